// RUN: etc-opt %s -split-input-file -event-dynamic-schedule=workers=2 | FileCheck %s --enable-var-scope

// The all-gather of static-schedule-ranks.mlir, scheduled dynamically. The
// tiles of "use" wait on a symmetric event, which other ranks notify: no
// notifier of this rank takes it to zero, so the workers find its elements
// ready by polling. The counter buffer holds, after the pending counts and
// tile offsets, one *handled* flag per event counter (an !event.tensor<?>):
// `_init` sets it to 1 for every symmetric element that is not ready yet.
// A worker takes tiles with `event.queue_try_pop`, which never waits; when
// the queue has nothing published, it scans the symmetric elements, and the
// one whose `event.notify_ready` takes an arrived element's flag to zero
// readies its waiters as a local notifier would (pending counts, pushes).
// Finding nothing, it backs off with `event.idle`, whose watchdog names the
// first element that has not arrived, the event and the first tile waiting
// on it (tile i of "use" waits on element i; without a closed form for the
// first waiting task's wait, the task only).
// The send tiles notify with `event.remote_notify` and ready nobody here.

// CHECK-LABEL: func.func @gather_init(
// CHECK-SAME:      %{{[^:]*}}: memref<?xi64> {event.table}, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// CHECK-SAME:      event.ranks = 2 : i64
// CHECK-SAME:      event.schedule = "dynamic"
// CHECK:           %[[WAITING:.*]] = arith.cmpi sgt, %{{.*}}, %{{.*}} : i32
// CHECK-NEXT:      %[[FLAG:.*]] = arith.extui %[[WAITING]] : i1 to i32
// CHECK-NEXT:      %[[AT:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK-NEXT:      memref.store %[[FLAG]], %[[COUNTERS]][%[[AT]]] : memref<?xi32>

// CHECK-LABEL: func.func @gather_worker(
// CHECK-SAME:      %[[TABLE:[^:]*]]: memref<?xi64> {event.table}, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// CHECK-SAME:      event.ranks = 2 : i64
// CHECK-SAME:      event.schedule = "dynamic"
// CHECK-SAME:      event.transport = 9 : i64
// CHECK:         %[[PENDING:.*]] = event.view %[[COUNTERS]][%{{.*}}](%{{.*}}) : memref<?xi32> -> !event.tensor<?>
// CHECK:         %[[FLAGS:.*]] = event.view %[[COUNTERS]][%{{.*}}](%{{.*}}) : memref<?xi32> -> !event.tensor<?>
// CHECK:         scf.while (%[[SINCE:.*]] = %{{.*}}) : (i64) -> (i64, index) {
// CHECK:           %[[T:.*]] = event.queue_try_pop %[[COUNTERS]][%{{.*}}] capacity(%[[TOTAL:.*]]) : memref<?xi32>
// CHECK:           %[[LEFT:.*]] = arith.cmpi ne, %[[T]], %[[TOTAL]] : index
// CHECK:           %[[STOPPED:.*]] = event.run_aborted %[[COUNTERS]] : memref<?xi32>
// CHECK:           scf.condition(%{{.*}}) %[[SINCE]], %[[T]] : i64, index
// CHECK:         } do {
// CHECK:         ^bb0(%[[SINCE2:.*]]: i64, %[[T2:.*]]: index):
// CHECK:           %[[GOT:.*]] = arith.cmpi ult, %[[T2]], %[[TOTAL]] : index
// CHECK:           scf.if %[[GOT]] -> (i64) {
// CHECK:             event.put
// CHECK:             event.remote_notify %{{.*}}[%{{.*}}] rank(%{{.*}}) : !event.tensor<4, symmetric>
// CHECK-NOT:         event.notify_ready %{{.*}} : !event.tensor<4, symmetric>
// CHECK:           } else {
// CHECK:             %[[VIEW:.*]] = event.view %[[COUNTERS]][%{{.*}}]() : memref<?xi32> -> !event.tensor<4, symmetric>
// CHECK:             scf.for %[[L:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(
// CHECK:               %[[DONE:.*]] = event.test %[[FLAGS]][%{{.*}}] : !event.tensor<?>
// CHECK:               %[[ARRIVED:.*]] = event.test %[[VIEW]][%[[L]]] : !event.tensor<4, symmetric>
// CHECK:               %[[MINE:.*]] = event.notify_ready %[[FLAGS]][%{{.*}}] : !event.tensor<?>
// CHECK:               scf.if %[[MINE]] {
// CHECK:                 event.notify_ready %{{.*}}[%{{.*}}] per_lane : !event.tensor<?>
// CHECK:                 event.queue_push %{{.*}}, %[[COUNTERS]][%{{.*}}] capacity(%[[TOTAL]]) per_lane : memref<?xi32>
// CHECK:             event.idle %[[COUNTERS]] since(%[[SINCE2]]) on %{{.*}}[%[[AT:.*]]] site(%{{.*}}, %{{.*}}, %[[AT]]) : memref<?xi32>, !event.tensor<4, symmetric>
// CHECK:             event.idle %[[COUNTERS]] since(%[[SINCE2]]) on %{{.*}}[%{{.*}}] site(%{{.*}}, %{{.*}}) : memref<?xi32>, !event.tensor<4, symmetric>
// CHECK:             event.idle %[[COUNTERS]] since(%[[SINCE2]]) : memref<?xi32>

event.graph @gather(%x: memref<32x64xf32>, %y: memref<64x64xf32>,
                    %g: memref<64x64xf32> {event.intermediate, event.symmetric})
    attributes {event.ranks = 2 : i64} {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  %e = event.alloc() count(%c1) : !event.tensor<4, symmetric>
  event.task "send" grid(%c2, %c2)
      reads(%x : memref<32x64xf32> (d0, d1) -> (d0 * 16, 0) [16, ?])
      notifies(%e : !event.tensor<4, symmetric> (d0, d1)[s0] -> (d1, s0 * 2 + d0)) {
  ^bb0(%i: index, %p: index):
    %me = event.rank_id
    %row = arith.muli %i, %c16 : index
    %block = arith.muli %me, %c2 : index
    %first = arith.addi %block, %i : index
    %at = arith.muli %first, %c16 : index
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
