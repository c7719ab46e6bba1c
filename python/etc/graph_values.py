"""The values a `Graph` records: symbols, derived dimensions, tensors,
operator calls and graph arguments, with the shape helpers that every
front-end module uses for its checks and error messages.

They are plain data with no dependencies, so that the graph, its operator
mixins (`etc.graph_llm`, `etc.graph_collective`), its MLIR builder
(`etc.graph_to_mlir`) and the operator families (`etc.ops`, for type hints
only) can all import them without a circle. `Graph` creates them; users get
them from its methods (`Graph.symbol`, `Graph.input`, `Graph.operations`,
`Graph.arguments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

__all__ = ["Argument", "CeilDiv", "Dim", "Operation", "Symbol", "Tensor", "describe",
           "format_shape", "same_dim"]


@dataclass(frozen=True)
class Argument:
    """One argument of the built `event.graph`, in argument order.

    `kind` is "symbol", "input", "state", "output" or "intermediate";
    `shape` holds ints and symbol names (`()` for a symbol); `dtype` is
    "f32", "f16", "bf16", "i32", or "index" for a symbol.
    """

    kind: str
    name: str
    shape: tuple
    dtype: str


class Symbol:
    """A symbolic dimension of a graph (e.g. the batch size); `graph` is the
    `etc.Graph` that declared it."""

    __slots__ = ("graph", "name")

    def __init__(self, graph, name: str):
        self.graph = graph
        self.name = name

    def __repr__(self) -> str:
        return f"Symbol({self.name!r})"

    def __str__(self) -> str:
        return self.name


Dim = Union[int, Symbol]


class CeilDiv:
    """ceil(symbol / divisor): a dimension derived from a symbol, for the
    buffers an operator sizes from another buffer's symbolic dimension
    (attention's chunk scratch has ceil(L / C) chunks of a cache of L
    positions). Its name, "ceildiv(L, C)", is how shapes spell it; runtimes
    evaluate it with the symbol bound (`etc.binding.concrete_shape`). Only
    operators create these, for their internal buffers: inputs are sized by
    symbols."""

    __slots__ = ("symbol", "divisor")

    def __init__(self, symbol: Symbol, divisor: int):
        self.symbol, self.divisor = symbol, divisor

    @property
    def name(self) -> str:
        return f"ceildiv({self.symbol.name}, {self.divisor})"

    def __eq__(self, other) -> bool:
        return isinstance(other, CeilDiv) and other.symbol is self.symbol and \
            other.divisor == self.divisor

    def __hash__(self) -> int:
        return hash((id(self.symbol), self.divisor))

    def __repr__(self) -> str:
        return f"CeilDiv({self.symbol.name!r}, {self.divisor})"

    __str__ = name.fget


class Tensor:
    """A buffer of a graph: an input, a state buffer, an operator result or a
    scratch tensor.

    `kind` is "input" (from `Graph.input`), "state" (from `Graph.state`,
    updated in place), "value" (an operator's result) or "scratch" (from
    `Graph.tensor`, written through `out=`). `graph` is the `etc.Graph`
    that holds it.
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
        return tuple(d.name if isinstance(d, (Symbol, CeilDiv)) else d for d in self.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {format_shape(self.shape)}, {self.dtype!r})"


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
    #: Whether the user chose the tile (`tile=`); otherwise a family may
    #: pick one per target (e.g. more, narrower matmul tiles on a GPU).
    user_tile: bool = False


def format_shape(shape) -> str:
    """A shape as error messages print it: `(B, 256)`, `(8,)`."""
    inner = ", ".join(str(d) for d in shape)
    if len(shape) == 1:
        inner += ","
    return f"({inner})"


def same_dim(a: Dim, b: Dim) -> bool:
    """Dimensions are equal when they are the same symbol or equal ints."""
    if isinstance(a, Symbol) or isinstance(b, Symbol):
        return a is b
    return a == b


def describe(role: str, t: Tensor) -> str:
    """An operand as error messages name it: role, tensor name, shape and dtype."""
    return f"operand '{role}' ('{t.name}', shape {format_shape(t.shape)}, {t.dtype})"
