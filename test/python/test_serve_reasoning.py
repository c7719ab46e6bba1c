"""Reasoning in chat answers (`etc.serve.reasoning`): Qwen3's `<think>` and
gpt-oss's harmony channels split into `reasoning_content` and `content`,
by the parser itself (every chunking of an answer) and end to end through
the `openai` client, the tiny chat model made to write a chosen answer."""

import numpy as np
import pytest

import etc.serve
from etc.serve import reasoning
from etc.serve.reasoning import Reader, parser_for, split
from test_serve import CHAT, NAME, Server

QWEN3 = "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"
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
        assert not any("<|" in p or "think>" in p for _, p in pieces), size


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
    assert reasoning.CHOICES == ("auto", "none", "qwen3", "harmony")


def test_the_cli_refuses_an_unknown_parser(capsys):
    from etc.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "x", "--reasoning-parser", "deepseek"])
    assert "--reasoning-parser" in capsys.readouterr().err


# -- end to end -------------------------------------------------------------


@pytest.fixture(scope="module")
def marked_model(tmp_path_factory):
    """The tiny chat model with harmony's special tokens and Qwen3's
    `<think>` `</think>` (added tokens, not special, as Qwen3's) in its
    tokenizer, and 128 positions: EOS id 2."""
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
                          AddedToken("</think>", special=False)])
    tokenizer.save(str(path / "tokenizer.json"))
    return etc.models.load(path, workers=2, max_seq_len=128, attention_chunk=16)


@pytest.fixture
def scripted(marked_model, monkeypatch):
    """Makes the model answer CHAT (with `tools`) with `text` (then EOS)."""
    tok = marked_model.tokenizer
    step = marked_model.step

    def script(text: str, **template):
        prompt = len(tok.encode(tok.apply_chat_template(CHAT, **template),
                                add_special_tokens=False))
        answer = tok.encode(text, add_special_tokens=False) + [2]

        def forced(cache, requests, *args, **options):
            logits, ids, *rest = step(cache, requests, *args, **options)
            ends = [r.start + len(r.tokens) - prompt for r in requests]
            forced_ids = np.array([answer[min(max(e, 0), len(answer) - 1)] for e in ends],
                                  dtype=ids.dtype)
            return (logits, forced_ids, *rest)

        monkeypatch.setattr(marked_model, "step", forced)
        return answer

    return script


def test_auto_finds_the_markers(marked_model, chat_model):
    assert parser_for(marked_model.config.architecture, marked_model.tokenizer) == "harmony"
    assert parser_for(chat_model.config.architecture, chat_model.tokenizer) is None


@pytest.mark.parametrize("parser, text, expected", [
    ("qwen3", QWEN3, ("\nThe user greets.\n", "Hello! How can I help?")),
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
