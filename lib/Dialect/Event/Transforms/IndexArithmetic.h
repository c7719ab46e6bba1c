//===- IndexArithmetic.h - Index values for the schedulers ------*- C++ -*-===//
//
// The index arithmetic the schedulers emit: it folds as it is built, so
// that the static parts of a schedule (constant grids, offset 0) read as
// plainly as they are; row-major positions; and the event coordinates an
// index map gives a tile.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_INDEXARITHMETIC_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_INDEXARITHMETIC_H

#include "Event/IR/EventOps.h"
#include "mlir/IR/Builders.h"

namespace etc::event {

mlir::Value constantIndex(mlir::OpBuilder &b, mlir::Location loc,
                          int64_t value);
mlir::Value addIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value subIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value mulIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value remIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value divIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
mlir::Value minIndex(mlir::OpBuilder &b, mlir::Location loc, mlir::Value lhs,
                     mlir::Value rhs);
/// The product of `factors` (1 when empty).
mlir::Value productIndex(mlir::OpBuilder &b, mlir::Location loc,
                         mlir::ValueRange factors);

/// Row-major position of `coordinates` in a tensor of shape `sizes`.
mlir::Value linearize(mlir::OpBuilder &b, mlir::Location loc,
                      mlir::ValueRange coordinates, mlir::ValueRange sizes);

/// Inverse of `linearize`: the coordinates of row-major position `linear`.
llvm::SmallVector<mlir::Value> delinearize(mlir::OpBuilder &b,
                                           mlir::Location loc,
                                           mlir::Value linear,
                                           mlir::ValueRange sizes);

/// The event coordinates `indexMap` gives tile `tile`: affine results applied
/// to the tile indices, indirect results loaded from `indexBuffers` (the
/// task's index buffers, already remapped) and cast to `index`.
llvm::SmallVector<mlir::Value> evaluateIndexMap(mlir::OpBuilder &b,
                                                mlir::Location loc,
                                                IndexMapAttr indexMap,
                                                mlir::ValueRange tile,
                                                mlir::ValueRange indexBuffers);

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_INDEXARITHMETIC_H
