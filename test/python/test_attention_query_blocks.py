"""The CPU attention tile's prefill path (`AttentionChunkBlocks.
emit_query_blocks`: QUERY_ROWS new tokens against each packed block of
keys, each row masked to its own keys) against NumPy: bf16 queries and
caches at head_dim 64, prompts that are no multiple of the rows or of the
16 keys of a block, a prefill after a cached prefix, paged caches with
shuffled tables, sliding windows, a soft cap, both schedules. Steps of
fewer new tokens than QUERY_ROWS (decode) take the token-at-a-time path of
the same kernel. Where the CPU has AMX the tests above run the tile path
(`query_tiles`); the last ones run it on AMX where there is one and with
its tile instructions emulated (kernels="amx") on any AVX-512 BF16 CPU."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import bfloat16
from etc.ops.attention_cpu import AttentionChunkBlocks
from etc.runtime import isa
from test_llm_ops import _batch

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

D = 64
ROWS = AttentionChunkBlocks.QUERY_ROWS


def _graph(heads, kv_heads, chunk, max_length, paged, window=None, softcap=None, d=D):
    """One attention layer over bf16 caches (paged: blocks of 16 positions)
    appended to this step, heads of `d`."""
    g = etc.Graph("query_blocks")
    T, R = g.symbol("T"), g.symbol("R")
    q = g.input("q", (T, heads * d), "bf16")
    k = g.input("k", (T, kv_heads * d), "bf16")
    v = g.input("v", (T, kv_heads * d), "bf16")
    if paged:
        batch = g.ragged_batch(T, R, blocks_per_request=g.symbol("M"))
        shape = (g.symbol("N"), 16, kv_heads * d)
    else:
        batch = g.ragged_batch(T, R)
        shape = (g.symbol("S"), g.symbol("L"), kv_heads * d)
    kc = g.kv_append(g.state("kc", shape, "bf16"), k, batch)
    vc = g.kv_append(g.state("vc", shape, "bf16"), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=d, chunk=chunk, max_length=max_length,
                         window=window, softcap=softcap))
    return g


def empty_caches(rng, requests: int, width: int, max_length: int, paged: bool, storage):
    """Four zeroed caches (k and v, kernel's and reference's) of `requests`
    sequences of `max_length` rows of `width`: paged, blocks of 16 rows
    shuffled over a pool one block larger than needed, with the block
    tables (else contiguous, tables None)."""
    tables = None
    if paged:
        per = max_length // 16
        pool = requests * per + 1
        order = rng.permutation(pool)
        tables = np.stack([order[r * per:(r + 1) * per] for r in range(requests)]).astype(np.int32)
        shape = (pool, 16, width)
    else:
        shape = (requests, max_length, width)
    return tables, [np.zeros(shape, storage) for _ in range(4)]


def _run(g, kernel, steps, heads, kv_heads, max_length, paged, rng, values=None, d=D):
    """Runs `steps` (new tokens per request) through `kernel` and NumPy's
    reference, on caches of two requests (paged: their blocks shuffled over
    the pool), heads of `d`; returns the kernel's outputs. `values(
    positions)`, if given, makes each token's q, k and v (else random)."""
    width = kv_heads * d
    requests = len(steps[0])
    tables, caches = empty_caches(rng, requests, width, max_length, paged, np.uint16)
    lengths, outputs = [0] * requests, []
    for new in steps:
        batch = _batch(lengths, new, list(range(requests)))
        if paged:
            del batch["request_slot"]
            batch["block_table"] = tables
        tokens = sum(new)
        if values is None:
            q, k, v = (rng.standard_normal((tokens, n)).astype(np.float32)
                       for n in (heads * d, width, width))
        else:
            q, k, v = values(batch["positions"], heads, kv_heads)
        (got,) = kernel.run(q=q, k=k, v=v, kc=caches[0], vc=caches[1], **batch)
        (want,) = etc.reference.evaluate(g, q=q, k=k, v=v, kc=caches[2], vc=caches[3], **batch)
        got, want = (bfloat16.from_bits(x) if x.dtype == np.uint16 else np.asarray(x, np.float32)
                     for x in (got, want))
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
        np.testing.assert_array_equal(caches[0], caches[2])
        outputs.append(got)
        lengths = [a + b for a, b in zip(lengths, new)]
    return outputs


# Prompts of 37 and 70 tokens (neither a multiple of the rows nor of 16),
# then a prefill of 19 and 33 more after them (a cached prefix), decode, a
# step of fewer tokens than the rows and one of exactly as many.
STEPS = [[37, 70], [19, 33], [1, 1], [ROWS - 1, 2], [ROWS, 1]]


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("schedule, workers", [("dynamic", 2), ("static", 3)])
def test_prefill_steps_match_numpy(paged, schedule, workers):
    g = _graph(9, 3, 32, 192, paged)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    _run(g, kernel, STEPS, 9, 3, 192, paged, np.random.default_rng(workers + 10 * paged))


@pytest.mark.parametrize("heads, kv_heads, chunk", [(6, 2, 128), (8, 8, 48), (4, 1, 16)])
def test_grouped_heads_and_chunks(heads, kv_heads, chunk):
    """Groups of 3, 1 and 4 query heads per KV head; chunks of 8 blocks,
    of 3 and of one; the tile's KV heads 2, 4 and 1."""
    g = _graph(heads, kv_heads, chunk, 192, True)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, STEPS, heads, kv_heads, 192, True, np.random.default_rng(heads + chunk))


@pytest.mark.parametrize("d, heads, kv_heads", [(128, 16, 8), (256, 4, 2)])
def test_wider_heads(d, heads, kv_heads):
    """head_dim 128 (Qwen3's: 4 transposes of 16 x 16 pairs a block, 8
    value parts) with 4 KV heads a tile, and 256 (Gemma's)."""
    g = _graph(heads, kv_heads, 32, 96, True, d=d)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, [[21, 50], [19, 11], [1, 1]], heads, kv_heads, 96, True,
         np.random.default_rng(d), d=d)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("window", [5, 24, 40])
def test_sliding_windows(paged, window):
    """Each row's keys start at its own position - W + 1: rows of one block
    of queries start at different keys, inside blocks of 16 (the blocks
    are not aligned to the cache's), chunks start at the window of the
    request's first new token."""
    g = _graph(6, 2, 32, 192, paged, window=window)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, STEPS, 6, 2, 192, paged, np.random.default_rng(window))


def test_soft_cap():
    g = _graph(6, 2, 32, 192, True, softcap=5.0)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    _run(g, kernel, STEPS[:2], 6, 2, 192, True, np.random.default_rng(4))


def _uniform(positions, heads, kv_heads):
    """q = k = 0 (every seen key weighs the same) and each token's values
    its position: a token's output is the mean of the positions it sees."""
    tokens = len(positions)
    zeros = np.zeros((tokens, heads * D), np.float32)
    v = np.repeat(positions.astype(np.float32)[:, None], kv_heads * D, axis=1)
    return zeros, zeros[:, :kv_heads * D], v


@pytest.mark.parametrize("window", [None, 11])
def test_each_row_sees_its_own_keys_only(window):
    """A token at position p sees keys up to p (with a window, from
    p - W + 1), not those of the later rows of its block of queries: with
    equal weights its output is the mean of exactly those positions, which
    a key too many or too few moves by at least 1 / (2 p + 2)."""
    g = _graph(6, 2, 32, 192, False, window=window)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    steps = [[45, 3], [26, 1]]
    outputs = _run(g, kernel, steps, 6, 2, 192, False, np.random.default_rng(0), _uniform)
    lengths = [0, 0]
    for new, got in zip(steps, outputs):
        positions = _batch(lengths, new, [0, 1])["positions"]
        first = 0 if window is None else np.maximum(positions - window + 1, 0)
        mean = (first + positions) / 2
        np.testing.assert_allclose(got, np.repeat(mean[:, None], 6 * D, axis=1), rtol=4e-3)
        lengths = [a + b for a, b in zip(lengths, new)]


def test_the_prefill_path_is_compiled_where_the_cpu_has_avx512_bf16(monkeypatch):
    """The tests above pass on the token-at-a-time path too: this one fails
    if a CPU with AVX-512 BF16 (where `value_pairs` holds) does not build
    the query-block path, and if any other CPU does."""
    from etc.runtime import isa

    g = _graph(9, 3, 48, 96, paged=True)

    def graph_ir():
        return etc.compile(g, target="cpu", schedule="dynamic", workers=1).ir("graph")

    with_blocks = graph_ir()
    monkeypatch.setattr(AttentionChunkBlocks, "QUERY_ROWS", 1)
    token_at_a_time = graph_ir()
    assert (with_blocks != token_at_a_time) == isa.has(isa.chosen(), "avx512bf16")


AVX512_BF16 = "x86-64-v4+avx512bf16"
AMX = AVX512_BF16 + "+amx-tile+amx-bf16"
needs_avx512bf16 = pytest.mark.skipif(
    not isa.is_x86_64() or not isa.host_supports(AVX512_BF16),
    reason="this x86-64 CPU has no AVX-512 BF16")
needs_amx = pytest.mark.skipif(not isa.is_x86_64() or not isa.host_supports(AMX),
                               reason="this x86-64 CPU has no AMX tile unit")

# Ragged prompts (none a multiple of 16), a cached prefix, decode, and
# steps just below and at the tile path's 16 tokens.
TILE_STEPS = [[37, 70], [19, 33], [1, 1], [15, 2], [16, 1]]


def _tiles_in(kernel) -> int:
    return kernel.ir("graph").count("amx.tile_mulf")


def _tiles_for(d, keys=None) -> int:
    """The tile products in the IR of one attention at head_dim `d`: per
    step of `keys` keys (TILE_KEYS) d / 32 for each 16 keys' scores and
    for each 32 keys' weighted values per 16 columns."""
    keys = AttentionChunkBlocks.TILE_KEYS if keys is None else keys
    return d // 32 * (keys // 16) + 2 * d // 32 * (keys // 32)


@needs_amx
@pytest.mark.parametrize("heads, kv_heads, d, schedule", [
    (16, 8, 128, "dynamic"), (9, 3, 64, "static"), (8, 8, 64, "dynamic"), (8, 2, 64, "static")])
def test_amx_tiles_match_numpy(heads, kv_heads, d, schedule):
    """Qwen3's shape (G = 2, head_dim 128: 4 score and 8 value tiles a
    block), SmolLM2's (G = 3: 16 tokens, 3 tiles of queries a KV head), no
    grouping and G = 4, both schedules."""
    g = _graph(heads, kv_heads, 32, 192, True, d=d)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert _tiles_in(kernel) == _tiles_for(d)
    _run(g, kernel, TILE_STEPS, heads, kv_heads, 192, True,
         np.random.default_rng(heads * d), d=d)


@needs_amx
def test_amx_tiles_at_llvm_O0(monkeypatch):
    """At -O0 (the suite's default level; this file's is -O2) the tiles'
    accumulators live in stack slots (`AMXTiles.in_memory`): LLVM's -O0
    lowering of tiles carried between blocks failed."""
    monkeypatch.setenv(isa.OPT_LEVEL_ENVIRONMENT, "0")
    g = _graph(16, 8, 32, 96, True, d=128)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    assert _tiles_in(kernel) == _tiles_for(128)
    _run(g, kernel, [[21, 40], [1, 1]], 16, 8, 96, True, np.random.default_rng(0), d=128)


@needs_amx
@pytest.mark.parametrize("keys, paged", [(32, False), (32, True), (128, True)])
def test_amx_steps_of_keys(monkeypatch, keys, paged):
    """Steps of 32 keys (one tile of weighted values) and 128 (the chunk's
    keys at once; the last step of a tile mostly masked), keys straight
    from paged blocks or copied from a contiguous cache, Qwen3's shape."""
    monkeypatch.setattr(AttentionChunkBlocks, "TILE_KEYS", keys)
    g = _graph(16, 8, 48, 192, paged, d=128)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    assert _tiles_in(kernel) == _tiles_for(128, keys)
    _run(g, kernel, TILE_STEPS[:3], 16, 8, 192, paged, np.random.default_rng(keys), d=128)


@needs_avx512bf16
@pytest.mark.parametrize("keys", [16, 48, 0, "64"])
def test_steps_of_keys_must_be_a_multiple_of_32(monkeypatch, keys):
    """A step's weighted values are tiles of 32 keys: TILE_KEYS 16 (or any
    other) is refused naming the attribute, not silently replaced."""
    monkeypatch.setenv(isa.ENVIRONMENT, AVX512_BF16)
    monkeypatch.setattr(AttentionChunkBlocks, "TILE_KEYS", keys)
    g = _graph(9, 3, 32, 96, True)
    with pytest.raises(ValueError, match="TILE_KEYS must be a positive multiple of 32"):
        etc.compile(g, target="cpu", schedule="dynamic", workers=2, kernels="amx")


@needs_amx
@pytest.mark.parametrize("window, softcap", [(24, None), (None, 5.0)])
def test_amx_tiles_with_windows_and_soft_caps(window, softcap):
    g = _graph(6, 2, 32, 192, False, window=window, softcap=softcap)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2)
    assert _tiles_in(kernel) == _tiles_for(64)
    _run(g, kernel, TILE_STEPS[:2], 6, 2, 192, False, np.random.default_rng(7))


@needs_avx512bf16
@pytest.mark.parametrize("heads, kv_heads, paged, window", [
    (9, 3, True, None), (4, 1, False, 11)])
def test_amx_tiles_emulated_match_numpy(monkeypatch, heads, kv_heads, paged, window):
    """The tile path's packing, masks and softmax with its tile
    instructions emulated in AVX-512 BF16 (kernels="amx" on an instruction
    set without AMX, as on a CPU without it): G = 3 and 4, a window."""
    monkeypatch.setenv(isa.ENVIRONMENT, AVX512_BF16)
    g = _graph(heads, kv_heads, 32, 96, paged, window=window)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2, kernels="amx")
    monkeypatch.setattr(AttentionChunkBlocks, "AMX", False)
    without = etc.compile(g, target="cpu", schedule="dynamic", workers=2, kernels="amx")
    assert _tiles_in(kernel) == 0 and kernel.ir("graph") != without.ir("graph")
    _run(g, kernel, [[37, 50], [19, 3], [1, 1]], heads, kv_heads, 96, paged,
         np.random.default_rng(heads), _uniform if window else None)


def test_the_tile_path_is_compiled_where_the_cpu_has_amx():
    g = _graph(9, 3, 48, 96, paged=True)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=1)
    assert (_tiles_in(kernel) > 0) == isa.has(isa.chosen(), "amx-bf16")
