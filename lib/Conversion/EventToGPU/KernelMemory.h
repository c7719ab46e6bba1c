//===- KernelMemory.h - Where a GPU program's memory lives ------*- C++ -*-===//

#ifndef ETC_LIB_CONVERSION_EVENTTOGPU_KERNELMEMORY_H
#define ETC_LIB_CONVERSION_EVENTTOGPU_KERNELMEMORY_H

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"

namespace etc {

/// The discardable attribute convert-event-to-gpu puts on each
/// `event.scratch` in a `gpu.module`: its byte offset in the CTA's scratch
/// arena.
constexpr llvm::StringLiteral kArenaOffsetAttrName = "event.arena_offset";

/// The module attribute that records, per `gpu.module` (by name) that needs
/// any, the bytes of dynamic shared memory its worker must be launched with:
/// the largest scratch of any one function.
constexpr llvm::StringLiteral kDynamicSharedBytesAttrName =
    "event.dynamic_shared_bytes";

/// The alignment of every scratch buffer in the arena (16-byte vector and
/// `cp.async` accesses).
constexpr int64_t kScratchAlignment = 16;

/// Lays out the `event.scratch` buffers of every `gpu.module` of `module` in
/// one arena per CTA: a CTA runs one tile at a time, so each function's
/// buffers start at offset 0 and the arena is as large as the largest
/// function's. Annotates each scratch op with its offset and records the
/// arena sizes on `module`. Fails, naming the ops, when a scratch buffer has
/// a dynamic shape or non-scalar elements, or when a function with scratch
/// calls, directly or not, another function with scratch (their buffers
/// would overlap).
mlir::LogicalResult planScratchArenas(mlir::ModuleOp module);

/// Gives the functions of `kernels` that the kernels call global-memory
/// pointers where every call passes a buffer of the program (an
/// `event.buffer`, or a view of one): each such memref parameter becomes a
/// memref in NVPTX's global address space, 1 (its views too), and the calls
/// cast what they pass, so that the function's loads and stores are
/// `ld.global` / `st.global` and its `cp.async` reads global memory. (A
/// generic pointer cast to global and back at the function's entry does
/// not do it: LLVM's optimiser folds the pair away before the NVPTX
/// backend infers address spaces.)
void markGlobalArguments(mlir::gpu::GPUModuleOp kernels);

} // namespace etc

#endif // ETC_LIB_CONVERSION_EVENTTOGPU_KERNELMEMORY_H
