"""The host threads that run CPU programs' workers, kept between runs.

Starting a Python thread costs tens to hundreds of microseconds (the new
thread must take the GIL to say it has started), and a run of a CPU program
started one per worker: at decode sizes that was more than the program's
own work (2 workers: 0.6 ms of thread starts for 0.8 ms of tiles on a 2-core
machine). Instead, the process keeps idle worker threads, each parked on a
lock; a run takes as many as it has workers, hands each its call, and
waits for them; then they go back to the idle set for the next run of any
program. Runs from several Python threads at once take disjoint workers
(more threads are started when none is idle).

Waits on the calling thread stay interruptible: a Ctrl-C while a run waits
raises in the caller, which stops the workers' spins (see
`CPURuntime.run`) and then waits for every worker's call to return with
`finish`, so no worker writes into buffers its caller has let go of.

A child made by `os.fork` starts with no idle threads (the parent's are not
copied).

This module needs only the standard library.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence

#: Thread names: "etc-worker-<n>", n counting the threads this process started.
NAME = "etc-worker"


class _Worker:
    """One parked thread: `start(call)` runs `call()` on it."""

    def __init__(self, number: int):
        self._go = threading.Lock()
        self._go.acquire()
        self._call: Callable[[], None] | None = None
        self.thread = threading.Thread(target=self._loop, name=f"{NAME}-{number}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            call, self._call = self._call, None
            call()

    def start(self, call: Callable[[], None]) -> None:
        self._call = call
        self._go.release()


class _Pool:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._numbers = itertools.count()
        #: Workers handed out and not yet given back.
        self.busy = 0

    def take(self, count: int) -> list[_Worker]:
        with self._lock:
            taken = [self._idle.pop() for _ in range(min(count, len(self._idle)))]
            numbers = [next(self._numbers) for _ in range(count - len(taken))]
            self.busy += count
        try:
            for number in numbers:
                taken.append(_Worker(number))
        except BaseException:
            self.give_back(taken, count)
            raise
        return taken

    def give_back(self, workers: list[_Worker], count: int) -> None:
        with self._lock:
            self._idle.extend(workers)
            self.busy -= count


_pool = _Pool()


def _forget_threads() -> None:
    # In a forked child only the forking thread exists.
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


def busy() -> int:
    """How many worker threads are running a call now (0 once every run
    has returned, interrupted or not)."""
    return _pool.busy


class Run:
    """The calls of one run, one per worker thread, started at once: `wait`
    for all of them (interruptible), `finish` after an interruption (not
    interruptible). `wait` re-raises the first error a call raised."""

    def __init__(self, calls: Sequence[Callable[[], None]]):
        self._pool = _pool
        self._done = threading.Condition(threading.Lock())
        # Counted down by the workers (not by the waiting thread, so that an
        # interruption cannot lose a count).
        self._remaining = len(calls)
        self._errors: list[BaseException] = []
        self._workers = self._pool.take(len(calls))
        self._given_back = False
        for worker, call in zip(self._workers, calls):
            worker.start(self._wrap(call))

    def _wrap(self, call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                call()
            except BaseException as error:
                self._errors.append(error)
            finally:
                with self._done:
                    self._remaining -= 1
                    if not self._remaining:
                        self._done.notify()
        return run

    def wait(self) -> None:
        with self._done:
            while self._remaining:
                self._done.wait()
        self._give_back()
        if self._errors:
            raise self._errors[0]

    def finish(self) -> None:
        """Waits for every call, through further Ctrl-Cs: the caller's
        buffers must outlive the calls."""
        while True:
            try:
                with self._done:
                    while self._remaining:
                        self._done.wait()
                break
            except KeyboardInterrupt:
                continue
        self._give_back()

    def _give_back(self) -> None:
        if not self._given_back:
            self._given_back = True
            self._pool.give_back(self._workers, len(self._workers))
