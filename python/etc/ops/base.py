"""What every operator family builds on: footprint helpers, the task-building
interface and `TileKernel`, the base of every tile kernel.

A *tile kernel* is one tile of one operator as a function: its parameters are
the buffers it touches (in a fixed order per kernel) followed by the tile
indices. The graph builder emits each distinct kernel once per module (same
class, operator parameters, tile sizes and buffer types) and every task whose
tiles compute it calls that one function, so identical layers share code.

Kernel bodies are target-neutral: arith, math, memref and scf ops plus the
`event` lane ops. Elements (or rows, for row-wise operators) are spread over
lanes with `scf.for %e = event.lane_id to %n step event.lane_count`; each
lane owns what it stores, so no lane barrier is needed. f16/bf16 values are
extended to f32 after loading, computed and accumulated in f32, and truncated
before storing.
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol, Sequence

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from ..dialects import event
from ..packed import is_packed
from .packed_loads import load_packed

if TYPE_CHECKING:
    from ..graph_values import Operation, Tensor

#: The element type of index results (`topk` indices, `moe` routing buffers).
INDEX_DTYPE = "i32"

#: Default tile extents: rows of every 2-D tile, columns of matmul and
#: elementwise tiles. Every operator uses the same row tile, so that row
#: dependencies line up exactly and an operator can start on a row block as
#: soon as that block is ready.
DEFAULT_ROWS = 32
DEFAULT_COLS = 64


@dataclass(frozen=True)
class Target:
    """What the tile kernels are built for: `kind` is "cpu", "cuda" or
    "generic" (portable scalar kernels, what `Graph.to_mlir()` shows), and
    `chip` the GPU (e.g. "sm_90a") on CUDA. Families choose a kernel variant
    per target and shape.

    CUDA kernels are written for `lanes` threads per CTA (the runtime
    launches that many: the ABI records them) in warps of `warp`; with
    lanes other than 128 or with `min_ctas` the worker carries `.maxntid
    lanes` and, with `min_ctas`, `.minnctapersm min_ctas`, which fix the registers a lane has at entry
    (`entry_registers`). With `simulate_lanes`, the CUDA
    kernels are built to run on the CPU target: their lanes run one after
    another in loops split at the points where lanes exchange data (see
    `Lanes`), so a test on the CPU checks their indexing and reductions.

    On the CPU, `workers` is the number of host threads the program is
    compiled for (families size their tiles so that each gets work), and
    `isa` the x86-64 instruction set it is compiled for
    (`etc.runtime.isa`; None: not x86-64, or no CPU code), whose
    extensions (`has`) choose kernels: AVX-512 BF16 dot products, AMX
    tiles. With `emulate_amx` the AMX kernels are built where the
    instruction set has no AMX, their tile instructions emulated by
    AVX-512 BF16 vector code (`etc.compile(..., kernels="amx")`)."""

    kind: str = "generic"
    chip: Optional[str] = None
    lanes: int = 128
    warp: int = 32
    min_ctas: Optional[int] = None
    simulate_lanes: bool = False
    workers: int = 1
    isa: Optional[str] = None
    emulate_amx: bool = False

    def has(self, feature: str) -> bool:
        """Whether the CPU kernels may use instruction-set `feature` (an
        LLVM name: "avx512bf16", "amx-bf16")."""
        from ..runtime import isa as _isa

        return self.kind == "cpu" and _isa.has(self.isa, feature)

    @property
    def gpu_kernels(self) -> bool:
        """Whether the GPU variants of the kernels are wanted."""
        return self.kind == "cuda"

    #: Registers of an SM (every NVIDIA GPU since sm_50) and the most one
    #: thread may have (PTX `setmaxnreg` takes 24 to 256).
    SM_REGISTERS = 65536
    MAX_THREAD_REGISTERS = 256

    @property
    def entry_registers(self) -> Optional[int]:
        """The registers each lane of the worker has when it starts: what
        its bounds (`.maxntid lanes`, `.minnctapersm min_ctas`) give ptxas,
        65,536 / (lanes x min_ctas) rounded down to a multiple of 8 (the
        allocation unit) and capped at 256; None without `min_ctas`
        (ptxas then chooses, and ignores `setmaxnreg`)."""
        if self.min_ctas is None:
            return None
        per_lane = self.SM_REGISTERS // (self.lanes * self.min_ctas)
        return min(self.MAX_THREAD_REGISTERS, per_lane // 8 * 8)

    @property
    def compute_capability(self) -> int:
        """The chip's compute capability as a number (sm_90a: 90; 0 when
        no chip is named), for instructions that need a newer GPU."""
        digits = "".join(c for c in (self.chip or "").removeprefix("sm_") if c.isdigit())
        return int(digits) if digits else 0

    @property
    def sm_count(self) -> int:
        """A typical SM count of the chip, for choosing tile counts (the
        runtime sizes the grid from the real device)."""
        return {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132,
                "sm_90a": 132}.get(self.chip or "", 108)


#: The portable target: scalar loops over lanes, no vector or GPU ops.
GENERIC = Target()


def element_type(dtype: str) -> ir.Type:
    """The MLIR element type of an ETC dtype."""
    if dtype == INDEX_DTYPE:
        return ir.IntegerType.get_signless(32)
    return {"f32": ir.F32Type.get, "f16": ir.F16Type.get, "bf16": ir.BF16Type.get}[dtype]()


# ----------------------------------------------------------------------
# Footprints and index maps
# ----------------------------------------------------------------------


def tile_offset(dim: int, tile: int) -> str:
    """The footprint offset of grid dimension `dim` tiled by `tile`."""
    return f"d{dim} * {tile}"


def box(grid_rank: int, offsets: Sequence[str], sizes: Sequence) -> ir.Attribute:
    """`#event.box`: offsets as affine expressions of the tile indices, sizes
    as ints or None for the whole dimension."""
    dims = ", ".join(f"d{i}" for i in range(grid_rank))
    size_text = ", ".join("?" if s is None else str(s) for s in sizes)
    return ir.Attribute.parse(f"#event.box<({dims}) -> ({', '.join(offsets)}) [{size_text}]>")


def whole(grid_rank: int, t: "Tensor") -> ir.Attribute:
    """The footprint of every tile reading or writing all of `t`."""
    return box(grid_rank, ["0"] * t.rank, [None] * t.rank)


def row_block(grid_rank: int, t: "Tensor", rows: int = DEFAULT_ROWS) -> ir.Attribute:
    """Rows [d0 * rows, d0 * rows + rows) of `t`, every other dimension whole."""
    return box(grid_rank, [tile_offset(0, rows)] + ["0"] * (t.rank - 1),
               [rows] + [None] * (t.rank - 1))


def index_map(text: str) -> ir.Attribute:
    """`#event.map<text>`."""
    return ir.Attribute.parse(f"#event.map<{text}>")


def live_bound(dim: int, bound: str, position: str) -> ir.Attribute:
    """`#event.live`: tile index `d<dim>` below `bound` (an affine map of the
    loaded value) of the value that `position` (an index map with one
    indirect result) loads: only those tiles run."""
    return ir.Attribute.parse(f"#event.live<d{dim} below {bound} of {position}>")


class TaskBuilder(Protocol):
    """What an operator family needs from the graph builder to emit its tasks."""

    #: The target the kernels are built for.
    target: Target
    #: The graph's block argument of each buffer, by `id(Tensor)` (for task
    #: bodies that are not tile functions: the collectives' puts).
    buffers: dict
    #: Explicit events an operator's tasks leave for a later operator's,
    #: by a key the families choose.
    events: dict

    def grid_extent(self, dim, tile: int, scale: int = 1) -> ir.Value:
        """ceil(dim / tile) (times `scale`) as an index value (a constant or
        over a symbol)."""

    def emit_task(self, op: "Operation", name: str, grid: list, reads: list, writes: list,
                  kernel: type, waits: Sequence = (), notifies: Sequence = (),
                  indices: Sequence = (), live: Sequence = ()) -> None:
        """One `event.task` whose tiles call `kernel`; footprints are
        (tensor, box) pairs, explicit events (event value, map) pairs, and
        `live` the task's live bounds (`live_bound`), whose values are
        loaded from `indices`."""


# ----------------------------------------------------------------------
# Tile kernels
# ----------------------------------------------------------------------


class TileKernel:
    """The body of one tile of an operator, emitted as a function.

    Subclasses set `grid_rank` (the number of tile indices), list the
    buffers the function takes with `tensors(op)` and write `emit()`. The
    helpers give the buffers (`buf`), their sizes (`dim`, `extent`), loads
    and stores that convert to and from f32, lane loops and scalar math.
    """

    #: Tile indices the function takes after its buffers.
    grid_rank = 1
    #: Whether the function stays a call in the GPU worker (LLVM's
    #: `noinline`) instead of being inlined there: the worker's registers
    #: are the most any inlined body needs, and a thread has 255; bodies
    #: that need many of them (tensor-core tiles, weights dequantized in
    #: registers) are kept out so that the worker does not spill.
    out_of_line_on_gpu = False
    #: Whether the function must be inlined in the GPU worker (LLVM's
    #: `alwaysinline`): ptxas serialises the wgmma of a function the worker
    #: calls (C7510, the wgmma pipeline crossing a function boundary).
    inline_on_gpu = False

    @classmethod
    def tensors(cls, op: "Operation") -> list:
        """The buffers the kernel takes, in parameter order. Default: the
        operands, the result, then any further results."""
        return [*op.operands, op.result, *op.extra_results]

    @classmethod
    def name(cls, op: "Operation") -> str:
        """The stem of the kernel's function names (default: the operator
        kind, e.g. `matmul`)."""
        return op.kind

    def __init__(self, op: "Operation", tensors: Sequence["Tensor"],
                 arguments: Sequence[ir.Value], entry: ir.Block,
                 target: Optional[Target] = None):
        self.op = op
        self.block = entry
        self.target = target or GENERIC
        # A buffer passed twice (add(x, x)) is read through its first parameter.
        self._buffers: dict[int, ir.Value] = {}
        for t, arg in zip(tensors, arguments):
            self._buffers.setdefault(id(t), arg)
        self.ti = list(arguments[len(tensors):])
        self.index = ir.IndexType.get()
        self.f32 = ir.F32Type.get()
        self._consts: dict[int, ir.Value] = {}

    def emit(self) -> None:
        raise NotImplementedError(f"{type(self).__name__}.emit")

    # -- values ----------------------------------------------------------

    def cidx(self, v: int) -> ir.Value:
        """An index constant. Index constants live at the top of the function,
        so that they dominate every use wherever they are first needed."""
        if v not in self._consts:
            with ir.InsertionPoint.at_block_begin(self.block):
                self._consts[v] = arith.constant(self.index, v)
        return self._consts[v]

    def cf32(self, v: float) -> ir.Value:
        """An f32 constant where it is needed (inside loops it is recreated, so
        that it always dominates its uses)."""
        return arith.constant(self.f32, ir.FloatAttr.get(self.f32, v))

    def buf(self, t: "Tensor") -> ir.Value:
        return self._buffers[id(t)]

    def dim(self, t: "Tensor", d: int) -> ir.Value:
        size = t.shape[d]
        if isinstance(size, int):
            return self.cidx(size)
        return memref.dim(self.buf(t), self.cidx(d))

    def extent(self, t: "Tensor", d: int, offset: ir.Value, tile: int) -> ir.Value:
        """min(tile, dim - offset): the clipped extent of an edge tile."""
        size = t.shape[d]
        if isinstance(size, int) and size % tile == 0:
            return self.cidx(tile)
        rest = arith.subi(self.dim(t, d), offset)
        return arith.minsi(self.cidx(tile), rest)

    def row_block(self, t: "Tensor", tile: int) -> tuple[ir.Value, ir.Value]:
        """The first row of this tile's block of `tile` rows of `t` (tile
        index 0) and its row count, clipped at the edge."""
        row0 = arith.muli(self.ti[0], self.cidx(tile))
        return row0, self.extent(t, 0, row0, tile)

    # -- memory ----------------------------------------------------------

    def load(self, t: "Tensor", idx: list) -> ir.Value:
        """Element `idx` of `t` as f32 (or i32 for an index tensor); a
        packed weight's element dequantized (`packed_loads`)."""
        if is_packed(t.dtype):
            return load_packed(self, t, idx)
        v = memref.load(self.buf(t), idx)
        return v if t.dtype in ("f32", INDEX_DTYPE) else arith.extf(self.f32, v)

    def load_index(self, t: "Tensor", idx: list) -> ir.Value:
        """An i32 element of `t` as an index."""
        return arith.index_cast(self.index, self.load(t, idx))

    def store_index(self, value: ir.Value, t: "Tensor", idx: list) -> None:
        """Stores an index value into i32 tensor `t`."""
        memref.store(arith.index_cast(ir.IntegerType.get_signless(32), value), self.buf(t), idx)

    def store(self, value: ir.Value, t: "Tensor", idx: list) -> None:
        if t.dtype not in ("f32", INDEX_DTYPE):
            value = arith.truncf(element_type(t.dtype), value)
        memref.store(value, self.buf(t), idx)

    # -- lanes and scratch ------------------------------------------------

    def lanes(self) -> "Lanes":
        """The lanes this kernel's tile runs on (`target.lanes` on CUDA)."""
        t = self.target
        return Lanes(self, t.lanes, t.warp, t.simulate_lanes)

    def entry_alloca(self, type: ir.MemRefType, alignment: int | None = None) -> ir.Value:
        """A stack buffer allocated at the start of the function (not inside a
        loop, where it would grow the stack at every iteration), aligned to
        `alignment` bytes if given (else the element type's)."""
        with ir.InsertionPoint.at_block_begin(self.block):
            if alignment is None:
                return memref.alloca(type, [], [])
            return memref.alloca(type, [], [], alignment=alignment)

    def scratch(self, shape: Sequence[int], dtype: str = "f32") -> ir.Value:
        """An `event.scratch` buffer of `dtype` shared by the tile's lanes,
        made at the start of the function."""
        with ir.InsertionPoint.at_block_begin(self.block):
            return event.scratch(ir.MemRefType.get(list(shape), element_type(dtype)))

    # -- vectors (f32 arithmetic, storage dtype in memory) ----------------

    def vtype(self, width: int) -> ir.VectorType:
        return ir.VectorType.get([width], self.f32)

    def vload(self, t: "Tensor", idx: list, width: int, aligned: bool = False,
              widen: bool = True) -> ir.Value:
        """`width` consecutive elements of `t` from `idx` (along the last
        dimension), widened to f32. `aligned`: the address is a multiple of
        the vector's size (GPU kernels rely on it for 16-byte loads: device
        buffers are 256-byte aligned and their rows a multiple of 16 bytes).
        Not claimed when the lanes are simulated on the CPU, where the
        caller's NumPy arrays (e.g. safetensors weights mapped from a file)
        may start anywhere. `widen=False` keeps the storage type (`widen`
        converts later), e.g. to carry loads across a loop iteration in
        half the registers."""
        storage = ir.VectorType.get([width], element_type(t.dtype))
        v = vector.load(storage, self.buf(t), idx, alignment=self._alignment(t, width, aligned))
        return self.widen(v, t) if widen else v

    def widen(self, v: ir.Value, t: "Tensor") -> ir.Value:
        """A vector loaded from `t` in its storage type (`vload(...,
        widen=False)`) as f32."""
        if t.dtype == "f32" or ir.VectorType(v.type).element_type == self.f32:
            return v
        return arith.extf(self.vtype(ir.VectorType(v.type).shape[0]), v)

    def vstore(self, value: ir.Value, t: "Tensor", idx: list, aligned: bool = False) -> None:
        """Stores an f32 vector into `t` from `idx`, narrowed to its dtype
        (`aligned` as for `vload`)."""
        width = ir.VectorType(value.type).shape[0]
        if t.dtype != "f32":
            value = arith.truncf(ir.VectorType.get([width], element_type(t.dtype)), value)
        vector.store(value, self.buf(t), idx, alignment=self._alignment(t, width, aligned))

    def copy_row(self, src: "Tensor", src_at: list, dst: "Tensor", dst_at: list,
                 width: ir.Value, vector_width: int = 16, fill: Optional[float] = None) -> None:
        """Copies `width` consecutive elements of `src` from index `src_at`
        (its leading indices; the last, the column, starts at 0) to `dst`
        from `dst_at`: `vector_width` elements per step, the rest (width
        not a multiple of it) one at a time. Equal dtypes are copied as
        they are; others converted through f32, as `load` then `store`.
        With `fill`, `src` is not read: that value is stored instead."""
        same = src.dtype == dst.dtype and fill is None

        def piece(col: ir.Value, n: int) -> None:
            if fill is not None:
                value = (self.const_like(self.vzero(n), fill) if n > 1 else self.cf32(fill))
            elif n == 1:
                value = memref.load(self.buf(src), [*src_at, col]) if same else \
                    self.load(src, [*src_at, col])
            else:
                value = self.vload(src, [*src_at, col], n, widen=not same)
            if n > 1 and not same:
                self.vstore(value, dst, [*dst_at, col])
            elif n > 1:
                vector.store(value, self.buf(dst), [*dst_at, col])
            elif same:
                memref.store(value, self.buf(dst), [*dst_at, col])
            else:
                self.store(value, dst, [*dst_at, col])

        step = self.cidx(vector_width)
        whole = arith.muli(arith.divui(width, step), step)
        vectors = scf.ForOp(self.cidx(0), whole, step)
        with ir.InsertionPoint(vectors.body):
            piece(vectors.induction_variable, vector_width)
            scf.yield_([])
        tail = scf.ForOp(whole, width, self.cidx(1))
        with ir.InsertionPoint(tail.body):
            piece(tail.induction_variable, 1)
            scf.yield_([])

    #: The alignment a vector access may claim at most: the runtime's
    #: guarantee for every buffer (`etc.runtime.cuda.ALIGNMENT`).
    MAX_ALIGNMENT = 16

    def _alignment(self, t: "Tensor", width: int, aligned: bool):
        """The `alignment` attribute of a `width`-element access of `t`:
        its size up to MAX_ALIGNMENT bytes when `aligned`, else none (the
        element's)."""
        if not aligned or self.target.simulate_lanes:
            return None
        nbytes = width * (4 if t.dtype in ("f32", INDEX_DTYPE) else 2)
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                  min(nbytes, self.MAX_ALIGNMENT))

    def vsplat(self, scalar: ir.Value, width: int) -> ir.Value:
        return vector.broadcast(self.vtype(width), scalar)

    def vzero(self, width: int) -> ir.Value:
        return arith.constant(self.vtype(width), ir.DenseElementsAttr.get_splat(
            self.vtype(width), ir.FloatAttr.get(self.f32, 0.0)))

    def vsum(self, v: ir.Value) -> ir.Value:
        """The sum of the lanes of an f32 vector, in lane order."""
        return vector.reduction(self.f32, ir.Attribute.parse("#vector.kind<add>"), v)

    def tree_sum(self, v: ir.Value) -> ir.Value:
        """The sum of the lanes of an f32 vector, in any order: LLVM adds
        halves with shuffles (log2 steps) where `vsum`'s lane order is a
        chain of dependent scalar adds (a quarter of a CPU decode dot
        product of 576; most of the CPU attention's time before its key
        blocks used this)."""
        return vector.reduction(self.f32, ir.Attribute.parse("#vector.kind<add>"), v,
                                fastmath=ir.Attribute.parse("#arith.fastmath<reassoc>"))

    def each_sum(self, vectors: list) -> ir.Value:
        """A vector whose lane i is the sum of the lanes of `vectors[i]`
        (at most 16 vectors of 16 f32 lanes; zeros pad them to a power of
        two): each level pairs the vectors, keeps the first half of every
        segment of both in one shuffle and the second halves in another,
        and adds them, so segments halve while the vectors' count does.
        Many dot products' sums at once (the CPU matmul's blocks, the CPU
        attention's key blocks) for 8 adds where `tree_sum` takes one
        reduction each. `EachSum` takes the vectors one at a time."""
        if len(vectors) > 16:
            raise ValueError(f"each_sum takes at most 16 vectors, got {len(vectors)}")
        sums = EachSum(self)
        for v in vectors:
            sums.add(v)
        return sums.result()

    # -- loops -----------------------------------------------------------

    def lane_loop(self, count: ir.Value) -> scf.ForOp:
        """for e in [lane_id, count) step lane_count."""
        return scf.ForOp(event.lane_id(), count, event.lane_count())

    def reduce_row(self, n: ir.Value, init: ir.Value, step) -> ir.Value:
        """Folds `step(acc, k)` over k in [0, n) starting from `init`."""
        loop = scf.ForOp(self.cidx(0), n, self.cidx(1), [init])
        with ir.InsertionPoint(loop.body):
            scf.yield_([step(loop.inner_iter_args[0], loop.induction_variable)])
        return loop.results[0]

    def for_each_col(self, n: ir.Value, body) -> None:
        """Calls `body(k)` for k in [0, n)."""
        loop = scf.ForOp(self.cidx(0), n, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            body(loop.induction_variable)
            scf.yield_([])

    def tile_elements(self, out: "Tensor", tile: tuple):
        """Offsets and clipped extents of this tile of `out`; the element count."""
        offsets, extents = [], []
        for d, t in enumerate(tile):
            off = arith.muli(self.ti[d], self.cidx(t))
            offsets.append(off)
            extents.append(self.extent(out, d, off, t))
        count = extents[0] if len(extents) == 1 else arith.muli(extents[0], extents[1])
        return offsets, extents, count

    def element_coords(self, e: ir.Value, offsets, extents) -> list:
        """Position of linear element `e` of the tile in the buffer."""
        if len(offsets) == 1:
            return [arith.addi(offsets[0], e)]
        r = arith.divui(e, extents[1])
        c = arith.remui(e, extents[1])
        return [arith.addi(offsets[0], r), arith.addi(offsets[1], c)]

    # -- math (f32 scalars or f32 vectors) -------------------------------

    def const_like(self, value: ir.Value, constant: float) -> ir.Value:
        """An f32 constant of `value`'s type (a splat for a vector)."""
        if isinstance(value.type, ir.VectorType):
            return arith.constant(value.type, ir.DenseElementsAttr.get_splat(
                value.type, ir.FloatAttr.get(self.f32, constant)))
        return self.cf32(constant)

    @staticmethod
    def rounded(value: ir.Value, dtype: str) -> ir.Value:
        """f32 `value` (scalar or vector) rounded to `dtype` and widened
        back: what a buffer of `dtype` would give back (a fused operator's
        intermediate, rounded as the operator it replaces stored it)."""
        if dtype == "f32":
            return value
        narrow = element_type(dtype)
        if isinstance(value.type, ir.VectorType):
            narrow = ir.VectorType.get(ir.VectorType(value.type).shape, narrow)
        return arith.extf(value.type, arith.truncf(narrow, value))

    def unary(self, kind: str, x: ir.Value, c: Optional[float] = None) -> ir.Value:
        """An elementwise function of `x` (an f32 or an f32 vector): exp,
        scale (by `c`), silu, sigmoid, gelu, softcap (c tanh(x / c))."""
        k = lambda constant: self.const_like(x, constant)
        if kind == "exp":
            return math.exp(x)
        if kind == "sigmoid":
            # 1 / (1 + exp(-x)): 0 where exp overflows, as torch's.
            return arith.divf(k(1.0), arith.addf(k(1.0), math.exp(arith.negf(x))))
        if kind == "scale":
            return arith.mulf(x, k(c))
        if kind == "silu":
            # x / (1 + exp(-x))
            e = math.exp(arith.negf(x))
            return arith.divf(x, arith.addf(k(1.0), e))
        if kind == "gelu":
            # 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3),
            # tanh(z) = 1 - 2 / (exp(2z) + 1).
            x3 = arith.mulf(arith.mulf(x, x), x)
            inner = arith.addf(x, arith.mulf(k(0.044715), x3))
            two_z = arith.mulf(k(2.0 * _pymath.sqrt(2.0 / _pymath.pi)), inner)
            denom = arith.addf(math.exp(two_z), k(1.0))
            tanh = arith.subf(k(1.0), arith.divf(k(2.0), denom))
            half_x = arith.mulf(k(0.5), x)
            return arith.mulf(half_x, arith.addf(k(1.0), tanh))
        if kind == "softcap":
            # c tanh(x / c), tanh(z) = 1 - 2 / (exp(2z) + 1) (+-1 where exp
            # overflows or vanishes).
            denom = arith.addf(math.exp(arith.mulf(x, k(2.0 / c))), k(1.0))
            return arith.mulf(k(c), arith.subf(k(1.0), arith.divf(k(2.0), denom)))
        raise ValueError(f"unknown elementwise function {kind!r}")


# ----------------------------------------------------------------------
# Lane-parallel code
# ----------------------------------------------------------------------


class ResidualStores(TileKernel):
    """Stores of a matmul's result that add its residual operand, the third
    (`Graph.matmul(residual=)`): the product rounded to the result's dtype,
    plus the residual's element, rounded again, as a separate `add` of the
    two would compute. Kernels store the result through `store` and
    `vstore` only."""

    def _residual(self, t):
        operands = self.op.operands
        return operands[2] if t is self.op.result and len(operands) == 3 else None

    def store(self, value: ir.Value, t: "Tensor", idx: list) -> None:
        residual = self._residual(t)
        if residual is not None:
            value = arith.addf(self.rounded(value, t.dtype), self.load(residual, idx))
        super().store(value, t, idx)

    def vstore(self, value: ir.Value, t: "Tensor", idx: list, aligned: bool = False) -> None:
        residual = self._residual(t)
        if residual is not None:
            width = ir.VectorType(value.type).shape[0]
            value = arith.addf(self.rounded(value, t.dtype),
                               self.vload(residual, idx, width, aligned=aligned))
        super().vstore(value, t, idx, aligned)


class LaneValues:
    """Per-lane values produced by `Lanes.each`: SSA values of the running
    thread on a GPU, or an array indexed by lane when lanes are simulated."""

    def __init__(self, values: Sequence[ir.Value] = (), array=None, layout=()):
        self.values = list(values)
        self.array = array
        self.layout = list(layout)  # (offset, width or 0 for a scalar) per value


class Lanes:
    """The lanes of a tile task, `count` of them in warps of `warp`.

    Kernels that split work between lanes are written as phases:
    `each(body)` runs `body(lane)` for every lane and returns the per-lane
    values it yields; `reduce(values, kind, group, stride)` combines them
    across groups of lanes (see `event.lane_reduce`); `get(values, lane)`
    reads them back in a later phase; `barrier()` separates phases that
    exchange data through `event.scratch`.

    On a GPU every lane is a thread: `each` runs its body once with
    `lane = event.lane_id`, values stay in registers and `reduce` is
    `event.lane_reduce`. Simulated (`Target.simulate_lanes`, the CUDA
    kernels on the CPU target), the lanes run one after another in a loop,
    per-lane values live in arrays, and `reduce` reads the group's entries,
    so the same indexing and reductions run and can be checked on the CPU.
    """

    def __init__(self, kernel: "TileKernel", count: int, warp: int, simulate: bool):
        if count % warp:
            raise ValueError(f"lanes: {count} lanes are not whole warps of {warp}")
        self.k = kernel
        self.count = count
        self.warp = warp
        self.simulate = simulate

    def each(self, body) -> LaneValues:
        if not self.simulate:
            return LaneValues(body(event.lane_id()) or [])
        produced: list = []
        holder: dict = {}
        loop = scf.ForOp(self.k.cidx(0), self.k.cidx(self.count), self.k.cidx(1))
        with ir.InsertionPoint(loop.body):
            produced = body(loop.induction_variable) or []
            if produced:
                holder["array"], holder["layout"] = self._store(loop.induction_variable,
                                                                produced)
            scf.yield_([])
        return LaneValues(array=holder.get("array"), layout=holder.get("layout", []))

    def get(self, values: LaneValues, lane: ir.Value) -> list:
        if not self.simulate:
            return values.values
        return self._load(values, lane)

    def reduce(self, values: LaneValues, kind: str, group: int, stride: int = 1) -> LaneValues:
        """`kind` ("add" or "maxnumf") of each per-lane f32 value over the lanes
        that differ only in bits stride .. stride * group / 2 of the lane id:
        lanes of one warp (group and stride powers of two, group x stride
        at most the warp), checked here so that the simulation, which could
        read any lanes, refuses what `event.lane_reduce` cannot shuffle."""
        power = lambda n: isinstance(n, int) and n >= 1 and n & (n - 1) == 0
        if kind not in ("add", "maxnumf") or not (power(group) and power(stride)) \
                or group * stride > self.warp:
            raise ValueError(f"lanes: reduce({kind!r}, group={group}, stride={stride}) is not "
                             f"'add' or 'maxnumf' over powers of two within a warp of "
                             f"{self.warp} lanes")
        if not self.simulate:
            return LaneValues([self._lane_reduce(v, kind, group, stride) for v in values.values])
        k = self.k

        def combine(lane):
            low_mask = stride * group - stride  # the group's bits
            base = arith.andi(lane, arith.constant(k.index, ~low_mask))
            sources = [arith.ori(base, k.cidx(j * stride)) for j in range(group)]
            rows = [self._load(values, source) for source in sources]
            out = []
            for i in range(len(rows[0])):
                acc = rows[0][i]
                for row in rows[1:]:
                    acc = arith.addf(acc, row[i]) if kind == "add" else arith.maxnumf(acc, row[i])
                out.append(acc)
            return out
        return self.each(combine)

    def barrier(self) -> None:
        if not self.simulate:
            event.lane_barrier()

    def loop(self, lower: ir.Value, upper: ir.Value, step: ir.Value, state: LaneValues,
             body) -> LaneValues:
        """A loop over [lower, upper) by `step` (the same bounds for every
        lane) that carries per-lane values: `body(i, state)` runs phases
        (`each`, `reduce`) and returns the next state, with the layout of
        `state` (from `each`). On a GPU the state is the loop's carried
        registers; simulated, it stays in `state`'s per-lane array, which
        each iteration overwrites. Returns the final state."""
        if not self.simulate:
            loop = scf.ForOp(lower, upper, step, state.values)
            with ir.InsertionPoint(loop.body):
                new = body(loop.induction_variable, LaneValues(list(loop.inner_iter_args)))
                scf.yield_(new.values)
            return LaneValues(list(loop.results))
        loop = scf.ForOp(lower, upper, step)
        with ir.InsertionPoint(loop.body):
            new = body(loop.induction_variable, state)

            def write_back(lane):
                for value, (at, width) in zip(self._load(new, lane), state.layout):
                    if width:
                        vector.store(value, state.array, [lane, self.k.cidx(at)])
                    else:
                        memref.store(value, state.array, [lane, self.k.cidx(at)])
            self.each(write_back)
            scf.yield_([])
        return state

    # -- helpers -----------------------------------------------------------

    def _lane_reduce(self, value: ir.Value, kind: str, group: int, stride: int) -> ir.Value:
        if isinstance(value.type, ir.VectorType):
            width = value.type.shape[0]
            parts = [vector.extract(value, [], [i]) for i in range(width)]
            reduced = [self._lane_reduce(p, kind, group, stride) for p in parts]
            return vector.from_elements(value.type, reduced)
        if group == 1:
            return value
        return event.lane_reduce(value, ir.StringAttr.get(kind),
                                 ir.IntegerAttr.get(ir.IntegerType.get_signless(64), group),
                                 stride=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), stride))

    def _store(self, lane: ir.Value, values: list):
        layout, offset = [], 0
        for v in values:
            width = v.type.shape[0] if isinstance(v.type, ir.VectorType) else 0
            layout.append((offset, width))
            offset += max(width, 1)
        array = self.k.entry_alloca(ir.MemRefType.get([self.count, offset], self.k.f32))
        for v, (at, width) in zip(values, layout):
            if width:
                vector.store(v, array, [lane, self.k.cidx(at)])
            else:
                memref.store(v, array, [lane, self.k.cidx(at)])
        return array, layout

    def _load(self, values: LaneValues, lane: ir.Value) -> list:
        out = []
        for at, width in values.layout:
            if width:
                out.append(vector.load(self.k.vtype(width), values.array, [lane, self.k.cidx(at)]))
            else:
                out.append(memref.load(values.array, [lane, self.k.cidx(at)]))
        return out


class EachSum:
    """`TileKernel.each_sum` of vectors given one at a time: each pair of
    neighbours is added as soon as both exist (a binary counter over the
    levels), so a caller that forms the vectors in order keeps at most one
    per level alive (4 for 16 vectors, where forming all first held 16)."""

    def __init__(self, kernel: "TileKernel"):
        self.kernel = kernel
        #: (level, vector): a vector of 2^level inputs, levels decreasing.
        self.pending: list = []
        self.count = 0

    def add(self, v: ir.Value) -> None:
        """Adds the next vector (16 f32 lanes)."""
        if self.count == 16:
            raise ValueError("each_sum takes at most 16 vectors; this is the 17th (split the "
                             "vectors into groups of 16)")
        self.count += 1
        level = 0
        while self.pending and self.pending[-1][0] == level:
            _, x = self.pending.pop()
            v = self._pair(x, v, 16 >> level)
            level += 1
        self.pending.append((level, v))

    @staticmethod
    def _pair(x: ir.Value, y: ir.Value, segment: int) -> ir.Value:
        """Two vectors of 16 lanes in segments of `segment` into one: the
        halves of each segment added, x's segments, then y's."""
        half = segment // 2
        first = [s * segment + i for s in range(16 // segment) for i in range(half)]
        low = first + [16 + lane for lane in first]
        high = [lane + half for lane in low]
        return arith.addf(vector.shuffle(x, y, low), vector.shuffle(x, y, high))

    def result(self) -> ir.Value:
        """The sums: lane i that of the i-th vector added."""
        if not self.count:
            raise ValueError("each_sum of no vectors")
        while len(self.pending) > 1 or self.count & (self.count - 1):
            self.add(self.kernel.vzero(16))
        ((level, x),) = self.pending
        # One vector left: halve its width for the remaining levels.
        width, segment = 16, 16 >> level
        while segment > 1:
            half = segment // 2
            first = [s * segment + i for s in range(width // segment) for i in range(half)]
            x = arith.addf(vector.shuffle(x, x, first),
                           vector.shuffle(x, x, [lane + half for lane in first]))
            width //= 2
            segment = half
        return x
