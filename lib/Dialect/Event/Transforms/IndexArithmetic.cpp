//===- IndexArithmetic.cpp - Index values for the schedulers --------------===//
//
// Folding index arithmetic, row-major positions and index-map evaluation,
// for the code the schedulers emit.
//
//===----------------------------------------------------------------------===//

#include "IndexArithmetic.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace etc::event;

Value etc::event::constantIndex(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

// Index arithmetic folds as it is built, so that the static parts of the
// schedule (constant grids, offset 0) read as plainly as they are.
Value etc::event::addIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::AddIOp>(loc, lhs, rhs);
}
Value etc::event::subIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::SubIOp>(loc, lhs, rhs);
}
Value etc::event::mulIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::MulIOp>(loc, lhs, rhs);
}
Value etc::event::remIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::RemUIOp>(loc, lhs, rhs);
}
Value etc::event::divIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::DivUIOp>(loc, lhs, rhs);
}
Value etc::event::minIndex(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::MinUIOp>(loc, lhs, rhs);
}

Value etc::event::productIndex(OpBuilder &b, Location loc, ValueRange factors) {
  if (factors.empty())
    return constantIndex(b, loc, 1);
  Value result = factors.front();
  for (Value factor : factors.drop_front())
    result = mulIndex(b, loc, result, factor);
  return result;
}

Value etc::event::linearize(OpBuilder &b, Location loc, ValueRange coordinates,
                            ValueRange sizes) {
  if (coordinates.empty())
    return constantIndex(b, loc, 0);
  Value linear = coordinates.front();
  for (auto [coordinate, size] :
       llvm::zip(coordinates.drop_front(), sizes.drop_front()))
    linear = addIndex(b, loc, mulIndex(b, loc, linear, size), coordinate);
  return linear;
}

SmallVector<Value> etc::event::delinearize(OpBuilder &b, Location loc,
                                           Value linear, ValueRange sizes) {
  SmallVector<Value> coordinates(sizes.size());
  for (int dim = static_cast<int>(sizes.size()) - 1; dim > 0; --dim) {
    coordinates[dim] = remIndex(b, loc, linear, sizes[dim]);
    linear = divIndex(b, loc, linear, sizes[dim]);
  }
  if (!sizes.empty())
    coordinates[0] = linear;
  return coordinates;
}

SmallVector<Value> etc::event::evaluateIndexMap(OpBuilder &b, Location loc,
                                                IndexMapAttr indexMap,
                                                ValueRange tile,
                                                ValueRange indexBuffers) {
  AffineMap map = indexMap.getMap();
  SmallVector<Value> coordinates;
  // s0 is the rank the task runs on.
  SmallVector<Value> operands(tile);
  if (map.getNumSymbols() > 0)
    operands.push_back(RankIdOp::create(b, loc));
  for (unsigned result = 0; result < map.getNumResults(); ++result) {
    AffineExpr expr = map.getResult(result);
    Value position;
    if (auto dim = dyn_cast<AffineDimExpr>(expr))
      position = tile[dim.getPosition()];
    else if (auto constant = dyn_cast<AffineConstantExpr>(expr))
      position = constantIndex(b, loc, constant.getValue());
    else
      position = affine::AffineApplyOp::create(b, loc, map.getSubMap(result),
                                               operands);
    if (indexMap.isIndirect(result)) {
      Value buffer = indexBuffers[indexMap.getIndirect()[result]];
      position = memref::LoadOp::create(b, loc, buffer, position);
      if (!position.getType().isIndex())
        position = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                              position);
    }
    coordinates.push_back(position);
  }
  return coordinates;
}
