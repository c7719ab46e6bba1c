//===- Pipelines.cpp - ETC's named pass pipelines ---------------*- C++ -*-===//
//
// Each pipeline is defined once here and registered by name, so etc-opt, the
// Python API and the lit tests run the same passes.
//
//===----------------------------------------------------------------------===//

#include "Pipelines.h"

#include "Conversion/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

void etc::buildLowerToCPUPipeline(mlir::OpPassManager &pm) {
  pm.addPass(createConvertEventToCPU());
}

void etc::registerPipelines() {
  mlir::PassPipelineRegistration<>(
      "etc-lower-to-cpu",
      "Lowers a scheduled event program (L3) to the LLVM dialect for the CPU "
      "runtime",
      buildLowerToCPUPipeline);
}
