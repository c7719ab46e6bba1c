"""Matrix multiplication: C = A @ B, or A @ B^T with `transpose_b`.

Tasks: one tile task per (row block, column block) of C; each reads the row
block of A (all of K) and the column block of B (all of K).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("matmul",)


class Matmul(TileKernel):
    """One output element per lane iteration, with a serial K loop."""

    grid_rank = 2

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands
        transpose_b = op.params["transpose_b"]
        offsets, extents, count = self.tile_elements(out, op.tile)
        k_extent = self.dim(a, 1)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            row, col = self.element_coords(loop.induction_variable, offsets, extents)
            kloop = scf.ForOp(self.cidx(0), k_extent, self.cidx(1), [self.cf32(0.0)])
            with ir.InsertionPoint(kloop.body):
                k = kloop.induction_variable
                av = self.load(a, [row, k])
                bv = self.load(b, [col, k] if transpose_b else [k, col])
                acc = arith.addf(kloop.inner_iter_args[0], arith.mulf(av, bv))
                scf.yield_([acc])
            self.store(kloop.results[0], out, [row, col])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    a, w = op.operands
    res = op.result
    tm, tn = op.tile
    reads = [(a, box(2, [tile_offset(0, tm), "0"], [tm, None]))]
    if op.params["transpose_b"]:
        reads.append((w, box(2, [tile_offset(1, tn), "0"], [tn, None])))
    else:
        reads.append((w, box(2, ["0", tile_offset(1, tn)], [None, tn])))
    writes = [(res, box(2, [tile_offset(0, tm), tile_offset(1, tn)], [tm, tn]))]
    grid = [b.grid_extent(res.shape[0], tm), b.grid_extent(res.shape[1], tn)]
    b.emit_task(op, op.name, grid, reads, writes, Matmul)
