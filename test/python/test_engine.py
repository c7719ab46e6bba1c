"""etc.models.engine and Model.generate on text: prompts as strings and
chats, stopping at EOS ids, stop strings and max_new_tokens, many requests
on fewer KV slots, chunked prefill under a token budget, cancellation, and
the engine's own thread. One tiny model (conftest's `chat_model`)."""

import threading

import numpy as np
import pytest

from etc.models.engine import Engine, RequestError, StopChecker

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def greedy(chat_model):
    """The model's greedy continuation of CHAT, never stopping early."""
    return chat_model.generate(CHAT, 24, ignore_eos=True)


def test_generate_text_and_chats(chat_model, greedy):
    tok = chat_model.tokenizer
    assert chat_model.eos_token_ids == (2, 0)
    ids = tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)
    assert ids[0] == 1  # <|im_start|>: the template's markers are special tokens
    by_ids = chat_model.generate(ids, 24, ignore_eos=True)
    assert by_ids.tokens == greedy.tokens and len(greedy.tokens[0]) == 24
    assert greedy.text == [tok.decode(greedy.tokens[0])]
    assert greedy.finish_reasons == ["length"]
    # One batch of a string, a chat and ids: each as it is alone.
    batch = chat_model.generate(["Hello world", CHAT, [5, 6, 7]], 6, ignore_eos=True)
    assert batch.tokens[1] == greedy.tokens[0][:6]
    assert batch.tokens[0] == chat_model.generate("Hello world", 6, ignore_eos=True).tokens[0]
    assert batch.tokens[0] == chat_model.generate(tok.encode("Hello world"), 6,
                                                  ignore_eos=True).tokens[0]
    assert batch.tokens[2] == chat_model.generate([[5, 6, 7]], 6, ignore_eos=True).tokens[0]
    assert batch.steps > 0 and batch.seconds > 0 and batch.decode_tokens > 0


def test_generate_stops_at_an_eos_id(chat_model, greedy, monkeypatch):
    tokens = greedy.tokens[0]
    k = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    monkeypatch.setattr(chat_model, "eos_token_ids", (tokens[k],))
    out = chat_model.generate(CHAT, 24)
    # The ids end with the EOS id; the text leaves it out.
    assert out.tokens[0] == tokens[:k + 1] and out.finish_reasons == ["stop"]
    assert out.text[0] == chat_model.tokenizer.decode(tokens[:k])
    assert chat_model.generate(CHAT, 24, ignore_eos=True).tokens == greedy.tokens


def test_generate_stops_at_a_stop_string(chat_model, greedy):
    text = greedy.text[0]
    stop = stop_string(text)
    out = chat_model.generate(CHAT, 24, ignore_eos=True, stop=["never seen", stop])
    assert out.finish_reasons == ["stop"]
    assert out.text[0] == text[:text.find(stop)]
    # The ids go up to the one that completed the stop string.
    n = len(out.tokens[0])
    assert out.tokens[0] == greedy.tokens[0][:n]
    assert stop in chat_model.tokenizer.decode(greedy.tokens[0][:n])
    assert stop not in chat_model.tokenizer.decode(greedy.tokens[0][:n - 1])


def test_streamed_text_holds_back_a_possible_stop(chat_model, greedy):
    text = greedy.text[0]
    stop = text[-4:] + "#"  # starts like the end, but never completes
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=64)
    handle = engine.submit(greedy_prompt(chat_model), max_new_tokens=24, ignore_eos=True,
                           stop=[stop])
    pieces = [output.text for output in handle.outputs()]
    assert "".join(pieces) == text == handle.result().text
    assert handle.result().finish_reason == "length"
    # The last 4 characters came only with the last output.
    assert "".join(pieces[:-1]) == text[:len("".join(pieces[:-1]))]
    assert len("".join(pieces[:-1])) <= len(text) - 4


def stop_string(text: str) -> str:
    """Two characters of `text` (a random model's: bytes that often make no
    character) after its start, without U+FFFD."""
    i = next(i for i in range(2, len(text) - 1) if "\ufffd" not in text[i:i + 2])
    return text[i:i + 2]


def greedy_prompt(model):
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)


def test_stop_checker():
    check = StopChecker(["END", "xy"])
    assert check.feed("abc E") == ("abc ", False)  # "E" may begin END
    assert check.feed("N") == ("", False)
    assert check.feed("Dzz") == ("", True)        # stopped: the rest is dropped
    check = StopChecker(["xy"])
    assert check.feed("ax") == ("a", False)
    assert check.feed("z", final=True) == ("xz", False)
    # The earliest of several stops wins, across pieces.
    check = StopChecker(["cd", "bc"])
    assert check.feed("xab") == ("xa", False) and check.feed("cd") == ("", True)
    check = StopChecker(["bc", "abcd"])
    assert check.feed("a") == ("", False) and check.feed("bcd") == ("", True)
    assert StopChecker([]).feed("anything") == ("anything", False)


def test_more_requests_than_slots_queue_and_all_finish(chat_model):
    prompts = [[3 + i, 40 + i, 7] for i in range(7)]
    want = chat_model.generate(prompts, 5, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=32)
    handles = [engine.submit(p, max_new_tokens=5, ignore_eos=True) for p in prompts]
    assert engine.num_waiting == 7
    peak = 0
    while engine.step():
        peak = max(peak, engine.num_running)
        assert engine.slots_in_use == engine.num_running <= 2
    assert peak == 2 and engine.slots_in_use == 0
    assert [h.result().token_ids for h in handles] == want
    assert all(h.result().finish_reason == "length" for h in handles)


def test_chunked_prefill_mixes_with_decoding_under_the_budget(chat_model):
    long = list(range(10, 31))  # 21 tokens: 6 steps of at most 4
    want = chat_model.generate([[9], long], 6, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=40, max_step_tokens=4)
    handles = [engine.submit([9], max_new_tokens=6, ignore_eos=True),
               engine.submit(long, max_new_tokens=6, ignore_eos=True)]
    engine.run()
    assert [h.result().token_ids for h in handles] == want
    assert max(step.tokens for step in engine.steps) == 4
    # The short request decoded while the long one was still prefilling.
    assert any(step.requests == 2 and not step.decode_only for step in engine.steps)
    first = [h.result().first_token_time for h in handles]
    assert first[0] < first[1]


def test_cancel_frees_the_slot_for_a_waiting_request(chat_model):
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=64)
    long = engine.submit([5, 6], max_new_tokens=50, ignore_eos=True)
    waiting = engine.submit([7], max_new_tokens=3, ignore_eos=True)
    for _ in range(4):
        engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1
    long.cancel()
    engine.run()
    assert long.result().finish_reason == "abort" and len(long.result().token_ids) == 4
    assert waiting.result().finish_reason == "length" and engine.slots_in_use == 0
    # Cancelling a request still waiting, and one already finished.
    queued = [engine.submit([5], max_new_tokens=2), engine.submit([6], max_new_tokens=2)]
    queued[1].cancel()
    waiting.cancel()
    engine.run()
    assert [q.result().finish_reason for q in queued] == ["length", "abort"]
    assert queued[1].result().token_ids == []


def test_engine_thread_serves_submitters_from_several_threads(chat_model):
    prompts = [[11 + i, 12] for i in range(6)]
    want = chat_model.generate(prompts, 4, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=3, max_model_len=16)
    engine.start()
    results = [None] * len(prompts)

    def client(i):
        handle = engine.submit(prompts[i], max_new_tokens=4, ignore_eos=True)
        results[i] = [o.token_ids[0] for o in handle.outputs(timeout=60) if o.token_ids]

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        engine.shutdown()
    assert results == want
    assert not engine.running and engine.slots_in_use == 0


def test_a_failing_step_fails_its_requests_not_the_engine(chat_model, monkeypatch):
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=16)
    real = chat_model.step
    monkeypatch.setattr(chat_model, "step", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("boom")))
    broken = engine.submit([5], max_new_tokens=2)
    engine.run()
    assert broken.result().finish_reason == "error" and "boom" in broken.result().error
    monkeypatch.setattr(chat_model, "step", real)
    assert engine.submit([5], max_new_tokens=2).result().finish_reason == "length"
    assert engine.slots_in_use == 0
    monkeypatch.setattr(chat_model, "step", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="a step failed: RuntimeError: boom"):
        chat_model.generate([5], 2)


def test_request_errors_name_the_parameter(chat_model, monkeypatch):
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=16)
    cases = [(dict(prompt_ids=[1] * 16), "prompt", "leaving no room"),
             (dict(prompt_ids=[]), "prompt", "non-empty"),
             (dict(prompt_ids=[1, 320]), "prompt", r"position 1: 320 is not a token id"),
             (dict(prompt_ids=[1] * 10, max_new_tokens=7), "max_new_tokens", "16"),
             (dict(prompt_ids=[1], max_new_tokens=0), "max_new_tokens", "positive"),
             (dict(prompt_ids=[1], stop=[3]), "stop", "strings")]
    for arguments, param, message in cases:
        with pytest.raises(RequestError, match=message) as error:
            engine.submit(**arguments)
        assert error.value.param == param
    with pytest.raises(ValueError, match="max_model_len=65 is longer"):
        Engine(chat_model, max_model_len=65)
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        Engine(chat_model, max_num_seqs=0)
    with pytest.raises(ValueError, match="prompt 1 must be a string, a chat"):
        chat_model.generate(["hi", 3.5], 2)
    monkeypatch.setattr(chat_model, "tokenizer", None)
    with pytest.raises(ValueError, match="prompt 0 is text, but .* has no tokenizer"):
        chat_model.generate("hi", 2)


# -- the paged KV cache (chat_model's: blocks of 16) ---------------------------

SYSTEM = [1] + list(range(40, 80))  # 41 tokens: 2 full blocks, reusable


def test_prefix_reuse_gives_the_tokens_of_no_reuse(chat_model):
    questions = [[200, 201, 202], [210, 211], [220, 221, 222, 223, 224]]
    prompts = [SYSTEM + q for q in questions]
    # No reuse: each prompt alone on a fresh pool of its own.
    alone = []
    for prompt in prompts:
        engine = Engine(chat_model, max_num_seqs=1, max_model_len=64, kv_cache_tokens=64)
        alone.append(engine.submit(prompt, max_new_tokens=8, ignore_eos=True,
                                   return_logits=True).result())
        assert alone[-1].cached_tokens == 0 and engine.stats.cached_tokens == 0
    # Reuse: the first computes the system prompt, the others reuse its
    # two full blocks and prefill only the rest.
    engine = Engine(chat_model, max_num_seqs=3, max_model_len=64, kv_cache_tokens=192)
    first = engine.submit(prompts[0], max_new_tokens=8, ignore_eos=True, return_logits=True)
    engine.run()
    handles = [engine.submit(p, max_new_tokens=8, ignore_eos=True, return_logits=True)
               for p in prompts[1:]]
    engine.run()
    reused = [first.result()] + [h.result() for h in handles]
    assert [r.cached_tokens for r in reused] == [0, 32, 32]
    assert engine.stats.cached_tokens == 64 and engine.stats.prompt_tokens == \
        sum(map(len, prompts))
    # The steps after the first request prefilled only the uncached rest.
    assert sum(step.tokens for step in engine.steps) == \
        sum(map(len, prompts)) - 64 + 3 * (8 - 1)
    for got, want in zip(reused, alone):
        assert got.token_ids == want.token_ids
        np.testing.assert_allclose(got.logits, want.logits, rtol=1e-5, atol=1e-5)


def test_generate_reports_cached_prompt_tokens(chat_model):
    prompt = [1] + list(range(100, 140))
    # Two prompts each time: the model's pool keeps its size (it grows, and
    # drops what it cached, only for a larger request).
    cold = chat_model.generate([prompt, [5]], 4, ignore_eos=True)
    warm = chat_model.generate([prompt, prompt[:20] + [7]], 4, ignore_eos=True)
    assert cold.cached_tokens == [0, 0]   # nothing ran these ids before
    assert warm.cached_tokens == [32, 16] and warm.tokens[0] == cold.tokens[0]


def test_a_pool_too_small_for_all_requests_evicts_and_preempts(chat_model):
    """Six requests of up to 3 blocks each (two sharing a 2-block prefix)
    on a pool of 5 blocks: admission waits for blocks, decoding requests
    preempt the most recent one (recomputed later, its full blocks reused
    when still cached), cached blocks are evicted for new ones; every
    request finishes with the tokens it gets alone."""
    prompts = [SYSTEM[:20], SYSTEM[:33] + [9], list(range(150, 172)), SYSTEM[:33] + [8, 7],
               list(range(180, 200)), [5, 6, 7]]
    want = [chat_model.generate([p], 14, ignore_eos=True).tokens[0] for p in prompts]
    engine = Engine(chat_model, max_num_seqs=4, max_model_len=64, kv_cache_tokens=80)
    handles = [engine.submit(p, max_new_tokens=14, ignore_eos=True) for p in prompts]
    manager = engine.cache.manager
    while engine.step():
        manager.check()
        assert manager.used_blocks <= 5
    results = [h.result() for h in handles]
    assert [r.token_ids for r in results] == want
    assert all(r.finish_reason == "length" for r in results)
    assert engine.stats.preemptions > 0 and engine.stats.evictions > 0
    assert sum(r.preemptions for r in results) == engine.stats.preemptions
    assert engine.slots_in_use == 0 and manager.used_blocks == 0


def test_a_prompt_that_can_never_fit_is_refused(chat_model):
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=64, kv_cache_tokens=32)
    with pytest.raises(RequestError, match=r"the prompt has 40 tokens, more than the whole KV "
                                           r"cache holds \(32 positions\): it can never run") \
            as error:
        engine.submit([1] * 40, max_new_tokens=2)
    assert error.value.param == "prompt"
    with pytest.raises(RequestError, match=r"30 tokens and max_new_tokens is 10: 39 positions "
                                           r"to cache, more than the whole KV cache") as error:
        engine.submit([1] * 30, max_new_tokens=10)
    assert error.value.param == "max_new_tokens"
    assert engine.submit([1] * 30, max_new_tokens=3).result().finish_reason == "length"
