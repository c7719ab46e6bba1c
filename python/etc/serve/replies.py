"""The objects a completion request is answered with, as the OpenAI API
writes them: a whole answer, the chunks of a streamed one as server-sent
events (each choice's entry from `choice`), its `usage`, and the error
event that ends a stream that failed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Envelope", "usage", "sse", "error_event", "DONE"]

#: The event that ends every stream.
DONE = "data: [DONE]\n\n"

#: Characters JSON leaves as they are that str.splitlines (and so httpx's
#: `iter_lines`) takes for line ends: escaped, an event stays one line.
_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(data: dict) -> str:
    """`data` as one server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False).translate(_LINE_ENDS)}\n\n"


def usage(prompt_tokens: int, lasts: Sequence) -> dict:
    """A request's `usage`, from each choice's last output (None for a
    choice that has none yet): the cached tokens are the first choice's."""
    completion_tokens = sum(o.num_tokens for o in lasts if o is not None)
    cached = lasts[0].cached_tokens if lasts and lasts[0] is not None else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


@dataclass(frozen=True)
class Envelope:
    """What every object of one request's answer carries: its `id`, its
    kind (`chat` completion or text completion), when it was `created`
    and the `model`'s name."""

    request_id: str
    chat: bool
    created: int
    model: str

    @property
    def kind(self) -> str:
        """The `object` of the whole answer."""
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, kind: str) -> dict:
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}

    def chunk(self, choice: dict, include_usage: bool) -> dict:
        """A streamed chunk of one choice's entry (`usage` null in each
        where the request asked for usage: it comes in the last chunk)."""
        chunk = self._head(f"{self.kind}.chunk" if self.chat else self.kind)
        chunk["choices"] = [choice]
        if include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, usage: dict) -> dict:
        """The stream's last chunk (with include_usage): no choices."""
        chunk = self._head(f"{self.kind}.chunk" if self.chat else self.kind)
        chunk.update(choices=[], usage=usage)
        return chunk

    def whole(self, choices: list, usage: dict) -> dict:
        """The answer of a request that was not streamed."""
        answer = self._head(self.kind)
        answer.update(choices=choices, usage=usage)
        return answer


def error_event(message: str, kind: str) -> str:
    """The event that ends a stream that failed: its error's message and
    type."""
    return sse({"error": {"message": message, "type": kind}})
