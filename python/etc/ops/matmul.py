"""Matrix multiplication: C = A @ B, or A @ B^T with `transpose_b`.

Tasks: one tile task per (row block, column block) of C; each reads the row
block of A (all of K) and the column block of B (all of K).

Kernels, by target:
* generic: one output element per lane iteration with a serial K loop;
* cpu: register-blocked vector code (`MatmulCPU`) on tiles up to 256
  columns wide (as wide as still gives every worker two column tiles at
  one row block): micro-tiles of up to 4 rows by a chunk of columns
  accumulate in f32 vectors with fused multiply-adds while B streams
  through once per micro-tile: for B (K, N) each k loads contiguous
  vectors of B's row k (up to 1 KB for a decode row) and broadcasts
  A[r, k]; for B^T (N, K) both operands are contiguous along k and the
  dot products reduce at the end: groups of 4 rows of A take a stack
  panel of A in f32 and 4 x 2 dot products (`emit_panels`), the rows left
  (all at decode) dot groups of 4 columns a quarter of the tile apart
  (`emit_transposed`: 4 long streams of B^T per worker). Tile widths give
  every worker the same number of column tiles where one divides N so.
  Partial edge tiles (columns past N) take the scalar path.
* cuda, few rows (decode): `MatmulSkinny` for B (K, N) (lanes along N,
  split-K across lane groups, scratch reduction across warps) and
  `MatmulSkinnyT` for B^T (N, K), the layout of Hugging Face weights (a
  warp per group of 4 B^T rows, lanes along K with 512-byte warp loads,
  warp-shuffle reduction); both
  read each weight byte once per tile with 16-byte loads, and their column
  tiles are sized so that B = 1 gives every SM a tile;
* cuda, sm_80 and newer, f16 and bf16 with K a multiple of 16: tensor cores
  (`matmul_mma.MatmulMMA`: cp.async staging in shared memory, ldmatrix,
  mma.sync m16n8k16) for 16 rows or more; with symbolic rows (the batch) a
  kernel that also derives from the GEMV picks per tile at run time:
  `MatmulMMASkinny` and `MatmulMMASkinnyT` (tensor cores from 16 rows, the
  GEMV below), on the GEMV's column tiles.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

from mlir import ir
from mlir.dialects import arith, memref, scf, vector
from mlir.dialects import math as math_dialect

from .base import ResidualStores, TaskBuilder, TileKernel, box, tile_offset
from .matmul_mma import MatmulMMA

KINDS = ("matmul",)


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


class MatmulCPU(Matmul):
    """Vectorised matmul tile for the CPU target.

    C = A @ B (B is (K, N)), up to STREAMED_ROWS rows in the tile (decode
    batches): `emit_streamed`, k outermost, the partial sums of each group
    of at most ROWS rows in a stack buffer, each step reading KSTEP rows of
    B across the whole tile (tiles up to STREAMED_WIDEST columns, one per
    worker at least), so that B is read in runs as long as the tile is
    wide. More rows: micro-tiles
    of ROWS rows by a chunk of columns keep count x chunk / WIDTH f32 vector
    accumulators (at most ACCUMULATORS) while the K loop streams B's rows,
    each k loading the chunk's contiguous vectors of row k once for all
    `count` rows. (Decode rows took such micro-tiles, 1 row on 176-256
    columns: a run of 0.7-1 KB per row of B, and 22 vector registers of
    accumulators where AVX2 has 16, so LLVM kept half of them on the stack;
    on the decode MLP of `bench/cpu_tiles.py` the streamed rows, with the
    wider tiles, took 0.81x their time at B = 1 and 0.65-0.94x at B = 2-16
    on 2 workers, 2026-11-26.)

    C = A @ B^T: dot products along k (`emit_transposed`), and the panel
    micro-kernel for groups of PANEL_ROWS rows (`emit_panels`).
    """

    #: f32 lanes per vector: one AVX-512 register, two AVX2 registers.
    WIDTH = 16
    #: Rows of A that share each load of B (B^T: each load of B^T's rows).
    ROWS = 4
    #: Columns of B^T that share each load of A.
    COLS = 4
    #: Vector accumulators of one micro-tile of C = A @ B.
    ACCUMULATORS = 16
    #: Rows of B each step of `emit_streamed` reads across the tile (half
    #: as many for groups of ROWS rows of A: 8 splats of A in registers).
    KSTEP = 4
    #: The widest C = A @ B tile: `emit_streamed` reads runs of B's rows as
    #: wide as the tile, and keeps the partial sums of up to ROWS rows of
    #: it (24 KB at 1536 columns, within a 32 KB L1).
    STREAMED_WIDEST = 1536
    #: Tiles of C = A @ B with at most this many rows take `emit_streamed`
    #: (each group of ROWS rows reads the tile of B again: at B = 16 it
    #: still took 0.87x the micro-tiles' time).
    STREAMED_ROWS = 16
    #: The panel micro-kernel of C = A @ B^T (`emit_panels`): rows of A per
    #: panel, f32 lanes per vector, and the largest panel (a stack buffer).
    PANEL_ROWS = 4
    PANEL_WIDTH = 8
    PANEL_BYTES = 96 * 1024
    #: Tile widths the CPU picks (widest first) when the graph does not say.
    TILE_WIDTHS = (256, 128, 64)

    @classmethod
    def name(cls, op) -> str:
        return "matmul_cpu"

    @classmethod
    def applies(cls, op) -> bool:
        tn = op.tile[1]
        return op.params["transpose_b"] or tn % cls.WIDTH == 0

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Rows as the front end tiles them, and a width that divides N into
        column tiles every worker gets the same number of: a decode step is
        a chain of matmuls each of which all workers must finish before the
        next starts, so a stage of 9 tiles on 2 workers takes 5 tiles' time.
        C = A @ B^T: at least two tiles each, the widest such multiple of
        WIDTH up to 256 (B^T's rows are contiguous whatever the width).
        C = A @ B: at least one each, up to STREAMED_WIDEST, since the
        streamed rows read runs of B's rows as long as the tile is wide
        (on the decode MLP of `bench/cpu_tiles.py`, 1408 columns instead of
        704 took 0.75-0.81x the time at B = 1-4, 0.94-0.96x at B = 8 and
        0.76-0.79x right after a NumPy product, in two runs). Failing that,
        the widest of TILE_WIDTHS that still gives every worker two column
        tiles, else the narrowest that divides N; the front end's tile when
        none does.
        C = A @ B tiles are never narrower than 64 columns."""
        transpose_b = op.params["transpose_b"]
        n = op.operands[1].shape[0 if transpose_b else 1]
        if not isinstance(n, int):
            return op.tile
        workers = target.workers
        narrowest = cls.WIDTH if transpose_b else cls.TILE_WIDTHS[-1]
        widest = cls.TILE_WIDTHS[0] if transpose_b else cls.STREAMED_WIDEST
        each = 2 if transpose_b else 1
        for tn in range(widest, narrowest - 1, -cls.WIDTH):
            tiles = n // tn
            if n % tn == 0 and tiles >= each * workers and tiles % workers == 0:
                return (op.tile[0], tn)
        widths = [tn for tn in cls.TILE_WIDTHS if n % tn == 0]
        enough = [tn for tn in widths if n // tn >= 2 * workers]
        if enough:
            return (op.tile[0], enough[0])
        return (op.tile[0], widths[-1]) if widths else op.tile

    @classmethod
    def chunk(cls, count: int, tn: int) -> int:
        """The columns of a micro-tile of `count` rows in a tile `tn` wide:
        the most vectors that fit the accumulators and divide the tile."""
        vectors = tn // cls.WIDTH
        fit = max(1, cls.ACCUMULATORS // count)
        return cls.WIDTH * max(v for v in range(1, min(fit, vectors) + 1) if vectors % v == 0)

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a = op.operands[0]
        tm, tn = op.tile
        r0, rows = self.row_block(out, tm)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        cols = self.extent(out, 1, c0, tn)
        k_extent = self.dim(a, 1)
        if op.params["transpose_b"]:
            if self.panel_k() is None:
                self.emit_transposed(r0, c0, rows, cols, k_extent)
                return
            # Groups of PANEL_ROWS rows by the panel micro-kernel, the rows
            # left (all of them at decode) by the dot groups.
            groups = arith.divui(rows, self.cidx(self.PANEL_ROWS))
            paneled = arith.muli(groups, self.cidx(self.PANEL_ROWS))
            self.emit_panels(r0, groups, c0, cols, k_extent)
            left = arith.subi(rows, paneled)
            some = arith.cmpi(arith.CmpIPredicate.ugt, left, self.cidx(0))
            branch = scf.IfOp(some)
            with ir.InsertionPoint(branch.then_block):
                self.emit_transposed(arith.addi(r0, paneled), c0, left, cols, k_extent)
                scf.yield_([])
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
        """Full-width tiles of C = A @ B: groups of ROWS rows (streamed when
        the tile has at most STREAMED_ROWS rows, else (row group, chunk)
        micro-tiles spread over the lanes), then the rows left, streamed.
        The streamed rows run on the CPU's one lane."""
        groups = arith.divui(rows, self.cidx(self.ROWS))
        if self.op.tile[1] > self.STREAMED_WIDEST:
            # A tile the user chose wider than the stack buffer is meant for.
            self.emit_chunks(r0, groups, self.ROWS, c0, k_extent)
            self.emit_left(r0, rows, groups, c0, k_extent, self.emit_left_chunks)
            return
        few = arith.cmpi(arith.CmpIPredicate.ule, rows, self.cidx(self.STREAMED_ROWS))
        branch = scf.IfOp(few, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            each = scf.ForOp(self.cidx(0), groups, self.cidx(1))
            with ir.InsertionPoint(each.body):
                self.emit_streamed(arith.addi(r0, arith.muli(each.induction_variable,
                                                             self.cidx(self.ROWS))),
                                   self.ROWS, c0, k_extent)
                scf.yield_([])
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            self.emit_chunks(r0, groups, self.ROWS, c0, k_extent)
            scf.yield_([])
        self.emit_left(r0, rows, groups, c0, k_extent, self.emit_streamed)

    def emit_left(self, r0, rows, groups, c0, k_extent, emit) -> None:
        """The 1 to ROWS - 1 rows after `groups` groups of ROWS rows, by
        `emit(row, count, c0, k_extent)`."""
        base = arith.addi(r0, arith.muli(groups, self.cidx(self.ROWS)))
        left = arith.subi(rows, arith.muli(groups, self.cidx(self.ROWS)))
        for count in range(1, self.ROWS):
            is_count = arith.cmpi(arith.CmpIPredicate.eq, left, self.cidx(count))
            branch = scf.IfOp(is_count)
            with ir.InsertionPoint(branch.then_block):
                emit(base, count, c0, k_extent)
                scf.yield_([])

    def emit_left_chunks(self, row, count: int, c0, k_extent) -> None:
        """One micro-tile of `count` rows per chunk of the tile."""
        self.emit_chunks(row, self.cidx(1), count, c0, k_extent)

    def emit_chunks(self, r0, groups, count: int, c0, k_extent) -> None:
        """The micro-tiles of `groups` groups of `count` rows from row r0,
        each over the tile's chunks."""
        width = self.chunk(count, self.op.tile[1])
        chunks = self.cidx(self.op.tile[1] // width)
        # Chunk-major: the row groups of a chunk one after another, while
        # the chunk of B (K x width) is still in the core's cache.
        loop = self.lane_loop(arith.muli(groups, chunks))
        with ir.InsertionPoint(loop.body):
            unit = loop.induction_variable
            row = arith.addi(r0, arith.muli(arith.remui(unit, groups), self.cidx(count)))
            col = arith.addi(c0, arith.muli(arith.divui(unit, groups), self.cidx(width)))
            self.emit_micro_tile(row, count, col, width, k_extent)
            scf.yield_([])

    def emit_micro_tile(self, row, count: int, c0, columns: int, k_extent) -> None:
        """C[row : row + count, c0 : c0 + columns] = A[rows, :] @ B[:, cols]."""
        a, b = self.op.operands[:2]
        width = self.WIDTH
        vectors = columns // width
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

    def emit_streamed(self, row, count: int, c0, k_extent) -> None:
        """C[row : row + count, c0 : c0 + tn] = A[rows, :] @ B[:, cols] for a
        group of at most ROWS rows, k outermost: the group's partial sums
        stay in a stack buffer (in L1, one for all groups of the tile), and
        each step reads `kstep` rows of B across the whole tile, as that
        many long contiguous runs. The register micro-tile of one row read a
        chunk of the tile down all of K, one short run per row of B (176
        columns of f32 on the decode MLP, whose 11 vector accumulators of
        16 lanes are 22 registers of AVX2: LLVM kept half of them on the
        stack); a C prototype of both on the 2-core EPYC VM read the MLP's
        weights on one core at 3.7-6.6 GB/s that way and at 5.9-10.8 GB/s
        streamed (176 columns), 7.1-11.9 GB/s with 704-column tiles."""
        a, b = self.op.operands[:2]
        width, tn = self.WIDTH, self.op.tile[1]
        kstep = self.KSTEP if count < self.ROWS else self.KSTEP // 2
        if getattr(self, "_streamed_sums", None) is None:
            self._streamed_sums = self.entry_alloca(
                ir.MemRefType.get([self.ROWS, tn], self.f32))
        acc = self._streamed_sums
        zero = self.vzero(width)
        each = scf.ForOp(self.cidx(0), self.cidx(tn), self.cidx(width))
        with ir.InsertionPoint(each.body):
            for r in range(count):
                vector.store(zero, acc, [self.cidx(r), each.induction_variable])
            scf.yield_([])
        rows = [arith.addi(row, self.cidx(r)) for r in range(count)]
        vtype = self.vtype(width)

        def step(k, depth: int) -> None:
            """Adds A[rows, k : k + depth] @ B[k : k + depth, tile]."""
            ks = [arith.addi(k, self.cidx(j)) if j else k for j in range(depth)]
            splats = [[self.vsplat(self.load(a, [rows[r], ks[j]]), width) for j in range(depth)]
                      for r in range(count)]
            cols = scf.ForOp(self.cidx(0), self.cidx(tn), self.cidx(width))
            with ir.InsertionPoint(cols.body):
                c = cols.induction_variable
                col = arith.addi(c0, c)
                bv = [self.vload(b, [ks[j], col], width) for j in range(depth)]
                for r in range(count):
                    sums = vector.load(vtype, acc, [self.cidx(r), c])
                    for j in range(depth):
                        sums = vector.fma(splats[r][j], bv[j], sums)
                    vector.store(sums, acc, [self.cidx(r), c])
                scf.yield_([])

        whole = arith.muli(arith.divui(k_extent, self.cidx(kstep)), self.cidx(kstep))
        kloop = scf.ForOp(self.cidx(0), whole, self.cidx(kstep))
        with ir.InsertionPoint(kloop.body):
            step(kloop.induction_variable, kstep)
            scf.yield_([])
        tail = scf.ForOp(whole, k_extent, self.cidx(1))
        with ir.InsertionPoint(tail.body):
            step(tail.induction_variable, 1)
            scf.yield_([])
        out = scf.ForOp(self.cidx(0), self.cidx(tn), self.cidx(width))
        with ir.InsertionPoint(out.body):
            c = out.induction_variable
            for r in range(count):
                self.vstore(vector.load(vtype, acc, [self.cidx(r), c]), self.op.result,
                            [rows[r], arith.addi(c0, c)])
            scf.yield_([])

    def panel_k(self):
        """K when C = A @ B^T takes the panel micro-kernel (K static, and a
        panel of PANEL_ROWS rows of A in f32 at most PANEL_BYTES), else None."""
        k = self.op.operands[0].shape[1]
        if isinstance(k, int) and self.PANEL_ROWS * k * 4 <= self.PANEL_BYTES:
            return k
        return None

    def emit_panels(self, r0, groups, c0, cols, k_extent) -> None:
        """C = A @ B^T for `groups` groups of PANEL_ROWS rows from r0: each
        group's rows of A are widened to f32 once, into a stack panel (bf16
        and f16 A; f32 A is read in place), then every pair of columns
        (c, c + cols / 2: two far-apart streams of B^T, as in
        `emit_transposed`) takes PANEL_ROWS x 2 dot products of PANEL_WIDTH
        lanes: 8 accumulators, each B^T load widened once for 4 rows and
        each A load used twice, well within the 16 vector registers of
        AVX2. (The 4 x 4 dot groups of 16 lanes need 32 registers of
        accumulators: LLVM spilled them to the stack at every k, and
        widened A again for every group of columns.) 4 rows beat 6 (12
        accumulators) at B = 4, 8 and 16: fewer rows are left to the dot
        groups. An odd number of columns takes the dot groups."""
        a, b = self.op.operands[:2]
        rows_n, width = self.PANEL_ROWS, self.PANEL_WIDTH
        k = self.panel_k()
        vector_k = (k // width) * width
        even = arith.cmpi(arith.CmpIPredicate.eq, arith.remui(cols, self.cidx(2)), self.cidx(0))
        branch = scf.IfOp(even, has_else=True)
        with ir.InsertionPoint(branch.else_block):
            self.emit_transposed(r0, c0, arith.muli(groups, self.cidx(rows_n)), cols, k_extent)
            scf.yield_([])
        with ir.InsertionPoint(branch.then_block):
            step = arith.divui(cols, self.cidx(2))
            widen = a.dtype != "f32"
            panel = self.entry_alloca(ir.MemRefType.get([rows_n, k], self.f32)) if widen \
                else None
            vtype = self.vtype(width)
            loop = self.lane_loop(groups)
            with ir.InsertionPoint(loop.body):
                row = arith.addi(r0, arith.muli(loop.induction_variable, self.cidx(rows_n)))
                a_rows = [arith.addi(row, self.cidx(r)) for r in range(rows_n)]
                if widen:
                    fill = scf.ForOp(self.cidx(0), self.cidx(k), self.cidx(width))
                    with ir.InsertionPoint(fill.body):
                        kk = fill.induction_variable
                        # k + width may pass K: widen the last vector element
                        # by element instead.
                        whole = arith.cmpi(arith.CmpIPredicate.ule,
                                           arith.addi(kk, self.cidx(width)), self.cidx(k))
                        part = scf.IfOp(whole, has_else=True)
                        with ir.InsertionPoint(part.then_block):
                            for r in range(rows_n):
                                vector.store(self.vload(a, [a_rows[r], kk], width), panel,
                                             [self.cidx(r), kk])
                            scf.yield_([])
                        with ir.InsertionPoint(part.else_block):
                            tail = scf.ForOp(kk, self.cidx(k), self.cidx(1))
                            with ir.InsertionPoint(tail.body):
                                t = tail.induction_variable
                                for r in range(rows_n):
                                    memref.store(self.load(a, [a_rows[r], t]), panel,
                                                 [self.cidx(r), t])
                                scf.yield_([])
                            scf.yield_([])
                        scf.yield_([])

                def a_vector(r, kk):
                    if widen:
                        return vector.load(vtype, panel, [self.cidx(r), kk])
                    return vector.load(vtype, self.buf(a), [a_rows[r], kk])

                def a_scalar(r, kk):
                    if widen:
                        return memref.load(panel, [self.cidx(r), kk])
                    return self.load(a, [a_rows[r], kk])

                pairs = scf.ForOp(self.cidx(0), step, self.cidx(1))
                with ir.InsertionPoint(pairs.body):
                    col = arith.addi(c0, pairs.induction_variable)
                    b_cols = [col, arith.addi(col, step)]
                    accs = [self.vzero(width) for _ in range(rows_n * 2)]
                    kloop = scf.ForOp(self.cidx(0), self.cidx(vector_k), self.cidx(width), accs)
                    with ir.InsertionPoint(kloop.body):
                        kk = kloop.induction_variable
                        b_vecs = [self.vload(b, [c, kk], width) for c in b_cols]
                        carried = list(kloop.inner_iter_args)
                        updated = []
                        for r in range(rows_n):
                            av = a_vector(r, kk)
                            updated += [vector.fma(av, b_vecs[c], carried[r * 2 + c])
                                        for c in range(2)]
                        scf.yield_(updated)
                    for r in range(rows_n):
                        for c in range(2):
                            total = self.tree_sum(kloop.results[r * 2 + c])
                            if vector_k < k:
                                tail = scf.ForOp(self.cidx(vector_k), self.cidx(k), self.cidx(1),
                                                 [total])
                                with ir.InsertionPoint(tail.body):
                                    t = tail.induction_variable
                                    prod = arith.mulf(a_scalar(r, t), self.load(b, [b_cols[c], t]))
                                    scf.yield_([arith.addf(tail.inner_iter_args[0], prod)])
                                total = tail.results[0]
                            self.store(total, self.op.result, [a_rows[r], b_cols[c]])
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def emit_transposed(self, r0, c0, rows, cols, k_extent) -> None:
        """C = A @ B^T: each (row, column) is a dot product along k, where
        both operands are contiguous: vector partial sums over k in steps of
        WIDTH, then a scalar tail and one reduction. Micro-tiles of ROWS x
        COLS outputs share each load."""
        width = self.WIDTH
        vector_k = arith.muli(arith.divui(k_extent, self.cidx(width)), self.cidx(width))
        row_groups = arith.divui(arith.addi(rows, self.cidx(self.ROWS - 1)), self.cidx(self.ROWS))
        col_groups = arith.divui(arith.addi(cols, self.cidx(self.COLS - 1)), self.cidx(self.COLS))
        # A tile whose columns divide into COLS groups gives each dot group
        # columns `step` apart (c, c + step, ...): the COLS rows of B^T it
        # reads lie in COLS far-apart parts of the tile, so that each part is
        # read front to back as the groups go on, as COLS long sequential
        # streams the hardware prefetcher follows (adjacent columns make
        # COLS streams of one row each, ended after K elements).
        strided = arith.cmpi(arith.CmpIPredicate.eq,
                             arith.remui(cols, self.cidx(self.COLS)), self.cidx(0))
        step = arith.select(strided, arith.divui(cols, self.cidx(self.COLS)), self.cidx(1))
        loop = self.lane_loop(arith.muli(row_groups, col_groups))
        with ir.InsertionPoint(loop.body):
            g = loop.induction_variable
            rg = arith.divui(g, col_groups)
            cg = arith.remui(g, col_groups)
            row = arith.addi(r0, arith.muli(rg, self.cidx(self.ROWS)))
            col = arith.addi(c0, arith.select(strided, cg, arith.muli(cg, self.cidx(self.COLS))))
            row_count = arith.minsi(self.cidx(self.ROWS),
                                    arith.subi(arith.addi(r0, rows), row))
            col_count = arith.minsi(self.cidx(self.COLS),
                                    arith.subi(arith.addi(c0, cols), col))
            full = arith.andi(
                arith.cmpi(arith.CmpIPredicate.eq, row_count, self.cidx(self.ROWS)),
                arith.cmpi(arith.CmpIPredicate.eq, col_count, self.cidx(self.COLS)))
            branch = scf.IfOp(full, has_else=True)
            with ir.InsertionPoint(branch.then_block):
                self.emit_dots(row, self.ROWS, col, self.COLS, vector_k, k_extent, step)
                scf.yield_([])
            with ir.InsertionPoint(branch.else_block):
                # Fewer than ROWS rows (decode) but all COLS columns: a row at
                # a time, its COLS dot products sharing each load of A (COLS
                # independent accumulators keep the FMA pipes busy).
                all_cols = arith.cmpi(arith.CmpIPredicate.eq, col_count, self.cidx(self.COLS))
                rows_only = scf.IfOp(all_cols, has_else=True)
                with ir.InsertionPoint(rows_only.then_block):
                    each_row = scf.ForOp(self.cidx(0), row_count, self.cidx(1))
                    with ir.InsertionPoint(each_row.body):
                        self.emit_dots(arith.addi(row, each_row.induction_variable), 1, col,
                                       self.COLS, vector_k, k_extent, step)
                        scf.yield_([])
                    scf.yield_([])
                with ir.InsertionPoint(rows_only.else_block):
                    # An edge of columns too: one output at a time.
                    edge = scf.ForOp(self.cidx(0), arith.muli(row_count, col_count),
                                     self.cidx(1))
                    with ir.InsertionPoint(edge.body):
                        e = edge.induction_variable
                        self.emit_dots(arith.addi(row, arith.divui(e, col_count)), 1,
                                       arith.addi(col, arith.remui(e, col_count)), 1,
                                       vector_k, k_extent)
                        scf.yield_([])
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def tree_sum(self, v: ir.Value) -> ir.Value:
        """The sum of the lanes of an f32 vector, in any order: LLVM adds
        halves with shuffles (log2 steps) instead of a chain of scalar adds
        in lane order, which took about a quarter of a decode dot product
        of 576 (a 24-cycle chain per output after an 18-iteration loop)."""
        return vector.reduction(self.f32, ir.Attribute.parse("#vector.kind<add>"), v,
                                fastmath=ir.Attribute.parse("#arith.fastmath<reassoc>"))

    def emit_dots(self, row, nrows: int, col, ncols: int, vector_k, k_extent,
                  step=None) -> None:
        """C[row + r, col + c * step] for r < nrows, c < ncols (step 1 when
        None): dot products along k of A's rows and B^T's rows."""
        a, b = self.op.operands[:2]
        width = self.WIDTH
        step = self.cidx(1) if step is None else step
        cols = [arith.addi(col, arith.muli(self.cidx(c), step)) for c in range(ncols)]
        accs = [self.vzero(width) for _ in range(nrows * ncols)]
        kloop = scf.ForOp(self.cidx(0), vector_k, self.cidx(width), accs)
        with ir.InsertionPoint(kloop.body):
            k = kloop.induction_variable
            a_rows = [self.vload(a, [arith.addi(row, self.cidx(r)), k], width) for r in range(nrows)]
            b_rows = [self.vload(b, [c, k], width) for c in cols]
            carried = list(kloop.inner_iter_args)
            scf.yield_([vector.fma(a_rows[r], b_rows[c], carried[r * ncols + c])
                        for r in range(nrows) for c in range(ncols)])
        for r in range(nrows):
            for c in range(ncols):
                total = self.tree_sum(kloop.results[r * ncols + c])
                tail = scf.ForOp(vector_k, k_extent, self.cidx(1), [total])
                with ir.InsertionPoint(tail.body):
                    k = tail.induction_variable
                    prod = arith.mulf(self.load(a, [arith.addi(row, self.cidx(r)), k]),
                                      self.load(b, [cols[c], k]))
                    scf.yield_([arith.addf(tail.inner_iter_args[0], prod)])
                self.store(tail.results[0], self.op.result,
                           [arith.addi(row, self.cidx(r)), cols[c]])


def filling_tile(op, target, n: int, widths: list) -> tuple:
    """The tile with the widest of `widths` (widest first) whose N / width
    column tiles still give every SM of the chip one at B = 1, else the
    narrowest; the front end's tile when no width fits."""
    if not widths:
        return op.tile
    enough = [tn for tn in widths if n // tn >= target.sm_count]
    return (op.tile[0], enough[0] if enough else widths[-1])


class MatmulSkinny(Matmul):
    """GPU matmul tile for few rows (decode): C = A @ B with B (K, N).

    Lanes: a row segment of the tile's `tn` columns is P = tn / VEC lanes,
    each loading VEC columns (16 bytes) of a row of B at a time; the other
    lanes split K: G = lanes / P groups, group g taking the chunks of VEC
    rows g, g + G, ... (each weight byte is read once per tile, by one lane,
    with VEC 16-byte loads in flight per chunk). A pass handles up to RB rows
    of A, one vector accumulator per row; a tile of more rows takes several
    passes (the second reads B from L2). After the K loop the GW groups of a
    warp are combined with shuffles (`lane_reduce`, stride P), the warps'
    partials through scratch memory, and the lanes then store C.
    """

    #: Rows of A per pass (vector accumulators per lane).
    RB = 4

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv"

    @staticmethod
    def vec(op) -> int:
        """Elements of A and B in 16 bytes."""
        return 16 // (4 if op.operands[0].dtype == "f32" else 2)

    @classmethod
    def applies(cls, op, target) -> bool:
        a, b = op.operands[:2]
        vec = cls.vec(op)
        k, n = b.shape
        tn = op.tile[1]
        threads = tn // vec
        return (target.gpu_kernels and not op.params["transpose_b"]
                and isinstance(k, int) and isinstance(n, int)
                and k % vec == 0 and n % tn == 0 and tn % vec == 0
                and 1 <= threads <= target.warp and target.warp % threads == 0)

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Rows as the front end tiles them; columns so that the column
        tiles alone give every SM work at one row block (B = 1), at least
        two lanes per row segment (a 32-byte sector) and at most 128."""
        a, b = op.operands[:2]
        n = b.shape[1]
        vec = cls.vec(op)
        if not isinstance(n, int):
            return op.tile
        return filling_tile(op, target, n, [tn for tn in (128, 64, 32, 16, 8) if tn >= 2 * vec
                                            and n % tn == 0 and tn // vec <= target.warp])

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands[:2]
        tn = op.tile[1]
        vec = self.vec(op)
        lanes = self.lanes()
        threads = tn // vec                 # P: lanes per row segment
        groups = lanes.count // threads     # G: K groups
        per_warp = lanes.warp // threads    # GW: K groups of one warp
        warps = lanes.count // lanes.warp
        k_chunks = b.shape[0] // vec
        rb = self.RB
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        partials = self.scratch([warps, rb, tn])
        with self.row_passes(rb) as (first, in_pass, row_of):

            def accumulate(lane):
                p = arith.remui(lane, self.cidx(threads))
                g = arith.divui(lane, self.cidx(threads))
                col = arith.addi(c0, arith.muli(p, self.cidx(vec)))
                accs = [self.vzero(vec) for _ in range(rb)]
                kloop = scf.ForOp(g, self.cidx(k_chunks), self.cidx(groups), accs)
                with ir.InsertionPoint(kloop.body):
                    k0 = arith.muli(kloop.induction_variable, self.cidx(vec))
                    panel = [self.vload(b, [arith.addi(k0, self.cidx(i)), col], vec,
                                        aligned=True) for i in range(vec)]
                    carried = list(kloop.inner_iter_args)
                    updated = []
                    for r in range(rb):
                        xs = self.vload(a, [row_of[r], k0], vec, aligned=True)
                        acc = carried[r]
                        for i in range(vec):
                            x_i = self.vsplat(vector.extract(xs, [], [i]), vec)
                            acc = vector.fma(x_i, panel[i], acc)
                        updated.append(acc)
                    scf.yield_(updated)
                return list(kloop.results)

            summed = lanes.reduce(lanes.each(accumulate), "add", per_warp, threads)

            def publish(lane):
                # The first K group of each warp holds its warp's sums.
                g = arith.divui(lane, self.cidx(threads))
                first_of_warp = arith.cmpi(arith.CmpIPredicate.eq,
                                           arith.remui(g, self.cidx(per_warp)), self.cidx(0))
                branch = scf.IfOp(first_of_warp)
                with ir.InsertionPoint(branch.then_block):
                    w = arith.divui(lane, self.cidx(lanes.warp))
                    col = arith.muli(arith.remui(lane, self.cidx(threads)), self.cidx(vec))
                    for r, acc in enumerate(lanes.get(summed, lane)):
                        vector.store(acc, partials, [w, self.cidx(r), col])
                    scf.yield_([])
            lanes.each(publish)
            lanes.barrier()

            def store(lane):
                count = arith.muli(in_pass, self.cidx(tn))
                outputs = scf.ForOp(lane, count, self.cidx(lanes.count))
                with ir.InsertionPoint(outputs.body):
                    e = outputs.induction_variable
                    r = arith.divui(e, self.cidx(tn))
                    c = arith.remui(e, self.cidx(tn))
                    total = memref.load(partials, [self.cidx(0), r, c])
                    for w in range(1, warps):
                        total = arith.addf(total, memref.load(partials, [self.cidx(w), r, c]))
                    self.store(total, out, [arith.addi(first, r), arith.addi(c0, c)])
                    scf.yield_([])
            lanes.each(store)
            # The next pass writes the partials again.
            lanes.barrier()


class MatmulSkinnyT(Matmul):
    """GPU matmul tile for few rows with B transposed (decode GEMV over
    Hugging Face weights, stored (N, K)): C = A @ B^T.

    Both operands are contiguous along K, so a warp owns RW rows of B^T at
    a time (RW = min(MAX_RW, columns per warp)) and its 32 lanes split K in
    16-byte chunks: an iteration takes U = LOADS / RW chunks per lane (lane
    l: chunks l, l + 32, ..., U apart by 32), so each warp load instruction
    reads 512 contiguous bytes of a weight row and a lane has LOADS weight
    loads (128 bytes; 16 KB per 4-warp CTA) in flight. The K loop is
    software-pipelined: each iteration issues the next iteration's loads
    (carried in registers, in their storage type) before this one's
    multiply-adds, so the loads stay in flight while the FMAs run. Every
    weight byte is read once per tile, by one lane. A pass handles up to RB
    rows of A, and a tile of one row (B = 1) takes a one-row pass, which
    neither loads nor multiplies copies of that row; each (row of B^T, row
    of A) pair accumulates into one f32 per lane with fused multiply-adds,
    which the warp then sums (`lane_reduce`, 32 lanes, stride 1); lane 0
    stores. The warps take the tile's row groups round-robin; no scratch
    memory and no CTA barrier.

    A chunk past K (the last iterations when K / 16 bytes is not a multiple
    of 32 U) re-reads the last chunk and its products are discarded: the
    loads stay unconditional, so they can all be in flight together.
    """

    #: Rows of A per pass (tiles of more than one row).
    RB = 4
    #: Rows of B^T (columns of C) per warp iteration, at most.
    MAX_RW = 4
    #: 16-byte weight loads per lane and iteration.
    LOADS = 8

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_t"

    @classmethod
    def rows_per_warp(cls, tn: int, warps: int) -> int:
        """Rows of B^T a warp takes at a time in a tile `tn` columns wide."""
        return max(1, min(cls.MAX_RW, tn // warps))

    @classmethod
    def applies(cls, op, target) -> bool:
        n, k = op.operands[1].shape
        vec = MatmulSkinny.vec(op)
        tn = op.tile[1]
        warps = target.lanes // target.warp if target.warp else 0
        return (target.gpu_kernels and op.params["transpose_b"]
                and isinstance(k, int) and isinstance(n, int) and warps >= 1
                and k % vec == 0 and n % tn == 0
                and tn % (warps * cls.rows_per_warp(tn, warps)) == 0)

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Columns per tile: the largest that still gives every SM a tile at
        one row block (B = 1), each warp taking at least one row of B^T."""
        n = op.operands[1].shape[0]
        if not isinstance(n, int) or not target.warp:
            return op.tile
        warps = target.lanes // target.warp
        return filling_tile(op, target, n, [
            tn for tn in (128, 64, 32, 16, 8)
            if tn % (warps * cls.rows_per_warp(tn, warps)) == 0 and n % tn == 0])

    def emit(self) -> None:
        r0, rows = self.row_block(self.op.result, self.op.tile[0])
        one = arith.cmpi(arith.CmpIPredicate.eq, rows, self.cidx(1))
        branch = scf.IfOp(one, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.emit_passes(1)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            self.emit_passes(self.RB)
            scf.yield_([])

    def emit_passes(self, rb: int) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands[:2]
        tn = op.tile[1]
        vec = MatmulSkinny.vec(op)
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        rw = self.rows_per_warp(tn, warps)
        unroll = max(1, self.LOADS // rw)
        groups = tn // (warps * rw)          # row groups of B^T per warp
        k_chunks = b.shape[1] // vec
        last_chunk = self.cidx(k_chunks - 1)
        stride = self.cidx(lanes.warp * unroll)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        with self.row_passes(rb) as (first, in_pass, row_of):
            group_loop = scf.ForOp(self.cidx(0), self.cidx(groups), self.cidx(1))
            with ir.InsertionPoint(group_loop.body):
                group = group_loop.induction_variable

                def columns(lane):
                    # Warp w takes rows [c0 + (group * warps + w) * RW, + RW) of B^T.
                    w = arith.divui(lane, self.cidx(lanes.warp))
                    base = arith.addi(c0, arith.muli(
                        arith.addi(arith.muli(group, self.cidx(warps)), w), self.cidx(rw)))
                    return [arith.addi(base, self.cidx(j)) for j in range(rw)]

                def accumulate(lane):
                    cols = columns(lane)
                    part = arith.remui(lane, self.cidx(lanes.warp))

                    # Carried in their storage type on the GPU; as f32
                    # when simulated (x86 code would round a bf16 value
                    # carried across iterations through a library call).
                    raw = not self.target.simulate_lanes

                    def load(chunk) -> list:
                        """The weight and A vectors of an iteration's chunks
                        (clamped into K)."""
                        values = []
                        for u in range(unroll):
                            c = arith.minsi(arith.addi(chunk, self.cidx(u * lanes.warp)),
                                            last_chunk)
                            k0 = arith.muli(c, self.cidx(vec))
                            values += [self.vload(b, [col, k0], vec, aligned=True, widen=not raw)
                                       for col in cols]
                            values += [self.vload(a, [row_of[r], k0], vec, aligned=True,
                                                  widen=not raw) for r in range(rb)]
                        return values

                    accs = [self.cf32(0.0) for _ in range(rw * rb)]
                    loaded = load(part)
                    kloop = scf.ForOp(part, self.cidx(k_chunks), stride, accs + loaded)
                    with ir.InsertionPoint(kloop.body):
                        chunk = kloop.induction_variable
                        carried = list(kloop.inner_iter_args)
                        updated, current = carried[:len(accs)], carried[len(accs):]
                        # The next iteration's loads first (past K they
                        # re-read the last chunk, unused).
                        upcoming = load(arith.addi(chunk, stride))
                        per = rw + rb
                        for u in range(unroll):
                            weights = [self.widen(v, b) for v in current[u * per:u * per + rw]]
                            xs = [self.widen(v, a) for v in current[u * per + rw:(u + 1) * per]]
                            valid = None
                            if u:
                                valid = arith.cmpi(arith.CmpIPredicate.slt, arith.addi(
                                    chunk, self.cidx(u * lanes.warp)), self.cidx(k_chunks))
                            for j in range(rw):
                                for r in range(rb):
                                    acc = updated[j * rb + r]
                                    summed = acc
                                    for i in range(vec):
                                        summed = math_dialect.fma(
                                            vector.extract(xs[r], [], [i]),
                                            vector.extract(weights[j], [], [i]), summed)
                                    updated[j * rb + r] = (
                                        summed if valid is None
                                        else arith.select(valid, summed, acc))
                        scf.yield_(updated + upcoming)
                    return list(kloop.results)[:len(accs)]

                summed = lanes.reduce(lanes.each(accumulate), "add", lanes.warp, 1)

                def store(lane):
                    leader = arith.cmpi(arith.CmpIPredicate.eq,
                                        arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                    branch = scf.IfOp(leader)
                    with ir.InsertionPoint(branch.then_block):
                        cols = columns(lane)
                        totals = lanes.get(summed, lane)
                        for r in range(rb):
                            real = arith.cmpi(arith.CmpIPredicate.slt, self.cidx(r), in_pass)
                            inner = scf.IfOp(real)
                            with ir.InsertionPoint(inner.then_block):
                                for j in range(rw):
                                    self.store(totals[j * rb + r], out,
                                               [arith.addi(first, self.cidx(r)), cols[j]])
                                scf.yield_([])
                        scf.yield_([])
                lanes.each(store)
                scf.yield_([])


class MatmulMMASkinny(MatmulMMA, MatmulSkinny):
    """Symbolic rows, B (K, N): tensor cores for tiles of 16 rows or more,
    `MatmulSkinny`'s split-K GEMV for fewer."""

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_mma"

    def narrow(self) -> None:
        MatmulSkinny.emit(self)


class MatmulMMASkinnyT(MatmulMMA, MatmulSkinnyT):
    """Symbolic rows, B^T (N, K): tensor cores for tiles of 16 rows or more,
    `MatmulSkinnyT`'s GEMV for fewer."""

    @classmethod
    def name(cls, op) -> str:
        return "matmul_gemv_t_mma"

    def narrow(self) -> None:
        MatmulSkinnyT.emit(self)


def choose_kernel(op, target) -> type:
    """The matmul kernel for `op` on `target`."""
    if target.kind == "cpu" and MatmulCPU.applies(op):
        return MatmulCPU
    if MatmulMMA.applies(op, target):
        if isinstance(op.operands[0].shape[0], int):
            return MatmulMMA
        # Symbolic rows: only with a GEMV for the tiles of few rows.
        if op.params["transpose_b"]:
            if MatmulSkinnyT.applies(op, target):
                return MatmulMMASkinnyT
        elif MatmulSkinny.applies(op, target):
            return MatmulMMASkinny
    if MatmulSkinny.applies(op, target):
        return MatmulSkinny
    if MatmulSkinnyT.applies(op, target):
        return MatmulSkinnyT
    return Matmul


def build_tasks(b: TaskBuilder, op) -> None:
    if b.target.kind == "cpu" and not op.user_tile:
        op = dataclasses.replace(op, tile=MatmulCPU.tile_for(op, b.target))
    elif b.target.gpu_kernels and not op.user_tile:
        # Known rows of 16 or more: tiles for the tensor cores. Otherwise
        # the GEMV's (decode first), which the tensor cores also take.
        wide = dataclasses.replace(op, tile=MatmulMMA.tile_for(op, b.target))
        if isinstance(op.operands[0].shape[0], int) and MatmulMMA.applies(wide, b.target):
            op = wide
        else:
            chooser = MatmulSkinnyT if op.params["transpose_b"] else MatmulSkinny
            op = dataclasses.replace(op, tile=chooser.tile_for(op, b.target))
    a, w = op.operands[:2]
    res = op.result
    tm, tn = op.tile
    reads = [(a, box(2, [tile_offset(0, tm), "0"], [tm, None]))]
    if op.params["transpose_b"]:
        reads.append((w, box(2, [tile_offset(1, tn), "0"], [tn, None])))
    else:
        reads.append((w, box(2, ["0", tile_offset(1, tn)], [None, tn])))
    writes = [(res, box(2, [tile_offset(0, tm), tile_offset(1, tn)], [tm, tn]))]
    if len(op.operands) == 3:  # the residual: the tile's own elements
        reads.append((op.operands[2], writes[0][1]))
    grid = [b.grid_extent(res.shape[0], tm), b.grid_extent(res.shape[1], tn)]
    b.emit_task(op, op.name, grid, reads, writes, choose_kernel(op, b.target))
