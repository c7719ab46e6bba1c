//===- Passes.h - Passes of the event dialect -------------------*- C++ -*-===//

#ifndef ETC_EVENT_TRANSFORMS_PASSES_H
#define ETC_EVENT_TRANSFORMS_PASSES_H

#include "Event/IR/EventOps.h"
#include "mlir/Pass/Pass.h"

namespace etc::event {

#define GEN_PASS_DECL
#include "Event/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Event/Transforms/Passes.h.inc"

} // namespace etc::event

#endif // ETC_EVENT_TRANSFORMS_PASSES_H
