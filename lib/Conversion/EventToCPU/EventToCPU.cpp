//===- EventToCPU.cpp - convert-event-to-cpu --------------------------------------------===//
//
// Placeholder so the pass registry links while the pass is being written;
// it fails with a clear message instead of doing nothing.
//
//===----------------------------------------------------------------------===//

#include "Conversion/Passes.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"


namespace etc {
#define GEN_PASS_DEF_CONVERTEVENTTOCPU
#include "Conversion/Passes.h.inc"
} // namespace etc

namespace {
struct ConvertEventToCPUPass
    : public etc::impl::ConvertEventToCPUBase<ConvertEventToCPUPass> {
  using ConvertEventToCPUBase::ConvertEventToCPUBase;
  void runOnOperation() override {
    getOperation()->emitError("'convert-event-to-cpu' is not implemented yet");
    signalPassFailure();
  }
};
} // namespace
