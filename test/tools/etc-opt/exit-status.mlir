// RUN: not etc-opt %s -split-input-file -lower-affine 2>&1 | FileCheck %s --check-prefix=AFFINE
// RUN: not etc-opt %s -split-input-file -event-static-schedule -etc-lower-to-cpu 2>&1 | FileCheck %s --check-prefix=NOTIFY

// etc-opt exits non-zero whenever it printed an error, also when the pass
// that reported it did not fail: upstream lower-affine reports a
// non-positive divisor but leaves the op in place and succeeds.

// AFFINE: error: modulo by non-positive value is not supported
func.func @divisor(%n: index) -> index {
  %0 = affine.apply affine_map<()[s0] -> (s0 mod 0)>()[%n]
  return %0 : index
}

// -----

// A notify map with `mod 0` nested in another expression used to reach the
// affine lowering, which asserted; the task's verifier now names it.
// NOTIFY: error: 'event.task' op index map of notifies #0 '(d0) -> ((d0 mod 0) mod 4)': event index map divides by '0' in 'd0 mod 0'
event.graph @pipe(%n: index, %x: memref<?xf32>) {
  %e = event.alloc(%n) : !event.tensor<?>
  event.task "produce" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> ((d0 mod 0) mod 4)) {
  ^bb0(%i: index):
  }
}
