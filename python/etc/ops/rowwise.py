"""Row-wise operators over the last dimension: rmsnorm (optionally times
offset + weight: Gemma's 1 + w), layernorm (times weight, plus an optional
bias), softmax and sum.

Tasks: one tile task per block of rows; each reads its rows whole (and all
of the norms' weight and bias) and writes its rows (one value per row for
`sum`).

LayerNorm's statistics are two-pass: the mean, then the mean of the
squared deviations from it. The one-pass E[x^2] - E[x]^2 cancels
catastrophically in float32 when |mean| is large against the spread (a
residual stream with an offset), and a Welford merge of (count, mean, M2)
across lanes would need a three-value shuffle reduction per row; the
second pass costs nothing where the row is held in registers (the GPU's
rows of up to 2048 bf16 values) and re-reads it from cache elsewhere.

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

KINDS = ("rmsnorm", "layernorm", "softmax", "sum")


class Rowwise(TileKernel):
    """One row per lane iteration: a reduction over the row (layernorm: two,
    the mean then the centred squares), then (softmax, the norms) a pass
    writing the row."""

    grid_rank = 1

    def norm_weight(self, weight: ir.Value) -> ir.Value:
        """rmsnorm's loaded weight (f32, scalar or vector), plus its offset
        when it has one: Gemma's 1 + w, in float32."""
        offset = self.op.params.get("offset")
        return weight if offset is None else arith.addf(self.const_like(weight, offset), weight)

    def layer_affine(self, normed: ir.Value, at) -> ir.Value:
        """layernorm's normalised value (scalar or vector) times its weight,
        plus its bias when it has one; `at(tensor)` loads a tensor's values
        at the normalised value's columns."""
        out = arith.mulf(normed, at(self.op.operands[1]))
        return arith.addf(out, at(self.op.operands[2])) if len(self.op.operands) == 3 else out

    def width_f32(self, x, n: ir.Value) -> ir.Value:
        """The row width as an f32 (a constant when static)."""
        if isinstance(x.shape[1], int):
            return self.cf32(float(x.shape[1]))
        return arith.sitofp(self.f32, arith.index_cast(ir.IntegerType.get_signless(64), n))

    def emit(self) -> None:
        op, out = self.op, self.op.result
        x = op.operands[0]
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        if op.kind in ("rmsnorm", "layernorm"):
            n_f32 = self.width_f32(x, n)
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
            elif op.kind == "layernorm":
                total = self.reduce_row(
                    n, self.cf32(0.0), lambda acc, k: arith.addf(acc, self.load(x, [row, k])))
                mean = arith.divf(total, n_f32)

                def centred_square(acc, k):
                    v = arith.subf(self.load(x, [row, k]), mean)
                    return arith.addf(acc, arith.mulf(v, v))
                variance = arith.divf(self.reduce_row(n, self.cf32(0.0), centred_square), n_f32)
                inv = math.rsqrt(arith.addf(variance, self.cf32(op.params["eps"])))

                def write(k):
                    normed = arith.mulf(arith.subf(self.load(x, [row, k]), mean), inv)
                    self.store(self.layer_affine(normed, lambda t: self.load(t, [k])), out,
                               [row, k])
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
                    self.store(arith.mulf(v, self.norm_weight(self.load(weight, [k]))), out,
                               [row, k])
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
        if op.kind in ("rmsnorm", "layernorm"):
            n_f32 = self.width_f32(x, n)  # once, not per row
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
            elif op.kind == "layernorm":
                mean = arith.divf(self.fold_row(row, n, vector_n, 0.0,
                                                lambda acc, k: arith.addf(acc, vx(k)),
                                                lambda acc, k: arith.addf(acc, sx(k)), vsum),
                                  n_f32)
                vmean = self.vsplat(mean, width)

                def vsquare(acc, k):
                    d = arith.subf(vx(k), vmean)
                    return vector.fma(d, d, acc)

                def ssquare(acc, k):
                    d = arith.subf(sx(k), mean)
                    return arith.addf(acc, arith.mulf(d, d))
                variance = arith.divf(self.fold_row(row, n, vector_n, 0.0, vsquare, ssquare, vsum),
                                      n_f32)
                inv = math.rsqrt(arith.addf(variance, self.cf32(op.params["eps"])))
                vinv = self.vsplat(inv, width)
                self.map_row(
                    n, vector_n,
                    lambda k: self.vstore(self.layer_affine(
                        arith.mulf(arith.subf(vx(k), vmean), vinv),
                        lambda t: self.vload(t, [k], width)), out, [row, k]),
                    lambda k: self.store(self.layer_affine(
                        arith.mulf(arith.subf(sx(k), mean), inv),
                        lambda t: self.load(t, [k])), out, [row, k]))
            else:  # rmsnorm
                weight = op.operands[1]
                ss = self.fold_row(
                    row, n, vector_n, 0.0,
                    lambda acc, k: vector.fma(vx(k), vx(k), acc),
                    lambda acc, k: arith.addf(acc, arith.mulf(sx(k), sx(k))), vsum)
                inv = math.rsqrt(arith.addf(arith.divf(ss, n_f32), self.cf32(op.params["eps"])))
                vinv = self.vsplat(inv, width)
                self.map_row(
                    n, vector_n,
                    lambda k: self.vstore(arith.mulf(arith.mulf(vx(k), vinv), self.norm_weight(
                        self.vload(weight, [k], width))), out, [row, k]),
                    lambda k: self.store(arith.mulf(arith.mulf(sx(k), inv), self.norm_weight(
                        self.load(weight, [k]))), out, [row, k]))
            scf.yield_([])


class RowwiseGPU(Rowwise):
    """A warp per row, 16-byte slices per lane, shuffle reductions.

    Rows of at most HELD slices per lane (32 x HELD x 16 bytes: 4 KB of
    bf16, 2048 values) are held in registers: a lane issues all its loads
    of R rows at once (R x slices per lane <= HELD, so up to 128 bytes per
    lane and 16 KB per 4-warp CTA in flight), reduces, and writes from the
    registers, so each row is read from memory once. Wider rows stream
    through the lanes UNROLL slices per iteration (loads first), twice for
    softmax and rmsnorm (the second pass mostly from L2), three times for
    layernorm (mean, centred squares, output)."""

    #: 16-byte slices a lane holds in registers at most.
    HELD = 8
    #: Slices per lane and iteration when a row is streamed.
    UNROLL = 4

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
        op = self.op
        lanes = self.lanes()
        slices = op.operands[0].shape[1] // self.vec(op)
        if slices % lanes.warp == 0 and slices // lanes.warp <= self.HELD:
            self.emit_held(slices // lanes.warp)
        else:
            self.emit_streamed()

    def rounds(self, rows_per_round: int):
        """A loop over the tile's rows, `rows_per_round` at a time: yields
        its body's first row and a function giving a row of this round
        (clamped into the tile: a warp without a row of its own recomputes
        the last one) and whether it is real."""
        (tm,) = self.op.tile
        row0, rows = self.row_block(self.op.operands[0], tm)
        rounds = arith.ceildivui(rows, self.cidx(rows_per_round))
        loop = scf.ForOp(self.cidx(0), rounds, self.cidx(1))
        base = None
        with ir.InsertionPoint(loop.body):
            base = arith.addi(row0, arith.muli(loop.induction_variable,
                                               self.cidx(rows_per_round)))

            def row(index):
                end = arith.addi(row0, rows)
                real = arith.cmpi(arith.CmpIPredicate.ult, index, end)
                return arith.minsi(index, arith.subi(end, self.cidx(1))), real
            yield base, row
            scf.yield_([])

    def emit_held(self, per_lane: int) -> None:
        """Each warp takes R rows a round, each lane all its slices of them."""
        op, out = self.op, self.op.result
        x = op.operands[0]
        vec = self.vec(op)
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        n = x.shape[1]
        held_rows = max(1, min(4, self.HELD // per_lane))
        for base, row_at in self.rounds(warps * held_rows):

            def where(lane):
                warp = arith.divui(lane, self.cidx(lanes.warp))
                first = arith.addi(base, arith.muli(warp, self.cidx(held_rows)))
                rows = [row_at(arith.addi(first, self.cidx(i))) for i in range(held_rows)]
                in_warp = arith.remui(lane, self.cidx(lanes.warp))
                cols = [arith.muli(arith.addi(in_warp, self.cidx(s * lanes.warp)), self.cidx(vec))
                        for s in range(per_lane)]
                return rows, cols

            def load(lane):
                rows, cols = where(lane)
                return [self.vload(x, [row, col], vec, aligned=True)
                        for row, _ in rows for col in cols]

            held = lanes.each(load)

            def values(lane, i):
                return lanes.get(held, lane)[i * per_lane:(i + 1) * per_lane]

            def fold(lane, kind, step):
                """Per row: step(acc, v, i, lane) over the lane's slices v
                from the identity of `kind` ("add" or "maxnumf"), then
                `kind` across the vector."""
                out = []
                for i in range(held_rows):
                    acc = (self.const_like(self.vzero(vec), float("-inf")) if kind == "maxnumf"
                           else self.vzero(vec))
                    for v in values(lane, i):
                        acc = step(acc, v, i, lane)
                    out.append(vector.reduction(
                        self.f32, ir.Attribute.parse(f"#vector.kind<{kind}>"), acc))
                return out

            def write(lane, value_of):
                rows, cols = where(lane)
                for i, (row, real) in enumerate(rows):
                    branch = scf.IfOp(real)
                    with ir.InsertionPoint(branch.then_block):
                        for v, col in zip(values(lane, i), cols):
                            self.vstore(value_of(v, col, i, lane), out, [row, col], aligned=True)
                        scf.yield_([])

            if op.kind == "sum":
                totals = lanes.reduce(lanes.each(lambda lane: fold(
                    lane, "add", lambda a, v, i, l: arith.addf(a, v))), "add", lanes.warp)

                def store_sums(lane):
                    rows, _ = where(lane)
                    leads = arith.cmpi(arith.CmpIPredicate.eq,
                                       arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                    for i, (row, real) in enumerate(rows):
                        branch = scf.IfOp(arith.andi(real, leads))
                        with ir.InsertionPoint(branch.then_block):
                            self.store(lanes.get(totals, lane)[i], out, [row])
                            scf.yield_([])
                lanes.each(store_sums)
            elif op.kind == "softmax":
                maxima = lanes.reduce(lanes.each(lambda lane: fold(
                    lane, "maxnumf", lambda a, v, i, l: arith.maxnumf(a, v))), "maxnumf",
                    lanes.warp)
                peak = lambda lane, i: self.vsplat(lanes.get(maxima, lane)[i], vec)
                sums = lanes.reduce(lanes.each(lambda lane: fold(
                    lane, "add", lambda a, v, i, l: arith.addf(
                        a, math.exp(arith.subf(v, peak(l, i)))))), "add", lanes.warp)

                def normalise(v, col, i, lane):
                    inv = self.vsplat(arith.divf(self.cf32(1.0), lanes.get(sums, lane)[i]), vec)
                    return arith.mulf(math.exp(arith.subf(v, peak(lane, i))), inv)
                lanes.each(lambda lane: write(lane, normalise))
            elif op.kind == "layernorm":
                sums = lanes.reduce(lanes.each(lambda lane: fold(
                    lane, "add", lambda a, v, i, l: arith.addf(a, v))), "add", lanes.warp)

                def means(lane):
                    return [self.vsplat(arith.divf(total, self.cf32(float(n))), vec)
                            for total in lanes.get(sums, lane)]

                def centred_squares(lane):
                    mean = means(lane)

                    def step(a, v, i, l):
                        d = arith.subf(v, mean[i])
                        return vector.fma(d, d, a)
                    return fold(lane, "add", step)
                squares = lanes.reduce(lanes.each(centred_squares), "add", lanes.warp)

                def normalise_rows(lane):
                    mean = means(lane)
                    invs = [self.vsplat(math.rsqrt(arith.addf(
                        arith.divf(total, self.cf32(float(n))), self.cf32(op.params["eps"]))), vec)
                        for total in lanes.get(squares, lane)]
                    write(lane, lambda v, col, i, l: self.layer_affine(
                        arith.mulf(arith.subf(v, mean[i]), invs[i]),
                        lambda t: self.vload(t, [col], vec, aligned=True)))
                lanes.each(normalise_rows)
            else:  # rmsnorm
                weight = op.operands[1]
                squares = lanes.reduce(lanes.each(lambda lane: fold(
                    lane, "add", lambda a, v, i, l: vector.fma(v, v, a))), "add", lanes.warp)

                def scale(v, col, i, lane):
                    mean = arith.divf(lanes.get(squares, lane)[i], self.cf32(float(n)))
                    inv = self.vsplat(math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"]))),
                                      vec)
                    return arith.mulf(arith.mulf(v, inv), self.norm_weight(
                        self.vload(weight, [col], vec, aligned=True)))
                lanes.each(lambda lane: write(lane, scale))

    def emit_streamed(self) -> None:
        """A warp per row; each lane streams its slices of the row."""
        op, out = self.op, self.op.result
        x = op.operands[0]
        vec = self.vec(op)
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        n = x.shape[1]
        slices = n // vec
        unroll = self.UNROLL if slices % (lanes.warp * self.UNROLL) == 0 else 1
        for base, row_at in self.rounds(warps):

            def row_of(lane):
                warp = arith.divui(lane, self.cidx(lanes.warp))
                return row_at(arith.addi(base, warp))

            def fold(lane, kind: str, step):
                """step(acc, v) over this lane's slices of its row from the
                identity of `kind`, lane l of a warp taking slices l,
                l + warp, ... (UNROLL per iteration, their loads first),
                then `kind` across the vector: one f32 per lane."""
                row, _ = row_of(lane)
                start = arith.remui(lane, self.cidx(lanes.warp))
                init = float("-inf") if kind == "maxnumf" else 0.0
                acc0 = self.const_like(self.vzero(vec), init) if init else self.vzero(vec)
                loop = scf.ForOp(start, self.cidx(slices), self.cidx(lanes.warp * unroll),
                                 [acc0])
                with ir.InsertionPoint(loop.body):
                    cols = [arith.muli(arith.addi(loop.induction_variable,
                                                  self.cidx(u * lanes.warp)), self.cidx(vec))
                            for u in range(unroll)]
                    loaded = [self.vload(x, [row, col], vec, aligned=True) for col in cols]
                    acc = loop.inner_iter_args[0]
                    for v in loaded:
                        acc = step(acc, v)
                    scf.yield_([acc])
                return vector.reduction(self.f32, ir.Attribute.parse(f"#vector.kind<{kind}>"),
                                        loop.results[0])

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
                total = lanes.reduce(lanes.each(lambda lane: [fold(
                    lane, "add", lambda a, v: arith.addf(a, v))]), "add", lanes.warp)

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
                maxima = lanes.reduce(lanes.each(lambda lane: [fold(
                    lane, "maxnumf", lambda a, v: arith.maxnumf(a, v))]), "maxnumf", lanes.warp)

                def exp_sum(lane):
                    mx = self.vsplat(lanes.get(maxima, lane)[0], vec)
                    return [fold(lane, "add", lambda a, v: arith.addf(
                        a, math.exp(arith.subf(v, mx))))]
                sums = lanes.reduce(lanes.each(exp_sum), "add", lanes.warp)

                def normalise(lane):
                    mx = self.vsplat(lanes.get(maxima, lane)[0], vec)
                    inv = self.vsplat(arith.divf(self.cf32(1.0), lanes.get(sums, lane)[0]), vec)
                    write(lane, lambda v, c: arith.mulf(math.exp(arith.subf(v, mx)), inv))
                lanes.each(normalise)
            elif op.kind == "layernorm":
                sums = lanes.reduce(lanes.each(lambda lane: [fold(
                    lane, "add", lambda a, v: arith.addf(a, v))]), "add", lanes.warp)

                def mean(lane):
                    return self.vsplat(arith.divf(lanes.get(sums, lane)[0],
                                                  self.cf32(float(n))), vec)

                def centred_squares(lane):
                    m = mean(lane)

                    def step(a, v):
                        d = arith.subf(v, m)
                        return vector.fma(d, d, a)
                    return [fold(lane, "add", step)]
                squares = lanes.reduce(lanes.each(centred_squares), "add", lanes.warp)

                def normalise_row(lane):
                    m = mean(lane)
                    variance = arith.divf(lanes.get(squares, lane)[0], self.cf32(float(n)))
                    inv = self.vsplat(math.rsqrt(arith.addf(variance,
                                                            self.cf32(op.params["eps"]))), vec)
                    write(lane, lambda v, c: self.layer_affine(
                        arith.mulf(arith.subf(v, m), inv),
                        lambda t: self.vload(t, [c], vec, aligned=True)))
                lanes.each(normalise_row)
            else:  # rmsnorm
                weight = op.operands[1]
                total = lanes.reduce(lanes.each(lambda lane: [fold(
                    lane, "add", lambda a, v: vector.fma(v, v, a))]), "add", lanes.warp)

                def scale(lane):
                    mean = arith.divf(lanes.get(total, lane)[0], self.cf32(float(n)))
                    inv = self.vsplat(math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"]))), vec)
                    write(lane, lambda v, c: arith.mulf(arith.mulf(v, inv), self.norm_weight(
                        self.vload(weight, [c], vec, aligned=True))))
                lanes.each(scale)


def build_tasks(b: TaskBuilder, op) -> None:
    x = op.operands[0]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    reads = [(x, rows)]
    # The norms' weight (and layernorm's bias), whole.
    reads += [(t, box(1, ["0"], [None])) for t in op.operands[1:]]
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
