//===- StaticSchedule.cpp - event-static-schedule -------------------------===//
//
// Turns each L2 event graph into an L3 persistent program with a static
// schedule: all tile tasks in one global order (task textual order, then
// row-major tile order), global tile t run by worker t mod W (round-robin)
// or by whichever worker claims it next from a shared counter (claim). The
// program is
// four functions sharing the graph's arguments: one sizes the counter
// buffer, one initialises it, one is the per-worker loop and one checks the
// counters after the run.
//
//===----------------------------------------------------------------------===//

#include "StaticSchedule.h"
#include "CheckSchedule.h"
#include "GraphProgramBuilder.h"
#include "IndexArithmetic.h"

#include "Event/IR/EventOps.h"
#include "Event/Transforms/Passes.h"
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

FailureOr<StaticPolicy> etc::event::parseStaticPolicy(StringRef text) {
  if (text == "round-robin")
    return StaticPolicy::RoundRobin;
  if (text == "claim")
    return StaticPolicy::Claim;
  return failure();
}

//===----------------------------------------------------------------------===//
// Graph scheduler
//===----------------------------------------------------------------------===//

namespace {
/// Builds the four functions of one graph's static schedule.
class StaticScheduler : public GraphProgramBuilder {
public:
  StaticScheduler(const GraphPlan &plan, int64_t workers, bool trace,
                  StaticPolicy policy)
      : GraphProgramBuilder(plan, "static", workers, trace), policy(policy) {}

  /// Inserts the constant tables, `@g_counters`, `@g_init`, `@g_worker` and
  /// `@g_check` at `builder`.
  void build(OpBuilder &builder);

private:
  void buildCounters(OpBuilder &builder);
  void buildInit(OpBuilder &builder);
  void buildWorker(OpBuilder &builder);
  void buildCheck(OpBuilder &builder);
  void buildRoundRobinLoop(OpBuilder &b, Location loc,
                           ScheduledFunction &function);
  void buildClaimLoop(OpBuilder &b, Location loc, ScheduledFunction &function);
  /// Where the scheduler's state ends in the counter buffer: after the
  /// event counters, and under `policy=claim` after the next-tile word.
  Value stateEnd(OpBuilder &b, Location loc, ScheduledFunction &function) {
    if (policy == StaticPolicy::RoundRobin)
      return function.eventCounters;
    return addIndex(b, loc, function.eventCounters, constantIndex(b, loc, 1));
  }
  void runTile(OpBuilder &b, Location loc, ScheduledFunction &function,
               const TaskFamily &family, Value record, Value task,
               ValueRange tile, Value id);

  StaticPolicy policy;
};
} // namespace

/// `@g_counters(symbols, table) -> index`: the size of the counter buffer:
/// the event counters, the trace records when tracing, the run header.
void StaticScheduler::buildCounters(OpBuilder &builder) {
  ScheduledFunction function =
      createFunction(builder, "_counters", /*withCounters=*/false,
                     builder.getIndexType());
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  func::ReturnOp::create(
      b, loc, bufferSize(b, loc, function, stateEnd(b, loc, function)));
}

/// `@g_init(symbols, table, counters)`: the run header reset, every
/// counter set to its expected count and, under `policy=claim`, the
/// next-tile word (right after the event counters) set to 0.
void StaticScheduler::buildInit(OpBuilder &builder) {
  ScheduledFunction function = createFunction(
      builder, "_init", /*withCounters=*/true, /*results=*/{});
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  initRunHeader(b, loc, function, stateEnd(b, loc, function));
  initEventCounters(b, function);
  if (policy == StaticPolicy::Claim)
    memref::StoreOp::create(b, loc,
                            arith::ConstantIntOp::create(b, loc, 0, 32),
                            function.counters,
                            ValueRange{function.eventCounters});
  func::ReturnOp::create(b, loc);
}

/// Emits one tile (global tile `id`) of task `task`, whose record starts at
/// `record`: prefetches of its weight boxes (planned with `prefetch=true`)
/// when it has waits, the waits, then, unless the run was stopped meanwhile, the tile
/// body, one `event.release` and the (`released`) notifies (remote ones,
/// `event.remote_notify`, for symmetric events); only for live tiles when the task has live
/// bounds. A dead tile keeps its place in the global order and its worker
/// moves on, so the order argument against deadlock is unchanged.
void StaticScheduler::runTile(OpBuilder &builder, Location loc,
                              ScheduledFunction &function,
                              const TaskFamily &family, Value record,
                              Value task, ValueRange tile, Value id) {
  ifLive(builder, loc, function, family, record, tile, [&](OpBuilder &b) {
    // The weights wait on no event: ask for them before waiting for the rest.
    if (!family.waitClasses.empty())
      emitPrefetches(b, loc, function, family, record, tile);
    emitWaits(b, loc, function, family, record, task, tile);
    emitTileWork(b, loc, function, family, record, task, tile, id,
                 stateEnd(b, loc, function), /*afterWaits=*/true,
                 [&](OpBuilder &b) {
                   // One release publishes the tile for all its notifies.
                   if (!family.notifyClasses.empty())
                     ReleaseOp::create(b, loc);
                   for (unsigned entry = 0;
                        entry < family.notifyClasses.size(); ++entry) {
                     EntryEvent event = entryEvent(b, loc, function, family,
                                                   record, entry,
                                                   /*notify=*/true);
                     SmallVector<Value> coordinates =
                         entryCoordinates(b, loc, function, family, record,
                                          entry, /*notify=*/true, tile);
                     // A symmetric event's map names the rank first.
                     if (plan.classes[event.classIndex].type.getSymmetric()) {
                       RemoteNotifyOp::create(
                           b, loc, event.view,
                           ArrayRef<Value>(coordinates).drop_front(),
                           coordinates.front());
                       continue;
                     }
                     auto notify =
                         NotifyOp::create(b, loc, event.view, coordinates);
                     notify.setReleased(true);
                   }
                 });
  });
}

/// `@g_worker(symbols, table, counters)`: the worker's loop over the global
/// tile order, as the policy shares it out.
void StaticScheduler::buildWorker(OpBuilder &builder) {
  ScheduledFunction function = createFunction(
      builder, "_worker", /*withCounters=*/true, /*results=*/{});
  Location loc = graph.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(&function.op.getBody().front());
  if (policy == StaticPolicy::RoundRobin)
    buildRoundRobinLoop(b, loc, function);
  else if (!tasks.empty())
    buildClaimLoop(b, loc, function);
  func::ReturnOp::create(b, loc);
}

/// Round-robin: worker w of W runs the global tiles t with t mod W == w in
/// increasing t (the worker id and count are read also without tiles, as
/// before the claim policy existed). The loop walks the tasks in order, carrying o_k, the first
/// global tile of task k; within task k (tiles [o_k, o_k + tiles_k)) it
/// starts at the first tile congruent to w, o_k + ((w - o_k) mod W), and
/// steps by W.
void StaticScheduler::buildRoundRobinLoop(OpBuilder &b, Location loc,
                                          ScheduledFunction &function) {
  Value worker = WorkerIdOp::create(b, loc);
  Value workerCount = WorkerCountOp::create(b, loc);
  if (tasks.empty())
    return;
  Type index = b.getIndexType();
  scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), constantIndex(b, loc, tasks.size()),
      constantIndex(b, loc, 1), ValueRange{constantIndex(b, loc, 0)},
      [&](OpBuilder &nested, Location loc, Value task, ValueRange carried) {
        Value taskOffset = carried[0];
        ValueRange tiles = switchOnFamily(
            nested, loc, function, task, TypeRange{index},
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              SmallVector<Value> extents = gridOf(function, family);
              Value count = productIndex(cb, loc, extents);
              Value end = addIndex(cb, loc, taskOffset, count);
              // (w - o) mod W, kept non-negative: w + W - (o mod W) lies
              // in (0, 2W).
              Value residue = remIndex(cb, loc, taskOffset, workerCount);
              Value shifted = subIndex(
                  cb, loc, addIndex(cb, loc, worker, workerCount), residue);
              Value start = addIndex(cb, loc, taskOffset,
                                     remIndex(cb, loc, shifted, workerCount));
              scf::ForOp::create(
                  cb, loc, start, end, workerCount, ValueRange{},
                  [&](OpBuilder &lb, Location loc, Value global, ValueRange) {
                    Value local = subIndex(lb, loc, global, taskOffset);
                    runTile(lb, loc, function, family, record, task,
                            delinearize(lb, loc, local, extents), global);
                    scf::YieldOp::create(lb, loc);
                  });
              return {count};
            });
        scf::YieldOp::create(nested, loc,
                             addIndex(nested, loc, taskOffset, tiles[0]));
      });
}

/// Claim: every worker takes the next global tile t from the counter right
/// after the event counters (`event.claim`), runs it, and claims again. The
/// loop walks the tasks in order carrying o_k and the claimed t; while t
/// lies in task k ([o_k, o_k + tiles_k)) the worker runs tile t - o_k and
/// claims the next, otherwise it moves on to the task that holds t. Tiles
/// are claimed in increasing global order, so a claimed tile waits only on
/// tiles claimed before it, by workers that are running them: the order
/// argument against deadlock is the round-robin one, and a worker that is
/// descheduled holds back one tile instead of every W-th.
void StaticScheduler::buildClaimLoop(OpBuilder &b, Location loc,
                                     ScheduledFunction &function) {
  Type index = b.getIndexType();
  Value next = function.eventCounters;
  Value first = ClaimOp::create(b, loc, function.counters, next);
  scf::ForOp::create(
      b, loc, constantIndex(b, loc, 0), constantIndex(b, loc, tasks.size()),
      constantIndex(b, loc, 1),
      ValueRange{constantIndex(b, loc, 0), first},
      [&](OpBuilder &nested, Location loc, Value task, ValueRange carried) {
        Value taskOffset = carried[0];
        ValueRange results = switchOnFamily(
            nested, loc, function, task, TypeRange{index, index},
            [&](OpBuilder &cb, const TaskFamily &family,
                Value record) -> SmallVector<Value> {
              SmallVector<Value> extents = gridOf(function, family);
              Value count = productIndex(cb, loc, extents);
              Value end = addIndex(cb, loc, taskOffset, count);
              auto loop = scf::WhileOp::create(
                  cb, loc, TypeRange{index}, ValueRange{carried[1]},
                  [&](OpBuilder &wb, Location loc, ValueRange args) {
                    Value inTask = arith::CmpIOp::create(
                        wb, loc, arith::CmpIPredicate::ult, args[0], end);
                    scf::ConditionOp::create(wb, loc, inTask, args);
                  },
                  [&](OpBuilder &wb, Location loc, ValueRange args) {
                    Value global = args[0];
                    Value local = subIndex(wb, loc, global, taskOffset);
                    runTile(wb, loc, function, family, record, task,
                            delinearize(wb, loc, local, extents), global);
                    scf::YieldOp::create(
                        wb, loc,
                        ValueRange{ClaimOp::create(wb, loc, function.counters,
                                                   next)});
                  });
              return {count, loop.getResult(0)};
            });
        scf::YieldOp::create(
            nested, loc,
            ValueRange{addIndex(nested, loc, taskOffset, results[0]),
                       results[1]});
      });
}

/// `@g_check(symbols, table, counters) -> i32`: 0 when every event counter
/// is back to zero after the run, 2 (unbalanced) otherwise.
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
  createTables(builder);
  buildCounters(builder);
  buildInit(builder);
  buildWorker(builder);
  buildCheck(builder);
}

void etc::event::buildStaticSchedule(OpBuilder &builder, const GraphPlan &plan,
                                     int64_t workers, bool trace,
                                     StaticPolicy policy) {
  StaticScheduler(plan, workers, trace, policy).build(builder);
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
    FailureOr<StaticPolicy> parsed = parseStaticPolicy(policy);
    if (failed(parsed)) {
      module.emitError("event-static-schedule: unsupported policy '")
          << policy << "'; supported policies: " << kStaticPolicies;
      return signalPassFailure();
    }
    SmallVector<GraphOp> graphs(module.getOps<GraphOp>());
    for (GraphOp graph : graphs)
      if (check && failed(checkSchedule(graph)))
        return signalPassFailure();
    if (failed(checkScheduleSymbolsFree(module, "event-static-schedule")))
      return signalPassFailure();
    // Plan every graph before rewriting any, so that an error leaves the
    // module as it was.
    SmallVector<GraphPlan, 1> plans;
    for (GraphOp graph : graphs) {
      simplifyGraph(graph);
      FailureOr<GraphPlan> plan = GraphPlan::build(graph, prefetch);
      if (failed(plan) ||
          failed(StaticScheduler(*plan, workers, trace, *parsed)
                     .checkTraceable()))
        return signalPassFailure();
      plans.push_back(std::move(*plan));
    }
    for (const GraphPlan &plan : plans) {
      OpBuilder builder(plan.graph);
      buildStaticSchedule(builder, plan, workers, trace, *parsed);
      plan.graph->erase();
    }
  }
};
} // namespace
