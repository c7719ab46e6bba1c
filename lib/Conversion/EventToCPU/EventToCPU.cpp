//===- EventToCPU.cpp - convert-event-to-cpu ------------------------------===//
//
// Lowers a scheduled event program (L3) for the CPU target, where every
// persistent worker is a host thread calling the worker function with its
// id, and a tile body runs on a single lane. Counters are plain i32s in the
// runtime's buffer, accessed with LLVM atomics.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToCPU/EventToCPU.h"
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

/// The spin of a CPU worker: `sched_yield` between polls, system-scope
/// atomics, the monotonic clock.
static SpinTarget cpuSpin(int64_t timeoutMs) {
  return SpinTarget{monotonicNanoseconds,
                    [](OpBuilder &b, Location loc, Value state) -> Value {
                      func::CallOp::create(b, loc, kSchedYieldName,
                                           TypeRange{b.getI32Type()});
                      return state;
                    },
                    /*firstBackOff=*/0, /*syncScope=*/StringRef(), timeoutMs};
}

namespace {
/// Lowers `event.wait` to a watchdog-bounded spin loop: an acquire load of
/// the counter until it is no longer positive, calling `sched_yield`
/// between polls so that more workers than cores still make progress. The
/// loop also ends when the run is stopped, or after the timeout, when the
/// first such wait writes the error record of the run header (its worker,
/// tile, task, event, element and the counter's value).
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

/// Lowers `event.notify` to a release `atomicrmw sub` of 1 on the counter
/// (also a `released` one: the CPU keeps one release per notify).
struct NotifyOpLowering : public OpConversionPattern<NotifyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Value one = arith::ConstantIntOp::create(rewriter, op.getLoc(), 1, 32);
    LLVM::AtomicRMWOp::create(rewriter, op.getLoc(), LLVM::AtomicBinOp::sub,
                              *pointer, one, LLVM::AtomicOrdering::release,
                              /*syncscope=*/StringRef(), /*alignment=*/4);
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

/// Lowers `event.notify_ready` to an acq_rel `atomicrmw sub` of 1 on the
/// counter and a compare of the old value with 1: the notifier that takes the
/// counter to zero gets `true`. With one lane per worker, a `per_lane` op
/// is the same.
struct NotifyReadyOpLowering : public OpConversionPattern<NotifyReadyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(NotifyReadyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    Value one = arith::ConstantIntOp::create(rewriter, loc, 1, 32);
    Value previous = LLVM::AtomicRMWOp::create(
        rewriter, loc, LLVM::AtomicBinOp::sub, *pointer, one,
        LLVM::AtomicOrdering::acq_rel, /*syncscope=*/StringRef(),
        /*alignment=*/4);
    rewriter.replaceOpWithNewOp<arith::CmpIOp>(op, arith::CmpIPredicate::eq,
                                               previous, one);
    return success();
  }
};

/// Lowers `event.queue_push` to the shared queue protocol with system-scope
/// atomics: a relaxed `atomicrmw add` on the tail reserves a slot, then a
/// release store publishes `task + 1`, or the error word is set when full.
struct QueuePushOpLowering : public OpConversionPattern<QueuePushOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueuePushOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    buildQueuePush(rewriter, op.getLoc(), adaptor.getCounters(),
                   adaptor.getQueue(), adaptor.getCapacity(), adaptor.getTask(),
                   /*syncScope=*/StringRef());
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
    const TypeConverter &typeConverter, RewritePatternSet &patterns) {
  populateEventViewLoweringPattern(typeConverter, patterns);
  populateEventBufferLoweringPattern(typeConverter, patterns);
  populateRemoteToCPUConversionPatterns(typeConverter, patterns);
  patterns.add<WaitOpLowering, QueuePopOpLowering, NotifyOpLowering,
               EraseLowering<ReleaseOp>, EraseLowering<AcquireOp>, NotifyReadyOpLowering,
               QueuePushOpLowering,
               RunAbortedOpLowering, TraceBeginOpLowering, TraceEndOpLowering,
               LaneQueryLowering<LaneIdOp, 0>, LaneQueryLowering<LaneCountOp, 1>,
               EraseLowering<LaneBarrierOp>, EraseLowering<PrefetchOp>, LaneReduceLowering,
               ScratchLowering>(typeConverter, patterns.getContext());
}

LogicalResult etc::defineMonotonicClock(ModuleOp module) {
  MLIRContext *ctx = module.getContext();
  if (Operation *existing =
          SymbolTable::lookupSymbolIn(module, kMonotonicClockName)) {
    if (isa<LLVM::LLVMFuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << kMonotonicClockName
           << "', which the CPU lowering needs for its clock";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(module.getBody());
  Location loc = module.getLoc();
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  auto pointer = LLVM::LLVMPointerType::get(ctx);
  if (!SymbolTable::lookupSymbolIn(module, "clock_gettime"))
    LLVM::LLVMFuncOp::create(
        b, loc, "clock_gettime",
        LLVM::LLVMFunctionType::get(i32, {i32, pointer}));
  auto clock = LLVM::LLVMFuncOp::create(b, loc, kMonotonicClockName,
                                        LLVM::LLVMFunctionType::get(i64, {}),
                                        LLVM::Linkage::Internal);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(clock.addEntryBlock(b));
  auto timespec = LLVM::LLVMStructType::getLiteral(ctx, {i64, i64});
  Value one = LLVM::ConstantOp::create(b, loc, i64, 1);
  Value time = LLVM::AllocaOp::create(b, loc, pointer, timespec, one);
  // CLOCK_MONOTONIC is 1 on Linux.
  Value monotonic = LLVM::ConstantOp::create(b, loc, i32, 1);
  LLVM::CallOp::create(b, loc, TypeRange{i32}, "clock_gettime",
                       ValueRange{monotonic, time});
  auto field = [&](int32_t index) -> Value {
    Value address = LLVM::GEPOp::create(b, loc, pointer, timespec, time,
                                        ArrayRef<LLVM::GEPArg>{0, index});
    return LLVM::LoadOp::create(b, loc, i64, address);
  };
  Value seconds = field(0), nanoseconds = field(1);
  Value billion = LLVM::ConstantOp::create(b, loc, i64, 1000000000);
  Value total = LLVM::AddOp::create(
      b, loc, LLVM::MulOp::create(b, loc, seconds, billion), nanoseconds);
  LLVM::ReturnOp::create(b, loc, total);
  return success();
}

LogicalResult etc::declareSchedYield(ModuleOp module) {
  OpBuilder builder(module.getContext());
  FunctionType type = builder.getFunctionType({}, builder.getI32Type());
  Operation *existing = SymbolTable::lookupSymbolIn(module, kSchedYieldName);
  if (auto func = dyn_cast_or_null<func::FuncOp>(existing);
      func && func.getFunctionType() == type)
    return success();
  if (existing)
    return existing->emitOpError("uses the symbol '")
           << kSchedYieldName << "', which the CPU lowering of 'event.wait' "
           << "needs for 'func.func private @" << kSchedYieldName
           << "() -> i32'";
  builder.setInsertionPointToStart(module.getBody());
  auto func = func::FuncOp::create(builder, module.getLoc(), kSchedYieldName,
                                   type);
  func.setPrivate();
  return success();
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
    dropProgramTables(module);
    bool waits = module
                     .walk([](Operation *op) {
                       return isa<WaitOp, QueuePopOp>(op)
                                  ? WalkResult::interrupt()
                                  : WalkResult::advance();
                     })
                     .wasInterrupted();
    if (waits && failed(declareSchedYield(module)))
      return signalPassFailure();
    bool clock = module
                     .walk([](Operation *op) {
                       return isa<WaitOp, QueuePopOp, TraceBeginOp,
                                  TraceEndOp>(op)
                                  ? WalkResult::interrupt()
                                  : WalkResult::advance();
                     })
                     .wasInterrupted();
    if (clock && failed(defineMonotonicClock(module)))
      return signalPassFailure();
    if (waits && failed(defineSpinFunctions(module, cpuSpin(watchdogMs))))
      return signalPassFailure();

    TypeConverter typeConverter;
    populateEventToCPUTypeConversions(typeConverter);
    RewritePatternSet patterns(&getContext());
    populateEventToCPUConversionPatterns(typeConverter, patterns);
    ConversionTarget target(getContext());
    target.addIllegalDialect<EventDialect>();
    // The watchdog's records name the worker; the ids become arguments below.
    target.addLegalOp<WorkerIdOp, WorkerCountOp>();
    target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>())
      if (failed(materializeWorkerArguments(func)))
        return signalPassFailure();

    // The runtime calls every entry point of a program through its C
    // interface; tile functions and the spins are only called from inside.
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && func.isPublic() && !func->hasAttr("event.tile"))
        func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                      UnitAttr::get(&getContext()));
  }
};
} // namespace
