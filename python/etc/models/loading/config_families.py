"""The config fields of the families whose layers differ from Llama's in
ways `ModelConfig.from_dict` reads through a family reader: Granite's
multipliers, SmolLM3's NoPE layers and window, OLMo 2's and OLMo 3's
post-norm layers, OLMoE's whole-projection q/k norms, GLM-4's sandwich
norms and interleaved partial RoPE.
Each reader takes the parsed config.json and returns `ModelConfig` fields,
raising `UnsupportedConfigError` naming the field for what it cannot
compute as transformers does."""

from __future__ import annotations

from .fields import UnsupportedConfigError, head_dim_from_heads, positive_int, positive_number
from .moe_fields import GLM4_MOE

__all__ = ["OLMO", "OLMOE", "GLM4", "DEFAULT_HEAD_DIM", "DEFAULT_PARTIAL_ROTARY", "family_layers",
           "OLMO3_THETA", "olmo3_rope", "granite", "nope_layers", "smollm3_window"]

#: OLMo 2 and OLMo 3 (allenai): no norm before the attention or the MLP,
#: a norm of each one's output before its residual add, q/k RMSNorms over
#: the whole projection; OLMo 3 slides a window on 3 of every 4 layers.
OLMO = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
#: OLMoE (allenai OLMoE-1B-7B): Llama's pre-norm layers with OLMo 2's q/k
#: norms over the whole projection and a sparse MoE block in every layer
#: (`moe_fields.olmoe`).
OLMOE = "OlmoeForCausalLM"
#: GLM-4 (THUDM/zai-org GLM-4-0414, GLM-Z1): q/k/v biases, Gemma 2's four
#: norms (of w, not 1 + w), a fused gate/up projection, and RoPE on the
#: first half of each head in GPT-J's interleaved pairs.
GLM4 = "Glm4ForCausalLM"
#: transformers' `head_dim` where config.json has none and it is not
#: hidden / heads (Glm4Config: 128).
DEFAULT_HEAD_DIM = {GLM4: 128}
#: transformers' `partial_rotary_factor` where config.json gives none and
#: it is not 1 (Glm4Config's and Glm4MoeConfig's: 0.5).
DEFAULT_PARTIAL_ROTARY = {GLM4: 0.5, GLM4_MOE: 0.5}


def family_layers(config: dict, where: str, architecture: str, flag) -> dict:
    """The layer fields of OLMo 2 / 3, OLMoE and GLM-4 (`ModelConfig`'s
    `input_norms`, `sandwich_norms`, `qk_norm`, `qk_norm_projection`,
    `rope_interleaved`, and GLM-4's q/k/v biases as `attention_bias`, its
    default true); {} for the other architectures. `flag(name, default)`
    reads a JSON boolean."""
    if architecture in OLMO or architecture == OLMOE:
        clip = config.get("clip_qkv")
        if clip is not None:
            # (OlmoeAttention clamps q, k and v to it; Olmo2's ignores it.)
            raise UnsupportedConfigError(
                f"{where}: field 'clip_qkv' = {clip!r} is not supported (OLMo 1's clamping "
                f"of q, k and v: {architecture} has q/k norms instead)")
    if architecture in OLMO:
        return dict(input_norms=False, sandwich_norms=True, qk_norm=True,
                    qk_norm_projection=True)
    if architecture == OLMOE:
        return _olmoe_attention(config, where)
    if architecture == GLM4:
        # Glm4Config's q/k/v biases default to present; o has none.
        return dict(attention_bias=flag("attention_bias", True), sandwich_norms=True,
                    rope_interleaved=True)
    return {}


def _olmoe_attention(config: dict, where: str) -> dict:
    """OLMoE's attention fields, as transformers' OlmoeAttention reads
    them: q/k norms over the whole projection; its q_norm is
    `hidden_size` wide and its k_norm (hidden / heads) x KV heads, so a
    `head_dim` other than hidden / heads (which it would use for the
    projections) is refused; `sliding_window`, which it hands to the
    attention kernels (flash attention honours it, the default SDPA and
    eager ones ignore it), is refused when set."""
    head_dim_from_heads(config, where, OLMOE, "its q_norm and k_norm are of hidden_size / "
                        "num_attention_heads = {} per head")
    if config.get("sliding_window") is not None:
        raise UnsupportedConfigError(
            f"{where}: field 'sliding_window' = {config['sliding_window']!r} is not supported "
            f"for {OLMOE} (transformers' attention is full under its default SDPA and eager "
            f"kernels, windowed under flash attention)")
    return dict(qk_norm=True, qk_norm_projection=True)


#: Olmo3Config's RoPE base (its `default_theta`).
OLMO3_THETA = 500_000.0


def olmo3_rope(config: dict, where: str, full: tuple, read_rope) -> dict:
    """OLMo 3's sliding layers' RoPE (`ModelConfig.local_rope_theta`,
    `local_rope_scaling`) where it differs from the full layers' `full`
    (base, variant), as transformers' Olmo3Config keeps them: keyed by
    layer type in `rope_parameters`, the sliding layers' plain (a flat
    `rope_scaling` is the full layers' only). `read_rope(layer_type=...,
    default_theta=...)` reads one layer type's. Refused where transformers'
    versions disagree or Olmo3Config ignores the field: flat
    `rope_parameters`, and a flat `rope_theta` other than 500000
    (transformers 5.24 gives it to the full layers only, the sliding ones
    keeping 500000)."""
    params = config.get("rope_parameters")
    nested = isinstance(params, dict) and any(
        isinstance(params.get(kind), dict) for kind in ("full_attention", "sliding_attention"))
    if isinstance(params, dict) and params and not nested:
        raise UnsupportedConfigError(
            f"{where}: field 'rope_parameters' = {params!r} is not supported for "
            f"Olmo3ForCausalLM unless keyed by layer type ('full_attention', "
            f"'sliding_attention'): transformers' Olmo3Config ignores flat RoPE parameters")
    theta = config.get("rope_theta")
    if theta is not None and not nested and theta != OLMO3_THETA:
        raise UnsupportedConfigError(
            f"{where}: field 'rope_theta' = {theta!r} is not supported for Olmo3ForCausalLM "
            f"without rope_parameters keyed by layer type: transformers 5's Olmo3Config gives "
            f"it to the full-attention layers only (the sliding ones keep {OLMO3_THETA:g}); "
            f"state each layer type's base there")
    local = read_rope(layer_type="sliding_attention", default_theta=OLMO3_THETA)
    if local == tuple(full):
        return {}
    return {"local_rope_theta": local[0], "local_rope_scaling": local[1]}


#: Granite's multiplier fields (transformers' default 1.0 each).
_GRANITE_MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier",
                        "logits_scaling")


def granite(config: dict, where: str) -> dict:
    """Granite's four multipliers (`ModelConfig`'s Granite fields), as
    transformers 4 and 5 read them (default 1.0 each when absent or null),
    each a finite positive number; the attention multiplier is the
    attention scale itself, so its default 1.0 is kept, not taken for
    1 / sqrt(head_dim). A multiplier of 1 (other than the attention's) is
    None: no task."""
    out = {}
    for name in _GRANITE_MULTIPLIERS:
        value = config.get(name)
        value = 1.0 if value is None else positive_number(where, name, value)
        out[name] = value if value != 1.0 or name == "attention_multiplier" else None
    return out


def smollm3_window(config: dict, where: str, layers: int, use, types) -> tuple:
    """SmolLM3's window, as transformers reads it: with
    `use_sliding_window`, the layers `layer_types` calls sliding (by
    default the NoPE layers, when `sliding_window` is set) attend to the
    last `sliding_window` positions; without it, none does."""
    if not use:
        return None, ()
    window = config.get("sliding_window")
    if types is None:
        nope = nope_layers(config, where, layers)
        types = ["sliding_attention" if window is not None and i in nope else
                 "full_attention" for i in range(layers)]
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if sliding and window is None:
        raise UnsupportedConfigError(f"{where}: field 'sliding_window' is null, but layers "
                                     f"{list(sliding)} are 'sliding_attention' (layer_types)")
    if not sliding:
        return None, ()
    return positive_int(where, "sliding_window", window), sliding


def nope_layers(config: dict, where: str, layers: int) -> tuple:
    """SmolLM3's layers without RoPE, as transformers reads them:
    `no_rope_layers` (1: RoPE, 0: none; at least one entry per layer),
    else every `no_rope_layer_interval`-th layer (default 4) has none."""
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval")
        interval = 4 if interval is None else \
            positive_int(where, "no_rope_layer_interval", interval)
        return tuple(i for i in range(layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) < layers or \
            not all(type(f) is int and f in (0, 1) for f in flags):
        raise UnsupportedConfigError(f"{where}: field 'no_rope_layers' = {flags!r} must list "
                                     f"1 (RoPE) or 0 (none) for each of the {layers} layers")
    return tuple(i for i in range(layers) if not flags[i])
