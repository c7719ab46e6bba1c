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
"""

from __future__ import annotations

import math as _pymath

from mlir import ir
from mlir.dialects import arith, math, scf

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("rope",)


class Rope(TileKernel):
    """One (token, i) of the rotation per lane iteration: its angle's cos
    and sin, computed once, rotate pair i of every head of the token (each
    output stored by the lane that computes it)."""

    grid_rank = 1

    def reduce_angle(self, angle: ir.Value) -> ir.Value:
        """The f32 `angle` minus the nearest multiple of 2 pi, computed in
        f64 (exact enough for any angle a position can make), so that cos
        and sin see an argument in [-pi, pi]: the polynomial expansions of
        the CPU lowering (and fast GPU paths) lose accuracy far from 0,
        while Hugging Face takes cos and sin of the f32 angle exactly."""
        f64 = ir.F64Type.get()
        wide = arith.extf(f64, angle)
        two_pi = 2.0 * _pymath.pi
        turns = math.floor(arith.addf(
            arith.mulf(wide, arith.constant(f64, ir.FloatAttr.get(f64, 1.0 / two_pi))),
            arith.constant(f64, ir.FloatAttr.get(f64, 0.5))))
        reduced = arith.subf(wide, arith.mulf(turns, arith.constant(
            f64, ir.FloatAttr.get(f64, two_pi))))
        return arith.truncf(self.f32, reduced)

    def emit(self) -> None:
        op = self.op
        x, positions = op.operands[:2]
        inv_freq = op.operands[2] if len(op.operands) > 2 else None
        out = op.result
        head_dim = op.params["head_dim"]
        half = head_dim // 2
        (tm,) = op.tile
        row0, rows = self.row_block(x, tm)
        loop = self.lane_loop(arith.muli(rows, self.cidx(half)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, self.cidx(half)))
            i = arith.remui(e, self.cidx(half))
            i64 = ir.IntegerType.get_signless(64)
            if inv_freq is not None:
                freq = self.load(inv_freq, [i])
            else:
                # 1 / theta^(2i / D) in float32, as Hugging Face computes it.
                exponent = arith.divf(
                    arith.sitofp(self.f32, arith.index_cast(i64, arith.muli(i, self.cidx(2)))),
                    self.cf32(float(head_dim)))
                freq = arith.divf(self.cf32(1.0),
                                  math.powf(self.cf32(op.params["theta"]), exponent))
            position = arith.sitofp(self.f32, self.load(positions, [row]))
            angle = self.reduce_angle(arith.mulf(position, freq))
            cos, sin = math.cos(angle), math.sin(angle)
            heads = scf.ForOp(self.cidx(0), self.cidx(x.shape[1] // head_dim), self.cidx(1))
            with ir.InsertionPoint(heads.body):
                first = arith.addi(arith.muli(heads.induction_variable, self.cidx(head_dim)), i)
                second = arith.addi(first, self.cidx(half))
                x0 = self.load(x, [row, first])
                x1 = self.load(x, [row, second])
                self.store(arith.subf(arith.mulf(x0, cos), arith.mulf(x1, sin)), out,
                           [row, first])
                self.store(arith.addf(arith.mulf(x1, cos), arith.mulf(x0, sin)), out,
                           [row, second])
                scf.yield_([])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    x, positions = op.operands[:2]
    (tm,) = op.tile
    rows = box(1, [tile_offset(0, tm), "0"], [tm, None])
    reads = [(x, rows), (positions, box(1, [tile_offset(0, tm)], [tm]))]
    if len(op.operands) > 2:
        reads.append((op.operands[2], whole(1, op.operands[2])))
    b.emit_task(op, op.name, [b.grid_extent(x.shape[0], tm)], reads, [(op.result, rows)], Rope)
