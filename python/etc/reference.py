"""A NumPy reference for `etc.Graph`: what every compiled kernel must compute.

`evaluate(g, **inputs)` runs the graph's operators in call order with NumPy
in float32 and returns the outputs in `g.output()` order.

Dtypes:

* ``f32``: inputs are ``np.float32`` arrays; outputs are ``np.float32``.
* ``f16``: inputs are ``np.float16`` arrays, computed in float32; every
  operator result is rounded to float16 (as the compiled kernel stores it)
  and outputs are returned as ``np.float16``.
* ``bf16``: NumPy has no bfloat16, so inputs are ``np.float32`` arrays,
  rounded to bfloat16 (`round_bf16`: to nearest, ties to even) as the
  runtimes round them when they copy them into bf16 buffers, or
  ``np.uint16`` arrays of bf16 bit patterns, taken as they are. Results are
  rounded to bfloat16 after every operator and outputs are returned as
  ``np.float32`` arrays holding bfloat16 values.

``topk`` indices, ``argmax`` and ``sample`` results and ``i32`` inputs are
``np.int32``.
``moe`` computes its experts in float32 and rounds only its result; its
internal routing buffers are not outputs. The LLM operators (embedding,
rope, head_rmsnorm, sum_squares, split_rmsnorm, kv_append, attention, argmax,
sample) are computed by `etc.reference_llm` (and `sample` by
`etc.reference_sampling`).

State buffers (`Graph.state`) are passed like inputs and, as in the
compiled kernels, updated in place: after `evaluate`, the caller's state
arrays hold what the graph wrote into them.

Symbolic dimensions are bound from the input shapes; an inconsistent
binding raises `ValueError` naming both inputs and the dimension. A
symbolic dimension may be 0, as in the kernels: every operator then returns
the empty (or, for ``sum`` over an empty row, zero) result its shape says.

The reference works on a JSON-able description of the graph (`describe`),
which saved kernels carry, so it needs only NumPy: `evaluate` takes an
`etc.Graph`, such a description, or a kernel loaded with `etc.runtime.load`.
"""

from __future__ import annotations

import numpy as np

from types import SimpleNamespace

from . import bfloat16, packed, reference_llm, reference_sampling
from .binding import INPUT_DTYPES, check_input_dtype, check_input_names, dim_value
from .binding import bind_symbols as _bind_shapes

__all__ = ["evaluate", "describe", "round_bf16", "bind_symbols", "topk", "moe", "layernorm",
           "NUMPY_DTYPES"]

#: The NumPy dtype that carries each graph dtype (etc.binding's table).
NUMPY_DTYPES = INPUT_DTYPES
#: The NumPy array a state buffer of each dtype is (bf16: uint16 bit patterns).
STATE_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
                 "bf16": np.dtype(np.uint16), "i32": np.dtype(np.int32)}


def round_bf16(x) -> np.ndarray:
    """Rounds float32 values to the nearest bfloat16 (ties to even), as float32.

    NaN stays NaN; values beyond the bfloat16 range become infinities.
    """
    x = np.asarray(x, dtype=np.float32)
    return bfloat16.from_bits(bfloat16.to_bits(x)).reshape(x.shape)


def _to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds a float32 result to what a buffer of `dtype` holds (as float32;
    int32 for i32)."""
    if dtype == "i32":
        return np.asarray(x, dtype=np.int32)
    if dtype == "bf16" and np.asarray(x).dtype == np.uint16:  # bf16 bit patterns
        return bfloat16.from_bits(x)
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return round_bf16(x)
    return x


def describe(g) -> dict:
    """A JSON-able description of graph `g` that `evaluate` accepts: its
    name, arguments (as `etc.Graph.arguments`), outputs, and operators in
    call order (kind, task name, operand and result tensor names, params)."""
    def tensor(t) -> str:
        return t.name

    arguments = [{"kind": a.kind, "name": a.name, "shape": list(a.shape), "dtype": a.dtype}
                 for a in g.arguments]
    shapes = {}
    operations = []
    for op in g.operations:
        for t in (*op.operands, op.result, *op.extra_results):
            shapes[t.name] = {"shape": list(t.symbolic_shape), "dtype": t.dtype}
        operations.append({"kind": op.kind, "name": op.name,
                           "operands": [tensor(t) for t in op.operands],
                           "result": tensor(op.result),
                           "extra_results": [tensor(t) for t in op.extra_results],
                           "params": dict(op.params)})
    return {"name": g.name, "arguments": arguments, "outputs": list(g.outputs),
            "tensors": shapes, "operations": operations}


def _description(g) -> dict:
    """`g` as a description: a Graph, a description, or anything with the
    description in `.reference` or `.abi.reference` (a kernel's ABI, a loaded
    kernel)."""
    if isinstance(g, dict):
        return g
    for holder in (g, getattr(g, "abi", None)):
        reference = getattr(holder, "reference", None)
        if isinstance(reference, dict):
            return reference
    if hasattr(g, "operations") and hasattr(g, "arguments"):
        return describe(g)
    raise TypeError(f"cannot evaluate {type(g).__name__}: expected an etc.Graph, a graph "
                    "description (etc.reference.describe) or a kernel that carries one")


def _arguments(spec: dict) -> list:
    return [SimpleNamespace(kind=a["kind"], name=a["name"], shape=tuple(a["shape"]),
                            dtype=a["dtype"]) for a in spec["arguments"]]


def bind_symbols(g, inputs: dict) -> dict:
    """Checks `inputs` against the graph's inputs (names, ranks, dtypes, static
    dims) and returns {symbol name: value} bound from their shapes. The errors
    are those of the runtimes (etc.binding)."""
    spec = _description(g)
    arguments = _arguments(spec)
    check_input_names(spec["name"], arguments, inputs)
    for t in (a for a in arguments if a.kind in ("input", "state")):
        array = inputs[t.name]
        if not isinstance(array, np.ndarray):
            raise TypeError(f"input {t.name!r} must be a numpy.ndarray, got "
                            f"{type(array).__name__}")
        if t.kind == "input":
            check_input_dtype(t.name, t, array)
            continue
        # A state is its storage, as the runtimes take it in place.
        want = STATE_STORAGE[t.dtype]
        if array.dtype != want:
            raise TypeError(f"input {t.name!r} has dtype {array.dtype}, expected {want} "
                            f"for {t.dtype} (inputs are not cast implicitly)")
    # The reference evaluates only what the outputs need, so a symbol that only
    # an unused scratch tensor mentions may stay unbound.
    return _bind_shapes(arguments, {name: array.shape for name, array in inputs.items()},
                        allow_unbound=True)


def _concrete_shape(name: str, shape, symbols: dict) -> tuple:
    concrete = []
    for d in shape:
        if isinstance(d, str):
            try:
                concrete.append(dim_value(d, symbols))
            except KeyError:
                raise ValueError(f"symbol '{d}' (in the shape of '{name}') appears in "
                                 f"no input shape, so it cannot be bound") from None
        else:
            concrete.append(d)
    return tuple(concrete)


def _gelu(x: np.ndarray) -> np.ndarray:
    k = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(k * (x + np.float32(0.044715) * x ** 3)))


def layernorm(x: np.ndarray, weight: np.ndarray, bias=None, *, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight (+ bias) over the last axis,
    in float32: the variance is the mean of the squared deviations (two
    passes, as the kernels compute it)."""
    x = np.asarray(x, np.float32)
    mean = np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
    centred = x - mean
    variance = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
    out = centred / np.sqrt(variance + np.float32(eps)) * weight
    return out if bias is None else out + bias


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row of `x` and their indices (int32), in
    decreasing order; equal values are ordered by lower index first.

    NaN ranks above every number, +inf included (NaNs are picked first, in
    index order), so every index is picked at most once; the kernels use the
    same order."""
    x = np.asarray(x, dtype=np.float32)
    nan = np.isnan(x)
    # lexsort is stable and sorts by its last key first: NaNs, then larger
    # values, then (stability) lower indices.
    order = np.lexsort((-np.where(nan, 0, x), ~nan), axis=-1)[..., :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


#: The gate function of each gated product (silu_mul, gelu_mul, sigmoid_mul).
_GATES = {"silu_mul": _silu, "gelu_mul": _gelu, "sigmoid_mul": _sigmoid}


def moe(x: np.ndarray, router_w: np.ndarray, w1: np.ndarray, w2: np.ndarray,
        top_k: int, w_up=None, normalize: bool = True, *, router_b=None, b1=None, b_up=None,
        b2=None, activation: str = "silu", swiglu_limit=None,
        swiglu_alpha=None, scoring: str = "softmax", selection_bias=None,
        routed_scale: float = 1.0, n_group: int = 1, topk_group: int = 1,
        group_score: str = "top2", norm_min: float = 0.0) -> np.ndarray:
    """Mixture-of-Experts: p = softmax(x @ router_w + router_b) per token
    (sigmoid with `scoring="sigmoid"`), the top_k experts by p (ties: lower
    expert first; by p + selection_bias among the experts of the best
    `topk_group` of `n_group` groups, see `moe_route`), their p
    renormalised to sum 1 (unless `normalize` is false; sigmoid scores by
    sum + 1e-20; by at least `norm_min`) and times `routed_scale` as weights,
    y[t] = sum_j weight_j * (act_j @ w2[e_j] + b2[e_j]), with
    gate = x[t] @ w1[e_j] + b1[e_j], up = x[t] @ w_up[e_j] + b_up[e_j] and
    act_j = silu(gate) (times up with `w_up`: gated experts), or with
    activation "swiglu_oai" (gpt-oss) g = min(gate, limit),
    u = clip(up, -limit, limit), act_j = (u + 1) g sigmoid(alpha g).
    Absent biases are zero; float32."""
    x, router_w, w1, w2 = (np.asarray(a, dtype=np.float32) for a in (x, router_w, w1, w2))
    bias = lambda b: None if b is None else np.asarray(b, dtype=np.float32)
    router_b, b1, b_up, b2 = bias(router_b), bias(b1), bias(b_up), bias(b2)
    if activation not in ("silu", "swiglu_oai"):
        raise ValueError(f"moe: unknown activation {activation!r}")
    if activation == "swiglu_oai" and (w_up is None or swiglu_limit is None
                                       or swiglu_alpha is None):
        raise ValueError("moe: activation 'swiglu_oai' needs w_up, swiglu_limit and "
                         "swiglu_alpha")
    logits = x @ router_w
    if router_b is not None:
        logits = logits + router_b
    chosen, weights = moe_route(logits, top_k, normalize, scoring=scoring,
                                selection_bias=selection_bias, routed_scale=routed_scale,
                                n_group=n_group, topk_group=topk_group,
                                group_score=group_score, norm_min=norm_min)
    y = np.zeros(x.shape, np.float32)
    for j in range(top_k):
        for expert in np.unique(chosen[:, j]):
            tokens = np.nonzero(chosen[:, j] == expert)[0]
            gate = x[tokens] @ w1[expert]
            if b1 is not None:
                gate = gate + b1[expert]
            up = None
            if w_up is not None:
                up = x[tokens] @ np.asarray(w_up[expert], np.float32)
                if b_up is not None:
                    up = up + b_up[expert]
            if activation == "swiglu_oai":
                limit, alpha = np.float32(swiglu_limit), np.float32(swiglu_alpha)
                g = np.minimum(gate, limit)
                u = np.clip(up, -limit, limit)
                act = (u + np.float32(1.0)) * (g / (np.float32(1.0) + np.exp(-alpha * g)))
            else:
                act = _silu(gate)
                if up is not None:
                    act = act * up
            out = act @ w2[expert]
            if b2 is not None:
                out = out + b2[expert]
            y[tokens] += weights[tokens, j:j + 1] * out
    return y


def moe_route(logits: np.ndarray, top_k: int, normalize: bool = True, *,
              scoring: str = "softmax", selection_bias=None, routed_scale: float = 1.0,
              n_group: int = 1, topk_group: int = 1, group_score: str = "top2",
              norm_min: float = 0.0) -> tuple:
    """The routing of `moe` from the router's logits (T, E): the chosen
    experts (T, top_k) and their weights (T, top_k), float32. Scores p are
    the softmax or (scoring "sigmoid") the sigmoid of the logits; experts
    are ranked by p + selection_bias, and with n_group > 1 only the experts
    of the topk_group groups (of E / n_group consecutive experts) whose two
    best ranked values sum highest compete (DeepSeek-V3's and GLM-4.5's
    rule; group_score "max": whose best is highest, DeepSeek-V2's); the
    weights are the chosen p (unbiased), renormalised where `normalize`
    (divided by max(sum, norm_min)), times `routed_scale`."""
    logits = np.asarray(logits, np.float32)
    if scoring == "softmax":
        e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
        p = e / np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
    elif scoring == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf: p = 0, as torch's
            p = _sigmoid(logits)
    else:
        raise ValueError(f"moe: unknown scoring {scoring!r}")
    ranked = p if selection_bias is None else p + np.asarray(selection_bias, np.float32)
    if n_group > 1:
        tokens, experts = ranked.shape
        best = topk(ranked.reshape(-1, experts // n_group), 1 if group_score == "max" else 2)[0]
        group_scores = (best[:, 0] if group_score == "max" else best[:, 0] + best[:, 1]) \
            .reshape(tokens, n_group)
        kept = topk(group_scores, topk_group)[1]
        inside = np.zeros((tokens, n_group), bool)
        np.put_along_axis(inside, kept, True, axis=1)
        ranked = np.where(np.repeat(inside, experts // n_group, axis=1), ranked,
                          np.float32(-np.inf))
    chosen = topk(ranked, top_k)[1]
    weights = np.take_along_axis(p, chosen, axis=1)
    if normalize:
        total = np.sum(weights, axis=-1, keepdims=True, dtype=np.float32)
        if scoring == "sigmoid":
            total = total + np.float32(1e-20)
        weights = weights / np.maximum(total, np.float32(norm_min))
    return chosen, (weights * np.float32(routed_scale)).astype(np.float32)


def _apply(op, vals: list) -> np.ndarray:
    kind = op.kind
    if kind in reference_llm.KINDS:
        return reference_llm.apply(op, vals)
    if kind == "moe":
        params = op.params
        given = ["x", "router_w", "w1", "w2", *(["w_up"] if params.get("gated") else []),
                 *params.get("biases", ())]
        named = dict(zip(given, vals))
        if params.get("transpose_w"):
            for role in ("w1", "w2", "w_up"):
                if role in named:
                    named[role] = np.swapaxes(named[role], -1, -2)
        return moe(named["x"], named["router_w"], named["w1"], named["w2"], params["top_k"],
                   named.get("w_up"), params.get("normalize", True),
                   router_b=named.get("router_b"), b1=named.get("b1"), b_up=named.get("b_up"),
                   b2=named.get("b2"), activation=params.get("activation", "silu"),
                   swiglu_limit=params.get("swiglu_limit"),
                   swiglu_alpha=params.get("swiglu_alpha"),
                   scoring=params.get("scoring", "softmax"),
                   selection_bias=named.get("selection_bias"),
                   routed_scale=params.get("routed_scale", 1.0),
                   n_group=params.get("n_group", 1), topk_group=params.get("topk_group", 1),
                   group_score=params.get("group_score", "top2"),
                   norm_min=params.get("norm_min", 0.0))
    if kind == "matmul":
        a, b = vals[:2]  # a residual operand is added by `evaluate`
        return a @ (b.T if op.params["transpose_b"] else b)
    if kind == "add":
        return vals[0] + vals[1]
    if kind == "mul":
        return vals[0] * vals[1]
    if kind == "exp":
        return np.exp(vals[0])
    if kind == "silu":
        return _silu(vals[0])
    if kind in ("silu_mul", "gelu_mul", "sigmoid_mul"):  # finished by `evaluate`
        return vals[1]
    if kind == "gelu":
        return _gelu(vals[0])
    if kind == "scale":
        return vals[0] * np.float32(op.params["c"])
    if kind == "softcap":
        c = np.float32(op.params["c"])
        return c * np.tanh(vals[0] / c)
    if kind in ("rmsnorm", "layernorm", "softmax") and vals[0].shape[-1] == 0:
        # Rows of width 0 (a symbolic dimension bound to 0) normalise to
        # rows of width 0; NumPy's reductions would raise or warn.
        return vals[0].copy()
    if kind == "rmsnorm":
        x, w = vals
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return x / np.sqrt(ms + np.float32(op.params["eps"])) * \
            (np.float32(op.params.get("offset", 0.0)) + w)
    if kind == "layernorm":
        return layernorm(*vals, eps=op.params["eps"])
    if kind == "softmax":
        x = vals[0]
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
    if kind == "sum":
        return np.sum(vals[0], axis=-1, dtype=np.float32)
    raise AssertionError(f"unknown operator kind {kind!r}")


def evaluate(g, /, **inputs) -> list[np.ndarray]:
    """Computes every output of `g` (an `etc.Graph`, a description from
    `describe`, or a kernel that carries one) from the named input arrays
    (see the module docstring for dtypes); returns them in output order.
    `g` is positional-only, so an input may be called "g"."""
    spec = _description(g)
    if not spec["outputs"]:
        raise ValueError(f"Graph '{spec['name']}' has no outputs")
    symbols = bind_symbols(spec, inputs)
    tensors = spec["tensors"]
    env: dict[str, np.ndarray] = {}
    for arg in spec["arguments"]:
        if arg["kind"] in ("input", "state"):
            # A copy for states: operators replace their value, which is
            # written back into the caller's array at the end.
            value = inputs[arg["name"]]
            if packed.is_packed(arg["dtype"]):
                # A packed weight means its dequantized values.
                env[arg["name"]] = packed.dequantize(value, arg["dtype"])
                continue
            env[arg["name"]] = np.array(_to_storage(value, arg["dtype"]),
                                        copy=arg["kind"] == "state")
    with np.errstate(over="ignore", under="ignore"):
        for op in spec["operations"]:
            op = SimpleNamespace(**op)
            vals = [env[name] for name in op.operands]
            if op.kind == "topk":
                result, indices = topk(vals[0], op.params["k"])
                env[op.extra_results[0]] = indices
            elif op.kind == "sample" and op.extra_results:
                result = _apply(op, vals)
                logits, temperature, top_k, top_p, min_p = vals[:5]
                values, ids = reference_sampling.logprobs(
                    logits, temperature, top_k, top_p, min_p, result, vals[7],
                    op.params["max_logprobs"])
                env[op.extra_results[0]], env[op.extra_results[1]] = values, ids
            else:
                result = _apply(op, vals)
                if result.dtype != np.int32:
                    result = result.astype(np.float32, copy=False)
            declared = tensors[op.result]
            if op.kind == "matmul" and len(vals) == 3:
                # The product, rounded as a matmul's result, plus the residual.
                result = _to_storage(result, declared["dtype"]) + vals[2]
            if op.kind in ("silu_mul", "gelu_mul", "sigmoid_mul"):
                # silu(a), gelu(a) or sigmoid(a) (a column: broadcast over
                # b's columns), rounded as its result, times b.
                gate = _GATES[op.kind](vals[0])
                result = _to_storage(gate, declared["dtype"]) * vals[1]
            shape = _concrete_shape(op.result, declared["shape"], symbols)
            assert result.shape == shape, (op.name, result.shape, shape)
            env[op.result] = _to_storage(result, declared["dtype"])
    for arg in spec["arguments"]:
        if arg["kind"] == "state":
            value = env[arg["name"]]
            if arg["dtype"] == "bf16":
                value = bfloat16.to_bits(value)
            inputs[arg["name"]][...] = value
    outs = []
    dtypes = {a["name"]: a["dtype"] for a in spec["arguments"]}
    for name in spec["outputs"]:
        v = env[name]
        outs.append(v.astype(np.float16) if dtypes[name] == "f16" else v.copy())
    return outs
