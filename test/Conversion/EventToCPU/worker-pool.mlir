// RUN: etc-opt %s -split-input-file -convert-event-to-cpu | FileCheck %s
// RUN: etc-opt %s -split-input-file -etc-lower-to-cpu | FileCheck %s --check-prefix=LOWERED

// A graph's worker gets the entry points of the runtime's worker pool
// (lib/Conversion/EventToCPU/WorkerPool.h): the packed worker reads the
// worker's other arguments from i64 words (values, and the addresses of
// memref descriptors) and passes its own worker id and count; the park loop
// waits for a new generation of its mailbox (an acquire load, then
// @__etc_sleep on it), leaves on command 1, and otherwise calls the packed
// worker its mailbox names and counts itself done (a seq_cst decrement),
// waking the launcher if it left one thread or none and the launcher
// sleeps; the launcher writes each mailbox's command, function, arguments,
// worker id and count and done block, bumps its generation (seq_cst), wakes
// the thread if it sleeps, then polls the pending count, sleeps on it unless
// one thread is left and it has polled for less than its spin, and returns
// what is left after the timeout.

// CHECK-LABEL: func.func @g_worker_packed(
// CHECK-SAME:      %[[ARGS:[^:]*]]: !llvm.ptr, %[[ID:[^:]*]]: index, %[[COUNT:[^:]*]]: index)
// CHECK-SAME:      attributes {llvm.emit_c_interface}
// CHECK:         %[[N_AT:.*]] = llvm.getelementptr %[[ARGS]][0] : (!llvm.ptr) -> !llvm.ptr, i64
// CHECK:         %[[N64:.*]] = llvm.load %[[N_AT]] {alignment = 8 : i64} : !llvm.ptr -> i64
// CHECK:         %[[N:.*]] = arith.index_cast %[[N64]] : i64 to index
// CHECK:         %[[TABLE_AT:.*]] = llvm.getelementptr %[[ARGS]][1] : (!llvm.ptr) -> !llvm.ptr, i64
// CHECK:         %[[TABLE_DESC:.*]] = llvm.load %[[TABLE_AT]] {{.*}} -> !llvm.ptr
// CHECK:         %[[TABLE_S:.*]] = llvm.load %[[TABLE_DESC]] {{.*}} -> !llvm.struct<(ptr, ptr, i64, array<1 x i64>, array<1 x i64>)>
// CHECK:         %[[TABLE:.*]] = builtin.unrealized_conversion_cast %[[TABLE_S]] : {{.*}} to memref<?xi64>
// CHECK:         %[[COUNTERS_AT:.*]] = llvm.getelementptr %[[ARGS]][2] : (!llvm.ptr) -> !llvm.ptr, i64
// CHECK:         %[[COUNTERS:.*]] = builtin.unrealized_conversion_cast %{{.*}} to memref<?xi32>
// CHECK:         call @g_worker(%[[N]], %[[TABLE]], %[[COUNTERS]], %[[ID]], %[[COUNT]])

// CHECK-LABEL: llvm.func @_mlir_ciface_g_park(
// CHECK-SAME:      %[[MAILBOX:[^:]*]]: !llvm.ptr)
// CHECK:         %[[GENERATION:.*]] = llvm.getelementptr %[[MAILBOX]][0] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK:         %[[SLEEPERS:.*]] = llvm.getelementptr %[[MAILBOX]][4] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK:         %[[SERVED_AT:.*]] = llvm.getelementptr %[[MAILBOX]][8] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK:       ^[[AWAIT:bb[0-9]+]]:
// CHECK:         %[[SERVED:.*]] = llvm.load %[[SERVED_AT]] {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:       ^[[POLL:bb[0-9]+]]:
// CHECK:         %[[NOW:.*]] = llvm.load %[[GENERATION]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:         %[[NEW:.*]] = llvm.icmp "ne" %[[NOW]], %[[SERVED]] : i32
// CHECK:         llvm.cond_br %[[NEW]], ^[[TAKE:bb[0-9]+]](%[[NOW]] : i32), ^[[IDLE:bb[0-9]+]]
// CHECK:       ^[[IDLE]]:
// CHECK:         llvm.getelementptr %[[MAILBOX]][56]
// CHECK:         llvm.call @__etc_sleep(%[[GENERATION]], %[[SERVED]], %[[SLEEPERS]], %{{.*}})
// CHECK:       ^[[TAKE]](%[[TAKEN:.*]]: i32):
// CHECK:         llvm.store %[[TAKEN]], %[[SERVED_AT]]
// CHECK:         %[[COMMAND:.*]] = llvm.load %{{.*}} : !llvm.ptr -> i32
// CHECK:         %[[LEAVE:.*]] = llvm.mlir.constant(1 : i32) : i32
// CHECK:         llvm.icmp "eq" %[[COMMAND]], %[[LEAVE]] : i32
// CHECK:         %[[FUNCTION_AT:.*]] = llvm.getelementptr %[[MAILBOX]][16]
// CHECK:         %[[FUNCTION:.*]] = llvm.load %[[FUNCTION_AT]] {{.*}} -> !llvm.ptr
// CHECK:         %[[DONE_AT:.*]] = llvm.getelementptr %[[MAILBOX]][48]
// CHECK:         %[[DONE:.*]] = llvm.load %[[DONE_AT]] {{.*}} -> !llvm.ptr
// CHECK:         llvm.call %[[FUNCTION]](%{{.*}}, %{{.*}}, %{{.*}}) : !llvm.ptr, (!llvm.ptr, i64, i64) -> ()
// CHECK:         %[[PENDING:.*]] = llvm.getelementptr %[[DONE]][0]
// CHECK:         %[[BEFORE:.*]] = llvm.atomicrmw add %[[PENDING]], %{{.*}} seq_cst
// CHECK:         %[[TWO:.*]] = llvm.mlir.constant(2 : i32) : i32
// CHECK:         llvm.icmp "sle" %[[BEFORE]], %[[TWO]] : i32
// CHECK:         llvm.getelementptr %[[DONE]][4]
// CHECK:         llvm.load %{{.*}} atomic seq_cst
// CHECK:         llvm.return
// CHECK:         llvm.call @__etc_wake(%[[PENDING]])

// CHECK-LABEL: llvm.func @_mlir_ciface_g_launch(
// CHECK-SAME:      %[[MAILBOXES:[^:]*]]: !llvm.ptr, %[[THREADS:[^:]*]]: i64, %[[BLOCK:[^:]*]]: !llvm.ptr, %[[SPIN:[^:]*]]: i64, %[[TIMEOUT:[^:]*]]: i64, %[[COMMAND_IN:[^:]*]]: i32, %[[FUNCTION_IN:[^:]*]]: !llvm.ptr, %[[ARGUMENTS_IN:[^:]*]]: !llvm.ptr, %[[COUNT_IN:[^:]*]]: i64) -> i32
// CHECK:       ^[[BUMP:bb[0-9]+]](%[[ID_IN:.*]]: i64):
// CHECK:         %[[BOX_AT:.*]] = llvm.getelementptr %[[MAILBOXES]][%[[ID_IN]]] : (!llvm.ptr, i64) -> !llvm.ptr, !llvm.ptr
// CHECK:         %[[BOX:.*]] = llvm.load %[[BOX_AT]]
// CHECK:         llvm.store %[[COMMAND_IN]], %{{.*}} {alignment = 4 : i64} : i32, !llvm.ptr
// CHECK:         llvm.store %[[FUNCTION_IN]],
// CHECK:         llvm.store %[[ARGUMENTS_IN]],
// CHECK:         llvm.store %[[ID_IN]],
// CHECK:         llvm.store %[[COUNT_IN]],
// CHECK:         llvm.store %[[BLOCK]],
// CHECK:         llvm.atomicrmw add %{{.*}}, %{{.*}} seq_cst
// CHECK:         llvm.load %{{.*}} atomic seq_cst
// CHECK:         llvm.icmp "slt" %{{.*}}, %[[THREADS]] : i64
// CHECK:         %[[LEFT:.*]] = llvm.load %{{.*}} atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK:         llvm.icmp "sge" %{{.*}}, %[[TIMEOUT]] : i64
// CHECK:         llvm.call @__etc_sleep(%{{.*}}, %[[LEFT]], %{{.*}}, %{{.*}})
// CHECK:         llvm.return %{{.*}} : i32
// CHECK:         llvm.call @__etc_wake(
// CHECK:         %[[CHANGED:.*]] = llvm.icmp "ne" %[[LEFT]], %{{.*}} : i32
// CHECK:         %[[ONE_LEFT:.*]] = llvm.icmp "eq" %[[LEFT]], %{{.*}} : i32
// CHECK:         %[[SPUN:.*]] = llvm.icmp "slt" %{{.*}}, %[[SPIN]] : i64
// CHECK:         llvm.and %[[ONE_LEFT]], %[[SPUN]] : i1

// Once lowered, the memref casts cancel out: the packed worker unpacks the
// descriptors it loaded into the worker's arguments.
// LOWERED-LABEL: llvm.func @g_worker_packed(
// LOWERED-NOT:     unrealized_conversion_cast
// LOWERED:         llvm.extractvalue
// LOWERED:         llvm.call @g_worker(
// LOWERED-LABEL: llvm.func @_mlir_ciface_g_worker_packed(
// LOWERED-LABEL: llvm.func @_mlir_ciface_g_park(
// LOWERED-LABEL: llvm.func @_mlir_ciface_g_launch(
func.func @g_worker(%n: index, %table: memref<?xi64>, %counters: memref<?xi32>)
    attributes {event.graph = "g"} {
  %c5 = arith.constant 5 : index
  %e = event.view %counters[%c5](%n) : memref<?xi32> -> !event.tensor<?>
  %w = event.worker_id
  %nw = event.worker_count
  scf.for %t = %w to %n step %nw {
    event.notify %e[%t] : !event.tensor<?>
  }
  return
}

// -----

// A worker that takes no id and count (it claims its tiles) is called
// without them; a function of a graph that is not its worker gets nothing.

// CHECK-LABEL: func.func @h_worker_packed(
// CHECK:         call @h_worker(%{{[^,]*}}, %{{[^,]*}}) : (index, memref<?xi32>) -> ()
// CHECK-NOT:     @h_init_packed
func.func @h_worker(%n: index, %counters: memref<?xi32>) attributes {event.graph = "h"} {
  return
}
func.func @h_init(%n: index, %counters: memref<?xi32>) attributes {event.graph = "h"} {
  return
}
