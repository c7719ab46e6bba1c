"""Per-head RMSNorm (Qwen3's `q_norm` and `k_norm`; Gemma 3's, whose
weight is used as offset + w, offset 1) and per-head LayerNorm (Command
R+'s q and k norms, a weight for every head).

x is (T, n * D): n heads of `head_dim` = D columns per row. Each head of
each row is normalised on its own, RMSNorm with the shared weight (D,):

    out[t, h D + d] = x[t, h D + d] / sqrt(mean over d' of x[t, h D + d']^2 + eps) * w[d]

LayerNorm with each head's own weight (n * D,), its statistics in two
passes (the mean, then the mean of the squared deviations: ops/rowwise.py):

    out[t, h D + d] = (x[t, h D + d] - m) / sqrt(var + eps) * w[h D + d]

Tasks: one tile task per block of rows; each reads its rows and all of the
weight, and writes its rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("head_rmsnorm", "head_layernorm")


class HeadRMSNorm(TileKernel):
    """One (row, head) per lane iteration: the head's statistics, then its D
    outputs (RMSNorm, or LayerNorm for `head_layernorm`)."""

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
            if op.kind == "head_layernorm":
                self.layer_norm(x, weight, out, row, base, head_dim)
            else:
                self.rms_norm(x, weight, out, row, base, head_dim)
            scf.yield_([])

    def rms_norm(self, x, weight, out, row, base, head_dim: int) -> None:
        """One head's RMSNorm: its sum of squares, then its D outputs times
        the shared weight (plus its offset)."""
        op = self.op

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

    def layer_norm(self, x, weight, out, row, base, head_dim: int) -> None:
        """One head's LayerNorm: its mean, the mean of its squared
        deviations, then its D outputs times the head's own weights."""
        width = self.cidx(head_dim)
        n = self.cf32(float(head_dim))
        mean = arith.divf(self.reduce_row(width, self.cf32(0.0), lambda acc, d: arith.addf(
            acc, self.load(x, [row, arith.addi(base, d)]))), n)

        def centred_square(acc, d):
            v = arith.subf(self.load(x, [row, arith.addi(base, d)]), mean)
            return arith.addf(acc, arith.mulf(v, v))
        variance = arith.divf(self.reduce_row(width, self.cf32(0.0), centred_square), n)
        inv = math.rsqrt(arith.addf(variance, self.cf32(self.op.params["eps"])))

        def write(d):
            column = arith.addi(base, d)
            v = arith.mulf(arith.subf(self.load(x, [row, column]), mean), inv)
            self.store(arith.mulf(v, self.load(weight, [column])), out, [row, column])
        self.for_each_col(width, write)


def build_tasks(b: TaskBuilder, op) -> None:
    x, weight = op.operands
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)],
                [(x, rows), (weight, whole(1, weight))], [(op.result, rows)], HeadRMSNorm)
