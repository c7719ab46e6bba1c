"""Tensor cores for packed weights on the CUDA target: C = A @ B^T with A
bf16 or f16 and B (N, K) in a block format of `etc.packed` (GGML's, or
fp8_e4m3 with its block scales), for tiles of 16 rows or more: prefill.

`MatmulPackedMMA` is `MatmulMMA` (cp.async staging of A, ldmatrix,
mma.sync m16n8k16, see `matmul_mma`) whose B tile is not copied but
dequantized: each lane takes chunks of 8 consecutive values of one row of
B^T, reads them through `packed_loads` (the float32 arithmetic of
`etc.packed.dequantize`, so each value equals the widened weight's bits),
rounds them to A's dtype and stores them into the shared B tile in one
16-byte store. The stores are ordinary ones: they are done when the
step's barrier is passed, where A's copies are waited for. Rows of A
below MIN_ROWS (decode, and any tile of a step with few rows) take
`MatmulPackedGPU`, the packed GEMV, decided per tile at run time.

Numerics: the tensor cores multiply A by the weights rounded to A's dtype
(bf16: 8 significant bits, f16: 11), as A's values already are, with f32
sums: C equals A @ round(W)^T up to the order of the sums. The GEMV
below MIN_ROWS multiplies by the f32 weights, so the same request's rows
can differ by that rounding between a prefill tile and a decode tile.

Reads: a chunk's 8 values share their block's scale (and a K-quant's
sub-block scale and minimum), which the 8 dequantizations load again;
the loads are the same addresses with no store between them, which LLVM
merges. What is left of the reads is one or two byte loads per value,
not 16-byte loads of whole blocks (the GEMV's loads are also per value).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

from .. import packed
from .base import element_type
from .matmul_mma import MatmulMMA
from .matmul_packed import MatmulPackedGPU


class MatmulPackedMMA(MatmulMMA, MatmulPackedGPU):
    """Packed B^T on the tensor cores (tiles of MIN_ROWS rows or more), the
    packed GEMV (`MatmulPackedGPU`) below (see the module docstring)."""

    @classmethod
    def name(cls, op) -> str:
        return f"matmul_{op.operands[1].dtype}_gemv_mma"

    @classmethod
    def applies(cls, op, target) -> bool:
        return (packed.is_packed(op.operands[1].dtype) and op.params["transpose_b"]
                and MatmulMMA.applies(op, target) and MatmulPackedGPU.applies(op, target))

    def narrow(self) -> None:
        MatmulPackedGPU.emit(self)

    def stage_b(self, lanes, buffer, k0, bk: int, fill) -> list:
        """Dequantizes B^T's rows of the tile over k0 : k0 + bk into shared
        buffer `buffer`, 8 values (16 bytes of A's dtype) per chunk; with
        `fill` false (the last step's prefetch, which no step reads)
        nothing."""
        a, b = self.op.operands[:2]
        tn = self.op.tile[1]
        per_row = bk // 8
        storage = ir.VectorType.get([8], element_type(a.dtype))

        def chunk(c):
            n = arith.divui(c, self.cidx(per_row))
            col = arith.muli(arith.remui(c, self.cidx(per_row)), self.cidx(8))
            row, k = arith.addi(self.c0, n), arith.addi(k0, col)

            def dequantize():
                # Every value first, then one store: no store between the
                # loads of the block's scales, so they can be merged.
                values = [arith.truncf(storage.element_type,
                                       self.load(b, [row, arith.addi(k, self.cidx(i))]))
                          for i in range(8)]
                shared = self.b_tile if lanes.simulate else self.b_shared
                vector.store(vector.from_elements(storage, values), shared, [buffer, n, col])

            if fill is None:
                dequantize()
            else:
                branch = scf.IfOp(fill)
                with ir.InsertionPoint(branch.then_block):
                    dequantize()
                    scf.yield_([])
            return []

        return self.each_chunk(lanes, tn * per_row, chunk)
