//===- EventDialect.h - The event dialect -----------------------*- C++ -*-===//

#ifndef ETC_EVENT_IR_EVENTDIALECT_H
#define ETC_EVENT_IR_EVENTDIALECT_H

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Dialect.h"

#include "Event/IR/EventDialect.h.inc"

namespace etc::event {
/// The unit attribute the schedulers put on a loop of an initialisation
/// function (`@g_init`) whose iterations are independent although they read
/// counters the function wrote before the loop: each iteration writes only
/// its own words or adds with atomics, and its queue pushes are `per_lane`.
/// The CUDA lowering spreads such a loop over the CTA's threads, like a loop
/// that only stores (also when it is nested in ops that write nothing
/// else); on the CPU it changes nothing.
inline constexpr llvm::StringLiteral kIndependentIterationsAttrName =
    "event.independent";

/// The unit attribute the schedulers put on a loop of an end-of-run check
/// (`@g_check`) whose one result is the OR (`i1`) of one independent test
/// per iteration, starting from false (`anyNonZero`). The CUDA lowering
/// spreads its iterations over the CTA's threads and ORs their results
/// with one reducing barrier; on the CPU it changes nothing.
inline constexpr llvm::StringLiteral kAnyReductionAttrName = "event.any";
} // namespace etc::event

#endif // ETC_EVENT_IR_EVENTDIALECT_H
