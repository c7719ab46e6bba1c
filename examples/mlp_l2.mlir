// A two-operator graph at L2: h = x * 2 (tile of 32 rows), then y = h + 1
// row-block by row-block, with the event tensor that connects them.
event.graph @scale_add(%B: index, %x: memref<?x64xf32>, %h: memref<?x64xf32> {event.intermediate}, %y: memref<?x64xf32>) {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
  %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
  event.task "scale" grid(%rows, %c2)
      reads(%x : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
    %lane = event.lane_id
  }
  event.task "add" grid(%rows)
      reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      writes(%y : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    event.lane_barrier
  }
}
