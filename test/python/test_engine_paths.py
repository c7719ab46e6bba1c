"""etc.models.engine on the paths the other engine tests do not take: a
shutdown with requests running and queued, an error the engine's thread
catches outside a step, two engines on one pool, preempted requests that
sample or keep their logits, a cancel in the middle of a chunked prefill, a
failing output callback, and stop strings across tokens and multi-byte
characters. One tiny model (conftest's `chat_model`)."""

import logging
import threading
import time

import numpy as np
import pytest

from etc.models.engine import Engine
from etc.models.step.sampling import SamplingParams

#: How long a test waits for something that happens at once unless the
#: code under test is broken (a hang guard, not a time bound).
HANG = 60


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


# -- shutting down -----------------------------------------------------------


def test_shutdown_ends_the_running_and_the_queued_requests(chat_model, monkeypatch):
    """shutdown() while a step runs: that step completes, then the request
    running, the one waiting for a slot and the one submitted during the
    step all end with "abort" and the error "the engine shut down", each
    with a last output; nothing stays held, and the engine starts again."""
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=32, kv_cache_tokens=64)
    real = chat_model.step
    in_step, go_on = threading.Event(), threading.Event()

    def step(*args, **options):
        in_step.set()
        assert go_on.wait(HANG), "the test never let the step finish"
        return real(*args, **options)

    monkeypatch.setattr(chat_model, "step", step)
    engine.start()
    running = engine.submit([5, 6], max_new_tokens=20, ignore_eos=True)
    queued = engine.submit([7], max_new_tokens=20, ignore_eos=True)
    outputs = []
    reader = threading.Thread(target=lambda: outputs.extend(queued.outputs(timeout=HANG)))
    reader.start()
    assert in_step.wait(HANG)
    late = engine.submit([8], max_new_tokens=20, ignore_eos=True)  # during the step
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    wait_for(lambda: engine._stopping, "shutdown asked the thread to stop")
    go_on.set()
    stopper.join(HANG)
    reader.join(HANG)
    assert not stopper.is_alive() and not reader.is_alive() and not engine.running
    for handle, tokens in ((running, 1), (queued, 0), (late, 0)):
        assert handle.finished
        result = handle.result(timeout=HANG)
        assert (result.finish_reason, result.error) == ("abort", "the engine shut down")
        assert len(result.token_ids) == tokens
    assert [(o.finish_reason, o.error) for o in outputs] == [("abort", "the engine shut down")]
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0 and not engine.has_work
    # Started again, it serves.
    monkeypatch.setattr(chat_model, "step", real)
    engine.start()
    try:
        again = engine.submit([5, 6], max_new_tokens=4, ignore_eos=True).result(timeout=HANG)
    finally:
        engine.shutdown()
    assert again.token_ids == chat_model.generate([[5, 6]], 4, ignore_eos=True).tokens[0]


def test_shutdown_without_a_thread_ends_what_was_submitted(chat_model):
    """An engine stepped by its caller: shutdown() ends the requests
    running and queued all the same."""
    engine = Engine(chat_model, max_num_seqs=1, max_model_len=32, kv_cache_tokens=64)
    handles = [engine.submit([5 + i], max_new_tokens=8, ignore_eos=True) for i in range(3)]
    engine.step()
    engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 2
    engine.shutdown()
    assert all(h.finished for h in handles)
    results = [h.result(timeout=HANG) for h in handles]
    assert [r.finish_reason for r in results] == ["abort"] * 3
    assert [len(r.token_ids) for r in results] == [2, 0, 0]
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0 and not engine.has_work


# -- the engine's thread when something raises outside a step -------------------


def _fails_once(real, message: str):
    """`real`, raising RuntimeError(message) on its first call after
    `.arm()`."""
    armed = threading.Event()

    def call(*args):
        if armed.is_set():
            armed.clear()
            raise RuntimeError(message)
        return real(*args)
    call.arm = armed.set
    return call


def _two_decoding(engine) -> list:
    """Starts `engine` and two requests of 20 tokens; returns their handles
    once both are decoding."""
    seen = threading.Semaphore(0)
    engine.start()
    handles = [engine.submit([5 + i, 6], max_new_tokens=20, ignore_eos=True,
                             on_output=lambda output: seen.release()) for i in range(2)]
    for _ in range(4):
        assert seen.acquire(timeout=HANG)
    return handles


def test_an_error_outside_the_step_fails_the_running_requests_not_the_thread(
        chat_model, monkeypatch):
    """The KV cache raising while the engine's thread schedules a step (a
    fault in the engine's own code, not a step's): the requests running
    end with "error" naming it, the thread goes on, and the next request
    gets its tokens."""
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=32, kv_cache_tokens=64)
    reserve = _fails_once(engine.cache.reserve, "the pool is inconsistent")
    monkeypatch.setattr(engine.cache, "reserve", reserve)
    try:
        handles = _two_decoding(engine)
        reserve.arm()
        results = [h.result(timeout=HANG) for h in handles]
        assert [r.finish_reason for r in results] == ["error", "error"]
        assert all(r.error == "RuntimeError: the pool is inconsistent" for r in results)
        assert engine.running
        after = engine.submit([9, 10], max_new_tokens=5, ignore_eos=True).result(timeout=HANG)
    finally:
        engine.shutdown()
    assert after.finish_reason == "length"
    assert after.token_ids == chat_model.generate([[9, 10]], 5, ignore_eos=True).tokens[0]
    engine.cache.manager.check()
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0


def test_an_error_path_that_fails_too_still_ends_the_requests(chat_model, monkeypatch):
    """The KV cache raising when the thread schedules a step and again when
    its error path releases the first request's slot: both requests still
    end with "error" (the slot that could not be released is given up),
    and the thread goes on serving."""
    engine = Engine(chat_model, max_num_seqs=3, max_model_len=32, kv_cache_tokens=96)
    reserve = _fails_once(engine.cache.reserve, "reserve failed")
    release = _fails_once(engine.cache.release, "release failed")
    monkeypatch.setattr(engine.cache, "reserve", reserve)
    monkeypatch.setattr(engine.cache, "release", release)
    try:
        handles = _two_decoding(engine)
        release.arm()
        reserve.arm()
        results = [h.result(timeout=HANG) for h in handles]
        assert [(r.finish_reason, r.error) for r in results] == \
            [("error", "RuntimeError: reserve failed")] * 2
        assert engine.running
        after = engine.submit([9, 10], max_new_tokens=5, ignore_eos=True).result(timeout=HANG)
    finally:
        engine.shutdown()
    assert after.token_ids == chat_model.generate([[9, 10]], 5, ignore_eos=True).tokens[0]
    assert engine.slots_in_use == 1  # the one whose release failed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_thread_is_not_running(chat_model):
    """An engine whose thread died (an output callback called sys.exit: a
    BaseException, which nothing catches) says it is not running, so that
    the server's /health says 503 and a handle's result() runs the steps
    in its caller's thread; start() starts a new thread."""
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=32, kv_cache_tokens=64)
    engine.start()

    left = []

    def leave(output):
        if not left:
            left.append(output)
            raise SystemExit(3)

    first = engine.submit([5], max_new_tokens=3, ignore_eos=True, on_output=leave)
    thread = engine._thread
    thread.join(HANG)
    assert not thread.is_alive()
    assert not engine.running
    want = chat_model.generate([[7, 8]], 3, ignore_eos=True).tokens[0]
    stepped = engine.submit([7, 8], max_new_tokens=3, ignore_eos=True)
    assert stepped.result(timeout=HANG).token_ids == want
    assert first.result(timeout=HANG).finish_reason == "length"
    engine.start()
    try:
        assert engine.running
        result = engine.submit([7, 8], max_new_tokens=3, ignore_eos=True).result(timeout=HANG)
    finally:
        engine.shutdown()
    assert result.token_ids == want


# -- two engines on one pool ---------------------------------------------------------


def test_two_engines_take_turns_on_a_pool_too_small_for_both(chat_model, monkeypatch):
    """Two engines on the model's pool of 4 blocks, stepped in turn, each
    with a request that needs 3 or 4 blocks: one waits for the other's
    blocks, or preempts its own request, and both get the tokens they get
    alone, the pool never over-committed."""
    prompts = [list(range(10, 30)), list(range(40, 58))]  # 20 + 30 and 18 + 22 tokens
    new = [30, 22]
    want = [chat_model.generate([p], n, ignore_eos=True).tokens[0]
            for p, n in zip(prompts, new)]
    monkeypatch.setattr(chat_model, "kv_cache_blocks", 4)
    monkeypatch.setattr(chat_model, "_paged_cache", None)
    engines = [Engine(chat_model, max_num_seqs=2, max_model_len=64) for _ in range(2)]
    assert engines[0].cache.cache is engines[1].cache.cache is chat_model.paged_cache()
    manager = engines[0].cache.manager
    handles = [e.submit(p, max_new_tokens=n, ignore_eos=True)
               for e, p, n in zip(engines, prompts, new)]
    starved = 0
    for _ in range(1000):
        busy = [e.step() for e in engines]
        manager.check()
        assert manager.used_blocks <= 4
        starved += sum(e.has_work and not e.num_running for e in engines)
        if not any(busy):
            break
    results = [h.result(timeout=HANG) for h in handles]
    assert [r.token_ids for r in results] == want
    assert [r.finish_reason for r in results] == ["length", "length"]
    # The pool was short: a request waited for the other engine's blocks
    # or gave its own up.
    assert starved > 0 or sum(e.stats.preemptions for e in engines) > 0
    assert manager.used_blocks == 0


def test_two_engine_threads_share_the_pool_and_its_prefixes(chat_model):
    """Two engines on the model's shared pool, each in its own thread,
    serving requests submitted at once: every request gets its tokens, a
    prefix one engine computed is reused by the other, and no block stays
    held."""
    system = [1] + list(range(60, 100))  # 41 tokens: 2 full blocks
    prompts = [system + [200 + i] for i in range(4)] + [[5 + i, 6] for i in range(4)]
    # The tokens without reuse: on a pool of their own, so that the model's
    # pool caches nothing of them.
    alone = Engine(chat_model, max_num_seqs=8, max_model_len=64, kv_cache_tokens=8 * 64)
    handles = [alone.submit(p, max_new_tokens=6, ignore_eos=True) for p in prompts]
    want = [h.result(timeout=HANG).token_ids for h in handles]
    engines = [Engine(chat_model, max_num_seqs=4, max_model_len=64) for _ in range(2)]
    assert engines[0].cache.cache is engines[1].cache.cache
    for engine in engines:
        engine.start()
    try:
        first = engines[0].submit(system + [250], max_new_tokens=2, ignore_eos=True)
        assert first.result(timeout=HANG).finish_reason == "length"
        handles = [engines[i % 2].submit(p, max_new_tokens=6, ignore_eos=True)
                   for i, p in enumerate(prompts)]
        results = [h.result(timeout=HANG) for h in handles]
    finally:
        for engine in engines:
            engine.shutdown()
    assert [r.token_ids for r in results] == want
    # The system prompt engine 0 computed: reused by engine 1's requests.
    assert results[1].cached_tokens == results[3].cached_tokens == 32
    engines[0].cache.manager.check()
    assert engines[0].blocks_in_use == 0


# -- preemption of requests that sample or keep their logits ------------------------


def test_preempted_sampled_and_logits_requests_equal_a_run_without(chat_model):
    """Three requests on a pool of 3 blocks, each growing to 2: the newer
    ones are preempted and recomputed. A seeded sampled request (with
    top-k, top-p, min-p) gets the tokens it draws alone, and a request
    keeping its logits gets the logits of a run that was never preempted."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    options = [dict(return_logits=True),
               dict(sampling=SamplingParams(1.3, top_k=40, top_p=0.95, seed=7),
                    return_logits=True),
               dict(sampling=SamplingParams(0.9, min_p=0.05, seed=8))]
    alone = []
    for prompt, option in zip(prompts, options):
        engine = Engine(chat_model, max_num_seqs=1, max_model_len=64, kv_cache_tokens=64)
        alone.append(engine.submit(prompt, max_new_tokens=24, ignore_eos=True,
                                   **option).result(timeout=HANG))
        assert alone[-1].preemptions == 0
    engine = Engine(chat_model, max_num_seqs=3, max_model_len=64, kv_cache_tokens=48)
    handles = [engine.submit(p, max_new_tokens=24, ignore_eos=True, **option)
               for p, option in zip(prompts, options)]
    engine.run()
    results = [h.result(timeout=HANG) for h in handles]
    assert [r.preemptions > 0 for r in results] == [False, True, True]
    for got, want in zip(results, alone):
        assert got.finish_reason == "length" and got.token_ids == want.token_ids
        if want.logits is None:
            assert got.logits is None
        else:
            assert got.logits.shape == want.logits.shape == (24, 320)
            np.testing.assert_allclose(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    # The sampled requests did not follow the argmax.
    assert results[1].token_ids != [int(np.argmax(row)) for row in results[1].logits]


# -- cancelling a request whose prompt is still being prefilled -------------------


def test_cancel_during_a_chunked_prefill(chat_model):
    """A 41-token prompt prefilled 8 tokens a step, cancelled after 3 steps
    (one full block computed): it ends with "abort" and no tokens, its
    blocks are released, the block it completed stays cached; a request
    that was waiting to reuse its prefix computes the rest itself, and both
    it and a later request with the same prompt get the tokens of a run
    without the cancel."""
    prompt = [1] + list(range(140, 180))
    other = prompt[:40] + [7, 8]  # the same first 2 blocks and more
    want = chat_model.generate([prompt, other], 5, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=64, max_step_tokens=8,
                    kv_cache_tokens=128)
    cancelled = engine.submit(prompt, max_new_tokens=5, ignore_eos=True)
    waiting = engine.submit(other, max_new_tokens=5, ignore_eos=True)
    for _ in range(3):
        engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1  # `other` waits for the prefix
    assert engine.blocks_in_use == 3 and sum(s.tokens for s in engine.steps) == 24
    cancelled.cancel()
    engine.run()
    result = cancelled.result(timeout=HANG)
    assert (result.finish_reason, result.token_ids, result.first_token_time) == \
        ("abort", [], None)
    waited = waiting.result(timeout=HANG)
    assert waited.token_ids == want[1] and waited.cached_tokens == 16
    again = engine.submit(prompt, max_new_tokens=5, ignore_eos=True).result(timeout=HANG)
    assert again.token_ids == want[0] and again.cached_tokens == 32
    engine.cache.manager.check()
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0


# -- output callbacks and observers that fail -------------------------------------


def test_a_failing_output_callback_harms_nothing(chat_model, caplog):
    """An on_output callback that raises at every output (a consumer gone)
    and an on_finish observer that raises: both are logged, and every
    request still runs to its end with its tokens, its result and its
    outputs tried."""
    prompts = [[5, 6], [7, 8]]
    want = chat_model.generate(prompts, 6, ignore_eos=True).tokens
    engine = Engine(chat_model, max_num_seqs=2, max_model_len=32, kv_cache_tokens=64)
    tried = []

    def gone(output):
        tried.append(output)
        raise RuntimeError("the consumer is gone")

    def observer(result):
        raise ValueError("the metrics are broken")

    engine.on_finish = observer
    with caplog.at_level(logging.ERROR, logger="etc.engine"):
        broken = engine.submit(prompts[0], max_new_tokens=6, ignore_eos=True, on_output=gone)
        fine = engine.submit(prompts[1], max_new_tokens=6, ignore_eos=True)
        engine.run()
    results = [broken.result(timeout=HANG), fine.result(timeout=HANG)]
    assert [r.token_ids for r in results] == want
    assert [r.finish_reason for r in results] == ["length"] * 2
    assert [o.token_ids for o in tried] == [[t] for t in want[0]]
    assert tried[-1].finish_reason == "length"
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("request 0: its output callback failed") == 6
    assert messages.count("request 0: on_finish failed") == 1
    assert messages.count("request 1: on_finish failed") == 1
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0


# -- stop strings across tokens and multi-byte characters ------------------------

#: Byte-level BPE splits these characters' bytes over several tokens of
#: chat_model's tokenizer ("ï" over 2, "日" over 3, "😀" over 4).
TEXT = "Hello naïve 日本 😀 ok"


@pytest.fixture
def scripted(chat_model, monkeypatch):
    """chat_model whose steps generate the ids of TEXT, then id 5 again and
    again (a scripted model: what the engine and its detokenizer do with
    the ids is what is tested)."""
    ids = chat_model.tokenizer.encode(TEXT, add_special_tokens=False)
    prompt = [3, 4]

    def step(cache, requests, return_logits=False):
        new = [r.start + len(r.tokens) - len(prompt) for r in requests]
        return None, np.array([ids[n] if n < len(ids) else 5 for n in new], np.int32)

    monkeypatch.setattr(chat_model, "step", step)
    return chat_model, prompt, ids


@pytest.mark.parametrize("stop", [["lo n"], ["aï"], ["ï"], ["😀"], ["本 😀"], ["日X", "e 日"],
                                  ["ok", "😀 o"], ["\ufffd"]],
                         ids=["ascii", "i-diaeresis", "2-byte", "4-byte", "3-and-4-byte",
                              "earliest", "overlapping", "replacement-char"])
def test_stop_strings_across_tokens_and_multibyte_characters(scripted, stop):
    """Stop strings that begin in one token and end in another, inside and
    across characters whose UTF-8 bytes are split over tokens: the text
    ends just before the first stop string, the ids with the one that
    completed it, and the streamed pieces are whole characters that add up
    to the text."""
    model, prompt, ids = scripted
    tok = model.tokenizer
    engine = Engine(model, max_num_seqs=1, max_model_len=64, kv_cache_tokens=64)
    handle = engine.submit(prompt, max_new_tokens=len(ids) + 4, ignore_eos=True, stop=stop)
    pieces = [o.text for o in handle.outputs(timeout=HANG)]
    result = handle.result(timeout=HANG)
    found = [TEXT.find(s) for s in stop if s in TEXT]
    if not found:
        # Never completed: the whole text, held back no longer than the end.
        assert result.finish_reason == "length"
        assert result.text == tok.decode(ids + [5] * 4) and result.text.startswith(TEXT)
    else:
        end = min(found)
        n = next(n for n in range(1, len(ids) + 1) if any(s in tok.decode(ids[:n]) for s in stop))
        assert (result.finish_reason, result.text, result.token_ids) == \
            ("stop", TEXT[:end], ids[:n])
    assert "".join(pieces) == result.text
    assert all("\ufffd" not in piece for piece in pieces)
