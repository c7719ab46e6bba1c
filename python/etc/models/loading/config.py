"""Hugging Face `config.json` of the supported architectures, checked.

`ModelConfig.from_dict` accepts `LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM` and `Qwen3MoeForCausalLM` configs, written by transformers 4 (flat `rope_theta`,
`rope_scaling`) or 5 (`rope_parameters`), and raises `UnsupportedConfigError`
naming the field for anything the compiled model would compute differently
(biases, sliding windows where the architecture has none, RoPE variants it
does not implement, ...) and for
values that are not what the field means (a string where a flag or a number
belongs, a non-finite or non-positive RoPE base, ...), rather than silently
ignoring or misreading them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["ARCHITECTURES", "ROPE_TYPES", "ModelConfig", "UnsupportedConfigError"]

#: The architectures `etc.models.load` builds.
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")

#: The RoPE variants (Hugging Face's `rope_type`) implemented: each is a set
#: of frequencies the host computes once (and, for yarn, a scale of the
#: attention logits). The parameters each takes besides `rope_type`/`type`,
#: `rope_theta` and `partial_rotary_factor` (which must be 1), and which of
#: them are required.
ROPE_TYPES = {
    "default": ((), ()),
    "linear": (("factor",), ("factor",)),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"),
               ("factor", "low_freq_factor", "high_freq_factor")),
    "yarn": (("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "truncate"), ("factor",)),
}
#: RoPE variants transformers knows and ETC refuses, and why.
_REFUSED_ROPE_TYPES = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence length at run "
               "time, and the step kernel computes with one set",
    "longrope": "LongRoPE switches between its short and long factors with the sequence "
                "length at run time, and the step kernel computes with one set",
    "proportional": "it rotates only part of each head (partial rotary embedding)",
    "axial": "axial (multi-dimensional) RoPE is for vision models",
    "mrope": "multimodal RoPE needs positions per modality axis",
}


class UnsupportedConfigError(ValueError):
    """A config.json that names an architecture or sets a field ETC's models
    do not implement, or a field whose value is not valid."""


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of one decoder-only model."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: Per-head RMSNorm of q and k before RoPE (Qwen3).
    qk_norm: bool
    #: Biases of the q, k and v projections (Qwen2; o has none).
    qkv_bias: bool = False
    #: The parameters of a scaled RoPE variant ("linear", "llama3" or
    #: "yarn"; its "rope_type" included, defaults filled in), or None for
    #: plain RoPE.
    rope_scaling: Optional[dict] = None
    #: Mixture-of-Experts (Qwen3-MoE): experts, experts per token, expert
    #: width, renormalised top-k weights, and which layers are sparse.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    sparse_layers: tuple = field(default_factory=tuple)
    #: Sliding-window attention: the positions a token of a sliding layer
    #: sees (its own included), and which layers slide (the others attend
    #: to the whole sequence).
    sliding_window: Optional[int] = None
    sliding_layers: tuple = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sliding(self, layer: int) -> bool:
        return layer in self.sliding_layers

    def window(self, layer: int) -> Optional[int]:
        """The attention window of `layer`: `sliding_window` for a sliding
        layer, None (the whole sequence) for the others."""
        return self.sliding_window if layer in self.sliding_layers else None

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    @property
    def rope_type(self) -> str:
        """Hugging Face's name of the RoPE variant ("default", "linear",
        "llama3" or "yarn")."""
        return self.rope_scaling["rope_type"] if self.rope_scaling else "default"

    @property
    def rope_attention_factor(self) -> float:
        """The factor Hugging Face multiplies cos and sin by (yarn's
        `attention_factor`, 1 for the other variants): q . k scales by its
        square."""
        if self.rope_type != "yarn":
            return 1.0
        s = self.rope_scaling
        if s.get("attention_factor") is not None:
            return float(s["attention_factor"])

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        factor = s["factor"]
        if s.get("mscale") and s.get("mscale_all_dim"):
            return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        return mscale(factor)

    @property
    def attention_scale(self) -> float:
        """The scale of the attention logits: 1 / sqrt(head_dim), times the
        square of `rope_attention_factor` (rotated q and k both carry it)."""
        return self.rope_attention_factor ** 2 / math.sqrt(self.head_dim)

    @classmethod
    def from_dict(cls, config: dict, where: str = "config.json") -> "ModelConfig":
        """Checks and reads a Hugging Face config (the parsed config.json)."""
        if not isinstance(config, dict):
            raise UnsupportedConfigError(f"{where}: expected a JSON object, got "
                                         f"{type(config).__name__}")
        architectures = config.get("architectures") or []
        if not isinstance(architectures, list) or len(architectures) != 1:
            raise UnsupportedConfigError(
                f"{where}: 'architectures' must name exactly one architecture, got "
                f"{architectures!r}; supported: {', '.join(ARCHITECTURES)}")
        architecture = architectures[0]
        if architecture not in ARCHITECTURES:
            raise UnsupportedConfigError(f"{where}: architecture {architecture!r} is not "
                                         f"supported; supported: {', '.join(ARCHITECTURES)}")

        def need(name: str, kind=int):
            if name not in config or config[name] is None:
                raise UnsupportedConfigError(f"{where}: field {name!r} is missing (required "
                                             f"for {architecture})")
            if kind is int:
                return _positive_int(where, name, config[name])
            return _positive_number(where, name, config[name])

        def refuse(name: str, allowed, why: str):
            value = config.get(name)
            # `1 == True` in Python: compare types too, so that a flag is not
            # taken for a count.
            if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} is not "
                                             f"supported ({why})")

        def flag(name: str, default: bool) -> bool:
            value = config.get(name)
            if value is None:
                return default
            if not isinstance(value, bool):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be "
                                             f"true or false (a JSON boolean)")
            return value

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        layers = need("num_hidden_layers")
        kv_heads = config.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else kv_heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or \
                heads % kv_heads:
            raise UnsupportedConfigError(f"{where}: field 'num_key_value_heads' = {kv_heads!r} "
                                         f"must divide num_attention_heads = {heads}")
        head_dim = config.get("head_dim")
        head_dim = hidden // heads if head_dim is None else head_dim
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or \
                head_dim % 2:
            raise UnsupportedConfigError(f"{where}: field 'head_dim' = {head_dim!r} must be an "
                                         f"even positive integer")
        refuse("hidden_act", ("silu", None), "only SiLU-gated MLPs are implemented")
        if architecture != "Qwen2ForCausalLM":
            # Qwen2's q/k/v projections always have biases and its o
            # projection never has one: transformers ignores the field.
            refuse("attention_bias", (False, None), "q/k/v/o projections have no bias")
        refuse("mlp_bias", (False, None), "MLP projections have no bias")
        refuse("attention_dropout", (0, 0.0, None), "inference uses no dropout")
        refuse("pretraining_tp", (1, None), "tensor-parallel slicing of the MLP")
        window, sliding = _sliding_layers(config, where, architecture, layers)
        rope_theta, scaling = _rope(config, where, need("max_position_embeddings"))
        moe = {}
        if architecture == "Qwen3MoeForCausalLM":
            mlp_only = config.get("mlp_only_layers")
            mlp_only = [] if mlp_only is None else mlp_only
            if not isinstance(mlp_only, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
                raise UnsupportedConfigError(f"{where}: field 'mlp_only_layers' = {mlp_only!r} "
                                             f"must be a list of layer indices")
            step = config.get("decoder_sparse_step")
            step = 1 if step is None else _positive_int(where, "decoder_sparse_step", step)
            experts = need("num_experts")
            moe = {
                "num_experts": experts,
                "num_experts_per_tok": need("num_experts_per_tok"),
                "moe_intermediate_size": need("moe_intermediate_size"),
                "norm_topk_prob": flag("norm_topk_prob", False),
                # Hugging Face's rule for which layers are sparse.
                "sparse_layers": tuple(i for i in range(layers) if i not in mlp_only and
                                       (i + 1) % step == 0),
            }
            if moe["num_experts_per_tok"] > experts:
                raise UnsupportedConfigError(
                    f"{where}: field 'num_experts_per_tok' = {moe['num_experts_per_tok']} "
                    f"exceeds num_experts = {experts}")
            if config.get("shared_expert_intermediate_size"):
                raise UnsupportedConfigError(f"{where}: field 'shared_expert_intermediate_size'"
                                             f" is not supported (no shared experts)")
        dense_layers = not moe or len(moe["sparse_layers"]) < layers
        if dense_layers:
            intermediate = need("intermediate_size")
        else:
            intermediate = config.get("intermediate_size")
            intermediate = 0 if intermediate is None else \
                _positive_int(where, "intermediate_size", intermediate)
        return cls(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            rms_norm_eps=need("rms_norm_eps", float),
            rope_theta=rope_theta,
            max_position_embeddings=need("max_position_embeddings"),
            tie_word_embeddings=flag("tie_word_embeddings", False),
            qk_norm=architecture.startswith("Qwen3"),
            qkv_bias=architecture == "Qwen2ForCausalLM",
            rope_scaling=scaling,
            sliding_window=window,
            sliding_layers=sliding,
            **moe,
        )

    def rope_inv_freq(self):
        """The RoPE frequencies (head_dim / 2 float32), as Hugging Face
        computes them for the configured variant."""
        import numpy as np

        from ...reference_llm import rope_inv_freq

        d = self.head_dim
        inv_freq = rope_inv_freq(d, self.rope_theta)
        kind, s = self.rope_type, self.rope_scaling
        if kind == "default":
            return inv_freq
        if kind == "linear":
            return (inv_freq / np.float32(s["factor"])).astype(np.float32)
        if kind == "llama3":
            factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
            old_context = s["original_max_position_embeddings"]
            low_wavelen, high_wavelen = old_context / low, old_context / high
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
            smooth = (old_context / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        # yarn: interpolated (divided by factor) below the correction range,
        # extrapolated (unchanged) above it, a linear ramp between.
        factor, base = s["factor"], self.rope_theta
        fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
        old_context = s["original_max_position_embeddings"]

        def correction_dim(rotations: float) -> float:
            return d * math.log(old_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(fast), correction_dim(slow)
        if s.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) /
                       np.float32(high - low), 0, 1)
        extrapolation = 1 - ramp
        interpolated = inv_freq / np.float32(factor)
        return (interpolated * (1 - extrapolation) + inv_freq * extrapolation).astype(np.float32)


#: The architectures with sliding-window attention, and how their configs
#: say which layers slide: "qwen2" (`use_sliding_window` turns
#: `sliding_window` on for the layers from `max_window_layers` on, or those
#: `layer_types` names), "mistral" (`sliding_window`, 4096 when absent and
#: none when null, for every layer; transformers ignores `layer_types`).
_WINDOWED = {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}


def _sliding_layers(config: dict, where: str, architecture: str,
                    layers: int) -> tuple[Optional[int], tuple]:
    """The attention window and the sliding layers of `config`, read as
    transformers reads them for `architecture` (`_WINDOWED`); a window in
    any other architecture is refused, naming the field."""
    style = _WINDOWED.get(architecture)
    use = config.get("use_sliding_window")
    if use is not None and not isinstance(use, bool):
        raise UnsupportedConfigError(f"{where}: field 'use_sliding_window' = {use!r} must be "
                                     f"true or false (a JSON boolean)")
    if style != "qwen2" and use:
        raise UnsupportedConfigError(f"{where}: field 'use_sliding_window' = True is not "
                                     f"supported for {architecture} (attention is full, not "
                                     f"windowed)")
    types = config.get("layer_types")
    if types is not None and style != "mistral":
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
    if style == "mistral":
        window = config.get("sliding_window", 4096)
        if window is None:
            return None, ()
        return _positive_int(where, "sliding_window", window), tuple(range(layers))
    window = config.get("sliding_window", 4096) if use else None
    if window is not None:
        window = _positive_int(where, "sliding_window", window)
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


def _positive_int(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a positive "
                                     f"integer")
    return value


def _positive_number(where: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not value > 0:
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a finite "
                                     f"positive number")
    return float(value)


def _rope(config: dict, where: str, max_positions: int) -> tuple[float, Optional[dict]]:
    """The RoPE base and the parameters of a scaled variant (or None), read
    as transformers reads them: `rope_scaling` (transformers 4) or else
    `rope_parameters` (transformers 5, possibly nested by layer type), with
    a flat `rope_theta` as the default base."""
    chosen, params = None, None
    for name in ("rope_scaling", "rope_parameters"):
        value = config.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be an "
                                         f"object of RoPE parameters")
        if name == "rope_parameters" and isinstance(value.get("full_attention"), dict):
            # Nested by layer type; every layer is full attention (checked).
            name, value = "rope_parameters['full_attention']", value["full_attention"]
        if params is None and value:
            chosen, params = name, dict(value)
    params = params or {}
    chosen = chosen or "rope_parameters"
    flat = config.get("rope_theta")
    if flat is not None:
        flat = _positive_number(where, "rope_theta", flat)
    theta = params.get("rope_theta")
    if theta is not None:
        theta = _positive_number(where, f"{chosen}.rope_theta", theta)
        if flat is not None and flat != theta:
            raise UnsupportedConfigError(
                f"{where}: field 'rope_theta' = {flat!r} contradicts {chosen}.rope_theta = "
                f"{theta!r}; keep one")
    theta = theta if theta is not None else flat if flat is not None else 10000.0
    for key in ("rope_type", "type"):
        if key in params and not isinstance(params[key], str):
            raise UnsupportedConfigError(f"{where}: field '{chosen}.{key}' = {params[key]!r} "
                                         f"must be a string")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in _REFUSED_ROPE_TYPES:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' has rope_type {kind!r}, which "
                                     f"is not supported: {_REFUSED_ROPE_TYPES[kind]}; supported: "
                                     f"{', '.join(map(repr, ROPE_TYPES))}")
    if kind not in ROPE_TYPES:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' has rope_type {kind!r}; "
                                     f"supported: {', '.join(map(repr, ROPE_TYPES))}")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial is not None and (isinstance(partial, bool) or partial != 1):
        raise UnsupportedConfigError(f"{where}: field 'partial_rotary_factor' = {partial!r} is "
                                     f"not supported (RoPE rotates whole heads)")
    allowed, required = ROPE_TYPES[kind]
    general = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
    unknown = sorted(k for k in params if k not in allowed and k not in general)
    if unknown:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' of rope_type {kind!r} has "
                                     f"{', '.join(map(repr, unknown))}, which ETC does not "
                                     f"implement; {kind!r} takes "
                                     f"{', '.join(map(repr, allowed)) or 'no parameters'}")
    for key in required:
        if params.get(key) is None:
            raise UnsupportedConfigError(f"{where}: field '{chosen}' of rope_type {kind!r} "
                                         f"lacks {key!r}")
    if kind == "default":
        return theta, None
    scaling = {"rope_type": kind}
    for key in allowed:
        value = params.get(key)
        if value is None:
            continue
        what = f"{chosen}.{key}"
        if key == "truncate":
            if not isinstance(value, bool):
                raise UnsupportedConfigError(f"{where}: field '{what}' = {value!r} must be true "
                                             f"or false")
        elif key == "original_max_position_embeddings":
            value = _positive_int(where, what, value)
        else:
            value = _positive_number(where, what, value)
        scaling[key] = value
    if kind in ("llama3", "yarn"):
        # transformers' default, as it standardises the parameters.
        scaling.setdefault("original_max_position_embeddings", max_positions)
    if kind == "llama3" and scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' of rope_type 'llama3' has "
                                     f"low_freq_factor = high_freq_factor = "
                                     f"{scaling['low_freq_factor']!r}: they must differ")
    return theta, scaling
