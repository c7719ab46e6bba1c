// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-dynamic-schedule=workers=2 -verify-diagnostics | FileCheck %s --enable-var-scope
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-dynamic-schedule="workers=2 force-index=true" -verify-diagnostics | FileCheck %s --check-prefix=INDEX
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-dynamic-schedule="workers=2 auto=true" -verify-diagnostics | FileCheck %s --check-prefix=AUTO
// RUN: etc-opt %s -allow-unregistered-dialect -split-input-file -event-dynamic-schedule="workers=2 trace=true" -verify-diagnostics | FileCheck %s --check-prefix=TRACE

// Two tasks joined by one counted event per row: T = 2n + n tiles. The
// counter buffer holds the event (n counters), then the queue (3 header
// words, T slots) at n, the T pending counts at n + 3 + T, and the first
// global tile of each task (2 tasks + 1) after them, and the 22-word run
// header last (g_init resets it first). g_init fills the tile
// offsets, then sets the pending counts, pushing the tiles that wait on
// nothing. A worker pops a tile id, finds its task by binary search over the
// tile offsets, and runs it in its family's case; the last notifier of an
// element walks the element's waiters from the constant waiter tables
// (event number -> (task, closed-form kind)) and readies the tiles of the
// box: tile i of "use" for row i.

// CHECK-LABEL: memref.global "private" constant @pipe_waiter_offsets : memref<2xi32> = dense<[0, 1]>
// CHECK:       memref.global "private" constant @pipe_waiter_tasks : memref<1xi32> = dense<1>
// CHECK:       memref.global "private" constant @pipe_waiter_kinds : memref<1xi32> = dense<0>

// CHECK-LABEL: func.func @pipe_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>) -> index
// CHECK-SAME:      attributes {event.graph = "pipe", event.schedule = "dynamic", event.workers = 2 : i64}
// CHECK:         %[[FILL:.*]] = arith.muli %[[N]], %{{.*}} : index
// CHECK:         %[[T:.*]] = arith.addi %[[FILL]], %[[N]] : index
// CHECK:         %[[SLOTS:.*]] = arith.addi %[[T]], %{{.*}} : index
// CHECK:         %[[PENDING:.*]] = arith.addi %[[N]], %[[SLOTS]] : index
// CHECK:         %[[OFFSETS:.*]] = arith.addi %[[PENDING]], %[[T]] : index
// CHECK:         %[[END:.*]] = arith.addi %[[OFFSETS]], %{{.*}} : index
// CHECK:         %[[SIZE:.*]] = arith.addi %[[END]], %c22 : index
// CHECK:         return %[[SIZE]] : index

// CHECK-LABEL: func.func @pipe_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         %[[PENDING:.*]] = arith.addi %[[N]], %{{.*}} : index
// CHECK:         %[[OFFSETS:.*]] = arith.addi %[[PENDING]], %{{.*}} : index
// Expected counts, then an empty queue, then the tile offsets.
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[N]] step
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]] : memref<?xi32>
// CHECK:         scf.for %[[I:.*]] = %[[N]] to %[[PENDING]] step
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[I]]] : memref<?xi32>
// CHECK:         memref.store %{{.*}}, %[[COUNTERS]][%[[OFFSETS]]] : memref<?xi32>
// CHECK:         scf.for %[[K:.*]] =
// CHECK:           %[[TILES:.*]] = scf.index_switch
// CHECK:           %[[AT:.*]] = arith.addi %[[OFFSETS]], %[[K]] : index
// CHECK:           %[[FIRST32:.*]] = memref.load %[[COUNTERS]][%[[AT]]] : memref<?xi32>
// CHECK:           %[[FIRST:.*]] = arith.index_cast %[[FIRST32]] : i32 to index
// CHECK:           %[[NEXT:.*]] = arith.addi %[[FIRST]], %[[TILES]] : index
// CHECK:           %[[NEXT32:.*]] = arith.index_cast %[[NEXT]] : index to i32
// CHECK:           memref.store %[[NEXT32]], %[[COUNTERS]]
// Pending counts: every "fill" tile is ready, a "use" tile waits on its row.
// One loop over the global tile ids, each finding its task (a binary search
// over the tile offsets); its iterations are independent, and each pushes
// its own tile.
// CHECK:         scf.for %[[ID:.*]] = %{{.*}} to %[[T:.*]] step %{{.*}} {
// CHECK:           scf.while
// CHECK:           %[[AT:.*]] = arith.addi %[[OFFSETS]], %[[K:.*]]#0 : index
// CHECK:           %[[FIRST32:.*]] = memref.load %[[COUNTERS]][%[[AT]]] : memref<?xi32>
// CHECK:           %[[FIRST:.*]] = arith.index_cast %[[FIRST32]] : i32 to index
// CHECK:           %[[LOCAL:.*]] = arith.subi %[[ID]], %[[FIRST]] : index
// CHECK:           case 0 {
// CHECK:             %[[PAT:.*]] = arith.addi %[[PENDING]], %[[ID]] : index
// CHECK:             memref.store %{{.*}}, %[[COUNTERS]][%[[PAT]]] : memref<?xi32>
// CHECK:             scf.if
// CHECK-NEXT:          event.queue_push %[[ID]], %[[COUNTERS]][%[[N]]] capacity(%{{.*}}) per_lane : memref<?xi32>
// CHECK:           default {
// CHECK:             %[[COUNT:.*]] = memref.load %[[COUNTERS]][%{{.*}}] : memref<?xi32>
// CHECK:             %[[WAITING:.*]] = arith.cmpi sgt, %[[COUNT]], %{{.*}} : i32
// CHECK:             %[[ONE:.*]] = arith.select %[[WAITING]]
// CHECK:             %[[COUNTS:.*]] = arith.addi %{{.*}}, %[[ONE]] : i32
// CHECK:             %[[PAT:.*]] = arith.addi %[[PENDING]], %[[ID]] : index
// CHECK:             memref.store %[[COUNTS]], %[[COUNTERS]][%[[PAT]]] : memref<?xi32>
// CHECK:             %[[READY:.*]] = arith.cmpi eq, %[[COUNTS]], %{{.*}} : i32
// CHECK:             scf.if %[[READY]] {
// CHECK-NEXT:          event.queue_push %[[ID]], %[[COUNTERS]][%[[N]]] capacity(%{{.*}}) per_lane : memref<?xi32>
// CHECK:         } {event.independent}

// CHECK-LABEL: func.func @pipe_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK-SAME:      attributes {event.events = [{name = "e0", notified_by = ["fill"], waited_by = ["use"]}], event.graph = "pipe", event.schedule = "dynamic",
// CHECK-SAME:      event.tasks = [{grid_rank = 2 : i64, name = "fill"}, {grid_rank = 1 : i64, name = "use"}], event.workers = 2 : i64}
// CHECK-DAG:     %[[X:.*]] = event.buffer %[[TABLE]][%c0{{(_[0-9]+)?}}] : memref<?xi64> -> memref<?x8xf32>
// CHECK-DAG:     %[[WAITER_TASKS:.*]] = memref.get_global @pipe_waiter_tasks : memref<1xi32>
// CHECK-DAG:     %[[WAITER_OFFSETS:.*]] = memref.get_global @pipe_waiter_offsets : memref<2xi32>
// CHECK:         %[[PENDING:.*]] = event.view %[[COUNTERS]][%{{.*}}](%[[T2:.*]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:         %[[OFFSETS:.*]] = arith.addi %{{.*}}, %[[T2]] : index
// CHECK:         scf.while : () -> index {
// CHECK-NEXT:      %[[POPPED:.*]] = event.queue_pop %[[COUNTERS]][%[[N]]] capacity(%[[T2]]) : memref<?xi32>
// CHECK-NEXT:      %[[MORE:.*]] = arith.cmpi ult, %[[POPPED]], %[[T2]] : index
// CHECK-NEXT:      scf.condition(%[[MORE]]) %[[POPPED]] : index
// CHECK-NEXT:    } do {
// CHECK-NEXT:    ^bb0(%[[ID:.*]]: index):
// The last task k with offsets[k] <= id.
// CHECK:           %[[SEARCH:.*]]:2 = scf.while (%[[LO:.*]] = %{{.*}}, %[[HI:.*]] = %{{.*}}) : (index, index) -> (index, index) {
// CHECK:             %[[MID:.*]] = arith.divui
// CHECK:             %[[MIDAT:.*]] = arith.addi %[[OFFSETS]], %[[MID]] : index
// CHECK:             %[[START32:.*]] = memref.load %[[COUNTERS]][%[[MIDAT]]] : memref<?xi32>
// CHECK:             %[[START:.*]] = arith.index_cast %[[START32]] : i32 to index
// CHECK:             %[[ATORAFTER:.*]] = arith.cmpi ule, %[[START]], %[[ID]] : index
// CHECK:             arith.select %[[ATORAFTER]], %[[MID]], %[[LO]] : index
// CHECK:             arith.select %[[ATORAFTER]], %[[HI]], %[[MID]] : index
// CHECK:           %[[TASKAT:.*]] = arith.addi %[[OFFSETS]], %[[SEARCH]]#0 : index
// CHECK:           %[[FIRST32:.*]] = memref.load %[[COUNTERS]][%[[TASKAT]]] : memref<?xi32>
// CHECK:           %[[FIRST:.*]] = arith.index_cast %[[FIRST32]] : i32 to index
// CHECK:           %[[LOCAL:.*]] = arith.subi %[[ID]], %[[FIRST]] : index
// The tile body in its family's case. A popped tile is ready: no wait.
// CHECK:           scf.index_switch
// CHECK:           case 0 {
// CHECK:             %[[I:.*]] = arith.divui %[[LOCAL]], %{{.*}} : index
// CHECK:             memref.store %{{.*}}, %[[X]][%[[I]], %{{.*}}]
// A family with notifies publishes its writes once, with one release.
// CHECK-NEXT:        event.release
// CHECK-NOT:         event.notify
// CHECK:           default {
// CHECK-NOT:         event.wait
// CHECK:             memref.load %[[X]][%[[LOCAL]], %{{.*}}]
// CHECK-NOT:         event.notify
// CHECK:           }
// Then the notifies, one entry per iteration: the family's case notifies
// its entry and reports (ready, class, event number, first counter, element).
// CHECK:           scf.for %[[ENTRY:.*]] = %{{.*}} to %{{.*}} step
// CHECK:             %[[R:.*]]:5 = scf.index_switch %{{.*}} -> i1, index, index, index, index
// CHECK:             case 0 {
// CHECK:               scf.index_switch %[[ENTRY]] -> i1, index, index, index, index
// CHECK:               case 0 {
// CHECK:                 %[[I:.*]] = arith.divui %[[LOCAL]], %{{.*}} : index
// CHECK:                 %[[NUMBER32:.*]] = memref.load %{{.*}}[%{{.*}}] : memref<2xi32>
// CHECK:                 %[[NUMBER:.*]] = arith.index_cast %[[NUMBER32]] : i32 to index
// CHECK:                 %[[E:.*]] = event.view %[[COUNTERS]][%[[BASE:.*]]](%[[N]]) : memref<?xi32> -> !event.tensor<?>
// CHECK:                 %[[ZERO:.*]] = event.notify_ready %[[E]][%[[I]]] released : !event.tensor<?>
// CHECK:                 scf.yield %[[ZERO]], %{{.*}}, %[[NUMBER]], %[[BASE]], %[[I]] : i1, index, index, index, index
// The waiters of a ready element, readied once per event class.
// CHECK:             scf.if %[[R]]#0 {
// CHECK-NEXT:          scf.index_switch %[[R]]#1
// CHECK-NEXT:          case 0 {
// CHECK:                 %[[BEGIN32:.*]] = memref.load %[[WAITER_OFFSETS]][%[[R]]#2] : memref<2xi32>
// CHECK:                 scf.for %[[WAITER:.*]] =
// CHECK:                   %[[WTASK32:.*]] = memref.load %[[WAITER_TASKS]][%[[WAITER]]] : memref<1xi32>
// CHECK:                   %[[WTASK:.*]] = arith.index_cast %[[WTASK32]] : i32 to index
// CHECK:                   %[[WAT:.*]] = arith.addi %[[OFFSETS]], %[[WTASK]] : index
// CHECK:                   %[[WFIRST32:.*]] = memref.load %[[COUNTERS]][%[[WAT]]] : memref<?xi32>
// CHECK:                   %[[WFIRST:.*]] = arith.index_cast %[[WFIRST32]] : i32 to index
// CHECK:                   scf.index_switch
// CHECK:                   case 0 {
// The box of waiting tiles is spread over the lanes: lane l takes its
// tiles l, l + lanes, ..., each lane decrementing and pushing on its own.
// CHECK:                     %[[LO:.*]] = arith.minui %[[R]]#4, %[[N]] : index
// CHECK:                     %[[NEXT:.*]] = arith.addi %[[R]]#4, %{{.*}} : index
// CHECK:                     %[[HI:.*]] = arith.minui %[[NEXT]], %[[N]] : index
// CHECK:                     %[[SIZE:.*]] = arith.subi %[[HI]], %[[LO]] : index
// CHECK:                     %[[LANE:.*]] = event.lane_id
// CHECK:                     %[[LANES:.*]] = event.lane_count
// CHECK:                     scf.for %[[P:.*]] = %[[LANE]] to %[[SIZE]] step %[[LANES]]
// CHECK-NEXT:                  %[[W:.*]] = arith.addi %[[LO]], %[[P]] : index
// CHECK-NEXT:                  %[[WID:.*]] = arith.addi %[[WFIRST]], %[[W]] : index
// CHECK-NEXT:                  %[[LAST:.*]] = event.notify_ready %[[PENDING]][%[[WID]]] per_lane : !event.tensor<?>
// CHECK-NEXT:                  scf.if %[[LAST]] {
// CHECK-NEXT:                    event.queue_push %[[WID]], %[[COUNTERS]][%[[N]]] capacity(%[[T2]]) per_lane : memref<?xi32>

// 1 when a push overflowed, else 2 when an event or pending count is not
// zero, else 0.
// CHECK-LABEL: func.func @pipe_check(
// CHECK-SAME:      %[[N:[^:]*]]: index, {{.*}}, %[[COUNTERS:[^:]*]]: memref<?xi32>) -> i32
// CHECK:         %[[ERROR:.*]] = memref.load %[[COUNTERS]][%{{.*}}] : memref<?xi32>
// CHECK:         %[[OVERFLOW:.*]] = arith.cmpi ne, %[[ERROR]], %{{.*}} : i32
// CHECK:         %[[EVENTS_LEFT:.*]] = scf.for %{{.*}} = %{{.*}} to %[[N]]
// CHECK:         %[[PENDING_END:.*]] = arith.addi %[[PENDING_AT:.*]], %[[T:.*]] : index
// CHECK:         %[[PENDING_LEFT:.*]] = scf.for %{{.*}} = %[[PENDING_AT]] to %[[PENDING_END]]
// CHECK:         %[[LEFT:.*]] = arith.ori %[[EVENTS_LEFT]], %[[PENDING_LEFT]] : i1
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : i32
// CHECK-DAG:     %[[C1:.*]] = arith.constant 1 : i32
// CHECK-DAG:     %[[C2:.*]] = arith.constant 2 : i32
// CHECK:         %[[BALANCE:.*]] = arith.select %[[LEFT]], %[[C2]], %[[C0]] : i32
// CHECK:         %[[STATUS:.*]] = arith.select %[[OVERFLOW]], %[[C1]], %[[BALANCE]] : i32
// CHECK:         return %[[STATUS]] : i32
// CHECK-NOT:     event.graph @

// With force-index the waiters come from the inverse index instead: no
// closed-form waiters, an index over every event counter.
// INDEX-LABEL: memref.global "private" constant @pipe_waiter_offsets : memref<2xi32> = dense<0>
// INDEX-LABEL: func.func @pipe_worker(
// INDEX:         event.notify_ready
// INDEX-NOT:     arith.minui
// INDEX:         scf.for
// INDEX:           event.notify_ready
// INDEX:           event.queue_push

// With trace=true the trace records follow the scheduler's state (before
// the run header); a popped tile has no waits, so it writes its record's
// start before the body and its end before the notifies (the per-entry
// notify loop that follows the body switch), naming the task the binary
// search found.
// TRACE-LABEL: func.func @pipe_worker(
// TRACE-SAME:      %[[COUNTERS:[^:]*]]: memref<?xi32>)
// TRACE-SAME:      event.trace
// TRACE:         event.queue_pop
// TRACE:         %[[FOUND:.*]]:2 = scf.while
// TRACE:         case 0 {
// TRACE:           event.trace_begin %[[COUNTERS]][%[[RECORD:.*]]] task(%[[FOUND]]#0) tile(%{{.*}}, %{{.*}}) : memref<?xi32>
// TRACE:           memref.store
// TRACE-NEXT:      event.trace_end %[[COUNTERS]][%[[RECORD]]] : memref<?xi32>
// TRACE:         default {
// TRACE:           event.trace_begin %[[COUNTERS]][%{{.*}}] task(%[[FOUND]]#0) tile(%{{.*}}) : memref<?xi32>
// TRACE:         event.notify_ready

// The graph is regular, so auto schedules it statically.
// AUTO-LABEL: func.func @pipe_worker(
// AUTO-SAME:      event.schedule = "static"
// AUTO:         event.wait
// AUTO-NOT:     event.queue_pop
event.graph @pipe(%n: index, %x: memref<?x8xf32>, %h: memref<?x8xf32> {event.intermediate}) {
  %c2 = arith.constant 2 : index
  %e = event.alloc(%n) count(%c2) : !event.tensor<?>
  event.task "fill" grid(%n, %c2)
      writes(%x : memref<?x8xf32> (d0, d1) -> (d0, d1 * 4) [1, 4])
      notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
  ^bb0(%i: index, %j: index):
    %one = arith.constant 1.0 : f32
    memref.store %one, %x[%i, %j] : memref<?x8xf32>
  }
  event.task "use" grid(%n)
      reads(%x : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      writes(%h : memref<?x8xf32> (d0) -> (d0, 0) [1, ?])
      waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %v = memref.load %x[%i, %c0] : memref<?x8xf32>
    memref.store %v, %h[%i, %c0] : memref<?x8xf32>
  }
}

// -----
// Closed-form waiters of a 2-D element (r, c): tiles (i, j) of "c" with
// i floordiv 2 == r (the box [2r, 2r + 2), clamped to the grid), j any of
// the 4 (absent from the map), and only when c is the constant 1.

// CHECK-LABEL: func.func @box_worker(
// CHECK-SAME:      %[[N:[^:]*]]: index
// CHECK:         %[[READY:.*]] = event.notify_ready %{{.*}}[%{{.*}}, %{{.*}}] released : !event.tensor<?x2>
// The element (r, c), from its row-major position in the event.
// CHECK:         scf.if %[[RES:.*]]#0 {
// CHECK:           %[[C:.*]] = arith.remui %[[RES]]#4, %{{.*}} : index
// CHECK:           %[[R:.*]] = arith.divui %[[RES]]#4, %{{.*}} : index
// CHECK:           scf.for
// CHECK:             case 0 {
// CHECK:               %[[FIRST:.*]] = arith.muli %[[R]], %[[TWO:.*]] : index
// CHECK:               %[[LO:.*]] = arith.minui %[[FIRST]], %[[N]] : index
// CHECK:               %[[PAST:.*]] = arith.addi %[[FIRST]], %[[TWO]] : index
// CHECK:               %[[HI:.*]] = arith.minui %[[PAST]], %[[N]] : index
// CHECK:               %[[IS_ONE:.*]] = arith.cmpi eq, %[[C]], %{{.*}} : index
// CHECK:               scf.if %[[IS_ONE]] {
// The box (HI - LO) x 4, row-major, spread over the lanes.
// CHECK:                 %[[ROWS:.*]] = arith.subi %[[HI]], %[[LO]] : index
// CHECK:                 %[[COUNT:.*]] = arith.muli %[[ROWS]], %{{.*}} : index
// CHECK:                 %[[LANE:.*]] = event.lane_id
// CHECK:                 %[[LANES:.*]] = event.lane_count
// CHECK:                 scf.for %[[P:.*]] = %[[LANE]] to %[[COUNT]] step %[[LANES]] {
// CHECK:                   %[[J:.*]] = arith.remui %[[P]], %{{.*}} : index
// CHECK:                   %[[ROW:.*]] = arith.divui %[[P]], %{{.*}} : index
// CHECK:                   %[[I:.*]] = arith.addi %[[LO]], %[[ROW]] : index
// CHECK:                   event.notify_ready %{{.*}} per_lane
// CHECK:                   event.queue_push %{{.*}} per_lane
event.graph @box(%n: index) {
  %c4 = arith.constant 4 : index
  %c2 = arith.constant 2 : index
  %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 2)>()[%n]
  %e = event.alloc(%rows) count(%c4) : !event.tensor<?x2>
  event.task "p" grid(%rows, %c2, %c4)
      notifies(%e : !event.tensor<?x2> (d0, d1, d2) -> (d0, d1)) {
  ^bb0(%i: index, %j: index, %k: index):
    "test.produce"(%i, %j, %k) : (index, index, index) -> ()
  }
  event.task "c" grid(%n, %c4)
      waits(%e : !event.tensor<?x2> (d0, d1) -> (d0 floordiv 2, 1)) {
  ^bb0(%i: index, %j: index):
    "test.consume"(%i, %j) : (index, index) -> ()
  }
}

// -----
// Data-dependent routing: "tokens" notifies the expert its route names
// (counted in g_init); "experts" waits affinely (closed form); "combine"
// waits through the route, so g_init builds the inverse index (counting
// sort of the combine tiles by the counter they wait on) and the last
// notifier of an expert walks its CSR row.

// CHECK-LABEL: func.func @routed_counters(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[EXPERTS:[^:]*]]: index
// CHECK:         %[[T:.*]] = arith.addi %{{.*}}, %[[N]] : index
// CHECK:         %[[PENDING:.*]] = arith.addi %[[EXPERTS]], %{{.*}} : index
// CHECK:         %[[OFFSETS:.*]] = arith.addi %[[PENDING]], %[[T]] : index
// CHECK:         %[[INVERSE:.*]] = arith.addi %[[OFFSETS]], %{{.*}} : index
// CHECK:         %[[ROWS:.*]] = arith.addi %[[EXPERTS]], %{{.*}} : index
// CHECK:         %[[ENTRIES:.*]] = arith.addi %[[INVERSE]], %[[ROWS]] : index
// CHECK:         %[[END:.*]] = arith.addi %[[ENTRIES]], %[[N]] : index
// CHECK:         %[[SIZE:.*]] = arith.addi %[[END]], %c22 : index
// CHECK:         return %[[SIZE]] : index

// CHECK-LABEL: func.func @routed_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[EXPERTS:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// Expected counts of %done, counted from the routes.
// CHECK:         scf.for %[[TOKEN:.*]] = %{{.*}} to %[[N]] step
// CHECK:           %[[ROUTE:.*]] = event.buffer %[[TABLE]][%{{.*}}] : memref<?xi64> -> memref<?xi32>
// CHECK:           %[[TO:.*]] = memref.load %[[ROUTE]][%[[TOKEN]]] : memref<?xi32>
// CHECK:           %[[EXPERT:.*]] = arith.index_cast %[[TO]] : i32 to index
// CHECK:           memref.load %[[COUNTERS]][%{{.*}}]
// CHECK:           arith.addi
// CHECK:           memref.store
// Counting sort: count per element into offsets[e + 1] ...
// CHECK:         scf.for %[[TOKEN:.*]] = %{{.*}} to %[[N]] step
// CHECK:           memref.load %{{.*}}[%[[TOKEN]]] : memref<?xi32>
// CHECK:           memref.store
// ... prefix sum ...
// CHECK:         scf.for %[[E:.*]] = %{{.*}} to %{{.*}} step
// CHECK:           %[[PREVIOUS:.*]] = memref.load
// CHECK:           %[[CURRENT:.*]] = memref.load
// CHECK:           arith.addi
// CHECK:           memref.store
// ... fill with the combine tile ids ...
// CHECK:         scf.for %[[TOKEN:.*]] = %{{.*}} to %[[N]] step
// CHECK:           %[[ID:.*]] = arith.addi %{{.*}}, %[[TOKEN]] : index
// CHECK:           memref.load %{{.*}}[%[[TOKEN]]] : memref<?xi32>
// CHECK:           %[[ID32:.*]] = arith.index_cast %[[ID]] : index to i32
// CHECK:           memref.store %[[ID32]], %[[COUNTERS]]
// ... and shift the offsets back.
// CHECK:         scf.for
// CHECK:         memref.store %{{.*}}, %[[COUNTERS]][%{{.*}}] : memref<?xi32>
// Pending counts: every tokens tile is ready, then experts and combine.
// CHECK:         scf.for
// CHECK:           case 0 {
// CHECK:             event.queue_push
// CHECK:           case 1 {
// CHECK:             event.queue_push
// CHECK:           default {
// CHECK:             memref.load %{{.*}} : memref<?xi32>
// CHECK:             event.queue_push

// CHECK-LABEL: func.func @routed_worker(
// CHECK:           case 0 {
// CHECK:             "test.token"(%[[TOKEN:.*]]) : (index) -> ()
// CHECK:             %[[TO:.*]] = memref.load %{{.*}}[%[[TOKEN]]] : memref<?xi32>
// CHECK:             %[[EXPERT:.*]] = arith.index_cast %[[TO]] : i32 to index
// CHECK:             %[[LAST:.*]] = event.notify_ready %{{.*}}[%[[EXPERT]]] released : !event.tensor<?>
// CHECK:             scf.yield %[[LAST]], %{{.*}}, %{{.*}}, %{{.*}}, %[[EXPERT]] : i1, index, index, index, index
// CHECK:           scf.if %[[RES:.*]]#0 {
// The "experts" waiter in closed form ...
// CHECK:               scf.for
// CHECK:                 scf.for
// CHECK:                   event.notify_ready
// CHECK:                   event.queue_push
// ... the "combine" waiters from the CSR row of the expert's counter.
// CHECK:               %[[ELEMENT:.*]] = arith.addi %{{.*}}, %[[RES]]#4 : index
// CHECK:               %[[ROW:.*]] = arith.addi %{{.*}}, %[[ELEMENT]] : index
// CHECK:               %[[BEGIN32:.*]] = memref.load %{{.*}}[%[[ROW]]] : memref<?xi32>
// CHECK:               %[[BEGIN:.*]] = arith.index_cast %[[BEGIN32]] : i32 to index
// CHECK:               %[[NEXT:.*]] = arith.addi %[[ROW]], %{{.*}} : index
// CHECK:               %[[END32:.*]] = memref.load %{{.*}}[%[[NEXT]]] : memref<?xi32>
// CHECK:               %[[END:.*]] = arith.index_cast %[[END32]] : i32 to index
// CHECK:               %[[LANE:.*]] = event.lane_id
// CHECK:               %[[LANES:.*]] = event.lane_count
// CHECK:               %[[FROM:.*]] = arith.addi %[[BEGIN]], %[[LANE]] : index
// CHECK:               scf.for %[[ENTRY:.*]] = %[[FROM]] to %[[END]] step %[[LANES]]
// CHECK:                 %[[WAITER32:.*]] = memref.load
// CHECK:                 %[[WAITER:.*]] = arith.index_cast %[[WAITER32]] : i32 to index
// CHECK:                 %[[GO:.*]] = event.notify_ready %{{.*}}[%[[WAITER]]] per_lane : !event.tensor<?>
// CHECK:                 scf.if %[[GO]] {
// CHECK-NEXT:              event.queue_push %[[WAITER]], %{{.*}} per_lane

// Data-dependent, so auto schedules it dynamically.
// AUTO-LABEL: func.func @routed_worker(
// AUTO-SAME:      event.schedule = "dynamic"
// AUTO:         event.queue_pop
event.graph @routed(%n: index, %experts: index, %route: memref<?xi32>) {
  %done = event.alloc(%experts) : !event.tensor<?>
  event.task "tokens" grid(%n)
      notifies(%done : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
    "test.token"(%t) : (index) -> ()
  }
  event.task "experts" grid(%experts)
      waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%x: index):
    "test.expert"(%x) : (index) -> ()
  }
  event.task "combine" grid(%n)
      waits(%done : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
    "test.combine"(%t) : (index) -> ()
  }
}

// -----
// The route is written by a task of the graph, so g_init cannot read it: the
// indirect wait of "combine" is taken over every expert (conservative, still
// deadlock-free: it adds no task-level edge). Its pending count is the
// number of not yet ready experts plus the router event, and every last
// notifier of an expert readies all combine tiles.

// CHECK-LABEL: func.func @routed_at_run_time_init(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[TABLE:[^:]*]]: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:           default {
// CHECK-NOT:           event.buffer
// CHECK:               %[[ANY:.*]] = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (i32) {
// CHECK-NOT:             event.buffer
// CHECK:                 arith.cmpi sgt
// CHECK:                 scf.yield %{{.*}} : i32
// CHECK:               arith.addi %{{.*}}, %[[ANY]] : i32
// CHECK:               event.queue_push
// CHECK:         } {event.independent}
// CHECK-LABEL: func.func @routed_at_run_time_worker(
// CHECK:             "test.expert"(%[[EXPERT:[^,]*]], %{{.*}})
// CHECK:             %[[LAST:.*]] = event.notify_ready %{{.*}}[%{{.*}}] released : !event.tensor<4>
// CHECK:           scf.if %{{.*}}#0 {
// CHECK:               scf.for
// CHECK:                 case {{[0-9]+}} {
// CHECK:                   scf.for %{{.*}} = %{{.*}} to %{{.*}} step
// CHECK:                     event.notify_ready
// CHECK:                     event.queue_push
event.graph @routed_at_run_time(%n: index, %route: memref<?xi32>) {
  %c4 = arith.constant 4 : index
  %routed = event.alloc() count(%n) : !event.tensor<>
  %done = event.alloc() count(%n) : !event.tensor<4>
  event.task "router" grid(%n)
      writes(%route : memref<?xi32> (d0) -> (d0) [1])
      notifies(%routed : !event.tensor<> (d0) -> ()) {
  ^bb0(%t: index):
    "test.route"(%t) : (index) -> ()
  }
  event.task "experts" grid(%c4, %n)
      waits(%routed : !event.tensor<> (d0, d1) -> ())
      notifies(%done : !event.tensor<4> (d0, d1) -> (d0)) {
  ^bb0(%x: index, %s: index):
    "test.expert"(%x, %s) : (index, index) -> ()
  }
  event.task "combine" grid(%n)
      waits(%routed : !event.tensor<> (d0) -> (),
            %done : !event.tensor<4> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
    "test.combine"(%t) : (index) -> ()
  }
}

// -----

// A queue runs tasks as they become ready, so the consumer may come first
// in the text (the static schedule rejects this order, so auto does not
// pick it).

// CHECK-LABEL: func.func @reversed_worker(
// CHECK:         event.queue_pop
// CHECK:           "test.consume"
// CHECK:           "test.produce"
// CHECK:           event.notify_ready
// AUTO-LABEL: func.func @reversed_worker(
// AUTO-SAME:      event.schedule = "dynamic"
event.graph @reversed(%n: index) {
  %c1 = arith.constant 1 : index
  %e = event.alloc(%n) count(%c1) : !event.tensor<?>
  event.task "consume" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    "test.consume"(%i) : (index) -> ()
  }
  event.task "produce" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    "test.produce"(%i) : (index) -> ()
  }
}

// -----

// The balance proof still applies.
event.graph @unbalanced(%n: index) {
  %c3 = arith.constant 3 : index
  // expected-error @+1 {{'count' cannot be proved equal to the number of notifies each element receives from task 'p'}}
  %e = event.alloc(%n) count(%c3) : !event.tensor<?>
  event.task "p" grid(%n) notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    "test.produce"(%i) : (index) -> ()
  }
  event.task "c" grid(%n) waits(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    "test.consume"(%i) : (index) -> ()
  }
}

// -----

// Counting the notifies of an event without `count` happens in g_init,
// before the router has written the routes: rejected (for both schedules).
event.graph @counted_too_early(%n: index, %experts: index, %route: memref<?xi32>) {
  // expected-error @+1 {{'event.alloc' op has no 'count', so its expected counts are counted before any task runs, but notify #0 of task 'tokens' loads its coordinates from index buffer #0, which task 'router' writes during the run}}
  %done = event.alloc(%experts) : !event.tensor<?>
  event.task "router" grid(%n) writes(%route : memref<?xi32> (d0) -> (d0) [1]) {
  ^bb0(%t: index):
  }
  event.task "tokens" grid(%n)
      notifies(%done : !event.tensor<?> (d0) -> (d0) indirect [0])
      indices(%route : memref<?xi32>) {
  ^bb0(%t: index):
  }
  event.task "experts" grid(%experts) waits(%done : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%x: index):
  }
}

// -----

// expected-error @+1 {{symbol 'taken_check' is taken; event-dynamic-schedule needs it for graph @taken}}
func.func @taken_check() {
  return
}
event.graph @taken(%n: index) {
}

// -----

// Live bounds: chunk tile (i, j) runs while j < ceildiv(len[i], 4), combine
// tile i while on[i] > 0. Tile ids and the queue keep the closed-form grid
// total T = 9 r; g_init counts the live tiles into the word after the tile
// offsets, publishes the end marker T + 1 in the queue slots [live, T) that
// no push will fill (a pop there returns T and ends the worker), and gives
// pending counts and pushes only to live tiles. A notifier readies a waiting
// tile only if it is live; g_check also requires exactly `live` pushes.

// CHECK-LABEL: func.func @live_counters(
// CHECK-SAME:      %[[R:[^:]*]]: index
// CHECK:         %[[GRID:.*]] = arith.muli %[[R]], %{{.*}} : index
// CHECK:         %[[T:.*]] = arith.addi %[[GRID]], %[[R]] : index
// CHECK:         %[[OFFSETS:.*]] = arith.addi %{{.*}}, %[[T]] : index
// CHECK:         %[[LIVE:.*]] = arith.addi %[[OFFSETS]], %{{.*}} : index
// CHECK:         %[[END:.*]] = arith.addi %[[LIVE]], %{{.*}} : index
// CHECK:         %[[WITH_HEADER:.*]] = arith.addi %[[END]], %{{.*}} : index
// CHECK:         return %[[WITH_HEADER]] : index

// CHECK-LABEL: func.func @live_init(
// CHECK-SAME:      %[[R:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// CHECK:         %[[T:.*]] = arith.addi %{{.*}}, %[[R]] : index
// CHECK:         %[[PENDING:.*]] = arith.addi %[[R]], %{{.*}} : index
// CHECK:         %[[OFFSETS:.*]] = arith.addi %[[PENDING]], %[[T]] : index
// CHECK:         %[[LIVEWORD:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// Dead tiles' pending counts are zero.
// CHECK:         scf.for %[[P:.*]] = %[[PENDING]] to %[[OFFSETS]] step
// CHECK-NEXT:      memref.store %{{.*}}, %[[COUNTERS]][%[[P]]]
// The live tiles are counted into their word.
// CHECK:         memref.store %{{.*}}, %[[COUNTERS]][%[[LIVEWORD]]] : memref<?xi32>
// CHECK:         scf.index_switch
// CHECK:         case 0 {
// CHECK:           %[[ALIVE:.*]] = arith.cmpi slt
// CHECK:           scf.if %[[ALIVE]] {
// CHECK:             memref.load %[[COUNTERS]][%[[LIVEWORD]]]
// CHECK:             memref.store %{{.*}}, %[[COUNTERS]][%[[LIVEWORD]]]
// CHECK:         default {
// CHECK:           memref.load %[[COUNTERS]][%[[LIVEWORD]]]
// CHECK:           memref.store %{{.*}}, %[[COUNTERS]][%[[LIVEWORD]]]
// CHECK:         %[[COUNT32:.*]] = memref.load %[[COUNTERS]][%[[LIVEWORD]]] : memref<?xi32>
// CHECK:         %[[COUNT:.*]] = arith.index_cast %[[COUNT32]] : i32 to index
// CHECK:         %[[SLOTS:.*]] = arith.addi %[[R]], %{{.*}} : index
// CHECK:         %[[TP1:.*]] = arith.addi %[[T]], %{{.*}} : index
// CHECK:         %[[MARKER:.*]] = arith.index_cast %[[TP1]] : index to i32
// CHECK:         %[[LAST:.*]] = arith.addi %[[SLOTS]], %[[T]] : index
// CHECK:         %[[FIRST:.*]] = arith.addi %[[SLOTS]], %[[COUNT]] : index
// CHECK:         scf.for %[[S:.*]] = %[[FIRST]] to %[[LAST]] step
// CHECK-NEXT:      memref.store %[[MARKER]], %[[COUNTERS]][%[[S]]] : memref<?xi32>
// Pending counts and pushes, live tiles only.
// CHECK:         case 0 {
// CHECK:           %[[ALIVE:.*]] = arith.cmpi slt
// CHECK:           scf.if %[[ALIVE]] {
// CHECK:             event.queue_push %{{.*}}, %[[COUNTERS]][%[[R]]] capacity(%[[T]])

// CHECK-LABEL: func.func @live_worker(
// CHECK:         event.queue_pop
// CHECK:         "test.chunk"
// CHECK:         event.notify_ready
// CHECK:         scf.if %{{.*}}#0 {
// CHECK:           scf.for
// CHECK:             scf.index_switch
// CHECK:             case 0 {
// CHECK:               scf.for %[[POSITION:.*]] = %{{.*}} to %{{.*}} step
// CHECK:                 %[[TILE:.*]] = arith.addi %{{.*}}, %[[POSITION]] : index
// CHECK:             %[[ALIVE:.*]] = arith.cmpi slt, %[[TILE]], %{{.*}} : index
// CHECK:             scf.if %[[ALIVE]] {
// CHECK:               event.notify_ready
// CHECK:               event.queue_push

// CHECK-LABEL: func.func @live_check(
// CHECK-SAME:      %[[R:[^:]*]]: index, %{{[^:]*}}: memref<?xi64>, %[[COUNTERS:.*]]: memref<?xi32>)
// The events-or-pending flag ORs two loop results (not loop-carried values).
// CHECK:         arith.ori %{{[0-9]+}}, %{{[0-9]+}} : i1
// CHECK-NEXT:    %[[ONE:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[TAILAT:.*]] = arith.addi %[[R]], %[[ONE]] : index
// CHECK-NEXT:    %[[TAIL:.*]] = memref.load %[[COUNTERS]][%[[TAILAT]]]
// CHECK-NEXT:    %[[LIVE:.*]] = memref.load %[[COUNTERS]][%{{.*}}]
// CHECK-NEXT:    %[[OTHER:.*]] = arith.cmpi ne, %[[TAIL]], %[[LIVE]] : i32
// CHECK-NEXT:    arith.ori %{{.*}}, %[[OTHER]] : i1
event.graph @live(%r: index, %len: memref<?xi32>, %on: memref<?xi32>) {
  %c8 = arith.constant 8 : index
  %done = event.alloc(%r) : !event.tensor<?>
  event.task "chunk" grid(%r, %c8)
      notifies(%done : !event.tensor<?> (d0, d1) -> (d0))
      indices(%len : memref<?xi32>)
      live(d1 below (d0) -> (d0 ceildiv 4) of (d0, d1) -> (d0) indirect [0]) {
  ^bb0(%i: index, %j: index):
    "test.chunk"(%i, %j) : (index, index) -> ()
  }
  event.task "combine" grid(%r) waits(%done : !event.tensor<?> (d0) -> (d0))
      indices(%on : memref<?xi32>)
      live(d0 below (d0) -> (d0 * 1000) of (d0) -> (d0) indirect [0]) {
  ^bb0(%i: index):
    "test.combine"(%i) : (index) -> ()
  }
}
