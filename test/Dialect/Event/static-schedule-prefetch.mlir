// RUN: etc-opt %s -event-static-schedule="workers=2 prefetch=true" | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -event-static-schedule="workers=2" | FileCheck %s --check-prefix=OFF
// RUN: etc-opt %s -event-dynamic-schedule="workers=2 auto=true prefetch=true" | FileCheck %s --check-prefix=AUTO

// Weight prefetch: before the waits of a tile, the boxes it reads from
// buffers no task writes (%w1 and %w2, the weights; %x is an input too but
// matmul_0 has no waits) are asked for with `event.prefetch`, clipped to the
// buffer. matmul_1 waits on its row block of %h and reads column block j of
// %w2: rows [0, 64) (`?`, the whole dimension) and columns
// [min(32 j, 32), +min(32, 32 - that)) of a 64x32 buffer. A tile without
// waits (matmul_0) has nothing to overlap and prefetches nothing.

// CHECK-LABEL: func.func @two_worker(
// CHECK-NOT:     event.prefetch
// CHECK:         %[[W2:.*]] = event.buffer %{{.*}}[%{{.*}}] : memref<?xi64> -> memref<64x32xf32>
// CHECK:         %[[OFF0:.*]] = affine.apply #{{.*}}(%{{.*}}, %[[J:[^)]*]])
// CHECK:         %[[D0:.*]] = memref.dim %[[W2]], %{{.*}} : memref<64x32xf32>
// CHECK:         %[[O0:.*]] = arith.minsi %[[OFF0]], %[[D0]] : index
// CHECK:         %[[S0:.*]] = arith.subi %[[D0]], %[[O0]] : index
// CHECK:         %[[OFF1:.*]] = affine.apply #{{.*}}(%{{.*}}, %[[J]])
// CHECK:         %[[D1:.*]] = memref.dim %[[W2]], %{{.*}} : memref<64x32xf32>
// CHECK:         %[[O1:.*]] = arith.minsi %[[OFF1]], %[[D1]] : index
// CHECK:         %[[LEFT1:.*]] = arith.subi %[[D1]], %[[O1]] : index
// CHECK:         %[[S1:.*]] = arith.minsi %{{.*}}, %[[LEFT1]] : index
// CHECK:         event.prefetch %[[W2]][%[[O0]], %[[O1]]] [%[[S0]], %[[S1]]] : memref<64x32xf32>
// CHECK:         event.wait
// CHECK-NOT:     event.prefetch

// OFF-NOT: event.prefetch

// `auto` schedules this regular graph statically and prefetches too.
// AUTO: event.schedule = "static"
// AUTO: event.prefetch

module {
  event.graph @two(%n: index, %x: memref<?x32xf32>, %w1: memref<32x64xf32>, %w2: memref<64x32xf32>, %y: memref<?x32xf32>, %h: memref<?x64xf32> {event.intermediate}) {
    %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 16)>()[%n]
    %c2 = arith.constant 2 : index
    %c1 = arith.constant 1 : index
    %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
    event.task "matmul_0" grid(%rows, %c2) reads(%x : memref<?x32xf32> (d0, d1) -> (d0 * 16, 0) [16, ?], %w1 : memref<32x64xf32> (d0, d1) -> (0, d1 * 32) [?, 32]) writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 16, d1 * 32) [16, 32]) notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
    ^bb0(%i: index, %j: index):
      func.call @tile0(%x, %w1, %h, %i, %j) : (memref<?x32xf32>, memref<32x64xf32>, memref<?x64xf32>, index, index) -> ()
    }
    event.task "matmul_1" grid(%rows, %c1) reads(%h : memref<?x64xf32> (d0, d1) -> (d0 * 16, 0) [16, ?], %w2 : memref<64x32xf32> (d0, d1) -> (0, d1 * 32) [?, 32]) writes(%y : memref<?x32xf32> (d0, d1) -> (d0 * 16, d1 * 32) [16, 32]) waits(%e : !event.tensor<?> (d0, d1) -> (d0)) {
    ^bb0(%i: index, %j: index):
      func.call @tile1(%h, %w2, %y, %i, %j) : (memref<?x64xf32>, memref<64x32xf32>, memref<?x32xf32>, index, index) -> ()
    }
  }
  func.func private @tile0(memref<?x32xf32>, memref<32x64xf32>, memref<?x64xf32>, index, index) attributes {event.tile}
  func.func private @tile1(memref<?x64xf32>, memref<64x32xf32>, memref<?x32xf32>, index, index) attributes {event.tile}
}
