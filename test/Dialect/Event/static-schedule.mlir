// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-static-schedule=workers=4 -verify-diagnostics | FileCheck %s --enable-var-scope
// RUN: not etc-opt %s -allow-unregistered-dialect -split-input-file -event-static-schedule=policy=greedy 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-static-schedule="workers=4 trace=true" -verify-diagnostics | FileCheck %s --check-prefix=TRACE --enable-var-scope

// POLICY: error: event-static-schedule: unsupported policy 'greedy'; supported policies: round-robin, claim

// Two tasks joined by one counted event per row block. The program takes
// the symbol, the buffer table and the counter buffer; the task tables say
// which family runs each task (one each here: the bodies are not tile
// calls, so they are cloned, reading their buffers from the table at
// constant offsets: %x from word 0, %h from word 3). The counter buffer ends
// with the 22-word run header, which g_init resets before it writes the
// count into the `rows` counters; every worker walks the tasks in order,
// carrying the first global tile of each, and runs its tiles from its first
// global index with step W. The worker carries the task and event tables; a
// wait names its site (task, event, tile) for the watchdog, and the tile runs
// only if the run was not stopped meanwhile.

// CHECK-LABEL: memref.global "private" constant @pipe_task_family : memref<2xi32> = dense<[0, 1]>
// CHECK:       memref.global "private" constant @pipe_task_record : memref<2xi32> = dense<[0, 1]>
// CHECK:       memref.global "private" constant @pipe_task_records : memref<2xi32> = dense<0>

// CHECK-LABEL: func.func @pipe_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>) -> index
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK:         %[[SIZE:.*]] = arith.addi %[[N]], %c22 : index
// CHECK:         return %[[SIZE]] : index

// CHECK-LABEL: func.func @pipe_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "static", event.workers = 4 : i64}
// CHECK:         %[[C2:.*]] = arith.constant 2 : index
// The run header at size - 22: status and claim 0, no trace records.
// CHECK:         %[[SIZE:.*]] = arith.addi %[[N]], %{{.*}} : index
// CHECK:         %[[HEADER:.*]] = arith.subi %[[SIZE]], %{{.*}} : index
// CHECK:         memref.store %{{.*}}, %[[COUNTERS]][%[[HEADER]]] : memref<?xi32>
// CHECK:         %[[CLAIM:.*]] = arith.addi %[[HEADER]], %{{.*}} : index
// CHECK-NEXT:    memref.store %{{.*}}, %[[COUNTERS]][%[[CLAIM]]] : memref<?xi32>
// CHECK:         %[[C18:.*]] = arith.constant 18 : index
// CHECK-NEXT:    %[[OFFSET:.*]] = arith.addi %[[HEADER]], %[[C18]] : index
// CHECK-NEXT:    memref.store %{{.*}}, %[[COUNTERS]][%[[OFFSET]]] : memref<?xi32>
// CHECK:         %[[C19:.*]] = arith.constant 19 : index
// CHECK-NEXT:    %[[TRACED:.*]] = arith.addi %[[HEADER]], %[[C19]] : index
// CHECK-NEXT:    memref.store %{{.*}}, %[[COUNTERS]][%[[TRACED]]] : memref<?xi32>
// CHECK:         %[[COUNT:.*]] = arith.index_cast %[[C2]] : index to i32
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      memref.store %[[COUNT]], %[[COUNTERS]][%[[I]]] : memref<?xi32>

// CHECK-LABEL: func.func @pipe_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-SAME:      attributes {event.events = [{name = "e0", notified_by = ["fill"], waited_by = ["use"]}], event.graph = "pipe", event.schedule = "static",
// CHECK-SAME:      event.tasks = [{grid_rank = 2 : i64, name = "fill"}, {grid_rank = 1 : i64, name = "use"}], event.workers = 4 : i64}
// CHECK-DAG:     %[[C3:.*]] = arith.constant 3 : index
// CHECK-DAG:     %[[H:.*]] = event.buffer %[[TABLE]][%[[C3]]] : memref<?xi64> -> memref<?x8xf32>
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[X:.*]] = event.buffer %[[TABLE]][%[[C0]]] : memref<?xi64> -> memref<?x8xf32>
// CHECK-DAG:     %[[FAMILIES:.*]] = memref.get_global @pipe_task_family : memref<2xi32>
// CHECK-DAG:     %[[RECORDS:.*]] = memref.get_global @pipe_task_records : memref<2xi32>
// CHECK:         %[[W:.*]] = event.worker_id
// CHECK:         %[[NW:.*]] = event.worker_count
// CHECK:         scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[O:.*]] = %{{.*}}) -> (index) {
// CHECK:           %[[F32:.*]] = memref.load %[[FAMILIES]][%[[K]]] : memref<2xi32>
// CHECK:           %[[F:.*]] = arith.index_cast %[[F32]] : i32 to index
// CHECK:           %[[TILES:.*]] = scf.index_switch %[[F]] -> index
// Task "fill": tiles [o, o + 2n), the first of this worker o + ((w - o) mod W).
// CHECK:           case 0 {
// CHECK:             %[[COUNT0:.*]] = arith.muli %[[N]], %{{.*}} : index
// CHECK:             %[[END0:.*]] = arith.addi %[[O]], %[[COUNT0]] : index
// CHECK:             %[[R0:.*]] = arith.remui %[[O]], %[[NW]] : index
// CHECK:             %[[S0:.*]] = arith.addi %[[W]], %[[NW]] : index
// CHECK:             %[[S1:.*]] = arith.subi %[[S0]], %[[R0]] : index
// CHECK:             %[[S2:.*]] = arith.remui %[[S1]], %[[NW]] : index
// CHECK:             %[[START0:.*]] = arith.addi %[[O]], %[[S2]] : index
// CHECK:             scf.for %[[T:.*]] = %[[START0]] to %[[END0]] step %[[NW]] {
// CHECK:               %[[LOCAL:.*]] = arith.subi %[[T]], %[[O]] : index
// CHECK:               %[[J:.*]] = arith.remui %[[LOCAL]], %{{.*}} : index
// CHECK:               %[[I:.*]] = arith.divui %[[LOCAL]], %{{.*}} : index
// CHECK:               memref.store %{{.*}}, %[[X]][%[[I]], %[[J]]]
// One release publishes the tile's writes for all its notifies, which are
// `released`.
// CHECK-NEXT:          event.release
// The event: number 0 of its class (from the record), n counters each.
// CHECK:               %[[NUMBER:.*]] = memref.load %[[RECORDS]][%{{.*}}] : memref<2xi32>
// CHECK:               %[[INSTANCE:.*]] = arith.index_cast %[[NUMBER]] : i32 to index
// CHECK:               %[[BASE:.*]] = arith.muli %[[INSTANCE]], %[[N]] : index
// CHECK:               %[[E:.*]] = event.view %[[COUNTERS]][%[[BASE]]](%[[N]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:               event.notify %[[E]][%[[I]]] released : !event.tensor<?>
// CHECK:             }
// CHECK:             scf.yield %[[COUNT0]] : index
// Task "use": the wait (site: task K, event number, tile), then the cloned
// body unless the run was stopped.
// CHECK:           default {
// CHECK:             scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step %[[NW]] {
// CHECK:               %[[ROW:.*]] = arith.subi %[[T]], %[[O]] : index
// CHECK:               %[[EVENT:.*]] = arith.index_cast %{{.*}} : i32 to index
// CHECK:               %[[E:.*]] = event.view %[[COUNTERS]][%{{.*}}](%[[N]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:               event.wait %[[E]][%[[ROW]]] site(%[[K]], %[[EVENT]], %[[ROW]]) deferred : !event.tensor<?>
// One acquire completes the tile's waits.
// CHECK-NEXT:          event.acquire
// CHECK:               %[[STOPPED:.*]] = event.run_aborted %[[COUNTERS]] : memref<?xi32>
// CHECK:               %[[RUNNING:.*]] = arith.xori %[[STOPPED]], %{{.*}} : i1
// CHECK:               scf.if %[[RUNNING]] {
// CHECK:                 memref.load %[[X]][%[[ROW]], %{{.*}}]
// CHECK:                 event.lane_barrier
// CHECK:                 memref.store %{{.*}}, %[[H]][%[[ROW]], %{{.*}}]
// CHECK:               }
// CHECK:             }
// CHECK:             scf.yield %[[N]] : index
// CHECK:           %[[NEXT:.*]] = arith.addi %[[O]], %[[TILES]] : index
// CHECK:           scf.yield %[[NEXT]] : index
// CHECK:         return
// After the run every event counter must be back to zero: 2 (unbalanced)
// if not.
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

// With trace=true, one 10-word trace record per tile task (T = 2n + n, by
// global tile index) lies between the event counters and the run header;
// g_init says where (header words 18, 19) and zeroes them; each tile writes
// its record after its waits and before its notifies.
// TRACE-LABEL: func.func @pipe_counters(
// TRACE-SAME:      %[[N:[^:]*]]: index
// TRACE:         %[[T:.*]] = arith.addi %{{.*}}, %[[N]] : index
// TRACE:         %[[WORDS:.*]] = arith.muli %[[T]], %c10 : index
// TRACE:         %[[RECORDS_END:.*]] = arith.addi %[[N]], %[[WORDS]] : index
// TRACE:         %[[SIZE:.*]] = arith.addi %[[RECORDS_END]], %c22 : index
// TRACE:         return %[[SIZE]] : index
// TRACE-LABEL: func.func @pipe_init(
// TRACE-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// TRACE:         %[[HEADER:.*]] = arith.subi %{{.*}}, %c22 : index
// TRACE:         %[[OFFSET:.*]] = arith.index_cast %[[N]] : index to i32
// TRACE-NEXT:    %[[C18:.*]] = arith.constant 18 : index
// TRACE-NEXT:    %[[AT18:.*]] = arith.addi %[[HEADER]], %[[C18]] : index
// TRACE-NEXT:    memref.store %[[OFFSET]], %[[COUNTERS]][%[[AT18]]] : memref<?xi32>
// TRACE:         %[[COUNT:.*]] = arith.index_cast %{{.*}} : index to i32
// TRACE-NEXT:    %[[C19:.*]] = arith.constant 19 : index
// TRACE-NEXT:    %[[AT19:.*]] = arith.addi %[[HEADER]], %[[C19]] : index
// TRACE-NEXT:    memref.store %[[COUNT]], %[[COUNTERS]][%[[AT19]]] : memref<?xi32>
// TRACE:         scf.for %[[I:.*]] = %[[N]] to %[[HEADER]] step
// TRACE-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]] : memref<?xi32>
// TRACE-LABEL: func.func @pipe_worker(
// TRACE-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:[^:]*]]: memref<?xi32>)
// TRACE-SAME:      event.trace
// TRACE:         scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step
// TRACE:           case 0 {
// TRACE:             scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// TRACE:               %[[J:.*]] = arith.remui %{{.*}}, %{{.*}} : index
// TRACE:               %[[I:.*]] = arith.divui %{{.*}}, %{{.*}} : index
// TRACE:               %[[AT:.*]] = arith.muli %[[T]], %c10 : index
// TRACE:               %[[RECORD:.*]] = arith.addi %[[N]], %[[AT]] : index
// TRACE:               event.trace_begin %[[COUNTERS]][%[[RECORD]]] task(%[[K]]) tile(%[[I]], %[[J]]) : memref<?xi32>
// TRACE:               memref.store
// TRACE-NEXT:          event.trace_end %[[COUNTERS]][%[[RECORD]]] : memref<?xi32>
// TRACE-NEXT:          event.release
// TRACE:               event.notify
// TRACE:           default {
// TRACE:               event.wait
// TRACE:               event.run_aborted
// TRACE:               scf.if
// TRACE:                 event.trace_begin %[[COUNTERS]][%{{.*}}] task(%[[K]]) tile(%{{.*}}) : memref<?xi32>
// TRACE:                 event.trace_end
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

// Identical layers share one family: the middle two tasks call the same tile
// function with the same grid and the same kind of wait and notify, so one
// piece of code runs both from their records ([in, out, wait event, notify
// event]: [2, 4, 0, 1] and [4, 6, 1, 2]): buffers come from the table at the
// record's offsets, and the three events, of one class (the two `count`
// constants are merged first), lie at event number times n.

// CHECK-LABEL: memref.global "private" constant @layers_task_family : memref<4xi32> = dense<[0, 1, 1, 2]>
// CHECK:       memref.global "private" constant @layers_task_record : memref<4xi32> = dense<[0, 3, 7, 11]>
// CHECK:       memref.global "private" constant @layers_task_records : memref<14xi32> =
// CHECK-SAME:      dense<[0, 2, 0, 2, 4, 0, 1, 4, 6, 1, 2, 6, 0, 2]>
// CHECK-LABEL: func.func @layers_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index
// CHECK:         %[[THREE:.*]] = arith.constant 3 : index
// CHECK:         %[[TOTAL:.*]] = arith.muli %[[N]], %[[THREE]] : index
// CHECK:         %[[SIZE:.*]] = arith.addi %[[TOTAL]], %c22 : index
// CHECK:         return %[[SIZE]] : index
// CHECK-LABEL: func.func @layers_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         %[[RECORDS:.*]] = memref.get_global @layers_task_records : memref<14xi32>
// CHECK:         %[[RECORD_OFFSETS:.*]] = memref.get_global @layers_task_record : memref<4xi32>
// CHECK:         scf.for %[[K:.*]] = {{.*}} iter_args(%[[O:.*]] = %{{.*}}) -> (index) {
// CHECK:           %[[R32:.*]] = memref.load %[[RECORD_OFFSETS]][%[[K]]] : memref<4xi32>
// CHECK:           %[[R:.*]] = arith.index_cast %[[R32]] : i32 to index
// CHECK:           case 1 {
// CHECK:             scf.for %[[T:.*]] =
// CHECK:               %[[I:.*]] = arith.subi %[[T]], %[[O]] : index
// CHECK:               %[[WAITFIELD:.*]] = arith.addi %[[R]], %{{.*}} : index
// CHECK:               %[[WAITED32:.*]] = memref.load %[[RECORDS]][%[[WAITFIELD]]] : memref<14xi32>
// CHECK:               %[[WAITED:.*]] = arith.index_cast %[[WAITED32]] : i32 to index
// CHECK:               %[[WAITBASE:.*]] = arith.muli %[[WAITED]], %[[N]] : index
// CHECK:               %[[WAIT:.*]] = event.view %[[COUNTERS]][%[[WAITBASE]]](%[[N]])
// CHECK:               event.wait %[[WAIT]][%[[I]]] site(%[[K]], %[[WAITED]], %[[I]]) deferred : !event.tensor<?>
// CHECK-NEXT:          event.acquire
// CHECK:               %[[IN32:.*]] = memref.load %[[RECORDS]][%[[R]]] : memref<14xi32>
// CHECK:               %[[IN:.*]] = arith.index_cast %[[IN32]] : i32 to index
// CHECK:               %[[INBUF:.*]] = event.buffer %[[TABLE]][%[[IN]]] : memref<?xi64> -> memref<?xf32>
// CHECK:               %[[OUT:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<?xf32>
// CHECK:               func.call @scale_tile(%[[INBUF]], %[[OUT]], %[[I]]) : (memref<?xf32>, memref<?xf32>, index) -> ()
// CHECK-NEXT:          event.release
// CHECK:               %[[NOTIFY:.*]] = event.view %[[COUNTERS]][%{{.*}}](%[[N]])
// CHECK:               event.notify %[[NOTIFY]][%[[I]]] released : !event.tensor<?>
func.func private @scale_tile(%in: memref<?xf32>, %out: memref<?xf32>, %i: index) attributes {event.tile} {
  %v = memref.load %in[%i] : memref<?xf32>
  %w = arith.addf %v, %v : f32
  memref.store %w, %out[%i] : memref<?xf32>
  return
}
event.graph @layers(%n: index, %x: memref<?xf32>, %y: memref<?xf32>, %z: memref<?xf32>, %w: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %e0 = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "layer0" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e0 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    func.call @scale_tile(%x, %y, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
  }
  %c1_again = arith.constant 1 : index
  %e1 = event.alloc(%n) count(%c1_again) : !event.tensor<?>
  event.task "layer1" grid(%n)
      reads(%y : memref<?xf32> (d0) -> (d0) [1])
      writes(%z : memref<?xf32> (d0) -> (d0) [1])
      waits(%e0 : !event.tensor<?> (d0) -> (d0))
      notifies(%e1 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    func.call @scale_tile(%y, %z, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
  }
  %e2 = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "layer2" grid(%n)
      reads(%z : memref<?xf32> (d0) -> (d0) [1])
      writes(%w : memref<?xf32> (d0) -> (d0) [1])
      waits(%e1 : !event.tensor<?> (d0) -> (d0))
      notifies(%e2 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    func.call @scale_tile(%z, %w, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
  }
  event.task "last" grid(%n)
      reads(%w : memref<?xf32> (d0) -> (d0) [1])
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      waits(%e2 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    func.call @scale_tile(%w, %x, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
  }
}

// -----

// Two event tensors lie one after the other; a 2-D one is row-major. Without
// `count`, g_init zeroes the counters and counts the notifies of every tile,
// loading indirect coordinates from the index buffer, read from the table
// at the offset in the task's record.

// CHECK-LABEL: func.func @routed_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[E:[^:]*]]: index
// CHECK:         %[[SIZE1:.*]] = arith.muli %[[E]], %{{.*}} : index
// CHECK:         %[[TOTAL:.*]] = arith.addi %[[E]], %[[SIZE1]] : index
// CHECK:         %[[SIZE:.*]] = arith.addi %[[TOTAL]], %c22 : index
// CHECK:         return %[[SIZE]] : index

// CHECK-LABEL: func.func @routed_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[E:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-DAG:     %[[RECORDS:.*]] = memref.get_global @routed_task_records : memref<5xi32>
// CHECK-DAG:     %[[SIZE1:.*]] = arith.muli %[[E]], %{{.*}} : index
// CHECK:         arith.constant 19 : index
// CHECK:         %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[E]] step
// CHECK-NEXT:      memref.store %[[ZERO]], %[[COUNTERS]][%[[I]]]
// The 2-D event starts at offset E.
// CHECK:         %[[END:.*]] = arith.addi %[[E]], %[[SIZE1]] : index
// CHECK:         scf.for %[[I:.*]] = %[[E]] to %[[END]] step
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]]
// CHECK:         scf.for %[[K:.*]] =
// CHECK:           scf.index_switch
// CHECK:           case 0 {
// CHECK:             scf.for %[[T:.*]] = %{{.*}} to %[[N]] step
// CHECK:               %[[ROUTE:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<?xi32>
// CHECK:               %[[RAW:.*]] = memref.load %[[ROUTE]][%[[T]]] : memref<?xi32>
// CHECK:               %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// Counting a notify is an atomic add, and the loop over the tiles is
// `event.independent`: the GPU spreads it over the threads.
// CHECK:               %[[AT:.*]] = arith.addi %{{.*}}, %[[EXPERT]] : index
// CHECK:               memref.atomic_rmw addi %{{.*}}, %[[COUNTERS]][%[[AT]]] : (i32, memref<?xi32>) -> i32
// CHECK:             } {event.independent}
// CHECK:             scf.for %[[T:.*]] = %{{.*}} to %[[N]] step
// CHECK:               memref.load %{{.*}}[%[[T]]] : memref<?xi32>
// CHECK:               %[[SLOT:.*]] = affine.apply #{{.*}}(%[[T]])
// CHECK:               memref.atomic_rmw addi %{{.*}}, %[[COUNTERS]]
// CHECK:             } {event.independent}

// CHECK-LABEL: func.func @routed_worker(
// CHECK:           case 0 {
// CHECK:             scf.for
// CHECK:               %[[T:.*]] = arith.subi
// A tile with two notifies has one release.
// CHECK:               event.release
// CHECK-NOT:           event.release
// CHECK:               %[[DONE:.*]] = event.view %{{.*}} -> !event.tensor<?>
// CHECK:               %[[RAW:.*]] = memref.load %{{.*}}[%[[T]]] : memref<?xi32>
// CHECK:               %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// CHECK:               event.notify %[[DONE]][%[[EXPERT]]] released : !event.tensor<?>
// CHECK-NOT:           event.release
// CHECK:               %[[SLOTS:.*]] = event.view %{{.*}} -> !event.tensor<?x3>
// CHECK:               %[[SLOT:.*]] = affine.apply #{{.*}}(%[[T]])
// CHECK:               event.notify %[[SLOTS]][%{{.*}}, %[[SLOT]]] released : !event.tensor<?x3>
// CHECK:           default {
// CHECK:             scf.for
// A tile with two waits acquires once, after both.
// CHECK:               event.wait %{{.*}}[%{{.*}}] site(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) deferred : !event.tensor<?>
// CHECK-NOT:           event.acquire
// CHECK:               event.wait %{{.*}}[%{{.*}}, %{{.*}}] site(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) deferred : !event.tensor<?x3>
// CHECK-NEXT:          event.acquire
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

// A wait whose coordinates are read from an index buffer follows an acquire
// of the tile's direct waits, which guard that buffer: deferred polls are
// relaxed and order nothing, so on a GPU the index load could otherwise see
// the buffer's old bytes. The indirect waits then share a second acquire,
// whatever their order in the task.

// CHECK-LABEL: func.func @gathered_worker(
// CHECK:           default {
// CHECK:             scf.for
// CHECK:               event.wait %{{.*}}[%{{.*}}] site(%{{.*}}, %{{.*}}, %{{.*}}) deferred : !event.tensor<?>
// CHECK-NEXT:          event.acquire
// CHECK:               %[[RAW:.*]] = memref.load %{{.*}}[%{{.*}}] : memref<?xi32>
// CHECK-NEXT:          %[[EXPERT:.*]] = arith.index_cast %[[RAW]] : i32 to index
// CHECK-NEXT:          event.wait %{{.*}}[%[[EXPERT]]] site(%{{.*}}, %{{.*}}, %{{.*}}) deferred : !event.tensor<?>
// CHECK-NEXT:          event.acquire
// CHECK-NOT:           event.acquire
// CHECK:             }
event.graph @gathered(%n: index, %experts: index, %route: memref<?xi32>) {
  %rows = event.alloc(%n) : !event.tensor<?>
  %done = event.alloc(%experts) : !event.tensor<?>
  event.task "route" grid(%n) notifies(%rows : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%t: index):
  }
  event.task "expert" grid(%experts) notifies(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%e: index):
  }
  event.task "combine" grid(%n)
      waits(%done : !event.tensor<?> (d0) -> (d0) indirect [0],
            %rows : !event.tensor<?> (d0) -> (d0))
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
  }
}

// -----

// Graph-level computations are cloned into each function; tasks without
// events run unsynchronised, a grid of rank 0 runs once, and a program
// without events needs only the run header.

// CHECK-LABEL: func.func @plain_counters(
// CHECK:         return %c22{{(_[0-9]+)?}} : index
// CHECK-LABEL: func.func @plain_init(
// CHECK-NOT:     scf.for
// CHECK:         return
// CHECK-LABEL: func.func @plain_worker(
// CHECK-SAME:      %[[B:[^:]*]]: index
// CHECK:         %[[ROWS:.*]] = affine.apply #{{.*}}()[%[[B]]]
// CHECK:         scf.for {{.*}} iter_args(%[[O:.*]] = %{{.*}}) -> (index) {
// CHECK:           case 0 {
// CHECK:             %[[END:.*]] = arith.addi %[[O]], %[[ROWS]] : index
// CHECK:             scf.for %[[T:.*]] = %{{.*}} to %[[END]] step
// CHECK:               %[[I:.*]] = arith.subi %[[T]], %[[O]] : index
// CHECK:               "test.tile"(%[[I]], %[[ROWS]])
// CHECK:           default {
// CHECK:             %[[ONE:.*]] = arith.constant 1 : index
// CHECK:             %[[ONCE:.*]] = arith.addi %[[O]], %[[ONE]] : index
// CHECK:             scf.for %{{.*}} = %{{.*}} to %[[ONCE]] step
// CHECK:               "test.once"()
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

// -----

// expected-error @+1 {{'event.graph' op buffer argument #1 has type 'memref<4xf32, strided<[2]>>'; scheduled programs read buffers from the buffer table, which describes contiguous row-major buffers in the default memory space}}
event.graph @strided(%n: index, %x: memref<4xf32, strided<[2]>>) {
}

// -----

// Live bounds: chunk tile (i, j) runs only while j < ceildiv(len[i], 4).
// g_init counts into done[i] only the live tiles' notifies; the worker keeps
// every tile in the global order (so the order proof holds) but runs the
// body and notify of a tile only under its live condition, read through the
// index buffer of the task's record.

// CHECK-LABEL: func.func @live_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         scf.for %[[E:.*]] = %{{.*}} to %[[N]] step %{{.*}} {
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[E]]] : memref<?xi32>
// CHECK:         case 0 {
// CHECK:           scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK:             %[[J:.*]] = arith.remui %[[T]], %{{.*}} : index
// CHECK:             %[[I:.*]] = arith.divui %[[T]], %{{.*}} : index
// CHECK:             %[[LEN:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<?xi32>
// CHECK:             %[[L32:.*]] = memref.load %[[LEN]][%[[I]]] : memref<?xi32>
// CHECK:             %[[L:.*]] = arith.index_cast %[[L32]] : i32 to index
// CHECK:             %[[BOUND:.*]] = affine.apply #{{.*}}(%[[L]])
// CHECK:             %[[LIVE:.*]] = arith.cmpi slt, %[[J]], %[[BOUND]] : index
// CHECK:             scf.if %[[LIVE]] {
// CHECK:               memref.atomic_rmw addi %{{.*}}, %[[COUNTERS]][%{{.*}}] : (i32, memref<?xi32>) -> i32
// CHECK:           } {event.independent}

// CHECK-LABEL: func.func @live_worker(
// CHECK:         case 0 {
// CHECK:           scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK:             %[[J:.*]] = arith.remui
// CHECK:             %[[I:.*]] = arith.divui
// CHECK:             %[[L32:.*]] = memref.load %{{.*}}[%[[I]]] : memref<?xi32>
// CHECK:             %[[L:.*]] = arith.index_cast %[[L32]] : i32 to index
// CHECK:             %[[BOUND:.*]] = affine.apply #{{.*}}(%[[L]])
// CHECK:             %[[LIVE:.*]] = arith.cmpi slt, %[[J]], %[[BOUND]] : index
// CHECK:             scf.if %[[LIVE]] {
// CHECK-NEXT:          "test.chunk"(%[[I]], %[[J]])
// CHECK-NEXT:          event.release
// CHECK:               event.notify %{{.*}}[%[[I]]] released : !event.tensor<?>
// CHECK-NEXT:        }
// CHECK:         default {
// CHECK:           event.wait
// CHECK:           event.run_aborted
// CHECK:           "test.combine"
event.graph @live(%r: index, %len: memref<?xi32>, %x: memref<?x8xf32>) {
  %c8 = arith.constant 8 : index
  %done = event.alloc(%r) : !event.tensor<?>
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 4) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
    "test.chunk"(%i, %j) : (index, index) -> ()
  }
  event.task "combine" grid(%r) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    "test.combine"(%i) : (index) -> ()
  }
}
