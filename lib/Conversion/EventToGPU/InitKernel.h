//===- InitKernel.h - Initialisation kernels on one CTA ---------*- C++ -*-===//

#ifndef ETC_LIB_CONVERSION_EVENTTOGPU_INITKERNEL_H
#define ETC_LIB_CONVERSION_EVENTTOGPU_INITKERNEL_H

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

namespace etc {

/// `gpu.thread_id x == 0`: the thread that polls and updates counters on
/// behalf of its CTA, and runs the init kernels' sequential parts.
mlir::Value isFirstThread(mlir::OpBuilder &b, mlir::Location loc);

/// Turns the body of `func`, which uses no worker op, into code for one CTA:
/// independent top-level loops (iterations that only store and read no
/// buffer the kernel writes, or marked so by the scheduler with
/// `event::kIndependentIterationsAttrName`) are strided over the threads,
/// as are marked loops nested in a top-level op that writes nothing outside
/// them (which then runs on every thread); every other op with write
/// effects runs on thread 0, and a barrier follows each of them so that the
/// next one sees their stores. Consecutive thread-0 ops (with only ops free
/// of memory effects between them) share one `scf.if` and one barrier. Ops
/// without write effects run on every thread, which keeps their results
/// available to all. Fails on a thread-0 op with results.
mlir::LogicalResult distributeOverCTA(mlir::gpu::GPUFuncOp func);

} // namespace etc

#endif // ETC_LIB_CONVERSION_EVENTTOGPU_INITKERNEL_H
