//===- EventAddressing.cpp - Counter addresses shared by the targets -----===//

#include "Conversion/EventCommon/EventAddressing.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

Value etc::getCounterPointer(OpBuilder &builder, Location loc, Value counters,
                             Value position) {
  Value address =
      memref::ExtractAlignedPointerAsIndexOp::create(builder, loc, counters);
  Value address64 =
      arith::IndexCastUIOp::create(builder, loc, builder.getI64Type(), address);
  Type pointerType = LLVM::LLVMPointerType::get(builder.getContext());
  Value base = LLVM::IntToPtrOp::create(builder, loc, pointerType, address64);
  Value position64 =
      arith::IndexCastOp::create(builder, loc, builder.getI64Type(), position);
  return LLVM::GEPOp::create(builder, loc, pointerType, builder.getI32Type(),
                             base, ValueRange{position64});
}

FailureOr<Value> etc::getEventElementPointer(ConversionPatternRewriter &rewriter,
                                             Operation *op, Value event,
                                             Value base, ValueRange indices) {
  auto view = event.getDefiningOp<ViewOp>();
  if (!view)
    return rewriter.notifyMatchFailure(
        op, "the event tensor is not an 'event.view' of a counter buffer");
  Location loc = op->getLoc();
  EventTensorType type = view.getType();
  Value linear;
  auto dynamicSize = view.getDynamicSizes().begin();
  for (auto [dim, index] : llvm::enumerate(indices)) {
    // The extent of the leading dimension does not matter for row-major
    // addressing, but its dynamic size still comes first in the operands.
    Value size;
    if (type.isDynamicDim(dim))
      size = *dynamicSize++;
    if (dim == 0) {
      linear = index;
      continue;
    }
    if (!size)
      size = arith::ConstantIndexOp::create(rewriter, loc, type.getShape()[dim]);
    linear = arith::AddIOp::create(
        rewriter, loc, arith::MulIOp::create(rewriter, loc, linear, size),
        index);
  }
  if (!linear)
    return base;
  Value linear64 =
      arith::IndexCastOp::create(rewriter, loc, rewriter.getI64Type(), linear);
  return LLVM::GEPOp::create(rewriter, loc, base.getType(),
                             rewriter.getI32Type(), base, ValueRange{linear64})
      .getResult();
}

void etc::populateEventTensorTypeConversion(TypeConverter &typeConverter) {
  typeConverter.addConversion([](Type type) { return type; });
  typeConverter.addConversion([](EventTensorType type) -> Type {
    return LLVM::LLVMPointerType::get(type.getContext());
  });
}

namespace {
/// Lowers `event.view %counters[%offset]` to the address of the view's first
/// counter: the buffer's aligned pointer advanced by `offset` i32s.
struct ViewOpLowering : public OpConversionPattern<ViewOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(ViewOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOp(op, getCounterPointer(rewriter, op.getLoc(),
                                             adaptor.getCounters(),
                                             adaptor.getOffset()));
    return success();
  }
};
} // namespace

void etc::populateEventViewLoweringPattern(const TypeConverter &typeConverter,
                                           RewritePatternSet &patterns) {
  patterns.add<ViewOpLowering>(typeConverter, patterns.getContext());
}
