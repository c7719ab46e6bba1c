"""Reasoning in chat answers (`etc.models.reasoning`): Qwen3's `<think>`,
Seed-OSS's `<seed:think>` and gpt-oss's harmony channels split into
`reasoning_content` and `content`, by the parser itself (every chunking of
an answer) and end to end through the `openai` client, the tiny chat model
made to write a chosen answer."""

import json

import httpx
import pytest

import etc.serve
from etc.models import reasoning
from etc.models.reasoning import Reader, parser_for, split
from test_serve import CHAT, NAME, Server, force_answer

QWEN3 = "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"
SEED = "<seed:think>The user greets.</seed:think>\nHello! How can I help?"
HARMONY = ("<|channel|>analysis<|message|>User says hello.<|end|><|start|>assistant"
           "<|channel|>final<|message|>Hi there!<|return|>")
HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                "<|message|>{\"city\":\"Paris\"}<|call|>")


def streamed(parser: str, text: str, size: int, prompt: str = "") -> list:
    reader = Reader(parser, prompt)
    pieces = []
    for i in range(0, len(text), size):
        pieces += reader.feed(text[i:i + size])
    return pieces + reader.finish()


@pytest.mark.parametrize("parser, text, prompt, expected", [
    ("qwen3", QWEN3, "", ("\nThe user greets.\n", "Hello! How can I help?")),
    # The template opened <think> (Qwen3 thinking models): no opening tag.
    ("qwen3", "Hmm.</think>\n\nYes.", "<|im_start|>assistant\n<think>\n", ("Hmm.", "Yes.")),
    # None opened (enable_thinking=false, Instruct): all content.
    ("qwen3", "Just this.", "", (None, "Just this.")),
    # enable_thinking=false: the template closed an empty <think> itself.
    ("qwen3", "Yes.", "<|im_start|>assistant\n<think>\n\n</think>\n\n", (None, "Yes.")),
    ("qwen3", "<think>cut short by max_tokens", "", ("cut short by max_tokens", None)),
    ("seed_oss", SEED, "", ("The user greets.", "Hello! How can I help?")),
    # Seed-OSS's template ends the prompt with `<seed:bos>assistant\n`: none opened.
    ("seed_oss", "Just this.", "<seed:bos>assistant\n", (None, "Just this.")),
    # thinking_budget=0: the template closed a think block itself.
    ("seed_oss", "Yes.", "<seed:bos>assistant\n<seed:think>\nNo budget.\n</seed:think>",
     (None, "Yes.")),
    # A prompt that opens the block (as Qwen3's thinking templates do).
    ("seed_oss", "Hmm.</seed:think>\nYes.", "<seed:think>\n", ("Hmm.", "Yes.")),
    ("seed_oss", "<seed:think>cut short", "", ("cut short", None)),
    # The other format's tags are text.
    ("seed_oss", "<think>a</think>b", "", (None, "<think>a</think>b")),
    ("qwen3", SEED, "", (None, SEED)),
    ("harmony", HARMONY, "", ("User says hello.", "Hi there!")),
    ("harmony", HARMONY.removesuffix("<|return|>"), "", ("User says hello.", "Hi there!")),
    ("harmony", "<|channel|>commentary<|message|>Checking.<|end|>", "", (None, "Checking.")),
])
def test_split_and_every_chunking_agree(parser, text, prompt, expected):
    assert split(parser, text, prompt)[:2] == expected
    for size in (1, 2, 3, 7, len(text)):
        pieces = streamed(parser, text, size, prompt)
        joined = {}
        for field, piece in pieces:
            joined[field] = joined.get(field, "") + piece
        assert (joined.get("reasoning_content"), joined.get("content")) == expected, size
        # Reasoning comes first; no piece is a marker's fragment.
        fields = [f for f, _ in pieces]
        assert fields == sorted(fields, key=lambda f: f != "reasoning_content"), size
        # (Unless the tags are the answer's text.)
        marks = ("<|", "think>", "<seed")
        if not any(m in part for part in expected if part for m in marks):
            assert not any(m in p for m in marks for _, p in pieces), size


def test_harmony_tool_call():
    reasoning_text, content, calls = split("harmony", HARMONY_CALL)
    assert (reasoning_text, content) == ("Need the weather.", None)
    assert [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]
    reader = Reader("harmony")
    for ch in HARMONY_CALL:
        reader.feed(ch)
    reader.finish()
    assert [c["function"] for c in reader.calls] == [c["function"] for c in calls]


class _Tokens:
    def __init__(self, *tokens):
        self.tokens = tokens

    def token_to_id(self, token):
        return self.tokens.index(token) if token in self.tokens else None


def test_auto_reads_the_tokenizer_and_unknown_names_are_refused(chat_model):
    assert parser_for("Qwen3ForCausalLM", _Tokens("<think>", "</think>")) == "qwen3"
    assert parser_for("SeedOssForCausalLM", _Tokens("<seed:think>", "</seed:think>")) == \
        "seed_oss"
    assert parser_for("GptOssForCausalLM", _Tokens("<|channel|>", "<|message|>")) == "harmony"
    assert parser_for("LlamaForCausalLM", _Tokens("<|channel|>", "<|message|>")) == "harmony"
    assert parser_for("Qwen3ForCausalLM", _Tokens("<|im_end|>")) is None
    assert parser_for("GptOssForCausalLM", None) == "harmony"
    with pytest.raises(ValueError, match="reasoning_parser='deepseek'"):
        etc.serve.build_app(chat_model, reasoning_parser="deepseek")
    with pytest.raises(ValueError, match="tool_call_parser='hermes' with reasoning_parser"):
        etc.serve.build_app(chat_model, reasoning_parser="harmony", tool_call_parser="hermes")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        Reader("deepseek")
    assert reasoning.CHOICES == ("auto", "none", "qwen3", "seed_oss", "harmony")


def test_the_cli_refuses_an_unknown_parser(capsys):
    from etc.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "x", "--reasoning-parser", "deepseek"])
    assert "--reasoning-parser" in capsys.readouterr().err


# -- end to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def marked_model(tmp_path_factory):
    """The tiny chat model with harmony's special tokens and Qwen3's
    `<think>` `</think>` and Seed-OSS's `<seed:think>` `</seed:think>`
    (added tokens, not special, as theirs) in its tokenizer, and 128
    positions: EOS id 2."""
    import etc.models
    from etc.models.testing import tiny_config, write_checkpoint, write_tokenizer
    from tokenizers import AddedToken, Tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("marked") / "tiny-chat",
                            tiny_config(vocab_size=336))
    write_tokenizer(path, 320)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_special_tokens(["<|channel|>", "<|message|>", "<|start|>", "<|end|>",
                                  "<|return|>", "<|call|>", "<|constrain|>"])
    tokenizer.add_tokens([AddedToken("<think>", special=False),
                          AddedToken("</think>", special=False),
                          AddedToken("<seed:think>", special=False),
                          AddedToken("</seed:think>", special=False)])
    tokenizer.save(str(path / "tokenizer.json"))
    return etc.models.load(path, workers=2, max_seq_len=128, attention_chunk=16)


@pytest.fixture
def scripted(marked_model, monkeypatch):
    """Makes the model answer CHAT (with `tools`) with `text` (then EOS)."""
    return lambda text, **template: force_answer(marked_model, monkeypatch, CHAT, text, 2,
                                                 **template)


def test_auto_finds_the_markers(marked_model, chat_model):
    assert parser_for(marked_model.config.architecture, marked_model.tokenizer) == "harmony"
    assert parser_for(chat_model.config.architecture, chat_model.tokenizer) is None


@pytest.mark.parametrize("parser, text, expected", [
    ("qwen3", QWEN3, ("\nThe user greets.\n", "Hello! How can I help?")),
    ("seed_oss", SEED, ("The user greets.", "Hello! How can I help?")),
    # The closing tag written as text across three tokens, not as its token.
    ("seed_oss", ["<seed:think>The user greets.</se", "ed:thi", "nk>\nHello! How can I help?"],
     ("The user greets.", "Hello! How can I help?")),
    ("harmony", HARMONY, ("User says hello.", "Hi there!")),
])
def test_chat_over_http(marked_model, scripted, parser, text, expected):
    answer = scripted(text)
    with Server.of(marked_model, reasoning_parser=parser) as server:
        client = server.client()
        reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=60,
                                               temperature=0)
        message = reply.choices[0].message
        assert (message.reasoning_content, message.content) == expected
        assert reply.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(model=NAME, messages=CHAT,
                                                     max_tokens=60, temperature=0,
                                                     stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        said = "".join(d.content or "" for d in deltas)
        assert (thought, said) == expected
        # All the reasoning before any content.
        kinds = ["r" if getattr(d, "reasoning_content", None) else "c" for d in deltas
                 if getattr(d, "reasoning_content", None) or d.content]
        assert kinds == sorted(kinds, reverse=True) and len(kinds) > 2
        # The completions endpoint is unchanged: the text as written.
        prompt = marked_model.tokenizer.apply_chat_template(CHAT)
        done = client.completions.create(model=NAME, prompt=prompt, max_tokens=60,
                                         temperature=0,
                                         extra_body={"skip_special_tokens": False})
        assert done.choices[0].text == marked_model.tokenizer.decode(
            answer[:-1], skip_special_tokens=False)


def test_harmony_tool_call_over_http(marked_model, scripted):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    scripted(HARMONY_CALL, tools=tools)
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        client = server.client()
        reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=90,
                                               temperature=0, tools=tools)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.reasoning_content == "Need the weather."
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] \
            == [("get_weather", "{\"city\":\"Paris\"}")]
        chunks = list(client.chat.completions.create(model=NAME, messages=CHAT,
                                                     max_tokens=90, temperature=0,
                                                     tools=tools, stream=True))
        calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls
                 or ()]
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [("get_weather", "{\"city\":\"Paris\"}")]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_qwen3_reasoning_then_a_hermes_call_over_http(marked_model, scripted):
    """Qwen3 thinks, then calls a tool: the reasoning apart, the call read
    from the content by the hermes parser, whole and streamed."""
    scripted('<think>Call f.</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n'
             '</tool_call>')
    tools = [{"type": "function", "function": {"name": "f"}}]
    with Server.of(marked_model, reasoning_parser="qwen3",
                   tool_call_parser="hermes") as server:
        client = server.client()
        reply = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=80,
                                               temperature=0, tools=tools)
        message = reply.choices[0].message
        assert (message.reasoning_content, message.content) == ("Call f.", None)
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
            [("f", "{}")]
        chunks = list(client.chat.completions.create(model=NAME, messages=CHAT,
                                                     max_tokens=80, temperature=0,
                                                     tools=tools, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == \
            "Call f."
        assert "".join(d.content or "" for d in deltas) == ""
        arguments = "".join(call.function.arguments or "" for d in deltas
                            for call in d.tool_calls or ())
        assert arguments == "{}"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_harmony_call_without_tools_is_dropped_with_a_warning(marked_model, scripted,
                                                                caplog):
    scripted(HARMONY_CALL)
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        reply = server.client().chat.completions.create(model=NAME, messages=CHAT,
                                                        max_tokens=90, temperature=0)
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content, message.tool_calls) == \
        ("Need the weather.", None, None)
    assert reply.choices[0].finish_reason == "stop"
    assert "calls get_weather, but the request gave no tools" in caplog.text


# -- tool_choice with harmony: the call forced by a grammar -------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z]{0,8}$"}},
    "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                              "maximum": 12}},
    "required": ["zone"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _matcher(model, tools, name):
    from etc.models.engine.constraints import Constraint, Grammar
    from etc.models.tool_calls import forced_grammar

    return Constraint(model, Grammar("lark", forced_grammar("harmony", tools, name)),
                      "tool_choice").matcher


@pytest.mark.parametrize("text, name, whole", [
    (HARMONY_CALL, "get_weather", True),
    (HARMONY_CALL, None, True),
    # No analysis message: the call straight away.
    (HARMONY_CALL[HARMONY_CALL.index("<|start|>") + len("<|start|>assistant"):], None, True),
    # The wrong tool, arguments against the schema, not a call, two analyses.
    (HARMONY_CALL, "get_time", False),
    (HARMONY_CALL.replace('"Paris"', "3"), None, False),
    (HARMONY_CALL.replace('"Paris"', '"Paris, France"'), None, False),
    (HARMONY, None, False),
    (HARMONY_CALL.replace("<|start|>assistant", "<|start|>assistant<|channel|>analysis"
                          "<|message|>More.<|end|><|start|>assistant", 1), None, False),
])
def test_the_forced_harmony_call_grammar(marked_model, text, name, whole):
    """The grammar takes a harmony call of the chosen tool with arguments
    valid against its schema, after at most one analysis message, and
    ends at <|call|>; it refuses anything else."""
    tokens = marked_model.tokenizer.encode(text, add_special_tokens=False)
    matcher = _matcher(marked_model, [WEATHER, TIME], name)
    taken = matcher.validate_tokens(tokens)
    assert (taken == len(tokens)) == whole, (taken, len(tokens))
    if whole:
        assert matcher.consume_tokens(tokens) and matcher.is_stopped()


def test_a_forced_harmony_call_over_http(marked_model, scripted):
    """The answer written as harmony writes a call passes the grammar of
    a named tool_choice; whole and streamed, it is the call."""
    scripted(HARMONY_CALL, tools=[WEATHER, TIME])
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        client = server.client()
        options = dict(model=NAME, messages=CHAT, max_tokens=90, temperature=0,
                       tools=[WEATHER, TIME], tool_choice=NAMED)
        choice = client.chat.completions.create(**options).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert (choice.message.reasoning_content, choice.message.content) == \
            ("Need the weather.", None)
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] \
            == [("get_weather", '{"city":"Paris"}')]
        chunks = [c for c in client.chat.completions.create(stream=True, **options)
                  if c.choices]
        calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or ()]
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [("get_weather", '{"city":"Paris"}')]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("tool_choice, names", [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
])
def test_sampled_harmony_answers_are_the_forced_call(marked_model, tool_choice, names):
    """The random model, sampling under the grammar, writes a call of a
    tool it may call, its arguments valid; <|end|> made likely keeps its
    analysis (any text) short."""
    from test_structured_output import validate

    end = marked_model.tokenizer.token_to_id("<|end|>")
    tools = {"get_weather": WEATHER, "get_time": TIME}
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        for seed in range(3):
            reply = server.client().chat.completions.create(
                model=NAME, messages=CHAT, max_tokens=90, temperature=1.0, seed=seed,
                tools=list(tools.values()), tool_choice=tool_choice,
                logit_bias={str(end): 100})
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            assert choice.message.content is None
            (call,) = choice.message.tool_calls
            assert call.function.name in names
            validate(json.loads(call.function.arguments),
                     tools[call.function.name]["function"]["parameters"])


def test_a_forced_harmony_call_needs_harmony_tokens(chat_model):
    """A tokenizer without harmony's tokens cannot force a call: refused,
    naming tool_choice and what it lacks."""
    with Server.of(chat_model, reasoning_parser="harmony") as server:
        response = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": CHAT, "max_tokens": 4, "tools": [WEATHER],
            "tool_choice": "required"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tool_choice" and "<|constrain|>" in error["message"]


# -- structured output with harmony: the final message constrained ---------

CITY = {"type": "object", "properties": {
    "city": {"type": "string", "pattern": "^[A-Za-z]{0,8}$"},
    "zone": {"type": "integer", "minimum": -12, "maximum": 12}},
    "required": ["city", "zone"], "additionalProperties": False}
THOUGHT = "<|channel|>analysis<|message|>Need a city.<|end|><|start|>assistant"
FINAL = "<|channel|>final<|message|>"
# Each kind of grammar: (kind, value, an answer it takes, one it refuses).
KINDS = [("json_schema", CITY, '{"city":"Paris","zone":1}', '{"city":"Paris, France","zone":1}'),
         ("json_object", None, '{"a":[1]}', "[1]"),
         ("regex", "[0-9]{3}-[a-z]{2}", "123-ab", "12-ab"),
         ("choice", ["yes", "no"], "no", "maybe"),
         ("lark", 'start: "x" NUMBER\n%import common.NUMBER', "x42", "y42")]


def _final_matcher(model, kind, value):
    from etc.models.engine.constraints import Constraint, Grammar, harmony_final_grammar

    source = Grammar(kind, value).source()
    return Constraint(model, Grammar("llguidance", harmony_final_grammar(source)),
                      "response_format").matcher


@pytest.mark.parametrize("kind, value, good, bad", KINDS, ids=[k[0] for k in KINDS])
def test_the_harmony_final_grammar(marked_model, kind, value, good, bad):
    """The grammar takes the final message holding an answer of the user's
    grammar, after at most one analysis message, ended by <|return|> or
    EOS (accepting, nothing more); it refuses a wrong answer, no final
    channel, a second analysis, and text after the answer."""
    tokenizer = marked_model.tokenizer
    for text, ending, whole in [
            (THOUGHT + FINAL + good, "<|return|>", True),
            (FINAL + good, "<|return|>", True),
            (FINAL + good, "", True),
            (THOUGHT + FINAL + bad, "<|return|>", False),
            (FINAL + good + "<|end|>", "", False),
            (THOUGHT + THOUGHT + FINAL + good, "<|return|>", False),
            (good, "", False),
            ("<|channel|>commentary<|message|>" + good, "<|return|>", False)]:
        tokens = tokenizer.encode(text + ending, add_special_tokens=False)
        matcher = _final_matcher(marked_model, kind, value)
        taken = matcher.validate_tokens(tokens)
        assert (taken == len(tokens)) == whole, (text, ending, taken, len(tokens))
        if whole:
            assert matcher.consume_tokens(tokens) and matcher.is_accepting()
            assert matcher.is_stopped() == bool(ending)
            if not ending:
                assert matcher.validate_tokens([2]) == 1  # EOS ends it


@pytest.mark.parametrize("thought", [THOUGHT, ""], ids=["analysis", "final_only"])
def test_a_harmony_answer_to_a_schema_over_http(marked_model, scripted, thought):
    """The answer written as harmony writes it passes the grammar (each
    token checked as it is taken); whole and streamed, the schema's JSON
    is the content, the analysis the reasoning."""
    from test_structured_output import validate

    answer = '{"city":"Paris","zone":1}'
    scripted(thought + FINAL + answer + "<|return|>")
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        client = server.client()
        options = dict(model=NAME, messages=CHAT, max_tokens=90, temperature=0,
                       response_format={"type": "json_schema", "json_schema": {
                           "name": "city", "schema": CITY, "strict": True}})
        choice = client.chat.completions.create(**options).choices[0]
        assert choice.finish_reason == "stop"
        assert (choice.message.reasoning_content, choice.message.content) == \
            ("Need a city." if thought else None, answer)
        validate(json.loads(choice.message.content), CITY)
        chunks = [c for c in client.chat.completions.create(stream=True, **options)
                  if c.choices]
        deltas = [c.choices[0].delta for c in chunks]
        assert "".join(d.content or "" for d in deltas) == answer
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == \
            ("Need a city." if thought else "")
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_tools_not_offered_for_calls_leave_the_grammar_exact(marked_model, scripted):
    """tool_choice "none" with tools: no call may come, so the final
    message's grammar is the whole story; a guided_regex answer passes."""
    scripted(FINAL + "123-ab")  # the template gets no tools with "none"
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        choice = server.client().chat.completions.create(
            model=NAME, messages=CHAT, max_tokens=40, temperature=0, tools=[WEATHER],
            tool_choice="none", extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"}).choices[0]
    assert (choice.message.content, choice.finish_reason) == ("123-ab", "stop")


# json_object left out: any object, which a random model sampling it may
# not close within max_tokens.
SAMPLED = [(kind, value) for kind, value, *_ in KINDS if kind != "json_object"]


@pytest.mark.parametrize("kind, value", SAMPLED, ids=[k[0] for k in SAMPLED])
def test_sampled_harmony_answers_follow_the_grammar(marked_model, kind, value):
    """The random model, sampling under the grammar, writes harmony (its
    tokens, as logprobs name them, a final message) whose content follows
    the user's grammar, whole and streamed (<|end|> made likely keeps an
    analysis short)."""
    import re

    from test_structured_output import validate

    field = {"json_schema": ("response_format", {"type": "json_schema", "json_schema": {
                 "name": "city", "schema": value}}),
             "regex": ("guided_regex", value), "choice": ("guided_choice", value),
             "lark": ("guided_grammar", value)}[kind]
    checks = {"json_schema": lambda t: validate(json.loads(t), CITY) is None,
              "regex": lambda t: re.fullmatch(value, t),
              "choice": lambda t: t in value,
              "lark": lambda t: re.fullmatch(r"x[0-9.eE+-]+", t)}
    end = marked_model.tokenizer.token_to_id("<|end|>")
    forms = set()  # whether each answer opened with an (empty) analysis
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        client = server.client()
        for seed in range(3):
            options = dict(model=NAME, messages=CHAT, max_tokens=80, temperature=1.0,
                           seed=seed, logit_bias={str(end): 100},
                           extra_body={field[0]: field[1]})
            choice = client.chat.completions.create(logprobs=True, **options).choices[0]
            assert choice.finish_reason == "stop", choice
            assert checks[kind](choice.message.content), choice.message.content
            # The tokens (special ones as written): harmony's final message.
            written = "".join(t.token for t in choice.logprobs.content)
            assert FINAL + choice.message.content in written, written
            forms.add(written.startswith("<|channel|>analysis"))
            chunks = [c for c in client.chat.completions.create(stream=True, **options)
                      if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            assert text == choice.message.content  # the same seed, the same answer
            assert chunks[-1].choices[0].finish_reason == "stop"
    assert forms == {True, False}  # these seeds sample both: with and without


def test_generate_constrains_a_harmony_chats_final_message(marked_model):
    """`Model.generate` as the server: on a model that writes harmony, a
    chat prompt's response_format holds for its final message (analysis
    free before it), a text prompt's for the whole answer."""
    import re

    from etc.models.engine.constraints import Grammar
    from etc.models.step.sampling import SamplingParams

    pattern = "[0-9]{3}-[a-z]{2}"
    end = marked_model.tokenizer.token_to_id("<|end|>")
    out = marked_model.generate(
        [CHAT, "Hello"], 80, response_format=Grammar("regex", pattern),
        sampling=SamplingParams(temperature=1.0, seed=0, logit_bias={end: 100}))
    assert out.finish_reasons == ["stop", "stop"], out.finish_reasons
    written = marked_model.tokenizer.decode(out.tokens[0], skip_special_tokens=False)
    analysis = "<\\|channel\\|>analysis<\\|message\\|>.*<\\|end\\|><\\|start\\|>assistant"
    assert re.fullmatch(f"({analysis})?{re.escape(FINAL)}{pattern}(<\\|return\\|>|<\\|im_end\\|>)",
                        written, re.S), written
    assert re.fullmatch(pattern, out.text[1]), out.text[1]


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_object"}, "tools": [WEATHER]}, "response_format"),
    ({"guided_regex": "a+", "tools": [WEATHER], "tool_choice": "auto"}, "guided_regex"),
    ({"guided_choice": ["a"], "tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    # Grammars that do not compile, inside harmony's as alone.
    ({"guided_grammar": "start: nowhere"}, "guided_grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}, "response_format"),
])
def test_grammars_under_harmony_refused(marked_model, extra, param):
    """With tools the model may call, a call (commentary) or an answer
    (final) may come: no one grammar says which the user's holds for; a
    grammar that does not compile is refused as without harmony: 400
    naming the field."""
    with Server.of(marked_model, reasoning_parser="harmony") as server:
        response = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": CHAT, "max_tokens": 4, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_grammar_under_harmony_needs_harmony_tokens(chat_model):
    """A tokenizer without harmony's tokens cannot write the final channel:
    400 naming the grammar's field and the tokens it lacks."""
    with Server.of(chat_model, reasoning_parser="harmony") as server:
        response = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": CHAT, "max_tokens": 4, "guided_choice": ["a"]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "guided_choice" and "<|channel|>" in error["message"]
