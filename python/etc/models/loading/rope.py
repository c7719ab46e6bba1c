"""RoPE of a Hugging Face config: the variants (`rope_type`) ETC
implements, their parameters read and checked as transformers reads them,
and their frequencies and attention factor as transformers computes them."""

from __future__ import annotations

import math
from typing import Optional

from .fields import UnsupportedConfigError, positive_int, positive_number

__all__ = ["ROPE_TYPES", "attention_factor", "inv_freq", "read", "rotary_dim", "uses_long"]

#: The RoPE variants (Hugging Face's `rope_type`) implemented: each is a set
#: of frequencies the host computes once (and, for yarn, a scale of the
#: attention logits). The parameters each takes besides `rope_type`/`type`,
#: `rope_theta` and `partial_rotary_factor` (read by `rotary_dim`), and which
#: of them are required. LongRoPE's two sets of factors are both read; the
#: one a compiled model computes with is chosen by its context length
#: (`uses_long`).
ROPE_TYPES = {
    "default": ((), ()),
    "linear": (("factor",), ("factor",)),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"),
               ("factor", "low_freq_factor", "high_freq_factor")),
    "yarn": (("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "truncate"), ("factor",)),
    "longrope": (("short_factor", "long_factor", "factor", "attention_factor",
                  "original_max_position_embeddings"), ("short_factor", "long_factor")),
}
#: RoPE variants transformers knows and ETC refuses, and why.
_REFUSED_ROPE_TYPES = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence length at run "
               "time, and the step kernel computes with one set",
    "proportional": "it rotates only part of each head (partial rotary embedding)",
    "axial": "axial (multi-dimensional) RoPE is for vision models",
    "mrope": "multimodal RoPE needs positions per modality axis",
}


def read(params: dict, chosen: str, where: str, theta: float, max_positions: int,
         original: Optional[int] = None) -> tuple[float, Optional[dict]]:
    """The base and variant of the RoPE parameters `params` (from field
    `chosen` of the config at `where`), base `theta` when they name none:
    (theta, None) for plain RoPE, else (theta, the variant's parameters
    with its "rope_type", defaults filled in as transformers fills them).
    `original` is a top-level `original_max_position_embeddings` (Phi-3's
    config has one, 4096 by default): transformers prefers it to the
    nested one for llama3, yarn and longrope. `partial_rotary_factor` is
    read by `rotary_dim`."""
    params = dict(params)
    if params.get("rope_theta") is not None:
        theta = positive_number(where, f"{chosen}.rope_theta", params["rope_theta"])
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
            value = positive_int(where, what, value)
        elif key in ("short_factor", "long_factor"):
            value = _factors(where, what, value)
        else:
            value = positive_number(where, what, value)
        scaling[key] = value
    if kind in ("llama3", "yarn", "longrope"):
        # transformers' default, as it standardises the parameters: a
        # top-level field wins, then the nested one, then the context.
        if original is not None:
            scaling["original_max_position_embeddings"] = original
        scaling.setdefault("original_max_position_embeddings", max_positions)
    if kind == "longrope":
        if len(scaling["short_factor"]) != len(scaling["long_factor"]):
            raise UnsupportedConfigError(
                f"{where}: field '{chosen}' of rope_type 'longrope' has "
                f"{len(scaling['short_factor'])} short_factor and "
                f"{len(scaling['long_factor'])} long_factor values: they must be as many (one "
                f"per rotated pair of each head)")
        # The scale of the context (transformers: max_position_embeddings /
        # original_max_position_embeddings when `factor` is absent), which
        # sets the attention factor.
        scaling.setdefault("factor", max_positions / scaling["original_max_position_embeddings"])
    if kind == "llama3" and scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' of rope_type 'llama3' has "
                                     f"low_freq_factor = high_freq_factor = "
                                     f"{scaling['low_freq_factor']!r}: they must differ")
    return theta, scaling


def _factors(where: str, what: str, value) -> tuple:
    """LongRoPE's list of per-frequency factors, checked: positive numbers."""
    if not isinstance(value, list) or not value or not all(
            not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and
            v > 0 for v in value):
        raise UnsupportedConfigError(f"{where}: field '{what}' = {value!r} must be a list of "
                                     f"positive numbers (one per rotated pair)")
    return tuple(float(v) for v in value)


def rotary_dim(head_dim: int, partial, where: str, field: str = "partial_rotary_factor") -> int:
    """The dimensions of each head that RoPE rotates: int(head_dim *
    partial_rotary_factor), as transformers computes them (the whole head
    for None), checked: a factor in (0, 1] that leaves an even count of at
    least 2."""
    if partial is None:
        return head_dim
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or \
            not math.isfinite(partial) or not 0 < partial <= 1:
        raise UnsupportedConfigError(f"{where}: field {field!r} = {partial!r} must be a number "
                                     f"in (0, 1]")
    dim = int(head_dim * partial)
    if dim < 2 or dim % 2:
        raise UnsupportedConfigError(f"{where}: field {field!r} = {partial!r} rotates "
                                     f"int({head_dim} x {partial!r}) = {dim} dimensions of each "
                                     f"head: RoPE needs an even count of at least 2")
    return dim


def uses_long(scaling: Optional[dict], length: int) -> bool:
    """Whether LongRoPE computes with its long factors for sequences of up
    to `length` positions: transformers switches to them when a forward
    pass reaches past `original_max_position_embeddings`; a compiled model
    has one set, chosen by its context length (llama.cpp's rule, by
    n_ctx)."""
    return bool(scaling) and scaling["rope_type"] == "longrope" and \
        length > scaling["original_max_position_embeddings"]


def attention_factor(scaling: Optional[dict]) -> float:
    """The factor Hugging Face multiplies cos and sin by for the RoPE
    variant `scaling` (yarn's and longrope's `attention_factor`, 1 for the
    others): q . k of the rotated dimensions scales by its square."""
    if not scaling or scaling["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    s = scaling
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    if s["rope_type"] == "longrope":
        factor, old_context = s["factor"], s["original_max_position_embeddings"]
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_context))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = s["factor"]
    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    return mscale(factor)


def inv_freq(head_dim: int, theta: float, scaling: Optional[dict], long: bool = False):
    """The RoPE frequencies (head_dim / 2 float32) of base `theta` and the
    variant `scaling` (None: plain), as Hugging Face computes them;
    `head_dim` is the rotated dimensions (`rotary_dim`). LongRoPE's with
    its long factors when `long`, else its short ones."""
    import numpy as np

    from ...reference_llm import rope_inv_freq

    d = head_dim
    plain = rope_inv_freq(d, theta)
    kind, s = (scaling["rope_type"], scaling) if scaling else ("default", None)
    if kind == "default":
        return plain
    if kind == "linear":
        return (plain / np.float32(s["factor"])).astype(np.float32)
    if kind == "longrope":
        factors = s["long_factor" if long else "short_factor"]
        if len(factors) != d // 2:
            raise UnsupportedConfigError(f"rope_type 'longrope': {len(factors)} factors for "
                                         f"{d} rotated dimensions; expected {d // 2}")
        exponents = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
        return (np.float32(1.0) / (np.asarray(factors, np.float32) *
                                   np.float32(theta) ** exponents)).astype(np.float32)
    if kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_context = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / plain
        scaled = np.where(wavelen > low_wavelen, plain / factor, plain)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    # yarn: interpolated (divided by factor) below the correction range,
    # extrapolated (unchanged) above it, a linear ramp between.
    factor, base = s["factor"], theta
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
    interpolated = plain / np.float32(factor)
    return (interpolated * (1 - extrapolation) + plain * extrapolation).astype(np.float32)
