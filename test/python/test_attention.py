"""Attention over the KV cache (flash-decoding with live chunk tiles) against
NumPy on the CPU target: prefill, decode and mixed ragged steps from one
compile, grouped-query heads, chunk boundaries, both schedules."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc.ops.attention_cpu import AttentionChunkBlocks
from test_llm_ops import _batch

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)


def _graph(heads=4, kv_heads=2, head_dim=8, chunk=4, max_length=24, cache_dtype="f32",
           q_dtype="f32"):
    """One attention layer over state caches: append this step's K and V,
    then attend."""
    g = etc.Graph("att")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, heads * head_dim), q_dtype)
    k = g.input("k", (T, kv_heads * head_dim), q_dtype)
    v = g.input("v", (T, kv_heads * head_dim), q_dtype)
    batch = g.ragged_batch(T, R)
    kc = g.state("kc", (S, L, kv_heads * head_dim), cache_dtype)
    vc = g.state("vc", (S, L, kv_heads * head_dim), cache_dtype)
    kc = g.kv_append(kc, k, batch)
    vc = g.kv_append(vc, v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=head_dim, chunk=chunk,
                         max_length=max_length))
    return g


def _run_steps(kernel, g, steps, slots, rng, width_q, width_kv, cache_shape, storage=np.float32,
               tol=1e-5):
    """Runs the steps (new tokens per request), checking each step's output
    and the caches against the reference."""
    caches = [np.zeros(cache_shape, storage) for _ in range(4)]
    lengths = [0] * len(steps[0])
    for new in steps:
        batch = _batch(lengths, new, slots)
        tokens = sum(new)
        inputs = {"q": rng.standard_normal((tokens, width_q)).astype(np.float32),
                  "k": rng.standard_normal((tokens, width_kv)).astype(np.float32),
                  "v": rng.standard_normal((tokens, width_kv)).astype(np.float32), **batch}
        (got,) = kernel.run(**inputs, kc=caches[0], vc=caches[1])
        (want,) = etc.reference.evaluate(g, **inputs, kc=caches[2], vc=caches[3])
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        np.testing.assert_array_equal(caches[0], caches[2])
        lengths = [a + b for a, b in zip(lengths, new)]
    return lengths


# Request lengths cross chunk boundaries (chunk 4): a prefill of 5, 9 and 1
# tokens, decode steps, then a mixed step where one request brings 7 more.
STEPS = [[5, 9, 1], [1, 1, 1], [1, 1, 1], [2, 1, 7], [1, 1, 1]]


@pytest.mark.parametrize("schedule, workers", [("static", 1), ("static", 3), ("dynamic", 2),
                                               ("dynamic", 5), ("auto", 3)])
def test_ragged_steps_match_numpy(schedule, workers):
    g = _graph()
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    rng = np.random.default_rng(workers)
    lengths = _run_steps(kernel, g, STEPS, [2, 0, 1], rng, 32, 16, (3, 24, 16))
    assert lengths == [10, 13, 11]


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 1), (6, 2)])
def test_grouped_query_heads(heads, kv_heads):
    g = _graph(heads=heads, kv_heads=kv_heads, head_dim=16, chunk=8, max_length=40)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=3)
    rng = np.random.default_rng(heads * 10 + kv_heads)
    _run_steps(kernel, g, [[17, 3], [1, 1], [8, 1]], [1, 0], rng, heads * 16, kv_heads * 16,
               (2, 40, kv_heads * 16))


@pytest.mark.parametrize("q_dtype, decode_dpbf16", [("bf16", None), ("bf16", True),
                                                   ("bf16", False), ("f32", None)])
def test_key_blocks_of_a_contiguous_cache(q_dtype, decode_dpbf16, monkeypatch):
    """Chunks of whole key blocks (chunk 32) in a contiguous bf16 cache, at
    head_dim 64: the CPU tile's blocks without clamps, the next block
    prefetched, then a clamped last block; bf16 queries take `vdpbf16ps`
    where the CPU has it, decode there on `vdpbf16ps` or on FMAs as
    `decode_dpbf16` says (None: as the CPU's default)."""
    monkeypatch.setattr(AttentionChunkBlocks, "DECODE_DPBF16", decode_dpbf16)
    g = _graph(heads=6, kv_heads=2, head_dim=64, chunk=32, max_length=80, cache_dtype="bf16",
               q_dtype=q_dtype)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    rng = np.random.default_rng(3)
    _run_steps(kernel, g, [[37, 70], [1, 1], [2, 1]], [1, 0], rng, 6 * 64, 2 * 64,
               (2, 80, 2 * 64), np.uint16, tol=1e-2)


def test_requests_as_long_as_the_grid():
    # Every chunk tile of the grid is live for a request of max_length.
    g = _graph(chunk=4, max_length=12)
    kernel = etc.compile(g, target="cpu", schedule="static", workers=2)
    rng = np.random.default_rng(7)
    lengths = _run_steps(kernel, g, [[11, 4], [1, 1]], [0, 1], rng, 32, 16, (2, 12, 16))
    assert lengths[0] == 12


def test_f16_cache_and_bf16_activations():
    g = _graph(cache_dtype="f16", q_dtype="bf16")
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=3)
    rng = np.random.default_rng(11)
    _run_steps(kernel, g, STEPS[:3], [0, 1, 2], rng, 32, 16, (3, 24, 16), np.float16, tol=2e-2)


def test_attention_lowers_to_live_chunk_tiles_and_a_data_dependent_event():
    g = _graph(heads=8, kv_heads=8, chunk=4, max_length=24)
    text = etc.compile(g, target="cpu", schedule="dynamic", workers=1).ir("event")
    # The chunk grid follows the cache length: ceil(L / 4) chunks, each
    # split on the CPU into one tile per 4 KV heads (2 of 8, each for their
    # 4 query heads), so that a decode step's attention is not one tile per
    # request.
    chunk = re.search(r'%(\S+) = affine\.apply #(\S+)\(\)\[%arg3\]\n\s*'
                      r'%(\S+) = event\.alloc\((%\S+)\) : !event\.tensor<\?>\n\s*'
                      r'event\.task "attention_0_chunk" grid\(\4, %\1\)[^\n]*', text)
    assert chunk, text
    assert f"#{chunk.group(2)} = affine_map<()[s0] -> ((s0 ceildiv 4) * 2)>" in text
    chunk = re.search(r'%(\S+) = event\.alloc\((%\S+)\) : !event\.tensor<\?>\n\s*'
                      r'event\.task "attention_0_chunk"[^\n]*', text)
    line = chunk.group(0)
    # No `count`: one notify per live chunk tile of the request.
    assert f"notifies(%{chunk.group(1)} : !event.tensor<?> (d0, d1) -> (d0))" in line
    assert "live(d1 below (d0) -> ((d0 ceildiv 4) * 2) of (d0, d1) -> (d0) indirect [0])" \
        in line
    combine = re.search(r'event\.task "attention_0_combine"[^\n]*', text).group(0)
    assert f"waits(%{chunk.group(1)} : !event.tensor<?> (d0) -> (d0) indirect [0])" in combine
    # `auto` picks the dynamic schedule for it.
    auto = etc.compile(g, target="cpu", schedule="auto", workers=1).ir("scheduled")
    assert 'event.schedule = "dynamic"' in auto


def test_attention_errors():
    g = etc.Graph("bad")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, 24), "f32")
    batch = g.ragged_batch(T, R)
    kc = g.state("kc", (S, L, 16))
    vc = g.state("vc", (S, L, 16))
    q32 = g.input("q32", (T, 32), "f32")
    with pytest.raises(ValueError, match=r"attention: 'max_length' must be a positive int"):
        g.attention(q32, kc, vc, batch, head_dim=8, max_length=0)
    with pytest.raises(ValueError, match=r"attention: 3 query heads cannot be grouped over 2 KV"):
        g.attention(q, kc, vc, batch, head_dim=8, max_length=16)
    with pytest.raises(ValueError, match=r"attention: the last dimension of 'q' \(24\) must be a "
                                         r"static multiple of head_dim = 16"):
        g.attention(q, kc, vc, batch, head_dim=16, max_length=16)
    vh = g.state("vh", (S, L, 16), "f16")
    with pytest.raises(ValueError, match=r"'kc'.* and .*'vh'.* must have the same shape and dtype"):
        g.attention(q32, kc, vh, batch, head_dim=8, max_length=16)


@pytest.mark.parametrize("schedule, sinks", [("static", False), ("dynamic", False),
                                             ("dynamic", True)])
def test_layers_share_one_scratch(schedule, sinks):
    """Two attention layers over their own caches share one scratch buffer:
    the second layer's chunk tiles wait until the first layer's combine
    tiles are done with it (an explicit event), and the layers keep sharing
    their tile functions (with `sinks`, each layer's own, too)."""
    g = etc.Graph("two_layers")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    x = g.input("x", (T, 16), "f32")
    batch = g.ragged_batch(T, R)
    out, previous = x, None
    for layer in range(2):
        kc = g.kv_append(g.state(f"kc{layer}", (S, L, 16)), out, batch)
        vc = g.kv_append(g.state(f"vc{layer}", (S, L, 16)), out, batch)
        attended = g.attention(out, kc, vc, batch, head_dim=8, chunk=4, max_length=16,
                               scratch_from=previous,
                               sinks=g.input(f"s{layer}", (2,), "f32") if sinks else None)
        previous = attended
        out = g.add(attended, out)
    g.output(out)
    assert sum(a.name.endswith("_partial") for a in g.arguments) == 1
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=4)
    text = kernel.ir("event")
    released = re.search(r'(%\S+) = event\.alloc\(\) count\(\S+\) : !event\.tensor<>\n\s*'
                         r'event\.task "attention_0_combine"', text)
    assert released, text
    chunk1 = re.search(r'event\.task "attention_1_chunk"[^\n]*', text).group(0)
    assert f"{released.group(1)} : !event.tensor<> (d0, d1) -> ()" in chunk1.split("notifies")[0]
    assert len(re.findall(r"func\.func private @two_layers_tile_attention_chunk", text)) == 1
    assert len(re.findall(r"func\.func private @two_layers_tile_attention_combine", text)) == 1
    rng = np.random.default_rng(5)
    logits = {"s0": np.array([1.5, -2.0], np.float32),
              "s1": np.array([0.5, 3.0], np.float32)} if sinks else {}
    caches = {f"{k}{l}": np.zeros((2, 16, 16), np.float32) for k in ("kc", "vc") for l in (0, 1)}
    mirror = {k: v.copy() for k, v in caches.items()}
    lengths = [0, 0]
    for new in ([7, 3], [1, 1], [4, 1]):
        b = _batch(lengths, new, [1, 0])
        xs = rng.standard_normal((sum(new), 16)).astype(np.float32)
        (got,) = kernel.run(x=xs, **b, **logits, **caches)
        (want,) = etc.reference.evaluate(g, x=xs, **b, **logits, **mirror)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        lengths = [a + n for a, n in zip(lengths, new)]


def test_the_key_at_a_time_kernel_where_a_row_is_no_whole_number_of_lanes():
    """A head_dim of 6 f32 (no whole number of 16-byte lane slices): the
    GPU kernels fall back to a lane per (token, query head) walking the keys
    one at a time (`AttentionChunk`), simulated here; it matches NumPy."""
    g = _graph(heads=4, kv_heads=2, head_dim=6, chunk=4, max_length=24)
    kernel = etc.compile(g, target="cpu", kernels="cuda", schedule="dynamic", workers=2)
    text = kernel.ir("graph")
    assert "attention_chunk_0" in text and "attention_chunk_warps" not in text
    rng = np.random.default_rng(6)
    _run_steps(kernel, g, STEPS[:4], [2, 0, 1], rng, 24, 12, (3, 24, 12))


@pytest.mark.parametrize("head_dim, cache_dtype, heads, kv_heads", [
    (16, "f32", 4, 2),     # 4 lanes per cache row, 8 keys per warp at once
    (16, "bf16", 6, 2),    # 2 lanes per row, 16 keys at once, 3 heads per KV head
    (64, "bf16", 4, 1),    # 8 lanes per row (Llama-3.2-1B's head_dim)
    (128, "f32", 2, 2)])   # a whole warp per row, one key at a time
def test_gpu_attention_kernels_with_simulated_lanes(head_dim, cache_dtype, heads, kv_heads):
    """The CUDA kernels (a warp per (token, KV head) with lanes along
    head_dim, the lane-per-column combine, the 16-byte kv_append) run on
    the CPU with their lanes simulated: ragged prefill, decode and mixed
    steps across chunk boundaries match NumPy, and so do the caches."""
    g = _graph(heads=heads, kv_heads=kv_heads, head_dim=head_dim, chunk=4, max_length=24,
               cache_dtype=cache_dtype, q_dtype="bf16" if cache_dtype == "bf16" else "f32")
    kernel = etc.compile(g, target="cpu", kernels="cuda", schedule="dynamic", workers=2)
    text = kernel.ir("graph")
    for name in ("attention_chunk_warps", "attention_combine_lanes", "kv_append_vector"):
        assert name in text, name
    rng = np.random.default_rng(head_dim + heads)
    storage = np.uint16 if cache_dtype == "bf16" else np.float32
    _run_steps(kernel, g, STEPS[:4], [2, 0, 1], rng, heads * head_dim, kv_heads * head_dim,
               (3, 24, kv_heads * head_dim), storage,
               tol=2e-2 if cache_dtype == "bf16" else 1e-5)
