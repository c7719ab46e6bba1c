"""KV-cache append: the new K (or V) rows of a step, written in place into
a preallocated cache at each token's request slot and position,

    cache[request_slot[token_request[t]], positions[t], :] = values[t, :]

or, for a paged cache (blocks, P, width) and a batch with block tables,
at the block that holds the position:

    r, p = token_request[t], positions[t]
    cache[block_table[r, p // P], p % P, :] = values[t, :]

`cache` is a state buffer (slots, length, width) that persists across runs;
the operator's result is the cache itself, so that later reads (attention)
are ordered after the write by dependency inference. Tokens whose slot,
block or position lies outside the cache write nothing (the models reject
such batches before a run).

Tasks: one tile task per block of tokens; each reads its rows of `values`,
its positions and requests, all of `request_slot` (or `block_table`), and
writes the cache, declared whole: which rows is runtime data. The block
table is read by the tile bodies (`CacheRows`), not by the task's maps:
the events that order the tiles are the same for every table.

Kernels: portable (`KVAppend`), an element per lane iteration; cpu
(`KVAppendCPU`), a row at a time in vectors; cuda (`KVAppendVector`), 16
bytes per lane iteration.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset, whole

KINDS = ("kv_append",)


class CacheRows:
    """Where request `request`'s positions live in a KV cache, for a tile
    kernel: [slot, position] of a contiguous cache (slots, length, W), the
    slot loaded once; [block_table[r, p // P], p % P] of a paged one
    (blocks, P, W), the table entry loaded per position. `block_size` is
    P, or None for a contiguous cache."""

    def __init__(self, kernel: TileKernel, cache, addressing, block_size, request: ir.Value):
        self.kernel, self.cache, self.addressing = kernel, cache, addressing
        self.block_size, self.request = block_size, request
        if block_size is None:
            self.slot = kernel.load_index(addressing, [request])
        else:
            # Table entries past the row's end are never read: positions are
            # clamped into it, and `inside` rejects the positions beyond.
            self.width = kernel.dim(addressing, 1)
            self.last_entry = arith.subi(self.width, kernel.cidx(1))

    def at(self, position: ir.Value) -> list:
        """The cache's first two indices of `position`."""
        if self.block_size is None:
            return [self.slot, position]
        k = self.kernel
        size = k.cidx(self.block_size)
        entry = arith.minui(arith.divui(position, size), self.last_entry)
        return [k.load_index(self.addressing, [self.request, entry]),
                arith.remui(position, size)]

    def inside(self, position: ir.Value, at: list) -> ir.Value:
        """Whether `position` (whose indices `at` gave) is in the cache: a
        slot and position within (slots, length), or a position within the
        table's blocks and a block within the pool."""
        k = self.kernel
        zero = k.cidx(0)

        def within(value, bound):
            return arith.andi(arith.cmpi(arith.CmpIPredicate.sge, value, zero),
                              arith.cmpi(arith.CmpIPredicate.slt, value, bound))

        if self.block_size is None:
            return arith.andi(within(at[0], k.dim(self.cache, 0)),
                              within(position, k.dim(self.cache, 1)))
        positions = arith.muli(self.width, k.cidx(self.block_size))
        return arith.andi(within(position, positions), within(at[0], k.dim(self.cache, 0)))


class KVAppend(TileKernel):
    """One element of the new rows per lane iteration."""

    grid_rank = 1

    @classmethod
    def tensors(cls, op) -> list:
        # The result is the cache, already the first operand.
        return list(op.operands)

    def emit(self) -> None:
        op = self.op
        cache, values = op.operands[:2]
        (tm,) = op.tile
        row0, rows = self.row_block(values, tm)
        width = self.dim(values, 1)
        loop = self.lane_loop(arith.muli(rows, width))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, width))
            col = arith.remui(e, width)
            self.write_row(row, lambda at: self.store(self.load(values, [row, col]), cache,
                                                      [*at, col]))
            scf.yield_([])

    def write_row(self, row: ir.Value, write) -> None:
        """Emits `write(at)` with `at` the cache's first two indices for the
        token of row `row` of the new values, where that position is inside
        its request's cache."""
        op = self.op
        cache, _, positions, token_request, addressing = op.operands
        where = CacheRows(self, cache, addressing, op.params.get("block_size"),
                          self.load_index(token_request, [row]))
        position = self.load_index(positions, [row])
        at = where.at(position)
        guard = scf.IfOp(where.inside(position, at))
        with ir.InsertionPoint(guard.then_block):
            write(at)
            scf.yield_([])


class KVAppendCPU(KVAppend):
    """CPU: a row of the new values at a time: its cache address (table
    entry, bounds) found once, then the row copied in vectors of 16 values
    (`copy_row`), where the portable kernel found it per element."""

    @classmethod
    def name(cls, op) -> str:
        return "kv_append_cpu"

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu"

    def emit(self) -> None:
        op = self.op
        cache, values = op.operands[:2]
        (tm,) = op.tile
        row0, rows = self.row_block(values, tm)
        width = self.dim(values, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            self.write_row(row, lambda at: self.copy_row(values, [row], cache, at, width))
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
        cache, values = op.operands[:2]
        vec = self.vec(op)
        (tm,) = op.tile
        row0, rows = self.row_block(values, tm)
        pieces = self.cidx(cache.shape[2] // vec)
        loop = self.lane_loop(arith.muli(rows, pieces))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            row = arith.addi(row0, arith.divui(e, pieces))
            col = arith.muli(arith.remui(e, pieces), self.cidx(vec))
            self.write_row(row, lambda at: self.vstore(
                self.vload(values, [row, col], vec, aligned=True), cache, [*at, col],
                aligned=True))
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    cache, values, positions, token_request, addressing = op.operands
    (tm,) = op.tile
    block = box(1, [tile_offset(0, tm)], [tm])
    b.emit_task(op, op.name, [b.grid_extent(values.shape[0], tm)],
                [(values, box(1, [tile_offset(0, tm), "0"], [tm, None])), (positions, block),
                 (token_request, block), (addressing, whole(1, addressing))],
                [(cache, whole(1, cache))],
                next(k for k in (KVAppendVector, KVAppendCPU, KVAppend)
                     if k is KVAppend or k.applies(op, b.target)))
