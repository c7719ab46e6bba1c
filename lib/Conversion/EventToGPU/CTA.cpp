//===- CTA.cpp - What a CTA's threads do together -------------------------===//

#include "CTA.h"
#include "InitKernel.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc;

void etc::buildIf(OpBuilder &b, Location loc, Value condition,
                  function_ref<void(OpBuilder &, Location)> body) {
  auto ifOp = scf::IfOp::create(b, loc, condition, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
  body(b, loc);
}

Value etc::onFirstThread(OpBuilder &b, Location loc,
                         function_ref<Value(OpBuilder &, Location)> body) {
  auto ifOp = scf::IfOp::create(
      b, loc, isFirstThread(b, loc),
      [&](OpBuilder &then, Location loc) {
        scf::YieldOp::create(then, loc, body(then, loc));
      },
      [&](OpBuilder &otherwise, Location loc) {
        scf::YieldOp::create(otherwise, loc,
                             ValueRange{arith::ConstantIntOp::create(
                                 otherwise, loc, 0, 1)});
      });
  return ifOp.getResult(0);
}

Value etc::barrierAny(OpBuilder &b, Location loc, Value predicate) {
  Value word = arith::ExtUIOp::create(b, loc, b.getI32Type(), predicate);
  Value any = NVVM::BarrierOp::create(
                  b, loc, TypeRange{b.getI32Type()}, /*barrierId=*/Value(),
                  /*numberOfThreads=*/Value(),
                  NVVM::BarrierReductionAttr::get(b.getContext(),
                                                  NVVM::BarrierReduction::OR),
                  word)
                  .getRes();
  Value none = arith::ConstantIntOp::create(b, loc, 0, 32);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, any, none);
}

FailureOr<Value> etc::broadcastWord(ConversionPatternRewriter &rewriter,
                                    Operation *op) {
  auto func = op->getParentOfType<gpu::GPUFuncOp>();
  if (!func || func.getWorkgroupAttributions().empty())
    return rewriter.notifyMatchFailure(
        op, "not in a gpu.func with a workgroup broadcast word");
  return func.getWorkgroupAttributions().front();
}

FailureOr<Value> etc::broadcastFromFirstThread(
    ConversionPatternRewriter &rewriter, Operation *op,
    function_ref<Value(OpBuilder &, Location)> body) {
  FailureOr<Value> word = broadcastWord(rewriter, op);
  if (failed(word))
    return failure();
  Location loc = op->getLoc();
  Value zero = arith::ConstantIndexOp::create(rewriter, loc, 0);
  gpu::BarrierOp::create(rewriter, loc);
  buildIf(rewriter, loc, isFirstThread(rewriter, loc),
          [&](OpBuilder &b, Location loc) {
            memref::StoreOp::create(b, loc, body(b, loc), *word,
                                    ValueRange{zero});
          });
  gpu::BarrierOp::create(rewriter, loc);
  Value value = memref::LoadOp::create(rewriter, loc, *word, ValueRange{zero});
  return arith::IndexCastUIOp::create(rewriter, loc, rewriter.getIndexType(),
                                      value)
      .getResult();
}

Value etc::globalTimer(OpBuilder &b, Location loc) {
  return NVVM::GlobalTimerOp::create(b, loc, b.getI64Type());
}

Value etc::blockId(OpBuilder &b, Location loc) {
  return gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
}
