"""The Hopper matmul tile of the CUDA target (`MatmulWGMMA`, sm_90a): C =
A @ B^T with f16 or bf16 operands and f32 accumulators, its operands staged
into 128-byte-swizzled shared memory through a ring of stages guarded by
mbarriers and multiplied by `wgmma` m64nNk16 straight from shared memory
(`etc.ops.wgmma` holds the instructions and their exact emulation).

The CTA is one warpgroup (the target's 128 lanes); every lane is both a
producer (its share of each stage's 16-byte `cp.async` copies) and a
consumer (the warpgroup's wgmma), so the pipeline is the ring of a
warp-specialised kernel without the specialisation:

* S stages (S = min(STAGES, K / 64)); a stage holds 64 K-columns of the
  tile's A rows (MI = ceil(tm / 64) blocks of 64 rows) and of its tn B^T
  rows, each row 128 bytes, 8 rows a 1024-byte swizzle atom, atoms 1024
  bytes apart (the descriptors' SBO), stages and atoms 1024-byte aligned
  (on the GPU the shared arena is aligned up at run time), so the
  hardware's address-based swizzle and the kernel's placement agree. The
  symbolic-rows kernel, which shares its worker with a model's other
  tiles, keeps its ring within 48 KB where it can: 2 stages, then 32
  K-columns per stage in the 64-byte swizzle (`_layout`).
* Barriers: full[s] and empty[s] per stage, 128 arrivals each. Step t's
  copies go into stage t % S after waiting empty[t % S] for parity
  (t / S + 1) % 2 (the first round's parity 1 passes on a fresh barrier:
  nothing to wait for), then each lane's `cp.async.mbarrier.arrive.noinc`
  arrives on full[t % S] once its copies land. Step s waits full[s % S]
  for parity (s / S) % 2, fences the generic proxy's writes for the async
  proxy, issues its 4 MI wgmma (k = 16 each; the descriptor of slice j
  starts 32 j bytes into the row, which the swizzle of the absolute
  address resolves; 2 MI with 64-byte rows), commits and waits for all but
  this group: step s - 1's wgmma are then done, each lane arrives on
  empty[(s - 1) % S] and refills that stage with step s - 1 + S. So S - 1
  steps of copies are in flight while one step of wgmma runs.
* Stores: each lane's accumulators (`wgmma.fragment_d`) through
  `ResidualStores`, two adjacent columns at a time, rows past the tile or
  the matrix skipped (A's rows past the matrix read its last row; with
  TMA they are zeros).

Rows are symbolic in LLM graphs: as `MatmulMMA`, tiles of fewer than
MIN_ROWS rows take `narrow` (the GEMV, `MatmulWGMMASkinnyT` in
`matmul.py`), decided per tile at run time.

Known rows: the tile is inlined in the worker (`inline_on_gpu`): a worker
that calls it makes ptxas serialise every wgmma (C7510). The symbolic-rows
kernel is a call (see `MatmulWGMMASkinnyT`). A barrier wait that hangs
raises a `WatchdogError` naming the barrier (docs/gpu.md, "Safety").

TMA loads (`tma = True`, or compiling inside `tma_loads()`; `etc.ops.tma`):
the full barriers expect one arrival, lane 0's `mbarrier.arrive.expect_tx`
of the stage's bytes, and lane 0 alone refills a stage with one
`cp.async.bulk.tensor.2d` per 64-row box (MI for A, ceil(tn / 64) for B^T,
whose rows in the stage are padded to whole boxes), which the TMA unit
swizzles as the descriptors read and zero-fills past the matrices, so K
and N need only be multiples of 8 (rows past N are zeros, their columns
not stored). The maps come from the runtime (`cuda_tensor_maps`) through
the module's directory, which lane 0 probes once per tile for A and B^T;
the consumer's proxy fence is not needed (TMA writes through the async
proxy). Default off: the first GPU run measures both (kit, "hopper").

Warp-specialised (`warp_specialised = True`, or compiling inside
`warp_specialised()`; needs TMA and `etc.compile(..., lanes=256,
min_ctas=N)`): warpgroup 0 `setmaxnreg.dec`s to PRODUCER_REGS and its
lane 0 runs the TMA ring over every step (wait empty[t % S] for parity
(t / S + 1) % 2, `expect_tx` on full[t % S], the boxes); warpgroup 1
`setmaxnreg.inc`s to CONSUMER_REGS (or the entry count, when more) and
runs the multiply loop (wait full[s % S] for parity (s / S) % 2, wgmma,
commit, wait for all but this group, then lane 0 of each of its 4 warps
arrives on empty[(s - 1) % S]: 4 arrivals) and the stores; both return to
the worker's count at entry before the tile's closing barrier. That count
comes from the worker's bounds (`Target.entry_registers`: `.maxntid 256`
and `.minnctapersm N` make it 65,536 / (256 x N), 128 at N = 2), without
which ptxas would ignore `setmaxnreg` (C7508); `registers` refuses bounds
that leave it unknown or too small. Simulated, the two roles run in the
one-warpgroup tile's order (a legal interleaving) with the same barrier
checks. See docs/operators.md, "Warp specialisation".

Not yet: a GPU measurement of the warp-specialised variant (the kit's
"hopper" table); barrier waits reporting through the watchdog's record;
B (K, N) (an MN-major B operand), which keeps `MatmulMMA`.
"""

from __future__ import annotations

import contextlib

from mlir import ir
from mlir.dialects import arith, llvm, memref, scf, vector

from . import tma as tensor_memory
from . import wgmma
from .base import element_type
from .matmul_mma import MatmulMMA, _workgroup


class MatmulWGMMA(MatmulMMA):
    """Hopper tensor-core matmul tile: C = A @ B^T, f16 or bf16, f32
    accumulators (`wgmma` m64nNk16 from 128-byte-swizzled shared memory, an
    S-stage mbarrier ring of `cp.async` loads; see the module docstring).
    Needs sm_90a, 128 lanes (one warpgroup; 256 warp-specialised), K a
    multiple of 64, N of the tile's columns (a multiple of 16, at most
    256)."""

    #: In the worker: called, ptxas serialises every wgmma (C7510).
    out_of_line_on_gpu = False
    inline_on_gpu = True

    #: (K per stage, swizzle): one swizzled row of 16-bit elements per
    #: operand row, in order of preference (see `_layout`).
    LAYOUTS = ((64, "128B"), (32, "64B"))
    #: K must be a multiple of this.
    BK = 64
    #: Stages of the ring (at most; fewer when K has fewer steps).
    STAGES = 3
    #: Alignment of the stages (a 128-byte swizzle atom: 8 rows of 128 bytes).
    ATOM = 1024
    #: Shared memory a CTA has without opting in: the most the symbolic-rows
    #: kernel's ring takes when a narrower layout fits.
    SHARED_LIMIT = 48 << 10
    #: Loads with TMA (one lane's `cp.async.bulk.tensor` per 64-row box,
    #: from the runtime's tensor maps) instead of every lane's `cp.async`.
    tma = False
    #: Rows of a TMA box (the operand maps' box: `tma.operand_map`).
    BOX_ROWS = tensor_memory.BOX_ROWS
    #: Warp-specialised (needs `tma` and 256 lanes: warpgroup 0 produces,
    #: warpgroup 1 consumes; see the module docstring and
    #: `warp_specialised`).
    warp_specialised = False

    @classmethod
    def name(cls, op) -> str:
        return "matmul_wgmma"

    @classmethod
    def applies(cls, op, target) -> bool:
        a, b = op.operands[:2]
        m, k = a.shape
        n = cls.columns(op)
        tm, tn = op.tile
        # wgmma is sm_90a only (the "a" features); one warpgroup per CTA.
        lanes = wgmma.WARPGROUP * (2 if cls.warp_specialised else 1)
        if cls.warp_specialised and target.gpu_kernels and target.chip == "sm_90a":
            if not cls.tma:
                raise ValueError("MatmulWGMMA.warp_specialised needs TMA loads (tma_loads()): "
                                 "its producer warpgroup issues them from one lane")
            if target.lanes != lanes:
                raise ValueError(f"MatmulWGMMA.warp_specialised needs {lanes} lanes per CTA "
                                 f"(a producer and a consumer warpgroup); the target has "
                                 f"{target.lanes}: etc.compile(..., lanes={lanes})")
            cls.registers(target)
        if not (target.gpu_kernels and target.chip == "sm_90a" and target.warp == 32
                and target.lanes == lanes and a.dtype in ("f16", "bf16")
                and b.dtype == a.dtype and op.params["transpose_b"]):
            return False
        # TMA zero-fills past K and N, so ragged K and N need only rows of
        # whole 16 bytes (the maps' stride) and whole column pairs.
        k_unit, n_unit = (8, 8) if cls.tma else (cls.BK, tn)
        if not (isinstance(k, int) and isinstance(n, int) and k % k_unit == 0
                and n % n_unit == 0 and tn % 8 == 0 and tn <= 256 and tm % 16 == 0):
            return False
        return not (isinstance(m, int) and m < cls.MIN_ROWS)

    @classmethod
    def tile_for(cls, op, target) -> tuple:
        """For known rows: 128 rows (64 for fewer than 128), the widest
        columns (at most 128: 128 f32 accumulators per lane) that still
        give every SM a tile."""
        m = op.operands[0].shape[0]
        n = cls.columns(op)
        if not isinstance(n, int) or not isinstance(m, int):
            return op.tile
        return cls.filling_columns(op, target, 128 if m >= 128 else wgmma.M)

    # -- layout -------------------------------------------------------------

    def _layout(self) -> None:
        """Stages of 64 K-columns in the 128-byte swizzle, up to STAGES of
        them. For symbolic rows (the tile sits in a model's worker beside
        every other tile, whose CTAs should not need more than
        SHARED_LIMIT), the first of: 3 then 2 such stages, 3 then 2 stages
        of 32 K-columns in the 64-byte swizzle, that fits (else one stage of
        the last)."""
        tm, tn = self.op.tile
        self.mi = -(-tm // wgmma.M)
        self.a_rows = self.mi * wgmma.M
        # TMA fills whole boxes of BOX_ROWS rows: B^T's rows padded to them.
        self.b_rows = -(-tn // self.BOX_ROWS) * self.BOX_ROWS if self.tma else tn
        k = self.op.operands[0].shape[1]
        known_rows = isinstance(self.op.operands[0].shape[0], int)
        for bk, mode in self.LAYOUTS:
            steps = -(-k // bk)
            for stages in range(min(self.STAGES, steps), 0, -1):
                self.bk, self.swizzle, self.stages, self.steps = bk, mode, stages, steps
                self.row_bytes = bk * 2
                self.a_bytes = self.a_rows * self.row_bytes
                self.stage_bytes = (self.a_rows + self.b_rows) * self.row_bytes
                self.barrier_offset = stages * self.stage_bytes
                # Room to align the arena's start up to an atom on the GPU.
                self.total_bytes = self.ATOM + self.barrier_offset + 16 * stages
                if known_rows or (stages > 1 and self.total_bytes <= self.SHARED_LIMIT):
                    return

    def descriptor(self, base: wgmma.Index, stage, operand: str, block: int,
                   slice_: int) -> wgmma.Index:
        """The descriptor of A's 64-row block `block` or of B^T, K slice
        `slice_` (16 columns) of `stage`."""
        start = base + wgmma.as_index(self, stage) * self.stage_bytes + slice_ * wgmma.K * 2
        if operand == "a":
            start = start + block * wgmma.M * self.row_bytes
        else:
            start = start + self.a_bytes
        # LBO: unused by K-major swizzled layouts (1 by convention).
        return wgmma.descriptor(start, 16, 8 * self.row_bytes, self.swizzle)

    # -- the tile -------------------------------------------------------------

    def emit_mma(self) -> None:
        op = self.op
        a = op.operands[0]
        tm, tn = op.tile
        lanes = self.lanes()
        self._layout()
        self.r0 = arith.muli(self.ti[0], self.cidx(tm))
        self.c0 = arith.muli(self.ti[1], self.cidx(tn))
        rows = self.extent(op.result, 0, self.r0, tm)
        self.smem = self.scratch([self.total_bytes // 2], a.dtype)
        k = self
        # Warp-specialised: lane 0 of warpgroup 0 runs the TMA ring, the
        # lanes of warpgroup 1 multiply; one lane per consumer warp arrives
        # on empty[] (the stage is free once all 4 warps' wgmma are done).
        self.ws = self.warp_specialised
        consumer_warps = wgmma.WARPGROUP // lanes.warp
        if lanes.simulate:
            # The simulated shared window starts at address 0, atom-aligned.
            self.raw = self.base = wgmma.as_index(k, 0)
            self.acc = self.entry_alloca(ir.MemRefType.get(
                [lanes.count, self.mi * tn // 2], self.f32))
        else:
            self.shared = _workgroup(self.smem)
            raw = memref.extract_aligned_pointer_as_index(self.shared)
            self.raw = wgmma.Index(k, raw)
            self.base = (self.raw + (self.ATOM - 1)) & ((1 << 64) - self.ATOM)
        barriers = self.base + self.barrier_offset
        # TMA: one arrival (the producer's expect_tx) and the copies' bytes.
        self.full = wgmma.Barriers(k, self.stages, 1 if self.tma else wgmma.WARPGROUP,
                                   None if lanes.simulate else barriers.value, role="full")
        self.empty = wgmma.Barriers(k, self.stages, consumer_warps if self.ws else wgmma.WARPGROUP,
                                    None if lanes.simulate else (barriers + 8 * self.stages).value,
                                    role="empty")
        self.full.init()
        self.empty.init()
        if lanes.simulate:
            def clear(lane):
                for slot in range(self.mi * tn // 2):
                    memref.store(self.cf32(0.0), self.acc, [lane, self.cidx(slot)])
            lanes.each(clear)
            init = []
        else:
            init = [wgmma.zero_accumulators(tn) for _ in range(self.mi)]
        lanes.barrier()
        if self.tma:
            self.maps = self._tensor_maps(lanes)
        if self.ws and not lanes.simulate:
            self._specialised(lanes, init, rows)
            return
        for t in range(self.stages):
            self.produce(lanes, self.cidx(t))
        loop = scf.ForOp(self.cidx(0), self.cidx(self.steps), self.cidx(1), init)
        with ir.InsertionPoint(loop.body):
            s = loop.induction_variable
            accs = self.consume(lanes, s, list(loop.inner_iter_args))
            started, previous = self._release_previous(
                s, lambda stage: lanes.each(lambda lane: self._release(lanes, lane, stage)))
            refill = arith.addi(previous, self.cidx(self.stages))
            more = arith.andi(started, arith.cmpi(arith.CmpIPredicate.ult, refill,
                                                  self.cidx(self.steps)))
            branch = scf.IfOp(more)
            with ir.InsertionPoint(branch.then_block):
                self.produce(lanes, refill)
                scf.yield_([])
            scf.yield_(accs)
        if not lanes.simulate:
            wgmma.wait(0)
        self.write_back(lanes, list(loop.results), arith.addi(self.r0, rows))
        lanes.barrier()
        self.full.invalidate()
        self.empty.invalidate()

    def _release_previous(self, s, release) -> tuple:
        """After step `s`'s wgmma: from step 1 on, `release(stage)` of step
        s - 1's stage (its wgmma are done). Returns (s >= 1, s - 1 or 0)."""
        started = arith.cmpi(arith.CmpIPredicate.uge, s, self.cidx(1))
        previous = arith.subi(arith.maxui(s, self.cidx(1)), self.cidx(1))
        branch = scf.IfOp(started)
        with ir.InsertionPoint(branch.then_block):
            release(self._stage(previous))
            scf.yield_([])
        return started, previous

    #: Registers a lane of the producer warpgroup gives back to (and a lane
    #: of the consumer warpgroup takes, at least) while the tile runs
    #: (`setmaxnreg`). Both return to the worker's count at entry, which
    #: its bounds fix (`Target.entry_registers`: `.maxntid 256,
    #: .minnctapersm 2` make it 65,536 / 512 = 128); see `registers`.
    PRODUCER_REGS = 40
    CONSUMER_REGS = 216

    @classmethod
    def registers(cls, target) -> tuple:
        """(producer, consumer, entry): the registers per lane of each role
        while the warp-specialised tile runs and the count both return to,
        the worker's at entry (`target.entry_registers`). The consumer
        takes CONSUMER_REGS, or the entry count when that is more. Refused
        by name where the bounds leave the count at entry unknown (ptxas
        then ignores `setmaxnreg`, C7508) or too small: the producer's and
        the consumer's lanes must fit the CTA's pool, 2 x entry (an
        increase past it blocks forever)."""
        entry = target.entry_registers
        if entry is None:
            raise ValueError(
                "MatmulWGMMA.warp_specialised needs the worker's register bound (ptxas ignores "
                "`setmaxnreg` without it): etc.compile(..., min_ctas=N), N worker CTAs per SM "
                f"(2 at {target.lanes} lanes: 65,536 / (2 x {target.lanes}) registers a lane "
                "at entry)")
        producer, consumer = cls.PRODUCER_REGS, max(cls.CONSUMER_REGS, entry)
        if producer > entry or producer + consumer > 2 * entry:
            raise ValueError(
                f"MatmulWGMMA.warp_specialised: min_ctas={target.min_ctas} at {target.lanes} "
                f"lanes leaves {entry} registers a lane at entry; its producer ({producer}) and "
                f"consumer ({consumer}) lanes need {producer + consumer} <= 2 x {entry}: use "
                "fewer worker CTAs per SM (min_ctas)")
        return producer, consumer, entry

    def _specialised(self, lanes, init: list, rows) -> None:
        """The GPU's warp-specialised ring: warpgroup 0 gives registers
        back and its lane 0 runs the producer's loop over every step;
        warpgroup 1 takes them and runs the consumer's loop (wait full[],
        wgmma, commit, wait for all but this group, one lane per warp
        releases the previous step's stage), stores, and both return to
        the entry count before the tile's closing barrier (the consumers
        first: the producer's increase waits for their registers)."""
        from mlir.dialects import nvvm
        from ..dialects import event
        producer_regs, consumer_regs, entry_regs = self.registers(self.target)
        lane = event.lane_id()
        producer = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, lane,
                                       self.cidx(wgmma.WARPGROUP)), has_else=True)
        decrease, increase = nvvm.SetMaxRegisterAction.decrease, nvvm.SetMaxRegisterAction.increase
        with ir.InsertionPoint(producer.then_block):
            nvvm.setmaxregister(producer_regs, decrease)
            loop = scf.ForOp(self.cidx(0), self.cidx(self.steps), self.cidx(1))
            with ir.InsertionPoint(loop.body):
                self.produce_tma(lanes, loop.induction_variable)
                scf.yield_([])
            nvvm.setmaxregister(entry_regs, increase)
            scf.yield_([])
        with ir.InsertionPoint(producer.else_block):
            nvvm.setmaxregister(consumer_regs, increase)
            loop = scf.ForOp(self.cidx(0), self.cidx(self.steps), self.cidx(1), init)
            with ir.InsertionPoint(loop.body):
                s = loop.induction_variable
                accs = self.consume(lanes, s, list(loop.inner_iter_args))
                self._release_previous(s, lambda stage: self._release(lanes, lane, stage))
                scf.yield_(accs)
            wgmma.wait(0)
            self.write_back(lanes, list(loop.results), arith.addi(self.r0, rows))
            nvvm.setmaxregister(entry_regs, decrease)
            scf.yield_([])
        lanes.barrier()
        self.full.invalidate()
        self.empty.invalidate()

    def _consumer(self, lane: ir.Value, lanes=None) -> ir.Value:
        """Whether `lane` multiplies: every lane, or warp-specialised the
        lanes of warpgroup 1 (and with `lanes`, only each warp's first)."""
        if not self.ws:
            return arith.constant(ir.IntegerType.get_signless(1), 1)
        inside = arith.cmpi(arith.CmpIPredicate.uge, lane, self.cidx(wgmma.WARPGROUP))
        if lanes is not None:
            first = arith.cmpi(arith.CmpIPredicate.eq,
                               arith.remui(lane, self.cidx(lanes.warp)), self.cidx(0))
            inside = arith.andi(inside, first)
        return inside

    def _release(self, lanes, lane: ir.Value, stage: ir.Value) -> None:
        """A consumer's arrival on empty[stage] (warp-specialised: one lane
        per consumer warp)."""
        if not self.ws:
            self.empty.arrive(stage)
            return
        branch = scf.IfOp(self._consumer(lane, lanes))
        with ir.InsertionPoint(branch.then_block):
            self.empty.arrive(stage)
            scf.yield_([])

    def _stage(self, step: ir.Value) -> ir.Value:
        return arith.remui(step, self.cidx(self.stages))

    def _parity(self, step: ir.Value, offset: int) -> ir.Value:
        """(step / S + offset) % 2: the phase a round's wait is for."""
        return arith.remui(arith.addi(arith.divui(step, self.cidx(self.stages)),
                                      self.cidx(offset)), self.cidx(2))

    def _operand_map(self, tensor) -> tensor_memory.TensorMap:
        """The tensor map `tensor` is loaded through (the runtime encodes
        the same for the GPU)."""
        return tensor_memory.operand_map(wgmma.Index(self, self.dim(tensor, 0)),
                                         wgmma.Index(self, self.dim(tensor, 1)),
                                         tensor.dtype, self.swizzle)

    def _flat(self, tensor) -> ir.Value:
        """Simulated: `tensor`'s buffer as one row of elements from its
        address, which a tensor map's stride and dims index."""
        shape = ir.MemRefType(self.buf(tensor).type).shape
        dynamic = ir.ShapedType.get_dynamic_size()
        size = dynamic if dynamic in shape else shape[0] * shape[1]
        return memref.collapse_shape(ir.MemRefType.get([size], element_type(tensor.dtype)),
                                     self.buf(tensor), [[0, 1]])

    def _tensor_maps(self, lanes) -> list:
        """On the GPU, the producer lane finds the maps of A and B^T in the
        directory (other lanes get 0: they issue no copy)."""
        if lanes.simulate:
            return []
        from ..dialects import event
        a, b = self.op.operands[:2]
        first = arith.cmpi(arith.CmpIPredicate.eq, event.lane_id(), self.cidx(0))
        branch = scf.IfOp(first, [self.index, self.index], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            found = [tensor_memory.lookup(self, wgmma.Index(
                self, memref.extract_aligned_pointer_as_index(self.buf(t))), self.swizzle).value
                for t in (a, b)]
            scf.yield_(found)
        with ir.InsertionPoint(branch.else_block):
            scf.yield_([self.cidx(0), self.cidx(0)])
        return [wgmma.Index(self, v) for v in branch.results]

    def produce(self, lanes, step: ir.Value) -> None:
        """Every lane: wait until stage step % S is free, copy its share of
        step `step`'s A rows and B^T rows into it (swizzled), arrive on the
        stage's full barrier once they land. With TMA, `produce_tma`."""
        if self.tma:
            self.produce_tma(lanes, step)
            return
        stage = self._stage(step)
        k0 = arith.muli(step, self.cidx(self.bk))
        a, b = self.op.operands[:2]
        last_row = arith.subi(self.dim(a, 0), self.cidx(1))
        chunks_per_row = self.row_bytes // 16
        tn = self.op.tile[1]
        copies = [(a, self.a_rows, 0), (b, tn, self.a_bytes)]

        def body(lane):
            self.empty.wait(stage, self._parity(step, 1))
            for tensor, rows, offset in copies:
                chunks = rows * chunks_per_row
                for j in range(-(-chunks // lanes.count)):
                    c = arith.addi(lane, self.cidx(j * lanes.count))
                    if (j + 1) * lanes.count > chunks:
                        c = arith.minui(c, self.cidx(chunks - 1))
                    row = arith.divui(c, self.cidx(chunks_per_row))
                    chunk = arith.remui(c, self.cidx(chunks_per_row))
                    if tensor is a:
                        src_row = arith.minsi(arith.addi(self.r0, row), last_row)
                    else:
                        src_row = arith.addi(self.c0, row)
                    src = [src_row, arith.addi(k0, arith.muli(chunk, self.cidx(8)))]
                    logical = (self.base + wgmma.Index(self, stage) * self.stage_bytes + offset
                               + wgmma.Index(self, row) * self.row_bytes
                               + wgmma.Index(self, chunk) * 16)
                    element = (wgmma.swizzle(logical, self.swizzle) - self.raw) // 2
                    self.copy16(lanes, tensor, src, element.value)
            self.full.arrive_after_copies(stage)
        lanes.each(body)

    def produce_tma(self, lanes, step: ir.Value) -> None:
        """Lane 0: wait until stage step % S is free, expect its bytes on
        the stage's full barrier (one arrival), and copy step `step`'s A
        rows and B^T rows in boxes of BOX_ROWS x bk elements (the tensor
        maps' box), which the TMA unit swizzles, zero-fills past the
        matrices and completes on the barrier."""
        stage = self._stage(step)
        k0 = arith.muli(step, self.cidx(self.bk))
        a, b = self.op.operands[:2]
        box_bytes = self.BOX_ROWS * self.row_bytes
        copies = [(a, self.r0, 0, self.a_rows), (b, self.c0, self.a_bytes, self.b_rows)]

        def body(lane):
            first = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, lane, self.cidx(0)))
            with ir.InsertionPoint(first.then_block):
                self.empty.wait(stage, self._parity(step, 1))
                self.full.arrive_expect_tx(stage, self.stage_bytes)
                stage_base = self.base + wgmma.Index(self, stage) * self.stage_bytes
                for which, (tensor, row0, offset, rows) in enumerate(copies):
                    for box in range(rows // self.BOX_ROWS):
                        y = arith.addi(row0, self.cidx(box * self.BOX_ROWS))
                        dst = stage_base + offset + box * box_bytes
                        if lanes.simulate:
                            tensor_map = self._operand_map(tensor)
                            tensor_memory.emulate_load(self, self._flat(tensor), tensor_map, k0,
                                                       y, self.smem, dst.value)
                            self.full.complete_tx(stage, tensor_map.box[0] * tensor_map.box[1]
                                                  * tensor_map.element_bytes)
                        else:
                            tensor_memory.load(self, dst, self.maps[which], k0, y,
                                               self.full.pointer(stage))
                scf.yield_([])
        lanes.each(body)

    def copy16(self, lanes, tensor, src: list, element: ir.Value) -> list:
        """8 elements (16 bytes) of `tensor` at `src` to shared memory at
        element `element` (`cp.async` on the GPU)."""
        if lanes.simulate:
            storage = ir.VectorType.get([8], element_type(tensor.dtype))
            vector.store(vector.load(storage, self.buf(tensor), src), self.smem, [element])
            return []
        from mlir.dialects import nvgpu
        return [nvgpu.device_async_copy(self.shared, [element], self.buf(tensor), src,
                                        ir.IntegerAttr.get(self.index, 8), bypass_l1=True)]

    def consume(self, lanes, step: ir.Value, accs: list) -> list:
        """Step `step`'s multiplies once its stage is full: on the GPU the
        wgmma of its 4 K slices and MI row blocks, committed as one group,
        then a wait for all but that group."""
        stage = self._stage(step)
        parity = self._parity(step, 0)
        tn = self.op.tile[1]
        dtype = self.op.operands[0].dtype
        slices = self.bk // wgmma.K
        if not lanes.simulate:
            self.full.wait(stage, parity)
            if not self.tma:  # TMA writes through the async proxy already
                wgmma.async_proxy_fence()
            wgmma.fence()
            i64 = ir.IntegerType.get_signless(64)
            for j in range(slices):
                b_desc = arith.index_cast(i64, self.descriptor(self.base, stage, "b", 0, j).value)
                for i in range(self.mi):
                    a_desc = arith.index_cast(
                        i64, self.descriptor(self.base, stage, "a", i, j).value)
                    accs[i] = wgmma.mma_async(accs[i], a_desc, b_desc, tn, dtype)
            wgmma.commit()
            wgmma.wait(1)
            return accs

        def body(lane):
            branch = scf.IfOp(self._consumer(lane))
            with ir.InsertionPoint(branch.then_block):
                self.full.wait(stage, parity)
                for j in range(slices):
                    b_desc = self.descriptor(self.base, stage, "b", 0, j).value
                    for i in range(self.mi):
                        a_desc = self.descriptor(self.base, stage, "a", i, j).value
                        wgmma.emulate(self, lane, self.smem, a_desc, b_desc, tn, self.acc,
                                      i * tn // 2)
                scf.yield_([])
        lanes.each(body)
        return []

    def write_back(self, lanes, accs: list, row_end) -> None:
        """Each lane stores its accumulators, two adjacent columns at a
        time; rows past the tile or the matrix are skipped. Simulated, a
        pipeline that would have deadlocked stores NaN."""
        out = self.op.result
        tn = self.op.tile[1]
        n = self.columns(self.op)
        f32 = self.f32
        poisoned = None
        if lanes.simulate:
            poisoned = arith.ori(self.full.deadlocked(), self.empty.deadlocked())

        def body(lane):
            if self.ws:  # only the consumers hold accumulators
                branch = scf.IfOp(self._consumer(lane))
                with ir.InsertionPoint(branch.then_block):
                    stores(lane)
                    scf.yield_([])
            else:
                stores(lane)

        def stores(lane):
            for i in range(self.mi):
                for v in range(0, tn // 2, 2):
                    row, col = wgmma.fragment_d(wgmma.Index(self, lane), v)
                    row = arith.addi(self.r0, (row + i * wgmma.M).value)
                    col = arith.addi(self.c0, col.value)
                    if lanes.simulate:
                        value = vector.load(self.vtype(2), self.acc,
                                            [lane, self.cidx(i * tn // 2 + v)])
                        nan = arith.constant(self.vtype(2), ir.DenseElementsAttr.get_splat(
                            self.vtype(2), ir.FloatAttr.get(f32, float("nan"))))
                        value = arith.select(poisoned, nan, value)
                    else:
                        pair = [llvm.extractvalue(f32, accs[i], [v + h]) for h in range(2)]
                        value = vector.from_elements(self.vtype(2), pair)
                    inside = arith.cmpi(arith.CmpIPredicate.ult, row, row_end)
                    if n % tn:  # ragged N (TMA): columns past N are not stored
                        inside = arith.andi(inside, arith.cmpi(arith.CmpIPredicate.ult, col,
                                                               self.cidx(n)))
                    inside = scf.IfOp(inside)
                    with ir.InsertionPoint(inside.then_block):
                        self.vstore(value, out, [row, col], aligned=True)
                        scf.yield_([])
        lanes.each(body)



#: The PTX ISA version TMA tiles need: `fence.proxy.tensormap` (the kernel's
#: acquire of a map the host wrote into global memory) is PTX 8.3.
TMA_PTX = 83


@contextlib.contextmanager
def tma_loads(enabled: bool = True):
    """Compiles the Hopper tile with TMA loads (`MatmulWGMMA.tma`) or
    without (`enabled=False`) inside the block; the pipeline then lowers
    sm_90a at PTX 8.3 (`TMA_PTX`, CUDA 12.3 drivers or newer) instead of
    8.0."""
    saved = MatmulWGMMA.tma
    MatmulWGMMA.tma = enabled
    try:
        yield
    finally:
        MatmulWGMMA.tma = saved


@contextlib.contextmanager
def warp_specialised(enabled: bool = True):
    """Compiles the Hopper tile warp-specialised (`MatmulWGMMA.warp_specialised`:
    256 lanes, warpgroup 0's lane 0 producing with TMA, warpgroup 1
    consuming) inside the block; needs `tma_loads()` and
    `etc.compile(..., lanes=256, min_ctas=N)` (N = 2: 128 registers a lane
    at entry; 1 for a worker whose other tiles need more)."""
    saved = MatmulWGMMA.warp_specialised
    MatmulWGMMA.warp_specialised = enabled
    try:
        yield
    finally:
        MatmulWGMMA.warp_specialised = saved
