"""End-to-end smoke test of the static schedule on the CPU target.

Hand-written L2 graphs go through `etc-opt -event-static-schedule
-etc-lower-to-cpu`; the LLVM-dialect result is JIT-compiled with MLIR's
ExecutionEngine and `<g>_counters`, `<g>_init` and `<g>_worker` are called
through their C interfaces, the workers from several host threads at once,
exactly as the runtime does. Results are compared with NumPy.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.runtime import get_ranked_memref_descriptor

from etc.runtime import layout

# h = 2 x in 1x4 tiles; y = h + 1 per row once both tiles of the row are done;
# s = sum(y) once every row is done (a symbolic count: n).
PIPELINE_GRAPH = """
event.graph @smoke(%n: index, %x: memref<?x8xf32>, %h: memref<?x8xf32> {event.intermediate},
                   %y: memref<?x8xf32>, %s: memref<1xf32>) {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %rows = event.alloc(%n) count(%c2) : !event.tensor<?>
  %all = event.alloc() count(%n) : !event.tensor<>
  event.task "scale" grid(%n, %c2)
      reads(%x : memref<?x8xf32> (d0, d1) -> (d0, d1 * 4) [1, 4])
      writes(%h : memref<?x8xf32> (d0, d1) -> (d0, d1 * 4) [1, 4])
      notifies(%rows : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c4 = arith.constant 4 : index
    %one = arith.constant 1 : index
    %two = arith.constant 2.0 : f32
    %base = arith.muli %j, %c4 : index
    scf.for %k = %c0 to %c4 step %one {
      %col = arith.addi %base, %k : index
      %v = memref.load %x[%i, %col] : memref<?x8xf32>
      %w = arith.mulf %v, %two : f32
      memref.store %w, %h[%i, %col] : memref<?x8xf32>
    }
  }
  event.task "add" grid(%n)
      reads(%h : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      writes(%y : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      waits(%rows : !event.tensor<?> (d0) -> (d0))
      notifies(%all : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %c8 = arith.constant 8 : index
    %one = arith.constant 1 : index
    %fone = arith.constant 1.0 : f32
    scf.for %k = %c0 to %c8 step %one {
      %v = memref.load %h[%i, %k] : memref<?x8xf32>
      %w = arith.addf %v, %fone : f32
      memref.store %w, %y[%i, %k] : memref<?x8xf32>
    }
  }
  event.task "total" grid(%c1)
      reads(%y : memref<?x8xf32> (d0) -> (0, 0) [?, ?])
      writes(%s : memref<1xf32> (d0) -> (0) [1])
      waits(%all : !event.tensor<> (d0) -> ()) {
  ^bb0(%t: index):
    %c0 = arith.constant 0 : index
    %c8 = arith.constant 8 : index
    %one = arith.constant 1 : index
    %zero = arith.constant 0.0 : f32
    %nrows = memref.dim %y, %c0 : memref<?x8xf32>
    %sum = scf.for %r = %c0 to %nrows step %one iter_args(%acc = %zero) -> f32 {
      %inner = scf.for %k = %c0 to %c8 step %one iter_args(%a = %acc) -> f32 {
        %v = memref.load %y[%r, %k] : memref<?x8xf32>
        %b = arith.addf %a, %v : f32
        scf.yield %b : f32
      }
      scf.yield %inner : f32
    }
    memref.store %sum, %s[%c0] : memref<1xf32>
  }
}
"""

# p[t] = 3 x[t] per token; out[e] = sum of p[t] over the tokens routed to
# expert e, once all of them are done. The event has no `count`: g_init counts
# each expert's tokens through the indirect notify map.
ROUTED_GRAPH = """
event.graph @routed(%n: index, %experts: index, %route: memref<?xi32>, %x: memref<?xf32>,
                    %p: memref<?xf32> {event.intermediate}, %out: memref<?xf32>) {
  %done = event.alloc(%experts) : !event.tensor<?>
  event.task "produce" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%p : memref<?xf32> (d0) -> (d0) [1])
      notifies(%done : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
    %three = arith.constant 3.0 : f32
    %v = memref.load %x[%t] : memref<?xf32>
    %w = arith.mulf %v, %three : f32
    memref.store %w, %p[%t] : memref<?xf32>
  }
  event.task "consume" grid(%experts)
      reads(%p : memref<?xf32> (d0) -> (0) [?])
      writes(%out : memref<?xf32> (d0) -> (d0) [1])
      waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%e: index):
    %c0 = arith.constant 0 : index
    %one = arith.constant 1 : index
    %zero = arith.constant 0.0 : f32
    %tokens = memref.dim %p, %c0 : memref<?xf32>
    %sum = scf.for %t = %c0 to %tokens step %one iter_args(%acc = %zero) -> f32 {
      %r = memref.load %route[%t] : memref<?xi32>
      %ri = arith.index_cast %r : i32 to index
      %mine = arith.cmpi eq, %ri, %e : index
      %v = memref.load %p[%t] : memref<?xf32>
      %a = arith.addf %acc, %v : f32
      %next = arith.select %mine, %a, %acc : f32
      scf.yield %next : f32
    }
    memref.store %sum, %out[%e] : memref<?xf32>
  }
}
"""

WORKERS = [1, 2, 3, 5]


class Program:
    """The three entry points of one scheduled graph, JIT-compiled."""

    def __init__(self, llvm_ir: str, graph: str, schedule: str = "static"):
        self.schedule = schedule
        self.context = ir.Context()
        with self.context:
            module = ir.Module.parse(llvm_ir)
        self.engine = ExecutionEngine(module, opt_level=2)
        self.graph = graph
        packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        self.entries = {
            kind: packed(self.engine.raw_lookup(f"_mlir_ciface_{graph}_{kind}"))
            for kind in ("counters", "init", "worker", "check")
        }

    @staticmethod
    def _pack(args: list) -> tuple[ctypes.Array, list]:
        """The packed-call argument array: one pointer to each argument's storage.

        Integers are `index` (int64) values; NumPy arrays are passed as a
        pointer to a ranked memref descriptor (the C interface), so their
        storage is that pointer. Returns the array and the objects it points
        into, which must outlive the call."""
        storage: list = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                descriptor = get_ranked_memref_descriptor(arg)
                storage += [arg, descriptor, ctypes.pointer(descriptor)]
            else:
                storage.append(ctypes.c_int64(arg))
        slots = [item for item in storage if isinstance(item, (ctypes.c_int64, ctypes._Pointer))]
        pointers = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(slot) for slot in slots])
        return pointers, storage

    @staticmethod
    def _table_args(args: list) -> list:
        """The scheduled program's arguments for graph arguments `args`: the
        symbols (ints), then the buffer table: each array's address and sizes
        (see `event.buffer`)."""
        words = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                words += [arg.ctypes.data, *arg.shape]
        table = np.array(words, dtype=np.uint64).view(np.int64)
        return [arg for arg in args if not isinstance(arg, np.ndarray)] + [table]

    def run(self, args: list, workers: int) -> None:
        arrays = args
        args = self._table_args(args)
        counters_result = ctypes.c_int64(-1)
        pointers, keep = self._pack(args)
        packed = (ctypes.c_void_p * (len(args) + 1))(*pointers, ctypes.addressof(counters_result))
        self.entries["counters"](ctypes.cast(packed, ctypes.c_void_p))
        assert counters_result.value >= 0
        # Garbage in the buffer shows that g_init writes every counter.
        counters = np.full(max(counters_result.value, 1), 12345, dtype=np.int32)
        pointers, keep_init = self._pack(args + [counters])
        self.entries["init"](ctypes.cast(pointers, ctypes.c_void_p))

        errors = []

        def work(worker: int) -> None:
            try:
                call_pointers, keep_call = self._pack(args + [counters, worker, workers])
                self.entries["worker"](ctypes.cast(call_pointers, ctypes.c_void_p))
            except Exception as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive(), "a worker did not finish: deadlock?"
        assert not errors, errors
        # The run header says the run went through (the error record is only
        # written on a timeout, so its words keep the garbage); g_check says
        # 0 (clean); the static schedule's event counters are all back to 0.
        assert layout.header(counters)[layout.STATUS_WORD] == layout.RUNNING, counters
        status = ctypes.c_int32(-1)
        pointers, keep_check = self._pack(args + [counters])
        packed = (ctypes.c_void_p * (len(args) + 2))(*pointers, ctypes.addressof(status))
        self.entries["check"](ctypes.cast(packed, ctypes.c_void_p))
        assert status.value == 0, (status.value, counters)
        if "static" in self.schedule:
            assert (counters[: counters_result.value - layout.HEADER_WORDS] == 0).all(), counters
        del keep, keep_init, keep_check, arrays


def _compile(etc_opt, text: str, graph: str) -> Program:
    llvm_ir = etc_opt(text, "-event-static-schedule", "-etc-lower-to-cpu")
    return Program(llvm_ir, graph)


@pytest.fixture(scope="module")
def pipeline_program(etc_opt):
    return _compile(etc_opt, PIPELINE_GRAPH, "smoke")


@pytest.fixture(scope="module")
def routed_program(etc_opt):
    return _compile(etc_opt, ROUTED_GRAPH, "routed")


def _nested_op_names(operation) -> set[str]:
    names = {operation.name}
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                names |= _nested_op_names(op.operation)
    return names


@pytest.mark.parametrize("text", [PIPELINE_GRAPH, ROUTED_GRAPH])
def test_lowered_module_is_llvm_only(etc_opt, text):
    llvm_ir = etc_opt(text, "-event-static-schedule", "-etc-lower-to-cpu")
    with ir.Context():
        module = ir.Module.parse(llvm_ir)
        names = _nested_op_names(module.operation)
    assert {name.split(".")[0] for name in names} == {"builtin", "llvm"}, names


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("n", [1, 7, 40])
def test_pipeline_graph(pipeline_program, workers, n):
    rng = np.random.default_rng(n * 10 + workers)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    h = np.zeros_like(x)
    y = np.zeros_like(x)
    s = np.zeros(1, dtype=np.float32)
    pipeline_program.run([n, x, h, y, s], workers)
    np.testing.assert_allclose(h, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    np.testing.assert_allclose(s[0], (2 * x + 1).sum(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("n,experts", [(1, 1), (13, 4), (64, 7)])
def test_routed_graph(routed_program, workers, n, experts):
    rng = np.random.default_rng(n + experts + workers)
    route = rng.integers(0, experts, n).astype(np.int32)
    x = rng.standard_normal(n).astype(np.float32)
    p = np.zeros_like(x)
    out = np.full(experts, np.nan, dtype=np.float32)
    routed_program.run([n, experts, route, x, p, out], workers)
    expected = np.zeros(experts, dtype=np.float32)
    np.add.at(expected, route, 3 * x)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


# Tile (i, j) of "chunk" runs only while j < ceildiv(len[i], 4) (a live
# bound): it marks hits[i, j] and notifies done[i], which has no `count`,
# so g_init counts the live tiles of each row. "combine" tile i, live only
# when len[i] > 0 (i < 1000 len[i]), waits on done[i] and stores how many
# tiles of row i ran.
LIVE_GRAPH = """
event.graph @live(%r: index, %len: memref<?xi32>, %hits: memref<?x8xi32>,
                  %ran: memref<?xi32>) {
  %c8 = arith.constant 8 : index
  %done = event.alloc(%r) : !event.tensor<?>
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 4) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
    %one = arith.constant 1 : i32
    memref.store %one, %hits[%i, %j] : memref<?x8xi32>
  }
  event.task "combine" grid(%r)
      writes(%ran : memref<?xi32> (d0) -> (d0) [1])
      waits(%done : !event.tensor<?> (d0) -> (d0))
      indices(%len : memref<?xi32>)
      live(d0 below (d0) -> (d0 * 1000) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c8i = arith.constant 8 : index
    %zero = arith.constant 0 : i32
    %sum = scf.for %j = %c0 to %c8i step %c1 iter_args(%acc = %zero) -> i32 {
      %v = memref.load %hits[%i, %j] : memref<?x8xi32>
      %a = arith.addi %acc, %v : i32
      scf.yield %a : i32
    }
    memref.store %sum, %ran[%i] : memref<?xi32>
  }
}
"""


@pytest.mark.parametrize("schedule", ["-event-static-schedule", "-event-dynamic-schedule"])
def test_live_bounds_run_only_live_tiles(etc_opt, schedule):
    program = Program(etc_opt(LIVE_GRAPH, schedule, "-etc-lower-to-cpu"), "live", schedule)
    rng = np.random.default_rng(len(schedule))
    for workers in (1, 3, 5):
        for rows in (1, 6, 17):
            lengths = rng.integers(0, 40, rows).astype(np.int32)
            lengths[0] = 0  # a request with no live tile: done[0] is ready at once
            hits = np.zeros((rows, 8), np.int32)
            ran = np.full(rows, -1, np.int32)
            program.run([rows, lengths, hits, ran], workers)
            live = np.minimum(-(-lengths // 4), 8)
            np.testing.assert_array_equal(hits, np.arange(8)[None, :] < live[:, None])
            np.testing.assert_array_equal(ran, np.where(lengths > 0, live, -1))
