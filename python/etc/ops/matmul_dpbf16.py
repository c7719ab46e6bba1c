"""The CPU matmul tile on AVX-512 BF16 dot products (`MatmulDPBF16`):
C = A @ B^T for bf16 A and B^T, the layout of Hugging Face weights, on a
CPU with `avx512bf16` (`vdpbf16ps`: 32 bf16 products summed in pairs into
16 f32 lanes per instruction, twice the multiply-adds of widening to f32).

Both operands' rows run along K, so they are read in place, nothing is
packed: a block of BLOCK_ROWS rows of A by BLOCK_COLS rows of B^T keeps one
16-lane f32 accumulator per output, and each step of 32 along K loads each
row's 64 bytes once and takes one dot product per accumulator. After the K
loop the block's accumulators of each row are summed across their lanes together
(`each_sum`: a tree of shuffles and adds that halves the vectors' lanes at
each level, 8 vector adds for 8 outputs instead of 8 reductions), and the
row is stored as a vector of BLOCK_COLS columns.

K longer than PANEL_K = 2048 is taken in chunks (`emit_chunks`, the last
one shorter): for each group of columns, each chunk's blocks of rows one
after another, their sums carried in f32 from one chunk to the next (a
stack buffer of the tile's rows by BLOCK_COLS; 2 stores, 2 loads and 16
lane inserts per block and chunk). A group's 8 rows of B^T over all of K
are 16 K bytes and a block's 2 rows of A 4 K more: past K = 2400 they no
longer fit the 48 KB L1 of a Zen 5 core, and each of a tile's 16 blocks
of a group read all 10 of its 64-byte loads per K step from L2 (1 MB,
which the tile's 32 rows of A, 64 K bytes, nearly fill at K = 12288 too).
A chunk of 2048 keeps the group's 32 KB and the block's 8 KB in L1 (8 of
the 10 loads) and the tile's rows of A of a chunk (128 KB) in L2.
Expected: K up to 2048 unchanged (the rows fit already), K of 3072 and
more bounded by the dot products instead of L2 (the FP8 kernel's chunks
took 0.65-0.83x the time). Measured (2026-11-28, M = 128 and 512, 2
workers, loaded 2-core VM, best of 4-5 x 5, alternating): chunks of 2048
took 0.72-0.86x the time of all of K at K = 3072, 0.65-0.71x at 8192 and
0.63-0.66x at 12288; chunks of 1536 the same, 2560 0.72-0.82x, 1024
0.67-0.81x but 1.05-1.06x at K = 1536 and 2048 (which 2048 leaves
whole). `MatmulFp8DPBF16` takes every K in chunks (of 1024), through its
panel.

Tiles with fewer than CROSSOVER rows (decode at B = 1) take the GEMV of
`MatmulCPU`, chosen per tile at run time from its live row count: one
compiled kernel serves every batch.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

from .base import element_type
from .matmul_cpu import MatmulCPU


class MatmulDPBF16(MatmulCPU):
    """C = A @ B^T on `vdpbf16ps` (x86vector's `avx512.dot`) for tiles of
    CROSSOVER rows or more, `MatmulCPU` below."""

    #: Rows of A and of B^T one block takes: BLOCK_ROWS x BLOCK_COLS
    #: accumulators, and as many 64-byte loads per K step as rows. The
    #: blocks of a group of columns run one after another, so its rows of
    #: B^T stay in L1 and each K step loads BLOCK_ROWS rows of A from L2:
    #: 2 x 8 was the fastest of 1 x 8, 1 x 16, 2 x 6, 2 x 8, 2 x 10, 2 x 12,
    #: 3 x 6, 3 x 8, 4 x 4, 4 x 6 and 6 x 4 on M x K x N = 512 x 2048 x
    #: 2048, 486 x 576 x 1536 and 486 x 1536 x 576: 0.84-0.96x the time of
    #: 4 x 4 (2026-11-27, one worker, 64-byte aligned operands, best CPU
    #: time of 12 runs each, in two runs).
    BLOCK_ROWS = 2
    BLOCK_COLS = 8
    #: bf16 elements of each operand per dot product (a 512-bit register).
    K_STEP = 32
    #: Tiles with at least this many rows take the dot products. Measured
    #: (2026-11-27, K x N = 576 x 1536 and 1536 x 576, 1 and 2 workers,
    #: best of 90 runs): one row as fast as the GEMV (0.88-1.02x its time),
    #: 2 rows 0.77-1.06x, 3 and more 0.33-0.63x.
    CROSSOVER = 2
    #: Elements of K each group of columns takes at a time: its BLOCK_COLS
    #: rows of B^T over a chunk are 32 KB, which stay in L1 beside the
    #: block's 8 KB of A (module docstring: 2048 against 1024, 1536 and
    #: 2560). K up to PANEL_K is taken whole, as before chunks.
    PANEL_K = 2048
    #: While `emit_chunks` emits: the chunk of K the blocks take (its start
    #: and length) and the tile's carried sums.
    k_chunk = None
    carry = None

    @classmethod
    def name(cls, op) -> str:
        return "matmul_dpbf16"

    @classmethod
    def applies(cls, op, target) -> bool:
        a, b = op.operands[:2]
        return (target.has("avx512bf16") and op.params["transpose_b"]
                and a.dtype == b.dtype == "bf16" and isinstance(a.shape[1], int))

    def emit(self) -> None:
        self.by_rows(self.CROSSOVER, self.emit_blocks,
                     lambda: MatmulCPU.emit_few(self, self.CROSSOVER - 1))

    def by_rows(self, crossover: int, wide, narrow) -> None:
        """`wide(r0, rows, c0, cols)` (the tile's first row, live rows,
        first column and columns) for tiles of `crossover` rows or more,
        `narrow()` for the others: chosen per tile at run time."""
        tm, tn = self.op.tile
        r0, rows = self.row_block(self.op.result, tm)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        cols = self.extent(self.op.result, 1, c0, tn)
        branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(crossover)),
                          has_else=True)
        with ir.InsertionPoint(branch.then_block):
            wide(r0, rows, c0, cols)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            narrow()
            scf.yield_([])

    def emit_blocks(self, r0, rows, c0, cols) -> None:
        """The tile as blocks of BLOCK_ROWS x BLOCK_COLS outputs, the blocks
        of one group of columns one after another (their rows of B^T stay in
        L1 while the tile's rows of A go by), all of K at once; K longer
        than PANEL_K in chunks (`emit_chunks`). An edge block computes rows
        and columns past the tile again from the tile's last row and column
        (the loads stay in bounds) and stores only its own."""
        if self.op.operands[0].shape[1] > self.PANEL_K:
            self.emit_chunks(r0, rows, c0, cols)
            return
        nr, nc = self.BLOCK_ROWS, self.BLOCK_COLS
        row_groups = arith.divui(arith.addi(rows, self.cidx(nr - 1)), self.cidx(nr))
        col_groups = arith.divui(arith.addi(cols, self.cidx(nc - 1)), self.cidx(nc))
        last_row = arith.subi(arith.addi(r0, rows), self.cidx(1))
        last_col = arith.subi(arith.addi(c0, cols), self.cidx(1))
        loop = self.lane_loop(arith.muli(row_groups, col_groups))
        with ir.InsertionPoint(loop.body):
            g = loop.induction_variable
            row = arith.addi(r0, arith.muli(arith.remui(g, row_groups), self.cidx(nr)))
            col = arith.addi(c0, arith.muli(arith.divui(g, row_groups), self.cidx(nc)))
            self.emit_block(row, col, last_row, last_col)
            scf.yield_([])

    def emit_chunks(self, r0, rows, c0, cols) -> None:
        """The tile's groups of BLOCK_COLS columns one after another; in
        each, the chunks of PANEL_K along K one after another (the last one
        shorter), every block of rows over a chunk (`take_chunk` first):
        the sums of the blocks of a chunk before the last are kept in
        `carry` (f32 per row and column of the tile) and a later chunk's
        accumulators start from them; the last chunk's blocks store."""
        nr, nc = self.BLOCK_ROWS, self.BLOCK_COLS
        k = self.op.operands[0].shape[1]
        chunk = min(k, self.PANEL_K)
        last = (k - 1) // chunk * chunk  # where the last chunk starts
        self.r0, self.carry = r0, None
        if last:
            self.carry = self.entry_alloca(ir.MemRefType.get([self.op.tile[0], nc], self.f32))
        row_groups = arith.divui(arith.addi(rows, self.cidx(nr - 1)), self.cidx(nr))
        col_groups = arith.divui(arith.addi(cols, self.cidx(nc - 1)), self.cidx(nc))
        last_row = arith.subi(arith.addi(r0, rows), self.cidx(1))
        last_col = arith.subi(arith.addi(c0, cols), self.cidx(1))

        def each_block(body) -> None:
            blocks = scf.ForOp(self.cidx(0), row_groups, self.cidx(1))
            with ir.InsertionPoint(blocks.body):
                body(arith.addi(r0, arith.muli(blocks.induction_variable, self.cidx(nr))))
                scf.yield_([])

        groups = self.lane_loop(col_groups)
        with ir.InsertionPoint(groups.body):
            col = arith.addi(c0, arith.muli(groups.induction_variable, self.cidx(nc)))
            if last:
                zeros = scf.ForOp(self.cidx(0), rows, self.cidx(1))
                with ir.InsertionPoint(zeros.body):
                    vector.store(self.vzero(nc), self.carry, [zeros.induction_variable,
                                                              self.cidx(0)])
                    scf.yield_([])
                chunks = scf.ForOp(self.cidx(0), self.cidx(last), self.cidx(chunk))
                with ir.InsertionPoint(chunks.body):
                    self.take_chunk(col, last_col, chunks.induction_variable, chunk)
                    each_block(lambda row: self.carry_block(row, col, last_row, last_col))
                    scf.yield_([])
            self.take_chunk(col, last_col, self.cidx(last), k - last)
            each_block(lambda row: self.emit_block(row, col, last_row, last_col))
            scf.yield_([])
        self.k_chunk, self.carry = None, None

    def take_chunk(self, col, last_col, k0, length: int) -> None:
        """The blocks of the group of columns from `col` (the tile's last
        one again past `last_col`) that follow take K's `length` elements
        from `k0`."""
        self.k_chunk = (k0, length)

    def carry_block(self, row, col, last_row, last_col) -> None:
        """`emit_block`'s sums over the chunk, kept in `carry` instead of
        stored (a row past the tile computes its last row again, into that
        row's place)."""
        nr, nc = self.BLOCK_ROWS, self.BLOCK_COLS
        a_rows = [arith.minui(arith.addi(row, self.cidx(r)), last_row) for r in range(nr)]
        b_rows = [arith.minui(arith.addi(col, self.cidx(c)), last_col) for c in range(nc)]
        dots = self.chunk_dots(a_rows, b_rows)
        for r in range(nr):
            sums = self.lanes_of(self.each_sum(dots[r * nc:(r + 1) * nc]), 0, nc)
            vector.store(sums, self.carry, [arith.subi(a_rows[r], self.r0), self.cidx(0)])

    def chunk_dots(self, a_rows: list, b_rows: list) -> list:
        """`block_dots` over the chunk of K taken (all of K outside
        `emit_chunks`), each accumulator starting from the earlier chunks'
        sum in lane 0 when K takes several."""
        if self.k_chunk is None:
            return self.block_dots(a_rows, b_rows)
        accs = None
        if self.carry is not None:
            accs = []
            for row in a_rows:
                sums = vector.load(self.vtype(len(b_rows)), self.carry,
                                   [arith.subi(row, self.r0), self.cidx(0)])
                accs += [vector.insert(vector.extract(sums, [], [c]), self.vzero(16), [], [0])
                         for c in range(len(b_rows))]
        k0, length = self.k_chunk
        return self.block_dots(a_rows, b_rows, k0, length, accs)

    def emit_block(self, row, col, last_row, last_col) -> None:
        """The block of BLOCK_ROWS x BLOCK_COLS outputs from (row, col), of
        a tile whose last row and column are `last_row` and `last_col`."""
        nr, nc = self.BLOCK_ROWS, self.BLOCK_COLS
        a_rows = [arith.minui(arith.addi(row, self.cidx(r)), last_row) for r in range(nr)]
        b_rows = [arith.minui(arith.addi(col, self.cidx(c)), last_col) for c in range(nc)]
        dots = self.chunk_dots(a_rows, b_rows)
        sums = [self.each_sum(dots[r * nc:(r + 1) * nc]) for r in range(nr)]
        in_rows = arith.subi(arith.addi(last_row, self.cidx(1)), row)
        in_cols = arith.subi(arith.addi(last_col, self.cidx(1)), col)
        full = arith.andi(
            arith.cmpi(arith.CmpIPredicate.uge, in_rows, self.cidx(nr)),
            arith.cmpi(arith.CmpIPredicate.uge, in_cols, self.cidx(nc)))
        branch = scf.IfOp(full, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            for r in range(nr):
                self.vstore(self.lanes_of(sums[r], 0, nc), self.op.result, [a_rows[r], col])
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            for r in range(nr):
                for c in range(nc):
                    inside = arith.andi(
                        arith.cmpi(arith.CmpIPredicate.ult, self.cidx(r), in_rows),
                        arith.cmpi(arith.CmpIPredicate.ult, self.cidx(c), in_cols))
                    store = scf.IfOp(inside)
                    with ir.InsertionPoint(store.then_block):
                        self.store(vector.extract(sums[r], [], [c]), self.op.result,
                                   [a_rows[r], b_rows[c]])
                        scf.yield_([])
            scf.yield_([])

    def block_dots(self, a_rows: list, b_rows: list, start=None, length: int = 0,
                   accs: list = None) -> list:
        """One 16-lane accumulator per (row of A, row of B^T), r-major:
        their dot products along K in lanes of pairwise sums (along
        [start, start + length) only, added to `accs`, when given)."""
        a, b = self.op.operands[:2]
        k = length or a.shape[1]
        start = self.cidx(0) if start is None else start
        step = self.K_STEP
        whole = k - k % step
        if accs is None:
            accs = [self.vzero(16) for _ in range(len(a_rows) * len(b_rows))]
        if whole:
            kloop = scf.ForOp(start, arith.addi(start, self.cidx(whole)), self.cidx(step), accs)
            with ir.InsertionPoint(kloop.body):
                kk = kloop.induction_variable
                scf.yield_(self.dot_step(list(kloop.inner_iter_args), a_rows, b_rows, kk))
            accs = list(kloop.results)
        if k % step:
            # The last K % 32 elements: masked loads, zeros past K.
            accs = self.dot_step(accs, a_rows, b_rows, arith.addi(start, self.cidx(whole)),
                                 k % step)
        return accs

    def dot_step(self, accs: list, a_rows: list, b_rows: list, kk, count: int = 0) -> list:
        """`accs` plus the products of K_STEP elements of each row from
        `kk` (the first `count` of them, zeros after, when `count`)."""
        a, b = self.op.operands[:2]
        a_vecs = [self.pairs(self.buf(a), row, kk, count) for row in a_rows]
        b_vecs = [self.b_pairs(row, kk, count) for row in b_rows]
        return [dot_bf16(accs[r * len(b_rows) + c], a_vecs[r], b_vecs[c])
                for r in range(len(a_rows)) for c in range(len(b_rows))]

    def pairs(self, buffer: ir.Value, row, kk, count: int = 0) -> ir.Value:
        """K_STEP bf16 values of row `row` of `buffer` from `kk` (the first
        `count`, zeros after, when `count`)."""
        pairs = ir.VectorType.get([self.K_STEP], element_type("bf16"))
        if not count:
            return vector.load(pairs, buffer, [row, kk])
        mask = vector.constant_mask(ir.VectorType.get([self.K_STEP], ir.IntegerType.get_signless(1)),
                                    [count])
        zeros = arith.constant(pairs, ir.DenseElementsAttr.get_splat(
            pairs, ir.FloatAttr.get(element_type("bf16"), 0.0)))
        return vector.maskedload(pairs, buffer, [row, kk], mask, zeros)

    def b_pairs(self, row, kk, count: int = 0) -> ir.Value:
        """B^T's K_STEP values of row `row` from `kk`, as `pairs`."""
        return self.pairs(self.buf(self.op.operands[1]), row, kk, count)

    def lanes_of(self, v: ir.Value, first: int, count: int) -> ir.Value:
        """Lanes [first, first + count) of `v` as a vector."""
        if first == 0 and ir.VectorType(v.type).shape[0] == count:
            return v
        return vector.extract_strided_slice(self.vtype(count), v, [first], [count], [1])


def dot_bf16(acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """`vdpbf16ps`: acc (16 x f32) plus, in each lane i, a[2i] b[2i] +
    a[2i+1] b[2i+1] (a, b: 32 x bf16). The x86vector dialect has no Python
    module; its op is built by name."""
    return ir.Operation.create("x86vector.avx512.dot", results=[acc.type],
                               operands=[acc, a, b]).result
