//===- Passes.td - Passes of the event dialect ------------*- tablegen -*-===//

#ifndef ETC_EVENT_TRANSFORMS_PASSES_TD
#define ETC_EVENT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

#endif // ETC_EVENT_TRANSFORMS_PASSES_TD
