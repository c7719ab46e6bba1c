"""The CPU runtime's parked worker threads (`etc.runtime.workers`): reuse
between runs, errors, pinning to cores, runs from several threads, fork."""

from __future__ import annotations

import os
import signal
import threading

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
    assert [mask for _, mask in _run(count)] == [everywhere] * count
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: False)
    assert [mask for _, mask in _run(count)] == [frozenset({c}) for c in sorted(everywhere)]


def test_others_load_is_the_cores_busy_time_less_the_workers(monkeypatch):
    clock = [100.0]
    busy = [50.0]
    ours = [3.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(workers.OtherLoad, "busy_seconds", staticmethod(lambda cores: busy[0]))
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
