//===- KernelOutlining.cpp - Kernels from a program's functions -----------===//
//
// How `convert-event-to-gpu` turns the functions of a scheduled program
// into the kernels of a self-contained `gpu.module`: which function is the
// persistent worker, moving a body into a `gpu.func` (a result becomes a
// one-element buffer), the `event.any` loops of `g_check` spread over the
// CTA, and the copies of the functions and constant tables the kernels
// use.
//
//===----------------------------------------------------------------------===//

#include "KernelOutlining.h"
#include "CTA.h"
#include "InitKernel.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

bool etc::isWorkerOp(Operation *op) {
  return isa<WorkerIdOp, WorkerCountOp, WaitOp, AcquireOp, NotifyOp, ReleaseOp,
             NotifyReadyOp, QueuePopOp, QueueTryPopOp, ClaimOp, TestOp, IdleOp,
             LaneIdOp, LaneCountOp, LaneBarrierOp, RunAbortedOp, TraceBeginOp,
             TraceEndOp>(op);
}

bool etc::needsBroadcastWord(gpu::GPUFuncOp kernel) {
  return kernel
      .walk([](Operation *op) {
        return isa<QueuePopOp, QueueTryPopOp, ClaimOp>(op)
                   ? WalkResult::interrupt()
                                                  : WalkResult::advance();
      })
      .wasInterrupted();
}

void etc::distributeAnyReductions(gpu::GPUFuncOp kernel) {
  SmallVector<scf::ForOp> loops;
  for (Block &block : kernel.getBody())
    for (Operation &op : block)
      if (auto loop = dyn_cast<scf::ForOp>(op))
        if (loop->hasAttr(event::kAnyReductionAttrName) && loop.getNumResults() == 1)
          loops.push_back(loop);
  for (scf::ForOp loop : loops) {
    OpBuilder b(loop);
    Location loc = loop.getLoc();
    Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
    Value threads = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
    Value step = loop.getStep();
    loop.setLowerBound(arith::AddIOp::create(
        b, loc, loop.getLowerBound(), arith::MulIOp::create(b, loc, thread, step)));
    loop.setStep(arith::MulIOp::create(b, loc, step, threads));
    b.setInsertionPointAfter(loop);
    Value any = barrierAny(b, loc, loop.getResult(0));
    // The first op barrierAny made reads the loop's result: it stays.
    loop.getResult(0).replaceAllUsesExcept(any, loop->getNextNode());
  }
}

FailureOr<gpu::GPUFuncOp> etc::outlineKernel(func::FuncOp func,
                                              gpu::GPUModuleOp kernels) {
  FunctionType type = func.getFunctionType();
  if (type.getNumResults() > 1)
    return func.emitOpError("returns ")
           << type.getNumResults()
           << " values; a kernel can report at most one";
  MLIRContext *ctx = func.getContext();
  SmallVector<Type> inputs(type.getInputs());
  Type resultType;
  if (type.getNumResults() == 1) {
    resultType = type.getResult(0);
    if (resultType.isIndex())
      resultType = IntegerType::get(ctx, 64);
    if (!resultType.isIntOrFloat())
      return func.emitOpError("returns ")
             << type.getResult(0)
             << "; a kernel can report an index, integer or float";
    inputs.push_back(MemRefType::get({1}, resultType));
  }

  OpBuilder b(kernels.getBodyRegion());
  b.setInsertionPointToEnd(kernels.getBody());
  auto kernel = gpu::GPUFuncOp::create(b, func.getLoc(), func.getName(),
                                       FunctionType::get(ctx, inputs, {}));
  kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  kernel.getBody().front().erase();
  kernel.getBody().takeBody(func.getBody());
  Block &entry = kernel.getBody().front();
  Value resultBuffer;
  if (resultType)
    resultBuffer = entry.addArgument(inputs.back(), func.getLoc());

  SmallVector<func::ReturnOp> returns;
  kernel.walk([&](func::ReturnOp ret) { returns.push_back(ret); });
  for (func::ReturnOp ret : returns) {
    Location loc = ret.getLoc();
    b.setInsertionPoint(ret);
    if (resultBuffer) {
      Value value = ret.getOperand(0);
      if (value.getType().isIndex())
        value = arith::IndexCastOp::create(b, loc, resultType, value);
      Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
      Value zero = arith::ConstantIndexOp::create(b, loc, 0);
      Value firstBlock =
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, block, zero);
      Value first =
          arith::AndIOp::create(b, loc, firstBlock, isFirstThread(b, loc));
      buildIf(b, loc, first, [&](OpBuilder &b, Location loc) {
        memref::StoreOp::create(b, loc, value, resultBuffer, ValueRange{zero});
      });
    }
    gpu::ReturnOp::create(b, loc);
    ret.erase();
  }
  return kernel;
}

LogicalResult etc::cloneCallees(gpu::GPUModuleOp kernels,
                                SymbolTable &hostSymbols,
                                llvm::SmallPtrSetImpl<Operation *> &cloned) {
  SymbolTable deviceSymbols(kernels);
  SmallVector<Operation *> worklist;
  for (Operation &op : kernels.getBody()->getOperations())
    worklist.push_back(&op);
  auto copy = [&](Operation *use, StringAttr name) -> LogicalResult {
    if (deviceSymbols.lookup(name))
      return success();
    Operation *original = hostSymbols.lookup(name);
    auto function = dyn_cast_or_null<func::FuncOp>(original);
    if (!(function && !function.isExternal()) &&
        !isa_and_nonnull<memref::GlobalOp>(original))
      return use->emitOpError("uses '")
             << name.getValue()
             << "', which is not a function or memref.global defined in the "
                "module; device code can only use symbols convert-event-to-gpu "
                "can copy into the gpu.module";
    cloned.insert(original);
    Operation *clone = original->clone();
    SymbolTable::setSymbolVisibility(clone, SymbolTable::Visibility::Private);
    deviceSymbols.insert(clone);
    worklist.push_back(clone);
    return success();
  };
  while (!worklist.empty()) {
    Operation *root = worklist.pop_back_val();
    WalkResult result = root->walk([&](Operation *op) {
      StringAttr name;
      if (auto call = dyn_cast<func::CallOp>(op))
        name = call.getCalleeAttr().getAttr();
      else if (auto global = dyn_cast<memref::GetGlobalOp>(op))
        name = global.getNameAttr().getAttr();
      if (name && failed(copy(op, name)))
        return WalkResult::interrupt();
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      return failure();
  }
  return success();
}

