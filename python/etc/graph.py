"""The `etc.Graph` front end: tiled operators over symbolic shapes, built as L1 IR.

A `Graph` records symbolic dimensions, input buffers, operators and outputs,
checking shapes and dtypes as each call is made. `Graph.build()` turns the
record into an L1 `event.graph` (one `event.task` per operator, with access
footprints and a target-neutral tile body) through the upstream `mlir`
bindings and the generated `event` op classes; `Graph.to_mlir()` prints it.

Conventions the rest of the compiler relies on:

* graph arguments: one `index` per symbol (creation order), the inputs
  (creation order), the outputs (`output()` order), then every other buffer
  (operator results that are not outputs, and `tensor()` scratch buffers) in
  creation order, marked with the unit attribute `event.intermediate`;
* one task per operator, named `<op>_<k>` (`matmul_0`, `add_1`, ...), in call
  order, except `moe`, which lowers to five tasks `moe_<k>_router`, `_route`,
  `_up`, `_down` and `_combine` plus explicit events for the accesses whose
  rows depend on routing data (see docs/moe.md);
* `topk` indices and the routing buffers of `moe` are `i32` tensors; users
  cannot declare integer inputs, and operators reject integer operands;
* tile bodies spread their elements (or rows, for row-wise operators) over
  lanes with `scf.for %e = event.lane_id to %n step event.lane_count`; each
  lane owns what it stores, so no lane barrier is needed;
* f16/bf16 values are extended to f32 after loading, computed and accumulated
  in f32, and truncated before storing.
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from mlir import ir
from mlir.dialects import affine, arith, math, memref, scf

from .dialects import event

__all__ = ["Argument", "Graph", "Symbol", "Tensor", "Operation", "DTYPES"]

#: The element types a user tensor may have.
DTYPES = ("f32", "f16", "bf16")
#: The element type of index results (`topk` indices, `moe` routing buffers).
INDEX_DTYPE = "i32"

_ELEMENTWISE_UNARY = ("silu", "gelu", "exp", "scale")
_ELEMENTWISE_BINARY = ("add", "mul")
_ROWWISE = ("rmsnorm", "softmax", "sum")

#: The largest static dimension: memref sizes and indices are signed 64-bit.
_MAX_INDEX = 2**63 - 1

#: Default tile extents: rows of every 2-D tile, columns of matmul and
#: elementwise tiles.
DEFAULT_ROWS = 32
DEFAULT_COLS = 64


@dataclass(frozen=True)
class Argument:
    """One argument of the built `event.graph`, in argument order.

    `kind` is "symbol", "input", "output" or "intermediate"; `shape` holds
    ints and symbol names (`()` for a symbol); `dtype` is "f32", "f16",
    "bf16", or "index" for a symbol.
    """

    kind: str
    name: str
    shape: tuple
    dtype: str


class Symbol:
    """A symbolic dimension of a graph (e.g. the batch size)."""

    __slots__ = ("graph", "name")

    def __init__(self, graph: "Graph", name: str):
        self.graph = graph
        self.name = name

    def __repr__(self) -> str:
        return f"Symbol({self.name!r})"

    def __str__(self) -> str:
        return self.name


Dim = Union[int, Symbol]


class Tensor:
    """A buffer of a graph: an input, an operator result or a scratch tensor.

    `kind` is "input" (from `Graph.input`), "value" (an operator's result) or
    "scratch" (from `Graph.tensor`, written through `out=`).
    """

    __slots__ = ("graph", "name", "shape", "dtype", "kind", "_written", "_order")

    def __init__(self, graph, name, shape, dtype, kind, order):
        self.graph = graph
        self.name = name
        self.shape: tuple = shape
        self.dtype: str = dtype
        self.kind: str = kind
        self._written = kind != "scratch"
        self._order = order

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def symbolic_shape(self) -> tuple:
        """The shape with symbols spelled as their names."""
        return tuple(d.name if isinstance(d, Symbol) else d for d in self.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {_fmt_shape(self.shape)}, {self.dtype!r})"


@dataclass
class Operation:
    """One recorded operator call: the task `name`, its `kind`, operand
    tensors, result tensor, tile and kind-specific parameters."""

    kind: str
    name: str
    operands: tuple
    result: Tensor
    tile: tuple
    params: dict = field(default_factory=dict)
    #: Further results after `result` (the indices of `topk`).
    extra_results: tuple = ()
    #: Internal buffers the operator lowers through, by role (`moe`).
    buffers: dict = field(default_factory=dict)


def _fmt_shape(shape) -> str:
    inner = ", ".join(str(d) for d in shape)
    if len(shape) == 1:
        inner += ","
    return f"({inner})"


def _same_dim(a: Dim, b: Dim) -> bool:
    """Dimensions are equal when they are the same symbol or equal ints."""
    if isinstance(a, Symbol) or isinstance(b, Symbol):
        return a is b
    return a == b


def _describe(role: str, t: Tensor) -> str:
    return f"operand '{role}' ('{t.name}', shape {_fmt_shape(t.shape)}, {t.dtype})"


class Graph:
    """A graph of tiled operators with symbolic dimensions.

    ```python
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 256), "f32")
    w = g.input("w", (256, 512), "f32")
    g.output(g.silu(g.matmul(x, w)))
    print(g.to_mlir())
    ```
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"Graph: name must be an identifier, got {name!r}")
        self.name = name
        self._symbols: list[Symbol] = []
        self._tensors: list[Tensor] = []
        self._ops: list[Operation] = []
        self._outputs: list[Tensor] = []
        self._names: set[str] = set()
        self._kind_counts: dict[str, int] = {}

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

    def _check_dtype(self, what: str, dtype) -> str:
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(
                f"{what}: unknown dtype {dtype!r} (argument 'dtype'; expected one of "
                f"{', '.join(DTYPES)})")
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
        """Declares an input buffer. Dims are ints, `Symbol`s or symbol names."""
        what = f"input '{name}'"
        self._check_dtype(what, dtype)
        shape = self._check_shape(what, shape)
        return self._new_tensor(self._claim_name("input", name), shape, dtype, "input")

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
    def operations(self) -> tuple:
        """The recorded operator calls, in call order."""
        return tuple(self._ops)

    def _arg_tensors(self) -> list[tuple[str, Tensor]]:
        ins = [("input", t) for t in self._tensors if t.kind == "input"]
        outs = [("output", t) for t in self._outputs]
        inter = [("intermediate", t) for t in self._tensors
                 if t.kind != "input" and not any(o is t for o in self._outputs)]
        return ins + outs + inter

    @property
    def arguments(self) -> list[Argument]:
        """The graph arguments in order (see the module docstring)."""
        args = [Argument("symbol", s.name, (), "index") for s in self._symbols]
        for kind, t in self._arg_tensors():
            args.append(Argument(kind, t.name, t.symbolic_shape, t.dtype))
        return args

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

    def _check_operand(self, kind: str, role: str, t, ranks: tuple = (1, 2)) -> Tensor:
        if not isinstance(t, Tensor):
            raise ValueError(f"{kind}: operand '{role}' must be a Tensor, got {t!r}")
        if t.graph is not self:
            raise ValueError(f"{kind}: operand '{role}' ('{t.name}') belongs to graph "
                             f"'{t.graph.name}', not '{self.name}'")
        if not t._written:
            raise ValueError(
                f"{kind}: operand '{role}' reads tensor '{t.name}' before anything writes it "
                f"(a cycle or an unproduced read)")
        if t.dtype not in DTYPES:
            raise ValueError(f"{kind}: {_describe(role, t)} is an integer tensor; the operator "
                             f"takes {', '.join(DTYPES)} tensors")
        if t.rank not in ranks:
            expected = " or ".join(f"{r}-D" for r in ranks)
            raise ValueError(f"{kind}: {_describe(role, t)} has rank {t.rank}; expected a "
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
                    f"{kind}: mixed dtypes: {_describe(operands[0][0], operands[0][1])} "
                    f"vs {_describe(role, t)}")
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
                    f"{kind}: out= tensor '{out.name}' has shape {_fmt_shape(out.shape)} and "
                    f"dtype {out.dtype}, but the result has shape {_fmt_shape(shape)} and "
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
               out: Optional[Tensor] = None, name: Optional[str] = None) -> Tensor:
        """C = A @ B (or A @ B^T with `transpose_b`); A is (M, K), B (K, N) or (N, K).
        `tile=(m, n)` sets the output tile (default 32 x 64)."""
        kind = "matmul"
        self._check_operand(kind, "a", a)
        self._check_operand(kind, "b", b)
        if a.rank != 2 or b.rank != 2:
            raise ValueError(f"{kind}: expects 2-D operands, got {_describe('a', a)} and "
                             f"{_describe('b', b)}")
        dtype = self._same_dtype(kind, [("a", a), ("b", b)])
        m, k = a.shape
        kb, n = (b.shape[1], b.shape[0]) if transpose_b else b.shape
        if k is not kb and k != kb:
            which = "last" if transpose_b else "first"
            raise ValueError(
                f"{kind}: inner dimensions differ: {_describe('a', a)} has K = {k} but "
                f"{_describe('b', b)} has {which} dimension {kb}")
        shape = (m, n)
        tile = self._check_tile(kind, tile, 2, (DEFAULT_ROWS, DEFAULT_COLS), shape)
        return self._finish(kind, [("a", a), ("b", b)], shape, dtype, tile,
                            {"transpose_b": bool(transpose_b)}, out, name)

    def _unary(self, kind, x, tile, out, name, params=None) -> Tensor:
        self._check_operand(kind, "x", x)
        default = (DEFAULT_ROWS, DEFAULT_COLS) if x.rank == 2 else (DEFAULT_COLS,)
        tile = self._check_tile(kind, tile, x.rank, default, x.shape)
        return self._finish(kind, [("x", x)], x.shape, x.dtype, tile, params or {}, out, name)

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
                f"{kind}: shapes do not match: {_describe('a', a)} and {_describe('b', b)} "
                f"(equal shapes, or a 1-D operand as long as the other's last dimension)")
        default = (DEFAULT_ROWS, DEFAULT_COLS) if len(shape) == 2 else (DEFAULT_COLS,)
        tile = self._check_tile(kind, tile, len(shape), default, shape)
        return self._finish(kind, [("a", a), ("b", b)], shape, dtype, tile, {}, out, name)

    def add(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """a + b elementwise; a 1-D operand is broadcast over the rows of a 2-D one."""
        return self._binary("add", a, b, tile, out, name)

    def mul(self, a: Tensor, b: Tensor, *, tile=None, out=None, name=None) -> Tensor:
        """a * b elementwise; a 1-D operand is broadcast over the rows of a 2-D one."""
        return self._binary("mul", a, b, tile, out, name)

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

    def _rowwise(self, kind, x, weight, tile, out, name, params) -> Tensor:
        self._check_operand(kind, "x", x)
        if x.rank != 2:
            raise ValueError(f"{kind}: expects a 2-D operand (rows x features), got "
                             f"{_describe('x', x)}")
        operands = [("x", x)]
        if weight is not None:
            self._check_operand(kind, "weight", weight)
            operands.append(("weight", weight))
            if weight.shape != (x.shape[1],):
                raise ValueError(
                    f"{kind}: {_describe('weight', weight)} must have shape "
                    f"{_fmt_shape((x.shape[1],))} to match the last dimension of "
                    f"{_describe('x', x)}")
        dtype = self._same_dtype(kind, operands)
        shape = (x.shape[0],) if kind == "sum" else x.shape
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, operands, shape, dtype, tile, params, out, name)

    def rmsnorm(self, x: Tensor, weight: Tensor, eps: float = 1e-6, *, tile=None, out=None,
                name=None) -> Tensor:
        """x / sqrt(mean(x^2 over the last dim) + eps) * weight, row by row.
        `tile=(m,)` sets the rows per tile (default 32)."""
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"rmsnorm: 'eps' must be a non-negative float, got {eps!r}")
        return self._rowwise("rmsnorm", x, weight, tile, out, name, {"eps": float(eps)})

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
                             f"{_describe('x', x)}")
        n = x.shape[1]
        if not isinstance(n, int):
            raise ValueError(f"{kind}: the last dimension of {_describe('x', x)} must be static "
                             f"so that 'k' can be checked against it")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"{kind}: 'k' = {k!r} is out of range for {_describe('x', x)}: "
                             f"expected an int with 1 <= k <= {n}")
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        shape = (x.shape[0], k)
        values = self._finish(kind, [("x", x)], shape, x.dtype, tile, {"k": k}, None, name)
        indices = self._new_tensor(self._fresh_name(f"{values.name}_indices"), shape,
                                   INDEX_DTYPE, "value")
        self._ops[-1].extra_results = (indices,)
        return values, indices

    def moe(self, x: Tensor, router_w: Tensor, w1: Tensor, w2: Tensor, top_k: int, *,
            tile=None, out: Optional[Tensor] = None, name: Optional[str] = None) -> Tensor:
        """A Mixture-of-Experts layer with SiLU experts.

        x is (T, H), router_w (H, E), w1 (E, H, F), w2 (E, F, H), E static.
        Per token: p = softmax(x @ router_w); the `top_k` experts with the
        largest p (equal p: lower expert index first); their p renormalised
        to sum 1 as weights; y = sum_j weight_j * (silu(x @ w1[e_j]) @ w2[e_j]).
        Result (T, H). `tile=m` sets the routed (token, expert) slots per
        expert tile (default 32). See docs/moe.md for the lowering.
        """
        kind = "moe"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_operand(kind, "router_w", router_w, ranks=(2,))
        self._check_operand(kind, "w1", w1, ranks=(3,))
        self._check_operand(kind, "w2", w2, ranks=(3,))
        operands = [("x", x), ("router_w", router_w), ("w1", w1), ("w2", w2)]
        dtype = self._same_dtype(kind, operands)
        tokens, hidden = x.shape
        experts = router_w.shape[1]

        def expect(role: str, t: Tensor, expected: tuple, why: str) -> None:
            if len(expected) != t.rank or not all(
                    _same_dim(a, b) for a, b in zip(t.shape, expected)):
                raise ValueError(f"{kind}: {_describe(role, t)} must have shape "
                                 f"{_fmt_shape(expected)} ({why})")

        expect("router_w", router_w, (hidden, experts),
               f"(H, E) with H = {hidden} from {_describe('x', x)}")
        if not isinstance(experts, int):
            raise ValueError(f"{kind}: the expert count E (dimension 1 of "
                             f"{_describe('router_w', router_w)}) must be static")
        ffn = w1.shape[2]
        expect("w1", w1, (experts, hidden, ffn),
               f"(E, H, F) with E = {experts} from {_describe('router_w', router_w)} and "
               f"H = {hidden} from {_describe('x', x)}")
        expect("w2", w2, (experts, ffn, hidden),
               f"(E, F, H) with F = {ffn} from {_describe('w1', w1)} and H = {hidden}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
            raise ValueError(f"{kind}: top_k = {top_k!r} is out of range: "
                             f"{_describe('router_w', router_w)} has E = {experts} experts; "
                             f"expected an int with 1 <= top_k <= {experts}")
        if tile is None:
            tile = DEFAULT_ROWS
        if isinstance(tile, (tuple, list)) and len(tile) == 1:
            tile = tile[0]
        if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
            raise ValueError(f"{kind}: tile {tile!r} must be a positive int (slots per "
                             f"expert tile)")
        result = self._finish(kind, operands, (tokens, hidden), dtype, (tile,),
                              {"top_k": top_k, "experts": experts}, out, name)

        def internal(role: str, shape: tuple, internal_dtype: str) -> Tensor:
            return self._new_tensor(self._fresh_name(f"{result.name}_{role}"), shape,
                                    internal_dtype, "value")

        op = self._ops[-1]
        op.buffers = {
            "probs": internal("probs", (tokens, experts), "f32"),
            "experts": tuple(internal(f"expert{j}", (tokens,), INDEX_DTYPE)
                             for j in range(top_k)),
            "weights": internal("weights", (tokens, top_k), "f32"),
            "offsets": internal("offsets", (experts + 1,), INDEX_DTYPE),
            "slots": internal("slots", (tokens, top_k), INDEX_DTYPE),
            "hidden": internal("hidden", (tokens, top_k, ffn), "f32"),
            "partial": internal("partial", (tokens, top_k, hidden), "f32"),
        }
        return result

    # ------------------------------------------------------------------
    # IR
    # ------------------------------------------------------------------

    def build(self, context: Optional[ir.Context] = None) -> ir.Module:
        """Builds and verifies the L1 module (in `context`, or a new one)."""
        if not self._outputs:
            raise ValueError(f"Graph '{self.name}' has no outputs: call output() before "
                             f"building it")
        ctx = context if context is not None else ir.Context()
        with ctx, ir.Location.unknown():
            module = _Builder(self).build()
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


# ----------------------------------------------------------------------
# IR construction
# ----------------------------------------------------------------------


def _element_type(dtype: str) -> ir.Type:
    if dtype == INDEX_DTYPE:
        return ir.IntegerType.get_signless(32)
    return {"f32": ir.F32Type.get, "f16": ir.F16Type.get, "bf16": ir.BF16Type.get}[dtype]()


def _whole(grid_rank: int, t: Tensor) -> ir.Attribute:
    """The footprint of every tile reading or writing all of `t`."""
    return _box(grid_rank, ["0"] * t.rank, [None] * t.rank)


def _index_map(text: str) -> ir.Attribute:
    return ir.Attribute.parse(f"#event.map<{text}>")


def _box(grid_rank: int, offsets: Sequence[str], sizes: Sequence) -> ir.Attribute:
    dims = ", ".join(f"d{i}" for i in range(grid_rank))
    size_text = ", ".join("?" if s is None else str(s) for s in sizes)
    return ir.Attribute.parse(f"#event.box<({dims}) -> ({', '.join(offsets)}) [{size_text}]>")


def _tile_offset(d: int, t: int) -> str:
    return f"d{d} * {t}"


class _Builder:
    """Builds the L1 module of one graph in the current context."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.index = ir.IndexType.get()
        self.f32 = ir.F32Type.get()
        self.buffers: dict[int, ir.Value] = {}  # id(Tensor) -> block argument
        self.symbols: dict[int, ir.Value] = {}  # id(Symbol) -> block argument
        self.grid_cache: dict = {}

    def memref_type(self, t: Tensor) -> ir.MemRefType:
        dyn = ir.ShapedType.get_dynamic_size()
        return ir.MemRefType.get([d if isinstance(d, int) else dyn for d in t.shape],
                                 _element_type(t.dtype))

    def build(self) -> ir.Module:
        g = self.g
        module = ir.Module.create()
        types, attrs, locs, owners = [], [], [], []
        for s in g._symbols:
            types.append(self.index)
            attrs.append(ir.DictAttr.get({}))
            locs.append(ir.Location.name(s.name))
            owners.append(("symbol", s))
        for kind, t in g._arg_tensors():
            types.append(self.memref_type(t))
            attrs.append(ir.DictAttr.get({"event.intermediate": ir.UnitAttr.get()})
                         if kind == "intermediate" else ir.DictAttr.get({}))
            locs.append(ir.Location.name(t.name))
            owners.append(("tensor", t))
        with ir.InsertionPoint(module.body):
            graph_op = event.GraphOp(g.name, ir.TypeAttr.get(ir.FunctionType.get(types, [])),
                                     arg_attrs=ir.ArrayAttr.get(attrs))
        block = graph_op.body.blocks.append(*types, arg_locs=locs)
        for (what, obj), arg in zip(owners, block.arguments):
            (self.symbols if what == "symbol" else self.buffers)[id(obj)] = arg
        with ir.InsertionPoint(block):
            for op in g._ops:
                self.build_task(op)
            event.YieldOp()
        return module

    # -- grid ----------------------------------------------------------

    def grid_extent(self, dim: Dim, tile: int) -> ir.Value:
        """ceil(dim / tile), as a constant or an affine.apply of the symbol."""
        if isinstance(dim, int):
            key = ("static", -(-dim // tile))
        else:
            key = ("symbol", id(dim), tile)
        if key not in self.grid_cache:
            if key[0] == "static":
                self.grid_cache[key] = arith.constant(self.index, key[1])
            else:
                amap = ir.AffineMap.get(0, 1, [ir.AffineExpr.get_ceil_div(
                    ir.AffineSymbolExpr.get(0), ir.AffineConstantExpr.get(tile))])
                self.grid_cache[key] = affine.apply(amap, [self.symbols[id(dim)]])
        return self.grid_cache[key]

    # -- tasks ---------------------------------------------------------

    def build_task(self, op: Operation) -> None:
        if op.kind == "moe":
            self.build_moe(op)
            return
        res = op.result
        tile = op.tile
        if op.kind == "topk":
            x = op.operands[0]
            (tm,) = tile
            grid_dims = [(x.shape[0], tm)]
            rows = _box(1, [_tile_offset(0, tm), "0"], [tm, None])
            reads = [(x, rows)]
            writes = [(res, rows), (op.extra_results[0], rows)]
        elif op.kind in _ROWWISE:
            x = op.operands[0]
            grid_dims = [(x.shape[0], tile[0])]
            reads = [(x, _box(1, [_tile_offset(0, tile[0]), "0"], [tile[0], None]))]
            if op.kind == "rmsnorm":
                reads.append((op.operands[1], _box(1, ["0"], [None])))
            if op.kind == "sum":
                writes = [(res, _box(1, [_tile_offset(0, tile[0])], [tile[0]]))]
            else:
                writes = [(res, _box(1, [_tile_offset(0, tile[0]), "0"], [tile[0], None]))]
        elif op.kind == "matmul":
            a, b = op.operands
            tm, tn = tile
            grid_dims = [(res.shape[0], tm), (res.shape[1], tn)]
            reads = [(a, _box(2, [_tile_offset(0, tm), "0"], [tm, None]))]
            if op.params["transpose_b"]:
                reads.append((b, _box(2, [_tile_offset(1, tn), "0"], [tn, None])))
            else:
                reads.append((b, _box(2, ["0", _tile_offset(1, tn)], [None, tn])))
            writes = [(res, _box(2, [_tile_offset(0, tm), _tile_offset(1, tn)], [tm, tn]))]
        else:
            rank = res.rank
            grid_dims = list(zip(res.shape, tile))
            offs = [_tile_offset(d, t) for d, t in enumerate(tile)]
            own = _box(rank, offs, list(tile))
            reads = []
            for t in op.operands:
                if t.rank == rank:
                    reads.append((t, own))
                else:  # a 1-D operand broadcast over rows: its column block
                    reads.append((t, _box(rank, [offs[-1]], [tile[-1]])))
            writes = [(res, own)]
        # Drop repeated identical reads (e.g. add(x, x)).
        unique_reads = []
        for t, fp in reads:
            if not any(u is t and str(f) == str(fp) for u, f in unique_reads):
                unique_reads.append((t, fp))
        grid = [self.grid_extent(d, t) for d, t in grid_dims]
        self.emit_task(op, op.name, grid, unique_reads, writes)

    def emit_task(self, op: Operation, name: str, grid: list, reads: list, writes: list,
                  part: Optional[str] = None, waits: Sequence = (), notifies: Sequence = (),
                  indices: Sequence[Tensor] = ()) -> None:
        """One `event.task`: footprints as (tensor, box) pairs, explicit events
        as (event value, map attribute) pairs; `part` names the piece of a
        multi-task operator whose body to emit."""
        task = event.TaskOp(
            name, grid,
            [self.buffers[id(t)] for t, _ in reads],
            [self.buffers[id(t)] for t, _ in writes],
            [e for e, _ in waits], [e for e, _ in notifies],
            [self.buffers[id(t)] for t in indices],
            ir.ArrayAttr.get([fp for _, fp in reads]),
            ir.ArrayAttr.get([fp for _, fp in writes]),
            ir.ArrayAttr.get([m for _, m in waits]),
            ir.ArrayAttr.get([m for _, m in notifies]))
        names = ["i", "j"][:len(grid)]
        body = task.body.blocks.append(*([self.index] * len(grid)),
                                       arg_locs=[ir.Location.name(n) for n in names])
        with ir.InsertionPoint(body):
            _TileBody(self, op, body, part).emit()
            event.YieldOp()

    def build_moe(self, op: Operation) -> None:
        """The five tasks of a Mixture-of-Experts layer (docs/moe.md).

        Footprints that tiles can state (row blocks, whole buffers, one
        expert's weights) are left to event-infer-dependencies. The slots an
        expert tile handles, and so the rows of `hidden` and `partial` it
        touches, depend on the routing; those two buffers get no footprints,
        and their ordering is declared here with two events:
        `ready[e, j]` (up tile (e, j) -> down tile (e, j), count 1) and
        `done[e]` (every down tile of expert e -> each token routed to e,
        through an indirect wait per routing choice reading `expert<j>`).
        Every tile of the padded (E, ceil(T / m)) grid notifies, empty ones
        included, so both counts are known without reading routing data.
        """
        x, router_w, w1, w2 = op.operands
        buffers = op.buffers
        tokens = x.shape[0]
        experts = op.params["experts"]
        (slots_per_tile,) = op.tile
        choices = buffers["experts"]
        row_block = lambda t: _box(1, [_tile_offset(0, DEFAULT_ROWS)] + ["0"] * (t.rank - 1),
                                   [DEFAULT_ROWS] + [None] * (t.rank - 1))
        one_expert = lambda t: _box(2, ["d0", "0", "0"], [1, None, None])

        routed = [buffers["probs"], *choices, buffers["weights"]]
        self.emit_task(op, f"{op.name}_router", [self.grid_extent(tokens, DEFAULT_ROWS)],
                       [(x, row_block(x)), (router_w, _whole(1, router_w))],
                       [(t, row_block(t)) for t in routed], part="router")
        self.emit_task(op, f"{op.name}_route", [self.grid_extent(1, 1)],
                       [(t, _whole(1, t)) for t in choices],
                       [(buffers["offsets"], _whole(1, buffers["offsets"])),
                        (buffers["slots"], _whole(1, buffers["slots"]))], part="route")

        grid = [self.grid_extent(experts, 1), self.grid_extent(tokens, slots_per_tile)]
        one = self.grid_extent(1, 1)
        if isinstance(tokens, int):
            tiles = -(-tokens // slots_per_tile)
            tiles_type, dynamic = ir.Type.parse(f"!event.tensor<{experts}x{tiles}>"), []
        else:
            tiles_type, dynamic = ir.Type.parse(f"!event.tensor<{experts}x?>"), [grid[1]]
        ready = event.AllocOp(tiles_type, dynamic, count=one).result
        routing = [(t, _whole(2, t)) for t in (buffers["offsets"], buffers["slots"])]
        tile_map = _index_map("(d0, d1) -> (d0, d1)")
        # x rows are read wherever routing sends them: the whole of x, so
        # that a later writer of x still waits for every expert tile.
        self.emit_task(op, f"{op.name}_up", grid,
                       [(x, _whole(2, x)), (w1, one_expert(w1)), *routing], [],
                       part="up", notifies=[(ready, tile_map)])
        done = event.AllocOp(ir.Type.parse(f"!event.tensor<{experts}>"), [],
                             count=grid[1]).result
        self.emit_task(op, f"{op.name}_down", grid,
                       [(w2, one_expert(w2)), *routing,
                        (buffers["weights"], _whole(2, buffers["weights"]))], [],
                       part="down", waits=[(ready, tile_map)],
                       notifies=[(done, _index_map("(d0, d1) -> (d0)"))])
        self.emit_task(op, f"{op.name}_combine", [self.grid_extent(tokens, 1)], [],
                       [(op.result, _box(1, ["d0", "0"], [1, None]))], part="combine",
                       waits=[(done, _index_map(f"(d0) -> (d0) indirect [{j}]"))
                              for j in range(len(choices))],
                       indices=choices)


class _TileBody:
    """Emits the target-neutral body of one tile task."""

    def __init__(self, builder: _Builder, op: Operation, block: ir.Block,
                 part: Optional[str] = None):
        self.b = builder
        self.op = op
        self.part = part
        self.block = block
        self.ti = list(block.arguments)
        self.index = builder.index
        self.f32 = builder.f32
        self.consts: dict = {}

    # -- helpers -------------------------------------------------------

    def cidx(self, v: int) -> ir.Value:
        # Index constants live at the top of the tile body, so that they
        # dominate every use wherever they are first needed.
        if v not in self.consts:
            with ir.InsertionPoint.at_block_begin(self.block):
                self.consts[v] = arith.constant(self.index, v)
        return self.consts[v]

    def cf32(self, v: float) -> ir.Value:
        # Constants are created where first needed; inside loops they are
        # recreated so that they always dominate their uses.
        return arith.constant(self.f32, ir.FloatAttr.get(self.f32, v))

    def buf(self, t: Tensor) -> ir.Value:
        return self.b.buffers[id(t)]

    def dim(self, t: Tensor, d: int) -> ir.Value:
        size = t.shape[d]
        if isinstance(size, int):
            return self.cidx(size)
        return memref.dim(self.buf(t), self.cidx(d))

    def extent(self, t: Tensor, d: int, offset: ir.Value, tile: int) -> ir.Value:
        """min(tile, dim - offset): the clipped extent of an edge tile."""
        size = t.shape[d]
        if isinstance(size, int) and size % tile == 0:
            return self.cidx(tile)
        rest = arith.subi(self.dim(t, d), offset)
        return arith.minsi(self.cidx(tile), rest)

    def load(self, t: Tensor, idx: list) -> ir.Value:
        v = memref.load(self.buf(t), idx)
        return v if t.dtype in ("f32", INDEX_DTYPE) else arith.extf(self.f32, v)

    def load_index(self, t: Tensor, idx: list) -> ir.Value:
        """An i32 element of `t` as an index."""
        return arith.index_cast(self.index, self.load(t, idx))

    def store_index(self, value: ir.Value, t: Tensor, idx: list) -> None:
        """Stores an index value into i32 tensor `t`."""
        memref.store(arith.index_cast(ir.IntegerType.get_signless(32), value), self.buf(t), idx)

    def store(self, value: ir.Value, t: Tensor, idx: list) -> None:
        if t.dtype not in ("f32", INDEX_DTYPE):
            value = arith.truncf(_element_type(t.dtype), value)
        memref.store(value, self.buf(t), idx)

    def lane_loop(self, count: ir.Value) -> scf.ForOp:
        lane = event.lane_id()
        lanes = event.lane_count()
        return scf.ForOp(lane, count, lanes)

    # -- scalar math (f32) ----------------------------------------------

    def unary(self, kind: str, x: ir.Value) -> ir.Value:
        if kind == "exp":
            return math.exp(x)
        if kind == "scale":
            return arith.mulf(x, self.cf32(self.op.params["c"]))
        if kind == "silu":
            # x / (1 + exp(-x))
            e = math.exp(arith.negf(x))
            return arith.divf(x, arith.addf(self.cf32(1.0), e))
        if kind == "gelu":
            # 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3),
            # tanh(z) = 1 - 2 / (exp(2z) + 1).
            x3 = arith.mulf(arith.mulf(x, x), x)
            inner = arith.addf(x, arith.mulf(self.cf32(0.044715), x3))
            two_z = arith.mulf(self.cf32(2.0 * _pymath.sqrt(2.0 / _pymath.pi)), inner)
            denom = arith.addf(math.exp(two_z), self.cf32(1.0))
            tanh = arith.subf(self.cf32(1.0), arith.divf(self.cf32(2.0), denom))
            half_x = arith.mulf(self.cf32(0.5), x)
            return arith.mulf(half_x, arith.addf(self.cf32(1.0), tanh))
        raise AssertionError(kind)

    # -- bodies --------------------------------------------------------

    def emit(self) -> None:
        kind = self.op.kind
        if kind == "moe":
            getattr(self, f"emit_moe_{self.part}")()
        elif kind == "topk":
            self.emit_topk()
        elif kind == "matmul":
            self.emit_matmul()
        elif kind in _ROWWISE:
            self.emit_rowwise()
        else:
            self.emit_elementwise()

    def tile_elements(self, out: Tensor, tile: tuple):
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

    def emit_elementwise(self) -> None:
        op, out = self.op, self.op.result
        offsets, extents, count = self.tile_elements(out, op.tile)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            pos = self.element_coords(loop.induction_variable, offsets, extents)
            vals = [self.load(t, pos if t.rank == out.rank else pos[-1:]) for t in op.operands]
            if op.kind == "add":
                r = arith.addf(vals[0], vals[1])
            elif op.kind == "mul":
                r = arith.mulf(vals[0], vals[1])
            else:
                r = self.unary(op.kind, vals[0])
            self.store(r, out, pos)
            scf.yield_([])

    def emit_matmul(self) -> None:
        op, out = self.op, self.op.result
        a, b = op.operands
        transpose_b = op.params["transpose_b"]
        offsets, extents, count = self.tile_elements(out, op.tile)
        k_extent = self.dim(a, 1)
        zero_idx, one_idx = self.cidx(0), self.cidx(1)
        loop = self.lane_loop(count)
        with ir.InsertionPoint(loop.body):
            row, col = self.element_coords(loop.induction_variable, offsets, extents)
            zero = self.cf32(0.0)
            kloop = scf.ForOp(zero_idx, k_extent, one_idx, [zero])
            with ir.InsertionPoint(kloop.body):
                k = kloop.induction_variable
                av = self.load(a, [row, k])
                bv = self.load(b, [col, k] if transpose_b else [k, col])
                acc = arith.addf(kloop.inner_iter_args[0], arith.mulf(av, bv))
                scf.yield_([acc])
            self.store(kloop.results[0], out, [row, col])
            scf.yield_([])

    def reduce_row(self, n: ir.Value, init: ir.Value, step) -> ir.Value:
        """Folds `step(acc, k)` over k in [0, n) starting from `init`."""
        loop = scf.ForOp(self.cidx(0), n, self.cidx(1), [init])
        with ir.InsertionPoint(loop.body):
            scf.yield_([step(loop.inner_iter_args[0], loop.induction_variable)])
        return loop.results[0]

    def for_each_col(self, n: ir.Value, body) -> None:
        loop = scf.ForOp(self.cidx(0), n, self.cidx(1))
        with ir.InsertionPoint(loop.body):
            body(loop.induction_variable)
            scf.yield_([])

    def emit_rowwise(self) -> None:
        op, out = self.op, self.op.result
        x = op.operands[0]
        (tm,) = op.tile
        row0 = arith.muli(self.ti[0], self.cidx(tm))
        rows = self.extent(x, 0, row0, tm)
        n = self.dim(x, 1)
        if op.kind == "rmsnorm":
            if isinstance(x.shape[1], int):
                n_f32 = self.cf32(float(x.shape[1]))
            else:
                n_f32 = arith.sitofp(self.f32, arith.index_cast(ir.IntegerType.get_signless(64), n))
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            if op.kind == "sum":
                total = self.reduce_row(
                    n, self.cf32(0.0),
                    lambda acc, k: arith.addf(acc, self.load(x, [row, k])))
                self.store(total, out, [row])
            elif op.kind == "softmax":
                neg_inf = self.cf32(float("-inf"))
                mx = self.reduce_row(
                    n, neg_inf, lambda acc, k: arith.maxnumf(acc, self.load(x, [row, k])))
                denom = self.reduce_row(
                    n, self.cf32(0.0),
                    lambda acc, k: arith.addf(acc, math.exp(arith.subf(self.load(x, [row, k]), mx))))
                inv = arith.divf(self.cf32(1.0), denom)

                def write(k):
                    e = math.exp(arith.subf(self.load(x, [row, k]), mx))
                    self.store(arith.mulf(e, inv), out, [row, k])
                self.for_each_col(n, write)
            else:  # rmsnorm
                weight = op.operands[1]

                def square(acc, k):
                    v = self.load(x, [row, k])
                    return arith.addf(acc, arith.mulf(v, v))
                ss = self.reduce_row(n, self.cf32(0.0), square)
                mean = arith.divf(ss, n_f32)
                inv = math.rsqrt(arith.addf(mean, self.cf32(op.params["eps"])))

                def write(k):
                    v = arith.mulf(self.load(x, [row, k]), inv)
                    self.store(arith.mulf(v, self.load(weight, [k])), out, [row, k])
                self.for_each_col(n, write)
            scf.yield_([])

    # -- top-k and Mixture-of-Experts -------------------------------------

    def ranks_above(self, a: ir.Value, b: ir.Value) -> ir.Value:
        """Whether value `a` comes before value `b` in top-k order: NaN above
        every number (+inf included), then larger numbers first. The order
        of `etc.reference.topk`; plain comparisons are false for NaN, which
        made NaN rows pick -inf and the same position twice."""
        a_nan = arith.cmpf(arith.CmpFPredicate.UNO, a, a)
        b_number = arith.cmpf(arith.CmpFPredicate.ORD, b, b)
        return arith.ori(arith.andi(a_nan, b_number), arith.cmpf(arith.CmpFPredicate.OGT, a, b))

    def ranks_equal(self, a: ir.Value, b: ir.Value) -> ir.Value:
        """Whether values `a` and `b` tie in top-k order (two NaNs tie)."""
        both_nan = arith.andi(arith.cmpf(arith.CmpFPredicate.UNO, a, a),
                              arith.cmpf(arith.CmpFPredicate.UNO, b, b))
        return arith.ori(arith.cmpf(arith.CmpFPredicate.OEQ, a, b), both_nan)

    def select_next(self, n: ir.Value, value_at, previous: tuple) -> tuple:
        """The next pick of a descending top-k over positions [0, n): the
        first value after `previous` = (value, position) in the order
        `ranks_above`, then lower position. Returns (value, position).
        Comparisons are strict, so the first position wins among equals."""
        prev_value, prev_position = previous
        init = [self.cf32(float("-inf")), self.cidx(0),
                arith.constant(ir.IntegerType.get_signless(1), 0)]
        loop = scf.ForOp(self.cidx(0), n, self.cidx(1), init)
        with ir.InsertionPoint(loop.body):
            position = loop.induction_variable
            best_value, best_position, found = loop.inner_iter_args
            v = value_at(position)
            after = arith.ori(
                self.ranks_above(prev_value, v),
                arith.andi(self.ranks_equal(v, prev_value),
                           arith.cmpi(arith.CmpIPredicate.sgt, position, prev_position)))
            not_found = arith.xori(found, arith.constant(ir.IntegerType.get_signless(1), 1))
            better = arith.ori(not_found, self.ranks_above(v, best_value))
            take = arith.andi(after, better)
            scf.yield_([arith.select(take, v, best_value),
                        arith.select(take, position, best_position),
                        arith.ori(found, take)])
        return loop.results[0], loop.results[1]

    def first_pick(self) -> tuple:
        """The `previous` of the first pick: after (NaN, -1), the top of the
        order at a position before every other, comes everything."""
        return self.cf32(float("nan")), arith.constant(self.index, -1)

    def emit_topk(self) -> None:
        op = self.op
        x, values, indices = op.operands[0], op.result, op.extra_results[0]
        (tm,) = op.tile
        row0 = arith.muli(self.ti[0], self.cidx(tm))
        rows = self.extent(x, 0, row0, tm)
        n = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            row = arith.addi(row0, loop.induction_variable)
            picks = scf.ForOp(self.cidx(0), self.cidx(op.params["k"]), self.cidx(1),
                              list(self.first_pick()))
            with ir.InsertionPoint(picks.body):
                j = picks.induction_variable
                value, position = self.select_next(
                    n, lambda c: self.load(x, [row, c]), tuple(picks.inner_iter_args))
                self.store(value, values, [row, j])
                self.store_index(position, indices, [row, j])
                scf.yield_([value, position])
            scf.yield_([])

    def emit_moe_router(self) -> None:
        """Tile i: tokens [32 i, 32 i + 32): probabilities, top-k experts and
        renormalised weights."""
        op, buffers = self.op, self.op.buffers
        x, router_w = op.operands[:2]
        probs, weights = buffers["probs"], buffers["weights"]
        experts = self.cidx(op.params["experts"])
        row0 = arith.muli(self.ti[0], self.cidx(DEFAULT_ROWS))
        rows = self.extent(x, 0, row0, DEFAULT_ROWS)
        hidden = self.dim(x, 1)
        loop = self.lane_loop(rows)
        with ir.InsertionPoint(loop.body):
            t = arith.addi(row0, loop.induction_variable)

            def logit(e):
                total = self.reduce_row(hidden, self.cf32(0.0), lambda acc, h: arith.addf(
                    acc, arith.mulf(self.load(x, [t, h]), self.load(router_w, [h, e]))))
                self.store(total, probs, [t, e])
            self.for_each_col(experts, logit)
            mx = self.reduce_row(experts, self.cf32(float("-inf")), lambda acc, e: arith.maxnumf(
                acc, self.load(probs, [t, e])))
            denom = self.reduce_row(experts, self.cf32(0.0), lambda acc, e: arith.addf(
                acc, math.exp(arith.subf(self.load(probs, [t, e]), mx))))
            self.for_each_col(experts, lambda e: self.store(
                arith.divf(math.exp(arith.subf(self.load(probs, [t, e]), mx)), denom),
                probs, [t, e]))
            previous = self.first_pick()
            chosen = []
            for j, choice in enumerate(buffers["experts"]):
                previous = self.select_next(experts, lambda e: self.load(probs, [t, e]), previous)
                self.store_index(previous[1], choice, [t])
                chosen.append(previous[0])
            total = chosen[0]
            for value in chosen[1:]:
                total = arith.addf(total, value)
            for j, value in enumerate(chosen):
                self.store(arith.divf(value, total), weights, [t, self.cidx(j)])
            scf.yield_([])

    def emit_moe_route(self) -> None:
        """One tile (run by lane 0): counts tokens per expert into
        offsets[e + 1], prefix-sums them, then lists every (token, choice)
        pair t * k + j in slots[] grouped by expert, in token order, using
        offsets[e] as the fill cursor and shifting it back afterwards."""
        op, buffers = self.op, self.op.buffers
        offsets, slots, choices = buffers["offsets"], buffers["slots"], buffers["experts"]
        k = len(choices)
        experts = op.params["experts"]
        i32 = ir.IntegerType.get_signless(32)
        tokens = self.dim(op.operands[0], 0)
        loop = self.lane_loop(self.cidx(1))
        with ir.InsertionPoint(loop.body):
            self.for_each_col(self.cidx(experts + 1), lambda e: memref.store(
                arith.constant(i32, 0), self.buf(offsets), [e]))

            def count(t):
                for choice in choices:
                    slot = arith.addi(self.load_index(choice, [t]), self.cidx(1))
                    memref.store(arith.addi(self.load(offsets, [slot]), arith.constant(i32, 1)),
                                 self.buf(offsets), [slot])
            self.for_each_col(tokens, count)

            def prefix(e):
                after = arith.addi(e, self.cidx(1))
                memref.store(arith.addi(self.load(offsets, [after]), self.load(offsets, [e])),
                             self.buf(offsets), [after])
            self.for_each_col(self.cidx(experts), prefix)

            def fill(t):
                for j, choice in enumerate(choices):
                    e = self.load_index(choice, [t])
                    position = self.load_index(offsets, [e])
                    pair = arith.addi(arith.muli(t, self.cidx(k)), self.cidx(j))
                    self.store_index(pair, slots, [arith.divui(position, self.cidx(k)),
                                                   arith.remui(position, self.cidx(k))])
                    self.store_index(arith.addi(position, self.cidx(1)), offsets, [e])
            self.for_each_col(tokens, fill)

            def shift(r):
                e = arith.subi(self.cidx(experts), r)
                memref.store(self.load(offsets, [arith.subi(e, self.cidx(1))]),
                             self.buf(offsets), [e])
            self.for_each_col(self.cidx(experts), shift)
            memref.store(arith.constant(i32, 0), self.buf(offsets), [self.cidx(0)])
            scf.yield_([])

    def expert_slots(self, width: ir.Value):
        """The lane loop over (slot, column) of expert tile (e, j): slots
        offsets[e] + [j m, min((j + 1) m, count)); an empty tile runs no
        iteration. Yields (loop, token, choice, column) inside the loop."""
        op, buffers = self.op, self.op.buffers
        k = len(buffers["experts"])
        (per_tile,) = op.tile
        e, j = self.ti
        begin = self.load_index(buffers["offsets"], [e])
        end = self.load_index(buffers["offsets"], [arith.addi(e, self.cidx(1))])
        first = arith.addi(begin, arith.muli(j, self.cidx(per_tile)))
        last = arith.minsi(end, arith.addi(first, self.cidx(per_tile)))
        count = arith.maxsi(arith.subi(last, first), self.cidx(0))
        loop = self.lane_loop(arith.muli(count, width))
        with ir.InsertionPoint(loop.body):
            element = loop.induction_variable
            slot = arith.addi(first, arith.divui(element, width))
            column = arith.remui(element, width)
            pair = self.load_index(buffers["slots"], [arith.divui(slot, self.cidx(k)),
                                                      arith.remui(slot, self.cidx(k))])
            token = arith.divui(pair, self.cidx(k))
            choice = arith.remui(pair, self.cidx(k))
        return loop, token, choice, column

    def emit_moe_up(self) -> None:
        """hidden[t, c, :] = silu(x[t] @ w1[e]) for the pairs of this tile."""
        x, _, w1, _ = self.op.operands
        hidden = self.op.buffers["hidden"]
        loop, t, c, f = self.expert_slots(self.dim(w1, 2))
        e = self.ti[0]
        with ir.InsertionPoint(loop.body):
            total = self.reduce_row(self.dim(x, 1), self.cf32(0.0), lambda acc, h: arith.addf(
                acc, arith.mulf(self.load(x, [t, h]), self.load(w1, [e, h, f]))))
            self.store(self.unary("silu", total), hidden, [t, c, f])
            scf.yield_([])

    def emit_moe_down(self) -> None:
        """partial[t, c, :] = weight[t, c] * (hidden[t, c] @ w2[e])."""
        w1, w2 = self.op.operands[2:]
        buffers = self.op.buffers
        hidden, partial = buffers["hidden"], buffers["partial"]
        loop, t, c, col = self.expert_slots(self.dim(w2, 2))
        e = self.ti[0]
        with ir.InsertionPoint(loop.body):
            total = self.reduce_row(self.dim(w1, 2), self.cf32(0.0), lambda acc, f: arith.addf(
                acc, arith.mulf(self.load(hidden, [t, c, f]), self.load(w2, [e, f, col]))))
            weight = self.load(buffers["weights"], [t, c])
            self.store(arith.mulf(weight, total), partial, [t, c, col])
            scf.yield_([])

    def emit_moe_combine(self) -> None:
        """y[t, :] = sum over the token's k choices of partial[t, c, :]."""
        op = self.op
        partial = op.buffers["partial"]
        t = self.ti[0]
        k = len(op.buffers["experts"])
        loop = self.lane_loop(self.dim(op.operands[0], 1))
        with ir.InsertionPoint(loop.body):
            col = loop.induction_variable
            total = self.reduce_row(self.cidx(k), self.cf32(0.0), lambda acc, c: arith.addf(
                acc, self.load(partial, [t, c, col])))
            self.store(total, op.result, [t, col])
            scf.yield_([])
