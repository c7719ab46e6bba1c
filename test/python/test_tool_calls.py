"""Tool calls (issue 35): tools rendered through the chat template's
`tools` variable, calls parsed from the Hermes format (Qwen's
`<tool_call>`), `tool_choice` "required" and a named function constrained
by a grammar so that the arguments validate, streamed, and a conversation
with the call and a `role: "tool"` answer. Through the real `openai`
client over HTTP on localhost, on a tiny random model whose template is
Qwen-like."""

import json

import httpx
import openai
import pytest

import etc.models
import etc.serve
from etc.models.testing import tiny_config, write_checkpoint
from etc.serve import tools
from test_serve import Server
from test_structured_output import validate

NAME = "tiny-tools"
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "Call one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response>"
    "<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>\n' }}{{ {'name': call['function']['name'], "
    "'arguments': call['function']['arguments']} | tojson }}{{ '\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "integer", "minimum": -12, "maximum": 12}}, "required": ["zone"],
        "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("tools") / NAME,
                            tiny_config(vocab_size=320), tokenizer=True, chat_template=TEMPLATE)
    return etc.models.load(path, workers=2, max_seq_len=1024, attention_chunk=128)


@pytest.fixture(scope="module")
def server(model):
    server = Server(etc.serve.build_app(model, served_model_name=NAME))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _check_call(call, tool):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_the_template_gets_the_tools(model, client):
    tok = model.tokenizer
    reply = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=1,
                                           temperature=0, tools=[WEATHER])
    text = tok.apply_chat_template(ASK, tools=[WEATHER])
    assert reply.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
    assert "get_weather" in text


def test_required_then_a_tool_answer(client):
    """tool_choice "required": the call is forced by a grammar, its
    arguments validate; the conversation goes on with the call and a
    role "tool" message."""
    reply = client.chat.completions.create(model=NAME, messages=ASK, temperature=0.8, seed=2,
                                           max_tokens=200, tools=[WEATHER, TIME],
                                           tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    _check_call(call, WEATHER if call.function.name == "get_weather" else TIME)
    follow = client.chat.completions.create(
        model=NAME, max_tokens=5, temperature=0, tools=[WEATHER, TIME],
        messages=[*ASK, choice.message,
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}])
    assert follow.choices[0].message.role == "assistant"
    assert follow.usage.prompt_tokens > reply.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool(client, stream):
    options = dict(model=NAME, messages=ASK, temperature=1.0, seed=4, max_tokens=200,
                   tools=[WEATHER, TIME],
                   tool_choice={"type": "function", "function": {"name": "get_time"}})
    if not stream:
        reply = client.chat.completions.create(**options)
        (call,) = reply.choices[0].message.tool_calls
        _check_call(call, TIME)
        assert reply.choices[0].finish_reason == "tool_calls"
        return
    chunks = list(client.chat.completions.create(stream=True, **options))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or ()]
    assert len(calls) == 1 and calls[0].index == 0
    assert calls[0].function.name == "get_time"
    validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_answers_text_or_a_call(client):
    reply = client.chat.completions.create(model=NAME, messages=ASK, temperature=0,
                                           max_tokens=8, tools=[WEATHER])
    message = reply.choices[0].message
    assert message.tool_calls or message.content is not None
    none = client.chat.completions.create(model=NAME, messages=ASK, temperature=0,
                                          max_tokens=8, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None


def test_parsers():
    content, calls = tools.parse("hermes", 'Sure. <tool_call>\n{"name": "f", "arguments": '
                                           '{"a": 1}}\n</tool_call><tool_call>{"name": "g", '
                                           '"arguments": {}}</tool_call>')
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    assert tools.parse("hermes", "no call <tool_call>{bad</tool_call>") == \
        ("no call <tool_call>{bad</tool_call>", [])
    content, calls = tools.parse("llama3_json", '{"name": "f", "parameters": {"x": "y"}}')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"x": "y"}
    assert tools.parser_for("...<tool_call>...") == "hermes"
    assert tools.parser_for("{{ 'ipython' }}") == "llama3_json"
    assert tools.parser_for("plain") is None


BAD = [({"tool_choice": "required"}, "tool_choice"),
       ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice"),
       ({"tools": [WEATHER, WEATHER]}, "tools"),
       ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "tools[0].function.name"),
       ({"tools": [WEATHER], "tool_choice": "required", "response_format": {
           "type": "json_object"}}, "tool_choice")]


@pytest.mark.parametrize("fields, param", BAD, ids=[b[1] for b in BAD])
def test_bad_tool_requests_are_400_naming_the_field(server, fields, param):
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": ASK, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_parallel_tool_calls_false_keeps_the_first_call():
    from types import SimpleNamespace

    from etc.serve.app import _calls

    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' \
           '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    for parallel, names in ((None, ["f", "g"]), (True, ["f", "g"]), (False, ["f"])):
        _, calls = _calls("hermes", text, SimpleNamespace(parallel_tool_calls=parallel))
        assert [c["function"]["name"] for c in calls] == names
