// RUN: etc-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the event dialect's verifiers and parsers, once.

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

// expected-error @+1 {{footprint offsets must not use symbols, found 1}}
func.func private @f() attributes {b = #event.box<(d0)[s0] -> (d0 * s0) [4]>}

// -----

// expected-error @+1 {{footprint has 2 offsets but 1 sizes}}
func.func private @f() attributes {b = #event.box<(d0) -> (d0, 0) [4]>}

// -----

// expected-error @+1 {{footprint dimension 1 covers the whole buffer ('?') so its offset must be 0}}
func.func private @f() attributes {b = #event.box<(d0) -> (0, d0 * 4) [4, ?]>}

// -----

// expected-error @+1 {{footprint size of dimension 0 must be positive or '?', found 0}}
func.func private @f() attributes {b = #event.box<(d0) -> (d0) [0]>}

// -----

// expected-error @+1 {{event index map may use one symbol (s0, the rank the task runs on), found 2}}
func.func private @f() attributes {m = #event.map<(d0)[s0, s1] -> (d0 + s0 + s1)>}

// -----

// expected-error @+1 {{event index map has 2 results but 1 indirect entries}}
func.func private @f() attributes {m = #event.map<(d0) -> (d0, 0) indirect [0]>}

// -----

// expected-error @+1 {{indirect entry of result 0 must be an index buffer number or -1, found -2}}
func.func private @f() attributes {m = #event.map<(d0) -> (d0) indirect [-2]>}

// -----

// expected-error @+1 {{event index map divides by '0' in 'd0 mod 0'; mod, floordiv and ceildiv need a positive constant divisor}}
func.func private @f() attributes {m = #event.map<(d0) -> ((d0 mod 0) mod 4)>}

// -----

// expected-error @+1 {{footprint offset map divides by '-32' in 'd0 floordiv -32'; mod, floordiv and ceildiv need a positive constant divisor}}
func.func private @f() attributes {b = #event.box<(d0) -> (d0 floordiv -32) [4]>}

// -----

//===----------------------------------------------------------------------===//
// event.graph
//===----------------------------------------------------------------------===//

// expected-error @+1 {{'event.graph' op returns nothing: outputs are written to buffer arguments, but found 1 result types}}
"event.graph"() ({
^bb0:
  "event.yield"() : () -> ()
}) {sym_name = "g", function_type = () -> i32} : () -> ()

// -----

// expected-error @+1 {{'event.graph' op argument #1 must be a memref buffer or an index dimension, found 'f32'}}
event.graph @g(%n: index, %x: f32) {
}

// -----

// expected-error @+1 {{'event.graph' op argument #0 attribute 'event.intermediate' must be a unit attribute}}
event.graph @g(%x: memref<4xf32> {event.intermediate = 1 : i32}) {
}

// -----

// expected-error @+1 {{'event.graph' op argument #0 is marked 'event.intermediate' but is not a memref buffer}}
event.graph @g(%n: index {event.intermediate}) {
}

// -----

// expected-error @+1 {{custom op 'event.graph' expects a body region with the tasks}}
event.graph @g(%n: index)

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  event.task "t" grid(%c1) {
  ^bb0(%i: index):
  }
  // expected-error @+1 {{'event.task' op name 't' is already used by another task}}
  event.task "t" grid(%c1) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>, %h: memref<8xf32> {event.intermediate}) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op reads intermediate buffer argument #1 (read #0) that no earlier task writes}}
  event.task "early" grid(%c1) reads(%h : memref<8xf32> (d0) -> (0) [?]) {
  ^bb0(%i: index):
  }
  event.task "late" grid(%c1) writes(%h : memref<8xf32> (d0) -> (0) [?]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() count(%c1) : !event.tensor<>
  // expected-error @+1 {{'event.task' op waits on an event that no task notifies (wait #0)}}
  event.task "orphan" grid(%c1) waits(%e : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %a = event.alloc() count(%c1) : !event.tensor<>
  %b = event.alloc() count(%c1) : !event.tensor<>
  // expected-error @+1 {{'event.task' op is part of a dependency cycle: 'ping' -> 'pong' -> 'ping'}}
  event.task "ping" grid(%c1) waits(%a : !event.tensor<> (d0) -> ()) notifies(%b : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
  event.task "pong" grid(%c1) waits(%b : !event.tensor<> (d0) -> ()) notifies(%a : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %a = event.alloc() count(%c1) : !event.tensor<>
  // expected-error @+1 {{'event.task' op is part of a dependency cycle: 'self' -> 'self'}}
  event.task "self" grid(%c1) waits(%a : !event.tensor<> (d0) -> ()) notifies(%a : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}

// -----

// Graphs and task bodies are affine scopes: a self-referencing affine.apply
// at their top level is a dominance error (the affine verifier used to look
// past them for a scope and recurse without end).
event.graph @g(%n: index) {
  // expected-error @+2 {{operand #0 does not dominate this use}}
  // expected-note @+1 {{operand defined here}}
  %r = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%r]
}

// -----

event.graph @g(%n: index) {
  event.task "t" grid(%n) {
  ^bb0(%i: index):
    // expected-error @+2 {{operand #1 does not dominate this use}}
    // expected-note @+1 {{operand defined here}}
    %r = affine.apply affine_map<(d0)[s0] -> (d0 + s0)>(%i)[%r]
  }
}

// -----

//===----------------------------------------------------------------------===//
// event.alloc / event.view
//===----------------------------------------------------------------------===//

event.graph @g(%n: index) {
  // expected-error @+1 {{'event.alloc' op expects 1 dynamic sizes for the '?' dimensions of '!event.tensor<?x4>', found 0}}
  %e = event.alloc() : !event.tensor<?x4>
}

// -----

event.graph @g(%n: index) {
  %c-1 = arith.constant -1 : index
  // expected-error @+1 {{'event.alloc' op expects a non-negative expected count, found -1}}
  %e = event.alloc(%n) count(%c-1) : !event.tensor<?>
}

// -----

event.graph @g() {
  %c-4 = arith.constant -4 : index
  // expected-error @+1 {{'event.alloc' op expects a non-negative dynamic size, found -4}}
  %e = event.alloc(%c-4) : !event.tensor<?>
}

// -----

func.func @f(%c: memref<?xi32>) {
  %o = arith.constant -8 : index
  // expected-error @+1 {{'event.view' op expects a non-negative offset into the counters, found -8}}
  %e = event.view %c[%o]() : memref<?xi32> -> !event.tensor<4>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %o: index, %n: index) {
  // expected-error @+1 {{'event.view' op expects 0 dynamic sizes for the '?' dimensions of '!event.tensor<4>', found 1}}
  %e = event.view %c[%o](%n) : memref<?xi32> -> !event.tensor<4>
  return
}

// -----

func.func @f(%c: memref<?xi64>, %o: index) {
  // expected-error @+1 {{'event.view' op operand #0 must be 1D memref of 32-bit signless integer values}}
  %e = event.view %c[%o]() : memref<?xi64> -> !event.tensor<4>
  return
}

// -----

//===----------------------------------------------------------------------===//
// event.task
//===----------------------------------------------------------------------===//

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op needs a non-empty name}}
  event.task "" grid(%c1) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c4 = arith.constant 4 : index
  %c0 = arith.constant 0 : index
  // expected-error @+1 {{'event.task' op grid dimension #1 is the constant 0; a task needs at least one tile}}
  event.task "t" grid(%c4, %c0) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op has 1 'reads' buffers but 0 footprints}}
  "event.task"(%c1, %x) <{name = "t", read_footprints = [], write_footprints = [], wait_maps = [], notify_maps = [], operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0>}> ({
  ^bb0(%i: index):
    "event.yield"() : () -> ()
  }) : (index, memref<8xf32>) -> ()
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op footprint of reads #0 has 2 tile indices but the grid has rank 1}}
  event.task "t" grid(%c1) reads(%x : memref<8xf32> (d0, d1) -> (d0) [4]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op footprint of writes #0 has 2 offsets but the buffer has rank 1}}
  event.task "t" grid(%c1) writes(%x : memref<8xf32> (d0) -> (d0, 0) [4, 4]) {
  ^bb0(%i: index):
  }
}

// -----

// Footprints and index maps inside a task are checked by the task, which
// names the clause and the map.
event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op footprint of reads #0 '(d0) -> (d0 ceildiv 0)': footprint offset map divides by '0' in 'd0 ceildiv 0'}}
  event.task "t" grid(%c1) reads(%x : memref<8xf32> (d0) -> (d0 ceildiv 0) [4]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() count(%c1) : !event.tensor<>
  // expected-error @+1 {{'event.task' op has 1 'waits' events but 0 index maps}}
  "event.task"(%c1, %e) <{name = "t", read_footprints = [], write_footprints = [], wait_maps = [], notify_maps = [], operandSegmentSizes = array<i32: 1, 0, 0, 1, 0, 0>}> ({
  ^bb0(%i: index):
    "event.yield"() : () -> ()
  }) : (index, !event.tensor<>) -> ()
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() count(%c1) : !event.tensor<4>
  // expected-error @+1 {{'event.task' op index map of waits #0 has 2 tile indices but the grid has rank 1}}
  event.task "t" grid(%c1) waits(%e : !event.tensor<4> (d0, d1) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() count(%c1) : !event.tensor<4>
  // expected-error @+1 {{'event.task' op index map of notifies #0 has 2 results but the event tensor has rank 1}}
  event.task "t" grid(%c1) notifies(%e : !event.tensor<4> (d0) -> (d0, d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c4 = arith.constant 4 : index
  %e = event.alloc() : !event.tensor<4>
  // expected-error @+1 {{'event.task' op index map of notifies #0 '(d0) -> ((d0 mod 0) mod 4)': event index map divides by '0' in 'd0 mod 0'; mod, floordiv and ceildiv need a positive constant divisor}}
  event.task "t" grid(%c4) notifies(%e : !event.tensor<4> (d0) -> ((d0 mod 0) mod 4)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c4 = arith.constant 4 : index
  %e = event.alloc() : !event.tensor<4>
  event.task "a" grid(%c4) notifies(%e : !event.tensor<4> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  // expected-error @+1 {{'event.task' op index map of waits #0 '(d0) -> (d0 floordiv -1)': event index map divides by '-1' in 'd0 floordiv -1'}}
  event.task "b" grid(%c4) waits(%e : !event.tensor<4> (d0) -> (d0 floordiv -1)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>, %r: memref<8xi32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() : !event.tensor<4>
  // expected-error @+1 {{'event.task' op index map of notifies #0 loads result 0 from index buffer 1 but the task has 1 index buffers}}
  event.task "t" grid(%c1) notifies(%e : !event.tensor<4> (d0) -> (d0) indirect [1]) indices(%r : memref<8xi32>) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>, %r: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op index buffer #0 must be a 1-D memref of integers, found 'memref<8xf32>'}}
  event.task "t" grid(%c1) indices(%r : memref<8xf32>) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op body has 2 arguments but the grid has rank 1 (one tile index per grid dimension)}}
  event.task "t" grid(%c1) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op tile index #0 must have type 'index', found 'i32'}}
  event.task "t" grid(%c1) {
  ^bb0(%i: i32):
  }
}

// -----

event.graph @g(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{custom op 'event.task' expects a body region with one block whose arguments are the tile indices}}
  event.task "t" grid(%c1) {}
}

// -----

func.func @f(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.task' op expects parent op 'event.graph'}}
  event.task "t" grid(%c1) {
  ^bb0(%i: index):
  }
  return
}

// -----

//===----------------------------------------------------------------------===//
// event.wait / event.notify
//===----------------------------------------------------------------------===//

func.func @f(%c: memref<?xi32>, %o: index, %i: index) {
  %e = event.view %c[%o]() : memref<?xi32> -> !event.tensor<4x4>
  // expected-error @+1 {{'event.wait' op expects 2 indices for '!event.tensor<4x4>', found 1}}
  event.wait %e[%i] : !event.tensor<4x4>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %o: index, %i: index) {
  %e = event.view %c[%o]() : memref<?xi32> -> !event.tensor<4>
  // expected-error @+1 {{'event.notify' op expects 1 indices for '!event.tensor<4>', found 2}}
  event.notify %e[%i, %i] : !event.tensor<4>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %o: index, %i: index) {
  %e = event.view %c[%o]() : memref<?xi32> -> !event.tensor<4x4>
  // expected-error @+1 {{'event.notify_ready' op expects 2 indices for '!event.tensor<4x4>', found 1}}
  %r = event.notify_ready %e[%i] : !event.tensor<4x4>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %q: index, %t: index) {
  %capacity = arith.constant 2147483647 : index
  // expected-error @+1 {{'event.queue_push' op expects a capacity in [1, 2147483647) so that task ids fit the 32-bit slots and a push can succeed, found 2147483647}}
  event.queue_push %t, %c[%q] capacity(%capacity) : memref<?xi32>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %q: index) -> index {
  %capacity = arith.constant -1 : index
  // expected-error @+1 {{'event.queue_pop' op expects a capacity in [0, 2147483647) so that task ids fit the 32-bit slots, found -1}}
  %t = event.queue_pop %c[%q] capacity(%capacity) : memref<?xi32>
  return %t : index
}

// -----

func.func @f(%c: memref<?xi32>, %q: index, %t: index) {
  %capacity = arith.constant 0 : index
  // expected-error @+1 {{'event.queue_push' op expects a capacity in [1, 2147483647) so that task ids fit the 32-bit slots and a push can succeed, found 0}}
  event.queue_push %t, %c[%q] capacity(%capacity) : memref<?xi32>
  return
}

// -----

func.func @f(%table: memref<?xi64>, %at: index) {
  // expected-error @+1 {{'event.buffer' op result type 'memref<4x4xf32, strided<[8, 1]>>' must have the identity layout: the buffer table describes contiguous row-major buffers}}
  %b = event.buffer %table[%at] : memref<?xi64> -> memref<4x4xf32, strided<[8, 1]>>
  return
}

// -----

func.func @wait_site(%e: !event.tensor<4>, %i: index) {
  // expected-error @+1 {{'event.wait' op expects a site of a task, an event and the tile's coordinates, found 1 value}}
  event.wait %e[%i] site(%i) : !event.tensor<4>
  return
}

// -----

func.func @f(%table: memref<?xi64>, %at: index) {
  // expected-error @+1 {{'event.buffer' op result type 'memref<4xf32, 3>' must be in the default memory space}}
  %b = event.buffer %table[%at] : memref<?xi64> -> memref<4xf32, 3>
  return
}

// -----

func.func @f(%x: f32) -> f32 {
  // expected-error @+1 {{'event.lane_reduce' op group must be a power of two from 1 to 32 (lanes of one warp on CUDA), found 48}}
  %r = event.lane_reduce "add" %x {group = 48} : f32
  return %r : f32
}

// -----

func.func @f(%x: f32) -> f32 {
  // expected-error @+1 {{'event.lane_reduce' op kind must be 'add' or 'maxnumf', found 'mul'}}
  %r = event.lane_reduce "mul" %x {group = 4} : f32
  return %r : f32
}

// -----

func.func @f() {
  // expected-error @+1 {{'event.scratch' op result type 'memref<8xf32, 3>' must have the identity layout and the default memory space; the target places the buffer}}
  %s = event.scratch : memref<8xf32, 3>
  return
}

// -----

func.func @f(%x: f32) -> f32 {
  // expected-error @+1 {{'event.lane_reduce' op stride must be a power of two with group * stride <= 32 (one warp on CUDA), found stride 8 with group 8}}
  %r = event.lane_reduce "add" %x {group = 8, stride = 8} : f32
  return %r : f32
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 bounds tile index d2 but the grid has rank 2}}
  event.task "t" grid(%r, %r) indices(%len : memref<?xi32>)
      live(d2 below (d0) -> (d0) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 has a position map with 1 tile indices but the grid has rank 2}}
  event.task "t" grid(%r, %r) indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 loads its value from index buffer 1 but the task has 1 index buffers}}
  event.task "t" grid(%r) indices(%len : memref<?xi32>)
      live(d0 below (d0) -> (d0) of (d0) -> (d0) indirect [1]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 'd0 below (d0) -> (d0) of (d0) -> (d0)': live bound position map must load one value from an index buffer ('indirect [k]' on its one result)}}
  event.task "t" grid(%r) indices(%len : memref<?xi32>)
      live(d0 below (d0) -> (d0) of (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 'd0 below (d0, d1) -> (d0) of (d0) -> (d0)': live bound map must take the loaded value as its one dimension and give one result, found (d0, d1) -> (d0)}}
  event.task "t" grid(%r) indices(%len : memref<?xi32>)
      live(d0 below (d0, d1) -> (d0) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+1 {{'event.task' op live bound #0 'd0 below (d0) -> (d0 ceildiv 0) of (d0) -> (d0)': live bound map divides by '0' in 'd0 ceildiv 0'; mod, floordiv and ceildiv need a positive constant divisor}}
  event.task "t" grid(%r) indices(%len : memref<?xi32>)
      live(d0 below (d0) -> (d0 ceildiv 0) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%r: index, %len: memref<?xi32>) {
  // expected-error @+2 {{expected the bounded tile index as 'd<N>'}}
  event.task "t" grid(%r) indices(%len : memref<?xi32>)
      live(x0 below (d0) -> (d0) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index):
  }
}

// -----

func.func @trace_rank(%counters: memref<?xi32>, %i: index) {
  // expected-error @+1 {{'event.trace_begin' op records at most 4 tile coordinates, found 5}}
  event.trace_begin %counters[%i] task(%i) tile(%i, %i, %i, %i, %i) : memref<?xi32>
  return
}

// -----

func.func @prefetch_rank(%w: memref<4x8xf32>, %i: index) {
  // expected-error @+1 {{'event.prefetch' op expects one offset and one size per dimension of the 2-d buffer, found 1 offsets and 2 sizes}}
  event.prefetch %w[%i] [%i, %i] : memref<4x8xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Several ranks
//===----------------------------------------------------------------------===//

// expected-error @+1 {{'event.graph' op attribute 'event.ranks' must be a positive integer (the number of devices), found 0 : i64}}
event.graph @g() attributes {event.ranks = 0 : i64} {
  %c0 = arith.constant 0 : index
}

// -----

// expected-error @+1 {{'event.graph' op argument #0 attribute 'event.symmetric' must be a unit attribute}}
event.graph @g(%x: memref<4xf32> {event.intermediate, event.symmetric = 1}) attributes {event.ranks = 2 : i64} {
  %c0 = arith.constant 0 : index
}

// -----

// expected-error @+1 {{'event.graph' op argument #0 is marked 'event.symmetric' but not 'event.intermediate': the runtime allocates symmetric buffers on every rank}}
event.graph @g(%x: memref<4xf32> {event.symmetric}) attributes {event.ranks = 2 : i64} {
  %c0 = arith.constant 0 : index
}

// -----

// expected-error @+1 {{'event.graph' op argument #0 is marked 'event.symmetric' but the graph has no 'event.ranks'}}
event.graph @g(%x: memref<4xf32> {event.intermediate, event.symmetric}) {
  %c0 = arith.constant 0 : index
}

// -----

event.graph @g() {
  %c1 = arith.constant 1 : index
  // expected-error @+1 {{'event.alloc' op allocates a symmetric event tensor in a graph without 'event.ranks'}}
  %e = event.alloc() count(%c1) : !event.tensor<symmetric>
}

// -----

event.graph @g() attributes {event.ranks = 2 : i64} {
  // expected-error @+1 {{'event.alloc' op allocates a symmetric event tensor without 'count': notifies from other ranks cannot be counted on this one}}
  %e = event.alloc() : !event.tensor<4, symmetric>
}

// -----

event.graph @g() attributes {event.ranks = 2 : i64} {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %e = event.alloc() count(%c1) : !event.tensor<4, symmetric>
  // expected-error @+1 {{'event.task' op index map of notifies #0 has 1 results but the event tensor has rank 1 (plus the rank of the notified copy)}}
  event.task "send" grid(%c2) notifies(%e : !event.tensor<4, symmetric> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @g(%r: memref<4xi32>) attributes {event.ranks = 2 : i64} {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %e = event.alloc() count(%c1) : !event.tensor<4, symmetric>
  // expected-error @+1 {{'event.task' op index map of notifies #0 loads the rank of a symmetric event from an index buffer; the rank must be affine}}
  event.task "send" grid(%c2) notifies(%e : !event.tensor<4, symmetric> (d0) -> (d0, d0) indirect [0, -1]) indices(%r : memref<4xi32>) {
  ^bb0(%i: index):
  }
}

// -----

func.func @f(%counters: memref<?xi32>, %i: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  // expected-error @+1 {{'event.notify' op notifies the symmetric event tensor '!event.tensor<4, symmetric>'; use 'event.remote_notify' with the target rank}}
  event.notify %e[%i] : !event.tensor<4, symmetric>
  return
}

// -----

func.func @f(%counters: memref<?xi32>, %i: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  // expected-error @+1 {{'event.notify_ready' op notifies the symmetric event tensor '!event.tensor<4, symmetric>'; use 'event.remote_notify' with the target rank}}
  %r = event.notify_ready %e[%i] : !event.tensor<4, symmetric>
  return
}

// -----

func.func @f(%counters: memref<?xi32>, %i: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4>
  // expected-error @+1 {{'event.remote_notify' op expects a symmetric event tensor (one copy per rank), found '!event.tensor<4>'}}
  event.remote_notify %e[%i] rank(%i) : !event.tensor<4>
  return
}

// -----

func.func @f(%counters: memref<?xi32>, %i: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  // expected-error @+1 {{'event.remote_notify' op expects 1 indices for '!event.tensor<4, symmetric>', found 2}}
  event.remote_notify %e[%i, %i] rank(%i) : !event.tensor<4, symmetric>
  return
}

// -----

func.func @f(%a: memref<4xf32>, %b: memref<4xf16>, %i: index) {
  // expected-error @+1 {{'event.put' op copies 'f32' elements into a buffer of 'f16'}}
  event.put %a[%i] [%i] to %b[%i] rank(%i) : memref<4xf32>, memref<4xf16>
  return
}

// -----

func.func @f(%a: memref<4x4xf32>, %b: memref<16xf32>, %i: index) {
  // expected-error @+1 {{'event.put' op expects one source offset and one size per dimension of the 2-d source, found 1 offsets and 2 sizes}}
  event.put %a[%i] [%i, %i] to %b[%i] rank(%i) : memref<4x4xf32>, memref<16xf32>
  return
}

// -----

func.func @f(%a: memref<4x4xf32>, %b: memref<16xf32>, %i: index) {
  // expected-error @+1 {{'event.put' op puts a 2-d box into a 1-d buffer; the destination needs at least as many dimensions}}
  event.put %a[%i, %i] [%i, %i] to %b[%i] rank(%i) : memref<4x4xf32>, memref<16xf32>
  return
}

// -----

func.func @f(%a: memref<4xf32>, %b: memref<2x4xf32>, %i: index) {
  // expected-error @+1 {{'event.put' op expects one destination offset per dimension of the 2-d destination, found 1}}
  event.put %a[%i] [%i] to %b[%i] rank(%i) : memref<4xf32>, memref<2x4xf32>
  return
}

// -----

func.func @f(%a: memref<4xf32, strided<[2]>>, %b: memref<4xf32>, %i: index) {
  // expected-error @+1 {{'event.put' op expects contiguous row-major buffers in the default memory space, found 'memref<4xf32, strided<[2]>>'}}
  event.put %a[%i] [%i] to %b[%i] rank(%i) : memref<4xf32, strided<[2]>>, memref<4xf32>
  return
}

// -----

func.func @f(%c: memref<?xi32>, %q: index) -> index {
  %capacity = arith.constant -1 : index
  // expected-error @+1 {{'event.queue_try_pop' op expects a capacity in [0, 2147483647) so that task ids fit the 32-bit slots, found -1}}
  %t = event.queue_try_pop %c[%q] capacity(%capacity) : memref<?xi32>
  return %t : index
}

// -----

func.func @f(%e: !event.tensor<4x4>, %i: index) -> i1 {
  // expected-error @+1 {{'event.test' op expects 2 indices for '!event.tensor<4x4>', found 1}}
  %ready = event.test %e[%i] : !event.tensor<4x4>
  return %ready : i1
}

// -----

func.func @idle_site(%c: memref<?xi32>, %since: i64, %e: !event.tensor<4>, %i: index) -> i64 {
  // expected-error @+1 {{'event.idle' op expects a site of a task, an event and the tile's coordinates, found 1 values}}
  %start = event.idle %c since(%since) on %e[%i] site(%i) : memref<?xi32>, !event.tensor<4>
  return %start : i64
}

// -----

func.func @idle_tile(%c: memref<?xi32>, %since: i64, %e: !event.tensor<4>, %i: index) -> i64 {
  // expected-error @+1 {{'event.idle' op records at most 4 tile coordinates, found 5}}
  %start = event.idle %c since(%since) on %e[%i] site(%i, %i, %i, %i, %i, %i, %i) : memref<?xi32>, !event.tensor<4>
  return %start : i64
}

// -----

func.func @idle_element(%c: memref<?xi32>, %since: i64, %e: !event.tensor<4x4>, %i: index) -> i64 {
  // expected-error @+1 {{'event.idle' op expects 2 indices for '!event.tensor<4x4>', found 1}}
  %start = event.idle %c since(%since) on %e[%i] site(%i, %i) : memref<?xi32>, !event.tensor<4x4>
  return %start : i64
}

// -----

func.func @idle_without_event(%c: memref<?xi32>, %since: i64, %i: index) -> i64 {
  // expected-error @+1 {{'event.idle' op names an element and a site only with 'on' an event tensor}}
  %start = "event.idle"(%c, %since, %i) {operandSegmentSizes = array<i32: 1, 1, 0, 1, 0>} : (memref<?xi32>, i64, index) -> i64
  return %start : i64
}

// -----

func.func @stall_role(%a: index, %since: i64) -> i64 {
  // expected-error @+1 {{'event.stall' op expects the role "full" or "empty", found "half"}}
  %start, %give_up = event.stall "half" barrier(%a) stage(%a) parity(%a) since(%since)
  return %start : i64
}

// -----

func.func @stall_no_site(%c: memref<?xi32>, %a: index, %since: i64) -> i64 {
  // expected-error @+1 {{'event.stall' op expects a site of a task and the tile's coordinates, found none}}
  %start, %give_up = event.stall "full" barrier(%a) stage(%a) parity(%a) since(%since) on %c site() : memref<?xi32>
  return %start : i64
}

// -----

func.func @stall_tile(%c: memref<?xi32>, %a: index, %since: i64) -> i64 {
  // expected-error @+1 {{'event.stall' op records at most 4 tile coordinates, found 5}}
  %start, %give_up = event.stall "full" barrier(%a) stage(%a) parity(%a) since(%since) on %c site(%a, %a, %a, %a, %a, %a) : memref<?xi32>
  return %start : i64
}

// -----

func.func @stall_site_without_counters(%a: index, %since: i64) -> i64 {
  // expected-error @+1 {{'event.stall' op names a site only 'on' a counter buffer}}
  %start, %give_up = "event.stall"(%a, %a, %a, %since, %a) {role = "full", operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1>} : (index, index, index, i64, index) -> (i64, i1)
  return %start : i64
}
