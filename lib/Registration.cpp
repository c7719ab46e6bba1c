//===- Registration.cpp - Register ETC's dialects and passes ----*- C++ -*-===//

#include "Registration.h"

#include "Event/IR/EventDialect.h"
#include "Conversion/Passes.h"
#include "Event/Transforms/Passes.h"
#include "Pipelines.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/AMX/Transforms.h"
#include "mlir/Dialect/X86Vector/X86VectorDialect.h"
#include "mlir/IR/DialectRegistry.h"

void etc::registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<event::EventDialect>();
  // The CPU matmul tiles emit AMX and x86vector ops, and etc-lower-to-cpu
  // converts the dialects it leaves to LLVM through their conversion
  // interfaces (AMX's tiles in block arguments among them): all are ETC's
  // to register, whatever else a context has.
  registry.insert<mlir::amx::AMXDialect, mlir::x86vector::X86VectorDialect>();
  mlir::registerConvertAMXToLLVMInterface(registry);
  mlir::arith::registerConvertArithToLLVMInterface(registry);
  mlir::cf::registerConvertControlFlowToLLVMInterface(registry);
  mlir::registerConvertFuncToLLVMInterface(registry);
  mlir::index::registerConvertIndexToLLVMInterface(registry);
  mlir::registerConvertMathToLLVMInterface(registry);
  mlir::registerConvertMemRefToLLVMInterface(registry);
  mlir::ub::registerConvertUBToLLVMInterface(registry);
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
