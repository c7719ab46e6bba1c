"""Traces of traced kernels (`etc.compile(..., trace=True)`).

Every run of a traced kernel records, for each tile task, the worker that
ran it, its task and tile, and two times on one clock shared by all workers
(CPU: `CLOCK_MONOTONIC`; GPU: `%globaltimer`, both in nanoseconds): `start`,
taken once its waits are satisfied, and `end`, taken before its notifies.
`kernel.trace` is the trace of the last run: `events`, and writers for
Chrome/Perfetto trace-event JSON and a Gantt chart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import layout


@dataclass(frozen=True)
class TraceEvent:
    """One tile task of a run: `start` and `end` in nanoseconds of the
    device's clock."""

    worker: int
    task: str
    tile: tuple
    start: int
    end: int

    @property
    def duration(self) -> int:
        return self.end - self.start


class Trace:
    """The trace of one run (see the module docstring)."""

    def __init__(self, kernel: str, target: str, events: list[TraceEvent], workers: int):
        self.kernel = kernel
        self.target = target
        self._events: list[TraceEvent] | None = sorted(events, key=lambda e: (e.start, e.worker))
        #: Workers of the run (some may have run nothing).
        self.workers = workers
        #: A decoded run's records and ABI, until `events` is first read.
        self._records: np.ndarray | None = None
        self._abi = None

    @property
    def events(self) -> list[TraceEvent]:
        """One record per tile task that ran, ordered by start time."""
        if self._events is None:
            self._events = sorted(self._decode(self._abi, self._records),
                                  key=lambda e: (e.start, e.worker))
            self._records = self._abi = None
        return self._events

    @classmethod
    def decode(cls, abi, counters: np.ndarray, workers: int) -> "Trace":
        """The trace in a counter buffer after a run (its run header says
        where the records are). Only the records are copied now: the events
        are made when first read (making them took about 0.15 ms of a run
        of a few hundred tiles, which a benchmark that times traced runs
        paid at every run)."""
        counters = np.asarray(counters, np.int32)
        header = layout.header(counters)
        offset = int(header[layout.TRACE_OFFSET_WORD])
        count = int(header[layout.TRACE_COUNT_WORD])
        trace = cls(abi.name, abi.target, [], workers)
        trace._records = counters[offset:offset + count * layout.TRACE_RECORD_WORDS].copy()
        trace._abi = abi
        trace._events = None
        return trace

    @staticmethod
    def _decode(abi, records: np.ndarray) -> list[TraceEvent]:
        """The events of a run's trace `records` (int32 words)."""
        count = len(records) // layout.TRACE_RECORD_WORDS
        records = records.reshape(count, layout.TRACE_RECORD_WORDS).astype(np.int64)
        words = records & 0xFFFFFFFF
        start = words[:, layout.TRACE_START_WORD] | (words[:, layout.TRACE_START_WORD + 1] << 32)
        end = words[:, layout.TRACE_END_WORD] | (words[:, layout.TRACE_END_WORD + 1] << 32)
        events = []
        for index in np.nonzero(end)[0]:  # a stopped run leaves records at 0
            row = records[index]
            task = abi.tasks[int(row[layout.TRACE_TASK_WORD])]
            rank = min(task.grid_rank, layout.MAX_RECORD_RANK)
            tile = tuple(int(v) for v in row[layout.TRACE_TILE_WORDS:layout.TRACE_TILE_WORDS + rank])
            events.append(TraceEvent(int(row[layout.TRACE_WORKER_WORD]), task.name, tile,
                                     int(start[index]), int(end[index])))
        return events

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        span = (self.events[-1].end - self.events[0].start) / 1e3 if self.events else 0.0
        return f"<Trace {self.kernel}: {len(self.events)} tile tasks, {span:.1f} µs>"

    # -- writers -------------------------------------------------------------

    def to_perfetto(self) -> dict:
        """Chrome/Perfetto trace-event JSON (as a dict): one complete event
        ("ph": "X") per tile task, one track (thread) per worker, times in
        microseconds from the first start."""
        origin = min((e.start for e in self.events), default=0)
        unit = "CTA" if self.target == "cuda" else "worker"
        records = [{"name": "process_name", "ph": "M", "pid": 0,
                    "args": {"name": f"{self.kernel} ({self.target})"}}]
        for worker in range(self.workers):
            records.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": worker,
                            "args": {"name": f"{unit} {worker}"}})
        for e in self.events:
            records.append({"name": e.task, "cat": "tile", "ph": "X", "pid": 0, "tid": e.worker,
                            "ts": (e.start - origin) / 1e3, "dur": (e.end - e.start) / 1e3,
                            "args": {"tile": list(e.tile)}})
        return {"traceEvents": records, "displayTimeUnit": "ns"}

    def save_perfetto(self, path) -> None:
        """Writes `to_perfetto()` to `path` (open it in ui.perfetto.dev or
        chrome://tracing)."""
        Path(path).write_text(json.dumps(self.to_perfetto()))

    def save_png(self, path, *, title: str | None = None) -> None:
        """Draws a Gantt chart to `path` with matplotlib: a row per worker, a
        colour per task, time in microseconds from the first start."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise ImportError("Trace.save_png needs matplotlib (pip install matplotlib); "
                              "save_perfetto needs nothing") from error
        origin = min((e.start for e in self.events), default=0)
        tasks = list(dict.fromkeys(e.task for e in self.events))
        colours = plt.get_cmap("tab20")
        figure, axes = plt.subplots(figsize=(12, max(2.0, 0.3 * self.workers + 1.2)))
        for index, task in enumerate(tasks):
            spans = [((e.start - origin) / 1e3, max(e.duration / 1e3, 1e-3), e.worker)
                     for e in self.events if e.task == task]
            for worker in sorted({w for _, _, w in spans}):
                axes.broken_barh([(s, d) for s, d, w in spans if w == worker],
                                 (worker - 0.4, 0.8), color=colours(index % 20),
                                 label=task if worker == min(w for _, _, w in spans) else None)
        axes.set_xlabel("µs")
        axes.set_ylabel("worker")
        axes.set_ylim(-0.6, self.workers - 0.4)
        axes.invert_yaxis()
        axes.set_title(title or f"{self.kernel} ({self.target}): {len(self.events)} tile tasks")
        if tasks:
            axes.legend(loc="upper right", fontsize="small", ncols=min(len(tasks), 4))
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)
