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
#include "Conversion/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
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

/// The stop flag of the function that holds `op`: its last argument, which
/// `convert-event-to-cpu` appends to every function that spins.
static FailureOr<Value> getStopFlag(Operation *op) {
  auto func = op->getParentOfType<func::FuncOp>();
  if (!func || func.getNumArguments() == 0 ||
      !isa<LLVM::LLVMPointerType>(func.getArguments().back().getType()))
    return op->emitOpError("must be in a func.func that takes the worker "
                           "arguments (see convert-event-to-cpu)");
  return func.getArguments().back();
}

/// Whether the stop flag at `flag` is set. Relaxed: the flag carries no
/// data, and a poll that misses it sees it on the next round.
static Value isStopped(OpBuilder &b, Location loc, Value flag) {
  Value word = LLVM::LoadOp::create(
      b, loc, b.getI32Type(), flag, /*alignment=*/4, /*isVolatile=*/false,
      /*isNonTemporal=*/false, /*isInvariant=*/false,
      /*isInvariantGroup=*/false, LLVM::AtomicOrdering::monotonic);
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, word, zero);
}

/// Moves the operations after `op` in its block, up to the terminator, into
/// `scf.if %run`. Values they define that the terminator uses come out of
/// the `scf.if`, as `ub.poison` when it does not run.
static void guardRestOfBlock(ConversionPatternRewriter &rewriter,
                             Operation *op, Value run) {
  Block *block = op->getBlock();
  Operation *terminator =
      block->mightHaveTerminator() ? block->getTerminator() : nullptr;
  SmallVector<Operation *> rest;
  for (Operation *next = op->getNextNode(); next && next != terminator;
       next = next->getNextNode())
    rest.push_back(next);
  if (rest.empty())
    return;
  SmallVector<Value> escaping;
  for (Operation *moved : rest)
    for (Value result : moved->getResults())
      if (llvm::any_of(result.getUsers(), [&](Operation *user) {
            return user == terminator;
          }))
        escaping.push_back(result);
  Location loc = op->getLoc();
  rewriter.setInsertionPointAfter(op);
  auto guard = scf::IfOp::create(rewriter, loc, TypeRange(ValueRange(escaping)),
                                 run, /*withElseRegion=*/!escaping.empty());
  if (escaping.empty()) {
    for (Operation *moved : rest)
      rewriter.moveOpBefore(moved, guard.thenBlock()->getTerminator());
    return;
  }
  rewriter.setInsertionPointToEnd(guard.thenBlock());
  auto yield = scf::YieldOp::create(rewriter, loc, escaping);
  for (Operation *moved : rest)
    rewriter.moveOpBefore(moved, yield);
  rewriter.setInsertionPointToEnd(guard.elseBlock());
  SmallVector<Value> poison;
  for (Value value : escaping)
    poison.push_back(ub::PoisonOp::create(rewriter, loc, value.getType()));
  scf::YieldOp::create(rewriter, loc, poison);
  rewriter.modifyOpInPlace(terminator, [&] {
    for (OpOperand &operand : terminator->getOpOperands())
      if (auto it = llvm::find(escaping, operand.get()); it != escaping.end())
        operand.set(guard.getResult(it - escaping.begin()));
  });
}

namespace {
/// Lowers `event.wait` to a spin loop: an acquire load of the counter until
/// it is no longer positive, calling `sched_yield` between polls so that
/// more workers than cores still make progress. The loop also ends when the
/// stop flag is set; the rest of the block (the tile body, its notifies)
/// then does not run, so a stopped worker skips each remaining task and
/// returns.
struct WaitOpLowering : public OpConversionPattern<WaitOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(WaitOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> stopFlag = getStopFlag(op);
    if (failed(stopFlag))
      return failure();
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Type i32 = rewriter.getI32Type();
    Type i1 = rewriter.getI1Type();
    Value zero = arith::ConstantIntOp::create(rewriter, op.getLoc(), 0, 32);
    auto spin = scf::WhileOp::create(
        rewriter, op.getLoc(), TypeRange{i1}, ValueRange{},
        [&](OpBuilder &b, Location loc, ValueRange) {
          Value count = LLVM::LoadOp::create(
              b, loc, i32, *pointer, /*alignment=*/4, /*isVolatile=*/false,
              /*isNonTemporal=*/false, /*isInvariant=*/false,
              /*isInvariantGroup=*/false, LLVM::AtomicOrdering::acquire);
          Value pending = arith::CmpIOp::create(
              b, loc, arith::CmpIPredicate::sgt, count, zero);
          Value stopped = isStopped(b, loc, *stopFlag);
          Value running = arith::XOrIOp::create(
              b, loc, stopped, arith::ConstantIntOp::create(b, loc, 1, 1));
          Value keepWaiting = arith::AndIOp::create(b, loc, pending, running);
          scf::ConditionOp::create(b, loc, keepWaiting, ValueRange{running});
        },
        [&](OpBuilder &b, Location loc, ValueRange) {
          func::CallOp::create(b, loc, kSchedYieldName, TypeRange{i32});
          scf::YieldOp::create(b, loc);
        });
    guardRestOfBlock(rewriter, op, spin.getResult(0));
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.notify` to a release `atomicrmw sub` of 1 on the counter.
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

/// Lowers `event.notify_ready` to an acq_rel `atomicrmw sub` of 1 on the
/// counter and a compare of the old value with 1: the notifier that takes the
/// counter to zero gets `true`.
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
/// capacity. A pop that sees the stop flag while it spins also returns the
/// capacity, so the worker loop ends.
struct QueuePopOpLowering : public OpConversionPattern<QueuePopOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueuePopOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> stopFlag = getStopFlag(op);
    if (failed(stopFlag))
      return failure();
    Value capacity = adaptor.getCapacity();
    auto waitForSlot = [&](OpBuilder &b, Location loc, Value pointer) -> Value {
      Type i32 = b.getI32Type();
      Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
      auto spin = scf::WhileOp::create(
          b, loc, TypeRange{i32, b.getI1Type()}, ValueRange{},
          [&](OpBuilder &before, Location loc, ValueRange) {
            Value published = LLVM::LoadOp::create(
                before, loc, i32, pointer, /*alignment=*/4,
                /*isVolatile=*/false, /*isNonTemporal=*/false,
                /*isInvariant=*/false, /*isInvariantGroup=*/false,
                LLVM::AtomicOrdering::acquire);
            Value empty = arith::CmpIOp::create(
                before, loc, arith::CmpIPredicate::eq, published, zero);
            Value stopped = isStopped(before, loc, *stopFlag);
            Value running = arith::XOrIOp::create(
                before, loc, stopped,
                arith::ConstantIntOp::create(before, loc, 1, 1));
            Value keepWaiting =
                arith::AndIOp::create(before, loc, empty, running);
            scf::ConditionOp::create(before, loc, keepWaiting,
                                     ValueRange{published, stopped});
          },
          [&](OpBuilder &after, Location loc, ValueRange) {
            func::CallOp::create(after, loc, kSchedYieldName, TypeRange{i32});
            scf::YieldOp::create(after, loc);
          });
      // The protocol subtracts one from the slot's value: capacity + 1
      // makes a stopped pop return the capacity.
      Value exhausted = arith::IndexCastUIOp::create(
          b, loc, i32,
          arith::AddIOp::create(b, loc, capacity,
                                arith::ConstantIndexOp::create(b, loc, 1)));
      return arith::SelectOp::create(b, loc, spin.getResult(1), exhausted,
                                     spin.getResult(0));
    };
    Value task = buildQueuePop(rewriter, op.getLoc(), adaptor.getCounters(),
                               adaptor.getQueue(), adaptor.getCapacity(),
                               /*syncScope=*/StringRef(), waitForSlot);
    rewriter.replaceOpWithNewOp<arith::IndexCastUIOp>(
        op, rewriter.getIndexType(), task);
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

/// Erases `event.lane_barrier`: with one lane there is nobody to wait for.
struct LaneBarrierLowering : public OpConversionPattern<LaneBarrierOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(LaneBarrierOp op, OpAdaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.eraseOp(op);
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
  patterns.add<WaitOpLowering, NotifyOpLowering,
               NotifyReadyOpLowering, QueuePushOpLowering, QueuePopOpLowering,
               LaneQueryLowering<LaneIdOp, 0>, LaneQueryLowering<LaneCountOp, 1>,
               LaneBarrierLowering, LaneReduceLowering, ScratchLowering>(typeConverter, patterns.getContext());
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

/// Appends the worker arguments `%worker_id: index, %worker_count: index,
/// %stop: !llvm.ptr` to `func` when it asks for its worker or spins, and
/// replaces `event.worker_id` / `event.worker_count` by them: each host
/// thread passes its own id, and all share the stop flag.
static LogicalResult materializeWorkerArguments(func::FuncOp func) {
  SmallVector<Operation *> ids, counts;
  bool spins = false;
  func.walk([&](Operation *op) {
    if (isa<WorkerIdOp>(op))
      ids.push_back(op);
    else if (isa<WorkerCountOp>(op))
      counts.push_back(op);
    else if (isa<WaitOp, QueuePopOp>(op))
      spins = true;
  });
  if (ids.empty() && counts.empty() && !spins)
    return success();
  unsigned numArgs = func.getNumArguments();
  Type index = IndexType::get(func.getContext());
  Type pointer = LLVM::LLVMPointerType::get(func.getContext());
  if (failed(func.insertArguments(
          {numArgs, numArgs, numArgs}, {index, index, pointer},
          {DictionaryAttr(), DictionaryAttr(), DictionaryAttr()},
          {func.getLoc(), func.getLoc(), func.getLoc()})))
    return func.emitOpError("cannot take the worker id, count and stop flag "
                            "as arguments");
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
    for (auto func : module.getOps<func::FuncOp>())
      if (failed(materializeWorkerArguments(func)))
        return signalPassFailure();
    bool waits = module
                     .walk([](Operation *op) {
                       return isa<WaitOp, QueuePopOp>(op)
                                  ? WalkResult::interrupt()
                                  : WalkResult::advance();
                     })
                     .wasInterrupted();
    if (waits && failed(declareSchedYield(module)))
      return signalPassFailure();

    TypeConverter typeConverter;
    populateEventToCPUTypeConversions(typeConverter);
    RewritePatternSet patterns(&getContext());
    populateEventToCPUConversionPatterns(typeConverter, patterns);
    ConversionTarget target(getContext());
    target.addIllegalDialect<EventDialect>();
    target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();

    // The runtime calls every entry point of a program through its C
    // interface; tile functions are only called from the worker.
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && !func->hasAttr("event.tile"))
        func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                      UnitAttr::get(&getContext()));
  }
};
} // namespace
