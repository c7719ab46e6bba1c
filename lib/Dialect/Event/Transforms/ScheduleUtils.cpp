//===- ScheduleUtils.cpp - Pieces shared by the schedulers ----------------===//
//
// The parts of a scheduled program that do not depend on the schedule: the
// functions' signatures and attributes, the layout of the event tensors in
// the counter buffer, their expected counts, index maps, tile bodies and the
// end-of-run check.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/ScheduleUtils.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// Index arithmetic
//===----------------------------------------------------------------------===//

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
  for (unsigned result = 0; result < map.getNumResults(); ++result) {
    AffineExpr expr = map.getResult(result);
    Value position;
    if (auto dim = dyn_cast<AffineDimExpr>(expr))
      position = tile[dim.getPosition()];
    else if (auto constant = dyn_cast<AffineConstantExpr>(expr))
      position = constantIndex(b, loc, constant.getValue());
    else
      position = affine::AffineApplyOp::create(b, loc, map.getSubMap(result),
                                               tile);
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

//===----------------------------------------------------------------------===//
// GraphProgramBuilder
//===----------------------------------------------------------------------===//

SmallVector<Value> ScheduledFunction::mapped(ValueRange values) const {
  return llvm::map_to_vector(values,
                             [&](Value value) { return mapping.lookup(value); });
}

GraphProgramBuilder::GraphProgramBuilder(GraphOp graph, StringRef schedule,
                                         int64_t workers)
    : graph(graph), schedule(schedule.str()), workers(workers),
      tasks(graph.getBody().getOps<TaskOp>()) {}

SmallVector<std::string> GraphProgramBuilder::functionNames(GraphOp graph) {
  SmallVector<std::string> names;
  for (StringRef suffix : {"_counters", "_init", "_worker", "_check"})
    names.push_back((graph.getSymName() + suffix).str());
  return names;
}

ScheduledFunction GraphProgramBuilder::createFunction(OpBuilder &builder,
                                                      StringRef suffix,
                                                      bool withCounters,
                                                      TypeRange results) {
  Location loc = graph.getLoc();
  MLIRContext *context = graph.getContext();
  SmallVector<Type> inputs(graph.getArgumentTypes());
  if (withCounters)
    inputs.push_back(
        MemRefType::get({ShapedType::kDynamic}, builder.getI32Type()));
  ScheduledFunction function;
  function.op = func::FuncOp::create(
      builder, loc, (graph.getSymName() + suffix).str(),
      builder.getFunctionType(inputs, results));
  for (unsigned arg = 0; arg < graph.getNumArguments(); ++arg)
    if (DictionaryAttr attrs = graph.getArgAttrDict(arg))
      function.op.setArgAttrs(arg, attrs);
  function.op->setAttr("event.graph", graph.getSymNameAttr());
  function.op->setAttr("event.schedule", StringAttr::get(context, schedule));
  function.op->setAttr("event.workers", builder.getI64IntegerAttr(workers));

  Block *entry = function.op.addEntryBlock();
  OpBuilder b = OpBuilder::atBlockBegin(entry);
  for (auto [graphArg, funcArg] :
       llvm::zip(graph.getArguments(), entry->getArguments()))
    function.mapping.map(graphArg, funcArg);
  if (withCounters)
    function.counters = entry->getArguments().back();

  Value offset = constantIndex(b, loc, 0);
  for (Operation &op : graph.getBody().front().without_terminator()) {
    if (isa<TaskOp>(op))
      continue;
    auto alloc = dyn_cast<AllocOp>(op);
    if (!alloc) {
      b.clone(op, function.mapping);
      continue;
    }
    EventLayout layout;
    layout.offset = offset;
    EventTensorType type = alloc.getType();
    SmallVector<Value> dynamicSizes = function.mapped(alloc.getDynamicSizes());
    auto nextDynamic = dynamicSizes.begin();
    for (unsigned dim = 0; dim < type.getRank(); ++dim)
      layout.sizes.push_back(type.isDynamicDim(dim)
                                 ? *nextDynamic++
                                 : constantIndex(b, alloc.getLoc(),
                                                 type.getShape()[dim]));
    layout.numElements = productIndex(b, alloc.getLoc(), layout.sizes);
    if (withCounters) {
      layout.view = ViewOp::create(b, alloc.getLoc(), type, function.counters,
                                   offset, dynamicSizes);
      function.mapping.map(alloc.getResult(), layout.view);
    }
    offset = addIndex(b, alloc.getLoc(), offset, layout.numElements);
    function.events[alloc] = layout;
  }
  function.eventCounters = offset;
  return function;
}

/// Adds one to every counter of `layout` that notify `entry` of `task`
/// targets, once per tile.
static void countNotifies(OpBuilder &b, ScheduledFunction &function,
                          TaskOp task, unsigned entry,
                          const EventLayout &layout) {
  Location loc = task.getLoc();
  SmallVector<Value> lowerBounds(task.getGridRank(), constantIndex(b, loc, 0));
  SmallVector<Value> steps(task.getGridRank(), constantIndex(b, loc, 1));
  SmallVector<Value> extents = function.mapped(task.getGrid());
  SmallVector<Value> indexBuffers = function.mapped(task.getIndices());
  scf::buildLoopNest(
      b, loc, lowerBounds, extents, steps,
      [&](OpBuilder &nested, Location loc, ValueRange tile) {
        SmallVector<Value> coordinates = evaluateIndexMap(
            nested, loc, task.getNotifyMap(entry), tile, indexBuffers);
        Value element =
            addIndex(nested, loc, layout.offset,
                     linearize(nested, loc, coordinates, layout.sizes));
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
        Value incremented = arith::AddIOp::create(nested, loc, count, one);
        memref::StoreOp::create(nested, loc, incremented, function.counters,
                                element);
      });
}

void GraphProgramBuilder::initEventCounters(OpBuilder &b,
                                            ScheduledFunction &function) {
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>()) {
    Location loc = alloc.getLoc();
    const EventLayout &layout = function.events[alloc];
    Value initial =
        alloc.getCount()
            ? arith::IndexCastOp::create(
                  b, loc, b.getI32Type(),
                  function.mapping.lookup(alloc.getCount()))
            : arith::ConstantIntOp::create(b, loc, 0, 32).getResult();
    scf::ForOp fill = scf::ForOp::create(b, loc, constantIndex(b, loc, 0),
                                         layout.numElements,
                                         constantIndex(b, loc, 1));
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(fill.getBody());
      Value element = addIndex(b, loc, layout.offset, fill.getInductionVar());
      memref::StoreOp::create(b, loc, initial, function.counters, element);
    }
    if (alloc.getCount())
      continue;
    for (TaskOp task : tasks)
      for (auto [entry, event] : llvm::enumerate(task.getNotifies()))
        if (event == alloc.getResult())
          countNotifies(b, function, task, entry, layout);
  }
}

void GraphProgramBuilder::cloneBody(OpBuilder &b, ScheduledFunction &function,
                                    TaskOp task, ValueRange tile) {
  for (auto [tileIndex, value] : llvm::zip(task.getTileIndices(), tile))
    function.mapping.map(tileIndex, value);
  for (Operation &op : task.getBodyBlock().without_terminator())
    b.clone(op, function.mapping);
}

Value GraphProgramBuilder::anyNonZero(OpBuilder &b, Location loc,
                                      ScheduledFunction &function, Value begin,
                                      Value end) {
  Value none = arith::ConstantIntOp::create(b, loc, 0, 1);
  auto scan = scf::ForOp::create(
      b, loc, begin, end, constantIndex(b, loc, 1), ValueRange{none},
      [&](OpBuilder &nested, Location loc, Value element, ValueRange found) {
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
        Value nonZero = arith::CmpIOp::create(
            nested, loc, arith::CmpIPredicate::ne, count, zero);
        Value any = arith::OrIOp::create(nested, loc, found[0], nonZero);
        scf::YieldOp::create(nested, loc, any);
      });
  return scan.getResult(0);
}

LogicalResult etc::event::checkScheduleSymbolsFree(ModuleOp module,
                                                   StringRef pass) {
  SymbolTable symbols(module);
  for (GraphOp graph : module.getOps<GraphOp>()) {
    for (const std::string &name : GraphProgramBuilder::functionNames(graph)) {
      if (Operation *existing = symbols.lookup(name))
        return existing->emitError("symbol '")
               << name << "' is taken; " << pass << " needs it for graph @"
               << graph.getSymName();
    }
  }
  return success();
}
