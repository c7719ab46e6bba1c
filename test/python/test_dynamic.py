"""The dynamic schedule (on-device task queue) on the CPU target.

Every operator and graph of test_cpu_runtime.py must give bit-for-bit the
results of the static schedule for the same worker count (the tile bodies
are the same; only the order of the tiles changes), and match NumPy, for 1,
2, 3 and 8 workers. The waiters of an event element are found in closed
form or through the inverse index built on the device; `force-index`
exercises the latter on every graph.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mlir import ir

import etc
from etc import pipeline
from etc.compiler import compile_module
from test_cpu_runtime import BATCHES, OPERATORS, WORKERS, _graph, _inputs, _mlp, _rand

_STATIC: dict[tuple, object] = {}


def _static_kernel(name: str, g: etc.Graph, workers: int = 2):
    """The static kernel of a graph for a worker count, the oracle of the
    dynamic ones compiled for it (the CPU sizes matmul tiles per worker
    count, and an edge tile takes another code path than a full one)."""
    if (name, workers) not in _STATIC:
        _STATIC[name, workers] = etc.compile(g, target="cpu", schedule="static", workers=workers)
    return _STATIC[name, workers]


def _same_as_static(kernel, static, g, inputs) -> None:
    got = kernel.run(**inputs)
    want = static.run(**inputs)
    reference = etc.reference.evaluate(g, **inputs)
    assert len(got) == len(want) == len(reference)
    for dynamic_out, static_out, numpy_out in zip(got, want, reference):
        np.testing.assert_array_equal(dynamic_out, static_out)
        np.testing.assert_allclose(dynamic_out, numpy_out, rtol=1e-4, atol=1e-5)


def _mlp_inputs(rng, batch: int) -> dict:
    return {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
            "w1": _rand(rng, (128, 192), 0.1), "w2": _rand(rng, (192, 128), 0.1)}


def _schedule_of(kernel) -> set[str]:
    return set(re.findall(r'event\.schedule = "(\w+)"', kernel.ir("scheduled")))


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("kind", OPERATORS)
def test_operator_dynamic_matches_static(kind, workers):
    rng = np.random.default_rng(len(kind) * 17 + workers)
    g, extra = _graph(kind)
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=workers)
    assert _schedule_of(kernel) == {"dynamic"}
    static = _static_kernel(kind, g, workers)
    for batch in BATCHES:
        _same_as_static(kernel, static, g, _inputs(rng, extra, batch))


@pytest.mark.parametrize("workers", WORKERS)
def test_mlp_dynamic_matches_static(workers):
    rng = np.random.default_rng(100 + workers)
    g = _mlp()
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=workers)
    static = _static_kernel("mlp", g, workers)
    for batch in BATCHES:
        _same_as_static(kernel, static, g, _mlp_inputs(rng, batch))


def test_two_symbols_dynamic():
    g = etc.Graph("two_syms")
    M, N = g.symbol("M"), g.symbol("N")
    a = g.input("a", (M, 64), "f32")
    b = g.input("b", (N, 64), "f32")
    g.output(g.matmul(a, b, transpose_b=True))
    kernel = etc.compile(g, schedule="dynamic", workers=3)
    static = _static_kernel("two_syms", g)
    rng = np.random.default_rng(7)
    for m, n in [(1, 1), (40, 3), (3, 70)]:
        _same_as_static(kernel, static, g, {"a": _rand(rng, (m, 64)), "b": _rand(rng, (n, 64))})


def _compile_with(g: etc.Graph, schedule_pipeline: str, workers: int,
                  edit=None):
    """Compiles `g` with a hand-picked scheduling pipeline; `edit` may rewrite
    the scheduled IR text before it is lowered."""
    options = pipeline.Options(workers=workers)
    context = ir.Context()
    # The CPU target's tile kernels, as etc.compile builds them, so that the
    # results compare bit for bit with kernels from etc.compile.
    module = g.build(context, target=etc.ops.Target("cpu"))
    pipeline.run_stage(module, "event", pipeline.stages(options)["event"])
    pipeline.run_stage(module, "scheduled", schedule_pipeline)
    if edit is not None:
        module = ir.Module.parse(edit(str(module)), context=context)
    return compile_module(module, g, options, stage="scheduled").runtime


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_inverse_index_matches_closed_form(workers):
    """force-index finds every waiter through the CSR index built in g_init."""
    g = _mlp()
    runtime = _compile_with(
        g, f"builtin.module(event-dynamic-schedule{{workers={workers} force-index=true}})",
        workers)
    static = _static_kernel("mlp", g)
    rng = np.random.default_rng(workers)
    for batch in BATCHES:
        inputs = _mlp_inputs(rng, batch)
        for got, want in zip(runtime.run(inputs), static.run(**inputs)):
            np.testing.assert_array_equal(got, want)


def test_auto_picks_static_for_dense_graphs():
    g = _mlp()
    kernel = etc.compile(g, schedule="auto", workers=2)
    assert _schedule_of(kernel) == {"static"}
    rng = np.random.default_rng(3)
    _same_as_static(kernel, _static_kernel("mlp", g), g, _mlp_inputs(rng, 33))


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_auto_picks_dynamic_for_moe(workers):
    g = etc.Graph("moe_auto")
    T = g.symbol("T")
    x = g.input("x", (T, 64), "f32")
    router = g.input("router", (64, 4), "f32")
    w1 = g.input("w1", (4, 64, 32), "f32")
    w2 = g.input("w2", (4, 32, 64), "f32")
    g.output(g.moe(x, router, w1, w2, 2))
    kernel = etc.compile(g, schedule="auto", workers=workers)
    assert _schedule_of(kernel) == {"dynamic"}
    rng = np.random.default_rng(workers)
    # The combine tiles read routes written during the run: enough tokens
    # and workers that a combine tile would race ahead of the expert tiles
    # if its waits were evaluated before the router ran.
    for tokens in (1, 7, 40, 300, 300):
        inputs = {"x": _rand(rng, (tokens, 64)), "router": _rand(rng, (64, 4)),
                  "w1": _rand(rng, (4, 64, 32), 0.1), "w2": _rand(rng, (4, 32, 64), 0.1)}
        for got, want in zip(kernel.run(**inputs), etc.reference.evaluate(g, **inputs)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _push_twice(text: str) -> str:
    """Every push in the worker made twice: more pushes than queue slots."""
    worker = text.index("_worker(")
    head, tail = text[:worker], text[worker:]
    doubled = re.sub(r"^(\s*event\.queue_push [^\n]*)$", r"\1\n\1", tail, flags=re.M)
    assert doubled != tail
    return head + doubled


def _notify_twice(text: str) -> str:
    """Every notify in the static worker made twice: counters end below 0."""
    doubled = re.sub(r"^(\s*event\.notify [^\n]*)$", r"\1\n\1", text, flags=re.M)
    assert doubled != text
    return doubled


def test_queue_overflow_is_reported():
    g = _mlp()
    runtime = _compile_with(g, "builtin.module(event-dynamic-schedule{workers=2})", 2,
                            edit=_push_twice)
    with pytest.raises(RuntimeError, match=r"^mlp: task queue overflow"):
        runtime.run(_mlp_inputs(np.random.default_rng(0), 40))


def test_unbalanced_events_are_reported():
    g = _mlp()
    runtime = _compile_with(g, "builtin.module(event-static-schedule{workers=2})", 2,
                            edit=_notify_twice)
    with pytest.raises(RuntimeError, match=r"^mlp: unbalanced events"):
        runtime.run(_mlp_inputs(np.random.default_rng(0), 40))
