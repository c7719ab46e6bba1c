"""Tokenizers of the chat formats that carry reasoning, for tests: harmony
(gpt-oss: `<|channel|>` messages, reasoning in the analysis channel) and
Qwen3's `<think>` with its `enable_thinking` switch, and Seed-OSS's
`<seed:think>` with its `thinking_budget`. Each is the tiny
byte-level BPE of `write_tokenizer` with the format's tokens added and a
chat template that renders prompts the way the family's own does (the
generation prompt the reasoning parsers of `etc.models.reasoning` expect),
without its system-prompt and tool-listing details."""

from __future__ import annotations

from pathlib import Path

from .checkpoints import write_tokenizer

__all__ = ["HARMONY_TEMPLATE", "QWEN3_TEMPLATE", "SEED_OSS_TEMPLATE", "HARMONY_TOKENS",
           "write_chat_tokenizer"]

#: gpt-oss's special tokens (special: decoding skips them by default).
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>",
                  "<|call|>", "<|constrain|>")

#: gpt-oss's layout: a message is `<|start|>ROLE<|message|>TEXT<|end|>`,
#: the answer starts after `<|start|>assistant` (the model writes the
#: channel). Tools, when given, are listed in a developer message.
HARMONY_TEMPLATE = (
    "{% if tools %}<|start|>developer<|message|># Tools\n"
    "{% for tool in tools %}{{ tool['function']['name'] }}\n{% endfor %}<|end|>{% endif %}"
    "{% for message in messages %}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")

#: Qwen3's layout: ChatML, tool calls as `<tool_call>` blocks;
#: `enable_thinking=false` closes an empty `<think>` in the prompt so the
#: answer is all content.
QWEN3_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\nCall one in <tool_call></tool_call> tags."
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}")

#: Seed-OSS's layout: `<seed:bos>ROLE\nTEXT` then EOS (`<|im_end|>` here,
#: `<seed:eos>` there); the answer starts after `<seed:bos>assistant\n`,
#: where the model opens `<seed:think>` itself. `thinking_budget=0`
#: closes a think block in the prompt, so the answer is all content.
SEED_OSS_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<seed:bos>' + message['role'] + '\n' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<seed:bos>assistant\n"
    "{% if thinking_budget is defined and thinking_budget == 0 %}<seed:think>\n"
    "The current thinking budget is 0, so I will directly start answering the question.\n"
    "</seed:think>{% endif %}{% endif %}")


def write_chat_tokenizer(path, vocab_size: int, chat_format: str) -> Path:
    """Writes to directory `path` a tokenizer of at most `vocab_size` ids in
    `chat_format` ("harmony", "qwen3" or "seed_oss"): `write_tokenizer`'s
    BPE (EOS `<|im_end|>`, id 2) with harmony's special tokens, Qwen3's
    `<think>` `</think>` `<tool_call>` `</tool_call>` (added tokens, not
    special, as Qwen3's) or Seed-OSS's `<seed:bos>` (special) and
    `<seed:think>` `</seed:think>` (added, not special: decoded into the
    text the reader splits), and the format's chat template."""
    from tokenizers import AddedToken, Tokenizer

    if chat_format == "harmony":
        added, template = list(HARMONY_TOKENS), HARMONY_TEMPLATE
    elif chat_format == "qwen3":
        added = [AddedToken(t, special=False)
                 for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")]
        template = QWEN3_TEMPLATE
    elif chat_format == "seed_oss":
        added = [AddedToken("<seed:bos>", special=True)] + [
            AddedToken(t, special=False) for t in ("<seed:think>", "</seed:think>")]
        template = SEED_OSS_TEMPLATE
    else:
        raise ValueError(f"write_chat_tokenizer: chat_format={chat_format!r} must be "
                         f"'harmony', 'qwen3' or 'seed_oss'")
    path = write_tokenizer(path, vocab_size - len(added), chat_template=template)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    if chat_format == "harmony":
        tokenizer.add_special_tokens(added)
    else:
        tokenizer.add_tokens(added)
    tokenizer.save(str(path / "tokenizer.json"))
    return path
