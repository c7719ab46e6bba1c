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

import numpy as np
import pytest

from etc.ops import wgmma

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
