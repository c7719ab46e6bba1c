"""Running a graph on several ranks on GPUs: one process per GPU over NVSHMEM.

A graph made with `etc.Graph(name, ranks=N)` and compiled for
`target="cuda"` runs as N processes started by MPI (`python -m
etc.runtime.distributed -n N script.py`, or `mpiexec`), one per GPU, each
calling `run` with its own inputs in the same order, as on the CPU
(docs/distributed.md). Its PTX calls NVSHMEM's device API (`nvshmem_my_pe`,
`nvshmemx_putmem_nbi_block`, `nvshmem_quiet`, `nvshmem_int_atomic_add`);
this runtime is the host side, on NVSHMEM's host library through
`nvshmem4py` (`nvshmem.bindings`):

* **bootstrap**: rank 0 makes an NVSHMEM unique id, MPI broadcasts it, and
  every rank initialises NVSHMEM with it (`nvshmemx_hostlib_init_attr`
  with `NVSHMEMX_INIT_WITH_UNIQUEID`), on the GPU of its local rank (local
  rank modulo the GPUs it sees), once per process;
* **symmetric heap**: per binding of the symbols one `nvshmem_malloc`
  (collective: every rank allocates the same size in the same order, so
  the block lies at the same place in every rank's heap) holds the
  counter buffer and every intermediate (`symmetric_layout`); outputs,
  copies of NumPy inputs and the buffer table are private device memory;
* **module**: the driver's JIT linker (`cuLinkCreate`, `cuLinkAddData`,
  `cuLinkComplete`) links the kernel PTX with NVSHMEM's device library
  (its PTX: `etc.runtime.distributed.nvshmem_library_ptx`, saved in the
  artifact) into a cubin for this GPU, which is loaded and given its
  NVSHMEM state (`nvshmemx_cumodule_init`) before any launch;
* **a run**: agree on the symbols with the other ranks (MPI), counters
  set by the init kernel, meet (every rank's counters hold their
  expected counts before any rank's remote notify can reach them),
  launch the worker (cooperatively for the static schedule, whose CTAs
  must be co-resident on each GPU; every rank launches, so all ranks'
  workers run at once), wait for it, meet again (every put into this
  rank is complete: each was followed by the `nvshmem_quiet` of a remote
  notify), then the end-of-run check kernel. Each meeting is polled
  against the watchdog, as on the CPU ranks: a rank that dies or hangs is
  a `DistributedError` or `WatchdogError` on the others, not a hang.

No kernel uses NVSHMEM's synchronising device API (barriers, waits on
symmetric variables), so no `nvshmemx_collective_launch` is needed: the
static schedule's cooperative launch gives co-residency on each GPU, the
meeting before it makes every rank launch. Runs are collective and
synchronous: `bind` (a `Launch` to enqueue or capture) is refused.

Needs NumPy, cuda-bindings, mpi4py and nvshmem4py (`pip install
'etc-compiler[distributed-cuda]'` in a checkout), not MLIR. What was run
where is in docs/gpu.md.
"""

from __future__ import annotations

import atexit
import ctypes
import time

import numpy as np

from . import layout
from .abi import KernelABI
from .cpu import _STORAGE
from .cuda import CUDARuntime
from .cuda_arrays import DeviceArray
from .cuda_driver import DriverJITError, JITLogs, _check, _error_name, stream_handle
from .cuda_launch import CHECK_THREADS, INIT_THREADS, _Workspace
from .distributed import DistributedError, Meetings
from ..binding import bind_symbols, check_input_names, out_items

#: Each part of the symmetric block (the counters, each intermediate) starts
#: at a multiple of this many bytes (the kernels need 16; 256 keeps every
#: buffer on its own cache lines, as device allocations are).
SYMMETRIC_ALIGNMENT = 256

#: Seconds the ranks wait for each other to load a program (link it, start
#: NVSHMEM) before a rank that does not come is an error.
LOAD_TIMEOUT = 300.0

#: The pip requirement that brings NVSHMEM's host library and its bindings.
NVSHMEM4PY = "nvshmem4py-cu13==0.4.1"


def symmetric_layout(counter_count: int, intermediates: list[tuple[str, int]]
                     ) -> tuple[dict[str, int], int]:
    """Where the counter buffer (`counter_count` i32 words, at offset 0) and
    each intermediate (`(name, bytes)`, in argument order) lie in a
    workspace's symmetric block: (byte offset by name, total bytes). The
    layout depends only on these sizes, so every rank, binding the same
    symbols, computes the same one."""
    if counter_count < 1:
        raise ValueError(f"counter_count={counter_count} must be positive")

    def align(size: int) -> int:
        return -(-size // SYMMETRIC_ALIGNMENT) * SYMMETRIC_ALIGNMENT

    offsets, size = {}, align(4 * counter_count)
    for name, nbytes in intermediates:
        if nbytes < 0:
            raise ValueError(f"intermediate {name!r} has {nbytes} bytes")
        offsets[name] = size
        size += align(max(nbytes, 1))
    return offsets, size


def _bindings():
    """nvshmem4py's `nvshmem.bindings`, with NVSHMEM's host library loaded,
    or RuntimeError saying what to install."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        load_nvidia_dynamic_lib = None
    try:
        if load_nvidia_dynamic_lib is not None:
            load_nvidia_dynamic_lib("nvshmem_host")
        import nvshmem.bindings as bindings
    except Exception as error:  # ImportError, or the loader's not-found error
        raise RuntimeError(
            f"a graph on several ranks runs on GPUs over NVSHMEM, whose host library this "
            f"process cannot load ({type(error).__name__}: {error}): pip install "
            f"'{NVSHMEM4PY}' nvidia-nvshmem-cu13==3.8.0 (in an ETC checkout, pip install -e "
            f"'.[distributed-cuda]')") from None
    return bindings


class _Process:
    """NVSHMEM in this process: initialised once (by the first program that
    runs), finalised at exit unless a run failed (finalising is collective,
    and a rank that died would never join)."""

    bindings = None
    failed = False

    @classmethod
    def start(cls, comm, rank: int, size: int):
        if cls.bindings is not None:
            return cls.bindings
        bindings = _bindings()
        uid = bindings.uniqueid()
        if rank == 0:
            bindings.get_uniqueid(uid.ptr)
        nbytes = bindings.uniqueid_dtype.itemsize
        buffer = np.frombuffer(ctypes.string_at(uid.ptr, nbytes), np.uint8).copy()
        comm.Bcast(buffer, root=0)
        ctypes.memmove(uid.ptr, buffer.ctypes.data, nbytes)
        attributes = bindings.InitAttr()
        try:
            bindings.set_attr_uniqueid_args(rank, size, uid.ptr, attributes.ptr)
            bindings.hostlib_init_attr(bindings.Flags.INIT_WITH_UNIQUEID, attributes.ptr)
        except Exception as error:
            raise DistributedError(
                f"rank {rank} of {size}: NVSHMEM did not initialise ({type(error).__name__}: "
                f"{error}); run with NVSHMEM_DEBUG=INFO to see why (the GPUs must reach each "
                "other: NVLink or PCIe peer access on one node)") from None
        pe, pes = bindings.my_pe(), bindings.n_pes()
        if (pe, pes) != (rank, size):
            raise DistributedError(f"NVSHMEM made this process PE {pe} of {pes}, but it is MPI "
                                   f"rank {rank} of {size}")
        cls.bindings = bindings
        atexit.register(cls.finish)
        return bindings

    @classmethod
    def finish(cls) -> None:
        if cls.bindings is not None and not cls.failed:
            cls.bindings.hostlib_finalize()
        cls.bindings = None


def _load_image(driver, image: bytes):
    """The module of a linked cubin (cuModuleLoadData)."""
    buffer = ctypes.create_string_buffer(image)  # one NUL more: harmless for an ELF image
    return _check(driver, "cuModuleLoadData (the linked cubin)",
                  driver.cuModuleLoadData(ctypes.addressof(buffer)))


def link_with_driver(driver, ptx: str, library_ptx: str) -> tuple[bytes, str]:
    """The kernel PTX and NVSHMEM's device library PTX linked by the driver's
    JIT linker into a cubin for the current device, and the linker's info
    log. Raises DriverJITError with its error log when it refuses."""
    logs = JITLogs(driver)
    state = _check(driver, "cuLinkCreate",
                   driver.cuLinkCreate(len(logs.keys), logs.keys, logs.values))
    try:
        for name, source in ((b"kernel.ptx", ptx), (b"nvshmem.ptx", library_ptx)):
            image = ctypes.create_string_buffer(source.encode())  # NUL-terminated
            err = driver.cuLinkAddData(state, driver.CUjitInputType.CU_JIT_INPUT_PTX,
                                       ctypes.addressof(image), len(image), name, 0, [], [])[0]
            if err != driver.CUresult.CUDA_SUCCESS:
                raise DriverJITError(f"cuLinkAddData ({name.decode()}) failed: "
                                   f"{_error_name(driver, err)}; the JIT says:\n"
                                   f"{logs.error_text()}")
        result = driver.cuLinkComplete(state)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise DriverJITError(f"cuLinkComplete (linking with NVSHMEM's device library) failed: "
                               f"{_error_name(driver, result[0])}; the linker says:\n"
                               f"{logs.error_text()}")
        cubin = ctypes.string_at(int(result[1]), int(result[2]))
    finally:
        driver.cuLinkDestroy(state)
    return cubin, logs.text(logs.info)


class _SymmetricWorkspace(_Workspace):
    """A workspace (see `cuda_launch._Workspace`) whose counter buffer and
    intermediates lie in one block of NVSHMEM's symmetric heap, at the
    offsets of `symmetric_layout`; outputs and the table are private."""

    PRIVATE_KINDS = ("output",)

    def _allocate_counters(self, runtime: "NVSHMEMRuntime") -> None:
        """Allocates the symmetric block and places the counters and the
        intermediates in it."""
        intermediates = [(arg.name, _STORAGE[arg.dtype],
                          self.buffer_shapes[arg.name]) for arg in runtime.arguments
                         if arg.kind == "intermediate"]
        offsets, self.nbytes = symmetric_layout(
            self.count, [(name, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
                         for name, dtype, shape in intermediates])
        self._runtime = runtime
        # Collective: every rank allocates the same size here.
        self.heap = runtime._symmetric_malloc(self.nbytes)
        runtime._zero(self.heap, self.nbytes)
        # Views into the block: freed with it (`free`), never on their own.
        self.counters = DeviceArray(self.heap, (self.count,), np.int32)
        for name, dtype, shape in intermediates:
            self.buffers[name] = DeviceArray(self.heap + offsets[name], shape, dtype)

    def free(self) -> None:
        """Gives the symmetric block back (collective: every rank frees the
        same workspace at the same point, see `NVSHMEMRuntime`)."""
        if self.heap:
            self._runtime._symmetric_free(self.heap)
            self.heap = 0


class NVSHMEMRuntime(Meetings, CUDARuntime):
    """Runs one rank's copy of a CUDA program compiled for
    `abi.extra["ranks"]` ranks on this process's GPU, over NVSHMEM (see the
    module docstring). `library_ptx` is NVSHMEM's device library as PTX, or
    a function that returns it (made on first use: compiling needs none).
    Nothing touches MPI, the driver or NVSHMEM until the first `run`.

    Its workspaces lie in NVSHMEM's symmetric heap, so making and freeing
    one is collective: a new size allocates a block, and the least recently
    used workspace beyond CACHED_SIZES is freed then (every rank runs the
    same sequence of sizes, so all do it at the same point);
    `free_workspaces` must be called on every rank."""

    _workspace_type = _SymmetricWorkspace

    def __init__(self, abi: KernelABI, ptx: str, library_ptx, **options):
        super().__init__(abi, ptx, **options)
        self.ranks = int(abi.extra["ranks"])
        self._library_ptx = library_ptx
        self._failed: str | None = None
        self._symbol_names = [arg.name for arg in self.arguments if arg.kind == "symbol"]
        self.comm = None
        #: The driver's link log (ptxas and nvlink info) after the first run.
        self.link_log = ""

    @property
    def library_ptx(self) -> str:
        """NVSHMEM's device library as PTX, linked with the program at load."""
        if callable(self._library_ptx):
            self._library_ptx = self._library_ptx()
        return self._library_ptx

    # -- setup ----------------------------------------------------------------

    def _join(self) -> None:
        """Checks that this process is one of `ranks` MPI processes."""
        if self.comm is not None:
            return
        from .distributed import _mpi

        mpi = _mpi()
        comm = mpi.COMM_WORLD
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._check_size("GPUs")
        local = comm.Split_type(mpi.COMM_TYPE_SHARED)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self.mpi, self.comm = mpi, comm

    def _load(self) -> None:
        if self._driver is not None:
            return
        self._join()
        super()._load()
        # Loading takes each rank its own time (NVSHMEM's start, the link,
        # maybe the device library's compilation): meet once it is done,
        # so that the runs' meetings measure runs only.
        self._barrier(f"load {self.abi.name} on their GPUs", timeout=LOAD_TIMEOUT)

    def _device_ordinal(self, driver) -> int:
        """The GPU of this rank: its local rank modulo the GPUs this process
        sees (several ranks on one GPU is NVSHMEM's multiple-PEs-per-GPU
        mode, docs/gpu.md)."""
        count = _check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount())
        return self.local_rank % int(count)

    def _load_module(self, driver):
        bindings = _Process.start(self.comm, self.rank, self.size)
        self._bindings = bindings
        cubin, self.link_log = link_with_driver(driver, self.ptx, self.library_ptx)
        module = _load_image(driver, cubin)
        status = bindings.cumodule_init(int(module))
        if status:
            raise RuntimeError(f"nvshmemx_cumodule_init failed with status {status}: the "
                               "linked module has no NVSHMEM device state to initialise")
        return module, self.link_log

    def _symmetric_malloc(self, nbytes: int) -> int:
        pointer = int(self._bindings.malloc(nbytes))
        if not pointer:
            raise MemoryError(f"rank {self.rank}: nvshmem_malloc({nbytes}) found no room in "
                              "the symmetric heap: raise NVSHMEM_SYMMETRIC_SIZE")
        return pointer

    def _symmetric_free(self, pointer: int) -> None:
        self._bindings.free(pointer)

    def bind(self, inputs: dict, out=None, stream=0):
        raise NotImplementedError(
            f"{self.abi.name} runs on {self.ranks} GPUs: each run meets the other ranks on the "
            "host before and after its worker, so it cannot be bound for enqueueing or CUDA-graph "
            "capture; call run")

    # -- runs ----------------------------------------------------------------

    def _symbols(self, inputs: dict) -> dict[str, int]:
        """The symbols `inputs` bind (checked again when the run binds them)."""
        check_input_names(self.abi.name, self.arguments, inputs)
        shapes = {}
        for arg in self.arguments:
            if arg.kind in ("input", "state"):
                value = inputs[arg.name]
                interface = getattr(value, "__cuda_array_interface__", None)
                shape = interface["shape"] if isinstance(interface, dict) else np.shape(value)
                shapes[arg.name] = tuple(int(s) for s in shape)
        return bind_symbols(self.arguments, shapes)

    def _finished(self, stream: int) -> None:
        """Waits for the worker on `stream`, polling, for as long as the
        device watchdog could take to stop it and more."""
        driver = self._driver
        limit = 4 * max(self.abi.watchdog_ms, 1000) / 1000.0 + 30.0
        deadline = time.monotonic() + limit
        while True:
            err = driver.cuStreamQuery(stream)[0]
            if err == driver.CUresult.CUDA_SUCCESS:
                return
            if err != driver.CUresult.CUDA_ERROR_NOT_READY:
                raise RuntimeError(f"kernel execution ({self.abi.name}_worker) failed: "
                                   f"{_error_name(driver, err)}")
            if time.monotonic() > deadline:
                self._failed = "the worker did not finish"
                raise DistributedError(
                    f"rank {self.rank}: {self.abi.name}: the worker kernel did not finish "
                    f"within {limit:.0f} s although every spin is bounded by the "
                    f"{self.abi.watchdog_ms} ms watchdog; this GPU's context is stuck")
            time.sleep(0.0002)

    def run(self, inputs: dict, *, out=None, stream=None) -> list:
        """Runs this rank's copy on its `inputs`, on `stream`, and waits for
        it; every rank must call `run` of the same kernel with the same
        shapes, in the same order. Returns the outputs like
        `CUDARuntime.run`."""
        if self._failed:
            raise DistributedError(f"rank {getattr(self, 'rank', '?')}: {self.abi.name}: an "
                                   f"earlier run failed ({self._failed}); the ranks are out of "
                                   "step")
        out = None if out is None else dict(out_items(self.abi.name, self.abi.outputs, out))
        self._load()
        symbols = self._symbols(inputs)
        self._agree(tuple(symbols[name] for name in self._symbol_names))
        try:
            return self._run(inputs, out, stream)
        except BaseException as error:
            self._failed = self._failed or f"{type(error).__name__}: {error}"
            _Process.failed = True
            raise

    def _run(self, inputs: dict, out, stream) -> list:
        driver = self._driver
        handle = stream_handle(stream)
        launch = self._bind(inputs, out, stream, own_table=False)
        parameters = launch._parameters
        self._launch(self._init, (1, INIT_THREADS), parameters["init"], handle)
        _check(driver, "cuStreamSynchronize (counter initialisation)",
               driver.cuStreamSynchronize(handle))
        # Every rank's counters hold their expected counts before any notify.
        self._barrier(f"initialise their counters for a run of {self.abi.name}")
        self._launch(self._worker, (self.workers, self.lanes), parameters["worker"], handle,
                     cooperative=self.abi.schedule == "static", shared=self.abi.shared_bytes)
        self._finished(handle)
        header = np.zeros(layout.HEADER_WORDS, np.int32)
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(
            header.ctypes.data, launch.counters.pointer + (launch.count - layout.HEADER_WORDS) * 4,
            header.nbytes))
        self._finish(header)
        self._launch(self._check_kernel, (1, CHECK_THREADS), parameters["check"], handle)
        launch.check(handle)
        return launch.collect(inputs, out)
