"""The host threads that run CPU programs' workers, kept between runs.

Starting a Python thread costs tens to hundreds of microseconds (the new
thread must take the GIL to say it has started), and a run of a CPU program
started one per worker: at decode sizes that was more than the program's
own work (2 workers: 0.6 ms of thread starts for 0.8 ms of tiles on a 2-core
machine). Instead, the process keeps idle worker threads; a run takes as
many as it has workers, hands each its call, and waits for them; then they
go back to the idle set for the next run of any program. Runs from several
Python threads at once take disjoint workers (more threads are started when
none is idle).

Native hand-off: Python threads waking each other through locks (and the
GIL each must take to return from one call and make the next) cost about
110 us from a run's call to its first tile and 130 us from its last tile
back to the caller, a quarter of a decode-shaped MLP's run. So the threads
wait in native code: each thread has a *mailbox* and parks in the program's
`_mlir_ciface_<g>_park` loop (lib/Conversion/EventToCPU/WorkerPool.h), and
a run (`Run.launch`) writes the program's packed worker and its argument
block into the mailboxes and calls the program's `launch`, which bumps each
mailbox's generation (a futex wake for a thread that sleeps) and waits for
the run's pending count to reach zero (a futex wait the last worker wakes),
all with the GIL released: no Python code runs between the call and the
first tile, nor between the last tile and the caller. The park loop and
the launcher come with every lowered program (a saved artifact has them
where only NumPy is installed) and are generic: a thread parked in one
program's loop runs any program's workers, and keeps the code of the
program it parked in alive (`Entry.owner`) for as long as it lives. Python
callables (`Run.start`) still run on the same threads: a thread parked in
native code is told to leave first. At exit every parked thread leaves, so
that none is woken inside code that finalization has freed.

The caller may join (`Run(count, joined=True)`; `etc.runtime.cpu`
decides, for runs known to be short): the pool's threads run worker ids
0 .. count-1 and the calling thread the last id itself, between `launch`
(which then only hands the run over) and `wait`; pinned, the threads get
the cores the caller is not on.

Waits on the calling thread stay interruptible: the launcher waits for at
most SLICE_NS at a time and returns to Python, which runs its signal
handlers; a Ctrl-C while a run waits raises in the caller, which stops the
workers' spins (see `CPURuntime.run`) and then waits for every worker's
call to return with `finish`, so no worker writes into buffers its caller
has let go of.

Pinning: when a run is the only one in the process, has exactly as many
workers as the process may use cores (it claims the machine), and nothing
else has kept those cores busy lately, worker i of the run is pinned to the
i-th of those cores (Linux `sched_setaffinity`), and unpinned again for a
run that does not qualify. Unpinned, the scheduler often queued the second
worker behind the first on one core of a 2-core machine while the other
core ran the waiting caller: the second worker began 140 us late and the
decode MLP's run took 0.94 ms instead of 0.59-0.72 ms. But a pinned worker
cannot move to a core that is free while another thread holds its own: with
one other busy process on a 2-core machine, pinned workers kept 2% of their
speed. So the pool watches the machine (`OtherLoad`: the busy time of the
process's cores in /proc/stat minus what its workers ran, over the share of
a core the workers got while runnable, sampled at most every 0.2 s) and
pins only while others want less than a quarter of a core. Both this
decision and the worker count (below) are made once per sample of the
load and reused by the runs until the next (`_Pool.decisions`). With fewer
workers than cores the scheduler has idle cores to spread them over, and
pinning would pile the workers of several processes onto the same first
cores, so they are not pinned. `ETC_PIN_WORKERS=0` in the
environment turns pinning off.

Worker count: a program's worker count is a run-time value (each worker is
called with its id and the count; both schedules spread the tiles over the
workers that run), so a run may use fewer workers than the program was
compiled for. `run_workers` gives the count a run should use: the
compiled count, but no more than the cores the others do not want
(rounded to the nearest whole core). Beside one busy process on a 2-core
machine, two workers share two cores with it: each gets two thirds of a
core, and whenever the one holding the last tile of a step's stage is
descheduled, the other waits for it; one worker has a core of its own.
Measured on the 135 M model's decode: 2 workers beside a busy process gave
0.96x of 1 worker's tokens/s. `ETC_ADAPT_WORKERS=0` in the environment turns this off
(every run uses the compiled count).

A child made by `os.fork` starts with no idle threads (the parent's are not
copied).

This module needs only the standard library (ctypes for the native calls).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence

#: Thread names: "etc-worker-<n>", n counting the threads this process started.
NAME = "etc-worker"


def pinning_enabled() -> bool:
    """Whether runs may pin their workers to cores (`ETC_PIN_WORKERS`,
    read once per sample of the load: see `_Pool.decisions`)."""
    return os.environ.get("ETC_PIN_WORKERS", "1") != "0" and hasattr(os, "sched_setaffinity")


def adapting_enabled() -> bool:
    """Whether runs may use fewer workers than compiled (`ETC_ADAPT_WORKERS`)."""
    return os.environ.get("ETC_ADAPT_WORKERS", "1") != "0"


# The mailbox and the run's done block, in bytes
# (lib/Conversion/EventToCPU/WorkerPool.h; test_cpu_handoff.py checks that
# they agree).
GENERATION_OFFSET = 0
SLEEPERS_OFFSET = 4
SERVED_OFFSET = 8
COMMAND_OFFSET = 12
FUNCTION_OFFSET = 16
ARGUMENTS_OFFSET = 24
WORKER_OFFSET = 32
WORKER_COUNT_OFFSET = 40
RUN_OFFSET = 48
IDLE_SPIN_OFFSET = 56
MAILBOX_BYTES = 64
COMMAND_RUN = 0
COMMAND_LEAVE = 1
PENDING_OFFSET = 0
RUN_SLEEPERS_OFFSET = 4
RUN_BYTES = 8

#: Nanoseconds a launcher waits before it returns to Python, which then
#: runs its signal handlers (Ctrl-C) and waits again.
SLICE_NS = 10_000_000
#: Nanoseconds an idle thread polls its mailbox before it blocks.
IDLE_SPIN_NS = 0


class _Mailbox(ctypes.Structure):
    _fields_ = [("generation", ctypes.c_int32), ("sleepers", ctypes.c_int32),
                ("served", ctypes.c_int32), ("command", ctypes.c_int32),
                ("function", ctypes.c_void_p), ("arguments", ctypes.c_void_p),
                ("worker", ctypes.c_int64), ("worker_count", ctypes.c_int64),
                ("run", ctypes.c_void_p), ("idle_spin", ctypes.c_int64)]


_PARK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
#: The packed worker: worker(arguments, worker_id, worker_count).
_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
#: launch(mailboxes, count, run, spin_ns, timeout_ns, command, function,
#: arguments, worker_count) -> the count left.
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64)


class Entry:
    """A program's native functions for the pool (WorkerPool.h): `worker`,
    the address of its packed worker `void (arguments, id, count)`; `park`
    and `launch`, the pool's loop and launcher in the same code (generic:
    one program's run every program's workers); `owner` keeps that code
    alive (the JIT engine, or the loaded library)."""

    def __init__(self, worker: int, park: int, launch: int, owner: object):
        self.worker = worker
        #: The packed worker as a call, for a caller that runs a share of
        #: the run itself (`Run.join`).
        self.call = _WORKER(worker)
        self.park = _PARK(park)
        self.launch = _LAUNCH(launch)
        self.owner = owner


class _Worker:
    """One parked thread. It waits either in Python (`_go`, for a Python
    call or a park loop to enter) or in a native park loop (`entry`), for a
    command in its mailbox."""

    def __init__(self, number: int):
        self._go = threading.Lock()
        self._go.acquire()
        #: Released when the thread has left a park loop.
        self._left = threading.Lock()
        self._left.acquire()
        self._job: Callable[[], None] | Entry | None = None
        # The mailbox on a cache line of its own, and on the next the done
        # block of the runs this thread is the first of: it lives as long
        # as the thread, since a worker may still read its sleepers word
        # after the caller has seen the count reach zero and returned.
        self._memory = ctypes.create_string_buffer(3 * MAILBOX_BYTES)
        base = ctypes.addressof(self._memory)
        self.address = (base + MAILBOX_BYTES - 1) // MAILBOX_BYTES * MAILBOX_BYTES
        self.mailbox = _Mailbox.from_address(self.address)
        self.run_block_address = self.address + MAILBOX_BYTES
        self.run_block = (ctypes.c_int32 * 2).from_address(self.run_block_address)
        self.mailbox.idle_spin = IDLE_SPIN_NS
        #: The entry whose park loop the thread waits in (None: in Python).
        self.entry: Entry | None = None
        #: How many times the thread has entered a park loop (runs reach a
        #: thread in one without Python).
        self.parks = 0
        self.number = number
        self._cpu_seconds = 0.0
        #: The cores this thread is pinned to (None: not pinned).
        self.pinned: frozenset | None = None
        self.thread = threading.Thread(target=self._loop, name=f"{NAME}-{number}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            if isinstance(job, Entry):
                # The GIL is released until a leave command: `job` keeps the
                # loop's code alive meanwhile.
                job.park(self.address)
                self._left.release()
            else:
                job()

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds this thread has run (read by `OtherLoad`)."""
        try:
            self._cpu_seconds = time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))
        except (AttributeError, OSError):  # no thread CPU clocks here
            pass
        return self._cpu_seconds

    def pin(self, cores: frozenset | None) -> None:
        """Lets the thread run on `cores` only (None: wherever the process
        may run)."""
        if cores == self.pinned:
            return
        try:
            # Unpinning gives back the process's cores.
            os.sched_setaffinity(self.thread.native_id,
                                 cores if cores is not None else os.sched_getaffinity(os.getpid()))
            self.pinned = cores
        except OSError:  # a core taken away meanwhile: run wherever allowed
            self.pinned = None

    def park(self, entry: Entry) -> None:
        """Makes the thread wait for commands in its mailbox in a park loop
        (`entry`'s, unless it waits in one already)."""
        if self.entry is None:
            self.entry = entry
            self.parks += 1
            self._job = entry
            self._go.release()

    def unpark(self) -> None:
        """Brings the thread back to Python from its park loop (if it waits
        in one), and waits until it is there (also through Ctrl-Cs, which
        are raised afterwards: a thread told to leave must be seen to)."""
        if self.entry is None:
            return
        done = (ctypes.c_int32 * 2)()  # nobody pending: the launch returns at once
        mailboxes = (ctypes.c_void_p * 1)(self.address)
        self.entry.launch(mailboxes, 1, done, 0, 0, COMMAND_LEAVE, None, None, 0)
        interrupted = None
        while True:
            try:
                self._left.acquire()
                break
            except KeyboardInterrupt as error:
                interrupted = error
        self.entry = None
        if interrupted is not None:
            raise interrupted

    def start(self, call: Callable[[], None]) -> None:
        """Runs the Python callable `call` on the thread."""
        self.unpark()
        self._job = call
        self._go.release()


class OtherLoad:
    """How many cores' worth of the process's cores other threads (other
    processes, or this process's threads that are not workers) want lately:
    the cores' busy time in /proc/stat minus the CPU time of the workers,
    over windows of at least WINDOW seconds, divided by the share of a core
    the workers got while they were runnable (their run-queue time, from
    /proc/self/task/<tid>/schedstat).

    The busy time alone is what others got, not what they wanted: a process
    that spins beside two workers on two cores gets two thirds of a core
    (the scheduler shares the cores fairly among the three runnable
    threads), and a window in which runs took two workers made it look
    smaller than it is (beside a busy process, 3 and 4 of 102 decode steps
    at B = 8 ran on two workers; with the share, none). Under a fair
    scheduler every runnable thread gets the share the workers got, so
    others' busy time over that share is what they would have run on
    cores of their own."""

    #: Seconds between two samples.
    WINDOW = 0.2
    #: Others' cores above which runs are not pinned.
    LIMIT = 0.25
    #: Seconds after which the last sample is not averaged with now: the
    #: next window starts afresh instead of averaging over the whole gap
    #: (e.g. another program's whole burst of work while this process was
    #: idle), and the last measurement stands until that window ends. (It
    #: was reset to 0, "unknown": beside a busy process every run after a
    #: pause then took all the workers for 0.4 s, whose contention made the
    #: busy process look like less than half a core in the next window:
    #: 12 of 68 decode steps at B = 8 ran on 2 workers, 0.84x the speed of
    #: 1 worker.)
    MAX_AGE = 2.0
    #: Seconds without a sample after which this process is taken to have
    #: been idle: a window that long measured others while the workers did
    #: not run (e.g. another engine's burst of work between two of ours),
    #: so when nothing else is runnable now (`others_runnable`), others
    #: want no core. (Without it, decode at B = 1 alternating with
    #: llama.cpp's batches ran on one worker: 7.3 against 4.2 ms a step.)
    IDLE_GAP = 0.4
    #: Seconds the workers must have been runnable in a window for their
    #: share of a core to be judged (below it: a full share).
    MIN_RUNNABLE = 0.002
    #: The smallest share used (a bound on how far others' time is scaled).
    MIN_SHARE = 0.25

    def __init__(self, workers_cpu_seconds: Callable[[], float],
                 workers_run_queue: Callable[[], tuple | None] = lambda: None):
        self._workers_cpu_seconds = workers_cpu_seconds
        self._workers_run_queue = workers_run_queue
        self._lock = threading.Lock()
        self._sample: tuple | None = None
        #: The last measurement, in cores (0.0 until two samples exist).
        self.cores = 0.0

    @staticmethod
    def busy_seconds(cores) -> float | None:
        """Seconds the given cores were not idle since boot (/proc/stat),
        or None where that cannot be read."""
        try:
            with open("/proc/stat", "rb") as stat:
                lines = stat.read().split(b"\n")
        except OSError:
            return None
        wanted = {f"cpu{core}".encode() for core in cores}
        busy = 0
        for line in lines:
            if not line.startswith(b"cpu"):  # the "intr" line alone has thousands of fields
                continue
            fields = line.split()
            if fields[0] in wanted:
                # user nice system idle iowait irq softirq steal ...
                ticks = [int(f) for f in fields[1:9]]
                busy += sum(ticks) - ticks[3] - ticks[4]
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def run_queue_seconds(tids) -> tuple | None:
        """The seconds the threads `tids` of this process have run and
        have waited runnable for a core, summed (their schedstat), or None
        where that cannot be read. (Worker threads never end; one that has
        is skipped.)"""
        ran = waited = 0
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as stat:
                    fields = stat.read().split()
                ran += int(fields[0])
                waited += int(fields[1])
            except FileNotFoundError:
                continue
            except (OSError, ValueError, IndexError):
                return None
        return ran * 1e-9, waited * 1e-9

    def share(self, before: tuple | None, now: tuple | None) -> float:
        """The share of a core the workers got while runnable between two
        run-queue samples (1.0 when unknown or too short to judge)."""
        if before is None or now is None:
            return 1.0
        ran, waited = now[0] - before[0], now[1] - before[1]
        if ran < 0 or waited <= 0 or ran + waited < self.MIN_RUNNABLE:
            return 1.0
        return max(self.MIN_SHARE, ran / (ran + waited))

    def fresh_until(self) -> float:
        """The monotonic time until which `busy` answers from the last
        sample (0.0: none yet: it samples at its next call)."""
        sample = self._sample
        return 0.0 if sample is None else sample[0] + self.WINDOW

    def busy(self, cores) -> bool:
        """Whether others wanted more than LIMIT cores in the last window."""
        now = time.monotonic()
        with self._lock:
            if self._sample is not None and now - self._sample[0] < self.WINDOW:
                return self.cores > self.LIMIT
            busy = self.busy_seconds(cores)
            if busy is None:
                return False
            sample = (now, busy, self._workers_cpu_seconds(), self._workers_run_queue())
            if self._sample is not None and now - self._sample[0] <= self.MAX_AGE:
                elapsed = now - self._sample[0]
                others = (busy - self._sample[1]) - (sample[2] - self._sample[2])
                share = self.share(self._sample[3], sample[3])
                self.cores = max(others, 0.0) / elapsed / share
            if self._sample is not None and now - self._sample[0] > self.IDLE_GAP and \
                    self.others_runnable() == 0:
                self.cores = 0.0
            self._sample = sample
            return self.cores > self.LIMIT

    @staticmethod
    def others_runnable() -> int | None:
        """Threads runnable now besides the calling one (/proc/stat's
        procs_running less 1), or None where that cannot be read."""
        try:
            with open("/proc/stat", "rb") as stat:
                for line in stat:
                    if line.startswith(b"procs_running"):
                        return max(0, int(line.split()[1]) - 1)
        except (OSError, ValueError, IndexError):
            pass
        return None


def _number(worker: _Worker) -> int:
    return worker.number


class _Pool:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._numbers = itertools.count()
        #: Workers handed out and not yet given back.
        self.busy = 0
        #: The CPU-time clocks of the threads that started runs, by ident:
        #: a caller waits while its run's workers run, so its own work
        #: between runs (a step's host work, a compile) is not others' load.
        self._callers: dict[int, int] = {}
        self._last: dict[int, float] = {}
        self._retired = 0.0
        self._mailboxes: dict[tuple, ctypes.Array] = {}
        #: The decisions of `run_workers` and `_cores_for` (by kind and
        #: count): (until when they hold, the decision). They follow the
        #: load, which is sampled at most every `OtherLoad.WINDOW`, so they
        #: are made once per sample, not per run: at every run they took
        #: 3-6 us of the caller's hand-off (the affinity system call, the
        #: load's lock, the masks); the process's cores are looked at again
        #: with the next sample (or `forget_decisions`).
        self.decisions: dict[tuple, tuple] = {}
        self.others = OtherLoad(lambda: sum(w.cpu_seconds for w in list(self._all))
                                + self._callers_cpu_seconds(),
                                lambda: OtherLoad.run_queue_seconds(
                                    [w.thread.native_id for w in list(self._all)]))

    def caller(self) -> None:
        """Counts the calling thread's CPU time as the runs' own."""
        ident = threading.get_ident()
        if ident not in self._callers and hasattr(time, "pthread_getcpuclockid"):
            try:
                self._callers[ident] = time.pthread_getcpuclockid(ident)
            except OSError:
                pass

    def _callers_cpu_seconds(self) -> float:
        """The callers' CPU seconds, never decreasing: a thread that has
        ended counts with what it had run when last seen."""
        for ident, clock in list(self._callers.items()):
            try:
                self._last[ident] = time.clock_gettime(clock)
            except OSError:  # the thread has ended
                self._callers.pop(ident, None)
                self._retired += self._last.pop(ident, 0.0)
        return self._retired + sum(self._last.values())

    def take(self, count: int) -> tuple[list[_Worker], bool]:
        """`count` idle workers (started if need be), and whether no other
        run holds any."""
        with self._lock:
            alone = self.busy == 0
            # The lowest-numbered idle threads (the idle list is sorted).
            taken = self._idle[:count]
            del self._idle[:count]
            numbers = [next(self._numbers) for _ in range(count - len(taken))]
            self.busy += count
        try:
            for number in numbers:
                taken.append(_Worker(number))
                self._all.append(taken[-1])
        except BaseException:
            self.give_back(taken, count)
            raise
        # The same threads in the same order for runs alike: a pinned
        # thread keeps its core. (The idle list is sorted: only new
        # threads can be out of order.)
        if numbers:
            taken.sort(key=_number)
        return taken, alone

    def mailboxes(self, workers: list[_Worker]):
        """The C array of the mailboxes of `workers` that `launch` reads
        (kept per set of threads: threads never end, so it stays valid)."""
        key = tuple(worker.number for worker in workers)
        array = self._mailboxes.get(key)
        if array is None:
            array = (ctypes.c_void_p * len(workers))(*[worker.address for worker in workers])
            with self._lock:
                self._mailboxes[key] = array
        return array

    def give_back(self, workers: list[_Worker], count: int) -> None:
        with self._lock:
            idle = self._idle
            if workers and (not idle or workers[-1].number < idle[0].number):
                idle[:0] = workers  # the usual case: the lowest-numbered threads
            else:
                idle.extend(workers)
                idle.sort(key=_number)
            self.busy -= count


_pool = _Pool()


def _forget_threads() -> None:
    # In a forked child only the forking thread exists.
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


@atexit.register
def _unpark_idle_threads() -> None:
    # Finalization frees the code the threads' park loops run in (a JIT
    # engine): none may be woken inside it by a signal afterwards.
    with _pool._lock:
        idle = list(_pool._idle)
    for worker in idle:
        worker.unpark()


def busy() -> int:
    """How many worker threads are running a call now (0 once every run
    has returned, interrupted or not)."""
    return _pool.busy


def run_workers(count: int) -> int:
    """How many of a program's `count` workers a run should use now: at
    most the cores that others (other processes, and this process's threads
    that are not workers) left free lately, rounded to the nearest core,
    and at least one (see the module docstring)."""
    if count <= 1 or not adapting_enabled():
        return count
    key = ("adapt", count)
    known = _pool.decisions.get(key)
    if known is not None and time.monotonic() < known[0]:
        return known[1]
    try:
        cores = os.sched_getaffinity(os.getpid())
    except (AttributeError, OSError):
        return count
    _pool.caller()
    others = _pool.others
    others.busy(cores)  # samples at most every WINDOW seconds
    free = len(cores) - others.cores
    used = max(1, min(count, int(free + 0.5)))
    _pool.decisions[key] = (others.fresh_until(), used)
    return used


def forget_decisions() -> None:
    """Makes the next run decide its worker count and pinning afresh
    (see `_Pool.decisions`), e.g. after the process's cores changed."""
    _pool.decisions = {}


try:
    _sched_getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    _sched_getcpu.restype = ctypes.c_int
    _sched_getcpu.argtypes = []
except (AttributeError, OSError):  # not glibc / not Linux
    _sched_getcpu = None


def current_cpu() -> int | None:
    """The core the calling thread runs on now (None where unknown)."""
    if _sched_getcpu is None:
        return None
    cpu = _sched_getcpu()
    return cpu if cpu >= 0 else None


def _cores_for(count: int) -> list:
    """Per worker of a run alone in the process: the core to pin it to,
    or None for all (see the module docstring)."""
    key = ("pin", count)
    known = _pool.decisions.get(key)
    if known is not None and time.monotonic() < known[0]:
        return known[1]
    if not pinning_enabled():
        _pool.decisions[key] = (time.monotonic() + OtherLoad.WINDOW, [None] * count)
        return [None] * count
    # The process's cores (the calling thread's mask may be narrower).
    cores = os.sched_getaffinity(os.getpid())
    if count != len(cores) or _pool.others.busy(cores):
        masks = [None] * count
    else:
        masks = _pin_masks(frozenset(cores))
    _pool.decisions[key] = (_pool.others.fresh_until(), masks)
    return masks


@functools.lru_cache(maxsize=8)
def _pin_masks(cores: frozenset) -> tuple:
    """A mask of one core for each of `cores`, in order (kept: built at
    every pinned run, it took a microsecond of the caller's hand-off)."""
    return tuple(frozenset((core,)) for core in sorted(cores))


class Run:
    """One run on the worker threads: `Run(count)` takes `count` threads;
    then either `launch` starts a program's workers on them (native: see
    the module docstring) or `start(calls)` starts Python callables, one
    per thread; `wait` waits for all of them (interruptible) and re-raises
    the first error a Python call raised; `finish` waits after an
    interruption (not interruptible). Call `launch` or `start` inside the
    `try` whose handler calls `finish`: an interruption while the run is
    being started still leaves a run that `finish` can wait for.

    `joined=True`: the calling thread runs one more worker itself between
    `launch` and `wait` (see `etc.runtime.cpu.run_interruptible`), so the
    run claims `count + 1` cores: pinned, the threads get those of them
    the caller is not on now, and `launch` returns without waiting (a
    `count` of 0 is then a run of the caller alone)."""

    def __init__(self, count: int, joined: bool = False):
        self._pool = _pool
        self._joined = joined
        self._spin_ns = 0
        #: Python calls' completion (made by `start`: a native run needs none).
        self._done: threading.Condition | None = None
        # Counted down by the workers (not by the waiting thread, so that an
        # interruption cannot lose a count); only started calls count.
        self._remaining = 0
        self._errors: list[BaseException] = []
        #: A native run's entry, the first mailbox's generation before the
        #: launch and the count left.
        self._entry: Entry | None = None
        self._generation = 0
        self._left = 0
        self._pool.caller()
        self._workers, self._alone = self._pool.take(count)
        self._given_back = False
        #: A native run's done block (pending count, sleepers) and its address.
        self._run_block = self._workers[0].run_block if self._workers else None
        self._run_block_address = self._workers[0].run_block_address if self._workers else 0

    def _cores(self) -> list:
        count = len(self._workers)
        if not self._alone:
            return [None] * count
        if not self._joined:
            return _cores_for(count)
        cores = _cores_for(count + 1)
        if cores[0] is None:
            return [None] * count
        here = current_cpu()
        # The core the caller runs on is its own (it runs a worker there).
        return [core for core in cores if here not in core][:count] if \
            any(here in core for core in cores) else cores[:count]

    def launch(self, entry: Entry, arguments: int, worker_count: int | None = None,
               spin_ns: int = 0) -> None:
        """Starts `entry`'s packed worker on every thread of the run, the
        i-th with worker id i, reading its other arguments at the address
        `arguments`; `worker_count` is the count the workers are told (by
        default the run's thread count). Once one thread is left, the caller
        polls for its end for `spin_ns` before it blocks."""
        threads = len(self._workers)
        count = threads if worker_count is None else worker_count
        self._entry = entry
        if not threads:  # a joined run of the caller alone
            self._left = 0
            return
        self._spin_ns = spin_ns
        self._run_block[0] = threads
        for worker, cores in zip(self._workers, self._cores()):
            worker.pin(cores)
            worker.park(entry)
        mailboxes = self._pool.mailboxes(self._workers)
        self._generation = self._workers[0].mailbox.generation
        # Joined, the launcher only hands the run over (no time to wait):
        # `wait` waits, after the caller's own share.
        self._left = entry.launch(mailboxes, threads, self._run_block_address,
                                  spin_ns if threads > 1 else 0,
                                  0 if self._joined else SLICE_NS, COMMAND_RUN,
                                  entry.worker, arguments, count)

    def start(self, calls: Sequence[Callable[[], None]]) -> None:
        """Starts the Python callables `calls`, one per thread."""
        if len(calls) != len(self._workers):
            raise ValueError(f"{len(calls)} calls for a run of {len(self._workers)} workers")
        count = len(calls)
        self._done = threading.Condition(threading.Lock())
        with self._done:
            self._remaining = count
        started = 0
        try:
            for worker, call, cores in zip(self._workers, calls, self._cores()):
                worker.pin(cores)
                worker.start(self._wrap(call))
                started += 1
        except BaseException:
            # Interrupted between starts: the calls not started never count
            # down.
            with self._done:
                self._remaining -= count - started
            raise

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

    def _launched(self) -> bool:
        # Only a launch changes a mailbox's generation while a run holds it.
        return self._entry is not None and bool(self._workers) and \
            self._workers[0].mailbox.generation != self._generation

    def _wait_native(self) -> None:
        # Joined, the caller has done its share: the threads' last tiles
        # are likely near their end, so it polls (one thread left, as the
        # launcher polls for the last of its own run) before it blocks.
        spin = self._spin_ns if self._joined else 0
        while self._left:
            self._left = self._entry.launch(None, 0, self._run_block_address, spin, SLICE_NS,
                                            COMMAND_RUN, None, None, 0)

    def wait(self) -> None:
        if self._entry is not None:
            self._wait_native()
        elif self._done is not None:
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
                if self._launched():
                    self._left = 1  # the launcher's own (acquire) look decides
                    self._wait_native()
                elif self._done is not None:
                    with self._done:
                        while self._remaining:
                            self._done.wait()
                break
            except KeyboardInterrupt:
                continue
        self._give_back()

    def __del__(self) -> None:
        # A run dropped before its calls started (an interruption between
        # taking the threads and starting them): its threads are idle.
        if not getattr(self, "_given_back", True) and not self._remaining \
                and not self._launched():
            self._give_back()

    def _give_back(self) -> None:
        if not self._given_back:
            self._given_back = True
            self._pool.give_back(self._workers, len(self._workers))
