"""`EventTimer`: the GPU time of a sequence of launches, measured between
two CUDA events with the host's queueing kept out of the window, hot or
with the L2 cleared (cold); and CUDA-graph capture of such a sequence.
"""

from __future__ import annotations

import statistics
import time

from . import probes
from .cuda_driver import _check, load_module, stream_handle
from .cuda_launch import _Parameters


class EventTimer:
    """GPU time of `enqueue(stream)`: the median milliseconds of `repeats`
    timed runs after `warmup` untimed ones, on a stream of its own.

    The window between the two CUDA events holds GPU work only: before
    each timed run a spin kernel (`etc.runtime.probes`) keeps the GPU busy
    for longer than the host takes to queue the events and the run, so the
    host's launch calls (10-20 us of Python for a program's three kernels)
    are not inside it. `cold=True` also clears the L2 before each run (a
    memset over twice its size, queued before the start event), so that
    weights are read from device memory, not from what the previous run
    left in the cache; `cold=False` (hot) times back-to-back runs over the
    same buffers. After each call `gap_us` is the median time the GPU
    waited between the spin's end and the start event beyond the flush
    (about 0 when the spin covered the host's queueing)."""

    #: The spin's floor and ceiling (nanoseconds).
    MIN_SPIN_NS, MAX_SPIN_NS = 50_000, 20_000_000

    def __init__(self, driver, repeats: int, warmup: int = 5):
        self.driver, self.repeats, self.warmup = driver, repeats, warmup
        self.stream = _check(driver, "cuStreamCreate", driver.cuStreamCreate(0))
        self.start = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        self.end = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        self.ready = _check(driver, "cuEventCreate", driver.cuEventCreate(0))
        module, _ = load_module(driver, probes.PTX)
        self._spin = _check(driver, "cuModuleGetFunction",
                            driver.cuModuleGetFunction(module, b"etc_spin"))
        self._flush = None
        self.gap_us = 0.0

    def spin(self, stream, nanoseconds: int) -> None:
        """Queues the spin kernel (one thread, `nanoseconds` long) on `stream`."""
        parameters = _Parameters([int(nanoseconds)])
        _check(self.driver, "cuLaunchKernel(etc_spin)", self.driver.cuLaunchKernel(
            self._spin, 1, 1, 1, 1, 1, 1, 0, stream_handle(stream),
            parameters.pointer_array(), 0))

    def flush(self, stream) -> None:
        """Queues a write of twice the L2's size, which evicts what it held."""
        d = self.driver
        if self._flush is None:
            device = _check(d, "cuDeviceGet", d.cuDeviceGet(0))
            l2 = int(_check(d, "cuDeviceGetAttribute", d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device)))
            nbytes = max(2 * l2, 1 << 20)
            self._flush = (_check(d, "cuMemAlloc", d.cuMemAlloc(nbytes)), nbytes)
        pointer, nbytes = self._flush
        _check(d, "cuMemsetD8Async", d.cuMemsetD8Async(pointer, 0, nbytes, stream))

    def _elapsed(self, first, second) -> float:
        return float(_check(self.driver, "cuEventElapsedTime",
                            self.driver.cuEventElapsedTime(first, second)))

    def _start(self, spin_ns: int, cold: bool) -> None:
        """Queues on the timer's stream what comes before a timed run: the
        spin, the `ready` event, the L2 flush when `cold`, the `start`
        event."""
        d, stream = self.driver, self.stream
        self.spin(stream, spin_ns)
        _check(d, "cuEventRecord", d.cuEventRecord(self.ready, stream))
        if cold:
            self.flush(stream)
        _check(d, "cuEventRecord", d.cuEventRecord(self.start, stream))

    def __call__(self, enqueue, repeats: int | None = None, cold: bool = False) -> float:
        d, stream = self.driver, self.stream
        for _ in range(self.warmup):
            enqueue(stream)
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        # How long the host takes to queue one timed run: the spin lasts
        # several times that.
        began = time.perf_counter()
        if cold:
            self.flush(stream)
        _check(d, "cuEventRecord", d.cuEventRecord(self.start, stream))
        enqueue(stream)
        _check(d, "cuEventRecord", d.cuEventRecord(self.end, stream))
        host_ns = (time.perf_counter() - began) * 1e9
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        spin = int(min(max(4 * host_ns, self.MIN_SPIN_NS), self.MAX_SPIN_NS))
        flush_ms = 0.0
        if cold:  # the flush alone, so that the gap excludes it
            self._start(spin, True)
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(self.start))
            flush_ms = self._elapsed(self.ready, self.start)
        times, gaps = [], []
        for _ in range(repeats or self.repeats):
            self._start(spin, cold)
            enqueue(stream)
            _check(d, "cuEventRecord", d.cuEventRecord(self.end, stream))
            _check(d, "cuEventSynchronize", d.cuEventSynchronize(self.end))
            times.append(self._elapsed(self.start, self.end))
            gaps.append(max(self._elapsed(self.ready, self.start) - flush_ms, 0.0))
        self.gap_us = statistics.median(gaps) * 1000
        return statistics.median(times)

    def within(self, enqueue, budget_ms: float = 2000.0, cold: bool = False) -> float:
        """Like calling the timer, with as many repeats (3 to `repeats`) as
        fit in `budget_ms`, judged from one timed call: for slow kernels."""
        first = max(self(enqueue, repeats=1, cold=cold), 1e-3)
        return self(enqueue, repeats=max(3, min(self.repeats, int(budget_ms / first))),
                    cold=cold)

    def graph(self, enqueue):
        """`enqueue` captured once as a CUDA graph; returns a launcher.
        Raises RuntimeError naming the call that failed when the driver
        cannot capture it (e.g. a cooperative launch)."""
        d = self.driver
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        _check(d, "cuStreamBeginCapture", d.cuStreamBeginCapture(self.stream, mode))
        try:
            enqueue(self.stream)
        finally:
            graph = d.cuStreamEndCapture(self.stream)
        graph = _check(d, "cuStreamEndCapture", graph)
        executable = _check(d, "cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
        return lambda stream: _check(d, "cuGraphLaunch", d.cuGraphLaunch(executable,
                                                                         stream_handle(stream)))
