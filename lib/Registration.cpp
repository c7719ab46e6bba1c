//===- Registration.cpp - Register ETC's dialects and passes ----*- C++ -*-===//

#include "Registration.h"

#include "Event/IR/EventDialect.h"
#include "Event/Transforms/Passes.h"

#include "mlir/IR/DialectRegistry.h"

void etc::registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<event::EventDialect>();
}

void etc::registerPassesAndPipelines() {
  static bool registered = [] {
    event::registerEventPasses();
    return true;
  }();
  (void)registered;
}
