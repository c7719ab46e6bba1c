"""etc.serve's request fields that test_serve.py does not reach, over HTTP on
localhost through the real `openai` client (and httpx where the client
would refuse to send it): max_completion_tokens, top_k and min_p, the
default temperature, stop lists and their limit, every refusal naming its
field (an image part saying ETC serves text), the developer role, content
as text parts, a prompt as [[ids]], a failed step (500, or an error event
in a stream) and /health's 503. One tiny model (conftest's `chat_model`)."""

import json

import httpx
import openai
import pytest

import etc.serve
from etc.serve.app import ENGINE_STOPPED, SHUTTING_DOWN
from etc.models.loading.tokenizer import Tokenizer
from etc.models.step.sampling import SamplingParams
from test_serve import CHAT, NAME, Server

#: A hang guard for requests that answer at once unless the code is broken.
HANG = 60


@pytest.fixture(scope="module")
def server(chat_model):
    with Server.of(chat_model, max_num_seqs=4) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=HANG)


def chat(client, **fields):
    """The text and the reply of a chat completion of CHAT (12 tokens,
    never stopping at EOS, unless `fields` say otherwise)."""
    extra = {"ignore_eos": True, **fields.pop("extra_body", {})}
    fields = {"messages": CHAT, "max_tokens": 12, **fields}
    reply = client.chat.completions.create(model=NAME, extra_body=extra, **fields)
    return reply.choices[0].message.content, reply


def generate(model, new_tokens=12, messages=CHAT, **sampling):
    """What the model generates offline: greedy, or with `sampling`."""
    params = SamplingParams(**sampling) if sampling else None
    return model.generate(messages, new_tokens, ignore_eos=True, sampling=params).text[0]


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{route}", json=body, timeout=HANG)


# -- fields that change what is generated ------------------------------------------


def test_max_completion_tokens(client, server, chat_model):
    """Chat's max_completion_tokens bounds the new tokens (with max_tokens
    only when both say the same); one too long is refused naming it."""
    text, reply = chat(client, max_tokens=None, max_completion_tokens=5, temperature=0)
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"
    assert text == generate(chat_model, 5)
    _, reply = chat(client, max_tokens=7, max_completion_tokens=7, temperature=0)
    assert reply.usage.completion_tokens == 7
    # Both, differing: which one the client meant is not guessed.
    response = post(server, "chat/completions", {"model": NAME, "messages": CHAT,
                                                 "max_tokens": 3, "max_completion_tokens": 7})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_completion_tokens"
    response = post(server, "chat/completions", {"model": NAME, "messages": CHAT,
                                                 "max_completion_tokens": 60})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_completion_tokens"
    assert error["message"].startswith("max_completion_tokens: the prompt has")


def test_top_k_and_min_p(client, chat_model):
    """top_k and min_p (extensions, in extra_body) reach the sampling: a
    seed gives the tokens generate draws with them, which differ from what
    the seed draws without; top_k=1 and min_p=1 keep only the argmax."""
    greedy = generate(chat_model)
    for field, value in (("top_k", 5), ("min_p", 0.5)):
        text, _ = chat(client, temperature=1.5, seed=11, extra_body={field: value})
        assert text == generate(chat_model, temperature=1.5, seed=11, **{field: value}), field
        assert text != generate(chat_model, temperature=1.5, seed=11), field
    for field, value in (("top_k", 1), ("min_p", 1.0)):
        text, _ = chat(client, temperature=2.0, seed=3, extra_body={field: value})
        assert text == greedy, field


def test_the_default_temperature_is_one(client, chat_model):
    """Without a temperature a request samples at 1, as OpenAI's API does
    (0 would be greedy)."""
    text, _ = chat(client, seed=5)
    assert text == generate(chat_model, temperature=1.0, seed=5)
    assert text != generate(chat_model)


def test_stop_lists_and_their_limit(client, server, chat_model):
    """Of several stop strings the one that comes first in the text ends
    it, wherever it is in the list; 16 strings are taken, 17 refused."""
    greedy = generate(chat_model)
    # Two characters of the text (after its first), by first occurrence.
    first_at = {}
    for i, character in enumerate(greedy[1:], start=1):
        if character != "\ufffd" and character.strip():
            first_at.setdefault(character, i)
    first, second = sorted(first_at, key=first_at.get)[:2]
    text, reply = chat(client, temperature=0, stop=[second, "never said", first])
    assert text == greedy[:first_at[first]] and reply.choices[0].finish_reason == "stop"
    text, _ = chat(client, temperature=0, stop=[f"no {i}" for i in range(15)] + [second])
    assert text == greedy[:first_at[second]]
    response = post(server, "chat/completions", {"model": NAME, "messages": CHAT,
                                                 "stop": [f"no {i}" for i in range(17)]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "stop"


# -- what a request may say, and how ---------------------------------------------------


def test_the_developer_role_is_the_system_role(client, chat_model):
    """A developer message (what OpenAI's newer models take for a system
    message) reaches the model as a system message when the chat template
    does not name the role."""
    developer = [{"role": "developer", "content": "Be brief."}, CHAT[1]]
    text, _ = chat(client, messages=developer, temperature=0)
    assert text == generate(chat_model)
    assert chat_model.generate(developer, 3).tokens == chat_model.generate(CHAT, 3).tokens
    # A template that names the role gets it as it is.
    template = ("{% for m in messages %}{% if m.role == 'developer' %}dev{% else %}"
                "{{ m.role }}{% endif %}:{{ m.content }};{% endfor %}")
    tokenizer = Tokenizer(chat_model.tokenizer.backend, chat_template=template)
    assert tokenizer.apply_chat_template(developer) == "dev:Be brief.;user:Hello!;"
    tokenizer = Tokenizer(chat_model.tokenizer.backend, chat_template=template.replace(
        "m.role == 'developer'", "false"))
    assert tokenizer.apply_chat_template(developer) == "system:Be brief.;user:Hello!;"


def test_content_as_text_parts(client, chat_model):
    """A message's content as a list of text parts is their text joined."""
    parts = [CHAT[0], {"role": "user", "content": [{"type": "text", "text": "Hel"},
                                                   {"type": "text", "text": "lo!"}]}]
    text, _ = chat(client, messages=parts, temperature=0)
    assert text == generate(chat_model)


def test_a_prompt_as_a_list_of_one(client, chat_model):
    """A completion's prompt as [[ids]] or [text]: one prompt, as if given
    alone."""
    ids = chat_model.tokenizer.encode("The quick brown")
    want = chat_model.generate([ids], 6, ignore_eos=True).text[0]
    for prompt in ([ids], ["The quick brown"], ids):
        reply = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert reply.choices[0].text == want and reply.usage.prompt_tokens == len(ids)


# -- what is refused, naming the field ------------------------------------------------

REFUSED = [
    # (route, the fields added to a valid body, the field named)
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("completions", {"echo": True}, "echo"),
    ("completions", {"suffix": "end"}, "suffix"),
    ("completions", {"best_of": 2}, "best_of"),
    ("completions", {"prompt": [[5, 6], [7]]}, "prompt"),
    ("chat/completions", {"top_k": 2.5}, "top_k"),
    ("chat/completions", {"min_p": 1.5}, "min_p"),
    ("chat/completions", {"top_p": 0.0}, "top_p"),
    ("chat/completions", {"seed": -1}, "seed"),
    ("chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat/completions", {"stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages[0].content[0].type"),
    ("chat/completions", {"messages": [{"role": "narrator", "content": "x"}]},
     "messages[0].role"),
    ("chat/completions", {"n": 0}, "n"),
    ("chat/completions", {"top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize("route, fields, param", REFUSED,
                         ids=[f"{r[0].split('/')[0]}-{r[2]}" for r in REFUSED])
def test_each_refusal_is_a_400_naming_its_field(server, route, fields, param):
    body = {"model": NAME, "max_tokens": 2, "temperature": 0,
            **({"messages": CHAT} if route == "chat/completions" else {"prompt": [5, 6]}),
            **fields}
    response = post(server, route, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param.split("[")[0].split(".")[0])


def test_an_image_is_refused_saying_etc_serves_text(client):
    """An image part beside text (what a client of a multimodal model such
    as Gemma 3 sends), through the openai client: a 400 naming the part's
    type, saying ETC serves text."""
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=NAME, messages=messages, max_tokens=2)
    error = caught.value
    assert error.status_code == 400 and error.param == "messages[0].content[1].type"
    assert error.body["message"] == (
        "messages[0].content[1].type: content parts of type 'image_url' are not supported: "
        "ETC serves text (it runs no vision or audio encoder, not even a multimodal "
        "checkpoint's); send 'text' parts")


def test_the_defaults_of_refused_fields_are_taken(server):
    """The refused fields at their defaults (what clients send unasked) are
    no refusal."""
    body = {"model": NAME, "messages": CHAT, "max_tokens": 2, "temperature": 0, "n": 1,
            "logprobs": False, "presence_penalty": 0.0, "frequency_penalty": 0.0, "tools": [],
            "stop": [], "top_k": 0, "min_p": 0.0}
    assert post(server, "chat/completions", body).status_code == 200
    body = {"model": NAME, "prompt": [5, 6], "max_tokens": 2, "temperature": 0, "echo": False,
            "suffix": None, "best_of": 1, "logprobs": 0}
    assert post(server, "completions", body).status_code == 200


# -- a step that fails -----------------------------------------------------------------


def test_a_failed_step_is_a_500_or_an_error_event(server, chat_model, monkeypatch):
    """A step that raises: a request not streamed gets 500 with the error, a
    stream an error event and [DONE]; the server goes on serving."""
    real = chat_model.step

    def step(*args, **options):
        raise RuntimeError("the device fell off the bus")

    monkeypatch.setattr(chat_model, "step", step)
    body = {"model": NAME, "prompt": [5, 6], "max_tokens": 4, "temperature": 0}
    response = post(server, "completions", body)
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "the step failed: RuntimeError: the device fell off the bus",
        "type": "internal_error", "param": None, "code": None}
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=HANG,
                      json={"model": NAME, "messages": CHAT, "stream": True}) as response:
        assert response.status_code == 200  # the stream had begun
        events = [line for line in response.iter_lines() if line]
    assert events == ["data: " + json.dumps({"error": {
        "message": "the step failed: RuntimeError: the device fell off the bus",
        "type": "internal_error"}}), "data: [DONE]"]
    monkeypatch.setattr(chat_model, "step", real)
    assert post(server, "completions", body).status_code == 200
    assert server.app.state.engine.slots_in_use == 0


# -- /health ---------------------------------------------------------------------------


def test_health_is_503_while_closing(chat_model):
    """A server closing (app.state.close: what a shutdown does first) says
    503 on /health and to new requests."""
    server = Server(etc.serve.build_app(chat_model, served_model_name=NAME))
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        server.app.state.close()
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503
        assert health.json()["error"]["type"] == "service_unavailable"
        assert health.json()["error"]["message"] == SHUTTING_DOWN
        response = post(server, "completions", {"model": NAME, "prompt": [5], "max_tokens": 2})
        assert response.status_code == 503
        assert response.json()["error"]["message"] == SHUTTING_DOWN
    finally:
        server.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_is_503_when_the_engine_thread_died(chat_model, monkeypatch):
    """The engine's thread dead (a step raised SystemExit, which nothing
    catches): /health says 503, and a new request gets 503 rather than
    waiting for steps that never come."""
    server = Server(etc.serve.build_app(chat_model, served_model_name=NAME))
    engine = server.app.state.engine
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        thread = engine._thread

        def leave():
            raise SystemExit(1)

        monkeypatch.setattr(engine, "step", leave)
        engine.cancel(10 ** 9)  # wakes the thread, which steps and dies
        thread.join(HANG)
        assert not thread.is_alive()
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503
        assert health.json()["error"] == {"message": ENGINE_STOPPED,
                                          "type": "service_unavailable", "param": None,
                                          "code": None}
        response = post(server, "completions", {"model": NAME, "prompt": [5], "max_tokens": 2})
        assert response.status_code == 503
        assert response.json()["error"]["message"] == ENGINE_STOPPED
    finally:
        server.stop()
