//===- StaticSchedule.cpp - event-static-schedule -------------------------===//
//
// Turns each L2 event graph into an L3 persistent program with a static
// schedule: all tile tasks in one global order (task textual order, then
// row-major tile order), global task t run by worker t mod W. The program is
// four functions sharing the graph's arguments: one sizes the counter
// buffer, one initialises it, one is the per-worker loop and one checks the
// counters after the run.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/CheckSchedule.h"
#include "Event/Transforms/Passes.h"
#include "Event/Transforms/ScheduleUtils.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"

namespace etc::event {
#define GEN_PASS_DEF_EVENTSTATICSCHEDULE
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

using namespace mlir;
using namespace etc::event;

/// The scheduling policies `policy=` accepts.
static constexpr StringLiteral kRoundRobin = "round-robin";

//===----------------------------------------------------------------------===//
// Graph scheduler
//===----------------------------------------------------------------------===//

namespace {
/// Builds the four functions of one graph's static schedule.
class StaticScheduler : public GraphProgramBuilder {
public:
  StaticScheduler(GraphOp graph, int64_t workers)
      : GraphProgramBuilder(graph, "static", workers) {}

  /// Inserts `@g_counters`, `@g_init`, `@g_worker` and `@g_check` at
  /// `builder`.
  void build(OpBuilder &builder);

private:
  void buildCounters(OpBuilder &builder);
  void buildInit(OpBuilder &builder);
  void buildWorker(OpBuilder &builder);
  void buildCheck(OpBuilder &builder);
  void runTile(OpBuilder &b, ScheduledFunction &function, TaskOp task,
               ValueRange tile);
};
} // namespace

/// `@g_counters(args) -> index`: the size of the counter buffer.
void StaticScheduler::buildCounters(OpBuilder &builder) {
  ScheduledFunction function =
      createFunction(builder, "_counters", /*withCounters=*/false,
                     builder.getIndexType());
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(b, graph.getLoc(), function.eventCounters);
}

/// `@g_init(args, counters)`: every counter set to its expected count.
void StaticScheduler::buildInit(OpBuilder &builder) {
  ScheduledFunction function = createFunction(
      builder, "_init", /*withCounters=*/true, /*results=*/{});
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  initEventCounters(b, function);
  func::ReturnOp::create(b, graph.getLoc());
}

/// Emits one tile of `task`: waits, the cloned body, notifies.
void StaticScheduler::runTile(OpBuilder &b, ScheduledFunction &function,
                              TaskOp task, ValueRange tile) {
  Location loc = task.getLoc();
  SmallVector<Value> indexBuffers = function.mapped(task.getIndices());
  for (auto [entry, event] : llvm::enumerate(task.getWaits())) {
    SmallVector<Value> coordinates = evaluateIndexMap(
        b, loc, task.getWaitMap(entry), tile, indexBuffers);
    WaitOp::create(b, loc, function.mapping.lookup(event), coordinates);
  }
  cloneBody(b, function, task, tile);
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
void StaticScheduler::buildWorker(OpBuilder &builder) {
  ScheduledFunction function = createFunction(
      builder, "_worker", /*withCounters=*/true, /*results=*/{});
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Value worker = WorkerIdOp::create(b, loc);
  Value workerCount = WorkerCountOp::create(b, loc);
  Value taskOffset = constantIndex(b, loc, 0);
  for (TaskOp task : tasks) {
    Location taskLoc = task.getLoc();
    SmallVector<Value> extents = function.mapped(task.getGrid());
    Value tiles = productIndex(b, taskLoc, extents);
    Value end = addIndex(b, taskLoc, taskOffset, tiles);
    // (w - o) mod W, kept non-negative: w + W - (o mod W) lies in (0, 2W).
    Value offsetResidue = remIndex(b, taskLoc, taskOffset, workerCount);
    Value shifted = subIndex(b, taskLoc, addIndex(b, taskLoc, worker, workerCount),
                             offsetResidue);
    Value start = addIndex(b, taskLoc, taskOffset,
                           remIndex(b, taskLoc, shifted, workerCount));
    auto loop = scf::ForOp::create(b, taskLoc, start, end, workerCount);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value local = subIndex(b, taskLoc, loop.getInductionVar(), taskOffset);
      runTile(b, function, task, delinearize(b, taskLoc, local, extents));
    }
    taskOffset = end;
  }
  func::ReturnOp::create(b, loc);
}

/// `@g_check(args, counters) -> i32`: 0 when every counter is back to zero
/// after the run, 2 (unbalanced) otherwise.
void StaticScheduler::buildCheck(OpBuilder &builder) {
  ScheduledFunction function = createFunction(
      builder, "_check", /*withCounters=*/true, builder.getI32Type());
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  Value unbalanced = anyNonZero(b, loc, function, constantIndex(b, loc, 0),
                                function.eventCounters);
  Value clean = arith::ConstantIntOp::create(b, loc, kClean, 32);
  Value notBalanced = arith::ConstantIntOp::create(b, loc, kUnbalanced, 32);
  Value status =
      arith::SelectOp::create(b, loc, unbalanced, notBalanced, clean);
  func::ReturnOp::create(b, loc, status);
}

void StaticScheduler::build(OpBuilder &builder) {
  buildCounters(builder);
  buildInit(builder);
  buildWorker(builder);
  buildCheck(builder);
}

void etc::event::buildStaticSchedule(OpBuilder &builder, GraphOp graph,
                                     int64_t workers) {
  StaticScheduler(graph, workers).build(builder);
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
    for (GraphOp graph : graphs)
      if (failed(checkSchedule(graph)))
        return signalPassFailure();
    if (failed(checkScheduleSymbolsFree(module, "event-static-schedule")))
      return signalPassFailure();
    for (GraphOp graph : graphs) {
      OpBuilder builder(graph);
      buildStaticSchedule(builder, graph, workers);
      graph.erase();
    }
  }
};
} // namespace
