"""Top-k: the k largest values of each row and their column indices.

Tasks: one tile task per block of rows; each reads its rows whole and
writes the values and the i32 indices of its rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset
from .variants import RowKernel, RowSelectGPU

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


def select_next(kernel: TileKernel, n: ir.Value, value_at, previous: tuple,
                start: ir.Value | None = None, step: ir.Value | None = None) -> tuple:
    """The next pick of a descending top-k over positions [start, n) by
    `step` (default: all of [0, n)): the first value after `previous` =
    (value, position) in the order `ranks_above`, then lower position.
    Returns (value, position, found). Comparisons are strict, so the first
    position wins among equals."""
    prev_value, prev_position = previous
    i1 = ir.IntegerType.get_signless(1)
    init = [kernel.cf32(float("-inf")), kernel.cidx(0), arith.constant(i1, 0)]
    loop = scf.ForOp(start if start is not None else kernel.cidx(0), n,
                     step if step is not None else kernel.cidx(1), init)
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
    return tuple(loop.results)


def first_pick(kernel: TileKernel) -> tuple:
    """The `previous` of the first pick: after (NaN, -1), the top of the
    order at a position before every other, comes everything."""
    return kernel.cf32(float("nan")), arith.constant(kernel.index, -1)


class TopK(RowKernel):
    """One row per lane iteration: k selection passes over the row."""

    def emit_row(self, x, row: ir.Value, n: ir.Value) -> None:
        op = self.op
        values, indices = op.result, op.extra_results[0]
        picks = scf.ForOp(self.cidx(0), self.cidx(op.params["k"]), self.cidx(1),
                          list(first_pick(self)))
        with ir.InsertionPoint(picks.body):
            j = picks.induction_variable
            value, position, _ = select_next(
                self, n, lambda c: self.load(x, [row, c]), tuple(picks.inner_iter_args))
            self.store(value, values, [row, j])
            self.store_index(position, indices, [row, j])
            scf.yield_([value, position])


class TopKGPU(RowSelectGPU, TopK):
    """A warp per row: each pick scans the row with the warp's lanes taking
    positions l, l + 32, ..., and the warp agrees on the winner with three
    shuffle reductions: whether any lane holds a NaN candidate, the largest
    candidate value, then the lowest position holding it (positions as f32,
    exact below 2**24). Lane 0 stores the pick; the next pick reads it back
    after a CTA barrier, so every lane continues from the same previous pick
    (on the GPU and with simulated lanes alike). The order is `ranks_above`:
    NaN first, then larger values, ties by lower position."""

    def emit(self) -> None:
        op = self.op
        x, values, indices = op.operands[0], op.result, op.extra_results[0]
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        n = x.shape[1]
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        rounds = arith.divui(arith.addi(rows, self.cidx(warps - 1)), self.cidx(warps))
        loop = scf.ForOp(self.cidx(0), rounds, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            base = arith.addi(row0, arith.muli(loop.induction_variable, self.cidx(warps)))

            def row_of(lane):
                # A warp without a row of its own this round recomputes the
                # tile's last row and stores nothing.
                row = arith.addi(base, arith.divui(lane, self.cidx(lanes.warp)))
                end = arith.addi(row0, rows)
                live = arith.cmpi(arith.CmpIPredicate.ult, row, end)
                return arith.minsi(row, arith.subi(end, self.cidx(1))), live

            def to_f32(flag):
                return arith.select(flag, self.cf32(1.0), self.cf32(0.0))

            picks = scf.ForOp(self.cidx(0), self.cidx(op.params["k"]), self.cidx(1))
            with ir.InsertionPoint(picks.body):
                j = picks.induction_variable

                def scan(lane):
                    row, _ = row_of(lane)
                    first = arith.cmpi(arith.CmpIPredicate.eq, j, self.cidx(0))
                    before = arith.maxsi(arith.subi(j, self.cidx(1)), self.cidx(0))
                    stored_value = self.load(values, [row, before])
                    stored_position = self.load_index(indices, [row, before])
                    start_value, start_position = first_pick(self)
                    previous = (arith.select(first, start_value, stored_value),
                                arith.select(first, start_position, stored_position))
                    # This lane's positions: l, l + 32, ... of the row.
                    value, position, found = select_next(
                        self, self.cidx(n), lambda p: self.load(x, [row, p]), previous,
                        start=arith.remui(lane, self.cidx(lanes.warp)),
                        step=self.cidx(lanes.warp))
                    is_nan = arith.andi(found, arith.cmpf(arith.CmpFPredicate.UNO, value, value))
                    position_f = arith.uitofp(self.f32, arith.index_cast(
                        ir.IntegerType.get_signless(32), position))
                    return [value, position_f, to_f32(found), to_f32(is_nan)]

                candidates = lanes.each(scan)

                def nan_flag(lane):
                    return [lanes.get(candidates, lane)[3]]
                any_nan = lanes.reduce(lanes.each(nan_flag), "maxnumf", lanes.warp)

                def value_key(lane):
                    value, _, found, _ = lanes.get(candidates, lane)
                    real = arith.andi(
                        arith.cmpf(arith.CmpFPredicate.OGT, found, self.cf32(0.0)),
                        arith.cmpf(arith.CmpFPredicate.ORD, value, value))
                    return [arith.select(real, value, self.cf32(float("-inf")))]
                best = lanes.reduce(lanes.each(value_key), "maxnumf", lanes.warp)

                def winner(lane):
                    value, position_f, found, is_nan = lanes.get(candidates, lane)
                    nan_round = arith.cmpf(arith.CmpFPredicate.OGT, lanes.get(any_nan, lane)[0],
                                           self.cf32(0.0))
                    matches = arith.select(
                        nan_round, arith.cmpf(arith.CmpFPredicate.OGT, is_nan, self.cf32(0.0)),
                        arith.cmpf(arith.CmpFPredicate.OEQ, value, lanes.get(best, lane)[0]))
                    wins = arith.andi(arith.cmpf(arith.CmpFPredicate.OGT, found, self.cf32(0.0)),
                                      matches)
                    return [arith.select(wins, arith.negf(position_f), self.cf32(float("-inf")))]
                lowest = lanes.reduce(lanes.each(winner), "maxnumf", lanes.warp)

                def store(lane):
                    row, live = row_of(lane)
                    leader = arith.cmpi(arith.CmpIPredicate.eq,
                                        arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                    branch = scf.IfOp(arith.andi(live, leader))
                    with ir.InsertionPoint(branch.then_block):
                        nan_round = arith.cmpf(arith.CmpFPredicate.OGT,
                                               lanes.get(any_nan, lane)[0], self.cf32(0.0))
                        value = arith.select(nan_round, self.cf32(float("nan")),
                                             lanes.get(best, lane)[0])
                        position = arith.index_cast(self.index, arith.fptoui(
                            ir.IntegerType.get_signless(32),
                            arith.negf(lanes.get(lowest, lane)[0])))
                        # The NaN itself (its payload) is the row's element.
                        value = arith.select(nan_round, self.load(x, [row, position]), value)
                        self.store(value, values, [row, j])
                        self.store_index(position, indices, [row, j])
                        scf.yield_([])
                lanes.each(store)
                # The next pick reads this one back.
                lanes.barrier()
                scf.yield_([])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    kernel = TopKGPU if TopKGPU.applies(op, b.target) else TopK
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], [(x, rows)],
                [(op.result, rows), (op.extra_results[0], rows)], kernel)
