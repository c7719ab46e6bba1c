// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-cpu -verify-diagnostics | FileCheck %s
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-cpu=watchdog-ms=250 -verify-diagnostics | FileCheck %s --check-prefix=LIMIT
// RUN: not etc-opt %s -allow-unregistered-dialect -convert-event-to-cpu=watchdog-ms=0 2>&1 | FileCheck %s --check-prefix=NO-LIMIT

// NO-LIMIT: error: convert-event-to-cpu: watchdog-ms must be positive, found 0
// LIMIT-LABEL: func.func private @__etc_spin_counter(
// LIMIT:         arith.constant 250000000 : i64

// The worker id and count become trailing arguments; views are addresses
// into the counter buffer; a wait loads the counter (acquire) and, unless it
// is ready, calls the out-of-line spin with its site (worker, task, tile,
// event, element). The spin polls; between polls it reads the run's status
// (the run header is the last 22 words of the buffer) and the monotonic
// clock, and after the timeout reports the site through
// @__etc_watchdog_report, which the first spin to time out claims (an atomic
// increment of the claim word), fills and publishes with release. Once it
// has polled for the run's spin budget (microseconds, header word 21, which
// the runtime writes) it blocks in @__etc_sleep until the element changes,
// for at most 10 ms or what is left of the watchdog's time: there it counts
// itself in the sleepers word (header word 20) and, if the element still
// holds the value it saw, makes the futex wait system call on it. A notify
// is a seq_cst atomic decrement; the one that takes the counter to zero
// reads the sleepers word and, if anyone sleeps, wakes the element's
// sleepers (@__etc_wake, the futex wake system call).

// CHECK-LABEL: llvm.func internal @__etc_wake(
// CHECK-SAME:      %[[WOKEN:[^:]*]]: !llvm.ptr)
// CHECK-SAME:      no_inline
// CHECK-DAG:     %[[NR:.*]] = llvm.mlir.constant({{[0-9]+}} : i64) : i64
// CHECK-DAG:     %[[WAKE_OP:.*]] = llvm.mlir.constant(129 : i32) : i32
// CHECK-DAG:     %[[ALL:.*]] = llvm.mlir.constant(2147483647 : i32) : i32
// CHECK:         llvm.call @syscall(%[[NR]], %[[WOKEN]], %[[WAKE_OP]], %[[ALL]]) vararg(!llvm.func<i64 (i64, ...)>) : (i64, !llvm.ptr, i32, i32) -> i64
// CHECK-LABEL: llvm.func internal @__etc_sleep(
// CHECK-SAME:      %[[SLEPT_ON:[^:]*]]: !llvm.ptr, %[[SEEN:[^:]*]]: i32, %[[SLEEPERS:[^:]*]]: !llvm.ptr, %[[FOR_NS:[^:]*]]: i64)
// CHECK-SAME:      no_inline
// CHECK:         %[[TIMESPEC:.*]] = llvm.alloca %{{.*}} x !llvm.struct<(i64, i64)>
// CHECK:         llvm.atomicrmw add %[[SLEEPERS]], %{{.*}} seq_cst {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[NOW_VALUE:.*]] = llvm.load %[[SLEPT_ON]] atomic seq_cst {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:         %[[SAME:.*]] = llvm.icmp "eq" %[[NOW_VALUE]], %[[SEEN]] : i32
// CHECK:         llvm.cond_br %[[SAME]], ^[[BLOCK:bb[0-9]+]], ^[[AWAKE:bb[0-9]+]]
// CHECK:       ^[[BLOCK]]:
// CHECK:         llvm.udiv %[[FOR_NS]]
// CHECK:         llvm.urem %[[FOR_NS]]
// CHECK:         %[[WAIT_OP:.*]] = llvm.mlir.constant(128 : i32) : i32
// CHECK:         llvm.call @syscall(%{{.*}}, %[[SLEPT_ON]], %[[WAIT_OP]], %[[SEEN]], %[[TIMESPEC]]) vararg(!llvm.func<i64 (i64, ...)>) : (i64, !llvm.ptr, i32, i32, !llvm.ptr) -> i64
// CHECK:       ^[[AWAKE]]:
// CHECK:         llvm.atomicrmw sub %[[SLEEPERS]], %{{.*}} monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK-LABEL: llvm.func @syscall(i64, ...) -> i64
// CHECK-LABEL: func.func private @__etc_spin_counter(
// CHECK-SAME:      %[[BUFFER:[^:]*]]: memref<?xi32>, %[[ELEMENT:[^:]*]]: !llvm.ptr, %[[KIND:[^:]*]]: i32,
// CHECK-SAME:      attributes {passthrough = ["noinline"]}
// CHECK:         scf.while
// CHECK:           %[[COUNT:.*]] = llvm.load %[[ELEMENT]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:         } do {
// CHECK:         ^bb0(%{{[^:]*}}: i64, %{{[^:]*}}: i1, %{{[^:]*}}: i32, %[[LAST:[^:]*]]: i32):
// CHECK-NOT:       sched_yield
// CHECK:           %[[SIZE:.*]] = memref.dim %[[BUFFER]], %{{.*}} : memref<?xi32>
// CHECK:           %[[HEADER:.*]] = arith.subi %[[SIZE]], %c22 : index
// CHECK:           %[[STATUS:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[NOW:.*]] = llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:           %[[BOUND:.*]] = arith.constant 5000000000 : i64
// CHECK:           %[[EXPIRED:.*]] = arith.cmpi sgt, %[[ELAPSED:.*]], %[[BOUND]] : i64
// CHECK:           scf.if %{{.*}} {
// CHECK:             llvm.call @__etc_watchdog_report(%{{.*}}, %[[KIND]], {{.*}}) : (!llvm.ptr, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32) -> ()
// CHECK:           }
// CHECK:           %[[STOP:.*]] = arith.ori %{{.*}}, %[[EXPIRED]] : i1
// The spin budget, in microseconds.
// CHECK:           %[[SIZE2:.*]] = memref.dim %[[BUFFER]], %{{.*}} : memref<?xi32>
// CHECK:           arith.subi %[[SIZE2]], %c1 : index
// CHECK:           %[[BUDGET_US:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           %[[BUDGET_US64:.*]] = arith.extui %[[BUDGET_US]] : i32 to i64
// CHECK:           %[[BUDGET:.*]] = arith.muli %[[BUDGET_US64]], %{{.*}} : i64
// CHECK:           %[[SPUN:.*]] = arith.cmpi sge, %[[ELAPSED]], %[[BUDGET]] : i64
// CHECK:           %[[BLOCK:.*]] = arith.andi %[[SPUN]], %{{.*}} : i1
// CHECK:           scf.if %[[BLOCK]] {
// CHECK:             %[[LEFT:.*]] = arith.subi %[[BOUND]], %[[ELAPSED]] : i64
// CHECK:             %[[FOR:.*]] = arith.minsi %[[LEFT]], %{{.*}} : i64
// CHECK:             %[[SLEEPERS_AT:.*]] = arith.subi %{{.*}}, %c2 : index
// CHECK:             llvm.call @__etc_sleep(%[[ELEMENT]], %[[LAST]], %{{.*}}, %[[FOR]]) : (!llvm.ptr, i32, !llvm.ptr, i64) -> ()
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
// CHECK:           %[[BEFORE:.*]] = llvm.atomicrmw sub %[[NOTIFIED]], %[[ONE]] seq_cst {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:           %[[TO_ZERO:.*]] = arith.cmpi eq, %[[BEFORE]], %[[ONE]] : i32
// CHECK:           scf.if %[[TO_ZERO]] {
// CHECK:             memref.dim %[[COUNTERS]]
// CHECK:             %[[ASLEEP:.*]] = llvm.load %{{.*}} atomic seq_cst {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[ANY:.*]] = arith.cmpi ne, %[[ASLEEP]], %{{.*}} : i32
// CHECK:             scf.if %[[ANY]] {
// CHECK:               llvm.call @__etc_wake(%[[NOTIFIED]]) : (!llvm.ptr) -> ()
// CHECK:             }
// CHECK:           }
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
// CHECK:         llvm.atomicrmw sub %[[ELEMENT]], %{{.*}} seq_cst
// CHECK:         llvm.call @__etc_wake(%[[ELEMENT]])
// A rank-0 view is its own element.
// CHECK:         %[[SCALAR:.*]] = llvm.getelementptr
// CHECK:         llvm.atomicrmw sub %[[SCALAR]], %{{.*}} seq_cst
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
// signature, and no @syscall is declared without waits or notifies.

// CHECK-NOT:   @syscall
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

// expected-error @+1 {{'func.func' op uses the symbol 'syscall', which the CPU lowering of waits and notifies needs for 'llvm.func @syscall(i64, ...) -> i64'}}
func.func private @syscall() -> i64

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
// CHECK:         arith.subi %[[SIZE]], %c22 : index
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
// store (then, after a seq_cst fence, wakes the slot's sleepers if the
// sleepers word is not 0), or raises the error flag past the capacity.
// notify_ready is a seq_cst decrement that reports whether it took the
// counter to zero, and wakes that counter's sleepers then, like a notify.

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
// CHECK:         %[[OLD:.*]] = llvm.atomicrmw sub %[[PENDING]], %[[ONE]] seq_cst {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[LAST:.*]] = arith.cmpi eq, %[[OLD]], %[[ONE]] : i32
// CHECK:         scf.if %[[LAST]] {
// CHECK:           %[[ASLEEP:.*]] = llvm.load %{{.*}} atomic seq_cst {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:           scf.if %{{.*}} {
// CHECK:             llvm.call @__etc_wake(%[[PENDING]]) : (!llvm.ptr) -> ()
// CHECK:           }
// CHECK:         }
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
// CHECK:             llvm.fence seq_cst
// CHECK:             %[[ASLEEP:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             scf.if %{{.*}} {
// CHECK:               llvm.call @__etc_wake(%[[TARGET]]) : (!llvm.ptr) -> ()
// CHECK:             }
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

// -----

// The polling worker's ops (the dynamic schedule on several ranks). A
// try-pop reads the head; below the capacity it loads the slot (acquire)
// and, when published, advances the head with a compare-and-swap, retrying
// when it lost; it yields the capacity + 1 for an empty slot and the
// capacity for an exhausted queue. A test is an acquire load compared with
// zero. An idle step reads the clock, keeps the start of the idle time,
// reports to the watchdog (the site of a wait: kind 1, the worker, task,
// tile rank 0, event, element and its value) once the worker has been idle
// longer than the watchdog while the run goes on, and yields the core.

// CHECK-LABEL: func.func @polling(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[N:[^:]*]]: index, %[[SINCE:[^:]*]]: i64
// CHECK:         %[[CAP:.*]] = arith.index_castui %[[N]] : index to i32
// CHECK:         %[[NOTHING:.*]] = arith.addi %[[CAP]], %{{.*}} : i32
// CHECK:         %[[TAKEN:.*]] = scf.while : () -> i32 {
// CHECK:           %[[HEAD:.*]] = llvm.load %[[HEADPTR:.*]] atomic monotonic
// CHECK:           %[[OUT:.*]] = arith.cmpi uge, %[[HEAD]], %[[CAP]] : i32
// CHECK:           scf.if %[[OUT]] -> (i1, i32) {
// CHECK:             scf.yield %{{.*}}, %[[CAP]] : i1, i32
// CHECK:           } else {
// CHECK:             %[[SLOT:.*]] = llvm.load %{{.*}} atomic acquire
// CHECK:             %[[EMPTY:.*]] = arith.cmpi eq, %[[SLOT]], %{{.*}} : i32
// CHECK:             scf.if %[[EMPTY]] -> (i1, i32) {
// CHECK:               scf.yield %{{.*}}, %[[NOTHING]] : i1, i32
// CHECK:             } else {
// CHECK:               %[[NEXT:.*]] = arith.addi %[[HEAD]], %{{.*}} : i32
// CHECK:               %[[SWAP:.*]] = llvm.cmpxchg %[[HEADPTR]], %[[HEAD]], %[[NEXT]] monotonic monotonic
// CHECK:               %[[WON:.*]] = llvm.extractvalue %[[SWAP]][1]
// CHECK:               %[[RETRY:.*]] = arith.xori %[[WON]], %{{.*}} : i1
// CHECK:               %[[TASK:.*]] = arith.subi %[[SLOT]], %{{.*}} : i32
// CHECK:               scf.yield %[[RETRY]], %[[TASK]] : i1, i32
// CHECK:         arith.index_castui %[[TAKEN]] : i32 to index
// CHECK:         %[[COUNT:.*]] = llvm.load %{{.*}} atomic acquire
// CHECK:         arith.cmpi sle, %[[COUNT]], %{{.*}} : i32
// CHECK:         %[[NOW:.*]] = llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:         %[[FIRST:.*]] = arith.cmpi eq, %[[SINCE]], %{{.*}} : i64
// CHECK:         %[[START:.*]] = arith.select %[[FIRST]], %[[NOW]], %[[SINCE]] : i64
// CHECK:         %[[IDLE:.*]] = arith.subi %[[NOW]], %[[START]] : i64
// CHECK:         %[[BOUND:.*]] = arith.constant 5000000000 : i64
// CHECK:         %[[EXPIRED:.*]] = arith.cmpi sgt, %[[IDLE]], %[[BOUND]] : i64
// CHECK:         scf.if %{{.*}} {
// CHECK:           llvm.call @__etc_watchdog_report(
// CHECK:         }
// CHECK:         llvm.call @syscall(%{{.*}}) vararg
// CHECK:         llvm.call @__etc_monotonic_ns()
// CHECK:         llvm.call @__etc_watchdog_report(
// CHECK:         llvm.call @syscall(%{{.*}}) vararg
// CHECK:         return %{{.*}}, %{{.*}}, %[[START]], %{{.*}} : index, i1, i64, i64

// LIMIT-LABEL: func.func @polling(
// LIMIT:         arith.constant 250000000 : i64
func.func @polling(%counters: memref<?xi32>, %n: index, %since: i64) -> (index, i1, i64, i64) {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %t = event.queue_try_pop %counters[%c3] capacity(%n) : memref<?xi32>
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<3, symmetric>
  %ready = event.test %e[%c0] : !event.tensor<3, symmetric>
  %task = arith.constant 1 : index
  %start = event.idle %counters since(%since) on %e[%c0] site(%task, %c0) : memref<?xi32>, !event.tensor<3, symmetric>
  %other = event.idle %counters since(%since) : memref<?xi32>
  return %t, %ready, %start, %other : index, i1, i64, i64
}

// -----

// event.claim: a relaxed atomic increment of the element; its old value is
// the claimed number.
// CHECK-LABEL: func.func @claim(
// CHECK:         %[[ONE:.*]] = arith.constant 1 : i32
// CHECK:         %[[PTR:.*]] = llvm.getelementptr
// CHECK:         %[[OLD:.*]] = llvm.atomicrmw add %[[PTR]], %[[ONE]] monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[T:.*]] = arith.index_castui %[[OLD]] : i32 to index
// CHECK:         return %[[T]] : index
func.func @claim(%counters: memref<?xi32>, %next: index) -> index {
  %t = event.claim %counters[%next] : memref<?xi32>
  return %t : index
}

// -----

// The CPU target simulates a tile's barriers and never stalls on one.

func.func @stall(%counters: memref<?xi32>, %address: index, %since: i64, %task: index) -> i1 {
  // expected-error @+1 {{'event.stall' op waits on a GPU mbarrier; the CPU target has none (its tile functions simulate barriers), so convert-event-to-cpu does not lower it}}
  %start, %give_up = event.stall "full" barrier(%address) stage(%task) parity(%task) since(%since) on %counters site(%task) : memref<?xi32>
  return %give_up : i1
}
