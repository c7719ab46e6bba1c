"""One choice of a request as the OpenAI API answers it: the engine's
outputs of that choice (text, log-probabilities, finish reason) read into
a chat message (reasoning, content, tool calls) or a text completion's
text, either chunk by chunk as they are generated (`StreamedChoice`) or
whole at the end (`CollectedChoice`). `AnswerForm` says how a request's
choices are read; both kinds of choice read harmony's calls, keep one
call without parallel_tool_calls, and finish with "tool_calls", alike.

A streamed answer is read as it arrives (`reasoning.Reader`,
`tool_calls.CallStream`), a whole one with `reasoning.split` and
`tool_calls.parse`, which is why the two kinds keep their own state: a
malformed call a stream has already begun stays a call, where the whole
answer leaves it content (`tool_calls.CallStream`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from ..models import reasoning as reasoning_
from ..models import tool_calls
from .logprobs import TokenText, chat_logprobs, completion_logprobs

__all__ = ["AnswerForm", "StreamedChoice", "CollectedChoice"]

logger = logging.getLogger("etc.serve")


@dataclass(frozen=True)
class AnswerForm:
    """How a request's choices are read: `chat` (a message) or a text
    completion; `parser` the tool-call format (None: the request gave no
    tools; "harmony": the calls are read with the channels), `reasoning`
    the reasoning format (None: all content) and `prompt_text` the
    rendered prompt it looks at; `parallel_tool_calls` as the request gave
    it (false keeps the first call); `logprobs`: whether the request asked
    for log-probabilities; `request_id` names the request in the log."""

    chat: bool
    parser: Optional[str] = None
    reasoning: Optional[str] = None
    prompt_text: str = ""
    parallel_tool_calls: Optional[bool] = None
    logprobs: bool = False
    request_id: str = ""

    @property
    def text_calls(self) -> bool:
        """Whether the calls are read from the content (`tool_calls`' parsers)."""
        return self.parser not in (None, "harmony")

    def reader(self) -> Optional[reasoning_.Reader]:
        """A reader of one chat answer's reasoning, or None."""
        if self.reasoning is None or not self.chat:
            return None
        return reasoning_.Reader(self.reasoning, self.prompt_text)

    def kept_calls(self, calls: list, sent: int, finished: bool) -> list:
        """Of `calls` (harmony's, read after `sent` already sent), those
        the answer returns: none where the request gave no tools (they are
        logged as dropped once the answer is `finished`), at most one in
        all without parallel tool calls."""
        if calls and self.parser is None:
            if finished:
                logger.warning("%s: the answer calls %s, but the request gave no tools: the "
                               "calls are dropped", self.request_id,
                               ", ".join(c["function"]["name"] for c in calls))
            return []
        return calls if self.parallel_tool_calls is not False else calls[:max(0, 1 - sent)]


def _calls(parser: str, text: str, form) -> tuple:
    """(content, calls) of an answer (`tool_calls.parse`), at most one call
    where `form.parallel_tool_calls` is false."""
    content, calls = tool_calls.parse(parser, text)
    if form.parallel_tool_calls is False:
        calls = calls[:1]
    return content, calls


class StreamedChoice:
    """Choice `index` of a streamed request: `chunk_choices(output)` gives
    the `choices` entries of the chunks the engine's next output of it
    makes (one chunk each): a chat delta per field or call (empty while a
    reader holds back text that may be a marker or a call), or the text
    completion's text; the first carries the role, the last the finish
    reason."""

    def __init__(self, index: int, form: AnswerForm, token_text: TokenText):
        self.index, self.form, self.token_text = index, form, token_text
        self.first = True
        self.reader = form.reader()
        self.stream = tool_calls.CallStream(form.parser, form.parallel_tool_calls is not False) \
            if form.text_calls else None
        self.sent_calls = 0  # harmony's calls sent
        self.offset = 0  # a text completion's characters before the output's tokens

    def chunk_choices(self, output) -> list:
        choices = self._chat(output) if self.form.chat else self._text(output)
        self.first = False
        return choices

    def _chat(self, output) -> list:
        reason = output.finish_reason
        pieces = [(reasoning_.CONTENT, output.text)]
        deltas: list = []
        if self.reader is not None:
            # Reasoning first, then the answer; a marker split across
            # chunks is held until read.
            pieces = self.reader.feed(output.text) + (
                self.reader.finish() if output.finished else [])
            calls = self.form.kept_calls(self.reader.calls[self.sent_calls:], self.sent_calls,
                                         output.finished)
            deltas += [{"tool_calls": [{"index": self.sent_calls + k, **call}]}
                       for k, call in enumerate(calls)]
            self.sent_calls += len(calls)
            if self.sent_calls and reason == "stop":
                reason = "tool_calls"
        for field, piece in pieces:
            if field == reasoning_.CONTENT and self.stream is not None:
                # Tool calls as OpenAI streams them: deltas of their own,
                # the text held while it may be one.
                deltas += self.stream.feed(piece)
            else:
                deltas.append({field: piece})
        if self.stream is not None:
            if output.finished:
                deltas += self.stream.finish()
            if self.stream.calls and reason == "stop":
                reason = "tool_calls"
        deltas = deltas or [{}]
        if self.first:
            deltas[0]["role"] = "assistant"
        logprobs = chat_logprobs(self.token_text, output.logprobs)
        choices = [{"index": self.index, "delta": delta,
                    "logprobs": logprobs if k == 0 else None,
                    "finish_reason": reason if k == len(deltas) - 1 else None}
                   for k, delta in enumerate(deltas)]
        # Text held back (a call's start) sends nothing.
        return [c for c in choices if c["delta"] or c["logprobs"] or c["finish_reason"]]

    def _text(self, output) -> list:
        choice = {"index": self.index, "text": output.text,
                  "logprobs": completion_logprobs(self.token_text, output.logprobs,
                                                  self.offset),
                  "finish_reason": output.finish_reason}
        self.offset += sum(len(self.token_text(t.token_id)) for t in output.logprobs or ())
        return [choice]


class CollectedChoice:
    """Choice `index` of a request answered whole: `add` each of the
    engine's outputs of it, then `choice()` is its entry of the answer's
    `choices` (a chat message with its reasoning and calls read, or the
    completion's text), with its log-probabilities where asked for."""

    def __init__(self, index: int, form: AnswerForm, token_text: TokenText):
        self.index, self.form, self.token_text = index, form, token_text
        self.texts: list = []
        self.logprobs: list = []
        self.finish_reason: Optional[str] = None

    def add(self, output) -> None:
        self.texts.append(output.text)
        self.logprobs += output.logprobs or ()
        self.finish_reason = output.finish_reason

    def choice(self) -> dict:
        text = "".join(self.texts)
        logprobs = self.logprobs if self.form.logprobs else None
        reason = self.finish_reason
        if self.form.chat:
            message, calls = self._message(text)
            if calls:
                message["tool_calls"] = calls
                reason = "tool_calls" if reason == "stop" else reason
            choice = {"index": self.index, "message": message,
                      "logprobs": chat_logprobs(self.token_text, logprobs)}
        else:
            choice = {"index": self.index, "text": text,
                      "logprobs": completion_logprobs(self.token_text, logprobs)}
        choice["finish_reason"] = reason
        return choice

    def _message(self, text: str) -> tuple:
        """(message, calls) of a chat answer."""
        form = self.form
        message = {"role": "assistant", "content": text}
        calls: list = []
        if form.reasoning is not None:
            message["reasoning_content"], message["content"], calls = \
                reasoning_.split(form.reasoning, text, form.prompt_text)
            calls = form.kept_calls(calls, 0, finished=True)
        if form.text_calls:
            message["content"], calls = _calls(form.parser, message["content"] or "", form)
        return message, calls
