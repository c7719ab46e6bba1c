"""The GPU GEMV over a packed B^T (`MatmulPackedGPU`): `MatmulSkinnyT`'s
warps, passes and reductions over weights in a block format of
`etc.packed`, read in the GPU layout (`etc.packed.to_gpu_layout`): whole
blocks' quants in 16-byte loads where the format has chunks
(`packed_vectors`), a value at a time otherwise. `matmul_packed` chooses
it; the CPU kernels are there."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, scf, vector

from .. import packed
from .matmul_gemv import MatmulSkinnyT
from .packed_vectors import CHUNK_FORMATS, PackedVectors, gemv_width


class MatmulPackedGPU(MatmulSkinnyT):
    """GPU GEMV over a packed B^T: `MatmulSkinnyT`'s warps, passes and
    reductions, each lane taking one value of K at a time (see the module
    docstring)."""

    #: A call in the worker: a Qwen3-30B-A3B step with bf16 and packed
    #: weights spilled 4 bytes on sm_90a with these inlined.
    out_of_line_on_gpu = True

    @classmethod
    def name(cls, op) -> str:
        return f"matmul_{op.operands[1].dtype}_gemv"

    @classmethod
    def applies(cls, op, target) -> bool:
        return packed.is_packed(op.operands[1].dtype) and super().applies(op, target)

    def lane_sums(self, lanes, cols: list, part, row_of: list, rb: int) -> list:
        """Each (row of B^T, row of A) pair's products over lane `part`'s
        chunks of K (`packed_vectors`: whole blocks' quants in 16-byte
        loads, dequantized in registers), or element by element where a
        chunk does not divide K."""
        a, b = self.op.operands[:2]
        width = gemv_width(b.dtype)
        if b.dtype in CHUNK_FORMATS and b.shape[1] % width == 0:
            return self.chunk_sums(lanes, cols, part, row_of, rb, width)
        return self.element_sums(lanes, cols, part, row_of, rb)

    def chunk_sums(self, lanes, cols: list, part, row_of: list, rb: int, width: int) -> list:
        """`lane_sums` by chunks: lane `part` takes chunks part, part + 32,
        ... of each row of B^T, each `width` values (`PackedVectors`),
        and multiplies them with A's same values, 16 at a time in 16-byte
        aligned loads, accumulating in f32 with fused multiply-adds.

        A's rows first, then one column at a time, its chunk dequantized
        and multiplied: one column's 16 values live at a time, not every
        column's (64 f32 at 4 columns); ptxas still issues the columns'
        loads ahead of the products. Dequantizing every column first made
        the GEMVs the largest callees of a step worker (Qwen2.5-0.5B's
        MLP widths, symbolic rows, sm_90a: q8_0 224 registers, 168 this
        way) and spilled gpt-oss-20b's mixed worker (4 bytes) and
        Qwen2.5-0.5B's (8 bytes, with MXFP4) on sm_90a."""
        a, b = self.op.operands[:2]
        reader = PackedVectors(self, b)
        accs = [self.cf32(0.0) for _ in range(len(cols) * rb)]
        chunks = b.shape[1] // width
        loop = scf.ForOp(part, self.cidx(chunks), self.cidx(lanes.warp), accs)
        with ir.InsertionPoint(loop.body):
            c = loop.induction_variable
            sums = list(loop.inner_iter_args)
            first = arith.muli(c, self.cidx(16))
            xs = [self.vload(a, [row_of[r], first], 16, aligned=True) for r in range(rb)]
            for j, col in enumerate(cols):
                (_, w), = reader.chunk(col, c, width)
                for r in range(rb):
                    acc = sums[j * rb + r]
                    for i in range(16):
                        acc = math.fma(vector.extract(xs[r], [], [i]),
                                       vector.extract(w, [], [i]), acc)
                    sums[j * rb + r] = acc
            scf.yield_(sums)
        return list(loop.results)

    def element_sums(self, lanes, cols: list, part, row_of: list, rb: int) -> list:
        """Each (row of B^T, row of A) pair's products over the values k =
        part, part + 32, ... of K, the weight dequantized as it is loaded."""
        a, b = self.op.operands[:2]
        accs = [self.cf32(0.0) for _ in range(len(cols) * rb)]
        kloop = scf.ForOp(part, self.cidx(b.shape[1]), self.cidx(lanes.warp), accs)
        with ir.InsertionPoint(kloop.body):
            k = kloop.induction_variable
            weights = [self.load(b, [col, k]) for col in cols]
            xs = [self.load(a, [row_of[r], k]) for r in range(rb)]
            carried = list(kloop.inner_iter_args)
            scf.yield_([math.fma(xs[r], weights[j], carried[j * rb + r])
                        for j in range(len(cols)) for r in range(rb)])
        return list(kloop.results)
