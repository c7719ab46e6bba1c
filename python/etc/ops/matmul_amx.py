"""The CPU matmul tile on AMX (`MatmulAMX`): C = A @ B^T for bf16 A and
B^T (the layout of Hugging Face weights) with `tdpbf16ps` on the tile
unit, where the instruction set has `amx-bf16` (and AVX-512 BF16, which
every AMX CPU has, for the edges).

`tdpbf16ps` multiplies a tile of 16 rows of 32 bf16 (pairs along K) by a
tile in the VNNI layout (16 rows of K pairs, each 16 columns of a pair)
into 16 x 16 f32. B^T's rows are already pairs along K, so the product is
computed transposed: C^T[n, m] = sum_k B^T[n, k] A[m, k], with A in the
VNNI layout. A tile has TALL_ROWS rows (128) from K = TALL_K (1,024) on,
SHORT_K_ROWS (64) below, and N up to WHOLE_N (192) whole, else column
tiles up to WIDEST (288) wide (`tile_for`), and K goes by in chunks of about K_CHUNK (512). Per chunk, the tile's rows of A are packed into a stack
panel (16-row blocks, 32 x 32 bf16 at a time transposed as 16 x 16 dwords
by a shuffle network); then per pair of 16-row blocks (its panel chunk
stays in L1) and group of 32 columns, each step of 32 along K loads 2
tiles of B^T in place and 2 of the panel and accumulates 2 x 2 tiles of
C^T in the tile registers (8 in all), which start and end each chunk in a
stack buffer of C^T. The K tail is packed, and B^T's copied, zero-padded. At the end the 16 x 16 results are stored
transposed, a row's 32 columns at a time narrowed to bf16 by
`vcvtneps2bf16` (16 at a time through `vstore` where a residual is added
or C is not bf16).
The stack buffers are 64-byte aligned (a tile row split over two cache
lines costs two loads). Columns past the last group of 32 take
`MatmulDPBF16`'s blocks.

Tiles with fewer than TILE_CROSSOVER rows take `MatmulDPBF16` (and below its
crossover the GEMV), chosen per tile at run time from the live row count.

`AMXTiles` emits the tile operations as MLIR's `amx` ops (lowered by
`etc-lower-to-cpu`), or, for `etc.compile(..., kernels="amx")` on a CPU
without AMX, their meaning in AVX-512 BF16 vector code, a tile being 16
row vectors: the packing, indexing and edges of this kernel are then
checked on any CPU with `avx512bf16`.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from .base import element_type
from .matmul_cpu import MatmulCPU
from .matmul_dpbf16 import MatmulDPBF16, dot_bf16


def transpose16(rows: list) -> list:
    """The transpose of a 16 x 16 matrix held as 16 vectors of 16 lanes
    (any 32-bit element type): four stages of 16 shuffles, each swapping
    the off-diagonal blocks of every 2s x 2s block (s = 8, 4, 2, 1)."""
    rows = list(rows)
    s = 8
    while s:
        low, high = [], []
        for j in range(16):
            block, offset = divmod(j, 2 * s)
            if offset < s:
                low.append(block * 2 * s + offset)
                high.append(block * 2 * s + s + offset)
            else:
                low.append(16 + block * 2 * s + offset - s)
                high.append(16 + block * 2 * s + offset)
        out = list(rows)
        for i in range(16):
            if i & s == 0:
                out[i] = vector.shuffle(rows[i], rows[i + s], low)
                out[i + s] = vector.shuffle(rows[i], rows[i + s], high)
        rows = out
        s //= 2
    return rows


def to_bf16(values: ir.Value) -> ir.Value:
    """A vector<32xf32> rounded to bf16 (to nearest even) by two
    `vcvtneps2bf16`: `arith.truncf` to bf16 is expanded into integer
    operations on the way to LLVM."""
    bf16 = element_type("bf16")
    halves = [ir.Operation.create(
        "x86vector.avx512.cvt.packed.f32_to_bf16", results=[ir.VectorType.get([16], bf16)],
        operands=[vector.shuffle(values, values, list(range(16 * h, 16 * h + 16)))]).result
        for h in range(2)]
    return vector.shuffle(halves[0], halves[1], list(range(32)))


class AMXTiles:
    """The tile operations of a kernel: MLIR's `amx` ops on `!amx.tile`
    values, or (`emulate`) the same meaning in vector code on tiles held
    as lists of 16 row vectors, f32 accumulators as vector<16xf32> and
    bf16 operands as vector<32xbf16>, `tdpbf16ps` as `vdpbf16ps` per row
    and K pair."""

    ROWS = 16

    def __init__(self, kernel, emulate: bool):
        from ..runtime.isa import opt_level

        self.kernel = kernel
        self.emulate = emulate
        # LLVM 22 cannot generate code at -O0 for a tile value that enters
        # a block through a phi (an accumulator carried around a loop): its
        # -O0 AMX lowering deletes the phi's incoming tile while the phi
        # still uses it ("Use still stuck around after Def is destroyed",
        # then UNREACHABLE; reproduced with llc -O0 on a 20-line loop). At
        # -O0 the accumulators therefore live in stack slots, each product
        # loading its accumulator and storing it back: no tile crosses a
        # block. ETC_CPU_OPT_LEVEL (the level the JIT uses) decides.
        self.in_memory = not emulate and opt_level() == 0
        self._carried = []
        self.f32 = ir.F32Type.get()
        self.bf16 = element_type("bf16")
        self.acc_type = ir.Type.parse("!amx.tile<16x16xf32>")
        self.operand_type = ir.Type.parse("!amx.tile<16x32xbf16>")

    def zero(self):
        if self.emulate:
            return [self.kernel.vzero(16) for _ in range(self.ROWS)]
        tile = ir.Operation.create("amx.tile_zero", results=[self.acc_type]).result
        return self._in_slot(tile) if self.in_memory else tile

    def _load_tile(self, buf: ir.Value, row: ir.Value, col: ir.Value, type: ir.Type):
        return ir.Operation.create(
            "amx.tile_load", results=[type], operands=[buf, row, col],
            attributes={"operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 2, 0])}).result

    def _store_tile(self, buf: ir.Value, row: ir.Value, col: ir.Value, tile) -> None:
        ir.Operation.create(
            "amx.tile_store", operands=[buf, row, col, tile],
            attributes={"operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 2, 1, 0])})

    def load(self, buf: ir.Value, row: ir.Value, col: ir.Value):
        """16 rows of 32 bf16 from buf[row + i, col] (a 2-D memref)."""
        if self.emulate:
            pairs = ir.VectorType.get([32], self.bf16)
            return [vector.load(pairs, buf, [arith.addi(row, self.kernel.cidx(i)), col])
                    for i in range(self.ROWS)]
        return self._load_tile(buf, row, col, self.operand_type)

    def load_acc(self, buf: ir.Value, row: ir.Value):
        """A 16 x 16 f32 accumulator from buf[row + i, 0 ...] (a 2-D memref)."""
        if self.emulate:
            return [vector.load(self.kernel.vtype(16), buf,
                                [arith.addi(row, self.kernel.cidx(i)), self.kernel.cidx(0)])
                    for i in range(self.ROWS)]
        tile = self._load_tile(buf, row, self.kernel.cidx(0), self.acc_type)
        return self._in_slot(tile) if self.in_memory else tile

    def _in_slot(self, tile) -> ir.Value:
        """`tile` stored in a new stack slot (`in_memory`), the slot."""
        slot = self.kernel.entry_alloca(ir.MemRefType.get([self.ROWS, 16], self.f32),
                                        alignment=64)
        self._store_tile(slot, self.kernel.cidx(0), self.kernel.cidx(0), tile)
        return slot

    def mul(self, lhs, rhs, acc):
        """`tdpbf16ps`: acc[m][n] + sum over pairs p of lhs[m][2p] rhs[p][2n]
        + lhs[m][2p + 1] rhs[p][2n + 1]."""
        if not self.emulate:
            zero = self.kernel.cidx(0)
            current = self._load_tile(acc, zero, zero, self.acc_type) if self.in_memory else acc
            product = ir.Operation.create("amx.tile_mulf", results=[self.acc_type],
                                          operands=[lhs, rhs, current]).result
            if not self.in_memory:
                return product
            self._store_tile(acc, zero, zero, product)
            return acc
        out = []
        for m in range(self.ROWS):
            total = acc[m]
            for p in range(self.ROWS):
                pair = vector.shuffle(lhs[m], lhs[m], [2 * p, 2 * p + 1] * 16)
                total = dot_bf16(total, pair, rhs[p])
            out.append(total)
        return out

    def store(self, buf: ir.Value, row: ir.Value, col: ir.Value, tile) -> None:
        """The 16 x 16 f32 `tile` into buf[row + i, col ...] (a 2-D memref)."""
        if self.emulate:
            for i, values in enumerate(tile):
                vector.store(values, buf, [arith.addi(row, self.kernel.cidx(i)), col])
            return
        if self.in_memory:
            zero = self.kernel.cidx(0)
            tile = self._load_tile(tile, zero, zero, self.acc_type)
        self._store_tile(buf, row, col, tile)

    def values(self, tiles: list) -> list:
        """The SSA values of `tiles` (for a loop's iteration arguments):
        none for accumulators in stack slots (`in_memory`), which `tiles`
        then gives back as they are."""
        if self.in_memory:
            self._carried = list(tiles)
            return []
        return [v for t in tiles for v in t] if self.emulate else list(tiles)

    def tiles(self, values: list) -> list:
        """`values` (from `values`) as tiles again."""
        values = list(values)
        if self.in_memory:
            return list(self._carried)
        if not self.emulate:
            return values
        return [values[i:i + self.ROWS] for i in range(0, len(values), self.ROWS)]


class MatmulAMX(MatmulDPBF16):
    """C = A @ B^T on AMX tiles for tiles of TILE_CROSSOVER rows or more (see the
    module docstring); `MatmulDPBF16` below and for the columns past the
    last group of 32."""

    #: Tiles with at least this many rows take the tile unit, below it
    #: `MatmulDPBF16` (and its GEMV). The tile unit's time is flat up to
    #: 16 rows (it computes a pair of 16-row blocks and reads all of B^T
    #: for them), the dot products' grows with the rows (`vdpbf16ps` runs
    #: at 80-85 GFLOP/s a core on this Xeon). Measured (bench/gemm_cpu.py's
    #: graph, best tile span of 3 x 25 runs, crossover 2 against 8 in one
    #: process, 2026-11-28 19:47-19:50 UTC, load 1.0-1.1, at cccf5a0), AMX
    #: us / AVX-512 BF16 us at 2, 3 and 4 rows:
    #:   K x N 576 x 192, 2 workers: 5.3 / 5.2, 5.3 / 7.9, 5.5 / 8.1;
    #:     1 worker: 6.7 / 6.2, 6.5 / 11.0, 6.7 / 11.1
    #:   576 x 576, 2 workers: 12.8 / 11.8, 13.6 / 20.2, 12.5 / 19.9;
    #:     1 worker: 19.9 / 16.9, 19.9 / 35.6, 20.0 / 35.5
    #:   576 x 1536, 2 workers: 27.4 / 25.1, 27.1 / 47.8, 27.7 / 47.0;
    #:     1 worker: 146 / 70, 106 / 150, 149 / 142 (noisy: flat in rows)
    #:   1536 x 576, 2 workers: 31.8 / 25.1, 30.6 / 46.4, 44.1 / 55.4;
    #:     1 worker: 172 / 78, 65 / 100, 142 / 98 (noisy: flat in rows)
    #:   2048 x 2048, 2 workers: 195 / 154, 195 / 265, 196 / 260;
    #:     1 worker: 374 / 306, 388 / 520, 370 / 497
    #: so AMX from 3 rows (its best time wins all 10 there; the dot
    #: products win 9 of 10 at 2). It was 8, measured at 16:17 before the
    #: aligned stack buffers and the K chunks made the tile 2.5x faster:
    #: a prefill's ragged last row tile (486 = 15 x 32 + 6 rows) then took
    #: the dot products, 9 us against 3.7 on the tile unit at K = 576, and
    #: ended each worker's share (486 x 576 x 192: best span 120.5 us ->
    #: 110.6 with AMX from 6 rows).
    TILE_CROSSOVER = 3
    #: Columns of C (rows of B^T) per group: two tiles.
    GROUP = 32
    #: Rows of A per tile from K = TALL_K on: B^T's tiles serve TALL_ROWS / 32
    #: pairs of row blocks from L2. One worker, fastest tile of 20 runs x
    #: tiles (2026-11-28 16:38 UTC, load 3): at 512 x 2048 x 2048 rows of
    #: 32 / 64 / 128 took 7.1 / 6.4-6.6 / 5.6 ms; at 486 x 576 x 576 0.43 /
    #: 0.42-0.53 / 0.43, at 256 x 576 x 1536 0.70 / 0.65-0.67 / 0.68 (level),
    #: where the 486-token prefill of bench/llm_decode_cpu.py --model smol
    #: took 1.12-1.18x main's time with 128 everywhere (fewer tiles).
    #: (Not named ROWS: that is `MatmulCPU`'s rows per dot group, which the
    #: GEMV below the crossover takes; as 128 it emitted a dead group of
    #: 128 x 4 dot products, 86 % of this tile's IR.)
    TALL_ROWS = 128
    TALL_K = 1024
    #: Rows of A per tile below K = TALL_K (SHORT_K_ROWS), the widest N
    #: taken whole as one column tile (WHOLE_N: the row tiles alone share
    #: a prefill out, and each row of A is packed once), and the widest
    #: column tile otherwise (WIDEST). Each tile packs its rows of A for all
    #: its columns, and a tile has a fixed cost (about 1.4 us: dispatch, tile
    #: configuration, the first group's cold loads). Measured (2026-11-29
    #: 03:25-03:58 UTC, load 2-8 from other developers' builds: the sum
    #: over tiles of each tile's fastest of 300 traced runs, halved, as
    #: spans of whole runs were noise), at M = 486: K x N 576 x 192 in 32 x
    #: 96 tiles 85 us, 32 x 192 75, 64 x 96 74, 64 x 192 60, 128 x 192 60;
    #: 576 x 576 32 x 96 260-272, 64 x 96 225, 64 x 192 185, 64 x 288
    #: 173-176; 576 x 1536 32 x 256 620, 64 x 256 554 (64 x 384 473, 64 x
    #: 512 492: level); 1536 x 576 128 x 96 580, 128 x 288 496. This
    #: kernel against main's choice, alternating: 58 / 83, 168 / 255, 483 /
    #: 593, 462 / 577 us; decode rows (a whole tile's best span, 300 runs):
    #: 8 x 576 x 192 7.4 / 11.2, 16 rows 14.1 / 10.6 (one tile against
    #: two), 8 x 576 x 576 14.6 / 15.1, 16 x 576 x 1536 31.0 / 33.4 us.
    #: 288 (9 groups) splits N = 576 into 2 tiles, as many per worker as
    #: 96 did at decode; 1536 stays at 256 (6 tiles).
    SHORT_K_ROWS = 64
    WHOLE_N = 192
    WIDEST = 288
    #: K per chunk (a multiple of 32), evened out over the chunks, and one
    #: chunk up to 1.5 K_CHUNK: a pair of 16-row blocks' chunk of the panel
    #: (32 x K_CHUNK bf16) stays in L1 over all the tile's groups. The first
    #: chunk's accumulators start at zero, the others' come from the stack
    #: buffer. One worker, fastest tile x tiles: K = 576 in one chunk of 18
    #: steps instead of 16 + 2 took 0.364 ms against 0.42-0.43 at 486 x 576
    #: x 576, 0.588 against 0.65-0.70 at 256 x 576 x 1536.
    K_CHUNK = 512
    #: Groups ahead whose rows of B^T each K step of a tile of at most 32
    #: rows prefetches, the line of each of the 32 rows at the step's K
    #: (0: none), and the prefetches'
    #: locality (2: `prefetcht1`, into L2). B^T streamed from memory through
    #: tiles of few rows is bound by the tile loads' misses: each of a
    #: group's 32 rows is a run of only K / 32 lines, too short for the
    #: hardware's prefetchers. One decode-shaped matmul (K x N 576 x 49152,
    #: 57 MB of bf16 B^T, 2 workers, median of 30, runs alternating,
    #: 2026-11-29 00:21-00:24, load 0.6-0.9): 8 rows 4.4-6.2 -> 3.6-4.4
    #: ms, 16 rows 6.4-7.9 -> 4.6-5.6, 64 rows 15.6-16.7 -> 9.9-11.8;
    #: level at K x N 1536 x 8192. `prefetcht0` (3) 1.0-1.05x the time of
    #: t1; the group's lines in address order, 1.1-1.4x; copying the
    #: group's rows into a contiguous buffer with vector loads first,
    #: 1.1-1.2x. SmolLM2-shaped bf16 decode (two models in one process,
    #: steps alternating, load 1.1-1.2): B = 4 144 -> 182 tok/s, 8 240-299
    #: -> 297-329, 12 390 -> 518, 16 548-599 -> 505-596 (level). Tiles of
    #: more rows read B^T's chunk from L2 for every pair after the first;
    #: prefetching there took 1.1x the time at 512 x 2048 x 2048 and 486 x
    #: 1536 x 576.
    PREFETCH_GROUPS = 1
    PREFETCH_LOCALITY = 2

    @classmethod
    def name(cls, op) -> str:
        return "matmul_amx"

    @classmethod
    def applies(cls, op, target) -> bool:
        return ((target.has("amx-bf16") or target.emulate_amx)
                and MatmulDPBF16.applies(op, target))

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Rows from `rows_for`; columns: all of N up to WHOLE_N (a multiple
        of GROUP), where the row tiles alone share the work out (each row of
        A packed once); else the widest multiple of GROUP up to WIDEST (every
        column on the tile unit) that divides N into column tiles every
        worker gets the same number of, at least one (each tile packs its
        rows of A once for all its columns), else into at least one per
        worker (the row blocks of a prefill even it out). Failing that,
        MatmulCPU's choice."""
        n = op.operands[1].shape[0]
        if isinstance(n, int):
            if n % cls.GROUP == 0 and n <= cls.WHOLE_N:
                return (cls.rows_for(op), n)
            widths = range(min(n, cls.WIDEST) // cls.GROUP * cls.GROUP, 0, -cls.GROUP)
            for even in (True, False):
                for tn in widths:
                    tiles = n // tn
                    if (n % tn == 0 and tiles >= target.workers
                            and (tiles % target.workers == 0 or not even)):
                        return (cls.rows_for(op), tn)
        return super().tile_for(op, target)

    @classmethod
    def rows_for(cls, op) -> int:
        """TALL_ROWS (or the front end's rows if more) from K = TALL_K on, where
        B^T read once per 4 row pairs pays; SHORT_K_ROWS (or the front
        end's) below."""
        k = op.operands[0].shape[1]
        return max(op.tile[0], cls.TALL_ROWS if k >= cls.TALL_K else cls.SHORT_K_ROWS)

    def emit(self) -> None:
        """Per tile at run time: from TILE_CROSSOVER rows on, the groups of
        32 columns on the tile unit (`emit_tiles`); from `MatmulDPBF16`'s
        CROSSOVER on, its blocks for the columns the tile unit left (all
        of them below TILE_CROSSOVER rows): one copy of them for both;
        fewer rows, the GEMV."""
        assert self.TILE_CROSSOVER >= self.CROSSOVER
        tm, tn = self.op.tile
        r0, rows = self.row_block(self.op.result, tm)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        cols = self.extent(self.op.result, 1, c0, tn)
        dots = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(self.CROSSOVER)),
                        has_else=True)
        with ir.InsertionPoint(dots.then_block):
            on_tiles = arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(self.TILE_CROSSOVER))
            branch = scf.IfOp(on_tiles)
            with ir.InsertionPoint(branch.then_block):
                self.emit_tiles(r0, rows, c0, cols)
                scf.yield_([])
            # The tile unit takes whole groups of 32 columns.
            done = arith.select(on_tiles, arith.muli(arith.divui(cols, self.cidx(self.GROUP)),
                                                     self.cidx(self.GROUP)), self.cidx(0))
            left = arith.subi(cols, done)
            some = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ugt, left, self.cidx(0)))
            with ir.InsertionPoint(some.then_block):
                self.emit_blocks(r0, rows, arith.addi(c0, done), left)
                scf.yield_([])
            scf.yield_([])
        with ir.InsertionPoint(dots.else_block):
            MatmulCPU.emit_few(self, self.CROSSOVER - 1)
            scf.yield_([])

    def emit_tiles(self, r0, rows, c0, cols) -> None:
        """K in chunks of K_CHUNK: each chunk's columns of the tile's rows of
        A packed into the panel (`pack_chunk`), then per pair of 16-row
        blocks (its chunk of the panel stays in L1) every group of 32
        columns (B^T's chunk stays in L2 over the pairs), the 2 x 2
        accumulators of each pair and group kept in a stack buffer of C^T
        between chunks; at the end the results are stored transposed. The
        columns past the last whole group are left to `emit`."""
        tiles = AMXTiles(self, self.target.emulate_amx and not self.target.has("amx-bf16"))
        k = self.op.operands[0].shape[1]
        whole = k // 32                       # whole steps of 32 along K
        # Steps per chunk: K_CHUNK's, evened out over the chunks, one chunk
        # where K is at most 1.5 K_CHUNK (no round trip of the accumulators).
        chunks = max(1, round(whole / (self.K_CHUNK // 32)))
        each = max(1, -(-whole // chunks))
        self._chunk_pairs = each * 16         # K pairs per block of the panel
        # Whole pairs of 16-row blocks: a pair's second block may lie past
        # the tile's rows (its columns of C^T are computed, not stored).
        blocks = -(-self.op.tile[0] // 32) * 2
        self._width = -(-self.op.tile[1] // self.GROUP)   # groups of a full tile
        bf16 = element_type("bf16")
        self._panel = self.entry_alloca(
            ir.MemRefType.get([blocks * self._chunk_pairs, 32], bf16), alignment=64)
        # B^T's K tail for every group, zero-padded: rows g * 32 + i.
        self._tail = self.entry_alloca(
            ir.MemRefType.get([self._width * 32, 32], bf16), alignment=64)
        self._results = self.entry_alloca(
            ir.MemRefType.get([blocks // 2 * self._width * 64, 16], self.f32), alignment=64)
        groups = arith.divui(cols, self.cidx(self.GROUP))
        row_pairs = arith.divui(arith.addi(rows, self.cidx(31)), self.cidx(32))
        # Tiles of one pair of row blocks read B^T once, from memory: they
        # prefetch it (PREFETCH_GROUPS).
        self._streamed = arith.cmpi(arith.CmpIPredicate.ule, rows, self.cidx(32))

        def each_block(body) -> None:
            """body(block, n0, at) for every pair of row blocks and group:
            the pair's first block, the group's first column, its
            accumulators' first row in results."""
            pairs = scf.ForOp(self.cidx(0), row_pairs, self.cidx(1))
            with ir.InsertionPoint(pairs.body):
                rp = pairs.induction_variable
                loop = scf.ForOp(self.cidx(0), groups, self.cidx(1))
                with ir.InsertionPoint(loop.body):
                    g = loop.induction_variable
                    at = arith.muli(arith.addi(arith.muli(rp, self.cidx(self._width)), g),
                                    self.cidx(64))
                    body(arith.muli(rp, self.cidx(2)),
                         arith.addi(c0, arith.muli(g, self.cidx(self.GROUP))), at)
                    scf.yield_([])
                scf.yield_([])

        def chunk(first, count: int, tail: bool, fresh: bool) -> None:
            """K steps first ... first + count (and the K tail); `fresh`:
            the first chunk, whose accumulators start at zero."""
            self.pack_chunk(r0, rows, first, count, tail)
            if tail:
                self.copy_tail(c0, groups)
            each_block(lambda block, n0, at: self.emit_group(tiles, block, n0, at, first,
                                                             count, tail, fresh))

        full = whole // each
        if full:
            chunk(self.cidx(0), each, False, True)
        if full > 1:
            loop = scf.ForOp(self.cidx(1), self.cidx(full), self.cidx(1))
            with ir.InsertionPoint(loop.body):
                chunk(arith.muli(loop.induction_variable, self.cidx(each)), each, False, False)
                scf.yield_([])
        if whole % each or k % 32:
            chunk(self.cidx(full * each), whole % each, bool(k % 32), not full)

        def results(block, n0, at) -> None:
            # The pair's two row blocks by one copy of the stores (a loop).
            halves = scf.ForOp(self.cidx(0), self.cidx(2), self.cidx(1))
            with ir.InsertionPoint(halves.body):
                mb = halves.induction_variable
                first = arith.addi(at, arith.muli(mb, self.cidx(16)))
                self.store_transposed([first, arith.addi(first, self.cidx(32))],
                                      r0, rows, arith.addi(block, mb), n0)
                scf.yield_([])
        each_block(results)

    def pack_chunk(self, r0, rows, first, count: int, tail: bool) -> None:
        """K steps first ... first + count of the tile's rows of A (and, with
        `tail`, the K % 32 columns past the last whole step, zero-padded)
        into the panel in the VNNI layout: block b (rows r0 + 16 b ...) at
        panel rows b * chunk_pairs + 16 s + p for the chunk's step s, row
        p holding the pair (A[m, 2p], A[m, 2p + 1]) of each of the block's
        16 rows m. Rows past the tile repeat its last (their columns of
        C^T are not stored)."""
        a = self.op.operands[0]
        k = a.shape[1]
        blocks = arith.divui(arith.addi(rows, self.cidx(15)), self.cidx(16))
        last_row = arith.subi(arith.addi(r0, rows), self.cidx(1))
        pairs_type = ir.VectorType.get([32], element_type("bf16"))
        dwords = ir.VectorType.get([16], ir.IntegerType.get_signless(32))

        def pack(b, s: ir.Value, masked: int) -> None:
            first_row = arith.addi(r0, arith.muli(b, self.cidx(16)))
            k0 = arith.muli(arith.addi(first, s), self.cidx(32))
            loaded = []
            for m in range(16):
                row = arith.minui(arith.addi(first_row, self.cidx(m)), last_row)
                if masked:
                    mask = vector.constant_mask(
                        ir.VectorType.get([32], ir.IntegerType.get_signless(1)), [masked])
                    zeros = arith.constant(pairs_type, ir.DenseElementsAttr.get_splat(
                        pairs_type, ir.FloatAttr.get(element_type("bf16"), 0.0)))
                    v = vector.maskedload(pairs_type, self.buf(a), [row, k0], mask, zeros)
                else:
                    v = vector.load(pairs_type, self.buf(a), [row, k0])
                loaded.append(vector.bitcast(dwords, v))
            base = arith.addi(arith.muli(b, self.cidx(self._chunk_pairs)),
                              arith.muli(s, self.cidx(16)))
            for p, column in enumerate(transpose16(loaded)):
                vector.store(vector.bitcast(pairs_type, column), self._panel,
                             [arith.addi(base, self.cidx(p)), self.cidx(0)])

        loop = scf.ForOp(self.cidx(0), blocks, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            b = loop.induction_variable
            if count:
                steps = scf.ForOp(self.cidx(0), self.cidx(count), self.cidx(1))
                with ir.InsertionPoint(steps.body):
                    pack(b, steps.induction_variable, 0)
                    scf.yield_([])
            if tail:
                pack(b, self.cidx(count), k % 32)
            scf.yield_([])

    def copy_tail(self, c0, groups) -> None:
        """B^T's last K % 32 columns of the tile's groups, zero-padded to a
        tile's 32, into `_tail` (group g's 32 rows from row 32 g)."""
        b = self.op.operands[1]
        k = self.op.operands[0].shape[1]
        pairs_type = ir.VectorType.get([32], element_type("bf16"))
        mask = vector.constant_mask(
            ir.VectorType.get([32], ir.IntegerType.get_signless(1)), [k % 32])
        zeros = arith.constant(pairs_type, ir.DenseElementsAttr.get_splat(
            pairs_type, ir.FloatAttr.get(element_type("bf16"), 0.0)))
        loop = scf.ForOp(self.cidx(0), groups, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            g = loop.induction_variable
            n0 = arith.addi(c0, arith.muli(g, self.cidx(self.GROUP)))
            at = arith.muli(g, self.cidx(32))
            for i in range(32):
                v = vector.maskedload(pairs_type, self.buf(b),
                                      [arith.addi(n0, self.cidx(i)), self.cidx(k // 32 * 32)],
                                      mask, zeros)
                vector.store(v, self._tail, [arith.addi(at, self.cidx(i)), self.cidx(0)])
            scf.yield_([])

    def emit_group(self, tiles: AMXTiles, block, n0, at, first, count: int,
                   tail: bool, fresh: bool) -> None:
        """K steps first ... first + count (and the K tail) of the 2 x 2
        accumulator tiles of C^T at results[at ...] for the 32 columns from
        n0 (group g of the tile, at = 64 (pair * width + g)) and the
        panel's blocks `block` and `block + 1`."""
        panel_rows = [arith.muli(arith.addi(block, self.cidx(i)), self.cidx(self._chunk_pairs))
                      for i in range(2)]
        g = arith.remui(arith.divui(at, self.cidx(64)), self.cidx(self._width))
        accs = [tiles.zero() if fresh else
                tiles.load_acc(self._results, arith.addi(at, self.cidx(16 * t)))
                for t in range(4)]

        def step(accs, xs, s):
            ys = [tiles.load(self._panel, arith.addi(row, arith.muli(s, self.cidx(16))),
                             self.cidx(0)) for row in panel_rows]
            return [tiles.mul(xs[nb], ys[mb], accs[nb * 2 + mb])
                    for nb in range(2) for mb in range(2)]

        if count:
            # B^T's tiles in place (copying them into contiguous tiles first,
            # measured, took 1.1-1.25x the time).
            b = self.op.operands[1]
            kloop = scf.ForOp(self.cidx(0), self.cidx(count), self.cidx(1), tiles.values(accs))
            with ir.InsertionPoint(kloop.body):
                s = kloop.induction_variable
                k0 = arith.muli(arith.addi(first, s), self.cidx(32))
                if self.PREFETCH_GROUPS:
                    few = scf.IfOp(self._streamed)
                    with ir.InsertionPoint(few.then_block):
                        ahead = arith.addi(n0, self.cidx(self.GROUP * self.PREFETCH_GROUPS))
                        for i in range(self.GROUP):
                            memref.prefetch(self.buf(b), [arith.addi(ahead, self.cidx(i)), k0],
                                            False, self.PREFETCH_LOCALITY, True)
                        scf.yield_([])
                xs = [tiles.load(self.buf(b), arith.addi(n0, self.cidx(16 * nb)), k0)
                      for nb in range(2)]
                scf.yield_(tiles.values(step(tiles.tiles(kloop.inner_iter_args), xs, s)))
            accs = tiles.tiles(kloop.results)
        if tail:
            at_tail = arith.muli(g, self.cidx(32))
            xs = [tiles.load(self._tail, arith.addi(at_tail, self.cidx(16 * nb)), self.cidx(0))
                  for nb in range(2)]
            accs = step(accs, xs, self.cidx(count))
        for t, acc in enumerate(accs):
            tiles.store(self._results, arith.addi(at, self.cidx(16 * t)), self.cidx(0), acc)

    def store_transposed(self, firsts: list, r0, rows, block, n0) -> None:
        """The two 16 x 16 C^T blocks at results[firsts[0] ...] (columns n0
        ... n0 + 16) and results[firsts[1] ...] (the next 16) into C's rows
        r0 + 16 block + m (those inside the tile). A bf16 C without a
        residual takes each row's 32 columns narrowed by two
        `vcvtneps2bf16` (`to_bf16`) and one 64-byte store: `arith.truncf`
        reaches LLVM as integer rounding (6 integer operations, a compare
        and a masked blend per 16 values, where this is 2 conversions and a
        shuffle per 32); other C through `vstore`, 16 columns at a time."""

        halves = []
        for first in firsts:
            values = [vector.load(self.vtype(16), self._results,
                                  [arith.addi(first, self.cidx(i)), self.cidx(0)])
                      for i in range(16)]
            halves.append(transpose16(values))
        row0 = arith.addi(r0, arith.muli(block, self.cidx(16)))
        end = arith.addi(r0, rows)
        c = self.op.result
        narrow = c.dtype == "bf16" and self._residual(c) is None
        n1 = arith.addi(n0, self.cidx(16))
        for m in range(16):
            row = arith.addi(row0, self.cidx(m))
            inside = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, row, end))
            with ir.InsertionPoint(inside.then_block):
                if narrow:
                    both = vector.shuffle(halves[0][m], halves[1][m], list(range(32)))
                    vector.store(to_bf16(both), self.buf(c), [row, n0])
                else:
                    self.vstore(halves[0][m], c, [row, n0])
                    self.vstore(halves[1][m], c, [row, n1])
                scf.yield_([])
