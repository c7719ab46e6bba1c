//===- Pipelines.h - ETC's named pass pipelines -----------------*- C++ -*-===//

#ifndef ETC_PIPELINES_H
#define ETC_PIPELINES_H

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace etc {

/// Adds `etc-lower-to-cpu`: a scheduled event program (L3) down to the LLVM
/// dialect, ready for the ExecutionEngine.
void buildLowerToCPUPipeline(mlir::OpPassManager &pm);

/// Registers the named pipelines with the global registry.
void registerPipelines();

} // namespace etc

#endif // ETC_PIPELINES_H
