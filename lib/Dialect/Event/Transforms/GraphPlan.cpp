//===- GraphPlan.cpp - The plan of a graph --------------------------------===//
//
// How a scheduled program finds a graph's buffers, events and tasks: the
// buffer table, the event classes, the task families and their records
// (see GraphPlan.h).
//
//===----------------------------------------------------------------------===//

#include "GraphPlan.h"

#include "mlir/IR/Dominance.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/CSE.h"

using namespace mlir;
using namespace etc::event;

LogicalResult GraphPlan::planBuffers() {
  int64_t offset = 0;
  for (auto [index, type] : llvm::enumerate(graph.getArgumentTypes())) {
    auto memref = dyn_cast<MemRefType>(type);
    if (!memref) {
      tableOffsets.push_back(-1);
      continue;
    }
    if (!memref.getLayout().isIdentity() || memref.getMemorySpace())
      return graph.emitOpError("buffer argument #")
             << index << " has type " << memref
             << "; scheduled programs read buffers from the buffer table, "
             << "which describes contiguous row-major buffers in the default "
             << "memory space";
    tableOffsets.push_back(offset);
    offset += 1 + memref.getRank();
  }
  tableWords = offset;
  return success();
}

void GraphPlan::planEvents() {
  for (AllocOp alloc : graph.getBody().getOps<AllocOp>()) {
    SmallVector<Value> sizes(alloc.getDynamicSizes());
    Value count = alloc.getCount();
    auto it = llvm::find_if(classes, [&](const EventClass &eventClass) {
      return eventClass.type == alloc.getType() && eventClass.count == count &&
             llvm::equal(eventClass.dynamicSizes, sizes);
    });
    if (it == classes.end()) {
      classes.push_back({alloc.getType(), sizes, count, {}, 0});
      it = std::prev(classes.end());
    }
    eventOf[alloc] = {static_cast<unsigned>(it - classes.begin()),
                      static_cast<unsigned>(it->instances.size())};
    it->instances.push_back(alloc);
  }
  int64_t next = 0;
  for (EventClass &eventClass : classes) {
    eventClass.firstEvent = next;
    next += eventClass.instances.size();
  }
}

namespace {
/// What makes two tasks run by the same code: everything but which buffers
/// and which events of their classes they use.
struct FamilyKey {
  Operation *callee = nullptr; // null: the body is cloned, no sharing
  StringAttr calleeName;
  SmallVector<CallOperand> operands;
  SmallVector<Value> grid;
  SmallVector<std::pair<unsigned, Attribute>> waits, notifies;
  SmallVector<std::pair<Type, bool>> indices; // type, written during the run
  Attribute liveBounds;                          // null: every tile runs
  // With prefetch: (call operand, footprint) of each weight box.
  SmallVector<std::pair<unsigned, Attribute>> prefetches;

  bool operator==(const FamilyKey &other) const {
    auto sameOperand = [](const CallOperand &a, const CallOperand &b) {
      return a.kind == b.kind && a.field == b.field && a.fixed == b.fixed;
    };
    return callee && other.callee && calleeName == other.calleeName &&
           llvm::equal(operands, other.operands, sameOperand) &&
           llvm::equal(grid, other.grid) && waits == other.waits &&
           notifies == other.notifies && indices == other.indices &&
           liveBounds == other.liveBounds && prefetches == other.prefetches;
  }
};
} // namespace

/// The tile call of `task`: its body's only op, a `func.call` whose
/// operands are tile indices or values from outside the task.
static func::CallOp tileCall(TaskOp task) {
  Block &body = task.getBodyBlock();
  if (!llvm::hasSingleElement(body.without_terminator()))
    return nullptr;
  auto call = dyn_cast<func::CallOp>(body.front());
  if (!call || call.getNumResults() != 0)
    return nullptr;
  for (Value operand : call.getOperands())
    if (Operation *def = operand.getDefiningOp(); def && task->isAncestor(def))
      return nullptr;
  return call;
}

void GraphPlan::planFamilies(bool prefetch) {
  llvm::SmallDenseSet<Value> written;
  for (TaskOp task : tasks)
    written.insert(task.getWrites().begin(), task.getWrites().end());

  SmallVector<FamilyKey, 4> keys;
  for (auto [taskIndex, task] : llvm::enumerate(tasks)) {
    FamilyKey key;
    SmallVector<int32_t> bufferFields;
    if (func::CallOp call = tileCall(task)) {
      key.callee = call;
      key.calleeName = call.getCalleeAttr().getAttr();
      for (Value operand : call.getOperands()) {
        auto arg = dyn_cast<BlockArgument>(operand);
        if (arg && arg.getOwner() == &task.getBodyBlock()) {
          key.operands.push_back({CallOperand::Tile, arg.getArgNumber(), {}});
        } else if (arg && arg.getOwner() == &graph.getBody().front() &&
                   isa<MemRefType>(arg.getType())) {
          key.operands.push_back(
              {CallOperand::Buffer,
               static_cast<unsigned>(bufferFields.size()), {}});
          bufferFields.push_back(tableOffsets[arg.getArgNumber()]);
        } else {
          key.operands.push_back({CallOperand::Fixed, 0, operand});
        }
      }
    }
    key.grid.assign(task.getGrid().begin(), task.getGrid().end());
    for (auto [entry, event] : llvm::enumerate(task.getWaits()))
      key.waits.push_back({eventOf.lookup(event.getDefiningOp()).first,
                           task.getWaitMap(entry)});
    for (auto [entry, event] : llvm::enumerate(task.getNotifies()))
      key.notifies.push_back({eventOf.lookup(event.getDefiningOp()).first,
                              task.getNotifyMap(entry)});
    for (Value index : task.getIndices())
      key.indices.push_back({index.getType(), written.contains(index)});
    if (task.isPredicated())
      key.liveBounds = task.getLiveBoundsAttr();
    // The boxes of buffers no task writes (weights), read through a buffer
    // operand of the call: they wait on no event.
    if (prefetch && key.callee) {
      auto call = cast<func::CallOp>(key.callee);
      for (auto [index, buffer] : llvm::enumerate(task.getReads())) {
        if (written.contains(buffer))
          continue;
        for (auto [position, operand] : llvm::enumerate(call.getOperands()))
          if (operand == buffer &&
              key.operands[position].kind == CallOperand::Buffer) {
            key.prefetches.push_back({static_cast<unsigned>(position),
                                      task.getReadFootprint(index)});
            break;
          }
      }
    }

    auto it = llvm::find(keys, key);
    unsigned familyIndex = it - keys.begin();
    if (it == keys.end()) {
      TaskFamily family;
      family.representative = task;
      family.call = key.callee ? cast<func::CallOp>(key.callee) : nullptr;
      family.operands = key.operands;
      family.numBufferFields = bufferFields.size();
      family.numIndexBuffers = task.getIndices().size();
      for (auto &[classIndex, map] : key.waits)
        family.waitClasses.push_back(classIndex);
      for (auto &[classIndex, map] : key.notifies)
        family.notifyClasses.push_back(classIndex);
      family.liveBounds = task.getLiveBoundList();
      for (auto &[operand, footprint] : key.prefetches)
        family.prefetches.push_back({operand, cast<FootprintAttr>(footprint)});
      families.push_back(std::move(family));
      keys.push_back(std::move(key));
    }
    TaskFamily &family = families[familyIndex];
    family.members.push_back(taskIndex);

    // The record: buffers of the call, index buffers, wait and notify events.
    taskFamily.push_back(familyIndex);
    taskRecord.push_back(records.size());
    records.append(bufferFields.begin(), bufferFields.end());
    for (Value index : task.getIndices())
      records.push_back(
          tableOffsets[cast<BlockArgument>(index).getArgNumber()]);
    for (Value event : task.getWaits())
      records.push_back(eventOf.lookup(event.getDefiningOp()).second);
    for (Value event : task.getNotifies())
      records.push_back(eventOf.lookup(event.getDefiningOp()).second);
  }
}

FailureOr<GraphPlan> GraphPlan::build(GraphOp graph, bool prefetch) {
  GraphPlan plan;
  plan.graph = graph;
  plan.tasks.assign(graph.getBody().getOps<TaskOp>().begin(),
                    graph.getBody().getOps<TaskOp>().end());
  if (failed(plan.planBuffers()))
    return failure();
  for (TaskOp task : plan.tasks)
    for (Value index : task.getIndices())
      if (!isa<BlockArgument>(index) ||
          cast<BlockArgument>(index).getOwner() != &graph.getBody().front())
        return task.emitOpError("index buffer ")
               << index << " must be a buffer argument of the graph, so that "
               << "the scheduled program can read it from the buffer table";
  plan.planEvents();
  plan.planFamilies(prefetch);
  return plan;
}

void etc::event::simplifyGraph(GraphOp graph) {
  IRRewriter rewriter(graph.getContext());
  DominanceInfo dominance(graph);
  eliminateCommonSubExpressions(rewriter, dominance, graph);
}
