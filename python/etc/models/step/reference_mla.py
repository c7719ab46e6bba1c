"""The NumPy forward pass's multi-head latent attention (DeepSeek-V2 and V3),
written from transformers' DeepseekV2Attention / DeepseekV3Attention in
Hugging Face's layout (`mla_layout.to_hf_layout` undoes the step graph's)."""

from __future__ import annotations

import numpy as np

from ..loading import rope
from ..loading.config import ModelConfig

__all__ = ["qkv"]

#: transformers' RMSNorm default, which MLA's latent norms keep.
_LATENT_EPS = 1e-6


def _rmsnorm(x, weight):
    variance = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return x / np.sqrt(variance + np.float32(_LATENT_EPS)) * weight


def _rotate(x, cos, sin, interleaved: bool):
    """RoPE of the pe dimensions `x` (..., pe): pairs (2i, 2i + 1) (V2's
    complex rotation; V3's `apply_rotary_pos_emb_interleave` computes the
    same values, its output de-interleaved, which q . k does not see) or
    (i, i + pe / 2) (rotate_half); cos, sin (..., pe / 2)."""
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = first * cos - second * sin
        out[..., 1::2] = second * cos + first * sin
        return out
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def qkv(config: ModelConfig, weights: dict, layer: int, h: np.ndarray) -> tuple:
    """Layer `layer`'s q and k (n, H (nope + pe)), rotated, and v padded to
    the same width (its v_head_dim values first in each head, then zeros,
    as the step layout's o projection takes it) from the normed input `h`
    (n, hidden); `weights` with `mla_layout.to_hf_layout`'s tensors. Hugging
    Face scales cos and sin by the RoPE variant's attention factor."""
    c, m = config, config.mla
    w = lambda key: weights[f"l{layer}_{key}"]
    n, heads = h.shape[0], c.num_heads
    if m.q_lora_rank is None:
        q = h @ w("q_proj").T
    else:
        q = _rmsnorm(h @ w("wq_a").T, w("q_a_norm")) @ w("q_b_proj").T
    q = q.reshape(n, heads, m.nope_dim + m.rope_dim)
    compressed = h @ w("kv_a_proj_with_mqa").T
    latent = _rmsnorm(compressed[:, :m.kv_lora_rank], w("kv_a_norm"))
    k_pe = compressed[:, m.kv_lora_rank:]
    kv = (latent @ w("kv_b_proj").T).reshape(n, heads, m.nope_dim + m.v_dim)
    k_nope, v = kv[..., :m.nope_dim], kv[..., m.nope_dim:]
    inv_freq = weights["inv_freq"][:m.rope_dim // 2] if "inv_freq" in weights else \
        c.rope_inv_freq()
    angles = np.arange(n, dtype=np.float32)[:, None] * inv_freq[None, :]
    factor = np.float32(rope.attention_factor(c.rope_scaling))
    cos, sin = np.cos(angles) * factor, np.sin(angles) * factor
    q_pe = _rotate(q[..., m.nope_dim:], cos[:, None], sin[:, None], m.interleaved)
    k_pe = _rotate(k_pe, cos, sin, m.interleaved)
    q = np.concatenate([q[..., :m.nope_dim], q_pe], axis=-1)
    k = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None], (n, heads, m.rope_dim))],
                       axis=-1)
    padded = np.zeros((n, heads, c.head_dim), np.float32)
    padded[..., :m.v_dim] = v
    return (q.reshape(n, -1).astype(np.float32), k.reshape(n, -1).astype(np.float32),
            padded.reshape(n, -1))
