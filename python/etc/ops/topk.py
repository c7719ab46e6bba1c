"""Top-k: the k largest values of each row and their column indices; and
the searches for a row's largest value that top-k and sampling share
(`argmax_scan`, `vector_argmax`, `select_next`).

Tasks: one tile task per block of rows; each reads its rows whole and
writes the values and the i32 indices of its rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

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


def argmax_scan(kernel: TileKernel, value_at, start: ir.Value, end: ir.Value,
                step: ir.Value) -> tuple:
    """The best (value, position) of positions [start, end) by `step` in
    argmax order: a later value replaces the best only when it ranks
    strictly above it (so the first of equal values wins), NaN ranking above
    every number. Returns (value, position, found)."""
    i1 = ir.IntegerType.get_signless(1)
    scan = scf.ForOp(start, end, step,
                     [kernel.cf32(float("-inf")), kernel.cidx(0), arith.constant(i1, 0)])
    with ir.InsertionPoint(scan.body):
        column = scan.induction_variable
        best, best_column, seen = scan.inner_iter_args
        v = value_at(column)
        # v ranks above best: v is NaN and best is not, or v > best.
        v_nan = arith.cmpf(arith.CmpFPredicate.UNO, v, v)
        best_number = arith.cmpf(arith.CmpFPredicate.ORD, best, best)
        above = arith.ori(arith.andi(v_nan, best_number),
                          arith.cmpf(arith.CmpFPredicate.OGT, v, best))
        # The first position is taken whatever it holds (-inf included).
        take = arith.ori(arith.xori(seen, arith.constant(i1, 1)), above)
        scf.yield_([arith.select(take, v, best), arith.select(take, column, best_column),
                    arith.constant(i1, 1)])
    return tuple(scan.results)


def first_where(kernel: TileKernel, x, row: ir.Value, n: ir.Value, start: ir.Value, holds,
                width: int) -> ir.Value:
    """The first column of row `row` of x (n columns) from `start` whose
    value `holds` (a predicate written for scalars and vectors alike), or
    n: whole vectors of `width` columns while none of their lanes holds,
    then columns one by one from the vector that holds (or the tail).
    Stops where it finds one."""
    k = kernel
    i1 = ir.IntegerType.get_signless(1)

    def search(first_column, step: int, found):
        """`while column (+ step) fits and not found(column): column += step`."""
        loop = scf.WhileOp([k.index], [first_column])
        before = loop.before.blocks.append(k.index)
        with ir.InsertionPoint(before):
            (c,) = before.arguments
            fits = arith.cmpi(arith.CmpIPredicate.ule, arith.addi(c, k.cidx(step)), n)
            branch = scf.IfOp(fits, [i1], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.yield_([arith.xori(found(c), arith.constant(i1, 1))])
            with ir.InsertionPoint(branch.else_block):
                scf.yield_([arith.constant(i1, 0)])
            scf.condition(branch.results[0], [c])
        after = loop.after.blocks.append(k.index)
        with ir.InsertionPoint(after):
            scf.yield_([arith.addi(after.arguments[0], k.cidx(step))])
        return loop.results[0]

    any_lane = lambda c: vector.reduction(i1, ir.Attribute.parse("#vector.kind<or>"),
                                          holds(k.vload(x, [row, c], width)))
    vectors_end = search(start, width, any_lane)
    return search(vectors_end, 1, lambda c: holds(k.load(x, [row, c])))


def vector_argmax(kernel: TileKernel, x, row: ir.Value, n: ir.Value, m: ir.Value,
                  width: int) -> ir.Value:
    """The argmax of row `row` of x (n columns) whose largest number is
    `m` (-inf where it has none), in two searches of `first_where` that
    stop where they find: the first column holding NaN or m, and, where
    that is a number, the first NaN after it (which ranks above it). The
    column of `argmax_scan`: the first NaN if there is one, else the first
    value equal to m (the first -inf of a row of -inf, the first of -0 and
    +0 when m is a zero); column 0 for an empty row."""
    k = kernel
    i1 = ir.IntegerType.get_signless(1)
    is_nan = lambda v: arith.cmpf(arith.CmpFPredicate.UNO, v, v)
    like_m = lambda v: vector.broadcast(v.type, m) if isinstance(v.type, ir.VectorType) else m
    candidate = first_where(k, x, row, n, k.cidx(0), lambda v: arith.ori(
        is_nan(v), arith.cmpf(arith.CmpFPredicate.OEQ, v, like_m(v))), width)
    found = arith.cmpi(arith.CmpIPredicate.ult, candidate, n)
    # Whether the candidate is a number (then a NaN may follow it).
    number = scf.IfOp(found, [i1], has_else=True)
    with ir.InsertionPoint(number.then_block):
        v = k.load(x, [row, candidate])
        scf.yield_([arith.cmpf(arith.CmpFPredicate.ORD, v, v)])
    with ir.InsertionPoint(number.else_block):
        scf.yield_([arith.constant(i1, 0)])
    later = first_where(k, x, row, n,
                        arith.select(number.results[0], arith.addi(candidate, k.cidx(1)), n),
                        is_nan, width)
    best = arith.select(arith.cmpi(arith.CmpIPredicate.ult, later, n), later, candidate)
    return arith.select(found, best, k.cidx(0))


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
