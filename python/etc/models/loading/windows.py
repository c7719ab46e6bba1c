"""Sliding-window attention of a Hugging Face config: the attention window
and which layers slide, read as transformers reads each architecture's
fields (`use_sliding_window`, `sliding_window`, `max_window_layers`,
`layer_types`, Gemma's layer pattern), and refused, naming the field, where
the architecture's attention is full."""

from __future__ import annotations

from typing import Optional

from . import config_families as families, families_cohere, families_dense as dense
from .fields import UnsupportedConfigError, positive_int

__all__ = ["sliding_layers"]

#: The architectures with sliding-window attention, and how their configs
#: say which layers slide: "qwen2" (`use_sliding_window` turns
#: `sliding_window` on for the layers from `max_window_layers` on, or those
#: `layer_types` names), "mistral" (`sliding_window`, 4096 when absent and
#: none when null, for every layer; transformers ignores `layer_types`),
#: "phi3" (the same, none when absent; Mixtral's too: MixtralConfig's
#: default is None where MistralConfig's is 4096, in transformers 4 and 5),
#: "gemma" (`layer_types`, or Gemma's pattern of full layers), "exaone4"
#: (`families_dense.exaone4_window`).
_WINDOWED = {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral",
             "MixtralForCausalLM": "phi3", "GptOssForCausalLM": "gemma",
             "Gemma2ForCausalLM": "gemma", "Gemma3ForCausalLM": "gemma",
             "Phi3ForCausalLM": "phi3", "SmolLM3ForCausalLM": "smollm3",
             "Olmo3ForCausalLM": "gemma", dense.EXAONE4: "exaone4",
             families_cohere.COHERE2: "gemma"}
#: Gemma's default layer pattern: every n-th layer full, the others
#: sliding (Gemma 3: `sliding_window_pattern`, default 6; Gemma 2: 2;
#: OLMo 3 and Cohere2: 4; Cohere2 reads `sliding_window_pattern` too).
_GEMMA_PATTERN = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6, "GptOssForCausalLM": 2,
                  "Olmo3ForCausalLM": 4, families_cohere.COHERE2: 4}
#: The default `sliding_window` of the "gemma" style (GptOssConfig: 128,
#: Olmo3Config: 4096).
_DEFAULT_WINDOW = {"GptOssForCausalLM": 128, "Olmo3ForCausalLM": 4096}


def sliding_layers(config: dict, where: str, architecture: str,
                    layers: int) -> tuple[Optional[int], tuple]:
    """The attention window and the sliding layers of `config`, read as
    transformers reads them for `architecture` (`_WINDOWED`); a window in
    any other architecture is refused, naming the field."""
    style = _WINDOWED.get(architecture)
    use = config.get("use_sliding_window")
    if use is not None and not isinstance(use, bool):
        raise UnsupportedConfigError(f"{where}: field 'use_sliding_window' = {use!r} must be "
                                     f"true or false (a JSON boolean)")
    if style not in ("qwen2", "smollm3") and use:
        raise UnsupportedConfigError(f"{where}: field 'use_sliding_window' = True is not "
                                     f"supported for {architecture} (attention is full, not "
                                     f"windowed)")
    types = config.get("layer_types")
    if types is not None and style not in ("mistral", "phi3"):
        kinds = ("full_attention", "sliding_attention") if style else ("full_attention",)
        if not isinstance(types, list) or len(types) != layers:
            raise UnsupportedConfigError(f"{where}: field 'layer_types' = {types!r} must list "
                                         f"one type for each of the {layers} layers")
        other = sorted({t for t in types if t not in kinds}, key=str)
        if other:
            raise UnsupportedConfigError(
                f"{where}: field 'layer_types' lists {', '.join(map(repr, other))} (layers "
                f"{[i for i, t in enumerate(types) if t not in kinds]}); " +
                (f"{architecture} supports 'full_attention' and 'sliding_attention'" if style
                 else "only 'full_attention' is supported (attention is full, not windowed)"))
    if style is None:
        return None, ()
    if style == "gemma":
        window = config.get("sliding_window", _DEFAULT_WINDOW.get(architecture, 4096))
        if types is None:
            pattern = _GEMMA_PATTERN[architecture]
            if architecture in ("Gemma3ForCausalLM", families_cohere.COHERE2) and \
                    config.get("sliding_window_pattern") is not None:
                pattern = positive_int(where, "sliding_window_pattern",
                                       config["sliding_window_pattern"])
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(layers)]
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        if sliding and window is None:
            raise UnsupportedConfigError(
                f"{where}: field 'sliding_window' is null, but layers {list(sliding)} are "
                f"'sliding_attention' (layer_types)")
        if window is not None:
            window = positive_int(where, "sliding_window", window)
        return (window if sliding else None), sliding
    if style == "smollm3":
        return families.smollm3_window(config, where, layers, use, types)
    if style == "exaone4":
        return dense.exaone4_window(config, where, layers, types)
    if style in ("mistral", "phi3"):
        window = config.get("sliding_window", 4096 if style == "mistral" else None)
        if window is None:
            return None, ()
        return positive_int(where, "sliding_window", window), tuple(range(layers))
    window = config.get("sliding_window", 4096) if use else None
    if window is not None:
        window = positive_int(where, "sliding_window", window)
    if types is not None:
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        if sliding and window is None:
            raise UnsupportedConfigError(
                f"{where}: field 'layer_types' lists 'sliding_attention' (layers "
                f"{list(sliding)}) but no window is set (use_sliding_window is "
                f"{bool(use)}, sliding_window is {config.get('sliding_window')!r})")
        return (window if sliding else None), sliding
    if window is None:
        return None, ()
    first = config.get("max_window_layers", 28)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise UnsupportedConfigError(f"{where}: field 'max_window_layers' = {first!r} must be "
                                     f"a non-negative integer")
    sliding = tuple(range(first, layers))
    return (window if sliding else None), sliding
