"""The CUDA tile kernels: numerics with their lanes simulated on the CPU, and
the PTX they assemble to.

`etc.compile(..., target="cpu", kernels="cuda")` builds the CUDA kernels and
runs their 128 lanes one after another, with what crosses a shuffle or a
barrier kept per lane: a wrong lane-to-data mapping, split-K partial or
reduction fails here without a GPU. The PTX tests check the leaf
instructions the simulation cannot: 16-byte loads, shuffles, FMAs, and that
ptxas assembles the kernels without spilling.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc.reference import round_bf16
from ptxas_check import assemble, assert_no_spills, needs_ptxas



def _inputs(g: etc.Graph, batch: int, rng, dtype: str) -> dict:
    inputs = {}
    for arg in g.arguments:
        if arg.kind != "input":
            continue
        shape = tuple(batch if d == "B" else d for d in arg.shape)
        value = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2 and shape[0] != batch:
            value *= 0.1
        inputs[arg.name] = round_bf16(value) if dtype == "bf16" else value
    return inputs


def _check(g: etc.Graph, dtype: str, batches, marker: str, tol: float) -> None:
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert marker in kernel.ir("graph"), f"the {marker} kernel was not chosen"
    rng = np.random.default_rng(7)
    for batch in batches:
        inputs = _inputs(g, batch, rng, dtype)
        got = kernel.run(**inputs)
        want = etc.reference.evaluate(g, **inputs)
        for name, a, b in zip(g.outputs, got, want):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{name} at B={batch}")


def _gemv(dtype: str, k: int = 256, n: int = 512) -> etc.Graph:
    g = etc.Graph("gemv")
    B = g.symbol("B")
    x = g.input("x", (B, k), dtype)
    w = g.input("w", (k, n), dtype)
    g.output(g.matmul(x, w))
    return g


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_skinny_matmul_lanes(dtype):
    """Split-K over 128 lanes, shuffles within warps, partials of the warps
    through scratch memory; several passes of 4 rows, edge row tiles."""
    _check(_gemv(dtype), dtype, (1, 3, 16, 33), "matmul_gemv", 1e-4 if dtype == "f32" else 2e-2)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_elementwise_lanes(dtype):
    g = etc.Graph("ew")
    B = g.symbol("B")
    x = g.input("x", (B, 96), dtype)
    b = g.input("b", (96,), dtype)
    g.output(g.silu(x), g.add(x, b), g.mul(b, x), g.gelu(x), g.exp(b))
    _check(g, dtype, (1, 5, 70), "silu_gpu", 1e-5 if dtype == "f32" else 2e-2)


@pytest.mark.parametrize("dtype, width", [("f32", 96), ("bf16", 96), ("f32", 1024),
                                          ("bf16", 1024), ("f32", 4096)])
def test_rowwise_lanes(dtype, width):
    """A warp per row: lanes over 16-byte slices, shuffle reductions of sums
    and maxima, warps taking rows in turn (rows not a multiple of 4); rows
    held in registers (1024: one row per warp in f32, two in bf16) and
    streamed (96, and 4096 f32 with four slices per iteration)."""
    g = etc.Graph("rows")
    B = g.symbol("B")
    x = g.input("x", (B, width), dtype)
    w = g.input("w", (width,), dtype)
    g.output(g.rmsnorm(x, w), g.softmax(x), g.sum(x))
    _check(g, dtype, (1, 5, 70), "rmsnorm_gpu", 2e-5 if dtype == "f32" else 2e-2)


def _function(ptx: str, name: str) -> str:
    match = re.search(r"\.func \w*" + name + r"\w*\(.*?\n\}", ptx, re.S)
    assert match, f"no device function {name} in the PTX"
    return match.group(0)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_gpu_kernels_use_wide_loads_shuffles_and_fma(chip, tmp_path):
    g = etc.Graph("gpu")
    B = g.symbol("B")
    x = g.input("x", (B, 1024), "bf16")
    w = g.input("w", (1024, 2048), "bf16")
    norm = g.input("norm", (1024,), "bf16")
    h = g.silu(g.matmul(g.rmsnorm(x, norm), w))
    g.output(g.softmax(h))
    ptx = etc.compile(g, target="cuda", chip=chip).ptx
    gemv = _function(ptx, "matmul_gemv")
    assert len(re.findall(r"ld(\.global)?\.v4\.b32", gemv)) >= 8  # 16-byte loads of B and A
    assert "shfl.sync.bfly" in gemv and "fma.rn.f32" in gemv
    assert "bar.sync" in gemv  # the warps' partials meet in scratch memory
    rms = _function(ptx, "rmsnorm_gpu")
    assert re.search(r"ld(\.global)?\.v4\.b32", rms) and "shfl.sync.bfly" in rms
    assert "fma.rn.f32" in rms
    silu = _function(ptx, "silu_gpu")
    assert re.search(r"ld(\.global)?\.v4\.b32", silu) and re.search(r"st(\.global)?\.v4\.b32", silu)
    assert_no_spills(assemble(ptx, chip, tmp_path, "gpu"))
