"""The CPU runtime's parked worker threads (`etc.runtime.workers`): reuse
between runs, errors, pinning to cores, runs from several threads, fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import etc
from etc.runtime import workers

needs_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux sched_setaffinity and at least 2 usable cores")


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The pinning tests below judge the rule, not the machine they run on:
    others' load is what each test says (none unless it says otherwise)."""
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: False)
    workers.forget_decisions()  # made once per sample of the load


def _record(out: list, key: int):
    def call():
        out[key] = (threading.current_thread().ident, frozenset(os.sched_getaffinity(0)))
    return call


def _run(count: int) -> list:
    out: list = [None] * count
    run = workers.Run(count)
    run.start([_record(out, i) for i in range(count)])
    run.wait()
    return out


def test_threads_are_reused_and_none_stays_busy():
    first = [ident for ident, _ in _run(2)]
    second = [ident for ident, _ in _run(2)]
    assert len(set(first)) == 2
    assert first == second
    assert workers.busy() == 0
    assert threading.get_ident() not in first


def test_a_calls_error_is_raised_after_all_calls_returned():
    finished = []

    def fails():
        raise ValueError("tile 3 failed")

    def slow():
        threading.Event().wait(0.05)
        finished.append(True)

    run = workers.Run(2)
    run.start([fails, slow])
    with pytest.raises(ValueError, match="tile 3 failed"):
        run.wait()
    assert finished == [True]
    assert workers.busy() == 0
    assert len(_run(2)) == 2  # the threads still work


@needs_affinity
def test_a_run_alone_on_every_core_pins_each_worker_to_its_own(monkeypatch):
    monkeypatch.delenv("ETC_PIN_WORKERS", raising=False)
    cores = sorted(os.sched_getaffinity(0))
    masks = [mask for _, mask in _run(len(cores))]
    assert masks == [frozenset({core}) for core in cores]


@needs_affinity
def test_fewer_workers_than_cores_are_not_pinned(monkeypatch):
    monkeypatch.delenv("ETC_PIN_WORKERS", raising=False)
    everywhere = frozenset(os.sched_getaffinity(0))
    _run(len(everywhere))  # pinned first, then unpinned below
    assert [mask for _, mask in _run(len(everywhere) - 1)] == [everywhere] * (len(everywhere) - 1)


@needs_affinity
def test_pinning_can_be_turned_off(monkeypatch):
    everywhere = frozenset(os.sched_getaffinity(0))
    _run(len(everywhere))  # pinned first, then unpinned below
    monkeypatch.setenv("ETC_PIN_WORKERS", "0")
    workers.forget_decisions()  # else read with the next sample of the load
    assert [mask for _, mask in _run(len(everywhere))] == [everywhere] * len(everywhere)


@needs_affinity
def test_more_workers_than_cores_are_not_pinned():
    everywhere = frozenset(os.sched_getaffinity(0))
    _run(len(everywhere))
    masks = [mask for _, mask in _run(len(everywhere) + 1)]
    assert masks == [everywhere] * (len(everywhere) + 1)


@needs_affinity
def test_a_run_beside_another_is_not_pinned():
    everywhere = frozenset(os.sched_getaffinity(0))
    count = len(everywhere)
    _run(count)  # pins the first threads
    release = threading.Event()
    blocker = workers.Run(1)
    blocker.start([lambda: release.wait(10)])
    try:
        assert [mask for _, mask in _run(count)] == [everywhere] * count
    finally:
        release.set()
        blocker.wait()


@needs_affinity
def test_a_run_is_not_pinned_while_others_keep_the_cores_busy(monkeypatch):
    """A pinned worker cannot move to a free core while another process
    holds its own: runs are pinned only while others leave the cores idle."""
    monkeypatch.delenv("ETC_PIN_WORKERS", raising=False)
    everywhere = frozenset(os.sched_getaffinity(0))
    count = len(everywhere)
    assert [mask for _, mask in _run(count)] == [frozenset({c}) for c in sorted(everywhere)]
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: True)
    workers.forget_decisions()  # else decided once per load sample
    assert [mask for _, mask in _run(count)] == [everywhere] * count
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: False)
    workers.forget_decisions()
    assert [mask for _, mask in _run(count)] == [frozenset({c}) for c in sorted(everywhere)]


def test_others_load_is_the_cores_busy_time_less_the_workers(monkeypatch):
    clock = [100.0]
    busy = [50.0]
    ours = [3.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: busy[0]))
    # Another process runs now: the windows' measurements stand (IDLE_GAP).
    monkeypatch.setattr(workers.OtherLoad, "others_runnable", staticmethod(lambda: 1))
    load = workers.OtherLoad(lambda: ours[0])
    assert not load.busy([0, 1])  # the first sample: nothing to compare with
    # 1 s later: the cores ran 1.5 s, of which the workers 1.4 s.
    clock[0], busy[0], ours[0] = 101.0, 51.5, 4.4
    assert not load.busy([0, 1]) and load.cores == pytest.approx(0.1)
    # Within the window the last answer holds.
    clock[0], busy[0] = 101.1, 60.0
    assert not load.busy([0, 1])
    # Another process kept a core busy beside the workers.
    clock[0], busy[0], ours[0] = 102.0, 53.4, 5.3
    assert load.busy([0, 1]) and load.cores == pytest.approx(1.0)


def test_others_load_after_an_idle_gap_is_what_runs_now(monkeypatch):
    """A window longer than IDLE_GAP measured others while this process
    was idle (another engine's burst between two of ours): when nothing
    else is runnable now, others want no core; when something is (a
    process that keeps spinning), the measurement stands."""
    clock, busy, ours, runnable = [100.0], [50.0], [3.0], [0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: busy[0]))
    monkeypatch.setattr(workers.OtherLoad, "others_runnable", staticmethod(lambda: runnable[0]))
    load = workers.OtherLoad(lambda: ours[0])
    load.busy([0, 1])
    # 0.3 s (a steady window): others ran 0.6 s of it.
    clock[0], busy[0] = 100.3, 50.6
    assert load.busy([0, 1]) and load.cores == pytest.approx(2.0)
    # 1 s idle while another process ran both cores, and it has stopped.
    clock[0], busy[0] = 101.3, 52.6
    assert not load.busy([0, 1]) and load.cores == 0.0
    # 1 s idle beside a process that still spins: its two cores stand.
    clock[0], busy[0], runnable[0] = 102.3, 54.6, 2
    assert load.busy([0, 1]) and load.cores == pytest.approx(2.0)
    # Unknown (no /proc/stat): the measurement stands too.
    clock[0], busy[0], runnable[0] = 103.3, 56.6, None
    assert load.busy([0, 1]) and load.cores == pytest.approx(2.0)


def test_others_runnable_reads_proc_stat():
    import os
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    assert isinstance(workers.OtherLoad.others_runnable(), int)


def test_others_load_is_what_they_want_not_what_they_got(monkeypatch):
    """Others' busy time is divided by the share of a core the workers got
    while runnable: a thread spinning beside two workers on two cores gets
    two thirds of a core, as each worker does, and wants a whole one."""
    clock, busy, ours = [100.0], [50.0], [3.0]
    queue = [(3.0, 1.0)]  # the workers' (ran, waited) seconds
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: busy[0]))
    # Another process runs now: the windows' measurements stand (IDLE_GAP).
    monkeypatch.setattr(workers.OtherLoad, "others_runnable", staticmethod(lambda: 1))
    load = workers.OtherLoad(lambda: ours[0], lambda: queue[0])
    assert not load.busy([0, 1])
    # 1 s: the cores ran 2 s, the workers 4/3 s, waiting 2/3 s for a core.
    clock[0], busy[0], ours[0], queue[0] = 101.0, 52.0, 3.0 + 4 / 3, (3.0 + 4 / 3, 1.0 + 2 / 3)
    assert load.busy([0, 1]) and load.cores == pytest.approx(1.0)
    # The workers never waited: others got what they wanted (1.5 - 1.2 s).
    clock[0], busy[0], ours[0], queue[0] = 102.0, 53.5, 5.5 + 1 / 30, (5.5 + 1 / 30, 1.0 + 2 / 3)
    load.busy([0, 1])
    assert load.cores == pytest.approx(0.3)
    # The workers were runnable for too short a time (1 ms) to judge their
    # share, though they waited half of it: none is applied.
    clock[0], busy[0], ours[0], queue[0] = 103.0, 54.0, 5.5 + 1 / 30 + 0.0005, \
        (5.5 + 1 / 30 + 0.0005, 1.0 + 2 / 3 + 0.0005)
    assert load.busy([0, 1]) and load.cores == pytest.approx(0.4995)
    # Unknown run-queue times (no schedstat): the busy time alone.
    load = workers.OtherLoad(lambda: ours[0], lambda: None)
    load.busy([0, 1])
    clock[0], busy[0], ours[0] = 104.0, 55.0, ours[0] + 0.3
    load.busy([0, 1])
    assert load.cores == pytest.approx(0.7)


def test_a_share_is_bounded_below():
    load = workers.OtherLoad(lambda: 0.0, lambda: None)
    assert load.share((0.0, 0.0), (0.01, 0.99)) == workers.OtherLoad.MIN_SHARE
    assert load.share((0.0, 0.0), (0.3, 0.1)) == pytest.approx(0.75)
    assert load.share(None, (0.3, 0.1)) == 1.0


def test_the_run_queue_times_are_read_from_schedstat():
    """This thread's schedstat: it has run; a thread that has ended (or never
    was) counts nothing."""
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("needs /proc/<pid>/task/<tid>/schedstat (Linux, CONFIG_SCHED_INFO)")
    me = threading.get_native_id()
    ran, waited = workers.OtherLoad.run_queue_seconds([me])
    assert ran > 0 and waited >= 0
    assert workers.OtherLoad.run_queue_seconds([]) == (0, 0)
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    again = workers.OtherLoad.run_queue_seconds([me, ended.native_id])
    assert again[0] >= ran


def test_the_cores_busy_time_is_read_from_proc_stat():
    if not os.path.exists("/proc/stat"):
        pytest.skip("needs /proc/stat")
    first = workers.OtherLoad.busy_seconds([0])
    threading.Event().wait(0.05)
    assert 0 < first <= workers.OtherLoad.busy_seconds([0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_workers():
    g = etc.Graph("fork")
    B = g.symbol("B")
    x = g.input("x", (B, 32))
    g.output(g.exp(x))
    kernel = etc.compile(g, target="cpu", workers=2)
    x = np.zeros((3, 32), np.float32)
    kernel.run(x=x)  # the parent's threads exist now
    pid = os.fork()
    if pid == 0:  # the child: its copy of the idle list must not be used
        signal.alarm(60)  # a wake-up of a thread the child lacks would hang
        try:
            (y,) = kernel.run(x=x)
            os._exit(0 if np.all(y == 1) and workers.busy() == 0 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_runs_of_one_kernel_from_several_threads_do_not_share_buffers():
    """Each run takes its own workspace (intermediates, counters) and its
    own worker threads, so concurrent runs of one kernel at the same sizes
    all give their own results."""
    g = etc.Graph("concurrent")
    B = g.symbol("B")
    x = g.input("x", (B, 64))
    w = g.input("w", (64, 128))
    g.output(g.add(g.matmul(g.exp(g.scale(x, 0.1)), w), g.matmul(x, w)))
    kernel = etc.compile(g, target="cpu", workers=2)
    rng = np.random.default_rng(5)
    wv = rng.standard_normal((64, 128)).astype(np.float32)
    inputs = [rng.standard_normal((33, 64)).astype(np.float32) for _ in range(4)]
    expected = [etc.reference.evaluate(g, x=xv, w=wv)[0] for xv in inputs]
    failures: list = []

    def runs(index: int) -> None:
        try:
            for _ in range(25):
                (got,) = kernel.run(x=inputs[index], w=wv)
                np.testing.assert_allclose(got, expected[index], rtol=1e-4, atol=1e-4)
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=runs, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]
    assert workers.busy() == 0


def test_freed_workspaces_are_built_again():
    g = etc.Graph("free")
    B = g.symbol("B")
    x = g.input("x", (B, 16))
    g.output(g.exp(g.exp(x)))
    kernel = etc.compile(g, target="cpu", workers=2)
    xs = np.zeros((3, 16), np.float32)
    kernel.run(x=xs)
    runtime = kernel.runtime
    (kept,) = runtime._workspaces.values()
    kernel.run(x=xs)
    assert list(runtime._workspaces.values()) == [kept]  # reused
    runtime.free_workspaces()
    assert not runtime._workspaces
    (y,) = kernel.run(x=xs)
    np.testing.assert_allclose(y, np.e, rtol=1e-6)
    assert list(runtime._workspaces.values()) != [kept]


def test_a_run_dropped_before_its_calls_started_gives_its_threads_back():
    run = workers.Run(2)
    assert workers.busy() == 2
    del run
    assert workers.busy() == 0


def test_a_run_uses_the_cores_others_leave_free(monkeypatch):
    """`run_workers`: the compiled count, but no more than the cores others
    leave free, rounded to the nearest core, and at least one."""
    monkeypatch.setenv("ETC_ADAPT_WORKERS", "1")
    others = workers._pool.others
    for cores, load, count, expected in [(2, 0.1, 2, 2), (2, 0.7, 2, 1), (2, 1.0, 2, 1),
                                         (2, 1.9, 2, 1), (4, 1.2, 4, 3), (4, 1.2, 2, 2),
                                         (4, 3.6, 4, 1), (2, 0.0, 1, 1)]:
        monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(others, "cores", load)
        workers.forget_decisions()  # else decided once per load sample
        assert workers.run_workers(count) == expected, (cores, load, count)
    monkeypatch.setenv("ETC_ADAPT_WORKERS", "0")
    assert workers.run_workers(2) == 2


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_a_kernel_computes_the_same_on_fewer_workers(monkeypatch, schedule):
    """The worker count is a run-time argument: a kernel compiled for 3
    workers gives the same bits on 1, 2 or 3, and its tiles run only on
    the workers the run used."""
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "f32")
    w1, w2 = g.input("w1", (384, 128), "f32"), g.input("w2", (128, 384), "f32")
    g.output(g.matmul(g.silu(g.matmul(x, w1, transpose_b=True)), w2, transpose_b=True))
    rng = np.random.default_rng(3)
    args = dict(x=rng.standard_normal((5, 128), dtype=np.float32),
                w1=rng.standard_normal((384, 128), dtype=np.float32) * 0.05,
                w2=rng.standard_normal((128, 384), dtype=np.float32) * 0.05)
    kernel = etc.compile(g, workers=3, schedule=schedule, trace=True)
    kernel.runtime.adapt_workers = True
    results, tiles = {}, set()
    for count in (3, 1, 2):
        monkeypatch.setattr(workers, "run_workers", lambda n, count=count: count)
        results[count] = kernel.run(**args)[0]
        assert kernel.runtime.last_workers == count
        assert {e.worker for e in kernel.trace.events} <= set(range(count))
        tiles.add(len(kernel.trace.events))
        assert len({(e.task, e.tile) for e in kernel.trace.events}) == len(kernel.trace.events)
    assert len(tiles) == 1  # every tile ran once, whatever the count
    np.testing.assert_array_equal(results[1], results[3])
    np.testing.assert_array_equal(results[2], results[3])
    np.testing.assert_allclose(results[3], etc.reference.evaluate(g, **args)[0], rtol=1e-5,
                               atol=1e-5)


@needs_affinity
def test_beside_a_busy_process_a_run_leaves_it_a_core(monkeypatch):
    """With a process spinning on the machine, a run that could use every
    core uses at most all but one (measured from /proc/stat, as runs do)."""
    monkeypatch.setenv("ETC_ADAPT_WORKERS", "1")
    others = workers._pool.others
    monkeypatch.setattr(others, "busy", workers.OtherLoad.busy.__get__(others))
    cores = len(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        deadline = time.monotonic() + 5
        used = workers.run_workers(cores)
        while used > cores - 1 and time.monotonic() < deadline:
            time.sleep(workers.OtherLoad.WINDOW)
            used = workers.run_workers(cores)
        assert used <= cores - 1, f"others kept {others.cores:.2f} cores busy"
    finally:
        spinner.kill()
        spinner.wait()


def test_the_threads_that_start_runs_are_not_others(monkeypatch):
    """A thread that starts runs waits while they run: its own work between
    runs (a compile, a step's host work) is not load that takes cores from
    the workers, also after the thread has ended; and a sample older than
    MAX_AGE starts a new window instead of averaging over the gap, and the
    last measurement stands until that window ends."""
    pool = workers._Pool()
    busy, clock = [10.0], [100.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: busy[0]))
    # Another process runs now: the windows' measurements stand (IDLE_GAP).
    monkeypatch.setattr(workers.OtherLoad, "others_runnable", staticmethod(lambda: 1))
    registered, worked, release = threading.Event(), threading.Event(), threading.Event()
    # The thread lives until its CPU clock has been read (a thread that has
    # ended has no clock: ProcessLookupError).
    finish = threading.Event()

    def caller():
        pool.caller()
        registered.set()
        release.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.05:  # 50 ms of this thread's work
            pass
        worked.set()
        finish.wait()

    thread = threading.Thread(target=caller)
    thread.start()
    registered.wait()
    assert not pool.others.busy([0, 1])  # first sample
    release.set()
    worked.wait()
    used = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    clock[0], busy[0] = 100.5, 10.0 + used  # the machine was busy with that work only
    pool.others.busy([0, 1])
    assert pool.others.cores == pytest.approx(0.0, abs=0.02)
    finish.set()
    thread.join()
    clock[0], busy[0] = 101.0, 10.0 + used  # the thread has ended: still not others
    pool.others.busy([0, 1])
    assert pool.others.cores == pytest.approx(0.0, abs=0.02)
    clock[0], busy[0] = 101.5, 10.5 + used  # half a core of someone else's work
    pool.others.busy([0, 1])
    assert pool.others.cores == pytest.approx(1.0, abs=0.02)
    clock[0], busy[0] = 110.0, 20.0  # 8.5 s later: a new window, not averaged over the gap;
    assert pool.others.busy([0, 1])  # the last measurement stands until it ends
    assert pool.others.cores == pytest.approx(1.0, abs=0.02)
    clock[0] = 110.5  # nobody else worked in it
    assert not pool.others.busy([0, 1]) and pool.others.cores == pytest.approx(0.0, abs=0.02)


def test_the_worker_count_is_decided_once_per_load_sample(monkeypatch):
    """`run_workers` looks at the cores and the load once per sample of the
    load (`OtherLoad.WINDOW`), not at every run; a new sample, or
    `forget_decisions`, decides again."""
    monkeypatch.setenv("ETC_ADAPT_WORKERS", "1")
    others = workers._pool.others
    looks = []
    monkeypatch.setattr(workers.os, "sched_getaffinity",
                        lambda pid: looks.append(pid) or {0, 1})
    clock = [1000.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(others, "_sample", None)
    monkeypatch.setattr(others, "busy", workers.OtherLoad.busy.__get__(others))
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: 1.0))
    monkeypatch.setattr(others, "cores", 1.2)
    workers.forget_decisions()
    assert workers.run_workers(2) == 1
    monkeypatch.setattr(others, "cores", 0.1)  # as a new sample would find
    assert [workers.run_workers(2) for _ in range(5)] == [1] * 5
    assert len(looks) == 1
    clock[0] += workers.OtherLoad.WINDOW  # the next sample is due
    assert workers.run_workers(2) == 2
    assert len(looks) == 2
    workers.forget_decisions()
    workers.run_workers(2)
    assert len(looks) == 3
