"""RoPE of a Hugging Face config: the variants (`rope_type`) ETC
implements, their parameters read and checked as transformers reads them,
and their frequencies and attention factor as transformers computes them."""

from __future__ import annotations

import math
from typing import Optional

from .fields import UnsupportedConfigError, positive_int, positive_number

__all__ = ["ROPE_TYPES", "attention_factor", "inv_freq", "read"]

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


def read(params: dict, chosen: str, where: str, theta: float, max_positions: int,
         partial=None) -> tuple[float, Optional[dict]]:
    """The base and variant of the RoPE parameters `params` (from field
    `chosen` of the config at `where`), base `theta` when they name none:
    (theta, None) for plain RoPE, else (theta, the variant's parameters
    with its "rope_type", defaults filled in as transformers fills them).
    `partial` is a `partial_rotary_factor` given beside them."""
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
    partial = params.get("partial_rotary_factor", partial)
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
            value = positive_int(where, what, value)
        else:
            value = positive_number(where, what, value)
        scaling[key] = value
    if kind in ("llama3", "yarn"):
        # transformers' default, as it standardises the parameters.
        scaling.setdefault("original_max_position_embeddings", max_positions)
    if kind == "llama3" and scaling["low_freq_factor"] == scaling["high_freq_factor"]:
        raise UnsupportedConfigError(f"{where}: field '{chosen}' of rope_type 'llama3' has "
                                     f"low_freq_factor = high_freq_factor = "
                                     f"{scaling['low_freq_factor']!r}: they must differ")
    return theta, scaling


def attention_factor(scaling: Optional[dict]) -> float:
    """The factor Hugging Face multiplies cos and sin by for the RoPE
    variant `scaling` (yarn's `attention_factor`, 1 for the others): q . k
    scales by its square."""
    if not scaling or scaling["rope_type"] != "yarn":
        return 1.0
    s = scaling
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = s["factor"]
    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    return mscale(factor)


def inv_freq(head_dim: int, theta: float, scaling: Optional[dict]):
    """The RoPE frequencies (head_dim / 2 float32) of base `theta` and the
    variant `scaling` (None: plain), as Hugging Face computes them."""
    import numpy as np

    from ...reference_llm import rope_inv_freq

    d = head_dim
    plain = rope_inv_freq(d, theta)
    kind, s = (scaling["rope_type"], scaling) if scaling else ("default", None)
    if kind == "default":
        return plain
    if kind == "linear":
        return (plain / np.float32(s["factor"])).astype(np.float32)
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
