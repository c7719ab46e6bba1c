//===- EventTypes.h - Types and attributes of the event dialect -*- C++ -*-===//

#ifndef ETC_EVENT_IR_EVENTTYPES_H
#define ETC_EVENT_IR_EVENTTYPES_H

#include "mlir/IR/AffineMap.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"

#define GET_TYPEDEF_CLASSES
#include "Event/IR/EventTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "Event/IR/EventAttrs.h.inc"

namespace etc::event {

/// The first `mod`, `floordiv` or `ceildiv` in `map` whose divisor is not a
/// positive constant, or a null expression. Index maps and footprints must
/// have none: the affine lowering cannot expand them (upstream it asserts).
mlir::AffineExpr findNonPositiveDivisor(mlir::AffineMap map);

} // namespace etc::event

#endif // ETC_EVENT_IR_EVENTTYPES_H
