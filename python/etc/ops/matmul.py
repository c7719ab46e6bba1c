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
  end. Partial edge tiles (columns past N) take the scalar path;
* cuda, f16 and bf16 with K a multiple of 16 and at least 16 rows (or
  symbolic rows): tensor cores (`MatmulMMA`: cp.async staging in shared
  memory, mma.sync m16n8k16), whose tiles of fewer than 16 rows run the
  split-K path of
* cuda, other few-row matmuls of B (K, N): split-K GEMV (`MatmulSkinny`);
* cuda, the rest: the generic kernel.
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import arith, memref, nvgpu, scf, vector

from ..dialects import event
from . import mma
from .base import TaskBuilder, TileKernel, box, element_type, tile_offset

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
        a, b = op.operands
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
        a, b = op.operands
        n = b.shape[1]
        vec = cls.vec(op)
        if not isinstance(n, int):
            return op.tile
        candidates = [tn for tn in (128, 64, 32, 16, 8)
                      if tn >= 2 * vec and n % tn == 0 and tn // vec <= target.warp]
        if not candidates:
            return op.tile
        enough = [tn for tn in candidates if n // tn >= target.sm_count]
        return (op.tile[0], enough[0] if enough else candidates[-1])

    def emit(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands
        tm, tn = op.tile
        vec = self.vec(op)
        lanes = self.lanes()
        threads = tn // vec                 # P: lanes per row segment
        groups = lanes.count // threads     # G: K groups
        per_warp = lanes.warp // threads    # GW: K groups of one warp
        warps = lanes.count // lanes.warp
        k_chunks = b.shape[0] // vec
        rb = self.RB
        r0 = arith.muli(self.ti[0], self.cidx(tm))
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        rows = self.extent(out, 0, r0, tm)
        last_row = arith.subi(self.dim(a, 0), self.cidx(1))
        partials = self.scratch([warps, rb, tn])
        passes = arith.divui(arith.addi(rows, self.cidx(rb - 1)), self.cidx(rb))
        loop = scf.ForOp(self.cidx(0), passes, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            first = arith.addi(r0, arith.muli(loop.induction_variable, self.cidx(rb)))
            in_pass = arith.minsi(self.cidx(rb), arith.subi(arith.addi(r0, rows), first))
            # Rows past the tile compute copies of the last row; only real
            # rows are stored.
            row_of = [arith.minsi(arith.addi(first, self.cidx(r)), last_row) for r in range(rb)]

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
            scf.yield_([])


class MatmulMMA(MatmulSkinny):
    """Tensor-core matmul tile for the CUDA target: C = A @ B or A @ B^T,
    f16 or bf16 operands, f32 accumulators (`mma.sync` m16n8k16, sm_80+).

    Warps: the CTA's W = lanes / 32 warps form a WM x WN grid over the
    tm x tn tile (WM = gcd(W, tm / 16)); each warp owns MI x NI blocks of
    16 x 8 outputs (MI = tm / 16 WM, NI = tn / 8 WN), 4 MI NI f32 registers
    per lane laid out as `mma` says.

    Staging: K goes in steps of BK (32, or 16 where K is not a multiple of
    32). The A rows of the tile and the B columns of a step are copied to
    shared memory in 16-byte chunks spread over all lanes, with `cp.async`
    on the GPU (a plain copy when simulated), into one of two buffers: the
    copy of step s + 1 is in flight while the warps multiply step s. A's
    rows past the matrix read its last row (computed, never stored); rows of
    shared memory are padded by PAD elements so that the lanes of a warp
    reading a fragment fall in different banks (80-byte rows for BK = 32:
    the eight rows of an `ldmatrix` matrix start on eight different 4-bank
    groups). Each warp then loads its A and B fragments from shared memory
    with `ldmatrix` (x4 per A block, x4 per two B blocks, transposed for
    B (K, N)) for each 16-wide slice of the step and issues MI NI
    multiplies.

    Rows are symbolic in LLM graphs (the batch): a tile with fewer than
    MIN_ROWS rows then takes `MatmulSkinny`'s split-K path (or the scalar
    one for B^T), decided per tile at run time, so one kernel serves decode
    and prefill. Needs K a multiple of 16 and N of the tile's columns.
    """

    #: Elements after each row of a shared-memory tile (16 bytes).
    PAD = 8
    #: Fewest rows of a tile for which the tensor-core path runs.
    MIN_ROWS = 16

    @classmethod
    def name(cls, op) -> str:
        return "matmul_mma"

    @staticmethod
    def k_step(op) -> int:
        """BK: K of A and B staged per step."""
        return 32 if op.operands[0].shape[1] % 32 == 0 else mma.K

    @staticmethod
    def warp_grid(tile: tuple, target) -> tuple:
        """(WM, WN): how the CTA's warps split the tile's rows and columns.
        A tile too small for every warp leaves some without blocks of their
        own: they repeat the multiplies of warp w mod WM WN and store
        nothing."""
        tm, tn = tile
        warps = target.lanes // target.warp
        rows = math.gcd(warps, max(tm // mma.M, 1))
        return rows, math.gcd(warps // rows, max(tn // mma.N, 1))

    @staticmethod
    def columns(op) -> object:
        b = op.operands[1]
        return b.shape[0] if op.params["transpose_b"] else b.shape[1]

    @classmethod
    def applies(cls, op, target) -> bool:
        a = op.operands[0]
        m, k = a.shape
        n = cls.columns(op)
        tm, tn = op.tile
        # mma.sync m16n8k16 with bf16, cp.async and ldmatrix need sm_80.
        if not (target.gpu_kernels and target.compute_capability >= 80
                and target.warp == mma.WARP and target.lanes % target.warp == 0
                and a.dtype in ("f16", "bf16")):
            return False
        if not (isinstance(k, int) and isinstance(n, int) and k % mma.K == 0
                and n % tn == 0 and tn % mma.N == 0 and tm % mma.M == 0):
            return False
        return not (isinstance(m, int) and m < cls.MIN_ROWS)

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Rows as the front end tiles them (a multiple of 16); the widest
        columns (at most 128, 16 bytes per lane of a warp in the skinny path)
        that still give every SM a tile: over the row tiles when rows are
        known, else at one row block (decode, where the skinny path runs)."""
        m = op.operands[0].shape[0]
        n = cls.columns(op)
        # Whole warp multiplies: a row tile clamped to a small matrix (23
        # rows) grows back to 32, still one tile.
        tm = -(-op.tile[0] // mma.M) * mma.M
        if not isinstance(n, int):
            return op.tile
        vec = cls.vec(op)
        candidates = [tn for tn in (128, 64, 32, 16) if n % tn == 0 and tn // vec <= target.warp]
        if not candidates:
            return op.tile
        row_tiles = -(-m // tm) if isinstance(m, int) else 1
        enough = [tn for tn in candidates if row_tiles * (n // tn) >= target.sm_count]
        return (tm, enough[0] if enough else candidates[-1])

    def emit(self) -> None:
        op = self.op
        if isinstance(op.operands[0].shape[0], int):
            self.emit_mma()
            return
        r0 = arith.muli(self.ti[0], self.cidx(op.tile[0]))
        rows = self.extent(op.result, 0, r0, op.tile[0])
        wide = arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(self.MIN_ROWS))
        branch = scf.IfOp(wide, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.emit_mma()
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            if MatmulSkinny.applies(op, self.target):
                MatmulSkinny.emit(self)
            else:
                Matmul.emit(self)
            scf.yield_([])

    def emit_mma(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands
        tm, tn = op.tile
        bk = self.k_step(op)
        lanes = self.lanes()
        self.wm, self.wn = self.warp_grid(op.tile, self.target)
        self.mi, self.ni = tm // (mma.M * self.wm), tn // (mma.N * self.wn)
        steps = a.shape[1] // bk
        self.r0 = arith.muli(self.ti[0], self.cidx(tm))
        self.c0 = arith.muli(self.ti[1], self.cidx(tn))
        rows = self.extent(out, 0, self.r0, tm)
        self.a_tile = self.scratch([2, tm, bk + self.PAD], a.dtype)
        self.b_tile = self.scratch([2, tn, bk + self.PAD] if op.params["transpose_b"]
                                   else [2, bk, tn + self.PAD], b.dtype)
        if not lanes.simulate:
            self.a_shared, self.b_shared = (_workgroup(t) for t in (self.a_tile, self.b_tile))
        blocks = self.mi * self.ni
        if lanes.simulate:
            # Per-lane registers live in arrays: accumulators, and the A and
            # B fragments of the slice being multiplied (widened to f32).
            self.acc = self.entry_alloca(ir.MemRefType.get(
                [lanes.count, blocks * mma.C_VALUES], self.f32))
            self.registers = self.entry_alloca(ir.MemRefType.get(
                [lanes.count, 2 * (self.mi * mma.A_REGS + self.ni * mma.B_REGS)], self.f32))
            # Each lane's row address (row, column) of each ldmatrix.
            self.addresses = self.entry_alloca(ir.MemRefType.get(
                [lanes.count, self.mi + (self.ni + 1) // 2, 2], self.index))

            def clear(lane):
                for slot in range(blocks * mma.C_VALUES):
                    memref.store(self.cf32(0.0), self.acc, [lane, self.cidx(slot)])
            lanes.each(clear)
            init = []
        else:
            init = [self.cf32(0.0)] * (blocks * mma.C_VALUES)
        self.stage(lanes, self.cidx(0), self.cidx(0), bk)
        if not lanes.simulate:
            # Step 0 in a group of its own: were step 1's copies in it too,
            # the first `wait_group 1` would wait for neither.
            nvgpu.device_async_create_group([])
        loop = scf.ForOp(self.cidx(0), self.cidx(steps), self.cidx(1), init)
        with ir.InsertionPoint(loop.body):
            s = loop.induction_variable
            following = arith.addi(s, self.cidx(1))
            prefetch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, following, self.cidx(steps)))
            with ir.InsertionPoint(prefetch.then_block):
                self.stage(lanes, arith.remui(following, self.cidx(2)),
                           arith.muli(following, self.cidx(bk)), bk)
                scf.yield_([])
            if not lanes.simulate:
                # One group per step (empty after the last), so that waiting
                # for all but the newest group waits for step s.
                group = nvgpu.device_async_create_group([])
                nvgpu.device_async_wait(group, num_groups=1)
            lanes.barrier()
            buffer = arith.remui(s, self.cidx(2))
            accs = list(loop.inner_iter_args)
            for slice_ in range(bk // mma.K):
                accs = self.multiply(lanes, buffer, slice_ * mma.K, accs)
            # The next step's copy overwrites this buffer.
            lanes.barrier()
            scf.yield_(accs)
        self.write_back(lanes, list(loop.results), arith.addi(self.r0, rows))

    def stage(self, lanes, buffer, k0, bk: int) -> None:
        """Copies A[rows of the tile, k0 : k0 + bk] and B's columns of the
        tile over the same K into shared buffer `buffer`, 16 bytes per copy,
        the copies spread over the lanes."""
        a, b = self.op.operands
        tm, tn = self.op.tile
        last_row = arith.subi(self.dim(a, 0), self.cidx(1))
        per_row = bk // 8

        def a_chunk(c):
            row = arith.divui(c, self.cidx(per_row))
            col = arith.muli(arith.remui(c, self.cidx(per_row)), self.cidx(8))
            src = [arith.minsi(arith.addi(self.r0, row), last_row), arith.addi(k0, col)]
            return src, [buffer, row, col]

        def b_chunk(c):
            if self.op.params["transpose_b"]:
                n = arith.divui(c, self.cidx(per_row))
                col = arith.muli(arith.remui(c, self.cidx(per_row)), self.cidx(8))
                return [arith.addi(self.c0, n), arith.addi(k0, col)], [buffer, n, col]
            k = arith.divui(c, self.cidx(tn // 8))
            col = arith.muli(arith.remui(c, self.cidx(tn // 8)), self.cidx(8))
            return [arith.addi(k0, k), arith.addi(self.c0, col)], [buffer, k, col]

        copies = [(a, self.a_tile, tm * per_row, a_chunk),
                  (b, self.b_tile, tn * per_row, b_chunk)]

        def body(lane):
            for tensor, tile, chunks, where in copies:
                for j in range(-(-chunks // lanes.count)):
                    c = arith.addi(lane, self.cidx(j * lanes.count))
                    if (j + 1) * lanes.count <= chunks:
                        self.copy16(lanes, tensor, tile, *where(c))
                        continue
                    guard = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, c, self.cidx(chunks)))
                    with ir.InsertionPoint(guard.then_block):
                        self.copy16(lanes, tensor, tile, *where(c))
                        scf.yield_([])
        lanes.each(body)

    def copy16(self, lanes, tensor, tile, src: list, dst: list) -> None:
        """8 elements (16 bytes) from `tensor` at `src` to shared `tile` at `dst`."""
        if lanes.simulate:
            storage = ir.VectorType.get([8], element_type(tensor.dtype))
            vector.store(vector.load(storage, self.buf(tensor), src), tile, dst)
            return
        shared = self.a_shared if tile is self.a_tile else self.b_shared
        nvgpu.device_async_copy(shared, dst, self.buf(tensor), src,
                                ir.IntegerAttr.get(self.index, 8), bypass_l1=True)

    def warp_block(self, lane) -> tuple:
        """(groupID, threadID_in_group, first row, first column in the tile,
        whether the warp stores) of a lane's warp."""
        warp, group, thread = mma.lane_in_warp(self, lane)
        active = self.wm * self.wn
        stores = None
        if active < self.lanes().count // mma.WARP:
            stores = arith.cmpi(arith.CmpIPredicate.ult, warp, self.cidx(active))
            warp = arith.remui(warp, self.cidx(active))
        first_row = arith.muli(arith.divui(warp, self.cidx(self.wn)),
                               self.cidx(self.mi * mma.M))
        first_col = arith.muli(arith.remui(warp, self.cidx(self.wn)),
                               self.cidx(self.ni * mma.N))
        return group, thread, first_row, first_col, stores

    def matrix_loads(self, lane, k0: int) -> list:
        """The `ldmatrix` loads that give a lane's warp its fragments of the
        slice k0 : k0 + 16: (shared tile, matrices, transposed, the lane's
        row address in the tile without the buffer index, register slots).

        A block of MI is four 8 x 8 matrices, register r = the matrix at
        rows 8 (r % 2), columns 8 (r / 2). Two blocks of NI are four matrices
        (one, the last, when NI is odd: two), register r of block j + m / 2
        = matrix m: K rows 8 (m % 2); B (K, N) is stored K-major, so its
        matrices are loaded transposed. Register slots number A's registers
        from 0 and B's after them, two values each (see `mma.emulate`)."""
        _, _, first_row, first_col, _ = self.warp_block(lane)
        matrix, row = mma.ldmatrix_lane(self, lane)
        high = arith.remui(matrix, self.cidx(2))   # the second 8 rows (A) or K (B)
        right = arith.divui(matrix, self.cidx(2))  # the second 8 columns (A) or block (B)
        loads = []
        for i in range(self.mi):
            address = [arith.addi(first_row, arith.addi(
                           arith.muli(high, self.cidx(8)), arith.addi(row, self.cidx(i * mma.M)))),
                       arith.addi(arith.muli(right, self.cidx(8)), self.cidx(k0))]
            slots = [2 * (i * mma.A_REGS + r) for r in range(mma.A_REGS)]
            loads.append((self.a_tile, mma.A_REGS, False, address, slots))
        b_base = 2 * self.mi * mma.A_REGS
        transposed = self.op.params["transpose_b"]
        for j in range(0, self.ni, 2):
            count = 4 if j + 1 < self.ni else 2
            column = arith.addi(first_col, arith.muli(arith.addi(right, self.cidx(j)),
                                                      self.cidx(mma.N)))
            k = arith.addi(arith.muli(high, self.cidx(8)), self.cidx(k0))
            address = ([arith.addi(column, row), k] if transposed
                       else [arith.addi(k, row), column])
            slots = [b_base + 2 * ((j + m // 2) * mma.B_REGS + m % 2) for m in range(count)]
            loads.append((self.b_tile, count, not transposed, address, slots))
        return loads

    def multiply(self, lanes, buffer, k0: int, accs: list) -> list:
        """Every warp's MI x NI multiplies of one 16-wide slice of K."""
        b_base = 2 * self.mi * mma.A_REGS
        if not lanes.simulate:
            lane = event.lane_id()
            registers = {}
            for tile, count, transpose, address, slots in self.matrix_loads(lane, k0):
                shared = self.a_shared if tile is self.a_tile else self.b_shared
                values = mma.ldmatrix(shared, [buffer, *address], count, transpose)
                registers.update(zip(slots, values))
            out = []
            for i in range(self.mi):
                a_regs = [registers[2 * (i * mma.A_REGS + r)] for r in range(mma.A_REGS)]
                for j in range(self.ni):
                    b_regs = [registers[b_base + 2 * (j * mma.B_REGS + r)]
                              for r in range(mma.B_REGS)]
                    at = (i * self.ni + j) * mma.C_VALUES
                    out += mma.mma(a_regs, b_regs, accs[at:at + mma.C_VALUES])
            return out

        # Simulated: every lane's row addresses, then every lane's registers
        # from the rows of the lanes `ldmatrix` takes them from, then the
        # multiplies.
        def addresses(lane):
            for n, (_, _, _, address, _) in enumerate(self.matrix_loads(lane, k0)):
                for d, value in enumerate(address):
                    memref.store(value, self.addresses, [lane, self.cidx(n), self.cidx(d)])
        lanes.each(addresses)

        def load(lane):
            for n, (tile, count, transpose, _, slots) in enumerate(self.matrix_loads(lane, k0)):
                mma.emulate_ldmatrix(self, lane, tile, buffer, self.addresses, n, count,
                                     transpose, self.registers, slots)
        lanes.each(load)

        def multiply(lane):
            for i in range(self.mi):
                for j in range(self.ni):
                    mma.emulate(self, lane, self.registers, 2 * i * mma.A_REGS,
                                b_base + 2 * j * mma.B_REGS, self.acc,
                                (i * self.ni + j) * mma.C_VALUES)
        lanes.each(multiply)
        return []

    def write_back(self, lanes, accs: list, row_end) -> None:
        """Each lane stores its C elements (two adjacent columns at a time),
        rows past the matrix skipped."""
        out = self.op.result

        def body(lane):
            group, thread, first_row, first_col, stores = self.warp_block(lane)
            first_row = arith.addi(self.r0, first_row)
            first_col = arith.addi(self.c0, first_col)
            for i in range(self.mi):
                for j in range(self.ni):
                    block = i * self.ni + j
                    for half in range(2):
                        row, col = mma.fragment_c(self, group, thread, half)
                        row = arith.addi(first_row, arith.addi(row, self.cidx(i * mma.M)))
                        col = arith.addi(first_col, arith.addi(col, self.cidx(j * mma.N)))
                        if lanes.simulate:
                            value = vector.load(self.vtype(2), self.acc,
                                                [lane, self.cidx(block * mma.C_VALUES + 2 * half)])
                        else:
                            at = block * mma.C_VALUES + 2 * half
                            value = vector.from_elements(self.vtype(2), accs[at:at + 2])
                        inside = arith.cmpi(arith.CmpIPredicate.ult, row, row_end)
                        if stores is not None:
                            inside = arith.andi(inside, stores)
                        inside = scf.IfOp(inside)
                        with ir.InsertionPoint(inside.then_block):
                            self.vstore(value, out, [row, col], aligned=True)
                            scf.yield_([])
        lanes.each(body)


def _workgroup(buffer: ir.Value) -> ir.Value:
    """`buffer` (an `event.scratch`) in the GPU's shared address space, where
    `cp.async` writes."""
    type = ir.MemRefType(buffer.type)
    shared = ir.MemRefType.get(type.shape, type.element_type,
                               memory_space=ir.Attribute.parse("#gpu.address_space<workgroup>"))
    return memref.memory_space_cast(shared, buffer)


def choose_kernel(op, target) -> type:
    """The matmul kernel for `op` on `target`."""
    if target.kind == "cpu" and MatmulCPU.applies(op):
        return MatmulCPU
    if MatmulMMA.applies(op, target):
        return MatmulMMA
    if MatmulSkinny.applies(op, target):
        return MatmulSkinny
    return Matmul


def build_tasks(b: TaskBuilder, op) -> None:
    if b.target.gpu_kernels and not op.user_tile:
        wide = dataclasses.replace(op, tile=MatmulMMA.tile_for(op, b.target))
        if MatmulMMA.applies(wide, b.target):
            op = wide
        else:
            op = dataclasses.replace(op, tile=MatmulSkinny.tile_for(op, b.target))
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
