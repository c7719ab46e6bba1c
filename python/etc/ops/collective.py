"""Collectives over the ranks of a graph that runs on several devices: their
tasks and tile kernel (the `Graph` methods are in `etc.graph_collective`).

A graph made with `etc.Graph(name, ranks=N)` runs on N ranks at once, each
its own copy of the graph on its own inputs (SPMD). The collectives move
tiles between the ranks inside the one persistent program, so that their
communication overlaps the computation around them tile by tile:

* `all_gather(x)`: x (m, K) on every rank; the result (N m, K) holds rank
  r's x in rows [r m, (r + 1) m) on every rank. A *send* task (grid: row
  blocks of x, destination ranks) puts each row block of x into every
  rank's copy of the result, a symmetric buffer, and notifies that rank's
  copy of a symmetric event with one element per row block of the result.
  A task that reads the result in row blocks waits on the element of its
  block (`arrival_waits`): `matmul(all_gather(x), w)` starts on rows that
  have arrived while the others are still in flight.
* `reduce_scatter(y)`: y (M, N) partial sums on every rank; rank r gets
  rows [r M/R, (r + 1) M/R) of their sum. The send task puts each tile of
  y, as soon as its producer has written it, into the staging slot of this
  rank in the owner's symmetric staging buffer (R, M/R, N); the reduce
  task of the owner waits on the tile's symmetric event (count R: one
  notify per rank) and adds the R slots in rank order.
* `all_reduce(y)`: y (M, N) on every rank, M may be symbolic; every rank
  gets the sum. Each tile goes to every rank's staging buffer (R, M, N);
  each rank adds the R slots of a tile in rank order, so every rank
  computes the same bits.

Sends are tasks whose body is an `event.put` (`event.rank_id` names the
sending rank) rather than a tile function: the transport the put needs is
reached from the scheduled worker. The symmetric buffers are declared by
the front end, since no footprint says which rank a tile writes; dependency
inference orders the sends after the producers of what they read, like any
task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, memref, scf

from ..dialects import event
from .base import TaskBuilder, TileKernel, box, index_map

if TYPE_CHECKING:
    from ..graph_values import Operation

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


# ----------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------


def _event(b: TaskBuilder, sizes: list, count: int) -> ir.Value:
    """A symmetric event tensor with one dimension per entry of `sizes`
    (ints, or grid extents for `?`) expecting `count` notifies per element."""
    static = []
    dynamic = []
    for size in sizes:
        if isinstance(size, int):
            static.append(str(size))
        else:
            static.append("?")
            dynamic.append(size)
    shape = "x".join(static)
    text = f"!event.tensor<{shape}, symmetric>" if static else "!event.tensor<symmetric>"
    counted = arith.constant(ir.IndexType.get(), count)
    return event.AllocOp(ir.Type.parse(text), dynamic, count=counted).result


def _send_task(b, op: "Operation", name: str, grid: list, reads: list, notifies: list,
               put) -> None:
    """A task whose tiles put a box of a local buffer into a rank's
    symmetric buffer: `put(tile_indices, index_constant)` emits the body."""
    index = ir.IndexType.get()
    task = event.TaskOp(
        name, grid, [b.buffers[id(t)] for t, _ in reads], [], [], [e for e, _ in notifies], [],
        ir.ArrayAttr.get([fp for _, fp in reads]), ir.ArrayAttr.get([]), ir.ArrayAttr.get([]),
        ir.ArrayAttr.get([m for _, m in notifies]))
    names = ["i", "j", "k"][:len(grid)]
    body = task.body.blocks.append(*([index] * len(grid)),
                                   arg_locs=[ir.Location.name(n) for n in names])
    with ir.InsertionPoint(body):
        put(list(body.arguments), lambda v: arith.constant(index, v))
        event.YieldOp()


def _clipped(extent: ir.Value, offset: ir.Value, tile: int, cidx) -> ir.Value:
    """min(tile, extent - offset)."""
    return arith.minsi(cidx(tile), arith.subi(extent, offset))


def build_tasks(b: TaskBuilder, op: "Operation") -> None:
    {"all_gather": _all_gather, "reduce_scatter": _reduce_scatter,
     "all_reduce": _all_reduce}[op.kind](b, op)


def _all_gather(b, op) -> None:
    (x,), gathered = op.operands, op.result
    ranks = op.params["ranks"]
    rows = x.shape[0]
    tile = op.tile[0]
    blocks = rows // tile
    arrived = _event(b, [ranks * blocks], 1)
    grid = [b.grid_extent(rows, tile), b.grid_extent(ranks, 1)]
    reads = [(x, box(2, [f"d0 * {tile}", "0"], [tile, None]))]
    notifies = [(arrived, index_map(f"(d0, d1)[s0] -> (d1, s0 * {blocks} + d0)"))]

    def put(tile_index, cidx):
        i, p = tile_index
        source = b.buffers[id(x)]
        me = event.rank_id()
        first = arith.muli(i, cidx(tile))
        at = arith.addi(arith.muli(me, cidx(rows)), first)
        cols = memref.dim(source, cidx(1))
        event.put(source, [first, cidx(0)], [cidx(tile), cols], b.buffers[id(gathered)],
                  [at, cidx(0)], p)

    _send_task(b, op, op.name, grid, reads, notifies, put)
    # Readers of the gathered rows wait for their block (see arrival_waits).
    b.events[("arrival", id(gathered))] = (arrived, tile, op.name)


def _reduce_task(b, op, staging, arrived) -> None:
    """The reduce task: tile (i, j) of the result is the sum, in rank
    order, of the R slots of the staging buffer, once every rank's tile has
    arrived."""
    result = op.result
    tm, tn = op.tile
    grid = [b.grid_extent(result.shape[0], tm), b.grid_extent(result.shape[1], tn)]
    own = box(2, [f"d0 * {tm}", f"d1 * {tn}"], [tm, tn])
    reads = [(staging, box(2, ["0", f"d0 * {tm}", f"d1 * {tn}"], [None, tm, tn]))]
    b.emit_task(op, f"{op.name}_reduce", grid, reads, [(result, own)], SumSlots,
                waits=[(arrived, index_map("(d0, d1) -> (d0, d1)"))])


def _reduce_scatter(b, op) -> None:
    (y,) = op.operands
    staging = op.buffers["staging"]
    ranks = op.params["ranks"]
    tm, tn = op.tile
    local = op.result.shape[0]
    local_blocks = local // tm
    cols = y.shape[1]
    col_blocks = -(-cols // tn) if isinstance(cols, int) else b.grid_extent(cols, tn)
    arrived = _event(b, [local_blocks, col_blocks], ranks)
    grid = [b.grid_extent(y.shape[0], tm), b.grid_extent(cols, tn)]
    reads = [(y, box(2, [f"d0 * {tm}", f"d1 * {tn}"], [tm, tn]))]
    notifies = [(arrived, index_map(
        f"(d0, d1)[s0] -> (d0 floordiv {local_blocks}, d0 mod {local_blocks}, d1)"))]

    def put(tile_index, cidx):
        i, j = tile_index
        source = b.buffers[id(y)]
        me = event.rank_id()
        owner = arith.divui(i, cidx(local_blocks))
        block = arith.remui(i, cidx(local_blocks))
        first_col = arith.muli(j, cidx(tn))
        width = _clipped(memref.dim(source, cidx(1)), first_col, tn, cidx)
        event.put(source, [arith.muli(i, cidx(tm)), first_col], [cidx(tm), width],
                  b.buffers[id(staging)], [me, arith.muli(block, cidx(tm)), first_col], owner)

    _send_task(b, op, f"{op.name}_send", grid, reads, notifies, put)
    _reduce_task(b, op, staging, arrived)


def _all_reduce(b, op) -> None:
    (y,) = op.operands
    staging = op.buffers["staging"]
    ranks = op.params["ranks"]
    tm, tn = op.tile
    rows, cols = y.shape
    sizes = [-(-d // t) if isinstance(d, int) else b.grid_extent(d, t)
             for d, t in ((rows, tm), (cols, tn))]
    arrived = _event(b, sizes, ranks)
    grid = [b.grid_extent(rows, tm), b.grid_extent(cols, tn), b.grid_extent(ranks, 1)]
    reads = [(y, box(3, [f"d0 * {tm}", f"d1 * {tn}"], [tm, tn]))]
    notifies = [(arrived, index_map("(d0, d1, d2)[s0] -> (d2, d0, d1)"))]

    def put(tile_index, cidx):
        i, j, p = tile_index
        source = b.buffers[id(y)]
        me = event.rank_id()
        first_row = arith.muli(i, cidx(tm))
        first_col = arith.muli(j, cidx(tn))
        height = _clipped(memref.dim(source, cidx(0)), first_row, tm, cidx)
        width = _clipped(memref.dim(source, cidx(1)), first_col, tn, cidx)
        event.put(source, [first_row, first_col], [height, width], b.buffers[id(staging)],
                  [me, first_row, first_col], p)

    _send_task(b, op, f"{op.name}_send", grid, reads, notifies, put)
    _reduce_task(b, op, staging, arrived)


def arrival_waits(b, reads: list) -> list:
    """The waits a task reading the result of an `all_gather` needs: for a
    read of its rows in blocks of the gather's rows (`d<k> * T` with size
    T), the arrival event's element of the block. Other reads of it are an
    error naming the reader."""
    waits = []
    for t, footprint in reads:
        found = b.events.get(("arrival", id(t)))
        if found is None:
            continue
        arrived, tile, sender = found
        footprint_attr = str(footprint)
        spec = footprint_attr[footprint_attr.index("<") + 1:footprint_attr.rindex(">")]
        domain, rest = spec.split("->", 1)
        offsets, sizes = rest.rsplit("[", 1)
        first_offset = offsets.strip().strip("()").split(",")[0].strip()
        first_size = sizes.strip("] ").split(",")[0].strip()
        parts = [p.strip() for p in first_offset.split("*")]
        if (len(parts) == 2 and parts[0].startswith("d") and parts[1] == str(tile)
                and first_size == str(tile)):
            waits.append((arrived, index_map(f"{domain.strip()} -> ({parts[0]})")))
            continue
        raise ValueError(f"a task reads '{t.name}', the result of {sender}, with footprint "
                         f"{footprint_attr}; readers of a gathered tensor must read it in row "
                         f"blocks of the {tile} rows each rank sends (e.g. tile=({tile}, ...))")
    return waits


# ----------------------------------------------------------------------
# Tile kernel
# ----------------------------------------------------------------------


class SumSlots(TileKernel):
    """Tile (i, j) of the result: the sum over the staging buffer's slots
    (one per rank), in slot order, accumulated in f32."""

    grid_rank = 2

    @classmethod
    def tensors(cls, op) -> list:
        return [op.buffers["staging"], op.result]

    @classmethod
    def name(cls, op) -> str:
        return "sum_slots"

    def emit(self) -> None:
        op, out = self.op, self.op.result
        staging = op.buffers["staging"]
        slots = staging.shape[0]
        offsets, extents, count = self.tile_elements(out, op.tile)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            row, col = self.element_coords(loop.induction_variable, offsets, extents)
            total = self.load(staging, [self.cidx(0), row, col])
            for slot in range(1, slots):
                total = arith.addf(total, self.load(staging, [self.cidx(slot), row, col]))
            self.store(total, out, [row, col])
            scf.yield_([])
