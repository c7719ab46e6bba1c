"""Device arrays: `DeviceArray` (a C-contiguous buffer in device memory,
shared through `__cuda_array_interface__`) and `as_device_array`, which
views a caller's CuPy, PyTorch, JAX or Numba array in place through
`__cuda_array_interface__` or DLPack (`__dlpack__`), checking its dtype,
layout, device and alignment.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..packed import FORMATS
from .cpu import _STORAGE, check_disjoint_out, check_out, copy_out
from .cuda_driver import _check, _driver


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
        #: (packed dtype, "gpu") when `CUDARuntime.device_array` repacked
        #: the blocks into the GPU layout (`etc.packed`), else None.
        self.packed_layout = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
                "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        """A host copy."""
        return self.copy_to(np.empty(self.shape, self.dtype))

    def copy_to(self, host: np.ndarray, driver=None) -> np.ndarray:
        """Copies the buffer into `host`, a C-contiguous NumPy array of its
        size (no conversion: the bytes as they are), and returns it. A
        borrowed buffer has no driver of its own: `driver` is the caller's."""
        if host.nbytes:
            driver = self._driver or driver or _driver()
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
#: Bytes (uint8 or int8) are the storage of the packed formats (`etc.packed`:
#: a weight's blocks, uploaded once as a model's weights are).
_DL_DTYPES = {(2, 32): ("f32",), (2, 16): ("f16",), (4, 16): ("bf16",), (0, 32): ("i32",),
              (1, 16): ("bf16",), (0, 16): ("bf16",), (1, 8): tuple(FORMATS),
              (0, 8): tuple(FORMATS)}
#: NumPy typestr of device storage -> the ETC dtypes it can hold.
_TYPESTR_DTYPES = {np.dtype(np.float32): ("f32",), np.dtype(np.float16): ("f16",),
                   np.dtype(np.uint16): ("bf16",), np.dtype(np.int16): ("bf16",),
                   np.dtype(np.int32): ("i32",), np.dtype(np.uint8): tuple(FORMATS),
                   np.dtype(np.int8): tuple(FORMATS)}


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


def fill_host_out(out: dict, buffers: dict, dtype_of, driver) -> list:
    """Copies the device outputs `buffers` (by name) into the NumPy arrays
    of `out` (by output name; device arrays there were written in place
    and are passed over) and returns `out`'s arrays in its order. A NumPy
    `out=` array follows the CPU target's rules (`etc.runtime.cpu.check_out`,
    `check_disjoint_out`): the output's storage dtype gets the device's
    bytes as they are, straight into a C-contiguous array (a bf16 output's
    uint16 bit patterns: no widening, no temporary), and a float32 array
    for a bf16 output the widened values; strided views are filled through
    a host copy. `dtype_of(name)` is the output's ETC dtype; `driver` the
    runtime's."""
    check_disjoint_out(list(out.items()))
    for name, array in out.items():
        if not isinstance(array, np.ndarray):
            continue
        device, dtype = buffers[name], dtype_of(name)
        check_out(name, array, device.shape, dtype)
        if array.dtype == device.dtype and array.flags.c_contiguous:
            device.copy_to(array, driver)
        else:
            copy_out(array, device.copy_to(np.empty(device.shape, device.dtype), driver), dtype)
    return list(out.values())
