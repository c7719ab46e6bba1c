// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -convert-event-to-cpu -verify-diagnostics | FileCheck %s

// The worker id, count and stop flag become trailing arguments; views are
// addresses into the counter buffer; a wait spins on an acquire load,
// yielding the core between polls, until the counter is ready or the stop
// flag is set, and runs the rest of its block only in the first case; a
// notify is a release atomic decrement.

// CHECK-LABEL: func.func private @sched_yield() -> i32

// CHECK-LABEL: func.func @g_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[WID:[^:]*]]: index, %[[WCOUNT:[^:]*]]: index, %[[STOP:[^:]*]]: !llvm.ptr)
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
// CHECK:           %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK:           %[[READY:.*]] = scf.while : () -> i1 {
// CHECK:             %[[COUNT:.*]] = llvm.load %[[WAITED]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[PENDING:.*]] = arith.cmpi sgt, %[[COUNT]], %[[ZERO]] : i32
// CHECK:             %[[FLAG:.*]] = llvm.load %[[STOP]] atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[STOPPED:.*]] = arith.cmpi ne, %[[FLAG]], %{{.*}} : i32
// CHECK:             %[[GO:.*]] = arith.xori %[[STOPPED]], %{{.*}} : i1
// CHECK:             %[[SPIN:.*]] = arith.andi %[[PENDING]], %[[GO]] : i1
// CHECK:             scf.condition(%[[SPIN]]) %[[GO]] : i1
// CHECK:           } do {
// CHECK:             func.call @sched_yield() : () -> i32
// CHECK:             scf.yield
// CHECK:           }
// CHECK:           scf.if %[[READY]] {
// CHECK:             "test.body"(%[[T]])
// CHECK:             %[[T64:.*]] = arith.index_cast %[[T]] : index to i64
// CHECK:             %[[NOTIFIED:.*]] = llvm.getelementptr %[[VIEW]][%[[T64]]] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:             %[[ONE:.*]] = arith.constant 1 : i32
// CHECK:             llvm.atomicrmw sub %[[NOTIFIED]], %[[ONE]] release {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:           }
// CHECK:         }
// CHECK-NOT:     event.
func.func @g_worker(%n: index, %counters: memref<?xi32>) {
  %c5 = arith.constant 5 : index
  %e = event.view %counters[%c5](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  %nw = event.worker_count
  scf.for %t = %w to %n step %nw {
    event.wait %e[%t] : !event.tensor<?>
    "test.body"(%t) : (index) -> ()
    event.notify %e[%t] : !event.tensor<?>
  }
  return
}

// -----

// Values computed after a wait that the block's terminator uses come out of
// the guarding scf.if; a stopped worker returns poison for them.

// CHECK-LABEL: func.func @wait_then_return(
// CHECK:         %[[READY:.*]] = scf.while : () -> i1 {
// CHECK:         %[[VALUES:.*]]:2 = scf.if %[[READY]] -> (index, i32) {
// CHECK:           %[[LANE:.*]] = arith.constant 0 : index
// CHECK:           %[[SUM:.*]] = "test.compute"() : () -> i32
// CHECK:           scf.yield %[[LANE]], %[[SUM]] : index, i32
// CHECK:         } else {
// CHECK:           %[[P0:.*]] = ub.poison : index
// CHECK:           %[[P1:.*]] = ub.poison : i32
// CHECK:           scf.yield %[[P0]], %[[P1]] : index, i32
// CHECK:         }
// CHECK:         return %[[VALUES]]#0, %[[VALUES]]#1 : index, i32
func.func @wait_then_return(%counters: memref<?xi32>, %i: index) -> (index, i32) {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4>
  event.wait %e[%i] : !event.tensor<4>
  %lane = event.lane_id
  %sum = "test.compute"() : () -> i32
  return %lane, %sum : index, i32
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

// The dynamic scheduler's queue. Word q is the head, q+1 the tail, q+2 the
// error flag, q+3+s slot s (task + 1, 0 while empty). A pop claims a slot
// with a relaxed increment of the head and, below the capacity, spins on an
// acquire load of the slot, yielding between polls; a push reserves a slot
// with a relaxed increment of the tail and publishes the task with a release
// store, or raises the error flag past the capacity. notify_ready is an
// acq_rel decrement that reports whether it took the counter to zero.

// CHECK-LABEL: func.func @queue_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %{{[^:]*}}: index, %{{[^:]*}}: index, %[[STOP:[^:]*]]: !llvm.ptr)
// CHECK:         %[[VIEW:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// Pop: claim a slot.
// CHECK:         %[[HEAD:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i32
// CHECK:         %[[CLAIMED32:.*]] = llvm.atomicrmw add %[[HEAD]], %{{.*}} monotonic {alignment = 4 : i64} : !llvm.ptr, i32
// CHECK:         %[[CLAIMED:.*]] = arith.index_castui %[[CLAIMED32]] : i32 to index
// CHECK:         %[[VALID:.*]] = arith.cmpi ult, %[[CLAIMED]], %[[N]] : index
// CHECK:         %[[TASK32:.*]] = scf.if %[[VALID]] -> (i32) {
// CHECK:           %[[SLOT:.*]] = llvm.getelementptr
// CHECK:           %[[PUBLISHED:.*]]:2 = scf.while : () -> (i32, i1) {
// CHECK:             %[[WORD:.*]] = llvm.load %[[SLOT]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[EMPTY:.*]] = arith.cmpi eq, %[[WORD]], %{{.*}} : i32
// CHECK:             %[[FLAG:.*]] = llvm.load %[[STOP]] atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:             %[[STOPPED:.*]] = arith.cmpi ne, %[[FLAG]], %{{.*}} : i32
// CHECK:             %[[GO:.*]] = arith.xori %[[STOPPED]], %{{.*}} : i1
// CHECK:             %[[SPIN:.*]] = arith.andi %[[EMPTY]], %[[GO]] : i1
// CHECK:             scf.condition(%[[SPIN]]) %[[WORD]], %[[STOPPED]] : i32, i1
// CHECK:           } do {
// CHECK:             func.call @sched_yield() : () -> i32
// A stopped pop reports the queue as exhausted: capacity + 1, minus one.
// CHECK:           %[[PAST:.*]] = arith.addi %[[N]], %{{.*}} : index
// CHECK:           %[[PAST32:.*]] = arith.index_castui %[[PAST]] : index to i32
// CHECK:           %[[VALUE:.*]] = arith.select %[[PUBLISHED]]#1, %[[PAST32]], %[[PUBLISHED]]#0 : i32
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
