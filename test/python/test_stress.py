"""Stress of the dynamic schedule: many runs with random worker counts and
sizes, each checked against the NumPy reference. Races in the queue (a slot
read before it is published, a task pushed twice or never) show up as wrong
numbers, a hang, or g_check's overflow/unbalanced error. Bounded by count, not
time (RUNS runs whatever the machine's load, so a loaded machine checks as
much as a quiet one), and printing how long they took."""

from __future__ import annotations

import time

import numpy as np

import etc
from test_cpu_runtime import _mlp, _rand

RUNS = 60
WORKER_CHOICES = (1, 2, 3, 4, 5, 8, 13)


def _chain() -> etc.Graph:
    """Elementwise and row operators chained so that most tiles wait."""
    g = etc.Graph("chain")
    B = g.symbol("B")
    x = g.input("x", (B, 64), "f32")
    w = g.input("w", (64, 64), "f32")
    h = g.silu(g.matmul(x, w))
    g.output(g.softmax(g.add(h, x)))
    return g


def _moe() -> etc.Graph:
    """Routes written during the run: the combine tiles' waits."""
    g = etc.Graph("moe_stress")
    T = g.symbol("T")
    x = g.input("x", (T, 32), "f32")
    router = g.input("router", (32, 4), "f32")
    w1 = g.input("w1", (4, 32, 32), "f32")
    w2 = g.input("w2", (4, 32, 32), "f32")
    g.output(g.moe(x, router, w1, w2, 2, tile=8))
    return g


def _random_inputs(rng, name: str, batch: int) -> dict:
    if name == "mlp":
        return {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
                "w1": _rand(rng, (128, 192), 0.1), "w2": _rand(rng, (192, 128), 0.1)}
    if name == "chain":
        return {"x": _rand(rng, (batch, 64)), "w": _rand(rng, (64, 64), 0.1)}
    return {"x": _rand(rng, (batch, 32)), "router": _rand(rng, (32, 4)),
            "w1": _rand(rng, (4, 32, 32), 0.1), "w2": _rand(rng, (4, 32, 32), 0.1)}


def test_dynamic_stress():
    rng = np.random.default_rng(2026)
    graphs = {"mlp": _mlp(), "chain": _chain(), "moe": _moe()}
    names = tuple(graphs)
    kernels: dict[tuple[str, int], object] = {}
    start = time.perf_counter()
    for runs in range(RUNS):
        name = names[runs % len(names)]
        workers = int(rng.choice(WORKER_CHOICES))
        g = graphs[name]
        if (name, workers) not in kernels:
            kernels[name, workers] = etc.compile(g, schedule="dynamic", workers=workers)
        batch = int(rng.integers(1, 97))
        inputs = _random_inputs(rng, name, batch)
        outputs = kernels[name, workers].run(**inputs)
        for got, want in zip(outputs, etc.reference.evaluate(g, **inputs)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} workers={workers} batch={batch}")
    print(f"\ndynamic stress: {RUNS} runs in {time.perf_counter() - start:.1f} s "
          f"({len(kernels)} kernels)")
