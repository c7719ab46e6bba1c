//===- Pipelines.h - ETC's named pass pipelines -----------------*- C++ -*-===//

#ifndef ETC_PIPELINES_H
#define ETC_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

#include <string>

namespace etc {

/// Options of `etc-lower-to-nvvm`.
struct LowerToNVVMOptions : public mlir::PassPipelineOptions<LowerToNVVMOptions> {
  Option<std::string> chip{*this, "chip",
                           llvm::cl::desc("The GPU architecture, e.g. sm_90a"),
                           llvm::cl::init("sm_90a")};
  Option<std::string> features{
      *this, "features",
      llvm::cl::desc("PTX features; sm_90a needs +ptx80 or newer"),
      llvm::cl::init("+ptx80")};
  Option<int> optLevel{*this, "opt-level",
                       llvm::cl::desc("LLVM optimisation level (0 to 3)"),
                       llvm::cl::init(3)};
  Option<int64_t> watchdogMs{
      *this, "watchdog-ms",
      llvm::cl::desc("How long a wait or queue pop may spin, in "
                     "milliseconds, before the watchdog stops the run"),
      llvm::cl::init(5000)};
  Option<int64_t> lanes{
      *this, "lanes",
      llvm::cl::desc("Threads per worker CTA (a multiple of 32, at most "
                     "1024): the worker's .maxntid, set when not 128 or "
                     "with min-ctas"),
      llvm::cl::init(128)};
  Option<int64_t> minCtas{
      *this, "min-ctas",
      llvm::cl::desc("The worker's .minnctapersm (worker CTAs per SM), which "
                     "with .maxntid fixes its registers at entry for "
                     "setmaxnreg; 0: none"),
      llvm::cl::init(0)};
};

/// Options of `etc-lower-to-cpu`.
struct LowerToCPUOptions : public mlir::PassPipelineOptions<LowerToCPUOptions> {
  Option<int64_t> watchdogMs{
      *this, "watchdog-ms",
      llvm::cl::desc("How long a wait or queue pop may spin, in "
                     "milliseconds, before the watchdog stops the run"),
      llvm::cl::init(5000)};
};

/// Adds `etc-lower-to-cpu`: a scheduled event program (L3) down to the LLVM
/// dialect, ready for the ExecutionEngine.
void buildLowerToCPUPipeline(mlir::OpPassManager &pm,
                             const LowerToCPUOptions &options);

/// Adds `etc-lower-to-nvvm`: a scheduled event program (L3) down to a
/// `gpu.binary` whose object is PTX text for `options.chip`.
void buildLowerToNVVMPipeline(mlir::OpPassManager &pm,
                              const LowerToNVVMOptions &options);

/// Registers the named pipelines with the global registry.
void registerPipelines();

} // namespace etc

#endif // ETC_PIPELINES_H
