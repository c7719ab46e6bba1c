//===- EventQueue.h - The task queue protocol shared by the targets -*- C++ -*-===//
//
// `event.queue_push` and `event.queue_pop` follow one protocol on every
// target; only the atomics' synchronisation scope and the way a thread waits
// for a slot to be published differ (the GPU also runs it on one thread per
// CTA and broadcasts the result).
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_EVENTCOMMON_EVENTQUEUE_H
#define ETC_CONVERSION_EVENTCOMMON_EVENTQUEUE_H

#include "mlir/IR/Builders.h"

namespace etc {

/// Builds `event.claim`: a relaxed atomic increment of i32 element `index`
/// (an index) of `counters`, returning the value it held before as an index.
/// Atomics use `syncScope` ("" for the system).
mlir::Value buildClaim(mlir::OpBuilder &builder, mlir::Location loc,
                       mlir::Value counters, mlir::Value index,
                       llvm::StringRef syncScope);

/// Builds a push of `task` into the queue at word `queue` of `counters`:
/// a relaxed atomic increment of the tail reserves slot `s`; if
/// `s < capacity`, a release store publishes `task + 1` into it, otherwise
/// the error word is set. Atomics use `syncScope` ("" for the system).
/// `afterPublish`, when set, is built after the store with the slot's
/// address (the CPU wakes a worker blocked on the slot there).
void buildQueuePush(
    mlir::OpBuilder &builder, mlir::Location loc, mlir::Value counters,
    mlir::Value queue, mlir::Value capacity, mlir::Value task,
    llvm::StringRef syncScope,
    llvm::function_ref<void(mlir::OpBuilder &, mlir::Location, mlir::Value)>
        afterPublish = nullptr);

/// Builds a pop: a relaxed atomic increment of the head claims slot `s`; if
/// `s < capacity`, `waitForSlot(slot pointer, s)` must return the slot's
/// value once it is non-zero (loaded with acquire), and the result is that
/// value minus one; otherwise the result is `capacity`. Returns an i32.
mlir::Value buildQueuePop(
    mlir::OpBuilder &builder, mlir::Location loc, mlir::Value counters,
    mlir::Value queue, mlir::Value capacity, llvm::StringRef syncScope,
    llvm::function_ref<mlir::Value(mlir::OpBuilder &, mlir::Location,
                                   mlir::Value, mlir::Value)>
        waitForSlot);

/// Builds a pop that never waits (`event.queue_try_pop`): while the head
/// `h` is below `capacity` and slot `h` (loaded with acquire) is published,
/// a compare-and-swap advances the head from `h`, retrying when another
/// worker took the slot first; the result is the slot's value minus one
/// (`capacity` for the end marker `capacity + 1`). With the head at the
/// capacity the result is `capacity`, and with slot `h` not yet published
/// `capacity + 1`. Returns an i32. With `acquireOnTake`, the loads of the
/// slot are relaxed and one acquire fence follows when a task was taken
/// (the GPU, where an acquire load invalidates the SM's L1 at every retry);
/// otherwise each load of the slot acquires.
mlir::Value buildQueueTryPop(mlir::OpBuilder &builder, mlir::Location loc,
                             mlir::Value counters, mlir::Value queue,
                             mlir::Value capacity, llvm::StringRef syncScope,
                             bool acquireOnTake = false);

/// `capacity + 1` (as i32) when `published`, a slot's value, is 0 (the spin
/// gave up: the run was stopped), else `published`: a `waitForSlot` that
/// returns this makes the pop return the capacity, so worker loops end.
mlir::Value exhaustedIfEmpty(mlir::OpBuilder &builder, mlir::Location loc,
                             mlir::Value published, mlir::Value capacity);

} // namespace etc

#endif // ETC_CONVERSION_EVENTCOMMON_EVENTQUEUE_H
