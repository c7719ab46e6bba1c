"""Matmul with an fp8_e4m3 weight on the CPU: C = A @ B^T where B (N, K) is
an FP8 checkpoint's weight in `etc.packed`'s fp8_e4m3 blocks (32 e4m3 bytes
after their float32 scale s).

Kernels:
* `MatmulFp8CPU` (every CPU): `MatmulCPU`'s f32 dot products of A and
  B^T (its 4 x 4 micro-tiles and 4-row panels: each vector of B is loaded
  once for 4 rows of A), whose vector loads of B dequantize 8 or 16 e4m3
  bytes in registers: sign-extended to 16 bits, shifted into float16 bits,
  converted (`vcvtph2ps` with F16C) and multiplied by 256 s (exact), the
  values of `etc.packed.dequantize` bit for bit. It computes the widened
  product up to the order of the sums.
* `MatmulFp8DPBF16` (bf16 A, AVX-512 BF16): `MatmulDPBF16`'s `vdpbf16ps`
  blocks for tiles of 2 rows or more (`MatmulFp8CPU` below): each group
  of 8 columns is dequantized once per tile into a stack panel of bf16
  (rounded to nearest even, as a bf16 model widened at load rounds its
  weights), which every block of rows reads. At prefill the dequantizing
  is then a small part of the tile: on M x K x N = 128 x 1024 x 3072
  (2 workers, loaded 2-core VM, best of 10, 2026-11-28) the f32 path took
  3.7x the bf16 weight's time (9.2 ms against 2.5 ms).
  K is taken in chunks of PANEL_K = 1024 (any K, the last chunk shorter):
  a 16 KB panel stays in the 48 KB L1 of a Zen 5 core while the blocks'
  rows of A come from L2 (a tile's 32 rows of a chunk: 64 KB of its 1 MB),
  and each block's sums are carried from one chunk to the next in f32
  (2 stores, 2 loads and 16 lane inserts per 512 dot products). One panel
  of all of K (96 KB at K = 6144, 192 KB at 12288) is read from L2 at each
  block: on 128 and 512 x 12288 x 1024 (2 workers, loaded 2-core VM, best
  of 4 x 5, 2026-11-28) chunks of 1024 took 0.80-0.83x the bf16 weight's
  time, of 2048 0.87x, of 6144 (the 96 KB panel) 1.17-1.19x, one
  12288-wide panel 1.09-1.37x, and the f32 path 1.74x; on 128 and 512 x
  4096 x 2048 chunks of 1024 took 0.70 and 0.65x the time of one panel.
  The stack the kernel needs is then the same for every K (16 KB and the
  carried sums, 1 KB): the worker threads' stacks (the platform's default
  for Python threads, 8 MB here) are not relied on.
"""

from __future__ import annotations

from typing import Optional

from mlir import ir
from mlir.dialects import arith, scf, vector

from .. import packed
from .base import element_type
from .matmul_cpu import MatmulCPU
from .matmul_dpbf16 import MatmulDPBF16
from .packed_loads import row_at

__all__ = ["choose_fp8", "MatmulFp8CPU", "MatmulFp8DPBF16"]

FP8 = packed.FORMATS["fp8_e4m3"]


def choose_fp8(op, target) -> Optional[type]:
    """The CPU kernel of matmul `op` with an fp8_e4m3 `b`, or None."""
    if MatmulFp8DPBF16.applies(op, target):
        return MatmulFp8DPBF16
    if MatmulFp8CPU.applies(op):
        return MatmulFp8CPU
    return None


def dequantized(kernel, t, row, k, width: int) -> ir.Value:
    """`width` values of fp8_e4m3 tensor `t` from [row, k] (k a multiple of
    `width`, which divides the block of 32: the values lie in one block) as
    an f32 vector."""
    return arith.mulf(unscaled(kernel, t, row, k, width),
                      kernel.vsplat(block_scale(kernel, t, row, k), width))


def unscaled(kernel, t, row, k, width: int) -> ir.Value:
    """`width` e4m3 values of fp8_e4m3 tensor `t` from [row, k] (as for
    `dequantized`) as f32 vector of their values / 256, without their
    block's scale (`block_scale`)."""
    base = arith.muli(arith.divui(k, kernel.cidx(FP8.block)), kernel.cidx(FP8.nbytes))
    at = arith.addi(arith.addi(base, kernel.cidx(4)), arith.remui(k, kernel.cidx(FP8.block)))
    i8, i16 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(16)
    # Sign-extended, q << 7 has the sign in bits 15 and 14 and q's low 7
    # bits in 13-7: clearing bit 14 leaves the float16 bits (three
    # instructions: vpmovsxbw, vpsllw, vpand).
    q = arith.extsi(ir.VectorType.get([width], i16),
                    vector.load(ir.VectorType.get([width], i8), kernel.buf(t), row_at(row, at)))
    splat = lambda value: arith.constant(q.type, ir.DenseElementsAttr.get_splat(  # noqa: E731
        q.type, ir.IntegerAttr.get(i16, value)))
    bits = arith.andi(arith.shli(q, splat(7)), splat(0xBF80 - 0x10000))
    half = vector.bitcast(ir.VectorType.get([width], ir.F16Type.get()), bits)
    return arith.extf(kernel.vtype(width), half)


def block_scale(kernel, t, row, k) -> ir.Value:
    """256 times the scale s of the block of fp8_e4m3 tensor `t` that holds
    [row, k]: `unscaled` values times it are `etc.packed.dequantize`'s
    (256 s is exact, s < 2^120, so the product is dequantize's (x 256) s,
    rounded once the same way)."""
    base = arith.muli(arith.divui(k, kernel.cidx(FP8.block)), kernel.cidx(FP8.nbytes))
    four = vector.load(ir.VectorType.get([4], ir.IntegerType.get_signless(8)), kernel.buf(t),
                       row_at(row, base))
    scale = vector.extract(vector.bitcast(kernel.vtype(1), four), [], [0])
    return arith.mulf(scale, kernel.cf32(256.0))


class MatmulFp8CPU(MatmulCPU):
    """C = A @ B^T with B in fp8_e4m3: `MatmulCPU`'s transposed path, B's
    vectors dequantized as they are loaded (module docstring)."""

    @classmethod
    def name(cls, op) -> str:
        return "matmul_fp8_e4m3_cpu"

    @classmethod
    def applies(cls, op) -> bool:
        return op.operands[1].dtype == "fp8_e4m3" and op.params["transpose_b"]

    def vload(self, t, idx: list, width: int, aligned: bool = False,
              widen: bool = True) -> ir.Value:
        """B's `width` values from [row, k] dequantized to f32
        (`dequantized`); other tensors as `MatmulCPU` loads them."""
        if t.dtype != "fp8_e4m3":
            return super().vload(t, idx, width, aligned, widen)
        assert FP8.block % width == 0 and widen, (width, widen)
        *row, k = idx
        return dequantized(self, t, row, k, width)


class MatmulFp8DPBF16(MatmulDPBF16, MatmulFp8CPU):
    """C = A @ B^T for bf16 A and fp8_e4m3 B on AVX-512 BF16: the groups of
    BLOCK_COLS columns dequantized to a bf16 panel once per tile and chunk
    of PANEL_K along K, then `MatmulDPBF16`'s blocks over it, their sums
    carried from chunk to chunk; `MatmulFp8CPU` for tiles of fewer than
    CROSSOVER rows (module docstring)."""

    #: Elements of K one panel holds: BLOCK_COLS rows of PANEL_K bf16, a
    #: 16 KB stack buffer (L1-resident). Longer K is taken in chunks of
    #: PANEL_K, their sums carried (module docstring: 1024 against 2048,
    #: 3072, 6144 and all of K).
    PANEL_K = 1024

    @classmethod
    def name(cls, op) -> str:
        return "matmul_fp8_e4m3_dpbf16"

    @classmethod
    def applies(cls, op, target) -> bool:
        a, b = op.operands[:2]
        return (target.has("avx512bf16") and op.params["transpose_b"] and a.dtype == "bf16"
                and b.dtype == "fp8_e4m3" and isinstance(b.shape[1], int))

    def emit_blocks(self, r0, rows, c0, cols) -> None:
        """`MatmulDPBF16.emit_chunks` for every K, each chunk of each group
        of columns dequantized into the panel first (`take_chunk`)."""
        chunk = min(self.op.operands[1].shape[1], self.PANEL_K)
        self.panel = self.entry_alloca(
            ir.MemRefType.get([self.BLOCK_COLS, chunk], element_type("bf16")))
        self.emit_chunks(r0, rows, c0, cols)

    def take_chunk(self, col, last_col, k0, length: int) -> None:
        """The panel's `length` columns (a multiple of K_STEP): B's
        BLOCK_COLS rows from `col` (the tile's last one again past
        `last_col`), from `k0` along K, dequantized and rounded to bf16;
        the chunk the next blocks take."""
        super().take_chunk(col, last_col, k0, length)
        bf16 = element_type("bf16")
        loop = scf.ForOp(self.cidx(0), self.cidx(length), self.cidx(self.K_STEP))
        with ir.InsertionPoint(loop.body):
            kk = loop.induction_variable
            for c in range(self.BLOCK_COLS):
                b_row = arith.minui(arith.addi(col, self.cidx(c)), last_col)
                values = dequantized(self, self.op.operands[1], [b_row], arith.addi(k0, kk),
                                     self.K_STEP)
                vector.store(arith.truncf(ir.VectorType.get([self.K_STEP], bf16), values),
                             self.panel, [self.cidx(c), kk])
            scf.yield_([])

    def block_dots(self, a_rows: list, b_rows: list, start=None, length: int = 0,
                   accs: list = None) -> list:
        """`MatmulDPBF16.block_dots`, B^T's rows read from the panel (its
        rows 0 .. BLOCK_COLS - 1)."""
        return super().block_dots(a_rows, [self.cidx(c) for c in range(len(b_rows))],
                                  start, length, accs)

    def b_pairs(self, row, kk, count: int = 0) -> ir.Value:
        """Row `row` of the panel (dequantized B^T, its chunk from
        `self.k_chunk`'s start) at `kk` along K."""
        return self.pairs(self.panel, row, arith.subi(kk, self.k_chunk[0]), count)
