"""Rotary position embedding (RoPE), Hugging Face's `rotate_half` convention.

For each token t at position p = positions[t], each head of `head_dim` = D
columns, and i < D / 2, with the frequency f_i = inv_freq[i] (by default
1 / theta^(2 i / D)) and the angle a = p * f_i (float32, as Hugging Face
computes it):

    out[h D + i]         = x[h D + i] cos a - x[h D + i + D/2] sin a
    out[h D + i + D/2]   = x[h D + i + D/2] cos a + x[h D + i] sin a

that is `x * cos + rotate_half(x) * sin` with `rotate_half(x) = cat(-x2, x1)`.
An `inv_freq` operand (D / 2 float32 values) replaces the theta formula, for
the scaled variants (Llama 3's `rope_scaling`), which the host computes.

Tasks: one tile task per block of tokens; each reads its rows of x and its
positions (and all of inv_freq) and writes its rows.

Kernels: portable (`Rope`), a (token, pair) per lane iteration; cpu
(`RopeCPU`), a token at a time with the pairs in vectors, the same bits.
"""

from __future__ import annotations

import math as _pymath

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("rope",)


class Rope(TileKernel):
    """One (token, i) of the rotation per lane iteration: its angle's cos
    and sin, computed once, rotate pair i of every head of the token (each
    output stored by the lane that computes it)."""

    grid_rank = 1

    def reduce_angle(self, angle: ir.Value) -> ir.Value:
        """The f32 `angle` (a scalar or a vector) minus the nearest multiple
        of 2 pi, computed in f64 (exact enough for any angle a position can
        make), so that cos and sin see an argument in [-pi, pi]: the
        polynomial expansions of the CPU lowering (and fast GPU paths) lose
        accuracy far from 0, while Hugging Face takes cos and sin of the f32
        angle exactly. Lane by lane, a vector gives the bits of the scalar."""
        f64 = ir.F64Type.get()
        wide_type, narrow_type = f64, self.f32
        if isinstance(angle.type, ir.VectorType):
            shape = ir.VectorType(angle.type).shape
            wide_type, narrow_type = ir.VectorType.get(shape, f64), angle.type

        def constant(value: float) -> ir.Value:
            attr = ir.FloatAttr.get(f64, value)
            if wide_type == f64:
                return arith.constant(f64, attr)
            return arith.constant(wide_type, ir.DenseElementsAttr.get_splat(wide_type, attr))

        wide = arith.extf(wide_type, angle)
        two_pi = 2.0 * _pymath.pi
        turns = math.floor(arith.addf(arith.mulf(wide, constant(1.0 / two_pi)), constant(0.5)))
        reduced = arith.subf(wide, arith.mulf(turns, constant(two_pi)))
        return arith.truncf(narrow_type, reduced)

    def frequency(self, inv_freq, i: ir.Value) -> ir.Value:
        """f_i as an f32: inv_freq[i], or 1 / theta^(2i / D) in float32, as
        Hugging Face computes it."""
        if inv_freq is not None:
            return self.load(inv_freq, [i])
        i64 = ir.IntegerType.get_signless(64)
        exponent = arith.divf(
            arith.sitofp(self.f32, arith.index_cast(i64, arith.muli(i, self.cidx(2)))),
            self.cf32(float(self.op.params["head_dim"])))
        return arith.divf(self.cf32(1.0), math.powf(self.cf32(self.op.params["theta"]), exponent))

    @staticmethod
    def rotate(x0: ir.Value, x1: ir.Value, cos: ir.Value, sin: ir.Value) -> tuple:
        """The rotated pair (x0 cos - x1 sin, x1 cos + x0 sin), scalars or
        vectors alike."""
        return (arith.subf(arith.mulf(x0, cos), arith.mulf(x1, sin)),
                arith.addf(arith.mulf(x1, cos), arith.mulf(x0, sin)))

    def rotate_pair(self, row: ir.Value, i: ir.Value, freq: ir.Value) -> None:
        """Pair i of every head of row `row`, one element at a time."""
        op = self.op
        x, positions = op.operands[:2]
        head_dim = op.params["head_dim"]
        position = arith.sitofp(self.f32, self.load(positions, [row]))
        angle = self.reduce_angle(arith.mulf(position, freq))
        cos, sin = math.cos(angle), math.sin(angle)
        heads = scf.ForOp(self.cidx(0), self.cidx(x.shape[1] // head_dim), self.cidx(1))
        with ir.InsertionPoint(heads.body):
            first = arith.addi(arith.muli(heads.induction_variable, self.cidx(head_dim)), i)
            second = arith.addi(first, self.cidx(head_dim // 2))
            out0, out1 = self.rotate(self.load(x, [row, first]), self.load(x, [row, second]),
                                     cos, sin)
            self.store(out0, op.result, [row, first])
            self.store(out1, op.result, [row, second])
            scf.yield_([])

    def emit(self) -> None:
        op = self.op
        x = op.operands[0]
        inv_freq = op.operands[2] if len(op.operands) > 2 else None
        half = op.params["head_dim"] // 2
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        loop = self.lane_loop(arith.muli(rows, self.cidx(half)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            i = arith.remui(e, self.cidx(half))
            self.rotate_pair(arith.addi(row0, arith.divui(e, self.cidx(half))), i,
                             self.frequency(inv_freq, i))
            scf.yield_([])


class RopeCPU(Rope):
    """CPU: a row (token) at a time, i in vectors of WIDTH f32 lanes. The
    tile's frequencies are computed once (not per row and i); per row the
    position is loaded once, the cos and sin of each vector of angles are
    computed once (the same polynomials and range reduction as the scalar
    kernel's, lane by lane: the same bits), and every head's halves are
    contiguous vector loads and stores. Pairs past the last whole vector
    (D / 2 not a multiple of WIDTH) take the scalar kernel's path."""

    WIDTH = 16

    @classmethod
    def name(cls, op) -> str:
        return "rope_cpu"

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu"

    def emit(self) -> None:
        op = self.op
        x, positions = op.operands[:2]
        inv_freq = op.operands[2] if len(op.operands) > 2 else None
        head_dim = op.params["head_dim"]
        half = head_dim // 2
        whole_vectors = half // self.WIDTH
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        # The frequencies, once per tile (powf is a libm call per value).
        if inv_freq is None:
            freqs = self.entry_alloca(ir.MemRefType.get([half], self.f32))
            for_freqs = scf.ForOp(self.cidx(0), self.cidx(half), self.cidx(1))
            with ir.InsertionPoint(for_freqs.body):
                i = for_freqs.induction_variable
                memref.store(self.frequency(None, i), freqs, [i])
                scf.yield_([])

            def freq_vector(col: int) -> ir.Value:
                return vector.load(self.vtype(self.WIDTH), freqs, [self.cidx(col)])

            def freq_scalar(i: ir.Value) -> ir.Value:
                return memref.load(freqs, [i])
        else:
            def freq_vector(col: int) -> ir.Value:
                return self.vload(inv_freq, [self.cidx(col)], self.WIDTH)

            def freq_scalar(i: ir.Value) -> ir.Value:
                return self.frequency(inv_freq, i)

        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            position = self.vsplat(arith.sitofp(self.f32, self.load(positions, [row])),
                                   self.WIDTH)
            angles = []
            for v in range(whole_vectors):
                angle = self.reduce_angle(arith.mulf(position, freq_vector(v * self.WIDTH)))
                angles.append((math.cos(angle), math.sin(angle)))
            if whole_vectors:
                heads = scf.ForOp(self.cidx(0), self.cidx(x.shape[1] // head_dim),
                                  self.cidx(1))
                with ir.InsertionPoint(heads.body):
                    start = arith.muli(heads.induction_variable, self.cidx(head_dim))
                    for v, (cos, sin) in enumerate(angles):
                        first = arith.addi(start, self.cidx(v * self.WIDTH))
                        second = arith.addi(first, self.cidx(half))
                        out0, out1 = self.rotate(self.vload(x, [row, first], self.WIDTH),
                                                 self.vload(x, [row, second], self.WIDTH),
                                                 cos, sin)
                        self.vstore(out0, op.result, [row, first])
                        self.vstore(out1, op.result, [row, second])
                    scf.yield_([])
            if half % self.WIDTH:
                tail = scf.ForOp(self.cidx(whole_vectors * self.WIDTH), self.cidx(half),
                                 self.cidx(1))
                with ir.InsertionPoint(tail.body):
                    i = tail.induction_variable
                    self.rotate_pair(row, i, freq_scalar(i))
                    scf.yield_([])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x, positions = op.operands[:2]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    reads = [(x, rows), (positions, box(1, [tile_offset(0, tm)], [tm]))]
    if len(op.operands) > 2:
        reads.append((op.operands[2], whole(1, op.operands[2])))
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, [(op.result, rows)],
                RopeCPU if RopeCPU.applies(op, b.target) else Rope)
