"""The GPU check kit's families for sigmoid_mul, gelu_mul (GeGLU, f32 and
bf16), sigmoid-scored MoE routing, softmax routing with a selection bias
and a floor (ERNIE 4.5's) or with groups scored by their best
(DeepSeek-V2's), the GEMV's ragged last tile, the norm split over ranks
and layernorm (kit/families.py): they compile for the GPU and assemble
without spills, take the tiles they are there to check, match the NumPy
reference with the CUDA lanes simulated on the CPU at their recipes' sizes
and inputs, and their recipes draw inputs whose routing the bias and the
groups decide."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.reference import moe_route
from ptxas_check import assemble, assert_no_spills, needs_ptxas

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kit"))
import families  # noqa: E402

NEW = ("op_sigmoid_mul", "op_gelu_mul", "op_gelu_mul_bf16", "moe_sigmoid", "moe_sigmoid_bf16",
       "gemv_ragged", "gemv_ragged_bf16", "moe_softmax_bias", "moe_softmax_bias_bf16",
       "op_layernorm", "layernorm_rows", "layernorm_rows_f32", "moe_group_max",
       "moe_group_max_bf16", "split_norm", "split_norm_bf16")


@pytest.mark.parametrize("name", NEW)
def test_family_matches_the_reference_with_cuda_lanes(name):
    """What the kit's run.py does on a GPU, on the CPU build of the CUDA
    tiles: fresh inputs from the recipe at each of its sizes, every output
    within the recipe's tolerance of the reference."""
    build, recipe = families.families()[name]
    graph = build()
    kernel = etc.compile(graph, target="cpu", kernels="cuda", workers=2)
    symbol = next(a.name for a in kernel.arguments if a.kind == "symbol")
    rng = np.random.default_rng(11)
    for size in recipe.sizes:
        inputs = families.make_inputs(kernel.arguments, {symbol: size}, recipe, rng)
        outputs = kernel.run(**inputs)
        expected = etc.reference.evaluate(graph, **inputs)
        assert len(outputs) == len(expected) == len(graph.outputs)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            error = families.relative_error(got, want)
            assert error <= recipe.tolerance, (name, size, i, error)


@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
def test_ragged_family_takes_the_transposed_gemv(chip):
    """Every N of RAGGED_N (none a multiple of a tile width) on
    `MatmulSkinnyT`, not the generic matmul tile."""
    for dtype in ("f32", "bf16"):
        ir = etc.compile(families.gemv_ragged_graph(dtype), target="cuda", chip=chip).ir("graph")
        kinds = re.findall(r"_tile_(matmul\w*?)_\d+\(", ir)
        assert len(kinds) >= len(families.RAGGED_N) and set(kinds) == {"matmul_gemv_t"}, kinds


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("name", NEW)
def test_family_assembles_without_spills(name, chip, tmp_path):
    graph = families.families()[name][0]()
    report = assemble(etc.compile(graph, target="cuda", chip=chip).ptx, chip, tmp_path, name)
    assert_no_spills(report)


def test_sigmoid_recipe_routes_by_bias_and_groups():
    """At 40 tokens the recipe's inputs route some tokens otherwise without
    the selection bias, and some otherwise without the groups, so the kit
    checks both; each draw passes the margin check."""
    _, recipe = families.families()["moe_sigmoid"]
    arguments = families.moe_sigmoid_graph().arguments
    inputs = families.make_inputs(arguments, {"T": 40}, recipe, np.random.default_rng(5))
    logits = inputs["x"] @ inputs["router_w"]
    full = dict(scoring="sigmoid", selection_bias=inputs["bias"], n_group=4, topk_group=2)
    chosen = np.sort(moe_route(logits, 2, **full)[0], axis=-1)
    for without in (dict(selection_bias=None), dict(n_group=1, topk_group=1)):
        other = np.sort(moe_route(logits, 2, **{**full, **without})[0], axis=-1)
        assert np.any(chosen != other), without


def test_softmax_bias_recipe_routes_by_bias_under_the_floor():
    """At 40 tokens the recipe's inputs route some tokens otherwise without
    the selection bias, and some tokens' chosen scores sum below the floor
    (0.4), some above it, so the kit checks the bias and both sides of the
    floor."""
    _, recipe = families.families()["moe_softmax_bias"]
    arguments = families.moe_softmax_bias_graph().arguments
    inputs = families.make_inputs(arguments, {"T": 40}, recipe, np.random.default_rng(5))
    logits = inputs["x"] @ inputs["router_w"]
    chosen, weights = moe_route(logits, 2, selection_bias=inputs["bias"], norm_min=0.4)
    unbiased = moe_route(logits, 2)[0]
    assert np.any(np.sort(chosen, axis=-1) != np.sort(unbiased, axis=-1))
    floored = weights.sum(-1) < 0.999
    assert floored.any() and not floored.all()


def test_group_max_recipe_routes_by_the_groups_best():
    """At 40 tokens the recipe's inputs route some tokens otherwise without
    the groups, and some otherwise were the groups scored by their two
    best (group_score "top2"), so the kit checks the "max" rule itself."""
    _, recipe = families.families()["moe_group_max"]
    arguments = families.moe_group_max_graph().arguments
    inputs = families.make_inputs(arguments, {"T": 40}, recipe, np.random.default_rng(5))
    logits = inputs["x"] @ inputs["router_w"]
    full = dict(n_group=4, topk_group=2, group_score="max", routed_scale=2.0)
    chosen = np.sort(moe_route(logits, 3, False, **full)[0], axis=-1)
    for without in (dict(n_group=1, topk_group=1), dict(group_score="top2")):
        other = np.sort(moe_route(logits, 3, False, **{**full, **without})[0], axis=-1)
        assert np.any(chosen != other), without


def test_routing_margin_sees_group_max_ties():
    """Two groups whose best experts score the same leave no margin for
    the choice of groups by their best, though their sums of two differ."""
    x = np.eye(16, dtype=np.float32)[:6]  # logits: the router's first rows
    router = (np.random.default_rng(2).standard_normal((16, 8)) * 0.25).astype(np.float32)
    assert families._routing_margin(x, router, 2, None, 4, 2, "softmax", "max") > 0
    # Group 0 far ahead, group 3 far behind; groups 1 and 2 have the same
    # best (experts 2 and 4), group 2 the higher second.
    router[:, 0:2] += 3.0
    router[:, 6:8] -= 3.0
    router[:, 3] = router[:, 2] - 0.5
    router[:, 4] = router[:, 2]
    router[:, 5] = router[:, 2] - 0.2
    assert families._routing_margin(x, router, 2, None, 4, 2, "softmax", "max") == 0
    assert families._routing_margin(x, router, 2, None, 4, 2, "softmax", "top2") > 0


def test_routing_margin_sees_sigmoid_ties():
    """Two experts with the same scores, or two groups with the same
    scores, leave no margin: such draws are redrawn, not checked."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    router = (rng.standard_normal((16, 8)) * 0.25).astype(np.float32)
    bias = np.zeros(8, np.float32)
    assert families._routing_margin(x, router, 2, bias, 4, 2) > 0
    # Experts 0 and 1 (group 0) far ahead and the same: a clear margin.
    tied = router.copy()
    tied[:, 1] = tied[:, 0]
    assert families._routing_margin(x, tied, 2, bias + [5, 5, 0, 0, 0, 0, 0, 0], 4, 2) > 0
    # Groups 1 and 2 the same, behind group 0: which of them is kept ties.
    tied = router.copy()
    tied[:, 4:6] = tied[:, 2:4]
    assert families._routing_margin(x, tied, 2, bias + [5, 5, 0, 0, 0, 0, -5, -5], 4, 2) == 0
    # Expert 2 ties expert 3 for the single place left in the chosen groups.
    tied = router.copy()
    tied[:, 3] = tied[:, 2]
    assert families._routing_margin(x, tied, 2, bias + [5, -1, 0, 0, -5, -5, -5, -5], 4, 2) == 0


@pytest.mark.parametrize("name, dtype", [("op_gelu_mul", "f32"), ("op_gelu_mul_bf16", "bf16")])
def test_gelu_mul_family_is_the_operator_over_gelus_range(name, dtype):
    """The one `gelu_mul` operator (not a gelu then a mul) on operands of
    `dtype`, and gates that reach both of gelu's saturated ends (|x| > 4)
    and its curve."""
    build, recipe = families.families()[name]
    graph = build()
    assert [op.kind for op in graph.operations] == ["gelu_mul"]
    assert {t.dtype for _, t in graph.argument_tensors()} == {dtype}
    gate = families.make_inputs(etc.compile(graph, target="cpu", workers=2).arguments,
                                {"B": 64}, recipe, np.random.default_rng(3))["x"]
    assert gate.min() < -4 and gate.max() > 4 and np.mean(np.abs(gate) < 2) > 0.3
