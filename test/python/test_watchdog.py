"""The watchdog: every spin of a program is bounded, and a stuck run stops
and raises an error naming the task, tile, event tensor, element and its
counter instead of hanging. The programs here are hand-written event graphs
that notify too little, compiled with the schedule check skipped."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mlir import ir

import etc
from etc import pipeline
from etc.compiler import compile_module
from etc.runtime import layout

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kit"))
from families import HANG, hang_signature  # noqa: E402

SIGNATURE = hang_signature()


def hanging_kernel(schedule: str, watchdog: float, target: str = "cpu", workers: int = 2,
                   policy: str | None = None):
    """The HANG program, scheduled without the schedule check (the static
    schedule under `policy`, by default the target's)."""
    options = pipeline.Options(target=target, workers=workers, watchdog=watchdog, policy=policy)
    module = ir.Module.parse(HANG, ir.Context())
    scheduler = {"static": "event-static-schedule", "dynamic": "event-dynamic-schedule"}[schedule]
    chosen = f" policy={options.policy}" if schedule == "static" else ""
    pipeline.run_stage(module, "scheduled",
                       f"builtin.module({scheduler}{{workers={workers} check=false{chosen}}})")
    return compile_module(module, SIGNATURE, options, stage="scheduled")


def test_the_check_rejects_the_program_unless_skipped():
    module = ir.Module.parse(HANG, ir.Context())
    with pytest.raises(pipeline.PipelineError, match="cannot be proved equal to the number of notifies"):
        pipeline.run_stage(module, "scheduled",
                           "builtin.module(event-static-schedule{workers=2})")


#: CPU spin budgets: block at once, the default, poll for the whole wait.
SPINS = [0, None, 10_000_000]


def with_spin(kernel, spin):
    if spin is not None:
        kernel.runtime.spin_microseconds = spin
    return kernel


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("spin", SPINS)
@pytest.mark.parametrize("policy", pipeline.POLICIES)
def test_a_missing_notify_raises_within_the_timeout(workers, spin, policy):
    """Whether the waits poll or block (futex waits bounded by the time
    left), and whether the workers take the tiles round-robin or claim
    them, the first to time out stops the run."""
    kernel = with_spin(hanging_kernel("static", watchdog=0.4, workers=workers, policy=policy),
                       spin)
    start = time.monotonic()
    with pytest.raises(layout.WatchdogError) as caught:
        kernel.run(x=np.arange(6, dtype=np.float32))
    elapsed = time.monotonic() - start
    # It cannot fire before the timeout; the upper bound is a hang guard (a
    # loaded machine delays the waiters' wake-ups, not what they report).
    assert 0.4 <= elapsed < 0.4 + 30.0, elapsed
    error = caught.value
    message = str(error)
    assert re.search(r"hang: watchdog: task consume tile \(\d\) waited \d+\.\d s on event %e0 "
                     r"\(notified by produce\) element \[\d\] = 1; worker \d", message), message
    assert error.task == "consume" and error.event == "e0" and error.value == 1
    assert error.tile == error.element and 0 <= error.tile[0] < 6
    assert 0.4 <= error.waited < 30.4 and 0 <= error.worker < workers
    # The kernel is not broken by it: the same kernel stops the same way again.
    with pytest.raises(layout.WatchdogError):
        kernel.run(x=np.arange(2, dtype=np.float32))


@pytest.mark.parametrize("spin", SPINS)
def test_a_queue_that_never_fills_raises_within_the_timeout(spin):
    kernel = with_spin(hanging_kernel("dynamic", watchdog=0.3), spin)
    start = time.monotonic()
    with pytest.raises(layout.WatchdogError,
                       match=r"hang: watchdog: worker \d waited \d+\.\d s for a task from the queue "
                             r"\(slot \d\)") as caught:
        kernel.run(x=np.arange(4, dtype=np.float32))
    assert time.monotonic() - start < 0.3 + 30.0  # a hang guard
    assert caught.value.site == "pop" and caught.value.task is None


def test_saved_artifacts_keep_the_watchdog(tmp_path):
    kernel = hanging_kernel("static", watchdog=0.2)
    kernel.save(tmp_path / "hang.etc")
    loaded = etc.runtime.load(tmp_path / "hang.etc")
    assert loaded.abi.watchdog_ms == 200
    assert [t.name for t in loaded.abi.tasks] == ["produce", "consume"]
    with pytest.raises(layout.WatchdogError, match="task consume"):
        loaded.run(x=np.ones(3, np.float32))


def test_balanced_programs_are_not_stopped():
    g = etc.Graph("fine")
    B = g.symbol("B")
    g.output(g.silu(g.scale(g.input("x", (B, 64)), 2.0)))
    kernel = etc.compile(g, workers=8, watchdog=0.5)
    x = np.random.default_rng(0).standard_normal((200, 64)).astype(np.float32)
    np.testing.assert_allclose(kernel.run(x=x)[0], etc.reference.evaluate(g, x=x)[0], rtol=1e-5)


def test_watchdog_option_is_checked():
    with pytest.raises(ValueError, match="watchdog=0 must be a number of seconds"):
        etc.compile(etc.Graph("g"), watchdog=0)


def test_the_python_layout_mirrors_the_header():
    """etc.runtime.layout must agree with dialects/Event/IR/RunLayout.h."""
    header = (ROOT / "dialects" / "Event" / "IR" / "RunLayout.h").read_text()
    constants = dict(re.findall(r"constexpr int(?:64|32)_t k(\w+) = (-?\d+);", header))
    assert constants, "no constants found in RunLayout.h"
    for name, value in constants.items():
        python = re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()
        assert getattr(layout, python) == int(value), name
