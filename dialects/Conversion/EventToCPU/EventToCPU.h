//===- EventToCPU.h - Event ops for CPU worker threads ----------*- C++ -*-===//

#ifndef ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H
#define ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Transforms/DialectConversion.h"

namespace etc {

/// The symbol `event.wait` calls between two polls of its counter.
inline constexpr llvm::StringLiteral kSchedYieldName = "sched_yield";

/// Declares `func.func private @sched_yield() -> i32` in `module` unless it
/// is there; fails with an error if the symbol has another meaning.
mlir::LogicalResult declareSchedYield(mlir::ModuleOp module);

/// Converts `!event.tensor` to `!llvm.ptr` (the address of its first
/// counter) and leaves every other type alone.
void populateEventToCPUTypeConversions(mlir::TypeConverter &typeConverter);

/// Adds the patterns that lower `event.view`, `event.wait`, `event.notify`,
/// `event.notify_ready`, the queue ops and the lane ops for CPU worker
/// threads. `event.wait` and `event.queue_pop` call `@sched_yield`, which
/// `declareSchedYield` must have declared; they also poll the stop flag, the
/// last argument of their function, and give up when it is set.
/// `event.worker_id` / `event.worker_count` are not covered: they become
/// function arguments, with the stop flag after them (see
/// `convert-event-to-cpu`).
void populateEventToCPUConversionPatterns(
    const mlir::TypeConverter &typeConverter,
    mlir::RewritePatternSet &patterns);

} // namespace etc

#endif // ETC_CONVERSION_EVENTTOCPU_EVENTTOCPU_H
