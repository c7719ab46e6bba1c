//===- MathToPolynomials.cpp - convert-math-to-polynomials ----------------===//
//
// Expands transcendental math ops into polynomials that vectorise, for the
// CPU target: LLVM turns `llvm.intr.exp` on a vector into one `expf` call
// per lane.
//
//===----------------------------------------------------------------------===//

#include "Conversion/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace etc {
#define GEN_PASS_DEF_CONVERTMATHTOPOLYNOMIALS
#include "Conversion/Passes.h.inc"
} // namespace etc

using namespace mlir;

namespace {
struct ConvertMathToPolynomialsPass
    : public etc::impl::ConvertMathToPolynomialsBase<
          ConvertMathToPolynomialsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    // Every op the upstream patterns know: exp, expm1, log, log1p, log2,
    // tanh, erf, erfc, atan, atan2, asin, acos, cbrt, sin, cos, rsqrt.
    populateMathPolynomialApproximationPatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};
} // namespace
