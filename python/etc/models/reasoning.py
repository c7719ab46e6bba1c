"""Reasoning in a chat answer: the part of the generated text a model
thinks in, returned apart from its content (as vLLM's `--reasoning-parser`
and SGLang do): by the server as the message's `reasoning_content`, by
`Model.generate` as `Generation.reasoning`.

* `qwen3` (Qwen3, QwQ): `<think> ... </think>` before the answer. The
  opening tag is the model's or the chat template's (a template that ends
  the prompt with `<think>` has the answer start inside it); an answer
  that opens none is all content (`enable_thinking=false`, Instruct
  models).
* `seed_oss` (Seed-OSS): the same, with `<seed:think> ... </seed:think>`
  (its template ends the prompt with `<seed:bos>assistant\n`: the model
  opens the block itself; `thinking_budget=0` closes one in the prompt).
* `harmony` (gpt-oss): messages `<|channel|>NAME<|message|>TEXT` ended by
  `<|end|>`, `<|return|>` or `<|call|>`, the next one after `<|start|>`
  (and a role). The `analysis` channel is reasoning, `final` (and
  `commentary` without a recipient: a preamble) content; a message to
  `functions.NAME` is a tool call (`calls`).

A `Reader` reads an answer as it is generated: `feed` returns the pieces
(("reasoning_content" | "content", text)) now known, holding back text
that may be the start of a marker, so that a marker split across tokens
or chunks is never sent as text; `finish` returns what was held.

Structured output with harmony constrains the final message only
(`etc.models.engine.constraints.harmony_final`): the reader then takes
content that follows it.
"""

from __future__ import annotations

import re
import uuid
from typing import Optional

from .engine.constraints import writes_harmony

__all__ = ["PARSERS", "CHOICES", "parser_for", "resolve", "Reader", "split", "harmony_stop_ids"]

PARSERS = ("qwen3", "seed_oss", "harmony")
#: What `etc serve --reasoning-parser` takes.
CHOICES = ("auto", "none") + PARSERS

REASONING, CONTENT = "reasoning_content", "content"

#: The think-block formats: (opening tag, closing tag).
_THINK_TAGS = {"qwen3": ("<think>", "</think>"),
               "seed_oss": ("<seed:think>", "</seed:think>")}
_CHANNEL, _MESSAGE, _START = "<|channel|>", "<|message|>", "<|start|>"
_ANSWER_ENDS = ("<|return|>", "<|call|>")  # a message's ends that end the answer
_ENDS = ("<|end|>",) + _ANSWER_ENDS
_HARMONY_MARKERS = (_CHANNEL, _MESSAGE, _START) + _ENDS
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def parser_for(architecture: Optional[str], tokenizer) -> Optional[str]:
    """The reasoning format of a model (`--reasoning-parser auto`): harmony
    where the tokenizer has harmony's `<|channel|>` and `<|message|>`
    tokens (or the model is gpt-oss: `constraints.writes_harmony`),
    seed_oss where it has a `</seed:think>` token, qwen3 where it has a
    `</think>` token; None (all content) otherwise."""
    if writes_harmony(architecture, tokenizer):
        return "harmony"
    if tokenizer is None:
        return None
    for parser in ("seed_oss", "qwen3"):
        if tokenizer.token_to_id(_THINK_TAGS[parser][1]) is not None:
            return parser
    return None


def resolve(choice: Optional[str], architecture: Optional[str], tokenizer) -> Optional[str]:
    """The format a `--reasoning-parser` / `reasoning_parser` choice (one
    of CHOICES, or None) stands for: "auto" the model's (`parser_for`),
    "none" and None no format (all content). Raises ValueError naming an
    unknown choice."""
    if choice not in CHOICES + (None,):
        raise ValueError(f"reasoning_parser={choice!r} must be one of {CHOICES} or None")
    if choice == "auto":
        return parser_for(architecture, tokenizer)
    return None if choice == "none" else choice


def harmony_stop_ids(tokenizer) -> list[int]:
    """The ids of `<|return|>` and `<|call|>` (each ends a harmony answer)
    that the tokenizer has."""
    ids = [tokenizer.token_to_id(t) for t in _ANSWER_ENDS] if tokenizer else []
    return [i for i in ids if i is not None]


def _held(text: str, markers) -> int:
    """Where the longest end of `text` that is a proper start of a marker
    begins (len(text) when none is)."""
    for start in range(max(0, len(text) - max(map(len, markers)) + 1), len(text)):
        tail = text[start:]
        if any(m.startswith(tail) and m != tail for m in markers):
            return start
    return len(text)


class Reader:
    """Splits one answer of format `parser` into reasoning and content as
    it is generated; `prompt` is the rendered prompt's text (qwen3,
    seed_oss: whether the template opened the think block). `calls` are
    the harmony tool calls read (OpenAI's form: {"id", "type", "function":
    {"name", "arguments"}})."""

    def __init__(self, parser: str, prompt: str = ""):
        if parser not in PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; one of {PARSERS}")
        self.parser = parser
        self._read = self._think if parser in _THINK_TAGS else self._harmony
        self.calls: list = []
        self._buffer = ""
        if parser in _THINK_TAGS:
            self._open, self._close = _THINK_TAGS[parser]
            # "start": the answer may yet open the block; "think"; "answer".
            self._state = "think" if prompt.rstrip().endswith(self._open) else "start"
        else:
            # "body" of a message of channel self._channel, or its "header".
            self._state, self._channel, self._recipient, self._header = "body", None, None, ""
            self._arguments = ""

    def feed(self, text: str) -> list:
        """The pieces ((REASONING | CONTENT, text)) that `text`, the
        answer's next text, completes; a possible marker's start is held."""
        self._buffer += text
        out: list = []
        self._read(out, final=False)
        return _merged(out)

    def finish(self) -> list:
        """The pieces of what was held, at the answer's end (a harmony call
        cut short is taken as it stands)."""
        out: list = []
        # A final read leaves nothing held.
        self._read(out, final=True)
        if self.parser == "harmony" and self._recipient is not None:
            self._end_message()  # an answer cut short (max_tokens) mid-call
        return _merged(out)

    # -- qwen3, seed_oss: a think block ---------------------------------------

    def _think(self, out: list, final: bool) -> None:
        while True:
            if self._state == "start":
                stripped = self._buffer.lstrip()
                if stripped.startswith(self._open):
                    self._buffer = stripped[len(self._open):]
                    self._state = "think"
                    continue
                if not final and self._open.startswith(stripped):
                    return  # may yet be the opening tag
                self._state = "answer"
            if self._state == "answer":
                if self._buffer:
                    out.append((CONTENT, self._buffer))
                self._buffer = ""
                return
            if self._state == "after":  # blank lines still arriving
                self._buffer = self._buffer.lstrip("\n")
                if not self._buffer and not final:
                    return
                self._state = "answer"
                continue
            # thinking: up to the closing tag
            end = self._buffer.find(self._close)
            if end >= 0:
                if end:
                    out.append((REASONING, self._buffer[:end]))
                # "after" drops the template's blank lines before the answer.
                self._buffer = self._buffer[end + len(self._close):]
                self._state = "after"
                continue
            keep = len(self._buffer) if final else _held(self._buffer, (self._close,))
            if keep:
                out.append((REASONING, self._buffer[:keep]))
            self._buffer = self._buffer[keep:]
            return

    # -- harmony ---------------------------------------------------------------

    def _field(self) -> Optional[str]:
        """Where a message's body goes: None for a tool call's arguments."""
        if self._recipient is not None:
            return None
        return REASONING if self._channel == "analysis" else CONTENT

    def _harmony(self, out: list, final: bool) -> None:
        while True:
            found = [(self._buffer.find(m), m) for m in _HARMONY_MARKERS]
            found = [(at, m) for at, m in found if at >= 0]
            at, marker = min(found) if found else (-1, None)
            text = self._buffer if marker is None else self._buffer[:at]
            if marker is None and not final:
                text = text[:_held(text, _HARMONY_MARKERS)]
            self._buffer = self._buffer[len(text):]
            if self._state == "header":
                self._header += text
            elif text:
                self._body(out, text)
            if marker is None:
                return
            self._buffer = self._buffer[len(marker):]
            if marker in (_CHANNEL, _START):
                if self._state == "body":
                    self._end_message()
                    self._header = ""
                self._state = "header"
                self._header += marker
            elif marker == _MESSAGE:
                header = self._header
                channel = header.split(_CHANNEL, 1)[1] if _CHANNEL in header else ""
                self._channel = (re.split(r"[\s<]", channel.strip(), maxsplit=1)[0]
                                 if channel.strip() else None)
                found_to = _RECIPIENT.search(header)
                self._recipient = found_to.group(1) if found_to else None
                self._arguments = ""
                self._state, self._header = "body", ""
            else:  # a message's end
                self._end_message()
                self._state, self._channel = "body", None

    def _body(self, out: list, text: str) -> None:
        field = self._field()
        if field is None:
            self._arguments += text
        else:
            out.append((field, text))

    def _end_message(self) -> None:
        if self._recipient is not None:
            self.calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                               "function": {"name": self._recipient,
                                            "arguments": self._arguments.strip() or "{}"}})
        self._recipient, self._arguments = None, ""


def _merged(pieces: list) -> list:
    """Adjacent pieces of one field joined; empty ones dropped."""
    merged: list = []
    for field, text in pieces:
        if not text:
            continue
        if merged and merged[-1][0] == field:
            merged[-1] = (field, merged[-1][1] + text)
        else:
            merged.append((field, text))
    return merged


def split(parser: str, text: str, prompt: str = "") -> tuple:
    """(reasoning, content, calls) of a whole answer: None for a part it
    lacks (calls: a list, harmony's only)."""
    reader = Reader(parser, prompt)
    pieces = reader.feed(text) + reader.finish()
    parts = {REASONING: "", CONTENT: ""}
    for field, piece in pieces:
        parts[field] += piece
    return parts[REASONING] or None, parts[CONTENT] or None, reader.calls

