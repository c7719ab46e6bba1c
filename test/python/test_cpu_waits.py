"""The CPU target's waits: a wait polls for the run's spin budget, then
blocks in the kernel (a futex wait) until the notify that readies its
counter wakes it, so that a waiting worker gives its core to the producer
it waits for; runs with more workers than free cores finish."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from mlir import ir

import etc
from etc import pipeline
from etc.compiler import compile_module
from etc.runtime import layout
from etc.runtime.abi import Argument
from etc.runtime.cpu import DEFAULT_SPIN_MICROSECONDS

#: One long tile ("produce": a chain of n * 20000 dependent multiply-adds)
#: that every tile of "consume" waits for: with two workers, worker 1 waits
#: on its first tile for as long as worker 0 computes.
SLOW = """
event.graph @slow(%n: index, %x: memref<?xf32>, %y: memref<?xf32>,
                  %t: memref<1xf32> {event.intermediate}) {
  %c1 = arith.constant 1 : index
  %e = event.alloc(%c1) count(%c1) : !event.tensor<?>
  event.task "produce" grid(%c1)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%t : memref<1xf32> (d0) -> (d0) [1])
      notifies(%e : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %step = arith.constant 1 : index
    %per = arith.constant 20000 : index
    %iterations = arith.muli %n, %per : index
    %v = memref.load %x[%i] : memref<?xf32>
    %decay = arith.constant 0.999 : f32
    %sum = scf.for %k = %c0 to %iterations step %step iter_args(%acc = %v) -> (f32) {
      %scaled = arith.mulf %acc, %decay : f32
      %next = arith.addf %scaled, %v : f32
      scf.yield %next : f32
    }
    memref.store %sum, %t[%i] : memref<1xf32>
  }
  event.task "consume" grid(%n)
      reads(%t : memref<1xf32> (d0) -> (0) [1], %x : memref<?xf32> (d0) -> (d0) [1])
      writes(%y : memref<?xf32> (d0) -> (d0) [1])
      waits(%e : !event.tensor<?> (d0) -> (0)) {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %s = memref.load %t[%c0] : memref<1xf32>
    %v = memref.load %x[%i] : memref<?xf32>
    %w = arith.addf %s, %v : f32
    memref.store %w, %y[%i] : memref<?xf32>
  }
}
"""

SLOW_SIGNATURE = SimpleNamespace(
    name="slow",
    arguments=[Argument("symbol", "n", (), "index"), Argument("input", "x", ("n",), "f32"),
               Argument("output", "y", ("n",), "f32"),
               Argument("intermediate", "t", (1,), "f32")],
    outputs=["y"])


def _slow_expected(x: np.ndarray) -> np.ndarray:
    acc = np.float32(x[0])
    decay = np.float32(0.999)
    for _ in range(len(x) * 20000):
        acc = np.float32(acc * decay + x[0])
    return acc + x


@pytest.fixture(scope="module")
def slow_kernel():
    options = pipeline.Options(target="cpu", workers=2, schedule="static")
    module = ir.Module.parse(SLOW, ir.Context())
    return compile_module(module, SLOW_SIGNATURE, options, stage="event")


def _cpu_seconds(threads) -> dict:
    return {t.name: time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads}


def _worker_cpu(runtime, x) -> tuple[list[float], np.ndarray]:
    """Runs once, and returns the CPU seconds each worker thread used in the
    run (largest first) and the output."""
    runtime.run({"x": x})  # the workers exist now
    threads = [t for t in threading.enumerate() if t.name.startswith("etc-worker")]
    before = _cpu_seconds(threads)
    (y,) = runtime.run({"x": x})
    after = _cpu_seconds(threads)
    return sorted((after[n] - before[n] for n in before), reverse=True), y


def test_a_waiting_worker_blocks_instead_of_spinning(slow_kernel):
    """Worker 1 waits for worker 0's long tile: past its spin budget it
    sleeps in the kernel, so it uses a small part of the CPU time worker 0
    computes for (with the polling wait it used as much: it span alongside)."""
    runtime = slow_kernel.runtime
    x = np.full(2000, 0.5, np.float32)  # 4e7 multiply-adds: tens of ms
    seconds, y = _worker_cpu(runtime, x)
    np.testing.assert_allclose(y, x + y[0] - x[0], rtol=0)
    producer, *waiters = seconds
    assert producer > 0.01, seconds
    assert max(waiters) < 0.2 * producer, seconds


def test_polling_for_the_whole_wait_when_the_budget_says_so(slow_kernel):
    """The spin budget is the runtime's: a budget longer than the wait keeps
    the waiting worker polling (the fastest answer when every worker has a
    core), which the test above tells apart by its CPU time."""
    runtime = slow_kernel.runtime
    runtime.spin_microseconds = 10_000_000
    # A polling waiter gets the CPU the machine gives it: beside other busy
    # processes (a loaded test machine) it may get less than its producer
    # in one run (0.039 s against 0.081 s once, at load 5 on 2 cores), so
    # the best of three runs must show it.
    tries = []
    try:
        for _ in range(3):
            seconds, _ = _worker_cpu(runtime, np.full(2000, 0.5, np.float32))
            producer, *waiters = seconds
            tries.append(seconds)
            if max(waiters) > 0.5 * producer:
                break
        else:
            pytest.fail(f"the polling waiter never ran half as long as its producer: {tries}")
    finally:
        runtime.spin_microseconds = DEFAULT_SPIN_MICROSECONDS


def test_the_result_is_right_for_every_spin_budget(slow_kernel):
    runtime = slow_kernel.runtime
    x = np.linspace(-1, 1, 50).astype(np.float32)
    expected = _slow_expected(x)
    try:
        for budget in (0, 1, DEFAULT_SPIN_MICROSECONDS, 100_000):
            runtime.spin_microseconds = budget
            (y,) = runtime.run({"x": x})
            np.testing.assert_allclose(y, expected, rtol=1e-5)
    finally:
        runtime.spin_microseconds = DEFAULT_SPIN_MICROSECONDS


def test_the_spin_budget_is_checked(slow_kernel, monkeypatch):
    runtime = slow_kernel.runtime
    for bad in (-1, 2**31, 1.5, True):
        with pytest.raises(ValueError, match=r"spin_microseconds=.* must be an int from 0 to"):
            runtime.spin_microseconds = bad
    from etc.runtime import cpu

    monkeypatch.setenv("ETC_SPIN_US", "7")
    assert cpu.default_spin_microseconds() == 7
    monkeypatch.setenv("ETC_SPIN_US", "soon")
    with pytest.raises(ValueError, match=r"ETC_SPIN_US='soon' must be a number of microseconds"):
        cpu.default_spin_microseconds()


def test_no_worker_is_counted_asleep_after_a_run(slow_kernel):
    runtime = slow_kernel.runtime
    runtime.spin_microseconds = 0
    try:
        x = np.ones(400, np.float32)
        runtime.run({"x": x})
        workspace = runtime._workspaces[(400,)]
        assert workspace.header[layout.SLEEPERS_WORD] == 0
        assert workspace.header[layout.SPIN_MICROSECONDS_WORD] == 0
    finally:
        runtime.spin_microseconds = DEFAULT_SPIN_MICROSECONDS


#: A busy process on one core while the test runs.
_BUSY = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def busy_core():
    process = subprocess.Popen([sys.executable, "-c", _BUSY])
    try:
        yield
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_more_workers_than_free_cores_finish_with_the_right_result(schedule, busy_core):
    """Twelve workers on a machine whose cores are also taken by another
    busy process: waits whose producers are descheduled block, so the runs
    finish (within the watchdog's 5 s for every wait) and agree with NumPy."""
    g = etc.Graph("mlp")
    B = g.symbol("B")
    h = g.input("x", (B, 128))
    for layer in range(4):
        w = g.input(f"w{layer}", (128, 128))
        h = g.silu(g.matmul(h, w))
    g.output(h)
    kernel = etc.compile(g, target="cpu", workers=12, schedule=schedule)
    rng = np.random.default_rng(0)
    weights = {f"w{layer}": (rng.standard_normal((128, 128)) / 12).astype(np.float32)
               for layer in range(4)}
    for batch in (1, 5, 33):
        x = rng.standard_normal((batch, 128)).astype(np.float32)
        (y,) = kernel.run(x=x, **weights)
        np.testing.assert_allclose(y, etc.reference.evaluate(g, x=x, **weights)[0],
                                   rtol=1e-4, atol=1e-5)
