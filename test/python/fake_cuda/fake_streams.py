"""Streams of the fake CUDA driver (`fake_driver.py`): work queued on a
stream runs when the host waits for it, not when it is queued, and two
pieces of work that no stream order or host wait puts one after the other
must not touch the same bytes (one of them writing).

Order, as the driver defines it:
* work on one stream runs in the order it was queued;
* the legacy default stream (handle 0) waits for earlier work on every
  blocking stream (created with flags 0), and work on a blocking stream
  waits for earlier work on the legacy stream; non-blocking streams
  (CU_STREAM_NON_BLOCKING) have neither;
* a host wait (stream, event or context synchronisation, a synchronous
  copy) runs the work it waits for, and everything queued after it comes
  after that work.

The fake runs queued work as late as it may (at the host wait that needs
it), so a result read without the wait it needs reads stale memory. Vector
clocks (one component per stream) record what each piece of work comes
after; when work runs, its accesses are compared with every earlier one it
is not ordered after, and a conflict is a `RaceError`: the fake's order was
one of those the GPU may pick, and another would give other results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: The legacy default stream.
LEGACY = 0
#: cuStreamCreate's flag for a stream that does not wait for the legacy one.
NON_BLOCKING = 1


class RaceError(RuntimeError):
    """Two pieces of device work (or a host copy) touch the same bytes, one
    of them writing, and nothing orders them."""


class Fault(Exception):
    """Work that fails on the device: `code` becomes the context's sticky
    error (a CUresult), `why` says what the fake saw."""

    def __init__(self, code, why: str):
        super().__init__(why)
        self.code, self.why = code, why


#: (start, end, writes) byte ranges one piece of work touches.
Access = tuple[int, int, bool]


@dataclass
class Work:
    """One piece of device work. `prepare()` checks it and returns the
    ranges it touches (raising Fault where the device would fault);
    `perform()` does it."""

    seq: int
    stream: int
    what: str
    prepare: Callable[[], list]
    perform: Callable[[], None]
    clock: dict = field(default_factory=dict)
    accesses: list = field(default_factory=list)

    @property
    def epoch(self) -> int:
        return self.clock[self.stream]

    def after(self, other: "Work") -> bool:
        """Whether this work is ordered after `other`."""
        return self.clock.get(other.stream, 0) >= other.epoch


def _join(into: dict, other: dict) -> None:
    for agent, count in other.items():
        if count > into.get(agent, 0):
            into[agent] = count


def _overlap(first: list, second: list) -> tuple | None:
    for start, end, writes in first:
        for other_start, other_end, other_writes in second:
            if (writes or other_writes) and start < other_end and other_start < end:
                return max(start, other_start), min(end, other_end)
    return None


class Streams:
    """The fake device's streams, queued work and host waits (see the
    module docstring)."""

    def __init__(self):
        #: Stream handle -> flags; the legacy stream is always there.
        self.flags: dict[int, int] = {LEGACY: 0}
        self.clocks: dict[int, dict] = {LEGACY: {}}
        self.host: dict = {}
        self.pending: list[Work] = []
        self.history: list[Work] = []
        self.seq = 0
        #: Streams being captured into a graph: handle -> recorded work.
        self.capturing: dict[int, list] = {}
        #: Why the capture in progress can no longer end in a graph.
        self.invalidated: dict[int, str] = {}

    # -- streams ---------------------------------------------------------------

    def create(self, handle: int, flags: int) -> None:
        self.flags[handle] = flags
        self.clocks[handle] = dict(self.host)

    def destroy(self, handle: int) -> None:
        """The handle goes; work queued on it still runs (as the driver's)."""
        self.flags.pop(handle, None)

    def known(self, handle: int) -> bool:
        return handle in self.flags

    def blocking(self, handle: int) -> bool:
        return not self.flags.get(handle, 0) & NON_BLOCKING

    # -- queueing ---------------------------------------------------------------

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def queue(self, stream: int, what: str, prepare, perform, *, everything: bool = False
              ) -> Work:
        """Queues work on `stream`; `everything`: after all queued work (a free)."""
        clock = dict(self.host)
        _join(clock, self.clocks[stream])
        if everything:
            for other in self.clocks.values():
                _join(clock, other)
        elif stream == LEGACY:
            for handle, other in self.clocks.items():
                if handle != LEGACY and self.blocking(handle):
                    _join(clock, other)
        elif self.blocking(stream):
            _join(clock, self.clocks[LEGACY])
        clock[stream] = clock.get(stream, 0) + 1
        self.clocks[stream] = clock
        work = Work(self.next_seq(), stream, what, prepare, perform, clock)
        self.pending.append(work)
        return work

    # -- running ------------------------------------------------------------------

    def run_until(self, clock: dict) -> None:
        """Runs every queued work that `clock` comes after, in queue order
        (raises Fault or RaceError; the caller turns them into errors)."""
        ready = [w for w in self.pending if clock.get(w.stream, 0) >= w.epoch]
        for work in ready:
            self.pending.remove(work)
            self._run(work)

    def _run(self, work: Work) -> None:
        try:
            work.accesses = work.prepare()
            for earlier in self.history:
                if not work.after(earlier):
                    overlap = _overlap(earlier.accesses, work.accesses)
                    if overlap:
                        raise RaceError(
                            f"fake CUDA driver: a race: {earlier.what} on {_name(earlier.stream)} "
                            f"and {work.what} on {_name(work.stream)} both touch "
                            f"[{overlap[0]:#x}, {overlap[1]:#x}), one of them writing, and "
                            "nothing orders them (no stream order, event or host wait between "
                            "them): the GPU may run them either way round")
            work.perform()
        except (Fault, RaceError):
            self.pending.clear()
            raise
        if work.accesses:
            self.history.append(work)

    def wait(self, clock: dict) -> None:
        """The host waits for the work `clock` names: runs it, then orders
        everything queued later after it."""
        self.run_until(clock)
        _join(self.host, clock)
        self._forget()

    def _forget(self) -> None:
        """Drops history that everything queued now or later comes after."""
        def settled(work: Work) -> bool:
            return self.host.get(work.stream, 0) >= work.epoch and all(
                p.after(work) for p in self.pending)
        self.history = [w for w in self.history if not settled(w)]

    def stream_clock(self, stream: int) -> dict:
        """What waiting for `stream` waits for: on the legacy stream, also
        earlier work of the blocking streams (as work queued on it would)."""
        clock = dict(self.clocks[stream])
        if stream == LEGACY:
            for handle, other in self.clocks.items():
                if self.blocking(handle):
                    _join(clock, other)
        return clock

    def everything(self) -> dict:
        clock: dict = {}
        for other in self.clocks.values():
            _join(clock, other)
        return clock

    def busy(self, clock: dict) -> bool:
        """Whether work that `clock` names has not run yet."""
        return any(clock.get(w.stream, 0) >= w.epoch for w in self.pending)


def _name(stream: int) -> str:
    return "the legacy stream" if stream == LEGACY else f"stream {stream:#x}"
