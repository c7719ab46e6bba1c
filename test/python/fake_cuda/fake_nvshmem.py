"""A stand-in for nvshmem4py's `nvshmem.bindings` over MPI, for the fake
CUDA driver (`fake_driver.py`): it runs ETC's NVSHMEM runtime
(`etc.runtime.nvshmem`) in MPI processes without a GPU or NVSHMEM.

The symmetric heap is one MPI window (`MPI_Win_allocate` on
COMM_WORLD, `HEAP_BYTES`), allocated when NVSHMEM is initialised;
`malloc` hands out blocks of it in order, so a block lies at the same
displacement on every rank, as NVSHMEM's symmetric heap does. The fake
driver counts the heap as device memory and runs a program on several
ranks with the CPU build of the same program, whose puts and notifies go
through the transport block (`transport_block`) to this module's
functions, which do them as MPI operations on that window.

Like NVSHMEM on a GPU, and unlike a plain mock, it checks what a real run
would trip over:
* initialisation needs the same unique id on every rank (the broadcast
  must have happened) and a rank and rank count that match MPI's;
  `malloc` and `free` are collective and every rank must ask for the same
  size, and `free` must name a live block (it raises otherwise, where
  NVSHMEM would hang or corrupt the heap);
* a collective's source and destination, a put's destination and a
  notify's counter must lie inside one live block of the symmetric heap;
* collectives on a stream run in that stream's order (the fake driver's
  deferred work), not when they are called;
* a put is delivered only when the thread (a CTA) that made it flushes
  that rank (`nvshmem_quiet`); a notify (atomic add) issued while its own
  puts to that rank are not delivered, or a worker that ends with puts
  undelivered, is a violation that faults the worker: on a GPU the notify
  may overtake the data (puts are ordered more weakly than MPI_Put + flush);
* a worker of a module that `cumodule_init` did not see cannot run (the
  fake driver asks `initialised(module)`).
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
import types

import numpy as np

#: Bytes of the fake symmetric heap (NVSHMEM_SYMMETRIC_SIZE, default 64 MiB).
HEAP_BYTES = int(os.environ.get("NVSHMEM_SYMMETRIC_SIZE", 64 << 20))
#: malloc's alignment (NVSHMEM's is 512 bytes).
ALIGNMENT = 512

uniqueid_dtype = np.dtype([("version", np.int32), ("internal", np.uint8, 124)])


class Flags(enum.IntEnum):
    INIT_THREAD_PES = 1
    INIT_WITH_MPI_COMM = 2
    INIT_WITH_SHMEM = 4
    INIT_WITH_UNIQUEID = 8


class Team_id(enum.IntEnum):  # noqa: N801 - nvshmem4py's name
    TEAM_WORLD = 0


class NvshmemError(Exception):
    """What nvshmem4py raises for a failed status."""


class uniqueid:  # noqa: N801 - nvshmem4py's name
    def __init__(self, size: int = 1):
        self._data = np.zeros(size, uniqueid_dtype)

    @property
    def ptr(self) -> int:
        return self._data.ctypes.data


class InitAttr:
    def __init__(self):
        self._data = np.zeros(8, np.int64)

    @property
    def ptr(self) -> int:
        return self._data.ctypes.data


#: The process's state: the attribute records (by address), the heap, its
#: live blocks (displacement -> bytes), the modules NVSHMEM was given.
STATE: dict = {"attributes": {}, "window": None, "base": 0, "next": 0, "modules": set(),
               "rank": None, "size": None, "blocks": {}, "freed": []}


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _driver():
    """The fake CUDA driver of this process (its streams and memory)."""
    import sys

    driver = sys.modules.get("cuda.bindings.driver")
    if not getattr(driver, "FAKE", False):
        raise NvshmemError("the fake NVSHMEM needs the fake CUDA driver installed first")
    return driver


def get_uniqueid(pointer: int) -> None:
    raw = np.frombuffer(os.urandom(uniqueid_dtype.itemsize), np.uint8)
    ctypes.memmove(pointer, raw.ctypes.data, uniqueid_dtype.itemsize)


def set_attr_uniqueid_args(rank: int, size: int, uid: int, attributes: int) -> None:
    STATE["attributes"][attributes] = (rank, size, ctypes.string_at(uid, uniqueid_dtype.itemsize))


def hostlib_init_attr(flags: int, attributes: int) -> None:
    from mpi4py import MPI

    if int(flags) != Flags.INIT_WITH_UNIQUEID:
        raise NvshmemError(f"fake NVSHMEM supports the unique-id bootstrap only, not flags {flags}")
    rank, size, uid = STATE["attributes"][attributes]
    comm = _comm()
    if (rank, size) != (comm.Get_rank(), comm.Get_size()):
        raise NvshmemError(f"rank {rank} of {size} does not match MPI's "
                           f"{comm.Get_rank()} of {comm.Get_size()}")
    ids = comm.allgather(uid)
    if any(other != uid for other in ids) or not any(uid):
        raise NvshmemError("the ranks initialise with different unique ids (not broadcast)")
    window = MPI.Win.Allocate(HEAP_BYTES, 1, comm=comm)
    window.Lock_all(MPI.MODE_NOCHECK)
    memory = np.frombuffer(window.tomemory(), np.uint8)
    # The collectives on streams meet on a communicator of their own, so
    # that they never pair with the host's MPI calls on COMM_WORLD.
    STATE.update(window=window, memory=memory, base=memory.ctypes.data, next=0, rank=rank,
                 size=size, blocks={}, collectives=comm.Dup())
    _driver().register_memory(STATE["base"], HEAP_BYTES, "NVSHMEM's symmetric heap")


def hostlib_finalize() -> None:
    window = STATE.get("window")
    if window is not None:
        window.Unlock_all()
        window.Free()
        STATE["collectives"].Free()
        STATE.update(window=None, memory=None, base=0)


def _initialised() -> None:
    if STATE.get("window") is None:
        raise NvshmemError("NVSHMEM is not initialised")


def my_pe() -> int:
    _initialised()
    return STATE["rank"]


def n_pes() -> int:
    _initialised()
    return STATE["size"]


def _collective(what: str, value: int) -> None:
    values = _comm().allgather(value)
    if len(set(values)) != 1:
        raise NvshmemError(f"{what} is collective: the ranks asked for {values}")


def malloc(nbytes: int) -> int:
    _initialised()
    _collective("nvshmem_malloc", int(nbytes))
    at = -(-STATE["next"] // ALIGNMENT) * ALIGNMENT
    if at + nbytes > HEAP_BYTES:
        return 0
    STATE["next"] = at + int(nbytes)
    STATE["blocks"][at] = int(nbytes)
    return STATE["base"] + at


def free(pointer: int) -> None:
    _initialised()
    displacement = int(pointer) - STATE["base"]
    _collective("nvshmem_free", displacement)
    if STATE["blocks"].pop(displacement, None) is None:
        raise NvshmemError(f"nvshmem_free({int(pointer):#x}): no live block of the symmetric heap "
                           "starts there (never allocated, or freed already)")
    STATE["freed"].append(int(pointer))


def symmetric(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) lies in one live block of the
    symmetric heap (so that it has the same displacement on every rank)."""
    return _in_block(int(address) - STATE["base"], int(nbytes))


def _in_block(displacement: int, nbytes: int) -> bool:
    return any(start <= displacement and displacement + max(nbytes, 1) <= start + size
               for start, size in STATE["blocks"].items())


def cumodule_init(module: int) -> int:
    _initialised()
    STATE["modules"].add(int(module))
    return 0


def _bf16(pointer: int, count: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(int(pointer)))


def _on_stream(what: str, team: int, stream, buffers: list, perform) -> None:
    """Checks a collective's team and buffers (each (pointer, bytes,
    writes) must be symmetric) and queues it on `stream`."""
    _initialised()
    if int(team) != Team_id.TEAM_WORLD:
        raise NvshmemError(f"fake NVSHMEM knows TEAM_WORLD only, not team {team}")
    for pointer, nbytes, _ in buffers:
        if not symmetric(pointer, nbytes):
            raise NvshmemError(f"{what}: [{int(pointer):#x}, +{nbytes}) does not lie in one block "
                               "of the symmetric heap (nvshmem_malloc): a collective's source "
                               "and destination must be symmetric")
    _driver().defer(stream, what, [(int(p), n, w) for p, n, w in buffers], perform)


def bfloat16_fcollect_on_stream(team: int, dest: int, source: int, count: int,
                                stream: int) -> None:
    """NVSHMEM's all-gather of `count` bf16 values from every PE, in PE
    order, queued on `stream`."""
    size = STATE["size"] or 0

    def perform():
        gathered = np.concatenate(STATE["collectives"].allgather(_bf16(source, count).copy()))
        _bf16(dest, gathered.size)[:] = gathered

    _on_stream("nvshmemx_bfloat16_fcollect_on_stream", team, stream,
               [(source, 2 * count, False), (dest, 2 * count * size, True)], perform)


def bfloat16_sum_reducescatter_on_stream(team: int, dest: int, source: int, count: int,
                                         stream: int) -> None:
    """NVSHMEM's reduce-scatter: PE p gets the sum over PEs of block p
    (`count` bf16 values) of their sources, summed in float32; queued on
    `stream`."""
    from mpi4py import MPI

    size = STATE["size"] or 0

    def perform():
        values = (_bf16(source, count * size).astype(np.uint32) << 16).view(np.float32)
        mine = np.empty(count, np.float32)
        STATE["collectives"].Reduce_scatter_block(values, mine, op=MPI.SUM)
        bits = mine.view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        _bf16(dest, count)[:] = rounded.astype(np.uint16)

    _on_stream("nvshmemx_bfloat16_sum_reducescatter_on_stream", team, stream,
               [(source, 2 * count * size, False), (dest, 2 * count, True)], perform)


def initialised(module: int) -> bool:
    """Whether `cumodule_init` saw `module` (for the fake driver)."""
    return int(module) in STATE["modules"]


# ---------------------------------------------------------------------------
# The transport the CPU build of a program calls (its puts and notifies)
# ---------------------------------------------------------------------------

#: The C types of MPI_Put, MPI_Accumulate and MPI_Win_flush as the CPU
#: lowering calls them (`lib/Conversion/EventToCPU/RemoteCPU.cpp`).
_PUT = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                        ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
                        ctypes.c_int64)
_ACCUMULATE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                               ctypes.c_int32, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
                               ctypes.c_int64, ctypes.c_int64)
_FLUSH = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int64)
#: What an MPI call returns for a refused argument (MPI_ERR_ARG).
_REFUSED = 12


class _Transport:
    """The fake's puts, notifies and flushes (see the module docstring):
    puts wait per (thread, target rank) until that thread flushes that
    rank; violations are kept for the fake driver (`violations`)."""

    def __init__(self):
        from etc.runtime import distributed

        real = distributed._mpi_functions()
        self.put = _PUT(real["MPI_Put"])
        self.accumulate = _ACCUMULATE(real["MPI_Accumulate"])
        self.flush = _FLUSH(real["MPI_Win_flush"])
        self.pending: dict[tuple, list] = {}
        self.violations: list[str] = []
        #: Puts delivered and notifies made (for tests).
        self.delivered = self.notified = 0
        self.lock = threading.Lock()
        #: Whether a flush delivers the puts before it (a test turns it off
        #: to play a program whose quiet is missing).
        self.quiet = True
        self.callbacks = (_PUT(self._put), _ACCUMULATE(self._accumulate), _FLUSH(self._flush))
        from mpi4py import MPI

        self.byte = _handle(MPI.BYTE)

    def _violation(self, why: str) -> int:
        with self.lock:
            self.violations.append(f"rank {STATE['rank']}: {why}")
        return _REFUSED

    def _put(self, origin, count, datatype, rank, displacement, target_count,
             target_datatype, window):
        if datatype != self.byte or target_datatype != datatype:
            return self._violation(f"a put of datatype {datatype}, not bytes")
        if not _in_block(displacement, count):
            return self._violation(f"a put of {count} bytes to rank {rank} at displacement "
                                   f"{displacement} outside every block of the symmetric heap")
        with self.lock:
            self.pending.setdefault((threading.get_ident(), rank), []).append(
                (origin, count, datatype, displacement, target_count, target_datatype, window))
        return 0

    def _accumulate(self, origin, count, datatype, rank, displacement, target_count,
                    target_datatype, operation, window):
        if not _in_block(displacement, 4 * count):
            return self._violation(f"a notify of rank {rank} at displacement {displacement} "
                                   "outside every block of the symmetric heap")
        with self.lock:
            waiting = len(self.pending.get((threading.get_ident(), rank), []))
        if waiting:
            self._violation(f"a notify of rank {rank}'s counter at displacement {displacement} "
                            f"while {waiting} puts of the same CTA to that rank were not "
                            "completed (no nvshmem_quiet between them): the notify may overtake "
                            "the data")
        with self.lock:
            self.notified += 1
        return self.accumulate(origin, count, datatype, rank, displacement, target_count,
                               target_datatype, operation, window)

    def _flush(self, rank, window):
        if self.quiet:
            with self.lock:
                puts = self.pending.pop((threading.get_ident(), rank), [])
            for origin, count, datatype, displacement, target_count, target_datatype, win in puts:
                status = self.put(origin, count, datatype, rank, displacement, target_count,
                                  target_datatype, win)
                if status:
                    return status
            with self.lock:
                self.delivered += len(puts)
        return self.flush(rank, window)

    def finished(self) -> list[str]:
        """After a worker: the violations, and puts it never completed."""
        with self.lock:
            left = sum(len(puts) for puts in self.pending.values())
            self.pending.clear()
            found, self.violations = self.violations, []
        if left:
            found.append(f"rank {STATE['rank']}: the worker ended with {left} puts never "
                         "completed (no nvshmem_quiet after them)")
        return found


def _handle(mpi_object) -> int:
    from mpi4py import MPI

    from etc.runtime import distributed

    return distributed._signed(MPI._handleof(mpi_object))


def transport() -> _Transport:
    """The process's transport (made on first use)."""
    if STATE.get("transport") is None:
        STATE["transport"] = _Transport()
    return STATE["transport"]


def transport_block(rank_count: int) -> np.ndarray:
    """The transport block the CPU build of a program on several ranks
    reads after its buffer table (`etc.runtime.distributed.TRANSPORT_*`),
    for the fake heap's window and this module's checking transport."""
    from mpi4py import MPI

    from etc.runtime import distributed

    _initialised()
    put, accumulate, flush = transport().callbacks
    block = np.zeros(distributed.TRANSPORT_WORDS, np.int64)
    block[distributed.TRANSPORT_RANK] = STATE["rank"]
    block[distributed.TRANSPORT_RANK_COUNT] = rank_count
    block[distributed.TRANSPORT_WINDOW] = _handle(STATE["window"])
    block[distributed.TRANSPORT_BASE] = STATE["base"]
    for word, callback in ((distributed.TRANSPORT_PUT, put),
                           (distributed.TRANSPORT_ACCUMULATE, accumulate),
                           (distributed.TRANSPORT_FLUSH, flush)):
        block[word] = ctypes.cast(callback, ctypes.c_void_p).value
    block[distributed.TRANSPORT_BYTE] = _handle(MPI.BYTE)
    block[distributed.TRANSPORT_INT] = _handle(MPI.INT)
    block[distributed.TRANSPORT_SUM] = _handle(MPI.SUM)
    return block


def install() -> types.ModuleType:
    """Makes `import nvshmem.bindings` give this module in this process."""
    import sys

    package = types.ModuleType("nvshmem")
    bindings = sys.modules[__name__]
    package.bindings = bindings
    package.__version__ = "fake"
    sys.modules.update({"nvshmem": package, "nvshmem.bindings": bindings})
    return bindings
