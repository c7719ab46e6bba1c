//===- Passes.td - ETC's conversion passes ----------------*- tablegen -*-===//

#ifndef ETC_CONVERSION_PASSES_TD
#define ETC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertEventToCPU : Pass<"convert-event-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lowers a scheduled event program for CPU worker threads";
  let description = [{
    Lowers the event ops of a scheduled program (L3) for the CPU target,
    where each worker is a host thread and a tile body runs on one lane:
    * `event.worker_id` / `event.worker_count` become two trailing `index`
      arguments of the worker function;
    * `event.view` becomes a pointer into the counter buffer;
    * `event.wait` spins on an acquire load of the counter until it is 0,
      calling `sched_yield` between tries so that more workers than cores
      still make progress;
    * `event.notify` is a release `atomicrmw sub` of 1;
    * `event.lane_id` is 0, `event.lane_count` is 1, `event.lane_barrier`
      disappears.
    Every function gets `llvm.emit_c_interface`.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::LLVM::LLVMDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

#endif // ETC_CONVERSION_PASSES_TD
