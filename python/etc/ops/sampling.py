"""Choosing the next token: greedy (`argmax`) and sampled (`sample`).

    argmax: out[m] = the first n with x[m, n] maximal (NaN above every number)
    sample: out[m] = a draw from softmax(x[m] / T[m]) cut by top-k, top-p
            and min-p, or the argmax where T[m] = 0

as `etc.reference_llm.argmax` and `etc.reference_sampling.sample` define
them.

Tasks: one tile task per block of rows; each reads its rows whole (and
its rows' sampling parameters) and writes one i32 per row.

`sample` works without sorting the row, in passes over it (a pass is one
or a few reductions: maxima, counts, sums). The set top-k, top-p and min-p
keep is always "every logit at or above a threshold": top-k's threshold is
the k-th largest value, found by bisection on the float's bits (a pass
counts the logits at or above the candidate); top-p's by bisection too (a
pass sums the weights strictly above it), starting from top-k's; min-p is a
test of each weight. Each bisection pass also finds the nearest logits on
either side of the candidate, and the next step starts from them, so the
range skips keys no logit has: at most 32 passes, and 13 to 19 on
Gaussian logits of 49,152 and 151,936 values (for top-k 50 and top-p
0.9). Only rows that ask for top-k or top-p run them. The draw is one
uniform number from Philox-4x32-10 (`philox_uniform`), keyed by the row's
seed with the token's position as counter, and an inverse-CDF walk over
the kept weights in index order (on the CPU the weights 16 at a time,
added one by one from the vector in that order, and whole blocks skipped
while their last running sum stays at or below the target,
`etc.ops.draw.vector_draw`: the same column, about 0.1 ms a row of 128k
logits where the scalar draw took 0.4-0.7). A row costs 3 passes with
temperature alone, up to 35 with top-k, and up to 68 with both; greedy rows 2 (the
maximum, then the argmax scan; on the CPU two vector searches that stop
where they find, `etc.ops.topk.vector_argmax`: a scalar scan of 128k
logits took 0.6 ms a row, 50 times the vector passes at 16 rows).

Kernels: `Argmax`, a scalar scan (the portable kernel), and `ArgmaxCPU`,
the maximum and the searches over 16-wide vectors; `Sample`, a row per
lane iteration with sequential passes (the portable kernel), and
`SampleCPU`, the same with the reductions, the greedy searches and the
draw's weights over 16-wide vectors; `SampleGPU`, a CTA per row: every pass
spreads the row over the CTA's lanes (16-byte slices where the row is
whole slices) and combines their partial results with warp shuffles and
shared memory, and the walk splits the row into one contiguous segment
per lane, so that the order of the sum is still the index order.
"""

from __future__ import annotations

import struct
from typing import Sequence

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .draw import vector_draw
from .base import Lanes, LaneValues, TaskBuilder, TileKernel, box, tile_offset
from .topk import argmax_scan, select_next, vector_argmax
from .variants import RowKernel, RowSelectGPU

KINDS = ("argmax", "sample")

#: Philox-4x32's multipliers and key increments (as `etc.reference_sampling`).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
#: Bisection steps that narrow any range of 32-bit keys to one key.
BISECTION_STEPS = 32
#: The most reductions one pass makes (a bisection probe's).
MAX_REDUCTIONS = 3


class Argmax(RowKernel):
    """One row per lane iteration, scanned in order (`argmax_scan`)."""

    def emit_row(self, x, row: ir.Value, n: ir.Value) -> None:
        _, column, _ = argmax_scan(self, lambda c: self.load(x, [row, c]), self.cidx(0), n,
                                   self.cidx(1))
        self.store_index(column, self.op.result, [row])


class ArgmaxCPU(RowKernel):
    """A maximum over vectors, then `VectorRowPasses.argmax`'s searches."""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_cpu"

    def emit_row(self, x, row: ir.Value, n: ir.Value) -> None:
        passes = VectorRowPasses(self, x, row, n)
        (m,) = passes.fold(("maxnumf", float("-inf"), lambda v: v))
        self.store_index(passes.argmax(m), self.op.result, [row])


# ----------------------------------------------------------------------
# Passes over one row
# ----------------------------------------------------------------------


class RowPasses:
    """The passes `Sample.choose` makes over row `row` of x (n columns), one
    lane doing all of it: sequential loops in index order."""

    def __init__(self, kernel: TileKernel, x, row: ir.Value, n: ir.Value):
        self.k, self.x, self.row, self.n = kernel, x, row, n

    def load(self, column: ir.Value) -> ir.Value:
        return self.k.load(self.x, [self.row, column])

    def fold(self, *reductions) -> list:
        """One pass over the row: for each (kind, init, term) of
        `reductions`, the sum ("add") or maximum ("maxnumf") of
        `term(value)` (an f32, or an f32 vector for a vector of values)
        from `init`."""
        k = self.k
        loop = scf.ForOp(k.cidx(0), self.n, k.cidx(1), [k.cf32(r[1]) for r in reductions])
        with ir.InsertionPoint(loop.body):
            v = self.load(loop.induction_variable)
            scf.yield_(_step(reductions, loop.inner_iter_args, v))
        return list(loop.results)

    def argmax(self, m: ir.Value) -> ir.Value:
        """The row's argmax (`argmax_scan`); `m` is its largest number (a
        "maxnumf" fold), which this scan does not need."""
        k = self.k
        return argmax_scan(k, self.load, k.cidx(0), self.n, k.cidx(1))[1]

    def next_pick(self, previous: tuple) -> ir.Value:
        """The column of the next value of the row after `previous` (value,
        column) in top-k order (`etc.ops.topk.select_next`: NaN first, then
        larger values, then lower columns)."""
        return select_next(self.k, self.n, self.load, previous)[1]

    def store(self, write) -> None:
        """Runs `write()` (stores of values every lane holds) once."""
        write()

    def draw(self, weight_of, u: ir.Value) -> ir.Value:
        """The first column where the running sum of `weight_of(value)` in
        index order exceeds u times the row's total, among columns of
        positive weight (the last of those if rounding leaves none)."""
        k = self.k
        # The total in the walk's order (sequential), so the walk crosses
        # u * total.
        (total,) = RowPasses.fold(self, ("add", 0.0, weight_of))
        found, chosen, last = self.walk(weight_of, arith.mulf(u, total), k.cidx(0),
                                        k.cf32(0.0))
        return arith.select(found, chosen, last)

    def walk(self, weight_of, target: ir.Value, start: ir.Value, running: ir.Value) -> list:
        """The scalar walk from column `start` with the running sum
        `running` before it: [whether some column's running sum exceeds
        `target`, the first such column of positive weight, the last column
        of positive weight from `start` (`start` if none)]."""
        k = self.k
        i1 = ir.IntegerType.get_signless(1)
        types = [k.index, k.f32, i1, k.index, k.index]
        walk = scf.WhileOp(types, [start, running, arith.constant(i1, 0), start, start])
        before = walk.before.blocks.append(*types)
        with ir.InsertionPoint(before):
            column, _, found = before.arguments[:3]
            going = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, column, self.n),
                               arith.xori(found, arith.constant(i1, 1)))
            scf.condition(going, list(before.arguments))
        after = walk.after.blocks.append(*types)
        with ir.InsertionPoint(after):
            column, running, _, chosen, last = after.arguments
            w = weight_of(self.load(column))
            running = arith.addf(running, w)
            positive = arith.cmpf(arith.CmpFPredicate.OGT, w, k.cf32(0.0))
            hit = arith.andi(positive, arith.cmpf(arith.CmpFPredicate.OGT, running, target))
            scf.yield_([arith.addi(column, k.cidx(1)), running, hit,
                        arith.select(hit, column, chosen), arith.select(positive, column, last)])
        _, _, found, chosen, last = walk.results
        return [found, chosen, last]


class VectorRowPasses(RowPasses):
    """`RowPasses` with the reductions over f32 vectors of WIDTH columns
    (partials per vector lane, one horizontal reduction, a scalar tail):
    the CPU kernel. The terms are written for scalars and vectors alike."""

    WIDTH = 16

    def fold(self, *reductions) -> list:
        k, width = self.k, self.WIDTH
        vector_n = arith.muli(arith.divui(self.n, k.cidx(width)), k.cidx(width))
        loop = scf.ForOp(k.cidx(0), vector_n, k.cidx(width),
                         [k.const_like(k.vzero(width), r[1]) for r in reductions])
        with ir.InsertionPoint(loop.body):
            v = k.vload(self.x, [self.row, loop.induction_variable], width)
            scf.yield_(_step(reductions, loop.inner_iter_args, v))
        totals = [_horizontal(r[0], acc) for r, acc in zip(reductions, loop.results)]
        tail = scf.ForOp(vector_n, self.n, k.cidx(1), totals)
        with ir.InsertionPoint(tail.body):
            scf.yield_(_step(reductions, tail.inner_iter_args, self.load(tail.induction_variable)))
        return list(tail.results)

    def argmax(self, m: ir.Value) -> ir.Value:
        """`etc.ops.topk.vector_argmax` (two searches from the maximum)."""
        return vector_argmax(self.k, self.x, self.row, self.n, m, self.WIDTH)

    def draw(self, weight_of, u: ir.Value) -> ir.Value:
        """`etc.ops.draw.vector_draw`: the scalar walk's column, with the
        weights 16 at a time and blocks skipped whole."""
        return vector_draw(self, weight_of, u)


class LanePasses(RowPasses):
    """The same passes with the row spread over the CTA's lanes (the GPU
    variant; simulated lanes on the CPU): lane l takes the 16-byte slices
    (or columns, for rows of other widths) l, l + L, ... of a reduction,
    warps combine with shuffles and the CTA through
    `red` (one f32 per warp, shared). The walk gives lane l the contiguous
    segment l of the row: lanes sum their segments, exchange them through
    `prefix` (one f32 per lane), and each walks its own segment from the
    sum of the segments before it, so the running sum follows the index
    order as `RowPasses.draw`'s does."""

    def __init__(self, kernel: TileKernel, lanes: Lanes, x, row, n, red, prefix):
        super().__init__(kernel, x, row, n)
        self.lanes, self.red, self.prefix = lanes, red, prefix

    def combine(self, kinds: Sequence[str], values_of_lane) -> list:
        """For each of `kinds`, that reduction over the lanes of the
        matching value of `values_of_lane(lane)` (f32s), as values every
        lane holds."""
        k, lanes = self.k, self.lanes
        warp, width = k.cidx(lanes.warp), len(kinds)
        assert width <= MAX_REDUCTIONS, kinds
        per_lane = lanes.each(values_of_lane)
        per_warp = [lanes.reduce(_one(per_lane, i), kind, lanes.warp)
                    for i, kind in enumerate(kinds)]
        lanes.barrier()  # the previous combine's readers are done with `red`

        def put(lane):
            first = arith.cmpi(arith.CmpIPredicate.eq, arith.remui(lane, warp), k.cidx(0))
            branch = scf.IfOp(first)
            with ir.InsertionPoint(branch.then_block):
                slot = arith.muli(arith.divui(lane, warp), k.cidx(width))
                for i, values in enumerate(per_warp):
                    memref.store(lanes.get(values, lane)[0], self.red,
                                 [arith.addi(slot, k.cidx(i))])
                scf.yield_([])
        lanes.each(put)
        lanes.barrier()

        def take(lane):
            out = []
            for i, kind in enumerate(kinds):
                acc = memref.load(self.red, [k.cidx(i)])
                for w in range(1, lanes.count // lanes.warp):
                    v = memref.load(self.red, [k.cidx(w * width + i)])
                    acc = arith.addf(acc, v) if kind == "add" else arith.maxnumf(acc, v)
                out.append(acc)
            return out
        return lanes.get(lanes.each(take), k.cidx(0))

    def fold(self, *reductions) -> list:
        """With rows of whole 16-byte slices, lane l reduces slices l,
        l + L, ... (16-byte loads); otherwise columns l, l + L, ..."""
        k = self.k
        width = 16 // (4 if self.x.dtype == "f32" else 2)
        n = self.x.shape[1]
        if not (isinstance(n, int) and n % width == 0):
            width = 1
        stride = k.cidx(self.lanes.count * width)

        def partial(lane):
            inits = [k.const_like(k.vzero(width), r[1]) if width > 1 else k.cf32(r[1])
                     for r in reductions]
            loop = scf.ForOp(arith.muli(lane, k.cidx(width)), self.n, stride, inits)
            with ir.InsertionPoint(loop.body):
                column = loop.induction_variable
                v = k.vload(self.x, [self.row, column], width, aligned=True) if width > 1 \
                    else self.load(column)
                scf.yield_(_step(reductions, loop.inner_iter_args, v))
            if width == 1:
                return list(loop.results)
            return [_horizontal(r[0], acc) for r, acc in zip(reductions, loop.results)]
        return self.combine([r[0] for r in reductions], partial)

    def _as_f32(self, position: ir.Value) -> ir.Value:
        """A column as an f32 (exact: rows are narrower than 2**24)."""
        return arith.uitofp(self.k.f32, arith.index_cast(ir.IntegerType.get_signless(32),
                                                         position))

    def _as_index(self, value: ir.Value) -> ir.Value:
        return arith.index_cast(self.k.index, arith.fptoui(ir.IntegerType.get_signless(32), value))

    def argmax(self, m: ir.Value) -> ir.Value:
        """Each lane's best of its columns (`_agree`; `m` unused)."""
        k = self.k
        return self._agree(lambda lane: argmax_scan(k, self.load, lane, self.n,
                                                    k.cidx(self.lanes.count)))

    def next_pick(self, previous: tuple) -> ir.Value:
        """Each lane's next pick among its columns (`_agree`)."""
        k = self.k
        return self._agree(lambda lane: select_next(k, self.n, self.load, previous, lane,
                                                    k.cidx(self.lanes.count)))

    def store(self, write) -> None:
        """Runs `write()` in lane 0 only."""
        k = self.k

        def first(lane):
            branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, lane, k.cidx(0)))
            with ir.InsertionPoint(branch.then_block):
                write()
                scf.yield_([])
        self.lanes.each(first)

    def _agree(self, scan) -> ir.Value:
        """The column of the CTA's winner among each lane's candidate
        `scan(lane)` = (value, column, found) (lane l scans columns l,
        l + L, ...): whether any lane holds a NaN, the largest number,
        then the lowest column holding the winner."""
        k, lanes = self.k, self.lanes
        zero, ninf = k.cf32(0.0), k.cf32(float("-inf"))

        def candidate(lane):
            value, column, found = scan(lane)
            is_nan = arith.andi(found, arith.cmpf(arith.CmpFPredicate.UNO, value, value))
            flag = lambda b: arith.select(b, k.cf32(1.0), zero)
            return [value, self._as_f32(column), flag(found), flag(is_nan)]
        candidates = lanes.each(candidate)
        get = lambda lane: lanes.get(candidates, lane)
        positive = lambda v: arith.cmpf(arith.CmpFPredicate.OGT, v, zero)
        (any_nan,) = self.combine(["maxnumf"], lambda lane: [get(lane)[3]])

        def number(lane):
            value, _, found, is_nan = get(lane)
            real = arith.andi(positive(found), arith.xori(positive(is_nan), _true()))
            return [arith.select(real, value, ninf)]
        (best,) = self.combine(["maxnumf"], number)

        def winner(lane):
            value, column, found, is_nan = get(lane)
            matches = arith.select(positive(any_nan), positive(is_nan),
                                   arith.cmpf(arith.CmpFPredicate.OEQ, value, best))
            return [arith.select(arith.andi(positive(found), matches), arith.negf(column), ninf)]
        (lowest,) = self.combine(["maxnumf"], winner)
        # No candidate: column 0, as `RowPasses.argmax` of an empty row.
        some = arith.cmpf(arith.CmpFPredicate.OGT, lowest, ninf)
        return self._as_index(arith.select(some, arith.negf(lowest), zero))

    def draw(self, weight_of, u: ir.Value) -> ir.Value:
        k, lanes = self.k, self.lanes
        count = lanes.count
        zero, ninf = k.cf32(0.0), k.cf32(float("-inf"))
        segment = arith.divui(arith.addi(self.n, k.cidx(count - 1)), k.cidx(count))

        def bounds(lane):
            start = arith.minui(arith.muli(lane, segment), self.n)
            return start, arith.minui(arith.addi(start, segment), self.n)

        def segment_sum(lane):
            start, end = bounds(lane)
            loop = scf.ForOp(start, end, k.cidx(1), [zero])
            with ir.InsertionPoint(loop.body):
                w = weight_of(self.load(loop.induction_variable))
                scf.yield_([arith.addf(loop.inner_iter_args[0], w)])
            return [loop.results[0]]
        sums = lanes.each(segment_sum)
        lanes.barrier()  # the previous row's walk is done with `prefix`

        def put(lane):
            memref.store(lanes.get(sums, lane)[0], self.prefix, [lane])
        lanes.each(put)
        lanes.barrier()
        i1 = ir.IntegerType.get_signless(1)

        def walk(lane):
            # The sum of the segments before this lane's, and of all of
            # them, added in lane order (the same in every lane).
            totals = scf.ForOp(k.cidx(0), k.cidx(count), k.cidx(1), [zero, zero])
            with ir.InsertionPoint(totals.body):
                j = totals.induction_variable
                total, before = totals.inner_iter_args
                earlier = arith.cmpi(arith.CmpIPredicate.ult, j, lane)
                total = arith.addf(total, memref.load(self.prefix, [j]))
                scf.yield_([total, arith.select(earlier, total, before)])
            total, before = totals.results
            target = arith.mulf(u, total)
            start, end = bounds(lane)
            false = arith.constant(i1, 0)
            loop = scf.ForOp(start, end, k.cidx(1), [before, false, k.cidx(0), false, k.cidx(0)])
            with ir.InsertionPoint(loop.body):
                column = loop.induction_variable
                running, found, chosen, seen, last = loop.inner_iter_args
                w = weight_of(self.load(column))
                running = arith.addf(running, w)
                positive = arith.cmpf(arith.CmpFPredicate.OGT, w, zero)
                hit = arith.andi(arith.andi(positive, arith.xori(found, _true())),
                                 arith.cmpf(arith.CmpFPredicate.OGT, running, target))
                scf.yield_([running, arith.ori(found, hit), arith.select(hit, column, chosen),
                            arith.ori(seen, positive), arith.select(positive, column, last)])
            _, found, chosen, seen, last = loop.results
            return [arith.select(found, arith.negf(self._as_f32(chosen)), ninf),
                    arith.select(seen, self._as_f32(last), k.cf32(-1.0))]
        ends = lanes.each(walk)
        first, last = self.combine(["maxnumf", "maxnumf"], lambda lane: lanes.get(ends, lane))
        crossed = arith.cmpf(arith.CmpFPredicate.OGT, first, ninf)
        return self._as_index(arith.select(crossed, arith.negf(first),
                                           arith.maximumf(last, zero)))


def _true() -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(1), 1)


def _step(reductions, accumulators, value) -> list:
    """The accumulators after `value`: each reduction's term of it, added
    or maxed in."""
    out = []
    for (kind, _, term), acc in zip(reductions, accumulators):
        t = term(value)
        out.append(arith.addf(acc, t) if kind == "add" else arith.maxnumf(acc, t))
    return out


def _horizontal(kind: str, acc: ir.Value) -> ir.Value:
    """The reduction of an f32 vector's elements."""
    return vector.reduction(ir.F32Type.get(), ir.Attribute.parse(f"#vector.kind<{kind}>"), acc)


def _ordered_not(upper: ir.Value, v: ir.Value) -> ir.Value:
    """Numbers v not on the upper side (NaN is on neither)."""
    ordered = arith.cmpf(arith.CmpFPredicate.ORD, v, v)
    ones = _true() if not isinstance(upper.type, ir.VectorType) else arith.constant(
        upper.type, ir.DenseElementsAttr.get_splat(upper.type, ir.BoolAttr.get(True)))
    return arith.andi(arith.xori(upper, ones), ordered)


def _one(values: LaneValues, i: int) -> LaneValues:
    """The i-th of per-lane values, on its own."""
    if values.array is None:
        return LaneValues([values.values[i]])
    return LaneValues(array=values.array, layout=[values.layout[i]])


# ----------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------


def _i32_constant(value: int) -> ir.Value:
    """An i32 constant from a 32-bit pattern."""
    value &= 0xFFFFFFFF
    return arith.constant(ir.IntegerType.get_signless(32),
                          value - (1 << 32) if value >= 1 << 31 else value)


def _float_key(value: float) -> int:
    """The order key of a float32 (see `Sample.key_of`), computed here."""
    bits = struct.unpack("<i", struct.pack("<f", value))[0]
    return bits ^ 0x7FFFFFFF if bits < 0 else bits


def philox_uniform(seed_low: ir.Value, seed_high: ir.Value, position: ir.Value) -> ir.Value:
    """The f32 draw in [0, 1) of `etc.reference_sampling.uniform`: the top 24
    bits of the first word of Philox-4x32-10 (counter (position, 0, 0, 0),
    key (seed_low, seed_high), all i32 values), times 2**-24."""
    zero = _i32_constant(0)
    c = [position, zero, zero, zero]
    k0, k1 = seed_low, seed_high
    m0, m1 = _i32_constant(PHILOX_M[0]), _i32_constant(PHILOX_M[1])
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = arith.addi(k0, _i32_constant(PHILOX_W[0]))
            k1 = arith.addi(k1, _i32_constant(PHILOX_W[1]))
        low0, high0 = arith.mului_extended(m0, c[0])
        low1, high1 = arith.mului_extended(m1, c[2])
        c = [arith.xori(arith.xori(high1, c[1]), k0), low1,
             arith.xori(arith.xori(high0, c[3]), k1), low0]
    f32 = ir.F32Type.get()
    top = arith.uitofp(f32, arith.shrui(c[0], _i32_constant(8)))
    return arith.mulf(top, arith.constant(f32, ir.FloatAttr.get(f32, 2.0 ** -24)))


class Sample(RowKernel):
    """One row per lane iteration, its passes sequential (`RowPasses`)."""

    #: How the passes over a row run.
    passes = RowPasses

    def emit_row(self, x, row: ir.Value, n: ir.Value) -> None:
        self.store_index(self.choose(self.passes(self, x, row, n), row), self.op.result, [row])

    # -- keys: float32 values as ordered integers -------------------------

    def key_of(self, value: ir.Value) -> ir.Value:
        """An i64 that orders as the f32 `value` does (for numbers): the
        bits, with those of negative values but the sign flipped; -0 is
        +0's key 0 (they compare equal)."""
        i32 = ir.IntegerType.get_signless(32)
        bits = arith.bitcast(i32, value)
        negative = arith.cmpi(arith.CmpIPredicate.slt, bits, _i32_constant(0))
        key = arith.select(negative, arith.xori(bits, _i32_constant(0x7FFFFFFF)), bits)
        key = arith.select(arith.cmpi(arith.CmpIPredicate.eq, key, _i32_constant(-1)),
                           _i32_constant(0), key)
        return arith.extsi(ir.IntegerType.get_signless(64), key)

    def value_of(self, key: ir.Value) -> ir.Value:
        """The f32 of an i64 key of `key_of`."""
        k32 = arith.trunci(ir.IntegerType.get_signless(32), key)
        negative = arith.cmpi(arith.CmpIPredicate.slt, k32, _i32_constant(0))
        bits = arith.select(negative, arith.xori(k32, _i32_constant(0x7FFFFFFF)), k32)
        return arith.bitcast(self.f32, bits)

    def like(self, v: ir.Value, scalar) -> ir.Value:
        """`scalar` (an f32 value or a Python float) in the shape of `v` (an
        f32 or an f32 vector), so that the terms of a pass serve both."""
        if isinstance(scalar, float):
            return self.const_like(v, scalar)
        if isinstance(v.type, ir.VectorType):
            return vector.broadcast(v.type, scalar)
        return scalar

    def i64(self, value: int) -> ir.Value:
        return arith.constant(ir.IntegerType.get_signless(64), value)

    def bisect(self, low: ir.Value, high: ir.Value, probe, largest: bool) -> ir.Value:
        """Bisection over the keys [low, high] for the boundary of a
        predicate of the threshold. With `largest`: the largest key that
        holds (the predicate fails from some key on; `low` counts as
        holding). Otherwise the smallest (it holds from some key on; `high`
        counts as holding).

        `probe(t)` makes one pass and returns (holds, up, down): whether
        the value t holds, the smallest value of the row on t's upper side
        and the largest on its lower side (sides as the predicate splits
        the row: x >= t and x < t for `largest`, x > t and x <= t
        otherwise). The predicate is the same at t and at those values, so
        each step moves the bound past mid to them: the range skips the
        keys no logit has, which about halves the steps on real logits."""
        i64 = ir.IntegerType.get_signless(64)
        one = self.i64(1)
        steps = scf.ForOp(self.cidx(0), self.cidx(BISECTION_STEPS), self.cidx(1), [low, high])
        with ir.InsertionPoint(steps.body):
            lo, hi = steps.inner_iter_args
            open_ = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, lo, hi), [i64, i64],
                             has_else=True)
            with ir.InsertionPoint(open_.then_block):
                half = arith.subi(hi, lo)
                if largest:
                    half = arith.addi(half, one)
                mid = arith.addi(lo, arith.shrui(half, one))
                holds, up, down = probe(self.value_of(mid))
                # The bound that moves: at least as far as plain bisection
                # takes it, at most to the other bound.
                raised = arith.minsi(arith.maxsi(mid if largest else arith.addi(mid, one),
                                                 self.key_of(up)), hi)
                lowered = arith.maxsi(arith.minsi(arith.subi(mid, one) if largest else mid,
                                                  self.key_of(down)), lo)
                if largest:
                    scf.yield_([arith.select(holds, raised, lo), arith.select(holds, hi, lowered)])
                else:
                    scf.yield_([arith.select(holds, lo, raised), arith.select(holds, lowered, hi)])
            with ir.InsertionPoint(open_.else_block):
                scf.yield_([lo, hi])
            scf.yield_(list(open_.results))
        return steps.results[0] if largest else steps.results[1]

    # -- the choice -------------------------------------------------------

    @property
    def with_logprobs(self) -> bool:
        """Whether the op returns log-probabilities (`Graph.sample`'s
        `logprobs`)."""
        return bool(self.op.extra_results)

    def choose(self, passes: RowPasses, row: ir.Value) -> ir.Value:
        """The token of row `row` (an index value), and its log-probabilities
        where the op and the row ask for them (`log_probabilities`)."""
        op = self.op
        temperature = self.load(op.operands[1], [row])
        (m,) = passes.fold(("maxnumf", float("-inf"), lambda v: v))
        sampled = arith.andi(
            arith.cmpf(arith.CmpFPredicate.OGT, temperature, self.cf32(0.0)),
            arith.cmpf(arith.CmpFPredicate.OGT, m, self.cf32(float("-inf"))))
        want = None
        if self.with_logprobs:
            want = arith.cmpi(arith.CmpIPredicate.sge, self.load(op.operands[7], [row]),
                              _i32_constant(0))
        extra = [self.f32] * 4 if want is not None else []
        branch = scf.IfOp(sampled, [self.index] + extra, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            token, kept_weight, distribution = self.draw(passes, row, m, temperature)
            if want is not None:
                distribution.append(self._log_total(passes, want, kept_weight))
            scf.yield_([token] + (distribution if want is not None else []))
        with ir.InsertionPoint(branch.else_block):
            token = passes.argmax(m)
            if want is not None:
                # Greedy: the softmax of the logits (temperature 1, no filters).
                exp = lambda v: math.exp(arith.subf(v, self.like(v, m)))
                token = [token, self.cf32(float("-inf")), self.cf32(0.0), self.cf32(1.0),
                         self._log_total(passes, want, exp)]
            scf.yield_(token if want is not None else [token])
        if want is not None:
            self.log_probabilities(passes, row, want, branch.results[0], m,
                                   *branch.results[1:])
        return branch.results[0]

    def _log_total(self, passes: RowPasses, want: ir.Value, weight_of) -> ir.Value:
        """log of the row's sum of `weight_of(value)` where `want`, else 0
        (a pass only for the rows that ask for log-probabilities)."""
        branch = scf.IfOp(want, [self.f32], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            (total,) = passes.fold(("add", 0.0, weight_of))
            scf.yield_([math.log(total)])
        with ir.InsertionPoint(branch.else_block):
            scf.yield_([self.cf32(0.0)])
        return branch.results[0]

    def log_probabilities(self, passes: RowPasses, row: ir.Value, want: ir.Value,
                          token: ir.Value, m: ir.Value, threshold: ir.Value, floor: ir.Value,
                          inverse: ir.Value, log_total: ir.Value) -> None:
        """Where `want`: the log-probability of `token` and of the row's
        most likely tokens (as many as the row's `logprobs` asks, at most
        the op's `max_logprobs`) under the distribution it was drawn from:
        log w(v) - log_total for the values the filters keep (v >=
        `threshold` and w(v) >= `floor`, w(v) = exp((v - m) * `inverse`)),
        -inf for the others. The most likely tokens of that distribution
        are those of the largest logits (the filters keep an upper set of
        them), found by one pass each (`next_pick`)."""
        op = self.op
        values, ids = op.extra_results
        most = op.params["max_logprobs"]
        ninf = self.cf32(float("-inf"))

        def logprob(v):
            scaled = arith.mulf(arith.subf(v, m), inverse)
            at_max = arith.cmpf(arith.CmpFPredicate.OEQ, v, m)
            log_w = arith.select(at_max, self.cf32(0.0), scaled)
            w = arith.select(at_max, self.cf32(1.0), math.exp(scaled))
            kept = arith.andi(arith.cmpf(arith.CmpFPredicate.OGE, v, threshold),
                              arith.cmpf(arith.CmpFPredicate.OGE, w, floor))
            return arith.select(kept, arith.subf(log_w, log_total), ninf)

        branch = scf.IfOp(want)
        with ir.InsertionPoint(branch.then_block):
            chosen = logprob(passes.load(token))
            passes.store(lambda: self.store(chosen, values, [row, self.cidx(0)]))
            asked = self.load_index(op.operands[7], [row])
            count = arith.minsi(arith.minsi(asked, self.cidx(most)), passes.n)
            # Before the first pick: NaN at column -1, which every value follows.
            nan = self.cf32(float("nan"))
            picks = scf.ForOp(self.cidx(0), count, self.cidx(1), [nan, self.cidx(-1)])
            with ir.InsertionPoint(picks.body):
                j = picks.induction_variable
                column = passes.next_pick(tuple(picks.inner_iter_args))
                v = passes.load(column)
                lp = logprob(v)

                def write():
                    self.store_index(column, ids, [row, j])
                    self.store(lp, values, [row, arith.addi(j, self.cidx(1))])
                passes.store(write)
                scf.yield_([v, column])
            scf.yield_([])

    def draw(self, passes: RowPasses, row: ir.Value, m: ir.Value,
             temperature: ir.Value) -> tuple:
        """The sampled token of a row whose largest number is `m` (above
        -inf) at `temperature` (> 0), the weight of a value after the
        filters (a function), and the distribution's [threshold, floor,
        1 / temperature] (see `log_probabilities`)."""
        op = self.op
        _, _, top_k, top_p, min_p, seed, position = op.operands[:7]
        f32 = self.f32
        i64 = ir.IntegerType.get_signless(64)
        like = self.like
        ge = lambda a, b: arith.cmpf(arith.CmpFPredicate.OGE, a, like(a, b))
        gt = lambda a, b: arith.cmpf(arith.CmpFPredicate.OGT, a, like(a, b))
        pick = lambda keep, a, b: arith.select(keep, a, like(a, b))
        inverse = arith.divf(self.cf32(1.0), temperature)

        def weight(v):
            # exp((v - m) / T); exactly 1 at the maximum, also when it is +inf.
            e = math.exp(arith.mulf(arith.subf(v, like(v, m)), like(v, inverse)))
            return pick(arith.cmpf(arith.CmpFPredicate.OEQ, v, like(v, m)), like(v, 1.0), e)

        lowest = self.i64(_float_key(float("-inf")))
        highest = self.key_of(m)
        # Top-k: the k-th largest value (k = 0 or k >= n: none).
        k = arith.index_cast(self.index, self.load(top_k, [row]))
        use_k = arith.andi(arith.cmpi(arith.CmpIPredicate.sgt, k, self.cidx(0)),
                           arith.cmpi(arith.CmpIPredicate.slt, k, passes.n))
        k_f32 = arith.sitofp(f32, arith.index_cast(i64, k))
        ninf = float("-inf")
        negate = lambda v: arith.negf(v)

        def probe(t, upper, total_term):
            """One pass: the sum of `total_term`, the smallest value on the
            upper side of t (`upper(v)`) and the largest on the lower."""
            total, up, down = passes.fold(
                ("add", 0.0, total_term),
                ("maxnumf", ninf, lambda v: pick(upper(v), negate(v), ninf)),
                ("maxnumf", ninf, lambda v: pick(_ordered_not(upper(v), v), v, ninf)))
            return total, negate(up), down

        by_k = scf.IfOp(use_k, [i64], has_else=True)
        with ir.InsertionPoint(by_k.then_block):
            def enough(t):
                count, up, down = probe(t, lambda v: ge(v, t),
                                        lambda v: pick(ge(v, t), like(v, 1.0), 0.0))
                return ge(count, k_f32), up, down
            scf.yield_([self.bisect(lowest, highest, enough, largest=True)])
        with ir.InsertionPoint(by_k.else_block):
            scf.yield_([lowest])
        key_k = by_k.results[0]
        # Top-p over what top-k kept.
        p = self.load(top_p, [row])
        by_p = scf.IfOp(arith.cmpf(arith.CmpFPredicate.OLT, p, self.cf32(1.0)), [i64],
                        has_else=True)
        with ir.InsertionPoint(by_p.then_block):
            t_k = self.value_of(key_k)
            (kept,) = passes.fold(("add", 0.0, lambda v: pick(ge(v, t_k), weight(v), 0.0)))
            budget = arith.mulf(p, kept)

            def small(t):
                above, up, down = probe(t, lambda v: gt(v, t),
                                        lambda v: pick(gt(v, t), weight(v), 0.0))
                return arith.cmpf(arith.CmpFPredicate.OLT, above, budget), up, down
            scf.yield_([self.bisect(key_k, highest, small, largest=False)])
        with ir.InsertionPoint(by_p.else_block):
            scf.yield_([key_k])
        threshold = self.value_of(by_p.results[0])
        # Min-p: weights of at least min_p (of the maximum's 1).
        floor = arith.minnumf(self.load(min_p, [row]), self.cf32(1.0))

        def kept_weight(v):
            w = weight(v)
            return pick(arith.andi(ge(v, threshold), ge(w, floor)), w, 0.0)
        u = philox_uniform(self.load(seed, [row, self.cidx(0)]),
                           self.load(seed, [row, self.cidx(1)]),
                           self.load(position, [row]))
        return passes.draw(kept_weight, u), kept_weight, [threshold, floor, inverse]


class SampleCPU(Sample):
    """`Sample` with its reductions over vectors (`VectorRowPasses`)."""

    passes = VectorRowPasses

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_cpu"


class SampleGPU(RowSelectGPU, Sample):
    """A CTA per row (`LanePasses`); the tile's rows one after another."""

    def emit(self) -> None:
        op = self.op
        x = op.operands[0]
        lanes = self.lanes()
        red = self.scratch([lanes.count // lanes.warp * MAX_REDUCTIONS])
        prefix = self.scratch([lanes.count])
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        loop = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            chosen = self.choose(LanePasses(self, lanes, x, row, n, red, prefix), row)

            def store(lane):
                branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, lane, self.cidx(0)))
                with ir.InsertionPoint(branch.then_block):
                    self.store_index(chosen, op.result, [row])
                    scf.yield_([])
            lanes.each(store)
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm)], [tm])
    reads = [(x, box(1, [tile_offset(0, tm), "0"], [tm, None]))]
    if op.kind == "argmax":
        kernel = ArgmaxCPU if b.target.kind == "cpu" else Argmax
    else:
        if SampleGPU.applies(op, b.target):
            kernel = SampleGPU
        elif b.target.kind == "cpu":
            kernel = SampleCPU
        else:
            kernel = Sample
        seed = op.operands[5]
        reads += [(t, rows) for t in op.operands[1:] if t is not seed]
        reads.append((seed, box(1, [tile_offset(0, tm), "0"], [tm, None])))
    whole_rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    writes = [(op.result, rows)] + [(t, whole_rows) for t in op.extra_results]
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, writes, kernel)
