"""A NumPy forward pass of the supported architectures, written from the
Hugging Face modelling code, independent of the step graph: what the
compiled model's logits must be (teacher forcing in the tests), and a
readable statement of the models' numerics.
"""

from __future__ import annotations

import numpy as np

from ... import bfloat16
from ..loading.config import ModelConfig

__all__ = ["forward"]


def _rmsnorm(x, weight, eps):
    variance = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _silu(x):
    return x / (np.float32(1) + np.exp(-x))


def _round_to(x, dtype: str):
    """`x` (float32) rounded to what a buffer of `dtype` holds."""
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return bfloat16.from_bits(bfloat16.to_bits(x)).reshape(x.shape)
    return x


def forward(config: ModelConfig, weights: dict, tokens, kv_dtype: str = "f32") -> np.ndarray:
    """The logits (len(tokens), vocab) float32 of every position of one
    sequence, with `weights` named as `Checkpoint.weights` names them;
    `kv_dtype` rounds the keys (after RoPE) and values to what a KV cache
    of that dtype holds, the only rounding of a float32 model with a
    half-precision cache."""
    c = config
    tokens = np.asarray(tokens, dtype=np.int64)
    n, d = len(tokens), c.head_dim
    x = weights["embed"][tokens].astype(np.float32)
    inv_freq = c.rope_inv_freq()
    freqs = np.arange(n, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    # Hugging Face scales cos and sin by the variant's attention factor (yarn).
    factor = np.float32(c.rope_attention_factor)
    cos, sin = np.cos(emb)[:, None, :] * factor, np.sin(emb)[:, None, :] * factor  # (n, 1, d)
    causal = np.triu(np.full((n, n), -np.inf, np.float32), k=1)
    # A sliding layer's token at p sees keys p - W + 1 .. p (transformers'
    # `sliding_window_overlay`: kv > q - W).
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    windowed = np.where(offsets >= (c.sliding_window or n + 1), np.float32(-np.inf), causal)
    group = c.num_heads // c.num_kv_heads
    for i in range(c.num_layers):
        w = lambda key: weights[f"l{i}_{key}"]
        h = _rmsnorm(x, w("attn_norm"), c.rms_norm_eps)
        q, k, v = h @ w("wq").T, h @ w("wk").T, h @ w("wv").T
        if c.qkv_bias:
            q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
        q = q.reshape(n, c.num_heads, d)
        k = k.reshape(n, c.num_kv_heads, d)
        v = v.reshape(n, c.num_kv_heads, d)
        if c.qk_norm:
            q = _rmsnorm(q, w("q_norm"), c.rms_norm_eps)
            k = _rmsnorm(k, w("k_norm"), c.rms_norm_eps)
        q = q * cos + _rotate_half(q) * sin
        k = _round_to(k * cos + _rotate_half(k) * sin, kv_dtype)
        v = _round_to(v, kv_dtype)
        k = np.repeat(k, group, axis=1)  # repeat_kv
        v = np.repeat(v, group, axis=1)
        mask = windowed if c.is_sliding(i) else causal
        scores = np.einsum("qhd,khd->hqk", q, k) / np.float32(np.sqrt(d)) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", probs, v).reshape(n, c.num_heads * d)
        x = x + attended @ w("wo").T
        h = _rmsnorm(x, w("mlp_norm"), c.rms_norm_eps)
        if c.is_sparse(i):
            logits = h @ w("router")  # stored (H, E)
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            mlp = np.zeros_like(x)
            for t in range(n):
                chosen = np.argsort(-probs[t], kind="stable")[:c.num_experts_per_tok]
                routing = probs[t, chosen]
                if c.norm_topk_prob:
                    routing = routing / routing.sum()
                for weight, e in zip(routing, chosen):
                    act = _silu(h[t] @ w("experts_gate")[e]) * (h[t] @ w("experts_up")[e])
                    mlp[t] += weight * (act @ w("experts_down")[e])
        else:
            mlp = (_silu(h @ w("w_gate").T) * (h @ w("w_up").T)) @ w("w_down").T
        x = x + mlp
    x = _rmsnorm(x, weights["final_norm"], c.rms_norm_eps)
    head = weights["embed"] if c.tie_word_embeddings else weights["lm_head"]
    return (x @ head.T).astype(np.float32)
