// RUN: etc-opt %s -split-input-file -event-check-schedule -verify-diagnostics | FileCheck %s

// Graphs the static order provably runs to completion pass unchanged.

// CHECK-LABEL: event.graph @ceildiv_rows
// CHECK: event.alloc(%{{.*}}) count(%{{.*}}) : !event.tensor<?>
event.graph @ceildiv_rows(%B: index, %x: memref<?x64xf32>, %h: memref<?x64xf32>, %y: memref<?x64xf32>) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
  event.task "scale" grid(%rows, %c2)
      writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
  }
  event.task "add" grid(%rows)
      reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

// A symbolic count: every row notifies the single counter.
// CHECK-LABEL: event.graph @symbolic_count
event.graph @symbolic_count(%n: index) {
  %c1 = arith.constant 1 : index
  %all = event.alloc() count(%n) : !event.tensor<>
  event.task "rows" grid(%n) notifies(%all : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
  event.task "total" grid(%c1) waits(%all : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}

// -----

// The count is a product of the dropped extents, computed in another order
// and through affine.apply; a transposed projection keeps d2 then d1.
// CHECK-LABEL: event.graph @product_count
event.graph @product_count(%a: index, %b: index, %c: index) {
  %count = affine.apply affine_map<()[s0, s1] -> (s1 * s0)>()[%a, %c]
  %e = event.alloc(%b) count(%count) : !event.tensor<?>
  %t = event.alloc(%c, %b) count(%a) : !event.tensor<?x?>
  event.task "p" grid(%a, %b, %c)
      notifies(%e : !event.tensor<?> (d0, d1, d2) -> (d1),
               %t : !event.tensor<?x?> (d0, d1, d2) -> (d2, d1)) {
  ^bb0(%i: index, %j: index, %k: index):
  }
  event.task "q" grid(%c, %b) waits(%e : !event.tensor<?> (d0, d1) -> (d1),
                                    %t : !event.tensor<?x?> (d0, d1) -> (d0, d1)) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

// Two notifiers add up; grid and event sizes computed by distinct but equal
// affine.apply ops are equal.
// CHECK-LABEL: event.graph @two_notifiers
event.graph @two_notifiers(%n: index) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 8)>()[%n]
  %rows2 = affine.apply affine_map<()[s0] -> (s0 ceildiv 8)>()[%n]
  %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
  event.task "left" grid(%rows2) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "right" grid(%rows) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "join" grid(%rows2) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

// Waits with `floordiv`: a 64-row block waits on the 32-row blocks' counter
// of ceildiv(B, 64) elements; constants too.
// CHECK-LABEL: event.graph @floordiv_wait
event.graph @floordiv_wait(%B: index) {
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %rows32 = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %rows64 = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%B]
  %e = event.alloc(%rows64) count(%c1) : !event.tensor<?>
  %f = event.alloc() count(%c5) : !event.tensor<3>
  event.task "wide" grid(%rows64) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "five" grid(%c5, %c3) notifies(%f : !event.tensor<3> (d0, d1) -> (d1)) {
  ^bb0(%i: index, %j: index):
  }
  event.task "narrow" grid(%rows32, %c5) waits(%e : !event.tensor<?> (d0, d1) -> (d0 floordiv 2),
                                               %f : !event.tensor<3> (d0, d1) -> (d1 floordiv 2)) {
  ^bb0(%i: index, %j: index):
  }
  event.task "last" grid(%c1) waits(%f : !event.tensor<3> (d0) -> (2)) {
  ^bb0(%i: index):
  }
}

// -----

// Without `count` the counters are counted at run time: indirect notifies
// are fine and balance is not proved.
// CHECK-LABEL: event.graph @indirect
event.graph @indirect(%n: index, %experts: index, %route: memref<?xi32>) {
  %done = event.alloc(%experts) : !event.tensor<?>
  event.task "produce" grid(%n)
      notifies(%done : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
  }
  event.task "consume" grid(%experts) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%e: index):
  }
}

// -----

event.graph @not_allocated(%n: index, %counters: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  // expected-error @+1 {{'event.task' op notifies #0 names an event that is not allocated by an 'event.alloc' of graph @not_allocated; the schedule cannot lay out its counters}}
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "q" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @later_notifier(%n: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op is waited on by task 'early' (wait #0) but notified by task 'late', which is not earlier in the static order}}
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "early" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "late" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @not_projection(%n: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op has a 'count' but notify #0 of task 'p' has map affine_map<(d0, d1) -> (d0 + d1)>, which is not a projected permutation of the tile indices}}
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "p" grid(%n, %n) notifies(%e : !event.tensor<?> (d0, d1) -> (d0 + d1)) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @repeated_dim(%n: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op has a 'count' but notify #0 of task 'p' has map affine_map<(d0, d1) -> (d0, d0)>, which is not a projected permutation}}
  %e = event.alloc(%n, %n) count(%c1) : !event.tensor<?x?>
  event.task "p" grid(%n, %n) notifies(%e : !event.tensor<?x?> (d0, d1) -> (d0, d0)) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @indirect_with_count(%n: index, %route: memref<?xi32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op has a 'count' but notify #0 of task 'p' loads its coordinates from an index buffer; only events without 'count' may be notified indirectly}}
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @size_mismatch(%n: index, %m: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op has a 'count' but notify #0 of task 'p' maps tile index d0 to event dimension 0, but the grid extent and the event size cannot be proved equal}}
  %e = event.alloc(%m) count(%c1) : !event.tensor<?>
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @wrong_count(%n: index) {
  %c3 = arith.constant 3 : index
  %c2 = arith.constant 2 : index
  // expected-error @+1 {{'event.alloc' op 'count' cannot be proved equal to the number of notifies each element receives from task 'p' (the product of their grid extents over the tile indices the notify maps drop)}}
  %e = event.alloc(%n) count(%c3) : !event.tensor<?>
  event.task "p" grid(%n, %c2) notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @unprovable_count(%n: index, %k: index) {
  // expected-error @+1 {{'event.alloc' op 'count' cannot be proved equal to the number of notifies each element receives from tasks 'p', 'q'}}
  %e = event.alloc() count(%k) : !event.tensor<>
  event.task "p" grid(%n) notifies(%e : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
  event.task "q" grid(%n) notifies(%e : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @shifted_wait(%n: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op is waited on by task 'q' (wait #0) whose coordinate 0 is 'd0 + 1'; only a tile index 'dN' or 'dN floordiv M' can be proved inside the event tensor}}
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "q" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0 + 1)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @wait_extent(%n: index, %m: index) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op is waited on by task 'q' (wait #0) whose coordinate 0 is 'd0', but the event size cannot be proved equal to the grid extent along d0}}
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "q" grid(%m) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @wait_floordiv(%n: index) {
  %c1 = arith.constant 1 : index
  %half = affine.apply affine_map<()[s0] -> (s0 ceildiv 2)>()[%n]
  %e = event.alloc(%half) count(%c1) : !event.tensor<?>
  event.task "p" grid(%half) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "ok" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0 floordiv 2)) {
  ^bb0(%i: index):
  }
  // expected-error @-7 {{'event.alloc' op is waited on by task 'bad' (wait #0) whose coordinate 0 is 'd0 floordiv 4', but the event size cannot be proved equal to the grid extent along d0 ceildiv 4}}
  event.task "bad" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0 floordiv 4)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @constant_wait(%n: index) {
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  // expected-error @+1 {{'event.alloc' op is waited on by task 'q' (wait #0) whose coordinate 0 is the constant 4, which cannot be proved inside the event size}}
  %e = event.alloc() count(%n) : !event.tensor<4>
  event.task "p" grid(%n, %c4) notifies(%e : !event.tensor<4> (d0, d1) -> (d1)) {
  ^bb0(%i: index, %j: index):
  }
  event.task "q" grid(%c1) waits(%e : !event.tensor<4> (d0) -> (4)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @never_notified(%n: index) {
  // expected-error @+1 {{'event.alloc' op has no 'count', so its expected counts are counted from its notifies, but no task notifies it}}
  %e = event.alloc(%n) : !event.tensor<?>
}

// -----

// Live bounds: an event notified by a predicated task has no `count` (the
// program counts its live notifiers); waiting on it is proved like any wait.
// CHECK-LABEL: event.graph @live_notifier
// CHECK: event.alloc(%{{.*}}) : !event.tensor<?>
// CHECK: live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0])
event.graph @live_notifier(%r: index, %len: memref<?xi32>) {
  %c8 = arith.constant 8 : index
  %done = event.alloc(%r) : !event.tensor<?>
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "combine" grid(%r) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @live_counted(%r: index, %len: memref<?xi32>) {
  %c8 = arith.constant 8 : index
  // expected-error @+1 {{'event.alloc' op has a 'count' but notify #0 of task 'chunk' runs only on the tiles its live bounds allow, so how many notifies an element receives is runtime data; only events without 'count' (counted on the device over live tiles) may be notified by it}}
  %done = event.alloc(%r) count(%c8) : !event.tensor<?>
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "combine" grid(%r) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @live_written_during_run(%r: index, %len: memref<?xi32>) {
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  event.task "lengths" grid(%c1) writes(%len : memref<?xi32> (d0) -> (0) [?]) {
  ^bb0(%i: index):
  }
  // expected-error @+1 {{'event.task' op live bound #0 loads its value from index buffer #0, which task 'lengths' writes during the run; which tiles run is decided before any task runs}}
  event.task "chunk" grid(%r, %c8)
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
}
