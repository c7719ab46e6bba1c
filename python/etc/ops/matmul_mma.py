"""The tensor-core matmul tile of the CUDA target (`MatmulMMA`): C = A @ B
or A @ B^T with f16 or bf16 operands and f32 accumulators, staged through
shared memory with `cp.async` and multiplied with `mma.sync` m16n8k16
(`etc.ops.mma` holds the warp-level instructions and their simulation).

The family module (`matmul.py`) chooses it for sm_80 and newer when the
shapes allow, and pairs it with a split-K GEMV for symbolic rows, whose
tiles of fewer than 16 rows (decode) run the GEMV.
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, memref, nvgpu, scf, vector

from ..dialects import event
from . import mma
from .base import ResidualStores, element_type


class MatmulMMA(ResidualStores):
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
    copy of step s + 1 is in flight while the warps multiply step s (one
    `cp.async` group per step; the last step's prefetch zero-fills). A's
    rows past the matrix read its last row (computed, never stored); rows of
    shared memory are padded by PAD elements so that the lanes of a warp
    reading a fragment fall in different banks (80-byte rows for BK = 32:
    the eight rows of an `ldmatrix` matrix start on eight different 4-bank
    groups). Each warp then loads its A and B fragments from shared memory
    with `ldmatrix` (x4 per A block, x4 per two B blocks, transposed for
    B (K, N)) for each 16-wide slice of the step and issues MI NI
    multiplies.

    Rows are symbolic in LLM graphs (the batch): a subclass that also
    derives from a kernel for few rows then runs that kernel's `emit` for
    tiles of fewer than MIN_ROWS rows (`narrow`), decided per tile at run
    time, so one kernel serves decode and prefill. Needs K a multiple of 16
    and N of the tile's columns.
    """

    #: Out of line on the GPU: the worker that calls every tile function
    #: already needs the 255 registers a thread may have (bf16 Llama-shaped
    #: steps), and inlining this body there made it spill; as its own
    #: function it spills nowhere.
    out_of_line_on_gpu = True

    grid_rank = 2

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
        """For known rows: rows as the front end tiles them (a multiple of
        16); the widest columns (at most 128) that still give every SM a
        tile."""
        m = op.operands[0].shape[0]
        n = cls.columns(op)
        if not isinstance(n, int) or not isinstance(m, int):
            return op.tile
        # Whole warp multiplies: a row tile clamped to a small matrix (23
        # rows) grows back to 32, still one tile.
        return cls.filling_columns(op, target, -(-op.tile[0] // mma.M) * mma.M)

    @classmethod
    def filling_columns(cls, op, target, tm: int) -> tuple:
        """(tm, the widest of 128, 64, 32, 16 columns dividing N that still
        gives every SM a tile at tm rows, else the narrowest); `op.tile`
        when none divides N. Rows and N known."""
        m, n = op.operands[0].shape[0], cls.columns(op)
        candidates = [tn for tn in (128, 64, 32, 16) if n % tn == 0]
        if not candidates:
            return op.tile
        row_tiles = -(-m // tm)
        enough = [tn for tn in candidates if row_tiles * (n // tn) >= target.sm_count]
        return (tm, enough[0] if enough else candidates[-1])

    def emit(self) -> None:
        if isinstance(self.op.operands[0].shape[0], int):
            self.emit_mma()
            return
        _, rows = self.row_block(self.op.result, self.op.tile[0])
        wide = arith.cmpi(arith.CmpIPredicate.uge, rows, self.cidx(self.MIN_ROWS))
        branch = scf.IfOp(wide, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.emit_mma()
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            self.narrow()
            scf.yield_([])

    def narrow(self) -> None:
        """The tile when it has fewer than MIN_ROWS rows (symbolic rows only)."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel for few rows")

    def emit_mma(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands[:2]
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
        # B's tile takes A's dtype: the same unless B is packed (dequantized
        # into it, `matmul_packed_mma`).
        self.b_tile = self.scratch([2, tn, bk + self.PAD] if op.params["transpose_b"]
                                   else [2, bk, tn + self.PAD], a.dtype)
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
        tokens = self.stage(lanes, self.cidx(0), self.cidx(0), bk)
        if not lanes.simulate:
            # Step 0 in a group of its own: were step 1's copies in it too,
            # the first `wait_group 1` would wait for neither.
            first_group = nvgpu.device_async_create_group(tokens)
        loop = scf.ForOp(self.cidx(0), self.cidx(steps), self.cidx(1), init)
        with ir.InsertionPoint(loop.body):
            s = loop.induction_variable
            following = arith.addi(s, self.cidx(1))
            # The last step prefetches nothing: its copies read nothing and
            # zero the other buffer, which no later step reads. Copies
            # without conditions keep each step's group in one block.
            more = arith.cmpi(arith.CmpIPredicate.ult, following, self.cidx(steps))
            k_next = arith.muli(arith.minui(following, self.cidx(steps - 1)), self.cidx(bk))
            tokens = self.stage(lanes, arith.remui(following, self.cidx(2)), k_next, bk, more)
            if not lanes.simulate:
                # One group per step, so that waiting for all but the newest
                # group waits for step s.
                group = nvgpu.device_async_create_group(tokens)
                nvgpu.device_async_wait(group, num_groups=1)
            lanes.barrier()
            buffer = arith.remui(s, self.cidx(2))
            accs = list(loop.inner_iter_args)
            for slice_ in range(bk // mma.K):
                accs = self.multiply(lanes, buffer, slice_ * mma.K, accs)
            # The next step's copy overwrites this buffer.
            lanes.barrier()
            scf.yield_(accs)
        if not lanes.simulate:
            # The last step's zero fill may still be in flight: drain it
            # before the next tile's copies reuse the buffers.
            nvgpu.device_async_wait(first_group, num_groups=0)
        self.write_back(lanes, list(loop.results), arith.addi(self.r0, rows))

    def stage(self, lanes, buffer, k0, bk: int, fill=None) -> list:
        """Copies A[rows of the tile, k0 : k0 + bk] and B's columns of the
        tile over the same K into shared buffer `buffer`, 16 bytes per copy,
        the copies spread over the lanes; with `fill` false they write zeros
        and read nothing. Returns the copies' tokens (GPU)."""
        a = self.op.operands[0]
        tm = self.op.tile[0]
        last_row = arith.subi(self.dim(a, 0), self.cidx(1))
        per_row = bk // 8

        def a_chunk(c):
            row = arith.divui(c, self.cidx(per_row))
            col = arith.muli(arith.remui(c, self.cidx(per_row)), self.cidx(8))
            src = [arith.minsi(arith.addi(self.r0, row), last_row), arith.addi(k0, col)]
            return self.copy16(lanes, a, self.a_tile, src, [buffer, row, col], fill)

        tokens = self.each_chunk(lanes, tm * per_row, a_chunk)
        return tokens + self.stage_b(lanes, buffer, k0, bk, fill)

    def stage_b(self, lanes, buffer, k0, bk: int, fill) -> list:
        """B's part of `stage`: its columns of the tile over k0 : k0 + bk,
        copied 16 bytes at a time."""
        b = self.op.operands[1]
        tn = self.op.tile[1]
        per_row = bk // 8

        def b_chunk(c):
            if self.op.params["transpose_b"]:
                n = arith.divui(c, self.cidx(per_row))
                col = arith.muli(arith.remui(c, self.cidx(per_row)), self.cidx(8))
                src, dst = [arith.addi(self.c0, n), arith.addi(k0, col)], [buffer, n, col]
            else:
                k = arith.divui(c, self.cidx(tn // 8))
                col = arith.muli(arith.remui(c, self.cidx(tn // 8)), self.cidx(8))
                src, dst = [arith.addi(k0, k), arith.addi(self.c0, col)], [buffer, k, col]
            return self.copy16(lanes, b, self.b_tile, src, dst, fill)

        return self.each_chunk(lanes, tn * per_row, b_chunk)

    def each_chunk(self, lanes, chunks: int, copy) -> list:
        """`copy(c)` for chunks c = 0 .. chunks - 1 spread over the lanes
        (lane l takes l, l + lanes, ...; lanes past the last chunk copy it
        again: the same bytes to the same place); the tokens it returns."""
        tokens = []

        def body(lane):
            for j in range(-(-chunks // lanes.count)):
                c = arith.addi(lane, self.cidx(j * lanes.count))
                if (j + 1) * lanes.count > chunks:
                    c = arith.minui(c, self.cidx(chunks - 1))
                tokens.extend(copy(c))
        lanes.each(body)
        return tokens

    def copy16(self, lanes, tensor, tile, src: list, dst: list, fill) -> list:
        """8 elements (16 bytes) from `tensor` at `src` to shared `tile` at
        `dst` (zeros where `fill` is false, as `cp.async` with a source size
        of 0 writes them); the copy's token on the GPU."""
        if lanes.simulate:
            storage = ir.VectorType.get([8], element_type(tensor.dtype))
            value = vector.load(storage, self.buf(tensor), src)
            if fill is not None:
                zero = arith.constant(storage, ir.DenseElementsAttr.get_splat(
                    storage, ir.FloatAttr.get(storage.element_type, 0.0)))
                value = arith.select(fill, value, zero)
            vector.store(value, tile, dst)
            return []
        shared = self.a_shared if tile is self.a_tile else self.b_shared
        size = None if fill is None else arith.select(fill, self.cidx(8), self.cidx(0))
        return [nvgpu.device_async_copy(shared, dst, self.buf(tensor), src,
                                        ir.IntegerAttr.get(self.index, 8), src_elements=size,
                                        bypass_l1=True)]

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


