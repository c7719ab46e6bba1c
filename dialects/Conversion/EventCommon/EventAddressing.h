//===- EventAddressing.h - Counter addresses shared by the targets -*- C++ -*-===//
//
// Both targets keep event counters as i32s in the runtime's flat counter
// buffer and reach them through LLVM pointers; only the atomics and the
// waiting differ. This is the addressing they share.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_CONVERSION_EVENTCOMMON_EVENTADDRESSING_H
#define ETC_CONVERSION_EVENTCOMMON_EVENTADDRESSING_H

#include "mlir/IR/Builders.h"
#include "mlir/Transforms/DialectConversion.h"

namespace etc {

/// The address of i32 word `position` of the counter buffer `counters`
/// (a `memref<?xi32>` with the identity layout).
mlir::Value getCounterPointer(mlir::OpBuilder &builder, mlir::Location loc,
                              mlir::Value counters, mlir::Value position);

/// The address of element `indices` of `event`, an `event.view`, given
/// `base`, the (converted) address of its first counter. Elements are laid
/// out row-major, as the schedulers lay out the counter buffer. Fails (a
/// match failure on `op`) when `event` is not an `event.view`.
mlir::FailureOr<mlir::Value>
getEventElementPointer(mlir::ConversionPatternRewriter &rewriter,
                       mlir::Operation *op, mlir::Value event, mlir::Value base,
                       mlir::ValueRange indices);

/// The counter buffer (a `memref<?xi32>`) that `event`, an `event.view`,
/// carves its tensor out of. Fails (a match failure on `op`) otherwise.
mlir::FailureOr<mlir::Value>
getEventCounters(mlir::ConversionPatternRewriter &rewriter, mlir::Operation *op,
                 mlir::Value event);

/// Emits, for each row of the box an `event.put` copies (its last dimension,
/// contiguous in both buffers), `emitRow(builder, from, to)` with the byte
/// addresses (index values) of the row's first element in `source` and in
/// `dest`, inside nested `scf.for` loops over the box's other dimensions.
/// `source` and `dest` are the converted buffers (identity-layout memrefs),
/// `sourceOffsets`, `destOffsets` and `sizes` the op's converted operands.
/// Both targets' put lowerings share it; they differ in the call per row.
void forEachPutRow(
    mlir::OpBuilder &builder, mlir::Location loc, mlir::Value source,
    mlir::ValueRange sourceOffsets, mlir::Value dest,
    mlir::ValueRange destOffsets, mlir::ValueRange sizes,
    llvm::function_ref<void(mlir::OpBuilder &, mlir::Value, mlir::Value)>
        emitRow);

/// Converts `!event.tensor` to `!llvm.ptr` (its first counter) and leaves
/// every other type as it is.
void populateEventTensorTypeConversion(mlir::TypeConverter &typeConverter);

/// Adds the pattern that lowers `event.view` to the address of its first
/// counter.
void populateEventViewLoweringPattern(const mlir::TypeConverter &typeConverter,
                                      mlir::RewritePatternSet &patterns);

/// Adds the pattern that lowers `event.buffer` to a memref descriptor built
/// from the buffer table's words (address, then sizes; row-major strides).
/// The addresses point into LLVM address space `addressSpace` (1, global
/// memory, on NVPTX) and are used through generic pointers.
void populateEventBufferLoweringPattern(const mlir::TypeConverter &typeConverter,
                                        mlir::RewritePatternSet &patterns,
                                        unsigned addressSpace = 0);

} // namespace etc

#endif // ETC_CONVERSION_EVENTCOMMON_EVENTADDRESSING_H
