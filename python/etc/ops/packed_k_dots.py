"""K-quant products with the sub-block scales in integers, as llama.cpp
computes Q4_K, Q5_K and Q6_K against its Q8_K activation blocks: a mixin
of `matmul_packed.PackedDotsCPU` for AVX-512 VNNI.

Why. A K-quant block of 256 values has 8 (Q4_K, Q5_K) or 16 (Q6_K)
sub-blocks, each with its own small integer scale under one float16
scale d. With activations quantized per 32 values, every 32-value group
of every (row, column) pair needs its own float scale: a convert, a
multiply and an FMA (and one more FMA for a minimum) after each
`vpdpbusd`: five instructions per 64 products at B = 16, 0.37x of
`vpdpbusd`'s rate (`bench/packed_tiles.py`, 2026-11-28). Here the
activations of a tile whose weights are all K-quants are quantized per
256 values (one f32 scale d_a, `packed.activation_block`), so a block's
sub-block scales can multiply integers:

    sum_k w_k x_k = d d_a sum_j sc_j (sum_{k in j} q_k qa_k)
                    + sum_j c_j (d_a sum_{k in j} qa_k)

per 256-value block, j over the block's 16 runs of 16 values (sc_j:
the sub-block scale of run j; c_j: -dmin m_j for Q4_K / Q5_K, whose q
are unsigned, and -32 d sc_j for Q6_K, whose q are read unsigned and
centred here). Each 64-value step is `vpmaddubsw` (unsigned weights
times signed activations into 16-bit pairs: at most 2 x 63 x 127, no
saturation) and `vpdpwssd` (the pairs times the 16-bit scales of their
runs, summed into 32-bit lanes: at most 4 steps x 2 x 16002 x 128 per
lane, no overflow; `vpdpwssds`, the saturating form, as LLVM splits the
plain one into `vpmaddwd` + `vpaddd`). A block ends per row and pair of
columns with their 32-bit lanes folded into one vector (8 lanes each:
two shuffles and an add), one convert and one FMA by d x d_a, and two
FMAs of the corrections c_j against the row's run sums d_a sum(qa) (in
order, and each block's halves swapped, so that both columns' 16 runs
meet their sums in one vector's lanes): per 256 values and (row,
column) 8 products and 2.5 float instructions, where the float scales
took 4 x 5.

The activations' rounding per 256 values is coarser than per 32: for
Gaussian values max|x| over 256 is about 1.4x that over 32, and so is
the rounding error (llama.cpp's Q8_K pays the same). On the tiny
random models of `test_gguf_packed_models.py` with every matrix in one
K-quant, the largest logit difference from the widened model before the
first differing token went from 0.09-0.13 to 0.11-0.19 of the logits'
standard deviation (2026-11-28).

Each group of COLS columns is unpacked once into stack panels (integer
weights, expanded scales, d and the corrections per block and pair of
columns) that the tile's row steps read: once for all rows in tiles of
two rows or more. A single row keeps the float path (its unpacking in
registers; the weights' bytes bound it: one 8192 x 2048 Q4_K matmul
0.31-0.32 ms through the panels, 0.24-0.27 in registers).

Measured (`bench/packed_tiles.py`, one 8192 x 2048 matmul, 2 workers,
2026-11-28, loaded machine): Q4_K at B = 16 2.26-2.27 -> 1.18-1.23 ms,
B = 4 0.66-0.68 -> 0.44-0.45 ms; Q6_K at B = 16 1.52-1.54 -> 1.18-1.30
ms, B = 4 0.57-0.62 -> 0.45 ms."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from .. import packed
from .packed_loads import row_at

#: Values per 512-bit step.
STEP = 64
#: Values per run of the corrections (one sum of the activations each).
RUN = 16


class IntegerScaleDots:
    """Integer sub-block scales for `PackedDotsCPU` (see the module
    docstring): `prepare_integer`, `quantize_rows` storing `run_sums`,
    then `multiply_integer` per weight."""

    #: Rows per step of a tile that reads unpacked panels. One 8192 x
    #: 2048 matmul at B = 16 (`bench/packed_tiles.py`, loaded machine):
    #: Q4_K 1.18-1.23 ms with 4 rows, 1.26 with 3, 1.35-1.36 with 2; Q6_K
    #: 1.18-1.30, 1.40, 1.48-1.70. (Before columns were paired, 4 rows'
    #: 16 accumulators and 16 vectors of activations spilled: 2 rows were
    #: fastest, 1.31 ms against 1.50.)
    PANEL_STEP = 4
    #: Values of K per chunk of the panel path (`chunked_dots`): a chunk's
    #: unpacked columns and PANEL_STEP rows of activations (about 4 KB per
    #: block of 256) stay in the L1 cache while the row steps read them.
    #: B = 16, one worker, best of 50-100 (loaded machine, 2026-11-28):
    #: the 2048 x 8192 down projection, Q4_K 3.55 ms in one pass over K ->
    #: 2.86-2.96 ms in chunks of 512, 1024 or 2048 values, Q6_K 3.81 ->
    #: 3.11-3.48 ms; but 8192 x 2048 in two chunks of 1024 2.25 -> 2.68
    #: ms (Q4_K): each chunk's start costs, so K = 2048 stays one pass.
    CHUNK = 2048

    def prepare_integer(self, k: int, rows: int) -> None:
        """The stack buffers for `rows` rows of `k` values: per row the
        sums d_a sum(qa) of each run of 16 values, in order and with each
        block's halves swapped (`store_run_sum`); per unpacked column the
        expanded scales (32 16-bit lanes per step); per pair of unpacked
        columns (`column_pairs`) d per block and the corrections."""
        blocks = k // packed.FORMATS["q4_k"].block
        f32 = self.f32
        self.run_sums = self.entry_alloca(ir.MemRefType.get([rows, 2, k // RUN], f32))
        self.step_scales = self.entry_alloca(ir.MemRefType.get([self.COLS, k // 2], self.i16))
        pairs = self.COLS // 2
        self.block_scales = self.entry_alloca(ir.MemRefType.get([pairs, blocks * RUN], f32))
        self.corrections = self.entry_alloca(ir.MemRefType.get([pairs, 2, k // RUN], f32))
        #: Per row and pair of columns, the float lanes of `integer_dots`
        #: between the chunks of K (`chunked_dots`).
        self.partials = self.entry_alloca(ir.MemRefType.get([rows, pairs, RUN], f32))

    def store_run_sum(self, value, local, run) -> None:
        """Run `run`'s sum d_a sum(qa) of the tile's row `local`, at `run`
        and, with its block's halves swapped, at `run` xor 8."""
        memref.store(value, self.run_sums, [local, self.cidx(0), run])
        memref.store(value, self.run_sums, [local, self.cidx(1), arith.xori(run, self.cidx(8))])

    @staticmethod
    def column_pairs(ncols: int) -> list:
        """The pairs of unpacked columns whose products share vectors (a
        lone column with itself)."""
        return [(c, c + 1) for c in range(0, ncols, 2)] if ncols % 2 == 0 else [(0, 0)]

    def multiply_integer(self, rows, c0, cols) -> None:
        """`multiply` for a K-quant weight: one row by `multiply_float`
        (its unpacking in registers: the weights' bytes bound it); two rows
        or more unpack each group of COLS columns into the panels once and
        take their rows PANEL_STEP at a time (`chunked_dots`, then
        `integer_dots`); no rows (an empty MoE expert tile) nothing.
        (Tiles of 2 to 7 rows unpacked once per step of
        ROWS rows before: the same work up to ROWS rows, more above, and a
        second copy of the unpacking and the products in the code.)"""
        single = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, rows, self.cidx(1)),
                          has_else=True)
        with ir.InsertionPoint(single.then_block):
            self.multiply_float(rows, c0, cols, single=True)
            scf.yield_([])
        with ir.InsertionPoint(single.else_block):
            # No rows (an expert tile no token was routed to) unpack nothing:
            # the panels' unpacking reads all of the weight whatever the rows.
            some = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(2)))
            with ir.InsertionPoint(some.then_block):
                self.by_columns(lambda columns: self.chunked_dots(rows, columns), c0, cols)
                scf.yield_([])
            scf.yield_([])

    def chunked_dots(self, rows, columns: list) -> None:
        """The products of the tile's `rows` rows with `columns` from the
        panels: K in chunks of CHUNK values, each unpacked (`unpack_integer`)
        and then read by all row steps of PANEL_STEP rows, their float
        lanes kept in `partials` between chunks; one chunk where K is no
        longer."""
        blocks = self.k // packed.FORMATS[self.weight.dtype].block
        per = self.CHUNK // packed.FORMATS[self.weight.dtype].block
        if blocks <= per:
            self.unpack_integer(columns, self.cidx(0), self.cidx(blocks))
            self.each_row_step(rows, self.PANEL_STEP, lambda local, count: self.integer_dots(
                local, count, columns))
            return
        npairs = len(self.column_pairs(len(columns)))
        each = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(each.body):
            for p in range(npairs):
                vector.store(self.vzero(RUN), self.partials,
                             [each.induction_variable, self.cidx(p), self.cidx(0)])
            scf.yield_([])
        chunks = scf.ForOp(self.cidx(0), self.cidx(-(-blocks // per)), self.cidx(1))
        with ir.InsertionPoint(chunks.body):
            first = arith.muli(chunks.induction_variable, self.cidx(per))
            last = arith.minui(arith.addi(first, self.cidx(per)), self.cidx(blocks))
            self.unpack_integer(columns, first, last)
            self.each_row_step(rows, self.PANEL_STEP, lambda local, count: self.integer_dots(
                local, count, columns, first, last))
            scf.yield_([])
        each = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(each.body):
            local = each.induction_variable
            pairs = self.column_pairs(len(columns))
            for p in range(npairs):
                acc = vector.load(self.vtype(RUN), self.partials, [local, self.cidx(p),
                                                                   self.cidx(0)])
                self.store_pair(local, [columns[c] for c in pairs[p]], acc)
            scf.yield_([])

    def store_pair(self, local, columns: list, acc) -> None:
        """The products of the tile's row `local` with a pair of columns
        (lanes 0-7 the first's, 8-15 the second's; a lone column's 8 lanes
        each hold all its products)
        from `integer_dots`' lanes `acc`, to `store_product`."""
        reassoc = ir.Attribute.parse("#arith.fastmath<reassoc>")
        half = RUN // 2
        for column, lanes in zip(dict.fromkeys(columns), (range(half), range(half, RUN))):
            part = vector.shuffle(acc, acc, list(lanes))
            self.store_product(local, column, vector.reduction(
                self.f32, ir.Attribute.parse("#vector.kind<add>"), part, fastmath=reassoc))

    def unpack_integer(self, columns: list, first, last) -> None:
        """Each column's unsigned integer weights and scales as 16-bit
        lanes (per step: lane p multiplies values 2p and 2p + 1), and per
        pair of columns (`column_pairs`) d per block in 8 lanes each, and
        the block's 16 corrections of both as two vectors that meet the
        row's run sums in order (lanes 0-7: the first column's runs 0-7,
        8-15: the second's runs 8-15) and halves swapped."""
        fmt = packed.FORMATS[self.weight.dtype]
        loop = scf.ForOp(first, last, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            sb = loop.induction_variable
            base = arith.muli(sb, self.cidx(fmt.nbytes))
            parts = []
            for c, column in enumerate(columns):
                weights, scales, d, corrections = self.integer_parts(fmt, column, base)
                parts.append((d, corrections))
                for s in range(fmt.block // STEP):
                    vector.store(weights[s], self.weights_panel,
                                 [self.cidx(c), self._at(sb, fmt.block, s * STEP)])
                    vector.store(scales[s], self.step_scales,
                                 [self.cidx(c), self._at(sb, fmt.block // 2, s * STEP // 2)])
            half = RUN // 2
            for p, (c0, c1) in enumerate(self.column_pairs(len(columns))):
                (d0, m0), (d1, m1) = parts[c0], parts[c1]
                at = [self.cidx(p), self._at(sb, RUN, 0)]
                lanes = self.vtype(half)
                vector.store(vector.shuffle(vector.broadcast(lanes, d0),
                                            vector.broadcast(lanes, d1), list(range(RUN))),
                             self.block_scales, at)
                for swapped, order in enumerate((list(range(half)) + list(range(24, 32)),
                                                 list(range(half, RUN)) + list(range(16, 24)))):
                    vector.store(vector.shuffle(m0, m1, order), self.corrections,
                                 [self.cidx(p), self.cidx(swapped), self._at(sb, RUN, 0)])
            scf.yield_([])

    def _at(self, sb, per_block: int, offset: int) -> ir.Value:
        return arith.addi(arith.muli(sb, self.cidx(per_block)), self.cidx(offset))

    def integer_parts(self, fmt, column, base) -> tuple:
        """Column `column`'s block at byte `base` as (4 vector<64xi8> of
        unsigned weights, 4 vector<32xi16> of scales, d, the 16
        corrections c_j as a vector<16xf32>)."""
        groups = self.weight_groups(fmt, column, base)  # unsigned with VNNI
        weights = [vector.shuffle(groups[2 * s][0], groups[2 * s + 1][0], list(range(STEP)))
                   for s in range(4)]
        row = self.weight_row(column)
        i16x32 = ir.VectorType.get([STEP // 2], self.i16)
        if fmt.name == "q6_k":
            d = self.half(row, arith.addi(base, self.cidx(208)))
            raw = self.raw_bytes(row, arith.addi(base, self.cidx(192)), 16)
            # Step s's lane p: values 64 s + 2p, + 1, of run 4 s + p // 8.
            scales = [arith.extsi(i16x32, vector.shuffle(raw, raw, [4 * s + p // 8
                                                                   for p in range(32)]))
                      for s in range(4)]
            corrections = arith.mulf(arith.sitofp(self.vtype(RUN), raw),
                                     vector.broadcast(self.vtype(RUN),
                                                      arith.mulf(d, self.cf32(-32.0))))
            return weights, scales, d, corrections
        d = self.half(row, base)
        dmin = self.half(row, arith.addi(base, self.cidx(2)))
        both = self.k_scale_bytes(self.raw_bytes(row, arith.addi(base, self.cidx(4)), 16))
        # Bytes 0-7 of `both`: the 8 scales (runs 2j, 2j + 1); 8-15: minimums.
        scales = [arith.extui(i16x32, vector.shuffle(both, both, [2 * s + p // 16
                                                                 for p in range(32)]))
                  for s in range(4)]
        minimums = vector.shuffle(both, both, [8 + j // 2 for j in range(RUN)])
        corrections = arith.mulf(arith.uitofp(self.vtype(RUN), minimums),
                                 vector.broadcast(self.vtype(RUN), arith.negf(dmin)))
        return weights, scales, d, corrections

    def integer_dots(self, local, nrows: int, columns: list, first=None, last=None) -> None:
        """The products of the panel's rows `local` + r, r < nrows, with the
        unpacked `columns` (to `store_product`; with `first` and `last`,
        over K's blocks first .. last - 1 only, added to `partials`): per block of 256 values
        and (row, column), 4 steps of `vpmaddubsw` and `vpdpwssd` into
        32-bit lanes; then per pair of columns their lanes folded into one
        vector (8 lanes each), one convert and one FMA by d d_a, and two
        FMAs of the corrections with the row's run sums."""
        fmt = packed.FORMATS[self.weight.dtype]
        rows = [arith.addi(local, self.cidx(r)) for r in range(nrows)]
        pairs = self.column_pairs(len(columns))
        i8x64 = ir.VectorType.get([STEP], self.i8)
        i16x32 = ir.VectorType.get([STEP // 2], self.i16)
        i32x16 = ir.VectorType.get([RUN], self.i32)
        zero = arith.constant(i32x16, ir.DenseElementsAttr.get_splat(
            i32x16, ir.IntegerAttr.get(self.i32, 0)))
        half = RUN // 2
        chunk = first is not None
        if chunk:
            starts = [vector.load(self.vtype(RUN), self.partials, [r, self.cidx(p), self.cidx(0)])
                      for r in rows for p in range(len(pairs))]
        else:
            first, last = self.cidx(0), self.cidx(self.k // fmt.block)
            starts = [self.vzero(RUN) for _ in range(nrows * len(pairs))]
        loop = scf.ForOp(first, last, self.cidx(1), starts)
        with ir.InsertionPoint(loop.body):
            sb = loop.induction_variable
            steps = range(fmt.block // STEP)
            accs = list(loop.inner_iter_args)
            xs = [[vector.load(i8x64, self.panel, [r, self._at(sb, fmt.block, s * STEP)])
                   for s in steps] for r in rows]
            # d_a of the row's block: the same in each of its 8 groups' slots.
            dxs = [vector.broadcast(self.vtype(RUN), memref.load(
                self.scales, [r, self._at(sb, fmt.block // self.BLOCK, 0)])) for r in rows]
            sums = [[vector.load(self.vtype(RUN), self.run_sums,
                                 [r, self.cidx(swapped), self._at(sb, RUN, 0)])
                     for swapped in range(2)] for r in rows]
            totals = {}
            for c in sorted({c for pair in pairs for c in pair}):
                at = self.cidx(c)
                ws = [vector.load(i8x64, self.weights_panel,
                                  [at, self._at(sb, fmt.block, s * STEP)]) for s in steps]
                scs = [vector.load(i16x32, self.step_scales,
                                   [at, self._at(sb, fmt.block // 2, s * STEP // 2)])
                       for s in steps]
                for r in range(nrows):
                    total = zero
                    for s in steps:
                        pairs_16 = self._intrinsic("llvm.x86.avx512.pmaddubs.w.512", i16x32,
                                                   ws[s], xs[r][s])
                        # The saturating form: the sums never come near
                        # 2^31, and LLVM splits the plain one into
                        # vpmaddwd + vpaddd (two instructions).
                        total = self._intrinsic("llvm.x86.avx512.vpdpwssds.512", i32x16,
                                                total, pairs_16, scs[s])
                    totals[r, c] = total
            for p, (c0, c1) in enumerate(pairs):
                d = vector.load(self.vtype(RUN), self.block_scales,
                                [self.cidx(p), self._at(sb, RUN, 0)])
                corrections = [vector.load(self.vtype(RUN), self.corrections,
                                           [self.cidx(p), self.cidx(swapped), self._at(sb, RUN, 0)])
                                for swapped in range(2)]
                for r in range(nrows):
                    first, second = totals[r, c0], totals[r, c1]
                    both = arith.addi(
                        vector.shuffle(first, second, list(range(half)) + list(range(16, 24))),
                        vector.shuffle(first, second, list(range(half, RUN)) + list(range(24, 32))))
                    at_rp = r * len(pairs) + p
                    acc = vector.fma(arith.sitofp(self.vtype(RUN), both), arith.mulf(d, dxs[r]),
                                     accs[at_rp])
                    for swapped in range(2):
                        acc = vector.fma(corrections[swapped], sums[r][swapped], acc)
                    accs[at_rp] = acc
            scf.yield_(accs)
        for at, acc in enumerate(loop.results):
            r, p = divmod(at, len(pairs))
            if chunk:
                vector.store(acc, self.partials, [rows[r], self.cidx(p), self.cidx(0)])
            else:
                self.store_pair(rows[r], [columns[c] for c in pairs[p]], acc)

    def raw_bytes(self, row, at, n: int) -> ir.Value:
        """`n` bytes of row `row` of the weight from byte `at`."""
        return vector.load(ir.VectorType.get([n], self.i8), self.buf(self.weight),
                           row_at(row, at))
