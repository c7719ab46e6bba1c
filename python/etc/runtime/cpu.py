"""The CPU runtime: the worker function JIT-compiled by MLIR's ExecutionEngine
and called from N host threads at once.

ctypes releases the GIL for the duration of each foreign call, so the workers
run concurrently and their waits, notifies and atomics race for real.

ABI of the lowered program for graph `g` (see `event-static-schedule` and
`convert-event-to-cpu`), every function with a C interface:
  g_counters(symbols..., table) -> index       size of the counter buffer
  g_init(symbols..., table, counters)          writes each counter's expected count
  g_worker(symbols..., table, counters, worker_id, worker_count, stop)
                                               stop: address of an i32; setting it
                                               makes every worker return early
  g_check(symbols..., table, counters) -> i32  after the run: 0 clean, 1 task
                                               queue overflow, 2 unbalanced
where `symbols` are the graph's symbolic dimensions (`index`) and `table` is
the buffer table, a `memref<?xi64>` (see `buffer_table`).
The same ABI serves the static and the dynamic schedule: for the dynamic one
the counter buffer also holds the task queue, pending counts and inverse
indices, all sized by g_counters and filled by g_init.
"""

from __future__ import annotations

import ctypes
import threading
from functools import lru_cache

import numpy as np
from mlir import ir

from . import jit
from .. import bfloat16
from ..binding import Signature, bind_symbols, check_input_names, concrete_shape

#: NumPy storage of each ETC dtype. bf16 has no NumPy type: it is stored as the
#: upper 16 bits of float32 (see `to_storage` / `from_storage`).
_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16),
            "i32": np.dtype(np.int32)}
_USER_DTYPE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.float32),
               "i32": np.dtype(np.int32)}


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


def buffer_table(arguments, buffers: dict, address=lambda array: array.ctypes.data) -> np.ndarray:
    """The buffer table of a call: for each buffer argument in order, its
    address and then the size of each dimension (`event.buffer` documents
    the layout). `address(array)` gives an array's address (a device
    pointer for device arrays)."""
    words: list[int] = []
    for arg in arguments:
        if arg.kind == "symbol":
            continue
        array = buffers[arg.name]
        words.append(address(array))
        words.extend(array.shape)
    return np.array(words or [0], dtype=np.uint64).view(np.int64)


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """Converts a user array to the buffer ETC reads (bf16: rounded to
    nearest even, as `etc.reference` rounds bf16 inputs)."""
    if dtype != "bf16":
        return np.ascontiguousarray(array)
    return bfloat16.to_bits(array)


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """The user array of an output buffer (bf16: widened to float32)."""
    if dtype != "bf16":
        return array
    return bfloat16.from_bits(array)


#: What each non-zero status of g_check means.
_CHECK_ERRORS = {
    1: "task queue overflow: more tasks were pushed than the queue holds "
       "(the program pushed some task twice)",
    2: "unbalanced events: some event counters did not reach zero; the program's "
       "notifies do not match its expected counts",
}


def _join_all(threads: list[threading.Thread]) -> None:
    """Joins every started thread, even through further Ctrl-Cs: the caller
    must not return while a worker still runs."""
    for thread in threads:
        while thread.is_alive():
            try:
                thread.join()
            except KeyboardInterrupt:
                continue


class CPURuntime:
    """Runs one lowered module with a fixed number of host worker threads.

    `graph` is the compiled graph, or anything with its `name`, `arguments`
    and `outputs`; its signature is copied now (see `etc.binding.Signature`).
    """

    def __init__(self, graph, module: ir.Module, workers: int, opt_level: int = 2):
        self.signature = Signature.of(graph)
        self.workers = workers
        self.arguments = self.signature.arguments
        name = self.signature.name
        self._counters_fn = f"{name}_counters"
        self._init_fn = f"{name}_init"
        self._worker_fn = f"{name}_worker"
        self._check_fn = f"{name}_check"
        self.engine = jit.create(module, name, opt_level)
        # Looking the entry points up now makes the JIT generate their code
        # here, at compile time, instead of inside the first `run`, and turns
        # a program without the expected ABI into an error before any call.
        for function in (self._counters_fn, self._init_fn, self._worker_fn, self._check_fn):
            jit.lookup(self.engine, function, name)

    # -- argument binding -------------------------------------------------

    def _bind(self, inputs: dict) -> tuple[dict[str, int], dict[str, np.ndarray]]:
        check_input_names(self.signature.name, self.arguments, inputs)
        for arg in self.arguments:
            if arg.kind != "input":
                continue
            array = inputs[arg.name]
            if not isinstance(array, np.ndarray):
                raise TypeError(f"input {arg.name!r} must be a numpy.ndarray, got {type(array).__name__}")
            want = _USER_DTYPE[arg.dtype]
            if array.dtype != want:
                raise TypeError(
                    f"input {arg.name!r} has dtype {array.dtype}, expected {want} for {arg.dtype} "
                    "(inputs are not cast implicitly)")
        for arg in self.arguments:
            if arg.kind == "state":
                check_state(arg, inputs[arg.name])
        symbols = bind_symbols(self.arguments, {n: a.shape for n, a in inputs.items()})
        buffers: dict[str, np.ndarray] = {}
        for arg in self.arguments:
            if arg.kind == "state":
                buffers[arg.name] = inputs[arg.name]
            elif arg.kind == "input":
                buffers[arg.name] = to_storage(inputs[arg.name], arg.dtype)
            elif arg.kind in ("output", "intermediate"):
                buffers[arg.name] = np.zeros(concrete_shape(arg.shape, symbols), _STORAGE[arg.dtype])
        return symbols, buffers

    # -- calls --------------------------------------------------------------

    def _packed_args(self, symbols, buffers, keep):
        """ctypes pointers for the symbols and the buffer table, in order;
        `keep` holds the objects they point to alive."""
        pointers = []
        for arg in self.arguments:
            if arg.kind == "symbol":
                value = ctypes.c_longlong(symbols[arg.name])
                keep.append(value)
                pointers.append(ctypes.pointer(value))
        table = buffer_table(self.arguments, buffers)
        desc = _descriptor(table)
        pointer = ctypes.pointer(desc)
        keep.extend([table, desc, pointer])
        pointers.append(ctypes.pointer(pointer))
        return pointers

    def run(self, inputs: dict) -> list[np.ndarray]:
        symbols, buffers = self._bind(inputs)
        keep: list = []
        args = self._packed_args(symbols, buffers, keep)

        count = ctypes.c_longlong(0)
        self.engine.invoke(self._counters_fn, *args, ctypes.pointer(count))
        counters = np.zeros(max(count.value, 1), np.int32)
        counters_desc = _descriptor(counters)
        counters_ptr = ctypes.pointer(counters_desc)
        counters_arg = ctypes.pointer(counters_ptr)
        self.engine.invoke(self._init_fn, *args, counters_arg)

        errors: list[BaseException] = []
        worker = self.engine.lookup(self._worker_fn)
        total = ctypes.c_longlong(self.workers)
        # The stop flag: non-zero makes every spinning worker give up and
        # return (see convert-event-to-cpu).
        stop = ctypes.c_int32(0)
        stop_address = ctypes.c_void_p(ctypes.addressof(stop))

        def work(worker_id: int) -> None:
            try:
                wid = ctypes.c_longlong(worker_id)
                call = args + [counters_arg, ctypes.pointer(wid), ctypes.pointer(total),
                               ctypes.pointer(stop_address)]
                packed = (ctypes.c_void_p * len(call))(
                    *[ctypes.cast(p, ctypes.c_void_p) for p in call])
                worker(packed)
            except BaseException as error:  # reported on the calling thread
                errors.append(error)

        threads = [threading.Thread(target=work, args=(w,), name=f"etc-worker-{w}")
                   for w in range(self.workers)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except BaseException:
            # Ctrl-C (or any exception) while the workers start or run: they
            # write into `buffers` and `counters` until they return, so stop
            # them and wait before this frame lets go of those buffers.
            stop.value = 1
            _join_all(threads)
            raise
        if errors:
            raise errors[0]
        status = ctypes.c_int32(-1)
        self.engine.invoke(self._check_fn, *args, counters_arg, ctypes.pointer(status))
        if status.value != 0:
            raise RuntimeError(f"{self.signature.name}: {_CHECK_ERRORS.get(status.value, f'status {status.value}')}")
        return [from_storage(buffers[name], self._dtype(name)) for name in self.signature.outputs]

    def _dtype(self, name: str) -> str:
        return next(a.dtype for a in self.arguments if a.name == name)
