"""The expert tiles of `moe` (ops/moe.py): tile (e, j) of the padded
(E, ceil(T / m)) grid takes expert e's routed slots offsets[e] +
[j m, min((j + 1) m, count_e)), each a (token, choice) pair, and computes

    up    hidden[t, c, :] = silu(x[t] @ w1[e]) (times x[t] @ w_up[e], gated)
    down  partial[t, c, :] = weights[t, c] * (hidden[t, c] @ w2[e])

with gpt-oss's biases (b1[e], b_up[e] added to the up sums, b2[e] to the
down ones, before the activation and the routing weight) and clamped
SwiGLU (`activate`) where the op has them (`operand`; docs/moe.md).

Experts are (E, H, F) / (E, F, H) matrices, or with `transpose_w` their
transposes (E, F, H) / (E, H, F): rows of their inputs' values, llama.cpp's
layout and the one packed experts (a format of `etc.packed`) are stored in.

Kernels:
* `MoeUp`, `MoeDown` (CUDA, where a lane is a thread, and what the CPU
  kernels below do not take: an up tile mixing packed and float
  matrices, a tile whose stack buffers would pass
  `ExpertVectorCPU.STACK_BYTES`): one output element per lane iteration
  with a serial reduction. They read experts of any dtype through
  `TileKernel.load`, which dequantizes a packed expert's values one at a
  time in registers (`packed_loads`, the float32 operations of
  `etc.packed.dequantize`): the widened experts' products up to the
  order of the sums.
* `MoeUpPackedCPU`, `MoeDownPackedCPU` (the CPU, experts in a GGML block
  format): the packed matmul's int8 dot products
  (`matmul_packed.PackedDotsCPU`, as `MatmulPackedCPU` computes a dense
  layer): the tile's rows of activations (x[t], or hidden[t, c] for down)
  are quantized once into a stack panel, then multiplied with expert e's
  rows of blocks (the stacked weight's rows [e, n], byte offset e N row
  bytes), gate and up one after the other over the same panel.
* `MoeUpVectorCPU`, `MoeDownVectorCPU` (the CPU, f32, bf16, f16 and
  fp8_e4m3 experts): the tile's rows of activations gathered once into an
  f32 stack panel, then expert e's matrices streamed against it in
  vectors (`ExpertVectorCPU`): transposed experts by `MatmulCPU`'s dot
  blocks (fp8 rows converted as loaded, `matmul_fp8`'s
  `unscaled` / `block_scale`), (E, K, N) experts by whole rows, k
  outermost, as `MatmulCPU.emit_streamed`. One Qwen3-30B-A3B-width
  layer (H 2048, F 768, 32 experts, 8 per token), 2 workers
  (`bench/moe_cpu.py`, docs/benchmarks.md "Decisions measured"): bf16
  experts B = 1 / 8 / 32 2.1 / 9.6 / 21.1 ms against 36.7 / 285 / 1,097
  in the scalar tiles (B = 1: the 75.5 MB of the routed experts at 36
  GB/s, the memory's rate).

Every kernel keeps the tasks' footprints and events: only the tile's reads
of the experts differ.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .base import element_type
from .matmul_dpbf16 import dot_bf16
from .matmul_fp8 import FP8, block_scale, dequantized, unscaled
from .matmul_packed import MatmulPackedCPU, PackedDotsCPU
from .variants import PartKernel


#: The moe op's operands in their order; `w_up` and the biases only when
#: given (`Graph.moe`).
ROLES = ("x", "router_w", "w1", "w2", "w_up", "router_b", "b1", "b_up", "b2",
         "selection_bias")


def operand(op, role: str):
    """The moe op's operand `role` (one of ROLES), or None if not given."""
    given = ["x", "router_w", "w1", "w2", *(["w_up"] if op.params.get("gated") else []),
             *op.params.get("biases", ())]
    return op.operands[given.index(role)] if role in given else None


def activate(kernel, gate: ir.Value, up) -> ir.Value:
    """The expert's activation of the gate's sum `gate` and the up one's
    `up` (None for ungated experts), both already with their biases: an
    f32 or an f32 vector. silu(gate) (* up), or gpt-oss's clamped SwiGLU
    (`activation="swiglu_oai"`): g = min(gate, limit), u = clamp(up,
    -limit, limit), (u + 1) * g * sigmoid(alpha * g); NaN stays NaN, as
    torch.clamp keeps it."""
    params = kernel.op.params
    if params.get("activation", "silu") == "silu":
        value = kernel.unary("silu", gate)
        return value if up is None else arith.mulf(value, up)
    k = lambda constant: kernel.const_like(gate, constant)
    limit = params["swiglu_limit"]
    g = arith.minimumf(gate, k(limit))
    u = arith.maximumf(arith.minimumf(up, k(limit)), k(-limit))
    # g * sigmoid(alpha g) = g / (1 + exp(-alpha g))
    glu = arith.divf(g, arith.addf(k(1.0), math.exp(arith.mulf(k(-params["swiglu_alpha"]), g))))
    return arith.mulf(arith.addf(u, k(1.0)), glu)


class ExpertTile(PartKernel):
    """A tile (e, j) of the padded expert grid."""

    grid_rank = 2

    def biased(self, role: str, e, column, value: ir.Value) -> ir.Value:
        """`value` (f32 or a vector of them) plus bias `role`'s values from
        [e, column] as f32; `value` itself if the op has no such bias."""
        t = operand(self.op, role)
        if t is None:
            return value
        if isinstance(value.type, ir.VectorType):
            b = self.vload(t, [e, column], ir.VectorType(value.type).shape[0])
        else:
            b = self.load(t, [e, column])
        return arith.addf(value, b)

    def slot_range(self) -> tuple[ir.Value, ir.Value]:
        """The first slot of expert tile (e, j) and its count of slots,
        offsets[e] + [j m, min((j + 1) m, count_e)) (0 for an empty tile)."""
        buffers = self.op.buffers
        (per_tile,) = self.op.tile
        e, j = self.ti
        begin = self.load_index(buffers["offsets"], [e])
        end = self.load_index(buffers["offsets"], [arith.addi(e, self.cidx(1))])
        first = arith.addi(begin, arith.muli(j, self.cidx(per_tile)))
        last = arith.minsi(end, arith.addi(first, self.cidx(per_tile)))
        return first, arith.maxsi(arith.subi(last, first), self.cidx(0))

    def pair(self, slot: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The (token, choice) pair that slot `slot` holds."""
        k = self.op.params["top_k"]
        pair = self.load_index(self.op.buffers["slots"], [arith.divui(slot, self.cidx(k)),
                                                          arith.remui(slot, self.cidx(k))])
        return arith.divui(pair, self.cidx(k)), arith.remui(pair, self.cidx(k))

    def expert_slots(self, width: ir.Value):
        """The lane loop over (slot, column) of the tile's slots; an empty
        tile runs no iteration. Returns (loop, token, choice, column)
        inside the loop."""
        first, count = self.slot_range()
        loop = self.lane_loop(arith.muli(count, width))
        with ir.InsertionPoint(loop.body):
            element = loop.induction_variable
            token, choice = self.pair(arith.addi(first, arith.divui(element, width)))
            column = arith.remui(element, width)
        return loop, token, choice, column

    def outputs(self, w) -> ir.Value:
        """The values each of expert matrix `w`'s products has (F for w1
        and w_up, H for w2)."""
        return self.dim(w, 1 if self.op.params.get("transpose_w") else 2)

    def expert_value(self, w, e, k, n) -> ir.Value:
        """Value (k, n) of expert e's matrix `w` (k along its inputs, n its
        outputs), as f32."""
        index = [e, n, k] if self.op.params.get("transpose_w") else [e, k, n]
        return self.load(w, index)


class MoeUp(ExpertTile):
    """hidden[t, c, :] = silu(x[t] @ w1[e]) for the pairs of this tile, or
    silu(x[t] @ w1[e]) * (x[t] @ w_up[e]) for gated experts."""

    part = "up"

    @classmethod
    def tensors(cls, op) -> list:
        x, w1 = op.operands[0], op.operands[2]
        buffers = op.buffers
        return [x, w1, buffers["offsets"], buffers["slots"], buffers["hidden"],
                *[t for t in (operand(op, r) for r in ("w_up", "b1", "b_up")) if t is not None]]

    def emit(self) -> None:
        x, w1 = self.op.operands[0], self.op.operands[2]
        w_up = operand(self.op, "w_up")
        hidden = self.op.buffers["hidden"]
        loop, t, c, f = self.expert_slots(self.outputs(w1))
        e = self.ti[0]
        with ir.InsertionPoint(loop.body):
            total = self.reduce_row(self.dim(x, 1), self.cf32(0.0), lambda acc, h: arith.addf(
                acc, arith.mulf(self.load(x, [t, h]), self.expert_value(w1, e, h, f))))
            up = None
            if w_up is not None:
                up = self.reduce_row(self.dim(x, 1), self.cf32(0.0), lambda acc, h: arith.addf(
                    acc, arith.mulf(self.load(x, [t, h]), self.expert_value(w_up, e, h, f))))
                up = self.biased("b_up", e, f, up)
            value = activate(self, self.biased("b1", e, f, total), up)
            self.store(value, hidden, [t, c, f])
            scf.yield_([])


class MoeDown(ExpertTile):
    """partial[t, c, :] = weight[t, c] * (hidden[t, c] @ w2[e])."""

    part = "down"

    @classmethod
    def tensors(cls, op) -> list:
        w1, w2 = op.operands[2:4]
        buffers = op.buffers
        b2 = operand(op, "b2")
        return [w1, w2, buffers["offsets"], buffers["slots"], buffers["hidden"],
                buffers["partial"], buffers["weights"], *([b2] if b2 is not None else [])]

    def emit(self) -> None:
        w1, w2 = self.op.operands[2:4]
        buffers = self.op.buffers
        hidden, partial = buffers["hidden"], buffers["partial"]
        loop, t, c, col = self.expert_slots(self.outputs(w2))
        e = self.ti[0]
        with ir.InsertionPoint(loop.body):
            total = self.reduce_row(self.outputs(w1), self.cf32(0.0),
                                    lambda acc, f: arith.addf(acc, arith.mulf(
                                        self.load(hidden, [t, c, f]),
                                        self.expert_value(w2, e, f, col))))
            weight = self.load(buffers["weights"], [t, c])
            self.store(arith.mulf(weight, self.biased("b2", e, col, total)), partial, [t, c, col])
            scf.yield_([])


class ExpertDotsCPU(PackedDotsCPU, ExpertTile):
    """An expert tile whose packed experts are read by the packed matmul's
    int8 dot products: row r of the tile is its slot first + r, and expert
    e's column n is row [e, n] of the stacked weight's blocks."""

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_{cls.part}_packed_cpu"

    def multiply_experts(self, weights: list) -> None:
        """Quantizes the tile's rows of activations once, then multiplies
        them with each of `weights` (packed, (E, N, K)) in turn, each
        product to `store_product` (with `self.stage` the weight's
        position in `weights`)."""
        self.first, rows = self.slot_range()
        self.prepare(weights[0].shape[2], self.op.tile[0], [w.dtype for w in weights])
        self.quantize_rows(rows)
        for self.stage, w in enumerate(weights):
            self.multiply(w, rows, self.cidx(0), self.dim(w, 1))

    def weight_row(self, column):
        return [self.ti[0], column]

    def columns_divide(self) -> bool:
        """Each weight multiplied whole: its N columns, a static multiple
        of COLS or not."""
        n = self.weight.shape[1]
        return isinstance(n, int) and n % self.COLS == 0

    def slot_pair(self, local) -> tuple[ir.Value, ir.Value]:
        """The (token, choice) pair of the tile's row `local`."""
        return self.pair(arith.addi(self.first, local))


class MoeUpPackedCPU(ExpertDotsCPU, MoeUp):
    """`MoeUp` by int8 dot products with packed w1 (and w_up): the gate's
    products go to `hidden` first, then each up product takes silu of the
    gate's from there (the values `MoeUp` computes from the same sums)."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu" and all(w.dtype in MatmulPackedCPU.FORMATS
                                            for w in _up_weights(op))

    def emit(self) -> None:
        self.multiply_experts(_up_weights(self.op))

    def activation_row(self, local) -> tuple:
        token, _ = self.slot_pair(local)
        return self.op.operands[0], [token]

    def store_product(self, local, column, total: ir.Value) -> None:
        hidden = self.op.buffers["hidden"]
        index = [*self.slot_pair(local), column]
        e = self.ti[0]
        if not self.op.params.get("gated"):
            self.store(activate(self, self.biased("b1", e, column, total), None), hidden, index)
        elif self.stage == 0:  # the gate's product (biased), until the up one's
            self.store(self.biased("b1", e, column, total), hidden, index)
        else:
            self.store(activate(self, self.load(hidden, index),
                                self.biased("b_up", e, column, total)), hidden, index)


class MoeDownPackedCPU(ExpertDotsCPU, MoeDown):
    """`MoeDown` by int8 dot products with packed w2: the rows of
    activations are hidden[t, c]."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu" and op.operands[3].dtype in MatmulPackedCPU.FORMATS

    def emit(self) -> None:
        self.multiply_experts([self.op.operands[3]])

    def activation_row(self, local) -> tuple:
        return self.op.buffers["hidden"], list(self.slot_pair(local))

    def store_product(self, local, column, total: ir.Value) -> None:
        token, choice = self.slot_pair(local)
        weight = self.load(self.op.buffers["weights"], [token, choice])
        total = self.biased("b2", self.ti[0], column, total)
        self.store(arith.mulf(weight, total), self.op.buffers["partial"],
                   [token, choice, column])


class ExpertVectorCPU(ExpertTile):
    """An expert tile on the CPU with float (f32, bf16, f16) or fp8_e4m3
    experts, by vector products summed in f32: the tile's rows of activations
    (`activation_row`) are gathered once into a stack panel (f32, the
    tile's slots by K), then expert e's matrices (`weights`) stream
    through the vector registers against it, every matrix of the tile over
    the same panel, and `finish` turns each output's sums (one per matrix)
    into the value stored to `destination`.

    Experts given transposed (E, N, K) (rows along K: Hugging Face's and
    llama.cpp's (out, in), FP8 checkpoints) take `MatmulCPU`'s dot products:
    blocks of ROWS panel rows by PER_ROW / matrices rows of each matrix (a
    single row by COLUMNS / matrices), a 16-lane accumulator per output
    along K, summed across lanes together (`each_sum`); bf16 experts under
    bf16 activations take blocks of ROWS rows on `vdpbf16ps`
    (`matmul_dpbf16.dot_bf16`, a bf16 copy of the panel: the products of
    bf16 values are exact in f32; at B = 32 0.90-0.93x the multiply-adds'
    time, 1 and 2 workers), single rows the multiply-adds as the dense GEMV
    does; fp8_e4m3 rows are converted as they are loaded, a block of 32 at a
    time, their products with each panel row summed before one multiply by
    the block's scale (`matmul_fp8.unscaled`, `block_scale`:
    `etc.packed.dequantize`'s values up to the rounding of that product).
    Experts (E, K, N) (a widened checkpoint's (in, out)) take
    `MatmulCPU.emit_streamed`'s order: k outermost, each step reading KSTEP
    rows of every matrix across a chunk of columns (all of N for tiles of at
    most FEW_ROWS rows: long runs, as decode wants; CHUNK columns for more,
    whose sums stay in L1), each vector loaded once for ROWS panel rows, the
    sums in a stack buffer. (A register micro-tile of 32 columns down all of
    K read the weights at 6.4 GB/s at B = 1, in short runs; streamed whole
    rows at 18-23 GB/s.) Rows past the last group of ROWS go one at a time;
    columns past the last block are computed again from the last one (dot
    products) or go one by one past the last vector (streamed); K past the
    last vector or step by scalar products: any H and F.

    The sums are f32 over f32 products of the widened values, as `MoeUp`
    and `MoeDown` compute them, in another order."""

    #: Panel rows each dot block or streamed step shares every weight
    #: vector over.
    ROWS = 4
    #: Accumulators (16 lanes) per panel row of a dot block of ROWS rows
    #: (its columns times the matrices), and of a single row: the columns
    #: of a group (COLUMNS / matrices) times the matrices. 16 for a single
    #: row took 0.75x the time of 4 at B = 1 with fp8 experts (one
    #: worker), 8 the same as 4.
    PER_ROW = 4
    COLUMNS = 16
    #: f32 lanes per vector (one AVX-512 register).
    WIDTH = 16
    #: (E, K, N) experts: rows of each matrix every step reads, tiles of
    #: at most FEW_ROWS rows whose steps read whole rows (N wide), and the
    #: columns per chunk of tiles of more.
    KSTEP = 4
    FEW_ROWS = 4
    CHUNK = 128
    #: The most stack the tile's buffers may take: the panel (tile rows x
    #: K x 4 bytes) and the streamed sums; larger tiles take `MoeUp` /
    #: `MoeDown` (the worker threads' stacks are the platform's default).
    STACK_BYTES = 512 * 1024
    #: Expert dtypes the tiles read.
    DTYPES = ("f32", "bf16", "f16", "fp8_e4m3")

    @classmethod
    def name(cls, op) -> str:
        return f"{op.kind}_{cls.part}_vector_cpu"

    @classmethod
    def reads(cls, op, weights: list) -> bool:
        """Whether the tiles can read `weights`: every matrix in DTYPES
        (fp8_e4m3 transposed, as packed experts are), static K and N, and
        the tile's stack buffers within STACK_BYTES."""
        transposed = op.params.get("transpose_w")
        if not all(w.dtype in cls.DTYPES and (transposed or w.dtype != "fp8_e4m3")
                   for w in weights):
            return False
        if not all(isinstance(d, int) for w in weights for d in w.shape):
            return False
        _, n, k = weights[0].shape if transposed else (None, *weights[0].shape[2:0:-1])
        rows = op.tile[0]
        stack = rows * k * 4
        if not transposed:
            stack += len(weights) * 4 * (cls.FEW_ROWS * n + rows * min(n, cls.CHUNK))
        return stack <= cls.STACK_BYTES

    def activation_row(self, token, choice) -> tuple:
        """The tensor and leading indices of the row of activations of
        pair (token, choice)."""
        raise NotImplementedError(f"{type(self).__name__}.activation_row")

    def finish(self, token, choice, column, sums: list) -> ir.Value:
        """The output value (scalar or vector) of output `column` (the
        first of a vector's) from `sums`, one per matrix."""
        raise NotImplementedError(f"{type(self).__name__}.finish")

    def destination(self) -> object:
        """The tensor the tile's outputs go to, indexed [token, choice, n]."""
        raise NotImplementedError(f"{type(self).__name__}.destination")

    def multiply_experts(self, weights: list) -> None:
        """Gathers the tile's rows, then every output of `weights` (expert
        e's matrices, one layout and K) over them."""
        transposed = self.op.params.get("transpose_w")
        self.weights = weights
        self.e = self.ti[0]
        self.k = weights[0].shape[2 if transposed else 1]
        self.n = weights[0].shape[1 if transposed else 2]
        self.first, rows = self.slot_range()
        self.panel = self.entry_alloca(ir.MemRefType.get([self.op.tile[0], self.k], self.f32))
        a, _ = self.activation_row(self.cidx(0), self.cidx(0))
        self.bf16_panel = None
        if (transposed and self.target.has("avx512bf16") and a.dtype == "bf16"
                and all(w.dtype == "bf16" for w in weights)):
            self.bf16_panel = self.entry_alloca(
                ir.MemRefType.get([self.op.tile[0], self.k], element_type("bf16")))
        self.gather(rows)
        if transposed:
            self.transposed_blocks(rows)
        else:
            self.streamed_rows(rows)

    def output_pair(self, local) -> tuple:
        """The (token, choice) pair of panel row `local`."""
        return self.pair(arith.addi(self.first, local))

    def gather(self, rows) -> None:
        """The panel's rows: row r the activations of the tile's slot
        first + r, widened to f32."""
        width, k = self.WIDTH, self.k
        vector_k = k - k % width
        each = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(each.body):
            local = each.induction_variable
            a, row = self.activation_row(*self.pair(arith.addi(self.first, local)))
            if vector_k:
                copy = scf.ForOp(self.cidx(0), self.cidx(vector_k), self.cidx(width))
                with ir.InsertionPoint(copy.body):
                    kk = copy.induction_variable
                    raw = self.vload(a, [*row, kk], width, widen=False)
                    vector.store(self.widen(raw, a), self.panel, [local, kk])
                    if self.bf16_panel is not None:
                        vector.store(raw, self.bf16_panel, [local, kk])
                    scf.yield_([])
            for kk in range(vector_k, k):
                memref.store(self.load(a, [*row, self.cidx(kk)]), self.panel,
                             [local, self.cidx(kk)])
            scf.yield_([])

    def weight_vector(self, w, n, k) -> ir.Value:
        """WIDTH values of row `n` of expert e's transposed matrix `w` from
        `k` along K, as f32."""
        if w.dtype == "fp8_e4m3":
            return dequantized(self, w, [self.e, n], k, self.WIDTH)
        return self.vload(w, [self.e, n, k], self.WIDTH)

    # -- experts (E, N, K): dot products along K ---------------------------

    def transposed_blocks(self, rows) -> None:
        """Every column in groups of COLUMNS / matrices (the last group's
        columns past N computed again from the last one, stored to its
        place), each over the tile's rows while its rows of the matrices
        stay in the caches: groups of ROWS rows by blocks of PER_ROW /
        matrices of its columns, then the rows left one at a time by the
        whole group (16 accumulators: more weight rows read at once at
        decode)."""
        nw = len(self.weights)
        cols, narrow = max(1, self.COLUMNS // nw), max(1, self.PER_ROW // nw)
        groups = -(-self.n // cols)
        last = self.cidx(self.n - 1)
        whole = arith.muli(arith.divui(rows, self.cidx(self.ROWS)), self.cidx(self.ROWS))
        loop = self.lane_loop(self.cidx(groups))
        with ir.InsertionPoint(loop.body):
            col = arith.muli(loop.induction_variable, self.cidx(cols))
            columns = [arith.minui(arith.addi(col, self.cidx(c)), last) if c else col
                       for c in range(cols)]
            steps = scf.ForOp(self.cidx(0), whole, self.cidx(self.ROWS))
            with ir.InsertionPoint(steps.body):
                row = steps.induction_variable
                block = [arith.addi(row, self.cidx(r)) if r else row for r in range(self.ROWS)]
                for c in range(0, cols, narrow):
                    self.dot_block(block, columns[c:c + narrow])
                scf.yield_([])
            rest = scf.ForOp(whole, rows, self.cidx(1))
            with ir.InsertionPoint(rest.body):
                self.dot_block([rest.induction_variable], columns)
                scf.yield_([])
            scf.yield_([])

    def dot_block(self, rows: list, columns: list) -> None:
        """The outputs of panel rows `rows` and columns `columns`: one
        16-lane accumulator per (row, matrix, column) along the whole
        vectors of K, summed across lanes together per row, then K's last
        values one by one."""
        width, k = self.WIDTH, self.k
        vector_k = k - k % width
        nw, nc = len(self.weights), len(columns)
        per_row = nw * nc
        accs = [self.vzero(width) for _ in range(len(rows) * per_row)]
        if self.bf16_panel is not None and len(rows) > 1:
            vector_k = k - k % BF16_STEP
            if vector_k:
                kloop = scf.ForOp(self.cidx(0), self.cidx(vector_k), self.cidx(BF16_STEP), accs)
                with ir.InsertionPoint(kloop.body):
                    kk = kloop.induction_variable
                    pairs = ir.VectorType.get([BF16_STEP], element_type("bf16"))
                    a = [vector.load(pairs, self.bf16_panel, [row, kk]) for row in rows]
                    b = [vector.load(pairs, self.buf(w), [self.e, n, kk])
                         for w in self.weights for n in columns]
                    carried = list(kloop.inner_iter_args)
                    scf.yield_([dot_bf16(carried[r * per_row + j], a[r], b[j])
                                for r in range(len(rows)) for j in range(per_row)])
                accs = list(kloop.results)
        elif all(w.dtype == "fp8_e4m3" for w in self.weights):
            accs = self.fp8_dots(rows, columns, accs)
        elif vector_k:
            kloop = scf.ForOp(self.cidx(0), self.cidx(vector_k), self.cidx(width), accs)
            with ir.InsertionPoint(kloop.body):
                kk = kloop.induction_variable
                a = [vector.load(self.vtype(width), self.panel, [row, kk]) for row in rows]
                b = [self.weight_vector(w, n, kk) for w in self.weights for n in columns]
                carried = list(kloop.inner_iter_args)
                scf.yield_([vector.fma(a[r], b[j], carried[r * per_row + j])
                            for r in range(len(rows)) for j in range(per_row)])
            accs = list(kloop.results)
        totals = []
        for r in range(len(rows)):
            sums = self.each_sum(accs[r * per_row:(r + 1) * per_row])
            totals += [vector.extract(sums, [], [j]) for j in range(per_row)]
        if vector_k < k:
            tail = scf.ForOp(self.cidx(vector_k), self.cidx(k), self.cidx(1), totals)
            with ir.InsertionPoint(tail.body):
                kk = tail.induction_variable
                carried = list(tail.inner_iter_args)
                xs = [memref.load(self.panel, [row, kk]) for row in rows]
                ws = [self.load(w, [self.e, n, kk]) for w in self.weights for n in columns]
                scf.yield_([arith.addf(carried[r * per_row + j], arith.mulf(xs[r], ws[j]))
                            for r in range(len(rows)) for j in range(per_row)])
            totals = list(tail.results)
        out = self.destination()
        for r, row in enumerate(rows):
            token, choice = self.output_pair(row)
            for c, n in enumerate(columns):
                sums = [totals[r * per_row + m * nc + c] for m in range(nw)]
                self.store(self.finish(token, choice, n, sums), out, [token, choice, n])

    def fp8_dots(self, rows: list, columns: list, accs: list) -> list:
        """`dot_block`'s accumulators for fp8_e4m3 matrices (K a multiple of
        their blocks of 32), a block of each column at a time: its 32
        values converted without their scale (`matmul_fp8.unscaled`), their
        products with each row summed in 16 lanes, then added to the
        accumulator times the block's scale (`block_scale`): one scale
        load and multiply per block and column, not one per 16 values."""
        width, block = self.WIDTH, FP8.block
        per_row = len(self.weights) * len(columns)
        kloop = scf.ForOp(self.cidx(0), self.cidx(self.k), self.cidx(block), accs)
        with ir.InsertionPoint(kloop.body):
            kk = kloop.induction_variable
            k_half = arith.addi(kk, self.cidx(width))
            a = [[vector.load(self.vtype(width), self.panel, [row, at]) for at in (kk, k_half)]
                 for row in rows]
            carried = list(kloop.inner_iter_args)
            updated = list(carried)
            j = 0
            for w in self.weights:
                for n in columns:
                    q = [unscaled(self, w, [self.e, n], at, width) for at in (kk, k_half)]
                    scale = self.vsplat(block_scale(self, w, [self.e, n], kk), width)
                    for r in range(len(rows)):
                        products = vector.fma(a[r][1], q[1], arith.mulf(a[r][0], q[0]))
                        index = r * per_row + j
                        updated[index] = vector.fma(scale, products, carried[index])
                    j += 1
            scf.yield_(updated)
        return list(kloop.results)

    # -- experts (E, K, N): rows of the matrices streamed ---------------------

    def streamed_rows(self, rows) -> None:
        """Up to FEW_ROWS rows (decode): each k step reads KSTEP whole rows
        of every matrix, N wide, one long run each, into sums of all of N
        (`stream_chunk`); more rows: the same by chunks of CHUNK columns,
        whose sums for the tile's rows stay in L1."""
        few = arith.cmpi(arith.CmpIPredicate.ule, rows, self.cidx(self.FEW_ROWS))
        branch = scf.IfOp(few, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.stream_columns(rows, self.n, self.FEW_ROWS)
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            self.stream_columns(rows, min(self.n, self.CHUNK), self.op.tile[0])
            scf.yield_([])

    def stream_columns(self, rows, chunk: int, most: int) -> None:
        """N by chunks of `chunk` columns (the last one narrower), each
        over the tile's `rows` (at most `most`)."""
        nw = len(self.weights)
        sums = self.entry_alloca(ir.MemRefType.get([nw, most, chunk], self.f32))
        whole = self.n - self.n % chunk
        if whole:
            loop = self.lane_loop(self.cidx(whole // chunk))
            with ir.InsertionPoint(loop.body):
                self.stream_chunk(sums, rows, arith.muli(loop.induction_variable,
                                                         self.cidx(chunk)), chunk)
                scf.yield_([])
        if self.n % chunk:
            self.stream_chunk(sums, rows, self.cidx(whole), self.n % chunk)

    def stream_chunk(self, sums, rows, c0, width: int) -> None:
        """Outputs [c0, c0 + width) of the tile's `rows`: k outermost, each
        step of KSTEP reading those rows of every matrix once and adding
        their products with each panel row's KSTEP values to its sums
        (`sums`, [matrix, row, column]); then each row's outputs stored."""
        vectors = width - width % self.WIDTH
        vtype = self.vtype(self.WIDTH)
        zero = self.vzero(self.WIDTH)

        def columns(body) -> None:
            """`body(column, lanes)` for the chunk's vectors, then its
            columns past the last vector one at a time."""
            if vectors:
                loop = scf.ForOp(self.cidx(0), self.cidx(vectors), self.cidx(self.WIDTH))
                with ir.InsertionPoint(loop.body):
                    body(loop.induction_variable, self.WIDTH)
                    scf.yield_([])
            for column in range(vectors, width):
                body(self.cidx(column), 1)

        def load(m, row, column, lanes: int):
            if lanes > 1:
                return vector.load(vtype, sums, [self.cidx(m), row, column])
            return memref.load(sums, [self.cidx(m), row, column])

        def store(value, m, row, column, lanes: int) -> None:
            if lanes > 1:
                vector.store(value, sums, [self.cidx(m), row, column])
            else:
                memref.store(value, sums, [self.cidx(m), row, column])

        each_row = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(each_row.body):
            row = each_row.induction_variable
            columns(lambda column, lanes: [
                store(zero if lanes > 1 else self.cf32(0.0), m, row, column, lanes)
                for m in range(len(self.weights))])
            scf.yield_([])

        groups = arith.muli(arith.divui(rows, self.cidx(self.ROWS)), self.cidx(self.ROWS))

        def step(k, depth: int) -> None:
            """Adds the products of rows [k, k + depth) of the matrices,
            each vector of them loaded once for ROWS panel rows."""
            ks = [arith.addi(k, self.cidx(j)) if j else k for j in range(depth)]

            def add_rows(panel_rows: list) -> None:
                xs = [[memref.load(self.panel, [row, kk]) for kk in ks] for row in panel_rows]
                splats = [[self.vsplat(x, self.WIDTH) for x in row_xs] for row_xs in xs]

                def add(column, lanes: int) -> None:
                    at = arith.addi(c0, column)
                    for m, w in enumerate(self.weights):
                        if lanes > 1:
                            ws = [self.vload(w, [self.e, kk, at], lanes) for kk in ks]
                        else:
                            ws = [self.load(w, [self.e, kk, at]) for kk in ks]
                        for r, row in enumerate(panel_rows):
                            total = load(m, row, column, lanes)
                            for j in range(depth):
                                total = vector.fma(splats[r][j], ws[j], total) if lanes > 1 \
                                    else arith.addf(total, arith.mulf(xs[r][j], ws[j]))
                            store(total, m, row, column, lanes)
                columns(add)

            in_groups = scf.ForOp(self.cidx(0), groups, self.cidx(self.ROWS))
            with ir.InsertionPoint(in_groups.body):
                row = in_groups.induction_variable
                add_rows([arith.addi(row, self.cidx(r)) if r else row for r in range(self.ROWS)])
                scf.yield_([])
            rest = scf.ForOp(groups, rows, self.cidx(1))
            with ir.InsertionPoint(rest.body):
                add_rows([rest.induction_variable])
                scf.yield_([])

        kstep = self.KSTEP
        whole = self.k - self.k % kstep
        if whole:
            kloop = scf.ForOp(self.cidx(0), self.cidx(whole), self.cidx(kstep))
            with ir.InsertionPoint(kloop.body):
                step(kloop.induction_variable, kstep)
                scf.yield_([])
        for kk in range(whole, self.k):
            step(self.cidx(kk), 1)
        out = self.destination()
        finish = scf.ForOp(self.cidx(0), rows, self.cidx(1))
        with ir.InsertionPoint(finish.body):
            row = finish.induction_variable
            token, choice = self.output_pair(row)

            def put(column, lanes: int) -> None:
                at = arith.addi(c0, column)
                value = self.finish(token, choice, at, [load(m, row, column, lanes)
                                                        for m in range(len(self.weights))])
                index = [token, choice, at]
                if lanes > 1:
                    self.vstore(value, out, index)
                else:
                    self.store(value, out, index)
            columns(put)
            scf.yield_([])


class MoeUpVectorCPU(ExpertVectorCPU, MoeUp):
    """`MoeUp` by vector multiply-adds with float or fp8 w1 (and w_up),
    gate and up over the same panel of x rows, stored as silu(gate) x up."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu" and cls.reads(op, _up_weights(op))

    def emit(self) -> None:
        self.multiply_experts(_up_weights(self.op))

    def activation_row(self, token, choice) -> tuple:
        return self.op.operands[0], [token]

    def destination(self):
        return self.op.buffers["hidden"]

    def finish(self, token, choice, column, sums: list) -> ir.Value:
        e = self.ti[0]
        up = self.biased("b_up", e, column, sums[1]) if len(sums) > 1 else None
        return activate(self, self.biased("b1", e, column, sums[0]), up)


class MoeDownVectorCPU(ExpertVectorCPU, MoeDown):
    """`MoeDown` by vector multiply-adds with float or fp8 w2 over a panel
    of hidden rows, times the routing weight."""

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.kind == "cpu" and cls.reads(op, [op.operands[3]])

    def emit(self) -> None:
        self.multiply_experts([self.op.operands[3]])

    def activation_row(self, token, choice) -> tuple:
        return self.op.buffers["hidden"], [token, choice]

    def destination(self):
        return self.op.buffers["partial"]

    def finish(self, token, choice, column, sums: list) -> ir.Value:
        weight = self.load(self.op.buffers["weights"], [token, choice])
        if isinstance(sums[0].type, ir.VectorType):
            weight = self.vsplat(weight, ir.VectorType(sums[0].type).shape[0])
        return arith.mulf(weight, self.biased("b2", self.ti[0], column, sums[0]))


#: bf16 values of each operand per `vdpbf16ps` (a 512-bit register).
BF16_STEP = 32


def _up_weights(op) -> list:
    """The expert matrices the up tile reads: w1, and w_up when gated."""
    return [op.operands[2], *([operand(op, "w_up")] if op.params.get("gated") else [])]


def choose_up(op, target) -> type:
    """The up tile's kernel for moe `op` on `target`."""
    for kernel in (MoeUpPackedCPU, MoeUpVectorCPU):
        if kernel.applies(op, target):
            return kernel
    return MoeUp


def choose_down(op, target) -> type:
    """The down tile's kernel for moe `op` on `target`."""
    for kernel in (MoeDownPackedCPU, MoeDownVectorCPU):
        if kernel.applies(op, target):
            return kernel
    return MoeDown
