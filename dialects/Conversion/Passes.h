//===- Passes.h - ETC's conversion passes -----------------------*- C++ -*-===//

#ifndef ETC_CONVERSION_PASSES_H
#define ETC_CONVERSION_PASSES_H

#include "mlir/Pass/Pass.h"

namespace etc {

#define GEN_PASS_DECL
#include "Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Conversion/Passes.h.inc"

} // namespace etc

#endif // ETC_CONVERSION_PASSES_H
