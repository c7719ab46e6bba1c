//===- EventDialect.h - The event dialect -----------------------*- C++ -*-===//

#ifndef ETC_EVENT_IR_EVENTDIALECT_H
#define ETC_EVENT_IR_EVENTDIALECT_H

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Dialect.h"

#include "Event/IR/EventDialect.h.inc"

#endif // ETC_EVENT_IR_EVENTDIALECT_H
