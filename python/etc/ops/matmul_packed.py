"""Matmul with a packed weight: C = A @ B^T where B (N, K) is stored in a
block format of `etc.packed` (the matmul family's `b` with an `etc.packed`
dtype; see docs/operators.md, "Packed weights").

The tasks, tiles, footprints and events are the matmul's (`matmul.py`):
only the tile reads B's blocks instead of its values.

Kernels:
* generic, and formats without a vector kernel: the scalar tile
  (`matmul_scalar.Matmul`), whose loads of B dequantize each value
  (`packed_loads`) and accumulate in f32: the widened weights' product up
  to the order of the sums;
* cuda (`MatmulPackedGPU`, also with simulated lanes): the GEMV of
  `matmul_gemv.MatmulSkinnyT` (warps own rows of B^T, lanes split K,
  shuffle reductions) whose lanes take chunks of 16 values of each row,
  c = lane, lane + 32, ...: the chunk's quants in
  16-byte loads from the weight's GPU layout (`etc.packed`:
  `to_gpu_layout`, made once at upload), its scales beside them,
  dequantized in registers (`packed_vectors`) and accumulated in f32 as
  the widened product is, A's 16 values in aligned loads;
* cpu, fp8_e4m3: `matmul_fp8.py` (f32 dot products with B dequantized
  in registers; e4m3 values are not integers times a scale, so the int8
  kernels below do not apply);
* cpu, the GGML formats (`MatmulPackedCPU`, on `PackedDotsCPU`, which MoE's packed expert
  tiles share: `moe_experts.py`): int8 dot products, as llama.cpp
  computes on the CPU, on column tiles up to 1024 wide
  (`MatmulPackedCPU.tile_for`). The tile first quantizes its rows of A into a stack panel:
  each block of 32 values (256 where the tile's weights are all
  K-quants: `packed.activation_block`) gets d = max|x| / 127 and
  q = round(x / d) (-127 .. 127, a float32 scale); with AVX-512 VNNI the
  K-quants then take their sub-block scales in integers
  (`packed_k_dots.IntegerScaleDots`, as llama.cpp's Q8_K products).
  Otherwise each (row, column) is a sum over
  blocks of d_a d_b times the block's integer dot product, which AVX2
  computes 32 products at a time (`vpsignb`, `vpmaddubsw`, `vpmaddwd`:
  exact, the i16 pair sums stay below 2 x 128 x 127), and VNNI in one
  `vpdpbusd` of the weights read as unsigned bytes q + z (z: the
  format's zero point, `ZERO_POINTS`) starting from -z times the row's
  sums of 4 values (computed once per row and block as the row is
  quantized). Each step unpacks COLS columns' blocks once for ROWS rows
  of A; a minimum's term d_a sum(q) m joins the same accumulators. The activations'
  rounding is the only difference from the widened product: at most
  d_a / 2 per value, so |C - C_widened| <= sum_k |w_k| d_a(k) / 2 (plus
  float32 rounding), the bound the tests check.

Why int8 rather than widening B to f32 FMAs: a C prototype of both on the
2-core EPYC VM (x86-64-v3 code, 2 threads, a 100 MB Q8_0 weight, K = 576,
the machine loaded by other work; best of 7) took 3.6-7.8 ms (int8) vs
9.8-12.0 ms (f32 widening; 6.2 ms with block sums) at B = 1, 6.2-7.4 vs
14.4-28.0 ms at B = 4 and 29.9-83.1 vs 72.0-102.4 ms at B = 16: widening
costs 3 instructions per 8 weights and leaves decode short of the memory
bandwidth (28 GB/s reached by int8). AVX-VNNI `vpdpbusd` on 256-bit
vectors was no faster than `vpmaddubsw` + `vpmaddwd` there at B = 1
(4.0-6.2 ms), where the weights' bytes bound the time; batches are bound
by instructions: SmolLM2-135M Q4_1 at B = 8 (2 workers, 2026-11-27),
matmul workers' time per step 37.0-37.6 ms (AVX2, 2 rows per step) ->
33.1-33.9 ms (VNNI) -> 29.5-30.7 ms (VNNI, 4 rows per step); with two
groups of 32 per 512-bit step 25.7-26.1 ms against 29.8-30.4 ms for the
256-bit steps in the same run (loaded machine; B = 1 unchanged at
8.5-9.1 ms). What remains per step is mostly unpacking: each column's
nibbles, scales and minimums, and each row's scales, cost more
instructions than the 16 pairs' products. So tiles of PANEL_ROWS rows or
more unpack each group of columns once into a stack panel that all their
row steps read: one tile on one worker (best of 25, loaded machine),
Q4_K 1.13-1.21x faster at 16-64 rows and 1.8-2.3x at 256, Q8_0 (whose
unpacking is one xor) 0.96-1.16x.
"""

from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .. import packed
from .matmul_cpu import MatmulCPU
from .base import TileKernel
from .matmul_fp8 import choose_fp8
from .packed_int8 import Int8Vectors
from .packed_k_dots import IntegerScaleDots
from .matmul_scalar import Matmul
from .packed_loads import row_at
from .matmul_packed_gpu import MatmulPackedGPU


def choose_packed(op, target) -> type:
    """The kernel of matmul `op` whose `b` is packed, on `target`."""
    if target.kind == "cpu" and MatmulPackedCPU.applies(op):
        return MatmulPackedCPU   # `matmul.build_tasks` may take MatmulPackedAMX instead
    if target.kind == "cpu" and choose_fp8(op, target) is not None:
        return choose_fp8(op, target)
    if MatmulPackedGPU.applies(op, target):
        return MatmulPackedGPU
    return Matmul


#: With VNNI, the unsigned byte each format's integer weight q is read as:
#: q + ZERO_POINTS[format] (0 .. 255; the formats with a minimum are
#: unsigned already).
ZERO_POINTS = {"q8_0": 128, "q4_0": 8, "iq4_nl": 128, "mxfp4": 128, "q5_0": 16, "q6_k": 32,
               "q4_1": 0, "q5_1": 0, "q4_k": 0, "q5_k": 0}


#: The formats whose values have a minimum (value = d q + m): their
#: products need each block's sum of the quantized activations.
MINIMUM_FORMATS = ("q4_1", "q5_1", "q4_k", "q5_k")


class PackedDotsCPU(IntegerScaleDots, Int8Vectors, TileKernel):
    """Products of a tile's rows of activations with the rows of packed
    weights by int8 dot products over quantized blocks (see the module
    docstring): `prepare` the stack panel, `quantize_rows` once, then
    `multiply` by each weight the tile reads. Subclasses say where a row
    of activations is (`activation_row`), which rows of blocks a weight's
    column is (`weight_row`) and what becomes of a product
    (`store_product`). The byte reads, unpacking and int8 products are
    `packed_int8.Int8Vectors`'."""

    #: Values per block of quantized activations.
    BLOCK = 32
    #: Rows of A and columns of C each micro-kernel step shares loads over
    #: (ROWS x COLS accumulators): 4 rows where AVX-512 gives 32 vector
    #: registers, else 2.
    ROWS = 4
    ROWS_16_REGISTERS = 2
    COLS = 4
    #: Tiles of at least this many rows unpack each group of COLS columns
    #: once into a stack panel (`unpack_columns`) that all their row steps
    #: read, instead of unpacking the blocks again for every ROWS rows.
    PANEL_ROWS = 8

    def activation_row(self, local) -> tuple:
        """The tensor and leading indices of the tile's row `local` of
        activations (K values along the last dimension)."""
        raise NotImplementedError(f"{type(self).__name__}.activation_row")

    def weight_row(self, column):
        """The row of blocks (`packed_loads` row: an index, or a list) of
        the weight being multiplied that gives column `column`."""
        return column

    def store_product(self, local, column, total: ir.Value) -> None:
        """Takes the product of the tile's row `local` with `column`."""
        raise NotImplementedError(f"{type(self).__name__}.store_product")

    def prepare(self, k: int, rows: int, formats) -> None:
        """The stack panel for `rows` rows of `k` values, quantized for
        weights of `formats`."""
        self.k = k
        self.blocks = k // self.BLOCK
        self.i8 = ir.IntegerType.get_signless(8)
        self.i16 = ir.IntegerType.get_signless(16)
        self.i32 = ir.IntegerType.get_signless(32)
        self.avx2 = self.target.has("avx2")
        #: With VNNI the weights are read as unsigned bytes minus the
        #: format's zero point (see ZERO_POINTS), one `vpdpbusd` per block.
        self.vnni = self.target.has("avxvnni") or self.target.has("avx512vnni")
        #: AVX-512 VNNI: two groups of 32 values per 512-bit step.
        self.wide = self.vnni and self.target.has("avx512vnni")
        #: Values per block of quantized activations: 256 for K-quants
        #: (`packed.activation_block`), whose sub-block scales then
        #: multiply integers with AVX-512 VNNI (`IntegerScaleDots`).
        self.activation_block = packed.activation_block(formats)
        self.integer = self.wide and self.activation_block > self.BLOCK
        self.panel = self.entry_alloca(ir.MemRefType.get([rows, k], self.i8))
        #: Each block of 32's d_a (the same in the 8 of a block of 256).
        self.scales = self.entry_alloca(ir.MemRefType.get([rows, self.blocks], self.f32))
        #: Each block's sum of q, for formats whose values have a minimum.
        self.sums = self.entry_alloca(ir.MemRefType.get([rows, self.blocks], self.f32)) \
            if any(f in MINIMUM_FORMATS for f in formats) else None
        self.run_sums = None
        if self.integer:
            self.prepare_integer(k, rows)
        #: One group of COLS columns unpacked (`unpack_columns`): integer
        #: weights, and 8 lanes of scale (and of minimum) per group of 32.
        lanes = self.blocks * 8
        self.weights_panel = self.entry_alloca(ir.MemRefType.get([self.COLS, k], self.i8))
        self.scales_panel = self.entry_alloca(ir.MemRefType.get([self.COLS, lanes], self.f32))
        self.minimums_panel = self.entry_alloca(
            ir.MemRefType.get([self.COLS, lanes], self.f32)) \
            if any(f in MINIMUM_FORMATS for f in formats) else None
        #: Per row and block of A and per zero point z, 8 lanes of -z x
        #: (the sum of 4 values): `vpdpbusd`'s starting value, so that it
        #: sums (w + z - z) x.
        zeros = sorted({ZERO_POINTS[f] for f in formats} - {0}) if self.vnni else []
        self.inits = {zero: self.entry_alloca(ir.MemRefType.get([rows, self.blocks * 8],
                                                                self.i32))
                      for zero in zeros}

    def multiply(self, weight, rows, c0, cols) -> None:
        """The products of the tile's `rows` quantized rows with columns
        `c0` .. + `cols` of packed `weight` (its rows of blocks, by
        `weight_row`), each given to `store_product`."""
        self.weight = weight
        if self.integer:
            self.multiply_integer(rows, c0, cols)
        else:
            self.multiply_float(rows, c0, cols)

    def multiply_float(self, rows, c0, cols, single: bool = False) -> None:
        """`multiply` with float scales per group of 32 values; `single`:
        the caller knows `rows` is 1, so only the one row's code (the
        columns unpacked in registers) is emitted."""
        dtype = self.weight.dtype
        self.zero = ZERO_POINTS[dtype] if self.vnni else 0
        self.has_minimum = dtype in MINIMUM_FORMATS
        if single:
            self.by_columns(lambda columns: self.emit_dots(self.cidx(0), 1, columns), c0, cols)
            return
        step = self.ROWS if self.target.has("avx512f") else self.ROWS_16_REGISTERS
        many = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(self.PANEL_ROWS)),
                        has_else=True)
        with ir.InsertionPoint(many.then_block):
            self.by_columns(lambda columns: self.each_row_step(
                rows, step, lambda local, count: self.emit_dots(local, count, columns,
                                                                from_panel=True)),
                c0, cols, unpack=self.unpack_columns)
            scf.yield_([])
        with ir.InsertionPoint(many.else_block):
            self.each_row_step(rows, step, lambda local, count: self.by_columns(
                lambda columns: self.emit_dots(local, count, columns), c0, cols))
            scf.yield_([])

    def each_row_step(self, rows, step: int, body) -> None:
        """`body(local, count)` for the tile's rows in steps of `step`:
        count = step, then the rows left (fewer)."""
        pairs = arith.divui(rows, self.cidx(step))
        loop = scf.ForOp(self.cidx(0), pairs, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            body(arith.muli(loop.induction_variable, self.cidx(step)), step)
            scf.yield_([])
        for count in range(1, step):
            left = arith.subi(rows, arith.muli(pairs, self.cidx(step)))
            branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, left, self.cidx(count)))
            with ir.InsertionPoint(branch.then_block):
                body(arith.muli(pairs, self.cidx(step)), count)
                scf.yield_([])

    # -- activations -------------------------------------------------------

    def quantize_rows(self, rows) -> None:
        """The tile's rows of activations as int8 blocks in the panel, each
        block's scale d = max|x| / 127 beside them (one d per
        `activation_block` values, stored for each of its groups of 32);
        with integer sub-block scales also d times the sum of q of each
        run of 16 (`run_sums`)."""
        half = self.BLOCK // 2
        block = self.activation_block
        groups = block // self.BLOCK
        each = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(each.body):
            local = each.induction_variable
            a, row = self.activation_row(local)
            blocks = scf.ForOp(self.cidx(0), self.cidx(self.k // block), self.cidx(1))
            with ir.InsertionPoint(blocks.body):
                ab = blocks.induction_variable
                first = arith.muli(ab, self.cidx(block))
                parts = [self.vload(a, [*row, arith.addi(first, self.cidx(h * half))], half)
                         for h in range(block // half)]
                magnitudes = [math.absf(p) for p in parts]
                while len(magnitudes) > 1:
                    magnitudes = [arith.maxnumf(magnitudes[i], magnitudes[i + 1])
                                  for i in range(0, len(magnitudes), 2)]
                largest = vector.reduction(self.f32, ir.Attribute.parse("#vector.kind<maxnumf>"),
                                           magnitudes[0])
                scale = arith.divf(largest, self.cf32(127.0))
                positive = arith.cmpf(arith.CmpFPredicate.OGT, largest, self.cf32(0.0))
                inverse = arith.select(positive, arith.divf(self.cf32(127.0), largest),
                                       self.cf32(0.0))
                for g in range(groups):
                    kb = arith.addi(arith.muli(ab, self.cidx(groups)), self.cidx(g))
                    self.quantize_group(local, kb, parts[2 * g:2 * g + 2], scale, inverse)
                scf.yield_([])
            scf.yield_([])

    def quantize_group(self, local, kb, parts: list, scale, inverse) -> None:
        """Group `kb` of 32 values (`parts`: two vector<16xf32>) of the
        tile's row `local` rounded with `inverse` = 1 / `scale` into the
        panel, and what the products need of it: its scale, its sum of q
        (a minimum's products), -z times each 4 values' sum (a VNNI zero
        point's starting sums), d_a times each run of 16's sum."""
        half = self.BLOCK // 2
        vtype = self.vtype(half)
        start = arith.muli(kb, self.cidx(self.BLOCK))
        memref.store(scale, self.scales, [local, kb])
        total = None
        qs = []
        for h, part in enumerate(parts):
            rounded = math.roundeven(arith.mulf(part, vector.broadcast(vtype, inverse)))
            q = arith.trunci(ir.VectorType.get([half], self.i8),
                             arith.fptosi(ir.VectorType.get([half], self.i32), rounded))
            vector.store(q, self.panel, [local, arith.addi(start, self.cidx(h * half))])
            qs.append(q)
            if self.sums is not None or self.run_sums is not None:
                part_sum = self.vsum(rounded)  # integers: exact in any order
                total = part_sum if total is None else arith.addf(total, part_sum)
            if self.run_sums is not None:
                run = arith.addi(arith.muli(kb, self.cidx(2)), self.cidx(h))
                self.store_run_sum(arith.mulf(scale, part_sum), local, run)
        if self.sums is not None:
            memref.store(total, self.sums, [local, kb])
        for zero, inits in self.inits.items():
            block = vector.shuffle(qs[0], qs[1], list(range(self.BLOCK)))
            lanes = ir.VectorType.get([8], self.i32)
            start_sums = arith.constant(lanes, ir.DenseElementsAttr.get_splat(
                lanes, ir.IntegerAttr.get(self.i32, 0)))
            shifted = self.vnni_dot(start_sums, self.splat_i8(zero - 256 * (zero > 127)), block)
            vector.store(arith.subi(start_sums, shifted), inits,
                         [local, arith.muli(kb, self.cidx(8))])

    # -- products ----------------------------------------------------------

    def by_columns(self, body, c0, cols, unpack=None) -> None:
        """`body(columns)` for the weight's columns `c0` .. + `cols`: groups
        of COLS columns a quarter of the tile apart (COLS long streams of
        B, as `MatmulCPU.emit_transposed`), one column at a time when the
        columns do not divide so; with `unpack` (`unpack_columns`, or
        `unpack_integer`), each group unpacked into the panels first by
        `unpack(columns)` and `body` reading them."""
        ncols = self.COLS

        def strided_groups() -> None:
            step = arith.divui(cols, self.cidx(ncols))
            groups = self.lane_loop(step)
            with ir.InsertionPoint(groups.body):
                first = arith.addi(c0, groups.induction_variable)
                columns = [arith.addi(first, arith.muli(self.cidx(c), step))
                           for c in range(ncols)]
                if unpack is not None:
                    unpack(columns)
                body(columns)
                scf.yield_([])

        if self.columns_divide():
            # Every count of columns this tile multiplies is a multiple of
            # COLS: the single columns' copy of `body` would be dead code.
            strided_groups()
            return
        strided = arith.cmpi(arith.CmpIPredicate.eq, arith.remui(cols, self.cidx(ncols)),
                             self.cidx(0))
        branch = scf.IfOp(strided, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            strided_groups()
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            singles = self.lane_loop(cols)
            with ir.InsertionPoint(singles.body):
                columns = [arith.addi(c0, singles.induction_variable)]
                if unpack is not None:
                    unpack(columns)
                body(columns)
                scf.yield_([])
            scf.yield_([])

    def columns_divide(self) -> bool:
        """Whether every count of columns `multiply` is given (the tile's
        columns, and what the tile unit leaves of them: a multiple of 32
        fewer) is known to be a multiple of COLS, so that `by_columns`
        needs no code for columns one at a time. No, unless a subclass
        knows its shapes."""
        return False

    def unpack_columns(self, columns: list) -> None:
        """Each column's integer weights, and 8 lanes of scale and of
        minimum per group of 32, into the panel's rows 0, 1, ..."""
        fmt = packed.FORMATS[self.weight.dtype]
        per_block = fmt.block // self.BLOCK
        loop = scf.ForOp(self.cidx(0), self.cidx(self.k // fmt.block), self.cidx(1))
        with ir.InsertionPoint(loop.body):
            sb = loop.induction_variable
            base = arith.muli(sb, self.cidx(fmt.nbytes))
            for c, column in enumerate(columns):
                for g, (weights, scale, minimum) in enumerate(
                        self.weight_groups(fmt, column, base)):
                    group = arith.addi(arith.muli(sb, self.cidx(per_block)), self.cidx(g))
                    vector.store(weights, self.weights_panel,
                                 [self.cidx(c), arith.muli(group, self.cidx(self.BLOCK))])
                    at = [self.cidx(c), arith.muli(group, self.cidx(8))]
                    vector.store(self.group_lanes([scale]), self.scales_panel, at)
                    if minimum is not None:
                        vector.store(self.group_lanes([minimum]), self.minimums_panel, at)
            scf.yield_([])

    def panel_group(self, c: int, group) -> tuple:
        """Group `group` of the panel's column `c`: as `weight_groups` gives
        one (integer weights, scale lanes, minimum lanes or None)."""
        weights = vector.load(ir.VectorType.get([self.BLOCK], self.i8), self.weights_panel,
                              [self.cidx(c), arith.muli(group, self.cidx(self.BLOCK))])
        at = [self.cidx(c), arith.muli(group, self.cidx(8))]
        scale = vector.load(self.vtype(8), self.scales_panel, at)
        minimum = vector.load(self.vtype(8), self.minimums_panel, at) \
            if self.has_minimum else None
        return weights, scale, minimum

    def by_groups(self, rows: list, columns: list, group_of) -> list:
        """The totals of `emit_dots` over K's groups of 32 in steps of
        `wide`'s span (an odd last group alone), `group_of(c, g)` giving
        column c's group g as `weight_groups` gives one."""
        span = 2 if self.wide else 1
        groups = self.k // self.BLOCK
        loop = scf.ForOp(self.cidx(0), self.cidx(groups // span), self.cidx(1),
                         self.zero_accumulators(len(rows), columns, span))
        with ir.InsertionPoint(loop.body):
            first = arith.muli(loop.induction_variable, self.cidx(span))
            column_groups = [[group_of(c, arith.addi(first, self.cidx(i))) for i in range(span)]
                             for c in range(len(columns))]
            scf.yield_(self.accumulate(list(loop.inner_iter_args), rows, first, column_groups))
        totals = self.lane_totals(loop.results)
        if groups % span:
            last = self.cidx(groups - 1)
            tail = self.accumulate(self.zero_accumulators(len(rows), columns, 1), rows, last,
                                   [[group_of(c, last)] for c in range(len(columns))])
            totals = [arith.addf(t, u) for t, u in zip(totals, self.lane_totals(tail))]
        return totals

    def emit_dots(self, local, nrows: int, columns: list, from_panel: bool = False) -> None:
        """The products of the panel's rows `local` + r, r < nrows, with
        every column of `columns` (to `store_product`): per group of 32
        values, the integer dot product of each quantized row with the
        column's integer weights (`weight_groups`), times both scales;
        formats with a minimum add its product with the row's block sum.
        With AVX-512 VNNI two groups go together in 512-bit vectors
        (`wide`; a last odd block of 32 alone). `from_panel`: the columns'
        groups are read from the panel `unpack_columns` filled."""
        fmt = packed.FORMATS[self.weight.dtype]
        rows = [arith.addi(local, self.cidx(r)) for r in range(nrows)]
        per_block = fmt.block // self.BLOCK
        span = 2 if self.wide else 1
        if from_panel:
            totals = self.by_groups(rows, columns, self.panel_group)
        elif per_block % span == 0:
            # Steps inside each block of the format.
            loop = scf.ForOp(self.cidx(0), self.cidx(self.k // fmt.block), self.cidx(1),
                             self.zero_accumulators(nrows, columns, span))
            with ir.InsertionPoint(loop.body):
                sb = loop.induction_variable
                base = arith.muli(sb, self.cidx(fmt.nbytes))
                groups = [self.weight_groups(fmt, column, base) for column in columns]
                accs = list(loop.inner_iter_args)
                for g in range(0, per_block, span):
                    first = arith.addi(arith.muli(sb, self.cidx(per_block)), self.cidx(g))
                    accs = self.accumulate(accs, rows, first,
                                           [column[g:g + span] for column in groups])
                scf.yield_(accs)
            totals = self.lane_totals(loop.results)
        else:
            # Blocks of 32 values two at a time, then an odd last one alone.
            totals = self.by_groups(rows, columns, lambda c, g: self.weight_groups(
                fmt, columns[c], arith.muli(g, self.cidx(fmt.nbytes)))[0])
        ncols = len(columns)
        for at, total in enumerate(totals):
            r, c = divmod(at, ncols)
            self.store_product(rows[r], columns[c], total)

    def zero_accumulators(self, nrows: int, columns: list, span: int) -> list:
        return [self.vzero(8 * span) for _ in range(nrows * len(columns))]

    def lane_totals(self, accs) -> list:
        return [vector.reduction(self.f32, ir.Attribute.parse("#vector.kind<add>"), acc,
                                 fastmath=ir.Attribute.parse("#arith.fastmath<reassoc>"))
                for acc in accs]

    def accumulate(self, accs: list, rows: list, first, column_groups: list) -> list:
        """`accs` (r-major over rows x columns, 8 lanes per group of 32)
        plus the products of groups first, first + 1, ... of each row with
        `column_groups[c]` (each column's `weight_groups` for them: one, or
        two with `wide`)."""
        span = len(column_groups[0])
        lanes = 8 * span
        ncols = len(column_groups)
        blocks = [arith.addi(first, self.cidx(i)) for i in range(span)]
        start = arith.muli(first, self.cidx(self.BLOCK))
        xs = [vector.load(ir.VectorType.get([self.BLOCK * span], self.i8), self.panel,
                          [r, start]) for r in rows]
        dxs = [[memref.load(self.scales, [r, block]) for block in blocks] for r in rows]
        # A minimum's products d_a sum(q) m, spread over each group's 8
        # lanes (1/8 each: exact) so that they join the accumulators.
        spread = [self.group_lanes([arith.mulf(arith.mulf(dx, memref.load(self.sums, [r, block])),
                                               self.cf32(1 / 8))
                                    for dx, block in zip(row_dxs, blocks)])
                  for r, row_dxs in zip(rows, dxs)] if self.has_minimum else []
        if self.vnni:
            # The zero point's products start each row's sums; the row and
            # column scales meet in one multiply per pair.
            lane_type = ir.VectorType.get([lanes], self.i32)
            inits = self.inits.get(self.zero)
            starts = [vector.load(lane_type, inits, [r, arith.muli(first, self.cidx(8))])
                      for r in rows] if inits is not None else \
                [arith.constant(lane_type, ir.DenseElementsAttr.get_splat(
                    lane_type, ir.IntegerAttr.get(self.i32, 0)))] * len(rows)
            dx_lanes = [self.group_lanes(row_dxs) for row_dxs in dxs]
        accs = list(accs)
        for c, groups in enumerate(column_groups):
            weights = groups[0][0] if span == 1 else \
                vector.shuffle(groups[0][0], groups[1][0], list(range(2 * self.BLOCK)))
            scale = groups[0][1] if span == 1 else self.group_lanes([g[1] for g in groups])
            minimum = None if groups[0][2] is None else self.group_lanes([g[2] for g in groups])
            if self.vnni:
                scale_lanes = self.group_lanes([scale]) if span == 1 else scale
            else:
                magnitudes = self.sign(weights, weights)
            for r in range(len(rows)):
                at = r * ncols + c
                if self.vnni:
                    dot = self.vnni_dot(starts[r], weights, xs[r])
                    both = arith.mulf(scale_lanes, dx_lanes[r])
                else:
                    dot = self.int8_dot(magnitudes, self.sign(xs[r], weights))
                    both = arith.mulf(scale, vector.broadcast(scale.type, dxs[r][0])) \
                        if isinstance(scale.type, ir.VectorType) else \
                        vector.broadcast(self.vtype(lanes), arith.mulf(scale, dxs[r][0]))
                accs[at] = vector.fma(arith.sitofp(self.vtype(lanes), dot), both, accs[at])
                if minimum is not None:
                    accs[at] = vector.fma(minimum, spread[r], accs[at])
        return accs

    def group_lanes(self, values: list) -> ir.Value:
        """One vector of 8 lanes per group of 32 values from each group's
        value: a scalar over its 8 lanes, or its own vector<8xf32>."""
        parts = [v if isinstance(v.type, ir.VectorType) else vector.broadcast(self.vtype(8), v)
                 for v in values]
        if len(parts) == 1:
            return parts[0]
        return vector.shuffle(parts[0], parts[1], list(range(16)))

    # -- weights -------------------------------------------------------------

    def weight_groups(self, fmt, column, base) -> list:
        """The groups of 32 values of column `column`'s block at byte `base`
        as (integer weights vector<32xi8>, scale, minimum): value j of the
        group is scale * weights[j] + minimum, where the scale is an f32 or
        a vector<8xf32> (the scale of each int8_dot lane's 4 values) and
        the minimum an f32 or None."""
        b = self.weight
        row = self.weight_row(column)
        half = lambda at: self.half(row, arith.addi(base, self.cidx(at)))  # noqa
        raw = lambda at, n: vector.load(ir.VectorType.get([n], self.i8), self.buf(b),  # noqa
                                        row_at(row, arith.addi(base, self.cidx(at))))
        name = fmt.name
        # With VNNI the integer weights stay unsigned, the zero point
        # (ZERO_POINTS) subtracted through the rows' starting sums.
        centred = (lambda q, zero: q) if self.vnni else \
            (lambda q, zero: arith.subi(q, self.splat_i8(zero)))  # noqa: E731
        if name == "q8_0":
            if self.vnni:  # w + 128: the sign bit flipped
                return [(arith.xori(raw(2, 32), self.splat_i8(-128)), half(0), None)]
            return [(raw(2, 32), half(0), None)]
        if name in ("q4_0", "iq4_nl"):
            q = self.nibbles(raw(2, 16))
            if name == "q4_0":
                return [(centred(q, 8), half(0), None)]
            table = packed.IQ4_NL_VALUES.astype(np.int16) + (128 if self.vnni else 0)
            return [(self.lookup(table.astype(np.uint8).view(np.int8), q), half(0), None)]
        if name == "mxfp4":
            # Doubled e2m1 integers, the scale 2^(e - 128) from byte 0.
            table = packed.MXFP4_VALUES.astype(np.int16) + (128 if self.vnni else 0)
            q = self.nibbles(raw(1, 16))
            return [(self.lookup(table.astype(np.uint8).view(np.int8), q),
                     self.e8m0(row, base), None)]
        if name == "q4_1":
            return [(self.nibbles(raw(4, 16)), half(0), half(2))]
        if name in ("q5_0", "q5_1"):
            at = 2 if name == "q5_0" else 4
            q = arith.ori(self.nibbles(raw(at + 4, 16)), self.fifth_bits(raw(at, 4)))
            if name == "q5_0":
                return [(centred(q, 16), half(0), None)]
            return [(q, half(0), half(2))]
        if name in ("q4_k", "q5_k"):
            d, dmin = half(0), half(2)
            qs = 16 if name == "q4_k" else 48
            high = raw(16, 32) if name == "q5_k" else None
            scales, minimums = self.k_scales_mins(raw(4, 16), d, dmin)
            out = []
            for g in range(8):
                packed_bytes = raw(qs + 32 * (g // 2), 32)
                q = self.low_nibbles(packed_bytes) if g % 2 == 0 else \
                    self.high_nibbles(packed_bytes)
                if high is not None:
                    bit = arith.andi(arith.shrui(high, self.splat_i8(g)), self.splat_i8(1))
                    q = arith.ori(q, arith.shli(bit, self.splat_i8(4)))
                out.append((q, vector.extract(scales, [], [g]),
                            vector.extract(minimums, [], [g])))
            return out
        if name == "q6_k":
            # The 16 int8 scales of the block converted and scaled together.
            scales_d = arith.mulf(arith.sitofp(self.vtype(16), raw(192, 16)),
                                  vector.broadcast(self.vtype(16), half(208)))
            out = []
            for h in range(2):
                high = raw(128 + 32 * h, 32)
                for run in range(4):
                    low_bytes = raw(64 * h + 32 * (run % 2), 32)
                    low = self.low_nibbles(low_bytes) if run < 2 else self.high_nibbles(low_bytes)
                    top = arith.andi(arith.shrui(high, self.splat_i8(2 * run)), self.splat_i8(3))
                    q = centred(arith.ori(low, arith.shli(top, self.splat_i8(4))), 32)
                    first = 8 * h + 2 * run  # the scales of values 0-15 and 16-31
                    lane_scales = vector.shuffle(scales_d, scales_d,
                                                 [first] * 4 + [first + 1] * 4)
                    out.append((q, lane_scales, None))
            return out
        raise NotImplementedError(f"MatmulPackedCPU: no vector read of {name}")


class MatmulPackedCPU(PackedDotsCPU, Matmul):
    """C = A @ B^T with B packed, by int8 dot products over quantized
    blocks of A (see the module docstring)."""

    #: The formats this kernel reads: the GGML block formats, whose values
    #: are integers times a scale (fp8_e4m3's are not: the scalar tile
    #: reads it, each value dequantized as it is loaded).
    FORMATS = packed.GGML_FORMATS

    #: The widest column tile. Each tile quantizes its rows of A and sets
    #: up its panels anew, so packed tiles are wider than `MatmulCPU`'s
    #: 256 columns: one 8192 x 2048 Q4_K matmul, 2 workers, best of 50
    #: (2026-11-28, loaded machine): tiles of 256 / 512 / 1024 columns
    #: 0.24 / 0.22-0.23 / 0.21-0.22 ms at B = 1, 1.27-1.41 / 1.08-1.35 /
    #: 1.03-1.28 ms at B = 16; one worker, B = 16: Q4_K 2.37 / 2.09 /
    #: 2.05 ms, Q6_K 2.67 / 2.52 / 2.35 ms.
    WIDEST = 1024

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """`MatmulCPU.tile_for`'s rule (every worker the same number of
        column tiles, at least two each) with tiles up to WIDEST columns,
        multiples of 16; `MatmulCPU`'s tile where none divides N so."""
        n = op.operands[1].shape[0]
        if op.params["transpose_b"] and isinstance(n, int):
            for tn in range(cls.WIDEST, 15, -16):
                tiles = n // tn
                if n % tn == 0 and tiles >= 2 * target.workers and tiles % target.workers == 0:
                    return (op.tile[0], tn)
        return MatmulCPU.tile_for(op, target)

    @classmethod
    def name(cls, op) -> str:
        return f"matmul_{op.operands[1].dtype}_cpu"

    @classmethod
    def applies(cls, op) -> bool:
        return op.operands[1].dtype in cls.FORMATS

    def emit(self) -> None:
        rows, c0, cols = self.prepare_tile()
        self.emit_vnni(rows, c0, cols)

    def prepare_tile(self) -> tuple:
        """The tile's live rows (its first in `r0`), first column and
        columns, its stack panel prepared."""
        op, out = self.op, self.op.result
        tm, tn = op.tile
        self.r0, rows = self.row_block(out, tm)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        cols = self.extent(out, 1, c0, tn)
        self.prepare(op.operands[0].shape[1], tm, [op.operands[1].dtype])
        return rows, c0, cols

    def emit_vnni(self, rows, c0, cols) -> None:
        """The tile's products as int8 dots over its quantized rows."""
        self.quantize_rows(rows)
        self.multiply(self.op.operands[1], rows, c0, cols)

    def columns_divide(self) -> bool:
        """N and the column tile static multiples of COLS: every tile's
        count of columns is too (the edge tile's N - c0 included)."""
        n = self.op.operands[1].shape[0]
        return isinstance(n, int) and n % self.COLS == 0 and self.op.tile[1] % self.COLS == 0

    def activation_row(self, local) -> tuple:
        return self.op.operands[0], [arith.addi(self.r0, local)]

    def store_product(self, local, column, total: ir.Value) -> None:
        self.store(total, self.op.result, [arith.addi(self.r0, local), column])

