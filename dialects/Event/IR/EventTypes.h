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

#endif // ETC_EVENT_IR_EVENTTYPES_H
