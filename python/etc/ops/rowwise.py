"""Row-wise operators over the last dimension: rmsnorm, softmax and sum.

Tasks: one tile task per block of rows; each reads its rows whole (and all
of rmsnorm's weight) and writes its rows (one value per row for `sum`).

Kernels: generic, one row per lane iteration with scalar loops; cpu
(`RowwiseCPU`), the same with each pass over a row in f32 vectors (partial
sums or maxima per vector lane, one horizontal reduction, a scalar tail);
cuda (`RowwiseGPU`), one warp per row: each lane reads 16-byte slices of the
row, the warp combines the lanes' partials with shuffles
(`event.lane_reduce`), and the warps take the tile's rows in turn.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf, vector

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
        row0, rows = self.row_block(x, tm)
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


class RowwiseCPU(Rowwise):
    """Row passes over f32 vectors of WIDTH lanes."""

    WIDTH = 16

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_cpu"

    def fold_row(self, row, n, vector_n, init: float, vstep, sstep, combine) -> ir.Value:
        """Folds a row: vector partials over [0, vector_n) with `vstep(acc,
        k)`, combined across lanes with `combine`, then the scalar tail
        [vector_n, n) with `sstep(acc, k)`."""
        width = self.WIDTH
        start = arith.constant(self.vtype(width), ir.DenseElementsAttr.get_splat(
            self.vtype(width), ir.FloatAttr.get(self.f32, init)))
        loop = scf.ForOp(self.cidx(0), vector_n, self.cidx(width), [start])
        with ir.InsertionPoint(loop.body):
            scf.yield_([vstep(loop.inner_iter_args[0], loop.induction_variable)])
        total = combine(loop.results[0])
        tail = scf.ForOp(vector_n, n, self.cidx(1), [total])
        with ir.InsertionPoint(tail.body):
            scf.yield_([sstep(tail.inner_iter_args[0], tail.induction_variable)])
        return tail.results[0]

    def map_row(self, n, vector_n, vbody, sbody) -> None:
        """`vbody(k)` for the vectors of a row, `sbody(k)` for its tail."""
        loop = scf.ForOp(self.cidx(0), vector_n, self.cidx(self.WIDTH))
        with ir.InsertionPoint(loop.body):
            vbody(loop.induction_variable)
            scf.yield_([])
        self.for_each_col_from(vector_n, n, sbody)

    def for_each_col_from(self, begin, end, body) -> None:
        loop = scf.ForOp(begin, end, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            body(loop.induction_variable)
            scf.yield_([])

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x = op.operands[0]
        width = self.WIDTH
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        vector_n = arith.muli(arith.divui(n, self.cidx(width)), self.cidx(width))
        add_kind = ir.Attribute.parse("#vector.kind<add>")
        max_kind = ir.Attribute.parse("#vector.kind<maxnumf>")
        vsum = lambda v: vector.reduction(self.f32, add_kind, v)
        vmax = lambda v: vector.reduction(self.f32, max_kind, v)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            vx = lambda k: self.vload(x, [row, k], width)
            sx = lambda k: self.load(x, [row, k])
            if op.kind == "sum":
                total = self.fold_row(row, n, vector_n, 0.0,
                                      lambda acc, k: arith.addf(acc, vx(k)),
                                      lambda acc, k: arith.addf(acc, sx(k)), vsum)
                self.store(total, out, [row])
            elif op.kind == "softmax":
                mx = self.fold_row(row, n, vector_n, float("-inf"),
                                   lambda acc, k: arith.maxnumf(acc, vx(k)),
                                   lambda acc, k: arith.maxnumf(acc, sx(k)), vmax)
                vmx = self.vsplat(mx, width)
                denom = self.fold_row(
                    row, n, vector_n, 0.0,
                    lambda acc, k: arith.addf(acc, math.exp(arith.subf(vx(k), vmx))),
                    lambda acc, k: arith.addf(acc, math.exp(arith.subf(sx(k), mx))), vsum)
                inv = arith.divf(self.cf32(1.0), denom)
                vinv = self.vsplat(inv, width)
                self.map_row(
                    n, vector_n,
                    lambda k: self.vstore(arith.mulf(math.exp(arith.subf(vx(k), vmx)), vinv),
                                          out, [row, k]),
                    lambda k: self.store(arith.mulf(math.exp(arith.subf(sx(k), mx)), inv),
                                         out, [row, k]))
            else:  # rmsnorm
                weight = op.operands[1]
                if isinstance(x.shape[1], int):
                    n_f32 = self.cf32(float(x.shape[1]))
                else:
                    n_f32 = arith.sitofp(self.f32, arith.index_cast(
                        ir.IntegerType.get_signless(64), n))
                ss = self.fold_row(
                    row, n, vector_n, 0.0,
                    lambda acc, k: vector.fma(vx(k), vx(k), acc),
                    lambda acc, k: arith.addf(acc, arith.mulf(sx(k), sx(k))), vsum)
                inv = math.rsqrt(arith.addf(arith.divf(ss, n_f32), self.cf32(op.params["eps"])))
                vinv = self.vsplat(inv, width)
                self.map_row(
                    n, vector_n,
                    lambda k: self.vstore(arith.mulf(arith.mulf(vx(k), vinv),
                                                     self.vload(weight, [k], width)), out, [row, k]),
                    lambda k: self.store(arith.mulf(arith.mulf(sx(k), inv),
                                                    self.load(weight, [k])), out, [row, k]))
            scf.yield_([])


class RowwiseGPU(Rowwise):
    """A warp per row, 16-byte slices per lane, shuffle reductions."""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_gpu"

    @staticmethod
    def vec(op) -> int:
        return 16 // (4 if op.operands[0].dtype == "f32" else 2)

    @classmethod
    def applies(cls, op) -> bool:
        n = op.operands[0].shape[1]
        return isinstance(n, int) and n % cls.vec(op) == 0

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x = op.operands[0]
        vec = self.vec(op)
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        n = x.shape[1]
        slices = n // vec
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        rounds = arith.divui(arith.addi(rows, self.cidx(warps - 1)), self.cidx(warps))
        loop = scf.ForOp(self.cidx(0), rounds, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            base = arith.addi(row0, arith.muli(loop.induction_variable, self.cidx(warps)))

            def row_of(lane):
                # This lane's row this round, clamped into the tile: a warp
                # without a row of its own recomputes the last one and does
                # not store.
                warp = arith.divui(lane, self.cidx(lanes.warp))
                row = arith.addi(base, warp)
                last = arith.subi(arith.addi(row0, rows), self.cidx(1))
                live = arith.cmpi(arith.CmpIPredicate.ult, row, arith.addi(row0, rows))
                return arith.minsi(row, last), live

            def fold(lane, init: float, step):
                """`step(acc, slice)` over this lane's slices of its row,
                lane l of a warp taking slices l, l + warp, ...; one f32
                partial per lane."""
                row, _ = row_of(lane)
                start = arith.remui(lane, self.cidx(lanes.warp))
                acc0 = self.const_like(self.vzero(vec), init) if init else self.vzero(vec)
                slices_loop = scf.ForOp(start, self.cidx(slices), self.cidx(lanes.warp), [acc0])
                with ir.InsertionPoint(slices_loop.body):
                    col = arith.muli(slices_loop.induction_variable, self.cidx(vec))
                    v = self.vload(x, [row, col], vec, aligned=True)
                    scf.yield_([step(slices_loop.inner_iter_args[0], v, col)])
                return slices_loop.results[0]

            def across(kind, total):
                combine = (lambda v: vector.reduction(
                    self.f32, ir.Attribute.parse(f"#vector.kind<{kind}>"), v))
                return combine(total)

            def write(lane, value_of):
                """Stores `value_of(v, col)` for this lane's slices of its row,
                if the row is real."""
                row, live = row_of(lane)
                branch = scf.IfOp(live)
                with ir.InsertionPoint(branch.then_block):
                    start = arith.remui(lane, self.cidx(lanes.warp))
                    w = scf.ForOp(start, self.cidx(slices), self.cidx(lanes.warp))
                    with ir.InsertionPoint(w.body):
                        col = arith.muli(w.induction_variable, self.cidx(vec))
                        v = self.vload(x, [row, col], vec, aligned=True)
                        self.vstore(value_of(v, col), out, [row, col], aligned=True)
                        scf.yield_([])
                    scf.yield_([])

            if op.kind == "sum":
                partial = lanes.each(lambda lane: [across("add", fold(lane, 0.0, lambda a, v, c: arith.addf(a, v)))])
                total = lanes.reduce(partial, "add", lanes.warp)

                def store_sum(lane):
                    row, live = row_of(lane)
                    first = arith.cmpi(arith.CmpIPredicate.eq,
                                       arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                    branch = scf.IfOp(arith.andi(live, first))
                    with ir.InsertionPoint(branch.then_block):
                        self.store(lanes.get(total, lane)[0], out, [row])
                        scf.yield_([])
                lanes.each(store_sum)
            elif op.kind == "softmax":
                partial = lanes.each(lambda lane: [across("maxnumf", fold(
                    lane, float("-inf"), lambda a, v, c: arith.maxnumf(a, v)))])
                maxima = lanes.reduce(partial, "maxnumf", lanes.warp)

                def exp_sum(lane):
                    mx = self.vsplat(lanes.get(maxima, lane)[0], vec)
                    return [across("add", fold(lane, 0.0, lambda a, v, c: arith.addf(
                        a, math.exp(arith.subf(v, mx)))))]
                sums = lanes.reduce(lanes.each(exp_sum), "add", lanes.warp)

                def normalise(lane):
                    mx = self.vsplat(lanes.get(maxima, lane)[0], vec)
                    inv = self.vsplat(arith.divf(self.cf32(1.0), lanes.get(sums, lane)[0]), vec)
                    write(lane, lambda v, c: arith.mulf(math.exp(arith.subf(v, mx)), inv))
                lanes.each(normalise)
            else:  # rmsnorm
                weight = op.operands[1]
                squares = lanes.each(lambda lane: [across("add", fold(
                    lane, 0.0, lambda a, v, c: vector.fma(v, v, a)))])
                total = lanes.reduce(squares, "add", lanes.warp)

                def scale(lane):
                    mean = arith.divf(lanes.get(total, lane)[0], self.cf32(float(n)))
                    inv = self.vsplat(math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"]))), vec)
                    write(lane, lambda v, c: arith.mulf(arith.mulf(v, inv),
                                                        self.vload(weight, [c], vec, aligned=True)))
                lanes.each(scale)
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
    if b.target.kind == "cpu":
        kernel = RowwiseCPU
    elif b.target.gpu_kernels and RowwiseGPU.applies(op):
        kernel = RowwiseGPU
    else:
        kernel = Rowwise
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, writes, kernel)
