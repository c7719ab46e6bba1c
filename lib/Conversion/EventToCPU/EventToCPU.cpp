//===- EventToCPU.cpp - convert-event-to-cpu ------------------------------===//
//
// Lowers a scheduled event program (L3) for the CPU target, where every
// persistent worker is a host thread calling the worker function with its
// id, and a tile body runs on a single lane. Counters are plain i32s in the
// runtime's buffer, accessed with LLVM atomics.
//
// A wait polls for a while (the run's spin budget) and then blocks in the
// kernel (a futex wait on the element), so that a worker whose producer has
// been descheduled gives up its core instead of spinning on it; the
// notifier that ends a wait wakes the element only when the run header says
// someone sleeps, so that runs where nobody blocks make no system call.
// The functions that sleep and wake are defined in SystemFunctions.cpp.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToCPU/EventToCPU.h"
#include "WorkerPool.h"
#include "Conversion/EventCommon/EventAddressing.h"
#include "Conversion/EventCommon/EventQueue.h"
#include "Conversion/EventCommon/EventRunHeader.h"
#include "Conversion/Passes.h"

#include "Event/IR/EventOps.h"
#include "Event/IR/RunLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"

#ifndef __linux__
#error "convert-event-to-cpu blocks waits with the Linux futex system call"
#endif
#include <sys/syscall.h>

namespace etc {
#define GEN_PASS_DEF_CONVERTEVENTTOCPU
#include "Conversion/Passes.h.inc"
} // namespace etc

using namespace mlir;
using namespace etc;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

/// The CPU's clock for the watchdog and traces: `CLOCK_MONOTONIC` in
/// nanoseconds, through `@__etc_monotonic_ns` (see `defineMonotonicClock`).
static Value monotonicNanoseconds(OpBuilder &b, Location loc) {
  return LLVM::CallOp::create(b, loc, TypeRange{b.getI64Type()},
                              kMonotonicClockName, ValueRange{})
      .getResult();
}

/// How long one futex wait of a blocked CPU wait lasts at most, so that a
/// stopped run (Ctrl-C: the host sets the status word, and cannot wake the
/// sleepers itself) ends its blocked waits within this time.
static constexpr int64_t kMaxSleepNs = 10 * 1000000;

/// Blocks a CPU spin that has polled for the run's spin budget (the run
/// header's `kSpinMicrosecondsWord`, written by the runtime): while the run
/// goes on, `@__etc_sleep` sleeps until the element no longer holds the
/// value the poll saw, for at most `kMaxSleepNs` or the watchdog's time
/// left. The spin loop then polls again.
static void blockAfterBudget(OpBuilder &b, Location loc,
                             const SpinProgress &spin) {
  Value budgetUs = LLVM::LoadOp::create(
      b, loc, b.getI32Type(),
      buildHeaderWordPointer(b, loc, spin.counters,
                             run::kSpinMicrosecondsWord),
      /*alignment=*/4, /*isVolatile=*/false, /*isNonTemporal=*/false,
      /*isInvariant=*/false, /*isInvariantGroup=*/false,
      LLVM::AtomicOrdering::monotonic);
  Value budgetNs = arith::MulIOp::create(
      b, loc, arith::ExtUIOp::create(b, loc, b.getI64Type(), budgetUs),
      arith::ConstantIntOp::create(b, loc, 1000, 64));
  Value spun = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge,
                                     spin.elapsedNs, budgetNs);
  Value block = arith::AndIOp::create(b, loc, spun, spin.going);
  scf::IfOp::create(b, loc, block, [&](OpBuilder &then, Location loc) {
    Value left =
        arith::SubIOp::create(then, loc, spin.timeoutNs, spin.elapsedNs);
    Value sleepNs = arith::MinSIOp::create(
        then, loc, left,
        arith::ConstantIntOp::create(then, loc, kMaxSleepNs, 64));
    Value sleepers =
        buildHeaderWordPointer(then, loc, spin.counters, run::kSleepersWord);
    LLVM::CallOp::create(then, loc, TypeRange{}, kSleepName,
                         ValueRange{spin.pointer, spin.last, sleepers, sleepNs});
    scf::YieldOp::create(then, loc);
  });
}

/// `sched_yield()`, through the `syscall` function (`declareSyscall`).
static void yieldCore(OpBuilder &b, Location loc) {
  Type i64 = b.getI64Type();
  LLVM::CallOp::create(
      b, loc, LLVM::LLVMFunctionType::get(i64, {i64}, /*isVarArg=*/true),
      kSyscallName,
      ValueRange{LLVM::ConstantOp::create(
          b, loc, i64, static_cast<int64_t>(SYS_sched_yield))});
}

/// The back-off of a spin on several ranks: a yield of the core after
/// every poll. The state is unused.
static Value yieldBackOff(OpBuilder &b, Location loc, Value state) {
  yieldCore(b, loc);
  return state;
}

/// The spin of a CPU worker: system-scope atomics, the monotonic clock,
/// and a futex wait once it has polled for the run's spin budget
/// (`blockAfterBudget`). On one device it does not back off while it
/// polls. On several ranks (`ranked`) the runtime's budget is the whole
/// watchdog, since another rank's notify cannot wake a futex sleeper, so
/// the spin yields the core after every poll instead: with more workers
/// than cores, a worker that spins without yielding holds the core that its
/// producer needs until the scheduler's tick.
static SpinTarget cpuSpin(int64_t timeoutMs, bool ranked) {
  SpinTarget target{monotonicNanoseconds,
                    /*backOff=*/nullptr,
                    /*firstBackOff=*/0,
                    /*syncScope=*/StringRef(),
                    timeoutMs};
  // A function_ref refers to its callable: the functions themselves, not a
  // temporary pointer to them.
  if (ranked)
    target.backOff = yieldBackOff;
  target.block = blockAfterBudget;
  return target;
}

/// Wakes the workers blocked on the i32 at `pointer` if the run header's
/// sleepers word says anyone sleeps: after a change of that element that
/// can end their waits. The caller's change of the element must precede
/// the load of the sleepers word in the total order of seq_cst operations
/// (a seq_cst read-modify-write, or a store and a seq_cst fence), so that
/// a waiter that counted itself in before it read the element either sees
/// the change or is seen here (`@__etc_sleep`). `ordering` is the load's.
static void wakeIfSleepers(OpBuilder &b, Location loc, Value counters,
                           Value pointer, LLVM::AtomicOrdering ordering) {
  Value sleepers = LLVM::LoadOp::create(
      b, loc, b.getI32Type(),
      buildHeaderWordPointer(b, loc, counters, run::kSleepersWord),
      /*alignment=*/4, /*isVolatile=*/false, /*isNonTemporal=*/false,
      /*isInvariant=*/false, /*isInvariantGroup=*/false, ordering);
  Value any = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ne, sleepers,
      arith::ConstantIntOp::create(b, loc, 0, 32));
  scf::IfOp::create(b, loc, any, [&](OpBuilder &then, Location loc) {
    LLVM::CallOp::create(then, loc, TypeRange{}, kWakeName,
                         ValueRange{pointer});
    scf::YieldOp::create(then, loc);
  });
}

/// A seq_cst `atomicrmw sub` of 1 on the counter at `pointer`, and the wake
/// of its sleepers when it took the counter to zero (the only change that
/// ends a wait). Returns whether it did (i1).
static Value notifyAndWake(OpBuilder &b, Location loc, Value counters,
                           Value pointer) {
  Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
  Value previous = LLVM::AtomicRMWOp::create(
      b, loc, LLVM::AtomicBinOp::sub, pointer, one,
      LLVM::AtomicOrdering::seq_cst, /*syncscope=*/StringRef(),
      /*alignment=*/4);
  Value toZero =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, previous, one);
  scf::IfOp::create(b, loc, toZero, [&](OpBuilder &then, Location loc) {
    wakeIfSleepers(then, loc, counters, pointer,
                   LLVM::AtomicOrdering::seq_cst);
    scf::YieldOp::create(then, loc);
  });
  return toZero;
}

namespace {
/// Lowers `event.wait` to a watchdog-bounded wait: an acquire load of the
/// counter and, unless it is no longer positive, a call of the out-of-line
/// spin, which polls for the run's spin budget and then blocks in futex
/// waits until a notify wakes it, so that a waiting worker gives its core to
/// the producer it waits for. The wait also ends when the run is stopped,
/// or after the timeout, when the first such wait writes the error record
/// of the run header (its worker, tile, task, event, element and the
/// counter's value).
struct WaitOpLowering : public OpConversionPattern<WaitOp> {
  using OpConversionPattern::OpConversionPattern;

  LogicalResult
  matchAndRewrite(WaitOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    FailureOr<Value> counters = getEventCounters(rewriter, op, op.getEvent());
    if (failed(pointer) || failed(counters))
      return failure();
    Location loc = op.getLoc();
    WatchdogSite record =
        WatchdogSite::forWait(rewriter, loc, WorkerIdOp::create(rewriter, loc),
                              adaptor.getSite(), adaptor.getIndices());
    buildSpin(rewriter, loc, *counters, *pointer, /*syncScope=*/StringRef(),
              SpinUntil::CounterReady, record);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.notify` to a seq_cst `atomicrmw sub` of 1 on the counter
/// (also a `released` one: the CPU keeps one release per notify) and, when
/// it takes the counter to zero and the run header counts sleepers, a call
/// of `@__etc_wake` on it.
struct NotifyOpLowering : public OpConversionPattern<NotifyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    FailureOr<Value> counters = getEventCounters(rewriter, op, op.getEvent());
    if (failed(pointer) || failed(counters))
      return failure();
    notifyAndWake(rewriter, op.getLoc(), *counters, *pointer);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Erases an op that has nothing to do on the CPU, where a worker is one
/// lane and every wait and notify is an acquire poll or release atomic of
/// its own: `event.acquire` (the attribute `deferred` changes nothing),
/// `event.release` (nor does `released`), `event.lane_barrier` (with one
/// lane there is nobody to wait for) and `event.prefetch` (software
/// prefetch made the CPU tiles slower, see docs/benchmarks.md).
template <typename OpTy>
struct EraseLowering : public OpConversionPattern<OpTy> {
  using OpConversionPattern<OpTy>::OpConversionPattern;
  LogicalResult
  matchAndRewrite(OpTy op, typename OpTy::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.notify_ready` like `event.notify` (a seq_cst `atomicrmw
/// sub` of 1, waking the counter's sleepers when it reaches zero), to
/// whether it took the counter to zero. With one lane per worker, a
/// `per_lane` op is the same.
struct NotifyReadyOpLowering : public OpConversionPattern<NotifyReadyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyReadyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    FailureOr<Value> counters = getEventCounters(rewriter, op, op.getEvent());
    if (failed(pointer) || failed(counters))
      return failure();
    rewriter.replaceOp(
        op, notifyAndWake(rewriter, op.getLoc(), *counters, *pointer));
    return success();
  }
};

/// Lowers `event.queue_push` to the shared queue protocol with system-scope
/// atomics: a relaxed `atomicrmw add` on the tail reserves a slot, then a
/// release store publishes `task + 1` and, after a seq_cst fence, the
/// slot's sleepers are woken if the run header counts any; or the error
/// word is set when full.
struct QueuePushOpLowering : public OpConversionPattern<QueuePushOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueuePushOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Value counters = adaptor.getCounters();
    auto wake = [&](OpBuilder &b, Location loc, Value slot) {
      LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::seq_cst);
      wakeIfSleepers(b, loc, counters, slot, LLVM::AtomicOrdering::monotonic);
    };
    buildQueuePush(rewriter, op.getLoc(), counters, adaptor.getQueue(),
                   adaptor.getCapacity(), adaptor.getTask(),
                   /*syncScope=*/StringRef(), wake);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.queue_pop` to the shared queue protocol: a relaxed
/// `atomicrmw add` on the head claims a slot; below the capacity the worker
/// spins on an acquire load of the slot until it is published, calling
/// `sched_yield` between polls, and gets the task id it holds; otherwise the
/// capacity. The spin is bounded like `event.wait`'s; one that stops without
/// a task (the run was stopped) makes the pop return the capacity, so the
/// worker loop ends.
struct QueuePopOpLowering : public OpConversionPattern<QueuePopOp> {
  using OpConversionPattern::OpConversionPattern;

  LogicalResult
  matchAndRewrite(QueuePopOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Value counters = adaptor.getCounters();
    Value worker = WorkerIdOp::create(rewriter, op.getLoc());
    auto waitForSlot = [&](OpBuilder &b, Location loc, Value pointer,
                           Value slot) -> Value {
      WatchdogSite site = WatchdogSite::get(b, loc, run::kSitePop, worker,
                                            Value(), ValueRange{}, Value(),
                                            ValueRange{slot});
      Value published = buildSpin(b, loc, counters, pointer,
                                  /*syncScope=*/StringRef(),
                                  SpinUntil::SlotPublished, site);
      return exhaustedIfEmpty(b, loc, published, adaptor.getCapacity());
    };
    Value task = buildQueuePop(rewriter, op.getLoc(), counters,
                               adaptor.getQueue(), adaptor.getCapacity(),
                               /*syncScope=*/StringRef(), waitForSlot);
    rewriter.replaceOpWithNewOp<arith::IndexCastUIOp>(
        op, rewriter.getIndexType(), task);
    return success();
  }
};

/// Lowers `event.queue_try_pop` to the shared protocol's pop that never
/// waits (`buildQueueTryPop`) with system-scope atomics.
struct QueueTryPopOpLowering : public OpConversionPattern<QueueTryPopOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueueTryPopOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Value task = buildQueueTryPop(rewriter, op.getLoc(), adaptor.getCounters(),
                                  adaptor.getQueue(), adaptor.getCapacity(),
                                  /*syncScope=*/StringRef());
    rewriter.replaceOpWithNewOp<arith::IndexCastUIOp>(
        op, rewriter.getIndexType(), task);
    return success();
  }
};

/// Lowers `event.claim` to a relaxed `atomicrmw add` of 1 on the element.
struct ClaimOpLowering : public OpConversionPattern<ClaimOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ClaimOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOp(op, buildClaim(rewriter, op.getLoc(),
                                      adaptor.getCounters(), adaptor.getIndex(),
                                      /*syncScope=*/StringRef()));
    return success();
  }
};

/// Lowers `event.test` to an acquire load of the counter compared with 0.
struct TestOpLowering : public OpConversionPattern<TestOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(TestOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    Value count = LLVM::LoadOp::create(
        rewriter, loc, rewriter.getI32Type(), *pointer, /*alignment=*/4,
        /*isVolatile=*/false, /*isNonTemporal=*/false, /*isInvariant=*/false,
        /*isInvariantGroup=*/false, LLVM::AtomicOrdering::acquire);
    rewriter.replaceOpWithNewOp<arith::CmpIOp>(
        op, arith::CmpIPredicate::sle, count,
        arith::ConstantIntOp::create(rewriter, loc, 0, 32));
    return success();
  }
};

/// Lowers `event.idle` inline: the clock, the idle start (now when `since`
/// is 0), the watchdog's report once the worker has been idle longer than
/// `watchdogMs` while the run goes on (with the element's value and the
/// op's site, or a pop's site without `on`), then `sched_yield`, so that
/// a polling worker gives its core to the producers it waits for.
struct IdleOpLowering : public OpConversionPattern<IdleOp> {
  IdleOpLowering(const TypeConverter &typeConverter, MLIRContext *context,
                 int64_t watchdogMs)
      : OpConversionPattern(typeConverter, context), watchdogMs(watchdogMs) {}

  LogicalResult
  matchAndRewrite(IdleOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Value pointer;
    if (op.getEvent()) {
      FailureOr<Value> element = getEventElementPointer(
          rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
      if (failed(element))
        return failure();
      pointer = *element;
    }
    Value counters = adaptor.getCounters();
    Value now = monotonicNanoseconds(rewriter, loc);
    Value since = adaptor.getSince();
    Value first = arith::CmpIOp::create(
        rewriter, loc, arith::CmpIPredicate::eq, since,
        arith::ConstantIntOp::create(rewriter, loc, 0, 64));
    Value start = arith::SelectOp::create(rewriter, loc, first, now, since);
    Value elapsed = arith::SubIOp::create(rewriter, loc, now, start);
    Value expired = arith::CmpIOp::create(
        rewriter, loc, arith::CmpIPredicate::sgt, elapsed,
        arith::ConstantIntOp::create(rewriter, loc, watchdogMs * 1000000, 64));
    Value going = arith::XOrIOp::create(
        rewriter, loc,
        buildRunStopped(rewriter, loc, counters, /*syncScope=*/StringRef()),
        arith::ConstantIntOp::create(rewriter, loc, 1, 1));
    Value report = arith::AndIOp::create(rewriter, loc, expired, going);
    scf::IfOp::create(rewriter, loc, report, [&](OpBuilder &b, Location loc) {
      Value worker = WorkerIdOp::create(b, loc);
      WatchdogSite site =
          pointer ? WatchdogSite::forWait(b, loc, worker, adaptor.getSite(),
                                          adaptor.getIndices())
                  : WatchdogSite::get(b, loc, run::kSitePop, worker, Value(),
                                      ValueRange{}, Value(), ValueRange{});
      Value value =
          pointer ? LLVM::LoadOp::create(
                        b, loc, b.getI32Type(), pointer, /*alignment=*/4,
                        /*isVolatile=*/false, /*isNonTemporal=*/false,
                        /*isInvariant=*/false, /*isInvariantGroup=*/false,
                        LLVM::AtomicOrdering::monotonic)
                        .getResult()
                  : arith::ConstantIntOp::create(b, loc, 0, 32).getResult();
      Value waitedMs = arith::TruncIOp::create(
          b, loc, b.getI32Type(),
          arith::DivSIOp::create(
              b, loc, elapsed,
              arith::ConstantIntOp::create(b, loc, 1000000, 64)));
      buildWatchdogReport(b, loc, counters, site, value, waitedMs);
      scf::YieldOp::create(b, loc);
    });
    yieldCore(rewriter, loc);
    rewriter.replaceOp(op, start);
    return success();
  }

private:
  int64_t watchdogMs;
};

/// Lowers `event.run_aborted` to a relaxed load of the run's status word
/// compared with `run::kRunning`.
struct RunAbortedOpLowering : public OpConversionPattern<RunAbortedOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RunAbortedOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    rewriter.replaceOp(op, buildRunStopped(rewriter, loc, adaptor.getCounters(),
                                           /*syncScope=*/StringRef()));
    return success();
  }
};

/// Lowers `event.trace_begin` to plain stores of the worker, task, tile and
/// the monotonic clock into the trace record.
struct TraceBeginOpLowering : public OpConversionPattern<TraceBeginOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(TraceBeginOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    buildTraceBegin(rewriter, loc, adaptor.getCounters(), adaptor.getRecord(),
                    WorkerIdOp::create(rewriter, loc), adaptor.getTask(),
                    adaptor.getTile(), monotonicNanoseconds(rewriter, loc));
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.trace_end` to a store of the monotonic clock into the
/// trace record.
struct TraceEndOpLowering : public OpConversionPattern<TraceEndOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(TraceEndOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    buildTraceEnd(rewriter, loc, adaptor.getCounters(), adaptor.getRecord(),
                  monotonicNanoseconds(rewriter, loc));
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers a lane query to its CPU value: a tile body runs on one lane, so
/// `event.lane_id` is 0 and `event.lane_count` is 1.
template <typename QueryOp, int64_t value>
struct LaneQueryLowering : public OpConversionPattern<QueryOp> {
  using OpConversionPattern<QueryOp>::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueryOp op, typename QueryOp::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithNewOp<arith::ConstantIndexOp>(op, value);
    return success();
  }
};

/// Lowers `event.lane_reduce` to its operand: with one lane per tile there
/// is nobody to combine with.
struct LaneReduceLowering : public OpConversionPattern<LaneReduceOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(LaneReduceOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOp(op, adaptor.getValue());
    return success();
  }
};

/// Lowers `event.scratch` to a `memref.alloca` at the start of the enclosing
/// function, so that a scratch buffer inside a loop does not grow the stack
/// at every iteration; with one lane the buffer is private to it anyway.
struct ScratchLowering : public OpConversionPattern<ScratchOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ScratchOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    auto function = op->getParentOfType<FunctionOpInterface>();
    if (!function)
      return rewriter.notifyMatchFailure(op, "not inside a function");
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPointToStart(&function.getFunctionBody().front());
    Value buffer = memref::AllocaOp::create(rewriter, op.getLoc(), op.getType());
    rewriter.replaceOp(op, buffer);
    return success();
  }
};
} // namespace

void etc::populateEventToCPUTypeConversions(TypeConverter &typeConverter) {
  populateEventTensorTypeConversion(typeConverter);
}

void etc::populateEventToCPUConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns,
    int64_t watchdogMs) {
  populateEventViewLoweringPattern(typeConverter, patterns);
  populateEventBufferLoweringPattern(typeConverter, patterns);
  populateRemoteToCPUConversionPatterns(typeConverter, patterns);
  patterns.add<WaitOpLowering, QueuePopOpLowering, NotifyOpLowering,
               EraseLowering<ReleaseOp>, EraseLowering<AcquireOp>, NotifyReadyOpLowering,
               QueuePushOpLowering,
               RunAbortedOpLowering, TraceBeginOpLowering, TraceEndOpLowering,
               LaneQueryLowering<LaneIdOp, 0>, LaneQueryLowering<LaneCountOp, 1>,
               EraseLowering<LaneBarrierOp>, EraseLowering<PrefetchOp>, LaneReduceLowering,
               ScratchLowering, QueueTryPopOpLowering, TestOpLowering,
               ClaimOpLowering>(
      typeConverter, patterns.getContext());
  patterns.add<IdleOpLowering>(typeConverter, patterns.getContext(),
                               watchdogMs);
}

//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

/// Appends `%worker_id: index, %worker_count: index` to `func` and
/// replaces `event.worker_id` / `event.worker_count` by them: each host
/// thread passes its own id.
static LogicalResult materializeWorkerArguments(func::FuncOp func) {
  SmallVector<Operation *> ids, counts;
  func.walk([&](Operation *op) {
    if (isa<WorkerIdOp>(op))
      ids.push_back(op);
    else if (isa<WorkerCountOp>(op))
      counts.push_back(op);
  });
  if (ids.empty() && counts.empty())
    return success();
  unsigned numArgs = func.getNumArguments();
  Type index = IndexType::get(func.getContext());
  if (failed(func.insertArguments({numArgs, numArgs}, {index, index},
                                  {DictionaryAttr(), DictionaryAttr()},
                                  {func.getLoc(), func.getLoc()})))
    return func.emitOpError("cannot take the worker id and count as "
                            "arguments");
  Value workerId = func.getArgument(numArgs);
  Value workerCount = func.getArgument(numArgs + 1);
  for (Operation *op : ids) {
    op->getResult(0).replaceAllUsesWith(workerId);
    op->erase();
  }
  for (Operation *op : counts) {
    op->getResult(0).replaceAllUsesWith(workerCount);
    op->erase();
  }
  return success();
}

namespace {
struct ConvertEventToCPUPass
    : public etc::impl::ConvertEventToCPUBase<ConvertEventToCPUPass> {
  using ConvertEventToCPUBase::ConvertEventToCPUBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (watchdogMs <= 0) {
      module.emitError("convert-event-to-cpu: watchdog-ms must be positive, "
                       "found ")
          << static_cast<int64_t>(watchdogMs);
      return signalPassFailure();
    }
    // The CPU target simulates a tile's barriers (etc.ops.wgmma.Barriers
    // with simulated lanes) and never polls one.
    WalkResult stalls = module.walk([](StallOp stall) {
      stall.emitOpError("waits on a GPU mbarrier; the CPU target has none "
                        "(its tile functions simulate barriers), so "
                        "convert-event-to-cpu does not lower it");
      return WalkResult::interrupt();
    });
    if (stalls.wasInterrupted())
      return signalPassFailure();
    dropProgramTables(module);
    auto any = [&](auto isOneOf) {
      return module
          .walk([&](Operation *op) {
            return isOneOf(op) ? WalkResult::interrupt()
                               : WalkResult::advance();
          })
          .wasInterrupted();
    };
    bool waits =
        any([](Operation *op) { return isa<WaitOp, QueuePopOp, IdleOp>(op); });
    bool wakes = any([](Operation *op) {
      return isa<NotifyOp, NotifyReadyOp, QueuePushOp>(op);
    });
    bool clock = any([](Operation *op) {
      return isa<WaitOp, QueuePopOp, IdleOp, TraceBeginOp, TraceEndOp>(op);
    });
    if (clock && failed(defineMonotonicClock(module)))
      return signalPassFailure();
    // A graph on several ranks: its functions carry the rank count.
    bool ranked = any([](Operation *op) {
      return isa<func::FuncOp>(op) &&
             op->hasAttr(GraphOp::getRanksAttrName());
    });
    if (waits &&
        failed(defineSpinFunctions(module, cpuSpin(watchdogMs, ranked))))
      return signalPassFailure();
    if ((waits || wakes) && failed(defineFutexFunctions(module)))
      return signalPassFailure();

    TypeConverter typeConverter;
    populateEventToCPUTypeConversions(typeConverter);
    RewritePatternSet patterns(&getContext());
    populateEventToCPUConversionPatterns(typeConverter, patterns, watchdogMs);
    ConversionTarget target(getContext());
    target.addIllegalDialect<EventDialect>();
    // The watchdog's records name the worker; the ids become arguments below.
    target.addLegalOp<WorkerIdOp, WorkerCountOp>();
    target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();
    // The program's workers (`<graph>_worker`), and whether each takes the
    // worker id and count.
    SmallVector<std::pair<func::FuncOp, bool>> workers;
    for (auto func : module.getOps<func::FuncOp>()) {
      unsigned before = func.getNumArguments();
      if (failed(materializeWorkerArguments(func)))
        return signalPassFailure();
      auto graph = func->getAttrOfType<StringAttr>("event.graph");
      if (graph && func.getSymName() == (graph.getValue() + "_worker").str())
        workers.push_back({func, func.getNumArguments() != before});
    }

    // The runtime calls every entry point of a program through its C
    // interface; tile functions and the spins are only called from inside.
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && func.isPublic() && !func->hasAttr("event.tile"))
        func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                      UnitAttr::get(&getContext()));

    // The runtime's pool threads enter the workers through these.
    for (auto [worker, takesWorkerIds] : workers)
      if (failed(definePackedWorker(worker, takesWorkerIds)) ||
          failed(defineWorkerPoolFunctions(
              module, worker->getAttrOfType<StringAttr>("event.graph")
                          .getValue())))
        return signalPassFailure();
  }
};
} // namespace
