"""The CUDA driver through cuda-bindings (`cuda.bindings.driver`): loading
and initialising it, checking its calls, JIT-compiling PTX into a module
(with the JIT's logs), and the CUstream handle of a stream object.

What fails here says why in words a user can act on: `CUDAUnavailableError`
when there is no driver, device or cuda-bindings, `DriverJITError` with the
JIT's error log when the driver refuses the code.
"""

from __future__ import annotations

import ctypes
import os

#: Bytes of each JIT log buffer (errors, and ptxas's info with its
#: register and spill counts).
JIT_LOG_BYTES = 1 << 16


class CUDAUnavailableError(RuntimeError):
    """No usable CUDA driver, device or cuda-python in this process."""


class DriverJITError(RuntimeError):
    """The driver's JIT compiler or linker refused the program's code."""


def _driver():
    """`cuda.bindings.driver`, initialised, or CUDAUnavailableError saying why not."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise CUDAUnavailableError(
            "running on target='cuda' needs cuda-python's driver bindings, which are not "
            "installed: pip install 'cuda-bindings>=12.9,<14' (in an ETC checkout, "
            "pip install -e '.[cuda]'); the PTX is available without them as kernel.ptx") \
            from error
    try:
        result = driver.cuInit(0)
    except Exception as error:  # the bindings raise when libcuda cannot be loaded
        raise CUDAUnavailableError(
            f"no CUDA driver is available, so the kernel cannot run here ({error}); "
            "the PTX is available as kernel.ptx") from None
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise CUDAUnavailableError(
            f"no CUDA device is available: cuInit failed with {_error_name(driver, result[0])}; "
            "the PTX is available as kernel.ptx")
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        raise CUDAUnavailableError(
            "no CUDA device is available (cuDeviceGetCount found none); "
            "the PTX is available as kernel.ptx")
    return driver


def require_device(what: str) -> None:
    """Raises CUDAUnavailableError, prefixed with `what` needs a device, when
    no CUDA device can run kernels here: for callers that would compile for
    minutes before they first touch the device."""
    try:
        _driver()
    except CUDAUnavailableError as error:
        reason = str(error).replace("; the PTX is available as kernel.ptx", "").replace(
            "; the PTX is available without them as kernel.ptx", "")
        raise CUDAUnavailableError(f"{what} needs a CUDA device: {reason}") from None


def cuda_available() -> bool:
    """Whether a CUDA device can run kernels in this process."""
    try:
        _driver()
    except CUDAUnavailableError:
        return False
    return True


def _error_name(driver, err) -> str:
    try:
        code, name = driver.cuGetErrorName(err)
        if code == driver.CUresult.CUDA_SUCCESS and name:
            return name.decode()
    except Exception:
        pass
    return str(err)


def _check(driver, what: str, result):
    """The values of a driver call's result tuple; RuntimeError on an error."""
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {_error_name(driver, err)}")
    values = result[1:]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


#: The environment variable that sets the driver JIT's optimization level
#: (0 to 4; unset: the driver's default, 4). A triage knob: on an H200 a
#: kernel whose warps reached a barrier diverged at the default level
#: passed at 0 (docs/gpu.md, "What the first GPU found").
JIT_OPT_LEVEL_VARIABLE = "ETC_CUDA_JIT_OPT_LEVEL"


def jit_opt_level() -> int | None:
    """The JIT optimization level `ETC_CUDA_JIT_OPT_LEVEL` asks for, or None;
    ValueError naming the variable for anything but 0 to 4."""
    text = os.environ.get(JIT_OPT_LEVEL_VARIABLE, "").strip()
    if not text:
        return None
    if text not in ("0", "1", "2", "3", "4"):
        raise ValueError(f"{JIT_OPT_LEVEL_VARIABLE}={text!r}: the driver JIT's optimization "
                         "level is 0, 1, 2, 3 or 4")
    return int(text)


class JITLogs:
    """The driver JIT's info and error log buffers, and the options
    (`keys`, `values`) that hand them to cuModuleLoadDataEx or cuLinkCreate
    (with the optimization level of `ETC_CUDA_JIT_OPT_LEVEL` when set)."""

    def __init__(self, driver):
        self.info, self.errors = bytearray(JIT_LOG_BYTES), bytearray(JIT_LOG_BYTES)
        option = driver.CUjit_option
        options = {option.CU_JIT_INFO_LOG_BUFFER: self.info,
                   option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: JIT_LOG_BYTES,
                   option.CU_JIT_ERROR_LOG_BUFFER: self.errors,
                   option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: JIT_LOG_BYTES,
                   option.CU_JIT_LOG_VERBOSE: 1}
        level = jit_opt_level()
        if level is not None:
            options[option.CU_JIT_OPTIMIZATION_LEVEL] = level
        self.keys, self.values = list(options), list(options.values())

    @staticmethod
    def text(log: bytearray) -> str:
        return bytes(log).split(b"\0", 1)[0].decode(errors="replace").strip()

    def error_text(self) -> str:
        return self.text(self.errors) or "(nothing)"


def load_module(driver, ptx: str):
    """The module of `ptx`, JIT-compiled by the driver (cuModuleLoadDataEx),
    and the JIT's info log (ptxas's registers and spills per kernel).
    Raises RuntimeError with the JIT's error log when the driver refuses."""
    image = ctypes.create_string_buffer(ptx.encode())  # NUL-terminated
    logs = JITLogs(driver)
    result = driver.cuModuleLoadDataEx(ctypes.addressof(image), len(logs.keys), logs.keys,
                                       logs.values)
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise DriverJITError(f"cuModuleLoadDataEx (driver JIT of the PTX) failed: "
                           f"{_error_name(driver, result[0])}; the JIT says:\n"
                           f"{logs.error_text()}")
    return result[1], logs.text(logs.info)


def stream_handle(stream) -> int:
    """The CUstream handle of `stream`: None or 0 (the legacy default stream),
    an int, a `cuda.bindings` CUstream, or an object exposing one
    (`__cuda_stream__()` of cuda.core, PyTorch's `.cuda_stream`, CuPy's
    `.ptr`).

    A CUstream's handle is `int(stream)` in every cuda-bindings version;
    only some versions (12.9.x up to 12.9.4 and 13.0.x have none) give it a
    `__cuda_stream__`, and its `getPtr()` is the address of the Python
    object's storage, never the handle."""
    if stream is None:
        return 0
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    if isinstance(stream, bool):
        raise TypeError(f"stream={stream!r} is not a CUDA stream")
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError(f"stream={stream!r} is not a CUDA stream (expected an int handle, "
                        "a CUstream, or an object with __cuda_stream__, cuda_stream or ptr)") \
            from None
