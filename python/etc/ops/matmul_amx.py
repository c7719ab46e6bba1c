"""The CPU matmul tile on AMX (`MatmulAMX`): C = A @ B^T for bf16 A and
B^T (the layout of Hugging Face weights) with `tdpbf16ps` on the tile
unit, where the instruction set has `amx-bf16` (and AVX-512 BF16, which
every AMX CPU has, for the edges).

`tdpbf16ps` multiplies a tile of 16 rows of 32 bf16 (pairs along K) by a
tile in the VNNI layout (16 rows of K pairs, each 16 columns of a pair)
into 16 x 16 f32. B^T's rows are already pairs along K, so its tiles load
in place, and the product is computed transposed: C^T[n, m] =
sum_k B^T[n, k] A[m, k], with A in the VNNI layout. A tile's rows of A are
packed once per tile into a stack panel (16-row blocks, 32 x 32 bf16
at a time transposed as 16 x 16 dwords by a shuffle network) and serve
every column of the tile: the weights are read where they are, only the
activations, a tile's 32 rows, are rearranged. Each step of 32 along K
loads 2 tiles of B^T and 2 of the panel and accumulates 2 x 2 tiles of
C^T in the tile registers (8 in all); the K tail loads B^T from a
zero-padded copy. The four 16 x 16 results go through a stack buffer and
are stored transposed, 16 columns of a row at a time (the residual added
there). Columns past the last group of 32 take `MatmulDPBF16`'s blocks.

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
from mlir.dialects import arith, scf, vector

from .base import element_type
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
        if not self.in_memory:
            return tile
        slot = self.kernel.entry_alloca(ir.MemRefType.get([self.ROWS, 16], self.f32))
        self._store_tile(slot, self.kernel.cidx(0), self.kernel.cidx(0), tile)
        return slot

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

    #: Tiles with at least this many rows take the tile unit. Not measured
    #: (no AMX machine yet): a 16 x 16 x 32 `tdpbf16ps` does 8x the
    #: multiply-adds per cycle of two `vdpbf16ps`, so a tile of 4 rows of
    #: 16 still does twice their work, before the packing of A.
    TILE_CROSSOVER = 4
    #: Columns of C (rows of B^T) per group: two tiles.
    GROUP = 32

    @classmethod
    def name(cls, op) -> str:
        return "matmul_amx"

    @classmethod
    def applies(cls, op, target) -> bool:
        return ((target.has("amx-bf16") or target.emulate_amx)
                and MatmulDPBF16.applies(op, target))

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """The widest multiple of GROUP up to 256 (every column on the tile
        unit) that divides N into column tiles every worker gets the same
        number of, at least one (each tile packs its rows of A once for all
        its columns), else into at least one per worker (the row blocks of
        a prefill even it out). Failing that, MatmulCPU's choice."""
        n = op.operands[1].shape[0]
        if isinstance(n, int):
            widths = range(min(n, 256) // cls.GROUP * cls.GROUP, 0, -cls.GROUP)
            for even in (True, False):
                for tn in widths:
                    tiles = n // tn
                    if (n % tn == 0 and tiles >= target.workers
                            and (tiles % target.workers == 0 or not even)):
                        return (op.tile[0], tn)
        return super().tile_for(op, target)

    def emit(self) -> None:
        self.by_rows(self.TILE_CROSSOVER, self.emit_tiles, lambda: MatmulDPBF16.emit(self))

    def emit_tiles(self, r0, rows, c0, cols) -> None:
        tiles = AMXTiles(self, self.target.emulate_amx and not self.target.has("amx-bf16"))
        k = self.op.operands[0].shape[1]
        self._pairs = -(-k // 32) * 16   # K pairs per block of the panel, padded to tiles
        # Whole pairs of 16-row blocks: a group's second block may lie past
        # the tile's rows (its columns of C^T are computed, not stored).
        blocks = -(-self.op.tile[0] // 32) * 2
        bf16 = element_type("bf16")
        self._panel = self.entry_alloca(ir.MemRefType.get([blocks * self._pairs, 32], bf16))
        self._edge = self.entry_alloca(ir.MemRefType.get([2 * 16, 32], bf16))
        self._results = self.entry_alloca(ir.MemRefType.get([4 * 16, 16], self.f32))
        self.pack_rows(r0, rows)
        groups = arith.divui(cols, self.cidx(self.GROUP))
        row_pairs = arith.divui(arith.addi(rows, self.cidx(31)), self.cidx(32))
        each = scf.ForOp(self.cidx(0), arith.muli(groups, row_pairs), self.cidx(1))
        with ir.InsertionPoint(each.body):
            g = each.induction_variable
            n0 = arith.addi(c0, arith.muli(arith.divui(g, row_pairs), self.cidx(self.GROUP)))
            block = arith.muli(arith.remui(g, row_pairs), self.cidx(2))
            self.emit_group(tiles, r0, rows, n0, block)
            scf.yield_([])
        done = arith.muli(groups, self.cidx(self.GROUP))
        left = arith.subi(cols, done)
        some = arith.cmpi(arith.CmpIPredicate.ugt, left, self.cidx(0))
        branch = scf.IfOp(some)
        with ir.InsertionPoint(branch.then_block):
            self.emit_blocks(r0, rows, arith.addi(c0, done), left)
            scf.yield_([])

    def pack_rows(self, r0, rows) -> None:
        """The tile's rows of A into the panel in the VNNI layout: block b
        (rows r0 + 16 b ...) at panel rows b * pairs + p, row p holding the
        pair (A[m, 2p], A[m, 2p + 1]) of each of the block's 16 rows m.
        Rows past the tile repeat its last (their columns of C^T are not
        stored); K past the end reads zeros."""
        a = self.op.operands[0]
        k = a.shape[1]
        blocks = arith.divui(arith.addi(rows, self.cidx(15)), self.cidx(16))
        last_row = arith.subi(arith.addi(r0, rows), self.cidx(1))
        pairs_type = ir.VectorType.get([32], element_type("bf16"))
        dwords = ir.VectorType.get([16], ir.IntegerType.get_signless(32))
        steps = -(-k // 32)

        def pack(b, kb: ir.Value, count: int) -> None:
            first = arith.addi(r0, arith.muli(b, self.cidx(16)))
            k0 = arith.muli(kb, self.cidx(32))
            loaded = []
            for m in range(16):
                row = arith.minui(arith.addi(first, self.cidx(m)), last_row)
                if count:
                    mask = vector.constant_mask(
                        ir.VectorType.get([32], ir.IntegerType.get_signless(1)), [count])
                    zeros = arith.constant(pairs_type, ir.DenseElementsAttr.get_splat(
                        pairs_type, ir.FloatAttr.get(element_type("bf16"), 0.0)))
                    v = vector.maskedload(pairs_type, self.buf(a), [row, k0], mask, zeros)
                else:
                    v = vector.load(pairs_type, self.buf(a), [row, k0])
                loaded.append(vector.bitcast(dwords, v))
            base = arith.addi(arith.muli(b, self.cidx(self._pairs)),
                              arith.muli(kb, self.cidx(16)))
            for p, column in enumerate(transpose16(loaded)):
                vector.store(vector.bitcast(pairs_type, column), self._panel,
                             [arith.addi(base, self.cidx(p)), self.cidx(0)])

        each = scf.ForOp(self.cidx(0), blocks, self.cidx(1))
        with ir.InsertionPoint(each.body):
            b = each.induction_variable
            whole = k // 32
            if whole:
                kloop = scf.ForOp(self.cidx(0), self.cidx(whole), self.cidx(1))
                with ir.InsertionPoint(kloop.body):
                    pack(b, kloop.induction_variable, 0)
                    scf.yield_([])
            if k % 32:
                pack(b, self.cidx(steps - 1), k % 32)
            scf.yield_([])

    def emit_group(self, tiles: AMXTiles, r0, rows, n0, block) -> None:
        """C[r0 + 16 block ... + 32, n0 ... n0 + 32] (the rows of the tile
        there): 2 x 2 accumulator tiles of C^T over K."""
        b = self.op.operands[1]
        k = self.op.operands[0].shape[1]
        whole = k // 32
        panel_rows = [arith.muli(arith.addi(block, self.cidx(i)), self.cidx(self._pairs))
                      for i in range(2)]
        n1 = arith.addi(n0, self.cidx(16))

        def step(accs, xs, kb):
            ys = [tiles.load(self._panel, arith.addi(base, arith.muli(kb, self.cidx(16))),
                             self.cidx(0)) for base in panel_rows]
            return [tiles.mul(xs[nb], ys[mb], accs[nb * 2 + mb])
                    for nb in range(2) for mb in range(2)]

        accs = [tiles.zero() for _ in range(4)]
        if whole:
            kloop = scf.ForOp(self.cidx(0), self.cidx(whole), self.cidx(1), tiles.values(accs))
            with ir.InsertionPoint(kloop.body):
                kb = kloop.induction_variable
                k0 = arith.muli(kb, self.cidx(32))
                xs = [tiles.load(self.buf(b), n, k0) for n in (n0, n1)]
                scf.yield_(tiles.values(step(tiles.tiles(kloop.inner_iter_args), xs, kb)))
            accs = tiles.tiles(kloop.results)
        if k % 32:
            # B^T's last K % 32 columns, zero-padded to a tile's 32.
            pairs_type = ir.VectorType.get([32], element_type("bf16"))
            mask = vector.constant_mask(
                ir.VectorType.get([32], ir.IntegerType.get_signless(1)), [k % 32])
            zeros = arith.constant(pairs_type, ir.DenseElementsAttr.get_splat(
                pairs_type, ir.FloatAttr.get(element_type("bf16"), 0.0)))
            for i in range(32):
                row = arith.addi(n0, self.cidx(i))
                v = vector.maskedload(pairs_type, self.buf(b), [row, self.cidx(whole * 32)],
                                      mask, zeros)
                vector.store(v, self._edge, [self.cidx(i), self.cidx(0)])
            xs = [tiles.load(self._edge, self.cidx(16 * nb), self.cidx(0)) for nb in range(2)]
            accs = step(accs, xs, self.cidx(whole))
        for t, acc in enumerate(accs):
            tiles.store(self._results, self.cidx(16 * t), self.cidx(0), acc)
        for nb in range(2):
            for mb in range(2):
                self.store_transposed(16 * (nb * 2 + mb), r0, rows,
                                      arith.addi(block, self.cidx(mb)), n1 if nb else n0)

    def store_transposed(self, first: int, r0, rows, block, n0) -> None:
        """The 16 x 16 C^T block at results[first ...] into C's rows
        r0 + 16 block + m (those inside the tile), columns n0 ... n0 + 16."""
        values = [vector.load(self.vtype(16), self._results,
                              [self.cidx(first + i), self.cidx(0)]) for i in range(16)]
        row0 = arith.addi(r0, arith.muli(block, self.cidx(16)))
        end = arith.addi(r0, rows)
        for m, column in enumerate(transpose16(values)):
            row = arith.addi(row0, self.cidx(m))
            inside = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, row, end))
            with ir.InsertionPoint(inside.then_block):
                self.vstore(column, self.op.result, [row, n0])
                scf.yield_([])
