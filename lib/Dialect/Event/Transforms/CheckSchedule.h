//===- CheckSchedule.h - Safety proof of a static schedule ------*- C++ -*-===//
//
// The proof behind `event-check-schedule`, shared with the schedulers that
// refuse to schedule a graph they cannot prove safe.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_DIALECT_EVENT_TRANSFORMS_CHECKSCHEDULE_H
#define ETC_LIB_DIALECT_EVENT_TRANSFORMS_CHECKSCHEDULE_H

#include "Event/IR/EventOps.h"

namespace etc::event {

/// Proves that `graph` (L2) runs to completion under the static global order
/// (tasks in textual order, tiles row-major) on co-resident workers: every
/// event is an `event.alloc` of the graph, every task waits only on events
/// notified by textually earlier tasks, every `count` equals the number of
/// notifies each element receives, and every affine wait stays inside its
/// event tensor. Emits an error naming the event and the tasks and fails
/// when any of this cannot be proved. Without `requireStaticOrder` the
/// textual-order rule is not checked: a schedule that runs tasks as they
/// become ready (the dynamic queue) only needs the graph acyclic, which the
/// graph verifier proves.
mlir::LogicalResult checkSchedule(GraphOp graph,
                                  bool requireStaticOrder = true);

} // namespace etc::event

#endif // ETC_LIB_DIALECT_EVENT_TRANSFORMS_CHECKSCHEDULE_H
