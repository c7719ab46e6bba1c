//===- RemoteCPU.cpp - Remote event ops on CPU processes over MPI ---------===//
//
// Lowers the operations of a graph that runs on several ranks for the CPU
// target, where every rank is a process and the transport is MPI one-sided
// communication: the counter buffer and the symmetric buffers lie in one
// MPI window with the same layout on every rank, so a remote address is a
// displacement from the window's local base. The lowered code calls the MPI
// library's `MPI_Put`, `MPI_Accumulate` and `MPI_Win_flush` through the
// function pointers of the transport block (`Event/IR/TransportLayout.h`),
// which the scheduled function reads from its buffer table.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToCPU/EventToCPU.h"
#include "Conversion/EventCommon/EventAddressing.h"

#include "Event/IR/EventOps.h"
#include "Event/IR/TransportLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

namespace {

//===----------------------------------------------------------------------===//
// The transport block
//===----------------------------------------------------------------------===//

/// The transport block of the scheduled function around `op`: its buffer
/// table and the word where the block starts, or a failure with a match
/// failure on `op` when the function has none (a graph on one device).
struct Transport {
  Value table;
  int64_t offset;

  static FailureOr<Transport> of(ConversionPatternRewriter &rewriter,
                                 Operation *op) {
    auto function = op->getParentOfType<func::FuncOp>();
    if (!function)
      return rewriter.notifyMatchFailure(op, "not inside a function");
    auto offset =
        function->getAttrOfType<IntegerAttr>(transport::kTransportAttrName);
    if (!offset)
      return failure();
    for (BlockArgument arg : function.getArguments())
      if (function.getArgAttr(arg.getArgNumber(), transport::kTableAttrName))
        return Transport{arg, offset.getInt()};
    return rewriter.notifyMatchFailure(op, "the function has no buffer table");
  }

  /// Word `word` of the block, an i64.
  Value word(OpBuilder &b, Location loc, int64_t word) const {
    Value index = arith::ConstantIndexOp::create(b, loc, offset + word);
    return memref::LoadOp::create(b, loc, table, index);
  }

  /// Word `word`, a function address, as a pointer.
  Value function(OpBuilder &b, Location loc, int64_t word) const {
    return LLVM::IntToPtrOp::create(b, loc, LLVM::LLVMPointerType::get(
                                                b.getContext()),
                                    this->word(b, loc, word));
  }
};

Value toI32(OpBuilder &b, Location loc, Value value) {
  if (value.getType().isIndex())
    return arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  return arith::TruncIOp::create(b, loc, b.getI32Type(), value);
}

Value toI64(OpBuilder &b, Location loc, Value index) {
  return arith::IndexCastOp::create(b, loc, b.getI64Type(), index);
}

/// `MPI_Win_flush(rank, window)`: every operation this process issued to
/// `rank` on the window is complete there.
void flush(OpBuilder &b, Location loc, const Transport &transport,
           Value rank32) {
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  auto type = LLVM::LLVMFunctionType::get(i32, {i32, i64});
  LLVM::CallOp::create(
      b, loc, type,
      ValueRange{transport.function(b, loc, transport::kFlushWord), rank32,
                 transport.word(b, loc, transport::kWindowWord)});
}

/// An i32 slot at the start of the enclosing function (not in a loop,
/// where an alloca would grow the stack at every iteration).
Value entrySlot(ConversionPatternRewriter &rewriter, Operation *op) {
  auto function = op->getParentOfType<FunctionOpInterface>();
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPointToStart(&function.getFunctionBody().front());
  Location loc = op->getLoc();
  Value one = LLVM::ConstantOp::create(rewriter, loc, rewriter.getI64Type(), 1);
  return LLVM::AllocaOp::create(
      rewriter, loc, LLVM::LLVMPointerType::get(rewriter.getContext()),
      rewriter.getI32Type(), one, /*alignment=*/4);
}

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

/// Lowers `event.rank_id` / `event.rank_count` to a word of the transport
/// block; in a function without one (a graph on one device), 0 and 1.
template <typename QueryOp, int64_t word, int64_t alone>
struct RankQueryLowering : public OpConversionPattern<QueryOp> {
  using OpConversionPattern<QueryOp>::OpConversionPattern;
  LogicalResult
  matchAndRewrite(QueryOp op, typename QueryOp::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Transport> transport = Transport::of(rewriter, op);
    if (failed(transport)) {
      rewriter.replaceOpWithNewOp<arith::ConstantIndexOp>(op, alone);
      return success();
    }
    Value value = transport->word(rewriter, op.getLoc(), word);
    rewriter.replaceOpWithNewOp<arith::IndexCastOp>(
        op, rewriter.getIndexType(), value);
    return success();
  }
};

/// Lowers `event.remote_notify` to `MPI_Win_flush(rank)` (the puts this
/// process made to `rank` are complete there), `MPI_Accumulate` of -1 with
/// `MPI_SUM` on the counter's displacement in the window, and
/// `MPI_Win_flush(rank)` again, so that the decrement is delivered before
/// the worker goes on.
struct RemoteNotifyLowering : public OpConversionPattern<RemoteNotifyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RemoteNotifyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Transport> transport = Transport::of(rewriter, op);
    if (failed(transport))
      return op.emitOpError("needs the transport block of a scheduled "
                            "function of a graph with 'event.ranks'");
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    Type i32 = rewriter.getI32Type(), i64 = rewriter.getI64Type();
    Value slot = entrySlot(rewriter, op);
    LLVM::StoreOp::create(rewriter, loc,
                          arith::ConstantIntOp::create(rewriter, loc, -1, 32),
                          slot);
    Value address = LLVM::PtrToIntOp::create(rewriter, loc, i64, *pointer);
    Value displacement = arith::SubIOp::create(
        rewriter, loc, address, transport->word(rewriter, loc, transport::kBaseWord));
    Value rank = toI32(rewriter, loc, adaptor.getRank());
    flush(rewriter, loc, *transport, rank);
    Value one = arith::ConstantIntOp::create(rewriter, loc, 1, 32);
    Value mpiInt = transport->word(rewriter, loc, transport::kIntWord);
    auto type = LLVM::LLVMFunctionType::get(
        i32, {LLVM::LLVMPointerType::get(rewriter.getContext()), i32, i64, i32,
              i64, i32, i64, i64, i64});
    LLVM::CallOp::create(
        rewriter, loc, type,
        ValueRange{transport->function(rewriter, loc, transport::kAccumulateWord),
                   slot, one, mpiInt, rank, displacement, one, mpiInt,
                   transport->word(rewriter, loc, transport::kSumWord),
                   transport->word(rewriter, loc, transport::kWindowWord)});
    flush(rewriter, loc, *transport, rank);
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.put` to one `MPI_Put` per row of the box (its last
/// dimension is contiguous in both buffers), in loops over the others.
/// Completion is left to the next `MPI_Win_flush` of the rank (the
/// `event.remote_notify` that follows).
struct PutLowering : public OpConversionPattern<PutOp> {
  using OpConversionPattern::OpConversionPattern;

  LogicalResult
  matchAndRewrite(PutOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Transport> transport = Transport::of(rewriter, op);
    if (failed(transport))
      return op.emitOpError("needs the transport block of a scheduled "
                            "function of a graph with 'event.ranks'");
    Location loc = op.getLoc();
    Type i32 = rewriter.getI32Type(), i64 = rewriter.getI64Type();
    auto pointerType = LLVM::LLVMPointerType::get(rewriter.getContext());
    int64_t elementBytes =
        op.getSource().getType().getElementTypeBitWidth() / 8;
    Value windowBase = transport->word(rewriter, loc, transport::kBaseWord);
    Value target = toI32(rewriter, loc, adaptor.getRank());
    Value byteSize = arith::ConstantIndexOp::create(rewriter, loc, elementBytes);
    Value rowBytes = toI32(
        rewriter, loc,
        arith::MulIOp::create(rewriter, loc, adaptor.getSizes().back(), byteSize));
    Value mpiByte = transport->word(rewriter, loc, transport::kByteWord);
    Value window = transport->word(rewriter, loc, transport::kWindowWord);
    Value put = transport->function(rewriter, loc, transport::kPutWord);
    auto putType = LLVM::LLVMFunctionType::get(
        i32, {pointerType, i32, i64, i32, i64, i32, i64, i64});
    forEachPutRow(
        rewriter, loc, adaptor.getSource(), adaptor.getSourceOffsets(),
        adaptor.getDest(), adaptor.getDestOffsets(), adaptor.getSizes(),
        [&](OpBuilder &b, Value from, Value into) {
          Value origin =
              LLVM::IntToPtrOp::create(b, loc, pointerType, toI64(b, loc, from));
          Value displacement =
              arith::SubIOp::create(b, loc, toI64(b, loc, into), windowBase);
          LLVM::CallOp::create(b, loc, putType,
                               ValueRange{put, origin, rowBytes, mpiByte,
                                          target, displacement, rowBytes,
                                          mpiByte, window});
        });
    rewriter.eraseOp(op);
    return success();
  }
};

} // namespace

void etc::populateRemoteToCPUConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns) {
  patterns.add<RankQueryLowering<RankIdOp, transport::kRankWord, 0>,
               RankQueryLowering<RankCountOp, transport::kRankCountWord, 1>,
               RemoteNotifyLowering, PutLowering>(typeConverter,
                                                  patterns.getContext());
}
