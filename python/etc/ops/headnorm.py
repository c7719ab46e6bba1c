"""Per-head RMSNorm (Qwen3's `q_norm` and `k_norm`; Gemma 3's, whose
weight is used as offset + w, offset 1).

x is (T, n * D): n heads of `head_dim` = D columns per row. Each head of
each row is normalised on its own with the shared weight (D,):

    out[t, h D + d] = x[t, h D + d] / sqrt(mean over d' of x[t, h D + d']^2 + eps) * w[d]

Tasks: one tile task per block of rows; each reads its rows and all of the
weight, and writes its rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("head_rmsnorm",)


class HeadRMSNorm(TileKernel):
    """One (row, head) per lane iteration: the sum of squares over the head,
    then the head's D outputs."""

    grid_rank = 1

    def emit(self) -> None:
        op = self.op
        x, weight = op.operands
        out = op.result
        head_dim = op.params["head_dim"]
        heads = x.shape[1] // head_dim
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        loop = self.lane_loop(arith.muli(rows, self.cidx(heads)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, self.cidx(heads)))
            base = arith.muli(arith.remui(e, self.cidx(heads)), self.cidx(head_dim))

            def square(acc, d):
                v = self.load(x, [row, arith.addi(base, d)])
                return arith.addf(acc, arith.mulf(v, v))
            ss = self.reduce_row(self.cidx(head_dim), self.cf32(0.0), square)
            mean = arith.divf(ss, self.cf32(float(head_dim)))
            inv = math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"])))

            def write(d):
                column = arith.addi(base, d)
                v = arith.mulf(self.load(x, [row, column]), inv)
                w = self.load(weight, [d])
                if "offset" in op.params:
                    w = arith.addf(self.cf32(op.params["offset"]), w)
                self.store(arith.mulf(v, w), out, [row, column])
            self.for_each_col(self.cidx(head_dim), write)
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x, weight = op.operands
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)],
                [(x, rows), (weight, whole(1, weight))], [(op.result, rows)], HeadRMSNorm)
