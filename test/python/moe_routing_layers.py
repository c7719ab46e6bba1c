"""What the MoE routing tests share (test_moe_sigmoid.py,
test_moe_softmax_bias.py, test_moe_routing_options.py): a layer is named by
its inputs' prefix and described by a tuple that starts (experts' dtype,
x's dtype, transpose_w, H, F); a graph of such layers of gated experts,
each with its routing options, their weights and inputs, the reference of
a layer with some routing options changed, the check that a path's output
is the reference's and far from the layer without each of its options,
the run of the graph on every token count, and (`routing_margin`) how
far inputs are from routing otherwise; the ptxas check of a router at a
real model's widths (`assert_router_assembles`) and the operands the
error tests build on (`error_operands`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np

import etc
from etc import packed
from etc.reference import evaluate, moe as moe_reference, round_bf16

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kit"))
# The smallest lead of the chosen experts (and groups) over the next: the
# GPU kit's, so that the tests and the kit draw inputs by one rule.
from families import _routing_margin as routing_margin  # noqa: E402, F401
from ptxas_check import assemble, assert_no_spills  # noqa: E402

#: Token counts the CPU's kernels run at; the simulated CUDA lanes (slow)
#: at the ends only.
TOKENS = (1, 2, 5, 16, 33)
CUDA_TOKENS = (1, 33)


def layers_graph(graph_name: str, layers: dict, experts: int, top_k: int, tile: int,
                 options: Callable) -> etc.Graph:
    """One `g.moe` of gated experts per layer (inputs `<name>_<role>`,
    output `name`), routed with `options(name, its selection bias input)`."""
    g = etc.Graph(graph_name)
    T = g.symbol("T")
    outs = []
    for name, layer in layers.items():
        expert, dtype, transposed, h, f = layer[:5]
        inp = lambda role, shape, dt: g.input(f"{name}_{role}", shape, dt)
        w_shape = lambda rows, cols: (experts, cols, rows) if transposed else \
            (experts, rows, cols)
        outs.append(g.moe(inp("x", (T, h), dtype), inp("router", (h, experts), dtype),
                          inp("w1", w_shape(h, f), expert), inp("w2", w_shape(f, h), expert),
                          top_k, w_up=inp("w_up", w_shape(h, f), expert),
                          transpose_w=transposed, tile=tile, name=name,
                          **options(name, inp("bias", (experts,), "f32"))))
    g.output(*outs)
    return g


def draw_inputs(name: str, layer: tuple, experts: int, tokens: int, bias_scale: float,
                accept: Callable[[np.ndarray, np.ndarray, np.ndarray], bool]) -> dict:
    """x (T, H) of N(0, 1), router (H, E) of N(0, 1 / H) (bf16 layers'
    rounded to bf16) and the selection bias (E,) of N(0, bias_scale²),
    drawn again until `accept(x, router, bias)`."""
    dtype, h = layer[1], layer[3]
    rng = np.random.default_rng(tokens + 7 * len(name))
    for _ in range(1000):
        x = rng.standard_normal((tokens, h)).astype(np.float32)
        router = (rng.standard_normal((h, experts)) / np.sqrt(h)).astype(np.float32)
        if dtype == "bf16":
            x, router = round_bf16(x), round_bf16(router)
        bias = (rng.standard_normal(experts) * bias_scale).astype(np.float32)
        if accept(x, router, bias):
            return {f"{name}_x": x, f"{name}_router": router, f"{name}_bias": bias}
    raise AssertionError(f"{name}: no inputs of {tokens} tokens route with a margin")


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


def reference(name: str, layer: tuple, values: dict, top_k: int, **options) -> np.ndarray:
    """`etc.reference.moe` of the layer on `values` (its inputs by name;
    packed experts dequantized, transposed ones swapped back) with the
    routing `options`."""
    expert, _, transposed = layer[:3]
    v = {role: values[f"{name}_{role}"] for role in ("x", "router", "w1", "w2", "w_up")}
    for role in ("w1", "w2", "w_up"):
        w = packed.dequantize(v[role], expert) if packed.is_packed(expert) else v[role]
        v[role] = np.swapaxes(w, -1, -2) if transposed else w
    return moe_reference(v["x"], v["router"], v["w1"], v["w2"], top_k, v["w_up"], **options)


def check(name: str, layer: tuple, got: np.ndarray, want: np.ndarray, values: dict,
          top_k: int, options: dict, changes: dict) -> None:
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
        other = reference(name, layer, values, top_k, **{**options, **change})
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


def assert_router_assembles(tmp_path, name: str, h: int, f: int, experts: int, top_k: int,
                            bias_dtype: str, **routing) -> None:
    """A bf16 layer of `experts` q8_0 gated experts (H `h`, F `f`,
    transposed) routed with a `bias_dtype` selection bias and `routing`,
    compiled for sm_90a: ptxas assembles its tiles with no spills."""
    g = etc.Graph(f"{name}_cuda")
    T = g.symbol("T")
    x = g.input("x", (T, h), "bf16")
    e = experts
    g.output(g.moe(x, g.input("router", (h, e), "bf16"), g.input("gate", (e, f, h), "q8_0"),
                   g.input("down", (e, h, f), "q8_0"), top_k,
                   w_up=g.input("up", (e, f, h), "q8_0"), transpose_w=True,
                   selection_bias=g.input("bias", (e,), bias_dtype), name="out", **routing))
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    assert_no_spills(assemble(kernel.ptx, "sm_90a", tmp_path, f"{name}_moe"))


def error_operands(experts: int) -> tuple:
    """A graph and the f32 operands of a `g.moe` (x (T, 16), router
    (16, `experts`), w1 and w2 of width 8) for the option error tests."""
    g = etc.Graph("errors")
    T = g.symbol("T")
    return (g, g.input("x", (T, 16)), g.input("router", (16, experts)),
            g.input("w1", (experts, 16, 8)), g.input("w2", (experts, 8, 16)))
