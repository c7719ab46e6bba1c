//===- EventRunHeader.cpp - Watchdog and trace records for the targets ----===//

#include "Conversion/EventCommon/EventRunHeader.h"

#include "Conversion/EventCommon/EventAddressing.h"
#include "Event/IR/RunLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace etc;
namespace run = etc::event::run;

/// The address of counter `position` of `counters`.
static Value wordPointer(OpBuilder &b, Location loc, Value counters,
                         Value position) {
  return getCounterPointer(b, loc, counters, position);
}

/// The address of word `word` of the run header: the last
/// `run::kHeaderWords` words of `counters`, found from its size.
static Value headerPointer(OpBuilder &b, Location loc, Value counters,
                           int64_t word) {
  Value size = memref::DimOp::create(
      b, loc, counters, arith::ConstantIndexOp::create(b, loc, 0));
  Value position = arith::SubIOp::create(
      b, loc, size,
      arith::ConstantIndexOp::create(b, loc, run::kHeaderWords - word));
  return wordPointer(b, loc, counters, position);
}

Value etc::buildHeaderWordPointer(OpBuilder &b, Location loc, Value counters,
                                  int64_t word) {
  return headerPointer(b, loc, counters, word);
}

static Value i32(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIntOp::create(b, loc, value, 32);
}

static Value toI32(OpBuilder &b, Location loc, Value value) {
  if (value.getType().isIndex())
    return arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  if (value.getType().getIntOrFloatBitWidth() > 32)
    return arith::TruncIOp::create(b, loc, b.getI32Type(), value);
  return value;
}

/// A plain store of the i32 `value` to `pointer` (the error record and the
/// trace records are read after the run, or published by a release).
static void storePlain(OpBuilder &b, Location loc, Value value, Value pointer) {
  LLVM::StoreOp::create(b, loc, value, pointer, /*alignment=*/4);
}

/// Stores up to kMaxRecordRank coordinates from word `first` on.
static void storeCoordinates(OpBuilder &b, Location loc, Value counters,
                             Value first, ValueRange coordinates) {
  for (auto [index, coordinate] : llvm::enumerate(coordinates)) {
    if (static_cast<int64_t>(index) >= run::kMaxRecordRank)
      break;
    Value word = arith::AddIOp::create(
        b, loc, first, arith::ConstantIndexOp::create(b, loc, index));
    storePlain(b, loc, toI32(b, loc, coordinate),
               wordPointer(b, loc, counters, word));
  }
}

Value etc::buildRunStopped(OpBuilder &b, Location loc, Value counters,
                           StringRef syncScope) {
  Value status = LLVM::LoadOp::create(
      b, loc, b.getI32Type(), headerPointer(b, loc, counters, run::kStatusWord),
      /*alignment=*/4, /*isVolatile=*/false, /*isNonTemporal=*/false,
      /*isInvariant=*/false, /*isInvariantGroup=*/false,
      LLVM::AtomicOrdering::monotonic, syncScope);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, status,
                               i32(b, loc, run::kRunning));
}

/// The i32 words of a site, in the order the report and spin functions
/// take them: kind, worker, task, tile rank, the tile, event, element
/// rank, the element.
static SmallVector<Value> siteWords(const WatchdogSite &site) {
  SmallVector<Value> words{site.kind, site.worker, site.task, site.tileRank};
  words.append(site.tile.begin(), site.tile.end());
  words.append({site.event, site.elementRank});
  words.append(site.element.begin(), site.element.end());
  return words;
}

/// The number of i32 words of a site.
static constexpr int64_t kSiteWords = 6 + 2 * run::kMaxRecordRank;

WatchdogSite WatchdogSite::forWait(OpBuilder &b, Location loc, Value worker,
                                   ValueRange site, ValueRange element) {
  if (site.empty())
    return get(b, loc, run::kSiteWait, worker, Value(), ValueRange{}, Value(),
               element);
  return get(b, loc, run::kSiteWait, worker, site[0], site.drop_front(2),
             site[1], element);
}

WatchdogSite WatchdogSite::get(OpBuilder &b, Location loc, int32_t kind,
                               Value worker, Value task, ValueRange tile,
                               Value event, ValueRange element) {
  auto padded = [&](ValueRange values) {
    SmallVector<Value, 4> words;
    for (int64_t k = 0; k < run::kMaxRecordRank; ++k)
      words.push_back(k < static_cast<int64_t>(values.size())
                          ? toI32(b, loc, values[k])
                          : i32(b, loc, 0));
    return words;
  };
  auto orUnknown = [&](Value value) {
    return value ? toI32(b, loc, value) : i32(b, loc, -1);
  };
  return WatchdogSite{i32(b, loc, kind),
                      toI32(b, loc, worker),
                      orUnknown(task),
                      i32(b, loc, tile.size()),
                      padded(tile),
                      orUnknown(event),
                      i32(b, loc, element.size()),
                      padded(element)};
}

void etc::buildWatchdogReport(OpBuilder &b, Location loc, Value counters,
                              const WatchdogSite &site, Value value,
                              Value waitedMs) {
  SmallVector<Value> arguments{
      headerPointer(b, loc, counters, run::kStatusWord)};
  arguments.append(siteWords(site));
  arguments.append({value, waitedMs});
  LLVM::CallOp::create(b, loc, TypeRange{}, kWatchdogReportName, arguments);
}

/// Defines `@__etc_watchdog_report(run header address, site words, value,
/// milliseconds)` (see `defineSpinFunctions`).
static LogicalResult defineWatchdogReport(Operation *symbolTable,
                                          StringRef syncScope) {
  MLIRContext *ctx = symbolTable->getContext();
  if (Operation *existing =
          SymbolTable::lookupSymbolIn(symbolTable, kWatchdogReportName)) {
    if (isa<LLVM::LLVMFuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << kWatchdogReportName
           << "', which the lowering of waits needs for the watchdog";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(&symbolTable->getRegion(0).front());
  Location loc = symbolTable->getLoc();
  Type i32Type = b.getI32Type();
  auto pointer = LLVM::LLVMPointerType::get(ctx);
  SmallVector<Type> inputs{pointer};
  inputs.append(kSiteWords + 2, i32Type);
  auto report = LLVM::LLVMFuncOp::create(
      b, loc, kWatchdogReportName,
      LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(ctx), inputs),
      LLVM::Linkage::Internal);
  report.setNoInline(true);
  Block *entry = report.addEntryBlock(b);
  Block *write = report.addBlock();
  Block *done = report.addBlock();
  Value base = entry->getArgument(0);
  auto word = [&](OpBuilder &b, int64_t position) -> Value {
    if (position == 0)
      return base;
    return LLVM::GEPOp::create(b, loc, pointer, i32Type, base,
                               ArrayRef<LLVM::GEPArg>{position});
  };
  b.setInsertionPointToStart(entry);
  Value one = LLVM::ConstantOp::create(b, loc, i32Type, 1);
  Value zero = LLVM::ConstantOp::create(b, loc, i32Type, 0);
  Value claim = LLVM::AtomicRMWOp::create(
      b, loc, LLVM::AtomicBinOp::add, word(b, run::kClaimWord), one,
      LLVM::AtomicOrdering::monotonic, syncScope, /*alignment=*/4);
  Value first =
      LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::eq, claim, zero);
  LLVM::CondBrOp::create(b, loc, first, write, done);

  b.setInsertionPointToStart(write);
  // The words in the order of the arguments, to their places in the header.
  SmallVector<int64_t> positions{run::kSiteWord, run::kWorkerWord,
                                 run::kTaskWord, run::kTileRankWord};
  for (int64_t k = 0; k < run::kMaxRecordRank; ++k)
    positions.push_back(run::kTileWords + k);
  positions.append({run::kEventWord, run::kElementRankWord});
  for (int64_t k = 0; k < run::kMaxRecordRank; ++k)
    positions.push_back(run::kElementWords + k);
  positions.append({run::kValueWord, run::kWaitedMsWord});
  for (auto [index, position] : llvm::enumerate(positions))
    LLVM::StoreOp::create(b, loc, entry->getArgument(index + 1),
                          word(b, position), /*alignment=*/4);
  // Release, as a fence and a relaxed store: LLVM's NVPTX backend drops the
  // ordering of release atomics.
  LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::release, syncScope);
  Value watchdog = LLVM::ConstantOp::create(b, loc, i32Type, run::kWatchdog);
  LLVM::StoreOp::create(b, loc, watchdog, word(b, run::kStatusWord),
                        /*alignment=*/4, /*isVolatile=*/false,
                        /*isNonTemporal=*/false, /*isInvariantGroup=*/false,
                        LLVM::AtomicOrdering::monotonic, syncScope);
  LLVM::BrOp::create(b, loc, done);

  b.setInsertionPointToStart(done);
  LLVM::ReturnOp::create(b, loc, ValueRange{});
  return success();
}

/// One poll of a spin's element: an acquire load, or a relaxed one when the
/// spin acquires once it is done.
static Value loadPoll(OpBuilder &b, Location loc, Value pointer,
                      StringRef syncScope, SpinAcquire acquire) {
  return LLVM::LoadOp::create(
      b, loc, b.getI32Type(), pointer, /*alignment=*/4, /*isVolatile=*/false,
      /*isNonTemporal=*/false, /*isInvariant=*/false,
      /*isInvariantGroup=*/false,
      acquire == SpinAcquire::EachPoll ? LLVM::AtomicOrdering::acquire
                                       : LLVM::AtomicOrdering::monotonic,
      syncScope);
}

/// Whether `value`, loaded from a spin's element, means it is done.
static Value isDone(OpBuilder &b, Location loc, SpinUntil until,
                    Value value) {
  Value zero = i32(b, loc, 0);
  return arith::CmpIOp::create(b, loc,
                               until == SpinUntil::CounterReady
                                   ? arith::CmpIPredicate::sle
                                   : arith::CmpIPredicate::ne,
                               value, zero);
}

/// The spin loop in the body of a spin function (see `defineSpinFunctions`).
static Value buildSpinLoop(OpBuilder &b, Location loc, Value counters,
                           Value pointer, const SpinTarget &target,
                           const WatchdogSite &site, SpinUntil until) {
  Type i32Type = b.getI32Type();
  Type i64Type = b.getI64Type();
  Type i1Type = b.getI1Type();
  Value noStart = arith::ConstantIntOp::create(b, loc, 0, 64);
  Value notStopped = arith::ConstantIntOp::create(b, loc, 0, 1);
  Value firstBackOff = i32(b, loc, target.firstBackOff);
  auto loop = scf::WhileOp::create(
      b, loc, TypeRange{i64Type, i1Type, i32Type, i32Type},
      ValueRange{noStart, notStopped, firstBackOff},
      [&](OpBuilder &b, Location loc, ValueRange args) {
        Value value = loadPoll(b, loc, pointer, target.syncScope,
                               target.acquire);
        Value pending = arith::XOrIOp::create(
            b, loc, isDone(b, loc, until, value),
            arith::ConstantIntOp::create(b, loc, 1, 1));
        Value running = arith::XOrIOp::create(
            b, loc, args[1], arith::ConstantIntOp::create(b, loc, 1, 1));
        Value more = arith::AndIOp::create(b, loc, pending, running);
        scf::ConditionOp::create(b, loc, more,
                                 ValueRange{args[0], args[1], args[2], value});
      },
      [&](OpBuilder &b, Location loc, ValueRange args) {
        Value backOff =
            target.backOff ? target.backOff(b, loc, args[2]) : args[2];
        Value stopped = buildRunStopped(b, loc, counters, target.syncScope);
        Value now = target.now(b, loc);
        Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                            args[0], noStart);
        Value start = arith::SelectOp::create(b, loc, first, now, args[0]);
        Value elapsed = arith::SubIOp::create(b, loc, now, start);
        Value timeoutNs =
            arith::ConstantIntOp::create(b, loc, target.timeoutMs * 1000000, 64);
        Value expired = arith::CmpIOp::create(
            b, loc, arith::CmpIPredicate::sgt, elapsed, timeoutNs);
        Value report = arith::AndIOp::create(
            b, loc, expired,
            arith::XOrIOp::create(b, loc, stopped,
                                  arith::ConstantIntOp::create(b, loc, 1, 1)));
        scf::IfOp::create(b, loc, report, [&](OpBuilder &then, Location loc) {
          Value waitedMs = arith::DivSIOp::create(
              then, loc, elapsed,
              arith::ConstantIntOp::create(then, loc, 1000000, 64));
          SmallVector<Value> arguments{
              headerPointer(then, loc, counters, run::kStatusWord)};
          arguments.append(siteWords(site));
          arguments.append({args[3], toI32(then, loc, waitedMs)});
          LLVM::CallOp::create(then, loc, TypeRange{}, kWatchdogReportName,
                               arguments);
          scf::YieldOp::create(then, loc);
        });
        Value stop = arith::OrIOp::create(b, loc, stopped, expired);
        if (target.block) {
          Value going = arith::XOrIOp::create(
              b, loc, stop, arith::ConstantIntOp::create(b, loc, 1, 1));
          target.block(b, loc,
                       SpinProgress{counters, pointer, args[3], elapsed,
                                    timeoutNs, going});
        }
        scf::YieldOp::create(b, loc, ValueRange{start, stop, backOff});
      });
  return loop.getResult(3);
}

/// Defines the spin function `name` (see `defineSpinFunctions`).
static LogicalResult defineSpinFunction(Operation *symbolTable, StringRef name,
                                        const SpinTarget &target,
                                        SpinUntil until) {
  MLIRContext *ctx = symbolTable->getContext();
  if (Operation *existing = SymbolTable::lookupSymbolIn(symbolTable, name)) {
    if (isa<func::FuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << name << "', which the lowering of waits needs for the watchdog";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(&symbolTable->getRegion(0).front());
  Location loc = symbolTable->getLoc();
  Type i32Type = b.getI32Type();
  SmallVector<Type> inputs{
      MemRefType::get({ShapedType::kDynamic}, i32Type),
      LLVM::LLVMPointerType::get(ctx)};
  inputs.append(kSiteWords, i32Type);
  auto spin = func::FuncOp::create(b, loc, name,
                                   b.getFunctionType(inputs, {i32Type}));
  spin.setPrivate();
  // Out of line: the spin is the cold path of every wait.
  spin->setAttr("passthrough", b.getArrayAttr({b.getStringAttr("noinline")}));
  Block *entry = spin.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto words = entry->getArguments().drop_front(2);
  auto coordinates = [&](int64_t first) {
    return SmallVector<Value, 4>(words.begin() + first,
                                 words.begin() + first + run::kMaxRecordRank);
  };
  WatchdogSite site{words[0], words[1], words[2], words[3], coordinates(4),
                    words[4 + run::kMaxRecordRank],
                    words[5 + run::kMaxRecordRank],
                    coordinates(6 + run::kMaxRecordRank)};
  Value last = buildSpinLoop(b, loc, entry->getArgument(0),
                             entry->getArgument(1), target, site, until);
  func::ReturnOp::create(b, loc, last);
  return success();
}

LogicalResult etc::defineSpinFunctions(Operation *symbolTable,
                                       const SpinTarget &target,
                                       bool systemCounters) {
  if (failed(defineWatchdogReport(symbolTable, target.syncScope)) ||
      failed(defineSpinFunction(symbolTable, kSpinCounterName, target,
                                SpinUntil::CounterReady)) ||
      failed(defineSpinFunction(symbolTable, kSpinSlotName, target,
                                SpinUntil::SlotPublished)))
    return failure();
  if (!systemCounters)
    return success();
  // The same spin at system scope ("" in LLVM's sync scopes): its polls
  // and its check of the run's status (the cold path) are system-scope.
  SpinTarget system = target;
  system.syncScope = "";
  return defineSpinFunction(symbolTable, kSpinCounterSystemName, system,
                            SpinUntil::CounterReady);
}

Value etc::buildSpin(OpBuilder &b, Location loc, Value counters, Value pointer,
                     StringRef syncScope, SpinUntil until,
                     const WatchdogSite &site, SpinAcquire acquire,
                     StringRef spinFunction) {
  Type i32Type = b.getI32Type();
  Value value = loadPoll(b, loc, pointer, syncScope, acquire);
  auto ifOp = scf::IfOp::create(
      b, loc, isDone(b, loc, until, value),
      [&](OpBuilder &then, Location loc) {
        scf::YieldOp::create(then, loc, value);
      },
      [&](OpBuilder &otherwise, Location loc) {
        SmallVector<Value> arguments{counters, pointer};
        arguments.append(siteWords(site));
        StringRef callee = !spinFunction.empty() ? spinFunction
                           : until == SpinUntil::CounterReady
                               ? StringRef(kSpinCounterName)
                               : StringRef(kSpinSlotName);
        Value last = func::CallOp::create(otherwise, loc, callee,
                                          TypeRange{i32Type}, arguments)
                         .getResult(0);
        scf::YieldOp::create(otherwise, loc, last);
      });
  // Relaxed polls synchronise with the element's last writer here, once:
  // the fence makes the load that saw the element done an acquire.
  if (acquire == SpinAcquire::OnceDone)
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acquire, syncScope);
  return ifOp.getResult(0);
}

/// Stores the i64 `value` as (low, high) i32 words from word `first` on.
static void storeTime(OpBuilder &b, Location loc, Value counters, Value first,
                      Value value) {
  Type i32Type = b.getI32Type();
  Value low = arith::TruncIOp::create(b, loc, i32Type, value);
  Value high = arith::TruncIOp::create(
      b, loc, i32Type,
      arith::ShRUIOp::create(b, loc, value,
                             arith::ConstantIntOp::create(b, loc, 32, 64)));
  storePlain(b, loc, low, wordPointer(b, loc, counters, first));
  Value next = arith::AddIOp::create(b, loc, first,
                                     arith::ConstantIndexOp::create(b, loc, 1));
  storePlain(b, loc, high, wordPointer(b, loc, counters, next));
}

static Value recordWord(OpBuilder &b, Location loc, Value record,
                        int64_t word) {
  return arith::AddIOp::create(b, loc, record,
                               arith::ConstantIndexOp::create(b, loc, word));
}

void etc::buildTraceBegin(OpBuilder &b, Location loc, Value counters,
                          Value record, Value worker, Value task,
                          ValueRange tile, Value nowNs) {
  storePlain(b, loc, toI32(b, loc, worker),
             wordPointer(b, loc, counters,
                         recordWord(b, loc, record, run::kTraceWorkerWord)));
  storePlain(b, loc, toI32(b, loc, task),
             wordPointer(b, loc, counters,
                         recordWord(b, loc, record, run::kTraceTaskWord)));
  storeCoordinates(b, loc, counters,
                   recordWord(b, loc, record, run::kTraceTileWords), tile);
  storeTime(b, loc, counters, recordWord(b, loc, record, run::kTraceStartWord),
            nowNs);
}

void etc::buildTraceEnd(OpBuilder &b, Location loc, Value counters,
                        Value record, Value nowNs) {
  storeTime(b, loc, counters, recordWord(b, loc, record, run::kTraceEndWord),
            nowNs);
}

void etc::dropProgramTables(Operation *module) {
  module->walk([](Operation *op) {
    if (!isa<FunctionOpInterface>(op))
      return;
    op->removeAttr("event.tasks");
    op->removeAttr("event.events");
  });
}
