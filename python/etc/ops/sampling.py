"""Greedy sampling: the index of the largest value of each row.

    out[m] = the first n with x[m, n] maximal (NaN above every number)

as `etc.reference.argmax` (and `topk` with k = 1) orders values.

Tasks: one tile task per block of rows; each reads its rows whole and
writes one i32 per row.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("argmax",)


class Argmax(TileKernel):
    """One row per lane iteration, scanned in order: a later value replaces
    the best only when it ranks strictly above it (so the first of equal
    values wins), NaN ranking above every number."""

    grid_rank = 1

    def emit(self) -> None:
        op = self.op
        x, out = op.operands[0], op.result
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            scan = scf.ForOp(self.cidx(0), n, self.cidx(1),
                             [self.cf32(float("-inf")), self.cidx(0), self.cidx(0)])
            with ir.InsertionPoint(scan.body):
                column = scan.induction_variable
                best, best_column, seen = scan.inner_iter_args
                v = self.load(x, [row, column])
                # v ranks above best: v is NaN and best is not, or v > best.
                v_nan = arith.cmpf(arith.CmpFPredicate.UNO, v, v)
                best_number = arith.cmpf(arith.CmpFPredicate.ORD, best, best)
                above = arith.ori(arith.andi(v_nan, best_number),
                                  arith.cmpf(arith.CmpFPredicate.OGT, v, best))
                # The first column is taken whatever it holds (-inf included).
                first = arith.cmpi(arith.CmpIPredicate.eq, seen, self.cidx(0))
                take = arith.ori(first, above)
                scf.yield_([arith.select(take, v, best), arith.select(take, column, best_column),
                            self.cidx(1)])
            self.store_index(scan.results[1], out, [row])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)],
                [(x, box(1, [tile_offset(0, tm), "0"], [tm, None]))],
                [(op.result, box(1, [tile_offset(0, tm)], [tm]))], Argmax)
