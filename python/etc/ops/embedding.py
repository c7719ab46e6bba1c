"""Embedding: a gather of table rows by integer ids.

    out[i, :] = table[ids[i], :]      (zeros where ids[i] is outside [0, V))

The same operator picks the embedding of each token (table = the embedding
matrix, ids = token ids) and the hidden state of the last token of each
request (table = the hidden states, ids = token indices).

Tasks: one tile task per block of ids; each reads its ids, all of the table
(which rows is runtime data) and writes its rows of the result.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from ..packed import is_packed
from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("embedding",)


class Embedding(TileKernel):
    """One element of the result per lane iteration, so that neighbouring
    lanes copy neighbouring columns of one row."""

    grid_rank = 1

    def in_table(self, token: ir.Value, vocab: ir.Value) -> ir.Value:
        """Whether id `token` is a row of the table: one outside [0, V)
        would read outside it, and yields a zero row instead (the models
        reject such ids before a run)."""
        return arith.andi(arith.cmpi(arith.CmpIPredicate.sge, token, self.cidx(0)),
                          arith.cmpi(arith.CmpIPredicate.slt, token, vocab))

    def emit(self) -> None:
        op = self.op
        table, ids = op.operands
        out = op.result
        (tm,) = op.tile
        row0, rows = self.row_block(out, tm)
        width = self.dim(table, 1)
        vocab = self.dim(table, 0)
        loop = self.lane_loop(arith.muli(rows, width))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, width))
            col = arith.remui(e, width)
            token = self.load_index(ids, [row])
            inside = self.in_table(token, vocab)
            safe = arith.select(inside, token, self.cidx(0))
            value = arith.select(inside, self.load(table, [safe, col]), self.cf32(0.0))
            self.store(value, out, [row, col])
            scf.yield_([])


class EmbeddingCPU(Embedding):
    """CPU: a row of the result at a time: its id loaded and checked once,
    then the table's row copied in vectors of 16 values (`copy_row`), or
    zeros stored, where the portable kernel did both per element. A packed
    table's rows are dequantized by the portable kernel."""

    @classmethod
    def name(cls, op) -> str:
        return "embedding_cpu"

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu" and not is_packed(op.operands[0].dtype)

    def emit(self) -> None:
        op = self.op
        table, ids = op.operands
        out = op.result
        (tm,) = op.tile
        row0, rows = self.row_block(out, tm)
        width = self.dim(table, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            token = self.load_index(ids, [row])
            inside = self.in_table(token, self.dim(table, 0))
            branch = scf.IfOp(inside, has_else=True)
            with ir.InsertionPoint(branch.then_block):
                self.copy_row(table, [token], out, [row], width)
                scf.yield_([])
            with ir.InsertionPoint(branch.else_block):
                self.copy_row(table, [token], out, [row], width, fill=0.0)
                scf.yield_([])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    table, ids = op.operands
    (tm,) = op.tile
    b.emit_task(op, op.name, [b.grid_extent(ids.shape[0], tm)],
                [(table, whole(1, table)), (ids, box(1, [tile_offset(0, tm)], [tm]))],
                [(op.result, box(1, [tile_offset(0, tm), "0"], [tm, None]))],
                EmbeddingCPU if EmbeddingCPU.applies(op, b.target) else Embedding)
