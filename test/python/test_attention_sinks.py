"""Attention sinks (`g.attention(..., sinks=)`, gpt-oss): one more logit
sinks[h] per query head, of value zero, in every token's softmax. Every
chunk kernel (CPU: the key-at-a-time blocks, whole aligned blocks, the
prefill's query blocks, the AMX query tiles; GPU under the lane
simulation: the warps, the portable lane per head; the combine on both)
against NumPy, with sinks that dominate, that do nothing and mixed,
windowed and not, paged and not, grouped heads, ragged requests whose keys
span several chunks (so the merge matters); the reference itself against
transformers' form (the sink concatenated to the scores, dropped after the
softmax); a sink counted twice or not at all fails here (`_check`
compares against both); errors, the IR, ptxas."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import etc
from etc import bfloat16
from etc.ops.attention_cpu import AttentionChunkBlocks
from etc.reference_llm import attention as reference_attention
from etc.runtime import isa
from ptxas_check import assemble, assert_no_spills, needs_ptxas
from test_attention_query_blocks import empty_caches
from test_llm_ops import _batch

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)


def _graph(heads=4, kv_heads=2, head_dim=16, chunk=4, max_length=48, dtype="f32",
           paged=False, window=None, softcap=None, sinks=True):
    """One attention layer with `sinks` (an f32 input of H logits) over
    caches appended to this step (paged: blocks of 16 positions)."""
    g = etc.Graph("sinks")
    T, R = g.symbol("T"), g.symbol("R")
    q = g.input("q", (T, heads * head_dim), dtype)
    k = g.input("k", (T, kv_heads * head_dim), dtype)
    v = g.input("v", (T, kv_heads * head_dim), dtype)
    s = g.input("s", (heads,), "f32") if sinks else None
    if paged:
        batch = g.ragged_batch(T, R, blocks_per_request=g.symbol("M"))
        shape = (g.symbol("N"), 16, kv_heads * head_dim)
    else:
        batch = g.ragged_batch(T, R)
        shape = (g.symbol("S"), g.symbol("L"), kv_heads * head_dim)
    kc = g.kv_append(g.state("kc", shape, dtype), k, batch)
    vc = g.kv_append(g.state("vc", shape, dtype), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=head_dim, chunk=chunk,
                         max_length=max_length, window=window, softcap=softcap, sinks=s))
    return g


def _sinks(heads: int, kind: str) -> np.ndarray:
    """Per head: "large" (the sink dominates: the keys keep about 1% of
    the weight), "small" (no effect) or "mixed" (the four kinds, the middle
    ones comparable to the keys' sum, where a sink counted twice or not at
    all moves the output most)."""
    if kind == "large":
        return np.full(heads, 9.0, np.float32)
    if kind == "small":
        return np.full(heads, -60.0, np.float32)
    return np.array([(2.5, -60.0, 9.0, 0.5)[h % 4] for h in range(heads)], np.float32)


def _close(got, want, heads: int, tol: float, label: str = "") -> None:
    """got == want to `tol` relative to each head's largest output (a
    dominating sink makes a head's outputs small, not worth less)."""
    got, want = (np.asarray(x, np.float32).reshape(x.shape[0], heads, -1) for x in (got, want))
    for h in range(heads):
        scale = max(float(np.abs(want[:, h]).max()), 1e-30)
        np.testing.assert_allclose(got[:, h], want[:, h], rtol=tol, atol=tol * scale,
                                   err_msg=f"{label} head {h}")


def _far(got, want, heads: int, tol: float) -> bool:
    """Some head of `got` is off `want` by more than 5 `tol` of its scale."""
    got, want = (np.asarray(x, np.float32).reshape(x.shape[0], heads, -1) for x in (got, want))
    return any(np.abs(got[:, h] - want[:, h]).max() > 5 * tol * np.abs(want[:, h]).max()
               for h in range(heads))


def _run(g, kernel, steps, sinks, heads=4, kv_heads=2, head_dim=16, max_length=48,
         paged=False, bf16=False, seed=0, tol=1e-5, check=None) -> list:
    """Runs `steps` (new tokens per request) through `kernel` and the
    reference, requests in shuffled slots (paged: blocks shuffled over the
    pool); checks each step's output (and the caches); returns [(the
    step's inputs, got)] for `check`."""
    rng = np.random.default_rng(seed)
    width = kv_heads * head_dim
    requests = len(steps[0])
    tables, caches = empty_caches(rng, requests, width, max_length, paged,
                                  np.uint16 if bf16 else np.float32)
    slots = list(rng.permutation(requests))
    lengths, runs = [0] * requests, []
    for step, new in enumerate(steps):
        batch = _batch(lengths, new, slots)
        if paged:
            del batch["request_slot"]
            batch["block_table"] = tables
        tokens = sum(new)
        data = {name: (scale * rng.standard_normal((tokens, n))).astype(np.float32)
                for name, n, scale in (("q", heads * head_dim, 2.0), ("k", width, 1.0),
                                       ("v", width, 1.0))}
        (got,) = kernel.run(**data, s=sinks, kc=caches[0], vc=caches[1], **batch)
        (want,) = etc.reference.evaluate(g, **data, s=sinks, kc=caches[2], vc=caches[3], **batch)
        got, want = (bfloat16.from_bits(x) if x.dtype == np.uint16 else np.asarray(x, np.float32)
                     for x in (got, want))
        _close(got, want, heads, tol, f"step {step}")
        np.testing.assert_array_equal(caches[0], caches[2])
        runs.append((dict(data, **batch), [c.copy() for c in caches[2:]], got))
        lengths = [a + b for a, b in zip(lengths, new)]
    return runs


# Two requests: prompts of 21 and 11 tokens (several chunks of 4 or 16),
# decode, a mixed step of 9 new tokens and one.
STEPS = [[21, 11], [1, 1], [9, 1], [1, 1]]


# ----------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------


def _transformers_form(q, keys, values, heads, head_dim, scale, sinks, window=None):
    """transformers' gpt-oss eager attention for one sequence (keys and
    values (n, H_kv, D), q (n, H D) at positions 0 .. n - 1): the sinks
    concatenated to the masked scores, a softmax, the sink column dropped."""
    n, kv_heads = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    q = q.reshape(n, heads, head_dim)
    k, v = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(scale)
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    hidden = (offsets < 0) | (offsets >= (window or n + 1))
    scores = np.where(hidden, -np.inf, scores)
    both = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (heads, n, 1))], -1)
    both = np.exp(both - both.max(-1, keepdims=True))
    probs = (both / both.sum(-1, keepdims=True))[..., :-1]
    return np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * head_dim)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("kind", ["large", "small", "mixed"])
def test_the_reference_is_transformers_form(kind, window):
    heads, kv_heads, d, n = 4, 2, 8, 13
    rng = np.random.default_rng(1)
    q = 2 * rng.standard_normal((n, heads * d)).astype(np.float32)
    cache = rng.standard_normal((2, 1, n, kv_heads * d)).astype(np.float32)
    sinks = _sinks(heads, kind)
    args = (np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.zeros(1, np.int32), d, 0.25)
    got = reference_attention(q, cache[0], cache[1], *args, window=window, sinks=sinks)
    want = _transformers_form(q, cache[0, 0].reshape(n, kv_heads, d),
                              cache[1, 0].reshape(n, kv_heads, d), heads, d, 0.25, sinks,
                              window)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = reference_attention(q, cache[0], cache[1], *args, window=window)
    if kind == "small":
        np.testing.assert_array_equal(got, plain)
    else:
        assert _far(got, plain, heads, 1e-3)


# ----------------------------------------------------------------------
# CPU kernels
# ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["large", "small", "mixed"])
@pytest.mark.parametrize("window", [None, 6])
def test_cpu_key_rows(kind, window):
    """f32, head_dim 16, chunks of 4 (blocks of keys each key's own row):
    a 21-token prompt spans 6 chunks, a windowed token 2 or 3."""
    g = _graph(window=window)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, STEPS, _sinks(4, kind), seed=len(kind) + (window or 0))


def test_a_sink_counted_twice_or_not_at_all_fails():
    """What the kernel computes is neither attention without the sinks nor
    with each sink counted twice (sinks + ln 2): both are far from it on
    the mixed heads, and the checks above would fail on either."""
    g = _graph()
    kernel = etc.compile(g, target="cpu", schedule="static", workers=2)
    sinks = _sinks(4, "mixed")
    runs = _run(g, kernel, STEPS[:2], sinks)
    for data, (kc, vc), got in runs:
        common = (data["q"], kc, vc, data["positions"], data["token_request"],
                  data["request_slot"], 16, 0.25)
        assert _far(got, reference_attention(*common), 4, 1e-5)
        assert _far(got, reference_attention(*common, sinks=sinks + np.float32(math.log(2))),
                    4, 1e-5)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("window", [None, 20])
def test_cpu_bf16_blocks_query_blocks_and_tiles(paged, window):
    """bf16, head_dim 64, chunks of 32 (whole aligned blocks of 16 keys,
    paged or not; with a window the clamped key rows): the prompts of 37
    and 70 tokens take the prefill's tiles (AMX where the CPU has it), the
    8-token step the query blocks, decode a token at a time."""
    steps = [[37, 70], [1, 1], [8, 1], [1, 1]]
    g = _graph(heads=6, kv_heads=2, head_dim=64, chunk=32, max_length=96, dtype="bf16",
               paged=paged, window=window)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, steps, _sinks(6, "mixed"), heads=6, head_dim=64, max_length=96,
         paged=paged, bf16=True, tol=2e-2, seed=2 + paged)


def test_cpu_query_blocks_without_amx_and_a_soft_cap(monkeypatch):
    """The prefill's `query_block` for every prompt (no AMX tiles), with
    the scores soft-capped (the sink is not), 4 query heads per KV head."""
    monkeypatch.setattr(AttentionChunkBlocks, "AMX", False)
    g = _graph(heads=4, kv_heads=1, head_dim=64, chunk=32, max_length=96, dtype="bf16",
               softcap=3.0)
    kernel = etc.compile(g, target="cpu", schedule="static", workers=2)
    _run(g, kernel, [[37, 19], [1, 1]], _sinks(4, "mixed"), heads=4, kv_heads=1, head_dim=64,
         max_length=96, bf16=True, tol=2e-2, seed=4)


def test_amx_tiles_emulated(monkeypatch):
    """The AMX query tiles with their instructions emulated (kernels="amx"
    on an AVX-512 BF16 CPU), at LLVM -O0 as the suite compiles."""
    monkeypatch.setenv(isa.ENVIRONMENT, "x86-64-v4+avx512bf16")
    monkeypatch.setenv(isa.OPT_LEVEL_ENVIRONMENT, "0")
    g = _graph(heads=4, kv_heads=2, head_dim=64, chunk=32, max_length=96, dtype="bf16")
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2, kernels="amx")
    _run(g, kernel, [[37, 21], [1, 1]], _sinks(4, "mixed"), head_dim=64, max_length=96,
         bf16=True, tol=2e-2, seed=5)


# ----------------------------------------------------------------------
# GPU kernels under the lane simulation, and ptxas
# ----------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, dtype, heads, kv_heads, paged, window", [
    (16, "f32", 4, 2, False, None),   # the warps, 4 lanes per cache row
    (64, "bf16", 4, 1, True, 6),      # 8 lanes per row, 4 query heads per KV head
    (6, "f32", 4, 2, False, 5)])      # no whole lanes per row: a lane per query head and
                                      # its combine (`AttentionCombine`)
def test_gpu_kernels_with_simulated_lanes(head_dim, dtype, heads, kv_heads, paged, window):
    g = _graph(heads=heads, kv_heads=kv_heads, head_dim=head_dim, chunk=16 if paged else 4,
               dtype=dtype, paged=paged, window=window)
    kernel = etc.compile(g, target="cpu", kernels="cuda", schedule="dynamic", workers=2)
    text = kernel.ir("graph")
    assert ("attention_combine_lanes" in text) == ("attention_chunk_warps" in text) == \
        (head_dim != 6)
    _run(g, kernel, STEPS, _sinks(heads, "mixed"), heads=heads, kv_heads=kv_heads,
         head_dim=head_dim, paged=paged, bf16=dtype == "bf16",
         tol=2e-2 if dtype == "bf16" else 1e-5, seed=head_dim)


@pytest.mark.parametrize("lanes", [256, 96])
def test_gpu_kernels_at_other_lane_counts(lanes):
    """Two warpgroups, and 3 warps (test_cuda_sim_lanes): the combine's
    lanes along head_dim each take their own head's sink."""
    g = _graph(heads=6, kv_heads=2, head_dim=16)
    kernel = etc.compile(g, target="cpu", kernels="cuda", lanes=lanes, schedule="dynamic",
                         workers=2)
    assert "attention_combine_lanes" in kernel.ir("graph")
    _run(g, kernel, STEPS, _sinks(6, "mixed"), heads=6, seed=lanes)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_ptx_assembles(chip, tmp_path):
    g = _graph(heads=8, kv_heads=2, head_dim=64, chunk=32, dtype="bf16", paged=True, window=64)
    ptx = etc.compile(g, target="cuda", chip=chip).ptx
    assert_no_spills(assemble(ptx, chip, tmp_path, "sinks"))


# ----------------------------------------------------------------------
# The operand: errors, the IR
# ----------------------------------------------------------------------


def test_sinks_errors():
    g = etc.Graph("bad")
    T, R = g.symbol("T"), g.symbol("R")
    q = g.input("q", (T, 32), "f32")
    batch = g.ragged_batch(T, R)
    kc = g.state("kc", (2, 16, 16), "f32")
    vc = g.state("vc", (2, 16, 16), "f32")
    for sinks, message in (
            (g.input("s_bf16", (4,), "bf16"), r"operand 'sinks' \('s_bf16', shape \(4,\), "
                                              r"bf16\) must be f32 of shape \(4,\): one logit "
                                              r"per query head"),
            (g.input("s_kv", (2,), "f32"),
             r"operand 'sinks' \('s_kv'.*must be f32 of shape \(4,\)"),
            (g.input("s_2d", (4, 1), "f32"),
             r"operand 'sinks' \('s_2d'.*has rank 2; expected a 1-D"),
            (np.zeros(4, np.float32), r"operand 'sinks' must be a Tensor")):
        with pytest.raises(ValueError, match=r"attention: " + message):
            g.attention(q, kc, vc, batch, head_dim=8, max_length=16, sinks=sinks)


def test_the_combine_task_reads_the_sinks(etc_opt):
    """The sinks are an operand of the combine task (which adds them) and
    of no chunk task; the IR round-trips through etc-opt."""
    g = _graph()
    text = g.to_mlir()
    combine = re.search(r'event\.task "attention_0_combine"[^\n]*', text).group(0)
    chunk = re.search(r'event\.task "attention_0_chunk"[^\n]*', text).group(0)
    sinks = re.search(r"(%\S+): memref<4xf32>", text).group(1)
    assert sinks in combine and sinks not in chunk
    once = etc_opt(text)
    assert etc_opt(once) == once


# ----------------------------------------------------------------------
# The model reference (`etc.models.step.reference.forward`, weights
# `l{i}_sinks`)
# ----------------------------------------------------------------------


def test_the_model_reference_takes_each_layers_sinks(tmp_path):
    """Inert sinks leave the logits as they are; dominating ones silence
    the attention (the logits of the model with its output projections
    zeroed); sinks between differ from both."""
    from etc.models.loading.checkpoint import Checkpoint
    from etc.models.step import reference
    from etc.models.testing import tiny_config, write_checkpoint

    checkpoint = Checkpoint(write_checkpoint(tmp_path / "llama", tiny_config("LlamaForCausalLM")))
    c, weights = checkpoint.config, checkpoint.weights()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = reference.forward(c, weights, tokens)

    def with_sinks(value, **changed):
        sinks = {f"l{i}_sinks": np.full(c.num_heads, value, np.float32)
                 for i in range(c.num_layers)}
        return reference.forward(c, {**weights, **sinks, **changed}, tokens)

    np.testing.assert_allclose(with_sinks(-100.0), plain, rtol=1e-6, atol=1e-6)
    silent = reference.forward(c, {**weights, **{f"l{i}_wo": np.zeros_like(weights[f"l{i}_wo"])
                                                 for i in range(c.num_layers)}}, tokens)
    np.testing.assert_allclose(with_sinks(100.0), silent, rtol=1e-5, atol=1e-5)
    between = with_sinks(0.0)
    assert np.abs(between - plain).max() > 1e-3 and np.abs(between - silent).max() > 1e-3
