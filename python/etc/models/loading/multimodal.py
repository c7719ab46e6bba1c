"""The text model of a multimodal checkpoint: Gemma 3 (4B and up) and
Mistral Small 3.1/3.2 ship as `Gemma3ForConditionalGeneration` and
`Mistral3ForConditionalGeneration`, the language model's config in
config.json's `text_config` (the vision encoder's in `vision_config`
beside it) and its weights under a prefix, next to the vision tower's and
the projector's. ETC runs the text model alone, as the causal LM it is
(`Gemma3ForCausalLM`, `MistralForCausalLM`): `text_config` read with the
defaults transformers' text config class gives the fields it omits, the
weights read from the language model's prefix only (the vision tower and
projector are never read), images refused where requests come in.

Which config level ties the LM head to the embeddings changed between
transformers 4 (`text_config.tie_word_embeddings`, the text class's
default when absent) and 5 (the top level's, default true, untied anyway
when the checkpoint holds a head of its own). Where the two levels state
one value, it is taken; where they state none or disagree, the checkpoint
decides as transformers 5 does: an LM head tensor of its own is untied,
none is tied (`tie_stated`, `Checkpoint`).
"""

from __future__ import annotations

from typing import Iterable, Optional

from .fields import UnsupportedConfigError

__all__ = ["WRAPPERS", "PREFIXES", "is_multimodal", "text_config", "tie_stated", "other_parts"]

#: The multimodal architectures whose text model ETC runs: per one, the
#: `text_config.model_type`s it takes (the first is what transformers
#: assumes when the field is absent) and the causal LM each one is.
WRAPPERS = {
    "Gemma3ForConditionalGeneration": {"gemma3_text": "Gemma3ForCausalLM"},
    "Mistral3ForConditionalGeneration": {"mistral": "MistralForCausalLM"},
}

#: The fields transformers' text config classes (Gemma3TextConfig,
#: MistralConfig) fill in where `text_config` omits them, and that
#: `ModelConfig.from_dict` would otherwise require or default differently.
#: Gemma 3's published configs rely on them (gemma-3-4b-it's text_config
#: states its hidden size, layers and widths, not its heads or vocabulary).
#: The fields the causal LMs default as these classes do (the RoPE bases,
#: windows, activations, head_dim, ties) are left to `from_dict`.
_TEXT_DEFAULTS = {
    "Gemma3ForCausalLM": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                              num_hidden_layers=26, num_attention_heads=8,
                              num_key_value_heads=4, max_position_embeddings=131072,
                              rms_norm_eps=1e-6),
    "MistralForCausalLM": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                               num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, max_position_embeddings=131072,
                               rms_norm_eps=1e-6),
}

#: Where the language model's tensors are: (prefix of the `model.*`
#: tensors, the LM head's name), as transformers 4 before 4.52 wrote them
#: (and 5 writes them again), then as 4.52 to 4.57 did.
PREFIXES = (("language_model.model.", "language_model.lm_head.weight"),
            ("model.language_model.", "lm_head.weight"))


def is_multimodal(config) -> bool:
    """Whether config.json `config` names one of `WRAPPERS`."""
    architectures = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(architectures, list) and len(architectures) == 1 and \
        architectures[0] in WRAPPERS


def text_config(config: dict, where: str) -> tuple[dict, str]:
    """The config of the text model of multimodal config.json `config` (an
    architecture of `WRAPPERS`), as a causal LM's config.json: `text_config`
    with its class's defaults for the fields it omits, its architecture the
    causal LM's and `tie_word_embeddings` the one value the config states
    (`tie_stated`; the text class's default where it states none or two);
    and the `where` its errors name."""
    wrapper = config["architectures"][0]
    text = config.get("text_config")
    if text is None:
        raise UnsupportedConfigError(
            f"{where}: field 'text_config' is missing: a {wrapper} config.json holds its "
            f"language model's config there (ETC runs that text model, not the vision part)")
    if not isinstance(text, dict):
        raise UnsupportedConfigError(f"{where}: field 'text_config' = {text!r} must be an "
                                     f"object (the language model's config)")
    kinds = WRAPPERS[wrapper]
    kind = text.get("model_type") or next(iter(kinds))
    if kind not in kinds:
        raise UnsupportedConfigError(
            f"{where}: field 'text_config.model_type' = {kind!r} is not supported for "
            f"{wrapper}; supported: {', '.join(map(repr, kinds))}")
    architecture = kinds[kind]
    out = {**_TEXT_DEFAULTS[architecture],
           **{name: value for name, value in text.items() if value is not None or
              name not in _TEXT_DEFAULTS[architecture]},
           "architectures": [architecture], "model_type": kind}
    tie = tie_stated(config, where)
    if tie is not None:
        out["tie_word_embeddings"] = tie
    else:
        out.pop("tie_word_embeddings", None)  # the causal LM's default
    return out, f"{where} (text_config)"


def tie_stated(config: dict, where: str = "config.json") -> Optional[bool]:
    """Whether multimodal config.json `config` ties the LM head to the
    embeddings: the value its `text_config` and top level state (one of
    them, or both alike), or None when neither states one or they disagree
    (transformers 4 and 5 read them differently: the checkpoint decides).
    A value that is not a JSON boolean is an error naming its field."""
    stated = set()
    for name, level in (("tie_word_embeddings", config),
                        ("text_config.tie_word_embeddings", config.get("text_config") or {})):
        value = level.get("tie_word_embeddings")
        if value is None:
            continue
        if not isinstance(value, bool):
            raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be true or "
                                         f"false (a JSON boolean)")
        stated.add(value)
    return stated.pop() if len(stated) == 1 else None


def other_parts(names: Iterable[str], prefix: str, head: str) -> dict[str, int]:
    """The tensors of `names` outside the language model (`prefix`, `head`),
    counted by their first name component ("vision_tower", ...)."""
    parts: dict[str, int] = {}
    for name in names:
        if not name.startswith(prefix) and name != head:
            part = name.split(".", 1)[0]
            parts[part] = parts.get(part, 0) + 1
    return parts
