"""16-byte reads of packed weights on the GPU: a chunk of a row's values
(16) read as whole 16-byte vectors of quants
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

Chunks: chunk c of a row is its values 16 c .. 16 c + 15, one 16-byte
load of quants and the block's scales:

* q8_0 and fp8_e4m3: half a block's quants (16 of its 32 bytes);
* q4_0, q4_1, iq4_nl, mxfp4, q5_0, q5_1: the block's 16 bytes of
  nibbles, the low ones (values 0-15) or the high ones (16-31) chosen by
  a shift (the block's two chunks load the same 16 bytes); q5_0 / q5_1 a
  4-byte load of the fifth bits; mxfp4's scale a byte load (its e8m0
  decoded with integer operations, `packed_loads.e8m0_half`);
* q4_k / q5_k: half of sub-block s, 16 of the 32 bytes of qs at
  32 (s / 2), their low (s even) or high nibbles; the block's first 16
  bytes (d, dmin and the 12 bytes of 6-bit scales and minimums) are one
  more 16-byte load, unpacked with shifts of its 32-bit words (no dynamic
  indexing of registers, which would put them in local memory); q5_k's
  fifth bits one more (16 of its 32 bytes);
* q6_k: half of run r of half h (values 128 h + 32 r + 16 u + i): one
  16-byte load of ql (its low or high nibbles) and one of qh (2 bits at
  2 r); the int8 scale a byte load.

Register pressure chose 16: chunks of 64 values for the K-quants (two
sub-blocks, every loaded byte used) spilled the q5_k and q6_k GEMVs at
Llama-3.2-1B's widths on sm_80, and chunks of 32 made real-width step
workers spill (`gemv_width`). Loads are 16 bytes still; what 16 values
leave unused of them (the other nibbles, qh's other bits) is read again
from L1 by the lane taking the neighbouring chunk.

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
from .packed_loads import block_count, e8m0_half, field_at, flat_bytes, global_block, gpu_layout

if TYPE_CHECKING:
    from ..graph_values import Tensor
    from .base import TileKernel

__all__ = ["PackedVectors", "CHUNK_FORMATS", "gemv_width"]

#: The formats `PackedVectors` reads.
CHUNK_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "fp8_e4m3",
                 "q4_k", "q5_k", "q6_k")


def gemv_width(dtype: str) -> int:
    """Values per chunk the GEMV takes: 16 for every format (one 16-byte
    load of quants per column and chunk). Chunks of 64 for the K-quants
    (every loaded byte used; removed) spilled the q5_k and q6_k GEMVs at
    Llama-3.2-1B's widths on sm_80 (40 to 196 bytes); chunks of 32 made
    the step worker that calls the GEMVs spill 8-60 bytes on sm_80 (Gemma
    3 1B, Phi-3-mini, Qwen2.5-0.5B mixed packed steps) and sm_90a
    (Qwen2.5-0.5B): 4 columns x 32 values and 4 rows of A x 32 stayed live."""
    return 16


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

    def chunk(self, row, c: ir.Value, width: int = 16) -> list:
        """Chunk `c` (an index) of row `row` (an index, or a list: a stack's
        [expert, row]) of `width` values (16; see the module docstring):
        [(k of its first value, vector<16xf32>)]."""
        if width != 16:
            raise ValueError(f"{self.dtype}: chunks of 16 values, not {width}")
        return [(arith.muli(c, self.k.cidx(16)), self.sixteen(row, c))]

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
            at = {"q4_0": 2, "iq4_nl": 2, "mxfp4": 1, "q4_1": 4, "q5_0": 6, "q5_1": 8}[name]
            q = self.shifted(self.raw(block, at, 16), arith.muli(half, c16(4)), 0x0F)
            if name == "mxfp4":
                e = memref.load(self.flat, [self.offset(block, 0)])
                return self.scaled(self.table(packed.MXFP4_VALUES, q), e8m0_half(k, e))
            d = self.half(block, 0)
            if name == "q4_0":
                return self.scaled(self.signed(arith.subi(q, self.splat(self.i8, 8))), d)
            if name == "iq4_nl":
                return self.scaled(self.table(packed.IQ4_NL_VALUES, q), d)
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

    def table(self, values, q: ir.Value) -> ir.Value:
        """values[q] lane by lane as f32 for a 16-entry int8 table (IQ4_NL's,
        MXFP4's): the table's 16 bytes as two i64 halves (entries 0-7 and
        8-15), the half chosen by q >= 8, the byte by a shift of 8 (q & 7)
        bits: one compare and one select a value. Four i32 words chosen by
        q >> 2 took three of each, and their predicates held registers: the
        packed GEMV at Qwen2.5-0.5B's MLP widths (symbolic rows, sm_90a)
        took 241 (IQ4_NL) and 244 (MXFP4) registers that way, 213 and 198
        this way, and Qwen2.5-0.5B's mixed step worker spilled 8 bytes."""
        raw = np.asarray(values, np.int8).view(np.uint8).astype(np.uint64)
        i64 = ir.IntegerType.get_signless(64)
        halves = []
        for h in range(2):
            bits = sum(int(raw[8 * h + i]) << (8 * i) for i in range(8))
            halves.append(self.splat(i64, bits - (1 << 64) if bits >= 1 << 63 else bits))
        upper = arith.cmpi(arith.CmpIPredicate.uge, q, self.splat(self.i8, 8))
        half = arith.select(upper, halves[1], halves[0])
        shift = arith.shli(arith.andi(arith.extui(self.v(i64), q), self.splat(i64, 7)),
                           self.splat(i64, 3))
        return self.signed(arith.trunci(self.v(self.i8), arith.shrui(half, shift)))

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
