//===- EventToGPU.h - Event ops for persistent CTAs -------------*- C++ -*-===//

#ifndef ETC_CONVERSION_EVENTTOGPU_EVENTTOGPU_H
#define ETC_CONVERSION_EVENTTOGPU_EVENTTOGPU_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Transforms/DialectConversion.h"

namespace etc {

/// The first sleep, in nanoseconds, of a CTA waiting on a counter that is not
/// ready; each further poll doubles it up to `kWaitMaxSleepNs`.
inline constexpr int32_t kWaitFirstSleepNs = 32;
inline constexpr int32_t kWaitMaxSleepNs = 512;

/// The synchronisation scope at which a CTA waits on or tests the counters
/// of `event` (an `!event.tensor`): the system ("") for a symmetric event,
/// which other GPUs notify through NVSHMEM's atomics after putting the data
/// it guards (the PTX memory model orders another device's writes only at
/// system scope), the GPU ("device") otherwise.
llvm::StringRef counterScope(mlir::Value event);

/// Converts `!event.tensor` to `!llvm.ptr` (the generic address of its first
/// counter) and leaves every other type alone.
void populateEventToGPUTypeConversions(mlir::TypeConverter &typeConverter);

/// Adds the patterns that lower the event ops inside a `gpu.func` for one CTA
/// per persistent worker and one thread per lane: `event.view`,
/// `event.wait` (thread 0 spins with relaxed loads at `counterScope` and
/// `nvvm.nanosleep`, then one acquire fence at that scope and a CTA
/// barrier; a `deferred` wait leaves both to `event.acquire`, unless its
/// event is symmetric: then it fences at system scope itself),
/// `event.release` (a CTA barrier, then thread 0's GPU-scope release fence),
/// `event.notify` (thread 0's atomic decrement at GPU scope, after its own
/// barrier and release fence unless `released`), the worker and lane
/// queries (block / thread ids and counts), `event.lane_barrier`, and the
/// dynamic scheduler's `event.notify_ready`, `event.queue_push` and
/// `event.queue_pop` (thread 0 acts for the CTA, or each thread for itself
/// with `per_lane`; a ready flag reaches every thread with `bar.red.or`, a
/// popped task through the enclosing kernel's first workgroup attribution,
/// a `memref<1xi32>` broadcast word), and the polling ops of graphs on
/// several ranks (`populatePollingToGPUConversionPatterns`). Spins and idle
/// workers give up after `watchdogMs`.
void populateEventToGPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns, int64_t watchdogMs);

/// Adds the patterns that lower the ops with which the dynamic schedule of
/// a graph on several ranks polls (`event.queue_try_pop`, `event.test`,
/// `event.idle`) for one CTA per worker: thread 0 acts, the CTA shares the
/// answer (broadcast word, `bar.red.or`); a symmetric event's counter is
/// tested at system scope, since other GPUs notify it; an idle CTA keeps
/// the watchdog (`watchdogMs`) and backs off with a short `nanosleep`.
/// Part of `populateEventToGPUConversionPatterns`.
void populatePollingToGPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns, int64_t watchdogMs);

/// The out-of-line half of a lowered `event.stall`, which a lane calls once
/// its wait on a tile's mbarrier has lasted a millisecond:
/// `i1 @__etc_stall_check(counters, nanoseconds stalled, task, tile rank,
/// kMaxRecordRank tile coordinates, barrier address, stage, role, parity)`
/// loads the run's status and, when the wait outlived `watchdogMs` while
/// the run goes on, writes the run header's error record (site kind
/// `run::kSiteBarrier`); it returns whether to give up (stopped or
/// expired).
inline constexpr llvm::StringLiteral kStallCheckName = "__etc_stall_check";

/// Defines `@__etc_stall_check` in `symbolTable` (a `gpu.module` whose
/// `@__etc_watchdog_report` `defineSpinFunctions` defines), unless it is.
mlir::LogicalResult defineStallCheck(mlir::Operation *symbolTable,
                                     int64_t watchdogMs);

/// Adds the patterns that lower the operations of a graph on several ranks
/// (`event.rank_id`, `event.rank_count`, `event.put`,
/// `event.remote_notify`) to calls of NVSHMEM's device API, left external
/// for the link with NVSHMEM's device library. Part of
/// `populateEventToGPUConversionPatterns`.
void populateRemoteToGPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns);

} // namespace etc

#endif // ETC_CONVERSION_EVENTTOGPU_EVENTTOGPU_H
