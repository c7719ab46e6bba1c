//===- EventOps.td - Operations of the event dialect ------*- tablegen -*-===//

#ifndef ETC_EVENT_OPS_TD
#define ETC_EVENT_OPS_TD

include "Event/IR/EventBase.td"
include "Event/IR/EventTypes.td"
include "Event/IR/EventAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/CallInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

def Event_Tensor : Type<CPred<"::llvm::isa<::etc::event::EventTensorType>($_self)">,
                        "event tensor", "::etc::event::EventTensorType">;

//===----------------------------------------------------------------------===//
// Containers
//===----------------------------------------------------------------------===//

// AffineScope: the graph's index arguments and the values computed from them
// at its top level (grid sizes) are affine symbols, as in a func.func. Without
// it, the affine verifier searched beyond the graph for the scope and
// recursed without end on a self-referencing affine.apply.
def Event_GraphOp : Event_Op<"graph", [
    AffineScope, AutomaticAllocationScope, IsolatedFromAbove, FunctionOpInterface,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "A graph of tile tasks over buffers and symbolic dimensions";
  let description = [{
    A function-like container holding the tasks of one computation. Its
    arguments are the buffers (`memref`s) the tasks read and write and the
    `index` values of the symbolic dimensions (e.g. the batch size). A
    buffer argument with the unit attribute `event.intermediate` is scratch
    memory allocated by the runtime: some task must write it before any task
    reads it.

    A graph with the attribute `event.ranks = N` runs on N devices (ranks)
    at once, each its own copy of the graph on its own inputs (SPMD). Its
    intermediates marked `event.symmetric` lie at the same place on every
    rank, so that a task may `event.put` into another rank's copy; they are
    written by those puts and ordered by symmetric event tensors
    (`!event.tensor<..., symmetric>`), whose notify maps name the rank
    first and may use `s0`, the rank the task runs on. Tasks run in an order consistent with their events; textual
    order is the order dependency inference assumes for buffer reuse.

    ```mlir
    event.graph @scale(%n: index, %x: memref<?xf32>, %y: memref<?xf32>) {
      %g = affine.apply affine_map<()[s0] -> (s0 ceildiv 64)>()[%n]
      event.task "scale" grid(%g)
          reads(%x : memref<?xf32> (d0) -> (d0 * 64) [64])
          writes(%y : memref<?xf32> (d0) -> (d0 * 64) [64]) {
      ^bb0(%i: index):
        ...
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       OptionalAttr<DictArrayAttr>:$arg_attrs,
                       OptionalAttr<DictArrayAttr>:$res_attrs);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The name of the unit argument attribute marking scratch buffers.
    static ::llvm::StringRef getIntermediateAttrName() { return "event.intermediate"; }
    bool isIntermediate(unsigned argIndex) {
      return getArgAttr(argIndex, getIntermediateAttrName()) != nullptr;
    }
    /// The unit argument attribute marking buffers that live on every rank
    /// at the same place (the symmetric heap), so that other ranks can put
    /// into them.
    static ::llvm::StringRef getSymmetricAttrName() { return "event.symmetric"; }
    bool isSymmetric(unsigned argIndex) {
      return getArgAttr(argIndex, getSymmetricAttrName()) != nullptr;
    }
    /// The attribute holding the number of devices (ranks) that each run
    /// a copy of the graph (absent: one).
    static ::llvm::StringRef getRanksAttrName() { return "event.ranks"; }
    ::mlir::IntegerAttr getRanksAttr() {
      return ::llvm::dyn_cast_or_null<::mlir::IntegerAttr>(
          (*this)->getAttr(getRanksAttrName()));
    }

    //===------------------------------------------------------------------===//
    // FunctionOpInterface
    //===------------------------------------------------------------------===//
    ::mlir::Region *getCallableRegion() { return &getBody(); }
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() {
      return getFunctionType().getInputs();
    }
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() {
      return getFunctionType().getResults();
    }
  }];
}

def Event_YieldOp : Event_Op<"yield", [
    Pure, Terminator, ReturnLike, ParentOneOf<["GraphOp", "TaskOp"]>]> {
  let summary = "Terminates a graph or a task body";
  let description = [{
    Ends the body of an `event.graph` or an `event.task`. It is implicit in
    the custom syntax of both.
  }];
  let assemblyFormat = "attr-dict";
}

//===----------------------------------------------------------------------===//
// Event tensors
//===----------------------------------------------------------------------===//

def Event_AllocOp : Event_Op<"alloc", [AttrSizedOperandSegments]> {
  let summary = "Allocates an event tensor";
  let description = [{
    Allocates an event tensor. `dynamic_sizes` gives one `index` per `?`
    dimension of the result type, in order.

    `count`, when present, is the expected count of every element: the
    number of notifies it receives before its waiters may run. Dependency
    inference computes it (from the grid sizes, so it may be symbolic).
    Without `count`, the expected counts depend on runtime data (indirect
    notify maps) and the scheduled program counts them on the device in an
    initialisation phase before any task runs.

    ```mlir
    %e = event.alloc(%rows) count(%c8) : !event.tensor<?>
    ```
  }];
  let arguments = (ins Variadic<Index>:$dynamic_sizes, Optional<Index>:$count);
  let results = (outs Event_Tensor:$result);
  let assemblyFormat = [{
    `(` $dynamic_sizes `)` (`count` `(` $count^ `)`)? attr-dict `:` qualified(type($result))
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::etc::event::EventTensorType getType() {
      return ::llvm::cast<::etc::event::EventTensorType>(getResult().getType());
    }
  }];
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

// AffineScope: within one tile task, the tile indices are fixed, so they and
// the values the body computes from them at its top level are symbols.
def Event_TaskOp : Event_Op<"task", [
    AffineScope, AttrSizedOperandSegments, HasParent<"GraphOp">,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "A grid of tile tasks with declared accesses and events";
  let description = [{
    A device function: the body runs once for every point of `grid`, with
    the tile indices as its block arguments. Grid sizes are `index` values,
    so they may be symbolic (computed from the graph's dimension arguments);
    a constant grid size must be positive.

    The clauses are declarative annotations of every tile task:
    * `reads` / `writes` (L1): the footprint of each buffer it accesses, as
      an affine map from the tile indices to the box offsets plus the box
      sizes (`?` = the whole dimension);
    * `waits` / `notifies` (L2, added by `event-infer-dependencies`): the
      element of each event tensor it waits on before it runs and notifies
      after it finishes, as an affine map of the tile indices, optionally
      with results loaded from the 1-D runtime buffers of `indices`;
    * `indices`: the index buffers that indirect maps and live bounds read;
    * `live` (optional): live bounds (`#event.live`) that make only some
      tiles run, decided from index buffers that hold their values before
      the run (e.g. `d1 below (d0) -> (d0 ceildiv 64) of (d0, d1) -> (d0)
      indirect [0]`: chunk tile (r, j) of attention runs when j is below
      the chunk count of request r's length). A dead tile waits on nothing,
      runs nothing and notifies nothing; events it would notify have no
      `count` and are counted on the device over live tiles only.

    The body refers to the graph's buffers directly and computes the tile
    with target-neutral ops (arith, math, memref, scf, vector) and the lane
    ops for intra-tile parallelism.

    ```mlir
    event.task "mm0" grid(%rows, %c8)
        reads(%x : memref<?x256xf32> (d0, d1) -> (d0 * 32, 0) [32, ?],
              %w : memref<256x512xf32> (d0, d1) -> (0, d1 * 64) [?, 64])
        writes(%h : memref<?x512xf32> (d0, d1) -> (d0 * 32, d1 * 64) [32, 64])
        notifies(%e : !event.tensor<?> (d0, d1) -> (d0)) {
    ^bb0(%i: index, %j: index):
      ...
    }
    ```
  }];
  let arguments = (ins StrAttr:$name,
                       Variadic<Index>:$grid,
                       Variadic<AnyMemRef>:$reads,
                       Variadic<AnyMemRef>:$writes,
                       Variadic<Event_Tensor>:$waits,
                       Variadic<Event_Tensor>:$notifies,
                       Variadic<AnyMemRef>:$indices,
                       TypedArrayAttrBase<Event_FootprintAttr, "read footprints">:$read_footprints,
                       TypedArrayAttrBase<Event_FootprintAttr, "write footprints">:$write_footprints,
                       TypedArrayAttrBase<Event_IndexMapAttr, "wait maps">:$wait_maps,
                       TypedArrayAttrBase<Event_IndexMapAttr, "notify maps">:$notify_maps,
                       OptionalAttr<TypedArrayAttrBase<Event_LiveAttr, "live bounds">>:$live_bounds);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [
    OpBuilder<(ins "::llvm::StringRef":$name, "::mlir::ValueRange":$grid)>,
  ];
  let extraClassDeclaration = [{
    unsigned getGridRank() { return getGrid().size(); }
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
    ::mlir::Block::BlockArgListType getTileIndices() {
      return getBodyBlock().getArguments();
    }
    ::etc::event::FootprintAttr getReadFootprint(unsigned i) {
      return ::llvm::cast<::etc::event::FootprintAttr>(getReadFootprints()[i]);
    }
    ::etc::event::FootprintAttr getWriteFootprint(unsigned i) {
      return ::llvm::cast<::etc::event::FootprintAttr>(getWriteFootprints()[i]);
    }
    ::etc::event::IndexMapAttr getWaitMap(unsigned i) {
      return ::llvm::cast<::etc::event::IndexMapAttr>(getWaitMaps()[i]);
    }
    ::etc::event::IndexMapAttr getNotifyMap(unsigned i) {
      return ::llvm::cast<::etc::event::IndexMapAttr>(getNotifyMaps()[i]);
    }
    /// The live bounds (none: every tile runs).
    ::llvm::SmallVector<::etc::event::LiveAttr> getLiveBoundList() {
      ::llvm::SmallVector<::etc::event::LiveAttr> bounds;
      if (::mlir::ArrayAttr attr = getLiveBoundsAttr())
        for (::mlir::Attribute bound : attr)
          bounds.push_back(::llvm::cast<::etc::event::LiveAttr>(bound));
      return bounds;
    }
    /// True when only some tiles run (the task has live bounds).
    bool isPredicated() {
      return getLiveBoundsAttr() && !getLiveBoundsAttr().empty();
    }
    /// Appends `event` to the waits (or notifies) with `map`.
    void addWait(::mlir::Value event, ::etc::event::IndexMapAttr map);
    void addNotify(::mlir::Value event, ::etc::event::IndexMapAttr map);
  }];
}

//===----------------------------------------------------------------------===//
// Imperative synchronisation (L3)
//===----------------------------------------------------------------------===//

def Event_WaitOp : Event_Op<"wait", [AttrSizedOperandSegments]> {
  let summary = "Waits until an event element reaches zero (acquire)";
  let description = [{
    Blocks until element `indices` of `event` has received all its expected
    notifies. Memory written before those notifies is visible after the wait
    (acquire semantics).

    The wait is bounded by the run's watchdog: if the element is not ready
    in time, the first such wait writes the run header's error record
    (`Event/IR/RunLayout.h`) and stops the run, and every wait (and queue
    pop) returns as soon as the run is stopped. `site` says where the wait
    is, for that record: the index of the waiting task and the number of
    the event tensor in the program's `event.tasks` / `event.events` tables,
    then the coordinates of the waiting tile. Without it the record says -1.

    A `deferred` wait only waits: the `event.acquire` that must follow it
    (after the tile's other waits) makes the notifiers' writes visible to
    every lane, so that a tile with several waits synchronises its lanes
    and acquires once (on CUDA one fence and one barrier per tile instead
    of one per wait). On the CPU target the attribute changes nothing.

    ```mlir
    event.wait %e[%i] : !event.tensor<?>
    event.wait %e[%i] site(%task, %event, %i, %j) : !event.tensor<?>
    event.wait %e[%i] deferred : !event.tensor<?>
    event.wait %f[%i] deferred : !event.tensor<?>
    event.acquire
    ```
  }];
  let arguments = (ins Event_Tensor:$event, Variadic<Index>:$indices,
                       Variadic<Index>:$site, UnitAttr:$deferred);
  let assemblyFormat = [{
    $event `[` $indices `]` (`site` `(` $site^ `)`)? (`deferred` $deferred^)?
    attr-dict `:` qualified(type($event))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$event, "::mlir::ValueRange":$indices), [{
      build($_builder, $_state, event, indices, ::mlir::ValueRange{});
    }]>,
  ];
  let extraClassDeclaration = [{
    /// The waiting tile's coordinates in `site`.
    ::mlir::OperandRange getSiteTile() { return getSite().drop_front(2); }
  }];
  let hasVerifier = 1;
}

def Event_NotifyOp : Event_Op<"notify"> {
  let summary = "Decrements an event element (release)";
  let description = [{
    Decrements element `indices` of `event` by one with release semantics:
    every write made before the notify is visible to a task whose wait on
    that element returns.

    A `released` notify relies on an `event.release` that the worker
    executed after its last write and before the notify: it only
    decrements. A tile with several notifies thus synchronises its lanes
    and publishes its writes once (on CUDA one barrier and one fence per
    tile instead of one per notify). On the CPU target the attribute
    changes nothing.

    ```mlir
    event.notify %e[%i] : !event.tensor<?>
    event.release
    event.notify %e[%i] released : !event.tensor<?>
    event.notify %f[%i] released : !event.tensor<?>
    ```
  }];
  let arguments = (ins Event_Tensor:$event, Variadic<Index>:$indices,
                       UnitAttr:$released);
  let assemblyFormat = [{
    $event `[` $indices `]` (`released` $released^)? attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Several devices: ranks, remote notifies and puts
//===----------------------------------------------------------------------===//

def Event_RemoteNotifyOp : Event_Op<"remote_notify"> {
  let summary = "Decrements an element of a symmetric event tensor on a rank";
  let description = [{
    Decrements element `indices` of rank `rank`'s copy of the symmetric
    event tensor `event` (`!event.tensor<..., symmetric>`) by one. Every
    `event.put` this rank issued to `rank` before the op is complete there
    before the decrement is visible (put, then fence, then signal), so a
    task on `rank` whose wait on the element returns reads the data. Used
    for every notify of a symmetric event, the rank's own copy included, so
    that all updates of its counters go through the same transport.

    CPU: `MPI_Win_flush` of `rank`, `MPI_Accumulate` of -1 (`MPI_SUM`,
    atomic against every other accumulate) on the counter's word of the
    counters window, then `MPI_Win_flush` of `rank` to deliver it.

    ```mlir
    event.remote_notify %e[%i] rank(%r) : !event.tensor<?, symmetric>
    ```
  }];
  let arguments = (ins Event_Tensor:$event, Variadic<Index>:$indices,
                       Index:$rank);
  let assemblyFormat = [{
    $event `[` $indices `]` `rank` `(` $rank `)` attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
}

def Event_PutOp : Event_Op<"put", [AttrSizedOperandSegments]> {
  let summary = "Copies a box of a local buffer into a symmetric buffer on a rank";
  let description = [{
    Copies the box of `source` at `source_offsets` with `sizes` elements
    per dimension into rank `rank`'s copy of the symmetric buffer `dest`
    (a graph buffer marked `event.symmetric`), at `dest_offsets`. `dest`
    may have more dimensions than `source`: the box then lies in the last
    dimensions of `dest`, with one element along each leading one (e.g. a
    tile into the slot of the sending rank of a staging buffer). Both have
    the same element type and are contiguous and row-major.

    The copy may still be in flight when the op returns; it is complete at
    `rank` before any later `event.remote_notify` to `rank` from this rank
    is visible there.

    CPU: one `MPI_Put` per row of the box into the symmetric window.

    ```mlir
    event.put %y[%r0, %c0] [%rows, %c64] to %s[%me, %r0, %c0] rank(%p)
        : memref<?x64xf32>, memref<2x?x64xf32>
    ```
  }];
  let arguments = (ins AnyMemRef:$source, Variadic<Index>:$source_offsets,
                       Variadic<Index>:$sizes, AnyMemRef:$dest,
                       Variadic<Index>:$dest_offsets, Index:$rank);
  let assemblyFormat = [{
    $source `[` $source_offsets `]` `[` $sizes `]` `to` $dest `[` $dest_offsets `]`
    `rank` `(` $rank `)` attr-dict `:` type($source) `,` type($dest)
  }];
  let hasVerifier = 1;
}

def Event_AcquireOp : Event_Op<"acquire"> {
  let summary = "Completes a tile's `deferred` waits";
  let description = [{
    After the `deferred` `event.wait`s before it have returned, every write
    their notifiers published is visible to every lane of the worker. The
    static scheduler emits one after each tile's waits, which it marks
    `deferred`. Every lane of the worker must reach it, like a barrier.

    CUDA: a GPU-scope acquire fence by thread 0, the thread that polled the
    counters (it makes each relaxed poll that saw a counter ready an
    acquire of that counter's notifiers), then a CTA barrier, which extends
    what thread 0 acquired to the other threads (when an
    `event.run_aborted` follows, its reducing barrier is that barrier). A
    deferred wait on a symmetric event, which other GPUs notify, issues its
    own system-scope acquire fence, the scope at which PTX orders another
    device's writes. CPU: nothing (each wait polls with acquire loads).

    ```mlir
    event.acquire
    ```
  }];
  let assemblyFormat = "attr-dict";
}

def Event_ReleaseOp : Event_Op<"release"> {
  let summary = "Publishes a tile's writes before its `released` notifies";
  let description = [{
    Every write that any lane of the worker made before the op is visible,
    at the scope of the event counters, to a task that acquires an element
    which a `released` `event.notify` or `event.notify_ready` of this worker
    decremented after the op. The schedulers emit one after each tile body
    that notifies, then mark the tile's notifies `released`. Every lane of
    the worker must reach it, like a barrier.

    CUDA: a CTA barrier (every thread has finished its part of the tile),
    then a GPU-scope release fence by thread 0, the thread that does the
    notifies; release fences are cumulative, so the fence publishes the
    writes the barrier ordered before it, not only thread 0's. CPU: nothing
    (each notify is a release atomic of its own).

    ```mlir
    event.release
    ```
  }];
  let assemblyFormat = "attr-dict";
}

def Event_PrefetchOp : Event_Op<"prefetch", [AttrSizedOperandSegments]> {
  let summary = "Hints that the tile is about to read a box of a buffer";
  let description = [{
    Asks the target to bring the box of `buffer` starting at `offsets`
    with `sizes` elements per dimension closer to the workers, without
    waiting for it: a hint with no effect on any value. The static
    schedule emits it (with `prefetch=true`) before a tile's waits for the
    boxes the tile reads from buffers no task writes (weights), so that
    the weights stream in while the tile waits for its activations.

    On CUDA the lanes of the tile issue `prefetch.global.L2` (inline PTX) for the
    128-byte lines of the box, row by row (the rows are the box's last
    dimension), lane l taking lines l, l + lanes, ..., and at most the
    first 2048 lines (256 KiB) of the box, so that the tiles in flight on
    every SM stay well inside L2. The CPU target drops it.

    The box must lie inside the buffer (offsets and offsets + sizes within
    each dimension); a size of zero prefetches nothing.

    ```mlir
    event.prefetch %w[%c0, %j] [%k, %c64] : memref<4096x4096xbf16>
    ```
  }];
  let arguments = (ins AnyMemRef:$buffer, Variadic<Index>:$offsets,
                       Variadic<Index>:$sizes);
  let assemblyFormat = [{
    $buffer `[` $offsets `]` `[` $sizes `]` attr-dict `:` type($buffer)
  }];
  let hasVerifier = 1;
}

def Event_ViewOp : Event_Op<"view", [Pure]> {
  let summary = "Views part of a counter buffer as an event tensor";
  let description = [{
    In a scheduled program (L3) the event tensors of a graph live in one
    flat buffer of 32-bit counters that the runtime allocates. `event.view`
    names the event tensor stored row-major from element `offset` on, with
    one `dynamic_sizes` entry per `?` dimension of the result type. Constant
    offsets and sizes must not be negative.

    ```mlir
    %e = event.view %counters[%offset](%rows) : memref<?xi32> -> !event.tensor<?x8>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$offset,
                       Variadic<Index>:$dynamic_sizes);
  let results = (outs Event_Tensor:$result);
  let assemblyFormat = [{
    $counters `[` $offset `]` `` `(` $dynamic_sizes `)` attr-dict `:`
    type($counters) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::etc::event::EventTensorType getType() {
      return ::llvm::cast<::etc::event::EventTensorType>(getResult().getType());
    }
  }];
}

def Event_BufferOp : Event_Op<"buffer", [Pure]> {
  let summary = "Reads a graph buffer from the buffer table";
  let description = [{
    In a scheduled program (L3) the graph's buffers reach the program through
    one `memref<?xi64>` *buffer table* that the runtime fills, so that a
    kernel takes a handful of parameters whatever the number of buffers.
    Buffer argument `i` of the graph (memref arguments counted in order) has
    `1 + rank` words from word `o_i = sum over j < i of (1 + rank_j)`: its
    aligned address, then the size of each dimension. Buffers are contiguous
    and row-major.

    `event.buffer` names the buffer whose descriptor starts at word
    `offset`; the result type gives its element type, rank and static sizes
    (a static size wins over the table's). The table is read-only while the
    program runs, so the op is pure.

    ```mlir
    %w = event.buffer %table[%c3] : memref<?xi64> -> memref<?x64xf32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I64], [1]>:$table, Index:$offset);
  let results = (outs AnyMemRef:$result);
  let assemblyFormat = [{
    $table `[` $offset `]` attr-dict `:` type($table) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Execution resources, lowered differently by each target
//===----------------------------------------------------------------------===//

class Event_IndexQueryOp<string mnemonic, string summaryText, string descriptionText>
    : Event_Op<mnemonic, [Pure]> {
  let summary = summaryText;
  let description = descriptionText;
  let results = (outs Index:$result);
  let assemblyFormat = "attr-dict";
}

def Event_LaneIdOp : Event_IndexQueryOp<"lane_id",
  "The lane that runs this part of a tile body",
  [{ The index of the calling lane within the tile task, in
     `[0, event.lane_count)`. One lane on the CPU target; a CTA thread on CUDA. }]>;

def Event_LaneCountOp : Event_IndexQueryOp<"lane_count",
  "The number of lanes that run a tile body",
  [{ How many lanes execute each tile body together. }]>;

def Event_WorkerIdOp : Event_IndexQueryOp<"worker_id",
  "The persistent worker that runs the calling code",
  [{ The index of the persistent worker (a host thread on CPU, a CTA on
     CUDA), in `[0, event.worker_count)`. }]>;

def Event_WorkerCountOp : Event_IndexQueryOp<"worker_count",
  "The number of persistent workers",
  [{ How many persistent workers run the program. }]>;

def Event_RankIdOp : Event_IndexQueryOp<"rank_id",
  "The rank (device) that runs the calling code",
  [{ The index of the calling device in the graph's device group, in
     `[0, event.rank_count)`: the `s0` of index maps. 0 in a graph that runs
     on one device. CPU: the MPI rank of the process. }]>;

def Event_RankCountOp : Event_IndexQueryOp<"rank_count",
  "The number of ranks (devices) the graph runs on",
  [{ How many devices run the graph, each its own copy (`event.ranks`). }]>;

def Event_LaneBarrierOp : Event_Op<"lane_barrier"> {
  let summary = "Synchronises the lanes of one tile task";
  let description = [{
    Every lane of the tile task waits until all have reached the barrier;
    their shared-memory and global writes before it are visible after it.
    A no-op with one lane; `gpu.barrier` on CUDA.
  }];
  let assemblyFormat = "attr-dict";
}

def Event_LaneReduceOp : Event_Op<"lane_reduce", [SameOperandsAndResultType]> {
  let summary = "Combines a value across a group of lanes";
  let description = [{
    Combines `value` (`add` or `maxnumf`) across groups of `group` lanes of
    the tile task and gives every lane of a group the result. The lanes of
    a group differ only in the bits `stride`, `2 stride`, ...,
    `group/2 stride` of their lane id: with `stride = 1` a group is `group`
    consecutive lanes; with `stride = 4`, `group = 8` the lanes `l`, `l + 4`,
    ..., `l + 28` of each 32 form a group. `group` and `stride` are powers
    of two with `group * stride <= 32`: on CUDA a group lies within one warp.
    All lanes of a group must reach the op together, like a barrier for the
    group. On CUDA: a butterfly of `shfl.sync.bfly` exchanges (log2 group
    steps); on the CPU target with one lane: the value itself.

    ```mlir
    %row_sum = event.lane_reduce "add" %partial {group = 32, stride = 1} : f32
    ```
  }];
  let arguments = (ins F32:$value, StrAttr:$kind, I64Attr:$group,
                       DefaultValuedAttr<I64Attr, "1">:$stride);
  let results = (outs F32:$result);
  let assemblyFormat = "$kind $value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def Event_ScratchOp : Event_Op<"scratch"> {
  let summary = "Memory shared by the lanes of a tile task";
  let description = [{
    A statically shaped buffer that every lane of the calling tile task
    sees, for exchanging partial results between lanes (with
    `event.lane_barrier` between the writes and the reads). Its contents are
    undefined when the tile starts and are lost when it returns; each op is
    its own buffer. On CUDA: a `__shared__` array of the kernel (workgroup
    memory, reached through generic addresses); on the CPU target with one
    lane: a stack allocation.

    ```mlir
    %partials = event.scratch : memref<4x32xf32>
    ```
  }];
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Dynamic scheduling (L3): ready counts and the task queue
//===----------------------------------------------------------------------===//

def Event_NotifyReadyOp : Event_Op<"notify_ready"> {
  let summary = "Decrements an event element and says whether it became ready";
  let description = [{
    Decrements element `indices` of `event` by one, like `event.notify`, and
    returns `true` in exactly one of its notifiers: the one whose decrement
    took the element from 1 to 0. The decrement is acquire-release (one
    atomic read-modify-write): it publishes the caller's writes like
    `event.notify`, and the notifier that sees the element reach zero also
    acquires the writes of every earlier notifier, so that what it does next
    (typically readying waiters, `event.queue_push`) carries all of them.
    The dynamic scheduler uses it both on event tensors and on the per-tile
    pending counts (an event tensor whose element is the number of wait
    elements a tile still needs).

    By default the op is collective: every lane of the worker reaches it
    with the same element, one decrement is made for the worker, and every
    lane gets its result. `released` means, as for `event.notify`, that an
    `event.release` already published the worker's writes. `per_lane`
    means each lane that executes it makes its own decrement, of its own
    element, and gets its own result; the lanes need not execute it
    together. The dynamic scheduler spreads the readying of an element's
    waiters over the lanes this way (lane l decrements the pending counts of
    waiters l, l + lanes, ...).

    CPU: `atomicrmw sub ... acq_rel` and a compare of the old value with 1.
    CUDA: thread 0 decrements and a reducing barrier (`bar.red.or`) hands
    the result to every thread, or, `per_lane`, each thread decrements; the
    ordering is a release fence (none when `released`), a relaxed atomic,
    and an acquire fence only in the notifier that sees the element reach
    zero.

    ```mlir
    %ready = event.notify_ready %e[%i] : !event.tensor<?>
    %ready = event.notify_ready %e[%i] released : !event.tensor<?>
    %last = event.notify_ready %pending[%tile] per_lane : !event.tensor<?>
    ```
  }];
  let arguments = (ins Event_Tensor:$event, Variadic<Index>:$indices,
                       UnitAttr:$released, UnitAttr:$per_lane);
  let results = (outs I1:$ready);
  let assemblyFormat = [{
    $event `[` $indices `]` (`released` $released^)? (`per_lane` $per_lane^)?
    attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
}

def Event_QueuePushOp : Event_Op<"queue_push"> {
  let summary = "Appends a task id to a task queue in the counter buffer";
  let description = [{
    The dynamic scheduler's multi-producer multi-consumer task queue lives in
    the counter buffer from element `queue` on, as 32-bit words:
    * `[queue + 0]` head: the number of slots claimed by `event.queue_pop`;
    * `[queue + 1]` tail: the number of slots reserved by `event.queue_push`;
    * `[queue + 2]` error flag: non-zero once a push found the queue full;
    * `[queue + 3 + s]`, `s` in `[0, capacity)`: slot `s`, holding
      `task + 1` once published and 0 while empty.
    The owner zeroes all `3 + capacity` words before any push or pop. Slots
    are used once each (every task is pushed once, so `capacity` = the
    number of tasks suffices and the queue never wraps).

    `event.queue_push` reserves slot `s` with an atomic increment of the
    tail, then publishes `task + 1` into it with a release store, so that
    whatever the pusher had acquired (the writes of the tasks that made
    `task` ready) is visible to the worker that pops it. If `s >= capacity`
    it stores nothing and sets the error flag to 1 instead. `task` must be
    below 2^31 - 1, and a constant `capacity` at least 1 (a push into a
    queue of capacity 0 always overflows).

    By default every lane of the worker reaches the op with the same task
    and one push is made for the worker (on CUDA by thread 0); `per_lane`,
    each lane that executes it pushes its own task.

    ```mlir
    event.queue_push %task, %counters[%queue] capacity(%tasks) : memref<?xi32>
    event.queue_push %task, %counters[%queue] capacity(%tasks) per_lane : memref<?xi32>
    ```
  }];
  let arguments = (ins Index:$task, MemRefRankOf<[I32], [1]>:$counters,
                       Index:$queue, Index:$capacity, UnitAttr:$per_lane);
  let assemblyFormat = [{
    $task `,` $counters `[` $queue `]` `capacity` `(` $capacity `)`
    (`per_lane` $per_lane^)? attr-dict `:` type($counters)
  }];
  let hasVerifier = 1;
}

def Event_QueuePopOp : Event_Op<"queue_pop"> {
  let summary = "Takes the next task id from a task queue";
  let description = [{
    Claims the next slot `s` of the task queue at element `queue` of the
    counter buffer (layout in `event.queue_push`) with an atomic increment
    of the head. If `s < capacity`, waits until the slot is published
    (acquire loads; the CPU polls, then blocks in a futex wait; the GPU
    backs off with `nanosleep`)
    and returns the task id in it; the pusher's writes are then visible.
    If `s >= capacity`, every slot has been claimed, and it returns
    `capacity` at once: a worker loop pops until it gets `capacity`.
    Capacity 0 is the queue of a program without tiles.

    On targets where a worker is a group of lanes (a CTA), one lane pops and
    the result is shared with the others.

    ```mlir
    %task = event.queue_pop %counters[%queue] capacity(%tasks) : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$queue,
                       Index:$capacity);
  let results = (outs Index:$task);
  let assemblyFormat = [{
    $counters `[` $queue `]` `capacity` `(` $capacity `)` attr-dict
    `:` type($counters)
  }];
  let hasVerifier = 1;
}

def Event_QueueTryPopOp : Event_Op<"queue_try_pop"> {
  let summary = "Takes the next task id from a task queue, without waiting";
  let description = [{
    The form of `event.queue_pop` for workers that must not wait on the
    queue (the dynamic schedule of a graph on several ranks, whose idle
    workers poll for remote notifies instead). It claims the next slot only
    once it is published: while the head `h` is below `capacity` and slot
    `h` holds a task, a compare-and-swap advances the head from `h` (and the
    op retries when another worker took it first); the acquire load of the
    slot makes the pusher's writes visible. Returns the task id; `capacity`
    when every slot has been taken or the next holds the end marker
    `capacity + 1` (the queue is exhausted, as a pop past the capacity); or
    `capacity + 1` when the next slot is not published yet. Workers of one
    queue use either `event.queue_pop` or this op, not both.

    On targets where a worker is a group of lanes (a CTA), one lane takes
    the task and the result is shared with the others.

    ```mlir
    %task = event.queue_try_pop %counters[%queue] capacity(%tasks) : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$queue,
                       Index:$capacity);
  let results = (outs Index:$task);
  let assemblyFormat = [{
    $counters `[` $queue `]` `capacity` `(` $capacity `)` attr-dict
    `:` type($counters)
  }];
  let hasVerifier = 1;
}

def Event_ClaimOp : Event_Op<"claim"> {
  let summary = "Claims the next number of a shared counter";
  let description = [{
    Adds 1 to element `index` of the counter buffer atomically and returns
    the value it held before: each call in the program, on any worker, gets
    a different number, counting up from the value the owner stored there
    (0 for the static schedule's `policy=claim`, whose workers claim global
    tile indices in increasing order). The increment orders no other memory
    access (relaxed): whatever the claimed work needs must be published by
    events. The value must stay below 2^31 - 1.

    On targets where a worker is a group of lanes (a CTA), one lane claims
    and the number is shared with the others.

    ```mlir
    %t = event.claim %counters[%next] : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$index);
  let results = (outs Index:$claimed);
  let assemblyFormat = [{
    $counters `[` $index `]` attr-dict `:` type($counters)
  }];
}

def Event_TestOp : Event_Op<"test"> {
  let summary = "Whether an event element is ready, without waiting";
  let description = [{
    Returns `true` when element `indices` of `event` has received all its
    expected notifies (its counter is no longer positive), with acquire
    semantics like `event.wait`: when it returns `true`, the notifiers'
    writes (for a symmetric event, the puts of the ranks that notified it)
    are visible. It never waits. On targets where a worker is a group of
    lanes, one lane loads and every lane gets the answer.

    ```mlir
    %ready = event.test %e[%i] : !event.tensor<4, symmetric>
    ```
  }];
  let arguments = (ins Event_Tensor:$event, Variadic<Index>:$indices);
  let results = (outs I1:$ready);
  let assemblyFormat = [{
    $event `[` $indices `]` attr-dict `:` qualified(type($event))
  }];
  let hasVerifier = 1;
}

def Event_IdleOp : Event_Op<"idle", [AttrSizedOperandSegments]> {
  let summary = "One back-off step of a worker that found nothing to do";
  let description = [{
    A worker that polls (it found no task and no arrived element) backs off
    once (CPU: `sched_yield`) and keeps the watchdog: `since` is the time,
    in nanoseconds of the target's clock, at which it became idle, or 0 when
    it was not idle before this step; the result is that time (the clock
    now when `since` is 0). Once the worker has been idle longer than the
    watchdog allows, the op writes the run header's error record, if no
    spin did before, and stops the run (`event.run_aborted` is then true),
    as a wait that timed out does.

    With `on`, the record names what the worker waits for, as the record of
    an `event.wait` would: the element `indices` of `event` (its value is
    the counter's) and `site`, the index of a waiting task and the number
    of the event, then the waiting tile's coordinates if known. Without it,
    the record is that of a queue pop.

    ```mlir
    %start = event.idle %counters since(%since) : memref<?xi32>
    %start = event.idle %counters since(%since) on %e[%i] site(%task, %event)
        : memref<?xi32>, !event.tensor<4, symmetric>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, I64:$since,
                       Optional<Event_Tensor>:$event, Variadic<Index>:$indices,
                       Variadic<Index>:$site);
  let results = (outs I64:$start);
  let assemblyFormat = [{
    $counters `since` `(` $since `)`
    (`on` $event^ `[` $indices `]` `site` `(` $site `)`)?
    attr-dict `:` type($counters) (`,` qualified(type($event))^)?
  }];
  let hasVerifier = 1;
}

def Event_StallOp : Event_Op<"stall", [AttrSizedOperandSegments]> {
  let summary = "One failed poll of a lane waiting on a tile's mbarrier";
  let description = [{
    A lane of a tile function that waits on one of the tile's own barriers
    (a GPU `mbarrier` in shared memory: `etc.ops.wgmma.Barriers`, the
    software pipeline of the Hopper kernels) polls it, and after each poll
    that found the phase incomplete it stalls once with this op, which
    keeps the watchdog for it: `since` is the time, in nanoseconds of the
    target's clock, at which the lane began to wait, or 0 on its first
    stall; `start` is that time (the clock now when `since` is 0).
    `give_up` is true when the lane should stop waiting: the run was
    stopped (a watchdog elsewhere, or the host), or this wait has outlived
    the watchdog, in which case the op has written the run header's error
    record, if no spin did before, and stopped the run. A lane that gives
    up leaves the barrier's phase incomplete, so what the tile computes
    from then on is garbage; the run's error says why.

    `role` names the barrier's part in the pipeline ("full": the stage's
    operands have landed; "empty": the stage's consumers are done with
    it), `barrier` is its byte address in the worker's shared memory,
    `stage` its number among the tile's barriers of that role, and
    `parity` (0 or 1) the parity of the phase waited for. The error record
    names them as the element (stage, role: 0 full, 1 empty, parity) and
    holds the barrier's low state word as the value.

    A tile function emits it without `on` and `site` (L1): the tile does
    not know the counter buffer or which task and tile it runs. The
    schedule (`event-static-schedule`, `event-dynamic-schedule`) gives the
    tile function the worker's counter buffer and the task index and tile
    coordinates as arguments, and every stall in it the `counters` and
    `site` (task, then the tile's coordinates) of the call (L3). Only the
    GPU target lowers it; the CPU target simulates barriers and never
    stalls on one.

    ```mlir
    %start, %give_up = event.stall "full" barrier(%address) stage(%s)
        parity(%p) since(%since)
    %start, %give_up = event.stall "empty" barrier(%address) stage(%s)
        parity(%p) since(%since) on %counters site(%task, %i, %j)
        : memref<?xi32>
    ```
  }];
  let arguments = (ins StrAttr:$role, Index:$barrier, Index:$stage,
                       Index:$parity, I64:$since,
                       Optional<MemRefRankOf<[I32], [1]>>:$counters,
                       Variadic<Index>:$site);
  let results = (outs I64:$start, I1:$give_up);
  let assemblyFormat = [{
    $role `barrier` `(` $barrier `)` `stage` `(` $stage `)`
    `parity` `(` $parity `)` `since` `(` $since `)`
    (`on` $counters^ `site` `(` $site `)`)?
    attr-dict (`:` type($counters)^)?
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// The run header: watchdog and traces (L3)
//===----------------------------------------------------------------------===//

def Event_RunAbortedOp : Event_Op<"run_aborted"> {
  let summary = "Whether the run has been stopped";
  let description = [{
    Reads the status word of the run header at the end of the counter
    buffer (`Event/IR/RunLayout.h`): `true` once a spin timed out (the
    watchdog) or the host interrupted the run. A worker checks it after its
    waits and skips the tile when it is set, because a wait that returned
    for that reason does not make the tile's inputs ready.

    On targets where a worker is a group of lanes (a CTA), one lane reads
    it and every lane gets the same answer.

    ```mlir
    %stopped = event.run_aborted %counters : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters);
  let results = (outs I1:$aborted);
  let assemblyFormat = "$counters attr-dict `:` type($counters)";
}

def Event_TraceBeginOp : Event_Op<"trace_begin"> {
  let summary = "Starts the trace record of a tile task";
  let description = [{
    Writes the first part of the trace record at word `record` of the
    counter buffer (layout in `Event/IR/RunLayout.h`): the calling worker,
    `task` (its index in the program's `event.tasks`), the tile coordinates
    `tile` (at most 4) and the start time, in nanoseconds of a clock shared
    by all workers (CPU: `CLOCK_MONOTONIC`; GPU: `%globaltimer`). The
    schedulers emit it after the tile's waits when tracing.

    ```mlir
    event.trace_begin %counters[%record] task(%task) tile(%i, %j) : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$record,
                       Index:$task, Variadic<Index>:$tile);
  let assemblyFormat = [{
    $counters `[` $record `]` `task` `(` $task `)` `tile` `(` $tile `)` attr-dict `:` type($counters)
  }];
  let hasVerifier = 1;
}

def Event_TraceEndOp : Event_Op<"trace_end"> {
  let summary = "Ends the trace record of a tile task";
  let description = [{
    Writes the end time into the trace record at word `record` of the
    counter buffer, once every lane has finished the tile (on the GPU, after
    a barrier). The schedulers emit it before the tile's notifies when
    tracing.

    ```mlir
    event.trace_end %counters[%record] : memref<?xi32>
    ```
  }];
  let arguments = (ins MemRefRankOf<[I32], [1]>:$counters, Index:$record);
  let assemblyFormat = "$counters `[` $record `]` attr-dict `:` type($counters)";
}

#endif // ETC_EVENT_OPS_TD
