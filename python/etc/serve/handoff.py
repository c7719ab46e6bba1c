"""Outputs handed from the engine's thread to the server's event loop in
batches: one wake-up of the loop for all the outputs a step delivers
(instead of one `call_soon_threadsafe`, a write to the loop's self-pipe and
a callback each), so that the loop wakes once per step and takes the GIL
once, not once per request, while the engine's thread prepares its next
step."""

from __future__ import annotations

import asyncio
import threading
import weakref

__all__ = ["Handoff"]


class Handoff:
    """Items put by any thread into asyncio queues of one event loop.
    `put` appends to a list; the put that finds it empty schedules one
    callback on the loop (`call_soon_threadsafe`), which moves everything
    put until it runs into the queues, in the order put. `wakeups` counts
    the callbacks scheduled. It holds the loop weakly (the server keeps
    one per loop, by loop, weakly too)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._pending: list = []
        #: Callbacks scheduled on the loop so far.
        self.wakeups = 0

    def put(self, queue: asyncio.Queue, item) -> None:
        """Hands `item` to `queue` on the loop (from any thread). Raises
        RuntimeError when the loop is closed (the item is dropped)."""
        with self._lock:
            self._pending.append((queue, item))
            if len(self._pending) > 1:
                return  # a callback is scheduled and has not run yet
            self.wakeups += 1
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the event loop is gone")
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nothing will take them
            with self._lock:
                self._pending.clear()
            raise

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, item in pending:
            queue.put_nowait(item)
