"""The engine's state of one request while it waits and runs: its tokens
(prompt and generated), how many of them the KV cache holds, what stops
it, how it samples and what constrains its tokens, its speculative
decoding state, and what it has delivered (`Engine` keeps one per
request, in its own thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .speculative import Speculation, Speculative
from .stopping import StopChecker

if TYPE_CHECKING:
    from .requests import RequestHandle

__all__ = ["SequenceState"]


class SequenceState:
    """The engine's state of one request (its thread only)."""

    def __init__(self, handle: "RequestHandle", prompt: list, max_new_tokens: int,
                 stop: StopChecker, eos: frozenset, stop_ids: frozenset, sampling, detokenizer,
                 return_logits: bool, speculative: Optional[Speculative] = None, draft=None):
        self.handle = handle
        self.prompt = prompt
        self.tokens = list(prompt)  # prompt + generated: what goes into the cache
        self.generated: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.stop = stop
        self.eos = eos
        self.stop_ids = stop_ids
        #: New tokens before which EOS and stop ids are never chosen.
        self.min_tokens = 0
        #: The tokens it may choose (`sampling.token_mask`), or None: all.
        self.token_mask = None
        #: Its grammar's matcher (`constraints.Constraint`), and the mask
        #: it gave for the step being prepared.
        self.constraint = None
        self.step_mask = None
        self.sampling = sampling
        self.detokenizer = detokenizer
        self.logits: Optional[list] = [] if return_logits else None
        self.logprobs: Optional[list] = \
            None if sampling is None or sampling.logprobs is None else []
        self.text: list[str] = []
        self.slot: Optional[int] = None
        self.cached = 0  # positions in the cache
        self.committed = 0  # of them, full blocks registered for reuse
        self.cached_prompt: Optional[int] = None  # prompt tokens found cached at admission
        self.preemptions = 0
        self.first_token_time: Optional[float] = None
        #: The last step that took tokens of it (at admission: the step
        #: before), which orders the next step's sequences.
        self.served = -1
        #: The hashes of the full blocks of its tokens (see
        #: `Engine._admit`), computed when first needed.
        self.hashes: Optional[list] = None
        #: Its speculative decoding state, and the tokens it proposes in
        #: the step being run (after its pending ones).
        self.speculation = None if speculative is None else Speculation(speculative, draft)
        self.proposed: list[int] = []

    @property
    def verifiable(self) -> bool:
        """Whether its proposed tokens can be verified in one step: every
        row is chosen with the adjustments and mask of the first, so
        nothing of them may change with the tokens before the row
        (penalties, min_tokens not yet reached, a grammar)."""
        s = self.sampling
        return self.constraint is None and len(self.generated) >= self.min_tokens and \
            (s is None or (s.presence_penalty == 0 and s.frequency_penalty == 0 and
                           s.repetition_penalty == 1))

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache: the rest of the prompt, or the last
        generated id."""
        return len(self.tokens) - self.cached
