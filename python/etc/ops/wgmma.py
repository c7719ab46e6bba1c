"""The warpgroup-level tensor-core multiply of Hopper (sm_90a): `wgmma`
m64nNk16 with f16 or bf16 operands read from shared memory through matrix
descriptors, f32 accumulators; the 128-byte swizzle the operands are laid
out in; the `mbarrier`s that pipeline their loads. Each on the GPU and
emulated exactly when lanes are simulated (`Target.simulate_lanes`).

The maps are written once, over Python integers or `Index` (IR index
values with the same operators), so the tests check on integers exactly
the arithmetic the kernels emit. From the PTX ISA (section "Asynchronous
Warpgroup Level Matrix Multiply-Accumulate Instructions"):

* Accumulator D ("Register Fragments", wgmma .m64nNk16, matrix D): lane t
  of the warpgroup (warp w = t / 32, groupID = t % 32 / 4,
  threadID_in_group = t % 4) holds N / 2 f32 values; value i is row
  16 w + groupID + 8 (i % 4 / 2), column 8 (i / 4) + 2 threadID_in_group
  + i % 2 (`fragment_d`).
* Matrix descriptor ("Matrix Descriptor Format"): 64 bits; bits 0-13 the
  start address, 16-29 the leading dimension byte offset (LBO), 32-45 the
  stride dimension byte offset (SBO), each encoded as (x & 0x3FFFF) >> 4;
  bits 49-51 the base offset (0 here: every swizzle atom is aligned to its
  repeat); bits 62-63 the swizzle mode, 0 interleave (none), 1 128-byte, 2
  64-byte, 3 32-byte (`descriptor`).
* Shared memory layouts ("Shared Memory Matrix Layout", K-major, 16-bit
  elements, T = 8 elements = 16 bytes): without swizzle the operand is
  8 x 16-byte core matrices, rows 16 bytes apart, core matrices adjacent
  along K LBO apart and along M/N SBO apart; with a W-byte swizzle (W =
  128, 64, 32) rows of W bytes hold K contiguously, 8 rows form an atom,
  atoms SBO apart, LBO unused; the 16-byte chunks of each row are permuted
  by XOR with the row's bits: in address terms bits 4.. of the byte
  address XOR bits 7.. (3 bits for 128-byte, 2 for 64, 1 for 32;
  `swizzle`).

`emulate` is the hardware's side: a simulated lane's accumulators are
computed from the simulated shared memory by decoding both descriptors
(`operand_address`, written separately from the kernel's `swizzle`) and
reading each element where the hardware would, so a kernel that lays out
its operands, or encodes a descriptor, start address, SBO, LBO or swizzle
mode wrongly computes the wrong product on the CPU too.

`Barriers` are a kernel's mbarriers ("Parallel Synchronization and
Communication Instructions: mbarrier"): each has a pending arrival count,
a transaction count (bytes that asynchronous copies still owe it:
`mbarrier.arrive.expect_tx` raises it, a TMA copy's complete_tx lowers
it) and a phase bit; the phase completes (flips the bit, restores the
count) when both counts reach zero; `mbarrier.try_wait.parity P` passes once the
phase of parity P has completed, i.e. while the current phase's parity is
not P. Simulated, the lanes run one after another with every arrival of a
phase placed before its waits, so a wait that would not pass (a wrong
parity, a missing arrival) is a deadlock on the GPU; the emulation records
it and the kernel's results become NaN.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm, memref, nvvm, scf

#: m and k of one wgmma (16-bit operands); N is a multiple of 8 up to 256.
M, K = 64, 16
#: Lanes of a warpgroup.
WARPGROUP = 128
#: Swizzle modes as the descriptor's bits 62-63 encode them.
MODES = {"interleave": 0, "128B": 1, "64B": 2, "32B": 3}
#: Bytes per row of a swizzle atom (8 rows per atom).
SPAN = {"128B": 128, "64B": 64, "32B": 32}
_XOR_BITS = {"128B": 7, "64B": 3, "32B": 1}
_MASK64 = (1 << 64) - 1


class Index:
    """An IR index value with Python's integer operators (unsigned
    division, remainder and shifts), so that the maps below run on ints in
    tests and emit IR in kernels. `k` is the kernel (`cidx`)."""

    def __init__(self, k, value: ir.Value):
        self.k = k
        self.value = value

    def _of(self, other) -> ir.Value:
        if isinstance(other, Index):
            return other.value
        if isinstance(other, ir.Value):
            return other
        if other >= 1 << 63:  # a 64-bit pattern with its top bit set
            return arith.constant(ir.IndexType.get(), other - (1 << 64))
        return self.k.cidx(other)

    def _op(self, fn, other, reverse: bool = False) -> "Index":
        a, b = self.value, self._of(other)
        return Index(self.k, fn(b, a) if reverse else fn(a, b))

    def __add__(self, o): return self._op(arith.addi, o)
    def __radd__(self, o): return self._op(arith.addi, o, True)
    def __sub__(self, o): return self._op(arith.subi, o)
    def __rsub__(self, o): return self._op(arith.subi, o, True)
    def __mul__(self, o): return self._op(arith.muli, o)
    def __rmul__(self, o): return self._op(arith.muli, o, True)
    def __floordiv__(self, o): return self._op(arith.divui, o)
    def __mod__(self, o): return self._op(arith.remui, o)
    def __and__(self, o): return self._op(arith.andi, o)
    def __rand__(self, o): return self._op(arith.andi, o, True)
    def __or__(self, o): return self._op(arith.ori, o)
    def __ror__(self, o): return self._op(arith.ori, o, True)
    def __xor__(self, o): return self._op(arith.xori, o)
    def __rshift__(self, o): return self._op(arith.shrui, o)
    def __rrshift__(self, o): return self._op(arith.shrui, o, True)
    def __lshift__(self, o): return self._op(arith.shli, o)


def as_index(k, value) -> Index:
    """`value` (an index ir.Value or an int) as an `Index`."""
    return Index(k, value if isinstance(value, ir.Value) else k.cidx(value))


# ----------------------------------------------------------------------
# The kernel's side: layouts and descriptors it writes
# ----------------------------------------------------------------------


def swizzle(address, mode: str):
    """The byte address where a kernel stores the 16-byte chunk that the
    unswizzled layout puts at `address` (atoms aligned to 8 W bytes)."""
    if mode == "interleave":
        return address
    return address ^ (((address >> 7) & _XOR_BITS[mode]) << 4)


def encode(byte_offset):
    """A descriptor field: (x & 0x3FFFF) >> 4 (14 bits of 16-byte units)."""
    return (byte_offset & 0x3FFFF) >> 4


def descriptor(start, leading: int, stride: int, mode: str):
    """The 64-bit shared-memory matrix descriptor (base offset 0)."""
    return (encode(start) | (encode(leading) << 16) | (encode(stride) << 32)
            | ((MODES[mode] << 62) & _MASK64))


def fragment_d(lane, i):
    """(row, column) in the 64 x N accumulator of value i of a lane of the
    warpgroup."""
    within = lane % WARPGROUP
    warp, group, thread = within // 32, within % 32 // 4, within % 4
    return (warp * 16 + group + (i % 4 // 2) * 8,
            (i // 4) * 8 + thread * 2 + i % 2)


# ----------------------------------------------------------------------
# The hardware's side: where a descriptor's operand elements are read
# ----------------------------------------------------------------------


def operand_address(desc, row, col):
    """The byte address the hardware reads element (row, col) of a K-major
    16-bit wgmma operand from (row: along M or N; col: along K, 0..15),
    given its descriptor: start + (row / 8) SBO + (row % 8) W + (col / 8)
    L + (col % 8) 2, with W the row's bytes (16 without swizzle), L the
    LBO without swizzle and 16 with one, then the 16-byte chunk bits XORed
    with the row bits of the address."""
    start = (desc & 0x3FFF) << 4
    leading = ((desc >> 16) & 0x3FFF) << 4
    stride = ((desc >> 32) & 0x3FFF) << 4
    mode = (desc >> 62) & 3
    # mode 0 -> 16 bytes per row and no XOR; 1, 2, 3 -> 128, 64, 32 bytes
    # per row and 3, 2, 1 XOR bits.
    shift = (mode + 3) % 4
    width = 128 >> shift
    interleave = (4 - mode) // 4
    chunk_step = leading * interleave + (1 - interleave) * 16
    address = start + (row // 8) * stride + (row % 8) * width + (col // 8) * chunk_step \
        + (col % 8) * 2
    row_bits = (address >> 7) & (7 >> shift)
    return address ^ (row_bits << 4)


def emulate(k, lane: ir.Value, smem: ir.Value, desc_a: ir.Value, desc_b: ir.Value, n: int,
            acc: ir.Value, slot: int) -> None:
    """One simulated lane's D += A B^T of a wgmma m64nNk16 (A K-major 64 x
    16, B K-major N x 16), both read from `smem` (16-bit elements, byte
    address 2 i is element i) where their descriptors say; the lane's N / 2
    accumulators are `acc[lane, slot + i]`, updated in place, summing over
    k in order in f32 (each product of two 16-bit floats is exact)."""
    f32 = ir.F32Type.get()
    da, db = Index(k, desc_a), Index(k, desc_b)
    values = scf.ForOp(k.cidx(0), k.cidx(n // 2), k.cidx(1))
    with ir.InsertionPoint(values.body):
        i = Index(k, values.induction_variable)
        row, col = fragment_d(Index(k, lane), i)
        at = [lane, (i + slot).value]
        loop = scf.ForOp(k.cidx(0), k.cidx(K), k.cidx(1), [memref.load(acc, at)])
        with ir.InsertionPoint(loop.body):
            kk = Index(k, loop.induction_variable)
            a = memref.load(smem, [(operand_address(da, row, kk) // 2).value])
            b = memref.load(smem, [(operand_address(db, col, kk) // 2).value])
            product = arith.mulf(arith.extf(f32, a), arith.extf(f32, b))
            scf.yield_([arith.addf(loop.inner_iter_args[0], product)])
        memref.store(loop.results[0], acc, at)
        scf.yield_([])


# ----------------------------------------------------------------------
# The GPU instructions
# ----------------------------------------------------------------------


def accumulator_type(n: int) -> ir.Type:
    """The LLVM struct of a lane's N / 2 f32 accumulators."""
    return llvm.StructType.get_literal([ir.F32Type.get()] * (n // 2))


def zero_accumulators(n: int) -> ir.Value:
    return llvm.mlir_zero(accumulator_type(n))


def mma_async(acc: ir.Value, desc_a: ir.Value, desc_b: ir.Value, n: int, dtype: str) -> ir.Value:
    """`wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T`, A and B K-major
    from shared memory (descriptors as i64), D += A B^T."""
    kind = "bf16" if dtype == "bf16" else "f16"
    attr = ir.Attribute.parse
    return nvvm.wgmma_mma_async(
        accumulator_type(n), acc, desc_a, desc_b,
        attr(f"#nvvm.shape<m = {M}, n = {n}, k = {K}>"),
        attr(f"#nvvm.wgmma_type<{kind}>"), attr(f"#nvvm.wgmma_type<{kind}>"),
        attr("#nvvm.wgmma_type<f32>"), attr("#nvvm.wgmma_scale_out<one>"),
        attr("#nvvm.wgmma_scale_in<one>"), attr("#nvvm.wgmma_scale_in<one>"),
        attr("#nvvm.mma_layout<row>"), attr("#nvvm.mma_layout<col>"))


def fence() -> None:
    """`wgmma.fence`: orders register accesses before the next wgmma."""
    nvvm.wgmma_fence_aligned()


def commit() -> None:
    nvvm.wgmma_commit_group_sync_aligned()


def wait(pending: int) -> None:
    """Waits until at most `pending` committed wgmma groups are in flight."""
    nvvm.wgmma_wait_group_sync_aligned(pending)


def async_proxy_fence() -> None:
    """`fence.proxy.async.shared::cta`: makes shared-memory writes of the
    generic proxy (cp.async, st.shared) visible to wgmma's reads, which go
    through the async proxy."""
    nvvm.fence_proxy(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                     space=ir.Attribute.parse("#nvvm.shared_space<cta>"))


# ----------------------------------------------------------------------
# mbarriers
# ----------------------------------------------------------------------


class Barriers:
    """`count` mbarriers of a tile, each expecting `arrivals` arrivals per
    phase, in the pipeline `role` "full" (a stage's operands have landed)
    or "empty" (a stage's consumers are done with it), which a hang's
    `WatchdogError` names. On the GPU they live in shared memory at byte
    address `address` (8 bytes each, `address` 8-byte aligned); simulated,
    their state is an array (pending count, phase bit) and a deadlock
    flag."""

    ROLES = ("full", "empty")

    def __init__(self, k, count: int, arrivals: int, address=None, *, role: str):
        if role not in self.ROLES:
            raise ValueError(f"role={role!r}: a tile's barriers are one of {self.ROLES}")
        self.k = k
        self.count = count
        self.arrivals = arrivals
        self.role = role
        self.simulate = k.target.simulate_lanes
        i32 = ir.IntegerType.get_signless(32)
        if self.simulate:
            self.state = k.entry_alloca(ir.MemRefType.get([count, 3], i32))
            self.stuck = k.entry_alloca(ir.MemRefType.get([1], i32))
        else:
            self.address = address

    def _address(self, barrier) -> Index:
        """The shared-memory byte address of barrier `barrier`."""
        return as_index(self.k, self.address) + as_index(self.k, barrier) * 8

    def _pointer(self, barrier) -> ir.Value:
        word = arith.index_cast(ir.IntegerType.get_signless(64), self._address(barrier).value)
        return llvm.inttoptr(llvm.PointerType.get(3), word)

    def _i32(self, v: int) -> ir.Value:
        return arith.constant(ir.IntegerType.get_signless(32), v)

    def init(self) -> None:
        """Every barrier at phase 0 (one lane on the GPU, then a fence that
        makes the initialisation visible; the caller's lane barrier
        follows). Simulated: also clears the deadlock flag."""
        k = self.k
        if self.simulate:
            for b in range(self.count):
                memref.store(self._i32(self.arrivals), self.state, [k.cidx(b), k.cidx(0)])
                memref.store(self._i32(0), self.state, [k.cidx(b), k.cidx(1)])
                memref.store(self._i32(0), self.state, [k.cidx(b), k.cidx(2)])
            memref.store(self._i32(0), self.stuck, [k.cidx(0)])
            return
        from ..dialects import event
        first = arith.cmpi(arith.CmpIPredicate.eq, event.lane_id(), k.cidx(0))
        branch = scf.IfOp(first)
        with ir.InsertionPoint(branch.then_block):
            for b in range(self.count):
                nvvm.mbarrier_init(self._pointer(b), self._i32(self.arrivals))
            nvvm.fence_mbarrier_init()
            scf.yield_([])

    def invalidate(self) -> None:
        """One lane invalidates the barriers (after the caller's lane
        barrier), so the shared memory may hold other data in the next tile."""
        if self.simulate:
            return
        from ..dialects import event
        k = self.k
        first = arith.cmpi(arith.CmpIPredicate.eq, event.lane_id(), k.cidx(0))
        branch = scf.IfOp(first)
        with ir.InsertionPoint(branch.then_block):
            for b in range(self.count):
                nvvm.mbarrier_inval(self._pointer(b))
            scf.yield_([])

    def arrive(self, barrier: ir.Value) -> None:
        """The calling lane arrives (`mbarrier.arrive`)."""
        if self.simulate:
            self._arrival(barrier)
            return
        nvvm.mbarrier_arrive(ir.IntegerType.get_signless(64), self._pointer(barrier))

    def arrive_after_copies(self, barrier: ir.Value) -> None:
        """The calling lane's arrival once its `cp.async` copies so far have
        landed (`cp.async.mbarrier.arrive.noinc`: counted in `arrivals`).
        Simulated copies land at once, so it arrives at once."""
        if self.simulate:
            self._arrival(barrier)
            return
        nvvm.cp_async_mbarrier_arrive(self._pointer(barrier), noinc=True)

    def arrive_expect_tx(self, barrier: ir.Value, nbytes: int) -> None:
        """The calling lane raises the transaction count by `nbytes` (what
        its TMA copies will complete) and arrives
        (`mbarrier.arrive.expect_tx`)."""
        if self.simulate:
            self._transactions(barrier, nbytes)
            self._arrival(barrier)
            return
        nvvm.mbarrier_arrive_expect_tx(None, self._pointer(barrier), self._i32(nbytes))

    def complete_tx(self, barrier: ir.Value, nbytes: int) -> None:
        """Simulated: a copy's bytes landed (the TMA unit's complete_tx),
        which completes the phase if they were the last owed."""
        self._transactions(barrier, -nbytes)
        self._complete_if_done(barrier)

    def pointer(self, barrier) -> ir.Value:
        """The barrier's shared-memory pointer (GPU)."""
        return self._pointer(barrier)

    def wait(self, barrier: ir.Value, parity: ir.Value) -> None:
        """Waits for the phase of parity `parity` (index 0 or 1) to have
        completed. Simulated: a wait that could not pass sets the deadlock
        flag."""
        k = self.k
        if not self.simulate:
            self._bounded_wait(barrier, parity)
            return
        phase = memref.load(self.state, [barrier, k.cidx(1)])
        word = arith.index_cast(ir.IntegerType.get_signless(32), parity)
        blocked = arith.cmpi(arith.CmpIPredicate.eq, phase, word)
        flag = memref.load(self.stuck, [k.cidx(0)])
        memref.store(arith.select(blocked, self._i32(1), flag), self.stuck, [k.cidx(0)])

    def _bounded_wait(self, barrier: ir.Value, parity: ir.Value) -> None:
        """`mbarrier.try_wait.parity` until the phase completes; after each
        failed poll the lane stalls (`event.stall`), which keeps the
        watchdog: the wait gives up when the run was stopped, or when it
        outlives the compile's `watchdog=` (then the stall has written the
        run's error record, which the host raises as a `WatchdogError`
        naming the task, tile, role, stage and parity). A lane that gave up
        goes on with the phase incomplete; the run's result is discarded."""
        from ..dialects import event
        i1, i64 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(64)
        address = self._address(barrier).value
        pointer = self._pointer(barrier)
        word = arith.index_cast(ir.IntegerType.get_signless(32), parity)
        true = arith.constant(i1, 1)
        loop = scf.WhileOp([i64], [arith.constant(i64, 0)])
        before = loop.before.blocks.append(i64)
        with ir.InsertionPoint(before):
            since = before.arguments[0]
            done = nvvm.mbarrier_try_wait(i1, pointer, word)
            poll = scf.IfOp(done, [i64, i1], has_else=True)
            with ir.InsertionPoint(poll.then_block):
                scf.yield_([since, true])
            with ir.InsertionPoint(poll.else_block):
                stall = event.StallOp(self.role, address, as_index(self.k, barrier).value,
                                      parity, since, [])
                scf.yield_([stall.start, stall.give_up])
            start, stop = poll.results
            scf.condition(arith.xori(stop, true), [start])
        after = loop.after.blocks.append(i64)
        with ir.InsertionPoint(after):
            scf.yield_([after.arguments[0]])

    def deadlocked(self) -> ir.Value:
        """Simulated: whether a wait could not have passed (i1)."""
        flag = memref.load(self.stuck, [self.k.cidx(0)])
        return arith.cmpi(arith.CmpIPredicate.ne, flag, self._i32(0))

    def _transactions(self, barrier: ir.Value, delta: int) -> None:
        k = self.k
        owed = memref.load(self.state, [barrier, k.cidx(2)])
        memref.store(arith.addi(owed, self._i32(delta)), self.state, [barrier, k.cidx(2)])

    def _arrival(self, barrier: ir.Value) -> None:
        k = self.k
        pending = arith.subi(memref.load(self.state, [barrier, k.cidx(0)]), self._i32(1))
        memref.store(pending, self.state, [barrier, k.cidx(0)])
        self._complete_if_done(barrier)

    def _complete_if_done(self, barrier: ir.Value) -> None:
        """No arrival and no byte left owed: the phase completes (the bit
        flips, the arrival count is restored). A transaction count that
        went below zero (more bytes landed than expected) never completes,
        and the wait on it is a deadlock."""
        k = self.k
        pending = memref.load(self.state, [barrier, k.cidx(0)])
        owed = memref.load(self.state, [barrier, k.cidx(2)])
        phase = memref.load(self.state, [barrier, k.cidx(1)])
        done = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, pending, self._i32(0)),
                          arith.cmpi(arith.CmpIPredicate.eq, owed, self._i32(0)))
        memref.store(arith.select(done, self._i32(self.arrivals), pending), self.state,
                     [barrier, k.cidx(0)])
        flipped = arith.xori(phase, self._i32(1))
        memref.store(arith.select(done, flipped, phase), self.state, [barrier, k.cidx(1)])
