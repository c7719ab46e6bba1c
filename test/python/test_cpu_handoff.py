"""The CPU runtime's native hand-off (`etc.runtime.workers`): between runs
the worker threads wait in the program's park loop, in native code, and a
run reaches them through their mailboxes, with no Python code between the
call and the tiles. The mailbox layout mirrors
lib/Conversion/EventToCPU/WorkerPool.h."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from mlir import ir

import etc
from etc import pipeline
from etc.compiler import compile_module
from etc.runtime import layout, workers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kit"))
from families import HANG, hang_signature  # noqa: E402


def mlp(name: str = "mlp", hidden: int = 64, ffn: int = 96) -> etc.Graph:
    g = etc.Graph(name)
    B = g.symbol("B")
    x = g.input("x", (B, hidden), "f32")
    w1, w2 = g.input("w1", (hidden, ffn), "f32"), g.input("w2", (ffn, hidden), "f32")
    g.output(g.matmul(g.silu(g.matmul(x, w1)), w2))
    return g


def mlp_inputs(batch: int, seed: int, hidden: int = 64, ffn: int = 96) -> dict:
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((batch, hidden)).astype(np.float32),
                w1=(rng.standard_normal((hidden, ffn)) * 0.1).astype(np.float32),
                w2=(rng.standard_normal((ffn, hidden)) * 0.1).astype(np.float32))


@pytest.fixture(scope="module")
def mlp_kernel():
    return etc.compile(mlp(), target="cpu", workers=2)


def _idle_workers() -> list:
    with workers._pool._lock:
        return list(workers._pool._idle)


def test_the_python_layout_mirrors_the_header():
    """etc.runtime.workers must agree with WorkerPool.h, and its mailbox
    structure with the offsets."""
    header = (ROOT / "lib" / "Conversion" / "EventToCPU" / "WorkerPool.h").read_text()
    constants = dict(re.findall(r"constexpr int(?:64|32)_t k(\w+) = (-?\d+);", header))
    assert len(constants) == 16, constants
    for name, value in constants.items():
        python = re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()
        assert getattr(workers, python) == int(value), name
    for field, *_ in workers._Mailbox._fields_:
        assert getattr(workers._Mailbox, field).offset == getattr(workers, f"{field.upper()}_OFFSET")
    assert ctypes.sizeof(workers._Mailbox) <= workers.MAILBOX_BYTES


def test_the_lowered_program_has_the_pool_entry_points(mlp_kernel):
    lowered = mlp_kernel.ir("lowered")
    for name in ("_mlir_ciface_mlp_park", "_mlir_ciface_mlp_launch",
                 "_mlir_ciface_mlp_worker_packed"):
        assert re.search(rf"llvm\.func @{name}\(", lowered), name


def test_workers_wait_in_native_code_between_runs(mlp_kernel):
    """After the first run each worker thread entered the park loop once,
    and many runs later it has not come back to Python; idle, the threads
    block (they use no CPU time) instead of spinning."""
    args = mlp_inputs(5, seed=1)
    (want,) = etc.reference.evaluate(mlp(), **args)
    mlp_kernel.runtime.adapt_workers = False
    mlp_kernel.run(**args)
    parked = {worker: worker.parks for worker in _idle_workers() if worker.entry is not None}
    assert len(parked) >= 2
    for _ in range(300):
        (got,) = mlp_kernel.run(**args)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert {worker: worker.parks for worker in parked} == parked
    assert workers.busy() == 0
    before = {worker: worker.cpu_seconds for worker in parked}
    time.sleep(0.3)
    spent = max(worker.cpu_seconds - before[worker] for worker in parked)
    assert spent < 0.05, f"an idle worker thread ran {spent:.3f} s in 0.3 s"


def test_runs_from_two_threads_on_two_kernels(mlp_kernel):
    """Two Python threads run two kernels at once, many times: each run
    takes its own threads, and every result is right."""
    other = etc.compile(mlp("other", hidden=32, ffn=48), target="cpu", workers=3)
    jobs = [(mlp_kernel, mlp(), mlp_inputs(3, seed=2)),
            (other, mlp("other", hidden=32, ffn=48), mlp_inputs(7, seed=3, hidden=32, ffn=48))]

    def runs(kernel, graph, args):
        (want,) = etc.reference.evaluate(graph, **args)
        for _ in range(100):
            (got,) = kernel.run(**args)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    with ThreadPoolExecutor(len(jobs)) as pool:
        for future in [pool.submit(runs, *job) for job in jobs]:
            future.result()
    assert workers.busy() == 0


def test_python_calls_and_native_runs_share_the_threads(mlp_kernel):
    """A Python call on a thread parked in native code brings it back to
    Python first; the next native run parks it again."""
    args = mlp_inputs(4, seed=4)
    (want,) = etc.reference.evaluate(mlp(), **args)
    mlp_kernel.runtime.adapt_workers = False
    mlp_kernel.run(**args)
    seen: list = []
    run = workers.Run(2)
    run.start([lambda: seen.append(threading.get_ident())] * 2)
    run.wait()
    assert len(seen) == 2
    (got,) = mlp_kernel.run(**args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert workers.busy() == 0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux sched_setaffinity and at least 2 usable cores")
def test_a_run_alone_on_every_core_pins_its_parked_threads(monkeypatch):
    """The caller pins the threads parked in native code (they run no
    Python to pin themselves): one per core for a run alone with as many
    workers as cores on an idle machine, and unpinned otherwise."""
    from etc.runtime import cpu
    monkeypatch.setattr(cpu, "JOIN_BELOW_NS", 0)  # every worker on a pool thread
    monkeypatch.delenv("ETC_PIN_WORKERS", raising=False)
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: False)
    workers.forget_decisions()  # decided once per load sample
    cores = sorted(os.sched_getaffinity(0))
    kernel = etc.compile(mlp("pinned"), target="cpu", workers=len(cores))
    kernel.runtime.adapt_workers = False
    args = mlp_inputs(3, seed=6)

    def masks() -> list:
        # A run alone takes the lowest-numbered idle threads.
        threads = sorted(_idle_workers(), key=lambda worker: worker.number)[:len(cores)]
        assert all(worker.entry is not None for worker in threads)
        return [frozenset(os.sched_getaffinity(worker.thread.native_id)) for worker in threads]
    kernel.run(**args)
    assert masks() == [frozenset({core}) for core in cores]
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: True)
    workers.forget_decisions()  # decided once per load sample
    (got,) = kernel.run(**args)
    assert masks() == [frozenset(cores)] * len(cores)
    np.testing.assert_allclose(got, etc.reference.evaluate(mlp("pinned"), **args)[0],
                               rtol=1e-4, atol=1e-4)


def test_a_watchdog_error_leaves_the_threads_parked(mlp_kernel):
    options = pipeline.Options(target="cpu", workers=2, watchdog=0.3)
    module = ir.Module.parse(HANG, ir.Context())
    pipeline.run_stage(module, "scheduled",
                       "builtin.module(event-static-schedule{workers=2 check=false})")
    hanging = compile_module(module, hang_signature(), options, stage="scheduled")
    hanging.runtime.adapt_workers = False
    with pytest.raises(layout.WatchdogError, match="hang: watchdog: task"):
        hanging.run(x=np.ones(8, np.float32))
    assert workers.busy() == 0
    args = mlp_inputs(2, seed=5)
    (got,) = mlp_kernel.run(**args)
    np.testing.assert_allclose(got, etc.reference.evaluate(mlp(), **args)[0], rtol=1e-4,
                               atol=1e-4)


def test_parked_threads_leave_at_exit():
    """At exit every idle thread leaves its park loop (finalization frees
    the JIT code it waits in); the process exits cleanly."""
    script = r"""
import numpy as np
import etc
from etc.runtime import workers
g = etc.Graph("exit")
B = g.symbol("B")
x = g.input("x", (B, 32))
g.output(g.exp(x))
kernel = etc.compile(g, target="cpu", workers=2)
kernel.runtime.adapt_workers = False
kernel.run(x=np.zeros((3, 32), np.float32))
idle = list(workers._pool._idle)
assert idle and all(w.entry is not None for w in idle)
workers._unpark_idle_threads()
assert all(w.entry is None for w in idle)
kernel.run(x=np.zeros((3, 32), np.float32))  # parked again
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stdout + proc.stderr


def _spy_on_the_caller(runtime) -> list:
    """Records (worker id, worker count) of every worker the calling thread
    runs itself in `runtime`'s runs (`run_interruptible(join=True)`)."""
    entry = runtime._pool_entry
    call, joined = entry.call, []

    def recorded(arguments, worker, count):
        joined.append((worker, count))
        return call(arguments, worker, count)
    entry.call = recorded
    return joined


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_a_short_run_joins_its_workers(schedule, count):
    """Once a run at a binding has taken less than JOIN_BELOW_NS, the next
    runs there have the caller run the last worker itself (ids 0 .. count-2
    on the pool's threads; with one worker no thread is woken at all), with
    the same results; the first run, whose time is unknown, does not."""
    from etc.runtime import cpu
    kernel = etc.compile(mlp(f"joined_{schedule}_{count}"), target="cpu", workers=count,
                         schedule=schedule)
    kernel.runtime.adapt_workers = False
    joined = _spy_on_the_caller(kernel.runtime)
    args = mlp_inputs(9, seed=7)
    (want,) = etc.reference.evaluate(mlp(f"joined_{schedule}_{count}"), **args)
    threads_before = len(workers._pool._all)
    for run in range(20):
        (got,) = kernel.run(**args)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert workers.busy() == 0
    assert joined and set(joined) == {(count - 1, count)}
    assert len(joined) >= 15  # a few slow runs (a loaded machine) may wait instead
    (got,) = kernel.run(**{**args, "x": args["x"][:4]})  # a new binding: unknown, not joined
    np.testing.assert_allclose(got, want[:4], rtol=1e-4, atol=1e-4)
    assert len(joined) <= 20
    if count == 1:
        assert len(workers._pool._all) == threads_before  # no thread needed
    assert cpu.JOIN_BELOW_NS == workers.SLICE_NS


def test_a_run_slower_than_the_bound_does_not_join(monkeypatch):
    from etc.runtime import cpu
    monkeypatch.setattr(cpu, "JOIN_BELOW_NS", 0)
    kernel = etc.compile(mlp("slow"), target="cpu", workers=2)
    kernel.runtime.adapt_workers = False
    joined = _spy_on_the_caller(kernel.runtime)
    for _ in range(5):
        kernel.run(**mlp_inputs(3, seed=8))
    assert joined == []


@pytest.fixture
def always_joined(monkeypatch):
    """Every run joins its workers, the first one too."""
    from etc.runtime import cpu
    run = cpu.run_interruptible

    def joining(*args, **options):
        return run(*args, **{**options, "join": True})
    monkeypatch.setattr(cpu, "run_interruptible", joining)


def test_a_joined_run_that_hangs_names_the_task(always_joined):
    """The caller's own worker is stopped by the watchdog as the threads'
    are: the error names the task, and no thread stays busy."""
    options = pipeline.Options(target="cpu", workers=2, watchdog=0.3)
    module = ir.Module.parse(HANG, ir.Context())
    pipeline.run_stage(module, "scheduled",
                       "builtin.module(event-static-schedule{workers=2 check=false})")
    hanging = compile_module(module, hang_signature(), options, stage="scheduled")
    hanging.runtime.adapt_workers = False
    joined = _spy_on_the_caller(hanging.runtime)
    with pytest.raises(layout.WatchdogError, match="hang: watchdog: task"):
        hanging.run(x=np.ones(8, np.float32))
    assert joined == [(1, 2)]
    assert workers.busy() == 0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux sched_setaffinity and at least 2 usable cores")
def test_a_joined_run_alone_pins_its_threads_off_the_callers_core(monkeypatch, always_joined):
    """A joined run with a worker per core claims the machine: its pool
    threads are pinned to the cores the caller is not on when it starts."""
    monkeypatch.delenv("ETC_PIN_WORKERS", raising=False)
    monkeypatch.setattr(workers._pool.others, "busy", lambda cores: False)
    workers.forget_decisions()  # decided once per load sample
    cores = sorted(os.sched_getaffinity(0))
    kernel = etc.compile(mlp("joined_pins"), target="cpu", workers=len(cores))
    kernel.runtime.adapt_workers = False
    args = mlp_inputs(3, seed=9)
    want = etc.reference.evaluate(mlp("joined_pins"), **args)[0]
    for here in (cores[0], cores[-1]):  # where the caller is said to run
        monkeypatch.setattr(workers, "current_cpu", lambda: here)
        (got,) = kernel.run(**args)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        threads = sorted(_idle_workers(), key=lambda worker: worker.number)[:len(cores) - 1]
        masks = [frozenset(os.sched_getaffinity(worker.thread.native_id)) for worker in threads]
        assert masks == [frozenset({core}) for core in cores if core != here]
