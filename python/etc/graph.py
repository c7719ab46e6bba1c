"""The `etc.Graph` front end: tiled operators over symbolic shapes, built as L1 IR.

A `Graph` records symbolic dimensions, input buffers, operators and outputs
(the values of `etc.graph_values`), checking shapes and dtypes as each call
is made. This module holds the graph itself: declarations, the record, the
general operators (matmul, elementwise, row-wise, topk), and `build`. The
operators of LLM inference come from `etc.graph_llm`, the collectives from
`etc.graph_collective`, Mixture-of-Experts from `etc.graph_moe`.
`Graph.build()` turns the record into an L1 `event.graph`
(`etc.graph_to_mlir`, which also states the conventions of the built IR);
`Graph.to_mlir()` prints it. What each operator's tasks
touch (footprints, explicit events) and how a tile computes live in the
operator families of `etc.ops`.

Conventions of the recorded values:

* `topk` indices, `argmax` results and the routing buffers of `moe` are
  `i32` tensors; users may declare `i32` inputs (token ids, positions,
  lengths), which only the operators that take indices accept: every other
  operator rejects integer operands;
* a *packed* input (dtype a block format of `etc.packed`: "q8_0", "q4_k",
  ...) is a weight stored in its blocks, of shape (..., K) with K whole
  blocks: only `matmul`'s `b` (with `transpose_b`) and `embedding`'s
  table take one, and dequantize it in their tiles;
* a *state* buffer (`state()`, e.g. a KV cache) is passed like an input but
  holds data that outlives one run: the caller's array is the buffer, and
  operators that update it (`kv_append`) write it in place, ordered with
  its reads by dependency inference like any other buffer.
"""

from __future__ import annotations

from typing import Optional, Sequence

from mlir import ir

from . import ops, packed
from .graph_collective import CollectiveOperators
from .graph_llm import LLMOperators, RaggedBatch, norm_eps, norm_offset
from .graph_moe import MoeOperators
from .graph_to_mlir import build_module
from .graph_values import (Argument, CeilDiv, Dim, Operation, Symbol, Tensor, describe,
                           format_shape, same_dim)
from .ops.base import DEFAULT_COLS, DEFAULT_ROWS, INDEX_DTYPE
from .runtime.ranges import IndexRange

__all__ = ["Argument", "CeilDiv", "Graph", "Symbol", "Tensor", "Operation", "RaggedBatch",
           "DTYPES"]

#: The element types of the tensors floating-point operators take.
DTYPES = ("f32", "f16", "bf16")
#: The element types an input may have: the float types, `i32` for
#: indices (token ids, positions, lengths) and the packed weight formats.
INPUT_DTYPES = DTYPES + (INDEX_DTYPE,) + tuple(packed.FORMATS)
#: The element types a state buffer may have: those whose storage NumPy can
#: hold, so that the caller's array is the buffer (bf16 as a uint16 array of
#: bf16 bit patterns, like bf16 weights).
STATE_DTYPES = ("f32", "f16", "bf16", INDEX_DTYPE)
#: The largest static dimension: memref sizes and indices are signed 64-bit.
_MAX_INDEX = 2**63 - 1


class Graph(LLMOperators, CollectiveOperators, MoeOperators):
    """A graph of tiled operators with symbolic dimensions.

    ```python
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 256), "f32")
    w = g.input("w", (256, 512), "f32")
    g.output(g.silu(g.matmul(x, w)))
    print(g.to_mlir())
    ```

    The operators of LLM inference (embedding, rope, head_rmsnorm,
    kv_append, attention, argmax, sample, ragged_batch) come from
    `etc.graph_llm.LLMOperators`, the collectives (all_gather,
    reduce_scatter, all_reduce) from
    `etc.graph_collective.CollectiveOperators`.

    `ranks=N` makes a graph that runs on N devices at once, each its own
    copy on its own inputs (see docs/distributed.md).
    """

    def __init__(self, name: str, *, ranks: int = 1):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"Graph: name must be an identifier, got {name!r}")
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"Graph: ranks={ranks!r} must be a positive int (the number of "
                             f"devices the graph runs on)")
        self.name = name
        #: The number of devices (ranks) that each run a copy of the graph.
        self.ranks = ranks
        # Tensors in the symmetric heap (ids): written by other ranks' puts.
        self._symmetric_tensors: set[int] = set()
        self._symbols: list[Symbol] = []
        self._tensors: list[Tensor] = []
        self._ops: list[Operation] = []
        self._outputs: list[Tensor] = []
        self._names: set[str] = set()
        self._kind_counts: dict[str, int] = {}
        self._index_ranges: dict[str, IndexRange] = {}
        self._ragged_batches: list[dict] = []

    # ------------------------------------------------------------------
    # Declarations
    # ------------------------------------------------------------------

    def _claim_name(self, what: str, name) -> str:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{what}: name must be a Python identifier, got {name!r}")
        if name in self._names:
            raise ValueError(f"{what}: name {name!r} is already used in graph '{self.name}'")
        self._names.add(name)
        return name

    def symbol(self, name: str) -> Symbol:
        """Declares a symbolic dimension, bound at run time from input shapes."""
        sym = Symbol(self, self._claim_name("symbol", name))
        self._symbols.append(sym)
        return sym

    def _check_dtype(self, what: str, dtype, allowed: tuple = DTYPES) -> str:
        if not isinstance(dtype, str) or dtype not in allowed:
            raise ValueError(
                f"{what}: unknown dtype {dtype!r} (argument 'dtype'; expected one of "
                f"{', '.join(allowed)})")
        return dtype

    def _check_shape(self, what: str, shape) -> tuple:
        if isinstance(shape, (int, Symbol, str)):
            shape = (shape,)
        try:
            dims = tuple(shape)
        except TypeError:
            raise ValueError(f"{what}: shape must be a tuple of ints and symbols, got {shape!r}")
        if len(dims) not in (1, 2, 3):
            raise ValueError(f"{what}: shape {dims!r} has rank {len(dims)}; ranks 1 to 3 are supported")
        out = []
        for d in dims:
            if isinstance(d, Symbol):
                if d.graph is not self:
                    raise ValueError(
                        f"{what}: symbol '{d.name}' belongs to graph '{d.graph.name}', "
                        f"not '{self.name}'")
                out.append(d)
            elif isinstance(d, str):
                match = [s for s in self._symbols if s.name == d]
                if not match:
                    raise ValueError(f"{what}: unknown symbol {d!r} in shape {dims!r}")
                out.append(match[0])
            elif isinstance(d, int) and not isinstance(d, bool):
                if d < 1:
                    raise ValueError(f"{what}: dimension {d} in shape {dims!r} must be positive")
                if d > _MAX_INDEX:
                    raise ValueError(f"{what}: dimension {d} in shape {dims!r} does not fit a "
                                     f"64-bit index (at most 2**63 - 1)")
                out.append(d)
            else:
                raise ValueError(f"{what}: dimension {d!r} in shape {dims!r} is not an int or a symbol")
        return tuple(out)

    def _new_tensor(self, name, shape, dtype, kind) -> Tensor:
        t = Tensor(self, name, shape, dtype, kind, len(self._tensors))
        self._tensors.append(t)
        return t

    def input(self, name: str, shape: Sequence[Dim], dtype: str = "f32") -> Tensor:
        """Declares an input buffer. Dims are ints, `Symbol`s or symbol names.
        `dtype` is "f32", "f16", "bf16", or "i32" for indices (token ids,
        positions, lengths), which only index-taking operators accept, or a
        packed weight format of `etc.packed` ("q8_0", "q4_k", ...): a 2-D
        weight (N, K), or a stack of them (E, N, K) (MoE experts), K a
        static multiple of the format's block, whose array is the blocks
        (uint8 (..., N, bytes of K values), as a GGUF file stores them);
        `matmul` (as `b`, with `transpose_b`), `embedding` (as the table)
        and `moe` (as experts, with `transpose_w`) read it."""
        what = f"input '{name}'"
        self._check_dtype(what, dtype, INPUT_DTYPES)
        shape = self._check_shape(what, shape)
        if packed.is_packed(dtype):
            block = packed.FORMATS[dtype].block
            if len(shape) not in (2, 3) or not isinstance(shape[-1], int) or shape[-1] % block:
                raise ValueError(f"{what}: a {dtype} weight is 2-D (N, K), or 3-D (E, N, K) "
                                 f"for stacked experts, with K a static multiple of its block "
                                 f"of {block} values, got shape {format_shape(shape)}")
        return self._new_tensor(self._claim_name("input", name), shape, dtype, "input")

    def state(self, name: str, shape: Sequence[Dim], dtype: str = "f32") -> Tensor:
        """Declares a state buffer: data that persists across runs, such as a
        KV cache. It is passed to `run` like an input, and the caller's
        array *is* the buffer: operators that update it (`kv_append`) write
        into that array in place, so the next run sees what this one
        wrote. Reads and writes of a state are ordered within a run by
        dependency inference, in call order. `dtype` is "f32", "f16",
        "bf16" or "i32"; the caller's array has the storage dtype, with no
        conversion (float32, float16, uint16 bf16 bit patterns, int32)."""
        what = f"state '{name}'"
        self._check_dtype(what, dtype, STATE_DTYPES)
        shape = self._check_shape(what, shape)
        return self._new_tensor(self._claim_name("state", name), shape, dtype, "state")

    def index_range(self, index: Tensor, *, low: int = 0, below: Optional[Dim] = None,
                    at_most: Optional[Dim] = None) -> None:
        """Declares the values the i32 input `index` must hold: at least
        `low`, less than `below` and at most `at_most` (ints or symbols of
        this graph, or (symbol, factor) pairs: the symbol times an int, e.g.
        the positions a paged batch's block tables hold). Operators that
        would index out of bounds with other values declare it; every
        runtime checks the input against the range, with the symbols bound,
        before a run (`etc.runtime.ranges`). Several calls narrow the
        range."""
        what = "index_range"
        if not isinstance(index, Tensor) or index.graph is not self or index.kind != "input" \
                or index.dtype != "i32":
            raise ValueError(f"{what}: 'index' must be an i32 input of graph '{self.name}', "
                             f"got {index!r}")
        if isinstance(low, bool) or not isinstance(low, int):
            raise ValueError(f"{what}: 'low' must be an int, got {low!r}")
        highs = []
        for role, dim, offset in (("below", below, -1), ("at_most", at_most, 0)):
            if dim is None:
                continue
            if isinstance(dim, Symbol) and dim.graph is self:
                highs.append((dim.name, offset))
            elif isinstance(dim, tuple) and len(dim) == 2 and isinstance(dim[0], Symbol) and \
                    dim[0].graph is self and isinstance(dim[1], int) and \
                    not isinstance(dim[1], bool) and dim[1] >= 1:
                highs.append((f"{dim[0].name}*{dim[1]}", offset))
            elif isinstance(dim, int) and not isinstance(dim, bool):
                highs.append((dim + offset, 0))
            else:
                raise ValueError(f"{what}: {role!r} must be an int, a symbol of graph "
                                 f"'{self.name}' or a (symbol, positive int) product, got "
                                 f"{dim!r}")
        declared = IndexRange(low, tuple(highs))
        earlier = self._index_ranges.get(index.name)
        self._index_ranges[index.name] = earlier.merged(declared) if earlier else declared

    @property
    def index_ranges(self) -> dict:
        """The declared ranges of the index inputs, by name (`IndexRange`)."""
        return dict(self._index_ranges)

    @property
    def ragged_batches(self) -> tuple:
        """The index inputs of each `ragged_batch`, by role; runtimes check
        that they describe a consistent batch (`etc.runtime.ranges.check_ragged`)."""
        return tuple(dict(batch) for batch in self._ragged_batches)

    def tensor(self, name: str, shape: Sequence[Dim], dtype: str = "f32") -> Tensor:
        """Declares a scratch buffer that operators write with `out=` (buffer reuse)."""
        what = f"tensor '{name}'"
        self._check_dtype(what, dtype)
        shape = self._check_shape(what, shape)
        return self._new_tensor(self._claim_name("tensor", name), shape, dtype, "scratch")

    def output(self, *tensors: Tensor) -> None:
        """Marks tensors as outputs, in call order."""
        for t in tensors:
            if not isinstance(t, Tensor):
                raise ValueError(f"output: expected a Tensor, got {t!r}")
            if t.graph is not self:
                raise ValueError(
                    f"output: tensor '{t.name}' is not produced by graph '{self.name}' "
                    f"(it belongs to graph '{t.graph.name}')")
            if t.kind == "input":
                raise ValueError(f"output: tensor '{t.name}' is an input of graph "
                                 f"'{self.name}'; outputs must be produced by an operator")
            if t.kind == "state":
                raise ValueError(f"output: tensor '{t.name}' is a state buffer of graph "
                                 f"'{self.name}'; it is updated in the caller's array, "
                                 f"so it cannot also be an output")
            if self.is_symmetric(t):
                raise ValueError(f"output: tensor '{t.name}' lives in the symmetric heap (other "
                                 f"ranks put into it), so it cannot be an output; read it with "
                                 f"an operator")
            if not t._written:
                raise ValueError(f"output: tensor '{t.name}' is never produced by graph "
                                 f"'{self.name}' (no operator writes it)")
            if any(o is t for o in self._outputs):
                raise ValueError(f"output: tensor '{t.name}' is already an output")
            self._outputs.append(t)

    # ------------------------------------------------------------------
    # Metadata
    # ------------------------------------------------------------------

    @property
    def symbols(self) -> list[str]:
        return [s.name for s in self._symbols]

    @property
    def outputs(self) -> list[str]:
        return [t.name for t in self._outputs]

    @property
    def inputs(self) -> list[str]:
        return [t.name for t in self._tensors if t.kind == "input"]

    @property
    def states(self) -> list[str]:
        """The state buffers, in creation order."""
        return [t.name for t in self._tensors if t.kind == "state"]

    @property
    def operations(self) -> tuple:
        """The recorded operator calls, in call order."""
        return tuple(self._ops)

    def argument_tensors(self) -> list[tuple[str, Tensor]]:
        """The buffer arguments in order, as (kind, Tensor) pairs: the
        `arguments` after the symbols (see `etc.graph_to_mlir`)."""
        ins = [("input", t) for t in self._tensors if t.kind == "input"]
        states = [("state", t) for t in self._tensors if t.kind == "state"]
        outs = [("output", t) for t in self._outputs]
        inter = [("intermediate", t) for t in self._tensors
                 if t.kind not in ("input", "state") and not any(o is t for o in self._outputs)]
        return ins + states + outs + inter

    @property
    def arguments(self) -> list[Argument]:
        """The graph arguments in order (see `etc.graph_to_mlir`)."""
        args = [Argument("symbol", s.name, (), "index") for s in self._symbols]
        for kind, t in self.argument_tensors():
            args.append(Argument(kind, t.name, t.symbolic_shape, t.dtype))
        return args

    def is_symmetric(self, t: Tensor) -> bool:
        """Whether `t` lives in the symmetric heap: other ranks put into it
        (the results and staging buffers of the collectives)."""
        return id(t) in self._symmetric_tensors

    def tensor_by_name(self, name: str) -> Tensor:
        for t in self._tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    # ------------------------------------------------------------------
    # Operators
    # ------------------------------------------------------------------

    def _next_name(self, kind: str) -> str:
        k = self._kind_counts.get(kind, 0)
        self._kind_counts[kind] = k + 1
        return f"{kind}_{k}"

    def _check_operand(self, kind: str, role: str, t, ranks: tuple = (1, 2),
                       packed_ok: bool = False) -> Tensor:
        if not isinstance(t, Tensor):
            raise ValueError(f"{kind}: operand '{role}' must be a Tensor, got {t!r}")
        if t.graph is not self:
            raise ValueError(f"{kind}: operand '{role}' ('{t.name}') belongs to graph "
                             f"'{t.graph.name}', not '{self.name}'")
        if not t._written:
            raise ValueError(
                f"{kind}: operand '{role}' reads tensor '{t.name}' before anything writes it "
                f"(a cycle or an unproduced read)")
        if packed.is_packed(t.dtype) and not packed_ok:
            raise ValueError(f"{kind}: {describe(role, t)} is a packed weight; only matmul's "
                             f"'b' (with transpose_b), embedding's 'table' and moe's experts "
                             f"(with transpose_w) read packed weights")
        if t.dtype not in DTYPES and not packed.is_packed(t.dtype):
            raise ValueError(f"{kind}: {describe(role, t)} is an integer tensor; the operator "
                             f"takes {', '.join(DTYPES)} tensors")
        if t.rank not in ranks:
            expected = " or ".join(f"{r}-D" for r in ranks)
            raise ValueError(f"{kind}: {describe(role, t)} has rank {t.rank}; expected a "
                             f"{expected} tensor")
        return t

    def _fresh_name(self, base: str) -> str:
        """Claims `base`, or `base` with `_r` suffixes if it is taken."""
        while base in self._names:
            base += "_r"
        return self._claim_name("internal buffer", base)

    def _same_dtype(self, kind: str, operands: Sequence[tuple[str, Tensor]]) -> str:
        dtype = operands[0][1].dtype
        for role, t in operands[1:]:
            if t.dtype != dtype:
                raise ValueError(
                    f"{kind}: mixed dtypes: {describe(operands[0][0], operands[0][1])} "
                    f"vs {describe(role, t)}")
        return dtype

    def _check_tile(self, kind: str, tile, rank: int, default: tuple, shape: tuple) -> tuple:
        if tile is None:
            tile = default
        else:
            if isinstance(tile, int):
                tile = (tile,)
            tile = tuple(tile)
            if len(tile) != rank or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tile):
                raise ValueError(f"{kind}: tile {tile!r} must be {rank} positive int(s)")
        # Clamp each tile extent to a smaller static dimension.
        return tuple(min(t, d) if isinstance(d, int) else t for t, d in zip(tile, shape))

    def _finish(self, kind, operands, shape, dtype, tile, params, out, name) -> Tensor:
        opname = self._next_name(kind)
        if out is not None:
            if not isinstance(out, Tensor):
                raise ValueError(f"{kind}: out= must be a Tensor made by tensor(), got {out!r}")
            if out.graph is not self:
                raise ValueError(f"{kind}: out= tensor '{out.name}' belongs to graph "
                                 f"'{out.graph.name}', not '{self.name}'")
            if out.kind != "scratch":
                raise ValueError(f"{kind}: out= tensor '{out.name}' is an {out.kind} tensor; "
                                 f"only tensors made by tensor() can be written with out=")
            if out.shape != shape or out.dtype != dtype:
                raise ValueError(
                    f"{kind}: out= tensor '{out.name}' has shape {format_shape(out.shape)} and "
                    f"dtype {out.dtype}, but the result has shape {format_shape(shape)} and "
                    f"dtype {dtype}")
            for role, t in operands:
                if t is out:
                    raise ValueError(f"{kind}: out= tensor '{out.name}' is also operand "
                                     f"'{role}'; in-place operators are not supported")
            if name is not None:
                raise ValueError(f"{kind}: give either name= or out=, not both")
            result = out
            out._written = True
        else:
            if name is None:
                name = opname
                while name in self._names:
                    name += "_r"
            result = self._new_tensor(self._claim_name(kind, name), shape, dtype, "value")
        self._ops.append(Operation(kind, opname, tuple(t for _, t in operands), result,
                                   tile, dict(params)))
        return result

    def matmul(self, a: Tensor, b: Tensor, *, transpose_b: bool = False, tile=None,
               residual: Optional[Tensor] = None, out: Optional[Tensor] = None,
               name: Optional[str] = None) -> Tensor:
        """C = A @ B (or A @ B^T with `transpose_b`); A is (M, K), B (K, N) or (N, K).
        `tile=(m, n)` sets the output tile (default 32 x 64).

        `residual` (M, N), in C's dtype, is added to the product in the
        tiles that compute it: the same values as `add(residual, matmul(a,
        b))` (the product is rounded to C's dtype first), without a task
        and a synchronisation of its own (a transformer layer's residual
        connections).

        `b` may be a packed weight (N, K) (`input` with a format of
        `etc.packed`) with `transpose_b`: C takes A's dtype, and the tiles
        read the blocks (see docs/operators.md, "Packed weights")."""
        kind = "matmul"
        self._check_operand(kind, "a", a)
        self._check_operand(kind, "b", b, packed_ok=True)
        if a.rank != 2 or b.rank != 2:
            raise ValueError(f"{kind}: expects 2-D operands, got {describe('a', a)} and "
                             f"{describe('b', b)}")
        if packed.is_packed(b.dtype):
            if not transpose_b:
                raise ValueError(f"{kind}: {describe('b', b)} is a packed weight, stored by "
                                 f"rows of K values: it is read as B^T (transpose_b=True)")
            dtype = a.dtype
        else:
            dtype = self._same_dtype(kind, [("a", a), ("b", b)])
        m, k = a.shape
        kb, n = (b.shape[1], b.shape[0]) if transpose_b else b.shape
        if k is not kb and k != kb:
            which = "last" if transpose_b else "first"
            raise ValueError(
                f"{kind}: inner dimensions differ: {describe('a', a)} has K = {k} but "
                f"{describe('b', b)} has {which} dimension {kb}")
        shape = (m, n)
        operands = [("a", a), ("b", b)]
        if residual is not None:
            self._check_operand(kind, "residual", residual)
            if residual.dtype != dtype or residual.rank != 2 or not all(
                    same_dim(x, y) for x, y in zip(residual.shape, shape)):
                raise ValueError(f"{kind}: {describe('residual', residual)} must have the "
                                 f"product's shape {format_shape(shape)} and dtype {dtype}")
            operands.append(("residual", residual))
        user_tile = tile is not None
        tile = self._check_tile(kind, tile, 2, (DEFAULT_ROWS, DEFAULT_COLS), shape)
        result = self._finish(kind, operands, shape, dtype, tile,
                              {"transpose_b": bool(transpose_b)}, out, name)
        self._ops[-1].user_tile = user_tile
        return result

    def _unary(self, kind, x, tile, out, name, params=None) -> Tensor:
        self._check_operand(kind, "x", x)
        default = (DEFAULT_ROWS, DEFAULT_COLS) if x.rank == 2 else (DEFAULT_COLS,)
        user_tile = tile is not None
        tile = self._check_tile(kind, tile, x.rank, default, x.shape)
        result = self._finish(kind, [("x", x)], x.shape, x.dtype, tile, params or {}, out, name)
        self._ops[-1].user_tile = user_tile
        return result

    def _binary(self, kind, a, b, tile, out, name) -> Tensor:
        self._check_operand(kind, "a", a)
        self._check_operand(kind, "b", b)
        dtype = self._same_dtype(kind, [("a", a), ("b", b)])
        if a.shape == b.shape:
            shape = a.shape
        elif a.rank == 2 and b.rank == 1 and b.shape[0] == a.shape[1]:
            shape = a.shape
        elif b.rank == 2 and a.rank == 1 and a.shape[0] == b.shape[1]:
            shape = b.shape
        else:
            raise ValueError(
                f"{kind}: shapes do not match: {describe('a', a)} and {describe('b', b)} "
                f"(equal shapes, or a 1-D operand as long as the other's last dimension)")
        default = (DEFAULT_ROWS, DEFAULT_COLS) if len(shape) == 2 else (DEFAULT_COLS,)
        user_tile = tile is not None
        tile = self._check_tile(kind, tile, len(shape), default, shape)
        result = self._finish(kind, [("a", a), ("b", b)], shape, dtype, tile, {}, out, name)
        self._ops[-1].user_tile = user_tile
        return result

    def add(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """a + b elementwise; a 1-D operand is broadcast over the rows of a 2-D one."""
        return self._binary("add", a, b, tile, out, name)

    def mul(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """a * b elementwise; a 1-D operand is broadcast over the rows of a 2-D one."""
        return self._binary("mul", a, b, tile, out, name)

    def silu_mul(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """silu(a) * b elementwise (a SwiGLU MLP's gate times its up
        projection), with silu(a) rounded to the dtype first: the values
        of `mul(silu(a), b)` in one task instead of two. A 1-D operand is
        broadcast over the rows of a 2-D one."""
        return self._binary("silu_mul", a, b, tile, out, name)

    def gelu_mul(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """gelu(a) * b elementwise (a GeGLU MLP's gate times its up
        projection; `gelu`'s tanh approximation, transformers'
        gelu_pytorch_tanh), gelu(a) rounded to the dtype first, as
        `silu_mul`."""
        return self._binary("gelu_mul", a, b, tile, out, name)

    def sigmoid_mul(self, gate: Tensor, x: Tensor, *, tile=None, out=None,
                    name=None) -> Tensor:
        """sigmoid(gate) * x, the column `gate` (M, 1) broadcast over the
        columns of `x` (M, N): each row of x scaled by its own gate (the
        shared expert of Qwen2-MoE, sigmoid(x . w) per token). sigmoid(gate)
        is rounded to the dtype first, as `silu_mul` rounds silu(a).
        `tile=(m, n)` sets the output tile (default 32 x 64)."""
        kind = "sigmoid_mul"
        self._check_operand(kind, "gate", gate, ranks=(2,))
        self._check_operand(kind, "x", x, ranks=(2,))
        dtype = self._same_dtype(kind, [("gate", gate), ("x", x)])
        if gate.shape[1] != 1 or not same_dim(gate.shape[0], x.shape[0]):
            raise ValueError(f"{kind}: {describe('gate', gate)} must be a column "
                             f"{format_shape((x.shape[0], 1))}: one gate per row of "
                             f"{describe('x', x)}")
        user_tile = tile is not None
        tile = self._check_tile(kind, tile, 2, (DEFAULT_ROWS, DEFAULT_COLS), x.shape)
        result = self._finish(kind, [("gate", gate), ("x", x)], x.shape, dtype, tile, {}, out,
                              name)
        self._ops[-1].user_tile = user_tile
        return result

    def silu(self, x: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """x * sigmoid(x) = x / (1 + exp(-x))."""
        return self._unary("silu", x, tile, out, name)

    def gelu(self, x: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (tanh approximation)."""
        return self._unary("gelu", x, tile, out, name)

    def exp(self, x: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """exp(x) elementwise."""
        return self._unary("exp", x, tile, out, name)

    def scale(self, x: Tensor, c: float, *, tile=None, out=None, name=None) -> Tensor:
        """c * x for a Python float constant c."""
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise ValueError(f"scale: constant 'c' must be a Python float, got {c!r}")
        return self._unary("scale", x, tile, out, name, {"c": float(c)})

    def softcap(self, x: Tensor, c: float, *, tile=None, out=None, name=None) -> Tensor:
        """c tanh(x / c) for a positive Python float c: soft-capping of
        logits into (-c, c) (Gemma 2's final logits)."""
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0:
            raise ValueError(f"softcap: constant 'c' must be a positive Python float, got {c!r}")
        return self._unary("softcap", x, tile, out, name, {"c": float(c)})

    def _rowwise(self, kind, x, weight, tile, out, name, params, bias=None) -> Tensor:
        self._check_operand(kind, "x", x)
        if x.rank != 2:
            raise ValueError(f"{kind}: expects a 2-D operand (rows x features), got "
                             f"{describe('x', x)}")
        operands = [("x", x)]
        for label, vector in (("weight", weight), ("bias", bias)):
            if vector is None:
                continue
            self._check_operand(kind, label, vector)
            operands.append((label, vector))
            if vector.shape != (x.shape[1],):
                raise ValueError(
                    f"{kind}: {describe(label, vector)} must have shape "
                    f"{format_shape((x.shape[1],))} to match the last dimension of "
                    f"{describe('x', x)}")
        dtype = self._same_dtype(kind, operands)
        shape = (x.shape[0],) if kind == "sum" else x.shape
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, operands, shape, dtype, tile, params, out, name)

    def rmsnorm(self, x: Tensor, weight: Tensor, eps: float = 1e-6, *, offset: float = 0.0,
                tile=None, out=None, name=None) -> Tensor:
        """x / sqrt(mean(x^2 over the last dim) + eps) * (offset + weight),
        row by row, in float32 and rounded once (Gemma's norms: offset 1,
        the weight added to it in float32, not in the weight's dtype).
        `tile=(m,)` sets the rows per tile (default 32)."""
        return self._rowwise("rmsnorm", x, weight, tile, out, name,
                             {"eps": norm_eps("rmsnorm", eps), **norm_offset("rmsnorm", offset)})

    def layernorm(self, x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                  eps: float = 1e-5, *, tile=None, out=None, name=None) -> Tensor:
        """(x - mean) / sqrt(var + eps) * weight (+ bias), the mean and the
        (biased) variance over the last dim, row by row, in float32 and
        rounded once; `weight` and `bias` are (N,) of x's dtype. The
        variance is the mean of the squared deviations from the mean (two
        passes over the row, not E[x^2] - E[x]^2). `tile=(m,)` sets the rows
        per tile (default 32)."""
        return self._rowwise("layernorm", x, weight, tile, out, name,
                             {"eps": norm_eps("layernorm", eps)},
                             bias=bias)

    def softmax(self, x: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """Softmax over the last dimension (the row maximum is subtracted first)."""
        return self._rowwise("softmax", x, None, tile, out, name, {})

    def sum(self, x: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """Sum over the last dimension: (M, N) -> (M,)."""
        return self._rowwise("sum", x, None, tile, out, name, {})

    def topk(self, x: Tensor, k: int, *, tile=None,
             name: Optional[str] = None) -> tuple[Tensor, Tensor]:
        """The `k` largest values of each row of `x` (M, N) and their column
        indices, both (M, k), in decreasing order; equal values are ordered
        by lower index first. Values keep x's dtype, indices are i32 (named
        `<name>_indices`). N must be static. `tile=(m,)` sets the rows per
        tile (default 32)."""
        kind = "topk"
        self._check_operand(kind, "x", x)
        if x.rank != 2:
            raise ValueError(f"{kind}: expects a 2-D operand (rows x candidates), got "
                             f"{describe('x', x)}")
        n = x.shape[1]
        if not isinstance(n, int):
            raise ValueError(f"{kind}: the last dimension of {describe('x', x)} must be static "
                             f"so that 'k' can be checked against it")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"{kind}: 'k' = {k!r} is out of range for {describe('x', x)}: "
                             f"expected an int with 1 <= k <= {n}")
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        shape = (x.shape[0], k)
        values = self._finish(kind, [("x", x)], shape, x.dtype, tile, {"k": k}, None, name)
        indices = self._new_tensor(self._fresh_name(f"{values.name}_indices"), shape,
                                   INDEX_DTYPE, "value")
        self._ops[-1].extra_results = (indices,)
        return values, indices

    # ------------------------------------------------------------------
    # IR
    # ------------------------------------------------------------------

    def build(self, context: Optional[ir.Context] = None,
              target: Optional[ops.Target] = None) -> ir.Module:
        """Builds and verifies the L1 module (in `context`, or a new one),
        with the tile kernels chosen for `target` (default: the portable
        scalar kernels; `etc.compile` passes its target)."""
        if not self._outputs:
            raise ValueError(f"Graph '{self.name}' has no outputs: call output() before "
                             f"building it")
        ctx = context if context is not None else ir.Context()
        with ctx, ir.Location.unknown():
            module = build_module(self, target or ops.GENERIC)
            if not module.operation.verify():
                raise RuntimeError(f"Graph '{self.name}': the built L1 module does not verify")
        return module

    def to_mlir(self) -> str:
        """The L1 IR as text (arguments named after the graph's symbols and tensors)."""
        module = self.build()
        return module.operation.get_asm(use_name_loc_as_prefix=True)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, symbols={self.symbols}, inputs={self.inputs}, "
                f"ops={[op.name for op in self._ops]}, outputs={self.outputs})")
