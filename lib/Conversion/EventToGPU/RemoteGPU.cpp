//===- RemoteGPU.cpp - Remote event ops on GPUs through NVSHMEM -----------===//
//
// Lowers the operations of a graph that runs on several ranks for CUDA,
// where every rank is a GPU and the transport is NVSHMEM's device API: the
// counter buffer and the symmetric buffers are on NVSHMEM's symmetric heap,
// so a remote address is the local one plus the rank (PE). The kernels call
// NVSHMEM's device functions, which the module declares and leaves
// external: the PTX is compiled relocatable and linked with NVSHMEM's
// device library (`libnvshmem_device.a` of the `nvidia-nvshmem-cu13`
// wheel), by `nvlink` or the driver's linker.
//
//===----------------------------------------------------------------------===//

#include "Conversion/EventToGPU/EventToGPU.h"
#include "Conversion/EventCommon/EventAddressing.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

namespace {

/// Calls NVSHMEM's device function `name` of type `type`, declaring it in
/// the enclosing module (a `gpu.module`) on first use.
Value callNvshmem(OpBuilder &b, Location loc, Operation *at, StringRef name,
                  LLVM::LLVMFunctionType type, ValueRange arguments) {
  Operation *module = at->getParentOfType<gpu::GPUModuleOp>();
  if (!module)
    module = at->getParentOfType<ModuleOp>();
  if (!SymbolTable::lookupSymbolIn(module, name)) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&module->getRegion(0).front());
    LLVM::LLVMFuncOp::create(b, loc, name, type);
  }
  auto call = LLVM::CallOp::create(b, loc, type, name, arguments);
  return type.getReturnType() == LLVM::LLVMVoidType::get(b.getContext())
             ? Value()
             : call.getResult();
}

Value firstThread(OpBuilder &b, Location loc) {
  Value thread = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value zero = arith::ConstantIndexOp::create(b, loc, 0);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, thread, zero);
}

Value toI32(OpBuilder &b, Location loc, Value index) {
  return arith::IndexCastOp::create(b, loc, b.getI32Type(), index);
}

Value pointerAt(OpBuilder &b, Location loc, Value address) {
  Value word = arith::IndexCastOp::create(b, loc, b.getI64Type(), address);
  return LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(b.getContext()), word);
}

/// Lowers `event.rank_id` / `event.rank_count` to `nvshmem_my_pe()` /
/// `nvshmem_n_pes()`.
template <typename QueryOp>
struct RankQueryLowering : public OpConversionPattern<QueryOp> {
  RankQueryLowering(const TypeConverter &converter, MLIRContext *context,
                    StringRef function)
      : OpConversionPattern<QueryOp>(converter, context), function(function) {}
  LogicalResult
  matchAndRewrite(QueryOp op, typename QueryOp::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    auto type = LLVM::LLVMFunctionType::get(rewriter.getI32Type(), {});
    Value pe = callNvshmem(rewriter, loc, op, function, type, {});
    rewriter.replaceOpWithNewOp<arith::IndexCastOp>(
        op, rewriter.getIndexType(), pe);
    return success();
  }
  std::string function;
};

/// Lowers `event.put` to `nvshmemx_putmem_nbi_block` per row of the box,
/// which every thread of the CTA calls together (the threads share the
/// row's bytes). Completion is left to the `nvshmem_quiet` of the next
/// `event.remote_notify`.
struct PutLowering : public OpConversionPattern<PutOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(PutOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    MLIRContext *context = rewriter.getContext();
    auto pointerType = LLVM::LLVMPointerType::get(context);
    auto type = LLVM::LLVMFunctionType::get(
        LLVM::LLVMVoidType::get(context),
        {pointerType, pointerType, rewriter.getI64Type(), rewriter.getI32Type()});
    int64_t elementBytes = op.getSource().getType().getElementTypeBitWidth() / 8;
    Value bytes = arith::ConstantIndexOp::create(rewriter, loc, elementBytes);
    Value rowBytes = arith::IndexCastOp::create(
        rewriter, loc, rewriter.getI64Type(),
        arith::MulIOp::create(rewriter, loc, adaptor.getSizes().back(), bytes));
    Value pe = toI32(rewriter, loc, adaptor.getRank());
    forEachPutRow(
        rewriter, loc, adaptor.getSource(), adaptor.getSourceOffsets(),
        adaptor.getDest(), adaptor.getDestOffsets(), adaptor.getSizes(),
        [&](OpBuilder &b, Value from, Value to) {
          callNvshmem(b, loc, op, "nvshmemx_putmem_nbi_block", type,
                      {pointerAt(b, loc, to), pointerAt(b, loc, from), rowBytes, pe});
        });
    rewriter.eraseOp(op);
    return success();
  }
};

/// Lowers `event.remote_notify` to thread 0's `nvshmem_quiet()` (every put
/// this GPU issued is complete at its target; the `event.release` before
/// the notifies made the CTA's puts issued) and `nvshmem_int_atomic_add`
/// of -1 on the counter's symmetric address at the rank.
struct RemoteNotifyLowering : public OpConversionPattern<RemoteNotifyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RemoteNotifyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    FailureOr<Value> pointer = getEventElementPointer(
        rewriter, op, op.getEvent(), adaptor.getEvent(), adaptor.getIndices());
    if (failed(pointer))
      return failure();
    Location loc = op.getLoc();
    MLIRContext *context = rewriter.getContext();
    Type i32 = rewriter.getI32Type();
    auto voidType = LLVM::LLVMVoidType::get(context);
    Value pe = toI32(rewriter, loc, adaptor.getRank());
    auto branch = scf::IfOp::create(rewriter, loc, firstThread(rewriter, loc));
    {
      OpBuilder::InsertionGuard guard(rewriter);
      rewriter.setInsertionPointToStart(branch.thenBlock());
      callNvshmem(rewriter, loc, op, "nvshmem_quiet",
                  LLVM::LLVMFunctionType::get(voidType, {}), {});
      Value minusOne = arith::ConstantIntOp::create(rewriter, loc, -1, 32);
      callNvshmem(rewriter, loc, op, "nvshmem_int_atomic_add",
                  LLVM::LLVMFunctionType::get(
                      voidType, {LLVM::LLVMPointerType::get(context), i32, i32}),
                  {*pointer, minusOne, pe});
    }
    rewriter.eraseOp(op);
    return success();
  }
};

} // namespace

void etc::populateRemoteToGPUConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns) {
  MLIRContext *context = patterns.getContext();
  patterns.add<RankQueryLowering<RankIdOp>>(typeConverter, context,
                                            "nvshmem_my_pe");
  patterns.add<RankQueryLowering<RankCountOp>>(typeConverter, context,
                                               "nvshmem_n_pes");
  patterns.add<PutLowering, RemoteNotifyLowering>(typeConverter, context);
}
