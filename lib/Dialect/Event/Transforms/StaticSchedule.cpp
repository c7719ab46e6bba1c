//===- StaticSchedule.cpp - event-static-schedule --------------------------------------------===//
//
// Placeholder so the pass registry links while the pass is being written;
// it fails with a clear message instead of doing nothing.
//
//===----------------------------------------------------------------------===//

#include "Event/Transforms/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"


namespace etc::event {
#define GEN_PASS_DEF_EVENTSTATICSCHEDULE
#include "Event/Transforms/Passes.h.inc"
} // namespace etc::event

namespace {
struct EventStaticSchedulePass
    : public etc::event::impl::EventStaticScheduleBase<EventStaticSchedulePass> {
  using EventStaticScheduleBase::EventStaticScheduleBase;
  void runOnOperation() override {
    getOperation()->emitError("'event-static-schedule' is not implemented yet");
    signalPassFailure();
  }
};
} // namespace
