//===- EventRunHeader.h - Watchdog and trace records for the targets -*- C++ -*-===//
//
// Both targets bound every spin with the watchdog, report the first spin
// that times out in the run header's error record, and write trace records
// the same way (layout in `Event/IR/RunLayout.h`); only the clock, the
// back-off, the atomics' scope and who in a worker does it differ.
//
// A spin is a load inline (the element is usually ready) and, when it is
// not, a call of an out-of-line function that polls: keeping the loop, the
// clock and the record out of the worker keeps the worker small, which
// matters because the NVPTX backend slows down sharply on many inlined
// copies.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_EVENTCOMMON_EVENTRUNHEADER_H
#define ETC_CONVERSION_EVENTCOMMON_EVENTRUNHEADER_H

#include "mlir/IR/Builders.h"

namespace etc {

/// Removes the schedulers' `event.tasks` and `event.events` tables from
/// every function in `module`: they describe the program for the front end,
/// which reads them from the scheduled program; the lowered code refers to
/// tasks and events by number only.
void dropProgramTables(mlir::Operation *module);

/// The functions the lowerings of waits and pops define and call.
inline constexpr llvm::StringLiteral kWatchdogReportName =
    "__etc_watchdog_report";
inline constexpr llvm::StringLiteral kSpinCounterName = "__etc_spin_counter";
inline constexpr llvm::StringLiteral kSpinSlotName = "__etc_spin_slot";
/// The counter spin that polls at system scope, for a target whose spins
/// are narrower (`defineSpinFunctions` with `systemCounters`).
inline constexpr llvm::StringLiteral kSpinCounterSystemName =
    "__etc_spin_counter_system";

/// Where a spin is, for the error record: every field an i32 value; `tile`
/// and `element` padded to `run::kMaxRecordRank` coordinates.
struct WatchdogSite {
  mlir::Value kind; ///< run::kSiteWait, kSitePop or kSiteBarrier.
  mlir::Value worker;
  mlir::Value task; ///< Task index, or -1.
  mlir::Value tileRank;
  llvm::SmallVector<mlir::Value, 4> tile;
  mlir::Value event; ///< Event index, or -1.
  mlir::Value elementRank;
  llvm::SmallVector<mlir::Value, 4> element;

  /// The site of a spin at `kind`, by `worker`, in tile `tile` of task
  /// `task` on element `element` of event number `event` (index values;
  /// a null task or event is recorded as -1).
  static WatchdogSite get(mlir::OpBuilder &b, mlir::Location loc, int32_t kind,
                          mlir::Value worker, mlir::Value task,
                          mlir::ValueRange tile, mlir::Value event,
                          mlir::ValueRange element);

  /// The site of an `event.wait` by `worker` on `element`, from the op's
  /// `site` operands (task, event, tile...; empty when the scheduler gave
  /// none, which the verifier allows besides two or more values).
  static WatchdogSite forWait(mlir::OpBuilder &b, mlir::Location loc,
                              mlir::Value worker, mlir::ValueRange site,
                              mlir::ValueRange element);
};

/// Calls `@__etc_watchdog_report` (which `defineSpinFunctions` defines):
/// unless a spin reported first, the run header of `counters` gets `site`,
/// `value` (the i32 last read) and `waitedMs` (i32), and the run stops.
void buildWatchdogReport(mlir::OpBuilder &b, mlir::Location loc,
                         mlir::Value counters, const WatchdogSite &site,
                         mlir::Value value, mlir::Value waitedMs);

/// How a spin acquires the writes published to the element it waits for:
/// with every poll (acquire loads; the CPU target), or once, when it is done
/// (relaxed polls, then one acquire fence; the GPU target, where every
/// acquire load and fence invalidates the SM's L1 cache, so that a poll
/// loop of acquire loads would invalidate it at every iteration).
/// `Deferred` polls relaxed like `OnceDone` and leaves the acquire fence to
/// the caller, which issues one after several spins.
enum class SpinAcquire { EachPoll, OnceDone, Deferred };

/// Where a spin stands after a poll that did not find its element ready,
/// for a target that blocks (`SpinTarget::block`).
struct SpinProgress {
  mlir::Value counters;  ///< The counter buffer (memref<?xi32>).
  mlir::Value pointer;   ///< The element (!llvm.ptr).
  mlir::Value last;      ///< The value the poll loaded (i32).
  mlir::Value elapsedNs; ///< Since the spin began (i64).
  mlir::Value timeoutNs; ///< The watchdog's bound (i64).
  mlir::Value going;     ///< i1: the spin goes on (not stopped, not expired).
};

/// How a target waits with the watchdog: the clock (i64 nanoseconds), the
/// back-off between polls, and the synchronisation scope of its atomics
/// ("" for the system). The back-off gets an i32 state (starting at
/// `firstBackOff`) and returns the next one, e.g. a growing sleep; a null
/// back-off polls again at once. `block`, when set, is built after the
/// watchdog's check of every poll that did not find the element ready: a
/// target that can block the thread until the element changes does so
/// there (the CPU's futex wait).
struct SpinTarget {
  llvm::function_ref<mlir::Value(mlir::OpBuilder &, mlir::Location)> now;
  llvm::function_ref<mlir::Value(mlir::OpBuilder &, mlir::Location,
                                 mlir::Value)>
      backOff;
  int32_t firstBackOff;
  llvm::StringRef syncScope;
  /// The spin gives up after this long.
  int64_t timeoutMs;
  /// How the polls of the spin functions load the element.
  SpinAcquire acquire = SpinAcquire::EachPoll;
  llvm::function_ref<void(mlir::OpBuilder &, mlir::Location,
                          const SpinProgress &)>
      block = nullptr;
};

/// What a spin waits for: a counter to be no longer positive (`event.wait`)
/// or a queue slot to be non-zero (`event.queue_pop`).
enum class SpinUntil { CounterReady, SlotPublished };

/// Defines, in the symbol table `symbolTable` (a module or a `gpu.module`),
/// unless they are there: `@__etc_watchdog_report` (claims the error record
/// with an atomic increment of the claim word and, if first, writes it and
/// publishes the status `run::kWatchdog` with a release fence and a relaxed
/// store), and the never-inlined spins `@__etc_spin_counter` and
/// `@__etc_spin_slot(counters, element pointer, the site's 14 words) -> i32`:
/// loads (acquire, or relaxed with `SpinAcquire::OnceDone`) with `target`'s back-off until the element is ready, the
/// run's status is no longer `run::kRunning`, or `target.timeoutMs` passed
/// (then the report); they return the last value loaded. With
/// `systemCounters`, also `@__etc_spin_counter_system`, the counter spin
/// whose loads are at system scope (for counters that other devices
/// write). Fails if a symbol has another meaning.
mlir::LogicalResult defineSpinFunctions(mlir::Operation *symbolTable,
                                        const SpinTarget &target,
                                        bool systemCounters = false);

/// Builds a watchdog-bounded spin on the i32 at `pointer` (an element of
/// `counters`): a load inline and, unless it is ready, a call of the spin
/// function `defineSpinFunctions` defined. With `SpinAcquire::EachPoll`
/// the loads acquire; with `SpinAcquire::OnceDone` (which must match the
/// spin functions' `SpinTarget`) they are relaxed and one acquire fence
/// follows the spin. `spinFunction` names the spin function to call when
/// it is not the one of `until` (`kSpinCounterSystemName`). Returns the
/// last value loaded (i32); for a slot, 0 means the spin stopped without a
/// task.
mlir::Value buildSpin(mlir::OpBuilder &b, mlir::Location loc,
                      mlir::Value counters, mlir::Value pointer,
                      llvm::StringRef syncScope, SpinUntil until,
                      const WatchdogSite &site,
                      SpinAcquire acquire = SpinAcquire::EachPoll,
                      llvm::StringRef spinFunction = {});

/// The address (!llvm.ptr) of word `word` of the run header of `counters`
/// (`run::...Word`): the header is the last `run::kHeaderWords` words of
/// the buffer, found from its size.
mlir::Value buildHeaderWordPointer(mlir::OpBuilder &b, mlir::Location loc,
                                   mlir::Value counters, int64_t word);

/// Whether the run is stopped: its status word (`run::kStatusWord` of
/// `counters`), loaded relaxed, is no longer `run::kRunning`. Returns an i1.
mlir::Value buildRunStopped(mlir::OpBuilder &b, mlir::Location loc,
                            mlir::Value counters, llvm::StringRef syncScope);

/// Writes the first part of the trace record at word `record` of `counters`
/// (worker, task, tile, start `nowNs`).
void buildTraceBegin(mlir::OpBuilder &b, mlir::Location loc,
                     mlir::Value counters, mlir::Value record,
                     mlir::Value worker, mlir::Value task,
                     mlir::ValueRange tile, mlir::Value nowNs);

/// Writes the end time `nowNs` into the trace record at word `record`.
void buildTraceEnd(mlir::OpBuilder &b, mlir::Location loc,
                   mlir::Value counters, mlir::Value record,
                   mlir::Value nowNs);

} // namespace etc

#endif // ETC_CONVERSION_EVENTCOMMON_EVENTRUNHEADER_H
