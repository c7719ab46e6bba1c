"""Binding a call's arrays to a graph's arguments: names, ranks, static
dimensions and symbolic dimensions.

Shared by the NumPy reference and every runtime, so that the same mistake
gets the same error everywhere. Element types are checked by the callers:
what a host array, a device array and the reference accept differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import packed


@dataclass(frozen=True)
class Signature:
    """What a compiled program takes and returns: the graph's `name`, its
    `arguments` (`etc.Argument`s, in argument order) and the names of its
    `outputs` in `g.output` order.

    Runtimes hold a snapshot taken when the graph was compiled, so that a
    graph changed afterwards (say, one more output) cannot make a kernel
    bind arguments it was not compiled with.
    """

    name: str
    arguments: tuple
    outputs: tuple
    #: The declared ranges of index inputs (`etc.runtime.ranges.IndexRange`), by name.
    index_ranges: dict = field(default_factory=dict)
    #: The ragged batches' index inputs (role -> input name), one dict each.
    ragged_batches: tuple = ()

    @classmethod
    def of(cls, graph) -> "Signature":
        """The current signature of `graph` (an `etc.Graph`, or anything with
        `name`, `arguments`, `outputs` and optionally `index_ranges` and
        `ragged_batches`)."""
        return cls(graph.name, tuple(graph.arguments), tuple(graph.outputs),
                   dict(getattr(graph, "index_ranges", {}) or {}),
                   tuple(getattr(graph, "ragged_batches", ()) or ()))


#: The argument kinds a call supplies: inputs, and state buffers (passed
#: like inputs and updated in place).
SUPPLIED = ("input", "state")


#: The NumPy dtype of an input of each ETC dtype (bf16: float32 values,
#: rounded when copied; see `check_input_dtype` for its bit patterns).
INPUT_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
                "bf16": np.dtype(np.float32), "i32": np.dtype(np.int32),
                **{name: np.dtype(np.uint8) for name in packed.FORMATS}}


def check_input_dtype(name: str, arg, array: np.ndarray) -> None:
    """Input `arg` takes arrays of its user dtype (float32 for bf16, rounded
    when copied) or, for bf16, uint16 arrays of bf16 bit patterns, used as
    they are (weights converted once, not at every run). A packed weight
    (a format of `etc.packed`) takes its blocks, a uint8 array."""
    want = INPUT_DTYPES[arg.dtype]
    if array.dtype == want or (arg.dtype == "bf16" and array.dtype == np.uint16):
        return
    also = " or uint16 bf16 bit patterns" if arg.dtype == "bf16" else ""
    if packed.is_packed(arg.dtype):
        also = f" (the {arg.dtype} blocks, as etc.packed.quantize or a GGUF file gives them)"
    raise TypeError(f"input {name!r} has dtype {array.dtype}, expected {want}{also} for "
                    f"{arg.dtype} (inputs are not cast implicitly)")


def check_input_names(graph_name: str, arguments: Sequence, names: Iterable[str]) -> None:
    """Raises TypeError, like a call with a wrong keyword, when `names` is not
    exactly the graph's inputs and state buffers."""
    names = list(names)
    expected = [a.name for a in arguments if a.kind in SUPPLIED]
    missing = [n for n in expected if n not in names]
    unknown = [n for n in names if n not in expected]
    if missing:
        raise TypeError(f"{graph_name}: missing inputs {missing}; expected {expected}")
    if unknown:
        raise TypeError(f"{graph_name}: unexpected inputs {unknown}; expected {expected}")


def bind_symbols(arguments: Sequence, shapes: Mapping[str, tuple], *,
                 allow_unbound: bool = False,
                 bound: Mapping[str, tuple[int, str]] | None = None) -> dict[str, int]:
    """Checks each input's shape in `shapes` against its declared shape and
    returns the value of every symbol, bound from the first input that uses it.
    `bound` (symbol -> (value, the input that bound it)) holds symbols bound
    already, by arrays bound once (`kernel.partial`): the inputs must agree.

    Raises ValueError naming the input and dimension for a wrong rank or
    static size, both inputs for an inconsistent symbol, and (unless
    `allow_unbound`, for callers that allocate nothing) the symbols that no
    input determines.
    """
    symbols: dict[str, int] = {}
    bound_by: dict[str, str] = {}
    for symbol, (value, name) in (bound or {}).items():
        symbols[symbol], bound_by[symbol] = value, name
    for arg in arguments:
        if arg.kind not in SUPPLIED:
            continue
        shape = tuple(shapes[arg.name])
        declared_shape = tuple(arg.shape)
        stored = ""
        if packed.is_packed(arg.dtype):
            # A packed weight's array is its blocks: the last dimension in bytes.
            declared_shape = packed.storage_shape(declared_shape, arg.dtype)
            stored = f", stored as {declared_shape} bytes of {arg.dtype} blocks"
        if len(shape) != len(declared_shape):
            raise ValueError(
                f"{arg.kind} {arg.name!r} has rank {len(shape)} (shape {shape}), "
                f"expected rank {len(arg.shape)} for shape {arg.shape}{stored}")
        for dim, (size, declared) in enumerate(zip(shape, declared_shape)):
            if isinstance(declared, int):
                if size != declared:
                    raise ValueError(
                        f"{arg.kind} {arg.name!r} dim {dim} is {size}, expected {declared} "
                        f"(shape {arg.shape}{stored})")
            elif declared in symbols and symbols[declared] != size:
                raise ValueError(
                    f"symbol {declared!r} is bound to {symbols[declared]} by input "
                    f"{bound_by[declared]!r} but {arg.kind} {arg.name!r} dim {dim} is {size}")
            else:
                symbols[declared] = size
                bound_by[declared] = arg.name
    unbound = [a.name for a in arguments if a.kind == "symbol" and a.name not in symbols]
    if unbound and not allow_unbound:
        raise ValueError(f"symbols {unbound} are not used by any input, so cannot be bound")
    return symbols


def dim_value(dim, symbols: Mapping[str, int]) -> int:
    """The value of one dimension of a declared shape: an int, a symbol's
    name, or a derived dimension "ceildiv(<symbol>, <divisor>)"
    (`etc.graph.CeilDiv`)."""
    if isinstance(dim, int):
        return dim
    if dim in symbols:
        return symbols[dim]
    if dim.startswith("ceildiv(") and dim.endswith(")"):
        symbol, _, divisor = dim[len("ceildiv("):-1].partition(",")
        return -(-symbols[symbol.strip()] // int(divisor))
    raise KeyError(dim)


def concrete_shape(shape: Sequence, symbols: Mapping[str, int]) -> tuple[int, ...]:
    """`shape` with every symbol (or derived dimension) replaced by its value."""
    return tuple(dim_value(d, symbols) for d in shape)


def out_items(graph_name: str, outputs: Sequence[str], out) -> list:
    """The (output name, array) pairs of an `out=` argument: a dict by
    output name or a sequence (any iterable) in output order. Unknown names
    and a wrong count are TypeErrors naming the outputs."""
    names = list(outputs)
    if isinstance(out, dict):
        unknown = [n for n in out if n not in names]
        if unknown:
            raise TypeError(f"{graph_name}: out= names {unknown} are not outputs {names}")
        return list(out.items())
    out = list(out)
    if len(out) != len(names):
        raise TypeError(f"{graph_name}: out= has {len(out)} arrays for the {len(names)} "
                        f"outputs {names}")
    return list(zip(names, out))
