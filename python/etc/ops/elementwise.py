"""Elementwise operators: add, mul, silu_mul (silu(a) * b, a SwiGLU MLP's
gate: one task where silu then mul were two; silu rounded to the dtype
first, so the bits are the same) and gelu_mul (the same for a GeGLU MLP),
each with a 1-D operand broadcast over rows; sigmoid_mul (sigmoid(gate) *
x, the gate a column (M, 1) broadcast over x's columns: a shared expert's
per-token gate); silu, gelu, exp, scale and softcap (c tanh(x / c)).

Tasks: one tile task per output tile (1-D or 2-D); each reads the same tile
of every operand of the result's rank, the column block of a broadcast
1-D operand, and the row block of a broadcast column. On the CPU a 2-D
operator whose tile the user did not choose takes columns up to 512 wide
(`ElementwiseCPU.tile_for`).

Kernels: generic, one element per lane iteration; cpu (`ElementwiseCPU`),
each row of a full-width tile as f32 vectors, the rows spread over the
lanes, partial edge tiles element by element; cuda (`ElementwiseGPU`), the
16-byte slices of a full tile spread over the lanes, partial edge tiles
element by element.
"""

from __future__ import annotations

import dataclasses

from mlir import ir
from mlir.dialects import arith, scf

from .base import TaskBuilder, TileKernel, box, tile_offset

UNARY = ("silu", "gelu", "exp", "scale", "softcap")
BINARY = ("add", "mul", "silu_mul", "gelu_mul", "sigmoid_mul")
KINDS = UNARY + BINARY


def is_column(op, t) -> bool:
    """Whether operand `t` of `op` is a column (M, 1) broadcast over the
    columns of the result (sigmoid_mul's gate)."""
    return op.kind == "sigmoid_mul" and t is op.operands[0]


class Elementwise(TileKernel):
    """out[e] = f(operands[e]) for the elements e of one tile, spread over
    the lanes."""

    def emit(self) -> None:
        op, out = self.op, self.op.result
        offsets, extents, count = self.tile_elements(out, op.tile)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            pos = self.element_coords(loop.induction_variable, offsets, extents)
            vals = [self.load(t, self.operand_index(t, pos)) for t in op.operands]
            self.store(self.combine(vals), out, pos)
            scf.yield_([])

    def operand_index(self, t, pos: list) -> list:
        """The element of operand `t` that goes with the result's `pos`: the
        same, its column's for a broadcast 1-D operand, its row's for a
        broadcast column."""
        if is_column(self.op, t):
            return [pos[0], self.cidx(0)]
        return pos if t.rank == self.op.result.rank else pos[-1:]

    def operand_vector(self, t, pos: list, width: int, aligned: bool = False) -> ir.Value:
        """`width` elements of operand `t` from the result's `pos` (along
        its last dimension) as an f32 vector: a broadcast column's element
        repeated."""
        if is_column(self.op, t):
            return self.vsplat(self.load(t, self.operand_index(t, pos)), width)
        return self.vload(t, self.operand_index(t, pos), width, aligned=aligned)

    def combine(self, vals: list) -> ir.Value:
        """The operator on loaded operands (scalars or vectors alike)."""
        kind = self.op.kind
        if kind == "add":
            return arith.addf(vals[0], vals[1])
        if kind == "mul":
            return arith.mulf(vals[0], vals[1])
        if kind in ("silu_mul", "gelu_mul", "sigmoid_mul"):
            gate = self.rounded(self.unary(kind.removesuffix("_mul"), vals[0]),
                                self.op.result.dtype)
            return arith.mulf(gate, vals[1])
        return self.unary(kind, vals[0], self.op.params.get("c"))


class Elementwise1D(Elementwise):
    grid_rank = 1


class Elementwise2D(Elementwise):
    grid_rank = 2


class ElementwiseCPU(Elementwise):
    """Rows of full-width tiles as f32 vectors of WIDTH lanes."""

    WIDTH = 16

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_cpu"

    #: The widest column block `tile_for` chooses, in elements.
    MAX_COLUMNS = 512

    @classmethod
    def applies(cls, op) -> bool:
        return op.tile[-1] % cls.WIDTH == 0

    @classmethod
    def tile_for(cls, op) -> tuple:
        """The tile of a 2-D operator whose tile the user did not choose:
        the default rows, and the widest multiple of WIDTH up to
        MAX_COLUMNS that divides a static last dimension (none: the
        default). A tile's rows then are runs of up to 1 KB (bf16) that the
        hardware prefetchers stream, where the default 64 columns are 128
        bytes per row, 3 KB apart in a SwiGLU's rows of 1536: the model's
        silu_mul, on inputs fresh from the matmuls and out of the caches,
        took twice as long with 64 columns as with 256 or more."""
        last = op.result.shape[-1]
        if op.result.rank != 2 or not isinstance(last, int):
            return op.tile
        widths = [w for w in range(cls.WIDTH, min(last, cls.MAX_COLUMNS) + 1, cls.WIDTH)
                  if last % w == 0]
        return (op.tile[0], widths[-1]) if widths else op.tile

    def emit(self) -> None:
        op, out = self.op, self.op.result
        tn = op.tile[-1]
        offsets, extents, _ = self.tile_elements(out, op.tile)
        full = arith.cmpi(arith.CmpIPredicate.eq, extents[-1], self.cidx(tn))
        branch = scf.IfOp(full, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            rows = extents[0] if out.rank == 2 else self.cidx(1)
            loop = self.lane_loop(rows)
            with ir.InsertionPoint(loop.body):
                prefix = [arith.addi(offsets[0], loop.induction_variable)] if out.rank == 2 else []
                for v in range(tn // self.WIDTH):
                    col = arith.addi(offsets[-1], self.cidx(v * self.WIDTH))
                    vals = [self.operand_vector(t, prefix + [col], self.WIDTH)
                            for t in op.operands]
                    self.vstore(self.combine(vals), out, prefix + [col])
                scf.yield_([])
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            super().emit()
            scf.yield_([])


class ElementwiseCPU1D(ElementwiseCPU):
    grid_rank = 1


class ElementwiseCPU2D(ElementwiseCPU):
    grid_rank = 2


class ElementwiseGPU(ElementwiseCPU):
    """A full tile as 16-byte slices (VEC elements), slice e on lane e mod
    lanes: consecutive lanes touch consecutive 16 bytes (coalesced)."""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_gpu"

    @staticmethod
    def vec(op) -> int:
        return 16 // (4 if op.result.dtype == "f32" else 2)

    @classmethod
    def applies(cls, op) -> bool:
        # Aligned slices: the tile width and every row's start are whole
        # slices (a static last dimension divisible by VEC).
        vec = cls.vec(op)
        last = op.result.shape[-1]
        return op.tile[-1] % vec == 0 and isinstance(last, int) and last % vec == 0

    def emit(self) -> None:
        op, out = self.op, self.op.result
        tn = op.tile[-1]
        vec = self.vec(op)
        offsets, extents, _ = self.tile_elements(out, op.tile)
        full = arith.cmpi(arith.CmpIPredicate.eq, extents[-1], self.cidx(tn))
        branch = scf.IfOp(full, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            per_row = tn // vec
            rows = extents[0] if out.rank == 2 else self.cidx(1)
            lanes = self.lanes()

            def body(lane):
                loop = scf.ForOp(lane, arith.muli(rows, self.cidx(per_row)),
                                 self.cidx(lanes.count))
                with ir.InsertionPoint(loop.body):
                    e = loop.induction_variable
                    col = arith.addi(offsets[-1], arith.muli(arith.remui(e, self.cidx(per_row)),
                                                             self.cidx(vec)))
                    prefix = ([arith.addi(offsets[0], arith.divui(e, self.cidx(per_row)))]
                              if out.rank == 2 else [])
                    vals = [self.operand_vector(t, prefix + [col], vec, aligned=True)
                            for t in op.operands]
                    self.vstore(self.combine(vals), out, prefix + [col], aligned=True)
                    scf.yield_([])
            lanes.each(body)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            Elementwise.emit(self)
            scf.yield_([])


class ElementwiseGPU1D(ElementwiseGPU):
    grid_rank = 1


class ElementwiseGPU2D(ElementwiseGPU):
    grid_rank = 2


def build_tasks(b: TaskBuilder, op) -> None:
    if b.target.kind == "cpu" and not op.user_tile:
        op = dataclasses.replace(op, tile=ElementwiseCPU.tile_for(op))
    res = op.result
    rank = res.rank
    offsets = [tile_offset(d, t) for d, t in enumerate(op.tile)]
    own = box(rank, offsets, list(op.tile))
    # A 1-D operand broadcast over rows: its column block; a column
    # broadcast over columns: its row block.
    reads = [(t, box(rank, [offsets[0], "0"], [op.tile[0], 1]) if is_column(op, t) else
              own if t.rank == rank else box(rank, [offsets[-1]], [op.tile[-1]]))
             for t in op.operands]
    grid = [b.grid_extent(d, t) for d, t in zip(res.shape, op.tile)]
    if b.target.kind == "cpu" and ElementwiseCPU.applies(op):
        kernel = ElementwiseCPU2D if rank == 2 else ElementwiseCPU1D
    elif b.target.gpu_kernels and ElementwiseGPU.applies(op):
        kernel = ElementwiseGPU2D if rank == 2 else ElementwiseGPU1D
    else:
        kernel = Elementwise2D if rank == 2 else Elementwise1D
    b.emit_task(op, op.name, grid, reads, [(res, own)], kernel)
