//===- EventOps.h - Operations of the event dialect -------------*- C++ -*-===//

#ifndef ETC_EVENT_IR_EVENTOPS_H
#define ETC_EVENT_IR_EVENTOPS_H

#include "Event/IR/EventDialect.h"
#include "Event/IR/EventTypes.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "Event/IR/EventOps.h.inc"

#endif // ETC_EVENT_IR_EVENTOPS_H
