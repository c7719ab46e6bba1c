"""NumPy arrays whose data starts on a 64-byte boundary: a cache line and
an AVX-512 register. NumPy aligns large arrays to 16 bytes only, and a
64-byte vector load from a row that starts elsewhere touches two cache
lines: the bf16 GEMM tiles ran at 0.66-0.78x their speed on such operands
(`etc.ops.matmul_dpbf16`; 2026-11-27). The CPU runtime allocates its
buffers and converted inputs so, and the model loaders their weights.

Needs only NumPy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ALIGNMENT", "empty", "zeros", "aligned", "is_aligned"]

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
