"""The sliding layers' paged KV blocks through the engine, on the CPU target:
tiny random checkpoints shaped as Gemma 3 (two sliding layers, one full) and
Mistral (every layer sliding), a window of 16 and blocks of 4, prompts of
several windows prefilled in chunks. The tokens and logits are the NumPy
forward pass's and the contiguous cache's (which keeps every position); a
sliding table holds at most the blocks a window (and a step's new tokens)
spans while the full layers' grows with the sequence; the blocks it gives
back serve other requests, of a window pool far smaller than their
sequences; speculative decoding, preemption and cancelling leave every pool
full at the end."""

from __future__ import annotations

import numpy as np
import pytest

import etc.models as models
from etc.models import Speculative
from etc.models.engine import Engine
from etc.models.engine.slots import PagedSlots
from etc.models.loading.checkpoint import Checkpoint
from etc.models.step import reference
from etc.models.testing import tiny_config, write_checkpoint

WINDOW, P, STEP_TOKENS = 16, 4, 16
LOAD = dict(workers=2, max_seq_len=128, attention_chunk=8, kv_block_size=P,
            max_step_tokens=STEP_TOKENS)
CONFIGS = {
    # Layers 0 and 1 sliding, layer 2 full.
    "gemma3": tiny_config("Gemma3ForCausalLM", num_hidden_layers=3, sliding_window_pattern=3,
                          sliding_window=WINDOW, max_position_embeddings=256),
    "mistral": tiny_config("MistralForCausalLM", sliding_window=WINDOW,
                           max_position_embeddings=256),
}


def sliding_bound(take: int) -> int:
    """The most blocks a sliding table holds after a step that took `take`
    tokens of its sequence: those of the window of the step's first
    position and of its new tokens, W - 1 + take positions."""
    return -(-(WINDOW - 1 + take) // P) + 1


#: Decoding, W positions: at most ceil(W / P) + 1 blocks.
DECODING_BOUND = sliding_bound(1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sliding")
    return {name: write_checkpoint(root / name, config, seed=21 + i)
            for i, (name, config) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def loaded(checkpoints):
    return {name: models.load(path, **LOAD) for name, path in checkpoints.items()}


def prompt(length: int, seed: int) -> list:
    return np.random.default_rng(seed).integers(3, 96, length).tolist()


def assert_numpy(checkpoint, prompts, results, tol=2e-4):
    """Each result's logits are the NumPy forward pass's over its prompt and
    the tokens before, and its tokens their argmax."""
    weights = checkpoint.weights()
    for p, result in zip(prompts, results):
        sequence = p + result.token_ids
        want = reference.forward(checkpoint.config, weights, sequence[:-1])[len(p) - 1:]
        np.testing.assert_allclose(result.logits, want, rtol=tol, atol=tol)
        assert result.token_ids == want.argmax(-1).tolist()


def assert_pools_full(engine) -> None:
    for manager in engine.cache.cache.managers:
        manager.check()
        assert manager.used_blocks == 0
    assert engine.slots_in_use == 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_long_prompt_generates_the_numpy_and_contiguous_tokens(name, loaded, checkpoints):
    """Prompts of 70 and 37 positions (4 windows and 2) prefilled 16 tokens
    a step beside each other's decoding, 12 new tokens each: the NumPy
    forward pass's logits and tokens, and the contiguous cache's."""
    model = loaded[name]
    prompts = [prompt(70, 1), prompt(37, 2)]
    engine = Engine(model, max_num_seqs=2, max_model_len=128)
    handles = [engine.submit(p, max_new_tokens=12, ignore_eos=True, return_logits=True)
               for p in prompts]
    results = [h.result() for h in handles]
    assert_numpy(Checkpoint(checkpoints[name]), prompts, results)
    contiguous = models.load(checkpoints[name], **{**LOAD, "kv_block_size": None})
    want = contiguous.generate(prompts, 12, ignore_eos=True)
    assert [r.token_ids for r in results] == want.tokens
    assert_pools_full(engine)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_sliding_table_holds_the_window_while_a_full_one_grows(name, loaded):
    """After every step of a 70-token prompt and 40 new tokens: the
    sliding table holds at most the blocks of the window and a step's new
    tokens (decoding: of the window alone), the full layers' table every
    block of the sequence."""
    model = loaded[name]
    engine = Engine(model, max_num_seqs=1, max_model_len=128)
    handle = engine.submit(prompt(70, 3), max_new_tokens=40, ignore_eos=True)
    cache = engine.cache.cache
    held, cached = [], 0
    while engine.step():
        for sequence in engine._running:
            full = cache.manager.held(sequence.slot)
            sliding = cache.window_manager.held(sequence.slot)
            # Admitted with the whole prompt's blocks, then grown a step ahead.
            assert full == -(-max(len(sequence.prompt), sequence.cached) // P)
            assert sliding <= sliding_bound(sequence.cached - cached)
            held.append((sequence.cached, full, sliding))
            cached = sequence.cached
    assert handle.result().finish_reason == "length"
    # Prefill chunks of 16 (blocks 8 .. 15 after the chunk from 48) hold more.
    assert max(sliding for _, _, sliding in held) == 8
    # Decoding, the window's 16 positions span 4 or 5 blocks; at 108
    # positions (the 39th new token), the full table holds 27.
    assert {sliding for cached, _, sliding in held if cached > 70} == {4, DECODING_BOUND}
    assert held[-1] == (108, 27, 4)
    assert_pools_full(engine)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_an_engine_sizes_the_sliding_pool_by_its_windows(name, loaded, checkpoints):
    """An engine's pool holds max_model_len positions per sequence for the
    full layers but only the window and a step's tokens per sequence (two
    blocks spare) for the sliding ones, in the sliding layers' arrays too;
    two sequences of 4 windows fill it and still give the NumPy tokens."""
    model = loaded[name]
    engine = Engine(model, max_num_seqs=2, max_model_len=128)
    cache = engine.cache.cache
    sliding_blocks = 2 * sliding_bound(STEP_TOKENS)
    assert model.window_pool_tokens(2, STEP_TOKENS) == sliding_blocks * P == 72
    assert cache.window_manager.num_blocks == sliding_blocks
    assert cache.manager.num_blocks == 2 * 128 // P
    config = model.config
    for i in range(config.num_layers):
        blocks = cache.arrays[f"l{i}_k_cache"].shape[0]
        assert blocks == (sliding_blocks if config.is_sliding(i) else 2 * 128 // P)
    prompts = [prompt(70, 7), prompt(64, 8)]
    handles = [engine.submit(p, max_new_tokens=20, ignore_eos=True, return_logits=True)
               for p in prompts]
    assert_numpy(Checkpoint(checkpoints[name]), prompts, [h.result() for h in handles])
    assert_pools_full(engine)


def test_an_engines_own_pool_sizes_the_sliding_pool_by_its_windows(loaded, checkpoints):
    """Engine(kv_cache_tokens=): the engine's own pool holds that many
    positions for the full layers and its sequences' windows and a step for
    the sliding ones (never more than the full layers'); two sequences
    still give the NumPy tokens."""
    model = loaded["gemma3"]
    engine = Engine(model, max_num_seqs=2, max_model_len=128, kv_cache_tokens=256)
    cache = engine.cache.cache
    assert cache is not model.paged_cache()
    assert cache.manager.num_blocks == 256 // P
    assert cache.window_manager.num_blocks == 2 * sliding_bound(STEP_TOKENS)
    prompts = [prompt(70, 10), prompt(64, 11)]
    handles = [engine.submit(p, max_new_tokens=20, ignore_eos=True, return_logits=True)
               for p in prompts]
    assert_numpy(Checkpoint(checkpoints["gemma3"]), prompts, [h.result() for h in handles])
    assert_pools_full(engine)
    small = Engine(model, max_num_seqs=2, max_model_len=128, kv_cache_tokens=40).cache.cache
    assert small.window_manager.num_blocks == small.manager.num_blocks == -(-40 // P)


def test_a_pool_sized_at_load_gives_the_sliding_layers_their_share(checkpoints):
    """kv_cache_memory pays for both pools: the sliding layers get the
    share of blocks a sequence of max_seq_len holds there (its window and a
    step: 9 blocks of 32), the full layers what is left; the pool's arrays
    fit the memory, and a long prompt still gives the NumPy tokens."""
    model = models.load(checkpoints["gemma3"], **LOAD, kv_cache_memory=200_000)
    pool = model.paged_cache()
    config = model.config
    layer_block = model.kv_cache_bytes_per_block // config.num_layers
    share = sliding_bound(STEP_TOKENS) * P / LOAD["max_seq_len"]
    assert model.window_pool_tokens(1, STEP_TOKENS) == sliding_bound(STEP_TOKENS) * P
    assert pool.num_blocks == int(200_000 // (layer_block * (1 + 2 * share)))
    assert pool.window_manager.num_blocks == int(pool.num_blocks * share)
    assert pool.nbytes <= 200_000 < pool.nbytes + 3 * layer_block
    prompts = [prompt(70, 9)]
    out = model.generate(prompts, 8, ignore_eos=True, return_logits=True)
    want = reference.forward(config, Checkpoint(checkpoints["gemma3"]).weights(),
                             prompts[0] + out.tokens[0][:-1])[69:]
    assert out.tokens[0] == want.argmax(-1).tolist()


def test_given_back_blocks_serve_other_requests(loaded, checkpoints):
    """Three requests of 60 to 80 positions on a sliding pool of 12 blocks
    (48 positions: without giving blocks back, one request would not fit):
    each finishes with the NumPy forward pass's tokens, requests waiting or
    preempted while the pool is short, and the pool is full again."""
    model = loaded["gemma3"]
    engine = Engine(model, max_num_seqs=3, max_model_len=128)
    engine.cache = PagedSlots(model.new_paged_cache(3 * 128, window_tokens=48), 3)
    prompts = [prompt(60, 4), prompt(50, 5), prompt(68, 6)]
    handles = [engine.submit(p, max_new_tokens=12, ignore_eos=True, return_logits=True)
               for p in prompts]
    window = engine.cache.cache.window_manager
    took = set()
    while engine.step():
        window.check()
        took |= {b for s in engine._running for b in window.table(s.slot) if b is not None}
    results = [h.result() for h in handles]
    assert_numpy(Checkpoint(checkpoints["gemma3"]), prompts, results)
    assert took == set(range(12))
    assert_pools_full(engine)


def test_speculation_preemption_and_cancel_give_every_block_back(loaded):
    """Speculative decoding (rejected positions trimmed from both tables),
    a pool too small for every request (preemptions) and a cancelled
    request: the tokens of each request alone, and every pool full at the
    end."""
    model = loaded["gemma3"]
    prompts = [prompt(40, 7), prompt(45, 8), prompt(30, 9)]
    alone = [model.generate([p], 16, ignore_eos=True).tokens[0] for p in prompts]
    # 36 blocks: the four prompts fit (35), the three sequences' 42 do not.
    engine = Engine(model, max_num_seqs=4, max_model_len=64, kv_cache_tokens=36 * P,
                    speculative=Speculative(tokens=3, adaptive=False, step_tokens=None))
    handles = [engine.submit(p, max_new_tokens=16, ignore_eos=True) for p in prompts]
    cancelled = engine.submit(prompt(20, 10), max_new_tokens=16, ignore_eos=True)
    for _ in range(6):
        engine.step()
    assert engine.slots_in_use == 4
    cancelled.cancel()
    engine.run()
    results = [h.result() for h in handles]
    assert [r.token_ids for r in results] == alone
    assert cancelled.result().finish_reason == "abort"
    assert engine.stats.preemptions > 0 and engine.stats.proposed_tokens > 0
    assert_pools_full(engine)


def test_the_step_graph_gives_the_sliding_layers_a_table(loaded):
    """Gemma 3: `window_block_table` (R, M) and a pool of NW blocks for the
    sliding layers; Mistral (every layer sliding): the one table."""
    names = {t.name: t for t in loaded["gemma3"].graph._tensors}
    assert names["window_block_table"].symbolic_shape == ("R", "M")
    assert names["l0_k_cache"].symbolic_shape == ("NW", P, 2 * 16)
    assert names["l2_k_cache"].symbolic_shape == ("N", P, 2 * 16)
    names = {t.name for t in loaded["mistral"].graph._tensors}
    assert "block_table" in names and "window_block_table" not in names
