"""How a request chooses its tokens: `SamplingParams`, data of each step
(the step kernel samples on the device; see `etc.Graph.sample`)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["SamplingParams", "GREEDY", "sampling_inputs", "fresh_seeds"]


def _number(field: str, value, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"SamplingParams: {field}={value!r} must be a number")
    value = float(value)
    below = value <= low if low_open else value < low
    if not math.isfinite(value) or below or value > high:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"SamplingParams: {field}={value!r} must be in {interval}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters.

    * `temperature` >= 0: 0 is greedy (the argmax of the logits, the first
      of equal values); otherwise tokens are drawn from softmax(logits / T);
    * `top_k` >= 0: keep the k most likely tokens (ties with the k-th
      kept); 0 keeps all, and so does -1 (vLLM's "disabled", taken as 0);
    * `top_p` in (0, 1]: then keep the most likely tokens whose probability
      (renormalised over what top-k kept) reaches top_p; 1 keeps all;
    * `min_p` in [0, 1]: then drop tokens less likely than min_p times the
      most likely one; 0 keeps all;
    * `seed`: an int (any, taken modulo 2**64) makes the draws
      reproducible: the token at position p depends only on the seed, p and
      the logits, whatever else the step holds. None: a fresh random seed
      every step;
    * `logprobs`: None, or an int in [0, 20]: the step also returns the
      log-probability of each chosen token and of that many most likely
      tokens, computed on the device under the distribution the token was
      drawn from (at temperature 0: the softmax of the logits).

    The filters are those of Hugging Face transformers, applied in that
    order; `etc.reference_sampling.sample` is the exact definition."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    logprobs: Optional[int] = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("temperature", _number("temperature", self.temperature, 0.0, math.inf))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or \
                self.top_k < -1:
            raise ValueError(f"SamplingParams: top_k={self.top_k!r} must be an int >= 0 "
                             f"(0 or -1 keeps every token)")
        set_("top_k", max(int(self.top_k), 0))
        set_("top_p", _number("top_p", self.top_p, 0.0, 1.0, low_open=True))
        set_("min_p", _number("min_p", self.min_p, 0.0, 1.0))
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
                raise ValueError(f"SamplingParams: seed={self.seed!r} must be an int or None")
            set_("seed", int(self.seed))
        if self.logprobs is not None:
            if isinstance(self.logprobs, bool) or \
                    not isinstance(self.logprobs, (int, np.integer)) or \
                    not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise ValueError(f"SamplingParams: logprobs={self.logprobs!r} must be None or "
                                 f"an int in [0, {MAX_LOGPROBS}]")
            set_("logprobs", int(self.logprobs))

    @property
    def greedy(self) -> bool:
        """Whether tokens are the argmax (temperature 0)."""
        return self.temperature == 0.0


#: The most top log-probabilities a request may ask for (the step graph's
#: `MAX_LOGPROBS`, not imported: the graph needs the compiler).
MAX_LOGPROBS = 20

#: What a request without sampling parameters uses.
GREEDY = SamplingParams()


def fresh_seeds(count: int) -> list:
    """`count` random 64-bit seeds from the operating system's generator."""
    return [secrets.randbits(64) for _ in range(count)]


def sampling_inputs(params: Sequence[Optional[SamplingParams]], fresh=fresh_seeds) -> dict:
    """The step kernel's sampling inputs for requests with `params` (None:
    greedy): `temperature`, `top_p`, `min_p` float32 (R,), `top_k` and
    `logprobs` (-1: none) int32 (R,) and `seed` int32 (R, 2) (the 64-bit seed's low and high words;
    for the seeds that are None, `fresh(count)` gives random ones)."""
    rows = [GREEDY if p is None else p for p in params]
    for r, p in enumerate(rows):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"step: request {r}: sampling={p!r} must be a SamplingParams or "
                             f"None")
    drawn = iter(fresh(sum(p.seed is None for p in rows)))
    seeds = [(next(drawn) if p.seed is None else p.seed) % (1 << 64) for p in rows]
    words = np.array([(seed & 0xFFFFFFFF, seed >> 32) for seed in seeds], dtype=np.uint32)
    f32 = lambda field: np.array([getattr(p, field) for p in rows], dtype=np.float32)
    # top_k beyond the vocabulary keeps every token, as 0 does.
    top_k = np.array([min(p.top_k, (1 << 31) - 1) for p in rows], dtype=np.int32)
    logprobs = np.array([-1 if p.logprobs is None else p.logprobs for p in rows], np.int32)
    return dict(temperature=f32("temperature"), top_k=top_k, top_p=f32("top_p"),
                min_p=f32("min_p"), logprobs=logprobs,
                seed=words.view(np.int32).reshape(len(rows), 2))
