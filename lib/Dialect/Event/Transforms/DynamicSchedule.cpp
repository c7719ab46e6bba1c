//===- DynamicSchedule.cpp - event-dynamic-schedule -----------------------===//
//
// Turns each L2 event graph into an L3 persistent program whose workers share
// one task queue in the counter buffer: a tile task is pushed when the last
// of its wait elements becomes ready, and any worker pops it. The whole
// scheduling logic (counts, pending counts, inverse indices, queue) is code
// of the program: nothing is prepared on the host.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/CheckSchedule.h"
#include "Event/Transforms/Passes.h"
#include "Event/Transforms/ScheduleUtils.h"
#include "Event/IR/QueueLayout.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"

namespace etc::event {
#define GEN_PASS_DEF_EVENTDYNAMICSCHEDULE
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

using namespace mlir;
using namespace etc::event;


//===----------------------------------------------------------------------===//
// Waiters of an event element
//===----------------------------------------------------------------------===//

namespace {
/// How one result of a wait map selects tiles: `tile[dim] == c`,
/// `tile[dim] floordiv divisor == c`, for a constant result every tile when
/// `c == constant`, and for `Any` (an indirect result whose index buffer is
/// written during the run) every tile for every `c`.
struct BoxResult {
  enum Kind { Dim, FloorDiv, Constant, Any } kind;
  unsigned dim = 0;
  int64_t value = 0; // The divisor or the constant.
};

/// One wait clause entry: task `task` waits on the event with entry `entry`.
struct WaitUse {
  unsigned task;
  unsigned entry;
  /// Set when the waiting tiles of an element form a box (closed form).
  std::optional<SmallVector<BoxResult>> box;
};

/// The closed form of `indexMap` as a box of tiles, if it has one: every
/// result is a distinct tile index `dN`, `dN floordiv M` (M > 0), a constant,
/// or, with `anyIndirect`, indirect (`Any`: the tile waits on every
/// coordinate there). Otherwise, without `anyIndirect`, indirect maps have
/// none.
std::optional<SmallVector<BoxResult>> closedForm(IndexMapAttr indexMap,
                                                 bool anyIndirect) {
  if (indexMap.hasIndirect() && !anyIndirect)
    return std::nullopt;
  SmallVector<BoxResult> results;
  llvm::SmallDenseSet<unsigned> used;
  for (auto [result, expr] : llvm::enumerate(indexMap.getMap().getResults())) {
    if (indexMap.isIndirect(result)) {
      results.push_back({BoxResult::Any, 0, 0});
      continue;
    }
    if (auto constant = dyn_cast<AffineConstantExpr>(expr)) {
      results.push_back({BoxResult::Constant, 0, constant.getValue()});
      continue;
    }
    if (auto dim = dyn_cast<AffineDimExpr>(expr)) {
      if (!used.insert(dim.getPosition()).second)
        return std::nullopt;
      results.push_back({BoxResult::Dim, dim.getPosition(), 1});
      continue;
    }
    auto binary = dyn_cast<AffineBinaryOpExpr>(expr);
    if (!binary || binary.getKind() != AffineExprKind::FloorDiv)
      return std::nullopt;
    auto dim = dyn_cast<AffineDimExpr>(binary.getLHS());
    auto divisor = dyn_cast<AffineConstantExpr>(binary.getRHS());
    if (!dim || !divisor || divisor.getValue() <= 0 ||
        !used.insert(dim.getPosition()).second)
      return std::nullopt;
    results.push_back({BoxResult::FloorDiv, dim.getPosition(),
                       divisor.getValue()});
  }
  return results;
}

/// The inverse index of one event: for each element, the ids of the tiles
/// waiting on it, in CSR form in the counter buffer.
struct InverseIndex {
  /// `numElements + 1` offsets into the entries, from this counter on.
  Value offsets;
  /// The entries (tile ids), from this counter on.
  Value entries;
  /// How many entries there are.
  Value numEntries;
};

/// Where the scheduling state lives in the counter buffer, as values of the
/// function being built.
struct QueueLayout {
  /// First global tile id of each task, plus the total tile count at the end.
  SmallVector<Value> taskOffsets;
  Value totalTiles;
  /// The first word of the queue (header, then slots).
  Value queue;
  /// The first pending count, and the pending counts as an event tensor.
  Value pending;
  Value pendingView;
  DenseMap<Operation *, InverseIndex> inverse;
  /// The size of the whole counter buffer.
  Value end;
};

/// Erases the pending-count view of a function that does not use it.
void dropUnusedPendingView(QueueLayout &layout) {
  if (layout.pendingView && layout.pendingView.use_empty())
    layout.pendingView.getDefiningOp()->erase();
}

/// Builds the four functions of one graph's dynamic schedule.
class DynamicScheduler : public GraphProgramBuilder {
public:
  DynamicScheduler(GraphOp graph, int64_t workers, bool forceIndex);

  /// Inserts `@g_counters`, `@g_init`, `@g_worker` and `@g_check` at
  /// `builder`.
  void build(OpBuilder &builder);

private:
  /// A function with the queue laid out after the event tensors.
  ScheduledFunction createFunction(OpBuilder &builder, StringRef suffix,
                                   bool withCounters, TypeRange results,
                                   QueueLayout &layout);
  void buildCounters(OpBuilder &builder);
  void buildInit(OpBuilder &builder);
  void buildWorker(OpBuilder &builder);
  void buildCheck(OpBuilder &builder);

  /// Builds the inverse index of `alloc` in `@g_init`.
  void buildInverseIndex(OpBuilder &b, ScheduledFunction &function,
                         QueueLayout &layout, AllocOp alloc);
  /// Calls `body(tile id, element)` for every tile of every wait entry of
  /// `alloc` that uses the inverse index; `element` is the row-major
  /// position of its wait element.
  void forEachIndexedWait(
      OpBuilder &b, ScheduledFunction &function, QueueLayout &layout,
      AllocOp alloc,
      function_ref<void(OpBuilder &, Location, Value, Value)> body);
  /// The number of not yet ready elements a tile waits on through a wait
  /// entry with `Any` results: every coordinate there, the others evaluated.
  Value countWaitingOnAny(OpBuilder &b, Location loc,
                          ScheduledFunction &function,
                          const EventLayout &eventLayout, IndexMapAttr map,
                          ArrayRef<BoxResult> box, ValueRange tile);
  const WaitUse &waitUse(unsigned task, unsigned entry) {
    Value event = tasks[task].getWaits()[entry];
    for (const WaitUse &use : waiters[event.getDefiningOp()])
      if (use.task == task && use.entry == entry)
        return use;
    llvm_unreachable("every wait entry has a use");
  }
  /// Sets every tile's pending count and pushes the ready tiles (`@g_init`).
  void initPending(OpBuilder &b, ScheduledFunction &function,
                   QueueLayout &layout);

  /// Emits tile `id` of task `taskIndex`: the body, then the notifies.
  void runTile(OpBuilder &b, ScheduledFunction &function, QueueLayout &layout,
               unsigned taskIndex, Value id);
  /// Emits the code that readies the waiters of element `coordinates` of
  /// `alloc`, run by the notifier that took it to zero.
  void readyWaiters(OpBuilder &b, Location loc, ScheduledFunction &function,
                    QueueLayout &layout, AllocOp alloc,
                    ValueRange coordinates);
  /// Decrements the pending count of tile `id`, pushing it when it is the
  /// last.
  void readyTile(OpBuilder &b, Location loc, ScheduledFunction &function,
                 QueueLayout &layout, Value id);

  /// Wait entries of each event tensor.
  DenseMap<Operation *, SmallVector<WaitUse>> waiters;
  /// Events with at least one waiter that needs the inverse index, in
  /// allocation order.
  SmallVector<AllocOp> indexedEvents;
};
} // namespace

DynamicScheduler::DynamicScheduler(GraphOp graph, int64_t workers,
                                   bool forceIndex)
    : GraphProgramBuilder(graph, "dynamic", workers) {
  // Index buffers some task writes hold their values only once that task
  // ran, so `@g_init` cannot evaluate indirect waits through them.
  llvm::SmallDenseSet<Value> written;
  for (TaskOp task : tasks)
    written.insert(task.getWrites().begin(), task.getWrites().end());
  for (auto [taskIndex, task] : llvm::enumerate(tasks))
    for (auto [entry, event] : llvm::enumerate(task.getWaits())) {
      WaitUse use{static_cast<unsigned>(taskIndex),
                  static_cast<unsigned>(entry), std::nullopt};
      IndexMapAttr map = task.getWaitMap(entry);
      bool runtimeIndices = llvm::any_of(map.getIndirect(), [&](int64_t k) {
        return k >= 0 && written.contains(task.getIndices()[k]);
      });
      if (runtimeIndices)
        use.box = closedForm(map, /*anyIndirect=*/true);
      else if (!forceIndex)
        use.box = closedForm(map, /*anyIndirect=*/false);
      // checkSchedule guarantees the event is an `event.alloc`.
      waiters[event.getDefiningOp()].push_back(use);
    }
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>())
    if (llvm::any_of(waiters.lookup(alloc),
                     [](const WaitUse &use) { return !use.box; }))
      indexedEvents.push_back(alloc);
}

ScheduledFunction DynamicScheduler::createFunction(OpBuilder &builder,
                                                   StringRef suffix,
                                                   bool withCounters,
                                                   TypeRange results,
                                                   QueueLayout &layout) {
  ScheduledFunction function = GraphProgramBuilder::createFunction(
      builder, suffix, withCounters, results);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  layout.totalTiles = constantIndex(b, loc, 0);
  SmallVector<Value> tilesPerTask;
  for (TaskOp task : tasks) {
    layout.taskOffsets.push_back(layout.totalTiles);
    Value tiles = productIndex(b, task.getLoc(), function.mapped(task.getGrid()));
    tilesPerTask.push_back(tiles);
    layout.totalTiles = addIndex(b, task.getLoc(), layout.totalTiles, tiles);
  }
  layout.taskOffsets.push_back(layout.totalTiles);
  layout.queue = function.eventCounters;
  layout.pending = addIndex(
      b, loc, layout.queue,
      addIndex(b, loc, constantIndex(b, loc, queue::kHeaderWords),
               layout.totalTiles));
  if (withCounters)
    layout.pendingView =
        ViewOp::create(b, loc, EventTensorType::get(graph.getContext(),
                                                    {ShapedType::kDynamic}),
                       function.counters, layout.pending,
                       ValueRange{layout.totalTiles});
  Value next = addIndex(b, loc, layout.pending, layout.totalTiles);
  for (AllocOp alloc : indexedEvents) {
    InverseIndex index;
    index.offsets = next;
    index.entries =
        addIndex(b, loc, next,
                 addIndex(b, loc, function.events[alloc].numElements,
                          constantIndex(b, loc, 1)));
    index.numEntries = constantIndex(b, loc, 0);
    for (const WaitUse &use : waiters.lookup(alloc))
      if (!use.box)
        index.numEntries =
            addIndex(b, loc, index.numEntries, tilesPerTask[use.task]);
    next = addIndex(b, loc, index.entries, index.numEntries);
    layout.inverse[alloc] = index;
  }
  layout.end = next;
  return function;
}

//===----------------------------------------------------------------------===//
// @g_counters and @g_init
//===----------------------------------------------------------------------===//

/// `@g_counters(args) -> index`: the size of the counter buffer.
void DynamicScheduler::buildCounters(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function =
      createFunction(builder, "_counters", /*withCounters=*/false,
                     builder.getIndexType(), layout);
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(b, graph.getLoc(), layout.end);
}

/// Loads counter `position` as an index.
static Value loadIndex(OpBuilder &b, Location loc, Value counters,
                       Value position) {
  Value word = memref::LoadOp::create(b, loc, counters, position);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), word);
}

/// Stores `value` (an index) into counter `position`.
static void storeIndex(OpBuilder &b, Location loc, Value value, Value counters,
                       Value position) {
  Value word = arith::IndexCastOp::create(b, loc, b.getI32Type(), value);
  memref::StoreOp::create(b, loc, word, counters, position);
}

/// Emits `for i in [begin, end): counters[i] = 0`.
static void zeroCounters(OpBuilder &b, Location loc, Value counters,
                         Value begin, Value end) {
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  scf::ForOp::create(b, loc, begin, end, constantIndex(b, loc, 1), ValueRange{},
                     [&](OpBuilder &nested, Location loc, Value position,
                         ValueRange) {
                       memref::StoreOp::create(nested, loc, zero, counters,
                                               position);
                       scf::YieldOp::create(nested, loc);
                     });
}

void DynamicScheduler::forEachIndexedWait(
    OpBuilder &b, ScheduledFunction &function, QueueLayout &layout,
    AllocOp alloc,
    function_ref<void(OpBuilder &, Location, Value, Value)> body) {
  const EventLayout &event = function.events[alloc];
  for (const WaitUse &use : waiters.lookup(alloc)) {
    if (use.box)
      continue;
    TaskOp task = tasks[use.task];
    Location loc = task.getLoc();
    SmallVector<Value> extents = function.mapped(task.getGrid());
    SmallVector<Value> indexBuffers = function.mapped(task.getIndices());
    Value tiles = productIndex(b, loc, extents);
    scf::ForOp::create(
        b, loc, constantIndex(b, loc, 0), tiles, constantIndex(b, loc, 1),
        ValueRange{},
        [&](OpBuilder &nested, Location loc, Value local, ValueRange) {
          SmallVector<Value> tile = delinearize(nested, loc, local, extents);
          SmallVector<Value> coordinates = evaluateIndexMap(
              nested, loc, task.getWaitMap(use.entry), tile, indexBuffers);
          Value element = linearize(nested, loc, coordinates, event.sizes);
          Value id = addIndex(nested, loc, layout.taskOffsets[use.task], local);
          body(nested, loc, id, element);
          scf::YieldOp::create(nested, loc);
        });
  }
}

/// Counting sort of the indexed waiting tiles by element: count into
/// `offsets[e + 1]`, prefix sum, fill while advancing `offsets[e]` (which
/// then holds the end of e's entries), and shift the offsets back.
void DynamicScheduler::buildInverseIndex(OpBuilder &b,
                                         ScheduledFunction &function,
                                         QueueLayout &layout, AllocOp alloc) {
  Location loc = alloc.getLoc();
  Value counters = function.counters;
  const InverseIndex &index = layout.inverse[alloc];
  Value numElements = function.events[alloc].numElements;
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  zeroCounters(b, loc, counters, index.offsets, index.entries);

  forEachIndexedWait(
      b, function, layout, alloc,
      [&](OpBuilder &nested, Location loc, Value, Value element) {
        Value position = addIndex(nested, loc, index.offsets,
                                  addIndex(nested, loc, element, one));
        Value count = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, count, one), counters,
                   position);
      });

  // offsets[e] += offsets[e - 1] for e in [1, numElements].
  scf::ForOp::create(
      b, loc, one, addIndex(b, loc, numElements, one), one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value element, ValueRange) {
        Value position = addIndex(nested, loc, index.offsets, element);
        Value previous = loadIndex(nested, loc, counters,
                                   subIndex(nested, loc, position, one));
        Value current = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, previous, current),
                   counters, position);
        scf::YieldOp::create(nested, loc);
      });

  forEachIndexedWait(
      b, function, layout, alloc,
      [&](OpBuilder &nested, Location loc, Value id, Value element) {
        Value cursor = addIndex(nested, loc, index.offsets, element);
        Value slot = loadIndex(nested, loc, counters, cursor);
        storeIndex(nested, loc, id, counters,
                   addIndex(nested, loc, index.entries, slot));
        storeIndex(nested, loc, addIndex(nested, loc, slot, one), counters,
                   cursor);
      });

  // offsets[e] = offsets[e - 1] for e from numElements down to 1; then
  // offsets[0] = 0.
  scf::ForOp::create(
      b, loc, zero, numElements, one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value step, ValueRange) {
        Value element = subIndex(nested, loc, numElements, step);
        Value position = addIndex(nested, loc, index.offsets, element);
        Value previous = memref::LoadOp::create(
            nested, loc, counters, subIndex(nested, loc, position, one));
        memref::StoreOp::create(nested, loc, previous, counters, position);
        scf::YieldOp::create(nested, loc);
      });
  memref::StoreOp::create(b, loc, arith::ConstantIntOp::create(b, loc, 0, 32),
                          counters, index.offsets);
}

Value DynamicScheduler::countWaitingOnAny(OpBuilder &b, Location loc,
                                         ScheduledFunction &function,
                                         const EventLayout &eventLayout,
                                         IndexMapAttr map,
                                         ArrayRef<BoxResult> box,
                                         ValueRange tile) {
  SmallVector<Value> lower, upper, steps;
  SmallVector<unsigned> anyResults;
  for (auto [result, part] : llvm::enumerate(box)) {
    if (part.kind != BoxResult::Any)
      continue;
    anyResults.push_back(result);
    lower.push_back(constantIndex(b, loc, 0));
    upper.push_back(eventLayout.sizes[result]);
    steps.push_back(constantIndex(b, loc, 1));
  }
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  scf::LoopNest nest = scf::buildLoopNest(
      b, loc, lower, upper, steps, ValueRange{zero},
      [&](OpBuilder &nested, Location loc, ValueRange anyCoordinates,
          ValueRange counted) -> scf::ValueVector {
        SmallVector<Value> coordinates;
        AffineMap affine = map.getMap();
        auto nextAny = anyCoordinates.begin();
        for (unsigned result = 0; result < affine.getNumResults(); ++result) {
          if (box[result].kind == BoxResult::Any) {
            coordinates.push_back(*nextAny++);
            continue;
          }
          coordinates.push_back(affine::AffineApplyOp::create(
              nested, loc, affine.getSubMap(result), tile));
        }
        Value element = addIndex(
            nested, loc, eventLayout.offset,
            linearize(nested, loc, coordinates, eventLayout.sizes));
        Value count =
            memref::LoadOp::create(nested, loc, function.counters, element);
        Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
        Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
        Value notReady = arith::CmpIOp::create(
            nested, loc, arith::CmpIPredicate::sgt, count, zero);
        Value increment =
            arith::SelectOp::create(nested, loc, notReady, one, zero);
        return {arith::AddIOp::create(nested, loc, counted[0], increment)};
      });
  return nest.results.front();
}

void DynamicScheduler::initPending(OpBuilder &b, ScheduledFunction &function,
                                   QueueLayout &layout) {
  for (auto [taskIndex, task] : llvm::enumerate(tasks)) {
    Location loc = task.getLoc();
    SmallVector<Value> extents = function.mapped(task.getGrid());
    SmallVector<Value> indexBuffers = function.mapped(task.getIndices());
    Value tiles = productIndex(b, loc, extents);
    Value offset = layout.taskOffsets[taskIndex];
    scf::ForOp::create(
        b, loc, constantIndex(b, loc, 0), tiles, constantIndex(b, loc, 1),
        ValueRange{},
        [&](OpBuilder &nested, Location loc, Value local, ValueRange) {
          SmallVector<Value> tile = delinearize(nested, loc, local, extents);
          Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
          Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
          Value pending = zero;
          // An element whose expected count is zero is ready already and
          // never notified: it does not count.
          for (auto [entry, event] : llvm::enumerate(task.getWaits())) {
            const EventLayout &eventLayout =
                function.events[event.getDefiningOp()];
            const WaitUse &use = waitUse(taskIndex, entry);
            IndexMapAttr map = task.getWaitMap(entry);
            if (use.box && llvm::any_of(*use.box, [](const BoxResult &box) {
                  return box.kind == BoxResult::Any;
                })) {
              pending = arith::AddIOp::create(
                  nested, loc, pending,
                  countWaitingOnAny(nested, loc, function, eventLayout, map,
                                    *use.box, tile));
              continue;
            }
            SmallVector<Value> coordinates =
                evaluateIndexMap(nested, loc, map, tile, indexBuffers);
            Value element = addIndex(
                nested, loc, eventLayout.offset,
                linearize(nested, loc, coordinates, eventLayout.sizes));
            Value count = memref::LoadOp::create(nested, loc,
                                                 function.counters, element);
            Value notReady = arith::CmpIOp::create(
                nested, loc, arith::CmpIPredicate::sgt, count, zero);
            pending = arith::AddIOp::create(
                nested, loc, pending,
                arith::SelectOp::create(nested, loc, notReady, one, zero));
          }
          Value id = addIndex(nested, loc, offset, local);
          memref::StoreOp::create(nested, loc, pending, function.counters,
                                  addIndex(nested, loc, layout.pending, id));
          Value ready = arith::CmpIOp::create(
              nested, loc, arith::CmpIPredicate::eq, pending, zero);
          scf::IfOp::create(nested, loc, ready, [&](OpBuilder &then,
                                                    Location loc) {
            QueuePushOp::create(then, loc, id, function.counters, layout.queue,
                                layout.totalTiles);
            scf::YieldOp::create(then, loc);
          });
          scf::YieldOp::create(nested, loc);
        });
  }
}

/// `@g_init(args, counters)`: expected counts, an empty queue, the inverse
/// indices, the pending counts, and the ready tiles pushed. Runs once,
/// single-threaded, before any worker starts.
void DynamicScheduler::buildInit(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_init", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  initEventCounters(b, function);
  zeroCounters(b, loc, function.counters, layout.queue, layout.pending);
  for (AllocOp alloc : indexedEvents)
    buildInverseIndex(b, function, layout, alloc);
  initPending(b, function, layout);
  func::ReturnOp::create(b, loc);
  dropUnusedPendingView(layout);
}

//===----------------------------------------------------------------------===//
// @g_worker
//===----------------------------------------------------------------------===//

void DynamicScheduler::readyTile(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 QueueLayout &layout, Value id) {
  Value last = NotifyReadyOp::create(b, loc, layout.pendingView, id);
  scf::IfOp::create(b, loc, last, [&](OpBuilder &then, Location loc) {
    QueuePushOp::create(then, loc, id, function.counters, layout.queue,
                        layout.totalTiles);
    scf::YieldOp::create(then, loc);
  });
}

void DynamicScheduler::readyWaiters(OpBuilder &b, Location loc,
                                    ScheduledFunction &function,
                                    QueueLayout &layout, AllocOp alloc,
                                    ValueRange coordinates) {
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  for (const WaitUse &use : waiters.lookup(alloc)) {
    if (!use.box)
      continue;
    TaskOp task = tasks[use.task];
    SmallVector<Value> extents = function.mapped(task.getGrid());
    SmallVector<Value> lower(task.getGridRank(), zero);
    SmallVector<Value> upper(extents);
    Value matches;
    for (auto [result, box] : llvm::enumerate(*use.box)) {
      Value coordinate = coordinates[result];
      if (box.kind == BoxResult::Any)
        continue;
      if (box.kind == BoxResult::Constant) {
        Value equal = arith::CmpIOp::create(
            b, loc, arith::CmpIPredicate::eq, coordinate,
            constantIndex(b, loc, box.value));
        matches = matches ? arith::AndIOp::create(b, loc, matches, equal)
                                .getResult()
                          : equal;
        continue;
      }
      // The tiles [c * M, c * M + M) along `dim`, inside the grid.
      Value extent = extents[box.dim];
      Value divisor = constantIndex(b, loc, box.value);
      Value first = mulIndex(b, loc, coordinate, divisor);
      lower[box.dim] = minIndex(b, loc, first, extent);
      upper[box.dim] =
          minIndex(b, loc, addIndex(b, loc, first, divisor), extent);
    }
    auto emitLoops = [&](OpBuilder &nested, Location loc) {
      SmallVector<Value> steps(task.getGridRank(), one);
      scf::buildLoopNest(
          nested, loc, lower, upper, steps,
          [&](OpBuilder &inner, Location loc, ValueRange tile) {
            Value id = addIndex(inner, loc, layout.taskOffsets[use.task],
                                linearize(inner, loc, tile, extents));
            readyTile(inner, loc, function, layout, id);
          });
    };
    if (!matches) {
      emitLoops(b, loc);
      continue;
    }
    scf::IfOp::create(b, loc, matches, [&](OpBuilder &then, Location loc) {
      emitLoops(then, loc);
      scf::YieldOp::create(then, loc);
    });
  }

  auto it = layout.inverse.find(alloc);
  if (it == layout.inverse.end())
    return;
  const InverseIndex &index = it->second;
  Value element = linearize(b, loc, coordinates, function.events[alloc].sizes);
  Value position = addIndex(b, loc, index.offsets, element);
  Value begin = loadIndex(b, loc, function.counters, position);
  Value end = loadIndex(b, loc, function.counters,
                        addIndex(b, loc, position, one));
  scf::ForOp::create(
      b, loc, begin, end, one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value entry, ValueRange) {
        Value id = loadIndex(nested, loc, function.counters,
                             addIndex(nested, loc, index.entries, entry));
        readyTile(nested, loc, function, layout, id);
        scf::YieldOp::create(nested, loc);
      });
}

void DynamicScheduler::runTile(OpBuilder &b, ScheduledFunction &function,
                               QueueLayout &layout, unsigned taskIndex,
                               Value id) {
  TaskOp task = tasks[taskIndex];
  Location loc = task.getLoc();
  SmallVector<Value> extents = function.mapped(task.getGrid());
  Value local = subIndex(b, loc, id, layout.taskOffsets[taskIndex]);
  SmallVector<Value> tile = delinearize(b, loc, local, extents);
  cloneBody(b, function, task, tile);
  SmallVector<Value> indexBuffers = function.mapped(task.getIndices());
  for (auto [entry, event] : llvm::enumerate(task.getNotifies())) {
    SmallVector<Value> coordinates = evaluateIndexMap(
        b, loc, task.getNotifyMap(entry), tile, indexBuffers);
    Value view = function.mapping.lookup(event);
    auto alloc = cast<AllocOp>(event.getDefiningOp());
    if (waiters.lookup(alloc).empty()) {
      NotifyOp::create(b, loc, view, coordinates);
      continue;
    }
    Value ready = NotifyReadyOp::create(b, loc, view, coordinates);
    scf::IfOp::create(b, loc, ready, [&](OpBuilder &then, Location loc) {
      readyWaiters(then, loc, function, layout, alloc, coordinates);
      scf::YieldOp::create(then, loc);
    });
  }
}

/// `@g_worker(args, counters)`: pops task ids until the queue is exhausted
/// and runs each in the task whose id range holds it.
void DynamicScheduler::buildWorker(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_worker", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Type index = b.getIndexType();
  scf::WhileOp::create(
      b, loc, TypeRange{index}, ValueRange{},
      [&](OpBuilder &before, Location loc, ValueRange) {
        Value id = QueuePopOp::create(before, loc, function.counters,
                                      layout.queue, layout.totalTiles);
        Value more = arith::CmpIOp::create(before, loc, arith::CmpIPredicate::ult,
                                           id, layout.totalTiles);
        scf::ConditionOp::create(before, loc, more, id);
      },
      [&](OpBuilder &after, Location loc, ValueRange arguments) {
        Value id = arguments[0];
        // if id < o_1 { task 0 } else if id < o_2 { task 1 } ... else
        // { last task }.
        std::function<void(OpBuilder &, unsigned)> dispatch =
            [&](OpBuilder &nested, unsigned taskIndex) {
              if (taskIndex + 1 == tasks.size()) {
                runTile(nested, function, layout, taskIndex, id);
                return;
              }
              Value inTask = arith::CmpIOp::create(
                  nested, loc, arith::CmpIPredicate::ult, id,
                  layout.taskOffsets[taskIndex + 1]);
              scf::IfOp::create(
                  nested, loc, inTask,
                  [&](OpBuilder &then, Location) {
                    runTile(then, function, layout, taskIndex, id);
                    scf::YieldOp::create(then, loc);
                  },
                  [&](OpBuilder &otherwise, Location) {
                    dispatch(otherwise, taskIndex + 1);
                    scf::YieldOp::create(otherwise, loc);
                  });
            };
        if (!tasks.empty())
          dispatch(after, 0);
        scf::YieldOp::create(after, loc);
      });
  func::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// @g_check
//===----------------------------------------------------------------------===//

/// `@g_check(args, counters) -> i32`: 1 when the queue overflowed, else 2
/// when an event counter or a pending count is not zero, else 0.
void DynamicScheduler::buildCheck(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_check", /*withCounters=*/true, builder.getI32Type(), layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Value errorFlag = memref::LoadOp::create(
      b, loc, function.counters,
      addIndex(b, loc, layout.queue, constantIndex(b, loc, queue::kErrorWord)));
  Value overflow = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ne, errorFlag,
      arith::ConstantIntOp::create(b, loc, 0, 32));
  Value eventsLeft = anyNonZero(b, loc, function, constantIndex(b, loc, 0),
                               function.eventCounters);
  Value pendingLeft =
      anyNonZero(b, loc, function, layout.pending,
                 addIndex(b, loc, layout.pending, layout.totalTiles));
  Value unbalanced = arith::OrIOp::create(b, loc, eventsLeft, pendingLeft);
  Value clean = arith::ConstantIntOp::create(b, loc, kClean, 32);
  Value overflowed = arith::ConstantIntOp::create(b, loc, kQueueOverflow, 32);
  Value notBalanced = arith::ConstantIntOp::create(b, loc, kUnbalanced, 32);
  Value balance =
      arith::SelectOp::create(b, loc, unbalanced, notBalanced, clean);
  Value status =
      arith::SelectOp::create(b, loc, overflow, overflowed, balance);
  func::ReturnOp::create(b, loc, status);
  dropUnusedPendingView(layout);
}

void DynamicScheduler::build(OpBuilder &builder) {
  buildCounters(builder);
  buildInit(builder);
  buildWorker(builder);
  buildCheck(builder);
}


//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

/// True when `graph`'s dependencies depend on runtime data: an event counted
/// on the device (no `count`) or an indirect wait or notify map.
static bool isDataDependent(GraphOp graph) {
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>())
    if (!alloc.getCount())
      return true;
  for (TaskOp task : graph.getBody().getOps<TaskOp>()) {
    for (unsigned entry = 0; entry < task.getWaits().size(); ++entry)
      if (task.getWaitMap(entry).hasIndirect())
        return true;
    for (unsigned entry = 0; entry < task.getNotifies().size(); ++entry)
      if (task.getNotifyMap(entry).hasIndirect())
        return true;
  }
  return false;
}

namespace {
struct EventDynamicSchedulePass
    : public etc::event::impl::EventDynamicScheduleBase<
          EventDynamicSchedulePass> {
  using EventDynamicScheduleBase::EventDynamicScheduleBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<std::pair<GraphOp, bool>> graphs;
    for (GraphOp graph : module.getOps<GraphOp>()) {
      if (failed(checkSchedule(graph, /*requireStaticOrder=*/false)))
        return signalPassFailure();
      bool dynamic = !autoSchedule || isDataDependent(graph);
      if (!dynamic) {
        // A regular graph whose textual order is no valid static order
        // still runs from the queue; the reason is not an error here.
        ScopedDiagnosticHandler silence(&getContext(),
                                        [](Diagnostic &) { return success(); });
        dynamic = failed(checkSchedule(graph, /*requireStaticOrder=*/true));
      }
      graphs.emplace_back(graph, dynamic);
    }
    if (failed(checkScheduleSymbolsFree(module, "event-dynamic-schedule")))
      return signalPassFailure();
    for (auto [graph, dynamic] : graphs) {
      OpBuilder builder(graph);
      if (dynamic)
        DynamicScheduler(graph, workers, forceIndex).build(builder);
      else
        buildStaticSchedule(builder, graph, workers);
      graph.erase();
    }
  }
};
} // namespace
