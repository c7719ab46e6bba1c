//===- PollingGPU.cpp - The polling worker's ops for persistent CTAs ------===//
//
// Lowers the ops with which the dynamic schedule of a graph on several
// ranks polls instead of waiting (`event.queue_try_pop`, `event.test`,
// `event.idle`): a remote notify is an NVSHMEM atomic from another GPU,
// which readies nobody on this one, so idle workers look for arrived
// elements themselves. Thread 0 of a CTA acts for it and the CTA shares
// what it found, as for the other event ops.
//
//===----------------------------------------------------------------------===//

#include "CTA.h"
#include "InitKernel.h"

#include "Conversion/EventToGPU/EventToGPU.h"
#include "Conversion/EventCommon/EventAddressing.h"
#include "Conversion/EventCommon/EventQueue.h"
#include "Conversion/EventCommon/EventRunHeader.h"

#include "Event/IR/EventOps.h"
#include "Event/IR/EventTypes.h"
#include "Event/IR/RunLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

StringRef etc::counterScope(Value event) {
  auto type = dyn_cast<EventTensorType>(event.getType());
  return type && type.getSymmetric() ? kSystemScope : kDeviceScope;
}

/// A relaxed load of the i32 at `pointer` at `scope`.
static Value loadRelaxed(OpBuilder &b, Location loc, Value pointer,
                         StringRef scope) {
  return LLVM::LoadOp::create(b, loc, b.getI32Type(), pointer, /*alignment=*/4,
                              /*isVolatile=*/false, /*isNonTemporal=*/false,
                              /*isInvariant=*/false,
                              /*isInvariantGroup=*/false,
                              LLVM::AtomicOrdering::monotonic, scope);
}

namespace {

/// Lowers `event.queue_try_pop` for a CTA: after a barrier (the broadcast
/// word is free), thread 0 runs the pop that never waits
/// (`buildQueueTryPop`) at GPU scope with relaxed loads of the slot and one
/// acquire fence when it took a task, and writes the result to the
/// broadcast word; a second barrier hands it to every thread, so the whole
/// CTA runs the same task (or polls together).
struct QueueTryPopOpLowering : public OpConversionPattern<QueueTryPopOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueueTryPopOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> task = broadcastFromFirstThread(
        rewriter, op, [&](OpBuilder &b, Location loc) {
          return buildQueueTryPop(b, loc, adaptor.getCounters(),
                                  adaptor.getQueue(), adaptor.getCapacity(),
                                  kDeviceScope, /*acquireOnTake=*/true);
        });
    if (failed(task))
      return failure();
    rewriter.replaceOp(op, *task);
    return success();
  }
};

/// Lowers `event.test` for a CTA: thread 0 loads the counter relaxed and,
/// when it is no longer positive, issues one acquire fence (which makes
/// that load an acquire of the notifiers' releases); a reducing barrier
/// (`bar.red.or`) gives every thread the answer and extends thread 0's
/// acquire to the CTA. Counters of symmetric events are loaded and fenced
/// at system scope: their notifiers are other GPUs, whose puts the fence
/// must order before this CTA's reads.
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
    StringRef scope = counterScope(op.getEvent());
    Value ready =
        onFirstThread(rewriter, loc, [&](OpBuilder &b, Location loc) -> Value {
          Value count = loadRelaxed(b, loc, *pointer, scope);
          Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
          Value done = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sle,
                                             count, zero);
          buildIf(b, loc, done, [&](OpBuilder &b, Location loc) {
            LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire, scope);
          });
          return done;
        });
    rewriter.replaceOp(op, barrierAny(rewriter, loc, ready));
    return success();
  }
};

/// `%globaltimer` now, the start of a wait that began at `since` (now when
/// `since` is 0: the wait's first poll) and the nanoseconds since then.
static std::pair<Value, Value> startAndElapsed(OpBuilder &b, Location loc,
                                               Value since) {
  Value now = globalTimer(b, loc);
  Value zero = arith::ConstantIntOp::create(b, loc, b.getI64Type(), 0);
  Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, since,
                                      zero);
  Value start = arith::SelectOp::create(b, loc, first, now, since);
  return {start, arith::SubIOp::create(b, loc, now, start)};
}

/// The shortest and longest back-off of an idle CTA, in nanoseconds.
static constexpr int64_t kIdleFirstSleepNs = kWaitFirstSleepNs;
static constexpr int64_t kIdleMaxSleepNs = kWaitMaxSleepNs;
/// An idle CTA sleeps this fraction (a shift: 1/16) of the time it has
/// been idle, between the bounds above.
static constexpr int64_t kIdleSleepShift = 4;

/// Lowers `event.idle` for a CTA: every thread reads `%globaltimer` and
/// keeps its idle start (the clock when `since` is 0); thread 0 alone
/// checks the watchdog and, once the CTA has been idle longer than
/// `watchdogMs` while the run goes on, writes the run header's error record
/// (with the element's counter, loaded relaxed, and the op's site, or a
/// pop's site without `on`), which stops the run. Then every thread backs
/// off with `nanosleep` for a sixteenth of the idle time, 32 to 512 ns: a
/// CTA that has just run out of work polls again soon, one that waits
/// long leaves the memory system to the producers. The next
/// `event.run_aborted` (a reducing barrier) gives the CTA one answer.
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
    Type i64 = rewriter.getI64Type();
    auto constant = [&](OpBuilder &b, int64_t value) -> Value {
      return arith::ConstantIntOp::create(b, loc, i64, value);
    };
    auto [start, idle] = startAndElapsed(rewriter, loc, adaptor.getSince());
    buildIf(rewriter, loc, isFirstThread(rewriter, loc),
            [&](OpBuilder &b, Location loc) {
              Value expired = arith::CmpIOp::create(
                  b, loc, arith::CmpIPredicate::sgt, idle,
                  constant(b, watchdogMs * 1000000));
              Value going = arith::XOrIOp::create(
                  b, loc, buildRunStopped(b, loc, counters, kDeviceScope),
                  arith::ConstantIntOp::create(b, loc, 1, 1));
              Value report = arith::AndIOp::create(b, loc, expired, going);
              buildIf(b, loc, report, [&](OpBuilder &b, Location loc) {
                Value worker = blockId(b, loc);
                WatchdogSite site =
                    pointer ? WatchdogSite::forWait(b, loc, worker,
                                                    adaptor.getSite(),
                                                    adaptor.getIndices())
                            : WatchdogSite::get(b, loc, run::kSitePop, worker,
                                                Value(), ValueRange{}, Value(),
                                                ValueRange{});
                Value value =
                    pointer ? loadRelaxed(b, loc, pointer,
                                          counterScope(op.getEvent()))
                            : arith::ConstantIntOp::create(b, loc, 0, 32)
                                  .getResult();
                Value waitedMs = arith::TruncIOp::create(
                    b, loc, b.getI32Type(),
                    arith::DivSIOp::create(b, loc, idle,
                                           constant(b, 1000000)));
                buildWatchdogReport(b, loc, counters, site, value, waitedMs);
              });
            });
    Value sleep = arith::ShRUIOp::create(rewriter, loc, idle,
                                         constant(rewriter, kIdleSleepShift));
    sleep = arith::MaxUIOp::create(rewriter, loc, sleep,
                                   constant(rewriter, kIdleFirstSleepNs));
    sleep = arith::MinUIOp::create(rewriter, loc, sleep,
                                   constant(rewriter, kIdleMaxSleepNs));
    NVVM::NanosleepOp::create(
        rewriter, loc,
        arith::TruncIOp::create(rewriter, loc, rewriter.getI32Type(), sleep));
    rewriter.replaceOp(op, start);
    return success();
  }

private:
  int64_t watchdogMs;
};

/// How long a lane's wait on an mbarrier lasts before its stalls look at
/// the run's status and the watchdog (1 ms, in nanoseconds): a healthy
/// pipeline's waits end within microseconds, and its stalls then cost no
/// load of the run header.
static constexpr int64_t kStallCheckNs = 1 << 20;

/// Lowers `event.stall` for one lane (every lane that polls a barrier
/// stalls on its own; nothing here synchronises the CTA): the lane reads
/// `%globaltimer` and keeps the time its wait began (the clock when `since`
/// is 0). Once the wait has lasted kStallCheckNs, each stall checks: it
/// loads the run's status (relaxed, GPU scope) and gives up when the run was
/// stopped; once the wait has outlived `watchdogMs` while the run goes on,
/// it writes the run header's error record (site kind kSiteBarrier: the
/// task and tile of the op's site, the element (stage, role, parity), the
/// barrier's low state word as the value), which stops the run, and gives
/// up. In a tile function the worker calls out of line, the check is a
/// call of `@__etc_stall_check` (`defineStallCheck`), which keeps its work
/// out of the function's registers (inline, a model's worker that calls
/// such tiles spilled); in one inlined into the worker (`alwaysinline`)
/// it is inline, since a call among the live wgmma accumulators of a
/// warp-specialised consumer spills them at its register bound. The
/// `mbarrier.try_wait` the lane polls with already suspends it for a
/// while, so a stall does not sleep.
struct StallOpLowering : public OpConversionPattern<StallOp> {
  StallOpLowering(const TypeConverter &typeConverter, MLIRContext *context,
                  int64_t watchdogMs)
      : OpConversionPattern(typeConverter, context), watchdogMs(watchdogMs) {}

  LogicalResult
  matchAndRewrite(StallOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Value counters = adaptor.getCounters();
    if (!counters)
      return rewriter.notifyMatchFailure(op, "no counter buffer");
    Location loc = op.getLoc();
    Type i64 = rewriter.getI64Type();
    auto constant = [&](OpBuilder &b, int64_t value) -> Value {
      return arith::ConstantIntOp::create(b, loc, i64, value);
    };
    auto [start, stalled] = startAndElapsed(rewriter, loc, adaptor.getSince());
    Value late =
        arith::CmpIOp::create(rewriter, loc, arith::CmpIPredicate::sgt,
                              stalled, constant(rewriter, kStallCheckNs));
    scf::IfOp check = inlined(op) ? inlineCheck(rewriter, op, adaptor, late,
                                                stalled)
                                  : callCheck(rewriter, op, adaptor, late,
                                              stalled);
    rewriter.replaceOp(op, ValueRange{start, check.getResult(0)});
    return success();
  }

private:
  /// Whether `op` is in a function inlined into its callers.
  static bool inlined(StallOp op) {
    auto func = op->getParentOfType<func::FuncOp>();
    auto passthrough =
        func ? func->getAttrOfType<ArrayAttr>("passthrough") : ArrayAttr();
    return passthrough &&
           llvm::any_of(passthrough, [](Attribute attribute) {
             auto name = dyn_cast<StringAttr>(attribute);
             return name && name.getValue() == "alwaysinline";
           });
  }

  scf::IfOp inlineCheck(ConversionPatternRewriter &rewriter, StallOp op,
                        OpAdaptor adaptor, Value late, Value stalled) const {
    Location loc = op.getLoc();
    Value counters = adaptor.getCounters();
    Type i64 = rewriter.getI64Type();
    auto constant = [&](OpBuilder &b, int64_t value) -> Value {
      return arith::ConstantIntOp::create(b, loc, i64, value);
    };
    return scf::IfOp::create(
        rewriter, loc, late,
        [&](OpBuilder &b, Location loc) {
          Value stopped = buildRunStopped(b, loc, counters, kDeviceScope);
          Value expired = arith::CmpIOp::create(
              b, loc, arith::CmpIPredicate::sgt, stalled,
              constant(b, watchdogMs * 1000000));
          Value going = arith::XOrIOp::create(
              b, loc, stopped, arith::ConstantIntOp::create(b, loc, 1, 1));
          Value report = arith::AndIOp::create(b, loc, expired, going);
          buildIf(b, loc, report, [&](OpBuilder &b, Location loc) {
            ValueRange site = adaptor.getSite();
            Value role = arith::ConstantIntOp::create(
                b, loc, op.getRole() == "full" ? run::kBarrierFull
                                               : run::kBarrierEmpty,
                32);
            WatchdogSite where = WatchdogSite::get(
                b, loc, run::kSiteBarrier, blockId(b, loc), site.front(),
                site.drop_front(), Value(),
                ValueRange{adaptor.getStage(), role, adaptor.getParity()});
            // The barrier's low state word (its layout is the hardware's),
            // read like any shared word: it is only shown.
            Value address = arith::IndexCastOp::create(b, loc, i64,
                                                       adaptor.getBarrier());
            Value pointer = LLVM::IntToPtrOp::create(
                b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3),
                address);
            Value state = LLVM::LoadOp::create(b, loc, b.getI32Type(), pointer,
                                               /*alignment=*/8,
                                               /*isVolatile=*/true);
            Value waitedMs = arith::TruncIOp::create(
                b, loc, b.getI32Type(),
                arith::DivSIOp::create(b, loc, stalled, constant(b, 1000000)));
            buildWatchdogReport(b, loc, counters, where, state, waitedMs);
          });
          Value giveUp = arith::OrIOp::create(b, loc, stopped, expired);
          scf::YieldOp::create(b, loc, giveUp);
        },
        [&](OpBuilder &b, Location loc) {
          scf::YieldOp::create(b, loc,
                               ValueRange{arith::ConstantIntOp::create(
                                   b, loc, 0, 1)});
        });
  }

  scf::IfOp callCheck(ConversionPatternRewriter &rewriter, StallOp op,
                      OpAdaptor adaptor, Value late, Value stalled) const {
    Location loc = op.getLoc();
    Value counters = adaptor.getCounters();
    return scf::IfOp::create(
        rewriter, loc, late,
        [&](OpBuilder &b, Location loc) {
          ValueRange site = adaptor.getSite();
          ValueRange tile = site.drop_front();
          SmallVector<Value> arguments{
              counters, stalled, site.front(),
              arith::ConstantIntOp::create(b, loc, tile.size(), 32)};
          for (int64_t k = 0; k < run::kMaxRecordRank; ++k)
            arguments.push_back(
                k < static_cast<int64_t>(tile.size())
                    ? tile[k]
                    : arith::ConstantIndexOp::create(b, loc, 0).getResult());
          arguments.append(
              {adaptor.getBarrier(), adaptor.getStage(),
               arith::ConstantIntOp::create(b, loc,
                                            op.getRole() == "full"
                                                ? run::kBarrierFull
                                                : run::kBarrierEmpty,
                                            32),
               adaptor.getParity()});
          auto call = func::CallOp::create(b, loc, kStallCheckName,
                                           TypeRange{b.getI1Type()},
                                           arguments);
          scf::YieldOp::create(b, loc, call.getResults());
        },
        [&](OpBuilder &b, Location loc) {
          scf::YieldOp::create(b, loc,
                               ValueRange{arith::ConstantIntOp::create(
                                   b, loc, 0, 1)});
        });
  }

  int64_t watchdogMs;
};

} // namespace

void etc::populatePollingToGPUConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns,
    int64_t watchdogMs) {
  MLIRContext *context = patterns.getContext();
  patterns.add<QueueTryPopOpLowering, TestOpLowering>(typeConverter, context);
  patterns.add<IdleOpLowering, StallOpLowering>(typeConverter, context,
                                                 watchdogMs);
}

LogicalResult etc::defineStallCheck(Operation *symbolTable,
                                    int64_t watchdogMs) {
  MLIRContext *ctx = symbolTable->getContext();
  if (Operation *existing =
          SymbolTable::lookupSymbolIn(symbolTable, kStallCheckName)) {
    if (isa<func::FuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << kStallCheckName
           << "', which the lowering of event.stall needs for the watchdog";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(&symbolTable->getRegion(0).front());
  Location loc = symbolTable->getLoc();
  Type i32 = b.getI32Type(), i64 = b.getI64Type(), index = b.getIndexType();
  SmallVector<Type> inputs{MemRefType::get({ShapedType::kDynamic}, i32), i64,
                           index, i32};
  inputs.append(run::kMaxRecordRank, index);
  inputs.append({index, index, i32, index});
  auto check = func::FuncOp::create(
      b, loc, kStallCheckName, b.getFunctionType(inputs, {b.getI1Type()}));
  check.setPrivate();
  // Out of line: only a wait that has lasted a millisecond calls it.
  check->setAttr("passthrough", b.getArrayAttr({b.getStringAttr("noinline")}));
  Block *entry = check.addEntryBlock();
  b.setInsertionPointToStart(entry);
  ValueRange args = entry->getArguments();
  Value counters = args[0], stalled = args[1];
  ValueRange tile = args.slice(4, run::kMaxRecordRank);
  ValueRange rest = args.drop_front(4 + run::kMaxRecordRank);
  Value barrier = rest[0], stage = rest[1], role = rest[2], parity = rest[3];
  auto toI32 = [&](OpBuilder &b, Value value) -> Value {
    return arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  };
  auto i32Constant = [&](OpBuilder &b, int64_t value) -> Value {
    return arith::ConstantIntOp::create(b, loc, value, 32);
  };
  Value stopped = buildRunStopped(b, loc, counters, kDeviceScope);
  Value expired = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::sgt, stalled,
      arith::ConstantIntOp::create(b, loc, i64, watchdogMs * 1000000));
  Value going =
      arith::XOrIOp::create(b, loc, stopped, arith::ConstantIntOp::create(b, loc, 1, 1));
  Value report = arith::AndIOp::create(b, loc, expired, going);
  buildIf(b, loc, report, [&](OpBuilder &b, Location loc) {
    WatchdogSite site;
    site.kind = i32Constant(b, run::kSiteBarrier);
    site.worker = toI32(b, blockId(b, loc));
    site.task = toI32(b, args[2]);
    site.tileRank = args[3];
    for (Value coordinate : tile)
      site.tile.push_back(toI32(b, coordinate));
    site.event = i32Constant(b, -1);
    site.elementRank = i32Constant(b, 3);
    site.element = {toI32(b, stage), role, toI32(b, parity)};
    while (static_cast<int64_t>(site.element.size()) < run::kMaxRecordRank)
      site.element.push_back(i32Constant(b, 0));
    // The barrier's low state word (its layout is the hardware's), read
    // like any shared word: it is only shown.
    Value pointer = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3),
        arith::IndexCastOp::create(b, loc, b.getI64Type(), barrier)
            .getResult());
    Value state = LLVM::LoadOp::create(b, loc, b.getI32Type(), pointer,
                                       /*alignment=*/8, /*isVolatile=*/true);
    Value waitedMs = arith::TruncIOp::create(
        b, loc, b.getI32Type(),
        arith::DivSIOp::create(
            b, loc, stalled,
            arith::ConstantIntOp::create(b, loc, b.getI64Type(), 1000000)));
    buildWatchdogReport(b, loc, counters, site, state, waitedMs);
  });
  func::ReturnOp::create(b, loc,
                         ValueRange{arith::OrIOp::create(b, loc, stopped,
                                                         expired)});
  return success();
}
