//===- CTA.h - What a CTA's threads do together ----------------*- C++ -*-===//
//
// The pieces every GPU lowering of an event op builds from: thread 0 acts
// for its CTA, and the CTA shares what it found through a reducing barrier
// or a broadcast word in shared memory.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_CONVERSION_EVENTTOGPU_CTA_H
#define ETC_LIB_CONVERSION_EVENTTOGPU_CTA_H

#include "mlir/IR/Builders.h"
#include "mlir/Transforms/DialectConversion.h"

namespace etc {

/// The LLVM synchronisation scope of counter accesses on one GPU (`.gpu` in
/// PTX), since producer and consumer CTAs may be on any SM.
inline constexpr llvm::StringLiteral kDeviceScope = "device";
/// The scope of counters other GPUs update (symmetric events, notified
/// through NVSHMEM): the system (no `syncscope`; `.sys` in PTX).
inline constexpr llvm::StringLiteral kSystemScope = "";

/// `scf.if %condition { <body> }`, with the builder left after it.
void buildIf(mlir::OpBuilder &b, mlir::Location loc, mlir::Value condition,
             llvm::function_ref<void(mlir::OpBuilder &, mlir::Location)> body);

/// On thread 0 only, `body` (which yields an i1); false on every other
/// thread.
mlir::Value
onFirstThread(mlir::OpBuilder &b, mlir::Location loc,
              llvm::function_ref<mlir::Value(mlir::OpBuilder &, mlir::Location)>
                  body);

/// `bar.red.or.pred`: a CTA barrier that also returns, to every thread,
/// whether `predicate` (an i1) held in any thread. It orders memory like
/// `bar.sync`, so a value thread 0 computed after acquiring reaches the CTA
/// with the same guarantees as through shared memory and two barriers.
mlir::Value barrierAny(mlir::OpBuilder &b, mlir::Location loc,
                       mlir::Value predicate);

/// The CTA's broadcast word: the `memref<1xi32, workgroup>` attribution that
/// convert-event-to-gpu gives each kernel that takes tasks from a queue,
/// through which thread 0 hands the task id to every thread.
mlir::FailureOr<mlir::Value>
broadcastWord(mlir::ConversionPatternRewriter &rewriter, mlir::Operation *op);

/// Thread 0's i32 `body` handed to every thread of the CTA, as an index:
/// a barrier (the broadcast word is free), thread 0 computes it and stores
/// it to the broadcast word, a second barrier, every thread loads it.
/// Fails like `broadcastWord`.
mlir::FailureOr<mlir::Value> broadcastFromFirstThread(
    mlir::ConversionPatternRewriter &rewriter, mlir::Operation *op,
    llvm::function_ref<mlir::Value(mlir::OpBuilder &, mlir::Location)> body);

/// The GPU's clock for the watchdog and traces: `%globaltimer`, in
/// nanoseconds, the same on every SM.
mlir::Value globalTimer(mlir::OpBuilder &b, mlir::Location loc);

/// The worker (block) id as an index.
mlir::Value blockId(mlir::OpBuilder &b, mlir::Location loc);

} // namespace etc

#endif // ETC_LIB_CONVERSION_EVENTTOGPU_CTA_H
