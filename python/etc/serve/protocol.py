"""The OpenAI API's request bodies, as pydantic models: what `etc.serve`
accepts, with the types and ranges it checks before a request reaches the
engine.

Nothing is ignored. A field no body declares is refused (400 naming it:
"unknown field"); a declared field either takes effect or, set to a value
ETC does not implement, is refused by name (`refused`, from the `REFUSED`
tables below). docs/models.md ("The server") lists every field and what
ETC does with it.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Callable, ClassVar, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat,
                      StrictInt, StrictStr)
from pydantic_core import PydanticCustomError

__all__ = ["ChatCompletionRequest", "CompletionRequest", "ChatMessage", "TextPart",
           "StreamOptions", "ResponseFormat"]


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

#: (field, accepts(value), why it is refused otherwise): a declared field
#: set to a value `accepts` says False for is refused with `why`.
Refusals = tuple[tuple[str, Callable[[Any], bool], str], ...]


def _unset(value) -> bool:
    """None, False or an empty container: nothing asked for."""
    return value is None or value is False or value == [] or value == {}


class _Body(BaseModel):
    # A field no body declares is an error, not a silent no-op (a misspelt
    # option, or one ETC does not know).
    model_config = ConfigDict(extra="forbid")

    #: The declared fields ETC refuses when set (see `Refusals`).
    REFUSED: ClassVar[Refusals] = ()

    def refused(self) -> Optional[tuple[str, str]]:
        """(field, message) of the first field set to something ETC does not
        do, or None."""
        for name, accepts, why in self.REFUSED:
            if not accepts(getattr(self, name)):
                return name, f"{name}: {why}"
        return None


def _text_type(kind: str) -> str:
    """A content part's type, which must be "text": an image, audio or file
    part is refused saying why, not as a mere mismatch of a literal."""
    if kind != "text":
        # (A type not ending in "_type": the app's error handler takes
        # those for a union member's mere mismatch.)
        raise PydanticCustomError(
            "content_part_unsupported", "content parts of type {kind} are not supported: ETC "
            "serves text (it runs no vision or audio encoder, not even a multimodal "
            "checkpoint's); send 'text' parts", {"kind": repr(kind)})
    return kind


class TextPart(_Body):
    """A part of a message's content; only text parts are supported."""

    type: Annotated[StrictStr, AfterValidator(_text_type)]
    text: Text


class FunctionCall(_Body):
    name: Text
    arguments: Text


class ToolCall(_Body):
    """A call an assistant message made (as OpenAI's answers hold it)."""

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    """A message of the conversation: its role, content (text, or text
    parts) and `name` (given to the chat template with the message); an
    assistant's `tool_calls`, a tool's answer (`role: "tool"`,
    `tool_call_id`). The fields an assistant message of OpenAI's answers
    has are accepted as null (a client that sends an answer back as it got
    it)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[Text, list[TextPart], None] = None
    name: Optional[Text] = None
    refusal: Optional[Text] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[Text] = None
    function_call: Optional[dict] = None
    audio: Optional[dict] = None

    REFUSED: ClassVar[Refusals] = (
        ("refusal", _unset, "a refusal is not something ETC's models give; send the text "
                            "as content"),
        ("function_call", _unset, "function calls (deprecated) are not supported; use "
                                  "tool_calls"),
        ("audio", _unset, "audio is not supported: ETC serves text"),
    )

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict:
        """The message as the chat template sees it."""
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            # As transformers gives them to templates: arguments as a dict.
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": _arguments(call.function.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


class StreamOptions(_Body):
    include_usage: StrictBool = False
    include_obfuscation: Optional[StrictBool] = None

    REFUSED: ClassVar[Refusals] = (
        ("include_obfuscation", lambda v: not v, "ETC's stream chunks carry no obfuscation "
                                                 "padding"),
    )


class Function(_Body):
    name: Annotated[Text, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: Optional[Text] = None
    parameters: Optional[dict] = None
    strict: Optional[StrictBool] = None


class Tool(_Body):
    type: Literal["function"]
    function: Function

    def for_template(self) -> dict:
        return self.model_dump(exclude_none=True)


class NamedFunction(_Body):
    name: Text


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(_Body):
    name: Text
    description: Optional[Text] = None
    schema_: Optional[dict] = Field(default=None, alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(_Body):
    """`response_format`: "text" (free text), "json_object" or
    "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JSONSchemaFormat] = None


def _text_format(value: Optional[ResponseFormat]) -> bool:
    return value is None or value.type == "text"


def _only(*allowed) -> Callable[[Any], bool]:
    return lambda value: value is None or value in allowed


class _Sampling(_Body):
    """What chat and text completions share."""

    model: Text
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[StrictFloat] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[StrictFloat] = Field(default=None, gt=0.0, le=1.0)
    seed: Optional[StrictInt] = Field(default=None, ge=0, lt=2 ** 63)
    stop: Union[Text, list[Text], None] = Field(default=None, max_length=16)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    n: StrictInt = Field(default=1, ge=1, le=128)
    presence_penalty: Optional[StrictFloat] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[StrictFloat] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, Annotated[StrictFloat, Field(ge=-100.0, le=100.0)]]] = None
    user: Optional[Text] = None
    # Extensions vLLM and SGLang accept too (extra_body in the openai client).
    top_k: Optional[StrictInt] = Field(default=None, ge=-1)
    min_p: Optional[StrictFloat] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[StrictFloat] = Field(default=None, gt=0.0, le=10.0)
    min_tokens: Optional[StrictInt] = Field(default=None, ge=0)
    ignore_eos: StrictBool = False
    stop_token_ids: Optional[list[StrictInt]] = None
    allowed_token_ids: Optional[list[StrictInt]] = Field(default=None, min_length=1)
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict] = None
    guided_json: Union[dict, Text, None] = None
    guided_regex: Optional[Text] = None
    guided_choice: Optional[list[Text]] = None
    guided_grammar: Optional[Text] = None

    REFUSED: ClassVar[Refusals] = (
    )

    def refused(self) -> Optional[tuple[str, str]]:
        """(field, message) of the first field set to something ETC does not
        do (the nested ones named by their path), or None."""
        found = super().refused()
        if found is None and self.stream_options is not None:
            found = self.stream_options.refused()
            if found is not None:
                found = f"stream_options.{found[0]}", f"stream_options.{found[1]}"
        if found is None and self.max_tokens is not None and \
                self.max_completion_tokens is not None and \
                self.max_tokens != self.max_completion_tokens:
            found = "max_completion_tokens", (
                f"max_completion_tokens: {self.max_completion_tokens} differs from "
                f"max_tokens ({self.max_tokens}); give one (max_completion_tokens is "
                f"max_tokens' newer name)")
        return found

    def grammar(self) -> Optional[tuple[str, object, str]]:
        """(kind, value, field) of the grammar the answer must follow (see
        `etc.models.engine.constraints.Grammar`), or None; raises
        ValueError (field, message) for two grammars, or one malformed."""
        found = []
        format_ = self.response_format
        if format_ is not None and format_.type == "json_object":
            found.append(("json_object", None, "response_format"))
        if format_ is not None and format_.type == "json_schema":
            if format_.json_schema is None or format_.json_schema.schema_ is None:
                raise ValueError("response_format.json_schema.schema",
                                 "response_format: json_schema needs json_schema.schema")
            found.append(("json_schema", format_.json_schema.schema_, "response_format"))
        for field, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"),
                            ("guided_choice", "choice"), ("guided_grammar", "lark")):
            value = getattr(self, field)
            if value is not None:
                if kind == "json_schema" and isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        raise ValueError(field, f"{field}: not a JSON schema") from None
                found.append((kind, value, field))
        for key, value in (self.structured_outputs or {}).items():
            kind = {"json": "json_schema", "regex": "regex", "choice": "choice",
                    "grammar": "lark", "json_object": "json_object"}.get(key)
            if kind is None:
                raise ValueError(f"structured_outputs.{key}",
                                 f"structured_outputs.{key}: unknown (json, json_object, "
                                 f"regex, choice, grammar)")
            if kind == "json_object":
                if value:
                    found.append((kind, None, "structured_outputs"))
                continue
            if value is not None:
                found.append((kind, value, "structured_outputs"))
        if len(found) > 1:
            raise ValueError(found[1][2], f"{found[1][2]}: one grammar per request "
                                          f"({found[0][2]} gives one already)")
        return found[0] if found else None

    @property
    def new_tokens(self) -> Optional[int]:
        """The most new tokens: `max_completion_tokens` or `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[StrictBool] = None
    functions: Optional[list] = None
    function_call: Union[Text, dict, None] = None
    modalities: Optional[list[Text]] = None
    audio: Optional[dict] = None
    prediction: Optional[dict] = None
    reasoning_effort: Optional[Text] = None
    verbosity: Optional[Text] = None
    web_search_options: Optional[dict] = None
    store: Optional[StrictBool] = None
    metadata: Optional[dict] = None
    service_tier: Optional[Text] = None
    prompt_cache_key: Optional[Text] = None
    safety_identifier: Optional[Text] = None
    # vLLM's chat extensions.
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    documents: Optional[list[dict]] = None
    chat_template: Optional[Text] = None
    echo: StrictBool = False

    REFUSED: ClassVar[Refusals] = _Sampling.REFUSED + (
        ("functions", _unset, "functions (deprecated function calling) are not supported"),
        ("function_call", _only("none"), "functions (deprecated function calling) are not "
                                         "supported"),
        ("modalities", lambda v: v is None or set(v) <= {"text"},
         "ETC generates text only (modalities=['text'])"),
        ("audio", _unset, "audio output is not supported: ETC generates text"),
        ("prediction", _unset, "predicted outputs are not supported"),
        ("reasoning_effort", lambda v: v is None,
         "reasoning_effort is not supported; a template's own switch goes in "
         "chat_template_kwargs (e.g. {\"enable_thinking\": false})"),
        ("verbosity", lambda v: v is None, "verbosity is not supported"),
        ("web_search_options", _unset, "web search is not supported"),
        ("store", lambda v: not v, "ETC stores no completions (store=false)"),
        ("metadata", _unset, "metadata tags stored completions, and ETC stores none"),
        ("service_tier", _only("auto", "default"),
         "ETC has one service tier ('auto' or 'default')"),
        ("chat_template", lambda v: v is None,
         "a chat template of the request's own is not accepted; the model's is used"),
        ("echo", lambda v: not v, "echo is not supported on chat completions"),
    )

    def refused(self) -> Optional[tuple[str, str]]:
        for i, message in enumerate(self.messages):
            found = message.refused()
            if found is not None:
                return f"messages[{i}].{found[0]}", f"messages[{i}].{found[1]}"
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs: needs logprobs=true"
        names = [tool.function.name for tool in self.tools or ()]
        if self.tool_choice not in (None, "none", "auto") and not names:
            return "tool_choice", "tool_choice: needs tools"
        if isinstance(self.tool_choice, NamedToolChoice) and \
                self.tool_choice.function.name not in names:
            return "tool_choice", (f"tool_choice: no tool is named "
                                   f"{self.tool_choice.function.name!r}")
        if len(set(names)) != len(names):
            return "tools", "tools: two tools have the same name"
        if self.continue_final_message:
            if self.add_generation_prompt:
                return "continue_final_message", (
                    "continue_final_message: give add_generation_prompt=false with it (the "
                    "reply continues the last message instead of starting a new one)")
            if self.messages[-1].role != "assistant":
                return "continue_final_message", (
                    "continue_final_message: the last message must be the assistant's, "
                    "the one to continue")
        return super().refused()

    @property
    def top_logprob_count(self) -> Optional[int]:
        """The most likely tokens whose log-probabilities each answer token
        carries, or None for no log-probabilities."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: Union[Text, list[StrictInt], list[Text], list[list[StrictInt]]]
    echo: StrictBool = False
    suffix: Optional[Text] = None
    best_of: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=5)
    add_special_tokens: StrictBool = True

    REFUSED: ClassVar[Refusals] = _Sampling.REFUSED + (
        ("echo", lambda v: not v, "echo is not supported"),
        ("suffix", _unset, "suffix is not supported"),
        ("best_of", _only(1), "best_of is not supported"),
    )

    @property
    def top_logprob_count(self) -> Optional[int]:
        """The most likely tokens whose log-probabilities each answer token
        carries, or None for no log-probabilities."""
        return self.logprobs
