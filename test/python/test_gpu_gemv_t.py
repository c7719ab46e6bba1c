"""The CUDA GEMV for B transposed (`matmul_gemv_t`: A @ B^T with B stored
(N, K), the layout of Hugging Face linear weights): numerics with its lanes
simulated on the CPU, and its PTX."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etc
from etc.reference import round_bf16
from ptxas_check import assemble, assert_no_spills, needs_ptxas



def _graph(dtype: str, n: int, k: int, tile=None) -> etc.Graph:
    g = etc.Graph("gemv_t")
    B = g.symbol("B")
    x = g.input("x", (B, k), dtype)
    w = g.input("w", (n, k), dtype)
    g.output(g.matmul(x, w, transpose_b=True, **({"tile": tile} if tile else {})))
    return g


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n,k", [(512, 256), (64, 1000), (2048, 64)])
def test_transposed_gemv_lanes(dtype, n, k):
    """Warps over row groups of B^T, 32 lanes splitting K (K not a multiple
    of 32 chunks, or fewer chunks than lanes), passes of 4 rows with a
    partial last pass, rows not a multiple of the row tile."""
    g = _graph(dtype, n, k)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert "matmul_gemv_t" in kernel.ir("graph")
    rng = np.random.default_rng(3)
    tol = 1e-4 if dtype == "f32" else 2e-2
    for batch in (1, 3, 16, 21):
        x = rng.standard_normal((batch, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
        if dtype == "bf16":
            x, w = round_bf16(x), round_bf16(w)
        (got,) = kernel.run(x=x, w=w)
        (want,) = etc.reference.evaluate(g, x=x, w=w)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"B={batch}")


#: Rows of B^T that no GEMV tile width divides (as Granite 3.x's 49,159
#: tokens), each a ragged last column tile: one row (a tile of 8, 7 rows
#: masked), 7, 33 (4 tiles of 8 and one row) and 260 (32 tiles of 8 and 4).
ODD_N = (1, 7, 33, 260)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_transposed_gemv_with_a_ragged_last_tile(dtype):
    """N not a multiple of any tile width: the GEMV still takes the matmul
    (not the generic tile; bf16 without the tensor cores, which need whole
    tiles), its rows past N read row N - 1 and are not stored; every decode
    batch 1 to 17 (passes of 4, the one-row pass, the rows left of a pass)
    matches the reference with the lanes simulated."""
    k = 96
    g = etc.Graph("gemv_t_odd")
    B = g.symbol("B")
    x = g.input("x", (B, k), dtype)
    g.output(*[g.matmul(x, g.input(f"w{n}", (n, k), dtype), transpose_b=True, name=f"y{n}")
               for n in ODD_N])
    for target in (dict(target="cuda", chip="sm_90a"), dict(target="cuda", chip="sm_80")):
        kinds = re.findall(r"_tile_(matmul\w*?)_\d+\(", etc.compile(g, **target).ir("graph"))
        assert set(kinds) == {"matmul_gemv_t"}, (target, kinds)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    rng = np.random.default_rng(7)
    ws = {f"w{n}": (rng.standard_normal((n, k)) * 0.1).astype(np.float32) for n in ODD_N}
    if dtype == "bf16":
        ws = {name: round_bf16(w) for name, w in ws.items()}
    tol = 1e-4 if dtype == "f32" else 2e-2
    for batch in range(1, 18):
        xs = rng.standard_normal((batch, k)).astype(np.float32)
        if dtype == "bf16":
            xs = round_bf16(xs)
        got = kernel.run(x=xs, **ws)
        want = etc.reference.evaluate(g, x=xs, **ws)
        for n, out, ref in zip(ODD_N, got, want):
            assert out.shape == (batch, n)
            np.testing.assert_allclose(out, ref, rtol=tol, atol=tol, err_msg=f"N={n} B={batch}")


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_ragged_gemv_ptx(chip, tmp_path):
    """A 49,159-row LM head (Granite 3.x's vocabulary) at Granite 3.3 8B's
    width takes the GEMV, in tiles of 128 rows (385 tiles, the last of 7),
    and assembles with no spills."""
    g = etc.Graph("head")
    B = g.symbol("B")
    x = g.input("x", (B, 4096), "bf16")
    g.output(g.matmul(x, g.input("w", (49159, 4096), "bf16"), transpose_b=True))
    kernel = etc.compile(g, target="cuda", chip=chip)
    graph = kernel.ir("graph")
    assert set(re.findall(r"_tile_(matmul\w*?)_\d+\(", graph)) == {"matmul_gemv_t"}
    assert re.search(r"grid\(%\w+, %c385\)", graph)  # 384 tiles of 128 rows and one of 7
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, "head"))


def test_transposed_gemv_is_chosen_only_where_it_applies():
    # K not a multiple of the 16-byte vector: the portable kernel.
    kernel = etc.compile(_graph("f32", 512, 250), target="cuda")
    assert "matmul_gemv_t" not in kernel.ir("graph")
    # Tiles sized from the chip: 4096 columns give >= 132 tiles on sm_90a.
    g = _graph("bf16", 4096, 1024)
    text = etc.compile(g, target="cuda").ir("graph")
    assert "matmul_gemv_t" in text


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_transposed_gemv_ptx(chip, tmp_path):
    # f32: f16 and bf16 take `matmul_gemv_t_mma`, the tensor-core kernel
    # whose tiles of few rows run this GEMV (test_gpu_mma.py checks it).
    ptx = etc.compile(_graph("f32", 2048, 1024), target="cuda", chip=chip).ptx
    match = re.search(r"\.func \w*matmul_gemv_t\w*\(.*?\n\}", ptx, re.S)
    assert match, "no matmul_gemv_t device function"
    body = match.group(0)
    assert len(re.findall(r"ld(\.global)?\.v4\.(b32|f32)", body)) >= 6  # 2 weight rows + 4 rows of A
    assert "shfl.sync.bfly" in body and "fma.rn.f32" in body
    assert "bar.sync" not in body  # warps never meet
    assert_no_spills(assemble(ptx, chip, tmp_path, "gemv_t"))


def test_simulated_gpu_kernels_accept_unaligned_arrays():
    """On the GPU the runtime's buffers are 256-byte aligned; on the CPU the
    caller's arrays may start anywhere (safetensors weights mapped from a
    file): the simulated 16-byte loads must not assume alignment."""
    g = _graph("f32", 64, 128)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    rng = np.random.default_rng(5)
    raw = np.zeros(64 * 128 * 4 + 16, np.uint8)
    w = np.ndarray((64, 128), np.float32, buffer=raw, offset=4)
    assert w.ctypes.data % 16 != 0
    w[...] = rng.standard_normal((64, 128)).astype(np.float32) * 0.1
    x = rng.standard_normal((5, 128)).astype(np.float32)
    (got,) = kernel.run(x=x, w=w)
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_gemv_shapes_with_simulated_lanes(data):
    """Random decode-shaped matmuls (both layouts of B, f32 and bf16, K a
    multiple of the 16-byte vector, N of 16 (a column tile holds two
    16-byte vectors), any B): the GEMV kernels are chosen and match NumPy
    with their lanes simulated."""
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), label="dtype")
    vec = 4 if dtype == "f32" else 8
    k = vec * data.draw(st.integers(1, 64), label="k chunks")
    n = 16 * data.draw(st.integers(1, 24), label="n / 16")
    transposed = data.draw(st.booleans(), label="transpose_b")
    g = etc.Graph("rand_gemv")
    B = g.symbol("B")
    x = g.input("x", (B, k), dtype)
    w = g.input("w", (n, k) if transposed else (k, n), dtype)
    g.output(g.matmul(x, w, transpose_b=transposed))
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    # bf16 with K a multiple of 16 pairs the GEMV with the tensor cores
    # (`matmul_gemv_mma`, `matmul_gemv_t_mma`), which take the tiles of 16
    # rows or more.
    gemv = "matmul_gemv_t" if transposed else "matmul_gemv"
    assert re.search(rf"_tile_{gemv}(_mma)?_0\(", kernel.ir("graph"))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    batch = data.draw(st.integers(1, 40), label="B")
    xs = rng.standard_normal((batch, k)).astype(np.float32)
    ws = (rng.standard_normal((n, k) if transposed else (k, n)) * 0.1).astype(np.float32)
    if dtype == "bf16":
        xs, ws = round_bf16(xs), round_bf16(ws)
    (got,) = kernel.run(x=xs, w=ws)
    (want,) = etc.reference.evaluate(g, x=xs, w=ws)
    tol = 1e-4 if dtype == "f32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
