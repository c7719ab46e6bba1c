"""The engine: many concurrent requests on one compiled step kernel.

A scheduler that calls `model.step` in a loop. Every request is data of a
step (its slot, positions, new tokens, sampling parameters); requests are
admitted while the KV cache has room for them, prefilled in chunks mixed
with the other requests' decoding under a token budget per step, and leave
between steps when they stop (an end-of-sequence id, a stop string, their
token limit) or are cancelled. Nothing about a request recompiles anything.

```python
engine = Engine(model, max_num_seqs=8)
handle = engine.submit(model.tokenizer.encode("Hello"), max_new_tokens=32, stop=["\\n"])
engine.run()                  # or engine.start(): a thread runs the steps
handle.result().text, handle.result().finish_reason
```

The KV cache is managed behind `admit`, `reserve`, `slide`, `trim`,
`commit`, `release` and `cache` by one of two classes. With the model's
paged cache (the default, `etc.models.step.kv_cache.PagedKVCache`),
`PagedSlots`: requests are admitted while the pool has free blocks for
their prompt, a new request reuses the blocks of its longest cached prefix
(another request's prompt, or an earlier one's, kept until evicted
least-recently-used) and prefills only the rest, and when a running request
needs a block and none is free, the most recently arrived running request
is preempted: its blocks are freed (its full blocks stay cached), it goes
back to the head of the queue and is recomputed from its prompt and the ids
it had generated when it is admitted again; sliding layers keep only the
blocks their windows see. With a contiguous cache (`kv_block_size=None`),
`SlotCache`: a slot of the full model length per running sequence.
"""

from __future__ import annotations

import collections
import inspect
import logging
import threading
import time
from dataclasses import dataclass
from numbers import Integral
from typing import Callable, Optional, Sequence

import numpy as np

from ..step.request import Request
from ..step.sampling import SamplingParams, logit_adjustments, token_mask
from .requests import (RequestError, RequestHandle, RequestOutput, RequestResult, TokenLogprobs,
                       check_ids, check_stop)
from .constraints import fill_masks
from .slots import PagedSlots, SlotCache
from .draft import DraftProposer
from .sequence import SequenceState
from .speculative import SpeculationCounts, Speculative, accepted_prefix, add_proposals
from .stopping import StopChecker

logger = logging.getLogger("etc.engine")

__all__ = ["Engine", "StepRecord", "EngineStats"]


@dataclass
class StepRecord:
    """One kernel run: its requests and tokens, whether it only decoded
    (one token per request, besides proposed ones), and its seconds (host
    preparation included); the ids it gave the requests, and of its
    tokens, those proposed by speculating requests and those accepted;
    the seconds its requests' grammar masks took to fill before it."""

    requests: int
    tokens: int
    decode_only: bool
    seconds: float
    generated: int = 0
    proposed: int = 0
    accepted: int = 0
    masks: float = 0.0


@dataclass
class EngineStats(SpeculationCounts):
    """What the engine's cache did since it started: prompt tokens admitted
    and how many came from cached prefixes, cached blocks evicted to make
    room, and requests preempted (their blocks freed, recomputed later);
    and what speculating requests proposed and had accepted."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0


class Engine:
    """Runs many requests on one model (see the module's docstring).

    `max_num_seqs` bounds the requests running at once; `max_model_len`
    (default: the model's `max_seq_len`) bounds each one's prompt plus new
    tokens, and is at most what the KV cache holds (a larger one is
    lowered to it, with a warning when it was given); `max_step_tokens`
    (default: the model's) bounds the tokens of one step.

    Scheduling: requests are admitted first come first served while a slot
    and the KV cache's blocks are free; each step then takes, within the
    token budget, one token of every decoding request and chunks of the
    prompts still being prefilled, the requests that waited longest since
    their last tokens first (among equals: decoding before prefilling, then
    fewer tokens generated so far, then by arrival), so that when the
    budget is short every request still advances in turn, and evenly. A request whose prompt starts with blocks another
    running request is prefilling waits for them (then reuses them) rather
    than computing them twice.

    The KV cache is the model's paged pool (`model.paged_cache`: sized by
    load's kv_cache_tokens / kv_cache_memory, else max_num_seqs x
    max_model_len positions), shared with every other engine of the model,
    so cached prefixes outlive the engine (`kv_cache_tokens`: a pool of
    the engine's own, of that many positions, instead; sliding layers get
    the windows and a step of max_num_seqs sequences either way); or, for
    a model loaded with kv_block_size=None, `max_num_seqs` contiguous slots
    of max_model_len. `stats` counts cached prompt tokens, evictions and
    preemptions.

    `speculative` (None, "ngram" or an `etc.models.Speculative`): requests
    propose tokens (prompt lookup, or a draft model's: `draft`) that their
    next step verifies (`etc.models.engine.speculative`): the same tokens
    as without, greedy, and the same distribution, sampled; `stats` counts
    what was proposed and accepted.

    Every parameter of a request is checked by `submit` (`RequestError`);
    a step that raises anyway is rerun on halves of its requests until the
    ones that make it raise are alone: they end with finish_reason
    "error", the others go on.

    Thread safety: `submit`, `cancel` and `abort` may be called from any
    thread. Steps run in the thread of `start()`, or in the caller's with
    `step()`, `run()` or a handle's `result()` / `outputs()`."""

    def __init__(self, model, *, max_num_seqs: int = 8, max_model_len: Optional[int] = None,
                 max_step_tokens: Optional[int] = None, kv_cache_tokens: Optional[int] = None,
                 speculative=None):
        for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len),
                            ("max_step_tokens", max_step_tokens),
                            ("kv_cache_tokens", kv_cache_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                      value < 1):
                raise ValueError(f"Engine: {name}={value!r} must be a positive int")
        given, max_model_len = max_model_len, max_model_len or model.max_seq_len
        if max_model_len > model.max_seq_len:
            raise ValueError(f"Engine: max_model_len={max_model_len} is longer than the model's "
                             f"max_seq_len={model.max_seq_len}")
        #: How requests speculate (None: they do not).
        self.speculative = Speculative.of(speculative, "Engine: speculative")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens or model.max_step_tokens
        if getattr(model, "kv_block_size", None) is None:
            if kv_cache_tokens is not None:
                raise ValueError("Engine: kv_cache_tokens sizes a paged KV cache, but the model "
                                 "was loaded with kv_block_size=None (contiguous slots)")
            self.cache = SlotCache(model, max_num_seqs, max_model_len)
        else:
            block = model.kv_block_size  # a sequence of max_model_len holds whole blocks
            window = model.window_pool_tokens(max_num_seqs, self.max_step_tokens)
            pool = model.paged_cache(max_num_seqs * -(-max_model_len // block) * block, window) \
                if kv_cache_tokens is None else model.new_paged_cache(kv_cache_tokens, window)
            self.cache = PagedSlots(pool, max_num_seqs)
        #: Whether the KV cache, not the model, sets `max_model_len`.
        self.limited_by_cache = self.cache.capacity < max_model_len
        if self.limited_by_cache:
            if given is not None:
                logger.warning("max_model_len=%d is more than the KV cache holds (%d "
                               "positions): sequences are limited to %d", given,
                               self.cache.capacity, self.cache.capacity)
            max_model_len = self.cache.capacity
        #: The longest sequence (prompt and new tokens) a request may reach.
        self.max_model_len = max_model_len
        #: The draft model's proposer (`speculative` with a draft model).
        self.draft = None
        if self.speculative is not None and self.speculative.method == "draft":
            model_of = self.speculative.draft
            if not hasattr(model_of, "step"):
                model_of = model.draft_model(model_of)
            self.draft = DraftProposer(model_of, model, max_num_seqs, max_model_len)
        self.stats = EngineStats()
        self._evictions_before = self.cache.evictions
        # A step that samples on the device returns logits only when asked.
        self._step_returns_logits_on_request = \
            "return_logits" in inspect.signature(model.step).parameters
        #: Every step run, in order (cleared by whoever reads it).
        self.steps: list[StepRecord] = []
        #: Called with each `RequestResult` as its request finishes (the
        #: server's metrics).
        self.on_finish: Optional[Callable[[RequestResult], None]] = None
        self._next_id = 0
        self._step_count = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._incoming: list[SequenceState] = []
        self._cancelled: set[int] = set()
        # (requests submitted before, the error they end with): `abort`.
        self._abort: Optional[tuple[int, str]] = None
        self._waiting: "collections.deque[SequenceState]" = collections.deque()
        self._running: list[SequenceState] = []
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

    # -- submitting --------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], *, max_new_tokens: Optional[int] = None,
               stop: Optional[Sequence[str]] = (), ignore_eos: bool = False, sampling=None,
               eos_token_ids: Optional[Sequence[int]] = None, return_logits: bool = False,
               on_output: Optional[Callable[[RequestOutput], None]] = None,
               stop_token_ids: Optional[Sequence[int]] = None,
               include_stop_str_in_output: bool = False,
               skip_special_tokens: bool = True, min_tokens: int = 0,
               allowed_token_ids: Optional[Sequence[int]] = None,
               constraint=None) -> RequestHandle:
        """Queues a request: `prompt_ids` (token ids: a list, a tuple or a
        1-D NumPy integer array), at most `max_new_tokens` new ids (default:
        up to `max_model_len`, which the KV cache bounds), stopping at an id
        of `eos_token_ids` (default: the model's) unless `ignore_eos`, at an
        id of `stop_token_ids` (also with `ignore_eos`; unlike an EOS id,
        its text is part of the output, nothing for a special token), or at
        a string of `stop` (a string or strings; None: none; needs the
        model's tokenizer; the text ends before it, or after it with
        `include_stop_str_in_output`). The text leaves out special tokens
        unless `skip_special_tokens` is False. The first `min_tokens` new
        tokens are never an EOS or stop id (their logits are -inf on the
        device). With `allowed_token_ids`, only those ids are ever chosen
        (a token bitmask applied on the device; EOS too only if listed).
        With `constraint` (a `constraints.Constraint`: structured output),
        every token follows its grammar: its mask, filled on the host
        before each step for all the step's constrained requests together,
        is applied on the device, and the request ends ("stop") when the
        grammar is complete. `sampling` is an
        `etc.models.step.sampling.SamplingParams` (None: greedy); without a
        seed each step draws fresh random seeds (rank 0's under tensor
        parallelism, so every rank draws the same token). `on_output` gets
        the outputs (from the engine's thread) instead of `outputs()`.
        Raises `RequestError` naming the parameter at fault: nothing that
        was not checked here reaches a step."""
        prompt = self._check_prompt(prompt_ids)
        max_new_tokens = self._check_max_new_tokens(prompt, max_new_tokens)
        stop = check_stop(stop)
        tokenizer = self.model.tokenizer
        if any(stop) and tokenizer is None:
            raise RequestError("stop strings need the model's tokenizer (tokenizer.json)", "stop")
        for name, value in (("ignore_eos", ignore_eos), ("return_logits", return_logits),
                            ("include_stop_str_in_output", include_stop_str_in_output),
                            ("skip_special_tokens", skip_special_tokens)):
            if not isinstance(value, (bool, np.bool_)):
                raise RequestError(f"{name}={value!r} must be True or False", name)
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise RequestError(f"sampling={sampling!r} must be an "
                               f"etc.models.step.sampling.SamplingParams or None (greedy)",
                               "sampling")
        if on_output is not None and not callable(on_output):
            raise RequestError(f"on_output={on_output!r} must be a callable or None",
                               "on_output")
        if ignore_eos:
            eos = frozenset()
        else:
            eos = frozenset(self.model.eos_token_ids if eos_token_ids is None else
                            check_ids(eos_token_ids, "eos_token_ids"))
        stop_ids = frozenset(() if stop_token_ids is None else
                             check_ids(stop_token_ids, "stop_token_ids",
                                        self.model.config.vocab_size))
        detokenizer = None if tokenizer is None else \
            tokenizer.detokenizer(skip_special_tokens=bool(skip_special_tokens))
        checker = StopChecker(stop, include_stop=bool(include_stop_str_in_output))
        if isinstance(min_tokens, (bool, np.bool_)) or not isinstance(min_tokens, Integral) or \
                not 0 <= min_tokens <= max_new_tokens:
            raise RequestError(f"min_tokens={min_tokens!r} must be an int in [0, "
                               f"max_new_tokens={max_new_tokens}]", "min_tokens")
        sequence = SequenceState(None, prompt, max_new_tokens, checker, eos, stop_ids, sampling,
                             detokenizer, bool(return_logits), self.speculative, self.draft)
        sequence.min_tokens = int(min_tokens)
        if allowed_token_ids is not None:
            allowed = check_ids(allowed_token_ids, "allowed_token_ids",
                                 self.model.config.vocab_size)
            if not allowed:
                raise RequestError("allowed_token_ids is empty: no token could be chosen",
                                   "allowed_token_ids")
            sequence.token_mask = token_mask(allowed, self.model.config.vocab_size)
        if constraint is not None:
            if not hasattr(constraint, "mask") or not hasattr(constraint, "accept"):
                raise RequestError(f"constraint={constraint!r} must be an "
                                   f"etc.models.engine.constraints.Constraint or None",
                                   "constraint")
            sequence.constraint = constraint
        with self._lock:
            sequence.handle = handle = RequestHandle(self, self._next_id, prompt, on_output)
            self._next_id += 1
            self._incoming.append(sequence)
            self._wake.notify()
        return handle

    def _check_prompt(self, prompt_ids) -> list[int]:
        if isinstance(prompt_ids, np.ndarray):
            if prompt_ids.ndim != 1:
                raise RequestError(f"the prompt is a NumPy array of shape {prompt_ids.shape}; "
                                   f"give one sequence of token ids (1-D)", "prompt")
        elif isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
            raise RequestError(f"the prompt must be a non-empty list of token ids, not "
                               f"{type(prompt_ids).__name__}", "prompt")
        if not len(prompt_ids):
            raise RequestError("the prompt must be a non-empty list of token ids", "prompt")
        vocab = self.model.config.vocab_size
        for i, token in enumerate(prompt_ids):
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, Integral) or \
                    not 0 <= token < vocab:
                raise RequestError(f"prompt position {i}: {token!r} is not a token id in "
                                   f"[0, {vocab})", "prompt")
        prompt = [int(t) for t in prompt_ids]
        if len(prompt) >= self.max_model_len:
            raise RequestError(f"the prompt has {len(prompt)} tokens, leaving no room for a new "
                               f"token within {self._length()}", "prompt")
        return prompt

    def _check_max_new_tokens(self, prompt: list, max_new_tokens) -> int:
        room = self.max_model_len - len(prompt)
        if max_new_tokens is None:
            return room
        if isinstance(max_new_tokens, (bool, np.bool_)) or \
                not isinstance(max_new_tokens, Integral) or max_new_tokens < 1:
            raise RequestError(f"max_new_tokens={max_new_tokens!r} must be a positive int",
                               "max_new_tokens")
        if max_new_tokens > room:
            raise RequestError(f"the prompt has {len(prompt)} tokens and max_new_tokens is "
                               f"{max_new_tokens}: {len(prompt) + max_new_tokens} tokens, more "
                               f"than {self._length()}", "max_new_tokens")
        return int(max_new_tokens)

    def _length(self) -> str:
        """What bounds a sequence, in words."""
        if self.limited_by_cache:
            return (f"the model length ({self.max_model_len}: all the KV cache holds; load the "
                    f"model with a larger kv_cache_tokens or kv_cache_memory for more)")
        return f"the model length ({self.max_model_len})"

    def cancel(self, request_id: int) -> None:
        """Ends request `request_id` before the next step (no-op if done)."""
        with self._lock:
            self._cancelled.add(request_id)
            self._wake.notify()

    def abort(self, error: str) -> None:
        """Ends every request submitted so far, running or waiting, before the
        next step: finish_reason "abort", with `error` saying why."""
        with self._lock:
            self._abort = (self._next_id, error)
            self._wake.notify()

    # -- state -------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._incoming)

    @property
    def slots_in_use(self) -> int:
        return self.cache.used

    @property
    def blocks_in_use(self) -> Optional[int]:
        """Blocks of the paged pool held by sequences (of every engine
        sharing it); None for contiguous slots."""
        manager = getattr(self.cache, "manager", None)
        return None if manager is None else manager.used_blocks

    @property
    def blocks_total(self) -> Optional[int]:
        """Blocks of the paged pool; None for contiguous slots."""
        manager = getattr(self.cache, "manager", None)
        return None if manager is None else manager.num_blocks

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._incoming)

    # -- running -----------------------------------------------------------

    def step(self) -> bool:
        """Admits, cancels and runs one step; False when there was nothing
        to do."""
        with self._lock:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
            cancelled, self._cancelled = self._cancelled, set()
            abort, self._abort = self._abort, None
        if cancelled or abort is not None:
            self._end_cancelled(cancelled, abort)
        self._admit()
        if not self._running:
            if self._waiting:
                # Nothing runs, yet the head of the queue does not fit: another
                # engine of the model holds the shared pool's blocks.
                time.sleep(0.001)
                return True
            return False
        batch = self._schedule()
        if not batch:
            return True  # every sequence preempted: the pool is held elsewhere
        done = self._run(batch)
        self._step_count += 1
        for sequence, take, chosen, logits, now, record, logprobs in done:
            try:
                sequence.served = self._step_count
                proposed, sequence.proposed = sequence.proposed, []
                sequence.cached += take - len(proposed)
                if sequence.pending:
                    self._commit(sequence, sequence.tokens[:sequence.cached])
                    continue  # a prefill chunk: the prompt goes on next step
                # The proposed tokens the target chose too: their keys and
                # values, written by this step, are the sequence's.
                accepted = accepted_prefix(proposed, chosen)
                if proposed:
                    self._verified(sequence, record, len(proposed), accepted)
                self._commit(sequence, sequence.tokens + proposed[:accepted])
                sequence.cached += accepted
                record.generated += self._take_chosen(sequence, chosen[:accepted + 1], logits,
                                                      logprobs, now)
                if proposed and sequence.slot is not None:
                    # Blocks past the accepted tokens go back to the pool.
                    self.cache.trim(sequence.slot, sequence.cached + 1)
            except Exception as error:  # this request's end, not the others'
                logger.exception("request %d failed", sequence.handle.request_id)
                self._finish(sequence, "error", error=f"{type(error).__name__}: {error}")
        self.stats.evictions = self.cache.evictions - self._evictions_before
        return True

    def _commit(self, sequence: SequenceState, tokens: list) -> None:
        """The first len(tokens) positions of `sequence` hold `tokens`'
        keys and values: its full blocks among them become reusable by
        later prompts."""
        block = self.cache.block_size
        if block is not None and len(tokens) // block > sequence.committed:
            self.cache.commit(sequence.slot, tokens)
            sequence.committed = len(tokens) // block

    def _verified(self, sequence: SequenceState, record: StepRecord, proposed: int,
                  accepted: int) -> None:
        """Counts a verification of `proposed` tokens, `accepted` of them."""
        sequence.speculation.verified(proposed, accepted)
        record.proposed += proposed
        record.accepted += accepted
        self.stats.count(proposed, accepted)

    def _take_chosen(self, sequence: SequenceState, tokens: list, logits, logprobs: list,
                     now: float) -> int:
        """Gives `sequence` its new ids, in order, until one ends it (EOS, a
        stop string, its token limit); returns how many it took."""
        for i, token in enumerate(tokens):
            self._advance(sequence, token, None if logits is None else logits[i], now,
                          logprobs[i])
            if sequence.slot is None:  # finished
                return i + 1
        return len(tokens)

    def _end_cancelled(self, cancelled: set, abort: Optional[tuple[int, str]]) -> None:
        """Ends the cancelled sequences, and with `abort` every one submitted
        before it (with its error)."""
        for sequence in list(self._running) + list(self._waiting):
            request_id = sequence.handle.request_id
            if abort is not None and request_id < abort[0]:
                error = abort[1]
            elif request_id in cancelled:
                error = None
            else:
                continue
            if sequence in self._waiting:
                self._waiting.remove(sequence)
            self._finish(sequence, "abort", error=error)

    def _run(self, batch: list) -> list:
        """Runs `batch` ((sequence, tokens to take) pairs) in one step and
        returns (sequence, take, next ids, their logits or None, time,
        the step's record, their log-probabilities or None) per sequence:
        one id, or one per row a speculating sequence verifies. A step
        that raises is run again on each half of the batch, down to the
        sequences that make it raise alone: those end with finish_reason
        "error", and the others' results stand (a rerun writes the same
        keys and values at the same positions)."""
        choosing = [s for s, take in batch
                    if s.constraint is not None and take - len(s.proposed) == s.pending]
        before = time.perf_counter()
        if choosing:  # the grammars' masks, all together
            for sequence, mask in zip(choosing, fill_masks([s.constraint for s in choosing])):
                sequence.step_mask = mask
        masks = time.perf_counter() - before
        requests = [self._request(s, take) for s, take in batch]
        # Logits leave the device only when a request keeps them.
        options = {}
        if self._step_returns_logits_on_request:
            options["return_logits"] = any(s.logits is not None for s, _ in batch)
        if any(s.logprobs is not None for s, _ in batch):
            options["return_logprobs"] = True
        start = time.perf_counter()
        try:
            logits, next_ids, *logprobs = self.model.step(self.cache.cache, requests, **options)
        except Exception as error:  # one request's fault, or all of theirs: find out
            if len(batch) == 1:
                sequence = batch[0][0]
                logger.warning("request %d: its step failed: %s: %s",
                               sequence.handle.request_id, type(error).__name__, error)
                self._finish(sequence, "error", error=f"{type(error).__name__}: {error}")
                return []
            half = len(batch) // 2
            return self._run(batch[:half]) + self._run(batch[half:])
        now = time.perf_counter()
        record = StepRecord(len(requests), sum(len(r.tokens) for r in requests), all(
            len(r.tokens) - r.choices == 0 for r in requests), now - start, masks=masks)
        self.steps.append(record)
        values, ids = logprobs[0] if logprobs else (None, None)

        def token_logprobs(i: int, sequence: SequenceState):
            if sequence.logprobs is None:
                return None
            top = int(sequence.sampling.logprobs)
            return TokenLogprobs(int(next_ids[i]), float(values[i, 0]),
                                 tuple((int(ids[i, j]), float(values[i, 1 + j]))
                                       for j in range(top)))
        done, row, chosen = [], 0, np.asarray(next_ids).tolist()
        for request, (sequence, take) in zip(requests, batch):
            rows = range(row, row + request.choices)
            row += request.choices
            done.append((sequence, take, chosen[rows.start:rows.stop],
                         None if logits is None else logits[rows.start:rows.stop], now, record,
                         [token_logprobs(i, sequence) for i in rows]))
        return done

    def _admit(self) -> None:
        """Admits waiting sequences, first come first served, while a slot
        and blocks for their tokens are free. A sequence's tokens are its
        prompt, and after a preemption the ids it had generated too (all
        recomputed, except a cached prefix).

        A sequence whose next uncached block is one a running sequence is
        still computing (the same ids after the same prefix: a system
        prompt submitted by several requests at once) waits, without
        holding up the sequences behind it, until that block is computed
        and cached; then it reuses it."""
        deferred = []
        while self._waiting:
            sequence = self._waiting[0]
            if self._waits_for_a_prefix(sequence):
                deferred.append(self._waiting.popleft())
                continue
            admitted = self.cache.admit(sequence.tokens, len(sequence.tokens))
            if admitted is None:
                break
            self._waiting.popleft()
            sequence.slot, sequence.cached = admitted
            sequence.committed = sequence.cached // (self.cache.block_size or 1)
            sequence.served = self._step_count - 1
            if sequence.cached_prompt is None:
                sequence.cached_prompt = min(sequence.cached, len(sequence.prompt))
                self.stats.prompt_tokens += len(sequence.prompt)
                self.stats.cached_tokens += sequence.cached_prompt
            if sequence.hashes is None:
                sequence.hashes = self.cache.block_hashes(sequence.tokens)
            self._running.append(sequence)
        self._waiting.extendleft(reversed(deferred))

    def _waits_for_a_prefix(self, sequence: SequenceState) -> bool:
        """Whether the next block of `sequence` past its cached prefix is
        one a running sequence is computing (one it reaches before its last
        token: that one is always computed)."""
        block = self.cache.block_size
        if block is None or len(sequence.tokens) <= block:
            return False
        if sequence.hashes is None:
            sequence.hashes = self.cache.block_hashes(sequence.tokens)
        usable = min((len(sequence.tokens) - 1) // block, len(sequence.hashes))
        cached = self.cache.cached_blocks(sequence.tokens)
        if cached >= usable:
            return False
        pending = {h for s in self._running for h in s.hashes[s.committed:]}
        return sequence.hashes[cached] in pending

    def _schedule(self) -> list:
        """This step's (sequence, tokens to take): the sequences that waited
        longest since their last tokens first (among equals: decoding ones,
        with one pending token, before prefills, then those with fewer new
        tokens, then by arrival), each taking what is left of the token
        budget, up to what it has pending (at least one chunk a step). A sequence whose tokens need a block
        none is free for preempts the most recently arrived running
        sequence (itself, if it is that one)."""
        order = sorted(self._running,
                       key=lambda s: (s.served, s.pending > 1, len(s.generated),
                                      s.handle.request_id))
        budget = self.max_step_tokens
        batch = []
        for sequence in order:
            if sequence.slot is None:
                continue  # preempted by an earlier one of this step
            take = min(sequence.pending, budget)
            if take < 1:
                if batch:
                    continue
                take = 1
            self.cache.slide(sequence.slot, sequence.cached)  # what left every window goes
            while not self.cache.reserve(sequence.slot, sequence.cached + take):
                victim = max(self._running, key=lambda s: s.handle.request_id)
                for i, (scheduled, taken) in enumerate(batch):
                    if scheduled is victim:
                        del batch[i]
                        budget += taken
                        break
                self._preempt(victim)
                if victim is sequence:
                    break
            else:
                budget -= take
                batch.append((sequence, take))
        if self.speculative is not None:
            add_proposals(batch, budget, self.cache, self.speculative, self.draft)
        return batch

    def _preempt(self, sequence: SequenceState) -> None:
        """Frees a running sequence's blocks (its full ones stay cached) and
        puts it back at the head of the queue, to be recomputed."""
        logger.info("request %d preempted: the KV cache has no free block",
                    sequence.handle.request_id)
        self._running.remove(sequence)
        self.cache.release(sequence.slot)
        if sequence.speculation is not None:
            sequence.speculation.release()
        sequence.slot = None
        sequence.cached = sequence.committed = 0
        sequence.hashes = None  # its tokens grew: named again when admitted
        sequence.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(sequence)

    def _request(self, sequence: SequenceState, take: int):
        """The step's request of `sequence`: `take` tokens, its proposed
        ones last (the step chooses a token after each of those and after
        the one before them, all with the same adjustments and mask)."""
        proposed = sequence.proposed
        own = take - len(proposed)
        tokens = sequence.tokens[sequence.cached:sequence.cached + own]
        adjustments = mask = None
        if own == sequence.pending:  # the step chooses its next token
            forbidden = ()
            if len(sequence.generated) < sequence.min_tokens:
                forbidden = sorted(sequence.eos | sequence.stop_ids)
            adjustments = logit_adjustments(sequence.sampling, sequence.prompt,
                                            sequence.generated, forbidden)
            mask = sequence.token_mask
            if sequence.constraint is not None:
                mask = sequence.step_mask if mask is None else mask & sequence.step_mask
        if sequence.sampling is None and adjustments is None and mask is None and \
                not proposed:
            return Request(sequence.slot, sequence.cached, tokens)
        return Request(sequence.slot, sequence.cached, tokens + proposed,
                       sampling=sequence.sampling, adjustments=adjustments, token_mask=mask,
                       choices=1 + len(proposed))

    def _advance(self, sequence: SequenceState, token: int, logits, now: float,
                 logprobs: Optional[TokenLogprobs] = None) -> None:
        """Takes one new id: checks the stops, delivers the output."""
        if sequence.first_token_time is None:
            sequence.first_token_time = now
        sequence.generated.append(token)
        sequence.tokens.append(token)
        if sequence.logits is not None:
            sequence.logits.append(np.array(logits, dtype=np.float32))
        if sequence.logprobs is not None:
            sequence.logprobs.append(logprobs)
        if sequence.constraint is not None:
            sequence.constraint.accept(token)
        reason = None
        text = ""
        if token in sequence.eos:
            reason = "stop"
        else:
            if sequence.detokenizer is not None:
                text = sequence.detokenizer.push(token)
            if token in sequence.stop_ids:
                reason = "stop"
        if reason is None and sequence.constraint is not None and sequence.constraint.finished:
            reason = "stop"  # the grammar is complete: nothing may follow
        if reason is None and len(sequence.generated) >= sequence.max_new_tokens:
            reason = "length"
        final = reason is not None
        if final and sequence.detokenizer is not None:
            text += sequence.detokenizer.flush()
        text, stopped = sequence.stop.feed(text, final=final)
        if stopped:
            reason = "stop"
        sequence.text.append(text)
        output = RequestOutput(sequence.handle.request_id, [token], text, reason,
                               num_tokens=len(sequence.generated),
                               cached_tokens=sequence.cached_prompt or 0,
                               logprobs=None if logprobs is None else [logprobs])
        if reason is not None:
            self._finish(sequence, reason, output=output)
        else:
            sequence.handle._deliver(output)

    def _finish(self, sequence: SequenceState, reason: str, *, output=None,
                error: Optional[str] = None) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
        if sequence.slot is not None:
            self.cache.release(sequence.slot)
            sequence.slot = None
        speculation = sequence.speculation
        if speculation is not None:
            speculation.release()
        handle = sequence.handle
        counts = {} if speculation is None else dict(
            speculative_steps=speculation.speculative_steps,
            proposed_tokens=speculation.proposed_tokens,
            accepted_tokens=speculation.accepted_tokens)
        result = RequestResult(
            handle.request_id, sequence.prompt, sequence.generated, "".join(sequence.text),
            reason, handle.arrival_time, sequence.first_token_time, time.perf_counter(),
            logits=np.stack(sequence.logits) if sequence.logits else None, error=error,
            cached_tokens=sequence.cached_prompt or 0, preemptions=sequence.preemptions,
            logprobs=sequence.logprobs, **counts)
        handle._finish(result)
        if output is None:
            output = RequestOutput(handle.request_id, [], "", reason,
                                   num_tokens=len(sequence.generated), error=error,
                                   cached_tokens=sequence.cached_prompt or 0)
        handle._deliver(output)
        if self.on_finish is not None:
            try:
                self.on_finish(result)
            except Exception:  # the observer's failure, not the request's
                logger.exception("request %d: on_finish failed", handle.request_id)

    def run(self) -> None:
        """Runs steps in this thread until every request has finished."""
        while self.step():
            pass

    # -- the engine's thread -------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a live thread of `start()` runs the steps."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Runs the steps in a thread of their own (a daemon, again after
        one died), waiting for requests when there are none, until
        `shutdown()`."""
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="etc-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not (self._incoming or self._running or
                                                  self._waiting or self._cancelled or
                                                  self._abort is not None):
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as error:  # never a dead engine: fail what ran, go on
                logger.exception("engine step failed")
                message = f"{type(error).__name__}: {error}"
                for sequence in list(self._running):
                    try:
                        self._finish(sequence, "error", error=message)
                    except Exception:  # the KV cache cannot release it: its slot is lost
                        logger.exception("request %d: slot lost", sequence.handle.request_id)
                        sequence.slot = None
                        self._finish(sequence, "error", error=message)

    def shutdown(self) -> None:
        """Stops the thread after its current step; requests still running
        or waiting end with "abort" (error: "the engine shut down")."""
        thread = self._thread
        if thread is not None:
            with self._lock:
                self._stopping = True
                self._wake.notify()
            thread.join()
            self._thread = None
        with self._lock:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
        for sequence in list(self._running) + list(self._waiting):
            self._finish(sequence, "abort", error="the engine shut down")
        self._waiting.clear()

