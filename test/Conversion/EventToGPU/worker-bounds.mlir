// RUN: etc-opt %s -event-static-schedule -convert-event-to-gpu | FileCheck %s --check-prefix=DEFAULT
// RUN: etc-opt %s -event-static-schedule -convert-event-to-gpu="lanes=256 min-ctas=2" | FileCheck %s --check-prefix=WS
// RUN: etc-opt %s -event-static-schedule -etc-lower-to-nvvm="lanes=256 min-ctas=2" | FileCheck %s --check-prefix=PTX
// RUN: etc-opt %s -event-static-schedule -etc-lower-to-nvvm | FileCheck %s --check-prefix=PTX128
// RUN: not etc-opt %s -event-static-schedule -convert-event-to-gpu="lanes=100" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not etc-opt %s -event-static-schedule -convert-event-to-gpu="lanes=1024 min-ctas=3" 2>&1 | FileCheck %s --check-prefix=BAD

// The worker kernel's launch bounds: `nvvm.maxntid` is the lanes its tiles
// are written for when not 128 (or with `min-ctas`; `.maxntid 128` alone
// made ptxas cap the worker at 128 registers), on the worker only (the init, counters
// and check kernels have launch shapes of their own); `nvvm.minctasm` only
// when asked for. In PTX they are `.maxntid` and `.minnctapersm` on the
// worker's entry, which together fix the registers a thread has at entry
// (65,536 / (256 x 2) = 128 here) so that ptxas honours `setmaxnreg`.

// DEFAULT-LABEL: gpu.func @pipe_counters(
// DEFAULT-NOT:     nvvm.maxntid
// DEFAULT-LABEL: gpu.func @pipe_worker(
// DEFAULT-SAME:    kernel {
// DEFAULT-LABEL: gpu.func @pipe_check(
// DEFAULT-NOT:     nvvm.m

// WS-LABEL: gpu.func @pipe_worker(
// WS-SAME:    kernel attributes {nvvm.maxntid = array<i32: 256, 1, 1>, nvvm.minctasm = 2 : i32}

// PTX:      .entry pipe_counters(
// PTX-NOT:  .maxntid
// PTX-SAME: .entry pipe_worker(
// PTX-SAME: )\0A.maxntid 256, 1, 1\0A.minnctapersm 2\0A{
// PTX-NOT:  .maxntid
// PTX-NOT:  .minnctapersm

// PTX128:      .entry pipe_worker(
// PTX128-SAME: )\0A{

// BAD: lanes must be a multiple of 32 in [32, 1024] and min-ctas in [0, 2048 / lanes]

event.graph @pipe(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
  %e = event.alloc(%n) : !event.tensor<?>
  event.task "produce" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = arith.constant 2.0 : f32
    memref.store %v, %x[%i] : memref<?xf32>
  }
  event.task "consume" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %y[%i] : memref<?xf32>
  }
}
