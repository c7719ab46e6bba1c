//===- Registration.cpp - Register ETC's dialects and passes ----*- C++ -*-===//

#include "Registration.h"

#include "Event/IR/EventDialect.h"
#include "Conversion/Passes.h"
#include "Event/Transforms/Passes.h"
#include "Pipelines.h"

#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/AMX/Transforms.h"
#include "mlir/Dialect/X86Vector/X86VectorDialect.h"
#include "mlir/IR/DialectRegistry.h"

void etc::registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<event::EventDialect>();
  // The CPU matmul tiles emit AMX and x86vector ops, and etc-lower-to-cpu
  // converts AMX tiles in block arguments through AMX's LLVM conversion
  // interface: both are ETC's to register, whatever else a context has.
  registry.insert<mlir::amx::AMXDialect, mlir::x86vector::X86VectorDialect>();
  mlir::registerConvertAMXToLLVMInterface(registry);
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
