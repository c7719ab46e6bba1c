//===- StaticSchedule.cpp - event-static-schedule -------------------------===//
//
// Turns each L2 event graph into an L3 persistent program with a static
// schedule: all tile tasks in one global order (task textual order, then
// row-major tile order), global task t run by worker t mod W. The program is
// three functions sharing the graph's arguments: one sizes the counter
// buffer, one initialises it, one is the per-worker loop.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/CheckSchedule.h"
#include "Event/Transforms/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"

namespace etc::event {
#define GEN_PASS_DEF_EVENTSTATICSCHEDULE
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

using namespace mlir;
using namespace etc::event;

/// The scheduling policies `policy=` accepts.
static constexpr StringLiteral kRoundRobin = "round-robin";

//===----------------------------------------------------------------------===//
// Index arithmetic helpers
//===----------------------------------------------------------------------===//

static Value constantIndex(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

// Index arithmetic folds as it is built, so that the static parts of the
// schedule (constant grids, offset 0) read as plainly as they are.
static Value add(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::AddIOp>(loc, lhs, rhs);
}
static Value sub(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::SubIOp>(loc, lhs, rhs);
}
static Value mul(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::MulIOp>(loc, lhs, rhs);
}
static Value rem(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::RemUIOp>(loc, lhs, rhs);
}
static Value div(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  return b.createOrFold<arith::DivUIOp>(loc, lhs, rhs);
}

static Value product(OpBuilder &b, Location loc, ValueRange factors) {
  if (factors.empty())
    return constantIndex(b, loc, 1);
  Value result = factors.front();
  for (Value factor : factors.drop_front())
    result = mul(b, loc, result, factor);
  return result;
}

/// Row-major position of `coordinates` in a tensor of shape `sizes`.
static Value linearize(OpBuilder &b, Location loc, ValueRange coordinates,
                       ValueRange sizes) {
  if (coordinates.empty())
    return constantIndex(b, loc, 0);
  Value linear = coordinates.front();
  for (auto [coordinate, size] :
       llvm::zip(coordinates.drop_front(), sizes.drop_front()))
    linear = add(b, loc, mul(b, loc, linear, size), coordinate);
  return linear;
}

/// Inverse of `linearize`: the coordinates of row-major position `linear`.
static SmallVector<Value> delinearize(OpBuilder &b, Location loc, Value linear,
                                      ValueRange sizes) {
  SmallVector<Value> coordinates(sizes.size());
  for (int dim = static_cast<int>(sizes.size()) - 1; dim > 0; --dim) {
    coordinates[dim] = rem(b, loc, linear, sizes[dim]);
    linear = div(b, loc, linear, sizes[dim]);
  }
  if (!sizes.empty())
    coordinates[0] = linear;
  return coordinates;
}

/// The event coordinates tile `tile` of `task` waits on or notifies:
/// affine results applied to the tile indices, indirect results loaded from
/// the task's index buffer (`indexBuffers`, already remapped) and cast to
/// `index`.
static SmallVector<Value> evaluateIndexMap(OpBuilder &b, Location loc,
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
// Graph scheduler
//===----------------------------------------------------------------------===//

namespace {
/// Where the counters of one event tensor live in the flat counter buffer,
/// as values of the function being built.
struct EventLayout {
  Value offset;
  Value numElements;
  /// Every dimension's size, static ones as constants.
  SmallVector<Value> sizes;
  /// The `event.view` naming the tensor, when the function has counters.
  Value view;
};

/// Builds the three functions of one graph's static schedule.
class GraphScheduler {
public:
  GraphScheduler(GraphOp graph, int64_t workers)
      : graph(graph), workers(workers),
        tasks(graph.getBody().getOps<TaskOp>()) {}

  /// Inserts `@g_counters`, `@g_init` and `@g_worker` at `builder`.
  void build(OpBuilder &builder);

private:
  /// State of the function being built.
  struct Function {
    func::FuncOp op;
    IRMapping mapping;
    DenseMap<Operation *, EventLayout> events;
    /// Number of counters of all event tensors together.
    Value totalCounters;
    Value counters;
  };

  Function createFunction(OpBuilder &builder, StringRef suffix,
                          bool withCounters, TypeRange results);
  void buildCounters(OpBuilder &builder);
  void buildInit(OpBuilder &builder);
  void buildWorker(OpBuilder &builder);
  void countNotifies(OpBuilder &b, Function &function, TaskOp task,
                     unsigned entry, const EventLayout &layout);
  void runTile(OpBuilder &b, Function &function, TaskOp task,
               ValueRange tile);

  SmallVector<Value> mapped(Function &function, ValueRange values) {
    return llvm::map_to_vector(
        values, [&](Value value) { return function.mapping.lookup(value); });
  }

  GraphOp graph;
  int64_t workers;
  SmallVector<TaskOp> tasks;
};
} // namespace

/// Creates a function with the graph's arguments (plus the counter buffer),
/// then clones the graph's index computations into it and lays out the
/// event tensors one after another, row-major.
GraphScheduler::Function GraphScheduler::createFunction(OpBuilder &builder,
                                                        StringRef suffix,
                                                        bool withCounters,
                                                        TypeRange results) {
  Location loc = graph.getLoc();
  MLIRContext *context = graph.getContext();
  SmallVector<Type> inputs(graph.getArgumentTypes());
  if (withCounters)
    inputs.push_back(
        MemRefType::get({ShapedType::kDynamic}, builder.getI32Type()));
  Function function;
  function.op = func::FuncOp::create(
      builder, loc, (graph.getSymName() + suffix).str(),
      builder.getFunctionType(inputs, results));
  for (unsigned arg = 0; arg < graph.getNumArguments(); ++arg)
    if (DictionaryAttr attrs = graph.getArgAttrDict(arg))
      function.op.setArgAttrs(arg, attrs);
  function.op->setAttr("event.graph", graph.getSymNameAttr());
  function.op->setAttr("event.schedule", StringAttr::get(context, "static"));
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
    SmallVector<Value> dynamicSizes = mapped(function, alloc.getDynamicSizes());
    auto nextDynamic = dynamicSizes.begin();
    for (unsigned dim = 0; dim < type.getRank(); ++dim)
      layout.sizes.push_back(type.isDynamicDim(dim)
                                 ? *nextDynamic++
                                 : constantIndex(b, alloc.getLoc(),
                                                 type.getShape()[dim]));
    layout.numElements = product(b, alloc.getLoc(), layout.sizes);
    if (withCounters) {
      layout.view = ViewOp::create(b, alloc.getLoc(), type, function.counters,
                                   offset, dynamicSizes);
      function.mapping.map(alloc.getResult(), layout.view);
    }
    offset = add(b, alloc.getLoc(), offset, layout.numElements);
    function.events[alloc] = layout;
  }
  function.totalCounters = offset;
  return function;
}

/// `@g_counters(args) -> index`: the size of the counter buffer.
void GraphScheduler::buildCounters(OpBuilder &builder) {
  Function function = createFunction(builder, "_counters",
                                     /*withCounters=*/false,
                                     builder.getIndexType());
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(b, graph.getLoc(), function.totalCounters);
}

/// Adds one to every counter of `layout` that notify `entry` of `task`
/// targets, once per tile.
void GraphScheduler::countNotifies(OpBuilder &b, Function &function,
                                   TaskOp task, unsigned entry,
                                   const EventLayout &layout) {
  Location loc = task.getLoc();
  SmallVector<Value> lowerBounds(task.getGridRank(), constantIndex(b, loc, 0));
  SmallVector<Value> steps(task.getGridRank(), constantIndex(b, loc, 1));
  SmallVector<Value> extents = mapped(function, task.getGrid());
  SmallVector<Value> indexBuffers = mapped(function, task.getIndices());
  scf::buildLoopNest(
      b, loc, lowerBounds, extents, steps,
      [&](OpBuilder &nested, Location loc, ValueRange tile) {
        SmallVector<Value> coordinates = evaluateIndexMap(
            nested, loc, task.getNotifyMap(entry), tile, indexBuffers);
        Value element =
            add(nested, loc, layout.offset,
                linearize(nested, loc, coordinates, layout.sizes));
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
        Value incremented = arith::AddIOp::create(nested, loc, count, one);
        memref::StoreOp::create(nested, loc, incremented, function.counters,
                                element);
      });
}

/// `@g_init(args, counters)`: every counter set to its expected count,
/// either the event's `count` or the number of notifies counted by
/// evaluating every notifying tile's (possibly indirect) map.
void GraphScheduler::buildInit(OpBuilder &builder) {
  Function function = createFunction(builder, "_init", /*withCounters=*/true,
                                     /*results=*/{});
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
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
      Value element = add(b, loc, layout.offset, fill.getInductionVar());
      memref::StoreOp::create(b, loc, initial, function.counters, element);
    }
    if (alloc.getCount())
      continue;
    for (TaskOp task : tasks)
      for (auto [entry, event] : llvm::enumerate(task.getNotifies()))
        if (event == alloc.getResult())
          countNotifies(b, function, task, entry, layout);
  }
  func::ReturnOp::create(b, graph.getLoc());
}

/// Emits one tile of `task`: waits, the cloned body, notifies.
void GraphScheduler::runTile(OpBuilder &b, Function &function, TaskOp task,
                             ValueRange tile) {
  Location loc = task.getLoc();
  SmallVector<Value> indexBuffers = mapped(function, task.getIndices());
  for (auto [entry, event] : llvm::enumerate(task.getWaits())) {
    SmallVector<Value> coordinates = evaluateIndexMap(
        b, loc, task.getWaitMap(entry), tile, indexBuffers);
    WaitOp::create(b, loc, function.mapping.lookup(event), coordinates);
  }
  for (auto [tileIndex, value] : llvm::zip(task.getTileIndices(), tile))
    function.mapping.map(tileIndex, value);
  for (Operation &op : task.getBodyBlock().without_terminator())
    b.clone(op, function.mapping);
  for (auto [entry, event] : llvm::enumerate(task.getNotifies())) {
    SmallVector<Value> coordinates = evaluateIndexMap(
        b, loc, task.getNotifyMap(entry), tile, indexBuffers);
    NotifyOp::create(b, loc, function.mapping.lookup(event), coordinates);
  }
}

/// `@g_worker(args, counters)`: worker w runs the global tasks t with
/// t mod W == w in increasing t. Task k owns global indices
/// [o_k, o_k + tiles_k); its loop starts at the first of them that is
/// congruent to w, o_k + ((w - o_k) mod W), and steps by W.
void GraphScheduler::buildWorker(OpBuilder &builder) {
  Function function = createFunction(builder, "_worker", /*withCounters=*/true,
                                     /*results=*/{});
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Value worker = WorkerIdOp::create(b, loc);
  Value workerCount = WorkerCountOp::create(b, loc);
  Value taskOffset = constantIndex(b, loc, 0);
  for (TaskOp task : tasks) {
    Location taskLoc = task.getLoc();
    SmallVector<Value> extents = mapped(function, task.getGrid());
    Value tiles = product(b, taskLoc, extents);
    Value end = add(b, taskLoc, taskOffset, tiles);
    // (w - o) mod W, kept non-negative: w + W - (o mod W) lies in (0, 2W).
    Value offsetResidue = rem(b, taskLoc, taskOffset, workerCount);
    Value shifted = sub(b, taskLoc, add(b, taskLoc, worker, workerCount),
                        offsetResidue);
    Value start =
        add(b, taskLoc, taskOffset, rem(b, taskLoc, shifted, workerCount));
    auto loop = scf::ForOp::create(b, taskLoc, start, end, workerCount);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value local = sub(b, taskLoc, loop.getInductionVar(), taskOffset);
      runTile(b, function, task, delinearize(b, taskLoc, local, extents));
    }
    taskOffset = end;
  }
  func::ReturnOp::create(b, loc);
}

void GraphScheduler::build(OpBuilder &builder) {
  buildCounters(builder);
  buildInit(builder);
  buildWorker(builder);
}

//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

namespace {
struct EventStaticSchedulePass
    : public etc::event::impl::EventStaticScheduleBase<
          EventStaticSchedulePass> {
  using EventStaticScheduleBase::EventStaticScheduleBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (policy != kRoundRobin) {
      module.emitError("event-static-schedule: unsupported policy '")
          << policy << "'; supported policies: " << kRoundRobin;
      return signalPassFailure();
    }
    SmallVector<GraphOp> graphs(module.getOps<GraphOp>());
    SymbolTable symbols(module);
    for (GraphOp graph : graphs) {
      if (failed(checkSchedule(graph)))
        return signalPassFailure();
      for (StringRef suffix : {"_counters", "_init", "_worker"}) {
        std::string name = (graph.getSymName() + suffix).str();
        if (Operation *existing = symbols.lookup(name)) {
          existing->emitError("symbol '")
              << name << "' is taken; event-static-schedule needs it for "
              << "graph @" << graph.getSymName();
          return signalPassFailure();
        }
      }
    }
    for (GraphOp graph : graphs) {
      OpBuilder builder(graph);
      GraphScheduler(graph, workers).build(builder);
      graph.erase();
    }
  }
};
} // namespace
