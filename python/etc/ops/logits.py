"""Changing logits before the choice of a token: `adjust_logits`, the
penalties and biases of each request as a few entries of its row.

    adjust_logits: out = x, then for each entry j of row r with
                   0 <= t = tokens[r, j] < V:
                   out[r, t] = (x[r, t] / s if x[r, t] > 0 else x[r, t] * s) + add[r, j]
                   (s = scale[r, j])

as `etc.reference_sampling.adjust_logits` defines it. Tasks: one per row;
each copies its row, then changes its entries (the lanes of a GPU tile
share both phases, a barrier between them).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("adjust_logits",)


class AdjustLogits(TileKernel):
    """`adjust_logits`, a row per tile: the row copied, then its entries
    changed. On the GPU (simulated lanes too) the CTA's lanes share both
    phases, a barrier between them."""

    def emit(self) -> None:
        op = self.op
        x, tokens, add, scale = op.operands[:4]
        mask = op.operands[4] if len(op.operands) > 4 else None
        out = op.result
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n, entries = self.dim(x, 1), self.dim(tokens, 1)
        lanes = self.lanes() if self.target.gpu_kernels else None

        def spread(count, body):
            """body(i) for i in [0, count), by the lanes when there are."""
            if lanes is None:
                self.for_each_col(count, body)
                return

            def per_lane(lane):
                loop = scf.ForOp(lane, count, self.cidx(lanes.count))
                with ir.InsertionPoint(loop.body):
                    body(loop.induction_variable)
                    scf.yield_([])
            lanes.each(per_lane)
            lanes.barrier()

        loop = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            i1 = ir.IntegerType.get_signless(1)
            if mask is None:
                masked = arith.constant(i1, 0)
            else:
                masked = arith.cmpi(arith.CmpIPredicate.ne, self.load(op.operands[5], [row]),
                                    arith.constant(ir.IntegerType.get_signless(32), 0))

            def kept(c, v):
                """v at column c after the row's mask (if it has one)."""
                if mask is None:
                    return v
                i32 = ir.IntegerType.get_signless(32)
                word = self.load(mask, [row, arith.shrui(c, self.cidx(5))])
                shift = arith.index_cast(i32, arith.andi(c, self.cidx(31)))
                bit = arith.andi(arith.shrui(word, shift), arith.constant(i32, 1))
                allowed = arith.cmpi(arith.CmpIPredicate.ne, bit, arith.constant(i32, 0))
                lowest = self.cf32(-3.4028234663852886e38)
                value = arith.select(allowed, arith.maximumf(v, lowest),
                                     self.cf32(float("-inf")))
                return arith.select(masked, value, v)

            copy = lambda c: self.store(self.load(x, [row, c]), out, [row, c])
            if mask is None:
                spread(n, copy)
            else:
                # A row without a mask is copied as if there were none: an
                # unconstrained request pays nothing for its neighbours'
                # masks (a select per column was 4x the copy of a 151,936
                # row on the CPU).
                branch = scf.IfOp(masked, has_else=True)
                with ir.InsertionPoint(branch.then_block):
                    spread(n, lambda c: self.store(kept(c, self.load(x, [row, c])), out,
                                                   [row, c]))
                    scf.yield_([])
                with ir.InsertionPoint(branch.else_block):
                    spread(n, copy)
                    scf.yield_([])

            def entry(j):
                token = self.load_index(tokens, [row, j])
                inside = arith.andi(arith.cmpi(arith.CmpIPredicate.sge, token, self.cidx(0)),
                                    arith.cmpi(arith.CmpIPredicate.slt, token, n))
                branch = scf.IfOp(inside)
                with ir.InsertionPoint(branch.then_block):
                    v = self.load(x, [row, token])
                    s = self.load(scale, [row, j])
                    positive = arith.cmpf(arith.CmpFPredicate.OGT, v, self.cf32(0.0))
                    scaled = arith.select(positive, arith.divf(v, s), arith.mulf(v, s))
                    self.store(kept(token, arith.addf(scaled, self.load(add, [row, j]))), out,
                               [row, token])
                    scf.yield_([])
            spread(entries, entry)
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    whole = box(1, [tile_offset(0, tm), "0"], [tm, None])
    rows = box(1, [tile_offset(0, tm)], [tm])
    reads = [(t, whole if t.rank == 2 else rows) for t in op.operands]
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, [(op.result, whole)],
                AdjustLogits)
