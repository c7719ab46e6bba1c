//===- DynamicSchedule.cpp - event-dynamic-schedule -----------------------===//
//
// Turns each L2 event graph into an L3 persistent program whose workers share
// one task queue in the counter buffer: a tile task is pushed when the last
// of its wait elements becomes ready, and any worker pops it. The whole
// scheduling logic (counts, pending counts, inverse indices, queue) is code
// of the program: nothing is prepared on the host.
//
//===----------------------------------------------------------------------===//

#include "CheckSchedule.h"
#include "DynamicScheduler.h"
#include "StaticSchedule.h"

#include "Event/IR/EventOps.h"
#include "Event/Transforms/Passes.h"
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
