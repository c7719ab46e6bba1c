"""Tool calls: the formats model families write them in (a parser per
family), the grammar that forces a call where `tool_choice` asks for one,
and the calls as OpenAI's API returns them.

* `hermes` (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`, one block per call;
* `llama3_json` (Llama 3.1-3.3): the answer is one JSON object `{"name":
  ..., "parameters": {...}}`.

The parser is chosen from the chat template (`parser_for`): one that
writes `<tool_call>` is Hermes', one that names `ipython` or
`<|python_tag|>` Llama's.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Optional

__all__ = ["PARSERS", "parser_for", "parse", "forced_grammar"]

PARSERS = ("hermes", "llama3_json")

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parser_for(chat_template: Optional[str]) -> Optional[str]:
    """The tool-call format of a chat template, or None when it has none."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3_json"
    return None


def parse(parser: str, text: str) -> tuple[Optional[str], list]:
    """(content, calls) of an answer: the text outside the calls (None when
    nothing is left) and the calls, {"id", "type", "function": {"name",
    "arguments" (a JSON string)}}. Text that is no well-formed call stays
    content."""
    calls = []
    if parser == "hermes":
        rest = []
        end = 0
        for match in _HERMES.finditer(text):
            call = _call(match.group(1), "arguments")
            if call is None:
                continue
            rest.append(text[end:match.start()])
            end = match.end()
            calls.append(call)
        rest.append(text[end:])
        content = "".join(rest).strip()
        return (content or None) if calls else text, calls
    if parser == "llama3_json":
        body = text.strip().removeprefix("<|python_tag|>")
        call = _call(body, "parameters") or _call(body, "arguments")
        return (None, [call]) if call is not None else (text, [])
    raise ValueError(f"unknown tool-call parser {parser!r}; one of {PARSERS}")


def _call(text: str, arguments_key: str) -> Optional[dict]:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or \
            not isinstance(value.get(arguments_key, {}), dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": json.dumps(value.get(arguments_key, {}),
                                                 ensure_ascii=False)}}


def _schema(tool: dict, arguments_key: str) -> dict:
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             arguments_key: parameters},
            "required": ["name", arguments_key], "additionalProperties": False}


def forced_grammar(parser: str, tools: list, name: Optional[str]) -> str:
    """A Lark grammar (llguidance's, with `%json`) of an answer that is one
    call (of the tool `name`, or of any of `tools`) in `parser`'s format,
    its arguments valid against the function's parameters."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    key = "arguments" if parser == "hermes" else "parameters"
    schema = {"anyOf": [_schema(t, key) for t in chosen]} if len(chosen) > 1 else \
        _schema(chosen[0], key)
    call = f"%json {json.dumps(schema)}"
    if parser == "hermes":
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n'
    return f"start: call\ncall: {call}\n"
