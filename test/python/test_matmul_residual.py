"""`Graph.matmul(residual=)`: the residual added in the matmul's own tiles
gives the same bits as a separate `add` of it and the product, on every
matmul kernel (CPU micro-tiles and panels, the GPU GEMVs and tensor-core
tiles simulated on the CPU), and in the reference; the model's layers use
it, so a step has no add tasks."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from ptxas_check import assemble, needs_ptxas


def _graphs(dtype: str, k: int, n: int, transpose_b: bool, rows=None):
    """The fused graph and the same computation with a separate add."""
    graphs = []
    for fused in (True, False):
        g = etc.Graph("mmr")
        m = g.symbol("M") if rows is None else rows
        x = g.input("x", (m, k), dtype)
        w = g.input("w", (n, k) if transpose_b else (k, n), dtype)
        r = g.input("r", (m, n), dtype)
        if fused:
            g.output(g.matmul(x, w, transpose_b=transpose_b, residual=r))
        else:
            g.output(g.add(r, g.matmul(x, w, transpose_b=transpose_b)))
        graphs.append(g)
    return graphs


def _inputs(rng, dtype, m, k, n, transpose_b):
    host = np.float16 if dtype == "f16" else np.float32
    return dict(x=rng.standard_normal((m, k)).astype(host),
                w=rng.standard_normal((n, k) if transpose_b else (k, n)).astype(host),
                r=(rng.standard_normal((m, n)) * 4).astype(host))


@pytest.mark.parametrize("kernels", ["native", "cuda"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("transpose_b", [True, False])
def test_fused_residual_matches_a_separate_add(kernels, dtype, transpose_b):
    k, n = 72, 200
    fused, separate = _graphs(dtype, k, n, transpose_b)
    options = dict(target="cpu", workers=2, kernels=kernels)
    kf, ks = etc.compile(fused, **options), etc.compile(separate, **options)
    assert "add" not in {op.kind for op in fused._ops}
    rng = np.random.default_rng(len(dtype) + transpose_b)
    for m in (1, 3, 4, 5, 33):
        inputs = _inputs(rng, dtype, m, k, n, transpose_b)
        (got,) = kf.run(**inputs)
        (want,) = ks.run(**inputs)
        np.testing.assert_array_equal(got, want, err_msg=f"M = {m}")
        np.testing.assert_array_equal(etc.reference.evaluate(fused, **inputs)[0],
                                      etc.reference.evaluate(separate, **inputs)[0])
        tol = 1e-4 if dtype == "f32" else 5e-2
        np.testing.assert_allclose(got, etc.reference.evaluate(fused, **inputs)[0],
                                   rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_tensor_core_tiles_add_the_residual(chip):
    """Known rows of 16 or more take the mma tiles, or wgmma on sm_90a
    (simulated on the CPU)."""
    fused, separate = _graphs("bf16", 64, 128, True, rows=32)
    options = dict(target="cpu", kernels="cuda", workers=2, chip=chip)
    kf = etc.compile(fused, **options)
    kind = "wgmma" if chip == "sm_90a" else "mma"
    assert re.search(rf"_tile_matmul(_gemv(_t)?)?_{kind}_", kf.ir("graph"))
    inputs = _inputs(np.random.default_rng(5), "bf16", 32, 64, 128, True)
    np.testing.assert_array_equal(kf.run(**inputs)[0],
                                  etc.compile(separate, **options).run(**inputs)[0])


def test_residual_errors():
    g = etc.Graph("bad")
    x, w = g.input("x", (4, 8)), g.input("w", (8, 16))
    with pytest.raises(ValueError, match=r"matmul: operand 'residual' .* must have the product's shape "
                                         r"\(4, 16\) and dtype f32"):
        g.matmul(x, w, residual=g.input("r", (4, 8)))
    with pytest.raises(ValueError, match=r"must have the product's shape"):
        g.matmul(x, w, residual=g.input("h", (4, 16), "bf16"))


@needs_ptxas
def test_fused_residual_ptx_assembles(tmp_path):
    fused, _ = _graphs("bf16", 576, 576, True)
    assemble(etc.compile(fused, target="cuda", chip="sm_90a").ptx, "sm_90a", tmp_path)


@pytest.mark.parametrize("kernels", ["native", "cuda"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_silu_mul_matches_silu_then_mul(kernels, dtype):
    """`silu_mul(a, b)` (a SwiGLU gate) gives the bits of `mul(silu(a), b)`:
    silu is rounded to the dtype before the product, as its own task's
    result was; a 1-D b is broadcast over the rows."""
    host = np.float16 if dtype == "f16" else np.float32
    rng = np.random.default_rng(len(dtype))
    for row in (False, True):
        kernels_ = []
        for fused in (True, False):
            g = etc.Graph("swiglu")
            m = g.symbol("M")
            a = g.input("a", (m, 200), dtype)
            b = g.input("b", (200,) if row else (m, 200), dtype)
            g.output(g.silu_mul(a, b) if fused else g.mul(g.silu(a), b))
            kernels_.append((g, etc.compile(g, target="cpu", workers=2, kernels=kernels)))
        (gf, kf), (gs, ks) = kernels_
        for m in (1, 3, 17):
            inputs = dict(a=(rng.standard_normal((m, 200)) * 3).astype(host),
                          b=rng.standard_normal((200,) if row else (m, 200)).astype(host))
            np.testing.assert_array_equal(kf.run(**inputs)[0], ks.run(**inputs)[0])
            np.testing.assert_array_equal(etc.reference.evaluate(gf, **inputs)[0],
                                          etc.reference.evaluate(gs, **inputs)[0])
