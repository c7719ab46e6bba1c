"""Top-k: the k largest values of each row and their column indices.

Tasks: one tile task per block of rows; each reads its rows whole and
writes the values and the i32 indices of its rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("topk",)


def ranks_above(a: ir.Value, b: ir.Value) -> ir.Value:
    """Whether value `a` comes before value `b` in top-k order: NaN above
    every number (+inf included), then larger numbers first. The order of
    `etc.reference.topk`; plain comparisons are false for NaN, which would
    make NaN rows pick -inf and the same position twice."""
    a_nan = arith.cmpf(arith.CmpFPredicate.UNO, a, a)
    b_number = arith.cmpf(arith.CmpFPredicate.ORD, b, b)
    return arith.ori(arith.andi(a_nan, b_number), arith.cmpf(arith.CmpFPredicate.OGT, a, b))


def ranks_equal(a: ir.Value, b: ir.Value) -> ir.Value:
    """Whether values `a` and `b` tie in top-k order (two NaNs tie)."""
    both_nan = arith.andi(arith.cmpf(arith.CmpFPredicate.UNO, a, a),
                          arith.cmpf(arith.CmpFPredicate.UNO, b, b))
    return arith.ori(arith.cmpf(arith.CmpFPredicate.OEQ, a, b), both_nan)


def select_next(kernel: TileKernel, n: ir.Value, value_at, previous: tuple) -> tuple:
    """The next pick of a descending top-k over positions [0, n): the first
    value after `previous` = (value, position) in the order `ranks_above`,
    then lower position. Returns (value, position). Comparisons are strict,
    so the first position wins among equals."""
    prev_value, prev_position = previous
    i1 = ir.IntegerType.get_signless(1)
    init = [kernel.cf32(float("-inf")), kernel.cidx(0), arith.constant(i1, 0)]
    loop = scf.ForOp(kernel.cidx(0), n, kernel.cidx(1), init)
    with ir.InsertionPoint(loop.body):
        position = loop.induction_variable
        best_value, best_position, found = loop.inner_iter_args
        v = value_at(position)
        after = arith.ori(
            ranks_above(prev_value, v),
            arith.andi(ranks_equal(v, prev_value),
                       arith.cmpi(arith.CmpIPredicate.sgt, position, prev_position)))
        not_found = arith.xori(found, arith.constant(i1, 1))
        better = arith.ori(not_found, ranks_above(v, best_value))
        take = arith.andi(after, better)
        scf.yield_([arith.select(take, v, best_value),
                    arith.select(take, position, best_position),
                    arith.ori(found, take)])
    return loop.results[0], loop.results[1]


def first_pick(kernel: TileKernel) -> tuple:
    """The `previous` of the first pick: after (NaN, -1), the top of the
    order at a position before every other, comes everything."""
    return kernel.cf32(float("nan")), arith.constant(kernel.index, -1)


class TopK(TileKernel):
    """One row per lane iteration: k selection passes over the row."""

    grid_rank = 1

    def emit(self) -> None:
        op = self.op
        x, values, indices = op.operands[0], op.result, op.extra_results[0]
        (tm,) = op.tile
        row0 = arith.muli(self.ti[0], self.cidx(tm))
        rows = self.extent(x, 0, row0, tm)
        n = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            picks = scf.ForOp(self.cidx(0), self.cidx(op.params["k"]), self.cidx(1),
                              list(first_pick(self)))
            with ir.InsertionPoint(picks.body):
                j = picks.induction_variable
                value, position = select_next(
                    self, n, lambda c: self.load(x, [row, c]), tuple(picks.inner_iter_args))
                self.store(value, values, [row, j])
                self.store_index(position, indices, [row, j])
                scf.yield_([value, position])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], [(x, rows)],
                [(op.result, rows), (op.extra_results[0], rows)], TopK)
