"""The GPU kernels for packed weights, without a GPU: `MatmulPackedGPU` (the
GEMV) and `MatmulPackedMMA` (tensor cores from 16 rows) for every block
format under the CPU lane simulation (`kernels="cuda"`), against the
widened reference, at ragged shapes. The PTX of real-width packed step graphs
(every shape of `etc.models.testing.SHAPES`, their matrices and stacks of
experts in the packed formats in turn) is assembled by ptxas for sm_80
and sm_90a with no spills in test_model_ptx.py; the packed MoE tiles'
numerics under the lane simulation are in test_moe_packed.py."""

from __future__ import annotations

import re

import numpy as np

import etc
from etc import packed
from etc.reference import evaluate

FORMATS = list(packed.FORMATS)


def _every_format(k: int, n: int, chip: str, tile=None, seed: int = 0):
    """x (T, k) bf16 times a (n, k) weight in each format; the graph (whose
    tiles, checked here, are the packed GEMV paired with the tensor cores),
    its lane-simulated CPU kernel, the weights and a generator."""
    g = etc.Graph("gpu")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    g.output(*[g.matmul(x, g.input(f"w_{fmt}", (n, k), fmt), transpose_b=True, tile=tile,
                        name=f"y_{fmt}") for fmt in FORMATS])
    module = str(g.build(target=etc.ops.Target(kind="cuda", chip=chip)))
    assert set(re.findall(r"@gpu_tile_(matmul_\w+?)_\d+\(", module)) == \
        {f"matmul_{fmt}_gemv_mma" for fmt in FORMATS}
    rng = np.random.default_rng(seed)
    weights = {f"w_{fmt}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
               for fmt in FORMATS}
    return g, etc.compile(g, target="cpu", kernels="cuda", workers=2), weights, rng


def test_every_format_under_the_lane_simulation():
    """Each value is dequantized in registers and accumulated in f32, as
    the widened product is: only the order of the sums differs (relative
    1e-5 of sum |a||w|). 40 weight rows (a tile of 8 columns: 4 warps,
    two rows of B^T each), 1 to 9 rows of A (passes of 4 and the
    one-row pass)."""
    k = 512
    g, kernel, weights, rng = _every_format(k, 40, "sm_90a")
    for rows in (1, 2, 5, 9):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        got = kernel.run(x=a, **weights)
        want = evaluate(g, x=a, **weights)
        for fmt, out, ref in zip(FORMATS, got, want):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            scale = np.abs(a) @ np.abs(w).T
            # C is bf16: half a unit of it, plus the order of the sums.
            assert np.all(np.abs(out - ref) <= np.abs(ref) * 2**-8 + 1e-5 * scale), fmt


def test_every_format_on_the_tensor_cores_under_the_lane_simulation():
    """Tiles of 16 rows or more dequantize B^T into the shared tile, rounded
    to A's dtype, and multiply on the (emulated) tensor cores: C = A @
    round(W)^T up to the order of the sums; a tile's rows below 16 take the
    GEMV (f32 weights). Row tiles of 32: 16 rows (one tile on the tensor
    cores, its rows past the matrix never stored), 33 (32 + a GEMV row), 50
    (32 + 18), 70 (32 + 32 + 6); K = 3 x 256 (three of the K-quants' 256-value
    blocks) and 96 columns in tiles of 8, so every chunk of 8 values of a
    block is read."""
    k = 768
    _, kernel, weights, rng = _every_format(k, 96, "sm_80", tile=(32, 8), seed=1)
    for rows in (16, 33, 50, 70):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        # Which rows the tensor cores computed: those of tiles of >= 16 rows.
        wide = np.array([min(32, rows - r // 32 * 32) >= 16 for r in range(rows)])
        got = kernel.run(x=a, **weights)
        for fmt, out in zip(FORMATS, got):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            want = np.where(wide[:, None], a @ etc.reference.round_bf16(w).T, a @ w.T)
            scale = np.abs(a) @ np.abs(w).T
            assert np.all(np.abs(out - want) <= np.abs(want) * 2**-8 + 1e-5 * scale), \
                (fmt, rows)
