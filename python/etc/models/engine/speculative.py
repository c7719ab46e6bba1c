"""Speculative decoding: tokens proposed on the host, verified by the
target's own step.

A speculating request brings its pending token and k proposed tokens to a
step, k + 1 query rows like a chunk of prefill, and asks for the target's
choice after each of them (`Request.choices`). The proposal is accepted up
to its first token that differs from the target's choice at the row before
it; the target's choice there (a correction, or after a fully accepted
proposal a bonus token) comes with the accepted tokens, so a step yields 1
to k + 1 tokens and never a token the target would not have chosen:

* greedy requests: the choices are the target's argmax, so the output is
  the output without speculation;
* sampled requests: each choice is drawn by the sampling task from the
  target's distribution p at its row, with the counter-based RNG keyed by
  the request's seed and the chosen token's position. A proposal is one
  token d per row (a point mass q = 1 at d), for which rejection sampling
  (accept d with probability min(1, p(d) / q(d)) = p(d), else draw from
  max(0, p - q) normalised, p without d) is exactly "draw x from p, accept
  when x = d, else x is the correction": the output is distributed as the
  target's, and a seeded request draws the same token at the same
  position with or without speculation (the logits aside: a row computed
  among k + 1 may round differently from one computed alone).

Rejected positions are rolled back: the sequence's length ends after the
accepted tokens, so the keys and values written for the rejected ones lie
past it (attention never reads them, and the next step writes over them),
and blocks wholly past it go back to the pool (`trim`).

Proposers: `NgramIndex` (prompt lookup: the tokens that followed the
latest earlier occurrence of the sequence's last n tokens). `Speculation`
is one request's state: its proposer, the adaptive number of tokens to
propose, and its counts (`SpeculationCounts`, which the engine's stats
keep too); `add_proposals` adds the proposals to a step the engine
scheduled, and `accepted_prefix` says how many the step accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePath
from typing import Optional, Sequence

from .draft import DraftSequence

__all__ = ["Speculative", "NgramIndex", "Speculation", "SpeculationCounts", "accepted_prefix",
           "add_proposals", "METHODS"]

#: The ways of proposing tokens: prompt lookup, a draft model.
METHODS = ("ngram", "draft")

#: The most rows (its own tokens and proposed ones) a speculating request
#: brings to a step: below the CPU attention's QUERY_ROWS (8), from which
#: a request's rows take the prefill path (`etc.ops.attention_cpu.
#: AttentionChunkBlocks.emit_query_blocks`), whose sums run in another
#: order than decoding's, so that a verified row would not be the row a
#: step without speculation computes (greedy output could change). Below
#: it, a row's logits do not depend on its request's or its step's other
#: rows, bit for bit (measured up to 72 rows a step), nor do a prompt's
#: rows on the prefill path (`test_a_prefill_beside_a_verification`).
MAX_REQUEST_ROWS = 7

#: Rows past `Speculative.step_tokens` pay when the step's fixed cost
#: (reading the weights) is shared by fewer steps, that is when every
#: request of the batch goes faster; a few requests' proposals past it
#: only move their rows earlier, and add the rejected ones. So a step
#: takes them only when at least this share of its requests is confident
#: (on SmolLM2-135M at B = 8, modelled from the measured step costs: with
#: 1/2, free prose 0.97x and copying 1.53x of the decode; 3/4, 0.99x and
#: 1.53x; all, 1.00x and 1.44x; measured with 3/4, prose 0.92-0.98x, so
#: all).
CONFIDENT_SHARE = 1.0


def _positive(field: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Speculative: {field}={value!r} must be an int >= {low}")
    return value


@dataclass(frozen=True)
class Speculative:
    """How requests speculate.

    * `method`: "ngram", prompt lookup (`NgramIndex`), or "draft", a draft
      model's greedy tokens (`etc.models.engine.draft`); by default
      "draft" when `draft` is given, else "ngram";
    * `draft`: the draft model, a checkpoint path (loaded with the
      target's options, once per target: `CompiledModel.draft_model`) or
      a loaded model with the target's vocabulary;
    * `tokens` >= 1: the most tokens proposed per request and step (k);
      None: 8 for "ngram" (a lookup costs nothing) and 4 for "draft" (each
      proposed token costs a step of the draft model);
    * `ngram=(min, max)`: the lengths of the suffix looked up, longest
      first (1 <= min <= max);
    * `adaptive`: each request proposes fewer tokens after rejections,
      down to none for a while, and more again after acceptances
      (`Speculation`); False proposes `tokens` whenever a proposal exists;
    * `step_tokens`: proposals fill a step up to this many tokens (its
      requests' own and proposed ones), None: up to the step's budget. A
      proposed row costs about as much as a decoded one once a step has a
      few rows (on the CPU: 5 rows take 2.2-2.7x one, 8 rows 3.9x), so
      proposals pay in small steps only: the default 8 lets a request
      alone propose and a batch of 8 not;
    * `confident_step_tokens`: past `step_tokens`, the proposals of
      confident requests fill a step up to this many tokens (None: none
      past it), in a step all of whose requests are confident
      (`CONFIDENT_SHARE`): their recent acceptance p
      (`Speculation.recent`) at least `confident_acceptance` (0 to 1);
      each proposes past `step_tokens` the tokens j = 1, 2 ... whose
      chance p^j of acceptance reaches `confident_acceptance`. A row past
      a full step pays when it is accepted more often than it costs
      relative to a token of the step: on the CPU a step of 8 decoding
      requests costs 1.6x with 2 rows each, 2.2x with 3, 2.8x with 4 and
      3.5x with 5, a row about 0.6 of a token (docs/benchmarks.md), the
      default. Prompt lookup only: a draft model's proposals stay within
      `step_tokens` (each of its tokens costs a draft step, which the
      rows' cost leaves out: the model as its own draft at B = 8 went
      from 0.58x to 0.2-0.4x past it);

    Every request brings at most `MAX_REQUEST_ROWS` rows to a step (its
    own and proposed tokens): more would take the attention's prefill
    path and change the verified rows' logits.

    Prompt lookup's k = 8 (a request alone proposes up to 6, the rows'
    limit): on SmolLM2-135M copying passages at B = 1, 1.53-1.59x
    tokens/s against 1.40x with 4 (when it proposed up to 7), and free
    prose 1.15x against 1.09x (docs/benchmarks.md, "Speculative decoding
    on the CPU").
    """

    method: Optional[str] = None
    tokens: Optional[int] = None
    ngram: tuple = (2, 4)
    adaptive: bool = True
    draft: object = None
    step_tokens: Optional[int] = 8
    confident_step_tokens: Optional[int] = 40
    confident_acceptance: float = 0.6

    def __post_init__(self):
        if self.method is None:
            object.__setattr__(self, "method", "ngram" if self.draft is None else "draft")
        if self.method not in METHODS:
            raise ValueError(f"Speculative: method={self.method!r} is not supported; expected "
                             f"one of {METHODS}")
        if (self.method == "draft") != (self.draft is not None):
            raise ValueError("Speculative: method='draft' needs draft= (a checkpoint path or a "
                             "model), and draft= needs method='draft'")
        if self.draft is not None and not isinstance(self.draft, (str, PurePath)) and \
                not hasattr(self.draft, "step"):
            raise ValueError(f"Speculative: draft={self.draft!r} must be a checkpoint path or a "
                             f"loaded model")
        if self.tokens is None:
            object.__setattr__(self, "tokens", 8 if self.method == "ngram" else 4)
        _positive("tokens", self.tokens)
        ngram = self.ngram
        if isinstance(ngram, (str, bytes)) or not isinstance(ngram, Sequence) or \
                len(ngram) != 2 or any(isinstance(n, bool) or not isinstance(n, int)
                                       for n in ngram) or not 1 <= ngram[0] <= ngram[1]:
            raise ValueError(f"Speculative: ngram={ngram!r} must be a pair of ints (min, max) "
                             f"with 1 <= min <= max")
        object.__setattr__(self, "ngram", (int(ngram[0]), int(ngram[1])))
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"Speculative: adaptive={self.adaptive!r} must be True or False")
        if self.step_tokens is not None:
            _positive("step_tokens", self.step_tokens)
        if self.confident_step_tokens is not None:
            _positive("confident_step_tokens", self.confident_step_tokens)
        value = self.confident_acceptance
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 <= value <= 1:
            raise ValueError(f"Speculative: confident_acceptance={value!r} must be a number "
                             f"in [0, 1]")

    @classmethod
    def of(cls, value, where: str = "speculative") -> Optional["Speculative"]:
        """`value` as a `Speculative`: None (no speculation), a method's
        name (its defaults), or a `Speculative`."""
        if value is None or isinstance(value, Speculative):
            return value
        if value == "ngram":
            return cls(method=value)
        if isinstance(value, str):
            raise ValueError(f"{where}={value!r} is not supported; expected 'ngram', an "
                             f"etc.models.Speculative (a draft model: Speculative(draft=PATH)) "
                             f"or None")
        raise ValueError(f"{where}={value!r} must be 'ngram', an etc.models.Speculative or None")


def accepted_prefix(proposed: Sequence[int], chosen: Sequence[int]) -> int:
    """How many of `proposed` the target accepts: the length of the longest
    prefix whose every token is the target's choice at the row before it
    (`chosen[i]` follows the step's row i: the pending token for i = 0,
    proposed[i - 1] after)."""
    accepted = 0
    for token, choice in zip(proposed, chosen):
        if token != choice:
            break
        accepted += 1
    return accepted


class NgramIndex:
    """Prompt lookup for one sequence: `propose(tokens, k)` finds the
    latest earlier occurrence of the last n tokens of `tokens` (n from
    `high` down to `low`, the first that occurs) and proposes the up to k
    tokens that followed it.

    `tokens` only grows between calls (a sequence's prompt and generated
    ids): the index takes the n-grams of the new tokens as it sees them,
    a dictionary per n from the n-gram to the latest position it ends
    at, so a proposal costs O(high) lookups whatever the length."""

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high
        self._latest: list[dict] = [{} for _ in range(high + 1)]
        self._indexed = 0  # n-grams ending before this position are indexed

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens to follow `tokens`."""
        return self.lookup(tokens, k)

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """`propose`'s tokens (`Speculation.shadow` looks up through this,
        not `propose`, which tests replace with an oracle)."""
        length = len(tokens)
        if k < 1 or length < self.low + 1:
            return []
        # Index the n-grams that end before the last token (the suffix
        # itself is looked up, not matched against itself).
        for end in range(self._indexed, length - 1):
            for n in range(self.low, min(self.high, end + 1) + 1):
                self._latest[n][tuple(tokens[end - n + 1:end + 1])] = end
        self._indexed = max(self._indexed, length - 1)
        for n in range(min(self.high, length - 1), self.low - 1, -1):
            end = self._latest[n].get(tuple(tokens[length - n:]))
            if end is not None:
                return [int(t) for t in tokens[end + 1:end + 1 + k]]
        return []


@dataclass
class SpeculationCounts:
    """Verification steps (a request's proposal checked by one step),
    tokens proposed, and of them accepted."""

    speculative_steps: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0

    def count(self, proposed: int, accepted: int) -> None:
        """Adds a verification of `proposed` tokens, `accepted` of them."""
        self.speculative_steps += 1
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (NaN before any proposal)."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else \
            float("nan")

    @property
    def accepted_tokens_per_step(self) -> float:
        """Accepted tokens per verification step (NaN before any)."""
        return self.accepted_tokens / self.speculative_steps if self.speculative_steps else \
            float("nan")


def add_proposals(batch: list, budget: int, cache, config: Speculative, draft=None) -> None:
    """Adds proposed tokens to the speculating sequences of a step's
    `batch` ((engine sequence, tokens it takes) pairs, changed in place)
    whose pending tokens all go into the step, within what is left of the
    step's token `budget` and `config`'s step_tokens (or for a confident
    request, confident_step_tokens), `MAX_REQUEST_ROWS`, their token
    limits (a step gives at most one token more than it verifies) and the
    free blocks of `cache` (the engine's slots): a proposal never
    preempts. The proposals are prompt lookup's, or with `draft` (a
    `DraftProposer`) the draft model's, all of the step's requests
    drafted together."""
    used = sum(take for _, take in batch)

    def room(limit):
        return budget if limit is None else min(budget, limit - used)
    cheap, wide = room(config.step_tokens), room(config.confident_step_tokens)
    # Rows past step_tokens pay when the step's fixed cost is shared by
    # fewer steps: when every request of the step goes faster; and when
    # proposing is free (prompt lookup: a draft's token costs a draft step).
    confident = sum(s.speculation is not None and s.speculation.confident for s, _ in batch)
    if config.confident_step_tokens is None or draft is not None or \
            confident < CONFIDENT_SHARE * len(batch):
        wide = 0
    wanted = []
    for i, (sequence, take) in enumerate(batch):
        speculation = sequence.speculation
        if speculation is None or take != sequence.pending or not sequence.verifiable:
            continue
        speculation.observe(sequence.tokens)
        limit = max(cheap, min(wide, speculation.confident_tokens()))
        k = speculation.wants(min(limit, MAX_REQUEST_ROWS - take,
                                  sequence.max_new_tokens - len(sequence.generated) - 1))
        if k:
            wanted.append((i, sequence, take, k))
            cheap, wide = cheap - k, wide - k
        elif speculation.index is not None:
            speculation.shadow(sequence.tokens)
    if draft is None:
        proposals = [s.speculation.index.propose(s.tokens, k) for _, s, _, k in wanted]
    else:
        proposals = draft.propose([(s.speculation.draft, s.tokens, k) for _, s, _, k in wanted])
    for (i, sequence, take, _), proposed in zip(wanted, proposals):
        if proposed and cache.reserve(sequence.slot, sequence.cached + take + len(proposed)):
            sequence.proposed = proposed
            batch[i] = (sequence, take + len(proposed))


class Speculation(SpeculationCounts):
    """One request's speculation: its proposer's state, how many tokens it
    proposes now (adaptive), and what was proposed and accepted.

    Adaptive: after a proposal accepted whole, the next may be one token
    longer (up to `tokens`); after a partial acceptance of a > 0 tokens,
    it is a long; after none accepted, the request proposes nothing for
    1, 2, 4 ... 32 steps (doubling while the proposals that follow fail,
    reset by an acceptance), then one token. A request whose proposals are
    wrong thus costs about one extra row every 32 steps, while one that
    copies grows back to `tokens` within a few steps. A request none of
    whose proposals was ever accepted (a draft model that does not know
    the text) pauses 1, 4, 16 ... steps, up to `MAX_IDLE_PAUSE`: after n
    tries about 4^n steps, so over 256 tokens 5 tries (and with a draft
    model, 5 draft steps), where 1, 2 ... 32 made 12; its first
    acceptance brings the pauses back to 1 ... 32. With a draft model the
    first proposal is one token (then one more after each accepted
    whole, as always): a draft that does not know the text costs one
    draft step there, not k; and a pause of p steps ends on the draft's
    clock (`DraftProposer.clock`, the engine's steps) at a multiple of p,
    p to 2p - 1 steps on, so that requests which started or failed at
    different steps try again in the same step and share its draft steps
    (the pauses being powers of 2, a longer pause ends on a shorter one's
    multiples too). A paused request's draft does nothing: it catches up
    on the tokens of the pause when it next proposes.

    `recent`: the request's recent acceptance, the accepted fraction of
    each verification (and for prompt lookup, of the first token the
    lookup would have proposed in a step it did not propose: `shadow`),
    averaged with weights shrinking by 3/4 at each older one (the newest
    1/4), 1 at first; the
    request is `confident` while it is at least the config's
    confident_acceptance (it may then propose past step_tokens)."""

    MAX_PAUSE = 32
    MAX_IDLE_PAUSE = 1024
    FIRST_RECENT = 1.0

    def __init__(self, config: Speculative, proposer=None):
        super().__init__()
        self.config = config
        #: Prompt lookup's index, or with a draft model (`proposer`, the
        #: engine's `DraftProposer`) the request's sequence in its cache.
        self.index = NgramIndex(*config.ngram) if proposer is None else None
        self.proposer = proposer
        self.draft = None if proposer is None else DraftSequence()
        # The next proposal's length: a draft model's first is one token
        # (each costs a draft step; the adaptive length grows it).
        self._length = config.tokens if proposer is None else 1
        self._pause = 0               # prompt lookup: steps left without proposing
        self._resume = 0              # a draft model: the clock it proposes again at
        self._backoff = 1             # the next pause after a failure
        self.recent = self.FIRST_RECENT
        self._shadow: Optional[tuple] = None  # (position, token) looked up, unverified

    @property
    def confident(self) -> bool:
        """Whether `recent` reaches the config's confident_acceptance."""
        return self.recent >= self.config.confident_acceptance

    def confident_tokens(self) -> int:
        """How many tokens the request may propose past step_tokens: the
        j-th is expected accepted with probability about recent^j (each
        accepted with `recent`, once the one before it is), and is
        proposed while that is at least confident_acceptance."""
        threshold, p = self.config.confident_acceptance, self.recent
        if p < threshold:
            return 0
        if p >= 1 or threshold <= 0:
            return MAX_REQUEST_ROWS
        return min(MAX_REQUEST_ROWS, int(math.log(threshold) / math.log(p) + 1e-9))

    def _recent(self, accepted: float) -> None:
        self.recent = 0.75 * self.recent + 0.25 * accepted

    def shadow(self, tokens: Sequence[int]) -> None:
        """Prompt lookup's first token after `tokens`, not proposed this
        step: `observe` scores it against the token the step chooses."""
        proposal = self.index.lookup(tokens, 1)
        self._shadow = (len(tokens), proposal[0]) if proposal else None

    def observe(self, tokens: Sequence[int]) -> None:
        """Scores the `shadow` lookup against `tokens` (grown since) in
        `recent`."""
        if self._shadow is not None and len(tokens) > self._shadow[0]:
            self._recent(float(tokens[self._shadow[0]] == self._shadow[1]))
        self._shadow = None

    def wants(self, limit: int) -> int:
        """How many tokens to propose this step, at most `limit` (what the
        request's length, token limit and the step's budget leave): 0
        while paused."""
        if limit < 1:
            return 0
        if not self.config.adaptive:
            return min(limit, self.config.tokens)
        if self.proposer is not None:
            if self.proposer.clock < self._resume:
                return 0
        elif self._pause:
            self._pause -= 1
            return 0
        return min(limit, self._length)

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Prompt lookup's tokens to verify after `tokens` this step, at
        most `limit`."""
        return self.index.propose(tokens, self.wants(limit))

    def release(self) -> None:
        """The request ended or was preempted: its draft sequence goes."""
        if self.proposer is not None:
            self.proposer.release(self.draft)

    def verified(self, proposed: int, accepted: int) -> None:
        """Records a verification: `accepted` of `proposed` tokens."""
        self.count(proposed, accepted)
        self._recent(accepted / proposed)
        if self.proposer is not None:
            self.proposer.verified(self.draft, proposed, accepted)
        if accepted == proposed:
            self._length = min(self.config.tokens, max(self._length, proposed) + 1)
            self._backoff = 1
        elif accepted:
            self._length = accepted
            self._backoff = 1
        else:
            self._length = 1
            if self.proposer is None:
                self._pause = self._backoff
            else:
                # Resume on the draft's clock at a multiple of the pause,
                # p to 2p - 1 steps on: requests that pause as long (or,
                # the pauses being powers of 2, longer) try in the same
                # step, so that one draft step serves them all.
                self._resume = -(-(self.proposer.clock + self._backoff) // self._backoff) * \
                    self._backoff
            if self.accepted_tokens:
                self._backoff = min(2 * self._backoff, self.MAX_PAUSE)
            else:
                self._backoff = min(4 * self._backoff, self.MAX_IDLE_PAUSE)
