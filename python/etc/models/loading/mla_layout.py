"""DeepSeek's multi-head latent attention (MLA) in the step graph's
attention, with no kernel of its own: the weights' layout, made at load.

The step graph attends with q and k heads of D = nope + pe dimensions (the
config's `head_dim`) and, as `Graph.attention` takes one width, v heads of D
too. Each q and k head is laid out so that the pe part's RoPE pairs sit at
(j, j + D / 2), j < pe / 2, and the nope dimensions fill the other
positions in order (`order`); RoPE then rotates whole heads with a table
whose other frequencies are 0 (cos 1, sin 0: the identity), and q . k, a
sum over the same pairs of products, is unchanged. DeepSeek's interleaved
pairs (2i, 2i + 1) are one more permutation of the same rows.

- q: `l<i>_wq` (H D, hidden), or the low-rank chain `l<i>_wq_a`,
  `l<i>_q_a_norm`, `l<i>_wq_b` (H D, q_lora_rank): Hugging Face's rows of
  each head reordered by `order`; the pe rows times the square of the RoPE
  variant's attention factor (yarn's mscale / mscale_all_dim, by which
  Hugging Face scales cos and sin: the pe products carry it, the nope ones
  must not).
- kv_a_proj_with_mqa splits into `l<i>_wkv_a` (the latent c's rows) and
  `l<i>_wk_pe` (the shared pe key's, as stored); `l<i>_kv_a_norm` norms c.
- k = c_norm `l<i>_wk_b`ᵀ + pe `PLACE`ᵀ, then RoPE: kv_b_proj's k_nope rows
  of each head in its nope positions, zero rows in its pe positions, and
  `PLACE` (H D, pe), a 0/1 matrix that copies the shared pe key into every
  head's pe positions (in `order`).
- v = c_norm `l<i>_wv_b`ᵀ: kv_b_proj's v rows in the first v_head_dim
  positions of each head, zero rows after; `l<i>_wo` (hidden, H D):
  o_proj's columns there, zero columns after (exact zeros times zeros).

This caches whole K and V heads, 2 H D values per position and layer (as
transformers does), not MLA's latent (kv_lora_rank + pe). A packed weight's
rows move as they are (q, kv_a); those that gain zero rows or columns, or
scaled rows, are read unpacked (`unpacked_keys`). `to_hf_layout` undoes it
(the NumPy reference computes in Hugging Face's layout)."""

from __future__ import annotations

import re

import numpy as np

from .partial_rotary import scale_rows

__all__ = ["PLACE", "order", "place", "plan", "to_step_layout", "to_hf_layout",
           "unpacked_keys", "q_scale"]

#: The graph input that places the shared pe key into every head.
PLACE = "mla_k_pe_place"


def order(config) -> np.ndarray:
    """One head's step layout: entry j is the Hugging Face dimension of a q
    (or k) head, [nope, pe], that lands at j."""
    m = config.mla
    half, pairs = config.head_dim // 2, m.rope_dim // 2
    pe = np.arange(m.rope_dim) + m.nope_dim
    firsts, seconds = (pe[0::2], pe[1::2]) if m.interleaved else (pe[:pairs], pe[pairs:])
    nope_first = half - pairs
    return np.concatenate([firsts, np.arange(nope_first), seconds,
                           np.arange(nope_first, m.nope_dim)])


def q_scale(config) -> float:
    """What q's pe rows are multiplied by: the RoPE attention factor's square."""
    return config.rope_attention_factor ** 2


def place(config) -> np.ndarray:
    """`PLACE`, float32 (H D, pe): row h D + j is 1 at the pe dimension that
    lands at j of head h."""
    m, d = config.mla, config.head_dim
    out = np.zeros((config.num_heads * d, m.rope_dim), np.float32)
    perm = order(config)
    for j in np.flatnonzero(perm >= m.nope_dim):
        out[np.arange(config.num_heads) * d + j, perm[j] - m.nope_dim] = 1.0
    return out


def query_latent_plan(config, i: int, names: dict) -> list[tuple]:
    """The plan entries of layer `i`'s query projection(s) and latent KV
    projection and norm, which the checkpoint and the GGUF file store alike
    but under their own names: `names` maps "q" (or, with a q latent, "q_a",
    "q_a_norm" and "q_b"), "kv_a" and "kv_a_norm" to the tensors."""
    m, h, heads = config.mla, config.hidden_size, config.num_heads
    qk, c, kv_a = m.nope_dim + m.rope_dim, m.kv_lora_rank, names["kv_a"]
    if m.q_lora_rank is None:
        out = [(f"l{i}_wq", names["q"], (heads * qk, h), f"layer {i} query projection", None)]
    else:
        r = m.q_lora_rank
        out = [(f"l{i}_wq_a", names["q_a"], (r, h), f"layer {i} query down-projection", None),
               (f"l{i}_q_a_norm", names["q_a_norm"], (r,), f"layer {i} query latent norm",
                None),
               (f"l{i}_wq_b", names["q_b"], (heads * qk, r), f"layer {i} query up-projection",
                None)]
    return out + [
        (f"l{i}_wkv_a", kv_a, (c + m.rope_dim, h), f"layer {i} latent KV projection",
         ("rows", 0, c)),
        (f"l{i}_wk_pe", kv_a, (c + m.rope_dim, h), f"layer {i} latent KV projection",
         ("rows", c, c + m.rope_dim)),
        (f"l{i}_kv_a_norm", names["kv_a_norm"], (c,), f"layer {i} latent KV norm", None)]


def plan(config, i: int, p: str) -> list[tuple]:
    """`Checkpoint._plan`'s entries of layer `i`'s attention (`p` its name
    prefix): (graph input, tensor, shape, what, layout)."""
    m, h, heads = config.mla, config.hidden_size, config.num_heads
    a = p + "self_attn."
    out = query_latent_plan(config, i, {
        "q": a + "q_proj.weight", "q_a": a + "q_a_proj.weight",
        "q_a_norm": a + "q_a_layernorm.weight", "q_b": a + "q_b_proj.weight",
        "kv_a": a + "kv_a_proj_with_mqa.weight", "kv_a_norm": a + "kv_a_layernorm.weight"})
    c, kv_b, kv_rows = m.kv_lora_rank, a + "kv_b_proj.weight", heads * (m.nope_dim + m.v_dim)
    return out + [
        (f"l{i}_wk_b", kv_b, (kv_rows, c), f"layer {i} KV up-projection", ("rows", 0, kv_rows)),
        (f"l{i}_wv_b", kv_b, (kv_rows, c), f"layer {i} KV up-projection", ("rows", 0, kv_rows)),
        (f"l{i}_wo", a + "o_proj.weight", (h, heads * m.v_dim), f"layer {i} output projection",
         None)]


#: The keys laid out here, by their name after `l<i>_`.
_KEYS = ("wq", "wq_b", "wk_b", "wv_b", "wo")


def _key(key: str):
    match = re.fullmatch(r"l(\d+)_(\w+)", key)
    return None if match is None or match.group(2) not in _KEYS else match.group(2)


def unpacked_keys(config) -> set:
    """The weights that cannot stay packed: those given zero rows or
    columns (k_b, v_b, o), and q's when its pe rows are scaled."""
    if config.mla is None:
        return set()
    names = ["wk_b", "wv_b", "wo"]
    if q_scale(config) != 1.0:
        names += ["wq", "wq_b"]
    return {f"l{i}_{name}" for i in range(config.num_layers) for name in names}


def to_step_layout(config, key: str, array: np.ndarray, storage: str = "f32",
                   packed: bool = False) -> np.ndarray:
    """Weight `key` (graph name) as the step graph takes it (the array
    itself where MLA does not change it): see the module docstring.
    `storage` is the array's compute dtype; a `packed` one may only have its
    rows reordered."""
    name = None if config.mla is None else _key(key)
    if name is None:
        return array
    m, d, heads = config.mla, config.head_dim, config.num_heads
    perm = order(config)
    if name in ("wq", "wq_b"):
        # Each head's rows reordered alike, so the rows may be a rank's
        # share of the heads (a packed GGUF weight is split as it is read).
        share = array.shape[0] // d
        out = np.ascontiguousarray(array[(np.arange(share)[:, None] * d + perm).ravel()])
        factor = q_scale(config)
        if factor != 1.0:
            if packed:
                raise NotImplementedError(f"{key}: a packed weight's rows cannot be scaled by "
                                          f"the RoPE attention factor (mla_layout.unpacked_keys)")
            pe = (np.arange(share)[:, None] * d + np.flatnonzero(perm >= m.nope_dim)).ravel()
            out = scale_rows(out, pe, factor, storage)
        return out
    if packed:
        raise NotImplementedError(f"{key}: a packed weight cannot gain zero rows or columns "
                                  f"(mla_layout.unpacked_keys)")
    if name == "wo":  # (hidden, H v) -> (hidden, H D), v in each head's first columns
        out = np.zeros((array.shape[0], heads, d), array.dtype)
        out[:, :, :m.v_dim] = array.reshape(array.shape[0], heads, m.v_dim)
        return out.reshape(array.shape[0], heads * d)
    # kv_b_proj, (H (nope + v), c): each head's k_nope rows, then its v rows;
    # or (GGUF's attn_k_b, attn_v_b) the k_nope rows or the v rows alone.
    per_head = array.reshape(heads, -1, array.shape[-1])
    k_rows = slice(0, m.nope_dim)
    v_rows = slice(0, m.v_dim) if per_head.shape[1] == m.v_dim and name == "wv_b" else \
        slice(m.nope_dim, m.nope_dim + m.v_dim)
    out = np.zeros((heads, d, array.shape[-1]), array.dtype)
    if name == "wk_b":
        nope = np.flatnonzero(perm < m.nope_dim)
        out[:, nope] = per_head[:, k_rows][:, perm[nope]]
    else:
        out[:, :m.v_dim] = per_head[:, v_rows]
    return out.reshape(heads * d, array.shape[-1])


def to_hf_layout(config, weights: dict) -> dict:
    """float32 `weights` in the step layout with each layer's Hugging Face
    tensors beside them, under their names after `l<i>_`: `q_proj` (or
    `q_b_proj`), `kv_a_proj_with_mqa`, `kv_b_proj`, `o_proj`."""
    m, d, heads = config.mla, config.head_dim, config.num_heads
    perm = order(config)
    nope = np.flatnonzero(perm < m.nope_dim)
    pe = np.flatnonzero(perm >= m.nope_dim)
    out = dict(weights)
    for i in range(config.num_layers):
        w = lambda key: np.asarray(weights[f"l{i}_{key}"], np.float32)
        q_key = "wq" if m.q_lora_rank is None else "wq_b"
        q = w(q_key).reshape(heads, d, -1).copy()
        q[:, pe] /= np.float32(q_scale(config))
        hf_q = np.empty_like(q)
        hf_q[:, perm] = q
        out[f"l{i}_{'q_proj' if m.q_lora_rank is None else 'q_b_proj'}"] = \
            hf_q.reshape(heads * d, -1)
        out[f"l{i}_kv_a_proj_with_mqa"] = np.concatenate([w("wkv_a"), w("wk_pe")])
        k_b = w("wk_b").reshape(heads, d, -1)
        v_b = w("wv_b").reshape(heads, d, -1)
        kv_b = np.empty((heads, m.nope_dim + m.v_dim, k_b.shape[-1]), np.float32)
        kv_b[:, perm[nope]] = k_b[:, nope]
        kv_b[:, m.nope_dim:] = v_b[:, :m.v_dim]
        out[f"l{i}_kv_b_proj"] = kv_b.reshape(-1, k_b.shape[-1])
        wo = w("wo")
        out[f"l{i}_o_proj"] = wo.reshape(wo.shape[0], heads, d)[:, :, :m.v_dim] \
            .reshape(wo.shape[0], heads * m.v_dim)
    return out
