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

This module holds `CUDARuntime`, which sets a program up on the device and
runs it; beside it, `cuda_driver` (the driver, its errors and its JIT),
`cuda_arrays` (device arrays, DLPack), `cuda_launch` (parameter words,
workspaces, `Launch`) and `cuda_timing` (`EventTimer`). Their public names,
and the helpers the GPU kit and the benchmarks use, are importable from
here too.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..binding import (bind_symbols, check_input_dtype, check_input_names, concrete_shape,
                       out_items)
from ..packed import FORMATS, check_storage, gpu_repacked, to_gpu_layout
from .abi import DEFAULT_LANES, KernelABI
from .cpu import _STORAGE, buffer_table, check_disjoint_out, check_out, check_state, to_storage
from .cuda_arrays import ALIGNMENT, DeviceArray, as_device_array
from .cuda_driver import (CUDAUnavailableError, DriverJITError, JITLogs, _check, _driver,
                          _error_name, cuda_available, load_module, require_device,
                          stream_handle)
from .cuda_launch import (CHECK_THREADS, INIT_THREADS, Launch, _Kernel, _memref_words,
                          _Parameters, _Workspace)
from .cuda_tensor_maps import TensorMaps
from .cuda_timing import EventTimer
from .program import ProgramRuntime
from .ranges import check as check_index_ranges

# DEFAULT_LANES (`etc.runtime.abi`): threads per worker CTA (the lanes of a
# tile body) of a program that does not say (`KernelABI.lanes`:
# `etc.compile(..., lanes=)`).
#: Bindings of the symbols (sizes) whose device buffers are kept for reuse.
CACHED_SIZES = 4
#: Shared memory a CTA may use without opting in (cuFuncSetAttribute).
DEFAULT_SHARED_BYTES = 48 << 10

__all__ = ["CUDARuntime", "CoResidencyError", "CUDAUnavailableError", "DriverJITError",
           "DeviceArray", "EventTimer", "Launch", "JITLogs", "ALIGNMENT", "CACHED_SIZES",
           "CHECK_THREADS", "DEFAULT_LANES", "DEFAULT_SHARED_BYTES", "INIT_THREADS",
           "as_device_array", "cuda_available", "load_module", "require_device",
           "stream_handle"]


class CoResidencyError(RuntimeError):
    """The static schedule's worker CTAs cannot all be resident at once, so
    the cooperative launch was refused (instead of hanging)."""


class CUDARuntime(ProgramRuntime):
    """Runs one program's PTX on the current CUDA device. Nothing touches the
    driver until the first `run` / `bind`, so compiling needs no GPU."""

    #: The device buffers of one binding of the symbols.
    _workspace_type = _Workspace

    def __init__(self, abi: KernelABI, ptx: str, *, lanes: int | None = None,
                 max_workers: int | None = None):
        super().__init__(abi)
        self.ptx = ptx
        if lanes is not None and lanes != abi.lanes:
            raise ValueError(f"lanes={lanes}: {abi.name}'s tiles are written for {abi.lanes} "
                             "threads per CTA (compile it with etc.compile(..., lanes=...))")
        #: Threads per worker CTA: the program's (`abi.lanes`).
        self.lanes = abi.lanes
        #: Upper bound on the worker grid (None: as many as can be resident).
        self.max_workers = max_workers
        #: The ordinal of the CUDA device it runs on (set before the first run).
        self.device = 0
        self._driver = None
        self._workspaces: OrderedDict[tuple, _Workspace] = OrderedDict()
        #: The driver JIT's info log of the PTX (after the first run).
        self.jit_log = ""

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
        #: The module's tensor-map directory (TMA tiles; `cuda_tensor_maps`).
        self._tensor_maps = TensorMaps(driver, module, self.ptx)
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
        self._zero(pointer, nbytes)
        return DeviceArray(pointer, shape, dtype, self._driver)

    def _zero(self, pointer, nbytes: int) -> None:
        """Zeroes new device memory before any stream uses it: cuMemsetD8 is
        asynchronous, on the legacy stream, which work on a non-blocking
        stream (PyTorch's) does not wait for, so it waits for the memset
        (once per allocation: a new size)."""
        driver = self._driver
        _check(driver, "cuMemsetD8", driver.cuMemsetD8(pointer, 0, nbytes))
        _check(driver, "cuStreamSynchronize (zeroing new memory)", driver.cuStreamSynchronize(0))

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
        kept = list(self._workspaces.values())
        self._workspaces.clear()
        for workspace in kept:
            workspace.free()

    def _workspace(self, symbols: dict[str, int]) -> _Workspace:
        key = tuple(sorted(symbols.items()))
        workspace = self._workspaces.get(key)
        if workspace is None:
            workspace = self._workspace_type(self, dict(symbols))
            self._workspaces[key] = workspace
            while len(self._workspaces) > CACHED_SIZES:
                self._workspaces.popitem(last=False)[1].free()
        self._workspaces.move_to_end(key)
        return workspace

    def bind(self, inputs: dict, out=None, stream=0) -> Launch:
        """Binds NumPy arrays (copied to the device now, on `stream`, and
        again by `Launch.upload`) or device arrays (used in place) to the
        graph's inputs, and `out` (device arrays, which receive the outputs
        in place at every launch; NumPy arrays are refused, `launch.collect`
        copies outputs into them) to its outputs; everything else comes
        from the workspace of these sizes. The launch has a buffer table of its own (see
        `Launch`). It waits for its copies, so that the launch may be
        enqueued on any stream (a non-blocking one does not wait for the
        legacy stream's work)."""
        launch = self._bind(inputs, out, stream, own_table=True)
        _check(self._driver, "cuStreamSynchronize (the bound copies)",
               self._driver.cuStreamSynchronize(stream_handle(stream)))
        return launch

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
                check_packed_layout(arg, value)
                device[arg.name] = view
                shapes[arg.name] = view.shape
        symbols = bind_symbols(self.arguments, shapes)
        # Index inputs on the device are copied back to be checked (a few
        # values each), at bind time, once `stream` has them: their producer
        # ordered its writes on `stream` only (the DLPack contract), not
        # before the legacy stream's copy.
        self._load()
        checked = set(self.abi.index_ranges).union(
            *(batch.values() for batch in self.abi.ragged_batches))
        if checked & device.keys():
            _check(self._driver, "cuStreamSynchronize (device index inputs)",
                   self._driver.cuStreamSynchronize(stream))
        check_index_ranges(self.abi.name, self.abi.index_ranges, {
            name: (device[name].numpy() if name in device else inputs[name])
            for name in checked}, symbols, self.abi.ragged_batches)
        outputs = self._bind_out(out, symbols, stream, host=not own_table)

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
                device_storage(inputs[arg.name], arg.dtype, arg.name)
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

    def _bind_out(self, out, symbols, stream, host: bool) -> dict:
        """The device arrays of `out` by output name (None where `out` holds
        a NumPy array, which receives a copy after the run; `host`: whether
        NumPy arrays are allowed). NumPy arrays are checked by the CPU
        target's rules (`etc.runtime.cpu.check_out`: the storage dtype, a
        bf16 output's uint16 bit patterns among them, or float32 for bf16,
        any strides), so that one `out=` works on both targets. Two `out=`
        arrays that share memory are refused (see `check_disjoint_out`;
        device arrays: overlapping byte ranges)."""
        if out is None:
            return {}
        items = out_items(self.abi.name, self.abi.outputs, out)
        result = {}
        for name, value in items:
            arg = self.abi.argument(name)
            shape = concrete_shape(arg.shape, symbols)
            view = as_device_array(value, f"out[{name!r}]", arg.dtype, stream)
            if view is None and not host:
                raise TypeError(
                    f"out[{name!r}] is a NumPy array: bind() takes device arrays for out= "
                    "(written in place at every launch); copy a bound launch's outputs "
                    "to the host with launch.collect(inputs, out) after launch.check()")
            if view is None:
                check_out(name, value, shape, arg.dtype)
            elif view.shape != shape:
                raise ValueError(f"out[{name!r}] has shape {list(view.shape)}, expected "
                                 f"{list(shape)}")
            result[name] = view
        check_disjoint_out(items)
        devices = [(name, view) for name, view in result.items() if view is not None]
        for i, (name, view) in enumerate(devices):
            for other, earlier in devices[:i]:
                if view.nbytes and earlier.nbytes and view.pointer < earlier.pointer + \
                        earlier.nbytes and earlier.pointer < view.pointer + view.nbytes:
                    raise ValueError(f"device out[{other!r}] and out[{name!r}] share memory: "
                                     "each output needs an array of its own (the run would "
                                     "write one over the other)")
        return result

    def run(self, inputs: dict, *, out=None, stream=None) -> list:
        """Runs the program once on `stream` (default: the legacy default
        stream) and waits for it; raises on a device-side error. Returns the
        outputs as NumPy arrays, or, with `out=`, the `out` arrays filled:
        device arrays written in place, NumPy ones copied into as on the
        CPU target (a bf16 output's uint16 bits as they are, float32
        widened; see `_bind_out`)."""
        # Paired once, by name: `out` may be an iterator.
        out = None if out is None else dict(out_items(self.abi.name, self.abi.outputs, out))
        launch = self._bind(inputs, out, stream, own_table=False)
        launch.enqueue(stream)
        launch.check(stream)
        return launch.collect(inputs, out)

    def device_array(self, host: np.ndarray, dtype: str | None = None) -> DeviceArray:
        """A device copy of the C-contiguous `host` array (in its storage
        dtype), to pass to later runs in place of `host`: weights uploaded
        once, or a state buffer that stays on the device. `dtype` names the
        ETC dtype `host` is the storage of; a packed one (`etc.packed`,
        `host` its GGUF blocks) is repacked for the GPU kernels as it is
        copied (`device_storage`), which the array records."""
        self._load()
        host = np.ascontiguousarray(host) if dtype is None else device_storage(host, dtype)
        device = self._alloc(host.shape, host.dtype)
        if dtype is not None and dtype in FORMATS:
            device.packed_layout = (dtype, "gpu")
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


# -- packed weights in the GPU layout (`etc.packed`) -------------------------

def device_storage(value, dtype: str, name: str = "device_array") -> np.ndarray:
    """The host bytes a CUDA program's buffer of `dtype` holds for the
    caller's NumPy `value`: `to_storage`'s, and for a packed format its GGUF
    blocks repacked into the GPU layout (`etc.packed.to_gpu_layout`; once
    per bind of a NumPy input, once per `device_array`)."""
    if dtype in FORMATS:
        check_storage(name, dtype, value)
        return to_gpu_layout(value, dtype)
    return np.ascontiguousarray(to_storage(value, dtype))


def check_packed_layout(arg, value) -> None:
    """Refuses a device array bound to packed input `arg` whose format the
    GPU kernels read repacked unless `device_array(host, dtype=...)`
    repacked it (recorded on the array): the GGUF bytes on the device,
    read as the GPU layout, would give wrong values without an error."""
    if arg.dtype not in FORMATS or not gpu_repacked(arg.dtype):
        return
    layout = getattr(value, "packed_layout", None)
    if layout == (arg.dtype, "gpu"):
        return
    got = (f"a device array repacked for {layout[0]}" if layout else
           f"a device array ({type(value).__name__}) not repacked by device_array")
    raise TypeError(f"input {arg.name!r} ({arg.dtype}) is read by the GPU kernels in the GPU "
                    f"layout (etc.packed): upload its GGUF blocks with "
                    f"runtime.device_array(blocks, dtype={arg.dtype!r}), got {got}")
