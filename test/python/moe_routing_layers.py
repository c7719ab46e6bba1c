"""What the MoE routing tests share (test_moe_sigmoid.py,
test_moe_softmax_bias.py, test_moe_routing_options.py): a layer is named by
its inputs' prefix and described by a tuple that starts (experts' dtype,
x's dtype, transpose_w, H, F); its gated experts' weights, the reference
of the layer with some routing options changed, the check that a path's
output is the reference's and far from the layer without each of its
options, and the run of a graph of such layers on every token count."""

from __future__ import annotations

from typing import Callable

import numpy as np

import etc
from etc import packed
from etc.reference import evaluate, moe as moe_reference, round_bf16

#: Token counts the CPU's kernels run at; the simulated CUDA lanes (slow)
#: at the ends only.
TOKENS = (1, 2, 5, 16, 33)
CUDA_TOKENS = (1, 33)


def expert_weights(name: str, layer: tuple, experts: int) -> dict:
    """w1, w_up and w2 of `experts` gated experts (inputs `<name>_<role>`),
    N(0, 1 / rows), quantized to a packed experts' dtype or rounded to
    bf16, laid out as the layer's transpose_w says."""
    expert, _, transposed, h, f = layer[:5]
    rng = np.random.default_rng(len(name))
    out = {}
    for role, (rows, cols) in (("w1", (h, f)), ("w_up", (h, f)), ("w2", (f, h))):
        shape = (experts, cols, rows) if transposed else (experts, rows, cols)
        values = (rng.standard_normal(shape) / np.sqrt(rows)).astype(np.float32)
        if packed.is_packed(expert):
            out[f"{name}_{role}"] = packed.quantize(values, expert)
        else:
            out[f"{name}_{role}"] = round_bf16(values) if expert == "bf16" else values
    return out


def reference(name: str, layer: tuple, values: dict, top_k: int, normalize: bool = True,
              **options) -> np.ndarray:
    """`etc.reference.moe` of the layer on `values` (its inputs by name;
    packed experts dequantized, transposed ones swapped back) with the
    routing `options`."""
    expert, _, transposed = layer[:3]
    v = {role: values[f"{name}_{role}"] for role in ("x", "router", "w1", "w2", "w_up")}
    for role in ("w1", "w2", "w_up"):
        w = packed.dequantize(v[role], expert) if packed.is_packed(expert) else v[role]
        v[role] = np.swapaxes(w, -1, -2) if transposed else w
    return moe_reference(v["x"], v["router"], v["w1"], v["w2"], top_k, v["w_up"], normalize,
                         **options)


def check(name: str, layer: tuple, got: np.ndarray, want: np.ndarray, values: dict,
          top_k: int, options: dict, changes: dict, normalize: bool = True) -> None:
    """`got` within the path's tolerance of `want` (of its largest value:
    1e-5 in f32, 2^-7 in bf16, 3 % for packed experts), and more than 4
    tolerances from the reference of the layer (routing `options`) with
    each of `changes` (what -> options it changes: one left out)."""
    expert, dtype = layer[:2]
    got = np.asarray(got, np.float32)
    tol = (0.03 if packed.is_packed(expert) else 2.0 ** -7 if dtype == "bf16" else 1e-5) \
        * np.abs(want).max() + 1e-6
    assert np.abs(got - want).max() <= tol, (name, np.abs(got - want).max(), tol)
    for what, change in changes.items():
        other = reference(name, layer, values, top_k, normalize, **{**options, **change})
        assert np.abs(got - other).max() > 4 * tol, (name, what)


def run_paths(g: etc.Graph, kernels: str, layers: dict, experts: int,
              inputs: Callable[[str, int], dict],
              check_layer: Callable[[str, np.ndarray, np.ndarray, dict], None]) -> None:
    """`g` (one output per layer of `layers`, in order) compiled for the
    CPU with `kernels`, run with `expert_weights` at each token count with
    `inputs(name, tokens)`; `check_layer(name, output, reference output,
    every input)` per layer."""
    names = list(layers)
    weights = {k: v for name in names
               for k, v in expert_weights(name, layers[name], experts).items()}
    kernel = etc.compile(g, target="cpu", kernels=kernels, workers=2)
    run = kernel.partial(**weights)
    for tokens in TOKENS if kernels == "native" else CUDA_TOKENS:
        ins = {k: v for name in names for k, v in inputs(name, tokens).items()}
        for name, out, ref in zip(names, run.run(**ins), evaluate(g, **ins, **weights)):
            check_layer(name, out, ref, {**ins, **weights})
