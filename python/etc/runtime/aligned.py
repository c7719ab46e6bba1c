"""NumPy arrays whose data starts on a 64-byte boundary: a cache line and
an AVX-512 register. NumPy aligns large arrays to 16 bytes only, and a
64-byte vector load from a row that starts elsewhere touches two cache
lines: the bf16 GEMM tiles ran at 0.66-0.78x their speed on such operands
(`etc.ops.matmul_dpbf16`; 2026-11-27). The CPU runtime allocates its
buffers and converted inputs so, and the model loaders their weights.

Needs only NumPy.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ALIGNMENT", "empty", "zeros", "aligned", "is_aligned", "new_output"]

#: Bytes the data of every array made here starts at a multiple of.
ALIGNMENT = 64


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised array of `shape` and `dtype`, 64-byte aligned (a
    view of a slightly larger byte buffer, which it keeps alive)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def zeros(shape, dtype) -> np.ndarray:
    """`empty`, filled with zeros."""
    out = empty(shape, dtype)
    out.fill(0)
    return out


def is_aligned(array: np.ndarray) -> bool:
    return array.ctypes.data % ALIGNMENT == 0


def aligned(array: np.ndarray) -> np.ndarray:
    """`array` itself when it is C-contiguous and aligned, else an aligned
    C-contiguous copy."""
    if array.flags.c_contiguous and is_aligned(array):
        return array
    out = empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


#: A run's new output arrays (no `out=`) of fewer bytes than this are
#: NumPy's own allocations, aligned to what the tiles' accesses claim (the
#: CPU runtime's OUT_ALIGNMENT); larger ones ALIGNMENT-aligned (`empty`),
#: which their tiles' full-line stores want. A decode step's output right
#: after its tiles streamed the weights finds Python's and NumPy's state
#: out of the caches: there `empty`'s extra NumPy calls took 40-70 us of a
#: 1 ms MLP call (`bench/cpu_tiles.py`, 2026-11-29), np.empty alone about
#: half.
SMALL_OUTPUT_BYTES = 64 * 1024


def new_output(shape: tuple, dtype, claimed: int) -> tuple:
    """A new output array of `shape` and `dtype` for the caller to keep,
    at least `claimed`-byte aligned, and its address (SMALL_OUTPUT_BYTES)."""
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < SMALL_OUTPUT_BYTES:
        array = np.empty(shape, dtype)
        address = array.ctypes.data
        if address % claimed == 0:
            return array, address
    array = empty(shape, dtype)
    return array, array.ctypes.data
