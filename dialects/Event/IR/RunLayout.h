//===- RunLayout.h - The run header and trace records -----------*- C++ -*-===//
//
// Every counter buffer ends with a run header of `kHeaderWords` i32 words,
// after the event counters, the scheduler's state and the trace records: the
// run's status (the abort flag every spin polls), the watchdog's error
// record, and where the trace records are. The schedulers lay it out and
// `@g_init` resets it; the targets' lowerings of `event.wait`,
// `event.queue_pop`, `event.run_aborted` and the trace ops find it from the
// buffer's size; the runtimes (python/etc/runtime/layout.py mirrors these
// numbers) read it after a run, without MLIR. (At the end rather than the
// start: with every event at a constant offset from the buffer's start,
// LLVM's straight-line strength reduction takes minutes on large NVPTX
// workers.)
//
// Word numbers below are relative to the header's first word.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_EVENT_IR_RUNLAYOUT_H
#define ETC_EVENT_IR_RUNLAYOUT_H

#include <cstdint>

namespace etc::event::run {

//===----------------------------------------------------------------------===//
// Run header
//===----------------------------------------------------------------------===//

/// The run's status: kRunning until a spin times out (kWatchdog) or the host
/// interrupts the run (kInterrupted). Every spin stops once it is not
/// kRunning, and the workers skip every tile they have not started.
inline constexpr int64_t kStatusWord = 0;
/// Incremented by every spin that times out; the one that finds 0 writes the
/// error record, then sets the status.
inline constexpr int64_t kClaimWord = 1;
/// The error record, written once by the first spin that timed out.
inline constexpr int64_t kWorkerWord = 2;  ///< The worker that spun.
inline constexpr int64_t kSiteWord = 3;    ///< kSiteWait, kSitePop, kSiteBarrier.
inline constexpr int64_t kTaskWord = 4;    ///< Task index, or -1.
inline constexpr int64_t kTileRankWord = 5;
inline constexpr int64_t kTileWords = 6;   ///< kMaxRecordRank coordinates.
inline constexpr int64_t kEventWord = 10;  ///< Event index, or -1.
inline constexpr int64_t kElementRankWord = 11;
inline constexpr int64_t kElementWords = 12; ///< kMaxRecordRank coordinates.
inline constexpr int64_t kValueWord = 16;  ///< The word last read.
inline constexpr int64_t kWaitedMsWord = 17; ///< Milliseconds spun.
/// First word of the trace records in the counter buffer (0 for a program
/// without traces), and their number (one per tile task), written by
/// `@g_init`.
inline constexpr int64_t kTraceOffsetWord = 18;
inline constexpr int64_t kTraceCountWord = 19;
/// The CPU target's blocking waits (`convert-event-to-cpu`): the number of
/// workers blocked in the kernel on an element now (a notify that takes a
/// counter to zero, or a push, makes the wake system call only when it is
/// not 0), and how long, in microseconds, a wait polls before it blocks
/// (written by the runtime after `@g_init`; 0 blocks at once).
inline constexpr int64_t kSleepersWord = 20;
inline constexpr int64_t kSpinMicrosecondsWord = 21;
/// Words of the header: the last kHeaderWords words of the counter buffer.
inline constexpr int64_t kHeaderWords = 22;

/// Coordinates kept in a record; tiles and elements of higher rank keep
/// their first kMaxRecordRank coordinates (the rank words say so).
inline constexpr int64_t kMaxRecordRank = 4;

/// Values of kStatusWord.
inline constexpr int32_t kRunning = 0;
inline constexpr int32_t kWatchdog = 1;
inline constexpr int32_t kInterrupted = 2;

/// Values of kSiteWord: what the spin that timed out waited for.
inline constexpr int32_t kSiteWait = 1; ///< An event element (`event.wait`).
inline constexpr int32_t kSitePop = 2;  ///< A queue slot (`event.queue_pop`);
                                        ///< element[0] is the slot.
inline constexpr int32_t kSiteBarrier = 3; ///< A tile's mbarrier
                                           ///< (`event.stall`): the element
                                           ///< is (stage, role, parity), the
                                           ///< value its low state word.

/// The roles of a tile's mbarriers in a kSiteBarrier record's element.
inline constexpr int32_t kBarrierFull = 0;  ///< The stage's operands landed.
inline constexpr int32_t kBarrierEmpty = 1; ///< The stage's consumers are done.

//===----------------------------------------------------------------------===//
// Trace records
//===----------------------------------------------------------------------===//

/// One record per tile task, at kTraceOffsetWord + id * kTraceRecordWords
/// (id = the tile's global index): worker, task, tile coordinates, then the
/// start and end times in nanoseconds as (low, high) word pairs.
inline constexpr int64_t kTraceWorkerWord = 0;
inline constexpr int64_t kTraceTaskWord = 1;
inline constexpr int64_t kTraceTileWords = 2; ///< kMaxRecordRank coordinates.
inline constexpr int64_t kTraceStartWord = 6;
inline constexpr int64_t kTraceEndWord = 8;
inline constexpr int64_t kTraceRecordWords = 10;

} // namespace etc::event::run

#endif // ETC_EVENT_IR_RUNLAYOUT_H
