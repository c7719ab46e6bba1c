"""The CUDA target's matmul tiles for few rows (decode GEMV): `MatmulSkinny`
for B (K, N) and `MatmulSkinnyT` for B^T (N, K), the layout of Hugging Face
weights, with the column tiles that give every SM a tile at B = 1
(`filling_tile`).

Both read each weight byte once per tile with 16-byte loads and take the
tile's rows in passes of a few rows. The family module (`matmul.py`)
chooses them for the rows the tensor cores do not take, and pairs them
with the tensor-core tile (`matmul_mma.MatmulMMA`) for symbolic rows.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref, scf, vector
from mlir.dialects import math as math_dialect

from .matmul_scalar import Matmul


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
    stores. The warps take the tile's row groups round-robin (with warps
    that are not a power of two the last group is partial: its warps past
    the tile re-read the tile's first rows and store nothing); no scratch
    memory and no CTA barrier.

    A chunk past K (the last iterations when K / 16 bytes is not a multiple
    of 32 U) re-reads the last chunk and its products are discarded: the
    loads stay unconditional, so they can all be in flight together.

    N need not be a multiple of the tile (an LM head of 49,159 rows, Granite
    3.x's vocabulary): the last column tile is ragged, its rows of B^T past
    N re-read row N - 1 (the loads stay unconditional) and their sums are
    not stored. Where the tile divides N no such code is emitted.
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
        """Rows of B^T a warp takes at a time in a tile `tn` columns wide:
        the most, up to MAX_RW and tn / warps (at least 1), that divide tn."""
        rw = max(1, min(cls.MAX_RW, tn // warps))
        while tn % rw:
            rw -= 1
        return rw

    @classmethod
    def splits(cls, tn: int, warps: int) -> bool:
        """Whether the warps can share a tile `tn` columns wide: the first
        row group (warps x RW rows of B^T) fits in it. The last group is
        partial when warps x RW does not divide tn (warps that are not a
        power of two): its warps past the tile idle."""
        return warps * cls.rows_per_warp(tn, warps) <= tn

    @classmethod
    def applies(cls, op, target) -> bool:
        n, k = op.operands[1].shape
        vec = MatmulSkinny.vec(op)
        tn = op.tile[1]
        warps = target.lanes // target.warp if target.warp else 0
        return (target.gpu_kernels and op.params["transpose_b"]
                and isinstance(k, int) and isinstance(n, int) and warps >= 1
                and k % vec == 0 and cls.splits(tn, warps))

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """Columns per tile: the largest that still gives every SM a tile at
        one row block (B = 1), each warp taking at least one row of B^T;
        widths that divide N first, and where none does (an odd
        vocabulary) a ragged last tile."""
        n = op.operands[1].shape[0]
        if not isinstance(n, int) or not target.warp:
            return op.tile
        warps = target.lanes // target.warp
        widths = [tn for tn in (128, 64, 32, 16, 8) if cls.splits(tn, warps)]
        return filling_tile(op, target, n, [tn for tn in widths if n % tn == 0] or widths)

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
        out = self.op.result
        tn = self.op.tile[1]
        lanes = self.lanes()
        warps = lanes.count // lanes.warp
        rw = self.rows_per_warp(tn, warps)
        groups = -(-tn // (warps * rw))      # row groups of B^T per warp
        # Warps that are not a power of two: the last group is partial.
        ragged = tn % (warps * rw) != 0
        # N not a multiple of the tile: the last tile's rows past N.
        n = self.op.operands[1].shape[0]
        edge = n % tn != 0
        c0 = arith.muli(self.ti[1], self.cidx(tn))
        with self.row_passes(rb) as (first, in_pass, row_of):
            group_loop = scf.ForOp(self.cidx(0), self.cidx(groups), self.cidx(1))
            with ir.InsertionPoint(group_loop.body):
                group = group_loop.induction_variable

                def slot(lane):
                    """Warp w's RW rows of B^T in the tile: group * warps + w."""
                    w = arith.divui(lane, self.cidx(lanes.warp))
                    return arith.addi(arith.muli(group, self.cidx(warps)), w)

                def inside(lane):
                    return arith.cmpi(arith.CmpIPredicate.ult, slot(lane), self.cidx(tn // rw))

                def columns(lane):
                    # Warp w takes rows [c0 + slot * RW, + RW) of B^T; past
                    # the tile (a partial last group) the tile's first rows
                    # again, whose sums it does not store.
                    at = slot(lane)
                    if ragged:
                        at = arith.select(inside(lane), at, self.cidx(0))
                    base = arith.addi(c0, arith.muli(at, self.cidx(rw)))
                    return [arith.addi(base, self.cidx(j)) for j in range(rw)]

                def accumulate(lane):
                    cols = columns(lane)
                    if edge:
                        # Rows past N read row N - 1; their sums are not stored.
                        cols = [arith.minsi(col, self.cidx(n - 1)) for col in cols]
                    return self.lane_sums(lanes, cols,
                                          arith.remui(lane, self.cidx(lanes.warp)), row_of, rb)

                summed = lanes.reduce(lanes.each(accumulate), "add", lanes.warp, 1)

                def store(lane):
                    leader = arith.cmpi(arith.CmpIPredicate.eq,
                                        arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
                    if ragged:
                        leader = arith.andi(leader, inside(lane))
                    branch = scf.IfOp(leader)
                    with ir.InsertionPoint(branch.then_block):
                        cols = columns(lane)
                        totals = lanes.get(summed, lane)
                        for r in range(rb):
                            real = arith.cmpi(arith.CmpIPredicate.slt, self.cidx(r), in_pass)
                            inner = scf.IfOp(real)
                            with ir.InsertionPoint(inner.then_block):
                                for j in range(rw):
                                    self.store_within(edge, n, totals[j * rb + r], out,
                                                      arith.addi(first, self.cidx(r)), cols[j])
                                scf.yield_([])
                        scf.yield_([])
                lanes.each(store)
                scf.yield_([])

    def store_within(self, edge: bool, n: int, value: ir.Value, out, row, col) -> None:
        """Stores C[row, col]; with `edge` (N not a multiple of the tile)
        only where col < N."""
        if not edge:
            self.store(value, out, [row, col])
            return
        inside = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, col, self.cidx(n)))
        with ir.InsertionPoint(inside.then_block):
            self.store(value, out, [row, col])
            scf.yield_([])

    def lane_sums(self, lanes, cols: list, part, row_of: list, rb: int) -> list:
        """The partial dot products one lane adds up: for each row of B^T in
        `cols` and each of the `rb` rows of A in `row_of` (row of B^T major),
        the products over the K chunks lane `part` of its warp takes (see
        the class docstring)."""
        a, b = self.op.operands[:2]
        vec = MatmulSkinny.vec(self.op)
        rw = len(cols)
        unroll = max(1, self.LOADS // rw)
        k_chunks = b.shape[1] // vec
        last_chunk = self.cidx(k_chunks - 1)
        stride = self.cidx(lanes.warp * unroll)

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
