"""Tool calls (issue 35): tools rendered through the chat template's
`tools` variable, calls parsed from the Hermes format (Qwen's
`<tool_call>`), `tool_choice` "required" and a named function constrained
by a grammar so that the arguments validate, streamed, and a conversation
with the call and a `role: "tool"` answer. Through the real `openai`
client over HTTP on localhost, on a tiny random model whose template is
Qwen-like. Streamed, the calls come as OpenAI sends them: a delta with the
name, then the arguments in fragments as they are generated
(`tool_calls.CallStream`, tested here with the text cut everywhere)."""

import json

import httpx
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

import etc.models
import etc.serve
from etc.models.testing import tiny_config, write_checkpoint
from etc.models import tool_calls as tools
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
    with Server.of(model, NAME) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


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


def test_a_named_tool(client):
    reply = client.chat.completions.create(
        model=NAME, messages=ASK, temperature=1.0, seed=4, max_tokens=200,
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = reply.choices[0].message.tool_calls
    _check_call(call, TIME)
    assert reply.choices[0].finish_reason == "tool_calls"


def _schema(tool):
    function = tool["function"]
    return json.dumps({"type": "object", "properties": {
        "name": {"const": function["name"]}, "arguments": function["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False}})


#: tool_choice "auto", the answer made to hold text and two calls (a
#: grammar of its own: a random model would not write them).
TWO_CALLS = {"guided_grammar": (
    'start: "Let me look. " weather "\\n" time\n'
    'weather: "<tool_call>\\n" weather_call "\\n</tool_call>"\n'
    'time: "<tool_call>\\n" time_call "\\n</tool_call>"\n'
    f"weather_call: %json {_schema(WEATHER)}\n"
    f"time_call: %json {_schema(TIME)}\n")}
STREAMED = {
    "required": (dict(tool_choice="required"), [None]),
    "named": (dict(tool_choice={"type": "function", "function": {"name": "get_time"}}),
              [TIME]),
    "auto": (dict(extra_body=TWO_CALLS), [WEATHER, TIME])}


@pytest.mark.parametrize("case", STREAMED)
def test_streamed_calls_arrive_as_openai_sends_them(client, case):
    """Streamed, each call's first delta has its index, id, type and name
    (arguments ""), then the arguments come in fragments as the tokens are
    generated, before the last chunk, adding up to what the same request
    gives whole; the text before the calls is content; the openai client's
    accumulation of the stream gives the whole answer."""
    fields, expected = STREAMED[case]
    options = dict(model=NAME, messages=ASK, temperature=0.8, seed=5, max_tokens=300,
                   tools=[WEATHER, TIME], **fields)
    whole = client.chat.completions.create(**options).choices[0]
    assert whole.finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(stream=True, **options))
    chunks = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    entries = [(k, call) for k, c in enumerate(chunks)
               for call in c.choices[0].delta.tool_calls or ()]
    heads = [(k, call) for k, call in entries if call.id is not None]
    assert [call.index for _, call in heads] == list(range(len(expected)))
    for (k, head), call, tool in zip(heads, whole.message.tool_calls, expected):
        assert head.type == "function" and head.id.startswith("call_")
        assert head.function.name == call.function.name and head.function.arguments == ""
        if tool is not None:
            assert call.function.name == tool["function"]["name"]
        fragments = [(j, c.function.arguments) for j, c in entries
                     if c.index == head.index and c.id is None]
        assert all(c.function.name is None for j, c in entries if c.id is None)
        assert all(j > k for j, _ in fragments)
        assert sum(1 for j, text in fragments if text and j < len(chunks) - 1) >= 2
        assert "".join(text for _, text in fragments) == call.function.arguments
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == (whole.message.content or "")
    assert "<" not in content  # no part of a tag leaks
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    accumulated = state.get_final_completion().choices[0].message
    assert accumulated.content == whole.message.content
    assert [(c.id, c.function.name, c.function.arguments) for c in accumulated.tool_calls] == \
        [(h.id, c.function.name, c.function.arguments)
         for (_, h), c in zip(heads, whole.message.tool_calls)]


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



#: Answers and what `tool_calls.parse` reads in them; a stream of each, cut
#: anywhere, must give the same.
ANSWERS = [
    ("hermes", 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "x}\\"y"}}\n'
               '</tool_call>\n<tool_call>{"arguments": {}, "name": "g"}</tool_call>'),
    ("hermes", "no call <tool_call>{bad</tool_call> more"),
    ("hermes", "text with < and <tool_ but no call\n"),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"ü": [1.5, null]}, "x": 3}</tool_call>'
               ' after'),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": [1, {"y": null}]}}'),
    ("llama3_json", ' {"name": "f", "arguments": {"x": 2}}'),
    ("llama3_json", 'Hello {"name": "f"}'),
    ("llama3_json", '{"a": 1}'),
    ("llama3_json", "<|python")]


def _streamed(parser: str, pieces: list, parallel: bool = True) -> tuple:
    """(content, [(name, arguments)]) of `pieces` through a CallStream, as a
    client adds the deltas up; checks that each call's first delta has its
    id and name, and only that one."""
    stream = tools.CallStream(parser, parallel)
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    content, calls = None, []
    for delta in deltas:
        if "content" in delta:
            content = (content or "") + delta["content"]
        for entry in delta.get("tool_calls", ()):
            if "id" in entry:
                assert entry["index"] == len(calls) and entry["function"]["arguments"] == ""
                calls.append([entry["function"]["name"], ""])
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == \
                    {"arguments"} and entry["function"]["arguments"]
                calls[entry["index"]][1] += entry["function"]["arguments"]
    return content, [tuple(call) for call in calls]


@pytest.mark.parametrize("parser, text", ANSWERS, ids=range(len(ANSWERS)))
def test_a_stream_cut_anywhere_reads_as_the_whole(parser, text):
    """Fed in two pieces cut at every place (a tag split across tokens),
    and a character at a time, a CallStream gives the content and calls
    `parse` gives, with and without parallel calls."""
    for parallel in (True, False):
        content, calls = tools.parse(parser, text)
        expected = (content, [(c["function"]["name"], c["function"]["arguments"])
                              for c in calls[:None if parallel else 1]])
        for cut in range(len(text) + 1):
            assert _streamed(parser, [text[:cut], text[cut:]], parallel) == expected, cut
        assert _streamed(parser, list(text), parallel) == expected


def test_a_stream_holds_back_only_what_may_be_a_call():
    """Text that may be the start of `<tool_call>` (and the space before
    it) waits; it is content as soon as it cannot be; a call's name goes
    out once complete, then its arguments as they come."""
    stream = tools.CallStream("hermes")
    assert stream.feed("Hi <tool") == [{"content": "Hi"}]
    assert stream.feed("s> and ") == [{"content": " <tools> and"}]
    assert stream.feed("<tool_call>\n{\"name\": \"get") == []
    (head,) = stream.feed('_time", ')[0]["tool_calls"]
    assert head["index"] == 0 and head["function"] == {"name": "get_time", "arguments": ""}
    assert stream.feed('"arguments": {"zo') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"zo'}}]}]
    assert stream.feed('ne": 2}}\n</tool') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ne": 2}'}}]}]
    assert stream.feed("_call>") == [] and stream.finish() == [] and stream.calls == 1


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

    from etc.serve.choice import _calls

    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' \
           '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    for parallel, names in ((None, ["f", "g"]), (True, ["f", "g"]), (False, ["f"])):
        _, calls = _calls("hermes", text, SimpleNamespace(parallel_tool_calls=parallel))
        assert [c["function"]["name"] for c in calls] == names
