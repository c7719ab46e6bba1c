"""Paged KV caches at the operator level: `kv_append` and `attention`
through block tables (a pool of blocks of P positions, block tables as an
i32 input of the step) against the contiguous cache and NumPy, on the CPU
tile kernels and the GPU ones with simulated lanes, both schedules, with
shuffled blocks and tables whose width changes from step to step."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import reference_llm
from etc.ops.attention_cpu import AttentionChunkBlocks
from test_llm_ops import _batch

HEADS, KV_HEADS, D = 4, 2, 8
W = KV_HEADS * D
P = 4          # positions per block
CHUNK = 8      # two blocks per attention chunk
MAX_LENGTH = 24


def ragged_cache(g, T, R, paged: bool, width: int, block: int = P) -> tuple:
    """(the ragged batch, a K/V cache shape of rows `width` wide): paged,
    blocks of `block` positions (N, block, width) and a block table of M per
    request; or a slot per request (S, L, width)."""
    if paged:
        N, M = g.symbol("N"), g.symbol("M")
        return g.ragged_batch(T, R, blocks_per_request=M), (N, block, width)
    S, L = g.symbol("S"), g.symbol("L")
    return g.ragged_batch(T, R), (S, L, width)


def _graph(paged: bool):
    g = etc.Graph("paged" if paged else "slots")
    T, R = g.symbol("T"), g.symbol("R")
    q = g.input("q", (T, HEADS * D), "f32")
    k = g.input("k", (T, W), "f32")
    v = g.input("v", (T, W), "f32")
    batch, shape = ragged_cache(g, T, R, paged, W)
    kc = g.kv_append(g.state("kc", shape, "f32"), k, batch)
    vc = g.kv_append(g.state("vc", shape, "f32"), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=D, chunk=CHUNK, max_length=MAX_LENGTH))
    return g


@pytest.fixture(scope="module")
def graphs():
    return {paged: _graph(paged) for paged in (False, True)}


# A prefill of 5, 9 and 1 tokens, decode steps, then a mixed step where one
# request brings 7 more: lengths cross blocks and chunks.
STEPS = [[5, 9, 1], [1, 1, 1], [1, 1, 1], [2, 1, 7], [1, 1, 1]]


def _tables(lengths, blocks, pad_to=None):
    """Each request's first ceil(length / P) blocks of its list, as an
    (R, M) table (M the longest, or `pad_to`), padded with block 0."""
    need = [-(-n // P) for n in lengths]
    width = pad_to or max(need)
    table = np.zeros((len(lengths), width), np.int32)
    for r, n in enumerate(need):
        table[r, :n] = blocks[r][:n]
    return table


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_shuffled_pages_match_contiguous_and_numpy(graphs, schedule, kernels):
    """Every step's output of the paged kernel equals the contiguous
    kernel's (the same tiles add the same keys in the same order) and
    NumPy's, with each request's blocks scattered over the pool."""
    kernel = {paged: etc.compile(graphs[paged], target="cpu", schedule=schedule, workers=3,
                                 kernels=kernels) for paged in (False, True)}
    rng = np.random.default_rng(1)
    slots = [2, 0, 1]
    pool = 3 * MAX_LENGTH // P + 2
    order = rng.permutation(pool)
    blocks = [order[r * MAX_LENGTH // P:(r + 1) * MAX_LENGTH // P] for r in range(3)]
    contiguous = [np.zeros((3, MAX_LENGTH, W), np.float32) for _ in range(2)]
    paged = [np.zeros((pool, P, W), np.float32) for _ in range(2)]
    mirror = [np.zeros((pool, P, W), np.float32) for _ in range(2)]
    lengths = [0, 0, 0]
    for step, new in enumerate(STEPS):
        batch = _batch(lengths, new, slots)
        after = [a + b for a, b in zip(lengths, new)]
        # Some steps pass a wider table than needed: M is data too.
        table = _tables(after, blocks, pad_to=6 if step % 2 else None)
        tokens = sum(new)
        data = {"q": rng.standard_normal((tokens, HEADS * D)).astype(np.float32),
                "k": rng.standard_normal((tokens, W)).astype(np.float32),
                "v": rng.standard_normal((tokens, W)).astype(np.float32)}
        (want,) = kernel[False].run(**data, **batch, kc=contiguous[0], vc=contiguous[1])
        del batch["request_slot"]
        (got,) = kernel[True].run(**data, **batch, block_table=table, kc=paged[0], vc=paged[1])
        (ref,) = etc.reference.evaluate(graphs[True], **data, **batch, block_table=table,
                                        kc=mirror[0], vc=mirror[1])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
        np.testing.assert_array_equal(paged[0], mirror[0])
        lengths = after
    # The pages hold what the slots hold, row for row.
    for r, slot in enumerate(slots):
        for cache, pages in zip(contiguous, paged):
            np.testing.assert_array_equal(
                reference_llm.paged_rows(pages, blocks[r], lengths[r]),
                cache[slot, :lengths[r]])


@pytest.mark.parametrize("q_dtype, decode_dpbf16", [("bf16", None), ("bf16", True),
                                                   ("bf16", False), ("f32", None)])
def test_key_blocks_of_whole_pages_match_numpy(q_dtype, decode_dpbf16, monkeypatch):
    """The CPU tile's path for chunks and pages of whole key blocks (P = 16,
    chunk 32: one table entry and a prefetch per block of 16 keys) on
    head_dim 64 and a bf16 cache: bf16 queries take `vdpbf16ps` where the
    CPU has it (decode as `decode_dpbf16` says: None, the CPU's default),
    f32 queries FMAs on the widened keys. Lengths end inside blocks and
    chunks, and the blocks are shuffled over the pool."""
    monkeypatch.setattr(AttentionChunkBlocks, "DECODE_DPBF16", decode_dpbf16)
    heads, kv_heads, d, block, chunk, max_length = 6, 2, 64, 16, 32, 96
    width = kv_heads * d
    g = etc.Graph("pages16")
    T, R = g.symbol("T"), g.symbol("R")
    q = g.input("q", (T, heads * d), q_dtype)
    k = g.input("k", (T, width), q_dtype)
    v = g.input("v", (T, width), q_dtype)
    batch, shape = ragged_cache(g, T, R, True, width, block)
    kc = g.kv_append(g.state("kc", shape, "bf16"), k, batch)
    vc = g.kv_append(g.state("vc", shape, "bf16"), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=d, chunk=chunk, max_length=max_length))
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    rng = np.random.default_rng(5)
    pool = 2 * max_length // block + 1
    order = rng.permutation(pool)
    blocks = [order[r * max_length // block:(r + 1) * max_length // block] for r in range(2)]
    caches = [np.zeros((pool, block, width), np.uint16) for _ in range(4)]
    lengths = [0, 0]
    for new in ([37, 70], [1, 1], [2, 1], [1, 1]):
        batch = _batch(lengths, new, [0, 1])
        del batch["request_slot"]
        lengths = [a + b for a, b in zip(lengths, new)]
        need = [-(-n // block) for n in lengths]
        table = np.zeros((2, max(need)), np.int32)
        for r, n in enumerate(need):
            table[r, :n] = blocks[r][:n]
        tokens = sum(new)
        data = {name: rng.standard_normal((tokens, cols)).astype(np.float32)
                for name, cols in (("q", heads * d), ("k", width), ("v", width))}
        (got,) = kernel.run(**data, **batch, block_table=table, kc=caches[0], vc=caches[1])
        (want,) = etc.reference.evaluate(g, **data, **batch, block_table=table, kc=caches[2],
                                         vc=caches[3])
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2, err_msg=f"lengths {lengths}")
        np.testing.assert_array_equal(caches[0], caches[2])
