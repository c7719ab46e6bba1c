"""MoE layers with packed experts: `g.moe(..., transpose_w=True)` whose
expert stacks (E, N, K) are in the block formats of `etc.packed`.

On the CPU the expert tiles multiply int8 blocks of their rows of
activations with the experts' blocks (`MoeUpPackedCPU`,
`MoeDownPackedCPU`: the packed matmul's dot products). Each result is
checked against a NumPy emulation of that: the reference's routing, each
routed token's x rounded by `etc.packed.quantize_activations` (per 256
values where a tile's experts are all K-quants: `activation_block`)
times the dequantized experts, the hidden row rounded again before the down
projection (within the float sums' rounding, and one hidden value at a
rounding tie rounded the other way: one step of its block; at most 0.54
of that bound measured); and against the widened reference
(`etc.reference.evaluate`, the dequantized experts) within 3% of the
output's largest value (at most 1.7% measured: the activations' rounding,
twice per expert, whose worst case, the errors all of one sign, bounds
nothing useful over 256 + 256 products).

Under the lane simulation of the CUDA kernels (`kernels="cuda"`) the
expert tiles read packed values one at a time, dequantized in registers
as `etc.packed.dequantize` computes them: the widened reference up to
the order of the sums.

Shapes: H = F = 256 (the K-quants' blocks), E = 8 experts of which two
are never chosen (no tokens), 2 per token, tiles of 8 slots: 1 to 33
tokens route ragged counts, 0 to about 12 slots (1 or 2 tiles) per
expert. Three layers cover the nine formats (gate, up, down each its
own); one compile per schedule serves every token count."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc import packed
from etc.reference import evaluate, topk

from moe_routing import routed_inputs

H, F, E, TOP_K, TILE = 256, 256, 8, 2, 8
#: (gate, up, down) formats of each layer: every format once, and MXFP4's
#: experts as llama.cpp's MXFP4_MOE files hold them (all three).
LAYERS = [("q4_k", "q8_0", "q6_k"), ("q5_0", "q5_k", "q4_0"), ("q4_1", "iq4_nl", "q5_1"),
          ("mxfp4", "mxfp4", "mxfp4")]
#: Experts the router never picks (a large negative logit).
UNUSED = (2, 6)


def _graph() -> etc.Graph:
    g = etc.Graph("packed_moe")
    T = g.symbol("T")
    x = g.input("x", (T, H), "f32")
    router = g.input("router", (H, E), "f32")
    outs = []
    for i, (gate, up, down) in enumerate(LAYERS):
        outs.append(g.moe(x, router, g.input(f"gate{i}", (E, F, H), gate),
                          g.input(f"down{i}", (E, H, F), down), TOP_K,
                          w_up=g.input(f"up{i}", (E, F, H), up), transpose_w=True, tile=TILE,
                          name=f"y{i}"))
    g.output(*outs)
    return g


def _experts() -> dict:
    rng = np.random.default_rng(7)
    out = {}
    for i, formats in enumerate(LAYERS):
        for role, fmt, shape in zip(("gate", "up", "down"), formats,
                                    ((E, F, H), (E, F, H), (E, H, F))):
            values = rng.standard_normal(shape) / np.sqrt(shape[2])
            out[f"{role}{i}"] = packed.quantize(values.astype(np.float32), fmt)
    return out


def _routed_inputs(tokens: int) -> dict:
    """x and a router that never picks the UNUSED experts (`routed_inputs`)."""
    return routed_inputs(tokens, H, E, TOP_K, UNUSED)


def _silu(v):
    return v / (1 + np.exp(-v))


def _emulated(x, router, gate, up, down, formats):
    """What the CPU kernels compute (float64): per token the sum over its
    choices of weight (w2 @ q(silu(w1 @ q(x)) * (w_up @ q(x)))), q =
    `quantize_activations`; and a bound of the kernels' difference from
    it: the sums' float32 rounding (1e-5 of sum weight |w2| @ |q(hidden)|)
    plus, per choice, a hidden value at a rounding tie rounded the other
    way (weight max_f |w2[:, f]| d(f), d(f) the step of its block)."""
    logits = x @ router
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    chosen_p, chosen = topk(p, TOP_K)
    weights = chosen_p / chosen_p.sum(-1, keepdims=True)
    up_block, down_block = (packed.activation_block(formats[:2]),
                            packed.activation_block(formats[2:]))
    xq = packed.quantize_activations(x, up_block).astype(np.float64)
    y, bound = np.zeros(x.shape), np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            e, weight = chosen[t, j], weights[t, j]
            hidden = (_silu(gate[e] @ xq[t]) * (up[e] @ xq[t])).astype(np.float32)
            hq = packed.quantize_activations(hidden, down_block).astype(np.float64)
            y[t] += weight * (down[e] @ hq)
            bound[t] += weight * (1e-5 * np.abs(down[e]) @ np.abs(hq) +
                                  (np.abs(down[e]) * _steps(hidden, down_block)).max(-1))
    return y, bound


def _steps(v, block):
    """Each value's rounding step by `quantize_activations` with `block`:
    its block's max |v| / 127."""
    return np.repeat(np.abs(v.reshape(*v.shape[:-1], -1, block)).max(-1) / 127, block, axis=-1)


@pytest.fixture(scope="module")
def experts():
    raw = _experts()
    widened = {name: packed.dequantize(value, LAYERS[int(name[-1])][
        ("gate", "up", "down").index(name[:-1])]).astype(np.float64)
        for name, value in raw.items()}
    return raw, widened


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_cpu_kernels_against_their_emulation_and_the_widened_reference(experts, schedule):
    raw, widened = experts
    g = _graph()
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert set(re.findall(r"_tile_(moe_\w+?)_\d+\(", kernel.ir("graph"))) >= \
        {"moe_up_packed_cpu", "moe_down_packed_cpu"}
    run = kernel.partial(**raw)
    for tokens in range(1, 34):
        ins = _routed_inputs(tokens)
        got = run.run(**ins)
        want = evaluate(g, **ins, **raw)
        for i, (out, ref) in enumerate(zip(got, want)):
            emulated, bound = _emulated(ins["x"], ins["router"], widened[f"gate{i}"],
                                        widened[f"up{i}"], widened[f"down{i}"], LAYERS[i])
            assert np.all(np.abs(out - emulated) <= bound), (tokens, LAYERS[i])
            assert np.abs(out - ref).max() <= 0.03 * np.abs(ref).max(), (tokens, LAYERS[i])


def test_simulated_gpu_kernels_read_packed_values_as_dequantized(experts):
    raw, _ = experts
    g = _graph()
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert set(re.findall(r"_tile_(moe_\w+?)_\d+\(", kernel.ir("graph"))) == \
        {"moe_router", "moe_route", "moe_up", "moe_down", "moe_combine"}
    run = kernel.partial(**raw)
    for tokens in (1, 2, 7, 16, 33):
        ins = _routed_inputs(tokens)
        for out, ref in zip(run.run(**ins), evaluate(g, **ins, **raw)):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_ungated_packed_experts_beside_transposed_float_ones():
    """Ungated experts (silu(x @ w1) @ w2): w1 packed (the CPU's int8 up
    tile) with a float w2 (the vector down tile, reading it transposed);
    and all-float experts given transposed (the vector tiles): the
    reference's values."""
    g = etc.Graph("mixed")
    T = g.symbol("T")
    x = g.input("x", (T, H), "f32")
    router = g.input("router", (H, E), "f32")
    mixed = g.moe(x, router, g.input("w1", (E, F, H), "q8_0"), g.input("w2", (E, H, F), "f32"),
                  TOP_K, transpose_w=True, tile=TILE, name="mixed")
    floats = g.moe(x, router, g.input("v1", (E, F, H), "f32"), g.input("v2", (E, H, F), "f32"),
                   TOP_K, w_up=g.input("vu", (E, F, H), "f32"), transpose_w=True, tile=TILE,
                   name="floats")
    g.output(mixed, floats)
    kernel = etc.compile(g, target="cpu", workers=2)
    assert set(re.findall(r"_tile_(moe_\w+?)_\d+\(", kernel.ir("graph"))) == \
        {"moe_router", "moe_route", "moe_up_packed_cpu", "moe_up_vector_cpu",
         "moe_down_vector_cpu", "moe_combine"}
    rng = np.random.default_rng(3)
    weights = {name: (rng.standard_normal(shape) / np.sqrt(shape[2])).astype(np.float32)
               for name, shape in (("w2", (E, H, F)), ("v1", (E, F, H)), ("v2", (E, H, F)),
                                   ("vu", (E, F, H)))}
    weights["w1"] = packed.quantize(rng.standard_normal((E, F, H)) / 16, "q8_0")
    for tokens in (1, 9, 33):
        ins = _routed_inputs(tokens)
        (got_mixed, got_floats) = kernel.run(**ins, **weights)
        want_mixed, want_floats = evaluate(g, **ins, **weights)
        np.testing.assert_allclose(got_floats, want_floats, rtol=1e-4, atol=1e-5)
        # The mixed layer's x is rounded to int8 blocks for w1.
        assert np.abs(got_mixed - want_mixed).max() <= 0.03 * np.abs(want_mixed).max()


def test_packed_experts_are_checked():
    g = etc.Graph("errors")
    x = g.input("x", (4, H), "f32")
    router = g.input("router", (H, E), "f32")
    w1 = g.input("w1", (E, F, H), "q4_k")
    w2 = g.input("w2", (E, H, F), "q6_k")
    with pytest.raises(ValueError, match=r"moe: operand 'w1' .* is a packed weight, stored by "
                                         r"rows of its input's values: packed experts are read "
                                         r"transposed \(transpose_w=True"):
        g.moe(x, router, w1, w2, TOP_K)
    with pytest.raises(ValueError, match=r"'w2' .* must have shape \(8, 256, 64\) \(\(E, H, F\)"):
        g.moe(x, router, g.input("narrow", (E, 64, H), "q8_0"), w2, TOP_K, transpose_w=True)
    with pytest.raises(ValueError, match="moe: operand 'router_w' .* is a packed weight; only "
                                         "matmul's 'b' .*, embedding's 'table' and moe's experts"):
        g.moe(x, g.input("packed_router", (E, H), "q8_0"), w1, w2, TOP_K, transpose_w=True)
    with pytest.raises(ValueError, match=r"a q4_k weight is 2-D \(N, K\), or 3-D \(E, N, K\) for "
                                         r"stacked experts, with K a static multiple of its "
                                         r"block of 256"):
        g.input("ragged", (E, F, 96), "q4_k")


def _within_guard(ancestors: list) -> bool:
    """Whether one of `ancestors` ((op, region index) pairs, outermost
    first) is the then-region of an `scf.if` on `count >= 2`."""
    for op, region in ancestors:
        if op.name != "scf.if" or region != 0:
            continue
        test = op.operands[0].owner
        if test.name != "arith.cmpi" or str(test.attributes["predicate"]) != "9 : i64":  # uge
            continue
        bound = test.operands[1].owner
        if bound.name == "arith.constant" and str(bound.attributes["value"]) == "2 : index":
            return True
    return False


def _panel_stores(op, cols: int, ancestors: list, found: list) -> None:
    """The stores into (`cols`, K) i8 buffers (the unpacked weights'
    panel) under `op`, each with whether a row-count guard holds it."""
    for index, region in enumerate(op.regions):
        for block in region.blocks:
            for inner in block.operations:
                inner = inner.operation
                if inner.name == "vector.store":
                    shape = inner.operands[1].type
                    if str(shape).startswith(f"memref<{cols}x") and str(shape).endswith("xi8>"):
                        found.append(_within_guard(ancestors + [(op, index)]))
                _panel_stores(inner, cols, ancestors + [(op, index)], found)


@pytest.mark.parametrize("k", [256, 2560])
def test_empty_expert_tiles_unpack_no_panels(k):
    """A K-quant expert tile unpacks its weights into the panels only for
    2 rows or more (one row takes the row dots in registers): an expert
    no token was routed to (most of them at decode: 8 of 32 chosen at B = 1)
    reads none of its weights. At 8fe3154 the panels' unpacking ran for 0
    rows too, reading every expert whole: a Qwen3-30B-A3B-width Q4_K layer
    at B = 1 took 4.8-12.7 ms against 1.3 before 64abf01 (`bench/moe_cpu.py`,
    docs/benchmarks.md). K = 2560 also takes the chunks of `chunked_dots`.
    Built for an AMX + VNNI CPU (the integer-scale tiles), no JIT."""
    from etc.ops.base import Target
    from etc.ops.moe_experts import MoeUpPackedCPU

    g = etc.Graph("empty")
    x = g.input("x", (g.symbol("T"), k), "f32")
    router = g.input("router", (k, E), "f32")
    g.output(g.moe(x, router, g.input("gate", (E, F, k), "q4_k"),
                   g.input("down", (E, k, F), "q6_k"), TOP_K,
                   w_up=g.input("up", (E, F, k), "q4_k"), transpose_w=True, tile=TILE))
    module = g.build(target=Target("cpu", workers=2,
                                   isa="x86-64-v4+avx512bf16+amx-tile+amx-bf16+avx512vnni"))
    tiles = {str(f.attributes["sym_name"]).strip('"'): f for f in module.body.operations}
    assert MoeUpPackedCPU.COLS != TILE  # the activations' panel has TILE rows
    for part in ("up", "down"):
        found = []
        _panel_stores(tiles[f"empty_tile_moe_{part}_packed_cpu_0"].operation,
                      MoeUpPackedCPU.COLS, [], found)
        assert found and all(found), (part, found)
