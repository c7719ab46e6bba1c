//===- EventAddressing.cpp - Counter addresses shared by the targets -----===//

#include "Conversion/EventCommon/EventAddressing.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"

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

FailureOr<Value> etc::getEventCounters(ConversionPatternRewriter &rewriter,
                                       Operation *op, Value event) {
  auto view = event.getDefiningOp<ViewOp>();
  if (!view)
    return rewriter.notifyMatchFailure(
        op, "the event tensor is not an 'event.view' of a counter buffer");
  return view.getCounters();
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

namespace {
/// Lowers `event.buffer %table[%offset]` to the memref descriptor of the
/// buffer the table describes there: the address word becomes both the
/// allocated and the aligned pointer, the offset is 0, dynamic sizes come
/// from the following words, and strides are row-major. The descriptor is
/// handed to the memref world through an `unrealized_conversion_cast`,
/// which `finalize-memref-to-llvm` and `reconcile-unrealized-casts` fold.
struct BufferOpLowering : public OpConversionPattern<BufferOp> {
  BufferOpLowering(const TypeConverter &typeConverter, MLIRContext *context,
                   unsigned addressSpace)
      : OpConversionPattern(typeConverter, context),
        addressSpace(addressSpace) {}
  /// The address space the table's addresses point into.
  unsigned addressSpace;

  LogicalResult
  matchAndRewrite(BufferOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    MLIRContext *context = op.getContext();
    auto type = cast<MemRefType>(op.getResult().getType());
    int64_t rank = type.getRank();
    Type i64 = rewriter.getI64Type();
    Type pointerType = LLVM::LLVMPointerType::get(context);
    auto word = [&](int64_t index) -> Value {
      Value position = arith::AddIOp::create(
          rewriter, loc, adaptor.getOffset(),
          arith::ConstantIndexOp::create(rewriter, loc, index));
      return memref::LoadOp::create(rewriter, loc, adaptor.getTable(),
                                    ValueRange{position});
    };
    Value pointer;
    if (addressSpace == 0) {
      pointer = LLVM::IntToPtrOp::create(rewriter, loc, pointerType, word(0));
    } else {
      // A pointer into that space, seen through a generic one: LLVM's
      // address-space inference then gives the accesses that space's
      // instructions (on NVPTX: ld.global / st.global).
      Value specific = LLVM::IntToPtrOp::create(
          rewriter, loc, LLVM::LLVMPointerType::get(context, addressSpace),
          word(0));
      pointer = LLVM::AddrSpaceCastOp::create(rewriter, loc, pointerType,
                                              specific);
    }
    SmallVector<Type> fields = {pointerType, pointerType, i64};
    if (rank > 0) {
      fields.push_back(LLVM::LLVMArrayType::get(i64, rank));
      fields.push_back(LLVM::LLVMArrayType::get(i64, rank));
    }
    auto structType = LLVM::LLVMStructType::getLiteral(context, fields);
    Value descriptor = LLVM::PoisonOp::create(rewriter, loc, structType);
    descriptor = LLVM::InsertValueOp::create(rewriter, loc, descriptor,
                                             pointer, ArrayRef<int64_t>{0});
    descriptor = LLVM::InsertValueOp::create(rewriter, loc, descriptor,
                                             pointer, ArrayRef<int64_t>{1});
    Value zero = LLVM::ConstantOp::create(rewriter, loc, i64, 0);
    descriptor = LLVM::InsertValueOp::create(rewriter, loc, descriptor, zero,
                                             ArrayRef<int64_t>{2});
    SmallVector<Value> sizes;
    for (int64_t dim = 0; dim < rank; ++dim)
      sizes.push_back(type.isDynamicDim(dim)
                          ? word(1 + dim)
                          : LLVM::ConstantOp::create(rewriter, loc, i64,
                                                     type.getDimSize(dim))
                                .getResult());
    Value stride = LLVM::ConstantOp::create(rewriter, loc, i64, 1);
    for (int64_t dim = rank - 1; dim >= 0; --dim) {
      descriptor = LLVM::InsertValueOp::create(
          rewriter, loc, descriptor, sizes[dim], ArrayRef<int64_t>{3, dim});
      descriptor = LLVM::InsertValueOp::create(
          rewriter, loc, descriptor, stride, ArrayRef<int64_t>{4, dim});
      if (dim > 0)
        stride = LLVM::MulOp::create(rewriter, loc, stride, sizes[dim]);
    }
    rewriter.replaceOpWithNewOp<UnrealizedConversionCastOp>(op, type,
                                                            descriptor);
    return success();
  }
};
} // namespace

void etc::populateEventBufferLoweringPattern(const TypeConverter &typeConverter,
                                             RewritePatternSet &patterns,
                                             unsigned addressSpace) {
  patterns.add<BufferOpLowering>(typeConverter, patterns.getContext(),
                                 addressSpace);
}

/// Row-major strides of `buffer` (identity layout), in elements.
static SmallVector<Value> rowMajorStrides(OpBuilder &b, Location loc,
                                          Value buffer) {
  auto type = cast<MemRefType>(buffer.getType());
  SmallVector<Value> result(type.getRank());
  Value stride = arith::ConstantIndexOp::create(b, loc, 1);
  for (int64_t dim = type.getRank() - 1; dim >= 0; --dim) {
    result[dim] = stride;
    stride = arith::MulIOp::create(b, loc, stride,
                                   memref::DimOp::create(b, loc, buffer, dim));
  }
  return result;
}

void etc::forEachPutRow(
    OpBuilder &builder, Location loc, Value source, ValueRange sourceOffsets,
    Value dest, ValueRange destOffsets, ValueRange sizes,
    function_ref<void(OpBuilder &, Value, Value)> emitRow) {
  unsigned rank = sizes.size();
  unsigned leading = destOffsets.size() - rank;
  auto elementType = cast<MemRefType>(source.getType()).getElementType();
  Value bytes = arith::ConstantIndexOp::create(
      builder, loc, elementType.getIntOrFloatBitWidth() / 8);
  SmallVector<Value> sourceStrides = rowMajorStrides(builder, loc, source);
  SmallVector<Value> destStrides = rowMajorStrides(builder, loc, dest);
  Value sourceBase =
      memref::ExtractAlignedPointerAsIndexOp::create(builder, loc, source);
  Value destBase =
      memref::ExtractAlignedPointerAsIndexOp::create(builder, loc, dest);

  // The first element of each row: the offsets plus the loop positions in
  // every dimension but the last; the leading dimensions of `dest` (those
  // the box does not span) at their offsets.
  std::function<void(OpBuilder &, unsigned, SmallVector<Value>)> rows =
      [&](OpBuilder &b, unsigned dim, SmallVector<Value> positions) {
        if (dim + 1 < rank) {
          Value zero = arith::ConstantIndexOp::create(b, loc, 0);
          Value one = arith::ConstantIndexOp::create(b, loc, 1);
          scf::ForOp::create(
              b, loc, zero, sizes[dim], one, ValueRange{},
              [&](OpBuilder &nested, Location, Value position, ValueRange) {
                SmallVector<Value> inner = positions;
                inner.push_back(position);
                rows(nested, dim + 1, inner);
                scf::YieldOp::create(nested, loc);
              });
          return;
        }
        Value from = arith::ConstantIndexOp::create(b, loc, 0);
        Value to = arith::ConstantIndexOp::create(b, loc, 0);
        for (unsigned d = 0; d < leading; ++d)
          to = arith::AddIOp::create(
              b, loc, to,
              arith::MulIOp::create(b, loc, destOffsets[d], destStrides[d]));
        for (unsigned d = 0; d < rank; ++d) {
          Value step = d < positions.size()
                           ? positions[d]
                           : arith::ConstantIndexOp::create(b, loc, 0);
          from = arith::AddIOp::create(
              b, loc, from,
              arith::MulIOp::create(
                  b, loc, arith::AddIOp::create(b, loc, sourceOffsets[d], step),
                  sourceStrides[d]));
          to = arith::AddIOp::create(
              b, loc, to,
              arith::MulIOp::create(
                  b, loc,
                  arith::AddIOp::create(b, loc, destOffsets[leading + d], step),
                  destStrides[leading + d]));
        }
        emitRow(b,
                arith::AddIOp::create(b, loc, sourceBase,
                                      arith::MulIOp::create(b, loc, from, bytes)),
                arith::AddIOp::create(b, loc, destBase,
                                      arith::MulIOp::create(b, loc, to, bytes)));
      };
  rows(builder, 0, {});
}
