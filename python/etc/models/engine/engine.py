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

The KV cache is managed behind five calls (`admit`, `reserve`, `commit`,
`release` and `cache`) by one of two classes. With the model's paged cache
(the default, `etc.models.step.kv_cache.PagedKVCache`), `PagedSlots`: requests are admitted
while the pool has free blocks for their prompt, a new request reuses the
blocks of its longest cached prefix (another request's prompt, or an
earlier one's, kept until evicted least-recently-used) and prefills only the
rest, and when a running request needs a block and none is free, the most
recently arrived running request is preempted: its blocks are freed (its
full blocks stay cached), it goes back to the head of the queue and is
recomputed from its prompt and the ids it had generated when it is
admitted again. With a contiguous cache (`kv_block_size=None`),
`SlotCache`: a slot of the full model length per running sequence.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..step.request import Request
from .requests import RequestError, RequestHandle, RequestOutput, RequestResult
from .slots import PagedSlots, SlotCache
from .stopping import StopChecker

logger = logging.getLogger("etc.engine")

__all__ = ["Engine", "StepRecord", "EngineStats"]


@dataclass
class StepRecord:
    """One kernel run: its requests and tokens, whether it only decoded
    (one token per request), and its seconds (host preparation included)."""

    requests: int
    tokens: int
    decode_only: bool
    seconds: float


@dataclass
class EngineStats:
    """What the engine's cache did since it started: prompt tokens admitted
    and how many came from cached prefixes, cached blocks evicted to make
    room, and requests preempted (their blocks freed, recomputed later)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0


class _Sequence:
    """The engine's state of one request (its thread only)."""

    def __init__(self, handle: "RequestHandle", prompt: list, max_new_tokens: int, stop,
                 eos: frozenset, sampling, detokenizer, return_logits: bool):
        self.handle = handle
        self.prompt = prompt
        self.tokens = list(prompt)  # prompt + generated: what goes into the cache
        self.generated: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.stop = StopChecker(stop)
        self.eos = eos
        self.sampling = sampling
        self.detokenizer = detokenizer
        self.logits: Optional[list] = [] if return_logits else None
        self.text: list[str] = []
        self.slot: Optional[int] = None
        self.cached = 0  # positions in the cache
        self.committed = 0  # of them, full blocks registered for reuse
        self.cached_prompt: Optional[int] = None  # prompt tokens found cached at admission
        self.preemptions = 0
        self.first_token_time: Optional[float] = None

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache: the rest of the prompt, or the last
        generated id."""
        return len(self.tokens) - self.cached


class Engine:
    """Runs many requests on one model (see the module's docstring).

    `max_num_seqs` bounds the requests running at once; `max_model_len`
    (default: the model's `max_seq_len`) bounds each one's prompt plus new
    tokens; `max_step_tokens` (default: the model's) bounds the tokens of
    one step: decoding requests take one each, prefills share what is left,
    a long prompt taking several steps. Requests beyond `max_num_seqs`, or
    beyond what the KV cache holds, wait, first come first served.

    The KV cache is the model's paged pool (`model.paged_cache`: sized by
    load's kv_cache_tokens / kv_cache_memory, else max_num_seqs x
    max_model_len positions), shared with every other engine of the model,
    so cached prefixes outlive the engine (`kv_cache_tokens`: a pool of
    the engine's own, of that many positions, instead); or, for a model
    loaded with kv_block_size=None, `max_num_seqs` contiguous slots of
    max_model_len.
    `stats` counts cached prompt tokens, evictions and preemptions.

    Thread safety: `submit` and `cancel` may be called from any thread.
    Steps run in the thread of `start()`, or in the caller's with `step()`,
    `run()` or a handle's `result()` / `outputs()`."""

    def __init__(self, model, *, max_num_seqs: int = 8, max_model_len: Optional[int] = None,
                 max_step_tokens: Optional[int] = None, kv_cache_tokens: Optional[int] = None):
        for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len),
                            ("max_step_tokens", max_step_tokens),
                            ("kv_cache_tokens", kv_cache_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                      value < 1):
                raise ValueError(f"Engine: {name}={value!r} must be a positive int")
        if max_model_len is None:
            max_model_len = model.max_seq_len
        if max_model_len > model.max_seq_len:
            raise ValueError(f"Engine: max_model_len={max_model_len} is longer than the model's "
                             f"max_seq_len={model.max_seq_len}")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_step_tokens = max_step_tokens or model.max_step_tokens
        if getattr(model, "kv_block_size", None) is None:
            if kv_cache_tokens is not None:
                raise ValueError("Engine: kv_cache_tokens sizes a paged KV cache, but the model "
                                 "was loaded with kv_block_size=None (contiguous slots)")
            self.cache = SlotCache(model, max_num_seqs, max_model_len)
        else:
            pool = model.paged_cache(max_num_seqs * max_model_len) if kv_cache_tokens is None \
                else model.new_paged_cache(kv_cache_tokens)
            self.cache = PagedSlots(pool, max_num_seqs)
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
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._incoming: list[_Sequence] = []
        self._cancelled: set[int] = set()
        self._waiting: "collections.deque[_Sequence]" = collections.deque()
        self._running: list[_Sequence] = []
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

    # -- submitting --------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], *, max_new_tokens: Optional[int] = None,
               stop: Sequence[str] = (), ignore_eos: bool = False, sampling=None,
               eos_token_ids: Optional[Sequence[int]] = None, return_logits: bool = False,
               on_output: Optional[Callable[[RequestOutput], None]] = None) -> RequestHandle:
        """Queues a request: `prompt_ids` (token ids), at most
        `max_new_tokens` new ids (default: up to `max_model_len`), stopping
        at an id of `eos_token_ids` (default: the model's) unless
        `ignore_eos`, or at a string of `stop` (needs the model's
        tokenizer). `sampling` is an `etc.models.step.sampling.SamplingParams`
        (None: greedy); without a seed each step draws fresh random seeds (rank
        0's under tensor parallelism, so every rank draws the same token).
        Raises `RequestError` naming the parameter at fault."""
        prompt = self._check_prompt(prompt_ids)
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise RequestError(f"the prompt has {len(prompt)} tokens; the model length is "
                               f"{self.max_model_len}, leaving no room for a new token",
                               "prompt")
        if max_new_tokens is None:
            max_new_tokens = room
        elif isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
                max_new_tokens < 1:
            raise RequestError(f"max_new_tokens={max_new_tokens!r} must be a positive int",
                               "max_new_tokens")
        elif max_new_tokens > room:
            raise RequestError(f"the prompt has {len(prompt)} tokens and max_new_tokens is "
                               f"{max_new_tokens}: {len(prompt) + max_new_tokens} tokens, more "
                               f"than the model length {self.max_model_len}", "max_new_tokens")
        # A sequence the whole cache cannot hold would wait (or be
        # preempted) forever: refused now. Its last id is never stored.
        if not self.cache.fits(len(prompt)):
            raise RequestError(f"the prompt has {len(prompt)} tokens, more than the whole KV "
                               f"cache holds ({self.cache.capacity} positions): it can never "
                               f"run; load the model with a larger kv_cache_tokens or "
                               f"kv_cache_memory", "prompt")
        if not self.cache.fits(len(prompt) + max_new_tokens - 1):
            raise RequestError(f"the prompt has {len(prompt)} tokens and max_new_tokens is "
                               f"{max_new_tokens}: {len(prompt) + max_new_tokens - 1} positions "
                               f"to cache, more than the whole KV cache holds "
                               f"({self.cache.capacity} positions); lower max_new_tokens or "
                               f"load the model with a larger kv_cache_tokens or "
                               f"kv_cache_memory", "max_new_tokens")
        if isinstance(stop, str):
            stop = [stop]
        if not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings", "stop")
        tokenizer = self.model.tokenizer
        if any(stop) and tokenizer is None:
            raise RequestError("stop strings need the model's tokenizer (tokenizer.json)", "stop")
        eos = frozenset() if ignore_eos else frozenset(
            self.model.eos_token_ids if eos_token_ids is None else eos_token_ids)
        detokenizer = tokenizer.detokenizer() if tokenizer is not None else None
        with self._lock:
            handle = RequestHandle(self, next(self._ids), prompt, on_output)
            self._incoming.append(_Sequence(handle, prompt, max_new_tokens, stop, eos, sampling,
                                            detokenizer, return_logits))
            self._wake.notify()
        return handle

    def _check_prompt(self, prompt_ids) -> list[int]:
        if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence) or \
                not prompt_ids:
            raise RequestError("the prompt must be a non-empty list of token ids", "prompt")
        vocab = self.model.config.vocab_size
        for i, token in enumerate(prompt_ids):
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or \
                    not 0 <= token < vocab:
                raise RequestError(f"prompt position {i}: {token!r} is not a token id in "
                                   f"[0, {vocab})", "prompt")
        return [int(t) for t in prompt_ids]

    def cancel(self, request_id: int) -> None:
        """Ends request `request_id` before the next step (no-op once it has
        finished)."""
        with self._lock:
            self._cancelled.add(request_id)
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
        if cancelled:
            for sequence in [s for s in self._running if s.handle.request_id in cancelled]:
                self._finish(sequence, "abort")
            for sequence in [s for s in self._waiting if s.handle.request_id in cancelled]:
                self._waiting.remove(sequence)
                self._finish(sequence, "abort")
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
        requests = [self._request(s, take) for s, take in batch]
        # Logits leave the device only when a request keeps them.
        options = {}
        if self._step_returns_logits_on_request:
            options["return_logits"] = any(s.logits is not None for s, _ in batch)
        start = time.perf_counter()
        try:
            logits, next_ids = self.model.step(self.cache.cache, requests, **options)
        except Exception as error:  # a bug below: fail these requests, keep serving
            for sequence, _ in batch:
                self._finish(sequence, "error", error=f"{type(error).__name__}: {error}")
            return True
        now = time.perf_counter()
        self.steps.append(StepRecord(len(requests), sum(len(r.tokens) for r in requests),
                                     all(len(r.tokens) == 1 for r in requests), now - start))
        block = self.cache.block_size
        for i, (sequence, take) in enumerate(batch):
            sequence.cached += take
            if block is not None and sequence.cached // block > sequence.committed:
                # Full blocks computed: reusable by later prompts.
                self.cache.commit(sequence.slot, sequence.tokens[:sequence.cached])
                sequence.committed = sequence.cached // block
            if sequence.pending:
                continue  # a prefill chunk: the prompt goes on next step
            self._advance(sequence, int(next_ids[i]), None if logits is None else logits[i], now)
        self.stats.evictions = self.cache.evictions - self._evictions_before
        return True

    def _admit(self) -> None:
        """Admits waiting sequences, first come first served, while a slot
        and blocks for their tokens are free. A sequence's tokens are its
        prompt, and after a preemption the ids it had generated too (all
        recomputed, except a cached prefix)."""
        while self._waiting:
            sequence = self._waiting[0]
            admitted = self.cache.admit(sequence.tokens, len(sequence.tokens))
            if admitted is None:
                break
            self._waiting.popleft()
            sequence.slot, sequence.cached = admitted
            sequence.committed = sequence.cached // (self.cache.block_size or 1)
            if sequence.cached_prompt is None:
                sequence.cached_prompt = min(sequence.cached, len(sequence.prompt))
                self.stats.prompt_tokens += len(sequence.prompt)
                self.stats.cached_tokens += sequence.cached_prompt
            self._running.append(sequence)

    def _schedule(self) -> list:
        """This step's (sequence, tokens to take): decoding sequences (one
        pending token) first, then prefill chunks, first come first served,
        from what is left of the token budget (at least one chunk a step).
        A sequence whose tokens need a block none is free for preempts the
        most recently arrived running sequence (itself, if it is that one)."""
        order = sorted(self._running, key=lambda s: s.pending > 1)
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
        return batch

    def _preempt(self, sequence: _Sequence) -> None:
        """Frees a running sequence's blocks (its full ones stay cached) and
        puts it back at the head of the queue, to be recomputed."""
        logger.info("request %d preempted: the KV cache has no free block",
                    sequence.handle.request_id)
        self._running.remove(sequence)
        self.cache.release(sequence.slot)
        sequence.slot = None
        sequence.cached = sequence.committed = 0
        sequence.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(sequence)

    def _request(self, sequence: _Sequence, take: int):
        tokens = sequence.tokens[sequence.cached:sequence.cached + take]
        if sequence.sampling is None:
            return Request(sequence.slot, sequence.cached, tokens)
        return Request(sequence.slot, sequence.cached, tokens, sampling=sequence.sampling)

    def _advance(self, sequence: _Sequence, token: int, logits, now: float) -> None:
        """Takes one new id: checks the stops, delivers the output."""
        if sequence.first_token_time is None:
            sequence.first_token_time = now
        sequence.generated.append(token)
        sequence.tokens.append(token)
        if sequence.logits is not None:
            sequence.logits.append(np.array(logits, dtype=np.float32))
        reason = None
        text = ""
        if token in sequence.eos:
            reason = "stop"
        elif sequence.detokenizer is not None:
            text = sequence.detokenizer.push(token)
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
                               cached_tokens=sequence.cached_prompt or 0)
        if reason is not None:
            self._finish(sequence, reason, output=output)
        else:
            sequence.handle._deliver(output)

    def _finish(self, sequence: _Sequence, reason: str, *, output=None,
                error: Optional[str] = None) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
        if sequence.slot is not None:
            self.cache.release(sequence.slot)
            sequence.slot = None
        handle = sequence.handle
        result = RequestResult(
            handle.request_id, sequence.prompt, sequence.generated, "".join(sequence.text),
            reason, handle.arrival_time, sequence.first_token_time, time.perf_counter(),
            logits=np.stack(sequence.logits) if sequence.logits else None, error=error,
            cached_tokens=sequence.cached_prompt or 0, preemptions=sequence.preemptions)
        handle._finish(result)
        if output is None:
            output = RequestOutput(handle.request_id, [], "", reason,
                                   num_tokens=len(sequence.generated), error=error,
                                   cached_tokens=sequence.cached_prompt or 0)
        handle._deliver(output)
        if self.on_finish is not None:
            self.on_finish(result)

    def run(self) -> None:
        """Runs steps in this thread until every request has finished."""
        while self.step():
            pass

    # -- the engine's thread -------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a thread of `start()` runs the steps."""
        return self._thread is not None

    def start(self) -> None:
        """Runs the steps in a thread of their own (a daemon), waiting for
        requests when there are none, until `shutdown()`."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="etc-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not (self._incoming or self._running or
                                                  self._waiting or self._cancelled):
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as error:  # never a dead engine: fail what ran, go on
                logger.exception("engine step failed")
                for sequence in list(self._running):
                    self._finish(sequence, "error", error=f"{type(error).__name__}: {error}")

    def shutdown(self) -> None:
        """Stops the thread after its current step; requests still running
        or waiting end with finish_reason "abort"."""
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
            self._finish(sequence, "abort")
        self._waiting.clear()
