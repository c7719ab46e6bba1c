"""The CPU runtime: the program's native code called from N host threads at once.

ctypes releases the GIL for the duration of each foreign call, so the workers
run concurrently and their waits, notifies and atomics race for real.

The code comes either from MLIR's JIT (`etc.compile`) or from a shared
library (a saved artifact, `etc.runtime.load`); either way the runtime calls
the C-interface functions `_mlir_ciface_<g>_<role>` of the lowered program
for graph `g` (see `event-static-schedule` and `convert-event-to-cpu`):
  g_counters(symbols..., table) -> index       size of the counter buffer
  g_init(symbols..., table, counters)          writes each counter's expected count
  g_worker(symbols..., table, counters, worker_id, worker_count)
  g_check(symbols..., table, counters) -> i32  after the run: 0 clean, 1 task
                                               queue overflow, 2 unbalanced
where `symbols` are the graph's symbolic dimensions (`int64_t`), `table` is
the buffer table (a pointer to the descriptor of a `memref<?xi64>`, see
`buffer_table`) and `counters` a pointer to the descriptor of a
`memref<?xi32>`. The same ABI serves the static and the dynamic schedule:
for the dynamic one the counter buffer also holds the task queue, pending
counts and inverse indices, all sized by g_counters and filled by g_init.
The workers run on the threads of `etc.runtime.workers`, which wait in
native code between runs: they enter the worker through
  g_worker_packed(arguments, worker_id, worker_count)
(`arguments`: i64 words holding the worker's other arguments, the symbols
and the descriptors' addresses), and wait in the program's `park` loop and
are handed runs by its `launch` (lib/Conversion/EventToCPU/WorkerPool.h).
The buffer ends with the run header (`etc.runtime.layout`): the runtime reads
it after every run (the watchdog's record, the trace records), sets its
status to stop the workers on Ctrl-C, and writes the spin budget before each
run: how long a wait polls its counter before it blocks in the kernel (a
futex wait, woken by the notify that readies the counter), so that a worker
waiting for a descheduled producer gives its core to it.

This module needs only NumPy: it imports nothing from MLIR.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from .. import bfloat16
from ..binding import (bind_symbols, check_input_dtype, check_input_names, concrete_shape,
                       out_items)
from ..packed import FORMATS, to_gpu_layout
from .ranges import check as check_index_ranges
from . import aligned, isa, layout, workers
from .workers import Entry, adapting_enabled
from .abi import KernelABI
from .bind_plan import BindPlan, copy_plan, data_word, given_ids
from .program import ProgramRuntime
from .trace import Trace

#: NumPy storage of each ETC dtype. bf16 has no NumPy type: it is stored as the
#: upper 16 bits of float32 (see `to_storage` / `from_storage`).
_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16),
            "i32": np.dtype(np.int32), **{name: np.dtype(np.uint8) for name in FORMATS}}


def check_state(arg, array) -> np.ndarray:
    """The caller's array of state buffer `arg`, which the kernel updates in
    place: it must be a writeable C-contiguous ndarray of the state's exact
    dtype (a converted copy would not be updated)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"state {arg.name!r} must be a numpy.ndarray, got {type(array).__name__}")
    want = _STORAGE[arg.dtype]
    if array.dtype != want:
        raise TypeError(f"state {arg.name!r} has dtype {array.dtype}, expected {want} for "
                        f"{arg.dtype} (it is updated in place, so it is not converted)")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"state {arg.name!r} must be a writeable C-contiguous array: the "
                         f"kernel updates it in place")
    return array

#: How long a wait polls before it blocks, in microseconds, unless the
#: environment's ETC_SPIN_US says otherwise (see `CPURuntime.spin_microseconds`).
DEFAULT_SPIN_MICROSECONDS = 50


def default_spin_microseconds() -> int:
    """`ETC_SPIN_US` from the environment, else DEFAULT_SPIN_MICROSECONDS."""
    value = os.environ.get("ETC_SPIN_US")
    if value is None:
        return DEFAULT_SPIN_MICROSECONDS
    try:
        return _check_spin(int(value))
    except ValueError:
        raise ValueError(f"ETC_SPIN_US={value!r} must be a number of microseconds from 0 to "
                         f"{_MAX_SPIN}") from None


#: The largest spin budget the header's i32 word holds.
_MAX_SPIN = 2**31 - 1


def _check_spin(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SPIN:
        raise ValueError(f"spin_microseconds={value!r} must be an int from 0 to {_MAX_SPIN}")
    return value


#: The roles of the program's functions that the runtime calls, as
#: `KernelABI.function` names them.
CALLS = ("counters", "init", "worker", "check")
#: ... and all of them: also those through which the pool's threads run the
#: workers (`workers.Entry`; lib/Conversion/EventToCPU/WorkerPool.h).
ROLES = CALLS + ("worker_packed", "park", "launch")


@lru_cache(maxsize=None)
def _descriptor_type(rank: int):
    """The C layout of a ranked memref descriptor (element type does not matter)."""

    class MemRefDescriptor(ctypes.Structure):
        _fields_ = [
            ("allocated", ctypes.c_void_p),
            ("aligned", ctypes.c_void_p),
            ("offset", ctypes.c_longlong),
            ("shape", ctypes.c_longlong * rank),
            ("strides", ctypes.c_longlong * rank),
        ]

    return MemRefDescriptor


def _descriptor(array: np.ndarray):
    assert array.flags.c_contiguous
    desc = _descriptor_type(array.ndim)()
    desc.allocated = desc.aligned = array.ctypes.data
    desc.offset = 0
    desc.shape[:] = array.shape
    desc.strides[:] = [s // array.itemsize for s in array.strides]
    return desc


def table_slots(arguments) -> tuple[dict[str, int], int]:
    """Where each buffer argument's address word lies in the buffer table
    (its sizes follow it), and the table's length in words."""
    slots: dict[str, int] = {}
    words = 0
    for arg in arguments:
        if arg.kind != "symbol":
            slots[arg.name] = words
            words += 1 + len(arg.shape)
    return slots, words


def buffer_table(arguments, buffers: dict, address=lambda array: array.ctypes.data) -> np.ndarray:
    """The buffer table of a call: for each buffer argument in order, its
    address and then the size of each dimension (`event.buffer` documents
    the layout). `address(array)` gives an array's address (a device
    pointer for device arrays)."""
    slots, size = table_slots(arguments)
    words = np.zeros(max(size, 1), dtype=np.uint64)
    for name, slot in slots.items():
        array = buffers[name]
        words[slot] = address(array)
        words[slot + 1:slot + 1 + len(array.shape)] = array.shape
    return words.view(np.int64)


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """Converts a user array to the buffer ETC reads (bf16: float32 rounded
    to nearest even, as `etc.reference` rounds bf16 inputs; uint16 arrays
    are bf16 bit patterns already)."""
    if dtype != "bf16" or array.dtype == np.uint16:  # uint16: bf16 bits already
        return np.ascontiguousarray(array)
    return aligned.aligned(bfloat16.to_bits(array))


def checked_storage(arg, array, packed_layout: str = "gguf") -> np.ndarray:
    """The buffer the program reads for the caller's `array` of input or
    state `arg`, after checking its type and dtype (a state: its own array,
    `check_state`; an input: `to_storage`). `packed_layout` "gpu" (CUDA
    kernels simulated on the CPU: the ABI's extra) repacks a packed input
    as the CUDA runtime does (`etc.packed.to_gpu_layout`)."""
    if arg.kind == "state":
        return check_state(arg, array)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"input {arg.name!r} must be a numpy.ndarray, got "
                        f"{type(array).__name__}")
    check_input_dtype(arg.name, arg, array)
    if packed_layout == "gpu" and arg.dtype in FORMATS:
        return to_gpu_layout(array, arg.dtype)
    return to_storage(array, arg.dtype)


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The user array of an output buffer (bf16: widened to float32)."""
    if dtype != "bf16":
        return array
    return widen_bits(array, np.empty(array.shape, np.float32))


def widen_bits(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Writes the float32 values of bf16 bit patterns `bits` into the
    float32 array `out` (any strides) and returns it: the values of
    `etc.bfloat16.from_bits`, in one pass and without its two temporaries."""
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


#: The most a tile's vector access claims about an address's alignment
#: (`KernelBuilder.MAX_ALIGNMENT` in etc.ops.base, which this module may not
#: import): an `out=` array the program writes in place must start at a
#: multiple of it.
OUT_ALIGNMENT = 16


def check_out(name: str, array, shape: tuple, dtype: str) -> bool:
    """Checks the caller's `out=` array for output `name` of `dtype` and
    `shape`: a writeable NumPy array of that shape, in the output's storage
    dtype (bf16: uint16 bit patterns, as `etc.bfloat16.to_bits` makes) or,
    for bf16, float32 (widened values, filled by a copy). True when it is
    in the storage dtype, which the program may write in place. The CUDA
    runtime checks its NumPy `out=` arrays by these rules too, so that one
    `out=` works on both targets."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"out[{name!r}] must be a numpy.ndarray on the CPU target, got "
                        f"{type(array).__name__}")
    storage = _STORAGE[dtype]
    if array.dtype != storage and not (dtype == "bf16" and array.dtype == np.float32):
        wanted = ("uint16 (bf16 bit patterns) or float32 (widened values)" if dtype == "bf16"
                  else str(storage))
        raise TypeError(f"out[{name!r}] has dtype {array.dtype}; output {name!r} is {dtype}, "
                        f"expected {wanted}")
    if array.shape != shape:
        raise ValueError(f"out[{name!r}] has shape {list(array.shape)}, expected {list(shape)}")
    if not array.flags.writeable:
        raise ValueError(f"out[{name!r}] is read-only")
    return array.dtype == storage


def check_disjoint_out(items: list) -> None:
    """Refuses two `out=` arrays ((output name, array) pairs; only NumPy
    ones are looked at) that share memory, e.g. two views of one buffer:
    after the run their common bytes could hold only one of the two
    outputs, so the other would be silently lost, whether the program
    writes both in place (then which one wins depends on the tiles'
    order) or one is copied after (the copy decides). A ValueError naming
    both; views that interleave without sharing an element (`x[:, ::2]`
    and `x[:, 1::2]`) are disjoint."""
    arrays = [(name, array) for name, array in items if isinstance(array, np.ndarray)]
    for i, (name, array) in enumerate(arrays):
        for other, earlier in arrays[:i]:
            # The bounds first (cheap); the exact test only where they meet.
            if np.may_share_memory(array, earlier) and np.shares_memory(array, earlier):
                raise ValueError(f"out[{other!r}] and out[{name!r}] share memory: each output "
                                 "needs an array of its own (the run would write one over "
                                 "the other)")


def copy_out(array: np.ndarray, storage: np.ndarray, dtype: str) -> None:
    """Copies an output's `storage` into the caller's `out=` array, which
    `check_out` accepted (bf16 into float32: widened, without a temporary)."""
    if array.dtype == storage.dtype:
        np.copyto(array, storage)
    else:
        widen_bits(storage, array)


def fill_out(abi: KernelABI, out, results: dict) -> list:
    """Copies `results` (storage arrays by output name) into the NumPy
    arrays of `out` (a list in output order or a dict by name; see
    `check_out`) and returns them in that order."""
    items = out_items(abi.name, abi.outputs, out)
    check_disjoint_out(items)
    filled = []
    for name, array in items:
        storage = results[name]
        check_out(name, array, storage.shape, abi.argument(name).dtype)
        copy_out(array, storage, abi.argument(name).dtype)
        filled.append(array)
    return filled


@dataclass(frozen=True)
class EntryPoints:
    """The addresses of the program's four C-interface functions, by role,
    and `owner`, which keeps the code they point into alive (the JIT engine
    or the loaded library)."""

    addresses: dict
    owner: object

    @classmethod
    def from_library(cls, library: ctypes.CDLL, abi: KernelABI) -> "EntryPoints":
        """The entry points of a shared library built from the lowered module."""
        addresses = {}
        for role in ROLES:
            symbol = f"_mlir_ciface_{abi.function(role)}"
            try:
                addresses[role] = ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
            except AttributeError:
                raise ValueError(f"the library has no function {symbol}; it was not built "
                                 f"from the program of graph {abi.name!r}") from None
        return cls(addresses, library)


#: Bindings of the symbols whose workspaces a runtime keeps.
CACHED_SIZES = 4


class _Workspace:
    """What a run at one binding of the symbols needs besides the caller's
    arrays, kept for the next run at these sizes: the intermediates, the
    counter buffer, the buffer table (its address words for inputs and
    outputs are filled per run) and the C arguments and argument block that
    point at them. Built once, a run only fills the table and zeroes the
    counters: at decode sizes building these took about as long (60-70 us
    after a run had flushed the caches) as a tenth of the run."""

    def __init__(self, runtime: "CPURuntime", symbols: dict[str, int]):
        self.key = runtime._key(symbols)
        buffers = [arg for arg in runtime.arguments if arg.kind != "symbol"]
        self.shapes = {arg.name: concrete_shape(arg.shape, symbols) for arg in buffers}
        self.intermediates = {arg.name: aligned.zeros(self.shapes[arg.name], _STORAGE[arg.dtype])
                              for arg in buffers if arg.kind == "intermediate"}
        #: The index of each buffer's address word in the table.
        self.slots, _ = table_slots(runtime.arguments)
        #: The input and state addresses in the table now, by name.
        self.addresses: dict[str, int] = {}
        #: The `Constants` whose addresses the table holds (all of them).
        self.constants = None
        # The intermediates' addresses now, the others' (0 here) per run.
        self.table = buffer_table(
            runtime.arguments,
            {**{name: SimpleNamespace(shape=shape) for name, shape in self.shapes.items()},
             **self.intermediates},
            address=lambda array: array.ctypes.data if isinstance(array, np.ndarray) else 0)
        self._table_desc = _descriptor(self.table)
        self.args = [symbols[arg.name] for arg in runtime.arguments if arg.kind == "symbol"]
        self.args.append(ctypes.addressof(self._table_desc))
        count = runtime._functions["counters"](*self.args)
        layout.check_count(runtime.abi, count)
        self.counters = np.zeros(max(count, 1), np.int32)
        self._counters_desc = _descriptor(self.counters)
        self.counters_arg = ctypes.addressof(self._counters_desc)
        self.header = layout.header(self.counters)
        #: The packed worker's argument block: the worker's arguments
        #: before its id and count (`WorkerPool.h`).
        self.arguments = np.array([*self.args, self.counters_arg], np.int64)
        self.arguments_address = self.arguments.ctypes.data
        #: How long the last run here took, from the hand-off to the
        #: workers to their return, in ns (unknown: the first run does not
        #: join its workers; see `JOIN_BELOW_NS`).
        self.last_ns: int | None = None
        #: Output buffers kept for the runs whose caller does not receive
        #: the program's own storage (outputs `out=` leaves out, copied or
        #: widened ones), as (array, address) by name; made at the first
        #: such run.
        self.outputs: dict[str, tuple] = {}
        #: The bind plan whose addresses the table holds (None: unknown),
        #: and the copies its runs make: (the index of the `out=` array,
        #: the kept storage, the dtype).
        self.plan = None
        self.plan_copies: list = []

    def output(self, name: str, dtype: str) -> tuple:
        """The kept buffer of output `name` and its address (see `outputs`)."""
        kept = self.outputs.get(name)
        if kept is None:
            array = aligned.empty(self.shapes[name], _STORAGE[dtype])
            kept = self.outputs[name] = (array, array.ctypes.data)
        return kept


#: A run joins its workers (`run_interruptible(join=True)`) when the last
#: run in its workspace took less than this many nanoseconds: a Ctrl-C waits
#: for the caller's own share of the tiles, so it stays about as prompt as
#: the launcher's slices (`workers.SLICE_NS`) make it for the others.
JOIN_BELOW_NS = workers.SLICE_NS


def run_interruptible(entry: Entry, arguments: int, count: int, header: np.ndarray,
                      spin_microseconds: int = DEFAULT_SPIN_MICROSECONDS,
                      threads: int | None = None, join: bool = False) -> None:
    """Runs the program's `count` workers on the pool's threads (the packed
    worker of `entry` with the argument block at the address `arguments`)
    and waits for them, polling for `spin_microseconds` once one thread is
    left; `threads` (default `count`) threads run worker ids 0, 1, ....

    `join=True`: the calling thread runs the last of those workers itself
    (the pool's threads the others), then waits for them: its share starts
    at once instead of after a sleeping thread's wake-up (17-34 us on the
    2-core AMX VM), and a run of one worker wakes no thread at all. Its
    share is one native call, which a Ctrl-C does not interrupt: the
    signal is seen when that call returns (`JOIN_BELOW_NS`).

    Ctrl-C (or another exception from a signal handler) while the workers
    run: they write into the buffers and the counters until they return.
    The interrupted status in the run `header` makes every spin give up and
    every worker skip the tiles it has not started; this waits for them
    before the caller may let go of those buffers, then raises."""
    threads = count if threads is None else threads
    run = workers.Run(threads - 1 if join else threads, joined=join)
    try:
        run.launch(entry, arguments, count, spin_microseconds * 1000)
        if join:
            entry.call(arguments, threads - 1, count)
        run.wait()
    except BaseException:
        header[layout.STATUS_WORD] = layout.INTERRUPTED
        run.finish()
        raise


def _prototype(abi: KernelABI, role: str):
    """The ctypes prototype of `_mlir_ciface_<g>_<role>`."""
    argtypes = [ctypes.c_int64 for a in abi.arguments if a.kind == "symbol"]
    argtypes.append(ctypes.c_void_p)  # the buffer table
    if role != "counters":
        argtypes.append(ctypes.c_void_p)  # the counter buffer
    if role == "worker":
        argtypes += [ctypes.c_int64, ctypes.c_int64]  # worker id, worker count
    restype = {"counters": ctypes.c_int64, "check": ctypes.c_int32}.get(role)
    return ctypes.CFUNCTYPE(restype, *argtypes)


class Constants:
    """Inputs bound once for many runs (`CPURuntime.constants`): checked,
    converted to their storage and addressed here, so that a run with them
    looks only at the other inputs. The symbols their shapes bind stay
    bound for those runs (the other inputs must agree). A decode step passes a few hundred
    weights with a dozen small per-step arrays; checking and addressing the
    weights again at every step cost about a millisecond once a step had
    streamed the weights through the caches.

    The arrays are kept (referenced) and read at every run: changing their
    contents in place changes what the next run computes; an array that
    needed a conversion (float32 for a bf16 input) was copied here, once."""

    def __init__(self, runtime: "CPURuntime", arrays: dict):
        names = list(arrays)
        by_name = {arg.name: arg for arg in runtime._supplied}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise TypeError(f"{runtime.abi.name}: constants {unknown} are not inputs or state "
                            f"buffers of the graph; expected some of {sorted(by_name)}")
        checked = set(runtime.abi.index_ranges)
        for batch in runtime.abi.ragged_batches:
            checked.update(batch.values())
        self.storage: dict[str, np.ndarray] = {}
        for name in names:
            arg, array = by_name[name], arrays[name]
            if name in checked:
                raise ValueError(f"{runtime.abi.name}: constant {name!r} is an index input, "
                                 f"whose values are checked at every run: pass it to run() "
                                 f"instead")
            self.storage[name] = checked_storage(arg, array,
                                                runtime.abi.extra.get("packed_layout", "gguf"))
        args = [by_name[n] for n in names]
        values = bind_symbols(args, {n: arrays[n].shape for n in names}, allow_unbound=True)
        #: The symbols the constants' shapes bind, for every run with them:
        #: symbol -> (value, the first constant with it). A decode step
        #: binds its KV caches (slots x length) so.
        self.symbols = {symbol: (value, next(arg.name for arg in args if symbol in arg.shape))
                        for symbol, value in values.items()}
        #: Each constant's address, by name.
        self.addresses = {name: array.ctypes.data for name, array in self.storage.items()}
        self.runtime = runtime
        #: The inputs and state buffers a run with these constants takes.
        self.rest = [arg for arg in runtime._supplied if arg.name not in self.storage]
        self.rest_names = {arg.name for arg in self.rest}
        # Where the constants lie: each one's bytes, and from the lowest
        # address to the highest end (outside it, an array overlaps none).
        self._starts = np.array(list(self.addresses.values()), np.uint64)
        self._ends = self._starts + np.array([a.nbytes for a in self.storage.values()], np.uint64)
        self._span = (int(self._starts.min()), int(self._ends.max())) if names else (0, 0)

    def overlaps(self, start: int, end: int) -> bool:
        """Whether the bytes [start, end) overlap one of the constants."""
        if end <= self._span[0] or start >= self._span[1]:
            return False
        return bool(((self._starts < end) & (start < self._ends)).any())

    def __repr__(self) -> str:
        return f"<Constants of {self.runtime.abi.name}: {len(self.storage)} arrays>"


class CPURuntime(ProgramRuntime):
    """Runs one program with a fixed number of host worker threads."""

    def __init__(self, abi: KernelABI, entry_points: EntryPoints, workers: int | None = None):
        super().__init__(abi)
        self.workers = abi.workers if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be positive")
        # AMX tile instructions fault until the process has the tile state.
        isa.prepare(abi.isa)
        self._entry_points = entry_points
        self._functions = {role: _prototype(abi, role)(entry_points.addresses[role])
                           for role in CALLS}
        addresses = entry_points.addresses
        self._pool_entry = Entry(addresses["worker_packed"], addresses["park"],
                                 addresses["launch"], entry_points.owner)
        self._symbol_names = [arg.name for arg in self.arguments if arg.kind == "symbol"]
        # Each output's name and dtype, in `g.output` order.
        self._outputs = [(name, abi.argument(name).dtype) for name in abi.outputs]
        self._output_dtypes = dict(self._outputs)
        # Idle workspaces by binding, least recently used first. A run takes
        # its workspace out and puts it back after, so runs from several
        # threads at once never share one.
        self._workspaces: OrderedDict[tuple, _Workspace] = OrderedDict()
        self._workspaces_lock = threading.Lock()
        self._spin = default_spin_microseconds()
        #: Whether a run may use fewer workers than `workers` while other
        #: threads keep cores busy (`workers.run_workers`; default: unless
        #: ETC_ADAPT_WORKERS=0). The tiles computed are the same.
        self.adapt_workers = adapting_enabled()
        self.last_workers = self.workers
        # Binding (see `_bind`): the inputs and state buffers, in order;
        # their names; those with a symbolic dim; the symbols; and what
        # was learnt about the arrays of earlier runs, by name.
        self._supplied = [arg for arg in self.arguments if arg.kind in ("input", "state")]
        self._supplied_names = {arg.name for arg in self._supplied}
        self._symbolic_names = {arg.name for arg in self._supplied
                                if any(not isinstance(d, int) for d in arg.shape)}
        self._symbol_args = [arg for arg in self.arguments if arg.kind == "symbol"]
        self._seen: dict[str, tuple] = {}
        self._state_names = {arg.name for arg in self._supplied if arg.kind == "state"}
        #: The bind plan of the last run whose arrays may be reused
        #: (`etc.runtime.bind_plan`), and whether a run checks index inputs.
        self._plan: BindPlan | None = None
        self._given: tuple = ()  # the ids of the last run's arrays, to make a plan
        self._index_checked = bool(abi.index_ranges or abi.ragged_batches)

    @property
    def spin_microseconds(self) -> int:
        """How long a wait of a run polls its counter before it blocks in
        the kernel until the notify that readies it (0: at once). Polling
        answers fastest while every worker has a core; blocking gives the
        core to the producer being waited for when they share one. Set it
        to tune; the default comes from ETC_SPIN_US or
        DEFAULT_SPIN_MICROSECONDS."""
        return self._spin

    @spin_microseconds.setter
    def spin_microseconds(self, value: int) -> None:
        self._spin = _check_spin(value)

    # -- argument binding -------------------------------------------------

    def constants(self, arrays: dict) -> Constants:
        """Binds `arrays` (inputs or state buffers by name, but not index
        inputs) once for the runs given them with `run(..., constants=)`:
        see `Constants`."""
        return Constants(self, arrays)

    def _bind(self, inputs: dict, constants: Constants | None = None
              ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        """The symbols' values and, by name, each caller's array as the
        program reads it (inputs converted to their storage, state buffers
        as given; `_address` gives its address).

        An array that is the same object, with the same shape, strides,
        dtype and data address, as at an earlier run and that the program
        reads as it is (no conversion) is not checked nor looked at again: a decode step
        passes hundreds of weights that do not change between steps, and
        checking them took milliseconds per step."""
        expected, expected_args = self._supplied_names, self._supplied
        if constants is not None:
            if constants.runtime is not self:
                raise ValueError(f"{self.abi.name}: constants= were bound by another kernel's "
                                 f"runtime ({constants!r})")
            expected, expected_args = constants.rest_names, constants.rest
        if inputs.keys() != expected:
            bound = set(inputs) & constants.storage.keys() if constants is not None else ()
            if bound:
                raise TypeError(f"{self.abi.name}: inputs {sorted(bound)} are bound as "
                                f"constants and given to run() too")
            check_input_names(self.abi.name, self.arguments,
                              [*inputs, *(constants.storage if constants is not None else ())])
        seen, supplied, fresh = self._seen, {}, set()
        for arg in expected_args:
            name = arg.name
            array = inputs[name]
            known = seen.get(name)
            if (known is not None and known[0]() is array and known[1] == array.shape
                    and known[2] == array.strides and known[3] == array.dtype
                    and known[5].value == known[4]
                    and (arg.kind != "state" or array.flags.writeable)):
                supplied[name] = array
                continue
            fresh.add(name)
            storage = supplied[name] = checked_storage(
                arg, array, self.abi.extra.get("packed_layout", "gguf"))
            if storage is array:
                # Its data address too: `resize` or `__setstate__` move it in place.
                word = data_word(array)
                seen[name] = (weakref.ref(array), array.shape, array.strides, array.dtype,
                              word.value, word)
            else:  # a converted copy: the caller's array may change meanwhile
                seen.pop(name, None)
        # Arguments with symbolic dims bind the symbols every run; static
        # ones are checked when they are new.
        checked = [arg for arg in expected_args if arg.name in fresh or arg.name in
                   self._symbolic_names]
        symbols = bind_symbols(checked + self._symbol_args,
                               {arg.name: inputs[arg.name].shape for arg in checked},
                               bound=constants.symbols if constants is not None else None)
        check_index_ranges(self.abi.name, self.abi.index_ranges, inputs, symbols,
                           self.abi.ragged_batches)
        return symbols, supplied

    def _address(self, name: str, array: np.ndarray) -> int:
        """The address of `array`, supplied for `name` (known since `_bind`
        saw it, unless it is a converted copy)."""
        known = self._seen.get(name)
        return known[4] if known is not None and known[0]() is array else array.ctypes.data

    def _key(self, symbols: dict[str, int]) -> tuple:
        return tuple(symbols[name] for name in self._symbol_names)

    def _take_workspace(self, symbols: dict[str, int]) -> _Workspace:
        with self._workspaces_lock:
            workspace = self._workspaces.pop(self._key(symbols), None)
        return workspace if workspace is not None else _Workspace(self, symbols)

    def free_workspaces(self) -> None:
        """Lets go of the kept workspaces (the intermediates of up to
        CACHED_SIZES bindings of the symbols: a large prefill's can be
        hundreds of MB); the next run at any size builds its own again."""
        with self._workspaces_lock:
            self._workspaces.clear()

    def _put_back(self, workspace: _Workspace) -> None:
        with self._workspaces_lock:
            self._workspaces[workspace.key] = workspace
            while len(self._workspaces) > CACHED_SIZES:
                self._workspaces.popitem(last=False)

    # -- calls --------------------------------------------------------------

    def run(self, inputs: dict, *, out=None, stream=None,
            constants: Constants | None = None) -> list[np.ndarray]:
        """Runs the program on NumPy `inputs` (and the arrays bound as
        `constants`, see `constants()`); returns the outputs (bf16 ones
        widened to float32), or with `out=` (NumPy arrays, a list in output
        order or a dict by name) fills and returns those: see
        `_output_buffers` for which the program writes in place. `stream`
        is for the CUDA target only."""
        if stream is not None:
            raise TypeError("stream= is for target='cuda'; CPU runs are synchronous")
        plan = self._plan
        hit = plan is not None and plan.match(inputs, out, constants)
        if hit:  # the last run's arrays: bound, checked and paired then
            symbols, supplied, items = plan.symbols, inputs, plan.items(out)
            if self._index_checked:
                check_index_ranges(self.abi.name, self.abi.index_ranges, inputs, symbols,
                                   self.abi.ragged_batches)
        else:
            symbols, supplied = self._bind(inputs, constants)
            # Paired once, by name: `out` may be an iterator.
            items = None if out is None else out_items(self.abi.name, self.abi.outputs, out)
            if items is not None and len(items) > 1:
                check_disjoint_out(items)
            # A plan only for arrays given twice in a row (`given_ids`).
            given = given_ids(inputs, out)
            plan = BindPlan.make(constants, inputs, supplied, self._state_names, symbols, out,
                                 self.abi.outputs) if given == self._given else None
            self._plan, self._given = plan, given
        workspace = self._take_workspace(symbols)
        try:
            if hit and workspace.plan is plan:
                # The table holds this plan's addresses (see `_run`).
                copies = [(items[index][1], storage, dtype)
                          for index, storage, dtype in workspace.plan_copies]
                self._run(workspace, None, None, constants)
            else:
                buffers, copies = self._output_buffers(workspace, items, supplied, constants)
                workspace.plan = None
                self._run(workspace, supplied, buffers, constants)
                if plan is not None and items is not None:
                    workspace.plan, workspace.plan_copies = plan, copy_plan(items, copies)
            # Before the workspace goes back: its kept buffers are the next run's.
            for array, storage, dtype in copies:
                copy_out(array, storage, dtype)
            if items is None:
                return [from_storage(buffers[name][0], dtype) for name, dtype in self._outputs]
        finally:
            self._put_back(workspace)
        return [array for _, array in items]

    def _output_buffers(self, workspace: _Workspace, items: list | None, supplied: dict,
                        constants: Constants | None) -> tuple[dict, list]:
        """The buffer the program writes for each output in this run, as
        (array, address) by name, and the copies to make after it: (the
        caller's array, the storage, the output's dtype).

        Without `out=`, new arrays the caller keeps (a bf16 output: the
        workspace's kept buffer, which `run` widens into a new float32
        array). With it, the program writes in place each `out=` array in
        the output's storage dtype (bf16: uint16 bits) that is C-contiguous,
        starts at a multiple of OUT_ALIGNMENT and shares no memory with an
        input or state buffer of the run; any other `out=` array (a bf16
        output's float32, a strided view) is filled by a copy from a kept
        buffer after the run, and outputs `out=` leaves out go to kept
        buffers, neither allocated nor converted (a decode step asks for its
        next ids, not for the logits, whose widening to float32 took 0.17
        ms of a 19 ms step). No output needs zeroing first: every tile writes each
        element of its result (the intermediates, reused between runs
        without zeroing, rely on that too), so `out=` may hold anything.
        Two `out=` arrays that share memory are refused before the run
        (`check_disjoint_out`)."""
        buffers: dict[str, tuple] = {}
        copies = []
        if items is not None:
            for name, array in items:
                dtype = self._output_dtypes[name]
                if check_out(name, array, workspace.shapes[name], dtype) and \
                        array.flags.c_contiguous:
                    address = array.ctypes.data
                    if address % OUT_ALIGNMENT == 0 and not self._overlaps(
                            address, address + array.nbytes, supplied, constants):
                        buffers[name] = (array, address)
                        continue
                buffers[name] = storage = workspace.output(name, dtype)
                copies.append((array, storage[0], dtype))
        for name, dtype in self._outputs:
            if name in buffers:
                continue
            if items is None and dtype != "bf16":
                buffers[name] = aligned.new_output(workspace.shapes[name], _STORAGE[dtype],
                                                    OUT_ALIGNMENT)
            else:
                buffers[name] = workspace.output(name, dtype)
        return buffers, copies

    def _overlaps(self, start: int, end: int, supplied: dict,
                  constants: Constants | None) -> bool:
        """Whether the bytes [start, end) overlap one of the run's inputs or
        state buffers (written in place, the program would read what it
        has written)."""
        for name, array in supplied.items():
            address = self._address(name, array)
            if address < end and start < address + array.nbytes:
                return True
        return constants is not None and constants.overlaps(start, end)

    def _fill_table(self, workspace: _Workspace, supplied: dict, outputs: dict,
                    constants: Constants | None) -> None:
        """Writes the addresses of the run's arrays into the table."""
        table, slots, written = workspace.table, workspace.slots, workspace.addresses
        if workspace.constants is not constants:
            # A run without these constants may have changed their words.
            if constants is not None:
                for name, address in constants.addresses.items():
                    table[slots[name]] = written[name] = address
            workspace.constants = constants
        for name, array in supplied.items():
            address = self._address(name, array)
            if written.get(name) != address:
                table[slots[name]] = written[name] = address
        for name, (_, address) in outputs.items():
            table[slots[name]] = address

    def _run(self, workspace: _Workspace, supplied: dict | None, outputs: dict | None,
             constants: Constants | None = None) -> None:
        """One run in `workspace` on the caller's arrays, writing `outputs`
        (by name, (array, address): see `_output_buffers`); `supplied` and
        `outputs` None: the table holds their addresses already (the
        workspace's `plan`)."""
        if supplied is not None:
            self._fill_table(workspace, supplied, outputs, constants)
        args, counters = workspace.args, workspace.counters
        counters.fill(0)
        self._functions["init"](*args, workspace.counters_arg)
        workspace.header[layout.SPIN_MICROSECONDS_WORD] = self._spin
        count = workers.run_workers(self.workers) if self.adapt_workers else self.workers
        start = time.perf_counter_ns()
        run_interruptible(self._pool_entry, workspace.arguments_address, count,
                          workspace.header, self._spin,
                          join=workspace.last_ns is not None and
                          workspace.last_ns < JOIN_BELOW_NS)
        workspace.last_ns = time.perf_counter_ns() - start
        layout.check_header(self.abi, workspace.header)
        #: The number of workers the last run used (`adapt_workers`).
        self.last_workers = count
        if self.abi.trace:
            self._trace = Trace.decode(self.abi, counters, count)
        layout.check_status(self.abi, self._functions["check"](*args, workspace.counters_arg))

