//===- Passes.td - Passes of the event dialect ------------*- tablegen -*-===//

#ifndef ETC_EVENT_TRANSFORMS_PASSES_TD
#define ETC_EVENT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def EventInferDependencies : Pass<"event-infer-dependencies", "::etc::event::GraphOp"> {
  let summary = "Derives event tensors and wait/notify maps from access footprints";
  let description = [{
    Turns an L1 task graph into an L2 event graph. Tasks are taken in textual
    order (program order). For every buffer, a reader waits on the last
    writer (read after write), a writer on the previous writer (write after
    write) and on the readers since then (write after read); an index buffer
    of `indices` counts as a whole-buffer read.

    For each such pair the producer's and the consumer's footprints are
    compared buffer dimension by buffer dimension, and a producer grid
    dimension `p` becomes an event dimension when its tiles
    (`d_p * T`, size <= T) contain each consumer tile:
    * the consumer tiles the same dimension with stride T: it waits with its
      own tile index (aligned);
    * the consumer's tile divides T (T = m * its stride): it waits with
      `d_c floordiv m`;
    * the consumer reads one fixed box inside one producer tile: it waits on
      that constant coordinate.
    The consumer's grid extent must provably stay inside the producer's
    (equal values, constants, or `affine.apply`s of the same symbols).
    Every other producer grid dimension is collapsed: whole-dimension or
    larger consumer boxes, misaligned or unanalysable offsets, and grid
    dimensions absent from the footprint (split reductions). A collapsed
    dimension is correct but coarser: each element's `count` is the product
    of the collapsed grid extents (an `arith.constant`, a grid value, an
    `affine.apply` or `arith.muli` when symbolic); with every dimension
    collapsed the event is a single counter expecting all producer tiles.

    The event has one dimension per kept grid dimension (static when the
    grid value is a constant, else `?` sized by the grid value) and is
    allocated right before the producer. Consumers that need the same
    (producer, notify map) share one event; of several events from one
    producer to one consumer, those subsumed by a coarser one are dropped.

    Graphs whose tasks already wait or notify are left unchanged, so the
    pass is idempotent. A footprint whose last tile starts past the end of a
    static buffer dimension is an error naming the task and buffer.

    Before (L1):
    ```mlir
    event.task "scale" grid(%rows, %c2)
        writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {...}
    event.task "rowsum" grid(%rows)
        reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?]) {...}
    ```
    After (L2): one counter per row block, expecting the 2 column tiles.
    ```mlir
    %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
    event.task "scale" grid(%rows, %c2) writes(...)
        notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {...}
    event.task "rowsum" grid(%rows) reads(...)
        waits(%e : !event.tensor<?> (d0) -> (d0)) {...}
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::affine::AffineDialect"];
}

def EventCheckSchedule : Pass<"event-check-schedule", "::etc::event::GraphOp"> {
  let summary = "Proves an event graph balanced, acyclic and deadlock-free";
  let description = [{
    Checks an L2 event graph before scheduling and fails with an error naming
    the event and the tasks when it cannot prove:
    * balance: every element's expected count equals the number of notifies
      that target it, for all values of the symbols;
    * acyclicity and co-residency safety: every task waits only on events
      notified by tasks earlier in the global order, so the unfinished task
      with the smallest global index can always run when all workers are
      resident.
    Events without a static `count` (indirect notify maps) are counted at run
    time and are exempt from the balance proof.
  }];
}

def EventStaticSchedule : Pass<"event-static-schedule", "::mlir::ModuleOp"> {
  let summary = "Schedules each event graph into a persistent worker program";
  let description = [{
    Replaces each `event.graph @g` by three functions that share its
    arguments plus a trailing `memref<?xi32>` buffer of event counters:
    * `@g_counters(args) -> index`: how many counters the program needs;
    * `@g_init(args, counters)`: writes each counter's expected count (run
      once, before any worker starts);
    * `@g_worker(args, counters)`: the persistent loop. All tile tasks are put
      in one global order (task order, then row-major tile order); task `t`
      goes to worker `t mod event.worker_count` under `policy=round-robin`;
      each worker runs its tasks in increasing global order with
      `event.wait` before and `event.notify` after each tile body.
    The graph is checked as by `event-check-schedule` first.
  }];
  let options = [
    Option<"workers", "workers", "unsigned", /*default=*/"0",
           "Number of persistent workers the program is launched with, "
           "recorded as `event.workers`; 0 lets the runtime decide">,
    Option<"policy", "policy", "std::string", /*default=*/"\"round-robin\"",
           "How global task indices map to workers (round-robin)">,
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

#endif // ETC_EVENT_TRANSFORMS_PASSES_TD
