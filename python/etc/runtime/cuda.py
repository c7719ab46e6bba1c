"""The CUDA runtime: the program's PTX JIT-compiled by the driver and launched
with cuda-python (`cuda.bindings.driver`). Needs only NumPy and cuda-bindings.

ABI of the kernels of graph `g` (see `convert-event-to-gpu`), one PTX module:
  g_counters(symbols..., table, result: memref<1xi64>)   grid 1, block 1
  g_init(symbols..., table, counters)          grid 1, block INIT_THREADS
  g_worker(symbols..., table, counters)        grid = workers, block = lanes
  g_check(symbols..., table, counters, result: memref<1xi32>)   grid 1, block CHECK_THREADS
where `symbols` are the graph's symbolic dimensions and `table` the buffer
table (`etc.runtime.cpu.buffer_table`: each buffer's device address and
sizes), so the parameter count does not grow with the number of buffers.
Kernel parameters follow MLIR's expansion of `gpu.func` arguments: an index
is one 64-bit integer; a rank-r memref is 3 + 2r parameters, all 64-bit:
allocated pointer, aligned pointer, offset (in elements), the r sizes, the r
strides (in elements). The runtime passes C-contiguous buffers with offset 0
and the same pointer twice.

Every worker CTA of the static schedule must be resident at once (a CTA
waiting on a counter that only a not-yet-scheduled CTA notifies would wait
forever). Its worker is therefore launched cooperatively
(`cuLaunchCooperativeKernel`): the driver guarantees co-residency or refuses
the launch, and the refusal is raised as `CoResidencyError`. The dynamic
schedule needs no co-residency (a CTA only waits for tasks that running CTAs
push) and gets a plain launch. The grid is the SM count times the occupancy
the driver reports for the worker kernel at the chosen block size, or fewer.

Arrays: NumPy inputs are copied to the device; objects with
`__cuda_array_interface__` (CuPy, PyTorch, Numba) or `__dlpack__` (PyTorch,
CuPy, JAX) are used in place. Device buffers for a binding of the symbols
(intermediates, outputs, copies of NumPy inputs, the counter buffer and
the buffer table) are kept and reused, so that once a size has run, running
it again allocates no device memory.

Driver range: the PTX needs a driver of CUDA 11.0 or newer for sm_80 and 12.0
or newer for sm_90a; cuda-bindings 12.x runs on CUDA 12 and 13 drivers,
cuda-bindings 13.x on CUDA 13 drivers (see docs/gpu.md).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..binding import (INPUT_DTYPES, Signature, bind_symbols, check_input_dtype,
                       check_input_names, concrete_shape, out_items)
from .ranges import check as check_index_ranges
from . import layout
from .abi import KernelABI
from .cpu import _STORAGE, buffer_table, check_state, from_storage, to_storage

#: Threads of the one-CTA initialisation kernel.
INIT_THREADS = 256
#: Threads of the one-CTA end-of-run check, which scans every counter.
CHECK_THREADS = 256
#: Threads per worker CTA (the lanes of a tile body) unless told otherwise.
DEFAULT_LANES = 128
#: Bindings of the symbols (sizes) whose device buffers are kept for reuse.
CACHED_SIZES = 4
#: Shared memory a CTA may use without opting in (cuFuncSetAttribute).
DEFAULT_SHARED_BYTES = 48 << 10
#: Bytes of each JIT log buffer (errors, and ptxas's info with its
#: register and spill counts).
JIT_LOG_BYTES = 1 << 16


class CUDAUnavailableError(RuntimeError):
    """No usable CUDA driver, device or cuda-python in this process."""


class DriverJITError(RuntimeError):
    """The driver's JIT compiler or linker refused the program's code."""


class CoResidencyError(RuntimeError):
    """The static schedule's worker CTAs cannot all be resident at once, so
    the cooperative launch was refused (instead of hanging)."""


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


class JITLogs:
    """The driver JIT's info and error log buffers, and the options
    (`keys`, `values`) that hand them to cuModuleLoadDataEx or cuLinkCreate."""

    def __init__(self, driver):
        self.info, self.errors = bytearray(JIT_LOG_BYTES), bytearray(JIT_LOG_BYTES)
        option = driver.CUjit_option
        options = {option.CU_JIT_INFO_LOG_BUFFER: self.info,
                   option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: JIT_LOG_BYTES,
                   option.CU_JIT_ERROR_LOG_BUFFER: self.errors,
                   option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: JIT_LOG_BYTES,
                   option.CU_JIT_LOG_VERBOSE: 1}
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


# ---------------------------------------------------------------------------
# Device arrays
# ---------------------------------------------------------------------------

class DeviceArray:
    """A C-contiguous buffer in device memory, shared without copies through
    `__cuda_array_interface__`. Frees its memory when it owns it (`driver`
    given) and it is collected or `free`d."""

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype, driver=None,
                 keep=None):
        self.pointer = int(pointer)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._driver = driver
        self._keep = keep  # what keeps borrowed memory alive (a DLPack capsule)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
                "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        """A host copy."""
        host = np.empty(self.shape, self.dtype)
        if host.nbytes:
            driver = self._driver or _driver()
            _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(host.ctypes.data, self.pointer, host.nbytes))
        return host

    def free(self) -> None:
        if self._driver is not None and self.pointer:
            self._driver.cuMemFree(self.pointer)
        self.pointer = 0
        self._driver = None

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


#: DLPack device types whose memory a CUDA kernel can use.
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
#: DLPack (code, bits) -> the ETC dtypes whose device storage it can be.
_DL_DTYPES = {(2, 32): ("f32",), (2, 16): ("f16",), (4, 16): ("bf16",), (0, 32): ("i32",),
              (1, 16): ("bf16",), (0, 16): ("bf16",)}
#: NumPy typestr of device storage -> the ETC dtypes it can hold.
_TYPESTR_DTYPES = {np.dtype(np.float32): ("f32",), np.dtype(np.float16): ("f16",),
                   np.dtype(np.uint16): ("bf16",), np.dtype(np.int16): ("bf16",),
                   np.dtype(np.int32): ("i32",)}


def _c_contiguous(shape, strides_in_elements) -> bool:
    expect = 1
    for size, stride in zip(reversed(shape), reversed(strides_in_elements)):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def _from_dlpack(value, what: str, stream: int):
    """(pointer, shape, dtype candidates, capsule) of a `__dlpack__` object."""
    # DLPack: None/1 mean the legacy default stream, 0 is not allowed.
    try:
        capsule = value.__dlpack__(stream=stream if stream else 1)
    except TypeError:
        capsule = value.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    # DLManagedTensor starts with its DLTensor.
    tensor = _DLTensor.from_address(address)
    if tensor.device.device_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise TypeError(f"{what} is a DLPack tensor on device type {tensor.device.device_type}, "
                        "not in CUDA memory")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    if tensor.strides:
        strides = tuple(tensor.strides[i] for i in range(tensor.ndim))
        if not _c_contiguous(shape, strides):
            raise ValueError(f"{what} must be C-contiguous, has strides {strides} (elements)")
    dtypes = _DL_DTYPES.get((tensor.dtype.code, tensor.dtype.bits), ())
    if tensor.dtype.lanes != 1:
        dtypes = ()
    return (tensor.data or 0) + tensor.byte_offset, shape, dtypes, capsule, \
        f"DLPack dtype code {tensor.dtype.code} bits {tensor.dtype.bits}"


def _from_interface(value, what: str):
    """(pointer, shape, dtype candidates, None) of a `__cuda_array_interface__` object."""
    interface = value.__cuda_array_interface__
    shape = tuple(int(s) for s in interface["shape"])
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    if strides is not None:
        elements = tuple(s // dtype.itemsize for s in strides)
        if any(s % dtype.itemsize for s in strides) or not _c_contiguous(shape, elements):
            raise ValueError(f"{what} must be C-contiguous, has strides {tuple(strides)}")
    return int(interface["data"][0]), shape, _TYPESTR_DTYPES.get(dtype, ()), None, str(dtype)


#: The alignment every buffer a kernel uses in place must have: tile
#: kernels read and write 16 bytes at a time (vector loads, `cp.async`), and
#: a misaligned access is a sticky CUDA_ERROR_MISALIGNED_ADDRESS that ends
#: the process's CUDA context. Device allocations are 256-byte aligned.
ALIGNMENT = 16


def _interface(value):
    """`value.__cuda_array_interface__`, None when it has none, or the
    exception reading it raised (PyTorch raises RuntimeError for a tensor
    that requires grad)."""
    try:
        return value.__cuda_array_interface__
    except AttributeError:
        return None
    except Exception as error:  # a property that refuses: keep why
        return error


def as_device_array(value, what: str, dtype: str, stream: int = 0):
    """`value` as a DeviceArray viewing its memory (no copy), if it is a
    device array (`__cuda_array_interface__` or `__dlpack__`); None for a
    NumPy array. Raises TypeError/ValueError for a wrong dtype, a
    non-contiguous layout, memory not on a CUDA device, or an address that
    is not a multiple of ALIGNMENT bytes.

    `__cuda_array_interface__` is tried first; `__dlpack__` when the
    interface cannot describe the dtype (PyTorch reports bf16 as `<V2`, a
    2-byte void) or raises."""
    if isinstance(value, np.ndarray):
        return None
    interface = _interface(value)
    found = None
    if isinstance(interface, dict):
        found = _from_interface(value, what)
        if dtype not in found[2] and hasattr(value, "__dlpack__"):
            found = None  # e.g. <V2 for bf16: DLPack names the type
    if found is None and hasattr(value, "__dlpack__"):
        try:
            found = _from_dlpack(value, what, stream)
        except (TypeError, ValueError):
            raise
        except Exception as error:
            before = (f"its __cuda_array_interface__ raised {type(interface).__name__}: "
                      f"{interface}; " if isinstance(interface, Exception) else "")
            raise TypeError(f"device {what} ({type(value).__name__}) cannot be used in place: "
                            f"{before}its __dlpack__ raised {type(error).__name__}: {error} "
                            "(a PyTorch tensor that requires grad: pass tensor.detach())") \
                from None
    if found is None:
        if isinstance(interface, Exception):
            raise TypeError(f"device {what} ({type(value).__name__}) cannot be used in place: "
                            f"its __cuda_array_interface__ raised {type(interface).__name__}: "
                            f"{interface} (a PyTorch tensor that requires grad: pass "
                            "tensor.detach())")
        raise TypeError(f"{what} must be a numpy.ndarray or a device array "
                        f"(__cuda_array_interface__ or __dlpack__), got {type(value).__name__}")
    pointer, shape, dtypes, keep, described = found
    if dtype not in dtypes:
        raise TypeError(f"device {what} has dtype {described}, expected "
                        f"{_STORAGE[dtype]} (the device storage of {dtype})")
    if pointer % ALIGNMENT:
        raise ValueError(f"device {what} starts at address {pointer:#x}, which is not a multiple "
                         f"of {ALIGNMENT} bytes: the kernels access buffers {ALIGNMENT} bytes at a "
                         "time, and a misaligned address would fault the GPU and end this "
                         "process's CUDA context; pass an aligned array (a whole allocation, or "
                         "a copy of the view: tensor.clone())")
    return DeviceArray(pointer, shape, _STORAGE[dtype], keep=(value, keep))


# ---------------------------------------------------------------------------
# Kernel arguments
# ---------------------------------------------------------------------------

def _memref_words(pointer: int, shape: tuple) -> list[int]:
    """The words of a C-contiguous memref: allocated and aligned pointer,
    offset 0, sizes, strides."""
    strides = []
    stride = 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= max(int(size), 1)
    return [pointer, pointer, 0, *[int(s) for s in shape], *reversed(strides)]


class _Parameters:
    """ctypes storage for one launch's parameters and the `void**` array the
    driver reads them through."""

    def __init__(self, words: list[int]):
        self._values = [ctypes.c_uint64(w & 0xFFFFFFFFFFFFFFFF) for w in words]
        self._array = (ctypes.c_void_p * len(self._values))(
            *[ctypes.addressof(v) for v in self._values])

    def pointer_array(self) -> int:
        return ctypes.addressof(self._array)


@dataclass
class _Kernel:
    name: str
    function: object


class _Workspace:
    """The device buffers of one binding of the symbols, kept for reuse:
    outputs and intermediates, copies of NumPy inputs, the counter buffer,
    the result words and the buffer table."""

    def __init__(self, runtime: "CUDARuntime", symbols: dict[str, int]):
        self.symbols = symbols
        self.buffer_shapes = {arg.name: concrete_shape(arg.shape, symbols)
                              for arg in runtime.arguments if arg.kind != "symbol"}
        self.buffers: dict[str, DeviceArray] = {}
        for arg in runtime.arguments:
            if arg.kind in ("output", "intermediate"):
                self.buffers[arg.name] = runtime._alloc(concrete_shape(arg.shape, symbols),
                                                        _STORAGE[arg.dtype])
        self.staging: dict[str, DeviceArray] = {}
        # Word 0: g_counters' result (i64); word 1: g_check's status (i32).
        # The buffer table: one word per address and size, whatever the
        # buffers. `run` fills these for each call; a `Launch` from `bind`
        # has its own (see `Launch`).
        self.results, self.table = runtime._table_and_results(self.shapes())
        self.count = runtime._counter_count(self)
        layout.check_count(runtime.abi, self.count)
        self.counters = runtime._alloc((self.count,), np.int32)

    def shapes(self) -> dict:
        """Stand-ins for every buffer: its shape at these sizes, address 0."""
        return {name: DeviceArray(0, shape, np.uint8)
                for name, shape in self.buffer_shapes.items()}

    def staged(self, runtime, name: str, shape, dtype) -> DeviceArray:
        """The device copy buffer of NumPy input `name`."""
        buffer = self.staging.get(name)
        if buffer is None or buffer.shape != tuple(shape) or buffer.dtype != dtype:
            buffer = self.staging[name] = runtime._alloc(shape, dtype)
        return buffer


class Launch:
    """One bound run of a program on the device: inputs, outputs,
    intermediates and counters allocated (or borrowed), ready to be enqueued
    any number of times on a stream, also under CUDA-graph capture.

    Each launch from `bind` has its own buffer table, result words, copies
    of NumPy inputs and outputs, so that bindings of the same sizes to
    different arrays (or a CUDA graph captured from one) each compute on,
    and into, their own arrays. Bindings of the same sizes share the
    workspace's intermediates and counter buffer: run them one after
    another (on one stream), not at the same time."""

    def __init__(self, runtime: "CUDARuntime", workspace: _Workspace,
                 buffers: dict[str, DeviceArray], copies: list, table: DeviceArray,
                 results: DeviceArray):
        self.runtime = runtime
        self.workspace = workspace
        self.symbols = workspace.symbols
        self.buffers = buffers
        self.counters = workspace.counters
        self.count = workspace.count
        #: This binding's buffer table and result words (device memory).
        self.table, self.results = table, results
        self._copies = copies  # (device buffer, host array): NumPy inputs
        self._parameters: dict[str, _Parameters] = {}

    def _words(self, *extra: tuple[int, tuple]) -> list[int]:
        words = [self.symbols[arg.name] for arg in self.runtime.arguments
                 if arg.kind == "symbol"]
        words += _memref_words(self.table.pointer, self.table.shape)
        for pointer, shape in extra:
            words += _memref_words(pointer, shape)
        return words

    def upload(self, stream=0) -> None:
        """Enqueues the copies of the NumPy inputs and of the buffer table on
        `stream`, and prepares the launch parameters. `bind` does this; call
        it again after changing a bound NumPy input in place."""
        rt = self.runtime
        driver = rt._driver
        stream = stream_handle(stream)
        for device, host in self._copies:
            if host.nbytes:
                _check(driver, "cuMemcpyHtoDAsync",
                       driver.cuMemcpyHtoDAsync(device.pointer, host.ctypes.data, host.nbytes,
                                                stream))
        self._table_host = rt._table(self.buffers)
        # Pageable host memory: the copy has read it when the call returns.
        _check(driver, "cuMemcpyHtoDAsync (buffer table)",
               driver.cuMemcpyHtoDAsync(self.table.pointer,
                                        self._table_host.ctypes.data, self._table_host.nbytes,
                                        stream))
        results = self.results.pointer
        counters = (self.counters.pointer, self.counters.shape)
        # _init and the worker take the same parameters (the driver copies
        # them at each launch, so one array serves both).
        same = _Parameters(self._words(counters))
        self._parameters = {"init": same, "worker": same,
                            "check": _Parameters(self._words(counters, (results + 8, (1,))))}

    def enqueue(self, stream=0) -> None:
        """Enqueues counter initialisation, the persistent worker grid and the
        end-of-run check on `stream` (no copies: capturable as a CUDA graph)."""
        rt = self.runtime
        stream = stream_handle(stream)
        rt._launch(rt._init, (1, INIT_THREADS), self._parameters["init"], stream)
        rt._launch(rt._worker, (rt.workers, rt.lanes), self._parameters["worker"], stream,
                   cooperative=rt.abi.schedule == "static", shared=rt.abi.shared_bytes)
        rt._launch(rt._check_kernel, (1, CHECK_THREADS), self._parameters["check"], stream)

    def check(self, stream=0) -> None:
        """Waits for `stream` and raises on a device-side error of the run:
        `WatchdogError` (a spin timed out), task queue overflow, unbalanced
        events. Decodes the trace of a traced program."""
        rt = self.runtime
        driver = rt._driver
        stream = stream_handle(stream)
        _check(driver, "kernel execution (cuStreamSynchronize)", driver.cuStreamSynchronize(stream))
        header = np.zeros(layout.HEADER_WORDS, np.int32)
        first = (self.count - layout.HEADER_WORDS) * 4
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(
            header.ctypes.data, self.counters.pointer + first, header.nbytes))
        layout.check_header(rt.abi, header)
        if rt.abi.trace:
            from .trace import Trace

            rt._trace = Trace.decode(rt.abi, self.counters.numpy(), rt.workers)
        value = np.zeros(1, np.int32)
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(
            value.ctypes.data, self.results.pointer + 8, 4))
        layout.check_status(rt.abi, int(value[0]))

    def outputs(self) -> list[np.ndarray]:
        """Host copies of the graph's outputs, in `g.output` order."""
        return [from_storage(self.buffers[name].numpy(), self.runtime._dtype(name))
                for name in self.runtime.abi.outputs]


class CUDARuntime:
    """Runs one program's PTX on the current CUDA device. Nothing touches the
    driver until the first `run` / `bind`, so compiling needs no GPU."""

    def __init__(self, abi: KernelABI, ptx: str, *, lanes: int = DEFAULT_LANES,
                 max_workers: int | None = None):
        self.abi = abi
        #: The compiled graph's name, arguments and outputs.
        self.signature = Signature(abi.name, abi.arguments, abi.outputs)
        self.ptx = ptx
        self.arguments = list(abi.arguments)
        #: Threads per worker CTA.
        self.lanes = lanes
        #: Upper bound on the worker grid (None: as many as can be resident).
        self.max_workers = max_workers
        #: The ordinal of the CUDA device it runs on (set before the first run).
        self.device = 0
        self._driver = None
        self._workspaces: OrderedDict[tuple, _Workspace] = OrderedDict()
        self._trace = None
        #: The driver JIT's info log of the PTX (after the first run).
        self.jit_log = ""

    @property
    def trace(self):
        """The trace of the last run (kernels compiled with trace=True)."""
        if not self.abi.trace:
            raise RuntimeError(f"{self.abi.name} was compiled without traces: compile with "
                               "etc.compile(..., trace=True)")
        if self._trace is None:
            raise RuntimeError(f"{self.abi.name} has not run yet, so there is no trace")
        return self._trace

    @property
    def workers(self) -> int:
        """Worker CTAs per launch: all that can be resident at once (SMs times
        occupancy at `lanes` threads), capped by `max_workers`."""
        self._load()
        resident = self.sm_count * self.ctas_per_sm
        return min(resident, self.max_workers) if self.max_workers else resident

    @property
    def ctas_per_sm(self) -> int:
        """Worker CTAs of `lanes` threads that fit on one SM at once, from the
        driver's occupancy calculator."""
        self._load()
        if self.lanes not in self._occupancy:
            driver = self._driver
            per_sm = _check(driver, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                            driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                                self._worker.function, self.lanes, self.abi.shared_bytes))
            if per_sm < 1:
                raise RuntimeError(f"{self._worker.name} cannot run with {self.lanes} threads "
                                   "per CTA (occupancy 0); use fewer lanes")
            self._occupancy[self.lanes] = int(per_sm)
        return self._occupancy[self.lanes]

    # -- device setup -------------------------------------------------------

    def _load(self) -> None:
        if self._driver is not None:
            return
        driver = _driver()
        device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(self._device_ordinal(driver)))
        context = _check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
        _check(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
        attribute = driver.CUdevice_attribute

        def device_attribute(name: str) -> int:
            return int(_check(driver, "cuDeviceGetAttribute",
                              driver.cuDeviceGetAttribute(getattr(attribute, name), device)))

        try:
            module, self.jit_log = self._load_module(driver)
        except DriverJITError as error:
            major = device_attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
            minor = device_attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
            raise RuntimeError(f"{error}\nThis device is sm_{major}{minor}: compile with "
                               f"chip='sm_{major}{minor}' (or older) for it, and check that the "
                               "driver is new enough for the PTX version (docs/gpu.md)") from None
        name = self.abi.name

        def function(suffix: str):
            err, fn = driver.cuModuleGetFunction(module, f"{name}_{suffix}".encode())
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"the PTX has no kernel {name}_{suffix}: {_error_name(driver, err)}")
            return _Kernel(f"{name}_{suffix}", fn)

        self._module = module
        self._counters = function("counters")
        self._init = function("init")
        self._worker = function("worker")
        self._check_kernel = function("check")
        #: SMs of the device.
        self.sm_count = device_attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        if self.abi.schedule == "static" and not device_attribute(
                "CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH"):
            raise CoResidencyError(
                f"{name}: the static schedule needs a cooperative launch to guarantee that "
                "its worker CTAs are co-resident, and this device does not support one; "
                "compile with schedule='dynamic'")
        self._occupancy: dict[int, int] = {}
        self._driver = driver
        self._allow_shared(device_attribute)

    def _device_ordinal(self, driver) -> int:
        """The device this runtime runs on (`device`)."""
        return self.device

    def _load_module(self, driver):
        """The program's module and the JIT's info log: the PTX, JIT-compiled
        by the driver on the current context's device."""
        return load_module(driver, self.ptx)

    def _allow_shared(self, device_attribute) -> None:
        """Lets the worker use its scratch arena (`abi.shared_bytes` of
        dynamic shared memory): above 48 KB a kernel must opt in
        (cuFuncSetAttribute), up to the device's per-block limit."""
        need = self.abi.shared_bytes
        if need <= DEFAULT_SHARED_BYTES:
            return
        driver = self._driver
        limit = device_attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        static = int(_check(driver, "cuFuncGetAttribute", driver.cuFuncGetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            self._worker.function)))
        if need + static > limit:
            raise RuntimeError(
                f"{self.abi.name}: the worker needs {need} bytes of shared memory for its tile "
                f"scratch (and {static} static), more than this device allows a CTA ({limit}): "
                "compile for this chip, or with smaller tiles")
        _check(driver, "cuFuncSetAttribute (dynamic shared memory)", driver.cuFuncSetAttribute(
            self._worker.function,
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, need))

    def resources(self) -> dict:
        """What the driver says about the worker kernel: registers per
        thread, local (stack and spill) bytes per thread, static and
        dynamic shared bytes per CTA, and CTAs per SM at `lanes` threads."""
        self._load()
        driver = self._driver
        attribute = driver.CUfunction_attribute

        def get(name: str) -> int:
            return int(_check(driver, "cuFuncGetAttribute", driver.cuFuncGetAttribute(
                getattr(attribute, name), self._worker.function)))

        return {"registers": get("CU_FUNC_ATTRIBUTE_NUM_REGS"),
                "local_bytes": get("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                "static_shared_bytes": get("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
                "dynamic_shared_bytes": self.abi.shared_bytes,
                "lanes": self.lanes, "ctas_per_sm": self.ctas_per_sm, "sms": self.sm_count}

    def _launch(self, kernel: _Kernel, shape: tuple[int, int], params: _Parameters, stream: int,
                cooperative: bool = False, shared: int = 0) -> None:
        driver = self._driver
        grid, block = shape
        what = f"{kernel.name}, grid={grid}, block={block}"
        if not cooperative:
            _check(driver, f"cuLaunchKernel({what})",
                   driver.cuLaunchKernel(kernel.function, grid, 1, 1, block, 1, 1, shared, stream,
                                         params.pointer_array(), 0))
            return
        err = driver.cuLaunchCooperativeKernel(kernel.function, grid, 1, 1, block, 1, 1, shared,
                                               stream, params.pointer_array())[0]
        if err != driver.CUresult.CUDA_SUCCESS:
            name = _error_name(driver, err)
            if "COOPERATIVE_LAUNCH_TOO_LARGE" in name:
                raise CoResidencyError(
                    f"{self.abi.name}: the static schedule needs all {grid} worker CTAs of "
                    f"{block} threads resident at once, and the device refused the cooperative "
                    f"launch ({name}; other kernels or MPS limits may hold SMs): lower "
                    "runtime.max_workers, or compile with schedule='dynamic'")
            raise RuntimeError(f"cuLaunchCooperativeKernel({what}) failed: {name}")

    def _alloc(self, shape, dtype) -> DeviceArray:
        array = DeviceArray(0, shape, dtype)
        nbytes = max(array.nbytes, 4)
        pointer = _check(self._driver, "cuMemAlloc", self._driver.cuMemAlloc(nbytes))
        _check(self._driver, "cuMemsetD8", self._driver.cuMemsetD8(pointer, 0, nbytes))
        return DeviceArray(pointer, shape, dtype, self._driver)

    def _table(self, buffers: dict) -> np.ndarray:
        """The host buffer table of `buffers` (DeviceArrays)."""
        return buffer_table(self.arguments, buffers, address=lambda array: array.pointer)

    def _table_and_results(self, buffers: dict) -> tuple[DeviceArray, DeviceArray]:
        """Device memory for the result words (g_counters' i64, g_check's
        i32) and for a buffer table of `buffers`."""
        return (self._alloc((2,), np.int64),
                self._alloc(self._table(buffers).shape, np.int64))

    def _counter_count(self, workspace: _Workspace) -> int:
        """The counter buffer's size for the workspace's symbols (g_counters on
        the device, given a table of the buffers' sizes)."""
        host = self._table(workspace.shapes())
        _check(self._driver, "cuMemcpyHtoD",
               self._driver.cuMemcpyHtoD(workspace.table.pointer, host.ctypes.data, host.nbytes))
        words = [workspace.symbols[arg.name] for arg in self.arguments if arg.kind == "symbol"]
        words += _memref_words(workspace.table.pointer, workspace.table.shape)
        words += _memref_words(workspace.results.pointer, (1,))
        self._launch(self._counters, (1, 1), _Parameters(words), 0)
        value = np.zeros(1, np.int64)
        _check(self._driver, "cuMemcpyDtoH",
               self._driver.cuMemcpyDtoH(value.ctypes.data, workspace.results.pointer, 8))
        return int(value[0])

    # -- binding ------------------------------------------------------------

    def free_workspaces(self) -> None:
        """Lets go of the kept device workspaces (intermediates and counters
        of up to CACHED_SIZES bindings of the symbols); their memory goes
        back to the driver when nothing else holds them (a `Launch` from
        `bind` keeps its own)."""
        self._workspaces.clear()

    def _workspace(self, symbols: dict[str, int]) -> _Workspace:
        key = tuple(sorted(symbols.items()))
        workspace = self._workspaces.get(key)
        if workspace is None:
            workspace = _Workspace(self, dict(symbols))
            self._workspaces[key] = workspace
            while len(self._workspaces) > CACHED_SIZES:
                self._workspaces.popitem(last=False)
        self._workspaces.move_to_end(key)
        return workspace

    def bind(self, inputs: dict, out=None, stream=0) -> Launch:
        """Binds NumPy arrays (copied to the device on each enqueue) or device
        arrays (used in place) to the graph's inputs, and `out` (device arrays
        receive the outputs in place) to its outputs; everything else comes
        from the workspace of these sizes. The launch has a buffer table of
        its own (see `Launch`)."""
        return self._bind(inputs, out, stream, own_table=True)

    def _bind(self, inputs: dict, out, stream, own_table: bool) -> Launch:
        check_input_names(self.abi.name, self.arguments, inputs)
        stream = stream_handle(stream)
        device: dict[str, DeviceArray] = {}
        shapes: dict[str, tuple] = {}
        for arg in self.arguments:
            if arg.kind not in ("input", "state"):
                continue
            value = inputs[arg.name]
            view = as_device_array(value, f"{arg.kind} {arg.name!r}", arg.dtype, stream)
            if view is None and arg.kind == "state":
                # Copied to the device and back after the run (see `run`).
                shapes[arg.name] = check_state(arg, value).shape
            elif view is None:
                check_input_dtype(arg.name, arg, value)
                shapes[arg.name] = tuple(value.shape)
            else:
                device[arg.name] = view
                shapes[arg.name] = view.shape
        symbols = bind_symbols(self.arguments, shapes)
        # Index inputs on the device are copied back to be checked (a few
        # values each), at bind time.
        self._load()
        checked = set(self.abi.index_ranges).union(
            *(batch.values() for batch in self.abi.ragged_batches))
        check_index_ranges(self.abi.name, self.abi.index_ranges, {
            name: (device[name].numpy() if name in device else inputs[name])
            for name in checked}, symbols, self.abi.ragged_batches)
        outputs = self._bind_out(out, symbols, stream)

        self._load()
        workspace = self._workspace(symbols)
        buffers = dict(workspace.buffers)
        if own_table:
            # Outputs of its own too, so that one binding's results stay
            # while another of the same sizes runs.
            for name in self.abi.outputs:
                buffers[name] = self._alloc(workspace.buffer_shapes[name],
                                            _STORAGE[self._dtype(name)])
        buffers.update({name: array for name, array in outputs.items() if array is not None})
        copies = []
        for arg in self.arguments:
            if arg.kind not in ("input", "state"):
                continue
            if arg.name in device:
                buffers[arg.name] = device[arg.name]
                continue
            host = inputs[arg.name] if arg.kind == "state" else \
                np.ascontiguousarray(to_storage(inputs[arg.name], arg.dtype))
            staged = (self._alloc(host.shape, host.dtype) if own_table else
                      workspace.staged(self, arg.name, host.shape, host.dtype))
            copies.append((staged, host))
            buffers[arg.name] = staged
        if own_table:
            results, table = self._table_and_results(workspace.shapes())
        else:  # `run`: done before it returns, so the workspace's serve
            results, table = workspace.results, workspace.table
        launch = Launch(self, workspace, buffers, copies, table, results)
        launch.upload(stream)
        return launch

    def _bind_out(self, out, symbols, stream) -> dict:
        """The device arrays of `out` by output name (None where `out` holds
        a NumPy array, which receives a copy)."""
        if out is None:
            return {}
        items = out_items(self.abi.name, self.abi.outputs, out)
        result = {}
        for name, value in items:
            arg = self.abi.argument(name)
            shape = concrete_shape(arg.shape, symbols)
            view = as_device_array(value, f"out[{name!r}]", arg.dtype, stream)
            got = view.shape if view is not None else tuple(value.shape)
            if got != shape:
                raise ValueError(f"out[{name!r}] has shape {got}, expected {shape}")
            if view is None and value.dtype != INPUT_DTYPES[arg.dtype]:
                raise TypeError(f"out[{name!r}] has dtype {value.dtype}, expected "
                                f"{INPUT_DTYPES[arg.dtype]}")
            if view is None and not value.flags.c_contiguous:
                raise ValueError(f"out[{name!r}] must be C-contiguous")
            result[name] = view
        return result

    def run(self, inputs: dict, *, out=None, stream=None) -> list:
        """Runs the program once on `stream` (default: the legacy default
        stream) and waits for it; raises on a device-side error. Returns the
        outputs as NumPy arrays, or, with `out=`, the `out` arrays filled."""
        # Paired once, by name: `out` may be an iterator.
        out = None if out is None else dict(out_items(self.abi.name, self.abi.outputs, out))
        launch = self._bind(inputs, out, stream, own_table=False)
        launch.enqueue(stream)
        launch.check(stream)
        # A state given as a NumPy array is updated in place: copy it back.
        for arg in self.arguments:
            value = inputs.get(arg.name)
            if arg.kind == "state" and isinstance(value, np.ndarray) and value.nbytes:
                _check(self._driver, "cuMemcpyDtoH",
                       self._driver.cuMemcpyDtoH(value.ctypes.data,
                                                 launch.buffers[arg.name].pointer, value.nbytes))
        if out is None:
            return launch.outputs()
        filled = []
        for name, value in out.items():
            if isinstance(value, np.ndarray):
                host = from_storage(launch.buffers[name].numpy(), self._dtype(name))
                np.copyto(value, host)
            filled.append(value)
        return filled

    def device_array(self, host: np.ndarray) -> DeviceArray:
        """A device copy of the C-contiguous `host` array (in its storage
        dtype), to pass to later runs in place of `host`: weights uploaded
        once, or a state buffer that stays on the device."""
        self._load()
        host = np.ascontiguousarray(host)
        device = self._alloc(host.shape, host.dtype)
        if host.nbytes:
            _check(self._driver, "cuMemcpyHtoD",
                   self._driver.cuMemcpyHtoD(device.pointer, host.ctypes.data, host.nbytes))
        return device

    def device_zeros(self, shape: tuple, dtype) -> DeviceArray:
        """A zeroed device array (e.g. a KV cache kept on the device)."""
        self._load()
        return self._alloc(tuple(shape), np.dtype(dtype))

    def _dtype(self, name: str) -> str:
        return self.abi.argument(name).dtype


class EventTimer:
    """GPU time of `enqueue(stream)`: the median milliseconds of `repeats`
    timed runs after `warmup` untimed ones, on a stream of its own.

    The window between the two CUDA events holds GPU work only: before
    each timed run a spin kernel (`etc.runtime.probes`) keeps the GPU busy
    for longer than the host takes to queue the events and the run, so the
    host's launch calls (10-20 us of Python for a program's three kernels)
    are not inside it. `cold=True` also clears the L2 before each run (a
    memset over twice its size, queued before the start event), so that
    weights are read from device memory, not from what the previous run
    left in the cache; `cold=False` (hot) times back-to-back runs over the
    same buffers. After each call `gap_us` is the median time the GPU
    waited between the spin's end and the start event beyond the flush
    (about 0 when the spin covered the host's queueing)."""

    #: The spin's floor and ceiling (nanoseconds).
    MIN_SPIN_NS, MAX_SPIN_NS = 50_000, 20_000_000

    def __init__(self, driver, repeats: int, warmup: int = 5):
        self.driver, self.repeats, self.warmup = driver, repeats, warmup
        self.stream = _check(driver, "cuStreamCreate", driver.cuStreamCreate(0))
        self.start = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        self.end = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        self.ready = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        from . import probes

        module, _ = load_module(driver, probes.PTX)
        self._spin = _check(driver, "cuModuleGetFunction",
                            driver.cuModuleGetFunction(module, b"etc_spin"))
        self._flush = None
        self.gap_us = 0.0

    def spin(self, stream, nanoseconds: int) -> None:
        """Queues the spin kernel (one thread, `nanoseconds` long) on `stream`."""
        parameters = _Parameters([int(nanoseconds)])
        _check(self.driver, "cuLaunchKernel(etc_spin)", self.driver.cuLaunchKernel(
            self._spin, 1, 1, 1, 1, 1, 1, 0, stream_handle(stream),
            parameters.pointer_array(), 0))

    def flush(self, stream) -> None:
        """Queues a write of twice the L2's size, which evicts what it held."""
        d = self.driver
        if self._flush is None:
            device = _check(d, "cuDeviceGet", d.cuDeviceGet(0))
            l2 = int(_check(d, "cuDeviceGetAttribute", d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device)))
            nbytes = max(2 * l2, 1 << 20)
            self._flush = (_check(d, "cuMemAlloc", d.cuMemAlloc(nbytes)), nbytes)
        pointer, nbytes = self._flush
        _check(d, "cuMemsetD8Async", d.cuMemsetD8Async(pointer, 0, nbytes, stream))

    def _elapsed(self, first, second) -> float:
        return float(_check(self.driver, "cuEventElapsedTime",
                            self.driver.cuEventElapsedTime(first, second)))

    def __call__(self, enqueue, repeats: int | None = None, cold: bool = False) -> float:
        d, stream = self.driver, self.stream
        for _ in range(self.warmup):
            enqueue(stream)
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        # How long the host takes to queue one timed run: the spin lasts
        # several times that.
        began = time.perf_counter()
        if cold:
            self.flush(stream)
        _check(d, "cuEventRecord", d.cuEventRecord(self.start, stream))
        enqueue(stream)
        _check(d, "cuEventRecord", d.cuEventRecord(self.end, stream))
        host_ns = (time.perf_counter() - began) * 1e9
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        spin = int(min(max(4 * host_ns, self.MIN_SPIN_NS), self.MAX_SPIN_NS))
        flush_ms = 0.0
        if cold:  # the flush alone, so that the gap excludes it
            self.spin(stream, spin)
            _check(d, "cuEventRecord", d.cuEventRecord(self.ready, stream))
            self.flush(stream)
            _check(d, "cuEventRecord", d.cuEventRecord(self.start, stream))
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(self.start))
            flush_ms = self._elapsed(self.ready, self.start)
        times, gaps = [], []
        for _ in range(repeats or self.repeats):
            self.spin(stream, spin)
            _check(d, "cuEventRecord", d.cuEventRecord(self.ready, stream))
            if cold:
                self.flush(stream)
            _check(d, "cuEventRecord", d.cuEventRecord(self.start, stream))
            enqueue(stream)
            _check(d, "cuEventRecord", d.cuEventRecord(self.end, stream))
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(self.end))
            times.append(self._elapsed(self.start, self.end))
            gaps.append(max(self._elapsed(self.ready, self.start) - flush_ms, 0.0))
        self.gap_us = statistics.median(gaps) * 1000
        return statistics.median(times)

    def within(self, enqueue, budget_ms: float = 2000.0, cold: bool = False) -> float:
        """Like calling the timer, with as many repeats (3 to `repeats`) as
        fit in `budget_ms`, judged from one timed call: for slow kernels."""
        first = max(self(enqueue, repeats=1, cold=cold), 1e-3)
        return self(enqueue, repeats=max(3, min(self.repeats, int(budget_ms / first))),
                    cold=cold)

    def graph(self, enqueue):
        """`enqueue` captured once as a CUDA graph; returns a launcher.
        Raises RuntimeError naming the call that failed when the driver
        cannot capture it (e.g. a cooperative launch)."""
        d = self.driver
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        _check(d, "cuStreamBeginCapture", d.cuStreamBeginCapture(self.stream, mode))
        try:
            enqueue(self.stream)
        finally:
            graph = d.cuStreamEndCapture(self.stream)
        graph = _check(d, "cuStreamEndCapture", graph)
        executable = _check(d, "cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
        return lambda stream: _check(d, "cuGraphLaunch", d.cuGraphLaunch(executable,
                                                                         stream_handle(stream)))
