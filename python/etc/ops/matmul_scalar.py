"""The scalar matmul tile (`Matmul`): C = A @ B or A @ B^T, one output
element per lane iteration with a serial K loop.

It is the generic target's kernel, the CPU kernel's path for partial edge
tiles, and the base of every matmul kernel of the family (`matmul.py`):
they store C through its `store` and `vstore`, which add the residual
operand when there is one (`ResidualStores`), and the GEMV kernels take the
tile's rows in passes (`row_passes`).
"""

from __future__ import annotations

from contextlib import contextmanager

from mlir import ir
from mlir.dialects import arith, scf

from .base import ResidualStores


class Matmul(ResidualStores):
    """One output element per lane iteration, with a serial K loop.

    Every kernel stores C through `store` and `vstore`, which add the
    residual operand when there is one (`ResidualStores`)."""

    grid_rank = 2

    @contextmanager
    def row_passes(self, rb: int):
        """Emits a loop over the tile's rows, `rb` at a time, and yields,
        inside its body, the pass's first row, its count of real rows and
        the `rb` rows the pass computes: past the tile (or A) they repeat
        A's last row, so that loads stay in bounds; store only `in_pass`."""
        a = self.op.operands[0]
        r0, rows = self.row_block(self.op.result, self.op.tile[0])
        last_row = arith.subi(self.dim(a, 0), self.cidx(1))
        passes = arith.divui(arith.addi(rows, self.cidx(rb - 1)), self.cidx(rb))
        loop = scf.ForOp(self.cidx(0), passes, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            first = arith.addi(r0, arith.muli(loop.induction_variable, self.cidx(rb)))
            in_pass = arith.minsi(self.cidx(rb), arith.subi(arith.addi(r0, rows), first))
            yield first, in_pass, [arith.minsi(arith.addi(first, self.cidx(r)), last_row)
                                   for r in range(rb)]
            scf.yield_([])

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands[:2]
        transpose_b = op.params["transpose_b"]
        offsets, extents, count = self.tile_elements(out, op.tile)
        k_extent = self.dim(a, 1)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            row, col = self.element_coords(loop.induction_variable, offsets, extents)
            kloop = scf.ForOp(self.cidx(0), k_extent, self.cidx(1), [self.cf32(0.0)])
            with ir.InsertionPoint(kloop.body):
                k = kloop.induction_variable
                av = self.load(a, [row, k])
                bv = self.load(b, [col, k] if transpose_b else [k, col])
                acc = arith.addf(kloop.inner_iter_args[0], arith.mulf(av, bv))
                scf.yield_([acc])
            self.store(kloop.results[0], out, [row, col])
            scf.yield_([])
