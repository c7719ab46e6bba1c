"""Draft-model proposals for speculative decoding: a smaller model with the
target's vocabulary runs its own step kernel over its own KV cache and
proposes, for each speculating request, its k next greedy tokens, which
the target's step then verifies (`etc.models.engine.speculative`).

One `DraftProposer` per engine holds the draft model's cache (a paged
pool of its own, or contiguous slots for a draft loaded with
kv_block_size=None) and a sequence in it per speculating request. A
request's draft sequence holds the keys and values of a prefix of the
request's tokens (`DraftSequence.cached`); to propose, the draft first
catches up on the rest (the prompt at first, then the tokens accepted
since), which chooses the first proposed token, then decodes k - 1 more,
all requests of the engine's step batched in each draft step. After the
target's verification the draft's sequence keeps what the target
accepted (the rest is rolled back as the target's is: trimmed, written
over later).

The draft's tokens are its argmax, a point mass q per row, so the target
verifies them as it verifies prompt lookup's: greedy output is the
target's, sampled output follows the target's distribution.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..step.request import Request
from .slots import PagedSlots, SlotCache

__all__ = ["DraftProposer", "DraftSequence"]


class DraftSequence:
    """One request's sequence in the draft's cache: its slot (None until
    its first proposal), how many of the request's tokens the draft's
    cache holds, and the length of the request's tokens when it last
    proposed."""

    def __init__(self):
        self.slot: Optional[int] = None
        self.cached = 0
        self.proposed_at = 0


class DraftProposer:
    """The draft model `draft` of an engine on `target`: a cache for up to
    `slots` sequences of `length` positions, and `propose` for a step's
    speculating requests (module docstring)."""

    def __init__(self, draft, target, slots: int, length: int):
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"speculative: the draft model's vocabulary "
                             f"({draft.config.vocab_size} tokens) is not the target's "
                             f"({target.config.vocab_size}): a draft must share the target's "
                             f"tokenizer")
        if draft.tokenizer is not None and target.tokenizer is not None and \
                draft.tokenizer.backend.get_vocab() != target.tokenizer.backend.get_vocab():
            raise ValueError("speculative: the draft model's tokenizer is not the target's (their "
                             "vocabularies differ)")
        if length > draft.max_seq_len:
            raise ValueError(f"speculative: the draft model's max_seq_len={draft.max_seq_len} is "
                             f"shorter than the engine's sequences ({length} positions)")
        self.model = draft
        if draft.kv_block_size is None:
            self.cache = SlotCache(draft, slots, length)
        else:
            block = draft.kv_block_size
            self.cache = PagedSlots(draft.new_paged_cache(slots * -(-length // block) * block),
                                    slots)
        #: Draft steps run (kernel runs of the draft model).
        self.steps = 0
        #: The engine's steps so far (calls of `propose`, one a step): the
        #: clock on which paused requests resume together
        #: (`Speculation.verified`), so that they share draft steps.
        self.clock = 0

    def propose(self, wanted: Sequence[tuple]) -> list[list[int]]:
        """The proposals for `wanted`, (DraftSequence, the request's tokens,
        k) per speculating request: up to k tokens each (none for a request
        the draft's cache has no room for, or still catching up on a prompt
        longer than one draft step takes)."""
        self.clock += 1
        proposals: list[list[int]] = [[] for _ in wanted]
        live = []  # (index, sequence, tokens, k) that propose this step
        for i, (sequence, tokens, k) in enumerate(wanted):
            # Positions: the tokens, then k - 1 proposals fed back.
            needed = len(tokens) + k - 1
            if sequence.slot is None:
                admitted = self.cache.admit(tokens, needed)
                if admitted is None:
                    continue
                sequence.slot, sequence.cached = admitted
            sequence.cached = min(sequence.cached, len(tokens) - 1)
            self.cache.slide(sequence.slot, sequence.cached)
            if not self.cache.reserve(sequence.slot, needed):
                continue
            sequence.proposed_at = len(tokens)
            live.append((i, sequence, tokens, k))
        # The first draft step: each catches up to its last token and
        # chooses the first proposal, within the draft's step budget.
        budget = self.model.max_step_tokens
        requests, first = [], []
        for i, sequence, tokens, k in live:
            take = min(len(tokens) - sequence.cached, budget)
            if take < 1:
                break
            budget -= take
            requests.append(Request(sequence.slot, sequence.cached,
                                    tokens[sequence.cached:sequence.cached + take]))
            first.append((i, sequence, tokens, k, sequence.cached + take == len(tokens)))
        if not requests:
            return proposals
        ids = self._step(requests)
        going = []
        for (i, sequence, tokens, k, complete), request, token in zip(first, requests, ids):
            sequence.cached += len(request.tokens)
            self.cache.commit(sequence.slot, list(tokens[:sequence.cached]))
            if complete:
                proposals[i].append(token)
                if k > 1:
                    going.append((i, sequence))
        # Then one token a step: each proposal fed back for the next.
        for _ in range(max((wanted[i][2] for i, _ in going), default=1) - 1):
            going = [(i, s) for i, s in going if len(proposals[i]) < wanted[i][2]]
            if not going:
                break
            requests = [Request(s.slot, s.proposed_at + len(proposals[i]) - 1,
                                [proposals[i][-1]]) for i, s in going]
            for (i, _), token in zip(going, self._step(requests)):
                proposals[i].append(token)
        return proposals

    def _step(self, requests: list) -> list[int]:
        self.steps += 1
        _, ids = self.model.step(self.cache.cache, requests)
        return [int(token) for token in ids]

    def verified(self, sequence: DraftSequence, proposed: int, accepted: int) -> None:
        """The target accepted `accepted` of the `proposed` tokens the draft
        proposed for `sequence`: its cache keeps the request's tokens and
        the accepted proposals it computed (the last proposal is never fed
        back), the rest is rolled back."""
        if sequence.slot is None:
            return
        sequence.cached = sequence.proposed_at + min(accepted, max(proposed - 1, 0))
        self.cache.trim(sequence.slot, sequence.cached)

    def release(self, sequence: DraftSequence) -> None:
        """The request ended (or was preempted): its draft sequence goes."""
        if sequence.slot is not None:
            self.cache.release(sequence.slot)
            sequence.slot = None
            sequence.cached = 0
