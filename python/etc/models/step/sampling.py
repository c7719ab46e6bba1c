"""How a request chooses its tokens: `SamplingParams`, data of each step
(the step kernel samples on the device; see `etc.Graph.sample`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["SamplingParams", "GREEDY", "sampling_inputs", "fresh_seeds", "logit_adjustments",
           "adjustment_inputs", "mask_inputs", "token_mask"]


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
      drawn from (at temperature 0: the softmax of the logits);
    * `presence_penalty`, `frequency_penalty` in [-2, 2]: subtracted from
      the logit of each token generated so far, once / once per
      occurrence (OpenAI's);
    * `repetition_penalty` > 0: the logit x of each token of the prompt or
      generated so far becomes x / r if x > 0 else x * r (Hugging Face's
      and vLLM's; 1: none);
    * `logit_bias`: {token id: bias}, added to those logits (OpenAI's,
      -100 to 100).

    The penalties and biases change the logits before the filters, on the
    device (`Graph.adjust_logits`, entries `logit_adjustments` computes),
    also for greedy requests. The filters are those of Hugging Face
    transformers, applied in that order; `etc.reference_sampling.sample`
    is the exact definition."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    logprobs: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    #: ((token id, bias), ...) sorted by id (a dict given is made so).
    logit_bias: tuple = ()

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
        for name in ("presence_penalty", "frequency_penalty"):
            set_(name, _number(name, getattr(self, name), -2.0, 2.0))
        set_("repetition_penalty", _number("repetition_penalty", self.repetition_penalty, 0.0,
                                           math.inf, low_open=True))
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else bias
        try:
            pairs = [(token, value) for token, value in pairs]
        except (TypeError, ValueError):
            raise ValueError(f"SamplingParams: logit_bias={bias!r} must be a dict of token id "
                             f"to bias") from None
        for token, value in pairs:
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
                raise ValueError(f"SamplingParams: logit_bias: {token!r} is not a token id")
            _number(f"logit_bias[{token}]", value, -100.0, 100.0)
        set_("logit_bias", tuple(sorted((int(t), float(v)) for t, v in dict(pairs).items())))

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties or biases change the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or
                    self.repetition_penalty != 1.0)

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
    """`count` random 64-bit seeds from the operating system's generator
    (one read for all, not a system call each)."""
    return np.frombuffer(os.urandom(8 * count), np.uint64).tolist()


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


def logit_adjustments(params: Optional[SamplingParams], prompt: Sequence[int],
                      generated: Sequence[int], forbidden: Sequence[int] = ()):
    """The entries of `Graph.adjust_logits` for one request, or None when
    nothing changes: (token ids int32, additions float32, scales float32),
    one entry per token, from `params`' penalties (presence and frequency
    over the `generated` tokens, repetition over `prompt` and `generated`)
    and logit biases, and -inf added to the `forbidden` ids (EOS before
    `min_tokens`)."""
    adjusts = params is not None and params.adjusts_logits
    if not adjusts and not forbidden:
        return None
    add: dict = {}
    scale: dict = {}
    if adjusts:
        if params.presence_penalty or params.frequency_penalty:
            ids, counts = np.unique(np.asarray(generated, np.int64), return_counts=True)
            for token, count in zip(ids.tolist(), counts.tolist()):
                add[token] = -params.presence_penalty - params.frequency_penalty * count
        if params.repetition_penalty != 1.0:
            for token in set(prompt) | set(generated):
                scale[token] = params.repetition_penalty
        for token, bias in params.logit_bias:
            add[token] = add.get(token, 0.0) + bias
    for token in forbidden:
        add[token] = -math.inf
    tokens = sorted(set(add) | set(scale))
    return (np.array(tokens, np.int32),
            np.array([add.get(t, 0.0) for t in tokens], np.float32),
            np.array([scale.get(t, 1.0) for t in tokens], np.float32))


def adjustment_inputs(entries: Sequence) -> dict:
    """The step kernel's `adjust_tokens` (R, A) int32 (-1: padding),
    `adjust_add` and `adjust_scale` (R, A) float32 for each request's
    `logit_adjustments` (None: none); A is the most entries, rounded up to
    a power of two (at least 1) so that few sizes occur."""
    most = max((len(e[0]) for e in entries if e is not None), default=0)
    width = 1 << max(most - 1, 0).bit_length()
    tokens = np.full((len(entries), width), -1, np.int32)
    add = np.zeros((len(entries), width), np.float32)
    scale = np.ones((len(entries), width), np.float32)
    for r, entry in enumerate(entries):
        if entry is not None:
            count = len(entry[0])
            tokens[r, :count], add[r, :count], scale[r, :count] = entry
    return dict(adjust_tokens=tokens, adjust_add=add, adjust_scale=scale)


def token_mask(allowed: Sequence[int], vocab: int) -> np.ndarray:
    """The bitmask (int32 (ceil(vocab / 32),)) that allows the ids of
    `allowed` (each in [0, vocab)) and nothing else."""
    ids = np.asarray(list(allowed), np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token_mask: ids must be in [0, {vocab})")
    words = np.zeros(-(-vocab // 32), np.uint32)
    np.bitwise_or.at(words, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return words.view(np.int32)


def mask_inputs(masks: Sequence, vocab: int) -> dict:
    """The step kernel's `token_mask` (R, ceil(vocab / 32)) int32 and
    `token_masked` (R,) int32 for each request's mask (None: every token)."""
    words = -(-vocab // 32)
    out = np.zeros((len(masks), words), np.int32)
    masked = np.zeros(len(masks), np.int32)
    for r, mask in enumerate(masks):
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != (words,):
                raise ValueError(f"step: request {r}: token_mask has shape {mask.shape}, "
                                 f"expected ({words},) (a bit per token of {vocab})")
            out[r] = mask.view(np.int32) if mask.dtype.itemsize == 4 else mask
            masked[r] = 1
    return dict(token_mask=out, token_masked=masked)
