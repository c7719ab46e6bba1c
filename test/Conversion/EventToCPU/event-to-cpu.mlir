// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-cpu -verify-diagnostics | FileCheck %s
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-cpu=watchdog-ms=250 -verify-diagnostics | FileCheck %s --check-prefix=LIMIT
// RUN: not etc-opt %s -allow-unregistered-dialect -convert-event-to-cpu=watchdog-ms=0 2>&1 | FileCheck %s --check-prefix=NO-LIMIT

// NO-LIMIT: error: convert-event-to-cpu: watchdog-ms must be positive, found 0
// LIMIT-LABEL: func.func private @__etc_spin_counter(
// LIMIT:         arith.constant 250000000 : i64

// The worker id and count become trailing arguments; views are addresses
// into the counter buffer; a wait loads the counter (acquire) and, unless it
// is ready, calls the out-of-line spin with its site (worker, task, tile,
// event, element). The spin polls, yielding the core between polls, reads
// the run's status (the run header is the last 20 words of the buffer) and
// the monotonic clock, and after the timeout reports the site through
// @__etc_watchdog_report, which the first spin to time out claims (an atomic
// increment of the claim word), fills and publishes with release. A notify
// is a release atomic decrement.

// CHECK-LABEL: func.func private @__etc_spin_counter(
// CHECK-SAME:      %[[BUFFER:[^:]*]]: memref<?xi32>, %[[ELEMENT:[^:]*]]: !llvm.ptr, %[[KIND:[^:]*]]: i32,
// CHECK-SAME:      attributes {passthrough = ["noinline"]}
// CHECK:         scf.while
// CHECK:           %[[COUNT:.*]] = llvm.load %[[ELEMENT]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:         } do {
// CHECK:           func.call @sched_yield() : () -> i32
// CHECK:           %[[SIZE:.*]] = memref.dim %[[BUFFER]], %{{.*}} : memref<?xi32>
// CHECK:           %[[HEADER:.*]] = arith.subi %[[SIZE]], %c20 : index
// CHECK:           %[[STATUS:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[NOW:.*]] = llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:           %[[BOUND:.*]] = arith.constant 5000000000 : i64
// CHECK:           %[[EXPIRED:.*]] = arith.cmpi sgt, %{{.*}}, %[[BOUND]] : i64
// CHECK:           scf.if %{{.*}} {
// CHECK:             llvm.call @__etc_watchdog_report(%{{.*}}, %[[KIND]], {{.*}}) : (!llvm.ptr, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32) -> ()
// CHECK:           }
// CHECK-LABEL: llvm.func internal @__etc_watchdog_report(
// CHECK-SAME:      %[[RECORD:[^:]*]]: !llvm.ptr
// CHECK-SAME:      attributes {no_inline}
// CHECK:         %[[CLAIM:.*]] = llvm.getelementptr %[[RECORD]][1] : (!llvm.ptr) -> !llvm.ptr, i32
// CHECK:         %[[OLD:.*]] = llvm.atomicrmw add %[[CLAIM]], %{{.*}} monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[FIRST:.*]] = llvm.icmp "eq" %[[OLD]], %{{.*}} : i32
// CHECK:         llvm.cond_br %[[FIRST]], ^[[WRITE:bb[0-9]+]], ^[[DONE:bb[0-9]+]]
// CHECK:       ^[[WRITE]]:
// CHECK:         llvm.fence release
// CHECK:         llvm.store %{{.*}}, %[[RECORD]] atomic monotonic {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK-LABEL: llvm.func internal @__etc_monotonic_ns() -> i64 {
// CHECK:         %[[TIME:.*]] = llvm.alloca %{{.*}} x !llvm.struct<(i64, i64)>
// CHECK:         %[[MONOTONIC:.*]] = llvm.mlir.constant(1 : i32) : i32
// CHECK:         llvm.call @clock_gettime(%[[MONOTONIC]], %[[TIME]]) : (i32, !llvm.ptr) -> i32
// CHECK-LABEL: func.func private @sched_yield() -> i32

// CHECK-LABEL: func.func @g_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[WID:[^:]*]]: index, %[[WCOUNT:[^:]*]]: index)
// CHECK-SAME:      attributes {llvm.emit_c_interface}
// CHECK-DAG:     %[[C5:.*]] = arith.constant 5 : index
// CHECK:         %[[ADDRESS:.*]] = memref.extract_aligned_pointer_as_index %[[COUNTERS]] : memref<?xi32> -> index
// CHECK:         %[[ADDRESS64:.*]] = arith.index_castui %[[ADDRESS]] : index to i64
// CHECK:         %[[BASE:.*]] = llvm.inttoptr %[[ADDRESS64]] : i64 to !llvm.ptr
// CHECK:         %[[OFFSET:.*]] = arith.index_cast %[[C5]] : index to i64
// CHECK:         %[[VIEW:.*]] = llvm.getelementptr %[[BASE]][%[[OFFSET]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:         scf.for %[[T:.*]] = %[[WID]] to %[[N]] step %[[WCOUNT]] {
// CHECK:           %[[T64:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK:           %[[WAITED:.*]] = llvm.getelementptr %[[VIEW]][%[[T64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// The site: a wait (1), this worker, task T, a tile of rank 1, event 5, an
// element of rank 1.
// CHECK:           %[[WAIT:.*]] = arith.constant 1 : i32
// CHECK:           %[[WORKER:.*]] = arith.index_cast %[[WID]] : index to i32
// CHECK:           %[[TASK:.*]] = arith.index_cast %[[T]] : index to i32
// CHECK:           %[[COUNT:.*]] = llvm.load %[[WAITED]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[READY:.*]] = arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:           scf.if %[[READY]] -> (i32) {
// CHECK:             scf.yield %[[COUNT]] : i32
// CHECK:           } else {
// CHECK:             func.call @__etc_spin_counter(%[[COUNTERS]], %[[WAITED]], %[[WAIT]], %[[WORKER]], %[[TASK]], {{.*}}) : (memref<?xi32>, !llvm.ptr, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32) -> i32
// CHECK:           }
// CHECK:           "test.body"(%[[T]])
// CHECK:           %[[T64:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK:           %[[NOTIFIED:.*]] = llvm.getelementptr %[[VIEW]][%[[T64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:           %[[ONE:.*]] = arith.constant 1 : i32
// CHECK:           llvm.atomicrmw sub %[[NOTIFIED]], %[[ONE]] release {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         }
// CHECK-NOT:     event.
func.func @g_worker(%n: index, %counters: memref<?xi32>) {
  %c5 = arith.constant 5 : index
  %e = event.view %counters[%c5](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  %nw = event.worker_count
  scf.for %t = %w to %n step %nw {
    event.wait %e[%t] site(%t, %c5, %t) : !event.tensor<?>
    "test.body"(%t) : (index) -> ()
    event.notify %e[%t] : !event.tensor<?>
  }
  return
}

// -----

// Elements of an N-d view are addressed row-major with its sizes.

// CHECK-LABEL: func.func @nd_view(
// CHECK-SAME:      %[[ROWS:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[I:[^:]*]]: index, %[[J:[^:]*]]: index, %[[K:[^:]*]]: index)
// CHECK:         %[[VIEW:.*]] = llvm.getelementptr
// CHECK:         %[[ROW:.*]] = arith.muli %[[I]], %[[ROWS]] : index
// CHECK:         %[[PARTIAL:.*]] = arith.addi %[[ROW]], %[[J]] : index
// CHECK:         %[[C4:.*]] = arith.constant 4 : index
// CHECK:         %[[PLANE:.*]] = arith.muli %[[PARTIAL]], %[[C4]] : index
// CHECK:         %[[LINEAR:.*]] = arith.addi %[[PLANE]], %[[K]] : index
// CHECK:         %[[LINEAR64:.*]] = arith.index_cast %[[LINEAR]] : index to i64
// CHECK:         %[[ELEMENT:.*]] = llvm.getelementptr %[[VIEW]][%[[LINEAR64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:         llvm.atomicrmw sub %[[ELEMENT]], %{{.*}} release
// A rank-0 view is its own element.
// CHECK:         %[[SCALAR:.*]] = llvm.getelementptr
// CHECK:         llvm.atomicrmw sub %[[SCALAR]], %{{.*}} release
func.func @nd_view(%rows: index, %counters: memref<?xi32>, %i: index, %j: index, %k: index) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0](%rows, %rows) : memref<?xi32> -> !event.tensor<?x?x4>
  event.notify %e[%i, %j, %k] : !event.tensor<?x?x4>
  %s = event.view %counters[%k]() : memref<?xi32> -> !event.tensor<>
  event.notify %s[] : !event.tensor<>
  return
}

// -----

// A tile body runs on one lane. Functions without worker queries keep their
// signature, and no @sched_yield is declared without waits.

// CHECK-NOT:   @sched_yield
// CHECK-LABEL: func.func @lanes(
// CHECK-SAME:      %[[X:[^:]*]]: memref<4xindex>)
// CHECK-SAME:      attributes {llvm.emit_c_interface}
// CHECK-DAG:     %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[ONE:.*]] = arith.constant 1 : index
// CHECK-NOT:     event.lane_barrier
// CHECK:         memref.store %[[ONE]], %[[X]][%[[ZERO]]]
func.func @lanes(%x: memref<4xindex>) {
  %lane = event.lane_id
  %lanes = event.lane_count
  event.lane_barrier
  memref.store %lanes, %x[%lane] : memref<4xindex>
  return
}

// Declarations are left alone.
// CHECK-LABEL: func.func private @external()
// CHECK-NOT:     llvm.emit_c_interface
func.func private @external()

// -----

// expected-error @+1 {{'func.func' op uses the symbol 'sched_yield', which the CPU lowering of 'event.wait' needs for 'func.func private @sched_yield() -> i32'}}
func.func private @sched_yield() -> i64

func.func @wait(%counters: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<>
  event.wait %e[] : !event.tensor<>
  return
}

// -----

// Only views of the counter buffer can be addressed.
func.func @not_a_view(%e: !event.tensor<?>, %i: index) {
  // expected-error @+1 {{failed to legalize operation 'event.notify'}}
  event.notify %e[%i] : !event.tensor<?>
  return
}

// -----

// `event.run_aborted` reads the run's status from the run header; the trace
// ops write the worker (an argument, like the program's own worker id), the
// task, the tile and the monotonic clock into the trace record.

// CHECK-LABEL: func.func @traced(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[RECORD:[^:]*]]: index, %[[I:[^:]*]]: index, %[[WID:[^:]*]]: index, %{{.*}}: index)
// CHECK:         %[[SIZE:.*]] = memref.dim %[[COUNTERS]], %{{.*}} : memref<?xi32>
// CHECK:         arith.subi %[[SIZE]], %c20 : index
// CHECK:         %[[STATUS:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:         %[[STOPPED:.*]] = arith.cmpi ne, %[[STATUS]], %{{.*}} : i32
// CHECK:         "test.use"(%[[STOPPED]])
// CHECK:         %[[START:.*]] = llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:         %[[WORKER:.*]] = arith.index_cast %[[WID]] : index to i32
// CHECK:         llvm.store %[[WORKER]]
// CHECK:         %[[TASK:.*]] = arith.index_cast %[[I]] : index to i32
// CHECK:         llvm.store %[[TASK]]
// CHECK:         %[[TILE:.*]] = arith.index_cast %[[I]] : index to i32
// CHECK:         llvm.store %[[TILE]]
// CHECK:         %[[LOW:.*]] = arith.trunci %[[START]] : i64 to i32
// CHECK:         %[[HIGH64:.*]] = arith.shrui %[[START]], %{{.*}} : i64
// CHECK:         %[[HIGH:.*]] = arith.trunci %[[HIGH64]] : i64 to i32
// CHECK:         llvm.store %[[LOW]]
// CHECK:         llvm.store %[[HIGH]]
// CHECK:         %[[END:.*]] = llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:         arith.trunci %[[END]] : i64 to i32
// CHECK-NOT:     event.
func.func @traced(%counters: memref<?xi32>, %record: index, %i: index) {
  %stopped = event.run_aborted %counters : memref<?xi32>
  "test.use"(%stopped) : (i1) -> ()
  event.trace_begin %counters[%record] task(%i) tile(%i) : memref<?xi32>
  event.trace_end %counters[%record] : memref<?xi32>
  return
}

// -----

// The dynamic scheduler's queue. Word q is the head, q+1 the tail, q+2 the
// error flag, q+3+s slot s (task + 1, 0 while empty). A pop claims a slot
// with a relaxed increment of the head and, below the capacity, waits for the
// slot to be published (an acquire load, then the bounded out-of-line spin,
// as a wait); a push reserves a slot
// with a relaxed increment of the tail and publishes the task with a release
// store, or raises the error flag past the capacity. notify_ready is an
// acq_rel decrement that reports whether it took the counter to zero.

// CHECK-LABEL: func.func @queue_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %{{[^:]*}}: index, %{{[^:]*}}: index)
// CHECK:         %[[VIEW:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// Pop: claim a slot.
// CHECK:         %[[HEAD:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:         %[[CLAIMED32:.*]] = llvm.atomicrmw add %[[HEAD]], %{{.*}} monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[CLAIMED:.*]] = arith.index_castui %[[CLAIMED32]] : i32 to index
// CHECK:         %[[VALID:.*]] = arith.cmpi ult, %[[CLAIMED]], %[[N]] : index
// CHECK:         %[[TASK32:.*]] = scf.if %[[VALID]] -> (i32) {
// CHECK:           %[[SLOT:.*]] = llvm.getelementptr
// CHECK:           %[[WORD:.*]] = llvm.load %[[SLOT]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[FULL:.*]] = arith.cmpi ne, %[[WORD]], %{{.*}} : i32
// CHECK:           %[[PUBLISHED:.*]] = scf.if %[[FULL]] -> (i32) {
// CHECK:             func.call @__etc_spin_slot(%[[COUNTERS]], %[[SLOT]], {{.*}}) : (memref<?xi32>, !llvm.ptr, {{.*}}) -> i32
// A stopped pop (the spin gives up with 0) reports the queue as exhausted:
// capacity + 1, minus one.
// CHECK:           %[[EMPTY:.*]] = arith.cmpi eq, %[[PUBLISHED]], %{{.*}} : i32
// CHECK:           %[[PAST:.*]] = arith.addi %[[N]], %{{.*}} : index
// CHECK:           %[[PAST32:.*]] = arith.index_castui %[[PAST]] : index to i32
// CHECK:           %[[VALUE:.*]] = arith.select %[[EMPTY]], %[[PAST32]], %[[PUBLISHED]] : i32
// CHECK:           %[[ID32:.*]] = arith.subi %[[VALUE]], %{{.*}} : i32
// CHECK:           scf.yield %[[ID32]] : i32
// CHECK:         } else {
// CHECK:           %[[EXHAUSTED:.*]] = arith.index_castui %[[N]] : index to i32
// CHECK:           scf.yield %[[EXHAUSTED]] : i32
// CHECK:         }
// CHECK:         %[[TASK:.*]] = arith.index_castui %[[TASK32]] : i32 to index
// notify_ready on the pending count of the popped task.
// CHECK:         %[[PENDING:.*]] = llvm.getelementptr %[[VIEW]][%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:         %[[ONE:.*]] = arith.constant 1 : i32
// CHECK:         %[[OLD:.*]] = llvm.atomicrmw sub %[[PENDING]], %[[ONE]] acq_rel {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[LAST:.*]] = arith.cmpi eq, %[[OLD]], %[[ONE]] : i32
// CHECK:         scf.if %[[LAST]] {
// Push: reserve a slot at the tail, publish or flag the overflow.
// CHECK:           %[[TAIL:.*]] = llvm.getelementptr
// CHECK:           %[[RESERVED32:.*]] = llvm.atomicrmw add %[[TAIL]], %{{.*}} monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:           %[[RESERVED:.*]] = arith.index_castui %[[RESERVED32]] : i32 to index
// CHECK:           %[[FITS:.*]] = arith.cmpi ult, %[[RESERVED]], %[[N]] : index
// CHECK:           scf.if %[[FITS]] {
// CHECK:             %[[PLUS:.*]] = arith.addi %[[TASK]], %{{.*}} : index
// CHECK:             %[[VALUE:.*]] = arith.index_castui %[[PLUS]] : index to i32
// CHECK:             %[[TARGET:.*]] = llvm.getelementptr
// CHECK:             llvm.store %[[VALUE]], %[[TARGET]] atomic release {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK:           } else {
// CHECK:             %[[ERROR:.*]] = llvm.getelementptr
// CHECK:             llvm.store %{{.*}}, %[[ERROR]] atomic monotonic {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK:           }
// CHECK:         }
// CHECK-NOT:     event.
func.func @queue_worker(%n: index, %counters: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %pending = event.view %counters[%c4](%n) : memref<?xi32> -> !event.tensor<?>
  %t = event.queue_pop %counters[%c0] capacity(%n) : memref<?xi32>
  %last = event.notify_ready %pending[%t] : !event.tensor<?>
  scf.if %last {
    event.queue_push %t, %counters[%c0] capacity(%n) : memref<?xi32>
  }
  return
}

// -----

// With one lane per tile, a lane reduction is the value itself, and scratch
// memory is a stack buffer allocated once at the start of the function.

// CHECK-LABEL: func.func @one_lane(
// CHECK-SAME:      %[[X:[^:]*]]: f32, %[[N:[^:]*]]: index)
// CHECK-NEXT:    %[[S:.*]] = memref.alloca() : memref<32xf32>
// CHECK:         scf.for
// CHECK-NEXT:      memref.store %[[X]], %[[S]][%{{.*}}] : memref<32xf32>
func.func @one_lane(%x: f32, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {
    %r = event.lane_reduce "add" %x {group = 32} : f32
    %s = event.scratch : memref<32xf32>
    memref.store %r, %s[%c0] : memref<32xf32>
  }
  return
}

// -----

// The schedulers' task and event tables are for the front end, which reads
// them from the scheduled program; the lowering drops them.

// CHECK-LABEL: func.func @tables(
// CHECK-SAME:      attributes {event.graph = "t", llvm.emit_c_interface}
func.func @tables() attributes {event.graph = "t", event.tasks = [{grid_rank = 1 : i64, name = "copy_0"}], event.events = [{name = "e0", notified_by = ["copy_0"], waited_by = []}]} {
  return
}
