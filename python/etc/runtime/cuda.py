"""The CUDA runtime: the program's PTX JIT-compiled by the driver and launched
with cuda-python (`cuda.bindings.driver`).

ABI of the kernels of graph `g` (see `convert-event-to-gpu`), one PTX module:
  g_counters(symbols..., table, result: memref<1xi64>)   grid 1, block 1
  g_init(symbols..., table, counters)          grid 1, block INIT_THREADS
  g_worker(symbols..., table, counters)        grid = workers, block = lanes
  g_check(symbols..., table, counters, result: memref<1xi32>)   grid 1, block 1
where `symbols` are the graph's symbolic dimensions and `table` the buffer
table (`etc.runtime.cpu.buffer_table`: each buffer's device address and
sizes), so the parameter count does not grow with the number of buffers.
Kernel parameters follow MLIR's expansion of `gpu.func` arguments: an index
is one 64-bit integer; a rank-r memref is 3 + 2r parameters, all 64-bit:
allocated pointer, aligned pointer, offset (in elements), the r sizes, the r
strides (in elements). The runtime passes C-contiguous buffers with offset 0
and the same pointer twice.

Every worker CTA must be resident at once (a CTA waiting on a counter that
only a not-yet-scheduled CTA notifies would wait forever), so the worker grid
is the SM count times the occupancy the driver reports for the worker kernel
at the chosen block size, or fewer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..binding import Signature, bind_symbols, check_input_names, concrete_shape
from .cpu import _STORAGE, _USER_DTYPE, buffer_table, from_storage, to_storage

#: Threads of the one-CTA initialisation kernel.
INIT_THREADS = 256
#: Threads per worker CTA (the lanes of a tile body) unless told otherwise.
DEFAULT_LANES = 128

#: What each non-zero status of g_check means.
_CHECK_ERRORS = {
    1: "task queue overflow: more tasks were pushed than the queue holds",
    2: "unbalanced events: some event counters did not reach zero; the program's "
       "notifies do not match its expected counts",
}


class CUDAUnavailableError(RuntimeError):
    """No usable CUDA driver, device or cuda-python in this process."""


def _driver():
    """`cuda.bindings.driver`, initialised, or CUDAUnavailableError saying why not."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise CUDAUnavailableError(
            "running on target='cuda' needs cuda-python's driver bindings, which are not "
            "installed: pip install 'etc-compiler[cuda]' (cuda-bindings); the PTX is "
            "available without them as kernel.ptx") from error
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


class DeviceArray:
    """A C-contiguous buffer in device memory, shared without copies through
    `__cuda_array_interface__`. Frees its memory when `owner` is set and it is
    collected or `free`d."""

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype, driver=None):
        self.pointer = int(pointer)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._driver = driver

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


@dataclass
class _Kernel:
    name: str
    function: object


class _Parameters:
    """ctypes storage for one launch's parameters and the `void**` array the
    driver reads them through."""

    def __init__(self):
        self._values: list = []

    def index(self, value: int) -> None:
        self._values.append(ctypes.c_int64(int(value)))

    def memref(self, pointer: int, shape: tuple[int, ...]) -> None:
        self._values.append(ctypes.c_uint64(pointer))  # allocated
        self._values.append(ctypes.c_uint64(pointer))  # aligned
        self.index(0)  # offset
        for size in shape:
            self.index(size)
        stride = 1
        strides = []
        for size in reversed(shape):
            strides.append(stride)
            stride *= max(int(size), 1)
        for s in reversed(strides):
            self.index(s)

    def pointer_array(self):
        array = (ctypes.c_void_p * len(self._values))(
            *[ctypes.addressof(v) for v in self._values])
        self._array = array
        return ctypes.addressof(array)


class Launch:
    """One bound run of a program on the device: inputs, outputs,
    intermediates and counters allocated (or borrowed), ready to be enqueued
    any number of times on a stream, also under CUDA-graph capture."""

    def __init__(self, runtime: "CUDARuntime", symbols: dict[str, int],
                 buffers: dict[str, DeviceArray], table: DeviceArray,
                 counters: DeviceArray | None, count: int):
        self.runtime = runtime
        self.symbols = symbols
        self.buffers = buffers
        self.table = table
        self.counters = counters
        self.count = count

    def _params(self, *extra: tuple[int, tuple[int, ...]]) -> _Parameters:
        params = _Parameters()
        for arg in self.runtime.arguments:
            if arg.kind == "symbol":
                params.index(self.symbols[arg.name])
        params.memref(self.table.pointer, self.table.shape)
        for pointer, shape in extra:
            params.memref(pointer, shape)
        return params

    def enqueue(self, stream=0) -> None:
        """Enqueues counter initialisation and the persistent worker grid."""
        rt = self.runtime
        counters = (self.counters.pointer, self.counters.shape)
        if self.count > 0:  # a graph without events has nothing to initialise
            rt._launch(rt._init, (1, INIT_THREADS), self._params(counters), stream)
        rt._launch(rt._worker, (rt.workers, rt.lanes), self._params(counters), stream)

    def check(self) -> None:
        """Runs g_check (after a synchronised run) and raises on a bad status."""
        rt = self.runtime
        driver = rt._driver
        status = rt._scratch(4)
        params = self._params((self.counters.pointer, self.counters.shape), (status, (1,)))
        rt._launch(rt._check_kernel, (1, 1), params, 0)
        value = np.zeros(1, np.int32)
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(value.ctypes.data, status, 4))
        if value[0] != 0:
            raise RuntimeError(f"{rt.signature.name}: "
                               f"{_CHECK_ERRORS.get(int(value[0]), f'status {int(value[0])}')}")

    def outputs(self) -> list[np.ndarray]:
        """Host copies of the graph's outputs, in `g.output` order."""
        return [from_storage(self.buffers[name].numpy(), self.runtime._dtype(name))
                for name in self.runtime.signature.outputs]


class CUDARuntime:
    """Runs one program's PTX on the current CUDA device. Nothing touches the
    driver until the first `run` / `bind`, so compiling needs no GPU."""

    def __init__(self, abi, ptx: str, *, lanes: int = DEFAULT_LANES, max_workers: int | None = None):
        self.abi = abi
        #: The compiled graph's name, arguments and outputs.
        self.signature = Signature(abi.name, abi.arguments, abi.outputs)
        self.ptx = ptx
        self.arguments = self.signature.arguments
        #: Threads per worker CTA.
        self.lanes = lanes
        #: Upper bound on the worker grid (None: as many as can be resident).
        self.max_workers = max_workers
        self._driver = None
        self._count_cache: dict[tuple, int] = {}

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
                                self._worker.function, self.lanes, 0))
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
        device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(0))
        context = _check(driver, "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
        _check(driver, "cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
        image = ctypes.create_string_buffer(self.ptx.encode())  # NUL-terminated
        try:
            module = _check(driver, "cuModuleLoadData (driver JIT of the PTX)",
                            driver.cuModuleLoadData(ctypes.addressof(image)))
        except RuntimeError as error:
            major = _check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
                driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
            minor = _check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
                driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
            raise RuntimeError(f"{error}; this device is sm_{major}{minor}: compile with "
                               f"chip='sm_{major}{minor}' (or older) for it") from None
        name = self.signature.name

        def function(suffix: str, required: bool = True):
            err, fn = driver.cuModuleGetFunction(module, f"{name}_{suffix}".encode())
            if err != driver.CUresult.CUDA_SUCCESS:
                if required:
                    raise RuntimeError(f"the PTX has no kernel {name}_{suffix}: {_error_name(driver, err)}")
                return None
            return _Kernel(f"{name}_{suffix}", fn)

        self._module = module
        self._counters = function("counters")
        self._init = function("init")
        self._worker = function("worker")
        self._check_kernel = function("check", required=False)
        sms = _check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
        #: SMs of the device.
        self.sm_count = int(sms)
        self._occupancy: dict[int, int] = {}
        self._driver = driver
        self._scratch_buffer = None

    def _scratch(self, nbytes: int) -> int:
        if self._scratch_buffer is None:
            self._scratch_buffer = DeviceArray(
                _check(self._driver, "cuMemAlloc", self._driver.cuMemAlloc(8)), (8,), np.uint8,
                self._driver)
        assert nbytes <= 8
        return self._scratch_buffer.pointer

    def _launch(self, kernel: _Kernel, shape: tuple[int, int], params: _Parameters, stream) -> None:
        driver = self._driver
        grid, block = shape
        _check(driver, f"cuLaunchKernel({kernel.name}, grid={grid}, block={block})",
               driver.cuLaunchKernel(kernel.function, grid, 1, 1, block, 1, 1, 0, stream,
                                     params.pointer_array(), 0))

    def _alloc(self, shape, dtype) -> DeviceArray:
        array = DeviceArray(0, shape, dtype)
        nbytes = max(array.nbytes, 4)
        pointer = _check(self._driver, "cuMemAlloc", self._driver.cuMemAlloc(nbytes))
        _check(self._driver, "cuMemsetD8", self._driver.cuMemsetD8(pointer, 0, nbytes))
        return DeviceArray(pointer, shape, dtype, self._driver)

    # -- binding ------------------------------------------------------------

    def _bind(self, inputs: dict) -> tuple[dict[str, int], dict[str, DeviceArray]]:
        check_input_names(self.signature.name, self.arguments, inputs)
        shapes: dict[str, tuple] = {}
        for arg in self.arguments:
            if arg.kind != "input":
                continue
            value = inputs[arg.name]
            if hasattr(value, "__cuda_array_interface__"):
                interface = value.__cuda_array_interface__
                shape = tuple(interface["shape"])
                dtype = np.dtype(interface["typestr"])
                if dtype != _STORAGE[arg.dtype]:
                    raise TypeError(f"device input {arg.name!r} has dtype {dtype}, expected "
                                    f"{_STORAGE[arg.dtype]} (the device storage of {arg.dtype})")
                strides = interface.get("strides")
                if strides is not None:
                    expect = []
                    step = dtype.itemsize
                    for size in reversed(shape):
                        expect.append(step)
                        step *= size
                    if tuple(strides) != tuple(reversed(expect)):
                        raise ValueError(f"device input {arg.name!r} must be C-contiguous, "
                                         f"has strides {tuple(strides)}")
            elif isinstance(value, np.ndarray):
                shape = value.shape
                want = _USER_DTYPE[arg.dtype]
                if value.dtype != want:
                    raise TypeError(
                        f"input {arg.name!r} has dtype {value.dtype}, expected {want} for "
                        f"{arg.dtype} (inputs are not cast implicitly)")
            else:
                raise TypeError(f"input {arg.name!r} must be a numpy.ndarray or have "
                                f"__cuda_array_interface__, got {type(value).__name__}")
            shapes[arg.name] = tuple(shape)
        symbols = bind_symbols(self.arguments, shapes)

        self._load()
        buffers: dict[str, DeviceArray] = {}
        for arg in self.arguments:
            if arg.kind == "symbol":
                continue
            if arg.kind == "input":
                value = inputs[arg.name]
                if hasattr(value, "__cuda_array_interface__"):
                    pointer = value.__cuda_array_interface__["data"][0]
                    buffers[arg.name] = DeviceArray(pointer, shapes[arg.name], _STORAGE[arg.dtype])
                    continue
                host = np.ascontiguousarray(to_storage(value, arg.dtype))
                device = self._alloc(host.shape, host.dtype)
                if host.nbytes:
                    _check(self._driver, "cuMemcpyHtoD",
                           self._driver.cuMemcpyHtoD(device.pointer, host.ctypes.data, host.nbytes))
                buffers[arg.name] = device
            else:
                buffers[arg.name] = self._alloc(concrete_shape(arg.shape, symbols),
                                                _STORAGE[arg.dtype])
        return symbols, buffers

    def _table(self, buffers: dict[str, DeviceArray]) -> DeviceArray:
        """The buffer table of `buffers`, on the device."""
        host = buffer_table(self.arguments, buffers, address=lambda array: array.pointer)
        device = self._alloc(host.shape, host.dtype)
        _check(self._driver, "cuMemcpyHtoD",
               self._driver.cuMemcpyHtoD(device.pointer, host.ctypes.data, host.nbytes))
        return device

    def _counter_count(self, symbols: dict[str, int], table: DeviceArray) -> int:
        key = tuple(sorted(symbols.items()))
        if key not in self._count_cache:
            launch = Launch(self, symbols, {}, table, None, 0)
            result = self._scratch(8)
            self._launch(self._counters, (1, 1), launch._params((result, (1,))), 0)
            value = np.zeros(1, np.int64)
            _check(self._driver, "cuMemcpyDtoH",
                   self._driver.cuMemcpyDtoH(value.ctypes.data, result, 8))
            self._count_cache[key] = int(value[0])
        return self._count_cache[key]

    def bind(self, inputs: dict) -> Launch:
        """Binds NumPy arrays (copied to the device) or device arrays (used in
        place) to the graph's inputs and allocates everything else."""
        symbols, buffers = self._bind(inputs)
        table = self._table(buffers)
        count = self._counter_count(symbols, table)
        counters = self._alloc((max(count, 1),), np.int32)
        return Launch(self, symbols, buffers, table, counters, count)

    def run(self, inputs: dict) -> list[np.ndarray]:
        launch = self.bind(inputs)
        launch.enqueue(0)
        _check(self._driver, "kernel execution (cuCtxSynchronize)", self._driver.cuCtxSynchronize())
        if self._check_kernel is not None:
            launch.check()
        else:
            left = np.count_nonzero(launch.counters.numpy()[: launch.count])
            if left:
                raise RuntimeError(f"{self.signature.name}: {left} event counters did not reach zero")
        return launch.outputs()

    def _dtype(self, name: str) -> str:
        return next(a.dtype for a in self.arguments if a.name == name)
