// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-static-schedule=workers=4 -verify-diagnostics | FileCheck %s
// RUN: not etc-opt %s -allow-unregistered-dialect -split-input-file -event-static-schedule=policy=greedy 2>&1 | FileCheck %s --check-prefix=POLICY

// POLICY: error: event-static-schedule: unsupported policy 'greedy'; supported policies: round-robin

// Two tasks joined by one counted event per row block: the counter buffer
// holds `rows` counters, g_init writes the count into each, and every worker
// walks both tasks' tiles from its first global index with step W.

// CHECK-LABEL: func.func @pipe_counters(
// CHECK-SAME:      %[[N:.*]]: index, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?x8xf32> {event.intermediate}) -> index
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK:         return %[[N]] : index

// CHECK-LABEL: func.func @pipe_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?x8xf32> {event.intermediate}, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK:         %[[C2:.*]] = arith.constant 2 : index
// CHECK:         %[[COUNT:.*]] = arith.index_cast %[[C2]] : index to i32
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      memref.store %[[COUNT]], %[[COUNTERS]][%[[I]]] : memref<?xi32>

// CHECK-LABEL: func.func @pipe_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[X:[^:]*]]: memref<?x8xf32>, %[[H:[^:]*]]: memref<?x8xf32> {event.intermediate}, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[C2:.*]] = arith.constant 2 : index
// CHECK:         %[[E:.*]] = event.view %[[COUNTERS]][%[[C0]]](%[[N]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:         %[[W:.*]] = event.worker_id
// CHECK:         %[[NW:.*]] = event.worker_count
// Task "fill": global indices [0, 2n).
// CHECK:         %[[END0:.*]] = arith.muli %[[N]], %[[C2]] : index
// CHECK:         %[[R0:.*]] = arith.remui %{{.*}}, %[[NW]] : index
// CHECK:         %[[S0:.*]] = arith.addi %[[W]], %[[NW]] : index
// CHECK:         %[[S1:.*]] = arith.subi %[[S0]], %[[R0]] : index
// CHECK:         %[[START0:.*]] = arith.remui %[[S1]], %[[NW]] : index
// CHECK:         scf.for %[[T:.*]] = %[[START0]] to %[[END0]] step %[[NW]] {
// CHECK:           %[[J:.*]] = arith.remui %[[T]], %[[C2]] : index
// CHECK:           %[[I:.*]] = arith.divui %[[T]], %[[C2]] : index
// CHECK:           memref.store %{{.*}}, %[[X]][%[[I]], %[[J]]]
// CHECK:           event.notify %[[E]][%[[I]]] : !event.tensor<?>
// CHECK:         }
// Task "use": global indices [2n, 3n).
// CHECK:         %[[END1:.*]] = arith.addi %[[END0]], %[[N]] : index
// CHECK:         %[[R1:.*]] = arith.remui %[[END0]], %[[NW]] : index
// CHECK:         %[[S2:.*]] = arith.addi %[[W]], %[[NW]] : index
// CHECK:         %[[S3:.*]] = arith.subi %[[S2]], %[[R1]] : index
// CHECK:         %[[S4:.*]] = arith.remui %[[S3]], %[[NW]] : index
// CHECK:         %[[START1:.*]] = arith.addi %[[END0]], %[[S4]] : index
// CHECK:         scf.for %[[T:.*]] = %[[START1]] to %[[END1]] step %[[NW]] {
// CHECK:           %[[ROW:.*]] = arith.subi %[[T]], %[[END0]] : index
// CHECK:           event.wait %[[E]][%[[ROW]]] : !event.tensor<?>
// CHECK:           memref.load %[[X]][%[[ROW]], %{{.*}}]
// CHECK:           event.lane_barrier
// CHECK:           memref.store %{{.*}}, %[[H]][%[[ROW]], %{{.*}}]
// CHECK:         }
// CHECK:         return
// After the run every counter must be back to zero: 2 (unbalanced) if not.
// CHECK-LABEL: func.func @pipe_check(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>) -> i32
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK:         %[[ANY:.*]] = scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[FOUND:.*]] = %false) -> (i1) {
// CHECK:           %[[COUNT:.*]] = memref.load %[[COUNTERS]][%[[I]]] : memref<?xi32>
// CHECK:           %[[NZ:.*]] = arith.cmpi ne, %[[COUNT]], %{{.*}} : i32
// CHECK:           %[[OR:.*]] = arith.ori %[[FOUND]], %[[NZ]] : i1
// CHECK:           scf.yield %[[OR]] : i1
// CHECK-DAG:     %[[CLEAN:.*]] = arith.constant 0 : i32
// CHECK-DAG:     %[[UNBALANCED:.*]] = arith.constant 2 : i32
// CHECK:         %[[STATUS:.*]] = arith.select %[[ANY]], %[[UNBALANCED]], %[[CLEAN]] : i32
// CHECK:         return %[[STATUS]] : i32
// CHECK-NOT:     event.graph @
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

// -----

// Two event tensors lie one after the other; a 2-D one is row-major. Without
// `count`, g_init zeroes the counters and counts the notifies of every tile,
// loading indirect coordinates from the index buffer.

// CHECK-LABEL: func.func @routed_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[E:[^:]*]]: index
// CHECK:         %[[SIZE1:.*]] = arith.muli %[[E]], %{{.*}} : index
// CHECK:         %[[TOTAL:.*]] = arith.addi %[[E]], %[[SIZE1]] : index
// CHECK:         return %[[TOTAL]] : index

// CHECK-LABEL: func.func @routed_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[E:[^:]*]]: index, %[[ROUTE:[^:]*]]: memref<?xi32>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         %[[SIZE1:.*]] = arith.muli %[[E]], %{{.*}} : index
// CHECK:         %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[E]] step
// CHECK-NEXT:      memref.store %[[ZERO]], %[[COUNTERS]][%[[I]]]
// CHECK:         scf.for %[[T:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      %[[RAW:.*]] = memref.load %[[ROUTE]][%[[T]]] : memref<?xi32>
// CHECK-NEXT:      %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// CHECK-NEXT:      %[[OLD:.*]] = memref.load %[[COUNTERS]][%[[EXPERT]]]
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT:      %[[NEW:.*]] = arith.addi %[[OLD]], %[[ONE]] : i32
// CHECK-NEXT:      memref.store %[[NEW]], %[[COUNTERS]][%[[EXPERT]]]
// The 2-D event starts at offset E.
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[SIZE1]] step
// CHECK-NEXT:      %[[AT:.*]] = arith.addi %[[E]], %[[I]] : index
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[AT]]]
// CHECK:         scf.for %[[T:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      %[[RAW:.*]] = memref.load %[[ROUTE]][%[[T]]] : memref<?xi32>
// CHECK-NEXT:      %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// CHECK-NEXT:      %[[SLOT:.*]] = affine.apply #{{.*}}(%[[T]])
// CHECK-NEXT:      %[[ROWSTART:.*]] = arith.muli %[[EXPERT]], %{{.*}} : index
// CHECK-NEXT:      %[[LINEAR:.*]] = arith.addi %[[ROWSTART]], %[[SLOT]] : index
// CHECK-NEXT:      %[[AT:.*]] = arith.addi %[[E]], %[[LINEAR]] : index
// CHECK-NEXT:      memref.load %[[COUNTERS]][%[[AT]]]

// CHECK-LABEL: func.func @routed_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[E:[^:]*]]: index, %[[ROUTE:[^:]*]]: memref<?xi32>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         %[[DONE:.*]] = event.view %[[COUNTERS]][%{{.*}}](%[[E]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:         %[[SLOTS:.*]] = event.view %[[COUNTERS]][%[[E]]](%[[E]]) : memref<?xi32> -> !event.tensor<?x3>
// CHECK:         scf.for %[[T:.*]] =
// CHECK:           %[[RAW:.*]] = memref.load %[[ROUTE]][%[[T]]] : memref<?xi32>
// CHECK:           %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// CHECK:           event.notify %[[DONE]][%[[EXPERT]]] : !event.tensor<?>
// CHECK:           %[[SLOT:.*]] = affine.apply #{{.*}}(%[[T]])
// CHECK:           event.notify %[[SLOTS]][%{{.*}}, %[[SLOT]]] : !event.tensor<?x3>
// CHECK:         scf.for
// CHECK:           event.wait %[[DONE]][%{{.*}}] : !event.tensor<?>
// CHECK:           event.wait %[[SLOTS]][%{{.*}}, %{{.*}}] : !event.tensor<?x3>
event.graph @routed(%n: index, %experts: index, %route: memref<?xi32>) {
  %c3 = arith.constant 3 : index
  %done = event.alloc(%experts) : !event.tensor<?>
  %slots = event.alloc(%experts) : !event.tensor<?x3>
  event.task "produce" grid(%n)
      notifies(%done : !event.tensor<?> (d0) -> (d0) indirect [0],
               %slots : !event.tensor<?x3> (d0) -> (d0, d0 mod 3) indirect [0, -1])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
  }
  event.task "consume" grid(%experts, %c3)
      waits(%done : !event.tensor<?> (d0, d1) -> (d0),
            %slots : !event.tensor<?x3> (d0, d1) -> (d0, d1)) {
  ^bb0(%e: index, %s: index):
  }
}

// -----

// Graph-level computations are cloned into each function; tasks without
// events run unsynchronised, and a grid of rank 0 runs once.

// CHECK-LABEL: func.func @plain_counters(
// CHECK:         %[[Z:.*]] = arith.constant 0 : index
// CHECK:         return %[[Z]] : index
// CHECK-LABEL: func.func @plain_init(
// CHECK-NOT:     scf.for
// CHECK:         return
// CHECK-LABEL: func.func @plain_worker(
// CHECK-SAME:      %[[B:[^:]*]]: index
// CHECK:         %[[ROWS:.*]] = affine.apply #{{.*}}()[%[[B]]]
// CHECK:         scf.for %[[T:.*]] = %{{.*}} to %[[ROWS]] step
// CHECK:           "test.tile"(%[[T]], %[[ROWS]])
// CHECK:         %[[ONCE:.*]] = arith.addi %[[ROWS]], %{{.*}} : index
// CHECK:         scf.for %{{.*}} = %{{.*}} to %[[ONCE]] step
// CHECK:           "test.once"()
event.graph @plain(%B: index) {
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 16)>()[%B]
  event.task "tiles" grid(%rows) {
  ^bb0(%i: index):
    "test.tile"(%i, %rows) : (index, index) -> ()
  }
  event.task "once" grid() {
    "test.once"() : () -> ()
  }
}

// -----

event.graph @unsafe(%n: index) {
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

// expected-error @+1 {{symbol 'taken_worker' is taken; event-static-schedule needs it for graph @taken}}
func.func @taken_worker() {
  return
}
event.graph @taken(%n: index) {
}
