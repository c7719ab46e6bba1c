"""`Graph.layernorm`: (x - mean) / sqrt(var + eps) * weight (+ bias) over
the last dim, in every rowwise kernel flavour (generic scalar, CPU vector,
GPU warp-per-row held in registers and streamed; the GPU ones with their
lanes simulated on the CPU, `kernels="cuda"`), against NumPy at ragged
widths, in f32, bf16 and f16, for row counts 1 to 33 from one compile; the
two-pass statistics' accuracy on rows whose mean dwarfs their spread; the
Graph-level errors; the PTX (sm_80, sm_90a) assembled without spills;
and `Graph.head_layernorm`, each head's LayerNorm with its own weights."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from ptxas_check import assemble, assert_no_spills, needs_ptxas

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

ROWS = (1, 2, 5, 17, 33)
TOLERANCE = {"f32": 2e-5, "bf16": 2e-2, "f16": 4e-3}


def _tiles(kernel) -> set:
    return set(re.findall(r"_tile_(layernorm\w*?)_\d+\(", kernel.ir("graph")))


def _draw(rng, shape, dtype: str, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    value = (rng.standard_normal(shape) * scale + shift).astype(np.float32)
    if dtype == "f16":
        return value.astype(np.float16)
    return etc.reference.round_bf16(value) if dtype == "bf16" else value


def _numpy(x, w, b, eps):
    """The operator in float64, written out independently of etc.reference."""
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * \
        np.asarray(w, np.float64)
    return out if b is None else out + np.asarray(b, np.float64)


def _graph(width, dtype: str, bias: bool = True) -> etc.Graph:
    """layernorm with and without a bias, over rows of `width` (a symbol
    "N" when None)."""
    g = etc.Graph("ln")
    B = g.symbol("B")
    n = g.symbol("N") if width is None else width
    x = g.input("x", (B, n), dtype)
    w = g.input("w", (n,), dtype)
    outputs = [g.layernorm(x, w, eps=1e-5, name="plain")]
    if bias:
        outputs.append(g.layernorm(x, w, g.input("b", (n,), dtype), 1e-6, name="biased"))
    g.output(*outputs)
    return g


def _check(g: etc.Graph, kernel, dtype: str, width: int, shift: float = 0.0,
           rows=ROWS) -> None:
    rng = np.random.default_rng(width)
    for count in rows:
        inputs = {"x": _draw(rng, (count, width), dtype, 2.0, shift),
                  "w": _draw(rng, (width,), dtype, 0.5, 1.0),
                  "b": _draw(rng, (width,), dtype)}
        inputs = {k: v for k, v in inputs.items() if k in {a.name for a in g.arguments}}
        got = kernel.run(**inputs)
        want = etc.reference.evaluate(g, **inputs)
        exact = [_numpy(inputs["x"], inputs["w"], None, 1e-5)]
        if "b" in inputs:
            exact.append(_numpy(inputs["x"], inputs["w"], inputs["b"], 1e-6))
        for name, a, r, e in zip(g.outputs, got, want, exact):
            a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
            tol = TOLERANCE[dtype] * max(1.0, float(np.abs(e).max()))
            np.testing.assert_allclose(a, r, rtol=0, atol=tol, err_msg=f"{name} B={count}")
            # The reference itself against the float64 formula.
            np.testing.assert_allclose(r, e, rtol=0, atol=tol, err_msg=f"ref {name} B={count}")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("width", [1, 37, 100, 1000])
def test_cpu_kernels(dtype, width):
    """The CPU vector kernel: whole vectors of 16 and a scalar tail (37,
    100, 1000 leave one; 1 is all tail)."""
    g = _graph(width, dtype)
    kernel = etc.compile(g, target="cpu", workers=2)
    assert _tiles(kernel) == {"layernorm_cpu"}
    _check(g, kernel, dtype, width)


@pytest.mark.parametrize("dtype, width, tile", [
    ("f32", 96, "layernorm_gpu"),     # streamed: 24 slices, not a multiple of the warp
    ("bf16", 1024, "layernorm_gpu"),  # held: 4 slices a lane, two rows per warp
    ("f32", 1024, "layernorm_gpu"),   # held: 8 slices a lane, one row per warp
    ("f32", 4096, "layernorm_gpu"),   # streamed, four slices an iteration
    ("bf16", 8192, "layernorm_gpu"),  # streamed: Command R's hidden size
    ("f16", 256, "layernorm_gpu"),    # held, one slice a lane
    ("f32", 37, "layernorm"),         # not a multiple of a 16-byte slice: generic
    ("bf16", 100, "layernorm"),
])
def test_cuda_kernels_lanes_simulated(dtype, width, tile):
    """The GPU kernels (a warp per row, shuffle reductions of the sums and
    of the centred squares), lanes simulated; widths that are no whole
    16-byte slices take the generic kernel."""
    g = _graph(width, dtype)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert _tiles(kernel) == {tile}
    _check(g, kernel, dtype, width)


@pytest.mark.parametrize("lanes", [96, 256])
def test_cuda_kernels_at_other_lane_counts(lanes):
    """3 warps (rows per round not a power of two) and 8 warps: the warps
    take the tile's rows in turn, held and streamed."""
    g = etc.Graph("ln_lanes")
    B = g.symbol("B")
    outs = []
    for width in (512, 96):
        x = g.input(f"x{width}", (B, width), "f32")
        outs.append(g.layernorm(x, g.input(f"w{width}", (width,), "f32"),
                                g.input(f"b{width}", (width,), "f32")))
    g.output(*outs)
    kernel = etc.compile(g, target="cpu", kernels="cuda", lanes=lanes, workers=2)
    assert _tiles(kernel) == {"layernorm_gpu"}
    rng = np.random.default_rng(lanes)
    for count in (1, 7, 33):
        inputs = {}
        for width in (512, 96):
            inputs.update({f"x{width}": _draw(rng, (count, width), "f32"),
                           f"w{width}": _draw(rng, (width,), "f32"),
                           f"b{width}": _draw(rng, (width,), "f32")})
        for a, r in zip(kernel.run(**inputs), etc.reference.evaluate(g, **inputs)):
            np.testing.assert_allclose(a, r, rtol=0, atol=2e-5)


def test_symbolic_width():
    """A symbolic row width: the CPU's vector kernel (its tail changing per
    call) and, under the CUDA kernels, the generic one (a warp's 16-byte
    slices need a static width); and rows of width 0."""
    g = _graph(None, "f32")
    for options, tile in (({}, "layernorm_cpu"), ({"kernels": "cuda"}, "layernorm")):
        kernel = etc.compile(g, target="cpu", workers=2, **options)
        assert _tiles(kernel) == {tile}
        for width in (3, 16, 45):
            _check(g, kernel, "f32", width, rows=(1, 4))
        empty = kernel.run(x=np.zeros((3, 0), np.float32), w=np.zeros(0, np.float32),
                           b=np.zeros(0, np.float32))
        assert all(out.shape == (3, 0) for out in empty)


@pytest.mark.parametrize("kernels", [{}, {"kernels": "cuda"}], ids=["cpu", "cuda"])
def test_two_pass_statistics_are_accurate_far_from_zero(kernels):
    """Rows of 1000 + N(0, 1) in f32: the centred second pass keeps the
    variance (and so the output) accurate to float32's rounding of x,
    where E[x^2] - E[x]^2 is off by up to 0.15 of the variance of 1."""
    g = _graph(1024, "f32", bias=False)
    kernel = etc.compile(g, target="cpu", workers=2, **kernels)
    rng = np.random.default_rng(3)
    x = (1000.0 + rng.standard_normal((9, 1024))).astype(np.float32)
    w = np.ones(1024, np.float32)
    (got,) = kernel.run(x=x, w=w)
    np.testing.assert_allclose(got, _numpy(x, w, None, 1e-5), rtol=0, atol=2e-3)
    naive = np.mean(x * x, -1, dtype=np.float32) - np.mean(x, -1, dtype=np.float32) ** 2
    assert np.abs(naive - np.var(x.astype(np.float64), -1)).max() > 0.1


def test_errors_name_the_operand():
    g = etc.Graph("bad")
    B = g.symbol("B")
    x = g.input("x", (B, 64), "f32")
    w = g.input("w", (64,), "f32")
    with pytest.raises(ValueError, match=r"layernorm: operand 'weight' \('w32', shape \(32,\), "
                                         r"f32\) must have shape \(64,\)"):
        g.layernorm(x, g.input("w32", (32,), "f32"))
    with pytest.raises(ValueError, match=r"layernorm: operand 'bias' \('b2', .*must have shape "
                                         r"\(64,\)"):
        g.layernorm(x, w, g.input("b2", (2, 64), "f32"))
    with pytest.raises(ValueError, match=r"layernorm: mixed dtypes: .* vs operand 'bias' "
                                         r"\('bb', shape \(64,\), bf16\)"):
        g.layernorm(x, w, g.input("bb", (64,), "bf16"))
    with pytest.raises(ValueError, match=r"layernorm: operand 'x' \('x3', .*has rank 3"):
        g.layernorm(g.input("x3", (B, 2, 64), "f32"), w)
    for bad in (-1.0, float("nan"), float("inf"), "1e-5", True):
        with pytest.raises(ValueError, match=r"layernorm: 'eps' must be a finite non-negative"):
            g.layernorm(x, w, eps=bad)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_ptx_assembles_without_spills(chip, tmp_path):
    """Held (1024 bf16) and streamed (8192 bf16, 96 f32) rows: 16-byte
    loads, butterfly shuffles, FMAs of the centred squares; with
    head_layernorm's scalar kernel, ptxas clean."""
    g = etc.Graph("ln_ptx")
    B = g.symbol("B")
    outs = []
    for width, dtype in ((1024, "bf16"), (8192, "bf16"), (96, "f32")):
        x = g.input(f"x{width}", (B, width), dtype)
        outs.append(g.layernorm(x, g.input(f"w{width}", (width,), dtype),
                                g.input(f"b{width}", (width,), dtype)))
    q = g.input("q", (B, 8 * 128), "bf16")
    outs.append(g.head_layernorm(q, g.input("qw", (8 * 128,), "bf16"), head_dim=128))
    g.output(*outs)
    ptx = etc.compile(g, target="cuda", chip=chip).ptx
    assert re.search(r"\.func \w*head_layernorm\w*\(", ptx)
    body = re.search(r"\.func \w*layernorm_gpu\w*\(.*?\n\}", ptx, re.S)
    assert body, "no layernorm_gpu device function in the PTX"
    body = body.group(0)
    assert re.search(r"ld(\.global)?\.v4\.b32", body) and "shfl.sync.bfly" in body
    assert "fma.rn.f32" in body
    assert_no_spills(assemble(ptx, chip, tmp_path, "ln"))


# ----------------------------------------------------------------------
# head_layernorm: each head's LayerNorm, a weight for every head
# ----------------------------------------------------------------------


@pytest.mark.parametrize("kernels", [{}, {"kernels": "cuda"}], ids=["cpu", "cuda"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_head_layernorm(kernels, dtype):
    """`Graph.head_layernorm` (Command R+'s q/k norms): every head of every
    row normalised on its own, times its own weights, against the float64
    formula, rows 1 to 33 from one compile; a head size of 24 (no power of
    two) and 5 heads."""
    g = etc.Graph("heads")
    T = g.symbol("T")
    x = g.input("x", (T, 5 * 24), dtype)
    w = g.input("w", (5 * 24,), dtype)
    g.output(g.head_layernorm(x, w, head_dim=24, eps=1e-5))
    kernel = etc.compile(g, target="cpu", workers=2, **kernels)
    rng = np.random.default_rng(9)
    for rows in ROWS:
        xs = _draw(rng, (rows, 120), dtype, 2.0, 1.5)
        ws = _draw(rng, (120,), dtype, 0.5, 1.0)
        (got,) = kernel.run(x=xs, w=ws)
        (want,) = etc.reference.evaluate(g, x=xs, w=ws)
        heads = np.asarray(xs, np.float64).reshape(rows, 5, 24)
        exact = (_numpy(heads, np.asarray(ws, np.float64).reshape(5, 24), None, 1e-5)
                 .reshape(rows, 120))
        tol = TOLERANCE[dtype] * max(1.0, float(np.abs(exact).max()))
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=0, atol=tol, err_msg=f"B={rows}")
        np.testing.assert_allclose(np.asarray(want, np.float32), exact, rtol=0, atol=tol)


def test_head_layernorm_errors_name_the_operand():
    g = etc.Graph("bad_heads")
    T = g.symbol("T")
    x = g.input("x", (T, 64), "f32")
    with pytest.raises(ValueError, match=r"head_layernorm: operand 'weight' \('w16', shape "
                                         r"\(16,\), f32\) must have one value per column"):
        g.head_layernorm(x, g.input("w16", (16,), "f32"), head_dim=16)
    w = g.input("w", (64,), "f32")
    with pytest.raises(ValueError, match=r"head_layernorm: .*head_dim"):
        g.head_layernorm(x, w, head_dim=24)
    with pytest.raises(ValueError, match=r"head_layernorm: mixed dtypes"):
        g.head_layernorm(x, g.input("wb", (64,), "bf16"), head_dim=16)
    with pytest.raises(ValueError, match=r"head_layernorm: 'eps' must be a finite"):
        g.head_layernorm(x, w, head_dim=16, eps=float("nan"))
