//===- DynamicScheduler.cpp - The dynamic schedule of a graph -------------===//
//
// The waiters of each event element and the layout of the scheduling state
// in the counter buffer, `@g_check`, and the order in which the dynamic
// scheduler emits its tables and functions.
//
//===----------------------------------------------------------------------===//

#include "DynamicScheduler.h"
#include "IndexArithmetic.h"

#include "Event/IR/QueueLayout.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// Waiters of an event element
//===----------------------------------------------------------------------===//

/// The closed form of `indexMap` as a box of tiles, if it has one: every
/// result is a distinct tile index `dN`, `dN floordiv M` (M > 0), a constant,
/// or, with `anyIndirect`, indirect (`Any`: the tile waits on every
/// coordinate there). Otherwise, without `anyIndirect`, indirect maps have
/// none.
static std::optional<SmallVector<BoxResult>>
closedForm(IndexMapAttr indexMap, bool anyIndirect) {
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

/// Erases the pending-count view of a function that does not use it.
void etc::event::dropUnusedPendingView(QueueLayout &layout) {
  if (layout.pendingView && layout.pendingView.use_empty())
    layout.pendingView.getDefiningOp()->erase();
  if (layout.handledView && layout.handledView.use_empty())
    layout.handledView.getDefiningOp()->erase();
}

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

//===----------------------------------------------------------------------===//
// The scheduling state in the counter buffer
//===----------------------------------------------------------------------===//

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
