"""Row-wise operators over the last dimension: rmsnorm, softmax and sum.

Tasks: one tile task per block of rows; each reads its rows whole (and all
of rmsnorm's weight) and writes its rows (one value per row for `sum`).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("rmsnorm", "softmax", "sum")


class Rowwise(TileKernel):
    """One row per lane iteration: a reduction over the row, then (softmax,
    rmsnorm) a second pass writing the row."""

    grid_rank = 1

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x = op.operands[0]
        (tm,) = op.tile
        row0 = arith.muli(self.ti[0], self.cidx(tm))
        rows = self.extent(x, 0, row0, tm)
        n = self.dim(x, 1)
        if op.kind == "rmsnorm":
            if isinstance(x.shape[1], int):
                n_f32 = self.cf32(float(x.shape[1]))
            else:
                n_f32 = arith.sitofp(self.f32, arith.index_cast(ir.IntegerType.get_signless(64), n))
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            if op.kind == "sum":
                total = self.reduce_row(
                    n, self.cf32(0.0),
                    lambda acc, k: arith.addf(acc, self.load(x, [row, k])))
                self.store(total, out, [row])
            elif op.kind == "softmax":
                mx = self.reduce_row(
                    n, self.cf32(float("-inf")),
                    lambda acc, k: arith.maxnumf(acc, self.load(x, [row, k])))
                denom = self.reduce_row(
                    n, self.cf32(0.0),
                    lambda acc, k: arith.addf(acc, math.exp(arith.subf(self.load(x, [row, k]), mx))))
                inv = arith.divf(self.cf32(1.0), denom)

                def write(k):
                    e = math.exp(arith.subf(self.load(x, [row, k]), mx))
                    self.store(arith.mulf(e, inv), out, [row, k])
                self.for_each_col(n, write)
            else:  # rmsnorm
                weight = op.operands[1]

                def square(acc, k):
                    v = self.load(x, [row, k])
                    return arith.addf(acc, arith.mulf(v, v))
                ss = self.reduce_row(n, self.cf32(0.0), square)
                mean = arith.divf(ss, n_f32)
                inv = math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"])))

                def write(k):
                    v = arith.mulf(self.load(x, [row, k]), inv)
                    self.store(arith.mulf(v, self.load(weight, [k])), out, [row, k])
                self.for_each_col(n, write)
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    reads = [(x, rows)]
    if op.kind == "rmsnorm":
        reads.append((op.operands[1], box(1, ["0"], [None])))
    if op.kind == "sum":
        writes = [(op.result, box(1, [tile_offset(0, tm)], [tm]))]
    else:
        writes = [(op.result, rows)]
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, writes, Rowwise)
