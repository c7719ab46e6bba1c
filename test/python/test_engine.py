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


def test_a_cache_smaller_than_the_model_length_bounds_the_requests(chat_model):
    """A pool of 32 positions for a model of 64: the engine serves
    sequences of 32 (its max_model_len says so), a request without
    max_new_tokens gets what the cache holds after its prompt, and one
    that asks for more is refused naming what to change."""
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=64, kv_cache_tokens=32)
    assert engine.max_model_len == 32 and engine.limited_by_cache
    result = engine.submit([5, 6, 7], ignore_eos=True).result()
    assert result.finish_reason == "length" and len(result.token_ids) == 29
    assert result.token_ids == chat_model.generate([[5, 6, 7]], 29, ignore_eos=True).tokens[0]
    with pytest.raises(RequestError, match=r"the prompt has 40 tokens, leaving no room for a "
                                           r"new token within the model length \(32: all the "
                                           r"KV cache holds; load the model with a larger "
                                           r"kv_cache_tokens or kv_cache_memory") as error:
        engine.submit([1] * 40, max_new_tokens=2)
    assert error.value.param == "prompt"
    with pytest.raises(RequestError, match=r"30 tokens and max_new_tokens is 10: 40 tokens, "
                                           r"more than the model length \(32: all the KV") \
            as error:
        engine.submit([1] * 30, max_new_tokens=10)
    assert error.value.param == "max_new_tokens"
    assert engine.submit([1] * 30, max_new_tokens=2).result().finish_reason == "length"
    # Without a max_model_len: the model's, lowered to the pool's.
    assert Engine(chat_model, kv_cache_tokens=20).max_model_len == 32  # two blocks of 16


# -- one request never harms another --------------------------------------------


def test_submit_checks_every_parameter(chat_model):
    """Every parameter is checked when submitted, naming it: nothing that
    would fail a step (and the requests beside it) is queued. What
    `generate` accepts, `submit` accepts too."""
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=16)
    cases = [(dict(sampling="greedy please"), "sampling", "must be an etc.models.step.sampling"
                                                          ".SamplingParams or None"),
             (dict(sampling={"temperature": 0.5}), "sampling", "SamplingParams"),
             (dict(ignore_eos="yes"), "ignore_eos", "True or False"),
             (dict(return_logits=1), "return_logits", "True or False"),
             (dict(eos_token_ids=2), "eos_token_ids", "list of token ids"),
             (dict(eos_token_ids=[2, "x"]), "eos_token_ids", "list of token ids"),
             (dict(on_output="print"), "on_output", "callable"),
             (dict(stop=5), "stop", "a string or a list of strings"),
             (dict(max_new_tokens=2.0), "max_new_tokens", "positive int"),
             (dict(prompt_ids=np.array([[5, 6]])), "prompt", "1-D"),
             (dict(prompt_ids=np.array([5.0, 6.0])), "prompt", "not a token id")]
    for arguments, param, message in cases:
        with pytest.raises(RequestError, match=message) as error:
            engine.submit(**{"prompt_ids": [5, 6], "max_new_tokens": 3, **arguments})
        assert error.value.param == param, arguments
    assert engine.num_waiting == 0 and not engine.has_work
    handle = engine.submit(np.array([5, 6], dtype=np.int64), max_new_tokens=np.int64(3),
                           stop=None, ignore_eos=np.bool_(True))
    assert handle.result().token_ids == \
        chat_model.generate(np.array([5, 6]), np.int64(3), ignore_eos=True, stop=None).tokens[0]
    with pytest.raises(RequestError, match="SamplingParams") as error:
        chat_model.generate("Hi", 3, sampling={"temperature": 0.5})
    assert error.value.param == "sampling"


def test_a_poisoned_request_fails_alone(chat_model, monkeypatch):
    """A step that raises because of one of its requests (here any step
    holding token 77, as a kernel fault would) ends that request with
    "error"; the requests beside it finish with the tokens they get
    without it."""
    prompts = [[5 + i, 6, 7] for i in range(5)]
    want = chat_model.generate(prompts, 6, ignore_eos=True).tokens
    real = chat_model.step

    def step(cache, requests, **options):
        if any(77 in request.tokens for request in requests):
            raise RuntimeError("poisoned")
        return real(cache, requests, **options)

    monkeypatch.setattr(chat_model, "step", step)
    engine = Engine(chat_model, max_num_seqs=6, max_model_len=16)
    handles = [engine.submit(p, max_new_tokens=6, ignore_eos=True) for p in prompts[:2]]
    poisoned = engine.submit([8, 77, 9], max_new_tokens=6, ignore_eos=True)
    handles += [engine.submit(p, max_new_tokens=6, ignore_eos=True) for p in prompts[2:]]
    engine.run()
    assert poisoned.result().finish_reason == "error"
    assert poisoned.result().error == "RuntimeError: poisoned"
    assert [h.result().token_ids for h in handles] == want
    assert all(h.result().finish_reason == "length" for h in handles)
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0


def test_generate_from_two_threads(chat_model, monkeypatch):
    """Two threads call generate at once: the first holds the model's pool
    (sized for it: 32 positions) while the second needs a longer sequence;
    the second runs on a pool of its own, and both get their tokens."""
    short, long = [[5, 6]], [list(range(10, 51))]  # 2 and 41 tokens
    want = [chat_model.generate(short, 20, ignore_eos=True).tokens,
            chat_model.generate(long, 10, ignore_eos=True).tokens]
    monkeypatch.setattr(chat_model, "_paged_cache", None)  # a pool sized by the first call
    real = chat_model.step
    first_running, second_done = threading.Event(), threading.Event()
    first = threading.current_thread()

    def step(cache, requests, **options):
        if threading.current_thread() is first and not first_running.is_set():
            first_running.set()
            assert second_done.wait(60), "the second call did not finish"
        return real(cache, requests, **options)

    monkeypatch.setattr(chat_model, "step", step)
    got = [None, None]

    def second():
        assert first_running.wait(60)
        try:
            got[1] = chat_model.generate(long, 10, ignore_eos=True).tokens
        finally:
            second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    try:
        got[0] = chat_model.generate(short, 20, ignore_eos=True).tokens
    finally:
        second_done.set()
        thread.join(60)
    assert got == want
    assert chat_model._paged_cache.tokens == 32  # the shared pool: the first call's


def test_generate_names_the_prompt_a_pool_refuses(chat_model, monkeypatch):
    """A pool sized at load (here 2 blocks) that cannot hold a prompt's
    sequence: the error names the prompt, its index in the batch."""
    monkeypatch.setattr(chat_model, "kv_cache_blocks", 2)
    monkeypatch.setattr(chat_model, "_paged_cache", None)
    with pytest.raises(RequestError, match=r"generate: prompt 1: the prompt has 40 tokens, "
                                           r"leaving no room .* all the KV cache holds") as error:
        chat_model.generate([[5], [6] * 40], 4)
    assert error.value.param == "prompt"
    with pytest.raises(RequestError, match=r"generate: prompt 0: the prompt has 20 tokens and "
                                           r"max_new_tokens is 20: 40 tokens") as error:
        chat_model.generate([[6] * 20, [5]], 20)
    assert error.value.param == "max_new_tokens"


def test_generate_edges(chat_model):
    """stop=None is no stop strings; a chat message whose content is None
    is empty; a lone UTF-16 surrogate (half an emoji) is refused, naming
    the prompt and message."""
    want = chat_model.generate("Hi", 3)
    assert chat_model.generate("Hi", 3, stop=None).tokens == want.tokens
    empty = chat_model.generate([[{"role": "user", "content": ""}]], 3)
    none = chat_model.generate([[{"role": "user", "content": None}]], 3)
    assert none.tokens == empty.tokens
    with pytest.raises(ValueError, match=r"generate: prompt 0: character 2 is a lone UTF-16 "
                                         r"surrogate \(U\+D83D\)"):
        chat_model.generate("Hi\ud83d", 3)
    with pytest.raises(ValueError, match=r"prompt 1, message 1's content: character 0 is a lone"):
        chat_model.generate(["Hi", [{"role": "system", "content": "x"},
                                    {"role": "user", "content": "\udc00!"}]], 3)


# -- scheduling ---------------------------------------------------------------------


def test_admission_is_fair_under_a_small_token_budget(chat_model):
    """8 requests on 8 slots with 4 tokens a step: the last four get their
    first token in the second step, not after the first four finish; each
    gets the tokens it gets alone."""
    prompts = [[5 + i] for i in range(8)]
    want = chat_model.generate(prompts, 10, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=8, max_model_len=32, max_step_tokens=4)
    step = [0]
    first, last = {}, {}

    def record(i):
        def on_output(output):
            if output.token_ids:
                first.setdefault(i, step[0])
            if output.finished:
                last[i] = step[0]
        return on_output

    handles = [engine.submit(p, max_new_tokens=10, ignore_eos=True, on_output=record(i))
               for i, p in enumerate(prompts)]
    while engine.step():
        step[0] += 1
    assert [first[i] for i in range(8)] == [0] * 4 + [1] * 4
    assert max(first.values()) < min(last.values())
    assert [h.result().token_ids for h in handles] == want
    assert max(s.tokens for s in engine.steps) == 4 and len(engine.steps) == 20


def test_many_one_token_prompts_take_about_the_fewest_steps(chat_model):
    """300 one-token prompts, 5 new tokens each, 256 tokens a step: 1,500
    tokens need at least 6 steps; no request waits for others to finish."""
    prompts = [[3 + i % 300] for i in range(300)]
    out = chat_model.generate(prompts, 5, ignore_eos=True)
    assert all(len(t) == 5 for t in out.tokens)
    assert out.steps <= 7
    assert out.tokens[299] == chat_model.generate([prompts[299]], 5, ignore_eos=True).tokens[0]


def test_identical_prefixes_submitted_together_are_computed_once(chat_model):
    """Four prompts sharing a 41-token prefix submitted together: the first
    computes its two full blocks, the others wait for them and reuse them
    (cached_tokens), and get the tokens of no reuse."""
    prefix = [1] + list(range(260, 300))
    prompts = [prefix + [200 + i, 201] for i in range(4)]
    alone = []
    for prompt in prompts:
        engine = Engine(chat_model, max_num_seqs=1, max_model_len=64, kv_cache_tokens=64)
        alone.append(engine.submit(prompt, max_new_tokens=4, ignore_eos=True).result())
    engine = Engine(chat_model, max_num_seqs=4, max_model_len=64, kv_cache_tokens=256)
    handles = [engine.submit(p, max_new_tokens=4, ignore_eos=True) for p in prompts]
    engine.run()
    results = [h.result() for h in handles]
    assert [r.cached_tokens for r in results] == [0, 32, 32, 32]
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]
    # The prefix was prefilled once: 43 tokens, then 11 for each other.
    assert sum(s.tokens for s in engine.steps) == 43 + 3 * 11 + 4 * 3


def test_outputs_after_the_end_and_with_a_callback(chat_model):
    """outputs() iterated again after the last output returns at once; on a
    request whose outputs go to on_output it raises, saying so."""
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=16)
    handle = engine.submit([5], max_new_tokens=3)
    assert len(list(handle.outputs(timeout=30))) == 3
    assert list(handle.outputs(timeout=30)) == []
    seen = []
    called = engine.submit([5], max_new_tokens=2, on_output=seen.append)
    with pytest.raises(RuntimeError, match="submitted with on_output"):
        next(called.outputs(timeout=30))
    assert called.result().finish_reason == "length" and len(seen) == 2
