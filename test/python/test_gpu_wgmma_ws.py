"""The warp-specialised Hopper matmul tile (`MatmulWGMMA.warp_specialised`,
`warp_specialised()`): 256 lanes, lane 0 of warpgroup 0 producing with TMA
(waits empty[], `expect_tx` on full[], the boxes), warpgroup 1 consuming
(waits full[], wgmma, one lane per warp arrives on empty[]: 4 arrivals).
Under the lane simulation against NumPy at ragged M, N and K; a wrong
producer parity or a missing consumer arrival deadlocks the simulated ring
(NaN results). The PTX assembles with ptxas (no spills); the worker
has no 256-lane plumbing yet (launch, `.maxntid`: docs/operators.md,
"Warp specialisation: plan").

The CUDA target is 128 lanes everywhere today (`Options.kernel_target`);
these tests build the simulated kernels for 256 by patching it.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import etc
import etc.pipeline
from etc.ops import wgmma
from etc.ops.matmul_wgmma import MatmulWGMMA, tma_loads, warp_specialised
import test_gpu_wgmma as wgmma_tests
from ptxas_check import assemble, assert_no_spills, needs_ptxas

LANES = 2 * wgmma.WARPGROUP


def _lanes(monkeypatch, lanes: int) -> None:
    """CUDA kernels (simulated or not) built for `lanes` lanes."""
    original = etc.pipeline.Options.kernel_target

    def kernel_target(self):
        target = original(self)
        return dataclasses.replace(target, lanes=lanes) if target.kind == "cuda" else target
    monkeypatch.setattr(etc.pipeline.Options, "kernel_target", kernel_target)


@pytest.fixture
def ws(monkeypatch):
    _lanes(monkeypatch, LANES)
    with tma_loads(), warp_specialised():
        yield


def _check(m, k, n, dtype, tile=None, seed=3):
    wgmma_tests._check(wgmma_tests._matmul(m, k, n, dtype, tile=tile), dtype, (m,), seed=seed)


# (rows, K, N, tile): one step; five steps round the three-stage ring; K
# past a multiple of 64 (zero-filled box); N past the tile; 16 x 16 tiles;
# three 64-row blocks a tile.
SHAPES = [(64, 64, 64, None), (70, 320, 64, None), (130, 328, 72, (128, 64)),
          (16, 136, 40, (64, 16)), (200, 200, 144, (192, 128))]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s[:3])) for s in SHAPES])
def test_ws_shapes(ws, shape, dtype):
    m, k, n, tile = shape
    _check(m, k, n, dtype, tile=tile, seed=m + k + n)


RING = (70, 320, 64)


def _fails(monkeypatch, name, replacement) -> None:
    monkeypatch.setattr(MatmulWGMMA, name, replacement)
    with pytest.raises(AssertionError):
        _check(*RING, "f16")


def test_ws_wrong_producer_parity_fails(ws, monkeypatch):
    """The producer waiting empty[] for the consumers' phase parity: its
    first round waits for a release that never comes."""
    right = MatmulWGMMA._parity
    _fails(monkeypatch, "_parity",
           lambda self, step, offset: right(self, step, 0 if offset == 1 else offset))


def test_ws_missing_arrival_fails(ws, monkeypatch):
    """Warp 7 (the last consumer warp) not arriving on empty[]: 3 of 4."""
    right = MatmulWGMMA._consumer
    from mlir.dialects import arith

    def consumer(self, lane, lanes=None):
        inside = right(self, lane, lanes)
        if lanes is None:
            return inside
        return arith.andi(inside, arith.cmpi(arith.CmpIPredicate.ult, lane,
                                             self.cidx(LANES - lanes.warp)))
    _fails(monkeypatch, "_consumer", consumer)


def test_ws_needs_256_lanes_and_tma(monkeypatch):
    """Asked for at the target's 128 lanes, or without TMA, the
    warp-specialised tile is refused by name (not silently replaced)."""
    g = wgmma_tests._matmul(*RING, "bf16")
    with tma_loads(), warp_specialised(), pytest.raises(ValueError, match="needs 256 lanes"):
        etc.compile(g, target="cpu", kernels="cuda", chip="sm_90a", workers=2)
    _lanes(monkeypatch, LANES)
    with warp_specialised(), pytest.raises(ValueError, match="needs TMA loads"):
        etc.compile(g, target="cpu", kernels="cuda", chip="sm_90a", workers=2)


@needs_ptxas
def test_ws_ptx_assembles(ws, tmp_path):
    """The worker with the warp-specialised tile (known rows, inlined, 128 x
    128 tiles: 128 accumulators a consumer lane): both roles' `setmaxnreg`,
    the producer's TMA ring and the consumer's wgmma, in PTX that ptxas
    assembles for sm_90a with no spills and no serialised wgmma. As
    compiled, the worker has no `.maxntid`, so ptxas ignores `setmaxnreg`
    (C7508); with the bounds the 256-lane plumbing is to add (`.maxntid 256`,
    `.minnctapersm 2`: 128 registers at entry) it honours them, still
    without spills."""
    g = etc.Graph("gemm")
    x = g.input("x", (4096, 512), "bf16")
    wt = g.input("wt", (4096, 512), "bf16")
    g.output(g.matmul(x, wt, transpose_b=True))
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    assert wgmma_tests.HOPPER.search(kernel.ir("graph"))
    ptx = kernel.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in ptx
    for role, count in (("dec", 40), ("inc", 216), ("inc", 128), ("dec", 128)):
        assert re.search(rf"setmaxnreg\.{role}\.sync\.aligned\.u32\s+{count};", ptx), (role, count)
    for instruction in ("mbarrier.arrive.expect_tx.shared.b64", "wgmma.mma_async"):
        assert instruction in ptx, instruction
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert_no_spills(report, stack=True)
    assert "C7510" not in report, report
    assert "C7508" in report, report
    entry = re.search(r"\.visible \.entry \w+_worker\([^)]*\)", ptx).end()
    bounded = ptx[:entry] + "\n.maxntid 256, 1, 1\n.minnctapersm 2\n" + ptx[entry:]
    report = assemble(bounded, "sm_90a", tmp_path, "gemm_bounded")
    assert "C7508" not in report, report
    assert_no_spills(report, stack=True)
