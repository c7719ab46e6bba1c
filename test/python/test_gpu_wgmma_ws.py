"""The warp-specialised Hopper matmul tile (`MatmulWGMMA.warp_specialised`,
`warp_specialised()`): 256 lanes, lane 0 of warpgroup 0 producing with TMA
(waits empty[], `expect_tx` on full[], the boxes), warpgroup 1 consuming
(waits full[], wgmma, one lane per warp arrives on empty[]: 4 arrivals).
Under the lane simulation against NumPy at ragged M, N and K; a wrong
producer parity or a missing consumer arrival deadlocks the simulated ring
(NaN results). Compiled with `etc.compile(..., lanes=256, min_ctas=2)`:
the worker carries `.maxntid 256` and `.minnctapersm 2`, so its registers
at entry are 128, which the tile's `setmaxnreg` counts are derived from and
ptxas honours (no C7508), with no spills.
"""

from __future__ import annotations

import re

import pytest

import etc
from etc.ops import wgmma
from etc.ops.base import Target
from etc.ops.matmul_wgmma import MatmulWGMMA, tma_loads, warp_specialised
import test_gpu_wgmma as wgmma_tests
from ptxas_check import assemble, assert_no_spills, needs_ptxas

LANES = 2 * wgmma.WARPGROUP
#: The worker's bounds the tests compile with: 65,536 / (256 x 2) = 128
#: registers a lane at entry.
BOUNDS = {"lanes": LANES, "min_ctas": 2}


@pytest.fixture
def ws():
    with tma_loads(), warp_specialised():
        yield


def _check(m, k, n, dtype, tile=None, seed=3):
    wgmma_tests._check(wgmma_tests._matmul(m, k, n, dtype, tile=tile), dtype, (m,), seed=seed,
                       **BOUNDS)


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


def test_ws_needs_256_lanes_tma_and_bounds():
    """Asked for at the default 128 lanes, without TMA, or without the
    worker's register bound, the warp-specialised tile is refused by name
    (not silently replaced)."""
    g = wgmma_tests._matmul(*RING, "bf16")
    simulated = {"target": "cpu", "kernels": "cuda", "chip": "sm_90a", "workers": 2}
    with tma_loads(), warp_specialised(), pytest.raises(ValueError, match="needs 256 lanes"):
        etc.compile(g, **simulated)
    with warp_specialised(), pytest.raises(ValueError, match="needs TMA loads"):
        etc.compile(g, **simulated, **BOUNDS)
    with tma_loads(), warp_specialised(), pytest.raises(ValueError, match="min_ctas=N"):
        etc.compile(g, **simulated, lanes=LANES)


def test_ws_registers_come_from_the_bounds():
    """The count both roles return to is the worker's at entry, 65,536 /
    (lanes x min_ctas) (256 at most); the consumer takes at least 216; a
    bound whose pool cannot hold producer + consumer is refused by name."""
    def registers(min_ctas):
        return MatmulWGMMA.registers(Target("cuda", "sm_90a", lanes=LANES, min_ctas=min_ctas))

    assert registers(2) == (40, 216, 128)
    assert registers(1) == (40, 256, 256)
    assert Target("cuda", "sm_90a", lanes=LANES).entry_registers is None
    assert Target("cuda", "sm_90a", lanes=384, min_ctas=1).entry_registers == 168
    for min_ctas in (3, 4):
        with pytest.raises(ValueError, match=rf"min_ctas={min_ctas} at 256 lanes leaves"):
            registers(min_ctas)


def _gemm() -> etc.Graph:
    g = etc.Graph("gemm")
    x = g.input("x", (4096, 512), "bf16")
    wt = g.input("wt", (4096, 512), "bf16")
    g.output(g.matmul(x, wt, transpose_b=True))
    return g


@needs_ptxas
@pytest.mark.parametrize("min_ctas, counts", [(2, (40, 216, 128)), (1, (40, 256, 256))])
def test_ws_ptx_assembles(ws, tmp_path, min_ctas, counts):
    """The worker with the warp-specialised tile (known rows, inlined, 128 x
    128 tiles: 128 accumulators a consumer lane), compiled at 256 lanes:
    `.maxntid 256, 1, 1` and `.minnctapersm` on the worker, both roles'
    `setmaxnreg` (producer down, consumer up, both back to the count at
    entry: 128 at 2 CTAs per SM, 256 at 1), the producer's TMA ring and the
    consumer's wgmma, in PTX that ptxas assembles for sm_90a honouring
    `setmaxnreg` (no C7508), with no spills and no serialised wgmma. The
    ABI records the 256 lanes."""
    kernel = etc.compile(_gemm(), target="cuda", chip="sm_90a", lanes=LANES, min_ctas=min_ctas)
    assert kernel.abi.lanes == LANES and kernel.runtime.lanes == LANES
    assert wgmma_tests.HOPPER.search(kernel.ir("graph"))
    ptx = kernel.ptx
    assert re.search(r"\.entry gemm_worker\([^)]*\)\s*\.maxntid 256, 1, 1\s*"
                     rf"\.minnctapersm {min_ctas}\s*\{{", ptx)
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in ptx
    producer, consumer, entry = counts
    for role, count in (("dec", producer), ("inc", consumer), ("inc", entry), ("dec", entry)):
        assert re.search(rf"setmaxnreg\.{role}\.sync\.aligned\.u32\s+{count};", ptx), (role, count)
    for instruction in ("mbarrier.arrive.expect_tx.shared.b64", "wgmma.mma_async"):
        assert instruction in ptx, instruction
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert "C7508" not in report, report
    assert "C7510" not in report, report
    assert_no_spills(report, stack=True)
    used = re.search(r"Function properties for gemm_worker.*?Used (\d+) registers", report, re.S)
    assert int(used.group(1)) == min(entry, 255), report
