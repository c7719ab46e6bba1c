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

__all__ = ["philox4x32", "uniform", "sample", "logprobs", "adjust_logits", "PHILOX_ROUNDS"]

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
        kept = _kept(x, temperature[r], top_k[r], top_p[r], min_p[r])
        if kept is None:
            continue
        running = np.cumsum(kept, dtype=np.float32)
        target = draws[r] * running[-1]
        crossed = np.nonzero((kept > 0) & (running > target))[0]
        out[r] = crossed[0] if crossed.size else np.nonzero(kept > 0)[0][-1]
    return out


def _filtered(x: np.ndarray, t, top_k, top_p, min_p):
    """Row `x`'s sampling distribution before normalisation: (m, 1 / T,
    the weights w, whether each value is kept), or None where the row is
    greedy (see `sample`)."""
    t = np.float32(t)
    numbers = x[~np.isnan(x)]
    m = numbers.max() if numbers.size else np.float32(-np.inf)
    if not (t > 0) or not (m > -np.inf):
        return None
    inv = np.float32(1.0) / t
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.where(x == m, np.float32(1.0), np.exp((x - m) * inv)).astype(np.float32)
    w[np.isnan(x)] = 0
    n = x.shape[0]
    threshold = np.float32(-np.inf)
    k = int(top_k)
    if 0 < k < n and k <= numbers.size:
        threshold = np.sort(numbers)[::-1][k - 1]
    p = np.float32(top_p)
    if p < 1:
        total = np.float32(p) * np.float32(np.sum(w[x >= threshold], dtype=np.float32))
        kept_values = [v for v in np.unique(numbers[numbers >= threshold])
                       if np.sum(w[x > v], dtype=np.float32) < total]
        threshold = min(kept_values) if kept_values else m
    q = min(np.float32(min_p), np.float32(1.0))
    return m, inv, w, (x >= threshold) & (w >= q)


def _kept(x: np.ndarray, t, top_k, top_p, min_p):
    """The kept weights of row `x` (0 for the tokens the filters drop), or
    None where the row is greedy."""
    filtered = _filtered(x, t, top_k, top_p, min_p)
    if filtered is None:
        return None
    _, _, w, keep = filtered
    return np.where(keep, w, np.float32(0.0)).astype(np.float32)


def logprobs(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray,
             top_p: np.ndarray, min_p: np.ndarray, tokens: np.ndarray, count: np.ndarray,
             most: int) -> tuple:
    """The log-probabilities `Graph.sample(..., logprobs=count)` returns:
    (values (R, 1 + most) float32, ids (R, most) int32). For each row r
    with count[r] >= 0: values[r, 0] is the log-probability of tokens[r],
    and ids[r, j], values[r, 1 + j] for j < min(count[r], most) the j-th
    most likely token (larger logits first, then lower ids) and its
    log-probability; the other entries of the row are 0 (the kernels leave
    them as they were).

    The distribution is the one the row's token was drawn from: where the
    row samples, the weights exp((x - m) / T) of the tokens the filters
    keep, normalised (-inf for the others); where it is greedy, the
    softmax of the logits (temperature 1, no filters)."""
    x_all = np.asarray(logits, np.float32)
    rows, n = x_all.shape
    values = np.zeros((rows, 1 + most), np.float32)
    ids = np.zeros((rows, most), np.int32)
    for r in range(rows):
        if count[r] < 0:
            continue
        x = x_all[r]
        filtered = _filtered(x, temperature[r], top_k[r], top_p[r], min_p[r])
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if filtered is None:
                m = np.max(x[~np.isnan(x)]) if (~np.isnan(x)).any() else np.float32(-np.inf)
                scaled = (x - m).astype(np.float32)
                scaled[x == m] = 0
                total = np.sum(np.exp(scaled), dtype=np.float32)
                keep = ~np.isnan(x)
            else:
                m, inv, w, keep = filtered
                scaled = ((x - m) * inv).astype(np.float32)
                scaled[x == m] = 0
                total = np.sum(np.where(keep, w, np.float32(0)), dtype=np.float32)
            log_total = np.float32(np.log(total))
            row = np.where(keep, scaled - log_total, np.float32(-np.inf)).astype(np.float32)
        values[r, 0] = row[tokens[r]]
        take = min(int(count[r]), most, n)
        # Larger logits first (NaN first of all), then lower ids.
        nan = np.isnan(x)
        order = np.lexsort((np.arange(n), -np.where(nan, 0, x), ~nan))[:take]
        ids[r, :take] = order
        values[r, 1:1 + take] = row[order]
    return values, ids


def adjust_logits(logits: np.ndarray, tokens: np.ndarray, add: np.ndarray,
                  scale: np.ndarray, mask=None, masked=None) -> np.ndarray:
    """`Graph.adjust_logits`: a copy of `logits` (R, V) where, for each
    entry j of row r with 0 <= tokens[r, j] < V, x = logits[r, t] becomes
    (x / s if x > 0 else x * s) + add[r, j] with s = scale[r, j] (a
    repetition penalty; 1 leaves x), computed in float32. Entries outside
    [0, V) (padding: -1) do nothing; a row's tokens are distinct. With
    `mask` (R, ceil(V / 32)) int32 and `masked` (R,), the rows whose
    `masked` is not 0 then keep only the tokens whose bit (t % 32 of word
    t // 32) is set: the others are -inf, the kept ones at least
    -FLT_MAX."""
    out = np.array(logits, np.float32)
    vocab = out.shape[1]
    for r, j in zip(*np.nonzero((tokens >= 0) & (tokens < vocab))):
        t = tokens[r, j]
        x, s = np.float32(logits[r, t]), np.float32(scale[r, j])
        with np.errstate(over="ignore", invalid="ignore"):
            out[r, t] = np.float32((x / s if x > 0 else x * s) + np.float32(add[r, j]))
    if mask is not None:
        bits = (np.asarray(mask).astype(np.uint32)[:, np.arange(vocab) // 32] >>
                (np.arange(vocab) % 32).astype(np.uint32)) & 1
        for r in np.nonzero(np.asarray(masked))[0]:
            lowest = np.finfo(np.float32).min
            out[r] = np.where(bits[r] == 1, np.maximum(out[r], lowest), -np.inf)
    return out
