"""The norm of rows split over ranks (`Graph.sum_squares`,
`Graph.split_rmsnorm`, `etc.ops.splitnorm`: tensor-parallel OLMo's q/k
norms): every kernel flavour against the NumPy reference at ragged widths
and every row count from 1 to 33 (the portable kernels, the CPU vector
ones, the CUDA ones with their lanes simulated on the CPU), the whole row's
split norm is `rmsnorm`, the GPU check kit's families on the GPU kernels
(their PTX and reference checks are test_gpu_kit_families.py's), a
real-width OLMo 2 shard's step graph that assembles, and the errors that
name the argument."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.ops import splitnorm
from ptxas_check import PTXAS, needs_ptxas

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kit"))
import families  # noqa: E402

#: Widths: a scalar tail only (1, 7), vectors and a tail (33, 100), whole
#: 16-lane vectors (64), whole 16-byte slices in f32 but not bf16 (100, 36),
#: a streamed row past the unrolled slices (264).
WIDTHS = (1, 7, 33, 36, 64, 100, 264)
KERNEL_FLAVOURS = ("generic", "cpu", "cuda")


def split_graph(dtype: str, widths=WIDTHS):
    """Per width n: x_n (B, n) a rank's share of rows 2n wide, `sum_squares`
    of every x_n, plus those of the other rank's shares (inputs o_n), and
    `split_rmsnorm` of each x_n by its column (odd widths with offset 1)."""
    g = etc.Graph(f"split_{dtype}")
    B = g.symbol("B")
    xs = [g.input(f"x{n}", (B, n), dtype) for n in widths]
    others = [g.input(f"o{n}", (B, n), dtype) for n in widths]
    totals = g.add(g.sum_squares(*xs), g.sum_squares(*others))
    g.output(totals, *[
        g.split_rmsnorm(x, g.input(f"w{n}", (n,), dtype), totals, width=2 * n, column=j,
                        eps=1e-5, offset=float(n % 2)) for j, (x, n) in enumerate(zip(xs, widths))])
    return g


def compiled(g, flavour: str, monkeypatch):
    """`g` for the CPU with the portable kernels ("generic"), the CPU
    vector kernels ("cpu") or the CUDA kernels on simulated lanes ("cuda")."""
    with monkeypatch.context() as patch:
        if flavour == "generic":
            for kernel in (splitnorm.SumSquaresCPU, splitnorm.SplitRMSNormCPU):
                patch.setattr(kernel, "applies", classmethod(lambda cls, op, target: False))
        return etc.compile(g, target="cpu", workers=2,
                           kernels="cuda" if flavour == "cuda" else "native")


def draw(g, rows: int, rng) -> dict:
    """N(0, 1) inputs for B = `rows` (bf16 ones rounded to bf16)."""
    return families.make_inputs(g.arguments, {"B": rows}, families.Recipe(), rng)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("flavour", KERNEL_FLAVOURS)
def test_kernels_match_numpy(flavour, dtype, monkeypatch):
    """Every row count 1..33 (a tile of 32 rows and a partial one), every
    width of WIDTHS: the sums within f32 rounding of the reference's, the
    norms within f32 rounding (f32) or one bf16 rounding (bf16)."""
    g = split_graph(dtype)
    kernel = compiled(g, flavour, monkeypatch)
    names = set(re.findall(r"_tile_((?:sum_squares|split_rmsnorm)\w*?)_\d+\(",
                           kernel.ir("event")))
    expected = {"generic": {"sum_squares", "split_rmsnorm"},
                "cpu": {"sum_squares_cpu", "split_rmsnorm_cpu"},
                # The ragged widths on the portable kernels.
                "cuda": {"sum_squares", "split_rmsnorm", "split_rmsnorm_gpu"}}[flavour]
    assert names == expected, names
    rng = np.random.default_rng(3)
    norm_tolerance = 1e-5 if dtype == "f32" else 8e-3
    for rows in range(1, 34):
        inputs = draw(g, rows, rng)
        got = kernel.run(**inputs)
        want = etc.reference.evaluate(g, **inputs)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, err_msg=f"sums, {rows} rows")
        for n, a, b in zip(WIDTHS, got[1:], want[1:]):
            np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=norm_tolerance,
                                       atol=norm_tolerance, err_msg=f"width {n}, {rows} rows")


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
def test_sum_squares_gpu_kernel_on_whole_slices(flavour, monkeypatch):
    """Operands of whole 16-byte slices take the warp-per-row kernel (264
    bf16 values: 33 slices, streamed; 256: unrolled), within f32 rounding."""
    g = etc.Graph("sums")
    B = g.symbol("B")
    xs = [g.input(f"x{n}", (B, n), "bf16") for n in (8, 256, 264)]
    g.output(g.sum_squares(*xs))
    kernel = compiled(g, flavour, monkeypatch)
    assert f"sum_squares_{'cpu' if flavour == 'cpu' else 'gpu'}" in kernel.ir("event")
    rng = np.random.default_rng(4)
    for rows in (1, 4, 5, 33):
        inputs = draw(g, rows, rng)
        np.testing.assert_allclose(kernel.run(**inputs)[0],
                                   etc.reference.evaluate(g, **inputs)[0], rtol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_whole_rows_split_norm_is_rmsnorm(dtype, monkeypatch):
    """With a row's own sum of squares and width, split_rmsnorm is rmsnorm
    (to f32 rounding), on the CPU and the simulated CUDA kernels."""
    for flavour in ("cpu", "cuda"):
        g = etc.Graph("whole")
        B = g.symbol("B")
        x, w = g.input("x", (B, 96), dtype), g.input("w", (96,), dtype)
        g.output(g.split_rmsnorm(x, w, g.sum_squares(x), width=96, eps=1e-6),
                 g.rmsnorm(x, w, 1e-6))
        kernel = compiled(g, flavour, monkeypatch)
        split, whole = kernel.run(**draw(g, 9, np.random.default_rng(5)))
        tolerance = 1e-6 if dtype == "f32" else 8e-3
        np.testing.assert_allclose(split, whole, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["split_norm", "split_norm_bf16"])
def test_kit_family_takes_the_gpu_kernels(name):
    """The GPU check kit's families (checked against the reference and by
    ptxas with the kit's others, test_gpu_kit_families.py) run the GPU
    kernels, not the portable ones."""
    graph = families.families()[name][0]()
    kernel = etc.compile(graph, target="cpu", kernels="cuda", workers=2)
    assert {"sum_squares_gpu", "split_rmsnorm_gpu"} <= set(
        re.findall(r"_tile_(\w+?)_\d+\(", kernel.ir("event")))


@needs_ptxas
def test_olmo_shard_step_graph_assembles(tmp_path):
    """OLMo-2-1B's step graph (2 layers) on one of 2 ranks, bf16, for
    sm_90a: its q/k norms on the GPU kernels at the real widths (1024 of
    2048 per rank), the (T, 2) sums all-reduced; the PTX assembles as
    relocatable code (`ptxas -c`: NVSHMEM's device library is linked at
    load, test_nvshmem.py)."""
    from etc.models.loading.config import ModelConfig
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import shard_config
    from etc.models.testing import shaped_config

    config = shard_config(ModelConfig.from_dict(shaped_config("olmo-2-1b", layers=2)), 2)
    graph = build_step_graph(config, dtype="bf16", max_seq_len=4096, chunk=256,
                             kv_block_size=16, ranks=2)
    kernel = etc.compile(graph, target="cuda", chip="sm_90a")
    assert {"sum_squares_gpu", "split_rmsnorm_gpu"} <= set(
        re.findall(r"_tile_(\w+?)_\d+\(", kernel.ir("graph")))
    path = tmp_path / "olmo_shard.ptx"
    path.write_text(kernel.ptx)
    result = subprocess.run([PTXAS, "-arch=sm_90a", "-c", str(path), "-o", "/dev/null"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def test_errors_name_the_argument():
    g = etc.Graph("errors")
    T = g.symbol("T")
    x, k = g.input("x", (T, 32)), g.input("k", (T, 16))
    w = g.input("w", (32,))
    ss = g.sum_squares(x, k)
    with pytest.raises(ValueError, match="sum_squares: needs at least one operand"):
        g.sum_squares()
    with pytest.raises(ValueError, match=r"sum_squares: mixed dtypes: .*'x1'"):
        g.sum_squares(x, g.input("h", (T, 8), "bf16"))
    with pytest.raises(ValueError, match=r"sum_squares: .*'x1'.* differ in rows"):
        g.sum_squares(x, g.input("short", (4, 8)))
    with pytest.raises(ValueError, match=r"split_rmsnorm: 'column' = 2 is not a column"):
        g.split_rmsnorm(x, w, ss, width=64, column=2)
    with pytest.raises(ValueError, match=r"split_rmsnorm: 'width' = 16 must be a positive int"):
        g.split_rmsnorm(x, w, ss, width=16)
    with pytest.raises(ValueError, match=r"split_rmsnorm: .*'weight'.* must have shape \(32,\)"):
        g.split_rmsnorm(x, g.input("w16", (16,)), ss, width=64)
    with pytest.raises(ValueError, match=r"split_rmsnorm: .*'sum_squares'.* must be f32"):
        g.split_rmsnorm(x, w, g.input("half", (T, 2), "bf16"), width=64)
    for eps in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"split_rmsnorm: 'eps' must be a finite "
                                             r"non-negative float"):
            g.split_rmsnorm(x, w, ss, width=64, eps=eps)
