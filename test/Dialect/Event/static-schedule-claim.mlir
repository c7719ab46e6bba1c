// RUN: etc-opt %s -allow-unregistered-dialect -event-static-schedule="workers=4 policy=claim" -verify-diagnostics | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -allow-unregistered-dialect -event-dynamic-schedule="workers=4 auto=true policy=claim" | FileCheck %s --check-prefix=AUTO
// RUN: not etc-opt %s -allow-unregistered-dialect -event-dynamic-schedule="auto=true policy=greedy" 2>&1 | FileCheck %s --check-prefix=POLICY

// POLICY: error: event-dynamic-schedule: unsupported policy 'greedy' for the statically scheduled graphs; supported policies: round-robin, claim

// policy=claim: the workers share one counter, the word right after the n
// event counters, which g_counters makes room for and g_init zeroes. Each
// worker claims a first global tile, then walks the tasks carrying the
// task's first global tile o and the claimed tile t: while t lies in the
// task it runs tile t - o and claims the next; otherwise it moves on.
// The worker id and count are not needed.

// CHECK-LABEL: func.func @pipe_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>) -> index
// CHECK:         %[[STATE:.*]] = arith.addi %[[N]], %c1{{.*}} : index
// CHECK:         %[[SIZE:.*]] = arith.addi %[[STATE]], %c22 : index
// CHECK:         return %[[SIZE]] : index

// CHECK-LABEL: func.func @pipe_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]] : memref<?xi32>
// CHECK:         }
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT:    memref.store %[[ZERO]], %[[COUNTERS]][%[[N]]] : memref<?xi32>
// CHECK-NEXT:    return

// CHECK-LABEL: func.func @pipe_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-NOT:     event.worker_id
// CHECK:         %[[FIRST:.*]] = event.claim %[[COUNTERS]][%[[N]]] : memref<?xi32>
// CHECK:         scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[O:.*]] = %{{.*}}, %[[T:.*]] = %[[FIRST]]) -> (index, index) {
// CHECK:           %[[RESULTS:.*]]:2 = scf.index_switch %{{.*}} -> index, index
// Task "fill": tiles [o, o + 2n).
// CHECK:           case 0 {
// CHECK:             %[[COUNT0:.*]] = arith.muli %[[N]], %{{.*}} : index
// CHECK:             %[[END0:.*]] = arith.addi %[[O]], %[[COUNT0]] : index
// CHECK:             %[[LAST0:.*]] = scf.while (%[[AT:.*]] = %[[T]]) : (index) -> index {
// CHECK:               %[[IN0:.*]] = arith.cmpi ult, %[[AT]], %[[END0]] : index
// CHECK:               scf.condition(%[[IN0]]) %[[AT]] : index
// CHECK:             } do {
// CHECK:             ^bb0(%[[G:.*]]: index):
// CHECK:               %[[LOCAL:.*]] = arith.subi %[[G]], %[[O]] : index
// CHECK:               %[[J:.*]] = arith.remui %[[LOCAL]], %{{.*}} : index
// CHECK:               %[[I:.*]] = arith.divui %[[LOCAL]], %{{.*}} : index
// CHECK:               memref.store %{{.*}}, %{{.*}}[%[[I]], %[[J]]]
// CHECK:               event.notify %{{.*}}[%[[I]]] released : !event.tensor<?>
// CHECK-NEXT:          %[[NEXT0:.*]] = event.claim %[[COUNTERS]][%[[N]]] : memref<?xi32>
// CHECK-NEXT:          scf.yield %[[NEXT0]] : index
// CHECK:             scf.yield %[[COUNT0]], %[[LAST0]] : index, index
// Task "use": the wait, the body unless the run was stopped, then the claim
// (also after a stopped tile, so that the worker's loop ends).
// CHECK:           default {
// CHECK:             %[[END1:.*]] = arith.addi %[[O]], %[[N]] : index
// CHECK:             %[[LAST1:.*]] = scf.while (%[[AT:.*]] = %[[T]]) : (index) -> index {
// CHECK:               arith.cmpi ult, %[[AT]], %[[END1]] : index
// CHECK:             } do {
// CHECK:             ^bb0(%[[G:.*]]: index):
// CHECK:               %[[ROW:.*]] = arith.subi %[[G]], %[[O]] : index
// CHECK:               event.wait %{{.*}}[%[[ROW]]] site(%[[K]], %{{.*}}, %[[ROW]]) deferred : !event.tensor<?>
// CHECK:               scf.if %{{.*}} {
// CHECK:               }
// CHECK-NEXT:          %[[NEXT1:.*]] = event.claim %[[COUNTERS]][%[[N]]] : memref<?xi32>
// CHECK-NEXT:          scf.yield %[[NEXT1]] : index
// CHECK:             scf.yield %[[N]], %[[LAST1]] : index, index
// CHECK:           %[[OFFSET:.*]] = arith.addi %[[O]], %[[RESULTS]]#0 : index
// CHECK:           scf.yield %[[OFFSET]], %[[RESULTS]]#1 : index, index
// CHECK:         return

// The check looks at the event counters only: the claim word ends at the
// tile count plus the workers.
// CHECK-LABEL: func.func @pipe_check(
// CHECK-SAME:      %[[N:[^:]*]]: index
// CHECK:         scf.for %{{.*}} = %{{.*}} to %[[N]] step

// With auto, a graph without data-dependent events is scheduled statically
// under the policy given.
// AUTO-LABEL: func.func @pipe_worker(
// AUTO-SAME:      event.schedule = "static"
// AUTO:         event.claim
event.graph @pipe(%n: index, %x: memref<?x8xf32>, %h: memref<?x8xf32> {event.intermediate}) {
  %c2 = arith.constant 2 : index
  %e = event.alloc(%n) count(%c2) : !event.tensor<?>
  event.task "fill" grid(%n, %c2)
      writes(%x : memref<?x8xf32> (d0, d1) -> (d0, d1 * 4) [1, 4])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
    %one = arith.constant 1.0 : f32
    memref.store %one, %x[%i, %j] : memref<?x8xf32>
  }
  event.task "use" grid(%n)
      reads(%x : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      writes(%h : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %v = memref.load %x[%i, %c0] : memref<?x8xf32>
    event.lane_barrier
    memref.store %v, %h[%i, %c0] : memref<?x8xf32>
  }
}
