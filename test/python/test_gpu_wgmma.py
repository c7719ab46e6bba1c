"""The Hopper matmul tile (`MatmulWGMMA`, sm_90a): the wgmma layouts,
descriptors and swizzles of `etc.ops.wgmma` against a NumPy model written
from the PTX ISA's text; the tile's numerics with its lanes simulated on the
CPU (wgmma emulated from the simulated shared memory through the
descriptors, the mbarrier ring's phases emulated); that a wrong swizzle,
descriptor (mode, SBO) or phase parity computes a wrong result there; the
family chooser; and the PTX it assembles to.

No GPU needed: the GPU check kit (kit/families.py, kit/benchmarks.py) runs
and times the same tile on one.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
from etc.ops import wgmma
from etc.ops.matmul_wgmma import MatmulWGMMA
import test_gpu_mma as mma_tests
from ptxas_check import assemble, assert_no_spills, needs_ptxas

#: A Hopper tile function: `matmul_wgmma` (known rows) or
#: `matmul_gemv_t_wgmma` (symbolic rows, with the GEMV for few rows).
HOPPER = re.compile(r"_tile_matmul(_gemv_t)?_wgmma_")



# ----------------------------------------------------------------------
# The NumPy model, from the PTX ISA ("Asynchronous Warpgroup Level Matrix
# Multiply-Accumulate Instructions": "Register Fragments", "Shared Memory
# Matrix Layout", "Matrix Descriptor Format")
# ----------------------------------------------------------------------


def _model_place(matrix: np.ndarray, mode: str, stride: int, leading: int = 0) -> np.ndarray:
    """Shared memory (as 16-bit words from address 0) holding `matrix`
    (rows along M or N, 8 * span / 16 columns along K) in a K-major layout.

    Swizzled (W = 128, 64, 32 bytes per row): 8-row atoms `stride` bytes
    apart; row r of an atom at r W bytes; its 16-byte chunks permuted as
    the ISA's figures draw them: 128B: chunk c at c ^ r; 64B: at
    c ^ (r / 2); 32B: at c ^ (r / 4). Interleave: 8 x 16-byte core
    matrices, rows 16 bytes apart, `leading` bytes between core matrices
    along K, `stride` along M/N."""
    rows, cols = matrix.shape
    words = np.full(1 << 16, -1, np.int64)
    for r in range(rows):
        for c in range(cols // 8):
            chunk = matrix[r, 8 * c:8 * c + 8]
            if mode == "interleave":
                at = (r // 8) * stride + c * leading + (r % 8) * 16
            else:
                span = wgmma.SPAN[mode]
                turn = {128: r % 8, 64: r % 8 // 2, 32: r % 8 // 4}[span]
                at = (r // 8) * stride + (r % 8) * span + (c ^ turn) * 16
            words[at // 2:at // 2 + 8] = chunk
    return words


def _model_fragment_d() -> dict:
    """(lane, value) -> (row, column) of the m64nNk16 accumulator, drawn as
    the ISA's figure: each warp w owns rows 16 w .. 16 w + 15 and, like
    mma.m16n8, each 8-column block j: d[4 j + 0, 1] in row groupID, d[4 j
    + 2, 3] in row groupID + 8, columns 8 j + 2 threadID_in_group + {0, 1}."""
    out = {}
    for lane in range(128):
        warp, group, thread = lane // 32, lane % 32 // 4, lane % 4
        for j in range(256 // 8):
            for h in range(4):
                out[lane, 4 * j + h] = (16 * warp + group + 8 * (h // 2), 8 * j + 2 * thread + h % 2)
    return out


def test_descriptor_bits():
    """Start, LBO, SBO in 16-byte units at bits 0, 16, 32; the swizzle
    mode at bits 62-63 (128B: 1, 64B: 2, 32B: 3)."""
    assert wgmma.descriptor(0x4400, 16, 1024, "128B") == \
        0x440 | (1 << 16) | (64 << 32) | (1 << 62)
    assert wgmma.descriptor(0x400, 128, 256, "interleave") == 0x40 | (8 << 16) | (16 << 32)
    assert wgmma.descriptor(0, 0, 0, "64B") >> 62 == 2
    assert wgmma.descriptor(0, 0, 0, "32B") >> 62 == 3
    # Only 18 bits of the address are encoded (the shared window).
    assert wgmma.encode(0x40000 + 0x30) == 3


@pytest.mark.parametrize("mode", ["128B", "64B", "32B"])
def test_kernel_swizzle_matches_model(mode):
    """The kernel's placement (`swizzle` of each chunk's unswizzled
    address) is the layout the ISA draws."""
    span = wgmma.SPAN[mode]
    rows, cols = 24, span // 2
    matrix = np.arange(rows * cols).reshape(rows, cols)
    want = _model_place(matrix, mode, 8 * span)
    got = np.full_like(want, -1)
    for r in range(rows):
        for c in range(cols // 8):
            at = wgmma.swizzle(r * span + c * 16, mode)
            got[at // 2:at // 2 + 8] = matrix[r, 8 * c:8 * c + 8]
    np.testing.assert_array_equal(got, want)


LAYOUTS = [("128B", 1024, 16, 4), ("128B", 2048, 16, 4), ("64B", 512, 16, 2),
           ("32B", 256, 16, 1), ("interleave", 512, 128, 2), ("interleave", 128, 2048, 2)]


@pytest.mark.parametrize("mode, stride, leading, slices", LAYOUTS,
                         ids=[f"{m}-sbo{s}-lbo{l}" for m, s, l, _ in LAYOUTS])
def test_operand_address_reads_the_model(mode, stride, leading, slices):
    """The hardware side (`operand_address`, what `emulate` reads): for
    every element of a 64 x 16 operand and every 16-wide K slice (the
    descriptor's start advanced by 32 bytes per slice inside a swizzled
    row), decoding the descriptor finds the element where the model
    placed it; atoms start on an atom-aligned address (base offset 0)."""
    cols = 16 * slices
    rng = np.random.default_rng(1)
    matrix = rng.permutation(64 * cols).reshape(64, cols)
    base = 4096
    words = np.roll(_model_place(matrix, mode, stride, leading), base // 2)
    for s in range(slices):
        if mode == "interleave":
            start = base + s * 2 * leading  # two core matrices per slice
        else:
            start = base + s * 32
        desc = wgmma.descriptor(start, leading, stride, mode)
        for row in range(64):
            for col in range(16):
                at = wgmma.operand_address(desc, row, col)
                assert words[at // 2] == matrix[row, 16 * s + col], (s, row, col)


def test_wrong_lbo_or_sbo_reads_other_elements():
    """The LBO steers the interleaved layout (a swizzled K-major one
    ignores it, as the ISA says), the SBO every layout."""
    matrix = np.arange(64 * 16).reshape(64, 16)
    words = _model_place(matrix, "interleave", 256, 128)

    def reads(desc):
        return np.array([[words[wgmma.operand_address(desc, r, c) // 2] for c in range(16)]
                         for r in range(64)])
    np.testing.assert_array_equal(reads(wgmma.descriptor(0, 128, 256, "interleave")), matrix)
    assert (reads(wgmma.descriptor(0, 256, 256, "interleave")) != matrix).any()
    assert (reads(wgmma.descriptor(0, 128, 512, "interleave")) != matrix).any()
    swizzled = _model_place(np.arange(64 * 64).reshape(64, 64), "128B", 1024)
    for lbo in (16, 4096):
        desc = wgmma.descriptor(0, lbo, 1024, "128B")
        assert swizzled[wgmma.operand_address(desc, 9, 15) // 2] == 9 * 64 + 15


def test_fragment_d_is_the_isa_figure():
    """Each lane's accumulator values are where the figure puts them, and
    the 128 lanes' N / 2 values cover the 64 x N tile once."""
    model = _model_fragment_d()
    for n in (8, 64, 256):
        seen = set()
        for lane in range(128):
            for i in range(n // 2):
                place = wgmma.fragment_d(lane, i)
                assert place == model[lane, i]
                seen.add(place)
        assert seen == {(r, c) for r in range(64) for c in range(n)}


# ----------------------------------------------------------------------
# The tile under lane simulation
# ----------------------------------------------------------------------


def _matmul(m, k: int, n: int, dtype: str, tile=None, transpose_b: bool = True) -> etc.Graph:
    return mma_tests._matmul(m, k, n, dtype, transpose_b, tile=tile)


def _check(g: etc.Graph, dtype: str, rows_values, *, chosen: bool = True, seed: int = 3,
           chip: str = "sm_90a", **options) -> None:
    mma_tests._check(g, dtype, rows_values, chosen=chosen, seed=seed, chip=chip,
                     kernels=HOPPER, **options)


# (rows, K, N): one step and one stage; five steps round the three-stage
# ring (refills, both phases of every barrier); rows not a multiple of 64,
# two 64-row blocks per tile (128-row tiles).
SHAPES = [(64, 64, 64), (70, 320, 64), (130, 192, 128), (16, 128, 32)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_wgmma_static_shapes(shape, dtype):
    m, k, n = shape
    _check(_matmul(m, k, n, dtype), dtype, (m,), seed=m + k + n)


TILES = [(128, 128), (64, 256), (32, 64), (192, 16)]


@pytest.mark.parametrize("tile", TILES, ids=["x".join(map(str, t)) for t in TILES])
def test_wgmma_user_tiles(tile):
    """Wide accumulators (n = 128, 256), a 32-row tile computing a whole
    64-row block and storing half, three 64-row blocks with n = 16."""
    _check(_matmul(260, 256, 256, "bf16", tile=tile), "bf16", (260,))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_symbolic_rows(dtype):
    """One kernel for every batch: tiles of 16 rows or more take wgmma
    (full, partial tiles), fewer the transposed GEMV."""
    _check(_matmul(None, 192, 128, dtype), dtype, (1, 5, 16, 20, 37, 64, 100))


def test_wgmma_symbolic_rows_fit_without_opting_in():
    """Symbolic rows (the tile sits in a model's worker) on 128 x 128
    tiles: three 128-byte-swizzled stages (96 KB) would need the CTA to opt
    in past 48 KB, so the ring holds two stages of 32 K-columns in the
    64-byte swizzle (33 KB); known rows keep three 128-byte stages."""
    g = _matmul(None, 320, 256, "bf16", tile=(128, 128))
    assert etc.compile(g, target="cuda", chip="sm_90a").abi.shared_bytes == 1024 + 2 * 16384 + 32
    _check(g, "bf16", (5, 100, 130, 260))
    known = _matmul(260, 320, 256, "bf16", tile=(128, 128))
    assert etc.compile(known, target="cuda", chip="sm_90a").abi.shared_bytes == \
        1024 + 3 * 32768 + 48


def test_wgmma_residual():
    """The residual store path: C = x W^T + r."""
    g = etc.Graph("mm")
    x = g.input("x", (80, 128), "bf16")
    w = g.input("w", (64, 128), "bf16")
    r = g.input("r", (80, 64), "bf16")
    g.output(g.matmul(x, w, transpose_b=True, residual=r))
    _check(g, "bf16", (80,))


def test_chooser_sm90a_only():
    """wgmma needs sm_90a: sm_80 and sm_90 keep `MatmulMMA`; on sm_90a B
    (K, N) and K not a multiple of 64 keep it too."""
    g = _matmul(64, 128, 64, "bf16")
    for chip, want in (("sm_80", False), ("sm_90", False), ("sm_90a", True)):
        kernel = etc.compile(g, target="cpu", kernels="cuda", chip=chip, workers=2)
        assert bool(HOPPER.search(kernel.ir("graph"))) == want, chip
        assert "_tile_matmul_mma_" in kernel.ir("graph") or want
    for g in (_matmul(64, 128, 64, "bf16", transpose_b=False), _matmul(64, 96, 64, "bf16")):
        kernel = etc.compile(g, target="cpu", kernels="cuda", chip="sm_90a", workers=2)
        text = kernel.ir("graph")
        assert not HOPPER.search(text) and "_tile_matmul_mma_" in text


# ----------------------------------------------------------------------
# Mutations: each breaks what the emulation decodes, and the result
# ----------------------------------------------------------------------

#: Five steps through three stages: every barrier completes phases 0 and 1.
RING = (70, 320, 64)


def _fails(monkeypatch, target, name, replacement) -> None:
    monkeypatch.setattr(target, name, replacement)
    with pytest.raises(AssertionError):
        _check(_matmul(*RING, "f16"), "f16", (RING[0],))


def test_wrong_swizzle_fails(monkeypatch):
    """Operands placed with the 64-byte pattern, read with the 128-byte one."""
    right = wgmma.swizzle
    _fails(monkeypatch, wgmma, "swizzle", lambda address, mode: right(address, "64B"))


def test_unswizzled_placement_fails(monkeypatch):
    _fails(monkeypatch, wgmma, "swizzle", lambda address, mode: address)


@pytest.mark.parametrize("change", ["mode", "sbo", "start"])
def test_wrong_descriptor_fails(monkeypatch, change):
    """A descriptor saying 64-byte swizzle, an SBO of 512 (half an atom),
    or a K slice's start not advanced."""
    right = wgmma.descriptor

    def wrong(start, leading, stride, mode):
        if change == "mode":
            return right(start, leading, stride, "64B")
        if change == "sbo":
            return right(start, leading, 512, mode)
        return right(start - (start & 0x60), leading, stride, mode)
    _fails(monkeypatch, wgmma, "descriptor", wrong)


@pytest.mark.parametrize("offset", [0, 1], ids=["producer", "consumer"])
def test_wrong_phase_fails(monkeypatch, offset):
    """A wait for the other parity (the producer's empty wait, or the
    consumer's full wait) would hang on the GPU: the emulation flags it
    and the tile's results are NaN."""
    right = MatmulWGMMA._parity

    def wrong(self, step, at):
        parity = right(self, step, at)
        if at == offset:
            return parity
        from mlir.dialects import arith
        return arith.xori(parity, self.cidx(1))
    _fails(monkeypatch, MatmulWGMMA, "_parity", wrong)


def test_missing_arrival_fails(monkeypatch):
    """A consumer that never releases its stage: the refill's wait would
    hang."""
    _fails(monkeypatch, wgmma.Barriers, "arrive", lambda self, barrier: None)


# ----------------------------------------------------------------------
# PTX
# ----------------------------------------------------------------------


def _function(ptx: str, name: str) -> str:
    """The PTX of function or kernel `name`, up to the next one (its
    inline wgmma blocks end in "}" lines of their own)."""
    start = r"(?:\.visible |\.weak )?\.(?:entry|func) "
    for chunk in re.split(rf"\n(?={start})", ptx):
        if re.match(rf"{start}(?:\([^)]*\) )?{name}\(", chunk):
            return chunk
    raise AssertionError(f"no function {name} in the PTX")


@needs_ptxas
def test_wgmma_ptx(tmp_path):
    """Known rows, each dtype: wgmma from descriptors with f32 accumulators,
    the mbarrier ring (init, cp.async arrivals, bounded parity waits,
    arrivals, inval), the proxy fence, one wgmma group in flight in the
    loop; inlined in the worker, which ptxas assembles for sm_90a with no
    spills, no stack and no serialised wgmma."""
    g = etc.Graph("gemm")
    for dtype in ("f16", "bf16"):
        x = g.input(f"x_{dtype}", (512, 512), dtype)
        wt = g.input(f"wt_{dtype}", (4096, 512), dtype)
        g.output(g.matmul(x, wt, transpose_b=True))
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    kinds = set(re.findall(r"_tile_(matmul\w*?)_\d+\(", kernel.ir("graph")))
    assert kinds == {"matmul_wgmma"}, kinds
    ptx = kernel.ptx
    worker = _function(ptx, "gemm_worker")
    for dtype in ("f16", "bf16"):
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.{dtype}\.{dtype}",
                         worker), dtype
    for instruction in ("mbarrier.init.shared.b64", "cp.async.mbarrier.arrive.noinc.shared.b64",
                        "mbarrier.try_wait.parity.shared.b64", "mbarrier.arrive.shared.b64",
                        "fence.proxy.async.shared::cta", "wgmma.fence.sync.aligned",
                        "wgmma.commit_group.sync.aligned", "cp.async.cg.shared.global",
                        "mbarrier.inval.shared.b64", "%globaltimer", "__etc_watchdog_report"):
        assert instruction in worker, instruction
    # A hung barrier wait reports through the watchdog's record instead.
    assert "trap;" not in worker
    # One group in flight in the loop, none after it.
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", worker)
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", worker)
    assert not re.search(r"call(\.uni)?\s+\S*matmul_wgmma", worker)
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert_no_spills(report, stack=True)
    assert "C7510" not in report, report
    registers = re.search(r"Compiling entry function 'gemm_worker'.*?Used (\d+) registers",
                          report, re.S).group(1)
    print(f"gemm_worker: {registers} registers, shared arena {kernel.abi.shared_bytes} bytes")


@needs_ptxas
def test_wgmma_symbolic_rows_ptx(tmp_path):
    """Symbolic rows: wgmma and the transposed GEMV in one function the
    worker calls (inlined, they made a model's worker spill), which ptxas
    assembles with no spills or stack; it serialises the wgmma across the
    call and says so (C7510), which the kit's prefill table measures."""
    g = etc.Graph("gemm")
    B = g.symbol("B")
    for dtype in ("f16", "bf16"):
        x = g.input(f"x_{dtype}", (B, 512), dtype)
        wt = g.input(f"wt_{dtype}", (1024, 512), dtype)
        g.output(g.matmul(x, wt, transpose_b=True))
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    ptx = kernel.ptx
    functions = re.findall(r"\.func (\w*matmul_gemv_t_wgmma_\d+)\(", ptx)
    assert len(functions) == 2, functions
    worker = _function(ptx, "gemm_worker")
    assert all(re.search(rf"call(\.uni)?\s+{f},", worker) for f in functions)
    for dtype in ("f16", "bf16"):
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.{dtype}\.{dtype}",
                         ptx), dtype
    assert "shfl.sync.bfly" in ptx  # the GEMV
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert_no_spills(report, stack=True)
    assert "C7510" in report, report
