"""The CPU matmul tile with a packed weight on AMX (`MatmulPackedAMX`):
C = A @ B^T for B (N, K) in a GGML block format of `etc.packed`, on the
tile unit (`tdpbf16ps`) where the instruction set has `amx-bf16`.

Per tile of TILE_CROSSOVER rows or more (chosen at run time from the live
row count; fewer take `MatmulPackedCPU`'s int8 VNNI products, in the same
kernel): the tile's rows of A are rounded to bf16 and packed once into a
stack panel in the VNNI layout (as `MatmulAMX.pack_rows`, 16-row blocks
of K pairs); then each group of 32 columns of B is dequantized once into a
32 x K bf16 panel (`dequantize_columns`: each block's integers times its
scales, plus its minimum, exactly `etc.packed.dequantize`'s f32 values,
then rounded to bf16) that every 32-row block of the tile reads as
`tdpbf16ps` tiles: 2 x 2 accumulators of C^T over K (`MatmulAMX`'s
scheme, with B^T's tiles from the panel). Columns past the last group of
32 take the VNNI products.

Why bf16 tiles on dequantized weights rather than int8 tiles
(`tdpbusd`) on the quantized blocks (the choice of the brief, issue #33):
per 16 x 16 block of C and block of 32 values of K, int8 tiles need the
block's i32 result stored from the tile unit and scaled by d_a(m) d_w(n)
in vector code (a tile store, 16 converts, 16 multiplies and 16 adds:
about 50 instructions against the tile product's 8-16 cycles), and the
K-quants' sub-block scales change every 16 or 32 values, so a tile
product spans one sub-block at most. With bf16, the scales are applied
once per weight (about 10 instructions per 32 values at dequantization,
shared by all the tile's rows) and the tile unit's accumulation runs over
the whole of K. Estimate per weight value, tile of M rows (tdpbf16ps:
16 x 16 x 32 products in 16 cycles, 512 a cycle): bf16 M / 512 + ~0.3
cycles (dequantization), int8 M / 1024 + M x ~0.01 (scaling) cycles: the
same at M = 32, bf16 ahead by 1.5x at M = 128 and more above. The VNNI
kernel takes about 1 / 40 cycle per product (measured: 114 G products/s
per core at B = 16 on Q4_K): M / 40.

Accuracy: bf16 keeps 8 significant bits, so each weight's and each
activation's rounding is at most 2^-9 of its magnitude: |C - C_widened|
<= sum_k |w_k| |x_k| 2^-8, within the bound the int8 kernel is held to
(sum_k |w_k| d_a(k) / 2 with d_a = max|x| / 127 over the block) wherever
|x_k| 2^-8 <= max|x| / 254, i.e. always (plus f32 rounding of the sums).

Measured (`bench/packed_tiles.py`, one 8192 x 2048 matmul, 2 workers,
Intel Xeon with AMX, 2026-11-28, load 1.3-2.1; docs/benchmarks.md): at
B = 128 Q8_0 32.7 -> 8.6 ms, Q4_K 24.9 -> 6.6 ms, Q6_K 22.6 -> 6.0 ms
against the VNNI products; at B = 512 127.9 -> 29.4, 83.8 -> 31.9, 90.4
-> 24.1 ms. Short of the tile unit's rate (250-360 G products/s on 2
cores, about 1,000 per core at its peak): the dequantization (about 0.2
ns per weight value, once per 128-row tile) and the tiles' 64 bytes a
cycle from L2. Two things the first prototype got wrong cost 2x each:
`arith.truncf` to bf16 becomes integer code on the way to LLVM (hence
`to_bf16`), and a panel of B^T with rows K values apart put a tile's 16
rows in one L1 set at K = 2048.

`AMXTiles` gives the tile operations (MLIR's `amx` dialect, or their
meaning in AVX-512 BF16 vector code for `kernels="amx"` on CPUs without
AMX); this module has its own packing of f32 rows and its own group
product reading B^T from the panel, since `MatmulAMX` reads bf16 A and B
from their tensors.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

from .. import packed
from .base import element_type
from .matmul_amx import AMXTiles, MatmulAMX, to_bf16, transpose16
from .matmul_packed import MatmulPackedCPU


class MatmulPackedAMX(MatmulPackedCPU):
    """C = A @ B^T with B packed: AMX bf16 tiles on dequantized panels of B
    for tiles of TILE_CROSSOVER rows or more, `MatmulPackedCPU` below
    (see the module docstring)."""

    #: Tiles with at least this many rows take the tile unit: each tile
    #: dequantizes all its columns, which few rows do not amortise. One
    #: 8192 x 2048 matmul, 2 workers, best of 9 (2026-11-28, load 2.4-3.3),
    #: tile unit / VNNI ms at 16, 32, 64, 128 rows: Q8_0 3.8 / 3.4, 4.5 /
    #: 5.8, 8.4 / 10.6, 14.6 / 41.0; Q4_K 7.7 / 7.5, 6.7 / 13.0, 7.9 /
    #: 24.2, 14.7 / 46.9; Q6_K 7.7 / 7.8, 5.7 / 13.6, 12.6 / 25.0, 14.2 /
    #: 36.4; Q5_0 5.7 / 6.1, 6.8 / 10.7, 11.3 / 19.7, 16.7 / 37.3.
    TILE_CROSSOVER = 32
    #: Columns of C per group (two tiles of 16): the panel of B^T.
    GROUP = 32

    @classmethod
    def name(cls, op) -> str:
        return f"matmul_{op.operands[1].dtype}_amx"

    @classmethod
    def applies(cls, op, target=None) -> bool:
        if target is None or target.kind != "cpu":
            return False
        k = op.operands[0].shape[1]
        return ((target.has("amx-bf16") or target.emulate_amx) and target.has("avx512bf16")
                and op.params["transpose_b"] and isinstance(k, int)
                and op.operands[1].dtype in cls.FORMATS)

    #: Rows per tile: each tile dequantizes its columns of B once for all
    #: its rows, so prefill tiles are taller than the front end's 32. One
    #: 8192 x 2048 Q8_0 matmul at B = 512, 2 workers (loaded machine,
    #: 2026-11-28): 32 / 64 / 128 / 256 rows 202 / 148 / 111 / 66 ms
    #: before the panel's bf16 conversion was fixed; after it, at B = 512
    #: on one worker, 128 and 256 rows the same (57-58 ms CPU time).
    ROW_TILE = 128
    #: The most bytes the tile's bf16 panel of A may take on the stack
    #: (ROW_TILE rows shrink, down to 32, where K is longer than 4096).
    PANEL_BYTES = 1 << 20

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """`MatmulPackedCPU.tile_for`'s columns; ROW_TILE rows, fewer (a
        multiple of 32) where their bf16 panel would pass PANEL_BYTES."""
        tm, tn = MatmulPackedCPU.tile_for(op, target)
        k = op.operands[0].shape[1]
        rows = max(32, min(cls.ROW_TILE, cls.PANEL_BYTES // (2 * k) // 32 * 32))
        return (max(tm, rows), tn)

    def emit(self) -> None:
        """The tile unit for the groups of 32 columns of tiles of
        TILE_CROSSOVER rows or more, then the VNNI products for the rest:
        all the columns of smaller tiles, the columns past the last group
        of larger ones. The VNNI code (most of the function's size: one
        copy per row step and column shape) is emitted once for both."""
        rows, c0, cols = self.prepare_tile()
        self.weight = self.op.operands[1]
        index = ir.IndexType.get()
        branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, rows,
                                     self.cidx(self.TILE_CROSSOVER)), [index], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.yield_([self.emit_tiles(self.r0, rows, c0, cols)])
        with ir.InsertionPoint(branch.else_block):
            scf.yield_([self.cidx(0)])
        done = branch.results[0]
        left = arith.subi(cols, done)
        some = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ugt, left, self.cidx(0)))
        with ir.InsertionPoint(some.then_block):
            self.emit_vnni(rows, arith.addi(c0, done), left)
            scf.yield_([])

    def emit_tiles(self, r0, rows, c0, cols) -> ir.Value:
        """The tile on the tile unit: A's rows packed once, then per group
        of 32 columns the panel of B^T and every 32-row block's products.
        Returns the columns done (the groups'); `emit` gives the rest to
        the VNNI products."""
        tiles = AMXTiles(self, self.target.emulate_amx and not self.target.has("amx-bf16"))
        k = self.op.operands[0].shape[1]
        bf16 = element_type("bf16")
        self._pairs = k // 2
        blocks = -(-self.op.tile[0] // 32) * 2
        self._panel = self.entry_alloca(ir.MemRefType.get([blocks * self._pairs, 32], bf16),
                                        alignment=64)
        # Tile by tile: step kb's two 16 x 32 tiles of B^T at rows
        # 32 kb ... 32 kb + 31 (64-byte rows: one tile is 1 KB in a row;
        # rows of K values, 4 KB apart at K = 2048, would fall in the same
        # set of the L1 cache).
        self._columns = self.entry_alloca(ir.MemRefType.get([k, 32], bf16), alignment=64)
        self._results = self.entry_alloca(ir.MemRefType.get([4 * 16, 16], self.f32), alignment=64)
        self.pack_rows(r0, rows)
        groups = arith.divui(cols, self.cidx(self.GROUP))
        row_pairs = arith.divui(arith.addi(rows, self.cidx(31)), self.cidx(32))
        each = scf.ForOp(self.cidx(0), groups, self.cidx(1))
        with ir.InsertionPoint(each.body):
            n0 = arith.addi(c0, arith.muli(each.induction_variable, self.cidx(self.GROUP)))
            self.dequantize_columns(n0)
            blocks_loop = scf.ForOp(self.cidx(0), row_pairs, self.cidx(1))
            with ir.InsertionPoint(blocks_loop.body):
                block = arith.muli(blocks_loop.induction_variable, self.cidx(2))
                self.emit_group(tiles, r0, rows, n0, block)
                scf.yield_([])
            scf.yield_([])
        return arith.muli(groups, self.cidx(self.GROUP))

    def pack_rows(self, r0, rows) -> None:
        """The tile's rows of A rounded to bf16 into the panel in the VNNI
        layout (`MatmulAMX.pack_rows`: block b at panel rows b * pairs + p,
        row p holding the pair (A[m, 2p], A[m, 2p + 1]) of each of the
        block's 16 rows; rows past the tile repeat its last). K is a whole
        number of the format's blocks, so of 32."""
        a = self.op.operands[0]
        k = a.shape[1]
        blocks = arith.divui(arith.addi(rows, self.cidx(15)), self.cidx(16))
        last_row = arith.subi(arith.addi(r0, rows), self.cidx(1))
        bf16 = element_type("bf16")
        pairs_type = ir.VectorType.get([32], bf16)
        dwords = ir.VectorType.get([16], ir.IntegerType.get_signless(32))
        each = scf.ForOp(self.cidx(0), blocks, self.cidx(1))
        with ir.InsertionPoint(each.body):
            b = each.induction_variable
            first = arith.addi(r0, arith.muli(b, self.cidx(16)))
            kloop = scf.ForOp(self.cidx(0), self.cidx(k // 32), self.cidx(1))
            with ir.InsertionPoint(kloop.body):
                kb = kloop.induction_variable
                k0 = arith.muli(kb, self.cidx(32))
                loaded = []
                for m in range(16):
                    row = arith.minui(arith.addi(first, self.cidx(m)), last_row)
                    v = self.vload(a, [row, k0], 32)
                    loaded.append(vector.bitcast(dwords, to_bf16(v)))
                base = arith.addi(arith.muli(b, self.cidx(self._pairs)),
                                  arith.muli(kb, self.cidx(16)))
                for p, column in enumerate(transpose16(loaded)):
                    vector.store(vector.bitcast(pairs_type, column), self._panel,
                                 [arith.addi(base, self.cidx(p)), self.cidx(0)])
                scf.yield_([])
            scf.yield_([])

    def dequantize_columns(self, n0) -> None:
        """Rows n0 ... n0 + 31 of B (columns of C) dequantized into the
        panel `_columns` as bf16: each group of 32 values' signed integers
        (`weight_groups` without VNNI's zero points) times its scale, plus
        its minimum, in f32 (`etc.packed.dequantize`'s values), then
        rounded."""
        fmt = packed.FORMATS[self.weight.dtype]
        wide = self.vtype(self.BLOCK)
        vnni, self.vnni = self.vnni, False  # signed integers, no zero points
        try:
            each = scf.ForOp(self.cidx(0), self.cidx(self.GROUP), self.cidx(1))
            with ir.InsertionPoint(each.body):
                c = each.induction_variable
                column = arith.addi(n0, c)
                loop = scf.ForOp(self.cidx(0), self.cidx(self.k // fmt.block), self.cidx(1))
                with ir.InsertionPoint(loop.body):
                    sb = loop.induction_variable
                    base = arith.muli(sb, self.cidx(fmt.nbytes))
                    for g, (q, scale, minimum) in enumerate(
                            self.weight_groups(fmt, column, base)):
                        if isinstance(scale.type, ir.VectorType):  # a scale per 4 values
                            scale = vector.shuffle(scale, scale, [j // 4 for j in range(32)])
                        else:
                            scale = vector.broadcast(wide, scale)
                        values = arith.mulf(arith.sitofp(wide, q), scale)
                        if minimum is not None:
                            values = arith.addf(values, vector.broadcast(wide, minimum))
                        at = arith.addi(arith.muli(sb, self.cidx(fmt.block)),
                                        arith.addi(self.cidx(g * self.BLOCK), c))
                        vector.store(to_bf16(values),
                                     self._columns, [at, self.cidx(0)])
                    scf.yield_([])
                scf.yield_([])
        finally:
            self.vnni = vnni

    def emit_group(self, tiles: AMXTiles, r0, rows, n0, block) -> None:
        """C[r0 + 16 block ... + 32, n0 ... n0 + 32] (the rows of the tile
        there): 2 x 2 accumulator tiles of C^T over K, B^T's tiles from the
        panel `_columns` (`MatmulAMX.emit_group`'s scheme)."""
        k = self.op.operands[0].shape[1]
        panel_rows = [arith.muli(arith.addi(block, self.cidx(i)), self.cidx(self._pairs))
                      for i in range(2)]
        accs = [tiles.zero() for _ in range(4)]
        kloop = scf.ForOp(self.cidx(0), self.cidx(k // 32), self.cidx(1), tiles.values(accs))
        with ir.InsertionPoint(kloop.body):
            kb = kloop.induction_variable
            k0 = arith.muli(kb, self.cidx(32))
            xs = [tiles.load(self._columns, arith.addi(k0, self.cidx(16 * nb)), self.cidx(0))
                  for nb in range(2)]
            ys = [tiles.load(self._panel, arith.addi(base, arith.muli(kb, self.cidx(16))),
                             self.cidx(0)) for base in panel_rows]
            accs = tiles.tiles(kloop.inner_iter_args)
            scf.yield_(tiles.values([tiles.mul(xs[nb], ys[mb], accs[nb * 2 + mb])
                                     for nb in range(2) for mb in range(2)]))
        accs = tiles.tiles(kloop.results)
        for t, acc in enumerate(accs):
            tiles.store(self._results, self.cidx(16 * t), self.cidx(0), acc)
        for mb in range(2):
            MatmulAMX.store_transposed(self, [self.cidx(16 * (nb * 2 + mb)) for nb in range(2)],
                                       r0, rows, arith.addi(block, self.cidx(mb)), n0)
