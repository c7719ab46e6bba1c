"""Kernel bases that several operator families share.

* `PartKernel`: an operator that runs as several tasks, each with a kernel
  of its own (attention's chunk and combine tiles, MoE's router, route,
  up, down and combine): a kernel's functions are named
  `<kind>_<part>`.
* `RowKernel`: the portable kernels of the operators that scan whole rows
  (top-k, argmax, sampling): one row of the operand per lane iteration.
* `RowSelectGPU`: the GPU kernel of an operator that picks columns of each
  row (top-k, sampling): its lanes spread over the row and agree on a
  column through reductions of f32 values, so it applies to rows of a
  known width below 2**24, where every column is exact as an f32; its
  functions are named `<kind>_gpu`.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TileKernel


class PartKernel(TileKernel):
    """A kernel of one of an operator's tasks; `part` names it."""

    part = ""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_{cls.part}"


class RowKernel(TileKernel):
    """The tile's rows of the first operand x, one per lane iteration:
    `emit_row(x, row, n)` emits the work of row `row` (of `n` columns)."""

    grid_rank = 1

    def emit_row(self, x, row: ir.Value, n: ir.Value) -> None:
        raise NotImplementedError

    def emit(self) -> None:
        x = self.op.operands[0]
        (tm,) = self.op.tile
        row0, rows = self.row_block(x, tm)
        n = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            self.emit_row(x, arith.addi(row0, loop.induction_variable), n)
            scf.yield_([])


class RowSelectGPU(TileKernel):
    """The GPU variant of a kernel that picks columns of each row, with
    columns as f32 in its lanes' reductions."""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_gpu"

    @classmethod
    def applies(cls, op, target) -> bool:
        n = op.operands[0].shape[1]
        return target.gpu_kernels and isinstance(n, int) and n < (1 << 24)
