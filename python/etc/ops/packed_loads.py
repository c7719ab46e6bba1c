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
whole blocks instead (`matmul_packed`, `packed_vectors`).

Layouts: CUDA kernels (simulated lanes too) read a weight in the GPU
layout of `etc.packed` (`to_gpu_layout`: each field of every block stored
together) where the format is repacked (`gpu_layout`), CPU kernels the
GGUF layout. `load_packed` addresses both through `Block`, which maps a
GGUF block byte to its place; `byte`, `signed_byte`, `load_half` and
`load_float` read the GGUF layout only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir import ir
from mlir.dialects import arith, memref

from .. import packed

if TYPE_CHECKING:
    from ..graph_values import Tensor
    from .base import TileKernel

__all__ = ["load_packed", "load_half", "load_float", "e4m3_to_f32", "e8m0_half", "byte",
           "signed_byte", "row_at", "Block", "gpu_layout", "flat_bytes", "block_count",
           "global_block", "field_at"]


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


def e8m0_half(k: "TileKernel", e: ir.Value) -> ir.Value:
    """MXFP4's block scale 2^(e - 128) of e8m0 byte `e` (an i8) as an f32,
    exactly (`etc.packed.e8m0_half`): the float32 bits (e - 1) << 23 for
    e >= 2, the subnormal 0x00200000 << e below."""
    i32 = ir.IntegerType.get_signless(32)
    wide = arith.extui(i32, e)
    normal = arith.shli(arith.subi(wide, _i(32, 1)), _i(32, 23))
    tiny = arith.shli(_i(32, 0x00200000), wide)
    small = arith.cmpi(arith.CmpIPredicate.ult, wide, _i(32, 2))
    return arith.bitcast(k.f32, arith.select(small, tiny, normal))


def _i(width: int, value: int) -> ir.Value:
    kind = ir.IntegerType.get_signless(width)
    return arith.constant(kind, ir.IntegerAttr.get(kind, value))


def _f32(k: "TileKernel", integer: ir.Value) -> ir.Value:
    return arith.sitofp(k.f32, integer)


def gpu_layout(k: "TileKernel", t: "Tensor") -> bool:
    """Whether packed `t` is read in the GPU layout (`etc.packed`): by CUDA
    kernels (simulated lanes too), in a format the upload repacks."""
    return k.target.gpu_kernels and packed.gpu_repacked(t.dtype)


def flat_bytes(k: "TileKernel", t: "Tensor") -> ir.Value:
    """Packed `t`'s buffer as one dimension of bytes (a view)."""
    source = k.buf(t)
    shape = ir.MemRefType(source.type).shape
    total = 1
    for size in shape:
        total = ir.ShapedType.get_dynamic_size() \
            if ir.ShapedType.is_dynamic_size(size) or total < 0 else total * size
    kind = ir.MemRefType.get([total], ir.IntegerType.get_signless(8))
    together = ir.ArrayAttr.get([ir.ArrayAttr.get(
        [ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d) for d in range(len(shape))])])
    return memref.collapse_shape(kind, source, together)


def block_count(k: "TileKernel", t: "Tensor") -> ir.Value:
    """The blocks of packed `t` in all (an index)."""
    fmt = packed.FORMATS[t.dtype]
    total = k.cidx(t.shape[-1] // fmt.block)
    for d in range(len(t.shape) - 1):
        total = arith.muli(total, k.dim(t, d))
    return total


def global_block(k: "TileKernel", t: "Tensor", row, block) -> ir.Value:
    """The index of block `block` (an index) of row `row` among all the
    blocks of packed `t`, row by row (the GPU layout's block order)."""
    fmt = packed.FORMATS[t.dtype]
    rows = list(row) if isinstance(row, (list, tuple)) else [row]
    linear = rows[0]
    for d in range(1, len(rows)):
        linear = arith.addi(arith.muli(linear, k.dim(t, d)), rows[d])
    return arith.addi(arith.muli(linear, k.cidx(t.shape[-1] // fmt.block)), block)


class Block:
    """The bytes of one block of packed `t` (row `row`, block `block` of it,
    an index value): `at(start, inner)` is the memref and indices of GGUF
    block byte `start` (an int, naming the field) + `inner` (an index value
    or None), in the layout `t` is read in (`gpu_layout`)."""

    def __init__(self, k: "TileKernel", t: "Tensor", row, block):
        self.k, self.t = k, t
        self.dtype = t.dtype
        self.gpu = gpu_layout(k, t)
        if self.gpu:
            self.flat = flat_bytes(k, t)
            self.index = global_block(k, t, row, block)
            self.count = block_count(k, t)
        else:
            self.row = row
            self.base = arith.muli(block, k.cidx(packed.FORMATS[t.dtype].nbytes))

    def at(self, start: int, inner=None) -> tuple:
        k = self.k
        if not self.gpu:
            at = arith.addi(self.base, k.cidx(start))
            return k.buf(self.t), row_at(self.row, at if inner is None else arith.addi(at, inner))
        at = field_at(k, self.dtype, self.count, self.index, start)
        return self.flat, [at if inner is None else arith.addi(at, inner)]

    def load(self, start: int, inner=None) -> ir.Value:
        """The i8 at GGUF block byte `start` + `inner`."""
        buffer, idx = self.at(start, inner)
        return memref.load(buffer, idx)

    def byte(self, start: int, inner=None) -> ir.Value:
        """That byte as an i32 from 0 to 255."""
        return arith.extui(ir.IntegerType.get_signless(32), self.load(start, inner))

    def signed_byte(self, start: int, inner=None) -> ir.Value:
        """That byte as a signed i32 (-128 .. 127)."""
        return arith.extsi(ir.IntegerType.get_signless(32), self.load(start, inner))

    def half(self, start: int) -> ir.Value:
        """The little-endian float16 at GGUF block bytes `start`, `start` + 1,
        as an f32."""
        i16 = ir.IntegerType.get_signless(16)
        low = arith.extui(i16, self.load(start))
        high = arith.extui(i16, self.load(start + 1))
        bits = arith.ori(low, arith.shli(high, _i(16, 8)))
        return arith.extf(self.k.f32, arith.bitcast(ir.F16Type.get(), bits))

    def float(self, start: int) -> ir.Value:
        """The little-endian float32 at GGUF block bytes `start` .. + 3."""
        i32 = ir.IntegerType.get_signless(32)
        bits = None
        for i in range(4):
            part = arith.extui(i32, self.load(start + i))
            part = arith.shli(part, _i(32, 8 * i)) if i else part
            bits = part if bits is None else arith.ori(bits, part)
        return arith.bitcast(self.k.f32, bits)


def field_at(k: "TileKernel", dtype: str, count: ir.Value, index: ir.Value,
             start: int) -> ir.Value:
    """The byte offset, in the GPU layout of a `dtype` tensor of `count`
    blocks, of GGUF byte `start` of block `index` (`packed.gpu_field_offset`)."""
    before, size, first = packed.gpu_field_offset(dtype, start)
    at = arith.muli(index, k.cidx(size))
    if before:
        at = arith.addi(at, arith.muli(count, k.cidx(before)))
    return arith.addi(at, k.cidx(start - first)) if start != first else at


def _nibble(k, blk: Block, j, offset: int) -> ir.Value:
    """Value j < 32 of a 32-value block's 16 bytes at `offset`: the low
    nibble of byte j for j < 16, the high nibble of byte j - 16 after."""
    high = arith.cmpi(arith.CmpIPredicate.uge, j, k.cidx(16))
    value = blk.byte(offset, arith.remui(j, k.cidx(16)))
    shift = arith.select(high, _i(32, 4), _i(32, 0))
    return arith.andi(arith.shrui(value, shift), _i(32, 0x0F))


def _fifth_bit(k, blk: Block, j, offset: int) -> ir.Value:
    """Bit j of the little-endian u32 at `offset`, times 16."""
    shift = arith.index_cast(ir.IntegerType.get_signless(32), arith.remui(j, k.cidx(8)))
    bit = arith.andi(arith.shrui(blk.byte(offset, arith.divui(j, k.cidx(8))), shift),
                     _i(32, 1))
    return arith.shli(bit, _i(32, 4))


def _k_scale_min(k, blk: Block, sub) -> tuple[ir.Value, ir.Value]:
    """The 6-bit scale and minimum of sub-block `sub` (0 .. 7) of a Q4_K /
    Q5_K block (ggml's `get_scale_min_k4` over bytes 4 .. 15), as i32."""
    low = arith.cmpi(arith.CmpIPredicate.ult, sub, k.cidx(4))
    j4 = arith.remui(sub, k.cidx(4))
    q_j = blk.byte(4, j4)  # q[j] (j < 4) or q[j - 4]
    q_j4 = blk.byte(8, j4)  # q[j + 4] or q[j]
    q_j8 = blk.byte(12, j4)  # q[j + 4], j >= 4
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
    computes it, from the layout `t` is read in (`gpu_layout`)."""
    fmt = packed.FORMATS[t.dtype]
    *row, col = idx
    row = row[0] if len(row) == 1 else row
    j = arith.remui(col, k.cidx(fmt.block))
    blk = Block(k, t, row, arith.divui(col, k.cidx(fmt.block)))
    name = fmt.name
    if name == "fp8_e4m3":
        return arith.mulf(e4m3_to_f32(k, blk.load(4, j)), blk.float(0))
    if name == "q8_0":
        return arith.mulf(_f32(k, blk.signed_byte(2, j)), blk.half(0))
    if name in ("q4_0", "iq4_nl"):
        q = _nibble(k, blk, j, 2)
        if name == "q4_0":
            value = _f32(k, arith.subi(q, _i(32, 8)))
        else:
            value = _f32(k, _table(k, packed.IQ4_NL_VALUES, q))
        return arith.mulf(blk.half(0), value)
    if name == "mxfp4":
        value = _f32(k, _table(k, packed.MXFP4_VALUES, _nibble(k, blk, j, 1)))
        return arith.mulf(e8m0_half(k, blk.load(0)), value)
    if name == "q4_1":
        q = _f32(k, _nibble(k, blk, j, 4))
        return arith.addf(arith.mulf(blk.half(0), q), blk.half(2))
    if name in ("q5_0", "q5_1"):
        at = 2 if name == "q5_0" else 4
        q = arith.ori(_nibble(k, blk, j, at + 4), _fifth_bit(k, blk, j, at))
        if name == "q5_0":
            return arith.mulf(blk.half(0), _f32(k, arith.subi(q, _i(32, 16))))
        return arith.addf(arith.mulf(blk.half(0), _f32(k, q)), blk.half(2))
    if name in ("q4_k", "q5_k"):
        sub = arith.divui(j, k.cidx(32))
        within = arith.remui(j, k.cidx(32))
        scale, minimum = _k_scale_min(k, blk, sub)
        qs = 16 if name == "q4_k" else 48
        at = arith.addi(arith.muli(arith.divui(sub, k.cidx(2)), k.cidx(32)), within)
        odd = arith.cmpi(arith.CmpIPredicate.ne, arith.remui(sub, k.cidx(2)), k.cidx(0))
        shift = arith.select(odd, _i(32, 4), _i(32, 0))
        q = arith.andi(arith.shrui(blk.byte(qs, at), shift), _i(32, 0x0F))
        if name == "q5_k":
            high = blk.byte(16, within)
            sub32 = arith.index_cast(ir.IntegerType.get_signless(32), sub)
            bit = arith.andi(arith.shrui(high, sub32), _i(32, 1))
            q = arith.ori(q, arith.shli(bit, _i(32, 4)))
        d = arith.mulf(blk.half(0), _f32(k, scale))
        dm = arith.mulf(blk.half(2), _f32(k, minimum))
        return arith.subf(arith.mulf(d, _f32(k, q)), dm)
    if name == "q6_k":
        # Value j: half h = j / 128, run r = (j % 128) / 32, l = j % 32;
        # low 4 bits from ql[64 h + l + 32 (r % 2)] (high nibble when r >= 2),
        # 2 high bits from qh[32 h + l] >> 2 r; scale index j / 16.
        half = arith.divui(j, k.cidx(128))
        rest = arith.remui(j, k.cidx(128))
        run = arith.divui(rest, k.cidx(32))
        lane = arith.remui(rest, k.cidx(32))
        low_at = arith.addi(arith.muli(half, k.cidx(64)),
                            arith.addi(lane, arith.muli(arith.remui(run, k.cidx(2)),
                                                        k.cidx(32))))
        nibble_shift = arith.select(arith.cmpi(arith.CmpIPredicate.uge, run, k.cidx(2)),
                                    _i(32, 4), _i(32, 0))
        low = arith.andi(arith.shrui(blk.byte(0, low_at), nibble_shift), _i(32, 0x0F))
        high_at = arith.addi(arith.muli(half, k.cidx(32)), lane)
        high_shift = arith.index_cast(ir.IntegerType.get_signless(32),
                                      arith.muli(run, k.cidx(2)))
        high = arith.andi(arith.shrui(blk.byte(128, high_at), high_shift), _i(32, 3))
        q = arith.subi(arith.ori(low, arith.shli(high, _i(32, 4))), _i(32, 32))
        scale = blk.signed_byte(192, arith.divui(j, k.cidx(16)))
        d = arith.mulf(blk.half(208), _f32(k, scale))
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
