"""Sliding-window attention (`g.attention(..., window=W)`) at the operator
level: a windowed layer and a full one sharing the scratch, as Gemma
interleaves them, against NumPy on ragged prefill, decode and mixed steps
whose windows start inside, at and across chunk boundaries, contiguous and
paged (shuffled blocks), both schedules, the CPU tile kernels and the GPU
ones with simulated lanes; the chunk tiles that run (from the trace) cover
the window, not the sequence; one compile for every length."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from test_llm_ops import _batch
from test_paged_attention import ragged_cache

HEADS, KV_HEADS, D = 4, 2, 8
WIDTH = KV_HEADS * D
CHUNK, P, MAX_LENGTH = 4, 4, 40


def _graph(window: int, paged: bool = False, heads: int = HEADS, kv_heads: int = KV_HEADS,
           head_dim: int = D, dtype: str = "f32"):
    """A windowed attention layer, then a full one over caches of their
    own, sharing one scratch; their outputs are added."""
    g = etc.Graph("window")
    T, R = g.symbol("T"), g.symbol("R")
    width = kv_heads * head_dim
    q = g.input("q", (T, heads * head_dim), dtype)
    k = g.input("k", (T, width), dtype)
    v = g.input("v", (T, width), dtype)
    batch, shape = ragged_cache(g, T, R, paged, width, P)
    outs, previous = [], None
    for layer, w in enumerate((window, None)):
        kc = g.kv_append(g.state(f"kc{layer}", shape, dtype), k, batch)
        vc = g.kv_append(g.state(f"vc{layer}", shape, dtype), v, batch)
        previous = g.attention(q, kc, vc, batch, head_dim=head_dim, chunk=CHUNK,
                               max_length=MAX_LENGTH, window=w, scratch_from=previous)
        outs.append(previous)
    g.output(g.add(outs[0], outs[1]))
    return g


# Prefills of 7, 13 and 1 tokens, decode steps, a mixed step where one
# request brings 9 more (its first token's window starts mid-chunk), and
# more decoding: lengths up to 18 against windows of 1, 5 and 8.
STEPS = [[7, 13, 1], [1, 1, 1], [2, 1, 9], [1, 1, 1], [1, 1, 1], [3, 1, 1]]


def _paged_tables(lengths, order):
    """Each request's blocks, taken from the shuffled `order`."""
    need = [-(-n // P) for n in lengths]
    table = np.zeros((len(lengths), max(need)), np.int32)
    at = 0
    for r, n in enumerate(need):
        table[r, :n] = order[at:at + n]
        at += n
    return table


def _run(kernel, g, steps, *, paged=False, heads=HEADS, kv_heads=KV_HEADS, head_dim=D,
         storage=np.float32, seed=0, tol=1e-5):
    rng = np.random.default_rng(seed)
    width = kv_heads * head_dim
    requests = len(steps[0])
    if paged:
        blocks = requests * -(-MAX_LENGTH // P)
        shape = (blocks, P, width)
        order = rng.permutation(blocks)
    else:
        shape = (requests, MAX_LENGTH, width)
    caches = [{f"{kind}{layer}": np.zeros(shape, storage) for kind in ("kc", "vc")
               for layer in (0, 1)} for _ in range(2)]
    lengths = [0] * requests
    for new in steps:
        batch = _batch(lengths, new, list(range(requests)))
        ends = [a + b for a, b in zip(lengths, new)]
        if paged:
            del batch["request_slot"]
            batch["block_table"] = _paged_tables([MAX_LENGTH] * requests, order)[:, :-(
                -max(ends) // P)].copy()
        tokens = sum(new)
        data = {name: rng.standard_normal((tokens, cols)).astype(np.float32)
                for name, cols in (("q", heads * head_dim), ("k", width), ("v", width))}
        if storage == np.uint16:
            data = {n: etc.bfloat16.to_bits(a) for n, a in data.items()}
        (got,) = kernel.run(**data, **batch, **caches[0])
        (want,) = etc.reference.evaluate(g, **data, **batch, **caches[1])
        got, want = (etc.bfloat16.from_bits(a).reshape(a.shape) if a.dtype == np.uint16 else a
                     for a in (got, want))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"step {new}")
        lengths = ends
    return lengths


def test_the_reference_windows_the_keys():
    """etc.reference's attention with a window W equals attention over the
    last W keys alone, and differs from full attention past W."""
    from etc.reference_llm import attention

    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 8)).astype(np.float32)
    cache = rng.standard_normal((2, 1, 10, 8)).astype(np.float32)
    args = (np.array([9]), np.array([0]), np.array([0]), 8, 0.3)
    windowed = attention(q, cache[0], cache[1], *args, window=3)
    np.testing.assert_allclose(windowed, attention(q, cache[0][:, 7:], cache[1][:, 7:],
                                                   np.array([2]), *args[1:]), rtol=1e-6)
    assert not np.allclose(windowed, attention(q, cache[0], cache[1], *args))


@pytest.mark.parametrize("window", [1, 5, 8])
@pytest.mark.parametrize("schedule, workers", [("static", 1), ("static", 3), ("dynamic", 2)])
def test_windowed_steps_match_numpy(window, schedule, workers):
    g = _graph(window)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    assert _run(kernel, g, STEPS, seed=window) == [15, 18, 14]


@pytest.mark.parametrize("kernels", ["native", "cuda"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_paged_windows_with_shuffled_blocks(kernels, schedule):
    g = _graph(5, paged=True)
    kernel = etc.compile(g, target="cpu", kernels=kernels, schedule=schedule, workers=2)
    _run(kernel, g, STEPS, paged=True, seed=3)


@pytest.mark.parametrize("head_dim, dtype, heads, kv_heads", [
    (16, "f32", 4, 2), (16, "bf16", 6, 2), (64, "bf16", 4, 1)])
def test_gpu_kernels_with_simulated_lanes(head_dim, dtype, heads, kv_heads):
    g = _graph(6, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    kernel = etc.compile(g, target="cpu", kernels="cuda", schedule="dynamic", workers=2)
    text = kernel.ir("graph")
    assert "attention_chunk_warps" in text and "attention_combine_lanes" in text
    _run(kernel, g, STEPS[:4], heads=heads, kv_heads=kv_heads, head_dim=head_dim,
         storage=np.uint16 if dtype == "bf16" else np.float32, seed=head_dim,
         tol=1e-5 if dtype == "f32" else 3e-2)


def test_the_windowed_chunk_grid_and_its_live_bound():
    """The windowed layer's chunk grid is min(ceil(L / C), ceil((T + W - 1)
    / C)) (times 2 here: the CPU takes up to 4 KV heads a tile, and the
    graph has 8), with the full layer's live bound; its tile functions
    differ from the full layer's (the window is a parameter), which keeps
    its own."""
    text = etc.compile(_graph(5, heads=8, kv_heads=8), target="cpu", schedule="dynamic",
                       workers=1).ir("event")
    task = re.search(r'event\.task "attention_0_chunk" grid\((%\S+), (%\S+)\)[^\n]*', text)
    assert task, text
    assert "live(d1 below (d0) -> ((d0 ceildiv 4) * 2) of (d0, d1) -> (d0) indirect [0])" \
        in task.group(0)
    grid = re.escape(task.group(2))
    product = re.search(grid + r" = arith\.muli (%\S+), %\S+ : index", text)
    smallest = re.search(re.escape(product.group(1)) +
                         r" = arith\.minui (%\S+), (%\S+) : index", text)
    span = re.search(re.escape(smallest.group(1)) + r" = affine\.apply #(\S+)\(", text)
    assert re.search("#" + re.escape(span.group(1)) +
                     r" = affine_map<\(d0\) -> \(\(d0 \+ 4\) ceildiv 4\)>", text), text
    full = re.search(r'event\.task "attention_1_chunk" grid\((%\S+), (%\S+)\)', text)
    assert full.group(2) != task.group(2)
    assert len(re.findall(r"func\.func private @window_tile_attention_chunk", text)) == 2


def _chunk_tiles(kernel, task):
    """(request, chunk) of every chunk tile of `task` the last run ran
    (the CPU takes up to `AttentionChunkBlocks.KV_HEADS` KV heads a tile:
    S tiles (r, j S + s) a chunk)."""
    from types import SimpleNamespace

    from etc.ops.attention_cpu import AttentionChunkBlocks

    splits = AttentionChunkBlocks.splits(SimpleNamespace(params={"kv_heads": KV_HEADS}))
    tiles = [e.tile for e in kernel.trace.events if e.task == task]
    return sorted({(r, js // splits) for r, js in tiles})


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_a_long_request_runs_the_window_s_chunks_only(schedule):
    """From the trace: decoding a request of 30 positions runs ceil(5 / 4)
    = 2 chunk tiles per head in the windowed layer (its window from
    position 25 spans chunks [25, 29) and [29, 33)), and 8 in the full
    one; a prefill of 30 runs min(8, ceil(34 / 4)) = 8 of each; one kernel
    for all lengths."""
    g = _graph(5)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2, trace=True)
    _run(kernel, g, [[30]], seed=1)
    assert _chunk_tiles(kernel, "attention_0_chunk") == [(0, j) for j in range(8)]
    assert _chunk_tiles(kernel, "attention_1_chunk") == [(0, j) for j in range(8)]
    _run(kernel, g, [[30], [1]], seed=2)
    assert _chunk_tiles(kernel, "attention_0_chunk") == [(0, 0), (0, 1)]
    assert _chunk_tiles(kernel, "attention_1_chunk") == [(0, j) for j in range(8)]
    # Two requests decoding (T = 2): ceil(6 / 4) = 2 chunks at most each.
    _run(kernel, g, [[30, 3], [1, 1]], seed=3)
    assert _chunk_tiles(kernel, "attention_0_chunk") == [(0, 0), (0, 1), (1, 0)]


def test_window_errors():
    g = etc.Graph("bad")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, 16), "f32")
    batch = g.ragged_batch(T, R)
    kc = g.state("kc", (S, L, 16))
    vc = g.state("vc", (S, L, 16))
    for window in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match=r"attention: 'window' must be a positive int"):
            g.attention(q, kc, vc, batch, head_dim=8, max_length=16, window=window)
