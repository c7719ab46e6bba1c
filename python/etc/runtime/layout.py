"""The run header and trace records of the counter buffer, as the runtimes
read them after a run (without MLIR). The header is the last HEADER_WORDS
words of the buffer; word numbers are relative to its start.

These numbers mirror `dialects/Event/IR/RunLayout.h`, which documents them;
`test_watchdog.py` checks that they agree. Changing them changes the
artifact format (`artifact.FORMAT_VERSION`).
"""

from __future__ import annotations

import numpy as np

STATUS_WORD = 0
CLAIM_WORD = 1
WORKER_WORD = 2
SITE_WORD = 3
TASK_WORD = 4
TILE_RANK_WORD = 5
TILE_WORDS = 6
EVENT_WORD = 10
ELEMENT_RANK_WORD = 11
ELEMENT_WORDS = 12
VALUE_WORD = 16
WAITED_MS_WORD = 17
TRACE_OFFSET_WORD = 18
TRACE_COUNT_WORD = 19
SLEEPERS_WORD = 20
SPIN_MICROSECONDS_WORD = 21
HEADER_WORDS = 22
MAX_RECORD_RANK = 4

RUNNING, WATCHDOG, INTERRUPTED = 0, 1, 2
SITE_WAIT, SITE_POP, SITE_BARRIER = 1, 2, 3
#: The roles of a tile's mbarriers in a SITE_BARRIER record's element.
BARRIER_FULL, BARRIER_EMPTY = 0, 1
BARRIER_ROLES = ("full", "empty")

TRACE_WORKER_WORD = 0
TRACE_TASK_WORD = 1
TRACE_TILE_WORDS = 2
TRACE_START_WORD = 6
TRACE_END_WORD = 8
TRACE_RECORD_WORDS = 10


class WatchdogError(RuntimeError):
    """A wait, queue pop or tile's barrier wait spun longer than the
    watchdog allows, so the run was stopped. Attributes: `kernel`,
    `worker`, `task` (name or None), `tile` (coordinates), `event` (name or
    None), `element` (coordinates; for a queue pop, `(slot,)`; for a
    barrier, `(stage, role, parity)` with role "full" or "empty"), `value`
    (the counter's last value; a barrier's low state word), `waited`
    (seconds), `site` ("wait", "pop" or "barrier")."""

    def __init__(self, message: str, **fields):
        super().__init__(message)
        for name, value in fields.items():
            setattr(self, name, value)


def _coordinates(header: np.ndarray, rank_word: int, first: int) -> tuple:
    rank = int(header[rank_word])
    kept = min(rank, MAX_RECORD_RANK)
    values = tuple(int(v) for v in header[first:first + kept])
    return values + (("...",) if rank > kept else ())


def _format(coordinates: tuple) -> str:
    return ", ".join(str(c) for c in coordinates)


def header(counters: np.ndarray) -> np.ndarray:
    """The run header of a counter buffer (a view of its last words)."""
    return counters[len(counters) - HEADER_WORDS:]


def watchdog_error(abi, header: np.ndarray) -> WatchdogError:
    """The error the record in `header` (the run header of a counter buffer
    after a run with status WATCHDOG) describes."""
    header = np.asarray(header, np.int32)
    worker = int(header[WORKER_WORD])
    waited = int(header[WAITED_MS_WORD]) / 1000
    value = int(header[VALUE_WORD])
    stop = ("; the run was stopped (raise the limit with etc.compile(..., watchdog=seconds) "
            "if the work is merely slow)")
    if int(header[SITE_WORD]) == SITE_POP:
        (slot, *_) = _coordinates(header, ELEMENT_RANK_WORD, ELEMENT_WORDS) or (None,)
        # An idle worker of the dynamic schedule on several ranks names no slot.
        where = "" if slot is None else f" (slot {slot})"
        message = (f"{abi.name}: watchdog: worker {worker} waited {waited:.1f} s for a task "
                   f"from the queue{where} that no finished task made ready: "
                   "an unbalanced program, or a task that never finished" + stop)
        return WatchdogError(message, kernel=abi.name, worker=worker, task=None, tile=(),
                             event=None, element=(slot,), value=value, waited=waited,
                             site="pop")
    task_index = int(header[TASK_WORD])
    event_index = int(header[EVENT_WORD])
    task = abi.tasks[task_index].name if 0 <= task_index < len(abi.tasks) else None
    if int(header[SITE_WORD]) == SITE_BARRIER:
        return _barrier_error(abi, header, worker, task, waited, value, stop)
    event = abi.events[event_index] if 0 <= event_index < len(abi.events) else None
    tile = _coordinates(header, TILE_RANK_WORD, TILE_WORDS)
    element = _coordinates(header, ELEMENT_RANK_WORD, ELEMENT_WORDS)
    if task and not tile and abi.tasks[task_index].grid_rank:
        # An idle worker's poll (the dynamic schedule on several ranks)
        # names the task, not its tile, when its wait has no closed form.
        where = f"a tile of task {task}"
    else:
        where = f"task {task} tile ({_format(tile)})" if task else f"worker {worker}"
    if event is not None:
        producers = ", ".join(event.notified_by) or "no task"
        what = f"event %{event.name} (notified by {producers})"
    else:
        what = "an event"
    message = (f"{abi.name}: watchdog: {where} waited {waited:.1f} s on {what} element "
               f"[{_format(element)}] = {value}; worker {worker}: a notify never came "
               "(an unbalanced program) or its producer is stuck" + stop)
    return WatchdogError(message, kernel=abi.name, worker=worker, task=task, tile=tile,
                         event=event.name if event else None, element=element, value=value,
                         waited=waited, site="wait")


def _barrier_error(abi, header: np.ndarray, worker: int, task, waited: float, value: int,
                   stop: str) -> WatchdogError:
    """The error of a lane that stalled on one of its tile's mbarriers
    (`event.stall`): the pipeline inside the tile is broken (an arrival
    that never came, or copies of fewer bytes than a stage expects)."""
    tile = _coordinates(header, TILE_RANK_WORD, TILE_WORDS)
    stage, role, parity = (int(v) for v in header[ELEMENT_WORDS:ELEMENT_WORDS + 3])
    role = BARRIER_ROLES[role] if 0 <= role < len(BARRIER_ROLES) else f"role-{role}"
    where = f"task {task} tile ({_format(tile)})" if task else f"worker {worker}"
    message = (f"{abi.name}: watchdog: {where} waited {waited:.1f} s on the {role} barrier of "
               f"stage {stage} for parity {parity} (barrier state 0x{value & 0xffffffff:08x}); "
               f"worker {worker}: the tile's pipeline lost an arrival or expects more bytes "
               "than its copies bring" + stop)
    return WatchdogError(message, kernel=abi.name, worker=worker, task=task, tile=tile,
                         event=None, element=(stage, role, parity), value=value, waited=waited,
                         site="barrier")


def check_header(abi, header: np.ndarray) -> None:
    """Raises what the run header says went wrong: WatchdogError, or
    KeyboardInterrupt for a run the host interrupted."""
    status = int(header[STATUS_WORD])
    if status == WATCHDOG:
        raise watchdog_error(abi, header)
    if status == INTERRUPTED:
        raise KeyboardInterrupt
    if status != RUNNING:
        raise RuntimeError(f"{abi.name}: the run header has an unknown status {status}")


#: What each non-zero status of g_check means.
CHECK_ERRORS = {
    1: "task queue overflow: more tasks were pushed than the queue holds "
       "(the program pushed some task twice)",
    2: "unbalanced events: some event counters did not reach zero; the program's "
       "notifies do not match its expected counts",
}
#: What the user can do about a g_check error.
_CHECK_ADVICE = ("; a program that passed ETC's schedule check never does this, so the "
                 "kernel was compiled with the check skipped or this is a compiler bug "
                 "(compile with trace=True to see which tasks ran, and report it)")


def check_count(abi, count: int) -> None:
    """Raises unless `count` counters (g_counters' answer) hold the run header."""
    if count < HEADER_WORDS:
        raise RuntimeError(f"{abi.name}: the program asks for {count} counters, fewer than its "
                           f"run header needs ({HEADER_WORDS}): it was not built by this ETC; "
                           "compile (and save) the kernel again with this version")


def check_status(abi, status: int) -> None:
    """Raises for a non-zero status of g_check (see `CHECK_ERRORS`)."""
    if status == 0:
        return
    if status in CHECK_ERRORS:
        raise RuntimeError(f"{abi.name}: {CHECK_ERRORS[status]}{_CHECK_ADVICE}")
    raise RuntimeError(f"{abi.name}: the end-of-run check returned unknown status {status}: the "
                       "kernel and this runtime disagree on the program format; compile (and "
                       "save) the kernel again with this version of ETC")
