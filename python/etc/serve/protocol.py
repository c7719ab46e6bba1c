"""The OpenAI API's request bodies, as pydantic models: what `etc.serve`
accepts, with the types and ranges it checks before a request reaches the
engine. Fields the API defines but ETC does not implement are refused by
name when set to anything but their default (see `unsupported`)."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr)

__all__ = ["ChatCompletionRequest", "CompletionRequest", "ChatMessage", "TextPart",
           "StreamOptions"]


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(text: str) -> str:
    """Refuses a lone UTF-16 surrogate: legal in JSON (`"\\ud83d"`, a client
    that cut an emoji's pair in two), but no Unicode text, so it could be
    neither tokenized nor sent back."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise ValueError(f"character {found.start()} is a lone UTF-16 surrogate "
                         f"(U+{ord(found.group()):04X}), which is not Unicode text")
    return text


#: A string of Unicode text (every string field of a request).
Text = Annotated[StrictStr, AfterValidator(_unicode)]


class _Body(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do (clients
    # send vendor extensions); known ones are checked strictly.
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    """A part of a message's content; only text parts are supported."""

    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[Text, list[TextPart], None] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Sampling(_Body):
    """What chat and text completions share."""

    model: Text
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[StrictFloat] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[StrictFloat] = Field(default=None, gt=0.0, le=1.0)
    # Extensions vLLM and SGLang accept too (extra_body in the openai client).
    top_k: Optional[StrictInt] = Field(default=None, ge=0)
    min_p: Optional[StrictFloat] = Field(default=None, ge=0.0, le=1.0)
    ignore_eos: StrictBool = False
    seed: Optional[StrictInt] = Field(default=None, ge=0, lt=2 ** 63)
    stop: Union[Text, list[Text], None] = Field(default=None, max_length=16)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    n: StrictInt = Field(default=1, ge=1)
    logprobs: Optional[Union[StrictBool, StrictInt]] = None
    presence_penalty: Optional[StrictFloat] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[StrictFloat] = Field(default=None, ge=-2.0, le=2.0)
    user: Optional[Text] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(field, why) of the first field set to something ETC does not do."""
        if self.n != 1:
            return "n", f"n={self.n}: only n=1 (one choice per request) is supported"
        if self.logprobs:
            return "logprobs", "logprobs are not supported"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return name, f"{name} is not supported"
        return None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    tools: Optional[list] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.tools:
            return "tools", "tools (function calling) are not supported"
        return super().unsupported()


class CompletionRequest(_Sampling):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: Union[Text, list[StrictInt], list[Text], list[list[StrictInt]]]
    echo: StrictBool = False
    suffix: Optional[Text] = None
    best_of: Optional[StrictInt] = None

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.echo:
            return "echo", "echo is not supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "best_of is not supported"
        return super().unsupported()
