"""Structured output: the grammar a request's tokens must follow (a JSON
schema, any JSON object, a regular expression, a choice of strings, a Lark
grammar), compiled with llguidance, and each request's matcher, which gives
the token bitmask of its next step (filled on the host between steps, for
all the step's constrained requests at once) and takes the token the step
chose. The bitmask is applied on the device (`Request.token_mask`).

llguidance rather than XGrammar: it depends on nothing (XGrammar 0.2.8
requires torch, transformers and triton, and ETC's runtime stays free of
torch), reads the checkpoint's tokenizer.json as it is, and covers the JSON
schemas, regular expressions and Lark grammars the API asks for.

A model that answers a chat in harmony's channels (gpt-oss) has the grammar
hold for its final message only (`harmony_final`), its analysis free: the
server's chat answers and `Model.generate`'s chat prompts do.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["Grammar", "GrammarError", "Constraint", "fill_masks", "writes_harmony",
           "harmony_final", "harmony_final_grammar", "HARMONY_ANALYSIS",
           "HARMONY_FINAL_TOKENS"]


class GrammarError(ValueError):
    """A grammar llguidance cannot compile (or that ETC cannot use), with
    `param`: the field that gave it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401
    except ImportError as error:  # pragma: no cover - a dependency of etc
        raise GrammarError(f"structured output needs the llguidance package ({error})",
                           "response_format") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What a request's tokens must follow: `kind` ("json_schema",
    "json_object", "regex", "choice", "lark", "llguidance") and its `value`
    (a schema dict, None, a pattern, a list of strings, a grammar's text,
    llguidance's own grammar as `source` gives it: one grammar built
    around another, as `harmony_final` builds a harmony answer's)."""

    kind: str
    value: object = None

    def source(self) -> str:
        """The grammar as llguidance takes it."""
        matcher = _llguidance().LLMatcher
        if self.kind == "json_schema":
            return matcher.grammar_from_json_schema(
                json.dumps(self.value), defaults={"whitespace_flexible": False})
        if self.kind == "json_object":
            return matcher.grammar_from_json_schema(
                json.dumps({"type": "object"}), defaults={"whitespace_flexible": False})
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            alternatives = " | ".join(json.dumps(choice) for choice in self.value)
            return matcher.grammar_from_lark(f"start: {alternatives}")
        if self.kind == "lark":
            return matcher.grammar_from_lark(self.value)
        if self.kind == "llguidance":
            return self.value
        raise ValueError(f"Grammar: unknown kind {self.kind!r}")


def _source(grammar: Grammar, param: str) -> str:
    """`grammar.source()`, a grammar it cannot write a GrammarError naming
    `param`."""
    try:
        return grammar.source()
    except ValueError as error:
        raise GrammarError(f"{param}: {error}", param) from None


# The llguidance tokenizer of each ETC tokenizer (building one reads the
# whole vocabulary: about a second for 150,000 tokens).
_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _ll_tokenizer(model):
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise GrammarError("structured output needs the model's tokenizer (tokenizer.json)",
                           "response_format")
    with _LOCK:
        found = _TOKENIZERS.get(tokenizer)
        if found is None:
            llg = _llguidance()
            found = llg.LLTokenizer(tokenizer.backend.to_str(),
                                    n_vocab=model.config.vocab_size,
                                    eos_token=list(model.eos_token_ids) or None)
            _TOKENIZERS[tokenizer] = found
        return found


class Constraint:
    """One request's matcher of `grammar` over `model`'s tokens: `mask()`
    the bitmask of the next token (int32 (ceil(vocab / 32),); EOS allowed
    only where the grammar accepts), `accept(token)` after a step chose it,
    `finished` once the grammar is complete (EOS taken, or nothing more can
    follow). Raises GrammarError (naming `param`) for a grammar llguidance
    cannot compile."""

    def __init__(self, model, grammar: Grammar, param: str = "response_format"):
        llg = _llguidance()
        tokenizer = _ll_tokenizer(model)
        source = _source(grammar, param)
        error = llg.LLMatcher.validate_grammar(source, tokenizer)
        if error and not error.startswith("WARNING"):
            raise GrammarError(f"{param}: the grammar cannot be compiled: {error}", param)
        self.matcher = llg.LLMatcher(tokenizer, source, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"{param}: the grammar cannot be compiled: "
                               f"{self.matcher.get_error()}", param)
        self.words = -(-model.config.vocab_size // 32)

    def mask(self) -> np.ndarray:
        out = np.empty((1, self.words), np.int32)
        _llguidance().numpy.fill_next_token_bitmask(self.matcher, out)
        return out[0]

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask "
                               f"allowed: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()


_EXECUTOR = None
#: Whether llguidance's executor may spread a step's masks over threads: not
#: on two cores, where its dispatch costs more than it saves (8 masks at
#: B = 8 in bench/serve.py --structured's engine: 287 us through it, 208 us
#: one after the other; docs/benchmarks.md, "Serving over HTTP").
_PARALLEL = len(os.sched_getaffinity(0)) > 2 if hasattr(os, "sched_getaffinity") else \
    (os.cpu_count() or 1) > 2


def fill_masks(constraints: Sequence[Constraint]) -> np.ndarray:
    """The next-token bitmasks of several constraints, (len, words) int32,
    filled together (llguidance's executor spreads them over threads where
    there are more than two cores)."""
    global _EXECUTOR
    llg = _llguidance()
    words = constraints[0].words
    out = np.empty((len(constraints), words), np.int32)
    if len(constraints) == 1 or not _PARALLEL:
        for row, constraint in enumerate(constraints):
            llg.numpy.fill_next_token_bitmask(constraint.matcher, out, row)
        return out
    if _EXECUTOR is None:
        _EXECUTOR = llg.LLExecutor()
    llg.numpy.fill_next_token_bitmask_par(
        _EXECUTOR, [(c.matcher, i) for i, c in enumerate(constraints)], out)
    return out


# -- harmony (gpt-oss's chat format) -------------------------------------------

_CHANNEL, _MESSAGE = "<|channel|>", "<|message|>"


def writes_harmony(architecture: Optional[str], tokenizer) -> bool:
    """Whether a model answers a chat in harmony's channels: its tokenizer
    has harmony's `<|channel|>` and `<|message|>` tokens, or it is gpt-oss."""
    def has(token: str) -> bool:
        return tokenizer is not None and tokenizer.token_to_id(token) is not None

    return (has(_CHANNEL) and has(_MESSAGE)) or architecture == "GptOssForCausalLM"


#: The Lark rule (llguidance's, special tokens as tokens) of one harmony
#: analysis message, any text, and the header of the message after it:
#: what may come before a forced call or a constrained final answer.
HARMONY_ANALYSIS = ('analysis: <|channel|> "analysis" <|message|> /(.|\\n)*/ <|end|> '
                    '<|start|> "assistant"')
#: The special tokens `harmony_final_grammar` writes, which a tokenizer must have.
HARMONY_FINAL_TOKENS = (_CHANNEL, _MESSAGE, "<|end|>", "<|start|>", "<|return|>")


def harmony_final_grammar(answer: str) -> str:
    """The llguidance grammar (a TopLevelGrammar's JSON) of a harmony answer
    whose `final` message follows `answer` (an llguidance grammar: Lark
    text or a TopLevelGrammar's JSON, as `Grammar.source` gives it): at
    most one analysis message (`HARMONY_ANALYSIS`), then
    `<|channel|>final<|message|>`, the answer, and `<|return|>` or EOS
    (`<|return|>` is an EOS id of some checkpoints, not of others). So the
    `content` a harmony reader takes from the final channel follows `answer`."""
    try:
        top = json.loads(answer)
    except ValueError:
        top = None
    if not isinstance(top, dict) or not top.get("grammars"):
        top = {"grammars": [{"lark_grammar": answer}]}
    grammars = [dict(g) for g in top["grammars"]]
    # The answer's grammar is referred to by name (`@name`, llguidance's
    # nested grammar): its rules and lexer stay its own.
    name = grammars[0].get("name") or "answer"
    grammars[0]["name"] = name
    lark = (f'start: analysis? {_CHANNEL} "final" {_MESSAGE} @{name} <|return|>?\n'
            f"{HARMONY_ANALYSIS}\n")
    return json.dumps({**top, "grammars": [{"name": "harmony_final", "lark_grammar": lark}]
                       + grammars})


def harmony_final(grammar: Grammar, tokenizer, param: str = "response_format") -> Grammar:
    """The grammar of a harmony answer whose final message follows
    `grammar` (`harmony_final_grammar`). Raises GrammarError naming
    `param` where the tokenizer lacks harmony's tokens or `grammar` does
    not compile."""
    missing = [t for t in HARMONY_FINAL_TOKENS
               if tokenizer is None or tokenizer.token_to_id(t) is None]
    if missing:
        raise GrammarError(f"{param}: structured output with harmony needs the special tokens "
                           f"{', '.join(missing)}, which this model's tokenizer lacks", param)
    return Grammar("llguidance", harmony_final_grammar(_source(grammar, param)))
