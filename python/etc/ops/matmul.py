"""Matrix multiplication: C = A @ B, or A @ B^T with `transpose_b`.

Tasks: one tile task per (row block, column block) of C; each reads the row
block of A (all of K) and the column block of B (all of K).

Kernels, by target:
* generic: one output element per lane iteration with a serial K loop;
* cpu: register-blocked vector code (`MatmulCPU`): micro-tiles of ROWS rows
  by the whole tile width accumulate in f32 vectors with fused multiply-adds
  while B streams through once per micro-tile: for B (K, N) each k loads
  contiguous vectors of B's row k and broadcasts A[r, k]; for B^T (N, K)
  both operands are contiguous along k and the dot products reduce at the
  end. Partial edge tiles (columns past N) take the scalar path.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, vector

from .base import TaskBuilder, TileKernel, box, tile_offset

KINDS = ("matmul",)


class Matmul(TileKernel):
    """One output element per lane iteration, with a serial K loop."""

    grid_rank = 2

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands
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


class MatmulCPU(Matmul):
    """Vectorised, register-blocked matmul tile for the CPU target."""

    #: f32 lanes per vector: one AVX-512 register, two AVX2 registers.
    WIDTH = 16
    #: Rows of A that share each load of B (B^T: each load of B^T's rows).
    ROWS = 4
    #: Columns of B^T that share each load of A.
    COLS = 4

    @classmethod
    def name(cls, op) -> str:
        return "matmul_cpu"

    @classmethod
    def applies(cls, op) -> bool:
        tn = op.tile[1]
        return op.params["transpose_b"] or tn % cls.WIDTH == 0

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a = op.operands[0]
        tm, tn = op.tile
        r0 = arith.muli(self.ti[0], self.cidx(tm))
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        rows = self.extent(out, 0, r0, tm)
        cols = self.extent(out, 1, c0, tn)
        k_extent = self.dim(a, 1)
        if op.params["transpose_b"]:
            self.emit_transposed(r0, c0, rows, cols, k_extent)
            return
        full = arith.cmpi(arith.CmpIPredicate.eq, cols, self.cidx(tn))
        branch = scf.IfOp(full, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.emit_rows(r0, rows, c0, k_extent)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            super().emit()
            scf.yield_([])

    def emit_rows(self, r0, rows, c0, k_extent) -> None:
        """Full-width tiles of C = A @ B: ROWS-row micro-tiles, then single
        rows; the micro-tiles are spread over the lanes."""
        groups = arith.divui(rows, self.cidx(self.ROWS))
        loop = self.lane_loop(groups)
        with ir.InsertionPoint(loop.body):
            base = arith.addi(r0, arith.muli(loop.induction_variable, self.cidx(self.ROWS)))
            self.emit_micro_tile(base, self.ROWS, c0, k_extent)
            scf.yield_([])
        done = arith.muli(groups, self.cidx(self.ROWS))
        tail = self.lane_loop(arith.subi(rows, done))
        with ir.InsertionPoint(tail.body):
            row = arith.addi(r0, arith.addi(done, tail.induction_variable))
            self.emit_micro_tile(row, 1, c0, k_extent)
            scf.yield_([])

    def emit_micro_tile(self, row, count: int, c0, k_extent) -> None:
        """C[row : row + count, c0 : c0 + tn] = A[rows, :] @ B[:, cols]."""
        a, b = self.op.operands
        width = self.WIDTH
        vectors = self.op.tile[1] // width
        accs = [self.vzero(width) for _ in range(count * vectors)]
        kloop = scf.ForOp(self.cidx(0), k_extent, self.cidx(1), accs)
        with ir.InsertionPoint(kloop.body):
            k = kloop.induction_variable
            panel = [self.vload(b, [k, arith.addi(c0, self.cidx(v * width))], width)
                     for v in range(vectors)]
            carried = list(kloop.inner_iter_args)
            updated = []
            for r in range(count):
                a_rk = self.vsplat(self.load(a, [arith.addi(row, self.cidx(r)), k]), width)
                for v in range(vectors):
                    updated.append(vector.fma(a_rk, panel[v], carried[r * vectors + v]))
            scf.yield_(updated)
        for r in range(count):
            for v in range(vectors):
                self.vstore(kloop.results[r * vectors + v], self.op.result,
                            [arith.addi(row, self.cidx(r)), arith.addi(c0, self.cidx(v * width))])

    def emit_transposed(self, r0, c0, rows, cols, k_extent) -> None:
        """C = A @ B^T: each (row, column) is a dot product along k, where
        both operands are contiguous: vector partial sums over k in steps of
        WIDTH, then a scalar tail and one reduction. Micro-tiles of ROWS x
        COLS outputs share each load."""
        width = self.WIDTH
        vector_k = arith.muli(arith.divui(k_extent, self.cidx(width)), self.cidx(width))
        row_groups = arith.divui(arith.addi(rows, self.cidx(self.ROWS - 1)), self.cidx(self.ROWS))
        col_groups = arith.divui(arith.addi(cols, self.cidx(self.COLS - 1)), self.cidx(self.COLS))
        loop = self.lane_loop(arith.muli(row_groups, col_groups))
        with ir.InsertionPoint(loop.body):
            g = loop.induction_variable
            rg = arith.divui(g, col_groups)
            cg = arith.remui(g, col_groups)
            row = arith.addi(r0, arith.muli(rg, self.cidx(self.ROWS)))
            col = arith.addi(c0, arith.muli(cg, self.cidx(self.COLS)))
            row_count = arith.minsi(self.cidx(self.ROWS),
                                    arith.subi(arith.addi(r0, rows), row))
            col_count = arith.minsi(self.cidx(self.COLS),
                                    arith.subi(arith.addi(c0, cols), col))
            full = arith.andi(
                arith.cmpi(arith.CmpIPredicate.eq, row_count, self.cidx(self.ROWS)),
                arith.cmpi(arith.CmpIPredicate.eq, col_count, self.cidx(self.COLS)))
            branch = scf.IfOp(full, has_else=True)
            with ir.InsertionPoint(branch.then_block):
                self.emit_dots(row, self.ROWS, col, self.COLS, vector_k, k_extent)
                scf.yield_([])
            with ir.InsertionPoint(branch.else_block):
                # A partial micro-tile: one output at a time.
                edge = scf.ForOp(self.cidx(0), arith.muli(row_count, col_count), self.cidx(1))
                with ir.InsertionPoint(edge.body):
                    e = edge.induction_variable
                    self.emit_dots(arith.addi(row, arith.divui(e, col_count)), 1,
                                   arith.addi(col, arith.remui(e, col_count)), 1,
                                   vector_k, k_extent)
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def emit_dots(self, row, nrows: int, col, ncols: int, vector_k, k_extent) -> None:
        a, b = self.op.operands
        width = self.WIDTH
        accs = [self.vzero(width) for _ in range(nrows * ncols)]
        kloop = scf.ForOp(self.cidx(0), vector_k, self.cidx(width), accs)
        with ir.InsertionPoint(kloop.body):
            k = kloop.induction_variable
            a_rows = [self.vload(a, [arith.addi(row, self.cidx(r)), k], width) for r in range(nrows)]
            b_rows = [self.vload(b, [arith.addi(col, self.cidx(c)), k], width) for c in range(ncols)]
            carried = list(kloop.inner_iter_args)
            scf.yield_([vector.fma(a_rows[r], b_rows[c], carried[r * ncols + c])
                        for r in range(nrows) for c in range(ncols)])
        for r in range(nrows):
            for c in range(ncols):
                total = self.vsum(kloop.results[r * ncols + c])
                tail = scf.ForOp(vector_k, k_extent, self.cidx(1), [total])
                with ir.InsertionPoint(tail.body):
                    k = tail.induction_variable
                    prod = arith.mulf(self.load(a, [arith.addi(row, self.cidx(r)), k]),
                                      self.load(b, [arith.addi(col, self.cidx(c)), k]))
                    scf.yield_([arith.addf(tail.inner_iter_args[0], prod)])
                self.store(tail.results[0], self.op.result,
                           [arith.addi(row, self.cidx(r)), arith.addi(col, self.cidx(c))])


def choose_kernel(op, target) -> type:
    """The matmul kernel for `op` on `target`."""
    if target.kind == "cpu" and MatmulCPU.applies(op):
        return MatmulCPU
    return Matmul


def build_tasks(b: TaskBuilder, op) -> None:
    a, w = op.operands
    res = op.result
    tm, tn = op.tile
    reads = [(a, box(2, [tile_offset(0, tm), "0"], [tm, None]))]
    if op.params["transpose_b"]:
        reads.append((w, box(2, [tile_offset(1, tn), "0"], [tn, None])))
    else:
        reads.append((w, box(2, ["0", tile_offset(1, tn)], [None, tn])))
    writes = [(res, box(2, [tile_offset(0, tm), tile_offset(1, tn)], [tm, tn]))]
    grid = [b.grid_extent(res.shape[0], tm), b.grid_extent(res.shape[1], tn)]
    b.emit_task(op, op.name, grid, reads, writes, choose_kernel(op, b.target))
