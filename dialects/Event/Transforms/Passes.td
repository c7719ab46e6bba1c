//===- Passes.td - Passes of the event dialect ------------*- tablegen -*-===//

#ifndef ETC_EVENT_TRANSFORMS_PASSES_TD
#define ETC_EVENT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def EventInferDependencies : Pass<"event-infer-dependencies", "::etc::event::GraphOp"> {
  let summary = "Derives event tensors and wait/notify maps from access footprints";
  let description = [{
    Turns an L1 task graph into an L2 event graph. For every pair of tasks
    that touch the same buffer — read after write, write after read and
    write after write, in textual order — it allocates an event tensor as
    small as the dependency allows and adds a notify map to the earlier task
    and a wait map to the later one. Expected counts are computed from the
    grid sizes (symbolic where the grids are).

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
