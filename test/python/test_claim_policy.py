"""The static schedule's policies: "round-robin" (tile t on worker t mod W)
and "claim" (each worker claims the next global tile from a shared
counter), the CPU's default. Both run the same tiles in the same global
order, so they give the same bits; under "claim" a worker that never gets a
core holds back nothing it has not claimed."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import etc
from etc import pipeline
from etc.runtime import cpu as cpu_runtime
from etc.runtime import layout

HIDDEN, FFN = 64, 96


def swiglu() -> etc.Graph:
    """A decode-shaped SwiGLU MLP with the residual added in the last product."""
    g = etc.Graph("swiglu")
    B = g.symbol("B")
    x = g.input("x", (B, HIDDEN), "f32")
    wg, wu = g.input("wg", (HIDDEN, FFN), "f32"), g.input("wu", (HIDDEN, FFN), "f32")
    wd = g.input("wd", (FFN, HIDDEN), "f32")
    g.output(g.matmul(g.silu_mul(g.matmul(x, wg), g.matmul(x, wu)), wd, residual=x))
    return g


def inputs(batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((batch, HIDDEN)).astype(np.float32),
                wg=(rng.standard_normal((HIDDEN, FFN)) * 0.1).astype(np.float32),
                wu=(rng.standard_normal((HIDDEN, FFN)) * 0.1).astype(np.float32),
                wd=(rng.standard_normal((FFN, HIDDEN)) * 0.1).astype(np.float32))


def test_the_default_policy_follows_the_target():
    assert pipeline.Options(target="cpu").policy == "claim"
    assert pipeline.Options(target="cuda").policy == "round-robin"
    assert pipeline.Options(target="cpu", policy="round-robin").policy == "round-robin"
    assert pipeline.Options(target="cuda", policy="claim").policy == "claim"
    with pytest.raises(ValueError, match=r"policy='greedy' is not supported; expected one of "
                                         r"\('round-robin', 'claim'\) or None"):
        pipeline.Options(policy="greedy")


@pytest.mark.parametrize("schedule", ["static", "auto"])
def test_the_pipeline_passes_the_policy(schedule):
    options = pipeline.Options(schedule=schedule, workers=3)
    assert "policy=claim" in pipeline.schedule_pipeline(options)
    options = pipeline.Options(schedule=schedule, workers=3, policy="round-robin")
    assert "policy=round-robin" in pipeline.schedule_pipeline(options)


def test_the_scheduled_worker_claims_its_tiles():
    kernel = etc.compile(swiglu(), workers=2)
    scheduled = kernel.ir("scheduled")
    assert "event.claim" in scheduled and "event.worker_id" not in scheduled
    rr = etc.compile(swiglu(), workers=2, policy="round-robin").ir("scheduled")
    assert "event.claim" not in rr and "event.worker_id" in rr


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_the_policies_give_the_same_bits(workers):
    """8 workers on this machine's cores: more workers than cores finish
    (the waits block, so a worker that waits gives its core away)."""
    g = swiglu()
    claim = etc.compile(g, workers=workers, policy="claim")
    rr = etc.compile(g, workers=workers, policy="round-robin")
    for batch in (1, 5, 33):
        args = inputs(batch, seed=batch)
        (want,) = etc.reference.evaluate(g, **args)
        (got,) = claim.run(**args)
        np.testing.assert_array_equal(got, rr.run(**args)[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_every_tile_runs_once_under_claim():
    kernel = etc.compile(swiglu(), workers=3, trace=True)
    kernel.runtime.adapt_workers = False
    kernel.run(**inputs(9))
    trace = kernel.trace
    seen = collections.Counter((e.task, e.tile) for e in trace.events)
    assert seen and set(seen.values()) == {1}
    assert {e.worker for e in trace.events} <= {0, 1, 2}
    # The same tiles as the round-robin schedule runs.
    rr = etc.compile(swiglu(), workers=3, trace=True, policy="round-robin")
    rr.run(**inputs(9))
    assert set(seen) == {(e.task, e.tile) for e in rr.trace.events}


@pytest.fixture
def absent_worker(monkeypatch):
    """Runs on 2 workers start only worker 0: worker 1 never gets a core."""
    run = cpu_runtime.run_interruptible

    def only_the_first(entry, arguments, count, header, spin, threads=None, **options):
        # Joined, the caller runs worker 0 (the last of one thread's ids).
        return run(entry, arguments, count, header, spin, threads=1 if count == 2 else threads,
                   **options)
    monkeypatch.setattr(cpu_runtime, "run_interruptible", only_the_first)


def test_a_worker_that_never_runs_holds_back_nothing_under_claim(absent_worker):
    g = swiglu()
    kernel = etc.compile(g, workers=2, watchdog=2.0)
    kernel.runtime.adapt_workers = False
    args = inputs(7)
    (got,) = kernel.run(**args)
    np.testing.assert_allclose(got, etc.reference.evaluate(g, **args)[0], rtol=1e-4, atol=1e-4)


def test_a_worker_that_never_runs_stops_a_round_robin_run(absent_worker):
    """The contrast: round-robin gives worker 1 every other tile, and worker
    0 waits for them until the watchdog stops the run."""
    kernel = etc.compile(swiglu(), workers=2, watchdog=0.3, policy="round-robin")
    kernel.runtime.adapt_workers = False
    with pytest.raises(layout.WatchdogError, match="swiglu: watchdog: task"):
        kernel.run(**inputs(7))
