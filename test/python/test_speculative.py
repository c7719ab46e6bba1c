"""Speculative decoding (`etc.models.engine.speculative`): a speculating
request's proposed tokens are verified by the target's own step.

The verification is tested with an oracle proposer (`Oracle`: the
reference continuation, with a wrong token in some proposals), so that
every path is taken whatever the tiny random models generate: proposals
accepted whole, in part and not at all. Greedy output with speculation is
the output without it, for every architecture, alone and batched, paged
(blocks shuffled over the pool) and contiguous, across EOS ids, stop
strings and token limits; the KV cache after speculation holds what a run
without it holds, and rejected positions are never read. Prompt lookup
(`NgramIndex`), the adaptive proposal length and the options' checks are
unit-tested; sampled requests keep their seeded tokens and the target's
distribution (chi-square); the server and the command line speculate
through the openai client and report it in /metrics."""

from __future__ import annotations

import random
import subprocess

import numpy as np
import pytest

import etc.models as models
from etc.models import Speculative
from etc.models.engine import Engine
from etc.models.engine.speculative import (MAX_REQUEST_ROWS, NgramIndex, Speculation,
                                           accepted_prefix)
from etc.models.step.kv_blocks import BlockManager
from etc.models.step.sampling import SamplingParams
from etc.models.testing import tiny_config, write_checkpoint

PROMPTS = [[5], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
NEW = 12
LOAD = dict(workers=2, max_seq_len=64, attention_chunk=8)
P = 4
#: Verification without the adaptive length: every proposal the oracle
#: makes is verified.
FIXED = Speculative(tokens=3, adaptive=False, step_tokens=None)

CONFIGS = {
    "llama": tiny_config("LlamaForCausalLM"),
    "qwen3": tiny_config("Qwen3ForCausalLM"),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0]),
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculative")
    out = {}
    for i, (name, config) in enumerate(CONFIGS.items()):
        path = write_checkpoint(root / name, config, seed=i)
        out[name] = models.load(path, kv_block_size=P, **LOAD)
        if name == "qwen3":
            out["qwen3_contiguous"] = models.load(path, kv_block_size=None, **LOAD)
    return out


class Oracle:
    """Stands in for prompt lookup: proposes the next tokens of the one
    reference sequence (prompt + continuation) that the request's tokens
    begin, with the token at a place drawn from the length made wrong in
    about half the proposals (`wrong=True`), so that proposals are
    accepted whole, in part and not at all. Records (tokens, proposal)."""

    def __init__(self, sequences, vocab: int, wrong: bool = True):
        self.sequences = [list(s) for s in sequences]
        self.vocab, self.wrong = vocab, wrong
        self.calls: list[tuple[list, list]] = []

    def __call__(self, index, tokens, k):
        tokens = list(tokens)
        matches = [s for s in self.sequences if s[:len(tokens)] == tokens]
        proposal = matches[0][len(tokens):len(tokens) + k] if matches and k > 0 else []
        draw = random.Random(len(tokens))
        if self.wrong and proposal and draw.random() < 2 / 3:
            place = draw.randrange(len(proposal) + 1)
            if place < len(proposal):
                proposal[place] = (proposal[place] + 1) % self.vocab
        self.calls.append((tokens, list(proposal)))
        return proposal


def oracle(monkeypatch, prompts, continuations, vocab, wrong=True) -> Oracle:
    proposer = Oracle([list(p) + list(c) for p, c in zip(prompts, continuations)], vocab, wrong)
    monkeypatch.setattr(NgramIndex, "propose",
                        lambda index, tokens, k: proposer(index, tokens, k))
    return proposer


def check_outcomes(out) -> None:
    """Proposals were made, some accepted and some not."""
    proposed, accepted = sum(out.proposed_tokens), sum(out.accepted_tokens)
    assert 0 < accepted < proposed, (proposed, accepted)


# ----------------------------------------------------------------------
# Greedy: the tokens without speculation
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_moe", "qwen3_contiguous"])
def test_greedy_speculation_gives_the_tokens_without_it(name, loaded, monkeypatch):
    model = loaded[name]
    want = model.generate(PROMPTS, NEW, ignore_eos=True, return_logits=True)
    proposer = oracle(monkeypatch, PROMPTS, want.tokens, model.config.vocab_size)
    got = model.generate(PROMPTS, NEW, ignore_eos=True, return_logits=True, speculative=FIXED)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_array_equal(a, b)
    check_outcomes(got)
    assert got.steps < want.steps
    assert max(len(p) for _, p in proposer.calls) == FIXED.tokens
    # Each prompt alone.
    for r, prompt in enumerate(PROMPTS):
        alone = model.generate([prompt], NEW, ignore_eos=True, speculative=FIXED)
        assert alone.tokens == [want.tokens[r]]


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_greedy_speculation_on_shuffled_blocks(name, loaded, monkeypatch):
    """An engine on a pool of its own whose free blocks are shuffled, with
    a step budget that splits the prompts: the tokens without
    speculation, and every block back in the pool at the end."""
    model = loaded[name]
    want = model.generate(PROMPTS, NEW, ignore_eos=True).tokens
    oracle(monkeypatch, PROMPTS, want, model.config.vocab_size)
    for seed, budget in ((1, 256), (2, 5)):
        engine = Engine(model, max_num_seqs=3, max_model_len=32, kv_cache_tokens=96,
                        max_step_tokens=budget, speculative=FIXED)
        manager = engine.cache.manager
        random.Random(seed).shuffle(manager._free)
        handles = [engine.submit(p, max_new_tokens=NEW, ignore_eos=True) for p in PROMPTS]
        engine.run()
        assert [h.result().token_ids for h in handles] == want
        assert engine.stats.accepted_tokens > 0
        assert manager.used_blocks == 0
        manager.check()


def test_rejected_positions_are_never_read(loaded, monkeypatch):
    """Before every step, each request's positions from its first new
    token on are filled with NaN in every layer's K and V blocks: a step
    that read a key or value it did not write (a rejected proposal's,
    left past the sequence's end) would turn its logits to NaN. The tokens
    stay those without speculation, and after each step a speculating
    sequence holds the blocks of its tokens and no more."""
    model = loaded["qwen3"]
    want = model.generate(PROMPTS, NEW, ignore_eos=True).tokens
    oracle(monkeypatch, PROMPTS, want, model.config.vocab_size)
    real = model.step

    def poisoned(cache, requests, **options):
        for request in requests:
            table = cache.manager.table(request.slot)
            for position in range(request.start, len(table) * P):
                for array in cache.arrays.values():
                    array[table[position // P], position % P] = np.nan
        return real(cache, requests, **options)

    monkeypatch.setattr(model, "step", poisoned)
    engine = Engine(model, max_num_seqs=3, max_model_len=32, kv_cache_tokens=96,
                    speculative=FIXED)
    handles = [engine.submit(p, max_new_tokens=NEW, ignore_eos=True) for p in PROMPTS]
    manager = engine.cache.manager
    while engine.step():
        for sequence in engine._running:
            if sequence.speculation.speculative_steps and not sequence.pending > 1:
                assert len(manager.table(sequence.slot)) == \
                    manager.blocks_for(len(sequence.tokens))
    assert [h.result().token_ids for h in handles] == want
    assert engine.stats.accepted_tokens < engine.stats.proposed_tokens


def _cache_rows(engine, model, snapshots):
    """Records, as each request finishes, the K and V rows its computed
    positions hold."""
    finish = engine._finish

    def recording(sequence, reason, **kwargs):
        if sequence.slot is not None:
            table = engine.cache.manager.table(sequence.slot)
            positions = sequence.cached
            rows = {name: np.stack([array[table[p // P], p % P] for p in range(positions)])
                    for name, array in engine.cache.cache.arrays.items()}
            snapshots[sequence.handle.request_id] = rows
        finish(sequence, reason, **kwargs)

    engine._finish = recording


def test_the_cache_after_speculation_is_the_cache_without_it(loaded, monkeypatch):
    model = loaded["llama"]
    runs = []
    for speculative in (None, FIXED):
        engine = Engine(model, max_num_seqs=3, max_model_len=32, kv_cache_tokens=96,
                        speculative=speculative)
        random.Random(4).shuffle(engine.cache.manager._free)
        snapshots = {}
        _cache_rows(engine, model, snapshots)
        handles = [engine.submit(p, max_new_tokens=NEW, ignore_eos=True) for p in PROMPTS]
        engine.run()
        runs.append(([h.result().token_ids for h in handles], snapshots, engine.stats))
        if speculative is None:
            oracle(monkeypatch, PROMPTS, runs[0][0], model.config.vocab_size)
    (want, plain, _), (got, speculated, stats) = runs
    assert got == want and 0 < stats.accepted_tokens < stats.proposed_tokens
    for request, rows in plain.items():
        # Every position but the last token's (never computed) is there.
        assert len(rows["l0_k_cache"]) == len(PROMPTS[request]) + NEW - 1
        for name, array in rows.items():
            np.testing.assert_array_equal(speculated[request][name], array, err_msg=name)


# ----------------------------------------------------------------------
# Stopping inside an accepted run
# ----------------------------------------------------------------------

CHAT = [{"role": "user", "content": "Hello!"}]
#: A prompt whose greedy continuation by the chat model repeats itself.
REPEATS = [9, 10]


@pytest.fixture(scope="module")
def chat_greedy(chat_model):
    return chat_model.generate(CHAT, 24, ignore_eos=True)


def chat_ids(model):
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)


def test_eos_inside_an_accepted_run(chat_model, chat_greedy, monkeypatch):
    """Every proposal right: an EOS id accepted in the middle of a proposal
    ends the request there (the ids end with it, the text leaves it
    out), although the step verified tokens past it."""
    tokens = chat_greedy.tokens[0]
    proposer = oracle(monkeypatch, [chat_ids(chat_model)], [tokens],
                      chat_model.config.vocab_size, wrong=False)
    # Steps give tokens 0-4, 5-9, ... (4 accepted and the target's next):
    # an EOS id at k % 5 < 3 has verified rows after it.
    k = next(i for i in range(6, len(tokens)) if tokens[i] not in tokens[:i] and i % 5 < 3)
    monkeypatch.setattr(chat_model, "eos_token_ids", (tokens[k],))
    want = chat_model.generate(CHAT, 24)
    got = chat_model.generate(CHAT, 24, speculative=Speculative(tokens=4, adaptive=False))
    assert got.tokens == want.tokens == [tokens[:k + 1]]
    assert got.text == want.text and got.finish_reasons == ["stop"]
    # A verified proposal went on past the EOS id.
    prompt = len(chat_ids(chat_model))
    assert any(len(t) - prompt <= k < len(t) - prompt + len(p) - 1 for t, p in proposer.calls)


def test_stop_string_inside_an_accepted_run(chat_model, chat_greedy, monkeypatch):
    tokens, text = chat_greedy.tokens[0], chat_greedy.text[0]
    oracle(monkeypatch, [chat_ids(chat_model)], [tokens], chat_model.config.vocab_size,
           wrong=False)
    i = next(i for i in range(4, len(text) - 1) if "\ufffd" not in text[i:i + 2])
    stop = text[i:i + 2]
    want = chat_model.generate(CHAT, 24, ignore_eos=True, stop=[stop])
    got = chat_model.generate(CHAT, 24, ignore_eos=True, stop=[stop],
                              speculative=Speculative(tokens=4, adaptive=False))
    assert want.finish_reasons == got.finish_reasons == ["stop"]
    assert got.tokens == want.tokens and got.text == want.text == [text[:text.find(stop)]]
    assert sum(got.accepted_tokens) > 0


def test_max_new_tokens_is_never_exceeded(chat_model, chat_greedy, monkeypatch):
    """No proposal reaches past the token limit (a step gives at most one
    token more than it verifies), and the ids are the limit's prefix."""
    tokens = chat_greedy.tokens[0]
    prompt = chat_ids(chat_model)
    proposer = oracle(monkeypatch, [prompt], [tokens], chat_model.config.vocab_size,
                      wrong=False)
    for limit in range(1, 9):
        proposer.calls.clear()
        got = chat_model.generate(CHAT, limit, ignore_eos=True,
                                  speculative=Speculative(tokens=4, adaptive=False))
        assert got.tokens == [tokens[:limit]] and got.finish_reasons == ["length"]
        for seen, proposal in proposer.calls:
            assert len(seen) - len(prompt) + len(proposal) + 1 <= limit


def test_streamed_outputs_carry_every_accepted_token(chat_model, chat_greedy, monkeypatch):
    tokens = chat_greedy.tokens[0]
    oracle(monkeypatch, [chat_ids(chat_model)], [tokens], chat_model.config.vocab_size)
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=64,
                    speculative=Speculative(tokens=4, adaptive=False))
    handle = engine.submit(chat_ids(chat_model), max_new_tokens=24, ignore_eos=True)
    outputs = list(handle.outputs())
    assert [t for o in outputs for t in o.token_ids] == tokens
    assert "".join(o.text for o in outputs) == chat_greedy.text[0]
    assert len(outputs) == 24  # one per token, as without speculation
    result = handle.result()
    assert result.accepted_tokens == engine.stats.accepted_tokens > 0
    assert result.speculative_steps == engine.stats.speculative_steps
    assert engine.steps[-1].generated >= 1
    assert sum(s.generated for s in engine.steps) == 24


# ----------------------------------------------------------------------
# The step: choices after several rows
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_moe"])
def test_a_request_with_choices_gets_an_id_after_each_row(name, loaded):
    """`Request.choices`: a prompt of 7 tokens with 7 choices gets the ids
    and logits a step of each of its prefixes gets, bit for bit (a row's
    sums do not depend on how many rows its step has: the CPU matmul's
    4-row panels and the rows left over add in the same order); its
    neighbours' single choices are unchanged."""
    model = loaded[name]
    prompt = [3, 9, 4, 1, 7, 7, 2]
    rows, row_logits = [], []
    for n in range(1, len(prompt) + 1):
        logits, ids = model.step(model.new_cache(1, 16), [models.Request(0, 0, prompt[:n])],
                                 return_logits=True)
        rows.append(int(ids[0]))
        row_logits.append(logits[0])
    other = models.Request(1, 0, [5, 6])
    alone_logits, alone = model.step(model.new_cache(2, 16), [other], return_logits=True)
    logits, ids = model.step(model.new_cache(2, 16),
                             [other, models.Request(0, 0, prompt, choices=len(prompt))],
                             return_logits=True)
    assert ids.shape == (1 + len(prompt),) and logits.shape[0] == 1 + len(prompt)
    assert int(ids[0]) == int(alone[0]) and list(ids[1:]) == rows
    np.testing.assert_array_equal(logits[1:], np.stack(row_logits))
    np.testing.assert_array_equal(logits[0], alone_logits[0])
    for bad in (0, len(prompt) + 1, 1.5, True):
        with pytest.raises(ValueError, match=r"request 0: choices=.* must be an int in \[1, 7\]"):
            model.step(model.new_cache(1, 16), [models.Request(0, 0, prompt, choices=bad)])


def test_choices_draw_each_position_with_its_own_counter(loaded):
    """Sampled choices: the id after row i is drawn at position i + 1 with
    the request's seed, exactly as the step that decodes that position
    draws it."""
    model = loaded["qwen3"]
    seeded = SamplingParams(temperature=1.5, seed=77)
    prompt = [3, 9, 4, 1, 7, 7, 2]
    want = [int(model.step(model.new_cache(1, 16),
                           [models.Request(0, 0, prompt[:n], seeded)])[1][0])
            for n in range(1, len(prompt) + 1)]
    _, ids = model.step(model.new_cache(1, 16),
                        [models.Request(0, 0, prompt, seeded, choices=len(prompt))])
    assert list(ids) == want
    assert len(set(want)) > 1


# ----------------------------------------------------------------------
# The block manager's trim
# ----------------------------------------------------------------------


def test_trim_gives_back_the_blocks_past_the_positions():
    manager = BlockManager(8, 4)
    assert manager.admit("a", list(range(9))) == 0
    manager.commit("a", list(range(9)))  # two full blocks cached
    assert manager.reserve("a", 20) and len(manager.table("a")) == 5
    manager.trim("a", 10)
    assert len(manager.table("a")) == 3 and manager.free_blocks == 5
    manager.check()
    # Never below its committed blocks, whatever is asked.
    manager.trim("a", 1)
    assert len(manager.table("a")) == 2
    manager.check()
    # Trimmed blocks were never cached: nothing of them is reused.
    assert manager.cached_blocks == 2
    manager.release("a")
    assert manager.free_blocks == 8
    manager.check()


# ----------------------------------------------------------------------
# Prompt lookup and the adaptive proposal length
# ----------------------------------------------------------------------


def lookup(tokens, k, low, high):
    """Prompt lookup by brute force: the tokens after the latest earlier
    occurrence of the longest suffix of `low` .. `high` tokens."""
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        suffix = list(tokens[len(tokens) - n:])
        for end in range(len(tokens) - 2, n - 2, -1):
            if list(tokens[end - n + 1:end + 1]) == suffix:
                return list(tokens[end + 1:end + 1 + k])
    return []


def test_ngram_proposals():
    index = NgramIndex(1, 3)
    assert index.propose([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    # The latest earlier occurrence, cut at the sequence's end.
    assert NgramIndex(2, 2).propose([1, 2, 9, 1, 2, 8, 1, 2], 5) == [8, 1, 2]
    # Longest first: (5, 1, 2) occurred once, (1, 2) later.
    tokens = [5, 1, 2, 7, 3, 1, 2, 6, 5, 1, 2]
    assert NgramIndex(1, 3).propose(tokens, 3) == [7, 3, 1]
    assert NgramIndex(1, 2).propose(tokens, 3) == [6, 5, 1]
    # Nothing shorter than min; nothing for k = 0 or a lone token.
    assert NgramIndex(2, 3).propose([1, 2, 3, 1], 3) == []
    assert NgramIndex(1, 3).propose([1, 2, 3, 1], 3) == [2, 3, 1]
    assert NgramIndex(1, 3).propose([1, 2, 3, 1], 0) == []
    assert NgramIndex(1, 1).propose([4], 2) == []
    # A repeated token proposes itself.
    assert NgramIndex(1, 4).propose([7, 7, 7, 7], 4) == [7]


def test_ngram_index_grows_with_its_sequence():
    """Asked after every new token, the index proposes what a search of
    the whole sequence finds, for any n-gram range."""
    rng = random.Random(3)
    for low, high in ((1, 1), (1, 3), (2, 4), (3, 3)):
        tokens = [rng.randrange(4) for _ in range(120)]
        index = NgramIndex(low, high)
        for length in range(1, len(tokens) + 1):
            k = rng.randrange(1, 6)
            assert index.propose(tokens[:length], k) == lookup(tokens[:length], k, low, high), \
                (low, high, length)


def test_the_proposal_length_adapts():
    speculation = Speculation(Speculative(tokens=4, ngram=(1, 1)))
    tokens = [1, 2, 3, 4, 5, 6, 1]
    assert speculation.propose(tokens, 10) == [2, 3, 4, 5]
    speculation.verified(4, 2)  # two accepted: two next
    assert speculation.propose(tokens, 10) == [2, 3]
    speculation.verified(2, 2)  # all accepted: one more
    assert speculation.propose(tokens, 10) == [2, 3, 4]
    assert speculation.propose(tokens, 1) == [2]  # the limit
    pauses = []
    for _ in range(8):  # none accepted: pauses of 1, 2, 4 ... 32 steps, then one token
        speculation.verified(1, 0)
        paused = 0
        while not speculation.propose(tokens, 10):
            paused += 1
        pauses.append(paused)
    assert pauses == [1, 2, 4, 8, 16, 32, 32, 32]
    assert speculation.propose(tokens, 10) == [2]
    speculation.verified(1, 1)  # an acceptance ends the pauses
    assert speculation.propose(tokens, 10) == [2, 3]
    speculation.verified(2, 0)
    assert speculation.propose(tokens, 10) == [] and speculation.propose(tokens, 10) == [2]
    assert (speculation.speculative_steps, speculation.proposed_tokens,
            speculation.accepted_tokens) == (12, 17, 5)
    fixed = Speculation(Speculative(tokens=4, ngram=(1, 1), adaptive=False))
    fixed.verified(4, 0)
    assert fixed.propose(tokens, 10) == [2, 3, 4, 5]


def test_proposals_fill_a_step_up_to_step_tokens(loaded, monkeypatch):
    """With step_tokens=8 (the default) and nothing past it, three
    decoding requests propose 5 tokens at most in all (the first in the
    step's order 4, the next 1); the tokens stay those without
    speculation."""
    model = loaded["qwen3"]
    want = model.generate(PROMPTS, NEW, ignore_eos=True).tokens
    proposer = oracle(monkeypatch, PROMPTS, want, model.config.vocab_size, wrong=False)
    engine = Engine(model, max_num_seqs=3, max_model_len=32,
                    speculative=Speculative(tokens=4, adaptive=False,
                                            confident_step_tokens=None))
    handles = [engine.submit(p, max_new_tokens=NEW, ignore_eos=True) for p in PROMPTS]
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    assert max(step.tokens for step in engine.steps[1:]) <= 8
    assert max(len(p) for _, p in proposer.calls) == 4
    assert engine.stats.proposed_tokens > 0


@pytest.mark.parametrize("wrong", ["none", "all", "two"])
def test_confident_requests_speculate_past_step_tokens(loaded, monkeypatch, wrong):
    """Requests whose proposals are accepted (the oracle, always right)
    stay confident and fill steps past step_tokens (8), up to
    confident_step_tokens (12), each of k + 1 = 5 rows; requests whose
    proposals are all wrong fall below confident_acceptance and keep
    within step_tokens after their first rejections, and so does a batch
    of three with two such requests (not all its requests confident:
    `CONFIDENT_SHARE`). The tokens are those without speculation."""
    model = loaded["qwen3"]
    prompts = [[5], [1, 2, 3], [7, 8, 9, 10]]
    want = model.generate(prompts, 2 * NEW, ignore_eos=True).tokens
    proposer = oracle(monkeypatch, prompts, want, model.config.vocab_size, wrong=False)
    failing = {"none": (), "all": (0, 1, 2), "two": (1, 2)}[wrong]

    def propose(index, tokens, k):
        right = proposer(index, tokens, k)
        if any(list(tokens[:len(prompts[i])]) == prompts[i] for i in failing):
            return [(t + 1) % model.config.vocab_size for t in right]  # each one off
        return right
    monkeypatch.setattr(NgramIndex, "propose", propose)
    monkeypatch.setattr(NgramIndex, "lookup", lambda index, tokens, k: [])  # no shadows
    engine = Engine(model, max_num_seqs=3, max_model_len=64, speculative=Speculative(
        tokens=4, adaptive=False, confident_step_tokens=12))
    handles = [engine.submit(p, max_new_tokens=2 * NEW, ignore_eos=True) for p in prompts]
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    sizes = [step.tokens for step in engine.steps[1:]]
    if failing:
        assert max(sizes[2:]) <= 8
    else:
        assert max(sizes) == 12 and engine.stats.acceptance_rate == 1.0
    results = [h.result() for h in handles]
    assert all(results[i].accepted_tokens == 0 for i in failing)


def test_confidence_follows_recent_acceptance():
    """`recent` averages the verifications' accepted fractions with
    weights shrinking by 3/4; prompt lookup's unproposed first tokens
    (`shadow`, scored by `observe`) count too, so that a request kept
    within step_tokens can become confident again; a confident request
    proposes past step_tokens the tokens j with recent^j at least
    confident_acceptance."""
    speculation = Speculation(Speculative(tokens=4, ngram=(1, 1), confident_acceptance=0.8))
    assert speculation.recent == 1.0 and speculation.confident
    assert speculation.confident_tokens() == MAX_REQUEST_ROWS
    speculation.verified(4, 0)
    assert speculation.recent == 0.75 and not speculation.confident
    assert speculation.confident_tokens() == 0
    tokens = [1, 2, 3, 1]
    speculation.shadow(tokens)  # the lookup's first token: 2
    speculation.observe(tokens + [2])
    assert speculation.recent == 0.8125 and speculation.confident
    assert speculation.confident_tokens() == 1  # 0.8125^2 = 0.66 < 0.8
    speculation.recent = 0.95
    assert speculation.confident_tokens() == 4  # 0.95^4 = 0.81, 0.95^5 = 0.77
    speculation.recent = 0.8125
    speculation.shadow(tokens + [2])
    speculation.observe(tokens + [2, 9])  # it looked up 3
    assert speculation.recent == 0.609375
    speculation.observe(tokens + [2, 9, 9])  # nothing looked up since: no change
    assert speculation.recent == 0.609375
    with pytest.raises(ValueError, match="Speculative: confident_acceptance=1.5"):
        Speculative(confident_acceptance=1.5)


def test_accepted_prefix():
    assert accepted_prefix([], [4]) == 0
    assert accepted_prefix([4, 5, 6], [4, 5, 6, 7]) == 3
    assert accepted_prefix([4, 5, 6], [4, 9, 6, 7]) == 1
    assert accepted_prefix([4, 5, 6], [3, 5, 6, 7]) == 0


def test_options_are_checked_by_field(chat_model):
    for options, field in ((dict(method="eagle"), "method"), (dict(tokens=0), "tokens"),
                           (dict(tokens=2.0), "tokens"), (dict(ngram=(3, 2)), "ngram"),
                           (dict(ngram=(0, 2)), "ngram"), (dict(ngram=3), "ngram"),
                           (dict(ngram=("1", 2)), "ngram"), (dict(adaptive=1), "adaptive"),
                           (dict(step_tokens=0), "step_tokens"),
                           (dict(confident_step_tokens=0), "confident_step_tokens"),
                           (dict(confident_step_tokens=8.5), "confident_step_tokens"),
                           (dict(confident_acceptance=-0.1), "confident_acceptance"),
                           (dict(confident_acceptance="high"), "confident_acceptance"),
                           (dict(confident_acceptance=True), "confident_acceptance")):
        with pytest.raises(ValueError, match=f"Speculative: {field}="):
            Speculative(**options)
    assert Speculative.of("ngram") == Speculative() and Speculative.of(None) is None
    assert Speculative(ngram=[1, 2]).ngram == (1, 2)
    with pytest.raises(ValueError, match=r"Engine: speculative='eagle' is not supported"):
        Engine(chat_model, speculative="eagle")
    with pytest.raises(ValueError, match=r"Engine: speculative=4 must be 'ngram', an "
                                         r"etc.models.Speculative or None"):
        Engine(chat_model, speculative=4)
    with pytest.raises(ValueError, match=r"generate: speculative=True must be 'ngram'"):
        chat_model.generate([5], 2, speculative=True)


def test_prompt_lookup_on_text_that_repeats(chat_model):
    """The tiny model's greedy text from [9, 10] repeats itself: prompt
    lookup proposes the repeats, the tokens are those without
    speculation, in fewer steps, and the counts add up."""
    want = chat_model.generate([REPEATS], 24, ignore_eos=True)
    got = chat_model.generate([REPEATS], 24, ignore_eos=True, speculative="ngram")
    assert got.tokens == want.tokens
    assert got.accepted_tokens[0] > 0 and got.steps < want.steps
    assert got.acceptance_rate == sum(got.accepted_tokens) / sum(got.proposed_tokens)
    assert got.accepted_tokens_per_step == \
        sum(got.accepted_tokens) / sum(got.speculative_steps)
    # The prefill's step gave the first token (nothing to look up yet),
    # the decoding steps the rest.
    assert got.decode_tokens == want.decode_tokens == 23
    assert want.proposed_tokens is None and np.isnan(want.acceptance_rate)


# ----------------------------------------------------------------------
# Sampled requests
# ----------------------------------------------------------------------


def test_a_seed_gives_its_tokens_with_or_without_speculation(loaded, monkeypatch):
    """The token at position p is drawn with the seed's counter p from the
    target's logits there, whichever step verifies it."""
    model = loaded["qwen3"]
    params = [SamplingParams(temperature=0.3, seed=s) for s in (1, 2, 3)]
    engine = Engine(model, max_num_seqs=3, max_model_len=32)
    handles = [engine.submit(p, max_new_tokens=NEW, sampling=q) for p, q in zip(PROMPTS, params)]
    engine.run()
    want = [h.result().token_ids for h in handles]
    oracle(monkeypatch, PROMPTS, want, model.config.vocab_size)
    engine = Engine(model, max_num_seqs=3, max_model_len=32, speculative=FIXED)
    handles = [engine.submit(p, max_new_tokens=NEW, sampling=q) for p, q in zip(PROMPTS, params)]
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    assert 0 < engine.stats.accepted_tokens < engine.stats.proposed_tokens


def test_sampled_speculation_follows_the_target_distribution(loaded, monkeypatch):
    """4,000 unseeded requests of 2 new tokens at temperature 0.1, each
    step with fresh seeds, proposing (a, b) (the two most likely first
    tokens' ...): the pairs they generate pass a chi-square test against
    the target's joint distribution p(x) p(y | x), and fail it against
    what accepting every proposal would give."""
    model = loaded["qwen3"]
    prompt, temperature, count = [5], 0.1, 4000
    vocab = model.config.vocab_size

    def softmax(logits):
        z = np.asarray(logits, np.float64) / temperature
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    first = softmax(model.step(model.new_cache(1, 8), [models.Request(0, 0, prompt)],
                               return_logits=True)[0][0])
    logits, _ = model.step(model.new_cache(vocab, 8),
                           [models.Request(x, 0, prompt + [x]) for x in range(vocab)],
                           return_logits=True)
    joint = first[:, None] * softmax(logits)  # p(x, y)
    a = int(np.argmax(first))
    b = int(np.argmax(joint[a]))
    assert 0.2 < first[a] < 0.8  # proposals accepted and rejected alike

    def propose(index, tokens, k):
        return [a, b][len(tokens) - len(prompt):][:k]

    monkeypatch.setattr(NgramIndex, "propose", propose)
    engine = Engine(model, max_num_seqs=128, max_model_len=8, speculative=FIXED)
    sampling = SamplingParams(temperature=temperature)
    handles = [engine.submit(prompt, max_new_tokens=2, sampling=sampling) for _ in range(count)]
    engine.run()
    pairs = np.array([h.result().token_ids for h in handles])
    assert engine.stats.accepted_tokens > count / 10
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)

    def chi2(p):
        """Pearson's statistic over the cells expected 5 times or more,
        the others pooled; and its 0.999 quantile."""
        expected = p.ravel() * count
        big = expected >= 5
        observed = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
        expected = np.append(expected[big], expected[~big].sum())
        df = len(expected) - 1
        z = 3.0902  # Wilson-Hilferty, as test_sampling's
        quantile = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
        return float(((observed - expected) ** 2 / expected).sum()), quantile

    statistic, quantile = chi2(joint)
    assert statistic < quantile
    # Accepting (a, b) whenever a is drawn would give p(a, b) = p(a).
    blind = joint.copy()
    blind[a] = 0
    blind[a, b] = first[a]
    statistic, quantile = chi2(blind)
    assert statistic > 3 * quantile



# ----------------------------------------------------------------------
# A draft model
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def drafts(loaded, tmp_path_factory):
    """Draft models for the Qwen3 target: itself, and another random
    model of the same vocabulary (one layer), loaded as the target's
    drafts are."""
    root = tmp_path_factory.mktemp("drafts")
    other = write_checkpoint(root / "other", tiny_config("LlamaForCausalLM",
                                                         num_hidden_layers=1), seed=9)
    target = loaded["qwen3"]
    return target, {"self": target.checkpoint.path, "other": other}


def record_proposals(monkeypatch):
    """Records each draft proposal: (the request's tokens, the proposal)."""
    from etc.models.engine.draft import DraftProposer

    calls = []
    real = DraftProposer.propose

    def propose(self, wanted):
        out = real(self, wanted)
        calls.extend((list(tokens), list(p)) for (_, tokens, _), p in zip(wanted, out))
        return out

    monkeypatch.setattr(DraftProposer, "propose", propose)
    return calls


def test_a_draft_model_proposes_within_step_tokens(drafts):
    """A draft model's proposals, every one accepted (the model as its own
    draft), stay within step_tokens (8): each of its tokens costs a draft
    step, so confident_step_tokens is prompt lookup's only."""
    target, paths = drafts
    want = target.generate(PROMPTS, NEW, ignore_eos=True).tokens
    engine = Engine(target, max_num_seqs=3, max_model_len=32, speculative=Speculative(
        draft=paths["self"], tokens=4, adaptive=False))
    handles = [engine.submit(p, max_new_tokens=NEW, ignore_eos=True) for p in PROMPTS]
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    assert engine.stats.acceptance_rate == 1.0
    assert max(step.tokens for step in engine.steps[1:]) <= 8


@pytest.mark.parametrize("which", ["self", "other"])
def test_a_draft_model_proposes_its_greedy_tokens(which, drafts, monkeypatch):
    """Greedy output with a draft model is the target's; each proposal is
    what the draft model generates greedily from the request's tokens
    (its cache rolled back right after every verification); a model as
    its own draft has every proposal accepted."""
    target, paths = drafts
    want = target.generate(PROMPTS, NEW, ignore_eos=True)
    calls = record_proposals(monkeypatch)
    spec = Speculative(draft=paths[which], tokens=3, adaptive=False, step_tokens=None)
    got = target.generate(PROMPTS, NEW, ignore_eos=True, speculative=spec)
    assert got.tokens == want.tokens
    draft = target.draft_model(paths[which])
    assert draft is target.draft_model(str(paths[which]))  # loaded once
    assert calls
    for tokens, proposal in calls:
        if proposal:
            assert proposal == draft.generate([tokens], len(proposal), ignore_eos=True).tokens[0]
    if which == "self":
        assert got.accepted_tokens == got.proposed_tokens and got.steps < want.steps / 2
    else:
        assert sum(got.accepted_tokens) < sum(got.proposed_tokens)


def test_a_draft_model_keeps_seeds_and_frees_its_cache(drafts):
    target, paths = drafts
    params = [SamplingParams(temperature=0.5, seed=s) for s in (4, 5, 6)]
    runs = []
    for speculative in (None, Speculative(draft=paths["other"], tokens=2, step_tokens=None)):
        engine = Engine(target, max_num_seqs=3, max_model_len=32, speculative=speculative)
        handles = [engine.submit(p, max_new_tokens=NEW, sampling=q)
                   for p, q in zip(PROMPTS, params)]
        engine.run()
        runs.append([h.result().token_ids for h in handles])
    assert runs[0] == runs[1]
    assert engine.stats.proposed_tokens > 0 and engine.draft.steps > 0
    manager = engine.draft.cache.manager
    assert len(manager) == 0 and manager.used_blocks == 0
    manager.check()


def test_draft_model_errors(drafts, tmp_path):
    target, paths = drafts
    small = write_checkpoint(tmp_path / "small-vocab", tiny_config(vocab_size=64))
    with pytest.raises(ValueError, match=r"the draft model's vocabulary \(64 tokens\) is not the "
                                         r"target's \(96\)"):
        Engine(target, speculative=Speculative(draft=small))
    with pytest.raises(ValueError, match="method='draft' needs draft="):
        Speculative(method="draft")
    with pytest.raises(ValueError, match="draft= needs method='draft'"):
        Speculative(method="ngram", draft=paths["other"])
    with pytest.raises(ValueError, match=r"draft=3 must be a checkpoint path or a loaded model"):
        Speculative(draft=3)
    with pytest.raises(ValueError, match=r"speculative='draft' is not supported; expected 'ngram'"):
        target.generate([5], 2, speculative="draft")
    assert Speculative(draft=paths["other"]).method == "draft"


# ----------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------


def test_the_server_speculates_and_reports_it(chat_model):
    openai = pytest.importorskip("openai")
    import httpx

    import etc.serve
    from test_serve import Server

    want = chat_model.generate([REPEATS], 24, ignore_eos=True)
    server = Server(etc.serve.build_app(chat_model, served_model_name="spec", max_num_seqs=2,
                                        speculative=Speculative(tokens=3)))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.completions.create(model="spec", prompt=REPEATS, max_tokens=24,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert reply.choices[0].text == want.text[0]
        stream = client.completions.create(model="spec", prompt=REPEATS, max_tokens=24,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(chunk.choices[0].text for chunk in stream) == want.text[0]
        text = httpx.get(server.url + "/metrics").text
    finally:
        server.stop()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    label = '{model_name="spec"}'
    stats = server.app.state.engine.stats
    assert values["etc_spec_decode_num_drafts_total" + label] == stats.speculative_steps > 0
    assert values["etc_spec_decode_num_draft_tokens_total" + label] == stats.proposed_tokens
    assert values["etc_spec_decode_num_accepted_tokens_total" + label] == \
        stats.accepted_tokens > 0
    assert values["etc_spec_decode_acceptance_rate" + label] == \
        pytest.approx(stats.acceptance_rate)
    assert values["etc_spec_decode_accepted_tokens_per_step" + label] == \
        pytest.approx(stats.accepted_tokens_per_step)


# ----------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------


def test_the_command_line_options(tmp_path):
    """`etc generate` and `etc serve` with --speculative ngram, and
    generate with --draft-model: the text without them, and the server's
    metrics count the proposals; the options' errors are one line (or
    argparse's usage error) before loading."""
    openai = pytest.importorskip("openai")
    import httpx
    from http_servers import listening_port, wait_until_healthy
    from test_cli import ETC, SMALL, etc_command, one_line_error

    path = write_checkpoint(tmp_path / "tiny-chat", tiny_config(vocab_size=320), tokenizer=True)
    cache = tmp_path / "cache"
    model = models.load(path, cache=cache, workers=2, max_seq_len=32, attention_chunk=8)
    prompt = "the cat the cat the cat the"
    want = model.generate(prompt, 8).text[0]
    result = etc_command("generate", path, prompt, "--max-new-tokens", "8", "--cache-dir", cache,
                         *SMALL, "--speculative", "ngram", "--speculative-tokens", "3",
                         "--speculative-ngram", "1", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout == want + ("" if want.endswith("\n") else "\n")
    # A draft model: the model as its own draft.
    drafted = etc_command("generate", path, prompt, "--max-new-tokens", "8", "--cache-dir", cache,
                          *SMALL, "--draft-model", path, "--speculative-tokens", "3")
    assert drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == result.stdout
    one_line_error(etc_command("generate", path, "hi", "--draft-model", tmp_path / "nowhere"),
                   "--draft-model", "nowhere: no such file or directory")
    one_line_error(etc_command("generate", path, "hi", "--draft-model", path, "--speculative",
                               "ngram"), "give it or --speculative ngram")
    one_line_error(etc_command("generate", path, "hi", "--speculative-tokens", "3"),
                   "--speculative-tokens sets how requests speculate; give --speculative ngram")
    one_line_error(etc_command("generate", path, "hi", "--speculative", "ngram",
                               "--speculative-ngram", "3", "1"),
                   "--speculative-ngram 3 1: MIN must not be more than MAX")
    usage = etc_command("serve", path, "--speculative", "eagle")
    assert usage.returncode == 2 and "invalid choice: 'eagle'" in usage.stderr
    server = subprocess.Popen([str(ETC), "serve", str(path), "--port", "0", "--cache-dir",
                               str(cache), *SMALL, "--speculative", "ngram",
                               "--speculative-ngram", "1", "3"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = listening_port(server)
        wait_until_healthy(server, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        # Long enough for the model's text to repeat itself (decoding
        # steps propose; the prompt's step is over step_tokens).
        reply = client.completions.create(model=client.models.list().data[0].id,
                                          prompt=prompt, max_tokens=14, temperature=0)
        assert reply.choices[0].text == model.generate(prompt, 14).text[0]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.terminate()
        server.wait(timeout=60)
    proposed = next(line for line in metrics.splitlines()
                    if line.startswith("etc_spec_decode_num_draft_tokens_total"))
    assert float(proposed.split()[-1]) > 0


# ----------------------------------------------------------------------
# Rows per request: below the attention's prefill path
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """The tiny Llama in bf16: its KV cache bf16, so that a request of
    QUERY_ROWS (8) new tokens or more takes the CPU attention's prefill
    path (`AttentionChunkBlocks.emit_query_blocks`), which sums in
    another order than decoding's."""
    config = tiny_config("LlamaForCausalLM", head_dim=32)  # whole 32-value pairs
    path = write_checkpoint(tmp_path_factory.mktemp("speculative_bf16") / "llama", config,
                            seed=0)
    return models.load(path, dtype="bf16", kv_block_size=P, **LOAD)


def test_a_long_proposal_is_verified_on_the_decoding_path(bf16_model, monkeypatch):
    """k = 8 proposals, all right: a request's verification rows stay below
    the attention's prefill path (`MAX_REQUEST_ROWS`), so every logit is
    the one decoding gives, in fewer steps: bit for bit, except where the
    CPU has AMX, whose matmul tiles take a step of 3 rows or more
    (`MatmulAMX.TILE_CROSSOVER`: a verification step's rows, not a
    decode step's) and sum K in another order, within f32 rounding."""
    from etc.ops.attention_cpu import AttentionChunkBlocks
    from etc.runtime import isa

    assert MAX_REQUEST_ROWS < AttentionChunkBlocks.QUERY_ROWS
    model = bf16_model

    def clear():  # a cached prefix: the prompt's rest decoded, not prefilled
        model.paged_cache().manager.clear_cached()
    clear()
    want = model.generate(PROMPTS, 2 * NEW, ignore_eos=True, return_logits=True)
    proposer = oracle(monkeypatch, PROMPTS, want.tokens, model.config.vocab_size, wrong=False)
    for batch in (PROMPTS, PROMPTS[:1]):
        clear()
        got = model.generate(batch, 2 * NEW, ignore_eos=True, return_logits=True,
                             speculative=Speculative(tokens=8, adaptive=False, step_tokens=None))
        assert got.tokens == want.tokens[:len(batch)]
        for a, b in zip(got.logits, want.logits):
            if isa.has(isa.chosen(), "amx-bf16"):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
            else:
                np.testing.assert_array_equal(a, b)
        assert got.steps < want.steps and sum(got.accepted_tokens) > 0
    assert 0 < max(len(p) for _, p in proposer.calls) <= MAX_REQUEST_ROWS - 1


def test_a_prefill_beside_a_verification(bf16_model, monkeypatch):
    """A prompt prefilled (11 rows: the attention's prefill path) in the
    step of a decoding request that verifies 6 proposed tokens: the
    prompt's logits are those of a step without them, bit for bit (a
    prefill's sums do not follow its step's other rows), and so are the
    decoding request's."""
    model = bf16_model
    first, second = PROMPTS[0], PROMPTS[2]
    want = model.generate([first, second], 2 * NEW, ignore_eos=True).tokens
    oracle(monkeypatch, [first, second], want, model.config.vocab_size, wrong=False)
    results = []
    for speculative in (None, Speculative(tokens=6, adaptive=False)):
        model.paged_cache().manager.clear_cached()
        engine = Engine(model, max_num_seqs=2, speculative=speculative)
        handles = [engine.submit(first, max_new_tokens=2 * NEW, ignore_eos=True,
                                 return_logits=True)]
        engine.step()
        engine.step()
        handles.append(engine.submit(second, max_new_tokens=NEW, ignore_eos=True,
                                     return_logits=True))
        engine.run()
        results.append([h.result() for h in handles])
        step = engine.steps[2]
        assert step.requests == 2 and step.tokens == len(second) + 1 + step.proposed
        assert (step.proposed == 6) == (speculative is not None)
    for plain, spec in zip(*results):
        assert spec.token_ids == plain.token_ids
        np.testing.assert_array_equal(spec.logits, plain.logits)
    assert results[1][0].accepted_tokens > 0


def pauses(speculation, failures: int) -> list:
    """The steps `speculation` proposes nothing for after each of
    `failures` proposals of one token none of which is accepted."""
    out = []
    for _ in range(failures):
        skipped = 0
        while not speculation.wants(10):
            skipped += 1
        speculation.verified(1, 0)
        out.append(skipped)
    return out


def test_pauses_grow_past_32_while_nothing_was_ever_accepted():
    """A request none of whose proposals was ever accepted (a draft that
    does not know the text) pauses 1, 4, 16 ... steps, past the cap of
    32, up to MAX_IDLE_PAUSE, so that it tries its draft a handful of
    times over its length; its first acceptance brings the pauses back
    to 1, doubling to 32 at most. A draft model's first proposal is one
    token."""
    assert Speculation(Speculative(tokens=4), proposer=Clock()).wants(10) == 1
    never = Speculation(Speculative(tokens=4))
    never.verified(4, 0)
    assert pauses(never, 8) == [1, 4, 16, 64, 256, 1024, 1024, 1024]
    assert Speculation.MAX_IDLE_PAUSE == 1024
    once = Speculation(Speculative(tokens=4))
    once.verified(4, 1)
    once.verified(1, 0)
    assert pauses(once, 8) == [1, 2, 4, 8, 16, 32, 32, 32]
    assert pauses(never, 0) == [] and sum(not never.wants(10) for _ in range(1024)) == 1024
    never.verified(1, 1)  # accepted after the pause: proposes at once, then short pauses
    assert pauses(never, 3) == [0, 1, 2]


class Clock:
    """Stands in for a `DraftProposer` in `Speculation`'s unit tests: its
    clock, and `verified`."""

    def __init__(self):
        self.clock = 0

    def verified(self, sequence, proposed, accepted):
        pass


def test_draft_requests_resume_together():
    """With a draft model a request's pause of p steps ends on the draft's
    clock at a multiple of p, p to 2p - 1 steps on (p = 1, 4, 16 ...
    while nothing was accepted, 1, 2 ... 32 after): requests that failed
    at different steps try again in the same one."""
    clock = Clock()
    requests = [Speculation(Speculative(draft="d", tokens=4), proposer=clock) for _ in range(3)]
    tries: list = [[] for _ in requests]
    for clock.clock in range(1, 300):
        for speculation, seen in zip(requests, tries):
            if clock.clock >= 3 * requests.index(speculation) and speculation.wants(10):
                seen.append(clock.clock)
                speculation.verified(1, 0)
    assert tries[0] == [1, 2, 8, 32, 128]
    for seen in tries:
        pauses = [b - a for a, b in zip(seen, seen[1:])]
        assert all(p <= pause <= 2 * p - 1 for p, pause in zip((1, 4, 16, 64), pauses)), seen
        assert seen[-2:] == [32, 128]
    accepted = requests[0]
    accepted.verified(1, 1)
    accepted.verified(1, 0)  # at 299: pauses of 1, 2, 4 ..., each ending on a multiple
    seen = []
    for clock.clock in range(299, 340):
        if accepted.wants(10):
            seen.append(clock.clock)
            accepted.verified(1, 0)
    assert seen == [300, 302, 308, 320, 336]


def test_paused_draft_requests_share_draft_steps(drafts, monkeypatch):
    """Requests whose draft proposals are never accepted, started 3 steps
    apart, try their draft in shared steps: the draft runs fewer steps
    than they try (a pause of 16 brings the first two together);
    a paused request's draft does nothing (every request a draft step
    serves is verified next), and greedy output is the target's."""
    from etc.models.engine import engine as engine_module
    from etc.models.engine.draft import DraftProposer

    target, paths = drafts
    monkeypatch.setattr(engine_module, "accepted_prefix", lambda proposed, chosen: 0)
    served = []  # per draft step: the slots it computes
    real = DraftProposer._step

    def step(self, requests):
        served.append(sorted(r.slot for r in requests))
        return real(self, requests)

    monkeypatch.setattr(DraftProposer, "_step", step)
    new = 40
    want = target.generate(PROMPTS, new, ignore_eos=True).tokens
    engine = Engine(target, max_num_seqs=3, max_model_len=64, speculative=Speculative(
        draft=paths["other"], tokens=2, step_tokens=None))
    handles = []
    for prompt in PROMPTS:
        handles.append(engine.submit(prompt, max_new_tokens=new, ignore_eos=True))
        for _ in range(3):
            engine.step()
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    results = [h.result() for h in handles]
    assert all(r.accepted_tokens == 0 and r.speculative_steps >= 3 for r in results)
    assert sum(len(slots) for slots in served) == engine.stats.speculative_steps
    # The first two requests' tries after pausing 16 steps (the 2nd
    # tried 3 steps after the 1st, at every level before) are one step.
    assert served[-1] == [0, 1] and len(served) < engine.stats.speculative_steps, served
