//===- EventToCPU.h - Event ops for CPU worker threads ----------*- C++ -*-===//

#ifndef ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H
#define ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Transforms/DialectConversion.h"

namespace etc {

/// The C library's system call entry, which blocking waits and their wakes
/// call for the futex system call.
inline constexpr llvm::StringLiteral kSyscallName = "syscall";
/// The functions a wait blocks in and a notify wakes the blocked with.
inline constexpr llvm::StringLiteral kSleepName = "__etc_sleep";
inline constexpr llvm::StringLiteral kWakeName = "__etc_wake";

/// Declares `llvm.func @syscall(i64, ...) -> i64` in `module` unless it is
/// there; fails with an error if the symbol has another meaning.
mlir::LogicalResult declareSyscall(mlir::ModuleOp module);

/// Declares `@syscall` and defines, unless they are there,
/// `llvm.func internal @__etc_sleep(element, seen, sleepers, nanoseconds)`
/// (counts the thread in the run header's sleepers word and, if the i32
/// element still holds `seen`, blocks in a futex wait on it for at most
/// `nanoseconds`) and `llvm.func internal @__etc_wake(element)` (wakes every
/// thread blocked on it). Fails if a symbol has another meaning.
mlir::LogicalResult defineFutexFunctions(mlir::ModuleOp module);

/// The function the watchdog and traces read the clock with.
inline constexpr llvm::StringLiteral kMonotonicClockName = "__etc_monotonic_ns";

/// Defines `llvm.func internal @__etc_monotonic_ns() -> i64`, which returns
/// `CLOCK_MONOTONIC` in nanoseconds through the C library's
/// `clock_gettime`, unless it is there; fails if the symbol has another
/// meaning.
mlir::LogicalResult defineMonotonicClock(mlir::ModuleOp module);

/// Converts `!event.tensor` to `!llvm.ptr` (the address of its first
/// counter) and leaves every other type alone.
void populateEventToCPUTypeConversions(mlir::TypeConverter &typeConverter);

/// Adds the patterns that lower `event.view`, `event.wait`, `event.notify`,
/// `event.notify_ready`, the queue ops, the run-header ops and the lane ops
/// for CPU worker threads. `event.wait` and `event.queue_pop` call the spin
/// functions that `defineSpinFunctions` defines (which call the clock of
/// `defineMonotonicClock` and `@__etc_sleep`); `event.notify`,
/// `event.notify_ready` and `event.queue_push` call `@__etc_wake` (both
/// defined by `defineFutexFunctions`); the trace ops read the clock too. The patterns
/// create `event.worker_id` for the records: like the program's own, they
/// become function arguments (see `convert-event-to-cpu`). `event.idle`
/// reports a worker idle for longer than `watchdogMs` through
/// `@__etc_watchdog_report` and yields the core with the `sched_yield`
/// system call (`declareSyscall`).
void populateEventToCPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns, int64_t watchdogMs);

/// Adds the patterns that lower the operations of a graph on several ranks
/// (`event.rank_id`, `event.rank_count`, `event.put`,
/// `event.remote_notify`) to calls of MPI's one-sided communication through
/// the transport block of the buffer table (`Event/IR/TransportLayout.h`).
/// Part of `populateEventToCPUConversionPatterns`.
void populateRemoteToCPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns);

} // namespace etc

#endif // ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H
