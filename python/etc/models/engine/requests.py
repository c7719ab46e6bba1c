"""A request's side of the engine: the error that refuses one (and the
checks of its stop strings and token ids), what each step gives it
(`RequestOutput`), its end (`RequestResult`), and the handle its
submitter holds (`RequestHandle`: outputs as they come, the result, cancel)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger("etc.engine")

__all__ = ["RequestError", "RequestOutput", "RequestResult", "RequestHandle", "FINISH_REASONS",
           "TokenLogprobs", "check_stop", "check_ids"]


class RequestError(ValueError):
    """A request the engine cannot run, with `param`: the parameter at fault
    ("prompt", "max_new_tokens", "stop", "sampling")."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


#: Why a request ended: an end-of-sequence id or a stop string ("stop"),
#: its token limit or the model length ("length"), `cancel` ("abort"), or a
#: failed step ("error").
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class TokenLogprobs:
    """A new token's log-probability and the most likely tokens of its step
    with theirs (as many as the request's `SamplingParams.logprobs` asks,
    most likely first), computed on the device under the distribution the
    token was drawn from; -inf for a token the filters (top-k, top-p,
    min-p) left out."""

    token_id: int
    logprob: float
    top: tuple = ()  # ((token id, log-probability), ...)


@dataclass
class RequestOutput:
    """What one step did for one request: the ids it produced (none while a
    long prompt is still being prefilled) and the text they completed (held
    back while it may be the start of a stop string, and never containing
    the stop string itself). `finish_reason` is set on the request's last
    output."""

    request_id: int
    token_ids: list
    text: str
    finish_reason: Optional[str] = None
    #: The ids of the request so far, and the error of a failed step.
    num_tokens: int = 0
    error: Optional[str] = None
    #: The prompt tokens whose keys and values came from the cache (a
    #: cached prefix) rather than being computed for this request.
    cached_tokens: int = 0
    #: One `TokenLogprobs` per id of `token_ids` when the request asked for
    #: log-probabilities, else None.
    logprobs: Optional[list] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestResult:
    """A finished request: its prompt and new ids, its text, why it ended,
    and when (perf_counter seconds) it arrived, got its first token and
    finished. `token_ids` include the end-of-sequence id that stopped it
    (`finish_reason` "stop" by EOS), `text` never does; after a stop string,
    `token_ids` end with the id that completed it, and `text` ends before
    it."""

    request_id: int
    prompt_ids: list
    token_ids: list
    text: str
    finish_reason: str
    arrival_time: float
    first_token_time: Optional[float]
    finish_time: float
    logits: Optional[np.ndarray] = None
    error: Optional[str] = None
    #: The prompt tokens that came from the cache (see `RequestOutput`),
    #: and how many times the request was preempted (and recomputed).
    cached_tokens: int = 0
    preemptions: int = 0
    #: One `TokenLogprobs` per new id when the request asked for them.
    logprobs: Optional[list] = None
    #: Speculative decoding: the steps that verified a proposal of this
    #: request, the tokens proposed, and those accepted.
    speculative_steps: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def time_to_first_token(self) -> Optional[float]:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def time_per_output_token(self) -> Optional[float]:
        """Seconds per token after the first (None with fewer than 2)."""
        if self.first_token_time is None or len(self.token_ids) < 2:
            return None
        return (self.finish_time - self.first_token_time) / (len(self.token_ids) - 1)


class RequestHandle:
    """A submitted request: `outputs()` yields its `RequestOutput`s as the
    steps make them, `result()` waits for the `RequestResult`, `cancel()`
    ends it between two steps (its slot is freed; finish_reason "abort").
    With an `on_output` callback given to `Engine.submit`, outputs go to the
    callback (from the engine's thread) instead."""

    def __init__(self, engine: "Engine", request_id: int, prompt_ids: list,
                 on_output: Optional[Callable[[RequestOutput], None]]):
        self.engine = engine
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.arrival_time = time.perf_counter()
        self._on_output = on_output
        self._queue: "queue.Queue[RequestOutput]" = queue.Queue()
        self._done = threading.Event()
        self._result: Optional[RequestResult] = None
        # Whether `outputs()` has yielded the last output.
        self._ended = False

    def _deliver(self, output: RequestOutput) -> None:
        if self._on_output is not None:
            try:
                self._on_output(output)
            except Exception:  # a consumer gone (a closed event loop): not the engine's end
                logger.exception("request %d: its output callback failed", self.request_id)
        else:
            self._queue.put(output)

    def _finish(self, result: RequestResult) -> None:
        self._result = result
        self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self.engine.cancel(self.request_id)

    def outputs(self, timeout: Optional[float] = None):
        """The outputs as they come, until the last one (iterated again
        after that, nothing: it returns at once). Without a running engine
        thread, the caller's thread runs the steps. A request submitted
        with `on_output` has none here: RuntimeError. `timeout` bounds the
        wait for each output (TimeoutError)."""
        if self._on_output is not None:
            raise RuntimeError(f"request {self.request_id} was submitted with on_output: its "
                               f"outputs go to that callback, and outputs() has none")
        while not self._ended:
            if not self.engine.running:
                while self._queue.empty() and self.engine.step():
                    pass
            try:
                output = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id}: no output in {timeout} s") \
                    from None
            self._ended = output.finished
            yield output

    def result(self, timeout: Optional[float] = None) -> RequestResult:
        """The finished request (running the steps in this thread when the
        engine has no thread of its own)."""
        if not self.engine.running:
            while not self._done.is_set() and self.engine.step():
                pass
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish in {timeout} s")
        return self._result


def check_stop(stop) -> list:
    """`submit`'s stop strings as a list (None: none; one string: itself)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (bytes, dict)) or not isinstance(stop, (Sequence, set, frozenset)) or \
            not all(isinstance(s, str) for s in stop):
        raise RequestError(f"stop={stop!r} must be a string or a list of strings", "stop")
    return list(stop)


def check_ids(ids, name: str, vocab: Optional[int] = None) -> list:
    """Token ids given as a list (or any iterable) of ints (with `vocab`,
    each in [0, vocab)), checked."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise RequestError(f"{name}={ids!r} must be a list of token ids", name)
    ids = list(ids)
    if not all(isinstance(i, Integral) and not isinstance(i, (bool, np.bool_)) for i in ids):
        raise RequestError(f"{name}={ids!r} must be a list of token ids", name)
    if vocab is not None:
        for i in ids:
            if not 0 <= i < vocab:
                raise RequestError(f"{name}: {i} is not a token id in [0, {vocab})", name)
    return [int(i) for i in ids]
