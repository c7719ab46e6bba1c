"""The config fields of three dense families close to Llama, read as
transformers 5.24 reads them (`ModelConfig.from_dict` calls `layers`):

- EXAONE 4.0 (LG AI Research, `Exaone4ForCausalLM`): no input norms, the
  attention's and MLP's outputs normed before their residual adds (OLMo 2's
  layout), q/k RMSNorms per head (Qwen3's); with a `sliding_window`, the
  layers `layer_types` (or `sliding_window_pattern`) call sliding attend to
  that window with RoPE and the others attend to everything without RoPE
  (the 32B's "global NoPE"); without one, every layer is full and rotates.
- Seed-OSS (ByteDance, `SeedOssForCausalLM`): Llama with q/k/v biases
  (`attention_bias`, default true), an optional o projection bias
  (`attention_out_bias`) and head_dim 128 by default.
- Hunyuan dense (Tencent, `HunYuanDenseV1ForCausalLM`): Llama with q/k
  RMSNorms per head applied after RoPE (`ModelConfig.qk_norm_after_rope`),
  and "dynamic" RoPE with an `alpha`, which transformers computes as
  NTK-alpha: plain RoPE of base theta alpha^(d / (d - 2)), fixed whatever
  the sequence length.

Each reader returns `ModelConfig` fields and raises `UnsupportedConfigError`
naming the field for what it cannot compute as transformers does."""

from __future__ import annotations

import math
from typing import Callable, Optional

from .fields import UnsupportedConfigError, positive_int, positive_number

__all__ = ["EXAONE4", "SEED_OSS", "HUNYUAN_DENSE", "ARCHITECTURES", "DEFAULT_HEAD_DIM",
           "DROPOUT_FIELDS", "exaone4_window", "layers", "QK_NORM_NAMES"]

EXAONE4 = "Exaone4ForCausalLM"
SEED_OSS = "SeedOssForCausalLM"
HUNYUAN_DENSE = "HunYuanDenseV1ForCausalLM"
ARCHITECTURES = (EXAONE4, SEED_OSS, HUNYUAN_DENSE)
#: transformers' `head_dim` where config.json has none and it is not
#: hidden / heads (SeedOssConfig: 128).
DEFAULT_HEAD_DIM = {SEED_OSS: 128}
#: The dropout fields each family's config carries (Seed-OSS's default to
#: 0.1, Hunyuan's published configs say 0.1): transformers applies them in
#: training only, so any probability computes the same at inference.
DROPOUT_FIELDS = {SEED_OSS: ("attention_dropout", "residual_dropout"),
                  HUNYUAN_DENSE: ("attention_dropout",), EXAONE4: ("attention_dropout",)}
#: The checkpoint names of the per-head q/k norms, where not q_norm / k_norm.
QK_NORM_NAMES = {HUNYUAN_DENSE: ("query_layernorm", "key_layernorm")}

#: The keys of Hunyuan's "dynamic" RoPE parameters: `alpha` and the base
#: set the frequencies (`partial_rotary_factor` is read, and below 1
#: refused, by `config`); the others are in the published configs and
#: transformers' NTK-alpha ignores them, as its sequence-independent
#: frequencies have no use for them.
_NTK_ALPHA_KEYS = {"rope_type", "type", "alpha", "rope_theta", "partial_rotary_factor", "factor",
                   "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}


def exaone4_window(config: dict, where: str, count: int,
                   types: Optional[list]) -> tuple[Optional[int], tuple]:
    """EXAONE 4's window and sliding layers, as Exaone4Config reads them:
    none without `sliding_window`; else `layer_types` (checked by the
    caller), or `sliding_window_pattern`: an int n slides all but every
    n-th layer (default 4), a string of 'L' (local) and 'G' (global)
    repeats from layer 0, the last layer global (the field's documented
    meaning; transformers 5.24 cannot read a string without layer_types)."""
    window = config.get("sliding_window", 4096)
    if window is None:
        if types is not None and "sliding_attention" in types:
            raise UnsupportedConfigError(
                f"{where}: field 'sliding_window' is null, but layers "
                f"{[i for i, t in enumerate(types) if t == 'sliding_attention']} are "
                f"'sliding_attention' (layer_types)")
        return None, ()
    window = positive_int(where, "sliding_window", window)
    if types is None:
        pattern = config.get("sliding_window_pattern", 4)
        if isinstance(pattern, str):
            if not pattern or set(pattern) - {"L", "G"}:
                raise UnsupportedConfigError(
                    f"{where}: field 'sliding_window_pattern' = {pattern!r} must be a string "
                    f"of 'L' (local) and 'G' (global) or a positive integer")
            types = ["sliding_attention" if pattern[i % len(pattern)] == "L" and i < count - 1
                     else "full_attention" for i in range(count)]
        else:
            pattern = positive_int(where, "sliding_window_pattern", pattern)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(count)]
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return (window if sliding else None), sliding


def layers(config: dict, where: str, architecture: str, flag: Callable,
           sliding: tuple, head_dim: int, read_rope: Callable[[dict], tuple]) -> dict:
    """The layer fields of EXAONE 4, Seed-OSS and Hunyuan dense (for
    `ModelConfig`, with `attention_bias` for its q/k/v biases and `qk_norm`
    popped by the caller; Hunyuan's RoPE as `rope_theta` / `rope_scaling`);
    {} for the other architectures. `sliding` are the sliding layers read
    (`exaone4_window`), `flag(name, default)` reads a JSON boolean,
    `read_rope(config)` reads a config's full-attention RoPE."""
    if architecture in DROPOUT_FIELDS:
        for name in DROPOUT_FIELDS[architecture]:
            value = config.get(name)
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, float)) or
                                      not 0 <= value < 1):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a "
                                             f"probability in [0, 1)")
    if architecture == EXAONE4:
        # "Global NoPE": with a window set (Exaone4Config's default 4096),
        # the full layers do not rotate, even when no layer slides.
        nope = () if config.get("sliding_window", 4096) is None else \
            tuple(i for i in range(config["num_hidden_layers"]) if i not in sliding)
        return dict(input_norms=False, sandwich_norms=True, qk_norm=True, nope_layers=nope)
    if architecture == SEED_OSS:
        return dict(attention_bias=flag("attention_bias", True),
                    o_bias=flag("attention_out_bias", False))
    if architecture == HUNYUAN_DENSE:
        return _hunyuan(config, where, flag, head_dim, read_rope)
    return {}


def _hunyuan(config: dict, where: str, flag: Callable, head_dim: int,
             read_rope: Callable[[dict], tuple]) -> dict:
    """Hunyuan dense's fields: q/k norms after RoPE (transformers applies
    them whatever `use_qk_norm` says; a false one is refused, as such a
    checkpoint has no norm weights), the parts of Tencent's shared config
    class that the dense model does not have refused (cross-layer
    attention, MLA, experts), and its RoPE."""
    if not flag("use_qk_norm", True):
        raise UnsupportedConfigError(f"{where}: field 'use_qk_norm' = False is not supported "
                                     f"for {HUNYUAN_DENSE}: its attention always norms q and k")
    for name, why in (("use_cla", "cross-layer attention shares K/V between layers"),
                      ("use_mla", "multi-head latent attention")):
        if flag(name, False):
            raise UnsupportedConfigError(f"{where}: field {name!r} = True is not supported for "
                                         f"{HUNYUAN_DENSE} ({why}; the dense model has neither)")
    experts = config.get("num_experts")
    if experts is not None and experts != 1:
        raise UnsupportedConfigError(
            f"{where}: field 'num_experts' = {experts!r} is not supported for {HUNYUAN_DENSE} "
            f"(a dense MLP: Hunyuan's MoE models are HunYuanMoEV1ForCausalLM)")
    out = dict(qk_norm=True, qk_norm_after_rope=True)
    for name in ("rope_scaling", "rope_parameters"):
        params = config.get(name)
        if not isinstance(params, dict) or \
                params.get("rope_type", params.get("type")) != "dynamic" or \
                not params.get("alpha"):
            continue  # (plain dynamic NTK is refused by `rope` by name)
        alpha = positive_number(where, f"{name}.alpha", params["alpha"])
        unknown = sorted(set(params) - _NTK_ALPHA_KEYS)
        if unknown:
            raise UnsupportedConfigError(
                f"{where}: field {name!r} of rope_type 'dynamic' with an alpha (NTK-alpha) "
                f"has {', '.join(map(repr, unknown))}, which ETC does not implement")
        if head_dim < 4:
            raise UnsupportedConfigError(f"{where}: NTK-alpha RoPE needs head_dim > 2, got "
                                         f"{head_dim}")
        plain = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_parameters")}
        if params.get("rope_theta") is not None:
            plain["rope_parameters"] = {"rope_type": "default", "rope_theta": params["rope_theta"]}
        theta, _ = read_rope(plain)
        # (transformers: the base in double precision, the powers in float32)
        out.update(rope_theta=theta * alpha ** (head_dim / (head_dim - 2)), rope_scaling=None)
        if not math.isfinite(out["rope_theta"]):
            raise UnsupportedConfigError(f"{where}: field '{name}.alpha' = {alpha!r} makes the "
                                         f"RoPE base overflow")
        return out
    theta, scaling = read_rope(config)
    if scaling and scaling["rope_type"] in ("yarn", "longrope"):
        # Its norms after RoPE would undo the factor transformers scales
        # cos and sin by, which the step graph puts on the logits' scale.
        raise UnsupportedConfigError(
            f"{where}: rope_type {scaling['rope_type']!r} is not supported for {HUNYUAN_DENSE} "
            f"(its q/k norms after RoPE cancel the variant's attention factor)")
    return dict(out, rope_theta=theta, rope_scaling=scaling)
