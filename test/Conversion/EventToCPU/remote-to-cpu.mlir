// RUN: etc-opt %s -split-input-file -convert-event-to-cpu | FileCheck %s --enable-var-scope

// The remote operations of a graph on several ranks call MPI through the
// transport block of the buffer table (word 6 on here): rank at +0, count
// at +1, window at +2, its base address at +3, MPI_Put at +4,
// MPI_Accumulate at +5, MPI_Win_flush at +6, MPI_BYTE at +7, MPI_INT at +8,
// MPI_SUM at +9.

// CHECK-LABEL: func.func @ranks(
// CHECK-SAME:      %[[TABLE:[^:]*]]: memref<?xi64> {event.table}
// CHECK:         %[[C6:.*]] = arith.constant 6 : index
// CHECK-NEXT:    %[[RANK:.*]] = memref.load %[[TABLE]][%[[C6]]] : memref<?xi64>
// CHECK-NEXT:    arith.index_cast %[[RANK]] : i64 to index
// CHECK:         %[[C7:.*]] = arith.constant 7 : index
// CHECK-NEXT:    %[[COUNT:.*]] = memref.load %[[TABLE]][%[[C7]]] : memref<?xi64>
// CHECK-NEXT:    arith.index_cast %[[COUNT]] : i64 to index
func.func @ranks(%n: index, %table: memref<?xi64> {event.table}) -> (index, index)
    attributes {event.transport = 6 : i64} {
  %me = event.rank_id
  %all = event.rank_count
  return %me, %all : index, index
}

// -----

// Without a transport block (a graph on one device) the rank is 0 of 1.

// CHECK-LABEL: func.func @alone(
// CHECK-DAG:     %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[ONE:.*]] = arith.constant 1 : index
// CHECK:         return %[[ZERO]], %[[ONE]]
func.func @alone() -> (index, index) {
  %me = event.rank_id
  %all = event.rank_count
  return %me, %all : index, index
}

// -----

// A remote notify: flush the rank (the puts before it are complete there),
// accumulate -1 into the counter's displacement in the window, flush again.

// CHECK-LABEL: func.func @notify(
// CHECK-SAME:      %[[TABLE:[^:]*]]: memref<?xi64> {event.table}, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[I:[^:]*]]: index, %[[R:[^:]*]]: index)
// CHECK:         %[[SLOT:.*]] = llvm.alloca %{{.*}} x i32
// CHECK:         llvm.store %{{.*}}, %[[SLOT]] : i32, !llvm.ptr
// CHECK:         %[[ADDRESS:.*]] = llvm.ptrtoint %{{.*}} : !llvm.ptr to i64
// CHECK:         %[[BASE:.*]] = memref.load %[[TABLE]][%{{.*}}] : memref<?xi64>
// CHECK:         %[[DISPLACEMENT:.*]] = arith.subi %[[ADDRESS]], %[[BASE]] : i64
// CHECK:         %[[RANK:.*]] = arith.index_cast %[[R]] : index to i32
// CHECK:         %[[FLUSH:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr
// CHECK:         llvm.call %[[FLUSH]](%[[RANK]], %{{.*}}) : !llvm.ptr, (i32, i64) -> i32
// CHECK:         %[[ACCUMULATE:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr
// CHECK:         llvm.call %[[ACCUMULATE]](%[[SLOT]], %{{.*}}, %{{.*}}, %[[RANK]], %[[DISPLACEMENT]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : !llvm.ptr, (!llvm.ptr, i32, i64, i32, i64, i32, i64, i64, i64) -> i32
// CHECK:         llvm.call %{{.*}}(%[[RANK]], %{{.*}}) : !llvm.ptr, (i32, i64) -> i32
func.func @notify(%table: memref<?xi64> {event.table}, %counters: memref<?xi32>, %i: index, %r: index)
    attributes {event.transport = 0 : i64} {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  event.remote_notify %e[%i] rank(%r) : !event.tensor<4, symmetric>
  return
}

// -----

// A put: one MPI_Put per row of the box, from the source row's address to
// the destination row's displacement in the window.

// CHECK-LABEL: func.func @put(
// CHECK:         %[[SOURCE:.*]] = memref.extract_aligned_pointer_as_index %{{.*}} : memref<?x64xf32> -> index
// CHECK:         %[[DEST:.*]] = memref.extract_aligned_pointer_as_index %{{.*}} : memref<2x?x64xf32> -> index
// CHECK:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK:           %[[ORIGIN:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr
// CHECK:           %[[DISPLACEMENT:.*]] = arith.subi %{{.*}}, %{{.*}} : i64
// CHECK:           llvm.call %{{.*}}(%[[ORIGIN]], %{{.*}}, %{{.*}}, %{{.*}}, %[[DISPLACEMENT]], %{{.*}}, %{{.*}}, %{{.*}}) : !llvm.ptr, (!llvm.ptr, i32, i64, i32, i64, i32, i64, i64) -> i32
func.func @put(%table: memref<?xi64> {event.table}, %y: memref<?x64xf32>, %s: memref<2x?x64xf32>,
               %me: index, %row: index, %rows: index, %r: index)
    attributes {event.transport = 0 : i64} {
  %c0 = arith.constant 0 : index
  %c64 = arith.constant 64 : index
  event.put %y[%row, %c0] [%rows, %c64] to %s[%me, %row, %c0] rank(%r) : memref<?x64xf32>, memref<2x?x64xf32>
  return
}

// -----

// On several ranks a wait polls for the whole watchdog (another rank's
// notify cannot wake a futex sleeper), so its spin yields the core
// (`sched_yield`) after every poll: with more workers than cores, a
// spinning worker would otherwise hold the core its producer needs for a
// whole time slice.

// CHECK-LABEL: func.func private @__etc_spin_counter(
// CHECK:         scf.while
// CHECK:         } do {
// CHECK:           %[[YIELD:.*]] = llvm.mlir.constant({{[0-9]+}} : i64) : i64
// CHECK-NEXT:      llvm.call @syscall(%[[YIELD]]) vararg
// CHECK-LABEL: func.func @ranked_wait(
func.func @ranked_wait(%counters: memref<?xi32>, %i: index) attributes {event.ranks = 2 : i64} {
  %c0 = arith.constant 0 : index
  %e = event.view %counters[%c0]() : memref<?xi32> -> !event.tensor<4, symmetric>
  event.wait %e[%i] : !event.tensor<4, symmetric>
  return
}
