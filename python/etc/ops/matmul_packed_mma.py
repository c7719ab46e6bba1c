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
from .packed_vectors import CHUNK_FORMATS, PackedVectors


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
        buffer `buffer`: by chunks of 32 values (`PackedVectors`, 16-byte
        loads) where BK is 32, else 8 values at a time read element by
        element (`stage_b_elements`); with `fill` false (the last step's
        prefetch, which no step reads) nothing."""
        b = self.op.operands[1]
        if bk == 32 and b.dtype in CHUNK_FORMATS:
            return self.stage_b_chunks(lanes, buffer, k0, fill)
        return self.stage_b_elements(lanes, buffer, k0, bk, fill)

    def stage_b_chunks(self, lanes, buffer, k0, fill) -> list:
        """`stage_b` for BK = 32: each lane takes one row of B^T's 32 values
        of the step (a chunk of width 32), dequantized in registers from
        16-byte loads, rounded to A's dtype and stored as 4 16-byte stores
        (all loads before the stores)."""
        a, b = self.op.operands[:2]
        tn = self.op.tile[1]
        storage = ir.VectorType.get([8], element_type(a.dtype))

        def chunk(n):
            def dequantize():
                reader = PackedVectors(self, b)
                row = arith.addi(self.c0, n)
                parts = reader.chunk(row, arith.divui(k0, self.cidx(32)), 32)
                shared = self.b_tile if lanes.simulate else self.b_shared
                for s, (_, values) in enumerate(parts):
                    narrow = arith.truncf(ir.VectorType.get([16], storage.element_type), values)
                    for h in range(2):
                        eight = vector.shuffle(narrow, narrow, list(range(8 * h, 8 * h + 8)))
                        vector.store(eight, shared, [buffer, n, self.cidx(16 * s + 8 * h)])

            if fill is None:
                dequantize()
            else:
                branch = scf.IfOp(fill)
                with ir.InsertionPoint(branch.then_block):
                    dequantize()
                    scf.yield_([])
            return []

        return self.each_chunk(lanes, tn, chunk)

    def stage_b_elements(self, lanes, buffer, k0, bk: int, fill) -> list:
        """`stage_b` 8 values (16 bytes of A's dtype) per chunk, each value
        read by `packed_loads`."""
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
