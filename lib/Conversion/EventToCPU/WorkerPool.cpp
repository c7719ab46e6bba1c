//===- WorkerPool.cpp - Native entry points of the CPU worker pool --------===//
//
// The loop a pool thread parks in, the launcher that hands a run to the
// pool's threads and waits for them, and the packed worker through which
// both reach a program's worker without knowing its arguments (see
// WorkerPool.h). The waits use the futex protocol of the program's own
// waits (`@__etc_sleep` / `@__etc_wake`, SystemFunctions.cpp): a sleeper
// counts itself in a sleepers word and reads its word again (both seq_cst)
// before it blocks; the writer changes the word and then reads the sleepers
// word (both seq_cst) and wakes only if someone sleeps.
//
//===----------------------------------------------------------------------===//

#include "WorkerPool.h"

#include "Conversion/EventToCPU/EventToCPU.h"

#include "mlir/Conversion/LLVMCommon/TypeConverter.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/SymbolTable.h"

#include <limits>

using namespace mlir;
using namespace etc;
using namespace etc::pool;

namespace {
/// LLVM ops at one location, with the types the pool's words have.
struct Emitter {
  Emitter(OpBuilder &b, Location loc)
      : b(b), loc(loc), i32(b.getI32Type()), i64(b.getI64Type()),
        pointer(LLVM::LLVMPointerType::get(b.getContext())) {}

  Value constant(Type type, int64_t value) {
    return LLVM::ConstantOp::create(b, loc, type, value);
  }
  /// The address `offset` bytes after `base`.
  Value at(Value base, int64_t offset) {
    return LLVM::GEPOp::create(b, loc, pointer, b.getI8Type(), base,
                               ArrayRef<LLVM::GEPArg>{
                                   static_cast<int32_t>(offset)});
  }
  Value load(Type type, Value address,
             LLVM::AtomicOrdering ordering = LLVM::AtomicOrdering::not_atomic) {
    unsigned alignment = type == i32 ? 4 : 8;
    return LLVM::LoadOp::create(b, loc, type, address, alignment,
                                /*isVolatile=*/false, /*isNonTemporal=*/false,
                                /*isInvariant=*/false,
                                /*isInvariantGroup=*/false, ordering);
  }
  void store(Value value, Value address,
             LLVM::AtomicOrdering ordering = LLVM::AtomicOrdering::not_atomic) {
    unsigned alignment = value.getType() == i32 ? 4 : 8;
    LLVM::StoreOp::create(b, loc, value, address, alignment,
                          /*isVolatile=*/false, /*isNonTemporal=*/false,
                          /*isInvariantGroup=*/false, ordering);
  }
  /// A seq_cst read-modify-write of the i32 at `address`; the old value.
  Value add(Value address, int32_t value) {
    return LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, address,
                                     constant(i32, value),
                                     LLVM::AtomicOrdering::seq_cst,
                                     StringRef(), /*alignment=*/4);
  }
  Value clock() {
    return LLVM::CallOp::create(b, loc, TypeRange{i64}, kMonotonicClockName,
                                ValueRange{})
        .getResult();
  }
  /// `@__etc_sleep(word, seen, sleepers, nanoseconds)`.
  void sleep(Value word, Value seen, Value sleepers, Value nanoseconds) {
    LLVM::CallOp::create(b, loc, TypeRange{}, kSleepName,
                         ValueRange{word, seen, sleepers, nanoseconds});
  }
  /// Wakes the threads blocked on `word` if the sleepers word at
  /// `sleepers` counts any (a seq_cst load), then branches to `next`.
  void wakeIfSleepers(Value word, Value sleepers, Block *next) {
    Value asleep = load(i32, sleepers, LLVM::AtomicOrdering::seq_cst);
    Value any = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne, asleep,
                                     constant(i32, 0));
    Block *wake = &b.getBlock()->getParent()->emplaceBlock();
    LLVM::CondBrOp::create(b, loc, any, wake, next);
    b.setInsertionPointToStart(wake);
    LLVM::CallOp::create(b, loc, TypeRange{}, kWakeName, ValueRange{word});
    LLVM::BrOp::create(b, loc, next);
  }
  Value compare(LLVM::ICmpPredicate predicate, Value lhs, Value rhs) {
    return LLVM::ICmpOp::create(b, loc, predicate, lhs, rhs);
  }

  OpBuilder &b;
  Location loc;
  Type i32, i64, pointer;
};
} // namespace

/// Creates `llvm.func @name(inputs) -> result` at the end of `module` with
/// an entry block; null if the function is there already; fails if the
/// symbol means something else.
static FailureOr<LLVM::LLVMFuncOp> createFunction(ModuleOp module,
                                                  StringRef name, Type result,
                                                  ArrayRef<Type> inputs) {
  if (Operation *existing = SymbolTable::lookupSymbolIn(module, name)) {
    if (isa<LLVM::LLVMFuncOp>(existing))
      return LLVM::LLVMFuncOp();
    return existing->emitOpError("uses the symbol '")
           << name << "', which the CPU lowering needs for the worker pool";
  }
  OpBuilder b(module.getContext());
  b.setInsertionPointToEnd(module.getBody());
  auto func = LLVM::LLVMFuncOp::create(
      b, module.getLoc(), name, LLVM::LLVMFunctionType::get(result, inputs));
  func.addEntryBlock(b);
  return func;
}

/// `@_mlir_ciface_<graph>_park(mailbox)`: see WorkerPool.h.
static LogicalResult definePark(ModuleOp module, StringRef graph) {
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Emitter e(b, module.getLoc());
  FailureOr<LLVM::LLVMFuncOp> park =
      createFunction(module, ("_mlir_ciface_" + graph + "_park").str(),
                     LLVM::LLVMVoidType::get(ctx), {e.pointer});
  if (failed(park))
    return failure();
  if (!*park)
    return success();
  Region &body = park->getBody();
  Block *entry = &body.front();
  Block *await = &body.emplaceBlock();
  Block *poll = &body.emplaceBlock();
  Block *idle = &body.emplaceBlock();
  Block *block = &body.emplaceBlock();
  Block *take = &body.emplaceBlock();
  take->addArgument(e.i32, e.loc);
  Block *run = &body.emplaceBlock();
  Block *last = &body.emplaceBlock();
  Block *leave = &body.emplaceBlock();
  Value mailbox = entry->getArgument(0);

  b.setInsertionPointToStart(entry);
  Value generation = e.at(mailbox, kGenerationOffset);
  Value sleepers = e.at(mailbox, kSleepersOffset);
  Value served = e.at(mailbox, kServedOffset);
  LLVM::BrOp::create(b, e.loc, await);

  // Waiting for a generation other than the one served last.
  b.setInsertionPointToStart(await);
  Value seen = e.load(e.i32, served);
  Value start = e.clock();
  LLVM::BrOp::create(b, e.loc, poll);

  b.setInsertionPointToStart(poll);
  Value now = e.load(e.i32, generation, LLVM::AtomicOrdering::acquire);
  LLVM::CondBrOp::create(b, e.loc,
                         e.compare(LLVM::ICmpPredicate::ne, now, seen), take,
                         ValueRange{now}, idle, ValueRange{});

  b.setInsertionPointToStart(idle);
  Value spun = LLVM::SubOp::create(b, e.loc, e.clock(), start);
  Value budget = e.load(e.i64, e.at(mailbox, kIdleSpinOffset));
  LLVM::CondBrOp::create(b, e.loc,
                         e.compare(LLVM::ICmpPredicate::sge, spun, budget),
                         block, poll);

  // An idle thread needs no timeout: a leave is a new generation too.
  b.setInsertionPointToStart(block);
  e.sleep(generation, seen, sleepers,
          e.constant(e.i64, std::numeric_limits<int32_t>::max() *
                                int64_t{1000000000}));
  LLVM::BrOp::create(b, e.loc, poll);

  b.setInsertionPointToStart(take);
  e.store(take->getArgument(0), served);
  Value command = e.load(e.i32, e.at(mailbox, kCommandOffset));
  LLVM::CondBrOp::create(
      b, e.loc,
      e.compare(LLVM::ICmpPredicate::eq, command,
                e.constant(e.i32, kCommandLeave)),
      leave, run);

  b.setInsertionPointToStart(run);
  Value function = e.load(e.pointer, e.at(mailbox, kFunctionOffset));
  Value arguments = e.load(e.pointer, e.at(mailbox, kArgumentsOffset));
  Value worker = e.load(e.i64, e.at(mailbox, kWorkerOffset));
  Value workers = e.load(e.i64, e.at(mailbox, kWorkerCountOffset));
  Value done = e.load(e.pointer, e.at(mailbox, kRunOffset));
  LLVM::CallOp::create(b, e.loc,
                       LLVM::LLVMFunctionType::get(
                           LLVM::LLVMVoidType::get(ctx),
                           {e.pointer, e.i64, e.i64}),
                       ValueRange{function, arguments, worker, workers});
  // The mailbox may be written for the next run as soon as the count is
  // zero: everything needed after it was read before. The last thread and
  // the one before it wake the launcher (the launcher polls for the last).
  Value pending = e.at(done, kPendingOffset);
  Value before = e.add(pending, -1);
  LLVM::CondBrOp::create(
      b, e.loc,
      e.compare(LLVM::ICmpPredicate::sle, before, e.constant(e.i32, 2)), last,
      await);

  b.setInsertionPointToStart(last);
  e.wakeIfSleepers(pending, e.at(done, kRunSleepersOffset), await);

  b.setInsertionPointToStart(leave);
  LLVM::ReturnOp::create(b, e.loc, ValueRange{});
  return success();
}

/// `@_mlir_ciface_<graph>_launch(mailboxes, count, run, spinNs, timeoutNs,
/// command, function, arguments, workerCount)`: see WorkerPool.h.
static LogicalResult defineLaunch(ModuleOp module, StringRef graph) {
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Emitter e(b, module.getLoc());
  FailureOr<LLVM::LLVMFuncOp> launch = createFunction(
      module, ("_mlir_ciface_" + graph + "_launch").str(), e.i32,
      {e.pointer, e.i64, e.pointer, e.i64, e.i64, e.i32, e.pointer, e.pointer,
       e.i64});
  if (failed(launch))
    return failure();
  if (!*launch)
    return success();
  Region &body = launch->getBody();
  Block *entry = &body.front();
  Block *bump = &body.emplaceBlock();
  bump->addArgument(e.i64, e.loc);
  Block *next = &body.emplaceBlock();
  next->addArgument(e.i64, e.loc);
  Block *started = &body.emplaceBlock();
  // The last count seen and when it was first seen.
  Block *poll = &body.emplaceBlock();
  poll->addArguments({e.i32, e.i64}, {e.loc, e.loc});
  Block *busy = &body.emplaceBlock();
  Block *block = &body.emplaceBlock();
  Block *out = &body.emplaceBlock();
  out->addArgument(e.i32, e.loc);
  Value mailboxes = entry->getArgument(0), count = entry->getArgument(1);
  Value done = entry->getArgument(2), spinNs = entry->getArgument(3);
  Value timeoutNs = entry->getArgument(4), command = entry->getArgument(5);
  Value function = entry->getArgument(6), arguments = entry->getArgument(7);
  Value workers = entry->getArgument(8);

  b.setInsertionPointToStart(entry);
  Value zero = e.constant(e.i64, 0);
  LLVM::BrOp::create(b, e.loc, ValueRange{zero}, next);

  // Writes each mailbox's command and bumps its generation, which orders
  // the words before it for the thread (it loads the generation with
  // acquire).
  b.setInsertionPointToStart(next);
  Value index = next->getArgument(0);
  LLVM::CondBrOp::create(b, e.loc,
                         e.compare(LLVM::ICmpPredicate::slt, index, count),
                         bump, ValueRange{index}, started, ValueRange{});

  b.setInsertionPointToStart(bump);
  Value worker = bump->getArgument(0);
  Value slot = LLVM::GEPOp::create(b, e.loc, e.pointer, e.pointer, mailboxes,
                                   ArrayRef<LLVM::GEPArg>{worker});
  Value mailbox = e.load(e.pointer, slot);
  e.store(command, e.at(mailbox, kCommandOffset));
  e.store(function, e.at(mailbox, kFunctionOffset));
  e.store(arguments, e.at(mailbox, kArgumentsOffset));
  e.store(worker, e.at(mailbox, kWorkerOffset));
  e.store(workers, e.at(mailbox, kWorkerCountOffset));
  e.store(done, e.at(mailbox, kRunOffset));
  Value generation = e.at(mailbox, kGenerationOffset);
  e.add(generation, 1);
  Block *following = &body.emplaceBlock();
  e.wakeIfSleepers(generation, e.at(mailbox, kSleepersOffset), following);
  b.setInsertionPointToStart(following);
  LLVM::BrOp::create(
      b, e.loc,
      ValueRange{LLVM::AddOp::create(b, e.loc, worker, e.constant(e.i64, 1))},
      next);

  // Waits for the run's pending count to reach zero: blocks while more
  // than one thread runs, and polls for `spinNs` once only one does (the
  // one before it wakes the launcher for that).
  b.setInsertionPointToStart(started);
  Value pending = e.at(done, kPendingOffset);
  Value start = e.clock();
  LLVM::BrOp::create(b, e.loc, ValueRange{e.constant(e.i32, -1), start}, poll);

  b.setInsertionPointToStart(poll);
  Value seen = poll->getArgument(0), since = poll->getArgument(1);
  Value left = e.load(e.i32, pending, LLVM::AtomicOrdering::acquire);
  LLVM::CondBrOp::create(
      b, e.loc, e.compare(LLVM::ICmpPredicate::eq, left, e.constant(e.i32, 0)),
      out, ValueRange{left}, busy, ValueRange{});

  b.setInsertionPointToStart(busy);
  Value now = e.clock();
  Value elapsed = LLVM::SubOp::create(b, e.loc, now, start);
  Block *wait = &body.emplaceBlock();
  LLVM::CondBrOp::create(
      b, e.loc, e.compare(LLVM::ICmpPredicate::sge, elapsed, timeoutNs), out,
      ValueRange{left}, wait, ValueRange{});
  b.setInsertionPointToStart(wait);
  Value changed = e.compare(LLVM::ICmpPredicate::ne, left, seen);
  Value from = LLVM::SelectOp::create(b, e.loc, changed, now, since);
  Value last = e.compare(LLVM::ICmpPredicate::eq, left, e.constant(e.i32, 1));
  Value polling = LLVM::AndOp::create(
      b, e.loc, last,
      e.compare(LLVM::ICmpPredicate::slt,
                LLVM::SubOp::create(b, e.loc, now, from), spinNs));
  LLVM::CondBrOp::create(b, e.loc, polling, poll, ValueRange{left, from},
                         block, ValueRange{});

  b.setInsertionPointToStart(block);
  e.sleep(pending, left, e.at(done, kRunSleepersOffset),
          LLVM::SubOp::create(b, e.loc, timeoutNs, elapsed));
  LLVM::BrOp::create(b, e.loc, ValueRange{left, from}, poll);

  b.setInsertionPointToStart(out);
  LLVM::ReturnOp::create(b, e.loc, out->getArgument(0));
  return success();
}

LogicalResult etc::defineWorkerPoolFunctions(ModuleOp module,
                                             StringRef graph) {
  if (failed(defineMonotonicClock(module)) ||
      failed(defineFutexFunctions(module)) ||
      failed(definePark(module, graph)) || failed(defineLaunch(module, graph)))
    return failure();
  return success();
}

LogicalResult etc::definePackedWorker(func::FuncOp worker,
                                      bool takesWorkerIds) {
  MLIRContext *ctx = worker.getContext();
  auto module = worker->getParentOfType<ModuleOp>();
  std::string name = (worker.getSymName() + "_packed").str();
  if (Operation *existing = SymbolTable::lookupSymbolIn(module, name))
    return existing->emitOpError("uses the symbol '")
           << name << "', which the CPU lowering needs for the worker pool";
  OpBuilder b(ctx);
  b.setInsertionPointAfter(worker);
  Location loc = worker.getLoc();
  Type index = b.getIndexType();
  auto pointer = LLVM::LLVMPointerType::get(ctx);
  auto packed = func::FuncOp::create(
      b, loc, name, b.getFunctionType({pointer, index, index}, {}));
  packed->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                  UnitAttr::get(ctx));
  Block *entry = packed.addEntryBlock();
  b.setInsertionPointToStart(entry);
  Emitter e(b, loc);
  LLVMTypeConverter converter(ctx);
  ArrayRef<Type> inputs = worker.getFunctionType().getInputs();
  size_t packedCount = inputs.size() - (takesWorkerIds ? 2 : 0);
  SmallVector<Value> operands;
  for (auto [position, type] : llvm::enumerate(inputs.take_front(packedCount))) {
    Value word = LLVM::GEPOp::create(
        b, loc, pointer, e.i64, entry->getArgument(0),
        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(position)});
    if (auto memref = dyn_cast<MemRefType>(type)) {
      // The descriptor, as the C interface passes it, becomes the memref
      // (the casts cancel out once memrefs are lowered).
      Type descriptor = converter.convertType(memref);
      if (!descriptor)
        return worker.emitOpError("has an argument of type ")
               << type << " that the worker pool cannot pass";
      Value value = e.load(descriptor, e.load(pointer, word));
      operands.push_back(
          UnrealizedConversionCastOp::create(b, loc, type, value).getResult(0));
    } else if (isa<IndexType>(type) || type == e.i64) {
      Value value = e.load(e.i64, word);
      operands.push_back(
          isa<IndexType>(type)
              ? arith::IndexCastOp::create(b, loc, type, value).getResult()
              : value);
    } else {
      return worker.emitOpError("has an argument of type ")
             << type << " that the worker pool cannot pass";
    }
  }
  if (takesWorkerIds) {
    operands.push_back(entry->getArgument(1));
    operands.push_back(entry->getArgument(2));
  }
  func::CallOp::create(b, loc, worker, operands);
  func::ReturnOp::create(b, loc);
  return success();
}
