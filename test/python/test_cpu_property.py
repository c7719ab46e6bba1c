"""Random graphs compiled for the CPU and run against the NumPy reference.

The graphs come from the dependency-inference property test's generator:
random chains, fan-in and fan-out of every operator, random static and
symbolic shapes, random tiles and buffer reuse (`out=`).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etc
from test_infer_property import random_graph

RUNS = {"graphs": 0, "tile tasks": 0}


def _inputs(g, symbols, rng):
    inputs = {}
    for arg in g.arguments:
        if arg.kind != "input":
            continue
        shape = tuple(symbols[d] if isinstance(d, str) else d for d in arg.shape)
        inputs[arg.name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return inputs


def _check(data, g, kernel, symbols, second_m) -> None:
    """Runs `kernel` at the drawn symbols and, when there are symbols, at a
    second M from `second_m` (one compile serves both), against NumPy."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    bindings = [symbols]
    if symbols:
        bindings.append({"M": data.draw(second_m, label="second M")})
    for binding in bindings:
        inputs = _inputs(g, binding, rng)
        outputs = kernel.run(**inputs)
        expected = etc.reference.evaluate(g, **inputs)
        for name, got, want in zip(g.outputs, outputs, expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_graphs_match_numpy(data):
    g, symbols = random_graph(data)
    workers = data.draw(st.sampled_from([1, 2, 3, 8]), label="workers")
    kernel = etc.compile(g, target="cpu", schedule="static", workers=workers)
    _check(data, g, kernel, symbols, st.integers(1, 70))
    RUNS["graphs"] += 1


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_graphs_with_cuda_kernels_match_numpy(data):
    """The same random graphs built with the CUDA tile kernels (GEMVs,
    warp-per-row and vector elementwise kernels where shapes allow them;
    tiles chosen for the chip) and run with their 128 lanes simulated."""
    g, symbols = random_graph(data)
    kernel = etc.compile(g, target="cpu", kernels="cuda",
                         schedule=data.draw(st.sampled_from(["static", "dynamic"]), label="s"),
                         workers=data.draw(st.sampled_from([1, 3]), label="workers"))
    _check(data, g, kernel, symbols, st.sampled_from([1, 2, 17, 33]))
