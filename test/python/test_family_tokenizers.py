"""The families' text side: chat templates in the shapes Gemma, Mistral and
Phi-3 ship, rendered as transformers renders them, and the SentencePiece
tokenizer of a GGUF file (Gemma's, Phi-3's: pieces, scores and types, no
merges) encoding as the BPE it was learned as, down to a model generating
from a chat. The families' models: test_families.py."""

from __future__ import annotations

import json

import pytest

import etc.models as models
from etc.models.testing import write_gguf
from test_families import GGUF_FAMILIES, LOAD

# ----------------------------------------------------------------------
# Chat templates of the families' shapes
# ----------------------------------------------------------------------

#: Chat templates in the shapes these families ship (written here): Gemma's
#: turns (`<start_of_turn>user` / `model`, the system prompt folded into the
#: first user turn, text parts, trimmed contents, alternating roles),
#: Mistral's `[INST]` and Phi-3's `<|user|>` / `<|end|>`.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('roles must alternate user/assistant') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- else -%}
        {%- for part in message['content'] if part['type'] == 'text' -%}
            {{ part['text'] | trim }}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}"""
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}")
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "  Hi there  "},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": [{"type": "text", "text": "Why?"}]}]


@pytest.mark.parametrize("template, tokens, conversation, expected", [
    (GEMMA_TEMPLATE, ("<bos>", "<eos>"), CONVERSATION,
     "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
     "Hello!<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n"),
    (MISTRAL_TEMPLATE, ("<s>", "</s>"),
     CONVERSATION[1:3] + [{"role": "user", "content": "Why?"}],
     "<s>[INST]   Hi there   [/INST]Hello!</s>[INST] Why? [/INST]"),
    (PHI3_TEMPLATE, ("<s>", "<|endoftext|>"),
     CONVERSATION[:3] + [{"role": "user", "content": "Why?"}],
     "<|system|>\nBe brief.<|end|>\n<|user|>\n  Hi there  <|end|>\n<|assistant|>\nHello!"
     "<|end|>\n<|user|>\nWhy?<|end|>\n<|assistant|>\n"),
], ids=["gemma", "mistral", "phi3"])
def test_family_chat_templates_render_as_transformers_renders_them(template, tokens,
                                                                   conversation, expected,
                                                                   tmp_path):
    """Each family's template shape, rendered by ETC's tokenizer: the text
    transformers 5.24.0 renders for it (whitespace control, `is string`,
    `trim`, filtered loops, the system prompt folded into Gemma's first
    turn); a conversation that does not alternate is the template's own
    error; Gemma's turn markers, as special tokens, are one id each."""
    from etc.models.loading.tokenizer import ChatTemplateError, Tokenizer
    from etc.models.testing import write_tokenizer

    backend = Tokenizer.from_directory(write_tokenizer(tmp_path, 320)).backend
    tokenizer = Tokenizer(backend, chat_template=template, bos_token=tokens[0],
                          eos_token=tokens[1])
    assert tokenizer.apply_chat_template(conversation) == expected
    if template is not PHI3_TEMPLATE:
        with pytest.raises(ChatTemplateError, match="roles must alternate"):
            tokenizer.apply_chat_template([{"role": "user", "content": "a"},
                                           {"role": "user", "content": "b"}])
    if template is GEMMA_TEMPLATE:
        from tokenizers import AddedToken

        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in ("<bos>", "<start_of_turn>", "<end_of_turn>")])
        ids = tokenizer.encode(expected, add_special_tokens=False)
        marks = [backend.token_to_id(t) for t in ("<start_of_turn>", "<end_of_turn>")]
        assert ids.count(marks[0]) == 4 and ids.count(marks[1]) == 3
        assert tokenizer.decode(ids) == expected.replace("<bos>", "").replace(
            "<start_of_turn>", "").replace("<end_of_turn>", "")


#: Templates in the shapes Seed-OSS and DeepSeek-V3.1 ship (written here),
#: for the jinja they use beyond the shapes above: Seed-OSS's thinking-budget
#: table (`dictsort` over int keys, a `namespace` found in a loop), a type
#: `macro`, tools listed with `.items()` and `tojson(ensure_ascii=False)`,
#: a call's arguments with the `items` filter and `| string`; DeepSeek's
#: `namespace` flags, `str.split('</think>', 1)` dropping an earlier
#: answer's reasoning, and a generation prompt that opens `<think>` or
#: closes it (`thinking`).
SEED_SHAPE = """{%- set budgets = {0: 0, 512: 128, 1024: 256} -%}
{%- if thinking_budget is not defined -%}{%- set thinking_budget = -1 -%}{%- endif -%}
{%- set ns = namespace(interval=none) -%}
{%- for limit, every in budgets | dictsort -%}
    {%- if ns.interval is none and thinking_budget <= limit -%}
        {%- set ns.interval = every -%}
    {%- endif -%}
{%- endfor -%}
{%- macro kind(t) -%}{%- if t == 'string' -%}str{%- else -%}Any{%- endif -%}{%- endmacro -%}
{%- if tools is iterable and tools | length > 0 -%}
{{ '<seed:bos>system\\n' }}
{%- for tool in tools if tool.type == 'function' -%}
def {{ tool.function.name }}(
{%- for name, spec in tool.function.parameters.properties.items() -%}
{{ name }}: {{ kind(spec.type) }}{{ ', ' if not loop.last }}
{%- endfor -%})
{% endfor -%}
{{ tools | tojson(ensure_ascii=False) }}
{{- '<seed:eos>' }}
{%- endif -%}
{%- if thinking_budget > 0 -%}
{{ '<seed:bos>system\\nbudget ' ~ thinking_budget ~ ', every ' ~ ns.interval ~ '<seed:eos>' }}
{%- endif -%}
{%- for message in messages -%}
{{ '<seed:bos>' + message.role + '\\n' }}
{%- if message.tool_calls is defined and message.tool_calls | length > 0 -%}
    {%- for call in message.tool_calls -%}
        {{ '<function=' + call.function.name + '>' }}
        {%- for key, value in call.function.arguments | items -%}
            {{ '<parameter=' + key + '>' + (value if value is string else value | string)
               + '</parameter>' }}
        {%- endfor -%}
        {{ '</function>' }}
    {%- endfor -%}
{%- else -%}
    {{ message.content | trim }}
{%- endif -%}
{{ '<seed:eos>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<seed:bos>assistant\\n' }}{%- endif -%}"""

DEEPSEEK_SHAPE = (
    "{%- if not thinking is defined -%}{%- set thinking = false -%}{%- endif -%}"
    "{%- set ns = namespace(system='', last_user=false) -%}"
    "{%- for message in messages if message['role'] == 'system' -%}"
    "{%- set ns.system = ns.system + message['content'] -%}{%- endfor -%}"
    "{{ bos_token }}{{ ns.system }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_user = true -%}"
    "{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>', 1)[1] -%}"
    "{%- endif -%}"
    "{{ '<｜Assistant｜></think>' + content + '<｜end▁of▁sentence｜>' }}"
    "{%- set ns.last_user = false -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and ns.last_user -%}"
    "{{ '<｜Assistant｜>' + ('<think>' if thinking else '</think>') }}{%- endif -%}")

TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}}}}}]
THOUGHT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Météo ?"},
           {"role": "assistant", "content": "<think>The user asks.</think>Where?"},
           {"role": "user", "content": "Paris"}]
CALLED = [{"role": "user", "content": "Paris"},
          {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
              "name": "weather", "arguments": {"city": "Paris", "days": 2}}}]}]


@pytest.mark.parametrize("template, variables, expected", [
    (SEED_SHAPE, dict(tools=TOOLS), "<seed:bos>system\ndef weather(city: str, "
     "days: Any)\n[{\"type\": \"function\", \"function\": {\"name\": \"weather\", "
     "\"description\": \"Weather.\", \"parameters\": {\"type\": \"object\", "
     "\"properties\": {\"city\": {\"type\": \"string\"}, "
     "\"days\": {\"type\": \"integer\"}}}}}]<seed:eos><seed:bos>"
     "system\nBe brief.<seed:eos><seed:bos>user\nMétéo ?<seed:eos><seed:bos>"
     "assistant\n<think>The user asks.</think>Where?<seed:eos><seed:bos>"
     "user\nParis<seed:eos><seed:bos>assistant\n"),
    (SEED_SHAPE, dict(thinking_budget=600),
     "<seed:bos>system\nbudget 600, every 256<seed:eos><seed:bos>"
     "user\nParis<seed:eos><seed:bos>assistant\n<function=weather>"
     "<parameter=city>Paris</parameter><parameter=days>2</parameter>"
     "</function><seed:eos><seed:bos>assistant\n"),
    (DEEPSEEK_SHAPE, {}, "<B>Be brief.<｜User｜>Météo ?<｜Assistant｜></think>"
     "Where?<｜end▁of▁sentence｜><｜User｜>Paris<｜Assistant｜></think>"),
    (DEEPSEEK_SHAPE, dict(thinking=True),
     "<B>Be brief.<｜User｜>Météo ?<｜Assistant｜></think>"
     "Where?<｜end▁of▁sentence｜><｜User｜>Paris<｜Assistant｜><think>"),
], ids=["seed-tools", "seed-budget-call", "deepseek", "deepseek-thinking"])
def test_new_family_template_shapes_render_as_transformers_renders_them(template, variables,
                                                                       expected, tmp_path):
    """The text transformers 5.24.0 renders for each (`venv-peer`,
    `transformers.utils.chat_template_utils`, the same variables), and
    the reasoning parser `auto` gives these families (`qwen3`: their
    tokenizers have a `</think>`) reading an answer to DeepSeek's prompt:
    reasoning after a prompt that opened `<think>`, content after one that
    closed it."""
    from etc.models.loading.tokenizer import Tokenizer
    from etc.models.reasoning import split
    from etc.models.testing import write_tokenizer

    backend = Tokenizer.from_directory(write_tokenizer(tmp_path, 320)).backend
    tokenizer = Tokenizer(backend, chat_template=template, bos_token="<B>", eos_token="<E>")
    messages = CALLED if "thinking_budget" in variables else THOUGHT
    prompt = tokenizer.apply_chat_template(messages, **variables)
    assert prompt == expected
    if template is DEEPSEEK_SHAPE:
        thinking = variables.get("thinking", False)
        assert split("qwen3", "Sunny.</think>It is sunny.", prompt) == (
            ("Sunny.", "It is sunny.", []) if thinking else
            (None, "Sunny.</think>It is sunny.", []))


# ----------------------------------------------------------------------
# SentencePiece tokenizers of GGUF files (Gemma, Phi-3)
# ----------------------------------------------------------------------


def _sentencepiece_vocabulary():
    """A SentencePiece-BPE-like vocabulary learned here on TEXT: control
    pieces, the 256 byte pieces, then the learned pieces, each scored by
    the rank of the merge that made it (single characters lowest); and
    the `tokenizers` BPE it was learned as (over text with spaces as ▁)."""
    from tokenizers import Tokenizer, models, trainers

    from etc.models.loading.spm import BYTE, CONTROL, NORMAL, SPACE, UNKNOWN
    from etc.models.testing import TEXT

    control = ["<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    learned = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=260, show_progress=False)
    learned.train_from_iterator([line.replace(" ", SPACE) for line in TEXT.splitlines()],
                                trainer)
    state = json.loads(learned.to_str())["model"]
    rank = {"".join(m if isinstance(m, list) else m.split(" ")): i
            for i, m in enumerate(state["merges"])}
    pieces = control + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN] + [CONTROL] * 4 + [BYTE] * 256
    scores = [0.0] * len(pieces)
    for piece, _ in sorted(state["vocab"].items(), key=lambda item: item[1]):
        pieces.append(piece)
        types.append(NORMAL)
        scores.append(-float(rank[piece]) if piece in rank else -1e4)
    return pieces, scores, types, learned


def test_gguf_sentencepiece_tokenizer_encodes_as_its_merges_do(tmp_path):
    """A GGUF file's "llama" tokenizer (pieces, scores, types; no merges):
    text encodes to the pieces the learned BPE gives (merges ranked by the
    joined piece's score), round trips, falls back to byte pieces for
    characters outside the vocabulary, keeps control pieces whole, and
    renders a Gemma chat template; the space prefix follows
    tokenizer.ggml.add_space_prefix."""
    from etc.models.loading.gguf import GGUFCheckpoint, GGUFError
    from etc.models.loading.spm import SPACE
    from etc.models.testing import TEXT

    pieces, scores, types, learned = _sentencepiece_vocabulary()
    config = {**GGUF_FAMILIES["gemma3"], "vocab_size": len(pieces)}
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
                "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 4, "tokenizer.ggml.unknown_token_id": 0,
                "tokenizer.chat_template": GEMMA_TEMPLATE}
    path = write_gguf(tmp_path / "spm.gguf", config, metadata=metadata)
    tokenizer = GGUFCheckpoint(path).tokenizer()
    for line in TEXT.splitlines():
        ids = tokenizer.encode(line, add_special_tokens=False)
        want = learned.encode(line.replace(" ", SPACE)).tokens
        assert [pieces[i] for i in ids] == want, line
        assert tokenizer.decode(ids) == line
    outside = tokenizer.encode("ΩΩ", add_special_tokens=False)
    assert [pieces[i] for i in outside] == ["<0xCE>", "<0xA9>"] * 2
    assert tokenizer.decode(outside) == "ΩΩ"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert chat == "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
    ids = tokenizer.encode(chat, add_special_tokens=False)
    assert ids[:2] == [1, 3] and ids.count(3) == 2 and ids.count(4) == 1
    prefixed = write_gguf(tmp_path / "prefix.gguf", config, metadata={
        **metadata, "tokenizer.ggml.add_space_prefix": True})
    with_prefix = GGUFCheckpoint(prefixed).tokenizer()
    ids = with_prefix.encode("Hello world", add_special_tokens=False)
    assert pieces[ids[0]].startswith(SPACE) and with_prefix.decode(ids) == "Hello world"
    # The whole model from the file, generating from a chat.
    model = models.load(path, **LOAD)
    chat_out = model.generate([{"role": "user", "content": "Hello"}], 3, ignore_eos=True)
    ids = tokenizer.encode(chat, add_special_tokens=False)
    assert chat_out.tokens == model.generate([ids], 3, ignore_eos=True).tokens
    no_scores = write_gguf(tmp_path / "bad.gguf", config, metadata={
        **metadata, "tokenizer.ggml.scores": None})
    with pytest.raises(GGUFError, match=r"tokenizer.ggml.scores is missing"):
        GGUFCheckpoint(no_scores).tokenizer()
