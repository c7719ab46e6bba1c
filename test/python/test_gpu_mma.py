"""The tensor-core matmul tile (`MatmulMMA`): numerics with its lanes
simulated on the CPU, and the PTX it assembles to.

Under simulation every lane loads its `mma.sync` m16n8k16 fragments from the
staged shared-memory tiles exactly as on the GPU, and the multiply is an
exact scalar emulation that reads each element of A and B from the lane and
register the PTX fragment layout puts it in (`etc.ops.mma`): a lane that
loads the wrong element makes a wrong product here, without a GPU. The PTX
tests check what the simulation cannot: `mma.sync`, `cp.async`, and that
ptxas assembles the kernels without spills or stack. (In a model's step
graph: test_model_ptx.py.)
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mlir import ir

import etc
from etc.ops import mma
from etc.reference import round_bf16
from ptxas_check import assemble, assert_no_spills, needs_ptxas


#: A tensor-core tile function: `matmul_mma` (known rows) or, for symbolic
#: rows, `matmul_gemv_mma` / `matmul_gemv_t_mma` (with the GEMV for few rows).
TENSOR_CORE = re.compile(r"_tile_matmul(_gemv(_t)?)?_mma_")

TOLERANCE = {"f16": 5e-3, "bf16": 2e-2}


def _value(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    value = (rng.standard_normal(shape) * scale).astype(np.float32)
    return value.astype(np.float16) if dtype == "f16" else round_bf16(value)


def _matmul(m, k: int, n: int, dtype: str, transpose_b: bool, tile=None) -> etc.Graph:
    g = etc.Graph("mm")
    rows = g.symbol("B") if m is None else m
    x = g.input("x", (rows, k), dtype)
    w = g.input("w", (n, k) if transpose_b else (k, n), dtype)
    g.output(g.matmul(x, w, transpose_b=transpose_b, tile=tile))
    return g


def _run(g: etc.Graph, kernel, dtype: str, inputs: dict, label: str) -> None:
    got = kernel.run(**inputs)
    want = etc.reference.evaluate(g, **inputs)
    tol = TOLERANCE[dtype]
    for a, b in zip(got, want):
        # Relative to the output's scale: the kernel and NumPy sum in
        # different orders and both round the result to the dtype.
        scale = max(float(np.abs(np.asarray(b, np.float32)).max()), 1.0)
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol * scale, err_msg=label)


def _check(g: etc.Graph, dtype: str, rows_values, *, chosen: bool = True, seed: int = 3,
           chip: str = "sm_80", kernels: re.Pattern = TENSOR_CORE, **options) -> None:
    """`g` under the lane simulation for `chip` (and `options` of
    `etc.compile`) against the reference at each row count; whether a tile
    function matching `kernels` was chosen must be `chosen`. (sm_80 by
    default: on sm_90a B^T takes wgmma, test_gpu_wgmma.py.)"""
    kernel = etc.compile(g, target="cpu", kernels="cuda", chip=chip, workers=2, **options)
    assert bool(kernels.search(kernel.ir("graph"))) == chosen
    rng = np.random.default_rng(seed)
    for rows in rows_values:
        inputs = {}
        for arg in g.arguments:
            if arg.kind == "input":
                shape = tuple(rows if d == "B" else d for d in arg.shape)
                inputs[arg.name] = _value(rng, shape, dtype, 1.0 if arg.name == "x" else 0.1)
        _run(g, kernel, dtype, inputs, f"rows={rows}")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
def test_mma_symbolic_rows(dtype, transpose_b):
    """One kernel for every batch: tiles of 16 rows or more take the tensor
    cores (full, partial and 16-row tiles), fewer rows the split-K or scalar
    path. K = 96: three staging steps, so both shared buffers are used and
    the last step has no prefetch."""
    _check(_matmul(None, 96, 128, dtype, transpose_b), dtype, (1, 5, 16, 20, 37, 64))


# (rows, K, N): K a multiple of 16 but not 32 (16-wide steps), tiles of 16
# columns, rows that are not a multiple of 16, one 16-row matrix.
SHAPES = [(16, 48, 48), (23, 64, 80), (50, 160, 32), (100, 32, 256), (33, 272, 144)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_mma_static_shapes(shape, dtype, transpose_b):
    m, k, n = shape
    _check(_matmul(m, k, n, dtype, transpose_b), dtype, (m,), seed=m + k + n)


TILES = [(32, 48), (64, 32), (48, 64), (16, 128)]


@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("tile", TILES, ids=["x".join(map(str, t)) for t in TILES])
def test_mma_user_tiles(tile, transpose_b):
    """Other warp grids: an odd number of 8-column blocks per warp (the
    last B block loaded alone), four warps along the rows, three row blocks
    per warp, one warp row across 128 columns."""
    g = etc.Graph("mm")
    x = g.input("x", (100, 64), "f16")
    w = g.input("w", (384, 64) if transpose_b else (64, 384), "f16")
    g.output(g.matmul(x, w, transpose_b=transpose_b, tile=tile))
    _check(g, "f16", (100,))


@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
def test_mma_random_shapes(transpose_b):
    """Random shapes the kernel takes: rows 16..130, K and N multiples of 16."""
    rng = np.random.default_rng(11 + transpose_b)
    for case in range(3):
        m = int(rng.integers(16, 131))
        k = 16 * int(rng.integers(1, 12))
        n = 16 * int(rng.integers(1, 12))
        dtype = ("f16", "bf16")[case % 2]
        _check(_matmul(m, k, n, dtype, transpose_b), dtype, (m,), seed=case)


@pytest.mark.parametrize("shape", [(40, 40, 64), (8, 64, 64)], ids=["k40", "rows8"])
def test_mma_not_chosen(shape):
    """K not a multiple of 16 (no whole m16n8k16 step) and matrices of fewer
    than 16 rows keep the other kernels, still correct."""
    m, k, n = shape
    _check(_matmul(m, k, n, "bf16", False), "bf16", (m,), chosen=False)


def test_mma_needs_sm80():
    """Volta has no m16n8k16, cp.async or ldmatrix: sm_70 keeps the other
    kernels."""
    g = _matmul(64, 64, 64, "f16", False)
    kernel = etc.compile(g, target="cpu", kernels="cuda", chip="sm_70", workers=2)
    assert not TENSOR_CORE.search(kernel.ir("graph"))
    kernel = etc.compile(g, target="cpu", kernels="cuda", chip="sm_80", workers=2)
    assert TENSOR_CORE.search(kernel.ir("graph"))


def test_mma_mlp():
    """A SwiGLU MLP: two projections, silu, product, a down projection whose
    K is the hidden width; bf16, decode and prefill batches."""
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "bf16")
    gate = g.input("gate", (256, 128), "bf16")
    up = g.input("up", (256, 128), "bf16")
    down = g.input("down", (256, 128), "bf16")
    h = g.mul(g.silu(g.matmul(x, gate, transpose_b=True)), g.matmul(x, up, transpose_b=True))
    g.output(g.matmul(h, down))
    _check(g, "bf16", (2, 24, 70))


def test_mma_fragment_bug_fails_on_cpu(monkeypatch):
    """The emulations read each register from the lanes and rows the PTX
    layouts of `ldmatrix` and `mma` name: a kernel whose lanes give
    `ldmatrix` the wrong rows computes a wrong product under simulation."""
    from mlir.dialects import arith
    right = mma.ldmatrix_lane

    def wrong(k, lane):
        matrix, row = right(k, lane)
        return matrix, arith.remui(arith.addi(row, k.cidx(1)), k.cidx(8))
    monkeypatch.setattr(mma, "ldmatrix_lane", wrong)
    for transpose_b in (False, True):
        with pytest.raises(AssertionError):
            _check(_matmul(32, 32, 64, "f16", transpose_b), "f16", (32,))


def test_mma_copy_groups():
    """Double buffering: step 0's copies are a group of their own before
    the loop; each step then commits the next step's copies (zero fills
    after the last) and waits for all but that newest group; the last zero
    fill is drained before the tile returns. The stage's IR parses back.
    (The simulation copies synchronously, so only the IR shows this.)"""
    kernel = etc.compile(_matmul(None, 256, 256, "bf16", True), target="cuda", chip="sm_80")
    text = kernel.ir("graph")
    order = re.findall(r"nvgpu\.device_async_(create_group|wait)[^\n]*?(\d+ : i32)?\}?$",
                       text, re.M)
    assert order == [("create_group", ""), ("create_group", ""), ("wait", "1 : i32"),
                     ("wait", "0 : i32")], order
    with ir.Context():
        ir.Module.parse(text)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_mma_ptx(chip, tmp_path):
    """Each dtype and layout of B: `mma.sync.aligned.m16n8k16` with f32
    accumulators, operands staged by `cp.async` and read from shared
    memory, and the GEMV path (shuffles) for tiles of few rows; ptxas
    assembles everything with no spills and no stack."""
    g = etc.Graph("gemm")
    B = g.symbol("B")
    for dtype in ("f16", "bf16"):
        x = g.input(f"x_{dtype}", (B, 512), dtype)
        w = g.input(f"w_{dtype}", (512, 1024), dtype)
        wt = g.input(f"wt_{dtype}", (1024, 512), dtype)
        g.output(g.matmul(x, w), g.matmul(x, wt, transpose_b=True))
    ptx = etc.compile(g, target="cuda", chip=chip).ptx
    functions = re.findall(r"\.func \w*matmul_gemv(?:_t)?_mma\w*\(.*?\n\}", ptx, re.S)
    # On sm_90a B^T (N, K) takes wgmma (test_gpu_wgmma.py), B (K, N) mma.sync.
    layouts = 1 if chip == "sm_90a" else 2
    assert len(functions) == 2 * layouts, "one tensor-core kernel per dtype and layout of B"
    for dtype in ("f16", "bf16"):
        instruction = f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32"
        assert sum(instruction in f for f in functions) == layouts, instruction
    for body in functions:
        assert "cp.async.cg.shared.global" in body and re.search(r"cp\.async\.wait_group\s+1;", body)
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in body and "bar.sync" in body
        assert "shfl.sync.bfly" in body and re.search(r"ld(\.global)?\.v4\.b32", body)
    assert_no_spills(assemble(ptx, chip, tmp_path, "gemm"), stack=True)
