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
    values = np.ascontiguousarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    # In 32 bits, with one temporary: a finite value or an infinity is at
    # most 0xFF800000 before rounding, so adding 0x8000 cannot wrap; NaNs,
    # which might, are set apart below.
    rounded = (bits >> 16) & 1
    rounded += bits
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype(np.uint16)
    # Rounding a NaN's mantissa could carry into the exponent (giving an
    # infinity or -0); keep its sign and make it the quiet NaN.
    nan = np.isnan(values)
    if nan.any():
        out[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x7FC0
    return out


def from_bits(bits) -> np.ndarray:
    """float32 values holding the bf16 bit patterns `bits` (uint16)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
