"""Sigmoid-scored MoE routing (DeepSeek-V3, GLM-4.5): `g.moe(...,
scoring="sigmoid", selection_bias=, routed_scale=, n_group=, topk_group=)`
(transformers' `Glm4MoeTopkRouter`: p = sigmoid(logits), experts chosen by
p + e_score_correction_bias among the topk_group groups whose two best
biased scores sum highest, weighted by the unbiased p renormalised by
sum + 1e-20, times routed_scaling_factor).

Every kernel path against `etc.reference.moe` for 1 to 33 tokens: the CPU's
vector tiles (f32, bf16 transposed), its packed int8 tiles (q8_0) and the
CUDA tiles by the exact lane simulation; the router tile is the one all of
them share. Inputs route with a margin (so float rounding routes as the
reference does), and each layer is checked far from the reference without
its bias, its groups or its scale. Exact ties and near-ties (duplicate
router columns, biases equal or 1e-6 apart) of experts and of groups are
routed as the reference routes them: the lower expert or group first."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc.reference import evaluate, moe_route

from moe_routing_layers import (assert_router_assembles, check, draw_inputs, error_operands,
                                layers_graph, routing_margin, run_paths)
from ptxas_check import needs_ptxas

E, TOP_K, TILE, GROUPS, KEPT, SCALE = 16, 4, 8, 4, 2, 2.5

#: name: (experts' dtype, x's dtype, transpose_w, H, F, n_group, topk_group, normalize)
LAYERS = {
    "f32": ("f32", "f32", False, 37, 23, GROUPS, KEPT, True),
    "f32_flat": ("f32", "f32", True, 24, 16, 1, 1, False),
    "bf16_transposed": ("bf16", "bf16", True, 64, 40, GROUPS, KEPT, True),
    "q8_0": ("q8_0", "f32", True, 64, 64, GROUPS, 3, True),
}


def _options(name: str, bias) -> dict:
    groups, kept, normalize = LAYERS[name][5:]
    return dict(normalize=normalize, scoring="sigmoid", selection_bias=bias,
                routed_scale=SCALE, n_group=groups, topk_group=kept)


def _inputs(name: str, tokens: int) -> dict:
    """x, router and the selection bias, routing with a margin of 1e-3
    (experts and, with groups, groups), the bias (about as large as the
    scores' spread) moving the choice."""
    groups, kept = LAYERS[name][5:7]
    return draw_inputs(name, LAYERS[name], E, tokens, 0.2, lambda x, router, bias: routing_margin(
        x, router, TOP_K, bias, groups, kept, "sigmoid") > 1e-3)


def _check(name: str, got: np.ndarray, want: np.ndarray, values: dict) -> None:
    """Close to the reference, far from the layer without its scale, (past
    one token, whose experts the bias may keep) without its bias and
    (from 16 tokens, with groups) without its groups."""
    changes = {"no scale": dict(routed_scale=1.0)}
    if got.shape[0] > 1:
        changes["no bias"] = dict(selection_bias=None)
    if got.shape[0] >= 16 and LAYERS[name][5] > 1:
        changes["no groups"] = dict(n_group=1, topk_group=1)
    check(name, LAYERS[name], got, want, values, TOP_K, _options(name, values[f"{name}_bias"]),
          changes)


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_paths(kernels):
    """The CPU's vector and packed tiles, and the CUDA ones simulated."""
    g = layers_graph("sigmoid_moe", LAYERS, E, TOP_K, TILE, _options)
    run_paths(g, kernels, LAYERS, E, _inputs, _check)


def _tie_inputs(near: bool) -> dict:
    """Four tokens whose expert 0 and 1 (identical router columns, bias
    +2) are always chosen; group 1 (bias -1) always loses; groups 2 and 3
    hold the same columns and biases (a tie of groups), and in each the
    first expert (bias 1) is chosen and the next two (identical columns,
    bias 0.2) tie for the last place. `near`: group 3's biases and the
    third expert's of each group 1e-6 higher, so that they win instead."""
    h = 16
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, h)).astype(np.float32)
    router = (rng.standard_normal((h, E)) / 8).astype(np.float32)
    router[:, 1] = router[:, 0]
    router[:, 10] = router[:, 9]
    router[:, 12:16] = router[:, 8:12]
    bias = np.array([2, 2, -5, -5, -1, -1, -1, -1, 1, 0.2, 0.2, -1, 1, 0.2, 0.2, -1],
                    np.float32)
    if near:
        bias[12:16] += np.float32(1e-6)
        bias[[10, 14]] += np.float32(1e-6)
    logits = x @ router
    assert np.array_equal(logits[:, 0], logits[:, 1])
    assert np.array_equal(logits[:, 9], logits[:, 10])
    assert np.array_equal(logits[:, 8:12], logits[:, 12:16])
    return dict(x=x, router=router, bias=bias)


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_ties_and_near_ties(kernels):
    """Equal biased scores: the lower expert, the lower group; 1e-6 apart:
    the higher one (each path, as the reference)."""
    h, f = 16, 8
    g = etc.Graph("ties")
    T = g.symbol("T")
    inp = lambda n, s: g.input(n, s)
    g.output(g.moe(inp("x", (T, h)), inp("router", (h, E)), inp("w1", (E, h, f)),
                   inp("w2", (E, f, h)), TOP_K, w_up=inp("w_up", (E, h, f)), scoring="sigmoid",
                   selection_bias=inp("bias", (E,)), routed_scale=SCALE, n_group=GROUPS,
                   topk_group=KEPT, tile=TILE))
    kernel = etc.compile(g, target="cpu", kernels=kernels, workers=2)
    rng = np.random.default_rng(4)
    weights = {n: rng.standard_normal(s).astype(np.float32) / 3 for n, s in
               (("w1", (E, h, f)), ("w2", (E, f, h)), ("w_up", (E, h, f)))}
    outputs = []
    for near, expected in ((False, [0, 1, 8, 9]), (True, [0, 1, 12, 14])):
        ins = _tie_inputs(near)
        chosen, _ = moe_route(ins["x"] @ ins["router"], TOP_K, scoring="sigmoid",
                              selection_bias=ins["bias"], n_group=GROUPS, topk_group=KEPT)
        assert np.all(np.sort(chosen, axis=1) == expected), chosen
        (got,), (want,) = kernel.run(**ins, **weights), evaluate(g, **ins, **weights)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        outputs.append(got)
    # Other experts: other outputs.
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-2


def test_route_reference():
    """`moe_route` by hand: sigmoid weights of the chosen experts,
    renormalised and scaled; groups ranked by their two best biased scores
    (not their best alone), and experts outside them never chosen."""
    logits = np.array([[3.0, -3.0, -3.0, -3.0, 1.0, 1.0, -3.0, -3.0, 0.0, 0.5, 2.0, -1.0]],
                      np.float32)
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    # Group 0's best is the highest score, but groups 1 and 2 sum higher.
    chosen, weights = moe_route(logits, 2, scoring="sigmoid", routed_scale=2.0, n_group=3,
                                topk_group=2)
    assert chosen.tolist() == [[10, 4]]
    np.testing.assert_allclose(weights[0], 2 * p[0, [10, 4]] / p[0, [10, 4]].sum(), rtol=1e-6)
    chosen, weights = moe_route(logits, 2, False, scoring="sigmoid", n_group=3, topk_group=1)
    assert chosen.tolist() == [[10, 9]]  # group 2's two best
    np.testing.assert_allclose(weights[0], p[0, [10, 9]], rtol=1e-6)
    bias = np.zeros(12, np.float32)
    bias[5] = 0.01  # breaks the tie of 4 and 5 (selection only: the weights stay unbiased)
    chosen, weights = moe_route(logits, 3, False, scoring="sigmoid", selection_bias=bias)
    assert chosen.tolist() == [[0, 10, 5]]
    np.testing.assert_allclose(weights[0], p[0, [0, 10, 5]], rtol=1e-6)


@needs_ptxas
def test_cuda_router_assembles(tmp_path):
    """DeepSeek-V3's routing (256 experts in 8 groups, the best 4 kept, 8
    per token, a bf16 selection bias) at GLM-4.5-Air's widths (H 4096,
    q8_0 experts of 1408): ptxas assembles the tiles on sm_90a with no
    spills."""
    assert_router_assembles(tmp_path, "sigmoid", 4096, 1408, 256, 8, "bf16", scoring="sigmoid",
                            routed_scale=2.5, n_group=8, topk_group=4)


def test_errors():
    g, x, router, w1, w2 = error_operands(E)
    with pytest.raises(ValueError, match=r"scoring 'tanh' is not one ETC knows"):
        g.moe(x, router, w1, w2, 2, scoring="tanh")
    with pytest.raises(ValueError, match=r"n_group = 4 is a parameter of scoring='sigmoid'"):
        g.moe(x, router, w1, w2, 2, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match=r"routed_scale must be a finite number > 0, got 0"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", routed_scale=0)
    with pytest.raises(ValueError, match=r"n_group must be a positive int, got 0"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", n_group=0)
    with pytest.raises(ValueError, match=r"n_group = 3 must divide the E = 16 experts"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", n_group=3)
    with pytest.raises(ValueError, match=r"n_group = 16 must divide .* groups of at least 2"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", n_group=16)
    with pytest.raises(ValueError, match=r"topk_group = 2 needs experts in groups"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", topk_group=2)
    with pytest.raises(ValueError, match=r"topk_group = 5 is more than n_group = 4"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", n_group=4, topk_group=5)
    with pytest.raises(ValueError, match=r"top_k = 5 is more than the 4 experts"):
        g.moe(x, router, w1, w2, 5, scoring="sigmoid", n_group=4, topk_group=1)
    with pytest.raises(ValueError, match=r"operand 'selection_bias' .* must have shape \(16,\)"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid", selection_bias=g.input("b8", (8,)))
    with pytest.raises(ValueError, match=r"operand 'selection_bias' .* must be f32 or x's"):
        g.moe(x, router, w1, w2, 2, scoring="sigmoid",
              selection_bias=g.input("b16", (E,), "bf16"))
