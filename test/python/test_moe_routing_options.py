"""Every routing option of `g.moe` at once: a selection bias, expert groups
scored by their best (`group_score="max"`), a floor under the
renormalising sum (`norm_min`) and a routed scale, with softmax and with
sigmoid scores. No published model combines them all, but the router tile
composes them (the bias ranks, the groups mask the ranked scores, the
weights are the unbiased scores, floored, scaled), so the operator takes
every combination but those it refuses (tested here): softmax groups
scored by their two best, a floor where nothing is renormalised, and a
group score without groups.

Every kernel path against `etc.reference.moe` for 1 to 33 tokens (the
CPU's vector tiles, f32 and bf16 transposed, its packed q8_0 tiles, the
CUDA tiles by the exact lane simulation), each layer far from the
reference without each option; ptxas on the CUDA router at a real
width."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc.reference import moe_route

from moe_routing_layers import (assert_router_assembles, check, draw_inputs, layers_graph,
                                routing_margin, run_paths)
from ptxas_check import needs_ptxas

E, TOP_K, TILE, GROUPS, KEPT, SCALE = 16, 3, 8, 4, 2, 2.5
#: Per scoring, a floor that some tokens' chosen scores sum below.
NORM_MIN = {"softmax": 0.4, "sigmoid": 2.0}

#: name: (experts' dtype, x's dtype, transpose_w, H, F, scoring)
LAYERS = {
    "softmax_f32": ("f32", "f32", False, 37, 23, "softmax"),
    "softmax_bf16_transposed": ("bf16", "bf16", True, 64, 40, "softmax"),
    "softmax_q8_0": ("q8_0", "f32", True, 64, 64, "softmax"),
    "sigmoid_f32": ("f32", "f32", True, 24, 16, "sigmoid"),
}


def _options(name: str, bias: np.ndarray) -> dict:
    scoring = LAYERS[name][5]
    return dict(scoring=scoring, selection_bias=bias, routed_scale=SCALE, n_group=GROUPS,
                topk_group=KEPT, group_score="max", norm_min=NORM_MIN[scoring])


def _inputs(name: str, tokens: int) -> dict:
    """x, router and the selection bias (about the scores' spread): the
    chosen groups and experts ahead of the next by 1e-3 (the floor, a
    `max`, needs no margin), and some token's chosen sum below 0.75 of
    the floor."""
    scoring = LAYERS[name][5]

    def accept(x, router, bias) -> bool:
        options = _options(name, bias)
        floor = options.pop("norm_min")
        weights = moe_route(x @ router, TOP_K, False, **{**options, "routed_scale": 1.0})[1]
        return routing_margin(x, router, TOP_K, bias, GROUPS, KEPT, scoring, "max") > 1e-3 \
            and weights.sum(-1).min() < 0.75 * floor
    return draw_inputs(name, LAYERS[name], E, tokens, 0.05 if scoring == "softmax" else 0.2,
                       accept)


def _check(name: str, got: np.ndarray, want: np.ndarray, values: dict) -> None:
    """Close to the reference; far from it without the floor or the scale,
    (past one token) without the bias, and (at 33 tokens) without the
    groups or with groups scored by their two best."""
    changes = {"no floor": dict(norm_min=0.0), "no scale": dict(routed_scale=1.0)}
    if got.shape[0] > 1:
        changes["no bias"] = dict(selection_bias=None)
    if got.shape[0] == 33:
        changes.update({"no groups": dict(n_group=1, topk_group=1),
                        "two best": dict(group_score="top2")})
    options = _options(name, values[f"{name}_bias"])
    check(name, LAYERS[name], got, want, values, TOP_K, options, changes)


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_paths(kernels):
    """The CPU's vector and packed tiles, and the CUDA ones simulated."""
    g = layers_graph("routing_options", LAYERS, E, TOP_K, TILE, _options)
    run_paths(g, kernels, LAYERS, E, _inputs, _check)


@needs_ptxas
def test_cuda_router_assembles(tmp_path):
    """Every option at once at DeepSeek-V2's routing widths (160 experts
    in 8 groups, the best 3 kept, 6 per token; H 5120, q8_0 experts of
    1536): ptxas assembles the tiles on sm_90a with no spills."""
    assert_router_assembles(tmp_path, "routing_options", 5120, 1536, 160, 6, "f32",
                            routed_scale=16.0, n_group=8, topk_group=3, group_score="max",
                            norm_min=1e-12)


def test_refusals():
    """The two combinations the operator refuses, each by name."""
    g = etc.Graph("refused")
    x, router = g.input("x", (4, 8)), g.input("router", (8, E))
    w1, w2 = g.input("w1", (E, 8, 4)), g.input("w2", (E, 4, 8))
    with pytest.raises(ValueError, match=r"n_group = 4 is a parameter of scoring='sigmoid' "
                                         r"routing .* take group_score='max'"):
        g.moe(x, router, w1, w2, 2, n_group=4, topk_group=2, group_score="top2")
    for scoring in ("softmax", "sigmoid"):
        with pytest.raises(ValueError, match=r"norm_min = 0.5 floors the renormalising sum, "
                                             r"but normalize=False renormalises nothing"):
            g.moe(x, router, w1, w2, 2, normalize=False, scoring=scoring, norm_min=0.5)
        with pytest.raises(ValueError, match=r"group_score = 'max' scores expert groups, but "
                                             r"n_group = 1 forms none"):
            g.moe(x, router, w1, w2, 2, scoring=scoring, group_score="max")
    # Groups of one expert, scored by their best: the groups' choice is the
    # experts' own, and the op takes it.
    g.moe(x, router, w1, w2, 2, n_group=E, topk_group=2, group_score="max", name="singles")
    assert g._ops[-1].params["n_group"] == E
