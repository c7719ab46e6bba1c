"""Log-probabilities as the OpenAI API returns them: a chat choice's
`logprobs.content` (one entry per token, with its `top_logprobs`) and a
text completion's legacy `logprobs` (tokens, token_logprobs,
top_logprobs, text_offset), from the engine's `TokenLogprobs`."""

from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["chat_logprobs", "completion_logprobs"]

#: What a log-probability of -inf (a token the filters left out) is sent as:
#: JSON has no infinity (vLLM sends the same).
NEGATIVE_INFINITY = -9999.0


def _number(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else NEGATIVE_INFINITY


class TokenText:
    """The text of single tokens (cached): special tokens as written,
    without a tokenizer `token_id:N` (vLLM's return_tokens_as_token_ids)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = f"token_id:{token_id}" if self.tokenizer is None else \
                self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text


def _entry(text: TokenText, token_id: int, logprob: float) -> dict:
    token = text(token_id)
    return {"token": token, "logprob": _number(logprob),
            "bytes": list(token.encode("utf-8", "surrogatepass"))}


def chat_logprobs(text: TokenText, logprobs: Optional[Sequence]) -> Optional[dict]:
    """A chat choice's (or chunk's) `logprobs` for the engine's
    `TokenLogprobs` (None when the request asked for none)."""
    if logprobs is None:
        return None
    content = []
    for item in logprobs:
        entry = _entry(text, item.token_id, item.logprob)
        entry["top_logprobs"] = [_entry(text, i, lp) for i, lp in item.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(text: TokenText, logprobs: Optional[Sequence],
                        offset: int = 0) -> Optional[dict]:
    """A text completion's legacy `logprobs`, the text offsets counted from
    `offset` (the characters of the answer before these tokens)."""
    if logprobs is None:
        return None
    tokens, values, tops, offsets = [], [], [], []
    for item in logprobs:
        token = text(item.token_id)
        tokens.append(token)
        values.append(_number(item.logprob))
        tops.append({text(i): _number(lp) for i, lp in item.top})
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}
