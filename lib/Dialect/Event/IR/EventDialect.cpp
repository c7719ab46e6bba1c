//===- EventDialect.cpp - The event dialect ---------------------*- C++ -*-===//

#include "Event/IR/EventDialect.h"
#include "Event/IR/EventOps.h"
#include "Event/IR/EventTypes.h"


using namespace mlir;
using namespace etc::event;

#include "Event/IR/EventDialect.cpp.inc"

void EventDialect::initialize() {
  registerTypesAndAttributes();
  addOperations<
#define GET_OP_LIST
#include "Event/IR/EventOps.cpp.inc"
      >();
}
