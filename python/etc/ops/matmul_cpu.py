"""The CPU target's matmul tile (`MatmulCPU`): register-blocked vector code
for C = A @ B and C = A @ B^T, and the tile width it picks so that every
worker gets the same number of column tiles.

The family module (`matmul.py`) chooses it on the CPU whenever the tile's
width is a multiple of its vector width (always for B^T); partial edge
tiles take the scalar path of its base (`matmul_scalar.Matmul`).
"""

from __future__ import annotations

from typing import Optional

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from .matmul_scalar import Matmul


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
            # left (all of them at decode) by the dot groups, summing as the
            # panels do (PANEL_WIDTH lanes): a row's result does not depend
            # on how many rows the step has (batching, speculative rows).
            groups = arith.divui(rows, self.cidx(self.PANEL_ROWS))
            paneled = arith.muli(groups, self.cidx(self.PANEL_ROWS))
            self.emit_panels(r0, groups, c0, cols, k_extent)
            left = arith.subi(rows, paneled)
            some = arith.cmpi(arith.CmpIPredicate.ugt, left, self.cidx(0))
            branch = scf.IfOp(some)
            with ir.InsertionPoint(branch.then_block):
                self.emit_transposed(arith.addi(r0, paneled), c0, left, cols, k_extent,
                                     self.PANEL_WIDTH)
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

    def emit_few(self, most: int) -> None:
        """`MatmulCPU.emit` for a tile that has at most `most` rows (those
        below a subclass's crossover: one at decode), emitting only the code
        such a tile can run. For C = A @ B^T and `most` under PANEL_ROWS no
        panel is full, so every row is one `emit` leaves to the dot groups
        after the panels (summed in PANEL_WIDTH lanes where K takes panels,
        as there), and no dot group has all ROWS rows: only those code
        paths are emitted. Other tiles take `MatmulCPU.emit` whole."""
        if not self.op.params["transpose_b"] or most >= min(self.PANEL_ROWS, self.ROWS):
            MatmulCPU.emit(self)
            return
        out = self.op.result
        tm, tn = self.op.tile
        r0, rows = self.row_block(out, tm)
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        cols = self.extent(out, 1, c0, tn)
        width = None if self.panel_k() is None else self.PANEL_WIDTH
        self.emit_transposed(r0, c0, rows, cols, self.dim(self.op.operands[0], 1), width,
                             most_rows=most)

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
            self.emit_transposed(r0, c0, arith.muli(groups, self.cidx(rows_n)), cols, k_extent,
                                 width)
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

    def emit_transposed(self, r0, c0, rows, cols, k_extent, width: Optional[int] = None,
                        most_rows: Optional[int] = None) -> None:
        """C = A @ B^T: each (row, column) is a dot product along k, where
        both operands are contiguous: vector partial sums over k in steps of
        `width` (default WIDTH), then a scalar tail and one reduction.
        Micro-tiles of ROWS x COLS outputs share each load. `most_rows`
        (below ROWS): `rows` is never more, and no code is emitted for a
        full group of ROWS rows (`emit_few`)."""
        width = width or self.WIDTH
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

            def partial() -> None:
                # Fewer than ROWS rows (decode) but all COLS columns: a row at
                # a time, its COLS dot products sharing each load of A (COLS
                # independent accumulators keep the FMA pipes busy).
                all_cols = arith.cmpi(arith.CmpIPredicate.eq, col_count, self.cidx(self.COLS))
                rows_only = scf.IfOp(all_cols, has_else=True)
                with ir.InsertionPoint(rows_only.then_block):
                    each_row = scf.ForOp(self.cidx(0), row_count, self.cidx(1))
                    with ir.InsertionPoint(each_row.body):
                        self.emit_dots(arith.addi(row, each_row.induction_variable), 1, col,
                                       self.COLS, vector_k, k_extent, step, width)
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
                                       vector_k, k_extent, width=width)
                        scf.yield_([])
                    scf.yield_([])

            if most_rows is not None and most_rows < self.ROWS:
                partial()
            else:
                full = arith.andi(
                    arith.cmpi(arith.CmpIPredicate.eq, row_count, self.cidx(self.ROWS)),
                    arith.cmpi(arith.CmpIPredicate.eq, col_count, self.cidx(self.COLS)))
                branch = scf.IfOp(full, has_else=True)
                with ir.InsertionPoint(branch.then_block):
                    self.emit_dots(row, self.ROWS, col, self.COLS, vector_k, k_extent, step,
                                   width)
                    scf.yield_([])
                with ir.InsertionPoint(branch.else_block):
                    partial()
                    scf.yield_([])
            scf.yield_([])

    def emit_dots(self, row, nrows: int, col, ncols: int, vector_k, k_extent,
                  step=None, width: Optional[int] = None) -> None:
        """C[row + r, col + c * step] for r < nrows, c < ncols (step 1 when
        None): dot products along k of A's rows and B^T's rows, in vectors
        of `width` lanes (default WIDTH; `vector_k` a multiple of it)."""
        a, b = self.op.operands[:2]
        width = width or self.WIDTH
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
