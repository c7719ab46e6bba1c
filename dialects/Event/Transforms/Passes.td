//===- Passes.td - Passes of the event dialect ------------*- tablegen -*-===//

#ifndef ETC_EVENT_TRANSFORMS_PASSES_TD
#define ETC_EVENT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def EventInferDependencies : Pass<"event-infer-dependencies", "::etc::event::GraphOp"> {
  let summary = "Derives event tensors and wait/notify maps from access footprints";
  let description = [{
    Turns an L1 task graph into an L2 event graph. Tasks are taken in textual
    order (program order). For every buffer, a reader waits on the last
    writer (read after write), a writer on the previous writer (write after
    write) and on the readers since then (write after read); an index buffer
    of `indices` counts as a whole-buffer read.

    For each such pair the producer's and the consumer's footprints are
    compared buffer dimension by buffer dimension, and a producer grid
    dimension `p` becomes an event dimension when its tiles
    (`d_p * T`, size <= T) contain each consumer tile:
    * the consumer tiles the same dimension with stride T: it waits with its
      own tile index (aligned);
    * the consumer's tile divides T (T = m * its stride): it waits with
      `d_c floordiv m`;
    * the consumer reads one fixed box inside one producer tile: it waits on
      that constant coordinate.
    The consumer's grid extent must provably stay inside the producer's
    (equal values, constants, or `affine.apply`s of the same symbols).
    Every other producer grid dimension is collapsed: whole-dimension or
    larger consumer boxes, misaligned or unanalysable offsets, and grid
    dimensions absent from the footprint (split reductions). A collapsed
    dimension is correct but coarser: each element's `count` is the product
    of the collapsed grid extents (an `arith.constant`, a grid value, an
    `affine.apply` or `arith.muli` when symbolic); with every dimension
    collapsed the event is a single counter expecting all producer tiles.

    The event has one dimension per kept grid dimension (static when the
    grid value is a constant, else `?` sized by the grid value) and is
    allocated right before the producer. Consumers that need the same
    (producer, notify map) share one event; of several events from one
    producer to one consumer, those subsumed by a coarser one are dropped.

    Waits and notifies already on the tasks are kept: the front end
    declares them for accesses no footprint describes (rows chosen by
    routing data). Inferred waits go before a task's first indirect wait,
    since an indirect coordinate is loaded right before its wait and the
    inferred waits order the index buffer's producer. An existing counted
    event notified by one task only, with the map and shape inference would
    build, is reused instead of duplicated, so the pass is idempotent.
    A producer with live bounds (`event.task ... live(...)`) writes only on
    its live tiles, so how many notifies an element receives is runtime
    data: the events built for it have no `count`, and the scheduled
    program counts the live notifiers before the run.
    A footprint whose last tile starts past the end of a
    static buffer dimension is an error naming the task and buffer.

    Before (L1):
    ```mlir
    event.task "scale" grid(%rows, %c2)
        writes(%h : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32]) {...}
    event.task "rowsum" grid(%rows)
        reads(%h : memref<?x64xf32> (d0) -> (d0 * 32, 0) [32, ?]) {...}
    ```
    After (L2): one counter per row block, expecting the 2 column tiles.
    ```mlir
    %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
    event.task "scale" grid(%rows, %c2) writes(...)
        notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {...}
    event.task "rowsum" grid(%rows) reads(...)
        waits(%e : !event.tensor<?> (d0) -> (d0)) {...}
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::affine::AffineDialect"];
}

def EventCheckSchedule : Pass<"event-check-schedule", "::etc::event::GraphOp"> {
  let summary = "Proves an event graph balanced, acyclic and deadlock-free";
  let description = [{
    Checks an L2 event graph before scheduling, leaving it unchanged, and
    fails with an error on the event's `event.alloc` naming the tasks when it
    cannot prove, for every value of the graph's symbolic dimensions:
    * every event a task waits on or notifies is an `event.alloc` of the
      graph (its counters need a place in the counter buffer);
    * acyclicity and co-residency safety: every task waits only on events
      notified by textually earlier tasks. Tiles run in one global order
      (task order, then row-major tile order), so the unfinished tile with
      the smallest global index can always run when all workers are
      resident;
    * balance, for events with `count`: each notify map is a projected
      permutation of the tile indices whose kept dimensions have the event's
      sizes, and `count` equals the sum over the notifying tasks of the
      product of their grid extents over the dropped tile indices;
    * range: each affine wait coordinate is a tile index `dN` whose grid
      extent is the event size, `dN floordiv M` with event size
      `extent ceildiv M`, or a constant inside a static size.
    * countability, for events without `count`: their expected counts are
      counted from the notify maps before any task runs, so no index buffer
      an indirect notify map reads may be written by a task of the graph;
    * live bounds: which tiles run is decided before any task runs, so no
      index buffer a live bound reads may be written by a task of the
      graph; and an event notified by a task with live bounds has no
      `count` (the number of its notifies is runtime data, counted on the
      device over the live tiles), while waits on it are proved as usual;
    Sizes and counts are compared symbolically: constants are folded, and
    `index` values computed with arith and `affine.apply` are normalised to
    polynomials and affine expressions of the graph's arguments. Events
    without `count` (indirect notify maps) are counted at run time and are
    exempt from balance, but some task must notify them.

    Accepted: the count 2 is the extent of the dropped tile index `d1`.
    ```mlir
    %rows = affine.apply affine_map<()[s0] -> (s0 ceildiv 32)>()[%B]
    %e = event.alloc(%rows) count(%c2) : !event.tensor<?>
    event.task "scale" grid(%rows, %c2) ...
        notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {...}
    event.task "add" grid(%rows) ... waits(%e : !event.tensor<?> (d0) -> (d0)) {...}
    ```
    Rejected: `count(%c3)` there ("'count' cannot be proved equal to the
    number of notifies each element receives from task 'scale'"), or "add"
    placed before "scale" ("... notified by task 'scale', which is not
    earlier in the static order").

    With `static-order=false` the textual-order rule is skipped: a dynamic
    schedule runs tasks when they become ready, which any acyclic graph
    allows (the graph verifier rejects cycles).
  }];
  let options = [
    Option<"staticOrder", "static-order", "bool", /*default=*/"true",
           "Require every task to wait only on events of textually earlier "
           "tasks (the static schedule's co-residency condition)">,
  ];
}

def EventStaticSchedule : Pass<"event-static-schedule", "::mlir::ModuleOp"> {
  let summary = "Schedules each event graph into a persistent worker program";
  let description = [{
    Replaces each `event.graph @g(args)` (L2) by a table-driven program (L3):
    constant tables and four public functions that take the graph's index
    arguments (its symbols), the buffer table (`memref<?xi64>`, see
    `event.buffer`) and, except the first, a `memref<?xi32>` buffer of event
    counters. The program's code grows with the number of distinct kinds of
    task, not with the number of tasks, so identical layers cost no code:
    * tasks that call the same tile function (a body that is one
      `func.call` of tile indices and graph values) with the same grid, the
      same live bounds and the same wait and notify maps on events of the
      same class form a
      *family*; a body that is not such a call makes a family of its own
      and is cloned. What differs between the tasks of a family is a
      *record* of i32 fields: the buffer-table offset of each buffer the
      call takes and of each index buffer, then the number within its class
      of the event of each wait and notify entry;
    * events with the same type, dynamic sizes and `count` form a *class*;
      the counters of a class's events lie one after another, row-major,
      the classes one after another from counter 0;
    * `@g_task_family`, `@g_task_record` and `@g_task_records` are private
      `memref.global` constants: each task's family, the first field of its
      record, the records.
    The functions:
    * `@g_counters(symbols, table) -> index`: how many counters the program
      needs;
    * `@g_init(symbols, table, counters)`: writes each counter's expected
      count, run once, single-threaded, before any worker starts: the
      class's `count`, or, without one, the number of notifies counted by
      evaluating every notifying tile's map (indirect coordinates loaded
      from the task's index buffer), only for the live tiles of a task with
      live bounds;
    * `@g_worker(symbols, table, counters)`: the persistent loop. All tile
      tasks are in one global order: task k's tiles are o_k + (row-major
      tile index), o_k the tile count of the tasks before it. Under
      `policy=round-robin` worker `w` of `W` (`event.worker_id` /
      `event.worker_count`, runtime values) runs the tiles t with
      t mod W == w in increasing t: a loop over the tasks carrying o_k, an
      `scf.index_switch` on the task's family, and in each case one
      `scf.for` from o_k + ((w - o_k) mod W) with step W, each iteration
      waiting on the tile's wait elements, running the tile, then notifying
      its notify elements. Under `policy=claim` the workers share one
      counter, the word right after the event counters (`@g_init` zeroes
      it): each worker claims the next global tile t with `event.claim`,
      and the loop over the tasks carries o_k and t, running tile t - o_k
      and claiming again (an `scf.while`) while t lies in task k. Tiles are
      claimed in increasing order, so the order argument against deadlock
      holds as for round-robin, and a worker that the operating system
      deschedules holds back the one tile it claimed, where under
      round-robin every W-th tile waits for it. A tile of a task with live bounds does all this
      only when it is live (`scf.if` on the bounds, read through the
      record's index buffers); a dead tile keeps its place in the order,
      so the deadlock argument is unchanged. With `prefetch`, a tile that
      has waits first emits `event.prefetch` for each box it reads from a
      buffer no task writes (the weights), clipped to the buffer, so that
      they stream in while it waits; the tasks of a family then also agree
      on those boxes;
    * `@g_check(symbols, table, counters) -> i32`: 0 when every counter is
      back to zero after the run, 2 (unbalanced) otherwise.
    All four carry `event.graph = "g"`, `event.schedule = "static"` and
    `event.workers = N`. The graph's identical pure computations are merged
    first (so equal counts and sizes share classes), every graph is checked
    as by `event-check-schedule`
    (unless `check=false`), and nothing is rewritten if any graph
    fails. A buffer argument that is not contiguous and row-major in the
    default memory space is an error (the table cannot describe it).

    The counter buffer ends with the run header (`Event/IR/RunLayout.h`:
    the run's status, the watchdog's error record, where the trace records
    are), which `@g_init` resets. Each `event.wait` carries its site (the
    global task index, the event's number, the tile) for the watchdog's
    record, and a tile with waits runs its body and notifies only if
    `event.run_aborted` says the run was not stopped during them. The
    worker carries the tables those numbers refer to: `event.tasks` (each
    task's name and grid rank, in order) and `event.events` (for event
    `e<k>`, the tasks that notify it and wait on it). With `trace`, the
    trace records (10 words per tile, by global tile index) lie between the
    event counters and the header, and each tile writes its record with
    `event.trace_begin` after its waits and `event.trace_end` before its
    notifies; the worker then also has `event.trace`.

    Before (L2):
    ```mlir
    event.graph @g(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
      %c1 = arith.constant 1 : index
      %e = event.alloc(%n) count(%c1) : !event.tensor<?>
      event.task "a" grid(%n) ... notifies(%e : !event.tensor<?> (d0) -> (d0)) {
      ^bb0(%i: index):
        func.call @tile_a(%x, %y, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
      }
      event.task "b" grid(%n) ... waits(%e : !event.tensor<?> (d0) -> (d0)) {...}
    }
    ```
    After (L3), the worker (records: "a" = [0, 2, 0]: %x at word 0, %y at
    word 2, event 0 of its class):
    ```mlir
    memref.global "private" constant @g_task_family : memref<2xi32> = dense<[0, 1]>
    func.func @g_worker(%n: index, %table: memref<?xi64>, %counters: memref<?xi32>)
        attributes {event.graph = "g", event.schedule = "static", event.workers = 0 : i64} {
      %w = event.worker_id
      %nw = event.worker_count
      %end = scf.for %k = %c0 to %c2 step %c1 iter_args(%o = %c0) -> (index) {
        %family = ... load @g_task_family[%k] ...
        %tiles = scf.index_switch %family -> index
        case 0 {
          scf.for %t = %first to %last step %nw {
            %i = arith.subi %t, %o : index
            %x = event.buffer %table[%x_offset] : memref<?xi64> -> memref<?xf32>
            %y = event.buffer %table[%y_offset] : memref<?xi64> -> memref<?xf32>
            func.call @tile_a(%x, %y, %i) : (memref<?xf32>, memref<?xf32>, index) -> ()
            %e = event.view %counters[%base](%n) : memref<?xi32> -> !event.tensor<?>
            event.notify %e[%i] : !event.tensor<?>
          }
          scf.yield %n : index
        }
        default { ... event.wait ..., the tile of "b" ... }
        %next = arith.addi %o, %tiles : index
        scf.yield %next : index
      }
      return
    }
    ```
  }];
  let options = [
    Option<"workers", "workers", "unsigned", /*default=*/"0",
           "Number of persistent workers the program is launched with, "
           "recorded as `event.workers`; 0 lets the runtime decide">,
    Option<"policy", "policy", "std::string", /*default=*/"\"round-robin\"",
           "How global tiles map to workers; supported: round-robin "
           "(global tile t runs on worker t mod W), claim (each worker "
           "claims the next global tile from a shared counter)">,
    Option<"trace", "trace", "bool", /*default=*/"false",
           "Record, for every tile task, its worker, task, tile and the times "
           "after its waits and before its notifies in trace records">,
    Option<"check", "check", "bool", /*default=*/"true",
           "Prove the schedule safe first (as event-check-schedule); false "
           "only to test how the runtime's watchdog reports unsafe programs">,
    Option<"prefetch", "prefetch", "bool", /*default=*/"false",
           "Before the waits of a tile, `event.prefetch` the boxes it reads "
           "from buffers no task writes (weights), so that they stream in "
           "while the tile waits (the CUDA pipeline sets it)">,
  ];
  let dependentDialects = ["::mlir::affine::AffineDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

def EventDynamicSchedule : Pass<"event-dynamic-schedule", "::mlir::ModuleOp"> {
  let summary = "Schedules each event graph into workers that share a task queue";
  let description = [{
    Replaces each `event.graph @g(args)` (L2) by the tables and four
    functions of `event-static-schedule` (same signatures, task families,
    records and event classes, `event.schedule = "dynamic"`), where workers
    take ready tile tasks from one global multi-producer multi-consumer
    queue instead of a fixed order. Tile task ids are global linear tile
    indices (task k's tiles are o_k + row-major tile index); T is the total
    tile count, symbolic.

    The counter buffer holds, after the event tensors (laid out as in the
    static schedule): the queue (`event.queue_push` documents it: head, tail,
    error flag, T slots); the *pending* counts, an `!event.tensor<?>` of T
    elements, tile t's being the number of its wait elements not yet ready;
    the first tile id of each task (numTasks + 1 words, o_k); and, when some
    wait uses it, the *inverse index* in CSR form over every event counter:
    eventCounters + 1 offsets, then the waiting tile ids grouped by counter.
    Three more constant tables list, for each event (numbered class by
    class), its waiters in closed form: `@g_waiter_offsets` (CSR rows),
    `@g_waiter_tasks` and `@g_waiter_kinds` (the waiting task and which of
    its family's wait entries).
    * `@g_counters(symbols, table) -> index`: the size of all of this;
    * `@g_init(symbols, table, counters)`: expected counts (as static); zeroes
      the queue; writes the tile offsets; builds the inverse index by
      evaluating every tile's indexed wait maps (count, prefix sum, fill);
      sets each tile's pending count to the number of its wait entries whose
      element is not already zero, and pushes the tiles whose count is zero;
    * `@g_worker(symbols, table, counters)`: pops task ids until
      `event.queue_pop` returns T; finds the task the id falls in by binary
      search over the tile offsets and runs the tile in its family's case;
      then, one notify entry per iteration of a loop, notifies the entry's
      element with `event.notify_ready` (in the family's case, which
      reports the element) and, in the notifier that took it to zero,
      decrements the pending count of every tile waiting on that element,
      pushing the tile whose count reaches zero. The readying code exists
      once per event class (a switch on the reported class), not once per
      notify site, which keeps the worker small. No tile waits: a popped tile is ready. The waiters of an element
      are found in closed form when the wait map is affine with results
      `dN`, `dN floordiv M` or constants (a box of tiles: the coordinate,
      the M tiles `[M*c, M*c+M)`, every tile along grid dimensions absent
      from the map), from the waiter tables and a switch over those kinds,
      and through the inverse index otherwise (indirect maps, other affine
      expressions) or with `force-index`. An indirect wait whose index
      buffer some task of the graph writes cannot be evaluated in
      `@g_init`: the tile then waits on every coordinate of its indirect
      results (conservative; no new task-level dependency, so no deadlock);
    * `@g_check(symbols, table, counters) -> i32`: 0 after a clean run, 1
      when a push overflowed the queue (impossible when the graph is
      balanced: every tile is pushed once), 2 when an event counter or a
      pending count is not zero.
    Tasks with live bounds run only their live tiles. Tile ids, the queue's
    capacity and the pending counts keep the closed-form grid total T;
    `@g_init` also counts the live tiles into one word after the tile
    offsets, gives pending counts and pushes only to live tiles, and stores
    the end marker T + 1 into the queue slots [live, T) that no push will
    fill, so that a worker claiming one gets tile id T and stops, as past
    the capacity. A notifier readies only live waiting tiles, and
    `@g_check` reports 1 unless exactly `live` tiles were pushed.
    A graph on several ranks (`event.ranks`) waits on symmetric events that
    other ranks notify, whose notifies cannot push into this rank's queue.
    Its symmetric notifies are `event.remote_notify`s, and its symmetric
    waits count in the pending counts like the others; after everything
    above, the counter buffer holds one *handled* flag per event counter,
    which `@g_init` sets to 1 for every element of a symmetric event that
    some tile waits on and that is still to arrive (every rank's counters
    hold their expected counts before any rank runs). The worker takes
    tiles with `event.queue_try_pop`, which never waits; when the queue has
    nothing published, it scans those elements (`event.test`), and the
    worker whose `event.notify_ready` takes an arrived element's flag to
    zero readies its waiters as a local notifier would. A worker that
    readied nothing backs off with `event.idle`, whose watchdog names the
    first element still to arrive, its event and the first task waiting on
    it (`@g_first_waiter`, by event number), with its first tile on the
    element when that task's wait is in closed form
    (`@g_first_waiter_kind`). No worker waits on one
    element, so any number of workers per rank cannot deadlock: a tile is
    pushed once its local producers have run and its remote elements have
    arrived, whichever worker sees that first. With `auto`, a graph on
    several ranks is scheduled statically.
    The graph is checked as by `event-check-schedule{static-order=false}`:
    any acyclic order of tasks is fine for a queue. With `auto`, graphs
    without data-dependent events (indirect maps, or events without
    `count`, live bounds) whose textual task order is a valid static order
    are scheduled statically instead, as by `event-static-schedule`.

    After (L3), the worker of a two-task graph "a" -> "b" (`%e` one counter
    per tile of "a", T = 2n):
    ```mlir
    func.func @g_worker(%n: index, %table: memref<?xi64>, %counters: memref<?xi32>)
        attributes {event.graph = "g", event.schedule = "dynamic", event.workers = 2 : i64} {
      %pending = event.view %counters[%p](%T) : memref<?xi32> -> !event.tensor<?>
      scf.while : () -> () {
        %t = event.queue_pop %counters[%q] capacity(%T) : memref<?xi32>
        %more = arith.cmpi ult, %t, %T : index
        scf.condition(%more) %t : index
      } do {
      ^bb0(%t: index):
        %k = ... binary search of %t over the tile offsets ...
        scf.index_switch %family
        case 0 { ... the tile of "a" (tile %t - o_k) ... }
        default { ... the tile of "b" ... }
        scf.for %entry = %c0 to %max_entries step %c1 {
          %r:5 = scf.index_switch %family -> i1, index, index, index, index
          case 0 {   // "a", entry 0
            %ready = event.notify_ready %e[%i] : !event.tensor<?>
            scf.yield %ready, %class, %number, %base, %i : ...
          }
          default { ... "b" notifies nothing: false ... }
          scf.if %r#0 {
            scf.index_switch %r#1
            case 0 {   // event class 0
              scf.for %w = %first_waiter to %last_waiter step %c1 {
                ... waiting task and kind from the waiter tables ...
                %go = event.notify_ready %pending[%waiter] : !event.tensor<?>
                scf.if %go {
                  event.queue_push %waiter, %counters[%q] capacity(%T) : memref<?xi32>
                }
              }
            }
          }
        }
        scf.yield
      }
      return
    }
    ```

    The counter buffer ends with the run header and, with `trace`, the
    trace records before it, as in `event-static-schedule`; a popped tile
    has no waits, so it needs no `event.run_aborted`, and a worker stops
    when `event.queue_pop` gives it no task (the run was stopped).
  }];
  let options = [
    Option<"workers", "workers", "unsigned", /*default=*/"0",
           "Number of persistent workers the program is launched with, "
           "recorded as `event.workers`; 0 lets the runtime decide">,
    Option<"autoSchedule", "auto", "bool", /*default=*/"false",
           "Schedule graphs without data-dependent events statically "
           "(round-robin) when their task order allows it, and only the "
           "others dynamically">,
    Option<"forceIndex", "force-index", "bool", /*default=*/"false",
           "Find the waiters of every event element through the inverse "
           "index built in `@g_init`, also for affine wait maps">,
    Option<"trace", "trace", "bool", /*default=*/"false",
           "Record, for every tile task, its worker, task, tile and the times "
           "before its body and before its notifies in trace records (as "
           "event-static-schedule)">,
    Option<"check", "check", "bool", /*default=*/"true",
           "Prove the graph acyclic and balanced first; false only to test "
           "how the runtime's watchdog reports unsafe programs">,
    Option<"policy", "policy", "std::string", /*default=*/"\"round-robin\"",
           "With `auto`, the policy of the graphs scheduled statically (as "
           "event-static-schedule: round-robin or claim)">,
    Option<"prefetch", "prefetch", "bool", /*default=*/"false",
           "With `auto`, the graphs scheduled statically prefetch their "
           "tiles' weight boxes before their waits (as "
           "event-static-schedule)">,
  ];
  let dependentDialects = ["::mlir::affine::AffineDialect",
                           "::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect"];
}

#endif // ETC_EVENT_TRANSFORMS_PASSES_TD
