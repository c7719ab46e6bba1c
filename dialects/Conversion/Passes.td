//===- Passes.td - ETC's conversion passes ----------------*- tablegen -*-===//

#ifndef ETC_CONVERSION_PASSES_TD
#define ETC_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertEventToCPU : Pass<"convert-event-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lowers a scheduled event program for CPU worker threads";
  let description = [{
    Lowers the event ops of a scheduled program (L3) for the CPU target,
    where each worker is a host thread and a tile body runs on one lane:
    * in every `func.func` using `event.worker_id` / `event.worker_count`,
      they become two trailing `index` arguments `%worker_id, %worker_count`
      that each host thread passes;
    * `event.view %counters[%offset]` becomes the address of its first
      counter (`memref.extract_aligned_pointer_as_index`, `llvm.inttoptr`,
      `llvm.getelementptr`); elements are addressed row-major from it;
    * `event.wait` spins on `llvm.load ... atomic acquire` of the counter
      until it is no longer positive, calling the C library's
      `sched_yield` (declared as `func.func private @sched_yield() -> i32`)
      between polls, so that more workers than cores still make progress;
    * `event.notify` is `llvm.atomicrmw sub ... release` of 1;
    * `event.lane_id` is 0, `event.lane_count` is 1, `event.lane_barrier`
      disappears.
    Every function with a body gets `llvm.emit_c_interface`, so the runtime
    calls `_mlir_ciface_<name>` with memref descriptors.

    Before:
    ```mlir
    func.func @g_worker(%n: index, %counters: memref<?xi32>) {
      %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
      %w = event.worker_id
      ...
      event.wait %e[%i] : !event.tensor<?>
    ```
    After:
    ```mlir
    func.func @g_worker(%n: index, %counters: memref<?xi32>, %worker_id: index,
                        %worker_count: index) attributes {llvm.emit_c_interface} {
      %address = memref.extract_aligned_pointer_as_index %counters : memref<?xi32> -> index
      ...
      %e = llvm.getelementptr %base[%offset] : (!llvm.ptr, i64) -> !llvm.ptr, i32
      ...
      %p = llvm.getelementptr %e[%i64] : (!llvm.ptr, i64) -> !llvm.ptr, i32
      scf.while : () -> () {
        %count = llvm.load %p atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
        %pending = arith.cmpi sgt, %count, %c0_i32 : i32
        scf.condition(%pending)
      } do {
        %0 = func.call @sched_yield() : () -> i32
        scf.yield
      }
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::LLVM::LLVMDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

#endif // ETC_CONVERSION_PASSES_TD
