"""Tensor cores for packed weights on the CUDA target: C = A @ B^T with A
bf16 or f16 and B (N, K) in a block format of `etc.packed` (GGML's, or
fp8_e4m3 with its block scales), for tiles of 16 rows or more: prefill.

`MatmulPackedMMA` is `MatmulMMA` (cp.async staging of A, ldmatrix,
mma.sync m16n8k16, see `matmul_mma`) whose B tile is not copied but
dequantized: each lane takes 16 values of a row of B^T in the K step
(BK = 32), reads them from the weight's GPU layout (`etc.packed`) as a
16-byte vector of quants with the block's scales beside it
(`packed_vectors.PackedVectors`, chunks of 16: the float32 arithmetic of
`etc.packed.dequantize`, so each value equals the widened weight's
bits), rounds them to A's dtype and stores them into the shared B tile
in two 16-byte stores. The stores are ordinary ones: they are done when
the step's barrier is passed, where A's copies are waited for. Rows of A
below MIN_ROWS (decode, and any tile of a step with few rows) take
`MatmulPackedGPU`, the packed GEMV, decided per tile at run time.

Numerics: the tensor cores multiply A by the weights rounded to A's dtype
(bf16: 8 significant bits, f16: 11), as A's values already are, with f32
sums: C equals A @ round(W)^T up to the order of the sums. The GEMV
below MIN_ROWS multiplies by the f32 weights, so the same request's rows
can differ by that rounding between a prefill tile and a decode tile.

Reads: a tile of tn columns has 2 tn chunks of 16 values a step, spread
over the lanes (lanes past them repeat the last, as `each_chunk` does):
each one 16-byte load of quants (q6_k two: ql and qh) and its block's
scales; a 4-bit format's two chunks of a block load the same 16 bytes
(low and high nibbles), the second from L1. Where BK is not 32 (K not a
multiple of 32: no packed format) the values are read element by element
(`stage_b_elements`, `packed_loads`).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

from .. import packed
from .base import element_type
from .matmul_mma import MatmulMMA
from .matmul_packed_gpu import MatmulPackedGPU
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
        """`stage_b` for BK = 32: the lanes take B^T's rows of the step in
        chunks of 16 values (`PackedVectors`, width 16: one 16-byte load
        of quants each, two chunks a row), dequantized in registers,
        rounded to A's dtype and stored as two 16-byte stores."""
        a, b = self.op.operands[:2]
        tn = self.op.tile[1]
        storage = ir.VectorType.get([8], element_type(a.dtype))

        def chunk(c):
            def dequantize():
                n, which = arith.divui(c, self.cidx(2)), arith.remui(c, self.cidx(2))
                reader = PackedVectors(self, b)
                (_, values), = reader.chunk(arith.addi(self.c0, n), arith.addi(
                    arith.divui(k0, self.cidx(16)), which), 16)
                narrow = arith.truncf(ir.VectorType.get([16], storage.element_type), values)
                shared = self.b_tile if lanes.simulate else self.b_shared
                col = arith.muli(which, self.cidx(16))
                for h in range(2):
                    eight = vector.shuffle(narrow, narrow, list(range(8 * h, 8 * h + 8)))
                    vector.store(eight, shared, [buffer, n, arith.addi(col, self.cidx(8 * h))])

            _when(fill, dequantize)
            return []

        return self.each_chunk(lanes, 2 * tn, chunk)

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

            _when(fill, dequantize)
            return []

        return self.each_chunk(lanes, tn * per_row, chunk)


def _when(condition, emit) -> None:
    """`emit()` always (condition None) or under `scf.if condition`."""
    if condition is None:
        emit()
        return
    branch = scf.IfOp(condition)
    with ir.InsertionPoint(branch.then_block):
        emit()
        scf.yield_([])
