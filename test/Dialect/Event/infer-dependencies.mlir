// RUN: etc-opt %s -split-input-file -event-infer-dependencies -verify-diagnostics | FileCheck %s
// Idempotence: a second run leaves every graph as the first run made it.
// RUN: etc-opt %s -split-input-file -event-infer-dependencies -verify-diagnostics | etc-opt -split-input-file -event-infer-dependencies | FileCheck %s
// Every inferred graph, explicit events included, is a schedule that
// event-check-schedule accepts.
// RUN: etc-opt %s -split-input-file -event-infer-dependencies -verify-diagnostics | etc-opt -split-input-file -event-check-schedule | FileCheck %s --check-prefix=SCHED

// Two operators: each row block of "rowsum" waits for the two column tiles of
// "scale" in that row block (reduction across tiles: count = column tiles).

// CHECK-LABEL: event.graph @chain2(
// CHECK-SAME:      %[[B:.*]]: index
// CHECK:         %[[C2:.*]] = arith.constant 2 : index
// CHECK:         %[[ROWS:.*]] = affine.apply #{{.*}}()[%[[B]]]
// CHECK:         %[[E:.*]] = event.alloc(%[[ROWS]]) count(%[[C2]]) : !event.tensor<?>
// CHECK-NEXT:    event.task "scale" grid(%[[ROWS]], %[[C2]])
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<?> (d0, d1) -> (d0))
// CHECK:         event.task "rowsum" grid(%[[ROWS]])
// CHECK-SAME:        waits(%[[E]] : !event.tensor<?> (d0) -> (d0))
// CHECK-NOT:     notifies
// CHECK-NOT:     event.alloc
event.graph @chain2(%B: index, %x: memref<?x64xf32>, %h: memref<?x64xf32> {event.intermediate}, %y: memref<?xf32>) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  event.task "scale" grid(%rows, %c2)
      reads(%x : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "rowsum" grid(%rows)
      reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      writes(%y : memref<?xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Three operators tiled alike: one counter per row block between each pair,
// each expecting the single producer tile of that block.

// CHECK-LABEL: event.graph @chain3(
// CHECK:         %[[C4:.*]] = arith.constant 4 : index
// CHECK:         %[[C1:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[E0:.*]] = event.alloc() count(%[[C1]]) : !event.tensor<4>
// CHECK-NEXT:    event.task "a" grid(%[[C4]])
// CHECK-SAME:        notifies(%[[E0]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         %[[E1:.*]] = event.alloc() count(%[[C1]]) : !event.tensor<4>
// CHECK-NEXT:    event.task "b" grid(%[[C4]])
// CHECK-SAME:        waits(%[[E0]] : !event.tensor<4> (d0) -> (d0))
// CHECK-SAME:        notifies(%[[E1]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         event.task "c" grid(%[[C4]])
// CHECK-SAME:        waits(%[[E1]] : !event.tensor<4> (d0) -> (d0))
// CHECK-NOT:     notifies
event.graph @chain3(%x: memref<128xf32>, %h1: memref<128xf32> {event.intermediate}, %h2: memref<128xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "a" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h1 : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%c4)
      reads(%h1 : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h2 : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "c" grid(%c4)
      reads(%h2 : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Fan-in: "add" reads two buffers produced by two tasks and waits on both.

// CHECK-LABEL: event.graph @fan_in(
// CHECK:         %[[EA:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "a"
// CHECK-SAME:        notifies(%[[EA]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         %[[EB:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "b"
// CHECK-SAME:        notifies(%[[EB]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         event.task "add"
// CHECK-SAME:        waits(%[[EA]] : !event.tensor<4> (d0) -> (d0), %[[EB]] : !event.tensor<4> (d0) -> (d0))
// CHECK-NOT:     notifies
event.graph @fan_in(%x: memref<128xf32>, %p: memref<128xf32> {event.intermediate}, %q: memref<128xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "a" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%p : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%q : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "add" grid(%c4)
      reads(%p : memref<128xf32> (d0) -> (d0 * 32) [32],
            %q : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Fan-out: two consumers with the same alignment share one event; the
// producer notifies it once.

// CHECK-LABEL: event.graph @fan_out(
// CHECK:         %[[E:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NOT:     event.alloc
// CHECK:         event.task "a"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<4> (d0) -> (d0)) {
// CHECK:         event.task "b"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<4> (d0) -> (d0)) {
// CHECK:         event.task "c"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<4> (d0) -> (d0)) {
event.graph @fan_out(%x: memref<128xf32>, %h: memref<128xf32> {event.intermediate}, %y: memref<128xf32>, %z: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "a" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%c4)
      reads(%h : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "c" grid(%c4)
      reads(%h : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%z : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Reduction across tiles: "rowmax" reads whole rows of a 4x8-tiled buffer, so
// each of its 4 counters expects the 8 column tiles of its row block.

// CHECK-LABEL: event.graph @reduction(
// CHECK:         %[[C4:.*]] = arith.constant 4 : index
// CHECK:         %[[C8:.*]] = arith.constant 8 : index
// CHECK:         %[[E:.*]] = event.alloc() count(%[[C8]]) : !event.tensor<4>
// CHECK-NEXT:    event.task "exp" grid(%[[C4]], %[[C8]])
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<4> (d0, d1) -> (d0))
// CHECK:         event.task "rowmax" grid(%[[C4]])
// CHECK-SAME:        waits(%[[E]] : !event.tensor<4> (d0) -> (d0))
event.graph @reduction(%x: memref<128x256xf32>, %h: memref<128x256xf32> {event.intermediate}, %m: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  event.task "exp" grid(%c4, %c8)
      reads(%x : memref<128x256xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%h : memref<128x256xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "rowmax" grid(%c4)
      reads(%h : memref<128x256xf32> (d0) -> (d0 * 32, 0) [32, ?])
      writes(%m : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Split reduction: the grid dimension of "partial" that splits K does not
// appear in its footprint, so it is collapsed into the count.

// CHECK-LABEL: event.graph @split_reduction(
// CHECK:         %[[C4:.*]] = arith.constant 4 : index
// CHECK:         %[[C2:.*]] = arith.constant 2 : index
// CHECK:         %[[E:.*]] = event.alloc() count(%[[C2]]) : !event.tensor<4>
// CHECK-NEXT:    event.task "partial" grid(%[[C4]], %[[C2]])
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<4> (d0, d1) -> (d0))
// CHECK:         event.task "finish" grid(%[[C4]])
// CHECK-SAME:        waits(%[[E]] : !event.tensor<4> (d0) -> (d0))
event.graph @split_reduction(%x: memref<128x512xf32>, %acc: memref<128xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  %c2 = arith.constant 2 : index
  event.task "partial" grid(%c4, %c2)
      reads(%x : memref<128x512xf32> (d0, d1) -> (d0 * 32, d1 * 256) [32, 256])
      writes(%acc : memref<128xf32> (d0, d1) -> (d0 * 32) [32]) {
  ^bb0(%i: index, %k: index):
  }
  event.task "finish" grid(%c4)
      reads(%acc : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Transposed access: "proj" writes W (256x128) in 32x32 tiles; "mm" computes
// y = x * W^T and output column block j reads rows j*32.. of W, all columns.
// Event dimension = W row blocks (8), waited on with mm's second tile index;
// each counter expects proj's 4 column tiles.

// CHECK-LABEL: event.graph @transposed(
// CHECK:         %[[C8:.*]] = arith.constant 8 : index
// CHECK:         %[[C4:.*]] = arith.constant 4 : index
// CHECK:         %[[E:.*]] = event.alloc() count(%[[C4]]) : !event.tensor<8>
// CHECK-NEXT:    event.task "proj" grid(%[[C8]], %[[C4]])
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<8> (d0, d1) -> (d0))
// CHECK:         event.task "mm" grid(%{{.*}}, %[[C8]])
// CHECK-SAME:        waits(%[[E]] : !event.tensor<8> (d0, d1) -> (d1))
// "transpose" reads tile (j, i) of W for its tile (i, j): a 2-D event, waited
// on with the tile indices swapped.
// CHECK:         %[[ET:.*]] = event.alloc() count(%[[C1:.*]]) : !event.tensor<8x4>
// CHECK-NEXT:    event.task "proj2" grid(%[[C8]], %[[C4]])
// CHECK-SAME:        notifies(%[[ET]] : !event.tensor<8x4> (d0, d1) -> (d0, d1))
// CHECK:         event.task "transpose" grid(%[[C4]], %[[C8]])
// CHECK-SAME:        waits(%[[ET]] : !event.tensor<8x4> (d0, d1) -> (d1, d0))
event.graph @transposed(%B: index, %w0: memref<256x128xf32>, %x: memref<?x128xf32>, %w: memref<256x128xf32> {event.intermediate}, %y: memref<?x256xf32>,
                        %v: memref<256x128xf32> {event.intermediate}, %vt: memref<128x256xf32>) {
  %c8 = arith.constant 8 : index
  %c4 = arith.constant 4 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 16)>()[%B]
  event.task "proj" grid(%c8, %c4)
      reads(%w0 : memref<256x128xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%w : memref<256x128xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "mm" grid(%rows, %c8)
      reads(%x : memref<?x128xf32> (d0, d1) -> (d0 * 16, 0) [16, ?],
            %w : memref<256x128xf32> (d0, d1) -> (d1 * 32, 0) [32, ?])
      writes(%y : memref<?x256xf32> (d0, d1) -> (d0 * 16, d1 * 32) [16, 32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "proj2" grid(%c8, %c4)
      reads(%w0 : memref<256x128xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%v : memref<256x128xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "transpose" grid(%c4, %c8)
      reads(%v : memref<256x128xf32> (d0, d1) -> (d1 * 32, d0 * 32) [32, 32])
      writes(%vt : memref<128x256xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {
  ^bb0(%i: index, %j: index):
  }
}

// -----

// One symbolic dimension in several operators: sizes are the grid values and
// the counts are those values or products of them.

// CHECK-LABEL: event.graph @symbolic(
// CHECK-SAME:      %[[B:[^:]*]]: index, %[[N:[^:]*]]: index
// CHECK:         %[[RB:.*]] = affine.apply #{{.*}}()[%[[B]]]
// CHECK:         %[[CB:.*]] = affine.apply #{{.*}}()[%[[N]]]
// CHECK:         %[[E0:.*]] = event.alloc(%[[RB]]) count(%[[CB]]) : !event.tensor<?>
// CHECK-NEXT:    %[[ALL:.*]] = arith.muli %[[RB]], %[[CB]] : index
// CHECK-NEXT:    %[[E1:.*]] = event.alloc() count(%[[ALL]]) : !event.tensor<>
// CHECK-NEXT:    event.task "mm" grid(%[[RB]], %[[CB]])
// CHECK-SAME:        notifies(%[[E0]] : !event.tensor<?> (d0, d1) -> (d0), %[[E1]] : !event.tensor<> (d0, d1) -> ())
// CHECK:         %[[E2:.*]] = event.alloc() count(%[[RB]]) : !event.tensor<>
// CHECK-NEXT:    event.task "rowsum" grid(%[[RB]])
// CHECK-SAME:        waits(%[[E0]] : !event.tensor<?> (d0) -> (d0))
// CHECK-SAME:        notifies(%[[E2]] : !event.tensor<> (d0) -> ())
// CHECK:         event.task "total" grid(%{{[^)]*}})
// CHECK-SAME:        waits(%[[E1]] : !event.tensor<> (d0) -> (), %[[E2]] : !event.tensor<> (d0) -> ())
event.graph @symbolic(%B: index, %N: index, %x: memref<?x128xf32>, %h: memref<?x?xf32> {event.intermediate}, %s: memref<?xf32> {event.intermediate}, %t: memref<1xf32>) {
  %c1 = arith.constant 1 : index
  %rb = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %cb = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%N]
  event.task "mm" grid(%rb, %cb)
      reads(%x : memref<?x128xf32> (d0, d1) -> (d0 * 32, 0) [32, ?])
      writes(%h : memref<?x?xf32> (d0, d1) -> (d0 * 32, d1 * 64) [32, 64]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "rowsum" grid(%rb)
      reads(%h : memref<?x?xf32> (d0) -> (d0 * 32, 0) [32, ?])
      writes(%s : memref<?xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "total" grid(%c1)
      reads(%h : memref<?x?xf32> (d0) -> (0, 0) [?, ?],
            %s : memref<?xf32> (d0) -> (0) [?])
      writes(%t : memref<1xf32> (d0) -> (0) [1]) {
  ^bb0(%i: index):
  }
}

// -----

// Case (b): each producer tile covers two consumer tiles, so consumer tile i
// waits on producer tile i floordiv 2; also when the extents are symbolic.

// CHECK-LABEL: event.graph @floordiv(
// CHECK:         %[[E0:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "wide"
// CHECK-SAME:        notifies(%[[E0]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         event.task "narrow"
// CHECK-SAME:        waits(%[[E0]] : !event.tensor<4> (d0) -> (d0 floordiv 2))
// CHECK:         %[[WIDE:.*]] = affine.apply #{{.*}}()[%{{.*}}]
// CHECK:         %[[E1:.*]] = event.alloc(%[[WIDE]]) count(%{{.*}}) : !event.tensor<?>
// CHECK-NEXT:    event.task "wide_sym" grid(%[[WIDE]])
// CHECK-SAME:        notifies(%[[E1]] : !event.tensor<?> (d0) -> (d0))
// CHECK:         event.task "narrow_sym"
// CHECK-SAME:        waits(%[[E1]] : !event.tensor<?> (d0) -> (d0 floordiv 2))
event.graph @floordiv(%B: index, %x: memref<256xf32>, %h: memref<256xf32> {event.intermediate}, %y: memref<256xf32>,
                      %u: memref<?xf32>, %v: memref<?xf32> {event.intermediate}, %w: memref<?xf32>) {
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  event.task "wide" grid(%c4)
      reads(%x : memref<256xf32> (d0) -> (d0 * 64) [64])
      writes(%h : memref<256xf32> (d0) -> (d0 * 64) [64]) {
  ^bb0(%i: index):
  }
  event.task "narrow" grid(%c8)
      reads(%h : memref<256xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<256xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  %wide = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%B]
  %narrow = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  event.task "wide_sym" grid(%wide)
      reads(%u : memref<?xf32> (d0) -> (d0 * 64) [64])
      writes(%v : memref<?xf32> (d0) -> (d0 * 64) [64]) {
  ^bb0(%i: index):
  }
  event.task "narrow_sym" grid(%narrow)
      reads(%v : memref<?xf32> (d0) -> (d0 * 32) [32])
      writes(%w : memref<?xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Case (c): the consumer's tile spans two producer tiles, so the event is
// collapsed to one counter that expects all 8 producer tiles.

// CHECK-LABEL: event.graph @coarser_consumer(
// CHECK:         %[[C8:.*]] = arith.constant 8 : index
// CHECK:         %[[E:.*]] = event.alloc() count(%[[C8]]) : !event.tensor<>
// CHECK-NEXT:    event.task "narrow" grid(%[[C8]])
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<> (d0) -> ())
// CHECK:         event.task "wide"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<> (d0) -> ())
event.graph @coarser_consumer(%x: memref<256xf32>, %h: memref<256xf32> {event.intermediate}, %y: memref<256xf32>) {
  %c8 = arith.constant 8 : index
  %c4 = arith.constant 4 : index
  event.task "narrow" grid(%c8)
      reads(%x : memref<256xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<256xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "wide" grid(%c4)
      reads(%h : memref<256xf32> (d0) -> (d0 * 64) [64])
      writes(%y : memref<256xf32> (d0) -> (d0 * 64) [64]) {
  ^bb0(%i: index):
  }
}

// -----

// A consumer that reads one fixed box inside a single producer tile waits on
// that tile's counter only.

// CHECK-LABEL: event.graph @fixed_box(
// CHECK:         %[[E:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK:         event.task "head"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<4> (d0) -> (1))
event.graph @fixed_box(%x: memref<128xf32>, %h: memref<128xf32> {event.intermediate}, %y: memref<16xf32>) {
  %c4 = arith.constant 4 : index
  %c1 = arith.constant 1 : index
  event.task "all" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "head" grid(%c1)
      reads(%h : memref<128xf32> (d0) -> (40) [16])
      writes(%y : memref<16xf32> (d0) -> (0) [16]) {
  ^bb0(%i: index):
  }
}

// -----

// A footprint the analysis does not understand degrades to one counter that
// expects every producer tile (count = rows * 2 as an affine.apply).

// CHECK-LABEL: event.graph @unknown_footprint(
// CHECK:         %[[ROWS:.*]] = affine.apply #{{.*}}()[%{{.*}}]
// CHECK:         %[[COUNT:.*]] = affine.apply #[[TWICE:.*]]()[%[[ROWS]]]
// CHECK-NEXT:    %[[E:.*]] = event.alloc() count(%[[COUNT]]) : !event.tensor<>
// CHECK-NEXT:    event.task "skewed"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<> (d0, d1) -> ())
// CHECK:         event.task "use"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<> (d0) -> ())
event.graph @unknown_footprint(%B: index, %h: memref<?xf32> {event.intermediate}, %y: memref<?xf32>) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%B]
  event.task "skewed" grid(%rows, %c2)
      writes(%h : memref<?xf32> (d0, d1) -> (d0 * 64 + d1 * 32) [32]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "use" grid(%rows)
      reads(%h : memref<?xf32> (d0) -> (d0 * 64) [64])
      writes(%y : memref<?xf32> (d0) -> (d0 * 64) [64]) {
  ^bb0(%i: index):
  }
}

// -----

// An index buffer is a whole-buffer read: the routed task waits for every
// tile of the router.

// CHECK-LABEL: event.graph @index_buffer(
// CHECK:         %[[E:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<>
// CHECK-NEXT:    event.task "route"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<> (d0) -> ())
// CHECK:         event.task "expert"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<> (d0) -> ())
event.graph @index_buffer(%x: memref<128xf32>, %ids: memref<128xi32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "route" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%ids : memref<128xi32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "expert" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32])
      indices(%ids : memref<128xi32>) {
  ^bb0(%i: index):
  }
}

// -----

// One producer, two buffers: "norm" needs its row block of %h but all of %s,
// so the coarser event (all tiles of "stats") subsumes the finer one.

// CHECK-LABEL: event.graph @subsumed(
// CHECK:         %[[E:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<>
// CHECK-NOT:     event.alloc
// CHECK:         event.task "stats"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<> (d0) -> ()) {
// CHECK:         event.task "norm"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<> (d0) -> ()) {
event.graph @subsumed(%x: memref<128xf32>, %h: memref<128xf32> {event.intermediate}, %s: memref<4xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "stats" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<128xf32> (d0) -> (d0 * 32) [32],
             %s : memref<4xf32> (d0) -> (d0) [1]) {
  ^bb0(%i: index):
  }
  event.task "norm" grid(%c4)
      reads(%h : memref<128xf32> (d0) -> (d0 * 32) [32],
            %s : memref<4xf32> (d0) -> (0) [?])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Buffer reuse: "w2" overwrites %buf after "r1" read it (write after read)
// and after "w1" wrote it (write after write). Both dependencies are aligned
// with w1's event resp. a new event of r1; "r2" then reads w2's data.

// CHECK-LABEL: event.graph @reuse(
// CHECK:         %[[E1:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "w1"
// CHECK-SAME:        notifies(%[[E1]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         %[[ER:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "r1"
// CHECK-SAME:        waits(%[[E1]] : !event.tensor<4> (d0) -> (d0))
// CHECK-SAME:        notifies(%[[ER]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         %[[E2:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "w2"
// CHECK-SAME:        waits(%[[ER]] : !event.tensor<4> (d0) -> (d0), %[[E1]] : !event.tensor<4> (d0) -> (d0))
// CHECK-SAME:        notifies(%[[E2]] : !event.tensor<4> (d0) -> (d0))
// CHECK:         event.task "r2"
// CHECK-SAME:        waits(%[[E2]] : !event.tensor<4> (d0) -> (d0))
// CHECK-NOT:     notifies
event.graph @reuse(%x: memref<128xf32>, %buf: memref<128xf32> {event.intermediate}, %y: memref<128xf32>, %z: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "w1" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%buf : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "r1" grid(%c4)
      reads(%buf : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "w2" grid(%c4)
      reads(%y : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%buf : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "r2" grid(%c4)
      reads(%buf : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%z : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// An in-place update reads and writes %acc: its read-after-write and
// write-after-write dependencies on "init" become one wait, and the later
// reader waits on the in-place writer only.

// CHECK-LABEL: event.graph @in_place(
// CHECK:         %[[E0:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "init"
// CHECK-SAME:        notifies(%[[E0]] : !event.tensor<4> (d0) -> (d0)) {
// CHECK:         %[[E1:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "accumulate"
// CHECK-SAME:        waits(%[[E0]] : !event.tensor<4> (d0) -> (d0)) notifies(%[[E1]] : !event.tensor<4> (d0) -> (d0)) {
// CHECK:         event.task "final"
// CHECK-SAME:        waits(%[[E1]] : !event.tensor<4> (d0) -> (d0)) {
event.graph @in_place(%x: memref<128xf32>, %acc: memref<128xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "init" grid(%c4)
      writes(%acc : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "accumulate" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32],
            %acc : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%acc : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "final" grid(%c4)
      reads(%acc : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// A graph that already carries the events inference would build is left
// unchanged: the existing event is recognised and reused.

// CHECK-LABEL: event.graph @already_l2(
// CHECK:         event.alloc
// CHECK-NOT:     event.alloc
// CHECK:         event.task "scale"
// CHECK-SAME:        notifies(%{{.*}} : !event.tensor<?> (d0, d1) -> (d0)) {
// CHECK:         event.task "add"
// CHECK-SAME:        waits(%{{.*}} : !event.tensor<?> (d0) -> (d0)) {
event.graph @already_l2(%B: index, %x: memref<?x64xf32>, %h: memref<?x64xf32> {event.intermediate}, %y: memref<?x64xf32>) {
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
  event.task "scale" grid(%rows, %c2)
      reads(%x : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
  }
  event.task "add" grid(%rows)
      reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      writes(%y : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

// Independent tasks need no events.

// CHECK-LABEL: event.graph @independent(
// CHECK-NOT:     event.alloc
// CHECK-NOT:     waits
// CHECK-NOT:     notifies
// CHECK:         event.task "a"
// CHECK:         event.task "b"
// CHECK-NOT:     waits
// CHECK-NOT:     notifies
event.graph @independent(%x: memref<128xf32>, %y: memref<128xf32>, %z: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  event.task "a" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%z : memref<128xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

event.graph @out_of_bounds(%x: memref<64xf32>) {
  %c4 = arith.constant 4 : index
  // expected-error @+1 {{'big' writes #0 (graph argument #0) out of bounds: its last tile starts at offset 96 of buffer dimension 0, which has size 64}}
  event.task "big" grid(%c4)
      writes(%x : memref<64xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// Explicit and inferred events on one graph: "a" already notifies %side with
// a map inference would never build (it is kept, and not reused); the
// footprints of %h add an inferred event after it, and "b" waits on both.

// CHECK-LABEL: event.graph @explicit_and_inferred(
// CHECK:         %[[SIDE:.*]] = event.alloc() : !event.tensor<4>
// CHECK:         %[[H:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<4>
// CHECK-NEXT:    event.task "a"
// CHECK-SAME:        notifies(%[[SIDE]] : !event.tensor<4> (d0) -> ((d0 + 1) mod 4), %[[H]] : !event.tensor<4> (d0) -> (d0)) {
// CHECK:         event.task "b"
// CHECK-SAME:        waits(%[[SIDE]] : !event.tensor<4> (d0) -> (d0), %[[H]] : !event.tensor<4> (d0) -> (d0)) {
// SCHED-LABEL: event.graph @explicit_and_inferred(
event.graph @explicit_and_inferred(%x: memref<128xf32>, %h: memref<128xf32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  %side = event.alloc() : !event.tensor<4>
  event.task "a" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<128xf32> (d0) -> (d0 * 32) [32])
      notifies(%side : !event.tensor<4> (d0) -> ((d0 + 1) mod 4)) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%c4)
      reads(%h : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<128xf32> (d0) -> (d0 * 32) [32])
      waits(%side : !event.tensor<4> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
}

// -----

// Routed work (the shape of a Mixture-of-Experts layer): "combine" waits on
// the expert each token was routed to through an explicit indirect wait
// reading %ids. The wait is kept; the inferred wait on "router", which
// writes %ids, goes before it, because an indirect coordinate is loaded
// right before its wait. "expert" only gets the inferred wait.

// CHECK-LABEL: event.graph @indirect_wait_kept(
// CHECK:         %[[R:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<>
// CHECK-NEXT:    event.task "router"
// CHECK-SAME:        notifies(%[[R]] : !event.tensor<> (d0) -> ()) {
// CHECK:         %[[DONE:.*]] = event.alloc() count(%{{.*}}) : !event.tensor<8>
// CHECK-NEXT:    event.task "expert"
// CHECK-SAME:        waits(%[[R]] : !event.tensor<> (d0, d1) -> ())
// CHECK-SAME:        notifies(%[[DONE]] : !event.tensor<8> (d0, d1) -> (d0)) {
// CHECK:         event.task "combine"
// CHECK-SAME:        waits(%[[R]] : !event.tensor<> (d0) -> (), %[[DONE]] : !event.tensor<8> (d0) -> (d0) indirect [0])
// CHECK-SAME:        indices(%{{.*}} : memref<128xi32>) {
// SCHED-LABEL: event.graph @indirect_wait_kept(
event.graph @indirect_wait_kept(%x: memref<128xf32>, %ids: memref<128xi32> {event.intermediate}, %y: memref<128xf32>) {
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c128 = arith.constant 128 : index
  event.task "router" grid(%c4)
      reads(%x : memref<128xf32> (d0) -> (d0 * 32) [32])
      writes(%ids : memref<128xi32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
  %done = event.alloc() count(%c4) : !event.tensor<8>
  event.task "expert" grid(%c8, %c4)
      reads(%ids : memref<128xi32> (d0, d1) -> (0) [?])
      notifies(%done : !event.tensor<8> (d0, d1) -> (d0)) {
  ^bb0(%e: index, %j: index):
  }
  event.task "combine" grid(%c128)
      writes(%y : memref<128xf32> (d0) -> (d0) [1])
      waits(%done : !event.tensor<8> (d0) -> (d0) indirect [0])
      indices(%ids : memref<128xi32>) {
  ^bb0(%t: index):
  }
}

// -----

// An explicit event shaped like the one inference derives (one counter per
// producer tile, notified by that producer alone) is reused rather than
// duplicated, even when it was declared with other footprints in mind.

// CHECK-LABEL: event.graph @explicit_reused(
// CHECK:         %[[E:.*]] = event.alloc(%{{.*}}) count(%{{.*}}) : !event.tensor<?>
// CHECK-NOT:     event.alloc
// CHECK:         event.task "a"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<?> (d0) -> (d0)) {
// CHECK:         event.task "b"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<?> (d0) -> (d0)) {
// CHECK:         event.task "c"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<?> (d0) -> (d0)) {
// SCHED-LABEL: event.graph @explicit_reused(
event.graph @explicit_reused(%B: index, %x: memref<?xf32>, %h: memref<?xf32> {event.intermediate}, %y: memref<?xf32>, %z: memref<?xf32>) {
  %c1 = arith.constant 1 : index
  %n = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "a" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0 * 32) [32])
      writes(%h : memref<?xf32> (d0) -> (d0 * 32) [32])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "b" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0 * 32) [32])
      writes(%y : memref<?xf32> (d0) -> (d0 * 32) [32])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
  }
  event.task "c" grid(%n)
      reads(%h : memref<?xf32> (d0) -> (d0 * 32) [32])
      writes(%z : memref<?xf32> (d0) -> (d0 * 32) [32]) {
  ^bb0(%i: index):
  }
}

// -----

// A producer with live bounds writes only on its live tiles, so the event
// inference builds for it has no `count`: the scheduled program counts the
// live notifiers of each element (a second run reuses it).

// CHECK-LABEL: event.graph @live_producer(
// CHECK:         %[[E:.*]] = event.alloc(%{{.*}}) : !event.tensor<?>
// CHECK-NEXT:    event.task "chunk"
// CHECK-SAME:        notifies(%[[E]] : !event.tensor<?> (d0, d1) -> (d0))
// CHECK-SAME:        live(d1 below (d0) -> (d0 ceildiv 4) of (d0, d1) -> (d0) indirect [0])
// CHECK:         event.task "rows"
// CHECK-SAME:        waits(%[[E]] : !event.tensor<?> (d0) -> (d0))
// CHECK-NOT:     event.alloc
// SCHED-LABEL: event.graph @live_producer(
event.graph @live_producer(%r: index, %len: memref<?xi32>, %h: memref<?x8xf32> {event.intermediate}, %y: memref<?xf32>) {
  %c8 = arith.constant 8 : index
  event.task "chunk" grid(%r, %c8)
      writes(%h : memref<?x8xf32> (d0, d1) -> (d0, d1) [1, 1])
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 4) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
  }
  event.task "rows" grid(%r)
      reads(%h : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      writes(%y : memref<?xf32> (d0) -> (d0) [1]) {
  ^bb0(%i: index):
  }
}
