"""Scalar reads of packed weights: one value of a tensor whose dtype is a
block format of `etc.packed`, dequantized to f32 in registers.

`TileKernel.load` reads a packed tensor through `load_packed`, so every
kernel that loads elements one at a time (the scalar matmul, the
embedding gather, the MoE expert tiles) reads every format as it reads a
float tensor. A packed tensor's buffer is its blocks as bytes,
`memref<N x bytes-per-row x i8>` (a stack of matrices, MoE's experts:
`memref<E x N x bytes-per-row x i8>`); value (n, k) lies in block
k / block of row n. A "row" below is the index of one row of blocks: an
index value, or a list of them in a stack ([expert, n]). Each format's
arithmetic is that of `etc.packed.dequantize` (the same float32
operations, so the values are equal bit for bit); vector kernels read
whole blocks instead (`matmul_packed`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, memref

from .. import packed

if TYPE_CHECKING:
    from ..graph_values import Tensor
    from .base import TileKernel

__all__ = ["load_packed", "load_half", "load_float", "e4m3_to_f32", "byte", "signed_byte",
           "row_at"]


def row_at(row, at) -> list:
    """The memref indices of byte `at` of row `row` (an index value, or a
    list of them for a stack of matrices)."""
    return [*row, at] if isinstance(row, (list, tuple)) else [row, at]


def byte(k: "TileKernel", t: "Tensor", row, at) -> ir.Value:
    """Byte `at` (an index value) of row `row` of packed `t`, as an i32
    from 0 to 255."""
    value = memref.load(k.buf(t), row_at(row, at))
    return arith.extui(ir.IntegerType.get_signless(32), value)


def signed_byte(k: "TileKernel", t: "Tensor", row, at) -> ir.Value:
    """Byte `at` of row `row` of packed `t` as a signed i32 (-128 .. 127)."""
    value = memref.load(k.buf(t), row_at(row, at))
    return arith.extsi(ir.IntegerType.get_signless(32), value)


def load_half(k: "TileKernel", t: "Tensor", row, at) -> ir.Value:
    """The little-endian float16 at bytes `at`, `at + 1` of row `row` of
    packed `t`, as an f32."""
    i16 = ir.IntegerType.get_signless(16)
    low = arith.extui(i16, memref.load(k.buf(t), row_at(row, at)))
    high = arith.extui(i16, memref.load(k.buf(t), row_at(row, arith.addi(at, k.cidx(1)))))
    bits = arith.ori(low, arith.shli(high, _i(16, 8)))
    return arith.extf(k.f32, arith.bitcast(ir.F16Type.get(), bits))


def load_float(k: "TileKernel", t: "Tensor", row, at) -> ir.Value:
    """The little-endian float32 at bytes `at` .. `at + 3` of row `row` of
    packed `t`."""
    i32 = ir.IntegerType.get_signless(32)
    bits = None
    for i in range(4):
        part = arith.extui(i32, memref.load(k.buf(t), row_at(row, arith.addi(at, k.cidx(i)))))
        part = arith.shli(part, _i(32, 8 * i)) if i else part
        bits = part if bits is None else arith.ori(bits, part)
    return arith.bitcast(k.f32, bits)


def e4m3_to_f32(k: "TileKernel", q: ir.Value) -> ir.Value:
    """The float8_e4m3fn value of byte `q` (an i8) as an f32: the float16
    of bits (q & 0x80) << 8 | (q & 0x7F) << 7, times 256 (exact; see
    `etc.packed`). Those bits are q sign-extended, shifted left by 7, bit
    14 (a copy of the sign) cleared."""
    i16 = ir.IntegerType.get_signless(16)
    bits = arith.andi(arith.shli(arith.extsi(i16, q), _i(16, 7)), _i(16, 0xBF80 - 0x10000))
    half = arith.extf(k.f32, arith.bitcast(ir.F16Type.get(), bits))
    return arith.mulf(half, k.cf32(256.0))


def _i(width: int, value: int) -> ir.Value:
    kind = ir.IntegerType.get_signless(width)
    return arith.constant(kind, ir.IntegerAttr.get(kind, value))


def _f32(k: "TileKernel", integer: ir.Value) -> ir.Value:
    return arith.sitofp(k.f32, integer)


def _nibble(k, t, row, base, j, offset: int) -> ir.Value:
    """Value j < 32 of a 32-value block's 16 bytes at `base + offset`: the
    low nibble of byte j for j < 16, the high nibble of byte j - 16 after."""
    high = arith.cmpi(arith.CmpIPredicate.uge, j, k.cidx(16))
    at = arith.addi(arith.addi(base, k.cidx(offset)), arith.remui(j, k.cidx(16)))
    value = byte(k, t, row, at)
    shift = arith.select(high, _i(32, 4), _i(32, 0))
    return arith.andi(arith.shrui(value, shift), _i(32, 0x0F))


def _fifth_bit(k, t, row, base, j, offset: int) -> ir.Value:
    """Bit j of the little-endian u32 at `base + offset`, times 16."""
    at = arith.addi(arith.addi(base, k.cidx(offset)), arith.divui(j, k.cidx(8)))
    shift = arith.index_cast(ir.IntegerType.get_signless(32), arith.remui(j, k.cidx(8)))
    bit = arith.andi(arith.shrui(byte(k, t, row, at), shift), _i(32, 1))
    return arith.shli(bit, _i(32, 4))


def _k_scale_min(k, t, row, base, sub) -> tuple[ir.Value, ir.Value]:
    """The 6-bit scale and minimum of sub-block `sub` (0 .. 7) of a Q4_K /
    Q5_K block (ggml's `get_scale_min_k4` over bytes 4 .. 15), as i32."""
    scales = arith.addi(base, k.cidx(4))
    low = arith.cmpi(arith.CmpIPredicate.ult, sub, k.cidx(4))
    j4 = arith.remui(sub, k.cidx(4))
    q_j = byte(k, t, row, arith.addi(scales, j4))  # q[j] (j < 4) or q[j - 4]
    q_j4 = byte(k, t, row, arith.addi(scales, arith.addi(j4, k.cidx(4))))  # q[j + 4] or q[j]
    q_j8 = byte(k, t, row, arith.addi(scales, arith.addi(j4, k.cidx(8))))  # q[j + 4], j >= 4
    mask6, mask4 = _i(32, 63), _i(32, 0x0F)
    top = lambda v: arith.shli(arith.shrui(v, _i(32, 6)), _i(32, 4))  # noqa: E731
    scale = arith.select(low, arith.andi(q_j, mask6),
                         arith.ori(arith.andi(q_j8, mask4), top(q_j)))
    minimum = arith.select(low, arith.andi(q_j4, mask6),
                           arith.ori(arith.shrui(q_j8, _i(32, 4)), top(q_j4)))
    return scale, minimum


def load_packed(k: "TileKernel", t: "Tensor", idx: list) -> ir.Value:
    """Element `idx` = [row, col] (or [expert, row, col] of a stack) of
    packed tensor `t`, dequantized to f32 as `etc.packed.dequantize`
    computes it."""
    fmt = packed.FORMATS[t.dtype]
    *row, col = idx
    block = arith.divui(col, k.cidx(fmt.block))
    j = arith.remui(col, k.cidx(fmt.block))
    base = arith.muli(block, k.cidx(fmt.nbytes))
    name = fmt.name
    if name == "fp8_e4m3":
        q = memref.load(k.buf(t), row_at(row, arith.addi(base, arith.addi(j, k.cidx(4)))))
        return arith.mulf(e4m3_to_f32(k, q), load_float(k, t, row, base))
    if name == "q8_0":
        q = signed_byte(k, t, row, arith.addi(base, arith.addi(j, k.cidx(2))))
        return arith.mulf(_f32(k, q), load_half(k, t, row, base))
    if name in ("q4_0", "iq4_nl"):
        q = _nibble(k, t, row, base, j, 2)
        if name == "q4_0":
            value = _f32(k, arith.subi(q, _i(32, 8)))
        else:
            value = _f32(k, _table(k, packed.IQ4_NL_VALUES, q))
        return arith.mulf(load_half(k, t, row, base), value)
    if name == "q4_1":
        q = _f32(k, _nibble(k, t, row, base, j, 4))
        scaled = arith.mulf(load_half(k, t, row, base), q)
        return arith.addf(scaled, load_half(k, t, row, arith.addi(base, k.cidx(2))))
    if name in ("q5_0", "q5_1"):
        at = 2 if name == "q5_0" else 4
        q = arith.ori(_nibble(k, t, row, base, j, at + 4), _fifth_bit(k, t, row, base, j, at))
        if name == "q5_0":
            return arith.mulf(load_half(k, t, row, base), _f32(k, arith.subi(q, _i(32, 16))))
        scaled = arith.mulf(load_half(k, t, row, base), _f32(k, q))
        return arith.addf(scaled, load_half(k, t, row, arith.addi(base, k.cidx(2))))
    if name in ("q4_k", "q5_k"):
        sub = arith.divui(j, k.cidx(32))
        within = arith.remui(j, k.cidx(32))
        scale, minimum = _k_scale_min(k, t, row, base, sub)
        qs = 16 if name == "q4_k" else 48
        at = arith.addi(arith.addi(base, k.cidx(qs)),
                        arith.addi(arith.muli(arith.divui(sub, k.cidx(2)), k.cidx(32)), within))
        odd = arith.cmpi(arith.CmpIPredicate.ne, arith.remui(sub, k.cidx(2)), k.cidx(0))
        shift = arith.select(odd, _i(32, 4), _i(32, 0))
        q = arith.andi(arith.shrui(byte(k, t, row, at), shift), _i(32, 0x0F))
        if name == "q5_k":
            high = byte(k, t, row, arith.addi(arith.addi(base, k.cidx(16)), within))
            sub32 = arith.index_cast(ir.IntegerType.get_signless(32), sub)
            bit = arith.andi(arith.shrui(high, sub32), _i(32, 1))
            q = arith.ori(q, arith.shli(bit, _i(32, 4)))
        d = arith.mulf(load_half(k, t, row, base), _f32(k, scale))
        dm = arith.mulf(load_half(k, t, row, arith.addi(base, k.cidx(2))), _f32(k, minimum))
        return arith.subf(arith.mulf(d, _f32(k, q)), dm)
    if name == "q6_k":
        # Value j: half h = j / 128, run r = (j % 128) / 32, l = j % 32;
        # low 4 bits from ql[64 h + l + 32 (r % 2)] (high nibble when r >= 2),
        # 2 high bits from qh[32 h + l] >> 2 r; scale index j / 16.
        half = arith.divui(j, k.cidx(128))
        rest = arith.remui(j, k.cidx(128))
        run = arith.divui(rest, k.cidx(32))
        lane = arith.remui(rest, k.cidx(32))
        low_at = arith.addi(arith.addi(base, arith.muli(half, k.cidx(64))),
                            arith.addi(lane, arith.muli(arith.remui(run, k.cidx(2)),
                                                        k.cidx(32))))
        nibble_shift = arith.select(arith.cmpi(arith.CmpIPredicate.uge, run, k.cidx(2)),
                                    _i(32, 4), _i(32, 0))
        low = arith.andi(arith.shrui(byte(k, t, row, low_at), nibble_shift), _i(32, 0x0F))
        high_at = arith.addi(arith.addi(base, k.cidx(128)),
                             arith.addi(arith.muli(half, k.cidx(32)), lane))
        high_shift = arith.index_cast(ir.IntegerType.get_signless(32),
                                      arith.muli(run, k.cidx(2)))
        high = arith.andi(arith.shrui(byte(k, t, row, high_at), high_shift), _i(32, 3))
        q = arith.subi(arith.ori(low, arith.shli(high, _i(32, 4))), _i(32, 32))
        scale = signed_byte(k, t, row, arith.addi(arith.addi(base, k.cidx(192)),
                                                  arith.divui(j, k.cidx(16))))
        d = arith.mulf(load_half(k, t, row, arith.addi(base, k.cidx(208))), _f32(k, scale))
        return arith.mulf(d, _f32(k, q))
    raise NotImplementedError(f"load_packed: no scalar read of {name}")


def _table(k: "TileKernel", values, index: ir.Value) -> ir.Value:
    """values[index] for a small constant table (i32 `index`), as i32: a
    chain of selects."""
    out = _i(32, int(values[0]))
    for position in range(1, len(values)):
        hit = arith.cmpi(arith.CmpIPredicate.eq, index, _i(32, position))
        out = arith.select(hit, _i(32, int(values[position])), out)
    return out
