"""16-byte reads of packed weights on the GPU: a chunk of a row's values
(16 or 32) read as whole 16-byte vectors of quants
(`ld.global.v4`), with the block's scales beside them, and dequantized in
registers to vectors of 16 f32 values.

The packed GEMV (`MatmulPackedGPU`) and the tensor cores'
dequantization into the shared tile (`MatmulPackedMMA`) read B through
`PackedVectors`. The weight is in the GPU layout of `etc.packed`
(`to_gpu_layout`: every block's quants 16-byte aligned, its scales,
minimums and high bits in fields of their own), except q4_k and q5_k,
whose GGUF blocks (144 and 176 bytes) and rows are multiples of 16 bytes
already and are read in place. Every value is computed with the float32
operations of `etc.packed.dequantize` (so it equals the widened weight).

Chunks: chunk c of a row of a format with blocks of 32 values is that
block (values 32c .. 32c + 31): q8_0 and fp8_e4m3 two 16-byte loads of
quants, the 4- and 5-bit formats one (low nibbles: values 0-15, high
nibbles 16-31), q5_0 / q5_1 a 4-byte load of the fifth bits. A chunk of
a K-quant (blocks of 256) is a sub-block of 32 values:

* q4_k / q5_k: sub-block s is the low (s even) or high nibbles of the 32
  bytes of qs at 32 (s / 2) (two 16-byte loads); the block's first 16
  bytes (d, dmin and the 12 bytes of 6-bit scales and minimums) are one
  more 16-byte load, unpacked with shifts of its 32-bit words (no dynamic
  indexing of registers, which would put them in local memory); q5_k's
  32 bytes of fifth bits are two more.
* q6_k: run r of half h (values 128 h + 32 r + l, l < 32): two 16-byte
  loads of ql (their low or high nibbles) and two of qh (2 bits at 2 r);
  the two int8 scales are byte loads.

Chunks of 64 values (two sub-blocks, every loaded byte used) spilled the
GEMV of q5_k and q6_k at Llama-3.2-1B's widths on sm_80: the GEMV takes
chunks of 32 (`gemv_width`).

Chunks of width 16 (the tensor cores' staging: two per row and K step,
so that twice as many lanes share a step's dequantization) are one
16-byte load of quants each: half a 32-value block (q8_0 and fp8_e4m3
their own 16 bytes, the 4- and 5-bit formats the block's 16 bytes with
the nibbles chosen by a shift), a K-quant sub-block's half (q6_k one
load of ql and one of qh).

Every format of `etc.packed` has a chunk reader here; `MatmulPackedGPU`
still reads element by element (`packed_loads`) where K is not a
multiple of its chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from mlir import ir
from mlir.dialects import arith, memref, vector

from .. import packed
from .packed_loads import block_count, field_at, flat_bytes, global_block, gpu_layout

if TYPE_CHECKING:
    from ..graph_values import Tensor
    from .base import TileKernel

__all__ = ["PackedVectors", "CHUNK_FORMATS", "gemv_width"]

#: The formats `PackedVectors` reads.
CHUNK_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "fp8_e4m3", "q4_k",
                 "q5_k", "q6_k")


def gemv_width(dtype: str) -> int:
    """Values per chunk the GEMV takes: 32 for every format. Chunks of 64
    for the K-quants (every loaded byte used; removed) left 4 columns x 64
    values live and spilled q5_k and q6_k at Llama-3.2-1B's widths on sm_80
    (40 to 196 bytes), whether dequantized at once or per segment."""
    return 32


class PackedVectors:
    """Chunks of the rows of packed `t` (see the module docstring), read by
    tile kernel `k`. `chunk(row, c, width)` returns the chunk's values as
    [(k of its first value, vector<16xf32>)], in 16 consecutive values
    each."""

    def __init__(self, k: "TileKernel", t: "Tensor"):
        if t.dtype not in CHUNK_FORMATS:
            raise NotImplementedError(f"PackedVectors: no 16-byte reads of {t.dtype}")
        self.k, self.t, self.dtype = k, t, t.dtype
        self.fmt = packed.FORMATS[t.dtype]
        self.flat = flat_bytes(k, t)
        self.gpu = gpu_layout(k, t)
        self.count = block_count(k, t) if self.gpu else None
        self.i8 = ir.IntegerType.get_signless(8)
        self.i16 = ir.IntegerType.get_signless(16)
        self.i32 = ir.IntegerType.get_signless(32)
        self.simulate = k.target.simulate_lanes

    # -- addresses and loads ----------------------------------------------

    def offset(self, block: ir.Value, start: int, inner: int = 0) -> ir.Value:
        """The byte offset in the flat buffer of GGUF byte `start` + `inner`
        of global block `block`."""
        k = self.k
        if self.gpu:
            at = field_at(k, self.dtype, self.count, block, start)
        else:
            at = arith.addi(arith.muli(block, k.cidx(self.fmt.nbytes)), k.cidx(start))
        return arith.addi(at, k.cidx(inner)) if inner else at

    def raw(self, block, start: int, n: int, inner=0) -> ir.Value:
        """vector<n x i8> from GGUF byte `start` + `inner` (an int or an
        index value) of `block`, its address a multiple of n (claimed on
        the GPU)."""
        align = None if self.simulate else ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n)
        at = self.offset(block, start, inner) if isinstance(inner, int) else \
            arith.addi(self.offset(block, start), inner)
        return vector.load(ir.VectorType.get([n], self.i8), self.flat, [at], alignment=align)

    def half(self, block, start: int) -> ir.Value:
        """The float16 at GGUF byte `start` of `block`, as an f32."""
        one = vector.bitcast(ir.VectorType.get([1], ir.F16Type.get()), self.raw(block, start, 2))
        return arith.extf(self.k.f32, vector.extract(one, [], [0]))

    def word(self, block, start: int) -> ir.Value:
        """The little-endian u32 at GGUF byte `start` of `block` (an i32)."""
        one = vector.bitcast(ir.VectorType.get([1], self.i32), self.raw(block, start, 4))
        return vector.extract(one, [], [0])

    def signed_byte(self, block, start: int, inner: ir.Value) -> ir.Value:
        """The int8 at GGUF byte `start` + `inner` (an index) of `block`, as f32."""
        value = memref.load(self.flat, [arith.addi(self.offset(block, start), inner)])
        return arith.sitofp(self.k.f32, value)

    # -- vector arithmetic --------------------------------------------------

    def v(self, kind, n: int = 16) -> ir.VectorType:
        return ir.VectorType.get([n], kind)

    def splat(self, kind, value: int, n: int = 16) -> ir.Value:
        vtype = self.v(kind, n)
        return arith.constant(vtype, ir.DenseElementsAttr.get_splat(
            vtype, ir.IntegerAttr.get(kind, value)))

    def lanes_of(self, kind, values) -> ir.Value:
        vtype = self.v(kind, len(values))
        return arith.constant(vtype, ir.DenseElementsAttr.get(
            np.asarray(values, {8: np.int8, 16: np.int16, 32: np.int32}[kind.width]),
            type=vtype))

    def spread(self, scalar: ir.Value) -> ir.Value:
        """An f32 (or i8) scalar in all 16 lanes."""
        return vector.broadcast(self.v(scalar.type), scalar)

    def signed(self, q: ir.Value) -> ir.Value:
        return arith.sitofp(self.v(self.k.f32), q)

    def unsigned(self, q: ir.Value) -> ir.Value:
        return arith.uitofp(self.v(self.k.f32), q)

    def low(self, q):
        return arith.andi(q, self.splat(self.i8, 0x0F))

    def high(self, q):
        return arith.shrui(q, self.splat(self.i8, 4))

    def shifted(self, q, amount: ir.Value, mask: int) -> ir.Value:
        """(q >> amount) & mask lane by lane (`amount` an index)."""
        by = vector.broadcast(self.v(self.i8), arith.index_cast(self.i8, amount))
        return arith.andi(arith.shrui(q, by), self.splat(self.i8, mask))

    def scaled(self, values: ir.Value, d: ir.Value) -> ir.Value:
        """d * values (d an f32), as `etc.packed.dequantize` multiplies."""
        return arith.mulf(self.spread(d), values)

    # -- chunks -------------------------------------------------------------

    def chunk(self, row, c: ir.Value, width: int) -> list:
        """Chunk `c` (an index) of row `row` (an index, or a list: a stack's
        [expert, row]) of `width` values (see the module docstring):
        [(k, vector<16xf32>)]."""
        k = self.k
        name = self.dtype
        if width == 16:
            return [(arith.muli(c, k.cidx(16)), self.sixteen(row, c))]
        if self.fmt.block == 32:
            if width != 32:
                raise ValueError(f"{name}: chunks of 16 or 32 values, not {width}")
            block = global_block(k, self.t, row, c)
            first = arith.muli(c, k.cidx(32))
            values = self.block32(block)
            return [(first, values[0]), (arith.addi(first, k.cidx(16)), values[1])]
        if width != 32:
            raise ValueError(f"{name}: chunks of 16 or 32 values, not {width}")
        index = arith.divui(c, k.cidx(8))
        block = global_block(k, self.t, row, index)
        part = arith.remui(c, k.cidx(8))
        base = arith.muli(index, k.cidx(256))
        if name == "q6_k":
            return self.q6_k(block, base, part)
        return self.k_quant(block, base, part)

    def block32(self, block) -> list:
        """A block of 32 values as two vector<16xf32> (values 0-15, 16-31)."""
        name = self.dtype
        if name == "q8_0":
            d = self.half(block, 0)
            return [self.scaled(self.signed(self.raw(block, 2, 16, inner)), d)
                    for inner in (0, 16)]
        if name == "fp8_e4m3":
            scale = vector.bitcast(ir.VectorType.get([1], self.k.f32), self.raw(block, 0, 4))
            scale = vector.extract(scale, [], [0])
            return [arith.mulf(self.e4m3(self.raw(block, 4, 16, inner)), self.spread(scale))
                    for inner in (0, 16)]
        at = {"q4_0": 2, "iq4_nl": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[name]
        qs = self.raw(block, at, 16)
        nibbles = [self.low(qs), self.high(qs)]
        d = self.half(block, 0)
        if name == "q4_0":
            return [self.scaled(self.signed(arith.subi(q, self.splat(self.i8, 8))), d)
                    for q in nibbles]
        if name == "iq4_nl":
            return [self.scaled(self.iq4_nl(q), d) for q in nibbles]
        if name in ("q5_0", "q5_1"):
            bits = self.word(block, at - 4)
            nibbles = [arith.ori(q, self.fifth_bits(bits, 16 * h)) for h, q in enumerate(nibbles)]
        if name == "q5_0":
            return [self.scaled(self.signed(arith.subi(q, self.splat(self.i8, 16))), d)
                    for q in nibbles]
        # q4_1, q5_1: d q + m
        m = self.spread(self.half(block, 2))
        return [arith.addf(self.scaled(self.unsigned(q), d), m) for q in nibbles]

    def sixteen(self, row, c: ir.Value) -> ir.Value:
        """Values 16 c .. 16 c + 15 of row `row` (a chunk of width 16: half a
        32-value block or K-quant sub-block): one
        16-byte load of quants (q6_k two, q4_k / q5_k the block's first
        16 bytes too, q5_k its fifth bits), as vector<16xf32>."""
        k = self.k
        c16 = k.cidx
        name = self.dtype
        if self.fmt.block == 32:
            block = global_block(k, self.t, row, arith.divui(c, c16(2)))
            half = arith.remui(c, c16(2))
            if name in ("q8_0", "fp8_e4m3"):
                q = self.raw(block, 2 if name == "q8_0" else 4, 16, arith.muli(half, c16(16)))
                if name == "q8_0":
                    return self.scaled(self.signed(q), self.half(block, 0))
                scale = vector.bitcast(ir.VectorType.get([1], k.f32), self.raw(block, 0, 4))
                return arith.mulf(self.e4m3(q), self.spread(vector.extract(scale, [], [0])))
            at = {"q4_0": 2, "iq4_nl": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[name]
            q = self.shifted(self.raw(block, at, 16), arith.muli(half, c16(4)), 0x0F)
            d = self.half(block, 0)
            if name == "q4_0":
                return self.scaled(self.signed(arith.subi(q, self.splat(self.i8, 8))), d)
            if name == "iq4_nl":
                return self.scaled(self.iq4_nl(q), d)
            if name in ("q5_0", "q5_1"):
                q = arith.ori(q, self.fifth_bits(self.word(block, at - 4), 0,
                                                 arith.muli(half, c16(16))))
            if name == "q5_0":
                return self.scaled(self.signed(arith.subi(q, self.splat(self.i8, 16))), d)
            return arith.addf(self.scaled(self.unsigned(q), d), self.spread(self.half(block, 2)))
        index = arith.divui(c, c16(16))
        block = global_block(k, self.t, row, index)
        part = arith.remui(c, c16(16))
        sub, u = arith.divui(part, c16(2)), arith.remui(part, c16(2))
        inner = arith.muli(u, c16(16))
        if name == "q6_k":
            h, run = arith.divui(sub, c16(4)), arith.remui(sub, c16(4))
            ql = self.raw(block, 0, 16, arith.addi(arith.addi(
                arith.muli(h, c16(64)), arith.muli(arith.remui(run, c16(2)), c16(32))), inner))
            qh = self.raw(block, 128, 16, arith.addi(arith.muli(h, c16(32)), inner))
            low = self.shifted(ql, arith.muli(arith.divui(run, c16(2)), c16(4)), 0x0F)
            top = self.shifted(qh, arith.muli(run, c16(2)), 0x03)
            q = self.signed(arith.subi(arith.ori(low, arith.shli(top, self.splat(self.i8, 4))),
                                       self.splat(self.i8, 32)))
            scale = self.signed_byte(block, 192, arith.addi(arith.muli(sub, c16(2)), u))
            return arith.mulf(self.spread(arith.mulf(self.half(block, 208), scale)), q)
        header = self.raw(block, 0, 16)
        halves = vector.bitcast(self.v(ir.F16Type.get(), 8), header)
        d, dmin = (arith.extf(k.f32, vector.extract(halves, [], [i])) for i in (0, 1))
        qs_at = 16 if name == "q4_k" else 48
        quants = self.raw(block, qs_at, 16,
                          arith.addi(arith.muli(arith.divui(sub, c16(2)), c16(32)), inner))
        q = self.shifted(quants, arith.muli(arith.remui(sub, c16(2)), c16(4)), 0x0F)
        if name == "q5_k":
            bits = self.shifted(self.raw(block, 16, 16, inner), sub, 1)
            q = arith.ori(q, arith.shli(bits, self.splat(self.i8, 4)))
        scale, minimum = self.k_scale_min(header, sub)
        return arith.subf(self.scaled(self.unsigned(q), arith.mulf(d, scale)),
                          self.spread(arith.mulf(dmin, minimum)))

    def fifth_bits(self, bits: ir.Value, first: int, plus=None) -> ir.Value:
        """Bits first .. first + 15 (+ `plus`, an index, when given) of the
        i32 `bits`, each times 16, as vector<16xi8>."""
        spread = vector.broadcast(self.v(self.i32), bits)
        shifts = self.lanes_of(self.i32, range(first, first + 16))
        if plus is not None:
            shifts = arith.addi(shifts, vector.broadcast(self.v(self.i32),
                                                         arith.index_cast(self.i32, plus)))
        one = arith.andi(arith.shrui(spread, shifts), self.splat(self.i32, 1))
        return arith.trunci(self.v(self.i8), arith.shli(one, self.splat(self.i32, 4)))

    def iq4_nl(self, q: ir.Value) -> ir.Value:
        """IQ4_NL_VALUES[q] lane by lane as f32: the table's 16 bytes in four
        i32 words, the word chosen by q >> 2, the byte by q & 3."""
        table = packed.IQ4_NL_VALUES.astype(np.int8).view(np.uint8).astype(np.uint32)
        words = [int(table[4 * w] | table[4 * w + 1] << 8 | table[4 * w + 2] << 16 |
                     table[4 * w + 3] << 24) for w in range(4)]
        wide = arith.extui(self.v(self.i32), q)
        which = arith.shrui(wide, self.splat(self.i32, 2))
        word = self.splat(self.i32, words[0] - (1 << 32 if words[0] >= 1 << 31 else 0))
        for w in range(1, 4):
            value = words[w] - (1 << 32 if words[w] >= 1 << 31 else 0)
            hit = arith.cmpi(arith.CmpIPredicate.eq, which, self.splat(self.i32, w))
            word = arith.select(hit, self.splat(self.i32, value), word)
        shift = arith.shli(arith.andi(wide, self.splat(self.i32, 3)), self.splat(self.i32, 3))
        byte = arith.trunci(self.v(self.i8), arith.shrui(word, shift))
        return self.signed(byte)

    def e4m3(self, q: ir.Value) -> ir.Value:
        """float8_e4m3fn bytes as f32 (`packed_loads.e4m3_to_f32` lane by
        lane)."""
        bits = arith.andi(arith.shli(arith.extsi(self.v(self.i16), q),
                                     self.splat(self.i16, 7)),
                          self.splat(self.i16, 0xBF80 - 0x10000))
        half = arith.extf(self.v(self.k.f32), vector.bitcast(self.v(ir.F16Type.get()), bits))
        return arith.mulf(half, self.spread(self.k.cf32(256.0)))

    def k_scale_min(self, header: ir.Value, sub: ir.Value) -> tuple:
        """Sub-block `sub`'s (an index, 0 .. 7) 6-bit scale and minimum of a
        Q4_K / Q5_K block from its first 16 bytes (`header`), as f32: ggml's
        `get_scale_min_k4` on the 32-bit words of bytes 4 .. 15."""
        k = self.k
        words = vector.bitcast(self.v(self.i32, 4), header)
        w1, w2, w3 = (vector.extract(words, [], [i]) for i in (1, 2, 3))
        shift = arith.index_cast(self.i32, arith.muli(arith.remui(sub, k.cidx(4)), k.cidx(8)))
        b1, b2, b3 = (arith.shrui(w, shift) for w in (w1, w2, w3))
        c = lambda value: arith.constant(self.i32, ir.IntegerAttr.get(self.i32, value))  # noqa
        top = lambda v: arith.shli(arith.andi(arith.shrui(v, c(6)), c(3)), c(4))  # noqa: E731
        low = arith.cmpi(arith.CmpIPredicate.ult, sub, k.cidx(4))
        scale = arith.select(low, arith.andi(b1, c(63)), arith.ori(arith.andi(b3, c(15)), top(b1)))
        minimum = arith.select(low, arith.andi(b2, c(63)),
                               arith.ori(arith.andi(arith.shrui(b3, c(4)), c(15)), top(b2)))
        return arith.uitofp(k.f32, scale), arith.uitofp(k.f32, minimum)

    def k_quant(self, block, base, sub) -> list:
        """A Q4_K / Q5_K chunk of 32 values: sub-block `sub` (an index)."""
        k = self.k
        header = self.raw(block, 0, 16)
        halves = vector.bitcast(self.v(ir.F16Type.get(), 8), header)
        d, dmin = (arith.extf(k.f32, vector.extract(halves, [], [i])) for i in (0, 1))
        g = arith.divui(sub, k.cidx(2))
        qs_at = 16 if self.dtype == "q4_k" else 48
        qs_block = arith.muli(g, k.cidx(32))
        out = []
        # Both 16-byte halves of the 32 bytes of qs (values l < 16, l >= 16).
        quants = [vector.load(self.v(self.i8), self.flat,
                              [arith.addi(self.offset(block, qs_at, 16 * u), qs_block)],
                              alignment=None if self.simulate else
                              ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 16))
                  for u in range(2)]
        high = [self.raw(block, 16, 16, 16 * u) for u in range(2)] \
            if self.dtype == "q5_k" else None
        scale, minimum = self.k_scale_min(header, sub)
        step = arith.mulf(d, scale)
        offset = arith.mulf(dmin, minimum)
        nibble = arith.muli(arith.remui(sub, k.cidx(2)), k.cidx(4))
        first = arith.addi(base, arith.muli(sub, k.cidx(32)))
        for u in range(2):
            q = self.shifted(quants[u], nibble, 0x0F)
            if high is not None:
                q = arith.ori(q, arith.shli(self.shifted(high[u], sub, 1),
                                            self.splat(self.i8, 4)))
            values = arith.subf(self.scaled(self.unsigned(q), step), self.spread(offset))
            out.append((arith.addi(first, k.cidx(16 * u)), values))
        return out

    def q6_k(self, block, base, part) -> list:
        """A Q6_K chunk of 32 values: run r of half h (part = 4 h + r; see
        the module docstring)."""
        k = self.k
        d = self.half(block, 208)
        c = k.cidx
        aligned = None if self.simulate else \
            ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 16)

        def load(start, inner):
            return vector.load(self.v(self.i8), self.flat,
                               [arith.addi(self.offset(block, start), inner)], alignment=aligned)

        def value(ql, qh, shift_low, run_shift):
            low = self.shifted(ql, shift_low, 0x0F)
            top = self.shifted(qh, run_shift, 0x03)
            q = arith.ori(low, arith.shli(top, self.splat(self.i8, 4)))
            return self.signed(arith.subi(q, self.splat(self.i8, 32)))

        out = []
        h, run = arith.divui(part, c(4)), arith.remui(part, c(4))
        at = arith.addi(arith.muli(h, c(64)), arith.muli(arith.remui(run, c(2)), c(32)))
        shift_low = arith.muli(arith.divui(run, c(2)), c(4))
        shift_high = arith.muli(run, c(2))
        for u in range(2):
            ql = load(0, arith.addi(at, c(16 * u)))
            qh = load(128, arith.addi(arith.muli(h, c(32)), c(16 * u)))
            q = value(ql, qh, shift_low, shift_high)
            at_scale = arith.addi(arith.muli(h, c(8)), arith.addi(arith.muli(run, c(2)), c(u)))
            scale = self.signed_byte(block, 192, at_scale)
            first = arith.addi(base, arith.addi(arith.muli(part, c(32)), c(16 * u)))
            out.append((first, arith.mulf(self.spread(arith.mulf(d, scale)), q)))
        return out
