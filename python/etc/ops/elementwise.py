"""Elementwise operators: add, mul (with a 1-D operand broadcast over rows),
silu, gelu, exp and scale.

Tasks: one tile task per output tile (1-D or 2-D); each reads the same tile
of every operand of the result's rank, and the column block of a broadcast
1-D operand.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

UNARY = ("silu", "gelu", "exp", "scale")
BINARY = ("add", "mul")
KINDS = UNARY + BINARY


class Elementwise(TileKernel):
    """out[e] = f(operands[e]) for the elements e of one tile, spread over
    the lanes."""

    def emit(self) -> None:
        op, out = self.op, self.op.result
        offsets, extents, count = self.tile_elements(out, op.tile)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            pos = self.element_coords(loop.induction_variable, offsets, extents)
            vals = [self.load(t, pos if t.rank == out.rank else pos[-1:]) for t in op.operands]
            if op.kind == "add":
                r = arith.addf(vals[0], vals[1])
            elif op.kind == "mul":
                r = arith.mulf(vals[0], vals[1])
            else:
                r = self.unary(op.kind, vals[0], op.params.get("c"))
            self.store(r, out, pos)
            scf.yield_([])


class Elementwise1D(Elementwise):
    grid_rank = 1


class Elementwise2D(Elementwise):
    grid_rank = 2


def build_tasks(b: TaskBuilder, op) -> None:
    res = op.result
    rank = res.rank
    offsets = [tile_offset(d, t) for d, t in enumerate(op.tile)]
    own = box(rank, offsets, list(op.tile))
    # A 1-D operand broadcast over rows: its column block.
    reads = [(t, own if t.rank == rank else box(rank, [offsets[-1]], [op.tile[-1]]))
             for t in op.operands]
    grid = [b.grid_extent(d, t) for d, t in zip(res.shape, op.tile)]
    kernel = Elementwise2D if rank == 2 else Elementwise1D
    b.emit_task(op, op.name, grid, reads, [(res, own)], kernel)
