"""bfloat16 storage for NumPy, which has no bfloat16 dtype.

A bf16 value is the upper 16 bits of a float32. ETC's reference and every
runtime convert float32 arrays with these two functions, so that both round
the same way: to nearest, ties to even; values beyond the bf16 range become
infinities; NaN stays NaN (quiet, same sign).
"""

from __future__ import annotations

import numpy as np


def to_bits(x) -> np.ndarray:
    """The bf16 bit patterns (uint16) nearest to the float32 values of `x`."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # Rounding a NaN's mantissa could carry into the exponent (giving an
    # infinity or -0); keep its sign and make it the quiet NaN.
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x7FC0
    return rounded


def from_bits(bits) -> np.ndarray:
    """float32 values holding the bf16 bit patterns `bits` (uint16)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
