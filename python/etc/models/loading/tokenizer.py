"""Text in and out of a model: a Hugging Face `tokenizers.Tokenizer` (the
Rust tokenizer, not transformers) and the checkpoint's chat template,
rendered with jinja2 the way transformers renders it.

```python
tok = Tokenizer.from_directory("Qwen3-0.6B/")
ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]),
                 add_special_tokens=False)
stream = tok.detokenizer()
text = "".join(stream.push(i) for i in new_ids) + stream.flush()
```
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["Tokenizer", "IncrementalDetokenizer", "ChatTemplateError", "TokenizerError"]


class TokenizerError(ValueError):
    """A tokenizer file or setting ETC cannot use."""


class ChatTemplateError(ValueError):
    """A chat template that does not render: a syntax error, the template's
    own `raise_exception(...)` (e.g. roles that do not alternate), or a
    model without a template."""


def _token_content(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string, or an
    AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A tokenizer and chat template.

    `backend` does the encoding and decoding; `chat_template` is a jinja2
    source (None: `apply_chat_template` raises `ChatTemplateError`);
    `bos_token` and `eos_token` are the strings templates see; with
    `add_bos_token` / `add_eos_token`, `encode(..., add_special_tokens=True)`
    puts the BOS / EOS id around the text when the backend's own
    post-processor did not already."""

    def __init__(self, backend, *, chat_template: Optional[str] = None,
                 bos_token: Optional[str] = None, eos_token: Optional[str] = None,
                 add_bos_token: bool = False, add_eos_token: bool = False):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.bos_token_id = self._id_of(bos_token, "bos_token")
        self.eos_token_id = self._id_of(eos_token, "eos_token")
        self._template = None  # compiled on first use

    def _id_of(self, token: Optional[str], what: str) -> Optional[int]:
        if token is None:
            return None
        token_id = self.backend.token_to_id(token)
        if token_id is None and (what == "bos_token" and self.add_bos_token or
                                 what == "eos_token" and self.add_eos_token):
            raise TokenizerError(f"Tokenizer: {what}={token!r} is not in the vocabulary, but "
                                 f"add_{what}=True needs its id")
        return token_id

    @classmethod
    def from_directory(cls, path) -> Optional["Tokenizer"]:
        """The tokenizer of a Hugging Face checkpoint directory: tokenizer.json,
        with the special tokens and chat template of tokenizer_config.json
        (and chat_template.jinja, which takes precedence, as in
        transformers; else a multimodal model's processor template,
        chat_template.json). None when the directory has no tokenizer.json."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            return None
        from tokenizers import Tokenizer as Backend

        try:
            backend = Backend.from_file(str(file))
        except Exception as error:  # the Rust parser's message says what is wrong
            raise TokenizerError(f"{file}: not a tokenizer the tokenizers package reads "
                                 f"({error})") from None
        config: dict = {}
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text())
            except json.JSONDecodeError as error:
                raise TokenizerError(f"{config_file}: not JSON ({error})") from None
        template = config.get("chat_template")
        if isinstance(template, list):
            # Several named templates: transformers uses "default".
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"{config_file}: chat_template must be a string")
        if template is None:
            template = _processor_template(path / "chat_template.json")
        return cls(backend, chat_template=template,
                   bos_token=_token_content(config.get("bos_token")),
                   eos_token=_token_content(config.get("eos_token")),
                   add_bos_token=bool(config.get("add_bos_token", False)),
                   add_eos_token=bool(config.get("add_eos_token", False)))

    # -- ids ---------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`. With `add_special_tokens`, the backend's
        post-processor runs and the BOS / EOS ids are added where the
        tokenizer config asks for them. Text rendered from a chat template
        already holds its special tokens: encode it with
        `add_special_tokens=False`."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, not {type(text).__name__}")
        ids = list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)
        if add_special_tokens:
            if self.add_bos_token and self.bos_token_id is not None and \
                    (not ids or ids[0] != self.bos_token_id):
                ids.insert(0, self.bos_token_id)
            if self.add_eos_token and self.eos_token_id is not None and \
                    (not ids or ids[-1] != self.eos_token_id):
                ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; special tokens (EOS, chat markers) left out with
        `skip_special_tokens`."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        """A streaming decoder for one sequence of new ids (see
        `IncrementalDetokenizer`)."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # -- chat --------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **extra) -> str:
        """The prompt text of a conversation: `messages` ({"role": ...,
        "content": ...} dicts) rendered by the chat template with the
        variables transformers gives templates (`messages`,
        `add_generation_prompt`, `bos_token`, `eos_token`, `tools=None`,
        `documents=None`, `raise_exception`, `strftime_now`, the `tojson`
        filter) and `extra` (e.g. `enable_thinking=False`). Encode the
        result with `add_special_tokens=False`.

        A "developer" message (OpenAI's name for the system message of its
        newer models) is given to a template that does not name that role
        as a "system" message: such templates refuse an unknown role, or
        drop its message (Qwen3's)."""
        if self.chat_template is None:
            raise ChatTemplateError("apply_chat_template: this tokenizer has no chat template "
                                    "(no chat_template.jinja or chat_template in "
                                    "tokenizer_config.json)")
        import jinja2

        template = self._compiled_template()
        messages = list(messages)
        if "developer" not in self.chat_template:
            messages = [dict(m, role="system") if isinstance(m, dict) and
                        m.get("role") == "developer" else m for m in messages]
        variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                         tools=None, documents=None, bos_token=self.bos_token or "",
                         eos_token=self.eos_token or "")
        variables.update(extra)
        try:
            return template.render(**variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"apply_chat_template: the chat template failed: "
                                    f"{error}") from None

    def _compiled_template(self):
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        return self._template


def _processor_template(file: Path) -> Optional[str]:
    """The chat template of `file`, a multimodal model's processor's
    chat_template.json ({"chat_template": "..."}: transformers' processors
    read it, its tokenizers do not), for a checkpoint whose tokenizer
    has no template of its own; None when there is no such file."""
    if not file.is_file():
        return None
    try:
        template = json.loads(file.read_text()).get("chat_template")
    except (json.JSONDecodeError, AttributeError) as error:
        raise TokenizerError(f"{file}: not a JSON object with a 'chat_template' "
                             f"({error})") from None
    if not isinstance(template, str):
        raise TokenizerError(f"{file}: 'chat_template' must be a string, got {template!r}")
    return template


def compile_chat_template(source: str):
    """A chat template compiled as transformers compiles one: a sandboxed,
    immutable jinja2 environment with trim_blocks and lstrip_blocks, loop
    controls (`{% break %}`), `{% generation %}` blocks rendered as their
    content, `raise_exception(message)`, `strftime_now(format)` and a
    `tojson` that keeps non-ASCII text and takes `indent`,
    `separators` and `sort_keys`."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlocks(Extension):
        """`{% generation %} ... {% endgeneration %}` (transformers' marker of
        the assistant's tokens) renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise ChatTemplateError(f"apply_chat_template: the chat template refused the "
                                f"messages: {message}")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlocks, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(f"chat template, line {error.lineno}: {error.message}") from None


#: The ids a detokenizer holds back at most waiting for a character to
#: complete: a UTF-8 character has at most 4 bytes, a token at least one.
_MAX_HELD = 4


class IncrementalDetokenizer:
    """Turns the ids of one sequence into text as they come, one id at a
    time: `push(id)` returns the text that id completes (often "", e.g. for
    the first bytes of a multi-byte character split over byte-level BPE
    tokens, which never come out halved); `flush()` returns what is left
    at the end. The concatenation of every `push` and the `flush` equals
    `tokenizer.decode(ids)` when the ids decode to valid UTF-8; bytes that
    never form a character come out as U+FFFD after at most 4 ids.

    It decodes a short window of ids rather than the whole sequence: the
    ids from `prefix` on (already emitted) and from `prefix` through the
    newest; what the newest add is the difference, held back while it ends
    in an incomplete character (U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # ids before this have been emitted and left the window
        self._read = 0    # ids before this have been emitted
        self._emitted: list[str] = []

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        """Adds one id; returns the new text it completes."""
        self._ids.append(int(token_id))
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and after.startswith(before) and \
                not after.endswith("\ufffd"):
            new = after[len(before):]
        elif len(self._ids) - self._read < _MAX_HELD:
            # An incomplete character (or a decoder that rewrote the
            # window, e.g. a leading-space rule): wait for more ids.
            return ""
        else:
            # Ids whose bytes never make a character (a model may generate
            # any bytes): give them up as decode does, so the stream goes on.
            new = after[len(os.path.commonprefix([before, after])):]
        self._prefix, self._read = self._read, len(self._ids)
        if new:
            self._emitted.append(new)
        return new

    def flush(self) -> str:
        """The text not yet emitted (an incomplete character at the very end
        comes out as U+FFFD, as `decode` gives it)."""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        new = after[len(before):] if after.startswith(before) else ""
        self._prefix = self._read = len(self._ids)
        if new:
            self._emitted.append(new)
        return new
