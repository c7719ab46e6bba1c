"""The expert tiles of `moe` (ops/moe.py): tile (e, j) of the padded
(E, ceil(T / m)) grid takes expert e's routed slots offsets[e] +
[j m, min((j + 1) m, count_e)), each a (token, choice) pair, and computes

    up    hidden[t, c, :] = silu(x[t] @ w1[e]) (times x[t] @ w_up[e], gated)
    down  partial[t, c, :] = weights[t, c] * (hidden[t, c] @ w2[e])

Experts are (E, H, F) / (E, F, H) matrices, or with `transpose_w` their
transposes (E, F, H) / (E, H, F): rows of their inputs' values, llama.cpp's
layout and the one packed experts (a format of `etc.packed`) are stored in.

Kernels:
* `MoeUp`, `MoeDown` (every target; on CUDA a lane is a thread): one
  output element per lane iteration with a serial reduction. They read
  experts of any dtype through `TileKernel.load`, which dequantizes a
  packed expert's values one at a time in registers (`packed_loads`, the
  float32 operations of `etc.packed.dequantize`): the widened experts'
  products up to the order of the sums.
* `MoeUpPackedCPU`, `MoeDownPackedCPU` (the CPU, experts in a GGML block
  format; fp8_e4m3 experts take `MoeUp`, `MoeDown`): the
  packed matmul's int8 dot products (`matmul_packed.PackedDotsCPU`, as
  `MatmulPackedCPU` computes a dense layer): the tile's rows of
  activations (x[t], or hidden[t, c] for down) are quantized once into a
  stack panel, then multiplied with expert e's rows of blocks (the
  stacked weight's rows [e, n], byte offset e N row bytes), gate and up
  one after the other over the same panel.

Every kernel keeps the tasks' footprints and events: only the tile's reads
of the experts differ.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from .matmul_packed import MatmulPackedCPU, PackedDotsCPU
from .variants import PartKernel


class ExpertTile(PartKernel):
    """A tile (e, j) of the padded expert grid."""

    grid_rank = 2

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
                *op.operands[4:]]

    def emit(self) -> None:
        x, w1 = self.op.operands[0], self.op.operands[2]
        w_up = self.op.operands[4] if self.op.params.get("gated") else None
        hidden = self.op.buffers["hidden"]
        loop, t, c, f = self.expert_slots(self.outputs(w1))
        e = self.ti[0]
        with ir.InsertionPoint(loop.body):
            total = self.reduce_row(self.dim(x, 1), self.cf32(0.0), lambda acc, h: arith.addf(
                acc, arith.mulf(self.load(x, [t, h]), self.expert_value(w1, e, h, f))))
            value = self.unary("silu", total)
            if w_up is not None:
                up = self.reduce_row(self.dim(x, 1), self.cf32(0.0), lambda acc, h: arith.addf(
                    acc, arith.mulf(self.load(x, [t, h]), self.expert_value(w_up, e, h, f))))
                value = arith.mulf(value, up)
            self.store(value, hidden, [t, c, f])
            scf.yield_([])


class MoeDown(ExpertTile):
    """partial[t, c, :] = weight[t, c] * (hidden[t, c] @ w2[e])."""

    part = "down"

    @classmethod
    def tensors(cls, op) -> list:
        w1, w2 = op.operands[2:4]
        buffers = op.buffers
        return [w1, w2, buffers["offsets"], buffers["slots"], buffers["hidden"],
                buffers["partial"], buffers["weights"]]

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
            self.store(arith.mulf(weight, total), partial, [t, c, col])
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
        if not self.op.params.get("gated"):
            self.store(self.unary("silu", total), hidden, index)
        elif self.stage == 0:  # the gate's product, until the up one's
            self.store(total, hidden, index)
        else:
            gate = self.unary("silu", self.load(hidden, index))
            self.store(arith.mulf(gate, total), hidden, index)


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
        self.store(arith.mulf(weight, total), self.op.buffers["partial"],
                   [token, choice, column])


def _up_weights(op) -> list:
    """The expert matrices the up tile reads: w1, and w_up when gated."""
    return [op.operands[2], *op.operands[4:]]


def choose_up(op, target) -> type:
    """The up tile's kernel for moe `op` on `target`."""
    return MoeUpPackedCPU if MoeUpPackedCPU.applies(op, target) else MoeUp


def choose_down(op, target) -> type:
    """The down tile's kernel for moe `op` on `target`."""
    return MoeDownPackedCPU if MoeDownPackedCPU.applies(op, target) else MoeDown
