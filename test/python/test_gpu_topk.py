"""The CUDA top-k kernel (`topk_gpu`: a warp per row, shuffle reductions
per pick) with its lanes simulated on the CPU, against the NumPy reference:
NaN first, then larger values, ties by lower position."""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from ptxas_check import assemble, assert_no_spills, needs_ptxas



def _graph(n: int, k: int, dtype: str = "f32") -> etc.Graph:
    g = etc.Graph("topk_gpu")
    B = g.symbol("B")
    values, indices = g.topk(g.input("x", (B, n), dtype), k)
    g.output(values, indices)
    return g


@pytest.mark.parametrize("n,k", [(8, 2), (96, 4), (300, 8), (33, 33)])
def test_topk_lanes(n, k):
    g = _graph(n, k)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert "topk_gpu" in kernel.ir("graph")
    rng = np.random.default_rng(n)
    for batch in (1, 3, 6, 41):
        x = rng.standard_normal((batch, n)).astype(np.float32)
        got = kernel.run(x=x)
        want = etc.reference.evaluate(g, x=x)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_topk_ties_nan_and_infinities():
    """Rows full of ties, NaNs and infinities, spread so that the winners
    sit on different lanes of the warp."""
    g = _graph(70, 6)
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=1)
    x = np.zeros((5, 70), np.float32)
    x[1, [3, 40, 65]] = np.nan
    x[1, [5, 6]] = np.inf
    x[2, :] = -np.inf
    x[2, [60, 61]] = 1.0
    x[3, ::7] = 2.0
    x[4] = np.arange(70, dtype=np.float32) % 5
    got = kernel.run(x=x)
    want = etc.reference.evaluate(g, x=x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert list(got[1][1][:3]) == [3, 40, 65] and list(got[1][1][3:5]) == [5, 6]


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_topk_ptx(chip, tmp_path):
    ptx = etc.compile(_graph(128, 8, "bf16"), target="cuda", chip=chip).ptx
    body = re.search(r"\.func \w*topk_gpu\w*\(.*?\n\}", ptx, re.S).group(0)
    assert "shfl.sync.bfly" in body and "bar.sync" in body
    assert_no_spills(assemble(ptx, chip, tmp_path, "topk"))
