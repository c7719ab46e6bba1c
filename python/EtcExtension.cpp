//===- EtcExtension.cpp - Python extension for ETC's dialects ---*- C++ -*-===//
//
// Linked against the `mlir` wheel's libMLIRPythonCAPI.so, so ETC's dialects
// and passes live in the same MLIR as `mlir.ir`; objects cross the boundary
// as MLIR C API capsules.
//
//===----------------------------------------------------------------------===//

#include "Registration.h"

#include "mlir/Bindings/Python/NanobindAdaptors.h"
#include "mlir/CAPI/IR.h"
#include "mlir/IR/DialectRegistry.h"

namespace nb = nanobind;

NB_MODULE(_etc, m) {
  m.doc() = "ETC's dialects and passes for the upstream MLIR Python bindings";

  m.def(
      "register_dialects",
      [](MlirDialectRegistry registry) {
        etc::registerDialects(*unwrap(registry));
      },
      nb::arg("registry"),
      "Adds ETC's dialects to an mlir.ir.DialectRegistry.");

  m.def(
      "register_passes", [] { etc::registerPassesAndPipelines(); },
      "Registers ETC's passes and pipelines for PassManager.parse.");
}
