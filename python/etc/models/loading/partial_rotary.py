"""Partial rotary embedding (Phi-4-mini: `partial_rotary_factor` 0.75) and
interleaved RoPE pairs (GLM-4: both, factor 0.5) in the step graph, with
no kernel of its own.

Hugging Face rotates the first r = `rotary_dim` dimensions of each head,
pairs (i, i + r / 2) for i < r / 2, and passes the other head_dim - r
through; its cos and sin carry the variant's attention factor (LongRoPE's
sqrt(1 + ln(factor) / ln(original context))), so only the rotated
dimensions are scaled by it. GLM-4's pairs are (2i, 2i + 1) instead
(`ModelConfig.rope_interleaved`, GPT-J's layout), of the same
frequencies. The step graph's `rope` rotates pairs (i, i + head_dim / 2)
of the whole head with a (head_dim / 2,) frequency table. At load, each
head's rows of the q and k projections (and their biases and norms) are
permuted so that Hugging Face's pair (i, i + r / 2), or (2i, 2i + 1),
lands on (i, i + head_dim / 2) and the pass-through dimensions fill the
pairs r / 2 .. head_dim / 2 - 1, whose frequency in the table
(`ModelConfig.rope_tables`) is 0: cos 1, sin 0, the identity. q . k is the
same sum over the same pairs of products, so attention is unchanged; v and
o are untouched. The attention factor's square is put on the q rows of the
rotated pairs (or the q norm's entries, with per-head norms), where q . k
takes it from, instead of the attention scale, which the pass-through
dimensions must not carry.

A permutation of whole rows keeps every row's blocks (a packed weight's
rows, GGUF's or FP8's, move as they are); a scaled row cannot stay packed
(`unpacked_keys`: that weight is dequantized). Tensor parallelism splits
whole heads, each permuted alike. `to_hf_layout` undoes the change (the
NumPy reference computes in Hugging Face's layout)."""

from __future__ import annotations

import re

import numpy as np

__all__ = ["permutation", "permuted", "q_scale", "scale_rows", "to_step_layout", "to_hf_layout",
           "unpacked_keys"]

#: The weights in a head's q or k layout, by the suffix of their graph name.
_Q_KEYS = ("wq", "bq", "q_norm")
_K_KEYS = ("wk", "bk", "k_norm")


def permutation(head_dim: int, rotary_dim: int, interleaved: bool = False) -> np.ndarray:
    """The step layout of one head: entry j is the Hugging Face dimension
    that lands at j (pair (i, i + head_dim / 2) holds (i, i + r / 2) for
    i < r / 2, or (2i, 2i + 1) when `interleaved`, then the pass-through
    dimensions in order, half each)."""
    half, rotated_half = head_dim // 2, rotary_dim // 2
    rest = half - rotated_half
    firsts, seconds = (np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)) \
        if interleaved else (np.arange(rotated_half), np.arange(rotated_half, rotary_dim))
    return np.concatenate([firsts, np.arange(rotary_dim, rotary_dim + rest),
                           seconds, np.arange(rotary_dim + rest, head_dim)])


def permuted(config) -> bool:
    """Whether the q and k rows of `config` are permuted at load: partial
    rotary, or interleaved pairs."""
    return config.rotary_dim is not None or config.rope_interleaved


def q_scale(config) -> float:
    """What the q rows of the rotated pairs are multiplied by: the square of
    the RoPE variant's attention factor (1 without partial rotary)."""
    return config.rope_attention_factor ** 2 if config.rotary_dim is not None else 1.0


def _layer_key(key: str):
    match = re.fullmatch(r"l(\d+)_(\w+)", key)
    if match is None or match.group(2) not in _Q_KEYS + _K_KEYS:
        return None, None
    return int(match.group(1)), match.group(2)


def unpacked_keys(config) -> set:
    """The weights that cannot stay packed: the q projections whose rows
    are scaled (a LongRoPE attention factor with partial rotary)."""
    if config.rotary_dim is None or q_scale(config) == 1.0 or config.qk_norm:
        return set()
    return {f"l{i}_wq" for i in range(config.num_layers) if config.uses_rope(i)}


def _rows(config, name: str, rows: int) -> np.ndarray:
    """The row order of a q or k weight of `rows` rows (whole heads; a
    per-head norm: one)."""
    d = config.head_dim
    perm = permutation(d, config.rotated, config.rope_interleaved)
    return (np.arange(rows // d)[:, None] * d + perm[None, :]).ravel()


def _scaled_rows(config, name: str, rows: int) -> np.ndarray:
    """The rows (in the step layout) that carry the attention factor's
    square: q's rotated pairs, in the projection (and bias), or in the
    norm with per-head norms."""
    if name not in _Q_KEYS or (name == "q_norm") != config.qk_norm:
        return np.zeros(0, np.int64)
    d, half, rotated_half = config.head_dim, config.head_dim // 2, config.rotated // 2
    one = np.concatenate([np.arange(rotated_half), half + np.arange(rotated_half)])
    return (np.arange(rows // d)[:, None] * d + one[None, :]).ravel()


def scale_rows(array: np.ndarray, rows: np.ndarray, factor: float, storage: str) -> np.ndarray:
    """`array` with `rows` multiplied by `factor`, in float32, stored back
    in `storage` (f32, f16 or bf16 bit patterns); `mla_layout` scales its
    rotated query rows with it too."""
    from ... import bfloat16

    wide = bfloat16.from_bits(array).reshape(array.shape) if storage == "bf16" else \
        array.astype(np.float32)
    wide[rows] *= np.float32(factor)
    if storage == "bf16":
        return bfloat16.to_bits(wide).reshape(array.shape)
    return wide.astype(array.dtype)


def to_step_layout(config, key: str, array: np.ndarray, storage: str = "f32",
                   packed: bool = False) -> np.ndarray:
    """Weight `key` (graph name) as the step graph takes it with partial
    rotary (the array itself otherwise): q/k rows permuted per head, q's
    rotated rows scaled (`q_scale`). `storage` is the array's compute dtype
    ("f32", "f16", or "bf16" bit patterns); a `packed` weight (rows of
    blocks) is permuted only, and must not need scaling."""
    layer, name = _layer_key(key)
    if not permuted(config) or name is None:
        return array
    out = np.ascontiguousarray(array[_rows(config, name, array.shape[0])])
    factor = q_scale(config)
    scaled = _scaled_rows(config, name, array.shape[0])
    if factor != 1.0 and len(scaled) and config.uses_rope(layer):
        if packed:
            raise NotImplementedError(f"{key}: a packed weight's rows cannot be scaled by the "
                                      f"RoPE attention factor (load it unpacked: "
                                      f"partial_rotary.unpacked_keys)")
        if name == "q_norm" and config.norm_offset:
            # The norm scales by offset + w: scaling w would not scale that.
            raise NotImplementedError(f"{key}: a q norm of {config.norm_offset} + w cannot "
                                      f"carry the RoPE attention factor")
        out = scale_rows(out, scaled, factor, storage)
    return out


def to_hf_layout(config, weights: dict) -> dict:
    """float32 `weights` in the step layout back in Hugging Face's (the
    inverse of `to_step_layout`); the same dict without partial rotary or
    interleaved pairs."""
    if not permuted(config):
        return weights
    out = dict(weights)
    factor = q_scale(config)
    for key, array in weights.items():
        layer, name = _layer_key(key)
        if name is None:
            continue
        array = np.asarray(array, np.float32).copy()
        scaled = _scaled_rows(config, name, array.shape[0])
        if factor != 1.0 and len(scaled) and config.uses_rope(layer):
            array[scaled] /= np.float32(factor)
        back = np.empty_like(array)
        back[_rows(config, name, array.shape[0])] = array
        out[key] = back
    return out
