// RUN: etc-opt %s -event-static-schedule -etc-lower-to-cpu | FileCheck %s --implicit-check-not='{{^ *(%[^ ]+ = )?"?(arith|affine|cf|event|func|index|math|memref|scf|ub|vector)\.}}'

// A scheduled graph goes all the way to the LLVM dialect: the runtime's
// entry points with C interfaces taking the symbols, the buffer table and
// the counter buffer, the worker taking its id and the worker count after
// them, the schedule's constant tables as LLVM globals, atomics, and waits
// that load inline and call the out-of-line spin, which blocks in a futex
// wait once it has spun for the run's budget and is bounded by the
// watchdog, only when the counter is not ready; notifies that take a
// counter to zero wake its sleepers, if any; the tile runs only if the run
// was not stopped meanwhile.

// CHECK-LABEL: llvm.func @__etc_spin_counter(
// CHECK-SAME:      attributes {passthrough = ["noinline"]
// CHECK-NOT:     sched_yield
// CHECK:         llvm.call @__etc_monotonic_ns() : () -> i64
// CHECK:         llvm.call @__etc_watchdog_report(
// CHECK:         llvm.call @__etc_sleep(
// CHECK-LABEL: llvm.func internal @__etc_watchdog_report(
// CHECK:         llvm.atomicrmw add %{{.*}}, %{{.*}} monotonic
// CHECK:         llvm.fence release
// CHECK-LABEL: llvm.func @clock_gettime(i32, !llvm.ptr) -> i32
// CHECK-LABEL: llvm.func internal @__etc_monotonic_ns() -> i64
// CHECK-DAG:   llvm.mlir.global private constant @pipe_task_family(dense<[0, 1]> : tensor<2xi32>)
// CHECK-DAG:   llvm.mlir.global private constant @pipe_task_record(dense<[0, 1]> : tensor<2xi32>)

// CHECK-LABEL: llvm.func @pipe_counters(
// CHECK:       llvm.func @_mlir_ciface_pipe_counters(%{{.*}}: i64, %{{.*}}: !llvm.ptr) -> i64

// CHECK-LABEL: llvm.func @pipe_init(
// CHECK:       llvm.func @_mlir_ciface_pipe_init(%{{.*}}: i64, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)

// CHECK-LABEL: llvm.func @pipe_worker(
// CHECK-SAME:      %[[WID:[^:]*]]: i64, %[[WCOUNT:[^:]*]]: i64) attributes {{{.*}}llvm.emit_c_interface}
// CHECK:         %[[BEFORE:.*]] = llvm.atomicrmw sub %[[NOTIFIED:.*]], %{{.*}} seq_cst
// CHECK:         llvm.icmp "eq" %[[BEFORE]]
// CHECK:         llvm.load %{{.*}} atomic seq_cst
// CHECK:         llvm.call @__etc_wake(%[[NOTIFIED]])
// CHECK:         %[[COUNT:.*]] = llvm.load %[[WAITED:.*]] atomic acquire {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK-NEXT:    %[[READY:.*]] = llvm.icmp "sle" %[[COUNT]], %{{.*}} : i32
// CHECK-NEXT:    llvm.cond_br %[[READY]], ^{{bb[0-9]+}}, ^[[SPIN:bb[0-9]+]]
// CHECK:       ^[[SPIN]]:
// CHECK-NEXT:    llvm.call @__etc_spin_counter(%{{.*}}, %[[WAITED]], {{.*}}) : ({{.*}}) -> i32
// CHECK:         %[[STATUS:.*]] = llvm.load %{{.*}} atomic monotonic {alignment = 4 : i64} : !llvm.ptr -> i32
// CHECK-NEXT:    %[[STOPPED:.*]] = llvm.icmp "ne" %[[STATUS]], %{{.*}} : i32
// CHECK-NEXT:    %[[RUNNING:.*]] = llvm.xor %[[STOPPED]], %{{.*}} : i1
// CHECK-NEXT:    llvm.cond_br %[[RUNNING]], ^[[BODY:bb[0-9]+]], ^[[NEXT:bb[0-9]+]]
// CHECK-NEXT:  ^[[BODY]]:
// CHECK:         llvm.intr.sqrt
// CHECK:         llvm.br ^[[NEXT]]
// CHECK:         llvm.return
// CHECK:       llvm.func @_mlir_ciface_pipe_worker(%{{.*}}: i64, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64)
event.graph @pipe(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "double" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %x[%i] : memref<?xf32>
    %w = arith.addf %v, %v : f32
    %lane = event.lane_id
    memref.store %w, %y[%i] : memref<?xf32>
  }
  event.task "square" grid(%n)
      reads(%y : memref<?xf32> (d0) -> (d0) [1])
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %y[%i] : memref<?xf32>
    %w = math.sqrt %v : f32
    event.lane_barrier
    memref.store %w, %x[%i] : memref<?xf32>
  }
}
