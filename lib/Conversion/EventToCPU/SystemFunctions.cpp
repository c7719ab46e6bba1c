//===- SystemFunctions.cpp - Clock, syscall and futex for CPU workers -----===//
//
// The functions through which lowered CPU code reaches the operating
// system, defined once per module: the monotonic clock the watchdog and
// traces read, the C library's `syscall` entry, and the futex sleep and
// wake that blocked waits and their notifiers call.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToCPU/EventToCPU.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/SymbolTable.h"

#include <limits>

#ifndef __linux__
#error "convert-event-to-cpu blocks waits with the Linux futex system call"
#endif
#include <sys/syscall.h>

using namespace mlir;
using namespace etc;

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

/// The futex system call's operations (`linux/futex.h`), private to the
/// process: every worker is a thread of it.
static constexpr int32_t kFutexWaitPrivate = 0 | 128;
static constexpr int32_t kFutexWakePrivate = 1 | 128;

LogicalResult etc::declareSyscall(ModuleOp module) {
  MLIRContext *ctx = module.getContext();
  Type i64 = IntegerType::get(ctx, 64);
  auto type = LLVM::LLVMFunctionType::get(i64, {i64}, /*isVarArg=*/true);
  Operation *existing = SymbolTable::lookupSymbolIn(module, kSyscallName);
  if (auto func = dyn_cast_or_null<LLVM::LLVMFuncOp>(existing);
      func && func.getFunctionType() == type)
    return success();
  if (existing)
    return existing->emitOpError("uses the symbol '")
           << kSyscallName << "', which the CPU lowering of waits and "
           << "notifies needs for 'llvm.func @" << kSyscallName
           << "(i64, ...) -> i64'";
  OpBuilder builder(ctx);
  builder.setInsertionPointToStart(module.getBody());
  LLVM::LLVMFuncOp::create(builder, module.getLoc(), kSyscallName, type);
  return success();
}

/// `syscall(SYS_futex, arguments...)`.
static void callFutex(OpBuilder &b, Location loc, ValueRange arguments) {
  MLIRContext *ctx = b.getContext();
  Type i64 = b.getI64Type();
  SmallVector<Value> operands{
      LLVM::ConstantOp::create(b, loc, i64, static_cast<int64_t>(SYS_futex))};
  operands.append(arguments.begin(), arguments.end());
  LLVM::CallOp::create(
      b, loc, LLVM::LLVMFunctionType::get(i64, {i64}, /*isVarArg=*/true),
      kSyscallName, operands);
  (void)ctx;
}

/// Defines `@__etc_wake(element)`: the futex wake of every thread blocked
/// on the element.
static LogicalResult defineWake(ModuleOp module) {
  MLIRContext *ctx = module.getContext();
  if (Operation *existing = SymbolTable::lookupSymbolIn(module, kWakeName)) {
    if (isa<LLVM::LLVMFuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << kWakeName << "', which the CPU lowering of notifies needs";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(module.getBody());
  Location loc = module.getLoc();
  Type i32 = b.getI32Type();
  auto pointer = LLVM::LLVMPointerType::get(ctx);
  auto wake = LLVM::LLVMFuncOp::create(
      b, loc, kWakeName,
      LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(ctx), {pointer}),
      LLVM::Linkage::Internal);
  wake.setNoInline(true);
  b.setInsertionPointToStart(wake.addEntryBlock(b));
  Value element = wake.getArgument(0);
  Value operation = LLVM::ConstantOp::create(b, loc, i32, kFutexWakePrivate);
  Value everyone = LLVM::ConstantOp::create(
      b, loc, i32, std::numeric_limits<int32_t>::max());
  callFutex(b, loc, ValueRange{element, operation, everyone});
  LLVM::ReturnOp::create(b, loc, ValueRange{});
  return success();
}

/// Defines `@__etc_sleep(element, seen, sleepers, nanoseconds)`: counts the
/// thread in the sleepers word (seq_cst), and, if the element still holds
/// `seen` (seq_cst load), blocks in a futex wait on it for at most
/// `nanoseconds`; the kernel returns at once if the element changed
/// meanwhile. A notifier that changes the element and then reads the
/// sleepers word (both seq_cst) either is seen by the load here or sees the
/// count, and wakes the element: no wake-up is lost.
static LogicalResult defineSleep(ModuleOp module) {
  MLIRContext *ctx = module.getContext();
  if (Operation *existing = SymbolTable::lookupSymbolIn(module, kSleepName)) {
    if (isa<LLVM::LLVMFuncOp>(existing))
      return success();
    return existing->emitOpError("uses the symbol '")
           << kSleepName << "', which the CPU lowering of waits needs";
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(module.getBody());
  Location loc = module.getLoc();
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  auto pointer = LLVM::LLVMPointerType::get(ctx);
  auto sleep = LLVM::LLVMFuncOp::create(
      b, loc, kSleepName,
      LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(ctx),
                                  {pointer, i32, pointer, i64}),
      LLVM::Linkage::Internal);
  sleep.setNoInline(true);
  Block *entry = sleep.addEntryBlock(b);
  Block *block = sleep.addBlock();
  Block *awake = sleep.addBlock();
  Value element = entry->getArgument(0), seen = entry->getArgument(1);
  Value sleepers = entry->getArgument(2), nanoseconds = entry->getArgument(3);

  b.setInsertionPointToStart(entry);
  auto timespec = LLVM::LLVMStructType::getLiteral(ctx, {i64, i64});
  Value time = LLVM::AllocaOp::create(
      b, loc, pointer, timespec, LLVM::ConstantOp::create(b, loc, i64, 1));
  Value one = LLVM::ConstantOp::create(b, loc, i32, 1);
  LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, sleepers, one,
                            LLVM::AtomicOrdering::seq_cst, StringRef(),
                            /*alignment=*/4);
  Value now = LLVM::LoadOp::create(
      b, loc, i32, element, /*alignment=*/4, /*isVolatile=*/false,
      /*isNonTemporal=*/false, /*isInvariant=*/false,
      /*isInvariantGroup=*/false, LLVM::AtomicOrdering::seq_cst);
  Value same = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::eq, now, seen);
  LLVM::CondBrOp::create(b, loc, same, block, awake);

  b.setInsertionPointToStart(block);
  Value billion = LLVM::ConstantOp::create(b, loc, i64, 1000000000);
  auto field = [&](int32_t index) -> Value {
    return LLVM::GEPOp::create(b, loc, pointer, timespec, time,
                               ArrayRef<LLVM::GEPArg>{0, index});
  };
  LLVM::StoreOp::create(b, loc,
                        LLVM::UDivOp::create(b, loc, nanoseconds, billion),
                        field(0));
  LLVM::StoreOp::create(b, loc,
                        LLVM::URemOp::create(b, loc, nanoseconds, billion),
                        field(1));
  Value operation = LLVM::ConstantOp::create(b, loc, i32, kFutexWaitPrivate);
  // Interrupted, timed out or the element changed: the caller polls again.
  callFutex(b, loc, ValueRange{element, operation, seen, time});
  LLVM::BrOp::create(b, loc, awake);

  b.setInsertionPointToStart(awake);
  LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::sub, sleepers, one,
                            LLVM::AtomicOrdering::monotonic, StringRef(),
                            /*alignment=*/4);
  LLVM::ReturnOp::create(b, loc, ValueRange{});
  return success();
}

LogicalResult etc::defineFutexFunctions(ModuleOp module) {
  if (failed(declareSyscall(module)) || failed(defineSleep(module)) ||
      failed(defineWake(module)))
    return failure();
  return success();
}
