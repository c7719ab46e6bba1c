// RUN: etc-opt %s -split-input-file -event-static-schedule=workers=2 | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -split-input-file -event-dynamic-schedule=auto=true | FileCheck %s --check-prefix=AUTO

// A graph on two ranks (an all-gather in front of a reader). Its scheduled
// functions carry the rank count and where the transport block starts in
// the buffer table (after the 3 + 3 + 3 words of the buffers), whose
// argument they mark. A notify of a symmetric event evaluates the map's
// rank (s0 is event.rank_id) and becomes event.remote_notify; the send
// task's body (not a tile call: cloned) keeps its event.put, now reading
// its buffers from the table. The symmetric event's count is not proved
// from this rank's notifies (they come from every rank): `_check` finds it
// balanced after the run.

// CHECK-LABEL: func.func @gather_init(
// CHECK-SAME:      %{{[^:]*}}: memref<?xi64> {event.table}
// CHECK-SAME:      event.ranks = 2 : i64
// CHECK-SAME:      event.transport = 9 : i64

// CHECK-LABEL: func.func @gather_worker(
// CHECK-SAME:      %[[TABLE:[^:]*]]: memref<?xi64> {event.table}, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// CHECK-SAME:      event.ranks = 2 : i64
// CHECK-SAME:      event.transport = 9 : i64
// CHECK-DAG:     %[[G:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<64x64xf32>
// CHECK-DAG:     %[[X:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<32x64xf32>
// CHECK:         %[[ME:.*]] = event.rank_id
// CHECK:         event.put %[[X]][%{{.*}}, %{{.*}}] [%{{.*}}, %{{.*}}] to %[[G]][%{{.*}}, %{{.*}}] rank(%[[P:[^)]*]])
// CHECK:         %[[S0:.*]] = event.rank_id
// CHECK:         %[[AT:.*]] = affine.apply #{{.*}}(%{{.*}}, %{{.*}})[%[[S0]]]
// CHECK:         event.remote_notify %{{.*}}[%[[AT]]] rank(%{{.*}}) : !event.tensor<4, symmetric>
// CHECK:         event.wait %{{.*}}[%{{.*}}] site(%{{.*}}) deferred : !event.tensor<4, symmetric>

// AUTO-LABEL: func.func @gather_worker(
// AUTO-SAME:      event.schedule = "static"
// AUTO:           event.remote_notify

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
