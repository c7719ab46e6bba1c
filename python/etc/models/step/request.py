"""One request of a step: the value `CompiledModel.step` takes per sequence
(its slot, first position, new tokens, sampling parameters, and how many
of its tokens the step chooses a next token after)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .sampling import SamplingParams

__all__ = ["Request"]


@dataclass(frozen=True)
class Request:
    """One request of a step: `tokens` (new token ids) of the sequence in
    cache slot `slot`, at positions `start`, `start + 1`, ...; the
    positions before `start` must already be in the cache. The token after
    the last one (at position `start + len(tokens)`) is chosen with
    `sampling` (None: greedy), from its logits changed by `adjustments`
    (`sampling.logit_adjustments`: penalties, biases; None: none), among
    the tokens `token_mask` allows (int32 (ceil(vocab / 32),): bit t % 32
    of word t // 32 set for an allowed token t; None: all). With `choices`
    = c > 1, the token after each of the last c tokens is (a speculating
    request: its last tokens are proposed ones, which the choices verify;
    every choice with the same adjustments and mask)."""

    slot: int
    start: int
    tokens: Sequence[int]
    sampling: Optional[SamplingParams] = None
    adjustments: Optional[tuple] = None
    token_mask: Optional[np.ndarray] = None
    choices: int = 1
