"""A stand-in for nvshmem4py's `nvshmem.bindings` over MPI, for the fake
CUDA driver (`fake_driver.py`): it runs ETC's NVSHMEM runtime
(`etc.runtime.nvshmem`) in MPI processes without a GPU or NVSHMEM.

The symmetric heap is one MPI window (`MPI_Win_allocate` on
COMM_WORLD, `HEAP_BYTES`), allocated when NVSHMEM is initialised;
`malloc` hands out blocks of it in order, so a block lies at the same
displacement on every rank, as NVSHMEM's symmetric heap does. The fake
driver runs a program on several ranks with the CPU build of the same
program, whose puts and notifies are MPI operations on that window at
those displacements (`transport_block`).

Like NVSHMEM, and unlike a plain mock, it checks what a real run would
trip over: initialisation needs the same unique id on every rank (the
broadcast must have happened) and a rank and rank count that match MPI's;
`malloc` and `free` are collective and every rank must ask for the same
size (it raises otherwise, where NVSHMEM would hang or corrupt the heap);
a worker of a module that `cumodule_init` did not see cannot run (the
fake driver asks `initialised(module)`).
"""

from __future__ import annotations

import ctypes
import enum
import os
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


#: The process's state: the attribute records (by address), the heap.
STATE: dict = {"attributes": {}, "window": None, "base": 0, "next": 0, "modules": set(),
               "rank": None, "size": None}


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


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
    STATE.update(window=window, memory=memory, base=memory.ctypes.data, next=0, rank=rank,
                 size=size)


def hostlib_finalize() -> None:
    window = STATE.get("window")
    if window is not None:
        window.Unlock_all()
        window.Free()
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
    return STATE["base"] + at


def free(pointer: int) -> None:
    _initialised()
    _collective("nvshmem_free", int(pointer) - STATE["base"])
    STATE.setdefault("freed", []).append(int(pointer))


def cumodule_init(module: int) -> int:
    _initialised()
    STATE["modules"].add(int(module))
    return 0


def _bf16(pointer: int, count: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(int(pointer)))


def bfloat16_fcollect_on_stream(team: int, dest: int, source: int, count: int,
                                stream: int) -> None:
    """NVSHMEM's all-gather of `count` bf16 values from every PE, in PE
    order (the fake driver's streams are synchronous)."""
    _initialised()
    if int(team) != Team_id.TEAM_WORLD:
        raise NvshmemError(f"fake NVSHMEM knows TEAM_WORLD only, not team {team}")
    gathered = np.concatenate(_comm().allgather(_bf16(source, count).copy()))
    _bf16(dest, gathered.size)[:] = gathered


def bfloat16_sum_reducescatter_on_stream(team: int, dest: int, source: int, count: int,
                                         stream: int) -> None:
    """NVSHMEM's reduce-scatter: PE p gets the sum over PEs of block p
    (`count` bf16 values) of their sources, summed in float32."""
    from mpi4py import MPI

    _initialised()
    if int(team) != Team_id.TEAM_WORLD:
        raise NvshmemError(f"fake NVSHMEM knows TEAM_WORLD only, not team {team}")
    comm = _comm()
    values = (_bf16(source, count * comm.Get_size()).astype(np.uint32) << 16).view(np.float32)
    mine = np.empty(count, np.float32)
    comm.Reduce_scatter_block(values, mine, op=MPI.SUM)
    bits = mine.view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    _bf16(dest, count)[:] = rounded.astype(np.uint16)


def initialised(module: int) -> bool:
    """Whether `cumodule_init` saw `module` (for the fake driver)."""
    return int(module) in STATE["modules"]


def transport_block(rank_count: int) -> np.ndarray:
    """The transport block the CPU build of a program on several ranks
    reads after its buffer table (`etc.runtime.distributed.TRANSPORT_*`),
    for the fake heap's window."""
    from mpi4py import MPI

    from etc.runtime import distributed

    _initialised()
    functions = distributed._mpi_functions()
    block = np.zeros(distributed.TRANSPORT_WORDS, np.int64)
    block[distributed.TRANSPORT_RANK] = STATE["rank"]
    block[distributed.TRANSPORT_RANK_COUNT] = rank_count
    block[distributed.TRANSPORT_WINDOW] = distributed._signed(MPI._handleof(STATE["window"]))
    block[distributed.TRANSPORT_BASE] = STATE["base"]
    block[distributed.TRANSPORT_PUT] = functions["MPI_Put"]
    block[distributed.TRANSPORT_ACCUMULATE] = functions["MPI_Accumulate"]
    block[distributed.TRANSPORT_FLUSH] = functions["MPI_Win_flush"]
    block[distributed.TRANSPORT_BYTE] = distributed._signed(MPI._handleof(MPI.BYTE))
    block[distributed.TRANSPORT_INT] = distributed._signed(MPI._handleof(MPI.INT))
    block[distributed.TRANSPORT_SUM] = distributed._signed(MPI._handleof(MPI.SUM))
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
