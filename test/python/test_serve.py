"""etc.serve: the OpenAI-compatible server, started here with uvicorn on a
free localhost port, driven by the real `openai` client (chat and text
completions, streamed and not, many at once) and by raw HTTP (httpx) for
the requests it must refuse. One tiny model (conftest's `chat_model`)."""

import asyncio
import json
import re
import threading
import time

import httpx
import numpy as np
import openai
import pytest

import etc.serve
from etc.models.engine import Engine
from test_engine import stop_string

NAME = "tiny-chat"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


def force_answer(model, monkeypatch, messages: list, text, eos: int, **template) -> list:
    """Makes `model` answer `messages` (rendered with the `template`
    variables) with `text`, then the id `eos`, whatever its logits say:
    each step's chosen ids replaced by the answer's next. `text` may be a
    list of pieces, each encoded apart (a marker written as several
    tokens). Returns the answer's ids."""
    tok = model.tokenizer
    prompt = len(tok.encode(tok.apply_chat_template(messages, **template),
                            add_special_tokens=False))
    pieces = [text] if isinstance(text, str) else text
    answer = [i for piece in pieces for i in tok.encode(piece, add_special_tokens=False)] + [eos]
    step = model.step

    def forced(cache, requests, *args, **options):
        logits, ids, *rest = step(cache, requests, *args, **options)
        ends = [r.start + len(r.tokens) - prompt for r in requests]
        forced_ids = np.array([answer[min(max(e, 0), len(answer) - 1)] for e in ends],
                              dtype=ids.dtype)
        return (logits, forced_ids, *rest)

    monkeypatch.setattr(model, "step", forced)
    return answer


class Server:
    """`etc.serve.Server` (uvicorn) serving `app` in a thread, on a port the
    OS picked."""

    def __init__(self, app):
        self.app = app
        self.socket = etc.serve.listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = etc.serve.Server(app, log_level="warning")
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs=dict(sockets=[self.socket]), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no server"
            time.sleep(0.02)

    @classmethod
    def of(cls, model, name: str = NAME, **options) -> "Server":
        """A server of `etc.serve.build_app(model, served_model_name=name,
        **options)`; a context manager that stops it."""
        return cls(etc.serve.build_app(model, served_model_name=name, **options))

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self, **options) -> openai.OpenAI:
        """The openai client of this server (no retries: a failure shows)."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0,
                             **options)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.socket.close()


@pytest.fixture(scope="module")
def server(chat_model):
    with Server.of(chat_model, max_num_seqs=8) as server:
        yield server
    assert not server.app.state.engine.running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def greedy(chat_model):
    return chat_model.generate(CHAT, 12, ignore_eos=True)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_chat_completion(client, greedy, chat_model):
    reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12,
                                           temperature=0, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == greedy.text[0]
    assert choice.finish_reason == "length" and reply.object == "chat.completion"
    prompt = chat_model.tokenizer.encode(chat_model.tokenizer.apply_chat_template(CHAT),
                                         add_special_tokens=False)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens,
            reply.usage.total_tokens) == (len(prompt), 12, len(prompt) + 12)


def test_chat_completion_streamed(client, greedy):
    stream = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy.text[0]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_stop_and_eos(client, greedy, chat_model, monkeypatch):
    text = greedy.text[0]
    stop = stop_string(text)
    reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12,
                                           temperature=0, stop=stop,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == text[:text.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    monkeypatch.setattr(chat_model, "eos_token_ids", (greedy.tokens[0][3],))
    stream = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=12,
                                            temperature=0, stream=True)
    chunks = list(stream)
    n = greedy.tokens[0].index(greedy.tokens[0][3])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        chat_model.tokenizer.decode(greedy.tokens[0][:n])
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions(client, chat_model):
    want = chat_model.generate("The quick brown", 8, ignore_eos=True)
    reply = client.completions.create(model=NAME, prompt="The quick brown", max_tokens=8,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert reply.choices[0].text == want.text[0] and reply.object == "text_completion"
    assert reply.usage.completion_tokens == 8
    ids = chat_model.tokenizer.encode("The quick brown")
    stream = client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == want.text[0]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_usage_reports_cached_prompt_tokens(client, chat_model):
    """A long system prompt sent twice: the second request's first two
    blocks (16 positions each) come from the cache, as `usage` says, and the
    reply is the same."""
    tok = chat_model.tokenizer
    words = "You answer in French, briefly, and never say more than asked. Be kind.".split()
    for n in range(1, len(words) + 1):  # a system prompt of more than 2 blocks
        system = " ".join(words[:n])
        chats = [[{"role": "system", "content": system}, {"role": "user", "content": question}]
                 for question in ("Hi!", "Bonjour?")]
        prompt = tok.encode(tok.apply_chat_template(chats[0]), add_special_tokens=False)
        if len(prompt) > 40:
            break
    assert 40 < len(prompt) < 58
    first, again, other = (client.chat.completions.create(
        model=NAME, messages=chat, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
        for chat in (chats[0], chats[0], chats[1]))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == (len(prompt) - 1) // 16 * 16 >= 32
    assert again.choices[0].message.content == first.choices[0].message.content
    # Another question after the same system prompt: its shared blocks.
    assert 16 <= other.usage.prompt_tokens_details.cached_tokens < len(prompt)
    stream = client.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    assert list(stream)[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_sampling_parameters(client):
    """temperature, top_p and seed reach the engine's on-device sampling: a
    seed reproduces its text, another seed gives another text."""
    texts = [client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=12, temperature=1.0, top_p=0.9, seed=seed,
        extra_body={"ignore_eos": True}).choices[0].message.content for seed in (1, 1, 2)]
    assert texts[0] == texts[1] != texts[2]


def test_200_requests_on_8_slots_all_finish(server, chat_model):
    engine = server.app.state.engine
    peak = []

    async def main():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none",
                                     max_retries=0, timeout=120)

        async def one(i):
            if i % 2:
                reply = await aclient.completions.create(
                    model=NAME, prompt=[3 + i % 50, 7, 9], max_tokens=3, temperature=0,
                    extra_body={"ignore_eos": True})
                return reply.choices[0].finish_reason, reply.usage.completion_tokens
            stream = await aclient.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=3,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
            return reasons[-1], len(reasons)

        async def watch():
            while True:
                peak.append((engine.num_running, engine.num_waiting, engine.slots_in_use))
                await asyncio.sleep(0.01)

        watcher = asyncio.ensure_future(watch())
        try:
            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            watcher.cancel()
            await aclient.close()

    results = asyncio.run(main())
    assert results == [("length", 3)] * 200
    assert max(r for r, _, _ in peak) == 8 and max(w for _, w, _ in peak) > 0
    assert all(s <= 8 for _, _, s in peak) and engine.slots_in_use == 0


def _wait(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_client_that_disconnects_frees_its_slot(server, chat_model, monkeypatch):
    engine = server.app.state.engine
    step, cancel = chat_model.step, engine.cancel
    hung_up, cancelled = threading.Event(), threading.Event()

    def noting_cancel(request_id):
        cancelled.set()
        cancel(request_id)

    def slow_step(*args, **options):
        # Slow enough to hang up mid-request; once the client has hung up,
        # no step runs until the server has cancelled the request, however
        # late a loaded machine lets it see the disconnect (the request must
        # end as "abort", not run to its length).
        time.sleep(0.05)
        if hung_up.is_set():
            assert cancelled.wait(timeout=60), "the server never cancelled the request"
        return step(*args, **options)

    monkeypatch.setattr(chat_model, "step", slow_step)
    monkeypatch.setattr(engine, "cancel", noting_cancel)
    body = {"model": NAME, "messages": CHAT, "max_tokens": 20, "temperature": 0,
            "ignore_eos": True}
    # Streamed: read two chunks and hang up.
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={**body, "stream": True}, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        _wait(lambda: engine.slots_in_use == 1)
        hung_up.set()
    _wait(lambda: engine.slots_in_use == 0)
    # Not streamed: the client gives up before the end.
    hung_up.clear()
    cancelled.clear()
    completion = {key: value for key, value in body.items() if key != "messages"}
    with pytest.raises(httpx.ReadTimeout):
        try:
            httpx.post(server.url + "/v1/completions",
                       json={**completion, "prompt": [5, 6], "max_tokens": 40}, timeout=0.3)
        finally:
            hung_up.set()
    _wait(lambda: engine.slots_in_use == 0)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'etc_requests_total{finish_reason="abort",model_name="tiny-chat"} 2.0' in metrics


def test_metrics(server, client):
    client.completions.create(model=NAME, prompt=[4, 5], max_tokens=3, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    label = '{model_name="tiny-chat"}'
    assert values["etc_time_to_first_token_seconds_count" + label] >= 1
    assert values["etc_time_per_output_token_seconds_count" + label] >= 1
    assert values["etc_kv_slots_total" + label] == 8
    for gauge in ("etc_num_requests_running", "etc_num_requests_waiting",
                  "etc_kv_slots_in_use"):
        assert values[gauge + label] == 0


BAD = [
    # (route, body, status, param)
    ("chat/completions", b'{"model": "tiny-chat", "messages": [', 400, None),
    ("chat/completions", {"model": NAME}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": []}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": "hi"}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "robot", "content": "x"}]},
     400, "messages[0].role"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": 5}]},
     400, "messages[0].content"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "max_tokens": "ten"}, 400,
     "max_tokens"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "max_tokens": 0}, 400,
     "max_tokens"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "temperature": 3}, 400,
     "temperature"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "temperature": "hot"}, 400,
     "temperature"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "stream": "yes"}, 400, "stream"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "stop": [1]}, 400, "stop"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "n": 0}, 400, "n"),
    ("chat/completions", {"model": "gpt-4", "messages": CHAT}, 404, "model"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "a " * 80}],
                          "temperature": 0}, 400, "messages"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "max_tokens": 60, "temperature": 0},
     400, "max_tokens"),
    ("completions", {"model": NAME, "prompt": [1, 2, 999], "temperature": 0}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": ""}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": 7}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": "x", "echo": True}, 400, "echo"),
    # Lone UTF-16 surrogates (legal JSON: half of an emoji's pair) are no text.
    ("completions", {"model": NAME, "prompt": "Hi \ud83d"}, 400, "prompt"),
    ("completions", {"model": NAME, "prompt": ["\ude00"]}, 400, "prompt[0]"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "\ud83d!"}]},
     400, "messages[0].content"),
    ("chat/completions", {"model": NAME, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a\udc00"}]}]}, 400,
     "messages[0].content[0].text"),
    ("chat/completions", {"model": NAME + "\ud800", "messages": CHAT}, 400, "model"),
    ("chat/completions", {"model": NAME, "messages": CHAT, "stop": ["\ud800"]}, 400,
     "stop[0]"),
]


@pytest.mark.parametrize("route, body, status, param", BAD,
                         ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_4xx_naming_the_field(server, route, body, status, param):
    url = f"{server.url}/v1/{route}"
    # JSON as clients send it: a lone surrogate escaped ("\\ud83d").
    text = body.decode() if isinstance(body, bytes) else json.dumps(body)
    response = httpx.post(url, content=text, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if re.search(r"\\ud[89a-f]", text):
        assert "is a lone UTF-16 surrogate" in error["message"]
    assert error["param"] == param and error["message"] and error["type"]
    if param:
        assert param.split("[")[0] in error["message"]


def test_unknown_routes_and_methods_are_4xx(server):
    assert httpx.get(server.url + "/v1/nothing").status_code == 404
    response = httpx.get(server.url + "/v1/chat/completions")
    assert response.status_code == 405 and "error" in response.json()
    assert httpx.get(server.url + "/health").status_code == 200


def test_lockstep_needs_a_tensor_parallel_model(chat_model):
    """The Leader and follow of `etc serve --tensor-parallel` (tested over
    MPI in test_tensor_parallel.py) refuse a model on one rank, saying why."""
    from etc.models.engine.lockstep import Leader, follow

    with pytest.raises(ValueError, match="needs a tensor-parallel model"):
        Leader(chat_model)
    with pytest.raises(ValueError, match="only the ranks other than 0 of a tensor-parallel"):
        follow(chat_model)
    assert not chat_model.led


def test_a_cache_smaller_than_the_model_length(chat_model):
    """A KV cache of 32 positions for a model of 64: /v1/models reports
    max_model_len 32, and a chat without max_tokens is served what the
    cache holds after its prompt."""
    engine = Engine(chat_model, max_num_seqs=2, kv_cache_tokens=32)
    server = Server(etc.serve.build_app(chat_model, served_model_name=NAME, engine=engine))
    try:
        models = httpx.get(server.url + "/v1/models").json()
        assert models["data"][0]["max_model_len"] == 32
        body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}],
                "temperature": 0, "ignore_eos": True}
        reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        assert usage["total_tokens"] == 32 and reply.json()["choices"][0]["finish_reason"] == \
            "length"
        too_long = httpx.post(server.url + "/v1/chat/completions",
                              json={**body, "max_tokens": 40}, timeout=60)
        assert too_long.status_code == 400
        assert too_long.json()["error"]["param"] == "max_tokens"
        assert "all the KV cache holds" in too_long.json()["error"]["message"]
    finally:
        server.stop()


def test_shutdown_ends_the_requests_in_flight(chat_model, monkeypatch):
    """The server stopping (what Ctrl-C and SIGTERM do) while a stream and a
    request not streamed run: the stream ends with an error event and
    [DONE], the other gets 503, and the server stops at once rather than
    after their 60 tokens."""
    step = chat_model.step

    def slow_step(*args, **options):  # 60 tokens take 3 s
        time.sleep(0.05)
        return step(*args, **options)

    monkeypatch.setattr(chat_model, "step", slow_step)
    server = Server(etc.serve.build_app(chat_model, served_model_name=NAME))
    engine = server.app.state.engine
    body = {"model": NAME, "prompt": [5, 6], "max_tokens": 60, "temperature": 0,
            "ignore_eos": True}
    plain = []
    thread = threading.Thread(target=lambda: plain.append(
        httpx.post(server.url + "/v1/completions", json=body, timeout=60)))
    try:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                          timeout=60) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines)[6:])["choices"][0]["text"] is not None
            thread.start()
            _wait(lambda: engine.num_running == 2)
            server.server.should_exit = True
            events = [line for line in lines if line]
    finally:
        thread.join(60)
        server.thread.join(60)
    assert not server.thread.is_alive() and not engine.running
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert error == {"message": "the server is shutting down", "type": "service_unavailable"}
    assert all("error" not in json.loads(e[6:]) for e in events[:-2])
    assert len(events) < 40  # it did not wait for the 60 tokens
    assert plain[0].status_code == 503
    assert plain[0].json()["error"]["message"] == "the server is shutting down"
    assert engine.slots_in_use == 0 and engine.blocks_in_use == 0
    server.socket.close()


def test_a_steps_outputs_reach_the_loop_in_one_wakeup(chat_model):
    # The engine's thread wakes the server's event loop once per step, not
    # once per request's output: every output put before the loop runs
    # goes in one callback, in order. (A step run here while the loop
    # waits, as the engine's thread runs one while the loop is busy.)
    from etc.serve.handoff import Handoff

    loop = asyncio.new_event_loop()
    try:
        handoff = Handoff(loop)
        engine = Engine(chat_model, max_num_seqs=4)
        queues = [asyncio.Queue() for _ in range(4)]
        for queue in queues:
            engine.submit(chat_model.tokenizer.encode("Hello there"), max_new_tokens=3,
                          ignore_eos=True,
                          on_output=lambda output, queue=queue: handoff.put(queue, output))
        seen = [[] for _ in queues]
        steps = 0
        while engine.step():
            steps += 1
            assert handoff.wakeups == steps  # the step's 4 outputs: one wake-up
            loop.run_until_complete(asyncio.sleep(0))  # the loop drains them
            for queue, outputs in zip(queues, seen):
                while not queue.empty():
                    outputs.append(queue.get_nowait())
        assert all(len(outputs) == 3 and outputs[-1].finished and
                   [o.num_tokens for o in outputs] == [1, 2, 3] for outputs in seen)
    finally:
        loop.close()
    # A closed loop takes nothing: the engine's callback raises (and logs),
    # and what was put is dropped rather than kept.
    with pytest.raises(RuntimeError):
        handoff.put(queues[0], "late")
    with pytest.raises(RuntimeError):
        handoff.put(queues[0], "later")


def test_the_server_wakes_its_loop_less_than_once_per_output(server, client):
    # The server hands its requests' outputs over through one Handoff per
    # loop: fewer wake-ups than outputs, the 4 choices' outputs of a step
    # coming together (one per output before).
    before = sum(h.wakeups for h in server.app.state.handoffs.values())
    stream = client.completions.create(model=NAME, prompt="Hello", max_tokens=6, n=4,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices) == 24
    handoffs = list(server.app.state.handoffs.values())
    assert len(handoffs) == 1  # the server's one loop
    assert 1 <= handoffs[0].wakeups - before < 24
