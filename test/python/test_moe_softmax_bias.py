"""Softmax MoE routing with a selection bias and a floor under the
renormalising sum (ERNIE 4.5): `g.moe(..., selection_bias=, norm_min=)`
(transformers' `Ernie4_5_MoeTopKRouter`: p = softmax(logits), experts
chosen by p + e_score_correction_bias, weighted by the unbiased p divided
by max(sum, moe_norm_min)).

Every kernel path against `etc.reference.moe` for 1 to 33 tokens: the CPU's
vector tiles (f32, bf16 transposed), its packed int8 tiles (q8_0) and the
CUDA tiles by the exact lane simulation (the router tile is the one all of
them share); inputs route with a margin, and each layer is checked far
from the reference without its bias or without its floor. The floor by
hand (`moe_route`), ptxas on the CUDA router, and the operator's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from etc.reference import moe_route

from moe_routing_layers import (assert_router_assembles, check, draw_inputs, error_operands,
                                layers_graph, run_paths)
from ptxas_check import needs_ptxas

E, TOP_K, TILE = 8, 2, 8
#: A floor most tokens' two chosen scores sum below (the bias picks
#: experts the softmax scores low), so that it is seen.
NORM_MIN = 0.4

#: name: (experts' dtype, x's dtype, transpose_w, H, F)
LAYERS = {
    "f32": ("f32", "f32", False, 37, 23),
    "bf16_transposed": ("bf16", "bf16", True, 64, 40),
    "q8_0": ("q8_0", "f32", True, 64, 64),
}


def _options(name: str, bias) -> dict:
    return dict(selection_bias=bias, norm_min=NORM_MIN)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _inputs(name: str, tokens: int) -> dict:
    """x, router and the selection bias, routing with a margin of 1e-3
    (the bias about as large as the scores' spread), each token's chosen
    sum at least 0.02 from the floor and some token's below 0.6 of it."""

    def accept(x, router, bias) -> bool:
        p = _softmax(x @ router)
        ordered = -np.sort(-(p + bias), axis=-1)
        chosen, _ = moe_route(x @ router, TOP_K, selection_bias=bias)
        total = np.take_along_axis(p, chosen, axis=1).sum(-1)
        return (ordered[:, TOP_K - 1] - ordered[:, TOP_K]).min() > 1e-3 and \
            np.abs(total - NORM_MIN).min() > 0.02 and total.min() < 0.6 * NORM_MIN
    return draw_inputs(name, LAYERS[name], E, tokens, 0.15, accept)


def _check(name: str, got: np.ndarray, want: np.ndarray, values: dict) -> None:
    """Close to the reference, far from the layer without its floor and
    (past one token, whose experts the bias may keep) without its bias."""
    changes = {"no floor": dict(norm_min=0.0)}
    if got.shape[0] > 1:
        changes["no bias"] = dict(selection_bias=None)
    check(name, LAYERS[name], got, want, values, TOP_K, _options(name, values[f"{name}_bias"]),
          changes)


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_paths(kernels):
    """The CPU's vector and packed tiles, and the CUDA ones simulated."""
    g = layers_graph("softmax_bias_moe", LAYERS, E, TOP_K, TILE, _options)
    run_paths(g, kernels, LAYERS, E, _inputs, _check)


def test_route_reference():
    """`moe_route` by hand: the experts of the highest p + bias, weighted by
    their unbiased p over max(sum, norm_min): a floor above the sum scales
    the weights down, one below it leaves the renormalised weights."""
    logits = np.array([[2.0, 0.0, -1.0, 1.0]], np.float32)
    p = np.exp(logits[0].astype(np.float64))
    p /= p.sum()
    bias = np.array([0.0, 0.3, 0.9, 0.0], np.float32)  # p + bias: 0.64, 0.39, 0.93, 0.24
    chosen, weights = moe_route(logits, 2, selection_bias=bias, norm_min=0.5)
    assert chosen.tolist() == [[2, 0]]
    assert p[[2, 0]].sum() > 0.5
    np.testing.assert_allclose(weights[0], p[[2, 0]] / p[[2, 0]].sum(), rtol=1e-6)
    chosen, weights = moe_route(logits, 2, selection_bias=bias, norm_min=0.9)
    np.testing.assert_allclose(weights[0], p[[2, 0]] / 0.9, rtol=1e-6)
    chosen, weights = moe_route(logits, 2, False, selection_bias=bias, norm_min=0.9)
    np.testing.assert_allclose(weights[0], p[[2, 0]], rtol=1e-6)  # (no renormalising)


@needs_ptxas
def test_cuda_router_assembles(tmp_path):
    """ERNIE-4.5-21B-A3B's routing (64 experts, 6 per token, the float32
    selection bias, the floor) at its widths (H 2560, q8_0 experts of
    1536): ptxas assembles the tiles on sm_90a with no spills."""
    assert_router_assembles(tmp_path, "softmax_bias", 2560, 1536, 64, 6, "f32", norm_min=1e-12)


def test_errors():
    g, x, router, w1, w2 = error_operands(E)
    for value in (-1e-12, float("inf"), float("nan"), True, "0"):
        with pytest.raises(ValueError, match=r"norm_min must be a finite number >= 0"):
            g.moe(x, router, w1, w2, 2, norm_min=value)
    with pytest.raises(ValueError, match=r"norm_min = 0.4 floors the renormalising sum, but "
                                         r"normalize=False renormalises nothing"):
        g.moe(x, router, w1, w2, 2, normalize=False, norm_min=0.4)
    with pytest.raises(ValueError, match=r"operand 'selection_bias' .* must have shape \(8,\)"):
        g.moe(x, router, w1, w2, 2, selection_bias=g.input("b4", (4,)))
    # A floor of 0 records nothing: the op is plain softmax routing's.
    g.moe(x, router, w1, w2, 2, norm_min=0.0, name="plain")
    assert "norm_min" not in g._ops[-1].params
