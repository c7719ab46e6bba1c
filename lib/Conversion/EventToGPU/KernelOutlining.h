//===- KernelOutlining.h - Kernels from a program's functions ---*- C++ -*-===//
//
// The steps with which `convert-event-to-gpu` makes the kernels of a
// program's `gpu.module`; private to lib/Conversion/EventToGPU.
//
//===----------------------------------------------------------------------===//

#ifndef ETC_LIB_CONVERSION_EVENTTOGPU_KERNELOUTLINING_H
#define ETC_LIB_CONVERSION_EVENTTOGPU_KERNELOUTLINING_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace etc {

/// The ops that make a function the persistent worker: they only mean
/// something when every CTA runs the function.
bool isWorkerOp(mlir::Operation *op);

/// Whether `kernel` pops tasks: thread 0 computes the popped task id for the
/// whole CTA and hands it over through a broadcast word in shared memory
/// (collective ops with a yes/no result use `bar.red.or` instead).
bool needsBroadcastWord(mlir::gpu::GPUFuncOp kernel);

/// Spreads each `event.any` loop at the top of `kernel` (a one-CTA kernel
/// with a result, `g_check`) over the CTA's threads: thread i takes
/// iterations i, i + threads, ...; one `bar.red.or` then gives every
/// thread the OR of all of them. With one thread it is the loop as it was.
void distributeAnyReductions(mlir::gpu::GPUFuncOp kernel);

/// Creates `gpu.func @<name>` in `kernels` from `func`, moving its body. A
/// function with a result gets one more argument, a `memref<1xT>` (`i64`
/// for `index`), and thread 0 of block 0 stores the returned value to it.
mlir::FailureOr<mlir::gpu::GPUFuncOp>
outlineKernel(mlir::func::FuncOp func, mlir::gpu::GPUModuleOp kernels);

/// Clones into `kernels` every function its kernels call and every
/// `memref.global` they read (directly or through the functions they call:
/// tile functions, the schedule's constant tables), so that the
/// `gpu.module` is self-contained: device code cannot reach the host's
/// symbols. A symbol several programs use gets one copy in each; `cloned`
/// collects the host originals.
mlir::LogicalResult
cloneCallees(mlir::gpu::GPUModuleOp kernels, mlir::SymbolTable &hostSymbols,
             llvm::SmallPtrSetImpl<mlir::Operation *> &cloned);

} // namespace etc

#endif // ETC_LIB_CONVERSION_EVENTTOGPU_KERNELOUTLINING_H
