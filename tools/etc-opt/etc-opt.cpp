//===- etc-opt.cpp - ETC's pass driver --------------------------*- C++ -*-===//
//
// Registers every upstream dialect, pass, extension and LLVM IR translation
// plus ETC's own, then hands over to MlirOptMain.
//
//===----------------------------------------------------------------------===//

#include "Registration.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"

#include <atomic>

using namespace mlir;

/// MlirOptMain, except that it also fails when a pass reported an error but
/// did not fail. Some upstream patterns do that (lower-affine emits "error:"
/// for a non-positive divisor and leaves the op unconverted), and etc-opt
/// must never print an error and exit 0. Mirrors upstream's
/// `MlirOptMain(argc, argv, inputFilename, outputFilename, registry)`.
static LogicalResult runOptMain(int argc, char **argv, StringRef inputFilename,
                                StringRef outputFilename,
                                DialectRegistry &registry) {
  llvm::InitLLVM initLLVM(argc, argv);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();
  // Passes may run on several threads; their diagnostics reach the handler
  // on the thread that emits them.
  std::atomic<bool> errorReported = false;
  // Under -verify-diagnostics, expected errors are the point of the run.
  if (!config.shouldVerifyDiagnostics()) {
    MlirOptMainConfig parsedPipeline = config;
    config.setPassPipelineSetupFn([parsedPipeline,
                                   &errorReported](PassManager &pm) {
      // Registered after the handler that prints, so it sees every
      // diagnostic first; failure() passes it on to be printed.
      pm.getContext()->getDiagEngine().registerHandler(
          [&errorReported](Diagnostic &diagnostic) {
            if (diagnostic.getSeverity() == DiagnosticSeverity::Error)
              errorReported = true;
            return failure();
          });
      return parsedPipeline.setupPassPipeline(pm);
    });
  }

  std::string errorMessage;
  std::unique_ptr<llvm::MemoryBuffer> input =
      openInputFile(inputFilename, &errorMessage);
  if (!input) {
    llvm::errs() << errorMessage << "\n";
    return failure();
  }
  std::unique_ptr<llvm::ToolOutputFile> output =
      openOutputFile(outputFilename, &errorMessage);
  if (!output) {
    llvm::errs() << errorMessage << "\n";
    return failure();
  }
  if (failed(MlirOptMain(output->os(), std::move(input), registry, config)) ||
      errorReported)
    return failure();
  output->keep();
  return success();
}

int main(int argc, char **argv) {
  DialectRegistry registry;
  registerAllDialects(registry);
  registerAllExtensions(registry);
  registerAllToLLVMIRTranslations(registry);
  registerAllPasses();
  etc::registerDialects(registry);
  etc::registerPassesAndPipelines();
  auto [inputFilename, outputFilename] = registerAndParseCLIOptions(
      argc, argv, "ETC (Event Tensor Compiler) optimizer driver\n", registry);
  return asMainReturnCode(
      runOptMain(argc, argv, inputFilename, outputFilename, registry));
}
