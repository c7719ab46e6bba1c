//===- Registration.cpp - Register ETC's dialects and passes ----*- C++ -*-===//

#include "Registration.h"

#include "Event/IR/EventDialect.h"
#include "Conversion/Passes.h"
#include "Event/Transforms/Passes.h"
#include "Pipelines.h"

#include "mlir/IR/DialectRegistry.h"

void etc::registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<event::EventDialect>();
}

void etc::registerPassesAndPipelines() {
  static bool registered = [] {
    event::registerEventPasses();
    registerConversionPasses();
    registerPipelines();
    return true;
  }();
  (void)registered;
}
