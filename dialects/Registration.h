//===- Registration.h - Register ETC's dialects and passes ------*- C++ -*-===//

#ifndef ETC_REGISTRATION_H
#define ETC_REGISTRATION_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace etc {

/// Adds ETC's dialects to `registry`.
void registerDialects(mlir::DialectRegistry &registry);

/// Registers ETC's passes and named pipelines with the global pass registry,
/// so `etc-opt`, `PassManager.parse` and the lit tests share one definition.
/// Idempotent.
void registerPassesAndPipelines();

} // namespace etc

#endif // ETC_REGISTRATION_H
