"""The paged KV cache of `etc.models` against the contiguous one: the same
tokens and logits for every architecture, alone and batched, with chunked
prefill, on both schedules, with block tables whose blocks are shuffled
over the pool; the pool's size options and the step's errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

import etc.models as models
from etc.models.testing import tiny_config, write_checkpoint

PROMPTS = [[5], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
NEW = 5
# Blocks of 4 positions: the longest sequence spans 4 blocks, attention
# chunks of 8 span 2.
LOAD = dict(workers=3, max_seq_len=32, attention_chunk=8)
P = 4

CONFIGS = {
    "llama": tiny_config("LlamaForCausalLM", rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "qwen3": tiny_config("Qwen3ForCausalLM"),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0]),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("paged")
    return {name: write_checkpoint(root / name, config, seed=i)
            for i, (name, config) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def loaded(checkpoints):
    """Each architecture paged and contiguous (schedule auto: dynamic),
    and Qwen3 on the static schedule."""
    out = {}
    for name, path in checkpoints.items():
        out[name, "paged"] = models.load(path, kv_block_size=P, **LOAD)
        out[name, "contiguous"] = models.load(path, kv_block_size=None, **LOAD)
    for layout, block in (("paged", P), ("contiguous", None)):
        out["qwen3_static", layout] = models.load(checkpoints["qwen3"], kv_block_size=block,
                                                  schedule="static", **LOAD)
    return out


def shuffled_cache(model, slots: int, length: int, seed: int):
    """A paged cache of two spare sequences' worth of blocks more than
    needed, whose sequences 0 .. slots - 1 hold blocks in a random order."""
    cache = model.new_cache(slots + 2, length)
    for s in range(slots + 2):
        cache.release(s)
    for manager in cache.managers:  # and the sliding layers' pool
        random.Random(seed).shuffle(manager._free)
    for s in range(slots):
        cache.admit(s, (), length)
    return cache


def decode(model, prompts, new: int, budget: int = 256, cache=None):
    """Greedy decoding with `model.step`, at most `budget` tokens a step
    (decoding first, then prefill chunks), as `generate` schedules: the new
    tokens and their logits per prompt."""
    sequences = [list(p) for p in prompts]
    if cache is None:
        cache = model.new_cache(len(prompts), max(map(len, prompts)) + new)
    cached = [0] * len(prompts)
    tokens = [[] for _ in prompts]
    logits = [[] for _ in prompts]
    while any(len(t) < new for t in tokens):
        active = sorted((r for r in range(len(prompts)) if len(tokens[r]) < new),
                        key=lambda r: len(sequences[r]) - cached[r])
        left, requests = budget, []
        for r in active:
            take = min(len(sequences[r]) - cached[r], max(1, left))
            left -= take
            requests.append(models.Request(r, cached[r], sequences[r][cached[r]:cached[r] + take]))
        step_logits, ids = model.step(cache, requests, return_logits=True)
        for i, request in enumerate(requests):
            r = request.slot
            cached[r] += len(request.tokens)
            if cached[r] == len(sequences[r]):
                tokens[r].append(int(ids[i]))
                sequences[r].append(int(ids[i]))
                logits[r].append(step_logits[i].copy())
    return tokens, [np.stack(rows) for rows in logits]


def same(a, b, tol=1e-6):
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1]):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_moe", "qwen3_static"])
def test_paged_and_contiguous_give_the_same_tokens_and_logits(name, loaded):
    paged, contiguous = loaded[name, "paged"], loaded[name, "contiguous"]
    want = decode(contiguous, PROMPTS, NEW)
    # Batched, with the blocks in order and shuffled over the pool.
    same(decode(paged, PROMPTS, NEW), want)
    same(decode(paged, PROMPTS, NEW, cache=shuffled_cache(paged, 3, 16, seed=1)), want)
    # Chunked prefill: 3 tokens a step, prefill chunks mixed with decoding.
    same(decode(paged, PROMPTS, NEW, budget=3, cache=shuffled_cache(paged, 3, 16, seed=2)),
         decode(contiguous, PROMPTS, NEW, budget=3))
    # Each prompt alone.
    for r, prompt in enumerate(PROMPTS):
        alone = decode(paged, [prompt], NEW, cache=shuffled_cache(paged, 1, 16, seed=3 + r))
        same(alone, ([want[0][r]], [want[1][r]]), tol=1e-5)


def test_paged_generate_is_the_contiguous_one(loaded):
    paged, contiguous = loaded["qwen3_moe", "paged"], loaded["qwen3_moe", "contiguous"]
    a = paged.generate(PROMPTS, NEW, return_logits=True)
    b = contiguous.generate(PROMPTS, NEW, return_logits=True)
    same((a.tokens, a.logits), (b.tokens, b.logits))


def test_the_step_graph_takes_block_tables(loaded):
    graph = loaded["qwen3", "paged"].graph
    names = {t.name: t for t in graph._tensors}
    assert names["block_table"].symbolic_shape == ("R", "M")
    assert names["l0_k_cache"].symbolic_shape == ("N", P, 2 * 16)
    assert "request_slot" not in names
    assert "request_slot" in {t.name for t in loaded["qwen3", "contiguous"].graph._tensors}


def test_pool_size_options(checkpoints, loaded):
    model = loaded["qwen3", "paged"]
    c = model.config
    per_block = 2 * c.num_layers * P * c.num_kv_heads * c.head_dim * 4
    assert model.kv_cache_bytes_per_block == per_block
    # Unsized: the first user's size; grown while empty.
    assert model.kv_cache_blocks is None
    assert model.paged_cache(10).num_blocks == 3
    assert model.paged_cache(20).num_blocks == 5
    pool = model.paged_cache(20)
    pool.manager.admit("x", [1, 2])
    assert model.paged_cache(40) is pool       # in use: kept
    pool.manager.release("x")
    with pytest.raises(ValueError, match="kv_cache_tokens or kv_cache_memory, not both"):
        models.load(checkpoints["qwen3"], kv_cache_tokens=8, kv_cache_memory=10**6, **LOAD)
    with pytest.raises(ValueError, match="kv_cache_tokens sizes the paged KV cache, but "
                                         "kv_block_size=None"):
        models.load(checkpoints["qwen3"], kv_cache_tokens=8, kv_block_size=None, **LOAD)
    with pytest.raises(ValueError, match=r"kv_cache_memory=100 bytes is less than one KV cache "
                                         rf"block \({per_block} bytes"):
        models.load(checkpoints["qwen3"], kv_cache_memory=100, kv_block_size=P, **LOAD)
    with pytest.raises(ValueError, match=r"kv_block_size=0 must be a positive int"):
        models.load(checkpoints["qwen3"], kv_block_size=0, **LOAD)


def test_step_errors(loaded):
    paged, contiguous = loaded["qwen3", "paged"], loaded["qwen3", "contiguous"]
    with pytest.raises(ValueError, match=r"takes a PagedKVCache \(kv_block_size=4\), got "
                                         r"KVCache"):
        paged.step(contiguous.new_cache(1, 4), [models.Request(0, 0, [1])])
    with pytest.raises(ValueError, match=r"takes a KVCache \(kv_block_size=None\), got "
                                         r"PagedKVCache"):
        contiguous.step(paged.new_cache(1, 4), [models.Request(0, 0, [1])])
    cache = contiguous.new_cache(1, 4)
    with pytest.raises(ValueError, match=r"request 0 covers positions \[2, 5\), a sequence "
                                         r"longer than the cache \(4 positions\)"):
        contiguous.step(cache, [models.Request(0, 2, [1, 2, 3])])
    with pytest.raises(ValueError, match=r"request 0 uses slot 1, but the cache has 1 slots"):
        contiguous.step(cache, [models.Request(1, 0, [1])])
    cache = paged.new_cache(2, 8)
    with pytest.raises(ValueError, match=r"slot 1 is used by two requests"):
        paged.step(cache, [models.Request(1, 0, [1]), models.Request(1, 1, [1])])


def _per_token_step_data(requests: list) -> dict:
    """The ragged batch's index arrays of `requests`, built token by token:
    what `CompiledModel._step_data` must build, however it does."""
    out = {name: [] for name in ("ids", "positions", "token_request", "request_length",
                                 "request_first", "request_last", "sample_rows",
                                 "sample_position")}
    for r, request in enumerate(requests):
        first = len(out["ids"])
        for i, token in enumerate(request.tokens):
            out["ids"].append(int(token))
            out["positions"].append(request.start + i)
            out["token_request"].append(r)
        end = request.start + len(request.tokens)
        out["request_length"].append(end)
        out["request_first"].append(first)
        out["request_last"].append(len(out["ids"]) - 1)
        for c in range(request.choices):  # after each of its last `choices` tokens
            out["sample_rows"].append(len(out["ids"]) - request.choices + c)
            out["sample_position"].append(end - request.choices + c + 1)
    return {name: np.array(values, np.int32) for name, values in out.items()}


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_step_data_is_the_per_token_build(loaded, layout):
    """Ragged batches of every shape (one token or many, choices 1 to all
    of a request's tokens, ids as lists, tuples and NumPy arrays, slots in
    any order): the step's index arrays are the per-token ones, and each
    choice's sampling parameters are its request's (a guard for faster
    builds of them: a NumPy one was tried, see _step_data)."""
    model = loaded["qwen3", layout]
    rng = random.Random(5)
    greedy, sampled = None, models.SamplingParams(0.5, top_k=3, seed=11)
    for trial in range(40):
        cache = model.new_cache(6, 32)
        count = rng.randint(1, 6)
        requests = []
        for slot in rng.sample(range(6), count):
            size = rng.choice([1, 1, rng.randint(2, 9)])
            tokens = [rng.randrange(model.config.vocab_size) for _ in range(size)]
            tokens = rng.choice([tokens, tuple(tokens), np.array(tokens, np.int64),
                                 [np.int32(t) for t in tokens]])
            requests.append(models.Request(slot, rng.randint(0, 32 - size), tokens,
                                           sampling=rng.choice([greedy, sampled]),
                                           choices=rng.randint(1, size)))
        data = model._step_data(cache, requests)
        for name, want in _per_token_step_data(requests).items():
            assert data[name].dtype == np.int32, name
            np.testing.assert_array_equal(data[name], want, err_msg=f"{name}, trial {trial}")
        per_row = [q.sampling is sampled for q in requests for _ in range(q.choices)]
        np.testing.assert_array_equal(data["temperature"], np.where(per_row, 0.5, 0.0))
        np.testing.assert_array_equal(data["top_k"], np.where(per_row, 3, 0))


def test_step_request_errors(loaded):
    """Each bad request is named (and its token, for an id), also beside
    good ones."""
    paged, contiguous = loaded["qwen3", "paged"], loaded["qwen3", "contiguous"]
    vocab = paged.config.vocab_size
    for model in (paged, contiguous):
        cache = model.new_cache(2, 8)
        cases = [
            ([models.Request(0, 0, [1]), models.Request(1, 0, [])], r"request 1 brings no tokens"),
            ([models.Request(0, 0, [1, vocab])],
             rf"request 0, token 1: id {vocab} is outside the vocabulary \[0, {vocab}\)"),
            ([models.Request(0, 0, [1]), models.Request(1, 0, [-1])],
             r"request 1, token 0: id -1 is outside"),
            ([models.Request(0, 0, [True])], r"request 0, token 0: id True is outside"),
            ([models.Request(0, 0, [1.0])], r"request 0, token 0: id 1.0 is outside"),
            ([models.Request(0, 0, np.array([1.5]))], r"request 0, token 0: id .*1.5.* is outside"),
            ([models.Request(0, 0, [1 << 70])], r"request 0, token 0: id 1180591620717411303424 "),
            ([models.Request(0, -1, [1])], r"request 0 covers positions \[-1, 0\)"),
            ([models.Request(0, 0, [1, 2], choices=3)],
             r"request 0: choices=3 must be an int in \[1, 2\]"),
            ([models.Request(0, 0, [1], choices=True)], r"request 0: choices=True must be"),
            ([models.Request(1, 0, [1]), models.Request(1, 1, [1])],
             r"slot 1 is used by two requests"),
        ]
        for requests, message in cases:
            with pytest.raises(ValueError, match=message):
                model.step(cache, requests)
    # A paged cache's sequences may have any key.
    cache = paged.new_paged_cache(8)
    cache.admit("a", [], 8)
    _, ids = paged.step(cache, [models.Request("a", 0, [1, 2])])
    assert ids.shape == (1,)
