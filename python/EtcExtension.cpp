//===- EtcExtension.cpp - Python extension for ETC's dialects ---*- C++ -*-===//
//
// Linked against the `mlir` wheel's libMLIRPythonCAPI.so, so ETC's dialects
// and passes live in the same MLIR as `mlir.ir`; objects cross the boundary
// as MLIR C API capsules.
//
//===----------------------------------------------------------------------===//

#include "Registration.h"

#include "mlir-c/Bindings/Python/Interop.h"
#include "mlir/Bindings/Python/NanobindAdaptors.h"
#include "mlir/CAPI/ExecutionEngine.h"
#include "mlir/CAPI/IR.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/TargetSelect.h"

namespace nb = nanobind;

namespace {

/// An ExecutionEngine for `module` whose LLVM IR passes *and* code
/// generation run at `optLevel`. Upstream's C API (what
/// `mlir.execution_engine.ExecutionEngine` calls) records the level for code
/// generation, but its JIT compiles with the target machine made before,
/// whose level is LLVM's default (-O2): -O0 there still ran loop strength
/// reduction and the greedy register allocator.
nb::object createExecutionEngine(MlirModule module, int optLevel,
                                 bool enableObjectDump, bool enablePIC) {
  static bool initialized = [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmParser();
    llvm::InitializeNativeTargetAsmPrinter();
    return true;
  }();
  (void)initialized;
  if (optLevel < 0 || optLevel > 3)
    throw nb::value_error("opt_level must be 0, 1, 2 or 3");
  mlir::Operation *op = unwrap(mlirModuleGetOperation(module));
  mlir::MLIRContext &context = *op->getContext();
  mlir::registerBuiltinDialectTranslation(context);
  mlir::registerLLVMDialectTranslation(context);

  auto level = static_cast<llvm::CodeGenOptLevel>(optLevel);
  auto builder = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!builder)
    throw std::runtime_error(llvm::toString(builder.takeError()));
  builder->setCodeGenOptLevel(level);
  if (enablePIC)
    builder->setRelocationModel(llvm::Reloc::PIC_);
  auto machine = builder->createTargetMachine();
  if (!machine)
    throw std::runtime_error(llvm::toString(machine.takeError()));

  auto transformer = mlir::makeOptimizingTransformer(optLevel, /*sizeLevel=*/0,
                                                     machine->get());
  mlir::ExecutionEngineOptions options;
  options.transformer = transformer;
  options.jitCodeGenOptLevel = level;
  options.enableObjectDump = enableObjectDump;
  auto engine = mlir::ExecutionEngine::create(op, options, std::move(*machine));
  if (!engine) {
    // The translation's diagnostics went to the context's handlers.
    llvm::consumeError(engine.takeError());
    throw std::runtime_error("the module could not be translated to LLVM IR");
  }
  MlirExecutionEngine wrapped = wrap(engine->release());
  return nb::steal<nb::object>(mlirPythonExecutionEngineToCapsule(wrapped));
}

} // namespace

NB_MODULE(_etc, m) {
  m.doc() = "ETC's dialects and passes for the upstream MLIR Python bindings";

  m.def(
      "register_dialects",
      [](MlirDialectRegistry registry) {
        etc::registerDialects(*unwrap(registry));
      },
      nb::arg("registry"),
      "Adds ETC's dialects to an mlir.ir.DialectRegistry.");

  m.def("create_execution_engine", &createExecutionEngine, nb::arg("module"),
        nb::arg("opt_level"), nb::arg("enable_object_dump"), nb::arg("enable_pic"),
        "An ExecutionEngine capsule (for mlir.execution_engine.ExecutionEngine."
        "_CAPICreate) whose IR passes and code generation both run at "
        "opt_level.");

  m.def(
      "register_passes", [] { etc::registerPassesAndPipelines(); },
      "Registers ETC's passes and pipelines for PassManager.parse.");
}
