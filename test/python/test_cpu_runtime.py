"""Numerics of compiled graphs on the CPU target against the NumPy reference.

One compile per graph and worker count serves several values of every
symbolic dimension; worker counts above the core count must still finish.
"""

from __future__ import annotations

import numpy as np
import pytest

import etc

WORKERS = [1, 2, 3, 8]
BATCHES = [1, 5, 33, 64]  # 5 and 33 are not multiples of the 32-row tile


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _graph(kind: str) -> tuple[etc.Graph, dict]:
    """A one- or two-operator graph per operator kind, and its static inputs."""
    g = etc.Graph(f"op_{kind}")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    extra: dict = {}
    if kind == "matmul":
        w = g.input("w", (96, 80), "f32")
        y = g.matmul(x, w)
        extra["w"] = (96, 80)
    elif kind == "matmul_t":
        w = g.input("w", (80, 96), "f32")
        y = g.matmul(x, w, transpose_b=True)
        extra["w"] = (80, 96)
    elif kind in ("add", "mul"):
        z = g.input("z", (B, 96), "f32")
        y = getattr(g, kind)(x, z)
        extra["z"] = ("B", 96)
    elif kind in ("add_row", "mul_row"):
        r = g.input("r", (96,), "f32")
        y = getattr(g, kind[:3])(x, r)
        extra["r"] = (96,)
    elif kind in ("silu", "gelu", "exp", "softmax", "sum"):
        y = getattr(g, kind)(x)
    elif kind == "scale":
        y = g.scale(x, -0.5)
    elif kind == "rmsnorm":
        w = g.input("w", (96,), "f32")
        y = g.rmsnorm(x, w, 1e-5)
        extra["w"] = (96,)
    else:
        raise AssertionError(kind)
    g.output(y)
    return g, extra


def _inputs(rng, extra: dict, batch: int) -> dict:
    inputs = {"x": _rand(rng, (batch, 96))}
    for name, shape in extra.items():
        inputs[name] = _rand(rng, tuple(batch if d == "B" else d for d in shape), 0.3)
    return inputs


def _check(kernel, g, inputs):
    outputs = kernel.run(**inputs)
    expected = etc.reference.evaluate(g, **inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


OPERATORS = ["matmul", "matmul_t", "add", "mul", "add_row", "mul_row", "silu", "gelu",
             "exp", "scale", "rmsnorm", "softmax", "sum"]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("kind", OPERATORS)
def test_operator_matches_numpy_for_every_batch(kind, workers):
    rng = np.random.default_rng(len(kind) * 31 + workers)
    g, extra = _graph(kind)
    kernel = etc.compile(g, target="cpu", schedule="static", workers=workers)
    for batch in BATCHES:
        _check(kernel, g, _inputs(rng, extra, batch))


def _mlp() -> etc.Graph:
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "f32")
    nw = g.input("nw", (128,), "f32")
    w1 = g.input("w1", (128, 192), "f32")
    w2 = g.input("w2", (192, 128), "f32")
    h = g.rmsnorm(x, nw, 1e-6)
    a = g.gelu(g.matmul(h, w1))
    y = g.add(g.matmul(a, w2), x)
    g.output(y, g.softmax(y))
    return g


@pytest.mark.parametrize("workers", WORKERS)
def test_mlp_one_compile_serves_every_batch(workers):
    rng = np.random.default_rng(workers)
    g = _mlp()
    kernel = etc.compile(g, target="cpu", schedule="static", workers=workers)
    for batch in BATCHES:
        inputs = {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
                  "w1": _rand(rng, (128, 192), 0.1), "w2": _rand(rng, (192, 128), 0.1)}
        _check(kernel, g, inputs)


def test_two_symbols_bound_independently():
    g = etc.Graph("two_syms")
    M, N = g.symbol("M"), g.symbol("N")
    a = g.input("a", (M, 64), "f32")
    b = g.input("b", (N, 64), "f32")
    g.output(g.matmul(a, b, transpose_b=True))
    kernel = etc.compile(g, workers=2)
    rng = np.random.default_rng(7)
    for m, n in [(1, 1), (40, 3), (3, 70)]:
        _check(kernel, g, {"a": _rand(rng, (m, 64)), "b": _rand(rng, (n, 64))})


@pytest.fixture(scope="module")
def add_kernel():
    g, _ = _graph("add")
    return g, etc.compile(g, workers=2)


def test_wrong_dtype_is_rejected_not_cast(add_kernel):
    _, kernel = add_kernel
    x = np.zeros((4, 96), np.float64)
    with pytest.raises(TypeError, match=r"input 'x' has dtype float64, expected float32"):
        kernel.run(x=x, z=np.zeros((4, 96), np.float32))


def test_wrong_rank_is_rejected(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"input 'x' has rank 1"):
        kernel.run(x=np.zeros(96, np.float32), z=np.zeros((4, 96), np.float32))


def test_static_dim_mismatch_is_rejected(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"input 'z' dim 1 is 95, expected 96"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((4, 95), np.float32))


def test_inconsistent_symbol_binding_names_both_inputs(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"symbol 'B' is bound to 4 by input 'x' but input 'z'"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((5, 96), np.float32))


def test_missing_and_unknown_inputs(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(TypeError, match=r"missing inputs \['z'\]"):
        kernel.run(x=np.zeros((4, 96), np.float32))
    with pytest.raises(TypeError, match=r"unexpected inputs \['q'\]"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((4, 96), np.float32),
                   q=np.zeros(1, np.float32))


def test_every_stage_is_inspectable(add_kernel):
    _, kernel = add_kernel
    assert "event.task" in kernel.ir("graph") and "event.alloc" not in kernel.ir("graph")
    assert "event.wait" not in kernel.ir("event")
    assert "func.func @op_add_worker" in kernel.ir("scheduled")
    assert "event.wait" not in kernel.ir("lowered") and "llvm.func" in kernel.ir("lowered")
    with pytest.raises(ValueError, match="unknown stage 'ptx'"):
        kernel.ir("ptx")


def test_bad_options_are_rejected():
    g, _ = _graph("exp")
    with pytest.raises(ValueError, match=r"workers=0 must be a positive integer"):
        etc.compile(g, workers=0)
    with pytest.raises(ValueError, match=r"target='tpu' is not supported"):
        etc.compile(g, target="tpu")


def test_kernel_runs_what_was_compiled_after_the_graph_changes():
    g = etc.Graph("edited")
    x = g.input("x", (8, 16), "f32")
    y = g.exp(x)
    doubled = g.scale(x, 2.0)
    g.output(y)
    kernel = etc.compile(g, workers=2)
    # `doubled` was an intermediate when compiled; now it is an output too.
    g.output(doubled)
    xv = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    outputs = kernel.run(x=xv)
    assert len(outputs) == 1 and kernel.signature.outputs == ("exp_0",)
    np.testing.assert_allclose(outputs[0], np.exp(xv), rtol=1e-6)
    assert [a.kind for a in kernel.signature.arguments] == ["input", "output", "intermediate"]


def test_an_input_may_be_called_self():
    g = etc.Graph("selfish")
    x = g.input("self", (4, 8), "f32")
    g.output(g.exp(x))
    xv = np.ones((4, 8), np.float32)
    (y,) = etc.compile(g, workers=1).run(**{"self": xv})
    np.testing.assert_allclose(y, np.exp(xv), rtol=1e-6)
    (ref,) = etc.reference.evaluate(g, **{"self": xv})
    np.testing.assert_allclose(y, ref, rtol=1e-6)
