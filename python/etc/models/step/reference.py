"""A NumPy forward pass of the supported architectures, written from the
Hugging Face modelling code, independent of the step graph: what the
compiled model's logits must be (teacher forcing in the tests), and a
readable statement of the models' numerics.
"""

from __future__ import annotations

import numpy as np

from ... import bfloat16
from ...reference import moe_route
from ..loading import mla_layout, partial_rotary, rope
from ..loading.config import ModelConfig
from . import reference_mla

__all__ = ["forward"]


def _rmsnorm(x, weight, eps, offset=0.0):
    """x / rms(x) * (offset + weight): Gemma's norms scale by 1 + w."""
    variance = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(variance + np.float32(eps))) * (np.float32(offset) + weight)


def _layernorm(x, weight, eps):
    """Cohere's LayerNorm (no bias): (x - mean) / sqrt(var + eps) * w in
    float32, the variance of the centred values."""
    centred = x - np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
    variance = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
    return centred / np.sqrt(variance + np.float32(eps)) * weight


def _gelu_tanh(x):
    """transformers' gelu_pytorch_tanh."""
    k = np.float32(np.sqrt(2.0 / np.pi))
    inner = k * (x + np.float32(0.044715) * x ** 3)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def _softcap(x, cap):
    """cap tanh(x / cap): Gemma's soft-capping (none for cap None)."""
    return x if cap is None else np.float32(cap) * np.tanh(x / np.float32(cap))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate_pairs(x):
    """GLM-4's (GPT-J's) rotation of pairs (2i, 2i + 1): (-x[2i + 1], x[2i])."""
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def _silu(x):
    return x / (np.float32(1) + np.exp(-x))


def _sigmoid(x):
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _swiglu_oai(gate, up, limit, alpha):
    """gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`):
    the gate clamped above, up on both sides, (up + 1) gate sigmoid(alpha
    gate)."""
    gate = np.minimum(gate, np.float32(limit))
    up = np.clip(up, np.float32(-limit), np.float32(limit))
    return (up + np.float32(1)) * (gate / (np.float32(1) + np.exp(-np.float32(alpha) * gate)))


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
    half-precision cache. Weights in the step graph's layout (partial
    rotary's permuted q and k rows) are taken back to Hugging Face's
    first; LongRoPE computes with the factors transformers picks for a
    forward pass of len(tokens) positions, unless `weights` has its
    `inv_freq`."""
    c = config
    weights = partial_rotary.to_hf_layout(c, weights)
    if c.mla is not None:  # DeepSeek's latent attention: its own tensors (`reference_mla`)
        weights = mla_layout.to_hf_layout(c, weights)
    tokens = np.asarray(tokens, dtype=np.int64)
    n, d = len(tokens), c.head_dim
    x = weights["embed"][tokens].astype(np.float32)
    if c.embedding_scale is not None:
        x = x * np.float32(c.embedding_scale)
    if c.embedding_multiplier is not None:
        x = x * np.float32(c.embedding_multiplier)
    # Granite: each block's output times the residual multiplier.
    residual = np.float32(c.residual_multiplier or 1.0)
    eps, offset = c.rms_norm_eps, c.norm_offset

    def norm(x, weight):
        """The model's norm: RMSNorm, or Cohere's LayerNorm."""
        return _layernorm(x, weight, eps) if c.layer_norm else _rmsnorm(x, weight, eps, offset)

    r = c.rotated  # partial rotary: the first r dimensions of each head

    def rotation(local: bool):
        """cos and sin (n, 1, r) of the full layers' RoPE or the sliding
        layers' own, and the variant's attention factor (yarn, longrope),
        by which Hugging Face scales them."""
        if local:
            inv_freq = c.rope_inv_freq(local)
        elif "inv_freq" in weights:
            inv_freq = weights["inv_freq"][:r // 2]
        else:
            inv_freq = c.rope_inv_freq(long=rope.uses_long(c.rope_scaling, n))
        freqs = np.arange(n, dtype=np.float32)[:, None] * inv_freq[None, :]
        # Pair i's frequency at i and i + r / 2, or at 2i and 2i + 1 (GLM-4).
        emb = np.repeat(freqs, 2, axis=-1) if c.rope_interleaved else \
            np.concatenate([freqs, freqs], axis=-1)
        scaling = c.local_rope_scaling if local else c.rope_scaling
        return np.cos(emb)[:, None, :], np.sin(emb)[:, None, :], \
            np.float32(rope.attention_factor(scaling))

    rotations = {local: rotation(local) for local in {c.local_rope(i)
                                                      for i in range(c.num_layers)}}
    causal = np.triu(np.full((n, n), -np.inf, np.float32), k=1)
    # A sliding layer's token at p sees keys p - W + 1 .. p (transformers'
    # `sliding_window_overlay`: kv > q - W).
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    windowed = np.where(offsets >= (c.sliding_window or n + 1), np.float32(-np.inf), causal)
    group = c.num_heads // c.num_kv_heads
    rotate = _rotate_pairs if c.rope_interleaved else _rotate_half
    for i in range(c.num_layers):
        w = lambda key: weights[f"l{i}_{key}"]
        # (OLMo 2 and 3: no input norms, their blocks' outputs normed instead.)
        h = norm(x, w("attn_norm")) if c.input_norms else x
        if c.mla is not None:  # q, k rotated; v padded to the o projection's heads
            q, k, v = reference_mla.qkv(c, weights, i, h)
        else:
            q, k, v = h @ w("wq").T, h @ w("wk").T, h @ w("wv").T
        if c.qkv_bias:
            q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
        if c.qk_norm_projection:  # OLMo 2, OLMo 3, OLMoE: over the whole projection
            q, k = norm(q, w("q_norm")), norm(k, w("k_norm"))
        q = q.reshape(n, c.num_heads, d)
        k = k.reshape(n, c.num_kv_heads, d)
        v = v.reshape(n, c.num_kv_heads, d)
        head_norms = c.qk_norm and not c.qk_norm_projection
        # (Command R+'s LayerNorms: a weight for every head)
        heads = (lambda key, n: w(key).reshape(n, d)) if c.layer_norm else \
            (lambda key, n: w(key))
        if head_norms and not c.qk_norm_after_rope:
            q = norm(q, heads("q_norm", c.num_heads))
            k = norm(k, heads("k_norm", c.num_kv_heads))
        if c.uses_rope(i) and c.mla is None:  # SmolLM3's NoPE layers have none
            cos, sin, factor = rotations[c.local_rope(i)]
            q = np.concatenate([(q[..., :r] * cos + rotate(q[..., :r]) * sin) * factor,
                                q[..., r:]], axis=-1)
            k = np.concatenate([k[..., :r] * cos + rotate(k[..., :r]) * sin, k[..., r:]],
                               axis=-1)
        if head_norms and c.qk_norm_after_rope:  # Hunyuan dense: after RoPE
            q = norm(q, heads("q_norm", c.num_heads))
            k = norm(k, heads("k_norm", c.num_kv_heads))
        if c.uses_rope(i) and c.mla is None:
            # The cache holds the keys before the attention factor (the
            # step graph puts it on q's side), so they round before it.
            k = np.concatenate([_round_to(k[..., :r], kv_dtype) * factor,
                                _round_to(k[..., r:], kv_dtype)], axis=-1)
        else:
            k = _round_to(k, kv_dtype)
        v = _round_to(v, kv_dtype)
        k = np.repeat(k, group, axis=1)  # repeat_kv
        v = np.repeat(v, group, axis=1)
        mask = windowed if c.is_sliding(i) else causal
        scale = np.float32(c.mla.softmax_scale if c.mla is not None else
                           c.attention_multiplier if c.attention_multiplier is not None else
                           1 / np.sqrt(c.query_pre_attn_scalar or d))
        scores = _softcap(np.einsum("qhd,khd->hqk", q, k) * scale,
                          c.attn_logit_softcapping) + mask
        if c.attention_sinks or f"l{i}_sinks" in weights:
            # gpt-oss: one more logit per head, whose value is zero (any
            # model's, given `l<i>_sinks`).
            sink = np.broadcast_to(w("sinks").astype(np.float32)[:, None, None],
                                   (c.num_heads, n, 1))
            scores = np.concatenate([scores, sink], axis=-1)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = (scores / scores.sum(-1, keepdims=True))[..., :n]
        attended = np.einsum("hqk,khd->qhd", probs, v).reshape(n, c.num_heads * d)
        out = attended @ w("wo").T
        if c.o_bias:
            out = out + w("bo")
        if c.parallel_block:
            # Cohere: x + attn(ln(x)) + mlp(ln(x)), the MLP on the same h.
            attention_out = out
        else:
            x = x + (norm(out, w("post_attn_norm")) if c.sandwich_norms else
                     out) * residual
            h = norm(x, w("mlp_norm")) if c.input_norms else x
        if c.is_sparse(i):
            logits = h @ w("router")  # stored (H, E)
            if c.router_bias:
                logits = logits + w("router_b")
            experts, routings = moe_route(
                logits, c.num_experts_per_tok, c.norm_topk_prob, scoring=c.moe_scoring,
                selection_bias=w("selection_bias") if c.selection_bias else None,
                routed_scale=c.routed_scaling_factor, n_group=c.n_group,
                topk_group=c.topk_group, group_score=c.moe_group_score,
                norm_min=c.moe_norm_min)
            mlp = np.zeros_like(x)
            for t, chosen, routing in zip(range(n), experts, routings):
                for weight, e in zip(routing, chosen):
                    # Each expert (out, in), as the checkpoint stores it.
                    gate, up = w("experts_gate")[e] @ h[t], w("experts_up")[e] @ h[t]
                    if c.expert_bias:
                        gate, up = gate + w("experts_gate_b")[e], up + w("experts_up_b")[e]
                    if c.expert_activation == "swiglu_oai":
                        act = _swiglu_oai(gate, up, c.swiglu_limit, c.swiglu_alpha)
                    else:
                        act = _silu(gate) * up
                    down = w("experts_down")[e] @ act
                    if c.expert_bias:
                        down = down + w("experts_down_b")[e]
                    mlp[t] += weight * down
            if c.shared_expert_intermediate_size:
                # Qwen2-MoE, Granite MoE shared: every token's shared
                # expert too (Qwen2-MoE's times sigmoid(h . w)).
                shared = (_silu(h @ w("shexp_gate").T) * (h @ w("shexp_up").T)) @ \
                    w("shexp_down").T
                if c.shared_expert_gate:
                    shared = shared * _sigmoid(h @ w("shexp_gate_inp").T)
                mlp = mlp + shared
        else:
            act = _gelu_tanh if c.hidden_act == "gelu_pytorch_tanh" else _silu
            mlp = (act(h @ w("w_gate").T) * (h @ w("w_up").T)) @ w("w_down").T
        if c.parallel_block:
            mlp = attention_out + mlp
        x = x + (norm(mlp, w("post_mlp_norm")) if c.sandwich_norms else
                 mlp) * residual
    x = norm(x, weights["final_norm"])
    head = weights["embed"] if c.tie_word_embeddings else weights["lm_head"]
    logits = x @ head.T
    if c.logits_scaling is not None:
        logits = logits / np.float32(c.logits_scaling)  # Granite
    if c.logit_scale is not None:
        logits = logits * np.float32(c.logit_scale)  # Cohere
    return _softcap(logits, c.final_logit_softcapping).astype(np.float32)
