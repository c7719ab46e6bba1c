"""The step graph's q, k and v of DeepSeek's multi-head latent attention
(MLA), in the layout `etc.models.loading.mla_layout` gives its weights:
heads of `head_dim` (nope + pe) for q and k, v padded to it, RoPE on the pe
pairs only (the frequency table's other entries are 0). The attention, KV
caches and output projection are every model's."""

from __future__ import annotations

from ..loading.config import ModelConfig
from ..loading.mla_layout import PLACE

__all__ = ["PLACE", "place_input", "project"]

#: The epsilon of MLA's latent norms (q_a_layernorm, kv_a_layernorm):
#: transformers builds them with its RMSNorm's default, not rms_norm_eps.
LATENT_EPS = 1e-6


def project(g, c: ModelConfig, i: int, normed, weight, place, positions, inv_freq):
    """Layer `i`'s q, k and v (each (T, H head_dim)) from its normed input:
    q = normed Wqᵀ (or q_b(norm(q_a(normed)))); the latent c_norm =
    norm(normed Wkv_aᵀ) and the shared pe key normed Wk_peᵀ; k = c_norm
    Wk_bᵀ + pe PLACEᵀ (the pe key copied into every head, added in the
    matmul's tiles); v = c_norm Wv_bᵀ; q and k rotated. `weight(key,
    shape)` is the graph's weight input, `place` the `PLACE` input (one for
    every layer: `place_input`)."""
    m, h, heads, d = c.mla, c.hidden_size, c.num_heads, c.head_dim
    if m.q_lora_rank is None:
        q = g.matmul(normed, weight(f"l{i}_wq", (heads * d, h)), transpose_b=True)
    else:
        r = m.q_lora_rank
        low = g.matmul(normed, weight(f"l{i}_wq_a", (r, h)), transpose_b=True)
        low = g.rmsnorm(low, weight(f"l{i}_q_a_norm", (r,)), LATENT_EPS)
        q = g.matmul(low, weight(f"l{i}_wq_b", (heads * d, r)), transpose_b=True)
    rank = m.kv_lora_rank
    latent = g.rmsnorm(g.matmul(normed, weight(f"l{i}_wkv_a", (rank, h)), transpose_b=True),
                       weight(f"l{i}_kv_a_norm", (rank,)), LATENT_EPS)
    pe = g.matmul(normed, weight(f"l{i}_wk_pe", (m.rope_dim, h)), transpose_b=True)
    k_nope = g.matmul(latent, weight(f"l{i}_wk_b", (heads * d, rank)), transpose_b=True)
    k = g.matmul(pe, place, transpose_b=True, residual=k_nope)
    v = g.matmul(latent, weight(f"l{i}_wv_b", (heads * d, rank)), transpose_b=True)
    q = g.rope(q, positions, head_dim=d, inv_freq=inv_freq)
    k = g.rope(k, positions, head_dim=d, inv_freq=inv_freq)
    return q, k, v


def place_input(c: ModelConfig, weight):
    """The `PLACE` input ((H head_dim, pe), 0/1 in the compute dtype)."""
    return weight(PLACE, (c.num_heads * c.head_dim, c.mla.rope_dim))
