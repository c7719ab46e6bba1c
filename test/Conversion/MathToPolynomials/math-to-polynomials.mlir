// RUN: etc-opt %s -split-input-file -convert-math-to-polynomials | FileCheck %s

// A vector exp becomes vector arithmetic: no math.exp is left for LLVM to
// scalarise into one expf call per lane.

// CHECK-LABEL: func.func @vector_exp(
// CHECK-NOT:     math.exp
// CHECK:         math.fma {{.*}} : vector<16xf32>
// CHECK-NOT:     math.exp
// CHECK:         return {{.*}} : vector<16xf32>
func.func @vector_exp(%x: vector<16xf32>) -> vector<16xf32> {
  %e = math.exp %x : vector<16xf32>
  return %e : vector<16xf32>
}

// -----

// Scalars too, and tanh.

// CHECK-LABEL: func.func @scalar_tanh(
// CHECK-NOT:     math.tanh
// CHECK:         return {{.*}} : f32
func.func @scalar_tanh(%x: f32) -> f32 {
  %t = math.tanh %x : f32
  return %t : f32
}
