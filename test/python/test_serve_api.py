"""etc.serve's API as applications and agents use it (issue 35): no field
silently ignored (each takes effect or is refused by name), vLLM's
extensions that take effect, and `Model.generate`'s keywords. Through the
real `openai` client over HTTP on localhost, and raw HTTP (httpx) for the
refusals; one tiny model (conftest's `chat_model`)."""

import logging

import httpx
import numpy as np
import pytest

import etc.serve
from etc.models.testing import CHAT_TEMPLATE
from test_serve import CHAT, NAME, Server

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def server(chat_model):
    with Server.of(chat_model, max_num_seqs=4) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def greedy(chat_model):
    return chat_model.generate(CHAT, 12, ignore_eos=True)


def chat(client, **options):
    options.setdefault("max_tokens", 12)
    options.setdefault("temperature", 0)
    extra = options.pop("extra_body", {})
    return client.chat.completions.create(model=NAME, messages=options.pop("messages", CHAT),
                                          extra_body={"ignore_eos": True, **extra}, **options)


# -- refused by name ---------------------------------------------------------

CHAT_BODY = {"model": NAME, "messages": CHAT}
TEXT_BODY = {"model": NAME, "prompt": "Hi"}

REFUSED = [
    # (route, fields added to the body, param): each silently ignored before.
    ("chat/completions", {"logit_bias": {"abc": -100}}, "logit_bias"),
    ("completions", {"logit_bias": {"320": -100}}, "logit_bias"),
    ("completions", {"logit_bias": {"5": -101}}, "logit_bias.5"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("completions", {"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ("chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat/completions", {"min_tokens": 3}, "min_tokens"),  # more than max_tokens (2)
    ("chat/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat/completions", {"n": 129}, "n"),
    ("completions", {"best_of": 2}, "best_of"),
    ("chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("completions", {"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("chat/completions", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat/completions", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat/completions", {"verbosity": "low"}, "verbosity"),
    ("chat/completions", {"web_search_options": {"search_context_size": "low"}},
     "web_search_options"),
    ("chat/completions", {"store": True}, "store"),
    ("chat/completions", {"metadata": {"k": "v"}}, "metadata"),
    ("chat/completions", {"service_tier": "flex"}, "service_tier"),
    ("chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("chat/completions", {"echo": True}, "echo"),
    ("chat/completions", {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
    ("chat/completions", {"continue_final_message": True}, "continue_final_message"),
    ("chat/completions", {"chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs.messages"),
    ("chat/completions", {"stop_token_ids": [3, 320]}, "stop_token_ids[1]"),
    ("completions", {"allowed_token_ids": [3, 320]}, "allowed_token_ids"),
    ("completions", {"allowed_token_ids": []}, "allowed_token_ids"),
    ("chat/completions", {"top_k": -2}, "top_k"),
    # Fields no body declares: a misspelling, another server's extension.
    ("chat/completions", {"tempreature": 0.3}, "tempreature"),
    ("completions", {"use_beam_search": True}, "use_beam_search"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi", "extra": 1}]},
     "messages[0].extra"),
    ("chat/completions", {"messages": [{"role": "assistant", "content": "Hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
]


@pytest.mark.parametrize("route, fields, param", REFUSED,
                         ids=[f"{i}-{r[2]}" for i, r in enumerate(REFUSED)])
def test_each_field_not_implemented_is_refused_by_name(server, route, fields, param):
    body = {**(CHAT_BODY if route.startswith("chat") else TEXT_BODY), "max_tokens": 2, **fields}
    response = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_fields_at_their_defaults_are_accepted(server):
    """A field set to what it means when absent asks for nothing: accepted
    (clients send such values, e.g. an answer's null fields sent back)."""
    body = {**CHAT_BODY, "max_tokens": 2, "temperature": 0, "n": 1, "logprobs": False,
            "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {},
            "repetition_penalty": 1.0, "min_tokens": 0, "response_format": {"type": "text"},
            "tool_choice": "none", "modalities": ["text"], "store": False,
            "service_tier": "auto", "prompt_cache_key": "k", "user": "u",
            "safety_identifier": "s", "stream_options": {"include_obfuscation": False},
            "messages": [*CHAT, {"role": "assistant", "content": "Hi", "refusal": None,
                                 "tool_calls": None}, {"role": "user", "content": "More"}]}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    body = {**TEXT_BODY, "max_tokens": 2, "temperature": 0, "best_of": 1, "echo": False}
    assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200


# -- vLLM's extensions that take effect -----------------------------------------


def test_top_k_minus_one_is_disabled(client):
    """vLLM's top_k=-1 keeps every token, as 0 does: the same seeded text."""
    texts = [chat(client, temperature=1.0, seed=5, extra_body={"top_k": k})
             .choices[0].message.content for k in (-1, 0)]
    assert texts[0] == texts[1]


def test_max_completion_tokens_on_completions(client):
    reply = client.completions.create(model=NAME, prompt="The quick brown", temperature=0,
                                      extra_body={"max_completion_tokens": 5,
                                                  "ignore_eos": True})
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


def test_stop_token_ids(client, greedy):
    """Generation stops at an id of stop_token_ids, also with ignore_eos;
    the id is counted, and its text (not special here) is part of the
    answer, as in vLLM."""
    tokens = greedy.tokens[0]
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i] and tokens[i] > 2)
    reply = chat(client, extra_body={"stop_token_ids": [tokens[k]]})
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == k + 1


def test_include_stop_str_in_output(client, greedy):
    text = greedy.text[0]
    stop = text[3:5]
    reply = chat(client, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert reply.choices[0].message.content == text[:text.find(stop) + len(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_skip_special_tokens(chat_model, monkeypatch):
    """A special token generated (forced here: the step returns id 1,
    <|im_start|>) is in the text only with skip_special_tokens=False."""
    step = chat_model.step

    def special(*args, **options):
        logits, ids = step(*args, **options)
        return logits, np.full_like(ids, 1)

    monkeypatch.setattr(chat_model, "step", special)
    server = Server(etc.serve.build_app(chat_model, served_model_name=NAME))
    try:
        body = {"model": NAME, "prompt": [5, 6], "max_tokens": 2, "temperature": 0}
        texts = [httpx.post(f"{server.url}/v1/completions", timeout=60,
                            json={**body, "skip_special_tokens": skip}).json()
                 ["choices"][0]["text"] for skip in (True, False)]
    finally:
        server.stop()
    assert texts == ["", "<|im_start|><|im_start|>"]


def test_a_value_the_template_cannot_take_is_a_400(server, chat_model, monkeypatch):
    """A template that joins a call's arguments as a string (DeepSeek's),
    given them as a dict (as transformers gives templates): 400 naming
    messages, or chat_template_kwargs where the request gave some."""
    tok = chat_model.tokenizer
    monkeypatch.setattr(tok, "chat_template", CHAT_TEMPLATE.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% for call in message.tool_calls or [] %}"
        "{{ call['function']['name'] + call['function']['arguments'] }}{% endfor %}"))
    monkeypatch.setattr(tok, "_template", None)
    called = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    for extra, param in (({}, "messages"), ({"chat_template_kwargs": {"a": 1}},
                                             "chat_template_kwargs")):
        reply = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": called, "max_tokens": 1, **extra})
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param, error
        assert "the chat template cannot take" in error["message"], error


def test_chat_template_fields(client, chat_model, monkeypatch):
    """add_generation_prompt, chat_template_kwargs and documents reach the
    template; continue_final_message continues the last (assistant)
    message; add_special_tokens adds the BOS id a tokenizer asks for."""
    tok = chat_model.tokenizer
    monkeypatch.setattr(tok, "chat_template", CHAT_TEMPLATE +
                        "{% if greeting %}{{ greeting }}{% endif %}"
                        "{% for d in documents or [] %}{{ d['text'] }}{% endfor %}")
    monkeypatch.setattr(tok, "_template", None)

    def prompt_tokens(**options):
        return chat(client, max_tokens=1, **options).usage.prompt_tokens

    def count(text):
        return len(tok.encode(text, add_special_tokens=False))

    rendered = tok.apply_chat_template(CHAT)
    assert prompt_tokens() == count(rendered)
    assert prompt_tokens(extra_body={"add_generation_prompt": False}) == \
        count(tok.apply_chat_template(CHAT, add_generation_prompt=False))
    assert prompt_tokens(extra_body={"chat_template_kwargs": {"greeting": "Hello there"}}) == \
        count(rendered + "Hello there")
    assert prompt_tokens(extra_body={"documents": [{"text": "A doc."}]}) == \
        count(rendered + "A doc.")
    # The reply continues "Once upon" instead of starting a new message.
    start = [*CHAT, {"role": "assistant", "content": "Once upon"}]
    continued = chat(client, messages=start, max_tokens=4, extra_body={
        "continue_final_message": True, "add_generation_prompt": False})
    text = tok.apply_chat_template(start, add_generation_prompt=False)
    ids = tok.encode(text[:text.rfind("Once upon") + len("Once upon")],
                     add_special_tokens=False)
    assert continued.usage.prompt_tokens == len(ids)
    assert continued.choices[0].message.content == \
        chat_model.generate(ids, 4, ignore_eos=True).text[0]
    monkeypatch.setattr(tok, "add_bos_token", True)
    monkeypatch.setattr(tok, "bos_token_id", 0)
    with_bos = [client.completions.create(
        model=NAME, prompt="The quick", max_tokens=1, temperature=0,
        extra_body={"add_special_tokens": add}).usage.prompt_tokens for add in (True, False)]
    assert with_bos[0] == with_bos[1] + 1
    assert prompt_tokens(extra_body={"add_special_tokens": True}) == count(rendered) + 1


def test_user_is_logged(client, caplog):
    caplog.set_level(logging.INFO, logger="etc.serve")
    reply = chat(client, max_tokens=1, user="alice")
    assert any(reply.id in r.getMessage() and "alice" in r.getMessage()
               for r in caplog.records)


# -- log-probabilities ----------------------------------------------------------------


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - x.max() - np.log(np.sum(np.exp(x - x.max())))


def test_chat_logprobs_streamed_and_not(client, chat_model):
    """Greedy: each token's log-probability and its 3 most likely
    alternatives are the log-softmax of the logits it was chosen from
    (within 1e-4), streamed or not; a token's bytes are its text's."""
    want = chat_model.generate(CHAT, 8, ignore_eos=True, return_logits=True)
    reply = chat(client, max_tokens=8, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    stream = chat(client, max_tokens=8, logprobs=True, top_logprobs=3, stream=True)
    streamed = [entry for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs.content]
    tok = chat_model.tokenizer
    assert len(content) == len(streamed) == 8
    for i, (entry, token, logits) in enumerate(zip(content, want.tokens[0], want.logits[0])):
        reference = _log_softmax(logits)
        assert entry.token == tok.decode([token], skip_special_tokens=False)
        assert bytes(entry.bytes) == entry.token.encode()
        assert abs(entry.logprob - reference[token]) < 1e-4, i
        top = np.argsort(-logits, kind="stable")[:3]
        assert [t.token for t in entry.top_logprobs] == \
            [tok.decode([t], skip_special_tokens=False) for t in top]
        np.testing.assert_allclose([t.logprob for t in entry.top_logprobs], reference[top],
                                   atol=1e-4)
        assert streamed[i].model_dump() == entry.model_dump()
    assert chat(client, max_tokens=2).choices[0].logprobs is None
    plain = chat(client, max_tokens=2, logprobs=True).choices[0].logprobs.content
    assert all(entry.top_logprobs == [] for entry in plain)


def test_sampled_logprobs_follow_the_filters(client):
    """At temperature 0.8 with top_k 2, the distribution drawn from keeps 2
    tokens: the two alternatives' probabilities sum to 1, the third is
    -inf (sent as -9999), and the chosen token is one of the two."""
    reply = chat(client, max_tokens=6, temperature=0.8, seed=4, logprobs=True, top_logprobs=3,
                 extra_body={"top_k": 2})
    for entry in reply.choices[0].logprobs.content:
        top = [t.logprob for t in entry.top_logprobs]
        assert abs(np.exp(top[0]) + np.exp(top[1]) - 1) < 1e-4 and top[2] == -9999.0
        assert entry.token in [t.token for t in entry.top_logprobs[:2]]


def test_completion_logprobs(client, chat_model):
    want = chat_model.generate("The quick brown", 5, ignore_eos=True, return_logits=True)
    reply = client.completions.create(model=NAME, prompt="The quick brown", max_tokens=5,
                                      temperature=0, logprobs=2,
                                      extra_body={"ignore_eos": True})
    logprobs = reply.choices[0].logprobs
    tok = chat_model.tokenizer
    assert logprobs.tokens == [tok.decode([t], skip_special_tokens=False)
                               for t in want.tokens[0]]
    for i, (token, logits) in enumerate(zip(want.tokens[0], want.logits[0])):
        reference = _log_softmax(logits)
        assert abs(logprobs.token_logprobs[i] - reference[token]) < 1e-4
        top = np.argsort(-logits, kind="stable")[:2]
        assert list(logprobs.top_logprobs[i]) == [tok.decode([t], skip_special_tokens=False)
                                                  for t in top]
    assert logprobs.text_offset == list(np.cumsum([0] + [len(t) for t in logprobs.tokens])[:-1])
    stream = client.completions.create(model=NAME, prompt="The quick brown", max_tokens=5,
                                       temperature=0, logprobs=2, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = [c.choices[0].logprobs for c in stream if c.choices[0].logprobs]
    assert sum((c.tokens for c in chunks), []) == logprobs.tokens
    assert sum((c.text_offset for c in chunks), []) == logprobs.text_offset


# -- penalties, biases, min_tokens ---------------------------------------------------


def _expected_greedy(chat_model, prompt, count, params, forbidden_until=0, forbidden=()):
    """The greedy tokens the reference says: at each step the raw logits
    (generate's, of the tokens so far), changed by `adjust_logits` with the
    entries of `logit_adjustments`, then the argmax."""
    from etc import reference_sampling
    from etc.models.step.sampling import logit_adjustments

    generated = []
    for _ in range(count):
        out = chat_model.generate([prompt + generated], 1, ignore_eos=True, return_logits=True)
        logits = out.logits[0][:1]
        entries = logit_adjustments(params, prompt, generated,
                                    forbidden if len(generated) < forbidden_until else ())
        if entries is not None:
            logits = reference_sampling.adjust_logits(logits, entries[0][None], entries[1][None],
                                                      entries[2][None])
        generated.append(int(np.argmax(logits[0])))
    return generated


def test_penalties_and_logit_bias_change_the_tokens_as_the_reference_says(client, chat_model,
                                                                          greedy):
    """Applied on the device before the choice, also at temperature 0: each
    greedy token is the argmax of the raw logits changed as the reference
    changes them (presence/frequency over the generated tokens, repetition
    over prompt and generated, the biases); a -100 bias on the answer's
    first token removes it (before, the same token came back)."""
    from etc.models.step.sampling import SamplingParams

    tok = chat_model.tokenizer
    prompt = tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)
    first = greedy.tokens[0][0]
    cases = [dict(logit_bias={str(first): -100.0}),
             dict(frequency_penalty=1.5, presence_penalty=0.5),
             dict(repetition_penalty=1.8, logit_bias={"7": 5.0})]
    for case in cases:
        reply = client.completions.create(model=NAME, prompt=prompt, max_tokens=8,
                                          temperature=0, extra_body={"ignore_eos": True, **case})
        params = SamplingParams(**{**case, "logit_bias": {int(k): v for k, v in
                                                          case.get("logit_bias", {}).items()}})
        want = _expected_greedy(chat_model, prompt, 8, params)
        assert reply.choices[0].text == tok.decode(want), case
        assert want != greedy.tokens[0][:8], case


def test_min_tokens_forbids_eos_until_reached(client, chat_model, greedy, monkeypatch):
    """With the answer's 2nd token made EOS, the answer stops there; with
    min_tokens 5 EOS is -inf on the device for the first 5 tokens, so it
    goes on, and the tokens are the reference's."""
    tokens = greedy.tokens[0]
    eos = tokens[1]
    monkeypatch.setattr(chat_model, "eos_token_ids", (eos,))
    server_eos = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8,
                                                temperature=0)
    assert server_eos.usage.completion_tokens == 2
    reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8,
                                           temperature=0, extra_body={"min_tokens": 5})
    tok = chat_model.tokenizer
    prompt = tok.encode(tok.apply_chat_template(CHAT), add_special_tokens=False)
    want = _expected_greedy(chat_model, prompt, 8, None, 5, (eos,))
    assert eos not in want[:5]
    end = next((i for i in range(5, 8) if want[i] == eos), None)
    if end is not None:
        want = want[:end + 1]
    assert reply.usage.completion_tokens == len(want) >= 5
    assert reply.choices[0].message.content == tok.decode([t for t in want if t != eos])


def test_allowed_token_ids_mask_every_other_token(client, chat_model):
    """vLLM's allowed_token_ids: a token bitmask applied on the device, so
    only those ids come out, sampled or greedy, EOS included only when
    listed; in Python through Engine.submit."""
    from etc.models.engine import Engine, RequestError

    tok = chat_model.tokenizer
    allowed = [tok.token_to_id(c) for c in "ab"]
    assert None not in allowed
    for temperature in (0.0, 1.0):
        reply = client.completions.create(
            model=NAME, prompt="The quick brown", max_tokens=10, temperature=temperature,
            seed=1, extra_body={"allowed_token_ids": allowed})
        text = reply.choices[0].text
        assert set(text) <= {"a", "b"} and len(text) == 10, text
    engine = Engine(chat_model, max_num_seqs=2)
    eos = chat_model.eos_token_ids[0]
    free = engine.submit([5, 6], max_new_tokens=6, ignore_eos=True)
    only = engine.submit([5, 6], max_new_tokens=6, allowed_token_ids=[eos, 40])
    engine.run()
    assert set(only.result().token_ids) <= {eos, 40}
    assert set(free.result().token_ids) - {eos, 40}
    with pytest.raises(RequestError, match="allowed_token_ids"):
        engine.submit([5, 6], max_new_tokens=2, allowed_token_ids=[320])


# -- n choices -------------------------------------------------------------------------


def test_n_choices_share_the_prompts_blocks(server, client, chat_model):
    """n = 3 seeded choices: choice i is what one request with seed + i
    gets; the three share the prompt's full KV blocks (computed once, by
    the first); usage counts every choice's tokens. Streamed, each chunk
    names its choice, and the texts are the same."""
    engine = server.app.state.engine
    words = "You answer in French, briefly, and never say more than asked. Be kind.".split()
    tok = chat_model.tokenizer
    for count in range(1, len(words) + 1):  # a prompt of more than 2 blocks
        messages = [{"role": "system", "content": " ".join(words[:count])},
                    {"role": "user", "content": "Hi!"}]
        prompt = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        if len(prompt) > 40:
            break
    full_blocks = (len(prompt) - 1) // 16 * 16
    assert full_blocks >= 32
    before = engine.stats.cached_tokens
    reply = chat(client, messages=messages, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert texts == [chat(client, messages=messages, temperature=1.0, seed=7 + i, max_tokens=6)
                     .choices[0].message.content for i in range(3)]
    assert len(set(texts)) > 1
    assert reply.usage.completion_tokens == 18 and reply.usage.prompt_tokens == len(prompt)
    # The other two choices (at least) reused the first's full blocks.
    assert engine.stats.cached_tokens - before >= 2 * full_blocks
    stream = chat(client, messages=messages, n=3, temperature=1.0, seed=7, max_tokens=6,
                  stream=True, stream_options={"include_usage": True})
    streamed = ["", "", ""]
    reasons = {}
    chunks = list(stream)
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        streamed[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            reasons[choice.index] = choice.finish_reason
    assert streamed == texts and reasons == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].usage.completion_tokens == 18
    completions = client.completions.create(model=NAME, prompt=prompt, n=2, temperature=1.0,
                                            seed=3, max_tokens=4,
                                            extra_body={"ignore_eos": True})
    assert [c.index for c in completions.choices] == [0, 1]
    assert completions.usage.completion_tokens == 8


# -- Python -----------------------------------------------------------------------


def test_generate_refuses_unknown_keywords(chat_model):
    """An option in the wrong place was silently greedy: now a TypeError
    saying where it belongs."""
    with pytest.raises(TypeError, match=r"'temperature'.*sampling=SamplingParams\("
                                        r"temperature=1.5, seed=3\)"):
        chat_model.generate("Once upon a time", 4, temperature=1.5, seed=3)
    with pytest.raises(TypeError, match=r"'tempreature'.*chat_template_kwargs="):
        chat_model.generate("Once upon a time", 4, tempreature=0.3)
    with pytest.raises(TypeError, match="chat_template_kwargs"):
        chat_model.generate(CHAT, 4, chat_template_kwargs=["enable_thinking"])
    with pytest.raises(ValueError, match="'messages' is set by generate"):
        chat_model.generate(CHAT, 4, chat_template_kwargs={"messages": []})


def test_generate_chat_template_kwargs(chat_model, monkeypatch):
    tok = chat_model.tokenizer
    monkeypatch.setattr(tok, "chat_template",
                        CHAT_TEMPLATE + "{% if greeting %}{{ greeting }}{% endif %}")
    monkeypatch.setattr(tok, "_template", None)
    out = chat_model.generate(CHAT, 4, ignore_eos=True,
                              chat_template_kwargs={"greeting": "Hello there"})
    ids = tok.encode(tok.apply_chat_template(CHAT) + "Hello there", add_special_tokens=False)
    assert out.tokens == chat_model.generate(ids, 4, ignore_eos=True).tokens
    assert out.tokens != chat_model.generate(CHAT, 4, ignore_eos=True).tokens


def test_engine_stop_token_ids_checked(chat_model):
    from etc.models.engine import Engine, RequestError

    engine = Engine(chat_model, max_num_seqs=1)
    with pytest.raises(RequestError, match=r"stop_token_ids: 999 is not a token id"):
        engine.submit([5, 6], max_new_tokens=2, stop_token_ids=[999])
    with pytest.raises(RequestError, match="skip_special_tokens"):
        engine.submit([5, 6], max_new_tokens=2, skip_special_tokens="no")
