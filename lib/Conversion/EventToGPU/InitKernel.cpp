//===- InitKernel.cpp - Initialisation kernels on one CTA -----------------===//
//
// The small kernels of a program (`_init` above all) are not persistent
// workers: they run once on one CTA before the worker starts. Their writes
// go to thread 0 unless a loop's iterations are independent, in which case
// the loop is spread over the CTA's threads.
//
//===----------------------------------------------------------------------===//

#include "InitKernel.h"

#include "Event/IR/EventDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

Value etc::isFirstThread(OpBuilder &b, Location loc) {
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value zero = arith::ConstantIndexOp::create(b, loc, 0);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, thread, zero);
}

namespace {
/// The buffers a function may write: operands of write effects anywhere in
/// it, or every buffer when some op's effects are unknown.
struct WrittenBuffers {
  llvm::SmallPtrSet<Value, 8> buffers;
  bool unknown = false;

  bool mayWrite(Value buffer) const {
    return unknown || buffers.contains(buffer);
  }
};
} // namespace

static WrittenBuffers writtenBuffers(gpu::GPUFuncOp func) {
  WrittenBuffers written;
  func.getBody().walk([&](Operation *op) {
    if (op->hasTrait<OpTrait::HasRecursiveMemoryEffects>())
      return;
    auto effects = dyn_cast<MemoryEffectOpInterface>(op);
    if (!effects) {
      written.unknown = true;
      return;
    }
    SmallVector<MemoryEffects::EffectInstance> instances;
    effects.getEffects(instances);
    for (const auto &instance : instances)
      if (isa<MemoryEffects::Write>(instance.getEffect()) && instance.getValue())
        written.buffers.insert(instance.getValue());
  });
  return written;
}

/// Whether the iterations of top-level loop `loop` of an initialisation
/// kernel may run on different threads: it carries no values, every op in it
/// has known effects, and it reads no buffer the kernel may write (so
/// iterations only store, and no iteration observes another's stores).
static bool isIndependentLoop(scf::ForOp loop, const WrittenBuffers &written) {
  if (loop.getNumResults() != 0)
    return false;
  WalkResult result = loop.getBody()->walk([&](Operation *op) {
    if (op->hasTrait<OpTrait::HasRecursiveMemoryEffects>())
      return WalkResult::advance();
    auto effects = dyn_cast<MemoryEffectOpInterface>(op);
    if (!effects)
      return WalkResult::interrupt();
    SmallVector<MemoryEffects::EffectInstance> instances;
    effects.getEffects(instances);
    for (const auto &instance : instances) {
      if (isa<MemoryEffects::Write>(instance.getEffect()))
        continue;
      if (isa<MemoryEffects::Read>(instance.getEffect()) &&
          instance.getValue() && !written.mayWrite(instance.getValue()))
        continue;
      if (isa<MemoryEffects::Allocate, MemoryEffects::Free>(
              instance.getEffect()) &&
          !instance.getValue())
        continue;
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return !result.wasInterrupted();
}

/// Whether `op` (not a region holder) writes memory or has unknown effects.
static bool mayWrite(Operation *op) {
  bool readsOnly = hasEffect<MemoryEffects::Read>(op) &&
                   !hasEffect<MemoryEffects::Write>(op);
  return !isMemoryEffectFree(op) && !readsOnly;
}

/// Collects in `loops` the outermost `event.independent` loops nested in
/// `op`, and returns whether there are some and every write in `op` is
/// inside one of them: then `op` can run on every thread with only those
/// loops spread over the threads.
static bool onlyWritesInIndependentLoops(Operation *op,
                                         SmallVectorImpl<scf::ForOp> &loops) {
  bool writesOutside = false;
  op->walk<WalkOrder::PreOrder>([&](Operation *nested) {
    auto loop = dyn_cast<scf::ForOp>(nested);
    if (nested != op && loop && loop.getNumResults() == 0 &&
        loop->hasAttr(kIndependentIterationsAttrName)) {
      loops.push_back(loop);
      return WalkResult::skip();
    }
    if (!nested->hasTrait<OpTrait::HasRecursiveMemoryEffects>() &&
        mayWrite(nested))
      writesOutside = true;
    return WalkResult::advance();
  });
  return !loops.empty() && !writesOutside;
}

/// Spreads the iterations of `loop` over the CTA's threads: thread t runs
/// iterations t, t + threads, ... of it.
static void strideOverThreads(scf::ForOp loop) {
  OpBuilder b(loop);
  Location loc = loop.getLoc();
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
  Value step = loop.getStep();
  Value offset = arith::MulIOp::create(b, loc, thread, step);
  Value start = arith::AddIOp::create(b, loc, loop.getLowerBound(), offset);
  loop.setLowerBound(start);
  loop.setStep(arith::MulIOp::create(b, loc, step, threads));
}

LogicalResult etc::distributeOverCTA(gpu::GPUFuncOp func) {
  WrittenBuffers written = writtenBuffers(func);
  Block &body = func.getBody().front();
  // The open thread-0 block and its barrier, while the next thread-0 op
  // may join it.
  scf::IfOp threadZero;
  gpu::BarrierOp threadZeroBarrier;
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    if (isMemoryEffectFree(&op))
      continue;
    if (hasEffect<MemoryEffects::Read>(&op) &&
        !hasEffect<MemoryEffects::Write>(&op)) {
      // It runs on every thread and reads what thread 0 wrote.
      threadZero = nullptr;
      continue;
    }
    Location loc = op.getLoc();
    OpBuilder b(&op);
    Operation *last = &op;
    auto loop = dyn_cast<scf::ForOp>(op);
    SmallVector<scf::ForOp> nested;
    if (loop && (loop->hasAttr(kIndependentIterationsAttrName) ||
                 isIndependentLoop(loop, written))) {
      strideOverThreads(loop);
      threadZero = nullptr;
    } else if (onlyWritesInIndependentLoops(&op, nested)) {
      for (scf::ForOp independent : nested)
        strideOverThreads(independent);
      threadZero = nullptr;
    } else {
      if (op.getNumResults() != 0)
        return op.emitOpError("writes memory and has results, so it cannot run "
                              "on one thread of the initialisation kernel");
      if (threadZero) {
        // Nothing between the open block and `op` touches memory, and ops
        // in the block have no results, so the block can move down to `op`.
        threadZero->moveBefore(&op);
        op.moveBefore(threadZero.thenBlock()->getTerminator());
        threadZeroBarrier->moveAfter(threadZero);
        continue;
      }
      threadZero = scf::IfOp::create(b, loc, isFirstThread(b, loc),
                                     /*withElseRegion=*/false);
      op.moveBefore(threadZero.thenBlock()->getTerminator());
      last = threadZero;
    }
    b.setInsertionPointAfter(last);
    auto barrier = gpu::BarrierOp::create(b, loc);
    if (threadZero)
      threadZeroBarrier = barrier;
  }
  return success();
}
