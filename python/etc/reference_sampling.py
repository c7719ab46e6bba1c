"""The NumPy meaning of `Graph.sample`: temperature, top-k, top-p and
min-p sampling with a counter-based random generator (see `sample`).

The random numbers are exact: `philox4x32` is Philox-4x32-10 (Salmon et
al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), checked
against the known-answer vectors of its authors' Random123 library, and
`uniform` derives the one float32 draw of a request from it bit for bit as
the kernels do. So a test can compare sampled tokens exactly: kernel and
reference differ only where a draw falls within float32 rounding of the
boundary between two tokens (their sums of weights are added in different
orders, and `exp` is not correctly rounded).
"""

from __future__ import annotations

import numpy as np

__all__ = ["philox4x32", "uniform", "sample", "PHILOX_ROUNDS"]

#: Philox-4x32's multipliers and key increments (Weyl constants).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
_MASK = np.uint64(0xFFFFFFFF)


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS) -> tuple:
    """Philox-4x32-`rounds` of `counter` (four uint32 words or arrays of
    them) under `key` (two words): the four output words, uint32 arrays."""
    c = [np.asarray(w, np.uint64) & _MASK for w in counter]
    k0, k1 = (np.asarray(w, np.uint64) & _MASK for w in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W[0])) & _MASK
            k1 = (k1 + np.uint64(PHILOX_W[1])) & _MASK
        p0, p1 = m0 * c[0], m1 * c[2]  # 32 x 32 bits: exact in 64
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK]
    return tuple(w.astype(np.uint32) for w in c)


def uniform(seed: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The float32 draw in [0, 1) of each request: the top 24 bits of the
    first word of Philox-4x32-10 with counter (position, 0, 0, 0) and key
    (seed[:, 0], seed[:, 1]) (the seed's low and high 32 bits, as int32),
    times 2**-24 (exact)."""
    seed = np.asarray(seed).astype(np.int64) & 0xFFFFFFFF
    position = np.asarray(position).astype(np.int64) & 0xFFFFFFFF
    zero = np.zeros_like(position)
    word = philox4x32((position, zero, zero, zero), (seed[:, 0], seed[:, 1]))[0]
    return ((word >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


def _argmax(x: np.ndarray) -> int:
    """The first largest value's index, NaN above every number (as
    `reference_llm.argmax`)."""
    nan = np.isnan(x)
    return int(np.lexsort((-np.where(nan, 0, x), ~nan))[0]) if x.size else 0


def sample(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
           min_p: np.ndarray, seed: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The int32 token of each row of `logits` (R, V), computed in float32.

    Row r with temperature T = temperature[r] is greedy (the argmax, first
    of equal values, NaN first) unless T > 0 and some logit is a number
    above -inf. Otherwise, with m the largest number of the row:

    * the weights are w = exp((x - m) * (1 / T)), 1 where x = m (so +inf
      logits share the mass), 0 for NaN;
    * top-k (0 < k < V): the threshold t_k is the k-th largest number
      (counted with repetition; -inf when the row has fewer numbers), and
      every x >= t_k is kept: ties with the k-th value are kept, as in
      Hugging Face's and vLLM's top-k;
    * top-p (p < 1), over the top-k set: x is kept if the weights of the
      logits strictly above x sum to less than p times the set's weight
      (ties kept alike; the largest logits are always kept);
    * min-p: x is kept if w >= min(min_p, 1) (p(x) >= min_p * p(max));
    * with W the sum of the kept weights and u = `uniform(seed, position)`,
      the token is the first kept index where the running sum of kept
      weights, in index order, exceeds u * W; tokens of zero weight are
      never chosen.
    """
    x_all = np.asarray(logits, np.float32)
    out = np.zeros(x_all.shape[0], np.int32)
    draws = uniform(seed, position)
    for r in range(x_all.shape[0]):
        x = x_all[r]
        out[r] = _argmax(x)
        t = np.float32(temperature[r])
        numbers = x[~np.isnan(x)]
        m = numbers.max() if numbers.size else np.float32(-np.inf)
        if not (t > 0) or not (m > -np.inf):
            continue
        inv = np.float32(1.0) / t
        with np.errstate(invalid="ignore", over="ignore"):
            w = np.where(x == m, np.float32(1.0), np.exp((x - m) * inv)).astype(np.float32)
        w[np.isnan(x)] = 0
        n = x.shape[0]
        threshold = np.float32(-np.inf)
        k = int(top_k[r])
        if 0 < k < n and k <= numbers.size:
            threshold = np.sort(numbers)[::-1][k - 1]
        p = np.float32(top_p[r])
        if p < 1:
            total = np.float32(p) * np.float32(np.sum(w[x >= threshold], dtype=np.float32))
            kept_values = [v for v in np.unique(numbers[numbers >= threshold])
                           if np.sum(w[x > v], dtype=np.float32) < total]
            threshold = min(kept_values) if kept_values else m
        q = min(np.float32(min_p[r]), np.float32(1.0))
        keep = (x >= threshold) & (w >= q)
        kept = np.where(keep, w, np.float32(0.0)).astype(np.float32)
        running = np.cumsum(kept, dtype=np.float32)
        target = draws[r] * running[-1]
        crossed = np.nonzero((kept > 0) & (running > target))[0]
        out[r] = crossed[0] if crossed.size else np.nonzero(kept > 0)[0][-1]
    return out
