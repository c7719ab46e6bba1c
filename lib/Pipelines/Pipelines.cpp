//===- Pipelines.cpp - ETC's named pass pipelines ---------------*- C++ -*-===//
//
// Each pipeline is defined once here and registered by name, so etc-opt, the
// Python API and the lit tests run the same passes.
//
//===----------------------------------------------------------------------===//

#include "Pipelines.h"

#include "Conversion/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/GPU/Pipelines/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

void etc::buildLowerToCPUPipeline(mlir::OpPassManager &pm,
                                  const LowerToCPUOptions &options) {
  ConvertEventToCPUOptions event;
  event.watchdogMs = options.watchdogMs;
  pm.addPass(createConvertEventToCPU(event));
  // Vector exp and friends as polynomials, not one libm call per lane.
  pm.addPass(createConvertMathToPolynomials());
  // Structured control flow and affine index arithmetic first, so that the
  // remaining conversions see only arith, cf, memref, math and func.
  pm.addPass(mlir::createLowerAffinePass());
  pm.addPass(mlir::createSCFToControlFlowPass());
  // Subviews and other strided memrefs of the tile bodies become descriptor
  // arithmetic, which itself uses affine.apply.
  pm.addPass(mlir::memref::createExpandStridedMetadataPass());
  pm.addPass(mlir::createLowerAffinePass());
  // bf16 conversions become integer arithmetic here: LLVM would call
  // compiler-rt's __truncsfbf2, which the JIT cannot resolve (no process
  // defines it) unless the host has native bf16 conversions (AVX512-BF16).
  // f16 needs nothing: x86-64 with F16C and AArch64 convert natively, and
  // libgcc_s (GCC >= 12) defines the f16 builtins otherwise.
  mlir::arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(mlir::arith::createArithExpandOpsPass(expand));
  // The matmul tiles' x86 instructions: AVX-512 BF16 dot products
  // (x86vector) and AMX tile loads, stores and multiplies (amx), as LLVM's
  // x86 intrinsics; the other vector ops as before.
  mlir::ConvertVectorToLLVMPassOptions vector;
  vector.x86Vector = true;
  vector.amx = true;
  pm.addPass(mlir::createConvertVectorToLLVMPass(vector));
  // Everything else (arith, cf, func, index, math, memref, ub and amx's
  // tiles in block arguments) in one conversion through the dialects'
  // conversion interfaces (etc::registerDialects registers them), not one
  // pass and one walk of the module per dialect: the same IR, in half the
  // time on a large step graph (5.1 -> 2.6 s for a 2-layer Q4_K MoE).
  // cf and amx must convert together: AMX accumulators are carried across
  // K-loop iterations as block arguments of !amx.tile type, which
  // convert-cf-to-llvm's own type converter does not know.
  pm.addPass(mlir::createConvertToLLVMPass());
  pm.addPass(mlir::createReconcileUnrealizedCastsPass());
  // Folding and dead code only: block merging and the other region
  // simplifications find nothing to do in the converted tile bodies (the
  // same LLVM dialect out) and were half of this pass's time; LLVM's own
  // simplifycfg runs at -O1 and above.
  mlir::GreedyRewriteConfig canonicalize;
  canonicalize.setRegionSimplificationLevel(
      mlir::GreedySimplifyRegionLevel::Disabled);
  pm.addPass(mlir::createCanonicalizerPass(canonicalize));
}

void etc::buildLowerToNVVMPipeline(mlir::OpPassManager &pm,
                                   const LowerToNVVMOptions &options) {
  ConvertEventToGPUOptions event;
  event.watchdogMs = options.watchdogMs;
  event.lanes = options.lanes;
  event.minCtas = options.minCtas;
  pm.addPass(createConvertEventToGPU(event));
  // The upstream GPU pipeline: kernels to NVVM and LLVM, the target
  // attached, then each gpu.module serialised as PTX text ("isa"), which
  // needs no CUDA installation; the driver or ptxas assembles it.
  mlir::gpu::GPUToNVVMPipelineOptions nvvm;
  nvvm.cubinChip = options.chip;
  nvvm.cubinFeatures = options.features;
  nvvm.cubinFormat = "isa";
  nvvm.optLevel = options.optLevel;
  mlir::gpu::buildLowerToNVVMPassPipeline(pm, nvvm);
}

void etc::registerPipelines() {
  mlir::PassPipelineRegistration<LowerToCPUOptions>(
      "etc-lower-to-cpu",
      "Lowers a scheduled event program (L3) to the LLVM dialect for the CPU "
      "runtime; the tiles' x86vector and AMX ops become x86 intrinsics",
      buildLowerToCPUPipeline);
  mlir::PassPipelineRegistration<LowerToNVVMOptions>(
      "etc-lower-to-nvvm",
      "Lowers a scheduled event program (L3) to GPU kernels and PTX text "
      "(a gpu.binary) for the CUDA runtime",
      buildLowerToNVVMPipeline);
}
