//===- DynamicSchedule.cpp - event-dynamic-schedule -----------------------===//
//
// Turns each L2 event graph into an L3 persistent program whose workers share
// one task queue in the counter buffer: a tile task is pushed when the last
// of its wait elements becomes ready, and any worker pops it. The whole
// scheduling logic (counts, pending counts, inverse indices, queue) is code
// of the program: nothing is prepared on the host.
//
//===----------------------------------------------------------------------===//

#include "GraphProgramBuilder.h"
#include "IndexArithmetic.h"
#include "StaticSchedule.h"

#include "Event/Transforms/CheckSchedule.h"
#include "Event/Transforms/Passes.h"
#include "Event/IR/QueueLayout.h"
#include "Event/IR/RunLayout.h"

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

/// How the waiters of wait entry `entry` of a family are found: in closed
/// form (`box`), or through the inverse index built in `@g_init`.
struct WaitKind {
  unsigned family;
  unsigned entry;
  std::optional<SmallVector<BoxResult>> box;
};

/// Where the scheduling state lives in the counter buffer, as values of the
/// function being built.
struct QueueLayout {
  Value totalTiles;
  /// The first word of the queue (header, then slots).
  Value queue;
  /// The first pending count, and the pending counts as an event tensor.
  Value pending;
  Value pendingView;
  /// The first global tile of each task, then the total (numTasks + 1).
  Value tileOffsets;
  /// When some task has live bounds: the word holding the number of live
  /// tiles, which `@g_init` counts.
  Value liveTiles;
  /// The inverse index, when some wait needs it: `eventCounters + 1`
  /// offsets (by counter position), then the waiting tile ids.
  Value indexOffsets;
  Value indexEntries;
  /// On several ranks, when some tile waits on a symmetric event: one
  /// *handled* flag per event counter, and the flags as an event tensor.
  Value handled;
  Value handledView;
  /// The size of the whole counter buffer.
  Value end;
};

/// Erases the pending-count view of a function that does not use it.
void dropUnusedPendingView(QueueLayout &layout) {
  if (layout.pendingView && layout.pendingView.use_empty())
    layout.pendingView.getDefiningOp()->erase();
  if (layout.handledView && layout.handledView.use_empty())
    layout.handledView.getDefiningOp()->erase();
}

/// Builds the tables and functions of one graph's dynamic schedule.
class DynamicScheduler : public GraphProgramBuilder {
public:
  DynamicScheduler(const GraphPlan &plan, int64_t workers, bool forceIndex,
                   bool trace);

  /// Inserts the constant tables, `@g_counters`, `@g_init`, `@g_worker` and
  /// `@g_check` at `builder`.
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

  /// Sets the handled flag of every element of the polled classes to
  /// whether it is still to arrive (`@g_init`).
  void initHandled(OpBuilder &b, ScheduledFunction &function,
                   QueueLayout &layout);
  /// The worker loop of a graph on several ranks: takes tiles with
  /// `event.queue_try_pop`, and polls the symmetric elements when the queue
  /// has nothing published.
  void buildPollingLoop(OpBuilder &b, Location loc,
                        ScheduledFunction &function, QueueLayout &layout);
  /// Scans every element of the polled classes; the worker that takes an
  /// arrived element's handled flag to zero readies its waiters. Returns
  /// whether it readied any element, then the first element still to
  /// arrive: its class (`polled.size()` when none), event number and
  /// linear position.
  SmallVector<Value> pollSymmetric(OpBuilder &b, Location loc,
                                   ScheduledFunction &function,
                                   QueueLayout &layout);
  /// `event.idle` of a worker that found nothing, naming the element
  /// `pollSymmetric` reported (when there is one). Returns the idle start.
  Value idle(OpBuilder &b, Location loc, ScheduledFunction &function,
             Value since, ValueRange site);

  /// The first global tile of task `task`.
  Value tileOffset(OpBuilder &b, Location loc, ScheduledFunction &function,
                   QueueLayout &layout, Value task);
  /// The task whose tile range holds global tile `id`: a binary search
  /// over the tile offsets.
  Value findTask(OpBuilder &b, Location loc, ScheduledFunction &function,
                 QueueLayout &layout, Value id);
  /// Calls `body(b, family, record, id, tile)` for every tile of every task,
  /// `id` its global tile id.
  void forEachTile(OpBuilder &b, Location loc, ScheduledFunction &function,
                   QueueLayout &layout,
                   function_ref<void(OpBuilder &, const TaskFamily &, Value,
                                     Value, ValueRange)>
                       body);
  /// Builds the inverse index in `@g_init`.
  void buildInverseIndex(OpBuilder &b, ScheduledFunction &function,
                         QueueLayout &layout);
  /// Calls `body(b, id, element)` for every tile and every wait entry that
  /// uses the inverse index; `element` is the counter position of its wait
  /// element.
  void forEachIndexedWait(OpBuilder &b, ScheduledFunction &function,
                          QueueLayout &layout,
                          function_ref<void(OpBuilder &, Location, Value, Value)>
                              body);
  /// The number of not yet ready elements a tile waits on through a wait
  /// entry with `Any` results: every coordinate there, the others evaluated.
  Value countWaitingOnAny(OpBuilder &b, Location loc,
                          ScheduledFunction &function, unsigned classIndex,
                          Value eventBase, IndexMapAttr map,
                          ArrayRef<BoxResult> box, ValueRange tile);
  /// Sets every tile's pending count and pushes the ready tiles (`@g_init`).
  void initPending(OpBuilder &b, ScheduledFunction &function,
                   QueueLayout &layout);
  /// Sets the pending count of live tile `tile` (global id `id`) of a task
  /// of `family` and pushes it when it is ready.
  void initTilePending(OpBuilder &b, ScheduledFunction &function,
                       QueueLayout &layout, const TaskFamily &family,
                       Value record, Value id, ValueRange tile);
  /// Counts the live tiles of all tasks into counter `word` (`@g_init`).
  void countLiveTiles(OpBuilder &b, Location loc, ScheduledFunction &function,
                      Value word);
  /// Counts the live tiles into `layout.liveTiles` and publishes the end
  /// marker in every queue slot no live tile will use (`@g_init`).
  void initLiveTiles(OpBuilder &b, ScheduledFunction &function,
                     QueueLayout &layout);

  /// Emits the tile with global id `id` of task `task`: the body, then the
  /// notifies.
  void runTile(OpBuilder &b, Location loc, ScheduledFunction &function,
               QueueLayout &layout, Value task, Value id);
  /// Emits the code that readies the waiters of element `coordinates` of
  /// the event numbered `number` (class `classIndex`, first counter
  /// `eventBase`), run by the notifier that took it to zero. Every lane of
  /// the worker runs it, and the waiting tiles are spread over the lanes:
  /// lane l readies waiters l, l + lanes, ... of each closed-form box and
  /// of the element's inverse-index row.
  void readyWaiters(OpBuilder &b, Location loc, ScheduledFunction &function,
                    QueueLayout &layout, unsigned classIndex, Value number,
                    Value eventBase, ValueRange coordinates);
  /// Decrements the pending count of tile `id`, pushing it when it is the
  /// last: the calling lane's own (`per_lane`) decrement and push.
  void readyTile(OpBuilder &b, Location loc, ScheduledFunction &function,
                 QueueLayout &layout, Value id);

  const WaitKind &kindOf(unsigned family, unsigned entry) const {
    return kinds[firstKind[family] + entry];
  }
  unsigned waitClassOf(const WaitKind &kind) const {
    return plan.families[kind.family].waitClasses[kind.entry];
  }

  /// The wait kinds, family by family, entry by entry.
  SmallVector<WaitKind> kinds;
  SmallVector<unsigned> firstKind;
  /// The closed-form kinds, numbered for the waiter tables.
  SmallVector<unsigned> boxKinds;
  /// For each event number, its waiting (task, box kind) pairs, CSR.
  SmallVector<int32_t> waiterOffsets, waiterTasks, waiterKinds;
  /// Per class: whether some wait entry waits on it in closed form, through
  /// the inverse index.
  SmallVector<bool> classHasBoxWaiters, classHasIndexedWaiters;
  /// Whether any wait uses the inverse index.
  bool anyIndexed = false;
  /// Whether some task has live bounds, so that fewer tiles than the grids
  /// hold run.
  bool anyLive = false;
  /// The symmetric classes some tile waits on (a graph on several ranks):
  /// their elements are readied by polling (`pollSymmetric`).
  SmallVector<unsigned> polled;
  /// For each event number, the first task that waits on it, or -1, and
  /// the closed-form kind (numbered as in `boxKinds`) of that wait, or -1.
  SmallVector<int32_t> firstWaiter, firstWaiterKind;
};
} // namespace

DynamicScheduler::DynamicScheduler(const GraphPlan &plan, int64_t workers,
                                   bool forceIndex, bool trace)
    : GraphProgramBuilder(plan, "dynamic", workers, trace) {
  anyLive = llvm::any_of(plan.families, [](const TaskFamily &family) {
    return family.isPredicated();
  });
  // Index buffers some task writes hold their values only once that task
  // ran, so `@g_init` cannot evaluate indirect waits through them.
  llvm::SmallDenseSet<Value> written;
  for (TaskOp task : tasks)
    written.insert(task.getWrites().begin(), task.getWrites().end());
  classHasBoxWaiters.assign(plan.classes.size(), false);
  classHasIndexedWaiters.assign(plan.classes.size(), false);
  SmallVector<int> boxNumber;
  for (auto [familyIndex, family] : llvm::enumerate(plan.families)) {
    firstKind.push_back(kinds.size());
    TaskOp task = family.representative;
    for (unsigned entry = 0; entry < family.waitClasses.size(); ++entry) {
      WaitKind kind{static_cast<unsigned>(familyIndex), entry, std::nullopt};
      IndexMapAttr map = task.getWaitMap(entry);
      bool runtimeIndices = llvm::any_of(map.getIndirect(), [&](int64_t k) {
        return k >= 0 && written.contains(task.getIndices()[k]);
      });
      if (runtimeIndices)
        kind.box = closedForm(map, /*anyIndirect=*/true);
      else if (!forceIndex)
        kind.box = closedForm(map, /*anyIndirect=*/false);
      unsigned classIndex = family.waitClasses[entry];
      if (kind.box) {
        classHasBoxWaiters[classIndex] = true;
        boxNumber.push_back(boxKinds.size());
        boxKinds.push_back(kinds.size());
      } else {
        classHasIndexedWaiters[classIndex] = true;
        anyIndexed = true;
        boxNumber.push_back(-1);
      }
      kinds.push_back(std::move(kind));
    }
  }

  // The waiter tables: for each event, the (task, box kind) pairs waiting on
  // it in closed form, in task order.
  SmallVector<SmallVector<std::pair<int32_t, int32_t>>> byEvent(
      plan.numEvents());
  for (unsigned taskIndex = 0; taskIndex < tasks.size(); ++taskIndex) {
    unsigned familyIndex = plan.taskFamily[taskIndex];
    TaskOp task = tasks[taskIndex];
    for (auto [entry, event] : llvm::enumerate(task.getWaits())) {
      int number = boxNumber[firstKind[familyIndex] + entry];
      if (number < 0)
        continue;
      byEvent[plan.eventNumber(cast<AllocOp>(event.getDefiningOp()))]
          .push_back({static_cast<int32_t>(taskIndex), number});
    }
  }
  firstWaiter.assign(plan.numEvents(), -1);
  firstWaiterKind.assign(plan.numEvents(), -1);
  for (unsigned taskIndex = 0; taskIndex < tasks.size(); ++taskIndex)
    for (auto [entry, event] : llvm::enumerate(tasks[taskIndex].getWaits())) {
      int64_t number = plan.eventNumber(cast<AllocOp>(event.getDefiningOp()));
      if (firstWaiter[number] >= 0)
        continue;
      firstWaiter[number] = taskIndex;
      firstWaiterKind[number] =
          boxNumber[firstKind[plan.taskFamily[taskIndex]] + entry];
    }
  if (graph.getRanksAttr())
    for (unsigned c = 0; c < plan.classes.size(); ++c)
      if (plan.classes[c].type.getSymmetric() &&
          (classHasBoxWaiters[c] || classHasIndexedWaiters[c]))
        polled.push_back(c);

  waiterOffsets.push_back(0);
  for (const auto &waiters : byEvent) {
    for (auto [task, kind] : waiters) {
      waiterTasks.push_back(task);
      waiterKinds.push_back(kind);
    }
    waiterOffsets.push_back(waiterTasks.size());
  }
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
  layout.totalTiles = totalTiles(b, loc, function);
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
  layout.tileOffsets = addIndex(b, loc, layout.pending, layout.totalTiles);
  layout.end = addIndex(b, loc, layout.tileOffsets,
                        constantIndex(b, loc, tasks.size() + 1));
  if (anyLive) {
    layout.liveTiles = layout.end;
    layout.end = addIndex(b, loc, layout.end, constantIndex(b, loc, 1));
  }
  if (anyIndexed) {
    layout.indexOffsets = layout.end;
    layout.indexEntries =
        addIndex(b, loc, layout.indexOffsets,
                 addIndex(b, loc, function.eventCounters,
                          constantIndex(b, loc, 1)));
    Value entries = constantIndex(b, loc, 0);
    for (auto [familyIndex, family] : llvm::enumerate(plan.families)) {
      int64_t indexed = 0;
      for (unsigned entry = 0; entry < family.waitClasses.size(); ++entry)
        indexed += !kindOf(familyIndex, entry).box;
      if (!indexed)
        continue;
      entries = addIndex(
          b, loc, entries,
          mulIndex(b, loc,
                   constantIndex(b, loc, indexed * family.members.size()),
                   tilesOf(b, loc, function, family)));
    }
    layout.end = addIndex(b, loc, layout.indexEntries, entries);
  }
  if (!polled.empty()) {
    layout.handled = layout.end;
    layout.end = addIndex(b, loc, layout.handled, function.eventCounters);
    if (withCounters)
      layout.handledView = ViewOp::create(
          b, loc,
          EventTensorType::get(graph.getContext(), {ShapedType::kDynamic}),
          function.counters, layout.handled,
          ValueRange{function.eventCounters});
  }
  return function;
}

//===----------------------------------------------------------------------===//
// @g_counters and @g_init
//===----------------------------------------------------------------------===//

/// `@g_counters(symbols, table) -> index`: the size of the counter buffer.
void DynamicScheduler::buildCounters(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function =
      createFunction(builder, "_counters", /*withCounters=*/false,
                     builder.getIndexType(), layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(b, loc, bufferSize(b, loc, function, layout.end));
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

Value DynamicScheduler::tileOffset(OpBuilder &b, Location loc,
                                   ScheduledFunction &function,
                                   QueueLayout &layout, Value task) {
  return loadIndex(b, loc, function.counters,
                   addIndex(b, loc, layout.tileOffsets, task));
}

Value DynamicScheduler::findTask(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 QueueLayout &layout, Value id) {
  Type index = b.getIndexType();
  // The last task k with tileOffsets[k] <= id: keep lo <= k < hi.
  auto search = scf::WhileOp::create(
      b, loc, TypeRange{index, index},
      ValueRange{constantIndex(b, loc, 0), constantIndex(b, loc, tasks.size())},
      [&](OpBuilder &before, Location loc, ValueRange bounds) {
        Value width = subIndex(before, loc, bounds[1], bounds[0]);
        Value more =
            arith::CmpIOp::create(before, loc, arith::CmpIPredicate::ugt,
                                  width, constantIndex(before, loc, 1));
        scf::ConditionOp::create(before, loc, more, bounds);
      },
      [&](OpBuilder &body, Location loc, ValueRange bounds) {
        Value middle =
            divIndex(body, loc, addIndex(body, loc, bounds[0], bounds[1]),
                     constantIndex(body, loc, 2));
        Value start = tileOffset(body, loc, function, layout, middle);
        Value atOrAfter = arith::CmpIOp::create(
            body, loc, arith::CmpIPredicate::ule, start, id);
        Value lo =
            arith::SelectOp::create(body, loc, atOrAfter, middle, bounds[0]);
        Value hi =
            arith::SelectOp::create(body, loc, atOrAfter, bounds[1], middle);
        scf::YieldOp::create(body, loc, ValueRange{lo, hi});
      });
  return search.getResult(0);
}

void DynamicScheduler::forEachTile(
    OpBuilder &b, Location loc, ScheduledFunction &function,
    QueueLayout &layout,
    function_ref<void(OpBuilder &, const TaskFamily &, Value, Value, ValueRange)>
        body) {
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    Value offset = tileOffset(nested, loc, function, layout, task);
    switchOnFamily(
        nested, loc, function, task, TypeRange{},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value record) -> SmallVector<Value> {
          SmallVector<Value> extents = gridOf(function, family);
          scf::ForOp::create(
              cb, loc, constantIndex(cb, loc, 0),
              productIndex(cb, loc, extents), constantIndex(cb, loc, 1),
              ValueRange{},
              [&](OpBuilder &lb, Location loc, Value local, ValueRange) {
                SmallVector<Value> tile = delinearize(lb, loc, local, extents);
                // Dead tiles are never queued, waited for or indexed.
                ifLive(lb, loc, function, family, record, tile,
                       [&](OpBuilder &live) {
                         body(live, family, record,
                              addIndex(live, loc, offset, local), tile);
                       });
                scf::YieldOp::create(lb, loc);
              });
          return {};
        });
  });
}

void DynamicScheduler::forEachIndexedWait(
    OpBuilder &b, ScheduledFunction &function, QueueLayout &layout,
    function_ref<void(OpBuilder &, Location, Value, Value)> body) {
  Location loc = graph.getLoc();
  forEachTile(b, loc, function, layout,
              [&](OpBuilder &nested, const TaskFamily &family, Value record,
                  Value id, ValueRange tile) {
                unsigned familyIndex = &family - plan.families.data();
                for (unsigned entry = 0; entry < family.waitClasses.size();
                     ++entry) {
                  if (kindOf(familyIndex, entry).box)
                    continue;
                  EntryEvent event = entryEvent(nested, loc, function, family,
                                                record, entry, /*notify=*/false);
                  SmallVector<Value> coordinates = entryCoordinates(
                      nested, loc, function, family, record, entry,
                      /*notify=*/false, tile);
                  Value element = addIndex(
                      nested, loc, event.base,
                      linearize(nested, loc, coordinates,
                                function.classes[event.classIndex].sizes));
                  body(nested, loc, id, element);
                }
              });
}

/// Counting sort of the indexed waiting tiles by counter position: count
/// into `offsets[p + 1]`, prefix sum, fill while advancing `offsets[p]`
/// (which then holds the end of p's entries), and shift the offsets back.
void DynamicScheduler::buildInverseIndex(OpBuilder &b,
                                         ScheduledFunction &function,
                                         QueueLayout &layout) {
  Location loc = graph.getLoc();
  Value counters = function.counters;
  Value numElements = function.eventCounters;
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  zeroCounters(b, loc, counters, layout.indexOffsets, layout.indexEntries);

  forEachIndexedWait(
      b, function, layout,
      [&](OpBuilder &nested, Location loc, Value, Value element) {
        Value position = addIndex(nested, loc, layout.indexOffsets,
                                  addIndex(nested, loc, element, one));
        Value count = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, count, one), counters,
                   position);
      });

  // offsets[p] += offsets[p - 1] for p in [1, numElements].
  scf::ForOp::create(
      b, loc, one, addIndex(b, loc, numElements, one), one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value element, ValueRange) {
        Value position = addIndex(nested, loc, layout.indexOffsets, element);
        Value previous = loadIndex(nested, loc, counters,
                                   subIndex(nested, loc, position, one));
        Value current = loadIndex(nested, loc, counters, position);
        storeIndex(nested, loc, addIndex(nested, loc, previous, current),
                   counters, position);
        scf::YieldOp::create(nested, loc);
      });

  forEachIndexedWait(
      b, function, layout,
      [&](OpBuilder &nested, Location loc, Value id, Value element) {
        Value cursor = addIndex(nested, loc, layout.indexOffsets, element);
        Value slot = loadIndex(nested, loc, counters, cursor);
        storeIndex(nested, loc, id, counters,
                   addIndex(nested, loc, layout.indexEntries, slot));
        storeIndex(nested, loc, addIndex(nested, loc, slot, one), counters,
                   cursor);
      });

  // offsets[p] = offsets[p - 1] for p from numElements down to 1; then
  // offsets[0] = 0.
  scf::ForOp::create(
      b, loc, zero, numElements, one, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value step, ValueRange) {
        Value element = subIndex(nested, loc, numElements, step);
        Value position = addIndex(nested, loc, layout.indexOffsets, element);
        Value previous = memref::LoadOp::create(
            nested, loc, counters, subIndex(nested, loc, position, one));
        memref::StoreOp::create(nested, loc, previous, counters, position);
        scf::YieldOp::create(nested, loc);
      });
  memref::StoreOp::create(b, loc, arith::ConstantIntOp::create(b, loc, 0, 32),
                          counters, layout.indexOffsets);
}

Value DynamicScheduler::countWaitingOnAny(OpBuilder &b, Location loc,
                                         ScheduledFunction &function,
                                         unsigned classIndex, Value eventBase,
                                         IndexMapAttr map,
                                         ArrayRef<BoxResult> box,
                                         ValueRange tile) {
  const ClassLayout &eventLayout = function.classes[classIndex];
  SmallVector<Value> lower, upper, steps;
  for (auto [result, part] : llvm::enumerate(box)) {
    if (part.kind != BoxResult::Any)
      continue;
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
        Value element =
            addIndex(nested, loc, eventBase,
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
  Location loc = graph.getLoc();
  if (tasks.empty())
    return;
  // One loop over the global tile ids, each finding its task: its
  // iterations are independent (each writes its own pending count and
  // pushes its own tile), so the GPU spreads them over a CTA's threads.
  auto loop = scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), layout.totalTiles,
      constantIndex(b, loc, 1), ValueRange{},
      [&](OpBuilder &lb, Location loc, Value id, ValueRange) {
        Value task = findTask(lb, loc, function, layout, id);
        Value local =
            subIndex(lb, loc, id, tileOffset(lb, loc, function, layout, task));
        switchOnFamily(
            lb, loc, function, task, TypeRange{},
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              SmallVector<Value> tile =
                  delinearize(cb, loc, local, gridOf(function, family));
              // Dead tiles are never queued.
              ifLive(cb, loc, function, family, record, tile,
                     [&](OpBuilder &live) {
                       initTilePending(live, function, layout, family, record,
                                       id, tile);
                     });
              return {};
            });
        scf::YieldOp::create(lb, loc);
      });
  loop->setAttr(kIndependentIterationsAttrName, b.getUnitAttr());
}

void DynamicScheduler::initTilePending(OpBuilder &nested,
                                       ScheduledFunction &function,
                                       QueueLayout &layout,
                                       const TaskFamily &family, Value record,
                                       Value id, ValueRange tile) {
  Location loc = graph.getLoc();
  unsigned familyIndex = &family - plan.families.data();
  Value zero = arith::ConstantIntOp::create(nested, loc, 0, 32);
  Value one = arith::ConstantIntOp::create(nested, loc, 1, 32);
  Value pending = zero;
  // An element whose expected count is zero is ready already and
  // never notified: it does not count.
  for (unsigned entry = 0; entry < family.waitClasses.size(); ++entry) {
    const WaitKind &kind = kindOf(familyIndex, entry);
    EntryEvent event = entryEvent(nested, loc, function, family, record,
                                  entry, /*notify=*/false);
    IndexMapAttr map = family.representative.getWaitMap(entry);
    if (kind.box && llvm::any_of(*kind.box, [](const BoxResult &box) {
          return box.kind == BoxResult::Any;
        })) {
      pending = arith::AddIOp::create(
          nested, loc, pending,
          countWaitingOnAny(nested, loc, function, event.classIndex,
                            event.base, map, *kind.box, tile));
      continue;
    }
    SmallVector<Value> coordinates = entryCoordinates(
        nested, loc, function, family, record, entry, /*notify=*/false,
        tile);
    Value element = addIndex(
        nested, loc, event.base,
        linearize(nested, loc, coordinates,
                  function.classes[event.classIndex].sizes));
    Value count =
        memref::LoadOp::create(nested, loc, function.counters, element);
    Value notReady = arith::CmpIOp::create(
        nested, loc, arith::CmpIPredicate::sgt, count, zero);
    pending = arith::AddIOp::create(
        nested, loc, pending,
        arith::SelectOp::create(nested, loc, notReady, one, zero));
  }
  memref::StoreOp::create(nested, loc, pending, function.counters,
                          addIndex(nested, loc, layout.pending, id));
  Value ready = arith::CmpIOp::create(
      nested, loc, arith::CmpIPredicate::eq, pending, zero);
  scf::IfOp::create(nested, loc, ready, [&](OpBuilder &then,
                                            Location loc) {
    QueuePushOp::create(then, loc, id, function.counters, layout.queue,
                        layout.totalTiles)
        .setPerLane(true);
    scf::YieldOp::create(then, loc);
  });
}

void DynamicScheduler::countLiveTiles(OpBuilder &b, Location loc,
                                     ScheduledFunction &function,
                                     Value word) {
  // Counted in place rather than carried through loop results: the GPU
  // initialisation kernel runs every write on one thread, and a loop that
  // writes and has results could not.
  storeIndex(b, loc, constantIndex(b, loc, 0), function.counters, word);
  auto add = [&](OpBuilder &nested, Value amount) {
    Value total = loadIndex(nested, loc, function.counters, word);
    storeIndex(nested, loc, addIndex(nested, loc, total, amount),
               function.counters, word);
  };
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    switchOnFamily(
        nested, loc, function, task, TypeRange{},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value record) -> SmallVector<Value> {
          if (!family.isPredicated()) {
            add(cb, tilesOf(cb, loc, function, family));
            return {};
          }
          SmallVector<Value> extents = gridOf(function, family);
          SmallVector<Value> zeros(extents.size(), constantIndex(cb, loc, 0));
          SmallVector<Value> ones(extents.size(), constantIndex(cb, loc, 1));
          scf::buildLoopNest(
              cb, loc, zeros, extents, ones,
              [&](OpBuilder &lb, Location, ValueRange tile) {
                ifLive(lb, loc, function, family, record, tile,
                       [&](OpBuilder &live) {
                         add(live, constantIndex(live, loc, 1));
                       });
              });
          return {};
        });
  });
}

/// Queue slots are claimed in order, one per pushed tile, and only live
/// tiles are pushed, so slots [live, total) are never filled by a push: a
/// worker that claims one would wait forever. Each holds `total + 1` from
/// the start instead, which a pop returns as tile id `total`, the id that
/// ends the worker loop, exactly as a pop past the capacity does. The
/// queue keeps its closed-form capacity and protocol.
void DynamicScheduler::initLiveTiles(OpBuilder &b, ScheduledFunction &function,
                                     QueueLayout &layout) {
  Location loc = graph.getLoc();
  countLiveTiles(b, loc, function, layout.liveTiles);
  Value live = loadIndex(b, loc, function.counters, layout.liveTiles);
  Value slots = addIndex(b, loc, layout.queue,
                         constantIndex(b, loc, queue::kHeaderWords));
  Value endMarker = arith::IndexCastOp::create(
      b, loc, b.getI32Type(),
      addIndex(b, loc, layout.totalTiles, constantIndex(b, loc, 1)));
  scf::ForOp::create(
      b, loc, addIndex(b, loc, slots, live),
      addIndex(b, loc, slots, layout.totalTiles), constantIndex(b, loc, 1),
      ValueRange{},
      [&](OpBuilder &nested, Location loc, Value position, ValueRange) {
        memref::StoreOp::create(nested, loc, endMarker, function.counters,
                                position);
        scf::YieldOp::create(nested, loc);
      });
}

/// `@g_init(symbols, table, counters)`: expected counts, an empty queue, the
/// tile offsets, the inverse index, the pending counts, and the ready tiles
/// pushed. With live bounds, also the live tile count and the end markers
/// of the slots dead tiles leave unused. Runs once before any worker
/// starts; only the pending-count loop may run on several lanes (it is
/// `event.independent`).
void DynamicScheduler::buildInit(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_init", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  initRunHeader(b, loc, function, layout.end);
  initEventCounters(b, function);
  zeroCounters(b, loc, function.counters, layout.queue, layout.pending);
  if (anyLive) {
    // Dead tiles get no pending count of their own; `@g_check` reads them.
    zeroCounters(b, loc, function.counters, layout.pending,
                 layout.tileOffsets);
    initLiveTiles(b, function, layout);
  }
  // tileOffsets[0] = 0, tileOffsets[k + 1] = tileOffsets[k] + tiles of k.
  storeIndex(b, loc, constantIndex(b, loc, 0), function.counters,
             layout.tileOffsets);
  forEachTask(b, loc, [&](OpBuilder &nested, Value task) {
    ValueRange tiles = switchOnFamily(
        nested, loc, function, task, TypeRange{nested.getIndexType()},
        [&](OpBuilder &cb, const TaskFamily &family,
            Value) -> SmallVector<Value> {
          return {tilesOf(cb, loc, function, family)};
        });
    Value offset = tileOffset(nested, loc, function, layout, task);
    storeIndex(nested, loc, addIndex(nested, loc, offset, tiles[0]),
               function.counters,
               addIndex(nested, loc, layout.tileOffsets,
                        addIndex(nested, loc, task, constantIndex(nested, loc, 1))));
  });
  if (anyIndexed)
    buildInverseIndex(b, function, layout);
  if (!polled.empty())
    initHandled(b, function, layout);
  initPending(b, function, layout);
  func::ReturnOp::create(b, loc);
  dropUnusedPendingView(layout);
}

/// Every rank's counters hold their expected counts before any rank runs a
/// tile (the runtime meets after `@g_init`), so an element whose counter is
/// positive here is still to arrive; one that is not (count 0) is ready and
/// counted so by the pending counts: it is never handled.
void DynamicScheduler::initHandled(OpBuilder &b, ScheduledFunction &function,
                                   QueueLayout &layout) {
  Location loc = graph.getLoc();
  zeroCounters(b, loc, function.counters, layout.handled,
               addIndex(b, loc, layout.handled, function.eventCounters));
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
  for (unsigned classIndex : polled) {
    const ClassLayout &classLayout = function.classes[classIndex];
    Value end = addIndex(
        b, loc, classLayout.base,
        mulIndex(b, loc, classLayout.numElements,
                 constantIndex(b, loc,
                               plan.classes[classIndex].instances.size())));
    scf::ForOp::create(
        b, loc, classLayout.base, end, constantIndex(b, loc, 1), ValueRange{},
        [&](OpBuilder &nested, Location loc, Value position, ValueRange) {
          Value count =
              memref::LoadOp::create(nested, loc, function.counters, position);
          Value waiting = arith::CmpIOp::create(
              nested, loc, arith::CmpIPredicate::sgt, count, zero);
          Value flag = arith::ExtUIOp::create(nested, loc,
                                              nested.getI32Type(), waiting);
          memref::StoreOp::create(
              nested, loc, flag, function.counters,
              addIndex(nested, loc, layout.handled, position));
          scf::YieldOp::create(nested, loc);
        });
  }
}

//===----------------------------------------------------------------------===//
// @g_worker
//===----------------------------------------------------------------------===//

void DynamicScheduler::readyTile(OpBuilder &b, Location loc,
                                 ScheduledFunction &function,
                                 QueueLayout &layout, Value id) {
  auto notify = NotifyReadyOp::create(b, loc, layout.pendingView, id);
  notify.setPerLane(true);
  scf::IfOp::create(b, loc, notify.getReady(), [&](OpBuilder &then,
                                                   Location loc) {
    auto push = QueuePushOp::create(then, loc, id, function.counters,
                                    layout.queue, layout.totalTiles);
    push.setPerLane(true);
    scf::YieldOp::create(then, loc);
  });
}

void DynamicScheduler::readyWaiters(OpBuilder &b, Location loc,
                                    ScheduledFunction &function,
                                    QueueLayout &layout, unsigned classIndex,
                                    Value number, Value eventBase,
                                    ValueRange coordinates) {
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  if (classHasBoxWaiters[classIndex]) {
    Value offsets =
        constantTable(function, "_waiter_offsets", waiterOffsets.size());
    Value waiterTaskTable =
        constantTable(function, "_waiter_tasks", waiterTasks.size());
    Value waiterKindTable =
        constantTable(function, "_waiter_kinds", waiterKinds.size());
    Value begin = loadConstant(b, loc, offsets, number);
    Value end = loadConstant(b, loc, offsets, addIndex(b, loc, number, one));
    scf::ForOp::create(
        b, loc, begin, end, one, ValueRange{},
        [&](OpBuilder &nested, Location loc, Value waiter, ValueRange) {
          Value task = loadConstant(nested, loc, waiterTaskTable, waiter);
          Value kindNumber = loadConstant(nested, loc, waiterKindTable, waiter);
          Value taskOffset = tileOffset(nested, loc, function, layout, task);
          // One case per closed-form kind that waits on this class; the
          // default is unreachable.
          SmallVector<int64_t> cases;
          for (auto [number, kindIndex] : llvm::enumerate(boxKinds))
            if (waitClassOf(kinds[kindIndex]) == classIndex)
              cases.push_back(number);
          auto switchOp = scf::IndexSwitchOp::create(
              nested, loc, TypeRange{}, kindNumber, cases, cases.size());
          auto fill = [&](Region &region, const WaitKind &kind) {
            OpBuilder::InsertionGuard guard(nested);
            nested.createBlock(&region);
            const TaskFamily &family = plan.families[kind.family];
            SmallVector<Value> extents = gridOf(function, family);
            SmallVector<Value> lower(extents.size(), zero);
            SmallVector<Value> upper(extents);
            Value matches;
            for (auto [result, box] : llvm::enumerate(*kind.box)) {
              Value coordinate = coordinates[result];
              if (box.kind == BoxResult::Any)
                continue;
              if (box.kind == BoxResult::Constant) {
                Value equal = arith::CmpIOp::create(
                    nested, loc, arith::CmpIPredicate::eq, coordinate,
                    constantIndex(nested, loc, box.value));
                matches = matches ? arith::AndIOp::create(nested, loc, matches,
                                                          equal)
                                        .getResult()
                                  : equal;
                continue;
              }
              // The tiles [c * M, c * M + M) along `dim`, inside the grid.
              Value extent = extents[box.dim];
              Value divisor = constantIndex(nested, loc, box.value);
              Value first = mulIndex(nested, loc, coordinate, divisor);
              lower[box.dim] = minIndex(nested, loc, first, extent);
              upper[box.dim] = minIndex(
                  nested, loc, addIndex(nested, loc, first, divisor), extent);
            }
            auto emitLoops = [&](OpBuilder &lb, Location loc) {
              Value record;
              if (family.isPredicated()) {
                useTaskTables(function);
                record = loadConstant(lb, loc, function.taskRecord, task);
              }
              // The box, row-major, spread over the lanes.
              SmallVector<Value> sizes;
              for (auto [low, high] : llvm::zip(lower, upper))
                sizes.push_back(subIndex(lb, loc, high, low));
              Value count = productIndex(lb, loc, sizes);
              Value lane = LaneIdOp::create(lb, loc);
              Value lanes = LaneCountOp::create(lb, loc);
              scf::ForOp::create(
                  lb, loc, lane, count, lanes, ValueRange{},
                  [&](OpBuilder &inner, Location loc, Value position,
                      ValueRange) {
                    SmallVector<Value> tile;
                    for (auto [low, offset] : llvm::zip(
                             lower, delinearize(inner, loc, position, sizes)))
                      tile.push_back(addIndex(inner, loc, low, offset));
                    // A dead waiting tile has no pending count to take.
                    ifLive(inner, loc, function, family, record, tile,
                           [&](OpBuilder &live) {
                             Value id = addIndex(
                                 live, loc, taskOffset,
                                 linearize(live, loc, tile, extents));
                             readyTile(live, loc, function, layout, id);
                           });
                    scf::YieldOp::create(inner, loc);
                  });
            };
            if (!matches) {
              emitLoops(nested, loc);
            } else {
              scf::IfOp::create(nested, loc, matches,
                                [&](OpBuilder &then, Location loc) {
                                  emitLoops(then, loc);
                                  scf::YieldOp::create(then, loc);
                                });
            }
            scf::YieldOp::create(nested, loc);
          };
          for (auto [region, number] :
               llvm::zip(switchOp.getCaseRegions(), cases))
            fill(region, kinds[boxKinds[number]]);
          {
            OpBuilder::InsertionGuard guard(nested);
            nested.createBlock(&switchOp.getDefaultRegion());
            scf::YieldOp::create(nested, loc);
          }
          scf::YieldOp::create(nested, loc);
        });
  }

  if (!classHasIndexedWaiters[classIndex])
    return;
  Value element = addIndex(
      b, loc, eventBase,
      linearize(b, loc, coordinates, function.classes[classIndex].sizes));
  Value position = addIndex(b, loc, layout.indexOffsets, element);
  Value begin = loadIndex(b, loc, function.counters, position);
  Value end = loadIndex(b, loc, function.counters,
                        addIndex(b, loc, position, one));
  Value lane = LaneIdOp::create(b, loc);
  Value lanes = LaneCountOp::create(b, loc);
  scf::ForOp::create(
      b, loc, addIndex(b, loc, begin, lane), end, lanes, ValueRange{},
      [&](OpBuilder &nested, Location loc, Value entry, ValueRange) {
        Value id = loadIndex(nested, loc, function.counters,
                             addIndex(nested, loc, layout.indexEntries, entry));
        readyTile(nested, loc, function, layout, id);
        scf::YieldOp::create(nested, loc);
      });
}

void DynamicScheduler::runTile(OpBuilder &b, Location loc,
                               ScheduledFunction &function,
                               QueueLayout &layout, Value task, Value id) {
  Value local = subIndex(b, loc, id, tileOffset(b, loc, function, layout, task));
  auto tileOf = [&](OpBuilder &nested, const TaskFamily &family) {
    return delinearize(nested, loc, local, gridOf(function, family));
  };
  switchOnFamily(b, loc, function, task, TypeRange{},
                 [&](OpBuilder &cb, const TaskFamily &family,
                     Value record) -> SmallVector<Value> {
                   // A popped tile is ready: it has no waits, so nothing to
                   // skip; its notifies follow, once per event class.
                   emitTileWork(cb, loc, function, family, record, task,
                                tileOf(cb, family), id, layout.end,
                                /*afterWaits=*/false, [&](OpBuilder &nb) {
                                  if (!family.notifyClasses.empty())
                                    ReleaseOp::create(nb, loc);
                                });
                   return {};
                 });

  // The notifies, one entry per iteration. A family's case notifies its
  // entry and reports the element when it became ready; the code that
  // readies an element's waiters then exists once per event class, not
  // once per notify site of every family (which made the worker, and
  // LLVM's time on it, several times larger).
  size_t maxEntries = 0;
  for (const TaskFamily &family : plan.families)
    maxEntries = std::max(maxEntries, family.notifyClasses.size());
  if (maxEntries == 0)
    return;
  Type i1 = b.getI1Type(), index = b.getIndexType();
  SmallVector<Type> reported = {i1, index, index, index, index};
  scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), constantIndex(b, loc, maxEntries),
      constantIndex(b, loc, 1), ValueRange{},
      [&](OpBuilder &lb, Location loc, Value entry, ValueRange) {
        auto nothing = [&](OpBuilder &nb) -> SmallVector<Value> {
          Value zero = constantIndex(nb, loc, 0);
          return {arith::ConstantIntOp::create(nb, loc, 0, 1), zero, zero, zero,
                  zero};
        };
        ValueRange ready = switchOnFamily(
            lb, loc, function, task, reported,
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              unsigned entries = family.notifyClasses.size();
              SmallVector<int64_t> cases;
              for (unsigned e = 0; e < entries; ++e)
                cases.push_back(e);
              auto entrySwitch = scf::IndexSwitchOp::create(
                  cb, loc, reported, entry, cases, cases.size());
              for (unsigned e = 0; e < entries; ++e) {
                OpBuilder::InsertionGuard guard(cb);
                cb.createBlock(&entrySwitch.getCaseRegions()[e]);
                SmallVector<Value> tile = tileOf(cb, family);
                EntryEvent event = entryEvent(cb, loc, function, family,
                                              record, e, /*notify=*/true);
                SmallVector<Value> coordinates = entryCoordinates(
                    cb, loc, function, family, record, e, /*notify=*/true, tile);
                // A symmetric event's map names the rank first; its
                // elements are readied by the polls of their own rank.
                if (plan.classes[event.classIndex].type.getSymmetric()) {
                  RemoteNotifyOp::create(
                      cb, loc, event.view,
                      ArrayRef<Value>(coordinates).drop_front(),
                      coordinates.front());
                  scf::YieldOp::create(cb, loc, nothing(cb));
                  continue;
                }
                if (!classHasBoxWaiters[event.classIndex] &&
                    !classHasIndexedWaiters[event.classIndex]) {
                  NotifyOp::create(cb, loc, event.view, coordinates)
                      .setReleased(true);
                  scf::YieldOp::create(cb, loc, nothing(cb));
                  continue;
                }
                auto notify =
                    NotifyReadyOp::create(cb, loc, event.view, coordinates);
                notify.setReleased(true);
                Value became = notify.getReady();
                Value linear = linearize(
                    cb, loc, coordinates,
                    function.classes[event.classIndex].sizes);
                scf::YieldOp::create(
                    cb, loc,
                    ValueRange{became,
                               constantIndex(cb, loc, event.classIndex),
                               event.number, event.base, linear});
              }
              {
                OpBuilder::InsertionGuard guard(cb);
                cb.createBlock(&entrySwitch.getDefaultRegion());
                scf::YieldOp::create(cb, loc, nothing(cb));
              }
              return SmallVector<Value>(entrySwitch.getResults());
            });
        SmallVector<int64_t> waited;
        for (unsigned c = 0; c < plan.classes.size(); ++c)
          if ((classHasBoxWaiters[c] || classHasIndexedWaiters[c]) &&
              !plan.classes[c].type.getSymmetric())
            waited.push_back(c);
        if (!waited.empty()) {
          scf::IfOp::create(lb, loc, ready[0], [&](OpBuilder &then,
                                                   Location loc) {
            auto classSwitch = scf::IndexSwitchOp::create(
                then, loc, TypeRange{}, ready[1], waited, waited.size());
            for (auto [region, classIndex] :
                 llvm::zip(classSwitch.getCaseRegions(), waited)) {
              OpBuilder::InsertionGuard guard(then);
              then.createBlock(&region);
              SmallVector<Value> coordinates =
                  delinearize(then, loc, ready[4],
                              function.classes[classIndex].sizes);
              readyWaiters(then, loc, function, layout, classIndex, ready[2],
                           ready[3], coordinates);
              scf::YieldOp::create(then, loc);
            }
            {
              OpBuilder::InsertionGuard guard(then);
              then.createBlock(&classSwitch.getDefaultRegion());
              scf::YieldOp::create(then, loc);
            }
            scf::YieldOp::create(then, loc);
          });
        }
        scf::YieldOp::create(lb, loc);
      });
}

/// `@g_worker(symbols, table, counters)`: pops task ids until the queue is
/// exhausted and runs each in the task whose tile range holds it, found by
/// binary search over the tile offsets.
void DynamicScheduler::buildWorker(OpBuilder &builder) {
  QueueLayout layout;
  ScheduledFunction function = createFunction(
      builder, "_worker", /*withCounters=*/true, /*results=*/{}, layout);
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Type index = b.getIndexType();
  if (!tasks.empty() && graph.getRanksAttr()) {
    buildPollingLoop(b, loc, function, layout);
  } else if (!tasks.empty()) {
    scf::WhileOp::create(
        b, loc, TypeRange{index}, ValueRange{},
        [&](OpBuilder &before, Location loc, ValueRange) {
          Value id = QueuePopOp::create(before, loc, function.counters,
                                        layout.queue, layout.totalTiles);
          Value more = arith::CmpIOp::create(
              before, loc, arith::CmpIPredicate::ult, id, layout.totalTiles);
          scf::ConditionOp::create(before, loc, more, id);
        },
        [&](OpBuilder &after, Location loc, ValueRange arguments) {
          Value id = arguments[0];
          runTile(after, loc, function, layout,
                  findTask(after, loc, function, layout, id), id);
          scf::YieldOp::create(after, loc);
        });
  }
  func::ReturnOp::create(b, loc);
  dropUnusedPendingView(layout);
}

/// Until the queue is exhausted or the run stopped: a tile from the queue
/// runs; with none published, the worker polls the symmetric elements, and
/// backs off (keeping the watchdog) when that readied nothing either. The
/// loop carries when the worker became idle (0 while it is not).
void DynamicScheduler::buildPollingLoop(OpBuilder &b, Location loc,
                                        ScheduledFunction &function,
                                        QueueLayout &layout) {
  Type index = b.getIndexType(), i64 = b.getI64Type();
  Value busy = arith::ConstantIntOp::create(b, loc, 0, 64);
  scf::WhileOp::create(
      b, loc, TypeRange{i64, index}, ValueRange{busy},
      [&](OpBuilder &before, Location loc, ValueRange arguments) {
        Value id = QueueTryPopOp::create(before, loc, function.counters,
                                         layout.queue, layout.totalTiles);
        Value left = arith::CmpIOp::create(before, loc, arith::CmpIPredicate::ne,
                                           id, layout.totalTiles);
        Value stopped = RunAbortedOp::create(before, loc, function.counters);
        Value going = arith::AndIOp::create(
            before, loc, left,
            arith::XOrIOp::create(
                before, loc, stopped,
                arith::ConstantIntOp::create(before, loc, 1, 1)));
        scf::ConditionOp::create(before, loc, going,
                                 ValueRange{arguments[0], id});
      },
      [&](OpBuilder &after, Location loc, ValueRange arguments) {
        Value since = arguments[0], id = arguments[1];
        Value got = arith::CmpIOp::create(after, loc, arith::CmpIPredicate::ult,
                                          id, layout.totalTiles);
        auto branch = scf::IfOp::create(
            after, loc, got,
            [&](OpBuilder &then, Location loc) {
              runTile(then, loc, function, layout,
                      findTask(then, loc, function, layout, id), id);
              scf::YieldOp::create(
                  then, loc, arith::ConstantIntOp::create(then, loc, 0, 64)
                                 .getResult());
            },
            [&](OpBuilder &otherwise, Location loc) {
              SmallVector<Value> found =
                  pollSymmetric(otherwise, loc, function, layout);
              auto next = scf::IfOp::create(
                  otherwise, loc, found[0],
                  [&](OpBuilder &then, Location loc) {
                    scf::YieldOp::create(
                        then, loc,
                        arith::ConstantIntOp::create(then, loc, 0, 64)
                            .getResult());
                  },
                  [&](OpBuilder &still, Location loc) {
                    scf::YieldOp::create(
                        still, loc,
                        idle(still, loc, function, since,
                             ArrayRef<Value>(found).drop_front()));
                  });
              scf::YieldOp::create(otherwise, loc, next.getResult(0));
            });
        scf::YieldOp::create(after, loc, branch.getResult(0));
      });
}

SmallVector<Value> DynamicScheduler::pollSymmetric(OpBuilder &b, Location loc,
                                                   ScheduledFunction &function,
                                                   QueueLayout &layout) {
  Type i1 = b.getI1Type(), index = b.getIndexType();
  Value one = constantIndex(b, loc, 1);
  Value zero = constantIndex(b, loc, 0);
  // progress, site class, site event number, site position.
  SmallVector<Value> state = {arith::ConstantIntOp::create(b, loc, 0, 1),
                              constantIndex(b, loc, polled.size()), zero,
                              zero};
  for (auto [polledIndex, classIndex] : llvm::enumerate(polled)) {
    const EventClass &eventClass = plan.classes[classIndex];
    const ClassLayout &classLayout = function.classes[classIndex];
    auto instances = scf::ForOp::create(
        b, loc, zero, constantIndex(b, loc, eventClass.instances.size()), one,
        state,
        [&](OpBuilder &ib, Location loc, Value instance, ValueRange carried) {
          Value number = addIndex(
              ib, loc, constantIndex(ib, loc, eventClass.firstEvent), instance);
          Value base = addIndex(ib, loc, classLayout.base,
                                mulIndex(ib, loc, instance,
                                         classLayout.numElements));
          Value view = ViewOp::create(ib, loc, eventClass.type,
                                      function.counters, base,
                                      classLayout.dynamicSizes);
          auto elements = scf::ForOp::create(
              ib, loc, zero, classLayout.numElements, one, carried,
              [&](OpBuilder &eb, Location loc, Value linear,
                  ValueRange current) {
                Value position = addIndex(eb, loc, base, linear);
                SmallVector<Value> coordinates =
                    delinearize(eb, loc, linear, classLayout.sizes);
                Value done = TestOp::create(eb, loc, layout.handledView,
                                            ValueRange{position});
                auto open = scf::IfOp::create(
                    eb, loc, done,
                    [&](OpBuilder &then, Location loc) {
                      scf::YieldOp::create(then, loc, current);
                    },
                    [&](OpBuilder &pending, Location loc) {
                      Value arrived =
                          TestOp::create(pending, loc, view, coordinates);
                      auto handle = scf::IfOp::create(
                          pending, loc, arrived,
                          [&](OpBuilder &then, Location loc) {
                            Value mine = NotifyReadyOp::create(
                                then, loc, layout.handledView,
                                ValueRange{position});
                            scf::IfOp::create(
                                then, loc, mine,
                                [&](OpBuilder &ready, Location loc) {
                                  readyWaiters(ready, loc, function, layout,
                                               classIndex, number, base,
                                               coordinates);
                                  scf::YieldOp::create(ready, loc);
                                });
                            SmallVector<Value> next(current);
                            next[0] = arith::OrIOp::create(then, loc,
                                                           current[0], mine);
                            scf::YieldOp::create(then, loc, next);
                          },
                          [&](OpBuilder &absent, Location loc) {
                            // The first element still to arrive.
                            Value first = arith::CmpIOp::create(
                                absent, loc, arith::CmpIPredicate::eq,
                                current[1],
                                constantIndex(absent, loc, polled.size()));
                            SmallVector<Value> next(current);
                            SmallVector<Value> mine = {
                                constantIndex(absent, loc, polledIndex), number,
                                linear};
                            for (unsigned k = 0; k < 3; ++k)
                              next[k + 1] = arith::SelectOp::create(
                                  absent, loc, first, mine[k], current[k + 1]);
                            scf::YieldOp::create(absent, loc, next);
                          });
                      scf::YieldOp::create(pending, loc, handle.getResults());
                    });
                scf::YieldOp::create(eb, loc, open.getResults());
              });
          scf::YieldOp::create(ib, loc, elements.getResults());
        });
    state.assign(instances.getResults().begin(), instances.getResults().end());
  }
  return state;
}

/// Whether the watchdog's record can name the first tile of closed-form
/// wait `kind` that waits on an element (`firstWaitingTile`): not when its
/// map has constant results (its tiles wait on one element only), nor when
/// its grid has more dimensions than a record holds.
static bool namesWaitingTile(const WaitKind &kind, unsigned gridRank) {
  return static_cast<int64_t>(gridRank) <= run::kMaxRecordRank &&
         llvm::none_of(*kind.box, [](const BoxResult &box) {
           return box.kind == BoxResult::Constant;
         });
}

/// The first tile of closed-form wait `kind`'s box of tiles waiting on
/// element `coordinates`: the coordinate, or the first of the M tiles of a
/// `floordiv M`, along the dimensions the map names; 0 along the others.
static SmallVector<Value> firstWaitingTile(OpBuilder &b, Location loc,
                                           const WaitKind &kind,
                                           unsigned gridRank,
                                           ValueRange coordinates) {
  SmallVector<Value> tile(gridRank, constantIndex(b, loc, 0));
  for (auto [result, box] : llvm::enumerate(*kind.box)) {
    if (box.kind == BoxResult::Dim)
      tile[box.dim] = coordinates[result];
    else if (box.kind == BoxResult::FloorDiv)
      tile[box.dim] = mulIndex(b, loc, coordinates[result],
                               constantIndex(b, loc, box.value));
  }
  return tile;
}

Value DynamicScheduler::idle(OpBuilder &b, Location loc,
                             ScheduledFunction &function, Value since,
                             ValueRange site) {
  Type i64 = b.getI64Type();
  SmallVector<int64_t> cases;
  for (unsigned k = 0; k < polled.size(); ++k)
    cases.push_back(k);
  auto switchOp = scf::IndexSwitchOp::create(b, loc, TypeRange{i64}, site[0],
                                             cases, cases.size());
  Value waiterTable, waiterKindTable;
  if (!polled.empty()) {
    waiterTable = constantTable(function, "_first_waiter", firstWaiter.size());
    waiterKindTable = constantTable(function, "_first_waiter_kind",
                                    firstWaiterKind.size());
  }
  for (auto [region, classIndex] :
       llvm::zip(switchOp.getCaseRegions(), polled)) {
    OpBuilder::InsertionGuard guard(b);
    b.createBlock(&region);
    const EventClass &eventClass = plan.classes[classIndex];
    const ClassLayout &classLayout = function.classes[classIndex];
    Value number = site[1];
    Value instance =
        subIndex(b, loc, number, constantIndex(b, loc, eventClass.firstEvent));
    Value base = addIndex(b, loc, classLayout.base,
                          mulIndex(b, loc, instance, classLayout.numElements));
    Value view = ViewOp::create(b, loc, eventClass.type, function.counters,
                                base, classLayout.dynamicSizes);
    SmallVector<Value> coordinates =
        delinearize(b, loc, site[2], classLayout.sizes);
    Value task = loadConstant(b, loc, waiterTable, number);
    // With the first waiting task's wait in closed form, its first tile on
    // the element too: one case per such kind of wait on this class.
    SmallVector<int64_t> kindCases;
    for (auto [boxIndex, kindIndex] : llvm::enumerate(boxKinds)) {
      const WaitKind &kind = kinds[kindIndex];
      if (waitClassOf(kind) == classIndex &&
          namesWaitingTile(
              kind, plan.families[kind.family].representative.getGrid().size()))
        kindCases.push_back(boxIndex);
    }
    auto kindSwitch = scf::IndexSwitchOp::create(
        b, loc, TypeRange{i64}, loadConstant(b, loc, waiterKindTable, number),
        kindCases, kindCases.size());
    for (auto [kindRegion, boxIndex] :
         llvm::zip(kindSwitch.getCaseRegions(), kindCases)) {
      OpBuilder::InsertionGuard caseGuard(b);
      b.createBlock(&kindRegion);
      const WaitKind &kind = kinds[boxKinds[boxIndex]];
      SmallVector<Value> words{task, number};
      llvm::append_range(
          words,
          firstWaitingTile(
              b, loc, kind,
              plan.families[kind.family].representative.getGrid().size(),
              coordinates));
      scf::YieldOp::create(b, loc,
                           IdleOp::create(b, loc, function.counters, since,
                                          view, coordinates, words)
                               .getResult());
    }
    {
      OpBuilder::InsertionGuard caseGuard(b);
      b.createBlock(&kindSwitch.getDefaultRegion());
      scf::YieldOp::create(b, loc,
                           IdleOp::create(b, loc, function.counters, since,
                                          view, coordinates,
                                          ValueRange{task, number})
                               .getResult());
    }
    scf::YieldOp::create(b, loc, kindSwitch.getResult(0));
  }
  {
    OpBuilder::InsertionGuard guard(b);
    b.createBlock(&switchOp.getDefaultRegion());
    Value start = IdleOp::create(b, loc, function.counters, since, Value(),
                                 ValueRange{}, ValueRange{});
    scf::YieldOp::create(b, loc, start);
  }
  return switchOp.getResult(0);
}

//===----------------------------------------------------------------------===//
// @g_check
//===----------------------------------------------------------------------===//

/// `@g_check(symbols, table, counters) -> i32`: 1 when the queue
/// overflowed, else 2 when an event counter or a pending count is not zero,
/// else 0.
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
  if (anyLive) {
    // Every live tile is pushed exactly once: one more push took an end
    // marker's slot (overflow), one fewer left a worker waiting.
    Value tail = memref::LoadOp::create(
        b, loc, function.counters,
        addIndex(b, loc, layout.queue, constantIndex(b, loc, queue::kTailWord)));
    Value live =
        memref::LoadOp::create(b, loc, function.counters, layout.liveTiles);
    Value pushedOther =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, tail, live);
    overflow = arith::OrIOp::create(b, loc, overflow, pushedOther);
  }
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
  createTables(builder);
  createConstantTable(builder, "_waiter_offsets", waiterOffsets);
  createConstantTable(builder, "_waiter_tasks", waiterTasks);
  createConstantTable(builder, "_waiter_kinds", waiterKinds);
  if (!polled.empty()) {
    createConstantTable(builder, "_first_waiter", firstWaiter);
    createConstantTable(builder, "_first_waiter_kind", firstWaiterKind);
  }
  buildCounters(builder);
  buildInit(builder);
  buildWorker(builder);
  buildCheck(builder);
}


//===----------------------------------------------------------------------===//
// Pass
//===----------------------------------------------------------------------===//

/// True when `graph`'s dependencies depend on runtime data: an event counted
/// on the device (no `count`), an indirect wait or notify map, or a task
/// whose live tiles are decided by data.
static bool isDataDependent(GraphOp graph) {
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>())
    if (!alloc.getCount())
      return true;
  for (TaskOp task : graph.getBody().getOps<TaskOp>()) {
    if (task.isPredicated())
      return true;
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
    FailureOr<StaticPolicy> staticPolicy = parseStaticPolicy(policy);
    if (failed(staticPolicy)) {
      module.emitError("event-dynamic-schedule: unsupported policy '")
          << policy << "' for the statically scheduled graphs; supported "
          << "policies: " << kStaticPolicies;
      return signalPassFailure();
    }
    SmallVector<std::pair<GraphOp, bool>> graphs;
    for (GraphOp graph : module.getOps<GraphOp>()) {
      if (check && failed(checkSchedule(graph, /*requireStaticOrder=*/false)))
        return signalPassFailure();
      // With `auto`, a graph on several ranks is scheduled statically:
      // its workers never poll, and the order argument spans the ranks.
      if (graph.getRanksAttr() && autoSchedule) {
        if (failed(checkSchedule(graph, /*requireStaticOrder=*/true)))
          return signalPassFailure();
        graphs.emplace_back(graph, false);
        continue;
      }
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
    // Plan every graph before rewriting any, so that an error leaves the
    // module as it was.
    SmallVector<GraphPlan, 1> plans;
    for (auto [graph, dynamic] : graphs) {
      simplifyGraph(graph);
      // Prefetches: only the static schedule has waits to overlap.
      FailureOr<GraphPlan> plan = GraphPlan::build(graph, prefetch && !dynamic);
      if (failed(plan) ||
          failed(GraphProgramBuilder(*plan, "", workers, trace).checkTraceable()))
        return signalPassFailure();
      plans.push_back(std::move(*plan));
    }
    for (auto [plan, scheduled] : llvm::zip(plans, graphs)) {
      OpBuilder builder(plan.graph);
      if (scheduled.second)
        DynamicScheduler(plan, workers, forceIndex, trace).build(builder);
      else
        buildStaticSchedule(builder, plan, workers, trace, *staticPolicy);
      plan.graph->erase();
    }
  }
};
} // namespace
