"""An RMSNorm of rows split over ranks: sum_squares and split_rmsnorm.

OLMo 2, OLMo 3 and OLMoE norm q (k) with one RMSNorm over the whole
projection, every head, so a tensor-parallel rank that holds its heads'
share of each row lacks the row's statistic. The two operators split the
norm at its reduction:

* `sum_squares(x_0, ..., x_{n-1})`: (T, n) f32, column j the sum over each
  row of x_j (T, N_j) of its squares, in f32. Each rank sums its share;
  one `all_reduce` of the (T, n) totals (q's and k's together) gives every
  rank the whole rows' sums.
* `split_rmsnorm(x, weight, sum_squares; width W, column j, eps, offset)`:
  x[t, c] / sqrt(sum_squares[t, j] / W + eps) * (offset + weight[c]), with
  W the whole row's width; the rank's slice of the weight goes with its
  columns.

Tasks: one tile task per block of rows; each reads its rows (and all of
the weight), and writes its rows.

Kernels: generic, a row per lane iteration with scalar loops; cpu, the
row's passes in f32 vectors of 16 with a scalar tail (`RowwiseCPU`'s
folds); cuda, for widths that are whole 16-byte slices: `sum_squares` a
warp per row, each lane folding its slices of every operand, one shuffle
reduction of the n sums (`RowwiseGPU`'s rounds of rows); `split_rmsnorm`
needs no reduction, so its lanes take the tile's 16-byte slices in turn,
every lane busy even on a decode step's single row.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf, vector

from .base import TaskBuilder, TileKernel, box, tile_offset, whole
from .rowwise import Rowwise, RowwiseCPU, RowwiseGPU

KINDS = ("sum_squares", "split_rmsnorm")


def _inverse_rms(kernel: TileKernel, total: ir.Value) -> ir.Value:
    """rsqrt(total / width + eps): the scale of a row whose squares sum to
    `total` over the whole `width`."""
    params = kernel.op.params
    mean = arith.divf(total, kernel.cf32(float(params["width"])))
    return math.rsqrt(arith.addf(mean, kernel.cf32(params["eps"])))


# ----------------------------------------------------------------------
# sum_squares
# ----------------------------------------------------------------------


class SumSquares(TileKernel):
    """One row per lane iteration; per operand a scalar fold of squares."""

    grid_rank = 1

    def emit(self) -> None:
        op, out = self.op, self.op.result
        (tm,) = op.tile
        row0, rows = self.row_block(op.operands[0], tm)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            for j, x in enumerate(op.operands):

                def square(acc, k, x=x):
                    v = self.load(x, [row, k])
                    return arith.addf(acc, arith.mulf(v, v))
                total = self.reduce_row(self.dim(x, 1), self.cf32(0.0), square)
                self.store(total, out, [row, self.cidx(j)])
            scf.yield_([])


class SumSquaresCPU(RowwiseCPU):
    """Per operand, FMAs of 16-lane f32 vectors, one horizontal sum, a scalar tail."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu"

    def emit(self) -> None:
        op, out = self.op, self.op.result
        width = self.WIDTH
        (tm,) = op.tile
        row0, rows = self.row_block(op.operands[0], tm)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            for j, x in enumerate(op.operands):
                n = self.dim(x, 1)
                vector_n = arith.muli(arith.divui(n, self.cidx(width)), self.cidx(width))
                vx = lambda k, x=x: self.vload(x, [row, k], width)
                sx = lambda k, x=x: self.load(x, [row, k])
                total = self.fold_row(
                    row, n, vector_n, 0.0, lambda acc, k: vector.fma(vx(k), vx(k), acc),
                    lambda acc, k: arith.addf(acc, arith.mulf(sx(k), sx(k))), self.vsum)
                self.store(total, out, [row, self.cidx(j)])
            scf.yield_([])


class SumSquaresGPU(RowwiseGPU):
    """A warp per row: each lane folds its 16-byte slices of the row of
    every operand (lane l of a warp slices l, l + 32, ..., UNROLL loads per
    iteration where they divide), the warp adds the lanes' n sums with
    shuffles and its first lane stores them."""

    @classmethod
    def applies(cls, op) -> bool:
        vec = cls.vec(op)
        return all(isinstance(x.shape[1], int) and x.shape[1] % vec == 0 for x in op.operands)

    def emit(self) -> None:
        op, out = self.op, self.op.result
        vec = self.vec(op)
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        for base, row_at in self.rounds(warps):

            def row_of(lane):
                warp = arith.divui(lane, self.cidx(lanes.warp))
                return row_at(arith.addi(base, warp))

            def fold(lane):
                row, _ = row_of(lane)
                start = arith.remui(lane, self.cidx(lanes.warp))
                sums = []
                for x in op.operands:
                    slices = x.shape[1] // vec
                    unroll = self.UNROLL if slices % (lanes.warp * self.UNROLL) == 0 else 1
                    loop = scf.ForOp(start, self.cidx(slices),
                                     self.cidx(lanes.warp * unroll), [self.vzero(vec)])
                    with ir.InsertionPoint(loop.body):
                        loaded = [self.vload(x, [row, arith.muli(arith.addi(
                            loop.induction_variable, self.cidx(u * lanes.warp)),
                            self.cidx(vec))], vec, aligned=True) for u in range(unroll)]
                        acc = loop.inner_iter_args[0]
                        for v in loaded:
                            acc = vector.fma(v, v, acc)
                        scf.yield_([acc])
                    sums.append(self.vsum(loop.results[0]))
                return sums

            totals = lanes.reduce(lanes.each(fold), "add", lanes.warp)

            def store(lane):
                row, live = row_of(lane)
                first = arith.cmpi(arith.CmpIPredicate.eq,
                                   arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                branch = scf.IfOp(arith.andi(live, first))
                with ir.InsertionPoint(branch.then_block):
                    for j, total in enumerate(lanes.get(totals, lane)):
                        self.store(total, out, [row, self.cidx(j)])
                    scf.yield_([])
            lanes.each(store)


# ----------------------------------------------------------------------
# split_rmsnorm
# ----------------------------------------------------------------------


class SplitRMSNorm(Rowwise):
    """One row per lane iteration: its scale from the given total, then its
    columns one at a time (rmsnorm's `norm_weight` for the offset)."""

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x, weight, totals = op.operands
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        column = self.cidx(op.params["column"])
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            inv = _inverse_rms(self, self.load(totals, [row, column]))

            def write(k):
                v = arith.mulf(self.load(x, [row, k]), inv)
                self.store(arith.mulf(v, self.norm_weight(self.load(weight, [k]))), out,
                           [row, k])
            self.for_each_col(self.dim(x, 1), write)
            scf.yield_([])


class SplitRMSNormCPU(RowwiseCPU):
    """The row's columns in 16-lane f32 vectors, then a scalar tail."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu"

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x, weight, totals = op.operands
        width = self.WIDTH
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        vector_n = arith.muli(arith.divui(n, self.cidx(width)), self.cidx(width))
        column = self.cidx(op.params["column"])
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            inv = _inverse_rms(self, self.load(totals, [row, column]))
            vinv = self.vsplat(inv, width)
            self.map_row(
                n, vector_n,
                lambda k: self.vstore(arith.mulf(
                    arith.mulf(self.vload(x, [row, k], width), vinv),
                    self.norm_weight(self.vload(weight, [k], width))), out, [row, k]),
                lambda k: self.store(arith.mulf(
                    arith.mulf(self.load(x, [row, k]), inv),
                    self.norm_weight(self.load(weight, [k]))), out, [row, k]))
            scf.yield_([])


class SplitRMSNormGPU(RowwiseGPU):
    """The tile's rows as 16-byte slices, lane e taking slices e, e +
    lanes, ...: each loads its row's total (the same address for the
    lanes of a row), scales the slice and times the weight's slice (for
    the rows of whole slices `RowwiseGPU` takes, without its reduction)."""

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x, weight, totals = op.operands
        vec = self.vec(op)
        slices = x.shape[1] // vec
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        column = self.cidx(op.params["column"])
        loop = self.lane_loop(arith.muli(rows, self.cidx(slices)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, self.cidx(slices)))
            col = arith.muli(arith.remui(e, self.cidx(slices)), self.cidx(vec))
            inv = self.vsplat(_inverse_rms(self, self.load(totals, [row, column])), vec)
            v = arith.mulf(self.vload(x, [row, col], vec, aligned=True), inv)
            w = self.norm_weight(self.vload(weight, [col], vec, aligned=True))
            self.vstore(arith.mulf(v, w), out, [row, col], aligned=True)
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = lambda: box(1, [tile_offset(0, tm), "0"], [tm, None])
    gpu = b.target.gpu_kernels
    if op.kind == "sum_squares":
        reads = [(t, rows()) for t in op.operands]
        kernel = SumSquaresCPU if SumSquaresCPU.applies(op, b.target) else \
            SumSquaresGPU if gpu and SumSquaresGPU.applies(op) else SumSquares
    else:
        weight, totals = op.operands[1:]
        reads = [(x, rows()), (weight, whole(1, weight)), (totals, rows())]
        kernel = SplitRMSNormCPU if SplitRMSNormCPU.applies(op, b.target) else \
            SplitRMSNormGPU if gpu and SplitRMSNormGPU.applies(op) else SplitRMSNorm
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, [(op.result, rows())],
                kernel)
