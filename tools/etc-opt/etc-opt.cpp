//===- etc-opt.cpp - ETC's pass driver --------------------------*- C++ -*-===//
//
// Registers every upstream dialect, pass, extension and LLVM IR translation
// plus ETC's own, then hands over to MlirOptMain.
//
//===----------------------------------------------------------------------===//

#include "Registration.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::registerAllDialects(registry);
  mlir::registerAllExtensions(registry);
  mlir::registerAllToLLVMIRTranslations(registry);
  mlir::registerAllPasses();
  etc::registerDialects(registry);
  etc::registerPassesAndPipelines();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "ETC (Event Tensor Compiler) optimizer driver\n", registry));
}
