"""KV-cache append: the new K (or V) rows of a step, written in place into
a preallocated cache at each token's request slot and position.

    cache[request_slot[token_request[t]], positions[t], :] = values[t, :]

`cache` is a state buffer (slots, length, width) that persists across runs;
the operator's result is the cache itself, so that later reads (attention)
are ordered after the write by dependency inference. Tokens whose slot or
position lies outside the cache write nothing (the models reject such
batches before a run).

Tasks: one tile task per block of tokens; each reads its rows of `values`,
its positions and requests, all of `request_slot`, and writes the cache,
declared whole: which rows is runtime data.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("kv_append",)


class KVAppend(TileKernel):
    """One element of the new rows per lane iteration."""

    grid_rank = 1

    @classmethod
    def tensors(cls, op) -> list:
        # The result is the cache, already the first operand.
        return list(op.operands)

    def emit(self) -> None:
        op = self.op
        cache, values, positions, token_request, request_slot = op.operands
        (tm,) = op.tile
        row0, rows = self.row_block(values, tm)
        width = self.dim(values, 1)
        slots, length = self.dim(cache, 0), self.dim(cache, 1)
        loop = self.lane_loop(arith.muli(rows, width))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, width))
            col = arith.remui(e, width)
            slot = self.load_index(request_slot, [self.load_index(token_request, [row])])
            position = self.load_index(positions, [row])
            zero = self.cidx(0)
            inside = arith.andi(
                arith.andi(arith.cmpi(arith.CmpIPredicate.sge, slot, zero),
                           arith.cmpi(arith.CmpIPredicate.slt, slot, slots)),
                arith.andi(arith.cmpi(arith.CmpIPredicate.sge, position, zero),
                           arith.cmpi(arith.CmpIPredicate.slt, position, length)))
            guard = scf.IfOp(inside)
            with ir.InsertionPoint(guard.then_block):
                self.store(self.load(values, [row, col]), cache, [slot, position, col])
                scf.yield_([])
            scf.yield_([])


class KVAppendVector(KVAppend):
    """GPU: 16 bytes of the cache (VEC values) per lane iteration,
    consecutive lanes along a row, so a warp writes 512 contiguous bytes."""

    @classmethod
    def name(cls, op) -> str:
        return "kv_append_vector"

    @staticmethod
    def vec(op) -> int:
        """Cache values in 16 bytes."""
        return 16 // (4 if op.operands[0].dtype == "f32" else 2)

    @classmethod
    def applies(cls, op, target) -> bool:
        width = op.operands[0].shape[2]
        return target.gpu_kernels and isinstance(width, int) and width % cls.vec(op) == 0

    def emit(self) -> None:
        op = self.op
        cache, values, positions, token_request, request_slot = op.operands
        vec = self.vec(op)
        (tm,) = op.tile
        row0, rows = self.row_block(values, tm)
        pieces = self.cidx(cache.shape[2] // vec)
        slots, length = self.dim(cache, 0), self.dim(cache, 1)
        loop = self.lane_loop(arith.muli(rows, pieces))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, pieces))
            col = arith.muli(arith.remui(e, pieces), self.cidx(vec))
            slot = self.load_index(request_slot, [self.load_index(token_request, [row])])
            position = self.load_index(positions, [row])
            zero = self.cidx(0)
            inside = arith.andi(
                arith.andi(arith.cmpi(arith.CmpIPredicate.sge, slot, zero),
                           arith.cmpi(arith.CmpIPredicate.slt, slot, slots)),
                arith.andi(arith.cmpi(arith.CmpIPredicate.sge, position, zero),
                           arith.cmpi(arith.CmpIPredicate.slt, position, length)))
            guard = scf.IfOp(inside)
            with ir.InsertionPoint(guard.then_block):
                self.vstore(self.vload(values, [row, col], vec, aligned=True), cache,
                            [slot, position, col], aligned=True)
                scf.yield_([])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    cache, values, positions, token_request, request_slot = op.operands
    (tm,) = op.tile
    block = box(1, [tile_offset(0, tm)], [tm])
    b.emit_task(op, op.name, [b.grid_extent(values.shape[0], tm)],
                [(values, box(1, [tile_offset(0, tm), "0"], [tm, None])), (positions, block),
                 (token_request, block), (request_slot, whole(1, request_slot))],
                [(cache, whole(1, cache))],
                KVAppendVector if KVAppendVector.applies(op, b.target) else KVAppend)
