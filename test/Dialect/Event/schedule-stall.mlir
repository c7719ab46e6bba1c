// RUN: etc-opt %s -split-input-file -event-static-schedule=workers=2 | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -split-input-file -event-dynamic-schedule=workers=2 | FileCheck %s --enable-var-scope

// A tile function that stalls on one of its barriers (`event.stall`, as
// `etc.ops.wgmma.Barriers` emits it) gets more arguments: the worker's
// counter buffer, and the task index and the tile's coordinates as i32
// words, which each stall in it gets as its counters and site, so that a hang's watchdog
// record names the task and tile. Only this graph's tasks call it, so it
// is rewritten in place and keeps its name; a tile function without
// stalls is called as it was.

// CHECK-LABEL: func.func private @pipe_tile(
// CHECK-SAME:      %[[X:[^:]*]]: memref<?xf32>, %[[I:[^:]*]]: index, %[[J:[^:]*]]: index,
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[TASK:[^:]*]]: i32, %[[T0:[^:]*]]: i32, %[[T1:[^:]*]]: i32)
// CHECK-SAME:      attributes {event.tile}
// CHECK-NEXT:    %[[TASKI:.*]] = arith.index_cast %[[TASK]] : i32 to index
// CHECK-NEXT:    %[[T0I:.*]] = arith.index_cast %[[T0]] : i32 to index
// CHECK-NEXT:    %[[T1I:.*]] = arith.index_cast %[[T1]] : i32 to index
// CHECK:         event.stall "full" barrier(%{{.*}}) stage(%[[I]]) parity(%[[J]]) since(%{{.*}}) on %[[COUNTERS]] site(%[[TASKI]], %[[T0I]], %[[T1I]]) : memref<?xi32>
// CHECK-NOT:     event.stall
// CHECK:         return
// CHECK-LABEL: func.func private @plain_tile(
// CHECK-NOT:   _sited
// CHECK-LABEL: func.func @pipe_worker(
// CHECK-SAME:      %[[WCOUNTERS:[^:]*]]: memref<?xi32>)
// CHECK:         %[[TASK32:.*]] = arith.index_cast %{{.*}} : index to i32
// CHECK-NEXT:    %[[A32:.*]] = arith.index_cast %[[A:.*]] : index to i32
// CHECK-NEXT:    %[[B32:.*]] = arith.index_cast %[[B:.*]] : index to i32
// CHECK-NEXT:    func.call @pipe_tile(%{{.*}}, %[[A]], %[[B]], %[[WCOUNTERS]], %[[TASK32]], %[[A32]], %[[B32]]) : (memref<?xf32>, index, index, memref<?xi32>, i32, i32, i32) -> ()
// CHECK:         func.call @plain_tile(%{{[^,]*}}, %{{[^)]*}}) : (memref<?xf32>, index) -> ()
func.func private @pipe_tile(%x: memref<?xf32>, %i: index, %j: index) attributes {event.tile} {
  %c0 = arith.constant 0 : index
  %since = arith.constant 0 : i64
  %start, %give_up = event.stall "full" barrier(%c0) stage(%i) parity(%j) since(%since)
  return
}
func.func private @plain_tile(%x: memref<?xf32>, %i: index) attributes {event.tile} {
  %v = memref.load %x[%i] : memref<?xf32>
  memref.store %v, %x[%i] : memref<?xf32>
  return
}
event.graph @pipe(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
  %c2 = arith.constant 2 : index
  %c1 = arith.constant 1 : index
  %e = event.alloc(%n) count(%c2) : !event.tensor<?>
  event.task "mma" grid(%n, %c2)
      writes(%x : memref<?xf32> (d0, d1) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
    func.call @pipe_tile(%x, %i, %j) : (memref<?xf32>, index, index) -> ()
  }
  event.task "after" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    func.call @plain_tile(%y, %i) : (memref<?xf32>, index) -> ()
  }
}

// -----

// A tile function that something outside the graph calls too is called
// through a sited copy, `@<callee>_sited`; the original stays as it was.

// CHECK-LABEL: func.func private @shared_tile(
// CHECK-SAME:      %{{[^:]*}}: memref<?xf32>, %{{[^:]*}}: index)
// CHECK:         event.stall "full" barrier(%{{.*}}) stage(%{{.*}}) parity(%{{.*}}) since(%{{.*}}){{$}}
// CHECK-LABEL: func.func private @shared_tile_sited(
// CHECK-SAME:      %{{[^:]*}}: memref<?xf32>, %{{[^:]*}}: index, %[[COUNTERS:[^:]*]]: memref<?xi32>, %[[TASK:[^:]*]]: i32, %[[T0:[^:]*]]: i32)
// CHECK-NEXT:    %[[TASKI:.*]] = arith.index_cast %[[TASK]] : i32 to index
// CHECK-NEXT:    %[[T0I:.*]] = arith.index_cast %[[T0]] : i32 to index
// CHECK:         event.stall "full" barrier(%{{.*}}) stage(%{{.*}}) parity(%{{.*}}) since(%{{.*}}) on %[[COUNTERS]] site(%[[TASKI]], %[[T0I]]) : memref<?xi32>
// CHECK-LABEL: func.func @elsewhere(
// CHECK:         call @shared_tile(%{{[^,]*}}, %{{[^)]*}}) : (memref<?xf32>, index) -> ()
// CHECK-LABEL: func.func @shared_worker(
// CHECK-SAME:      %[[WCOUNTERS:[^:]*]]: memref<?xi32>)
// CHECK:         func.call @shared_tile_sited(%{{[^,]*}}, %{{[^,]*}}, %[[WCOUNTERS]], %{{[^,]*}}, %{{[^)]*}}) : (memref<?xf32>, index, memref<?xi32>, i32, i32) -> ()
func.func private @shared_tile(%x: memref<?xf32>, %i: index) attributes {event.tile} {
  %since = arith.constant 0 : i64
  %start, %give_up = event.stall "full" barrier(%i) stage(%i) parity(%i) since(%since)
  return
}
func.func @elsewhere(%x: memref<?xf32>, %i: index) {
  call @shared_tile(%x, %i) : (memref<?xf32>, index) -> ()
  return
}
event.graph @shared(%n: index, %x: memref<?xf32>) {
  event.task "stage" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1]) {
  ^bb0(%i: index):
    func.call @shared_tile(%x, %i) : (memref<?xf32>, index) -> ()
  }
}

// -----

// A body that is not one call is cloned into the worker, and its stalls get
// the counter buffer and site there.

// CHECK-LABEL: func.func @inline_worker(
// CHECK-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>)
// CHECK:         event.stall "empty" barrier(%{{.*}}) stage(%[[I:[^)]*]]) parity(%{{.*}}) since(%{{.*}}) on %[[COUNTERS]] site(%{{[^,]*}}, %[[I]]) : memref<?xi32>
event.graph @inline(%n: index, %x: memref<?xf32>) {
  event.task "stage" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1]) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %since = arith.constant 0 : i64
    %start, %give_up = event.stall "empty" barrier(%c0) stage(%i) parity(%c0) since(%since)
    %v = arith.constant 1.0 : f32
    memref.store %v, %x[%i] : memref<?xf32>
  }
}
