//===- StaticSchedule.h - The static schedule of a graph --------*- C++ -*-===//
//
// The static schedule of one planned graph, as `event-static-schedule`
// emits it; `event-dynamic-schedule` emits it too for the graphs it
// schedules statically (`auto`).
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_STATICSCHEDULE_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_STATICSCHEDULE_H

#include "GraphPlan.h"

#include "mlir/IR/Builders.h"

namespace etc::event {

/// How the static schedule's workers share the global tile order.
enum class StaticPolicy {
  /// Worker w of W runs the global tiles t with t mod W == w.
  RoundRobin,
  /// Each worker claims the next global tile from a shared counter.
  Claim,
};

/// The policy that `policy=` option text names, or failure.
mlir::FailureOr<StaticPolicy> parseStaticPolicy(llvm::StringRef text);

/// The `policy=` values `parseStaticPolicy` accepts, for error messages.
inline constexpr llvm::StringLiteral kStaticPolicies = "round-robin, claim";

/// Inserts the static schedule of the planned graph (the tables and
/// functions `event-static-schedule` documents) at `builder`, leaving the
/// graph itself in place. The graph must have passed `checkSchedule`.
void buildStaticSchedule(mlir::OpBuilder &builder, const GraphPlan &plan,
                         int64_t workers, bool trace = false,
                         StaticPolicy policy = StaticPolicy::RoundRobin);

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_STATICSCHEDULE_H
