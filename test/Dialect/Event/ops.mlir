// RUN: etc-opt %s -split-input-file | etc-opt -split-input-file | FileCheck %s
// RUN: etc-opt %s -split-input-file -mlir-print-op-generic | etc-opt -split-input-file | FileCheck %s

// Every op of the event dialect prints in its custom form and parses back.

// CHECK-LABEL: event.graph @types
// CHECK-SAME: (%{{[0-9a-z_]+}}: index, %{{[0-9a-z_]+}}: memref<?x64xf32>, %{{[0-9a-z_]+}}: memref<?x64xf32> {event.intermediate})
event.graph @types(%n: index, %x: memref<?x64xf32>, %h: memref<?x64xf32> {event.intermediate}) {
  %c4 = arith.constant 4 : index
  // CHECK: event.alloc(%{{[0-9a-z_]+}}) count(%{{[0-9a-z_]+}}) : !event.tensor<?x8>
  %a = event.alloc(%n) count(%c4) : !event.tensor<?x8>
  // CHECK: event.alloc() : !event.tensor<>
  %b = event.alloc() : !event.tensor<>
  // CHECK: event.alloc() count(%{{[0-9a-z_]+}}) : !event.tensor<2x3x4>
  %c = event.alloc() count(%c4) : !event.tensor<2x3x4>
}

// -----

// CHECK-LABEL: event.graph @task_clauses
event.graph @task_clauses(%n: index, %x: memref<?x64xf32>, %y: memref<?x64xf32>, %route: memref<?xi32>) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%n]
  %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
  %f = event.alloc() : !event.tensor<4>
  // CHECK: event.task "produce" grid(%[[ROWS:[0-9a-z_]+]], %{{[0-9a-z_]+}})
  // CHECK-SAME: reads(%{{[0-9a-z_]+}} : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
  // CHECK-SAME: writes(%{{[0-9a-z_]+}} : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
  // CHECK-SAME: notifies(%{{[0-9a-z_]+}} : !event.tensor<?> (d0, d1) -> (d0), %{{[0-9a-z_]+}} : !event.tensor<4> (d0, d1) -> (d0) indirect [0])
  // CHECK-SAME: indices(%{{[0-9a-z_]+}} : memref<?xi32>)
  // CHECK-SAME: attributes {note = "kept"}
  // CHECK-NEXT: ^bb0(%{{[0-9a-z_]+}}: index, %{{[0-9a-z_]+}}: index):
  event.task "produce" grid(%rows, %c2)
      reads(%x : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%y : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0),
               %f : !event.tensor<4> (d0, d1) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) attributes {note = "kept"} {
  ^bb0(%i: index, %j: index):
  }
  // CHECK: event.task "consume" grid(%[[ROWS]])
  // CHECK-SAME: reads(%{{[0-9a-z_]+}} : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
  // CHECK-SAME: waits(%{{[0-9a-z_]+}} : !event.tensor<?> (d0) -> (d0), %{{[0-9a-z_]+}} : !event.tensor<4> (d0) -> (d0 mod 4))
  event.task "consume" grid(%rows)
      reads(%y : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0), %f : !event.tensor<4> (d0) -> (d0 mod 4)) {
  ^bb0(%i: index):
  }
}

// -----

// CHECK-LABEL: func.func @imperative
// CHECK: %[[E:[0-9a-z_]+]] = event.view %{{[0-9a-z_]+}}[%{{[0-9a-z_]+}}](%{{[0-9a-z_]+}}) : memref<?xi32> -> !event.tensor<?x8>
// CHECK: event.wait %[[E]][%{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}] : !event.tensor<?x8>
// CHECK: event.notify %[[E]][%{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}] : !event.tensor<?x8>
// CHECK: event.worker_id
// CHECK: event.worker_count
// CHECK: event.lane_id
// CHECK: event.lane_count
// CHECK: event.lane_barrier
func.func @imperative(%counters: memref<?xi32>, %off: index, %n: index, %i: index) -> (index, index, index, index) {
  %e = event.view %counters[%off](%n) : memref<?xi32> -> !event.tensor<?x8>
  event.wait %e[%i, %i] : !event.tensor<?x8>
  event.notify %e[%i, %i] : !event.tensor<?x8>
  %w = event.worker_id
  %wc = event.worker_count
  %l = event.lane_id
  %lc = event.lane_count
  event.lane_barrier
  return %w, %wc, %l, %lc : index, index, index, index
}

// -----

// Attributes have a standalone form too.
// CHECK-LABEL: func.func @attributes
// CHECK-SAME: box = #event.box<(d0) -> (d0 * 8, 0) [8, ?]>
// CHECK-SAME: map = #event.map<(d0, d1) -> (d1, d0) indirect [-1, 0]>
func.func @attributes() attributes {
    box = #event.box<(d0) -> (d0 * 8, 0) [8, ?]>,
    map = #event.map<(d0, d1) -> (d1, d0) indirect [-1, 0]>} {
  return
}

// -----

// The dynamic scheduler's ready counts and task queue.
// CHECK-LABEL: func.func @queue
// CHECK:         %[[READY:.*]] = event.notify_ready %{{.*}}[%{{.*}}] : !event.tensor<?>
// CHECK:         event.queue_push %{{.*}}, %{{.*}}[%{{.*}}] capacity(%{{.*}}) : memref<?xi32>
// CHECK:         %{{.*}} = event.queue_pop %{{.*}}[%{{.*}}] capacity(%{{.*}}) : memref<?xi32>
func.func @queue(%counters: memref<?xi32>, %n: index, %q: index, %t: index) -> (i1, index) {
  %c0 = arith.constant 0 : index
  %pending = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  %ready = event.notify_ready %pending[%t] : !event.tensor<?>
  event.queue_push %t, %counters[%q] capacity(%n) : memref<?xi32>
  %popped = event.queue_pop %counters[%q] capacity(%n) : memref<?xi32>
  return %ready, %popped : i1, index
}

// -----

// The polling worker of the dynamic schedule on several ranks.
// CHECK-LABEL: func.func @polling
// CHECK:         %{{.*}} = event.queue_try_pop %{{.*}}[%{{.*}}] capacity(%{{.*}}) : memref<?xi32>
// CHECK:         %{{.*}} = event.test %{{.*}}[%{{.*}}] : !event.tensor<4, symmetric>
// CHECK:         %{{.*}} = event.idle %{{.*}} since(%{{.*}}) on %{{.*}}[%{{.*}}] site(%{{.*}}, %{{.*}}) : memref<?xi32>, !event.tensor<4, symmetric>
// CHECK:         %{{.*}} = event.idle %{{.*}} since(%{{.*}}) : memref<?xi32>
func.func @polling(%counters: memref<?xi32>, %n: index, %q: index, %since: i64)
    -> (index, i1, i64, i64) {
  %c0 = arith.constant 0 : index
  %t = event.queue_try_pop %counters[%q] capacity(%n) : memref<?xi32>
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  %ready = event.test %e[%c0] : !event.tensor<4, symmetric>
  %start = event.idle %counters since(%since) on %e[%c0] site(%t, %c0) : memref<?xi32>, !event.tensor<4, symmetric>
  %other = event.idle %counters since(%since) : memref<?xi32>
  return %t, %ready, %start, %other : index, i1, i64, i64
}

// -----

// A pop from a queue of capacity 0 is the worker loop of a program without
// tiles: it returns 0 at once. (A push into it is rejected: see invalid.mlir.)
// CHECK-LABEL: func.func @empty_queue
// CHECK:         %{{.*}} = event.queue_pop %{{.*}}[%{{.*}}] capacity(%{{.*}}) : memref<?xi32>
func.func @empty_queue(%counters: memref<?xi32>, %q: index) -> index {
  %c0 = arith.constant 0 : index
  %popped = event.queue_pop %counters[%q] capacity(%c0) : memref<?xi32>
  return %popped : index
}

// -----

// CHECK-LABEL: func.func @buffer(
// CHECK: event.buffer %{{[0-9a-z_]+}}[%{{[0-9a-z_]+}}] : memref<?xi64> -> memref<?x64xbf16>
func.func @buffer(%table: memref<?xi64>, %at: index) -> memref<?x64xbf16> {
  %b = event.buffer %table[%at] : memref<?xi64> -> memref<?x64xbf16>
  return %b : memref<?x64xbf16>
}

// -----

// CHECK-LABEL: func.func @lanes(
// CHECK: %{{[0-9a-z_]+}} = event.lane_reduce "add" %{{[0-9a-z_]+}} {group = 32 : i64} : f32
// CHECK: %{{[0-9a-z_]+}} = event.scratch : memref<4x32xf32>
func.func @lanes(%x: f32) -> (f32, memref<4x32xf32>) {
  %sum = event.lane_reduce "add" %x {group = 32} : f32
  %partials = event.scratch : memref<4x32xf32>
  return %sum, %partials : f32, memref<4x32xf32>
}

// -----

// Live bounds: a clause after `indices`, and the standalone attribute.
// CHECK-LABEL: event.graph @live_bounds
event.graph @live_bounds(%r: index, %len: memref<?xi32>, %first: memref<?xi32>) {
  %c8 = arith.constant 8 : index
  %done = event.alloc(%r) : !event.tensor<?>
  // CHECK: event.task "chunk" grid(%{{[0-9a-z_]+}}, %{{[0-9a-z_]+}})
  // CHECK-SAME: notifies(%{{[0-9a-z_]+}} : !event.tensor<?> (d0, d1) -> (d0))
  // CHECK-SAME: indices(%{{[0-9a-z_]+}} : memref<?xi32>, %{{[0-9a-z_]+}} : memref<?xi32>)
  // CHECK-SAME: live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0], d0 below (d0) -> (d0 + 1) of (d0, d1) -> (d1) indirect [1])
  // CHECK-SAME: attributes {note = "kept"}
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>, %first : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0) indirect [0],
           d0 below (d0) -> (d0 + 1) of (d0, d1) -> (d1) indirect [1])
      attributes {note = "kept"} {
  ^bb0(%i: index, %j: index):
  }
  // CHECK: event.task "all" grid
  // CHECK-NOT: live(
  event.task "all" grid(%r) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// CHECK-LABEL: func.func @live_attribute
// CHECK: bound = #event.live<d1 below (d0) -> (d0 ceildiv 8) of (d0, d1) -> (d0) indirect [0]>
func.func @live_attribute() attributes {
    bound = #event.live<d1 below (d0) -> (d0 ceildiv 8) of (d0, d1) -> (d0) indirect [0]>} {
  return
}

// -----

// The watchdog's view of a wait (its site: task, event number, tile), the
// run's status and the trace records.
// CHECK-LABEL: func.func @run_header
// CHECK:         event.wait %{{.*}}[%[[T:.*]]] site(%[[T]], %[[T]], %[[T]], %[[T]]) : !event.tensor<?>
// CHECK:         %{{.*}} = event.run_aborted %{{.*}} : memref<?xi32>
// CHECK:         event.trace_begin %{{.*}}[%{{.*}}] task(%[[T]]) tile(%[[T]], %[[T]]) : memref<?xi32>
// CHECK:         event.trace_end %{{.*}}[%{{.*}}] : memref<?xi32>
func.func @run_header(%counters: memref<?xi32>, %n: index, %t: index) -> i1 {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  event.wait %e[%t] site(%t, %t, %t, %t) : !event.tensor<?>
  %stopped = event.run_aborted %counters : memref<?xi32>
  event.trace_begin %counters[%n] task(%t) tile(%t, %t) : memref<?xi32>
  event.trace_end %counters[%n] : memref<?xi32>
  return %stopped : i1
}

// -----

// One acquire for several waits, one release for several notifies, and the
// per-lane forms of the dynamic scheduler's readying.
// CHECK-LABEL: func.func @released_notifies
// CHECK:         event.wait %{{.*}}[%{{.*}}] deferred : !event.tensor<?>
// CHECK-NEXT:    event.wait %{{.*}}[%{{.*}}] site(%{{.*}}, %{{.*}}, %{{.*}}) deferred : !event.tensor<?>
// CHECK-NEXT:    event.acquire
// CHECK-NEXT:    event.release
// CHECK-NEXT:    event.notify %[[E:.*]][%[[T:.*]]] released : !event.tensor<?>
// CHECK-NEXT:    %{{.*}} = event.notify_ready %[[E]][%[[T]]] released : !event.tensor<?>
// CHECK-NEXT:    %[[LAST:.*]] = event.notify_ready %[[E]][%[[T]]] per_lane : !event.tensor<?>
// CHECK-NEXT:    %{{.*}} = event.notify_ready %[[E]][%[[T]]] released per_lane : !event.tensor<?>
// CHECK-NEXT:    event.queue_push %[[T]], %{{.*}}[%{{.*}}] capacity(%{{.*}}) per_lane : memref<?xi32>
func.func @released_notifies(%counters: memref<?xi32>, %n: index, %t: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?>
  event.wait %e[%t] deferred : !event.tensor<?>
  event.wait %e[%t] site(%t, %t, %t) deferred : !event.tensor<?>
  event.acquire
  event.release
  event.notify %e[%t] released : !event.tensor<?>
  %ready = event.notify_ready %e[%t] released : !event.tensor<?>
  %last = event.notify_ready %e[%t] per_lane : !event.tensor<?>
  %both = event.notify_ready %e[%t] released per_lane : !event.tensor<?>
  event.queue_push %t, %counters[%n] capacity(%n) per_lane : memref<?xi32>
  return
}

// -----

// CHECK-LABEL: func.func @prefetch(
// CHECK:         event.prefetch %{{.*}}[%{{.*}}, %{{.*}}] [%{{.*}}, %{{.*}}] : memref<?x64xbf16>
// CHECK:         event.prefetch %{{.*}}[] [] : memref<f32>
func.func @prefetch(%w: memref<?x64xbf16>, %s: memref<f32>, %i: index, %n: index) {
  event.prefetch %w[%i, %i] [%n, %n] : memref<?x64xbf16>
  event.prefetch %s[] [] : memref<f32>
  return
}

// -----

// A graph on two ranks: symmetric buffers and event tensors, a task whose
// notify names the rank (s0 is the rank the task runs on) and whose body
// puts a tile into another rank's copy.

// CHECK-LABEL: event.graph @ranks
// CHECK-SAME:    %{{[0-9a-z_]+}}: memref<64x64xf32> {event.intermediate, event.symmetric}
// CHECK-SAME:    attributes {event.ranks = 2 : i64}
// CHECK:         event.alloc() count(%{{.*}}) : !event.tensor<4, symmetric>
// CHECK:         event.alloc() count(%{{.*}}) : !event.tensor<symmetric>
// CHECK:         notifies(%{{.*}} : !event.tensor<4, symmetric> (d0, d1)[s0] -> (d1, d0 + s0 * 2))
// CHECK:         %[[ME:.*]] = event.rank_id
// CHECK:         event.rank_count
// CHECK:         event.put %{{.*}}[%{{.*}}, %{{.*}}] [%{{.*}}, %{{.*}}] to %{{.*}}[%{{.*}}, %{{.*}}] rank(%{{.*}}) : memref<32x64xf32>, memref<64x64xf32>
// CHECK:         waits(%{{.*}} : !event.tensor<4, symmetric> (d0) -> (d0))
event.graph @ranks(%x: memref<32x64xf32>, %y: memref<64x64xf32>,
                   %g: memref<64x64xf32> {event.intermediate, event.symmetric})
    attributes {event.ranks = 2 : i64} {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %e = event.alloc() count(%c1) : !event.tensor<4, symmetric>
  %f = event.alloc() count(%c2) : !event.tensor<symmetric>
  event.task "send" grid(%c2, %c2)
      reads(%x : memref<32x64xf32> (d0, d1) -> (d0 * 16, 0) [16, ?])
      notifies(%e : !event.tensor<4, symmetric> (d0, d1)[s0] -> (d1, s0 * 2 + d0)) {
  ^bb0(%i: index, %p: index):
    %me = event.rank_id
    %n = event.rank_count
    %row = arith.muli %i, %c16 : index
    %at = arith.muli %me, %c16 : index
    %c0 = arith.constant 0 : index
    event.put %x[%row, %c0] [%c16, %c64] to %g[%at, %c0] rank(%p) : memref<32x64xf32>, memref<64x64xf32>
  }
  event.task "use" grid(%c4)
      reads(%g : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?])
      writes(%y : memref<64x64xf32> (d0) -> (d0 * 16, 0) [16, ?])
      waits(%e : !event.tensor<4, symmetric> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

// CHECK-LABEL: func.func @remote_notify(
// CHECK:         event.put %{{.*}}[%{{.*}}] [%{{.*}}] to %{{.*}}[%{{.*}}, %{{.*}}] rank(%{{.*}}) : memref<?xf32>, memref<2x?xf32>
// CHECK:         event.remote_notify %{{.*}}[%{{.*}}] rank(%{{.*}}) : !event.tensor<?, symmetric>
func.func @remote_notify(%counters: memref<?xi32>, %n: index, %t: index, %r: index,
                         %a: memref<?xf32>, %b: memref<2x?xf32>) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%n) : memref<?xi32> -> !event.tensor<?, symmetric>
  event.put %a[%t] [%n] to %b[%r, %t] rank(%r) : memref<?xf32>, memref<2x?xf32>
  event.remote_notify %e[%t] rank(%r) : !event.tensor<?, symmetric>
  return
}

// -----

// The static schedule's claim of the next global tile (policy=claim).
// CHECK-LABEL: func.func @claim
// CHECK:         %{{.*}} = event.claim %{{.*}}[%{{.*}}] : memref<?xi32>
func.func @claim(%counters: memref<?xi32>, %next: index) -> index {
  %t = event.claim %counters[%next] : memref<?xi32>
  return %t : index
}

// -----

// A lane's stall on a tile's mbarrier: as a tile function emits it, and with
// the counter buffer and site the schedule gives it.

// CHECK-LABEL: func.func @stall
// CHECK:         %{{.*}}, %{{.*}} = event.stall "full" barrier(%{{.*}}) stage(%{{.*}}) parity(%{{.*}}) since(%{{.*}}){{$}}
// CHECK:         %{{.*}}, %{{.*}} = event.stall "empty" barrier(%{{.*}}) stage(%{{.*}}) parity(%{{.*}}) since(%{{.*}}) on %{{.*}} site(%{{.*}}, %{{.*}}, %{{.*}}) : memref<?xi32>
func.func @stall(%counters: memref<?xi32>, %address: index, %s: index, %p: index,
                 %since: i64, %task: index, %i: index) -> (i64, i1, i64, i1) {
  %start, %give_up = event.stall "full" barrier(%address) stage(%s) parity(%p) since(%since)
  %start2, %give_up2 = event.stall "empty" barrier(%address) stage(%s) parity(%p) since(%since) on %counters site(%task, %i, %i) : memref<?xi32>
  return %start, %give_up, %start2, %give_up2 : i64, i1, i64, i1
}
