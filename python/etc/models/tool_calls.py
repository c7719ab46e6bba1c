"""Tool calls: the formats model families write them in (a parser per
family), the grammar that forces a call where `tool_choice` asks for one,
and the calls as OpenAI's API returns them, whole (`parse`) or streamed
as they are generated (`CallStream`).

* `hermes` (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`, one block per call;
* `llama3_json` (Llama 3.1-3.3): the answer is one JSON object `{"name":
  ..., "parameters": {...}}`.

Both the server and `Model.generate` read calls with these parsers.
gpt-oss's calls (harmony) are read with its channels (`reasoning`); the
grammar that forces one is here too: a commentary message to
`functions.NAME`, after at most one analysis message.

The parser is chosen from the chat template (`parser_for`): one that
writes `<tool_call>` is Hermes', one that names `ipython` or
`<|python_tag|>` Llama's. A call's `arguments` are the text the model
wrote for them (as OpenAI returns them), so that the fragments a stream
sends add up to what the whole answer gives.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Optional

from .engine.constraints import HARMONY_ANALYSIS

__all__ = ["PARSERS", "parser_for", "parse", "forced_grammar", "HARMONY_TOKENS",
           "CallStream"]

PARSERS = ("hermes", "llama3_json")

_OPEN, _CLOSE, _PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
#: The keys of a call's arguments in each format (the first one written counts).
_ARGUMENT_KEYS = {"hermes": ("arguments",), "llama3_json": ("parameters", "arguments")}


def parser_for(chat_template: Optional[str]) -> Optional[str]:
    """The tool-call format of a chat template, or None when it has none."""
    if not chat_template:
        return None
    if _OPEN in chat_template:
        return "hermes"
    if _PYTHON_TAG in chat_template or "ipython" in chat_template:
        return "llama3_json"
    return None


def parse(parser: str, text: str) -> tuple[Optional[str], list]:
    """(content, calls) of an answer: the text outside the calls (None when
    nothing is left) and the calls, {"id", "type", "function": {"name",
    "arguments" (a JSON string)}}. Text that is no well-formed call stays
    content."""
    if parser not in PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}; one of {PARSERS}")
    calls = []
    if parser == "hermes":
        rest = []
        end = 0
        for match in _HERMES.finditer(text):
            call = _call(match.group(1), parser)
            if call is None:
                continue
            rest.append(text[end:match.start()])
            end = match.end()
            calls.append(call)
        rest.append(text[end:])
        content = "".join(rest).strip()
        return (content or None) if calls else text, calls
    call = _call(text.strip().removeprefix(_PYTHON_TAG), parser)
    return (None, [call]) if call is not None else (text, [])


def _call(text: str, parser: str) -> Optional[dict]:
    """The call `text` (one JSON object) is, or None when it is none."""
    try:
        json.loads(text)
    except ValueError:
        return None
    scanner = _CallScanner(_ARGUMENT_KEYS[parser])
    arguments = scanner.feed(text)
    if not scanner.done or scanner.name is None:
        return None
    arguments = arguments if scanner.arguments_seen else "{}"
    if not isinstance(json.loads(arguments), dict):
        return None
    return _header(scanner.name, arguments)


def _header(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _schema(tool: dict, arguments_key: str) -> dict:
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": function["name"]},
                                             arguments_key: parameters},
            "required": ["name", arguments_key], "additionalProperties": False}


#: The special tokens of harmony's forced call (`forced_grammar`), which a
#: tokenizer must have.
HARMONY_TOKENS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>",
                  "<|call|>")


def forced_grammar(parser: str, tools: list, name: Optional[str]) -> str:
    """A Lark grammar (llguidance's, with `%json`) of an answer that is one
    call (of the tool `name`, or of any of `tools`) in `parser`'s format,
    its arguments valid against the function's parameters. `parser`
    "harmony": the call is a commentary message to `functions.NAME` (its
    arguments after `<|constrain|>json`, ended by `<|call|>`), after at
    most one analysis message (the model's reasoning, any text)."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if parser == "harmony":
        return _harmony_grammar(chosen)
    key = _ARGUMENT_KEYS[parser][0]
    schema = {"anyOf": [_schema(t, key) for t in chosen]} if len(chosen) > 1 else \
        _schema(chosen[0], key)
    # No free whitespace: a sampled call would wander through it (as
    # `response_format`'s schemas, `constraints.Grammar`).
    schema["x-guidance"] = {"whitespace_flexible": False}
    call = f"%json {json.dumps(schema)}"
    if parser == "hermes":
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n'
    return f"start: call\ncall: {call}\n"


def _harmony_grammar(tools: list) -> str:
    """`forced_grammar` in harmony's form: what the chat template's
    `<|start|>assistant` is followed by, special tokens as tokens."""
    lines = ['start: analysis? <|channel|> "commentary to=functions." call <|call|>',
             HARMONY_ANALYSIS,
             "call: " + " | ".join(f"call_{k}" for k in range(len(tools)))]
    for k, tool in enumerate(tools):
        function = tool["function"]
        schema = dict(function.get("parameters") or {"type": "object"})
        schema["x-guidance"] = {"whitespace_flexible": False}
        lines.append(f'call_{k}: {json.dumps(function["name"])} " " <|constrain|> "json" '
                     f"<|message|> %json {json.dumps(schema)}")
    return "\n".join(lines) + "\n"


class _CallScanner:
    """Reads one call's JSON object as its text arrives: `name` once its
    string is complete, the text of the arguments' value (that of the
    first of `argument_keys`) as `feed` returns it, `done` at the object's
    end, `failed` where the text is no JSON object. It follows the
    structure only: `_call` checks the whole."""

    def __init__(self, argument_keys: tuple):
        self.argument_keys = argument_keys
        self.name: Optional[str] = None
        self.done = self.failed = False
        self.arguments_seen = False
        self.consumed = 0  # characters fed up to the object's end
        self._depth = 0
        # Where it is at depth 0 or 1: open, key, colon, value (its start),
        # inside (a value at depth 1), after (a value).
        self._part = "open"
        self._string = self._escape = False
        self._reading: Optional[str] = None  # "key", "name", "arguments" or None
        self._text = ""  # of the key or name being read
        self._key = ""  # whose value is being read
        self._fragment: list = []

    def feed(self, text: str) -> str:
        """Reads `text` up to the object's end (`consumed` counts how far);
        returns the arguments' text in it."""
        for ch in text:
            if self.done or self.failed:
                break
            self.consumed += 1
            if self._part == "inside" and not self._string and self._depth == 1 and \
                    (ch.isspace() or ch in ",}"):
                self._end_value()  # a number, true, false or null ends
            if self._string or self._depth > 1 or self._part == "inside":
                self._record(ch)
                self._inside(ch)
            elif not ch.isspace():
                self._top(ch)
        fragment, self._fragment = "".join(self._fragment), []
        return fragment

    def _record(self, ch: str) -> None:
        if self._reading == "arguments":
            self._fragment.append(ch)
        elif self._reading is not None:
            self._text += ch

    def _inside(self, ch: str) -> None:
        """A character of a key or a value."""
        if self._string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._string = False
                if self._depth == 1:
                    self._end_key() if self._reading == "key" else self._end_value()
        elif ch == '"':
            self._string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 1:
                self._end_value()

    def _top(self, ch: str) -> None:
        """A character between the keys and values of the object."""
        part = self._part
        if part == "open" and ch == "{":
            self._depth, self._part = 1, "key"
        elif part == "key" and ch == '"':
            self._reading, self._text = "key", ""
            self._record(ch)
            self._string = True
        elif part == "colon" and ch == ":":
            self._part = "value"
        elif part == "value":
            if self._key in self.argument_keys and not self.arguments_seen:
                self._reading = "arguments"
                self.arguments_seen = True
            elif self._key == "name":
                self._reading, self._text = "name", ""
            self._part = "inside"
            self._record(ch)
            self._inside(ch)
        elif part in ("key", "after") and ch == "}":
            self._depth, self.done = 0, True
        elif part == "after" and ch == ",":
            self._part = "key"
        else:
            self.failed = True

    def _end_key(self) -> None:
        try:
            self._key = json.loads(self._text)
        except ValueError:
            self.failed = True
        self._reading, self._part = None, "colon"

    def _end_value(self) -> None:
        if self._reading == "name":
            try:
                name = json.loads(self._text)
            except ValueError:
                name = None
            self.name = name if isinstance(name, str) else None
        self._reading, self._part = None, "after"


class CallStream:
    """The tool calls of an answer in `parser`'s format, read as its text
    arrives: `feed(text)`, and `finish()` at the end, return the deltas
    that can be sent now, as OpenAI streams them: content; a call's first
    delta (`tool_calls: [{index, id, type, function: {name, arguments:
    ""}}]`) as soon as its name is complete; then the arguments' text as it
    is generated (`{index, function: {arguments}}`), adding up to the
    arguments `parse` gives. Text that may still become a call (a part of
    `<tool_call>`, the space before it) is held back until it is known not
    to. With `parallel` false the calls after the first are read but not
    sent (`parse`'s callers keep the first). A call that turns out
    malformed after its first delta stays a call (a stream cannot take it
    back); before that, its text is content, as `parse` has it."""

    def __init__(self, parser: str, parallel: bool = True):
        if parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {parser!r}; one of {PARSERS}")
        self.parser, self.parallel = parser, parallel
        self.calls = 0  # calls sent
        # hermes: text, call, close (its end tag); llama3_json: start, call, text.
        self._state = "text" if parser == "hermes" else "start"
        self._pending = ""  # text received, not yet sent or read
        self._scanner = _CallScanner(())
        self._call_text = ""  # of the call being read: content if it is none
        self._held = ""  # its arguments read before its name
        self._index: Optional[int] = None  # its index once sent
        self._after_call = False  # the space after a call is no content
        self._deltas: list = []

    def feed(self, text: str) -> list:
        """The deltas `text` (the answer's next text) completes."""
        self._pending += text
        while self._step():
            pass
        return self._take()

    def finish(self) -> list:
        """The deltas of what was held back, at the answer's end."""
        if self._state == "call" and self._index is None:
            self._content(self._call_text + self._pending)
        elif self._state != "close":
            self._content(self._pending.rstrip() if self.calls else self._pending)
        self._pending, self._state = "", "finished"
        return self._take()

    def _take(self) -> list:
        deltas, self._deltas = self._deltas, []
        return deltas

    def _step(self) -> bool:
        """Reads what it can of the pending text; False when it must wait
        for more."""
        pending = self._pending
        if self._state == "call":
            return self._read_call()
        if self._state == "start":  # llama3_json: is the answer a JSON object?
            head = pending.lstrip()
            body = head.removeprefix(_PYTHON_TAG).lstrip()
            if not body or _PYTHON_TAG.startswith(head):
                return False
            if body[0] == "{":
                self._start_call(pending[:len(pending) - len(body)], body)
            else:
                self._state = "text"
            return True
        if self._state == "close":
            head = pending.lstrip()
            if head.startswith(_CLOSE):
                self._pending, self._state = head[len(_CLOSE):], "text"
                return True
            if _CLOSE.startswith(head):
                return False
            self._state = "text"  # no end tag: what follows is content
            return True
        at = pending.find(_OPEN) if self.parser == "hermes" else -1
        if at >= 0:
            before = pending[:at].rstrip()
            self._content(before)  # the space before stays with the call's text
            self._start_call(pending[len(before):at + len(_OPEN)], pending[at + len(_OPEN):])
            return True
        keep = 0
        if self.parser == "hermes":  # a part of the tag at the end, the space before it
            keep = next((n for n in range(min(len(_OPEN) - 1, len(pending)), 0, -1)
                         if _OPEN.startswith(pending[-n:])), 0)
            keep += len(pending) - keep - len(pending[:len(pending) - keep].rstrip())
        self._content(pending[:len(pending) - keep])
        self._pending = pending[len(pending) - keep:]
        return False

    def _start_call(self, opening: str, rest: str) -> None:
        self._state, self._call_text, self._pending = "call", opening, rest
        self._scanner = _CallScanner(_ARGUMENT_KEYS[self.parser])
        self._held, self._index = "", None

    def _read_call(self) -> bool:
        scanner = self._scanner
        before = scanner.consumed
        self._held += scanner.feed(self._pending)
        used = scanner.consumed - before
        self._call_text += self._pending[:used]
        self._pending = self._pending[used:]
        if scanner.name is not None and self._index is None and \
                (self.parallel or not self.calls):
            self._index, self.calls = self.calls, self.calls + 1
            self._deltas.append({"tool_calls": [{"index": self._index,
                                                 **_header(scanner.name, "")}]})
        if scanner.done and not scanner.arguments_seen:
            self._held = "{}"  # as `parse` gives a call without arguments
        if self._index is not None and self._held:
            self._arguments(self._held)
            self._held = ""
        if not (scanner.done or scanner.failed):
            return False
        called = scanner.done and scanner.name is not None
        if not called and self._index is None:
            self._content(self._call_text)  # no call after all
        self._state = "close" if called and self.parser == "hermes" else "text"
        self._after_call = called
        return True

    def _content(self, text: str) -> None:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        if not text:
            return
        if self._deltas and "content" in self._deltas[-1]:
            self._deltas[-1]["content"] += text
        else:
            self._deltas.append({"content": text})

    def _arguments(self, text: str) -> None:
        last = self._deltas[-1].get("tool_calls", [{}])[0] if self._deltas else {}
        if last.get("index") == self._index and "id" not in last:
            last["function"]["arguments"] += text
        else:
            self._deltas.append({"tool_calls": [{"index": self._index,
                                                 "function": {"arguments": text}}]})
