//===- WorkerPool.h - Native entry points of the CPU worker pool -*- C++ -*-===//
//
// The CPU runtime keeps a pool of worker threads parked in native code
// between runs, so that handing a run to them and getting it back costs a
// futex wake each way instead of Python threads waking each other (and the
// GIL). The code they park in comes with every lowered program, so that a
// saved artifact has it where only NumPy is installed; private to
// lib/Conversion/EventToCPU.
//
// A pool thread has a *mailbox* (the words below, owned by the runtime): it
// waits until the mailbox's generation differs from the one it served last,
// then runs what the mailbox says, and counts itself done in the run's *done
// block*. python/etc/runtime/workers.py mirrors these numbers
// (test_workers.py checks that they agree).
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_CONVERSION_EVENTTOCPU_WORKERPOOL_H
#define ETC_LIB_CONVERSION_EVENTTOCPU_WORKERPOOL_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include <cstdint>

namespace etc::pool {

// Byte offsets in a mailbox.
/// i32: bumped by the launcher (seq_cst) to hand the thread a command.
inline constexpr int64_t kGenerationOffset = 0;
/// i32: non-zero while the thread blocks in a futex wait on the generation.
inline constexpr int64_t kSleepersOffset = 4;
/// i32: the generation the thread took last (written by the thread).
inline constexpr int64_t kServedOffset = 8;
/// i32: kCommandRun or kCommandLeave.
inline constexpr int64_t kCommandOffset = 12;
/// ptr: the packed worker to call, `void (ptr arguments, i64 id, i64 count)`.
inline constexpr int64_t kFunctionOffset = 16;
/// ptr: the packed worker's argument block.
inline constexpr int64_t kArgumentsOffset = 24;
/// i64: the worker id to pass.
inline constexpr int64_t kWorkerOffset = 32;
/// i64: the worker count to pass.
inline constexpr int64_t kWorkerCountOffset = 40;
/// ptr: the run's done block.
inline constexpr int64_t kRunOffset = 48;
/// i64: nanoseconds the idle thread polls its generation before it blocks.
inline constexpr int64_t kIdleSpinOffset = 56;
/// A mailbox's size: a cache line of its own.
inline constexpr int64_t kMailboxBytes = 64;

/// Commands.
inline constexpr int32_t kCommandRun = 0;
inline constexpr int32_t kCommandLeave = 1;

// Byte offsets in a run's done block.
/// i32: the workers that have not finished the run (seq_cst decrements).
inline constexpr int64_t kPendingOffset = 0;
/// i32: non-zero while the launcher blocks in a futex wait on the count.
inline constexpr int64_t kRunSleepersOffset = 4;
inline constexpr int64_t kRunBytes = 8;

} // namespace etc::pool

namespace etc {

/// Defines, unless they are there, the two functions through which the
/// runtime's pool threads run the workers of any program (both generic:
/// a thread parked in one program's copy runs another program's workers):
///
///   llvm.func @_mlir_ciface_<graph>_park(%mailbox: !llvm.ptr)
///     a pool thread's loop: waits for a new generation of its mailbox
///     (polling for the mailbox's idle spin, then blocking in futex waits
///     through `@__etc_sleep`), returns on kCommandLeave, and otherwise calls
///     the packed worker with its arguments and decrements the run's
///     pending count; the thread that takes it to one or to zero wakes the
///     launcher if it sleeps;
///
///   llvm.func @_mlir_ciface_<graph>_launch(%mailboxes: !llvm.ptr,
///       %count: i64, %run: !llvm.ptr, %spinNs: i64, %timeoutNs: i64,
///       %command: i32, %function: !llvm.ptr, %arguments: !llvm.ptr,
///       %workerCount: i64) -> i32
///     writes the command into each of the `count` mailboxes whose
///     addresses `mailboxes` lists (the i-th gets worker id i, the worker
///     count, the function, its arguments and the run's done block) and
///     bumps its generation (waking the thread if it sleeps), then waits
///     until the run's pending count is zero: it blocks while more than one
///     thread runs and polls for `spinNs` once one does, for at most
///     `timeoutNs` in all; returns the count left (0: done), so that the
///     caller can look at its signals and wait again (`count` 0: only wait).
///
/// Also defines the clock and the futex functions they call.
mlir::LogicalResult defineWorkerPoolFunctions(mlir::ModuleOp module,
                                              llvm::StringRef graph);

/// Defines `func.func @<worker>_packed(%arguments: !llvm.ptr, %id: index,
/// %count: index)` with a C interface: calls `worker` with the arguments it
/// takes besides the worker id and count read from the i64 words at
/// `arguments` in order (an integer or index as its value, a memref as the
/// address of its descriptor, as the C interface passes it), and with `id`
/// and `count` when `takesWorkerIds`.
mlir::LogicalResult definePackedWorker(mlir::func::FuncOp worker,
                                       bool takesWorkerIds);

} // namespace etc

#endif // ETC_LIB_CONVERSION_EVENTTOCPU_WORKERPOOL_H
