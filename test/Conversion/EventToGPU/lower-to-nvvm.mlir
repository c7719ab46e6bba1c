// RUN: etc-opt %s -event-static-schedule -etc-lower-to-nvvm | FileCheck %s --check-prefixes=CHECK,SM90
// RUN: etc-opt %s -event-static-schedule -etc-lower-to-nvvm="chip=sm_80 features=+ptx70" | FileCheck %s --check-prefixes=CHECK,SM80

// A scheduled graph goes all the way to PTX text in a gpu.binary: one entry
// per program function taking the symbol and the buffer table (a memref
// expanded to 5 parameters: allocated and aligned pointers, offset, size,
// stride), whatever the number of buffers, the result of @pipe_counters
// through a trailing memref<1xi64>. (The schedule's constant tables fold
// away here: two tasks, loops LLVM unrolls.) The worker notifies with a
// CTA barrier, then thread 0's GPU-scope fence and atomic decrement. It
// waits with thread 0's relaxed load at GPU scope; only when that load finds
// the event not ready does thread 0 call the out-of-line spin function,
// which polls with relaxed loads, backs off with nanosleep, reads
// %globaltimer for the watchdog and, on expiry, calls the watchdog report.
// Then one GPU-scope fence (the acquire) and thread 0's load of the run's
// status, whose reducing barrier (bar.red) hands the CTA both what thread 0
// acquired and whether the run stopped. Spin functions come first in the
// PTX.

// CHECK-LABEL: gpu.binary @pipe_kernels
// SM90-SAME:     #nvvm.target<O = 3, chip = "sm_90a", features = "+ptx80">
// SM80-SAME:     #nvvm.target<O = 3, chip = "sm_80", features = "+ptx70">
// SM90-SAME:     .version 8.0\0A.target sm_90a
// SM80-SAME:     .version 7.0\0A.target sm_80
// CHECK-SAME:    .func __etc_watchdog_report
// CHECK-SAME:    .func (.param .b32 func_retval0) __etc_spin_counter(
// CHECK-SAME:    ld.relaxed.gpu.b32
// CHECK-SAME:    nanosleep.u32
// CHECK-SAME:    %globaltimer
// CHECK-SAME:    call.uni __etc_watchdog_report,
// CHECK-SAME:    .entry pipe_counters(
// CHECK-SAME:    .param .u64 pipe_counters_param_0,
// CHECK-SAME:    .param .u64 .ptr .align 1 pipe_counters_param_1,
// CHECK-SAME:    .param .u64 .ptr .align 1 pipe_counters_param_2,
// CHECK-SAME:    .param .u64 pipe_counters_param_3,
// CHECK-SAME:    .param .u64 pipe_counters_param_4,
// CHECK-SAME:    .param .u64 pipe_counters_param_5,
// CHECK-SAME:    .param .u64 pipe_counters_param_10\0A)
// CHECK-SAME:    .entry pipe_init(
// CHECK-SAME:    bar.sync
// CHECK-SAME:    .entry pipe_worker(
// CHECK-SAME:    bar.sync
// CHECK-SAME:    fence.acq_rel.gpu;\0A\09atom.global.add.u32 {{[^,]*}}, [{{[^]]*}}], -1;
// CHECK-SAME:    ld.relaxed.gpu.global.b32
// CHECK-SAME:    call.uni (retval0), __etc_spin_counter,
// CHECK-SAME:    fence.acq_rel.gpu;\0A\09ld.relaxed.gpu.global.b32 {{[^;]*}};\0A\09setp.ne.b32 {{[^;]*}};\0A$L__BB{{[0-9_]+}}:\0A\09bar.red.or.pred
// CHECK-NOT:     .extern
event.graph @pipe(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
  %e = event.alloc(%n) : !event.tensor<?>
  event.task "produce" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %lane = event.lane_id
    %c0 = arith.constant 0 : index
    %is0 = arith.cmpi eq, %lane, %c0 : index
    scf.if %is0 {
      %v = arith.constant 2.0 : f32
      memref.store %v, %x[%i] : memref<?xf32>
    }
  }
  event.task "consume" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %x[%i] : memref<?xf32>
    %r = math.exp %v : f32
    memref.store %r, %y[%i] : memref<?xf32>
  }
}
