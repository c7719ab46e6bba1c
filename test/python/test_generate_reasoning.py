"""`Model.generate` on models that reason: a chat answer's text is its
content, the reasoning (harmony's analysis channel, Qwen3's `<think>`,
Seed-OSS's `<seed:think>`) in
`Generation.reasoning` and the tool calls in `Generation.tool_calls`, as
the server's chat completions return them for the same tokens. Tiny
random gpt-oss, Qwen3 and Seed-OSS checkpoints with their formats' tokenizers
(`etc.models.testing.chat_formats`), made to write a chosen answer."""

import re

import pytest

import etc.models
from etc.models.loading.tokenizer import ChatTemplateError
from etc.models.testing import tiny_config, write_checkpoint
from etc.models.testing.chat_formats import write_chat_tokenizer
from test_serve import NAME, Server, force_answer

CHAT = [{"role": "user", "content": "Hello"}]
VOCAB = 336
EOS = 2  # <|im_end|>
HARMONY = ("<|channel|>analysis<|message|>User says hello.<|end|><|start|>assistant"
           "<|channel|>final<|message|>Hi there!<|return|>")
HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                "<|message|>{\"city\":\"Paris\"}<|call|>")
QWEN3 = "<think>\nThe user greets.\n</think>\n\nHello! How are you?"
QWEN3_CALL = ('<think>Call f.</think>\n\nLet me check.\n<tool_call>\n'
              '{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
SEED = "<seed:think>The user greets.</seed:think>\nHello! How are you?"
F = [{"type": "function", "function": {"name": "f"}}]
LOAD = dict(workers=2, max_seq_len=160, attention_chunk=16)


def _model(root, architecture: str, chat_format: str):
    path = write_checkpoint(root / chat_format, tiny_config(architecture, vocab_size=VOCAB))
    write_chat_tokenizer(path, VOCAB, chat_format)
    return etc.models.load(path, **LOAD)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("gptoss"), "GptOssForCausalLM", "harmony")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM", "qwen3")


@pytest.fixture(scope="module")
def seed_oss(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("seed"), "SeedOssForCausalLM", "seed_oss")


@pytest.fixture
def scripted(monkeypatch):
    """Makes `model` answer CHAT (rendered with `template`) with `text`,
    then EOS: the ids of the answer."""
    return lambda model, text, **template: force_answer(model, monkeypatch, CHAT, text, EOS,
                                                        **template)


def test_harmony_answer_is_content_and_reasoning(gpt_oss, scripted):
    """gpt-oss: the final channel is the text, the analysis the reasoning;
    `<|return|>` ends the answer (a stop id, kept in `tokens`). Without a
    parser the text is what it was: the channels' names run into it."""
    answer = scripted(gpt_oss, HARMONY)
    out = gpt_oss.generate(CHAT, 80)
    assert (out.text, out.reasoning, out.tool_calls) == (["Hi there!"], ["User says hello."],
                                                         [[]])
    assert out.finish_reasons == ["stop"] and out.tokens == [answer[:-1]]
    raw = gpt_oss.generate(CHAT, 80, reasoning_parser="none")
    assert raw.text == ["analysisUser says hello.assistantfinalHi there!"]
    assert raw.reasoning is None and raw.tokens == [answer]  # EOS ended it
    # A text prompt is read as the completions endpoint reads it: all text.
    both = gpt_oss.generate([CHAT, "Hello"], 80)
    assert both.text[0] == "Hi there!" and both.reasoning == ["User says hello.", None]


def test_harmony_call(gpt_oss, scripted):
    """A call to functions.NAME is a tool call (whether or not the template
    offered tools), its arguments as written; the content is empty."""
    scripted(gpt_oss, HARMONY_CALL)
    out = gpt_oss.generate(CHAT, 90)
    assert (out.text, out.reasoning) == ([""], ["Need the weather."])
    assert [c["function"] for c in out.tool_calls[0]] == [
        {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]
    assert out.finish_reasons == ["stop"]


@pytest.mark.parametrize("text, template, expected", [
    (QWEN3, {}, ("\nThe user greets.\n", "Hello! How are you?")),
    # No <think>: all content.
    ("Just this.", {}, (None, "Just this.")),
    # enable_thinking=false: the template closed an empty <think> itself.
    ("Yes.", {"enable_thinking": False}, (None, "Yes.")),
    ("<think>cut short", {}, ("cut short", "")),
])
def test_qwen3_answer_is_content_and_reasoning(qwen3, scripted, text, template, expected):
    scripted(qwen3, text, **template)
    out = qwen3.generate(CHAT, 60, chat_template_kwargs=template or None)
    assert (out.reasoning[0], out.text[0]) == expected
    assert out.tool_calls == [[]]


@pytest.mark.parametrize("text, template, expected", [
    (SEED, {}, ("The user greets.", "Hello! How are you?")),
    # The template ends the prompt with `<seed:bos>assistant\n`: an answer
    # that opens no <seed:think> is all content.
    ("Just this.", {}, (None, "Just this.")),
    # thinking_budget=0: the template closed a think block itself.
    ("Yes.", {"thinking_budget": 0}, (None, "Yes.")),
    ("<seed:think>cut short", {}, ("cut short", "")),
])
def test_seed_oss_answer_is_content_and_reasoning(seed_oss, scripted, text, template,
                                                  expected):
    """Seed-OSS: auto picks seed_oss (the tokenizer has `</seed:think>`);
    `none` leaves the tags in the text."""
    from etc.models.reasoning import parser_for

    assert parser_for(seed_oss.config.architecture, seed_oss.tokenizer) == "seed_oss"
    scripted(seed_oss, text, **template)
    out = seed_oss.generate(CHAT, 60, chat_template_kwargs=template or None)
    assert (out.reasoning[0], out.text[0]) == expected
    raw = seed_oss.generate(CHAT, 60, chat_template_kwargs=template or None,
                            reasoning_parser="none")
    assert raw.reasoning is None and raw.text == [text]


def test_qwen3_call_with_tools_offered(qwen3, scripted):
    """Tools offered to the template: a `<tool_call>` block is a call, the
    text around it the content; not offered, it stays content."""
    scripted(qwen3, QWEN3_CALL, tools=F)
    out = qwen3.generate(CHAT, 90, chat_template_kwargs={"tools": F})
    assert (out.reasoning, out.text) == (["Call f."], ["Let me check."])
    assert [c["function"] for c in out.tool_calls[0]] == [
        {"name": "f", "arguments": "{\"x\": 1}"}]
    scripted(qwen3, QWEN3_CALL)
    out = qwen3.generate(CHAT, 90)
    assert out.tool_calls == [[]] and out.text[0].startswith("Let me check.\n<tool_call>")


@pytest.mark.parametrize("fixture, text, tools", [
    ("gpt_oss", HARMONY, None), ("gpt_oss", HARMONY_CALL, WEATHER), ("qwen3", QWEN3, None),
    ("qwen3", QWEN3_CALL, F), ("seed_oss", SEED, None),
])
def test_server_and_generate_agree(request, scripted, fixture, text, tools):
    """The same answer through the server's chat completions and through
    generate: the same content (null there, "" here), reasoning and calls."""
    model = request.getfixturevalue(fixture)
    scripted(model, text, **({"tools": tools} if tools else {}))
    out = model.generate(CHAT, 90, chat_template_kwargs={"tools": tools} if tools else None)
    with Server.of(model) as server:
        reply = server.client().chat.completions.create(
            model=NAME, messages=CHAT, max_tokens=90, temperature=0,
            **({"tools": tools} if tools else {}))
    message = reply.choices[0].message
    assert (message.content or "", message.reasoning_content) == (out.text[0],
                                                                 out.reasoning[0])
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or ()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls[0]]


def test_a_grammar_follows_the_reasoning_parser(gpt_oss):
    """response_format on a harmony chat holds for the final message
    (after `<|channel|>final<|message|>`, the analysis free); with
    reasoning_parser="none" the answer is read as plain text, so the
    grammar holds for all of it."""
    from etc.models.engine.constraints import Grammar
    from etc.models.step.sampling import SamplingParams

    grammar = Grammar("regex", "[0-9]{3}")
    # The random model's analysis ends soon (<|end|> favoured).
    end = gpt_oss.tokenizer.token_to_id("<|end|>")
    read = gpt_oss.generate(CHAT, 60, response_format=grammar, sampling=SamplingParams(
        temperature=1.0, seed=0, logit_bias={end: 100}))
    written = gpt_oss.tokenizer.decode(read.tokens[0], skip_special_tokens=False)
    assert "<|channel|>final<|message|>" + read.text[0] in written, written
    assert re.fullmatch("[0-9]{3}", read.text[0]), read.text
    plain = gpt_oss.generate(CHAT, 60, response_format=grammar, reasoning_parser="none")
    assert re.fullmatch("[0-9]{3}", plain.text[0]) and plain.finish_reasons == ["stop"], plain
    # Tools offered beside it, the model could call none: refused, as the
    # server refuses a grammar with tools (tool_choice auto) under harmony.
    with pytest.raises(ValueError, match="response_format with the tools"):
        gpt_oss.generate(CHAT, 4, response_format=grammar,
                         chat_template_kwargs={"tools": WEATHER})


def test_refusals_name_the_argument(gpt_oss, tmp_path):
    with pytest.raises(ValueError, match="reasoning_parser='deepseek'"):
        gpt_oss.generate(CHAT, 4, reasoning_parser="deepseek")
    plain = write_checkpoint(tmp_path / "plain", tiny_config(vocab_size=VOCAB), tokenizer=True)
    model = etc.models.load(plain, **LOAD)
    # Its template writes no call format ETC reads: the tools would be ignored.
    with pytest.raises(ValueError, match=r"chat_template_kwargs\['tools'\]"):
        model.generate(CHAT, 4, chat_template_kwargs={"tools": F})
    out = model.generate(CHAT, 4)
    assert out.reasoning is None and out.tool_calls == [[]]
    # Template variables with no chat to render them with would be ignored.
    with pytest.raises(ValueError, match=r"chat_template_kwargs=.*no prompt is a chat"):
        gpt_oss.generate(["Hello", [1, 2]], 4, chat_template_kwargs={"enable_thinking": False})
    # What the template cannot render names the prompt (this one joins
    # contents as strings: a list of text parts is a TypeError in it).
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    with pytest.raises(ChatTemplateError, match=r"generate: prompt 1: the chat template "
                                                r"cannot take its messages"):
        gpt_oss.generate([CHAT, parts], 4)


# -- the command line ---------------------------------------------------------


def test_etc_generate_reads_reasoning_in_chats_only(capsys):
    """--reasoning-parser qwen3/harmony without --chat would be ignored (a
    text prompt's answer is all text): refused before the model loads.
    The choices are the library's."""
    from etc.cli import main
    from etc.cli.options import REASONING_CHOICES
    from etc.models.reasoning import CHOICES

    assert REASONING_CHOICES == CHOICES
    assert main(["generate", "no-such-checkpoint", "Hi", "--reasoning-parser", "qwen3"]) == 1
    assert "--reasoning-parser qwen3 reads a chat's answer: give --chat too" in \
        capsys.readouterr().err


def _chat_args(*options):
    from etc.cli import parser

    args = parser().parse_args(["chat", "unused", "--max-new-tokens", "80", *options])
    args.sampling = None  # (run_chat's, from the sampling options)
    return args


@pytest.mark.parametrize("fixture, text, thought, content", [
    ("gpt_oss", HARMONY, "User says hello.", "Hi there!"),
    ("qwen3", QWEN3, "\nThe user greets.\n", "Hello! How are you?"),
    ("seed_oss", SEED, "The user greets.", "Hello! How are you?"),
])
def test_etc_chat_prints_the_content_and_keeps_only_it(request, scripted, monkeypatch, capsys,
                                                      fixture, text, thought, content):
    """`etc chat`: the answer's content on stdout, its reasoning on stderr
    (then a line break), and the conversation's next prompt carries the
    content as the assistant's message; --reasoning-parser none prints
    the text as decoded."""
    import io
    import sys

    from etc.cli.text import chat_loop
    from etc.models.engine import Engine

    model = request.getfixturevalue(fixture)
    scripted(model, text)
    rendered = []
    render = model.tokenizer.apply_chat_template
    monkeypatch.setattr(model.tokenizer, "apply_chat_template",
                        lambda messages, **kw: rendered.append(list(messages)) or
                        render(messages, **kw))
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\nAgain\n"))
    assert chat_loop(Engine, model, _chat_args()) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith(content + "\n"), printed.out
    assert printed.err.startswith(thought + "\n"), printed.err
    assert rendered[1][:2] == [CHAT[0], {"role": "assistant", "content": content}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    chat_loop(Engine, model, _chat_args("--reasoning-parser", "none"))
    assert capsys.readouterr().out == model.tokenizer.decode(
        model.tokenizer.encode(text, add_special_tokens=False)) + "\n"
