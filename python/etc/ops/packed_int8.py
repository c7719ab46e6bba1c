"""The byte and int8 vector primitives of `matmul_packed.PackedDotsCPU`
(a mixin): reading a packed weight's scales (`half`: float16, `e8m0`:
MXFP4's, `k_scales_mins` / `k_scale_bytes`: a K-quant block's 6-bit
sub-block scales and minimums), unpacking its quants (`nibbles`,
`low_nibbles` / `high_nibbles`, `fifth_bits`, `lookup` in a 16-entry
table, `splat_i8`), and the int8 products (`sign`, `int8_dot`,
`vnni_dot`): the AVX2 / VNNI instruction where the tile's instruction
set has it, else plain vector code computing the same.

The class using it provides `BLOCK` (values per activation block),
`avx2`, the element types (`i8`, `i16`, `i32`, `f32`, `vtype`) and the
weight's buffer (`buf(self.weight)`), as `base.TileKernel` and
`PackedDotsCPU` do.
"""

from __future__ import annotations

import numpy as np
from mlir import ir
from mlir.dialects import arith, llvm, memref, vector

from .packed_loads import e8m0_half, row_at


class Int8Vectors:
    """Byte-level reads, unpacking and int8 dot products of packed weights
    (see the module docstring)."""

    def k_scales_mins(self, words: ir.Value, d: ir.Value, dmin: ir.Value) -> tuple:
        """A Q4_K / Q5_K block's 8 scales times `d` and 8 minimums times
        -`dmin` (two vector<8xf32>) from its 12 bytes of 6-bit fields
        (`words`: the block's bytes 4 .. 19; `k_scale_bytes`)."""
        values = arith.uitofp(self.vtype(16), self.k_scale_bytes(words))
        scales = vector.shuffle(values, values, list(range(8)))
        minimums = vector.shuffle(values, values, list(range(8, 16)))
        return (arith.mulf(scales, vector.broadcast(self.vtype(8), d)),
                arith.mulf(minimums, vector.broadcast(self.vtype(8), arith.negf(dmin))))

    def k_scale_bytes(self, words: ir.Value) -> ir.Value:
        """A Q4_K / Q5_K block's 8 scales then 8 minimums (0 .. 63, a
        vector<16xi8>) from its 12 bytes of 6-bit fields (`words`),
        unpacked together in four 32-bit lanes (ggml's `get_scale_min_k4`
        for all 8 at once) instead of 3 byte loads and a select per
        sub-block."""
        i32x2 = ir.VectorType.get([2], self.i32)
        splat = lambda v: arith.constant(i32x2, ir.DenseElementsAttr.get_splat(  # noqa: E731
            i32x2, ir.IntegerAttr.get(self.i32, v)))
        w = vector.bitcast(ir.VectorType.get([4], self.i32), words)
        low = vector.shuffle(w, w, [0, 1])  # scales 0-3, minimums 0-3 in their low 6 bits
        third = vector.shuffle(w, w, [2, 2])  # the low 4 bits of 4-7: nibbles of bytes 8-11
        shifts = arith.constant(i32x2, ir.DenseElementsAttr.get(
            np.array([0, 4], dtype=np.int32), type=i32x2))
        top = arith.shli(arith.andi(arith.shrui(low, splat(6)), splat(0x03030303)), splat(4))
        high = arith.ori(arith.andi(arith.shrui(third, shifts), splat(0x0F0F0F0F)), top)
        low = arith.andi(low, splat(0x3F3F3F3F))
        both = vector.shuffle(low, high, [0, 2, 1, 3])  # scales 0-7, minimums 0-7
        return vector.bitcast(ir.VectorType.get([16], self.i8), both)

    def half(self, row, at) -> ir.Value:
        """The float16 at bytes `at`, `at + 1` of row `row` of the weight as
        an f32: one 2-byte load and a conversion (`vcvtph2ps` with F16C)."""
        two = vector.load(ir.VectorType.get([2], self.i8), self.buf(self.weight),
                          row_at(row, at))
        one = vector.bitcast(ir.VectorType.get([1], ir.F16Type.get()), two)
        return arith.extf(self.f32, vector.extract(one, [], [0]))

    def e8m0(self, row, at) -> ir.Value:
        """MXFP4's scale 2^(e - 128) of the e8m0 byte at `at` of row `row`
        of the weight, as an f32 (`etc.packed.e8m0_half`: the bits
        (e - 1) << 23, or the subnormal 0x00200000 << e for e < 2)."""
        return e8m0_half(self, memref.load(self.buf(self.weight), row_at(row, at)))

    def splat_i8(self, value: int) -> ir.Value:
        kind = ir.VectorType.get([self.BLOCK], self.i8)
        return arith.constant(kind, ir.DenseElementsAttr.get_splat(
            kind, ir.IntegerAttr.get(self.i8, value)))

    def low_nibbles(self, v: ir.Value) -> ir.Value:
        return arith.andi(v, self.splat_i8(0x0F))

    def high_nibbles(self, v: ir.Value) -> ir.Value:
        return arith.shrui(v, self.splat_i8(4))

    def nibbles(self, v16: ir.Value) -> ir.Value:
        """A 32-value block's 16 bytes as 32 values: the low nibbles, then
        the high ones (one shift for all 16 bytes: x86 has no per-byte
        variable shift)."""
        kind = v16.type
        low_mask = arith.constant(kind, ir.DenseElementsAttr.get_splat(
            kind, ir.IntegerAttr.get(self.i8, 0x0F)))
        four = arith.constant(kind, ir.DenseElementsAttr.get_splat(
            kind, ir.IntegerAttr.get(self.i8, 4)))
        low = arith.andi(v16, low_mask)
        high = arith.shrui(v16, four)
        return vector.shuffle(low, high, list(range(self.BLOCK)))

    def fifth_bits(self, qh: ir.Value) -> ir.Value:
        """Bit j of the little-endian u32 `qh` (vector<4xi8>) times 16, for
        j < 32."""
        spread = vector.shuffle(qh, qh, [j // 8 for j in range(self.BLOCK)])
        kind = ir.VectorType.get([self.BLOCK], self.i8)
        masks = arith.constant(kind, ir.DenseElementsAttr.get(
            np.array([1 << (j % 8) for j in range(self.BLOCK)], np.uint8).view(np.int8),
            type=kind))
        hit = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(spread, masks), self.splat_i8(0))
        return arith.select(hit, self.splat_i8(16), self.splat_i8(0))

    def lookup(self, table, index: ir.Value) -> ir.Value:
        """table[index] lane by lane for a 16-entry int8 table (`vpshufb`
        with AVX2)."""
        kind = ir.VectorType.get([self.BLOCK], self.i8)
        values = np.asarray(table, np.int8)
        if self.avx2:
            # vpshufb looks up within each 16-byte half: the table twice.
            both = arith.constant(kind, ir.DenseElementsAttr.get(np.concatenate([values, values]),
                                                                 type=kind))
            return self._intrinsic("llvm.x86.avx2.pshuf.b", kind, both, index)
        out = self.splat_i8(int(values[0]))
        for position in range(1, 16):
            hit = arith.cmpi(arith.CmpIPredicate.eq, index, self.splat_i8(position))
            out = arith.select(hit, self.splat_i8(int(values[position])), out)
        return out

    # -- int8 arithmetic (AVX2, or plain vector code computing the same) ----

    def _intrinsic(self, name: str, result: ir.Type, *args) -> ir.Value:
        return llvm.call_intrinsic(result, name, list(args), [], [])

    def sign(self, x: ir.Value, by: ir.Value) -> ir.Value:
        """x with the sign of `by` applied lane by lane (0 where `by` is 0):
        `vpsignb`."""
        if self.avx2:
            return self._intrinsic("llvm.x86.avx2.psign.b", x.type, x, by)
        zero = arith.constant(x.type, ir.DenseElementsAttr.get_splat(
            x.type, ir.IntegerAttr.get(self.i8, 0)))
        negative = arith.cmpi(arith.CmpIPredicate.slt, by, zero)
        zeroed = arith.cmpi(arith.CmpIPredicate.eq, by, zero)
        return arith.select(zeroed, zero, arith.select(negative, arith.subi(zero, x), x))

    def vnni_dot(self, start: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
        """`start` (vector<8xi32> or <16xi32>) plus the sums of 4 consecutive
        products unsigned[j] * signed[j] (32 or 64 i8 lanes, `unsigned`
        read as 0 .. 255): one `vpdpbusd` (AVX-VNNI, or AVX-512 VNNI on
        256-bit vectors; AVX-512 VNNI on 512-bit ones), exact: no 16-bit
        step between."""
        width = ir.VectorType(start.type).shape[0] * 32
        return self._intrinsic(f"llvm.x86.avx512.vpdpbusd.{width}", start.type, start,
                               unsigned, signed)

    def int8_dot(self, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
        """The 8 sums of 4 consecutive products unsigned[j] * signed[j]
        (32 i8 lanes each, `unsigned` read as 0 .. 255) as vector<8xi32>:
        `vpmaddubsw` then `vpmaddwd` with ones."""
        if self.avx2:
            pairs = self._intrinsic("llvm.x86.avx2.pmadd.ub.sw",
                                    ir.VectorType.get([16], self.i16), unsigned, signed)
            ones = arith.constant(pairs.type, ir.DenseElementsAttr.get_splat(
                pairs.type, ir.IntegerAttr.get(self.i16, 1)))
            return self._intrinsic("llvm.x86.avx2.pmadd.wd", ir.VectorType.get([8], self.i32),
                                   pairs, ones)
        wide = ir.VectorType.get([self.BLOCK], self.i32)
        products = arith.muli(arith.extui(wide, unsigned), arith.extsi(wide, signed))
        quarters = [vector.shuffle(products, products, list(range(q, self.BLOCK, 4)))
                    for q in range(4)]
        return arith.addi(arith.addi(quarters[0], quarters[1]),
                          arith.addi(quarters[2], quarters[3]))
