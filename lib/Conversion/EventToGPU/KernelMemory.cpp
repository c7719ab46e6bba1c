//===- KernelMemory.cpp - Where a GPU program's memory lives --------------===//
//
// Two placement decisions of convert-event-to-gpu that need the whole
// gpu.module rather than one op: the tile functions' scratch buffers share
// one arena of dynamic shared memory per CTA (a CTA runs one tile at a
// time), and the buffers the worker hands to tile functions are global
// memory, which the functions are told so that they use global loads.
//
//===----------------------------------------------------------------------===//

#include "KernelMemory.h"

#include "Event/IR/EventOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace etc;
using namespace etc::event;

//===----------------------------------------------------------------------===//
// The scratch arena
//===----------------------------------------------------------------------===//

/// The functions `function` calls in `symbols`.
static SmallVector<Operation *> callees(Operation *function,
                                        SymbolTable &symbols) {
  SmallVector<Operation *> found;
  function->walk([&](func::CallOp call) {
    if (Operation *callee = symbols.lookup(call.getCallee()))
      found.push_back(callee);
  });
  return found;
}

/// Lays out the scratch ops of `function` from offset 0; returns the bytes
/// they take, or failure for a buffer without a static size.
static FailureOr<int64_t> layOutScratch(Operation *function) {
  Builder b(function->getContext());
  int64_t offset = 0;
  WalkResult result = function->walk([&](ScratchOp scratch) {
    MemRefType type = scratch.getType();
    if (!type.hasStaticShape() || !type.getElementType().isIntOrFloat()) {
      scratch.emitOpError("has type ")
          << type << "; a GPU scratch buffer needs a static shape and integer "
          << "or float elements (its bytes are reserved at launch)";
      return WalkResult::interrupt();
    }
    offset = llvm::alignTo(offset, kScratchAlignment);
    scratch->setAttr(kArenaOffsetAttrName, b.getI64IntegerAttr(offset));
    offset += type.getNumElements() *
              llvm::divideCeil(type.getElementTypeBitWidth(), 8);
    return WalkResult::advance();
  });
  if (result.wasInterrupted())
    return failure();
  return offset;
}

LogicalResult etc::planScratchArenas(ModuleOp module) {
  MLIRContext *context = module.getContext();
  SmallVector<NamedAttribute> sizes;
  for (auto kernels : module.getOps<gpu::GPUModuleOp>()) {
    SymbolTable symbols(kernels);
    llvm::DenseMap<Operation *, int64_t> own;
    int64_t arena = 0;
    for (Operation &op : kernels.getBody()->getOperations()) {
      if (!isa<FunctionOpInterface>(op))
        continue;
      FailureOr<int64_t> bytes = layOutScratch(&op);
      if (failed(bytes))
        return failure();
      if (*bytes)
        own[&op] = *bytes;
      arena = std::max(arena, *bytes);
    }
    // Every function's buffers start at the arena's start: one with
    // scratch must not run inside another one's.
    for (auto &[function, bytes] : own) {
      llvm::SetVector<Operation *> reached;
      SmallVector<Operation *> worklist = callees(function, symbols);
      while (!worklist.empty()) {
        Operation *callee = worklist.pop_back_val();
        if (!reached.insert(callee))
          continue;
        if (own.count(callee))
          return function->emitOpError("uses scratch memory and calls '")
                 << SymbolTable::getSymbolName(callee).getValue()
                 << "', which uses scratch memory too; in a GPU program's "
                 << "scratch arena their buffers would overlap";
        llvm::append_range(worklist, callees(callee, symbols));
      }
    }
    if (arena)
      sizes.push_back(NamedAttribute(
          kernels.getNameAttr(),
          IntegerAttr::get(IntegerType::get(context, 64), arena)));
  }
  if (!sizes.empty())
    module->setAttr(kDynamicSharedBytesAttrName,
                    DictionaryAttr::get(context, sizes));
  return success();
}

//===----------------------------------------------------------------------===//
// Global-memory arguments
//===----------------------------------------------------------------------===//

/// Whether `value` is a buffer of the program in global memory, given the
/// function arguments known to be: an `event.buffer`, a memref view of
/// one, or such an argument.
static bool isGlobalBuffer(Value value,
                           const llvm::DenseSet<Value> &globalArguments) {
  while (true) {
    if (globalArguments.contains(value))
      return true;
    Operation *def = value.getDefiningOp();
    if (!def)
      return false;
    if (isa<BufferOp>(def))
      return true;
    if (isa<memref::CastOp, memref::SubViewOp, memref::ReinterpretCastOp,
            memref::ExpandShapeOp, memref::CollapseShapeOp>(def)) {
      value = def->getOperand(0);
      continue;
    }
    return false;
  }
}

/// `type` in memory space `space`.
static MemRefType inSpace(MemRefType type, Attribute space) {
  return MemRefType::get(type.getShape(), type.getElementType(), type.getLayout(), space);
}

/// Gives the uses of `value`, now a memref in memory space `space`, what
/// they need: views of it (subview, cast, reshapes, strided metadata)
/// become views in that space, recursively; accesses (loads, stores,
/// `memref.dim`, cp.async, calls) take it as it is; any other use gets a
/// generic view of it.
static void retypeUses(Value value, Attribute space) {
  for (OpOperand &use : llvm::make_early_inc_range(value.getUses())) {
    Operation *user = use.getOwner();
    if (isa<memref::SubViewOp, memref::CastOp, memref::ReinterpretCastOp,
            memref::ExpandShapeOp, memref::CollapseShapeOp>(user)) {
      Value result = user->getResult(0);
      result.setType(inSpace(cast<MemRefType>(result.getType()), space));
      retypeUses(result, space);
      continue;
    }
    if (auto metadata = dyn_cast<memref::ExtractStridedMetadataOp>(user)) {
      Value base = metadata.getBaseBuffer();
      base.setType(inSpace(cast<MemRefType>(base.getType()), space));
      retypeUses(base, space);
      continue;
    }
    if (isa<memref::LoadOp, memref::StoreOp, memref::DimOp, vector::LoadOp, vector::StoreOp,
            vector::TransferReadOp, vector::TransferWriteOp, vector::MaskedLoadOp,
            vector::MaskedStoreOp, memref::ExtractAlignedPointerAsIndexOp,
            memref::MemorySpaceCastOp, nvgpu::DeviceAsyncCopyOp, func::CallOp>(user))
      continue;
    OpBuilder b(user);
    auto type = cast<MemRefType>(value.getType());
    use.set(memref::MemorySpaceCastOp::create(b, user->getLoc(),
                                              inSpace(type, Attribute()), value));
  }
}

void etc::markGlobalArguments(gpu::GPUModuleOp kernels) {
  SymbolTable symbols(kernels);
  // The call sites of each function of the module.
  llvm::DenseMap<Operation *, SmallVector<func::CallOp>> calls;
  kernels.walk([&](func::CallOp call) {
    if (Operation *callee = symbols.lookup(call.getCallee()))
      calls[callee].push_back(call);
  });
  // Optimistically every default-space memref argument of a called
  // function, then drop those some call passes anything else, until
  // nothing changes (a call chain passes a buffer down several levels).
  llvm::DenseSet<Value> global;
  for (auto &[callee, sites] : calls) {
    auto function = dyn_cast<func::FuncOp>(callee);
    if (!function || function.isExternal())
      continue;
    for (BlockArgument argument : function.getArguments()) {
      auto type = dyn_cast<MemRefType>(argument.getType());
      if (type && !type.getMemorySpace())
        global.insert(argument);
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (auto &[callee, sites] : calls) {
      auto function = dyn_cast<func::FuncOp>(callee);
      if (!function || function.isExternal())
        continue;
      for (BlockArgument argument : function.getArguments()) {
        if (!global.contains(argument))
          continue;
        for (func::CallOp call : sites) {
          if (!isGlobalBuffer(call.getOperand(argument.getArgNumber()), global)) {
            global.erase(argument);
            changed = true;
            break;
          }
        }
      }
    }
  }
  MLIRContext *context = kernels.getContext();
  // NVPTX's global address space as a plain integer: the function-to-LLVM
  // conversion, which lowers the signatures before the GPU one runs, maps
  // integer memory spaces, not #gpu.address_space.
  Attribute globalSpace = IntegerAttr::get(IntegerType::get(context, 64), 1);
  // In the module's order, so that the IR is the same on every run.
  SmallVector<BlockArgument> marked;
  for (auto function : kernels.getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    bool changed = false;
    for (BlockArgument argument : function.getArguments()) {
      if (!global.contains(argument))
        continue;
      marked.push_back(argument);
      argument.setType(inSpace(cast<MemRefType>(argument.getType()), globalSpace));
      changed = true;
    }
    if (changed)
      function.setType(FunctionType::get(
          context, function.getBody().getArgumentTypes(),
          function.getFunctionType().getResults()));
  }
  for (BlockArgument argument : marked)
    retypeUses(argument, globalSpace);
  // Calls now pass generic memrefs to global parameters (the worker's
  // table buffers) or the reverse (a global argument handed to a function
  // some other call gives a generic one): cast at the call.
  kernels.walk([&](func::CallOp call) {
    auto callee = dyn_cast_or_null<func::FuncOp>(symbols.lookup(call.getCallee()));
    if (!callee)
      return;
    OpBuilder b(call);
    for (auto [index, type] : llvm::enumerate(callee.getArgumentTypes())) {
      Value operand = call.getOperand(index);
      if (operand.getType() != type && isa<MemRefType>(type))
        call->setOperand(index, memref::MemorySpaceCastOp::create(b, call.getLoc(), type,
                                                                  operand));
    }
  });
}
