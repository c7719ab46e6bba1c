"""The NumPy meaning of the LLM inference operators (see `etc.graph_llm`).

Each function takes and returns NumPy arrays (float32 for float data, int32
for indices) and is what the compiled kernels must compute; `etc.reference`
dispatches to them through `apply`.
"""

from __future__ import annotations

import numpy as np

from . import reference_sampling

__all__ = ["embedding", "rope", "rope_inv_freq", "head_rmsnorm", "head_layernorm", "sum_squares",
           "split_rmsnorm", "kv_append", "attention", "paged_rows", "argmax", "KINDS", "apply"]

#: The operator kinds this module computes.
KINDS = ("embedding", "rope", "head_rmsnorm", "head_layernorm", "kv_append", "attention",
         "argmax", "sample", "adjust_logits", "sum_squares", "split_rmsnorm")


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """table[ids], with zero rows for ids outside [0, len(table))."""
    ids = np.asarray(ids, dtype=np.int64)
    inside = (ids >= 0) & (ids < table.shape[0])
    out = np.zeros((ids.shape[0], table.shape[1]), np.float32)
    out[inside] = table[ids[inside]]
    return out


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i / head_dim) for i < head_dim / 2, in float32 as Hugging
    Face computes it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, head_dim: int, theta: float = 10000.0,
         inv_freq=None) -> np.ndarray:
    """`x * cos + rotate_half(x) * sin` per head of `head_dim` columns, the
    angles positions * inv_freq in float32 (Hugging Face's convention)."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(head_dim, theta)
    angles = np.asarray(positions, np.float32)[:, None] * np.asarray(inv_freq, np.float32)[None]
    cos = np.cos(angles).astype(np.float32)
    sin = np.sin(angles).astype(np.float32)
    rows = x.shape[0]
    heads = x.reshape(rows, -1, head_dim)
    half = head_dim // 2
    first, second = heads[..., :half], heads[..., half:]
    out = np.empty_like(heads)
    out[..., :half] = first * cos[:, None] - second * sin[:, None]
    out[..., half:] = second * cos[:, None] + first * sin[:, None]
    return out.reshape(x.shape)


def head_rmsnorm(x: np.ndarray, weight: np.ndarray, head_dim: int, eps: float,
                 offset: float = 0.0) -> np.ndarray:
    """RMSNorm over each head of `head_dim` columns, with the shared weight
    (plus `offset`, in float32)."""
    rows = x.shape[0]
    heads = x.reshape(rows, -1, head_dim)
    ms = np.mean(heads * heads, axis=-1, keepdims=True, dtype=np.float32)
    weight = np.float32(offset) + weight
    return (heads / np.sqrt(ms + np.float32(eps)) * weight).reshape(x.shape)


def sum_squares(*xs: np.ndarray) -> np.ndarray:
    """(T, n): column j the float32 sum of the squares of each row of xs[j]."""
    return np.stack([np.sum(x * x, axis=-1, dtype=np.float32) for x in xs], axis=-1)


def split_rmsnorm(x: np.ndarray, weight: np.ndarray, totals: np.ndarray, width: int,
                  column: int, eps: float, offset: float = 0.0) -> np.ndarray:
    """x / sqrt(totals[:, column] / width + eps) * (offset + weight): the
    RMSNorm of a share of rows `width` wide whose squares sum to the
    column of `totals`."""
    ms = totals[:, column:column + 1] / np.float32(width)
    return x / np.sqrt(ms + np.float32(eps)) * (np.float32(offset) + weight)


def head_layernorm(x: np.ndarray, weight: np.ndarray, head_dim: int,
                   eps: float) -> np.ndarray:
    """LayerNorm over each head of `head_dim` columns (two passes, float32),
    times each head's own weights (`weight`: one per column of x)."""
    rows = x.shape[0]
    heads = x.reshape(rows, -1, head_dim)
    centred = heads - np.mean(heads, axis=-1, keepdims=True, dtype=np.float32)
    variance = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
    normed = centred / np.sqrt(variance + np.float32(eps))
    return (normed * weight.reshape(-1, head_dim)).reshape(x.shape)


def _cache_rows(cache: np.ndarray, positions: np.ndarray, token_request: np.ndarray,
                addressing: np.ndarray, block_size) -> list:
    """Where each token's row goes: (block or slot, row) of `cache`, or None
    outside it. Contiguous (`block_size` None): slot request_slot[r] at row
    p. Paged: block block_table[r, p // P] at row p % P."""
    positions = np.asarray(positions, np.int64)
    requests = np.asarray(token_request, np.int64)
    addressing = np.asarray(addressing, np.int64)
    rows = []
    for t in range(len(positions)):
        p, r = positions[t], requests[t]
        if block_size is None:
            at = (addressing[r], p)
        elif 0 <= p < addressing.shape[1] * block_size:
            at = (addressing[r, p // block_size], p % block_size)
        else:
            at = (-1, 0)
        inside = 0 <= at[0] < cache.shape[0] and 0 <= at[1] < cache.shape[1]
        rows.append(at if inside else None)
    return rows


def kv_append(cache: np.ndarray, values: np.ndarray, positions: np.ndarray,
              token_request: np.ndarray, request_slot: np.ndarray,
              block_size=None) -> np.ndarray:
    """A copy of `cache` with values[t] at
    [request_slot[token_request[t]], positions[t]], or, paged (`block_size`
    P, `request_slot` then the (R, M) block tables), at
    [block_table[token_request[t], positions[t] // P], positions[t] % P].
    Tokens outside the cache write nothing."""
    out = np.array(cache, dtype=np.float32, copy=True)
    for t, at in enumerate(_cache_rows(cache, positions, token_request, request_slot,
                                       block_size)):
        if at is not None:
            out[at] = values[t]
    return out


def paged_rows(cache: np.ndarray, block_table: np.ndarray, length: int) -> np.ndarray:
    """The first `length` positions of the sequence whose blocks are the
    row `block_table` of a paged cache (blocks, P, W), as (length, W)."""
    block_size = cache.shape[1]
    blocks = np.asarray(block_table, np.int64)[:-(-length // block_size)]
    return cache[blocks].reshape(-1, cache.shape[2])[:length]


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, positions: np.ndarray,
              token_request: np.ndarray, request_slot: np.ndarray, head_dim: int,
              scale: float, block_size=None, window=None, softcap=None,
              sinks=None) -> np.ndarray:
    """Causal grouped-query attention of each token over its request's cache
    slot: token t (query heads q[t], H of them) attends to the cached keys
    and values at positions 0 .. positions[t] (with a `window` W, positions
    max(0, positions[t] - W + 1) .. positions[t]) of slot
    request_slot[token_request[t]] (paged, `block_size` P: of the blocks of
    row token_request[t] of the block tables `request_slot`), query head h
    to KV head h // (H / H_kv); softmax(scale * q . k) weighted sum of v.
    With `sinks` (H,), head h's softmax has one more logit sinks[h] whose
    value is zero (gpt-oss): the key weights sum to less than 1."""
    tokens = q.shape[0]
    heads = q.shape[1] // head_dim
    kv_heads = k_cache.shape[2] // head_dim
    group = heads // kv_heads
    out = np.zeros((tokens, heads * head_dim), np.float32)
    requests = np.asarray(token_request, np.int64)
    addressing = np.asarray(request_slot, np.int64)
    for t in range(tokens):
        n = positions[t] + 1
        if block_size is None:
            slot = addressing[requests[t]]
            keys, values = k_cache[slot, :n], v_cache[slot, :n]
        else:
            table = addressing[requests[t]]
            keys, values = paged_rows(k_cache, table, n), paged_rows(v_cache, table, n)
        start = 0 if window is None else max(0, n - window)
        keys = keys[start:].reshape(-1, kv_heads, head_dim)
        values = values[start:].reshape(-1, kv_heads, head_dim)
        for h in range(heads):
            query = q[t, h * head_dim:(h + 1) * head_dim]
            scores = (keys[:, h // group] @ query) * np.float32(scale)
            if softcap is not None:
                scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
            top = scores.max() if sinks is None else max(scores.max(), np.float32(sinks[h]))
            weights = np.exp(scores - top)
            total = weights.sum(dtype=np.float32)
            if sinks is not None:
                total += np.exp(np.float32(sinks[h]) - top)
            weights /= total
            out[t, h * head_dim:(h + 1) * head_dim] = weights @ values[:, h // group]
    return out


def argmax(x: np.ndarray) -> np.ndarray:
    """The int32 index of the largest value of each row, the first of equal
    values, NaN above every number (the order of `etc.reference.topk`)."""
    x = np.asarray(x, np.float32)
    nan = np.isnan(x)
    order = np.lexsort((-np.where(nan, 0, x), ~nan), axis=-1)
    return order[..., 0].astype(np.int32)


def apply(op, vals: list) -> np.ndarray:
    """The result of operator `op` (kind, params) on operand arrays `vals`."""
    kind, params = op.kind, op.params
    if kind == "embedding":
        return embedding(*vals)
    if kind == "rope":
        inv_freq = vals[2] if len(vals) > 2 else None
        return rope(vals[0], vals[1], params["head_dim"], params.get("theta", 10000.0),
                    inv_freq)
    if kind == "head_rmsnorm":
        return head_rmsnorm(vals[0], vals[1], params["head_dim"], params["eps"],
                            params.get("offset", 0.0))
    if kind == "sum_squares":
        return sum_squares(*vals)
    if kind == "split_rmsnorm":
        return split_rmsnorm(*vals, params["width"], params["column"], params["eps"],
                             params.get("offset", 0.0))
    if kind == "head_layernorm":
        return head_layernorm(vals[0], vals[1], params["head_dim"], params["eps"])
    if kind == "kv_append":
        return kv_append(*vals, block_size=params.get("block_size"))
    if kind == "attention":
        q, k_cache, v_cache, positions, token_request, request_slot = vals[:6]
        return attention(q, k_cache, v_cache, positions, token_request, request_slot,
                         params["head_dim"], params["scale"], params.get("block_size"),
                         params.get("window"), params.get("softcap"),
                         vals[8] if len(vals) > 8 else None)
    if kind == "argmax":
        return argmax(vals[0])
    if kind == "sample":
        return reference_sampling.sample(*vals[:7])
    if kind == "adjust_logits":
        return reference_sampling.adjust_logits(*vals)
    raise AssertionError(f"unknown operator kind {kind!r}")
