"""Packed weight formats: llama.cpp's block quantizations, and FP8
checkpoints' e4m3 weights, as ETC dtypes.

A packed weight is a graph input whose dtype names its block format
("q8_0", "q4_k", ...): its shape is that of the weight it stands for,
(..., K) with K a multiple of the format's block, and its storage is the
blocks themselves, K / block blocks of `nbytes` bytes per row, exactly as
a GGUF file stores them, so a file's tensor is used in place (a memory
map). Kernels read the blocks and dequantize in registers; the NumPy
meaning of every format is `dequantize`, which equals the `gguf`
package's `gguf.quants.dequantize` bit for bit (the same float32
operations in the same order).

The block layouts (ggml's `block_*` structs; `d`, `m`, `dmin` are float16):

| dtype | values | bytes | layout | value j |
|---|---|---|---|---|
| q8_0 | 32 | 34 | d, qs[32] int8 | qs[j] d |
| q4_0 | 32 | 18 | d, qs[16] | (nibble j - 8) d |
| q4_1 | 32 | 20 | d, m, qs[16] | nibble j d + m |
| q5_0 | 32 | 22 | d, qh u32, qs[16] | (nibble j + 16 bit j of qh - 16) d |
| q5_1 | 32 | 24 | d, m, qh u32, qs[16] | (nibble j + 16 bit j of qh) d + m |
| iq4_nl | 32 | 18 | d, qs[16] | IQ4_NL_VALUES[nibble j] d |
| mxfp4 | 32 | 17 | e (e8m0), qs[16] | MXFP4_VALUES[nibble j] 2^(e - 128) |
| q4_k | 256 | 144 | d, dmin, scales[12], qs[128] | (d sc_s) q - (dmin m_s) |
| q5_k | 256 | 176 | d, dmin, scales[12], qh[32], qs[128] | as q4_k, a fifth bit from qh |
| q6_k | 256 | 210 | ql[128], qh[64], scales[16] int8, d | (d sc_s) (q - 32) |
| fp8_e4m3 | 32 | 36 | s float32, qs[32] e4m3 | e4m3(qs[j]) s |

MXFP4 (OCP microscaling FP4, gpt-oss's format and llama.cpp's
MXFP4_MOE experts) is IQ4_NL's structure with other numbers: its
nibbles index the e2m1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their
negatives (nibble 8 is -0), stored doubled as the integers
`MXFP4_VALUES` (ggml's `kvalues_mxfp4`), and its scale is one unsigned
byte e, the power of two 2^(e - 127) (OCP's e8m0) halved for the
doubling: 2^(e - 128), every e finite (ggml's `GGML_E8M0_TO_FP32_HALF`
reads e = 255 as 2^127, not OCP's NaN; e = 0 and 1 are the float32
subnormals 2^-128 and 2^-127). ggml's quantizer writes e <= 252 for
finite weights; above, values of 8 and 12 times the scale overflow to
infinities (ggml's too), so `first_bad_block` calls such a block damaged.

K-quant blocks hold 8 sub-blocks of 32 values with 6-bit scales and
minimums sc_s, m_s (Q6_K: 16 of 16 with int8 scales sc_s).
"nibble j" of a 32-value block: the low nibble of qs[j] for j < 16, the
high nibble of qs[j - 16] after. K-quant blocks take their 32-value groups
from 32 bytes of qs (low nibbles: group 2g, high nibbles: group 2g + 1).

fp8_e4m3 is ETC's own (no GGML type): the weights of FP8 checkpoints
(`quantization_config` `quant_method: "fp8"`, float8_e4m3fn values with a
float32 scale per 128 x 128 block), repacked at load so that each block
of 32 values of a row carries its scale (`etc.models.loading.fp8`).
e4m3(q) is the float8_e4m3fn value of byte q: sign bit 7, 4 exponent
bits (bias 7), 3 mantissa bits, subnormals below 2^-6, no infinities;
0x7F and 0xFF are NaN, which checkpoints do not hold (`first_bad_block`
finds them). It is computed, in the kernels too, as the float16 whose
bits are (q & 0x80) << 8 | (q & 0x7F) << 7, times 256: exactly the e4m3
value (float16 has e4m3's subnormals and more), so `dequantize` equals
transformers' `weight.float() * scale` bit for bit.

The GPU layout (`to_gpu_layout`): CUDA kernels read a block's quants in
16-byte loads (`ld.global.v4`), which a GGUF block of 34 (q8_0), 18, 20,
22, 24, 17 (mxfp4) or 210 (q6_k) bytes does not allow: only its 2-byte
fields are aligned (mxfp4's not even those). The device copy of such a
weight is therefore repacked once, as it is uploaded (the CUDA runtime
does it for NumPy inputs and for
`device_array(host, dtype=...)`, and records it on the device array):
the blocks' bytes are split into fields (`GPU_FIELDS`: the quants first,
then the high bits, scales and minimums) and each field of every block
of the whole tensor is stored together, in block order:

    [field 0 of block 0, of block 1, ...][field 1 of block 0, ...]...

Block b's field f lies at blocks x (sizes of the fields before f) +
b x size(f) (`gpu_field_offset`), b counting the blocks of the whole
tensor row by row (a stack of experts: expert by expert). The quants'
field is a multiple of 16 bytes (q8_0 and fp8_e4m3: 32, the 4-bit
formats 16, q6_k's ql and qh 192) and the first, so every block's quants
are 16-byte aligned in a 256-byte aligned allocation; each later field's
start is a multiple of its size (4: qh, d and m, fp8's scale; 16: q6_k's
scales; 2: float16 d; 1: mxfp4's e). The tensor keeps its storage shape and byte count
(a permutation of its bytes), so the kernels' buffers are unchanged.
q4_k (144 bytes) and q5_k (176) are multiples of 16 already and keep the
GGUF layout: `gpu_repacked` says which formats are repacked. CPU kernels
read the GGUF layout (the file's bytes in place).

This module needs only NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["Format", "FORMATS", "GGML_FORMATS", "IQ4_NL_VALUES", "MXFP4_VALUES",
           "MXFP4_LARGEST_E", "e8m0_half", "is_packed", "storage_shape",
           "row_bytes", "dequantize", "quantize", "quantize_activations", "check_storage",
           "first_bad_block", "e4m3_values", "to_e4m3", "GPU_FIELDS", "gpu_repacked",
           "to_gpu_layout", "from_gpu_layout", "gpu_field_offset"]


@dataclass(frozen=True)
class Format:
    """One block format: its ETC dtype name, the GGML type (name and id)
    it is (None for ETC's own), values and bytes per block, and the byte
    offsets of its float16 fields (scales and minimums) in a block."""

    name: str
    ggml: Optional[str]
    ggml_id: Optional[int]
    block: int
    nbytes: int
    halves: tuple = (0,)


#: The formats by ETC dtype name.
FORMATS = {f.name: f for f in (
    Format("q4_0", "Q4_0", 2, 32, 18),
    Format("q4_1", "Q4_1", 3, 32, 20, (0, 2)),
    Format("q5_0", "Q5_0", 6, 32, 22),
    Format("q5_1", "Q5_1", 7, 32, 24, (0, 2)),
    Format("q8_0", "Q8_0", 8, 32, 34),
    Format("q4_k", "Q4_K", 12, 256, 144, (0, 2)),
    Format("q5_k", "Q5_K", 13, 256, 176, (0, 2)),
    Format("q6_k", "Q6_K", 14, 256, 210, (208,)),
    Format("iq4_nl", "IQ4_NL", 20, 32, 18),
    Format("mxfp4", "MXFP4", 39, 32, 17, ()),
    Format("fp8_e4m3", None, None, 32, 36, ()),
)}
#: The formats that are GGML types (those a GGUF file may hold).
GGML_FORMATS = tuple(name for name, f in FORMATS.items() if f.ggml is not None)
#: The K-quant formats (their blocks of 256 values are sub-blocks with
#: integer scales), whose CPU products quantize the activations per 256
#: values.
K_FORMATS = tuple(name for name, f in FORMATS.items() if f.block == 256)

#: The 16 values IQ4_NL's nibbles index (ggml's `kvalues_iq4nl`).
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
                          89, 113], dtype=np.int8)

#: The 16 values MXFP4's nibbles index: e2m1's values doubled (ggml's
#: `kvalues_mxfp4`; nibble 8 is e2m1's -0).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                        dtype=np.int8)

#: The largest e ggml's MXFP4 quantizer writes for finite float32 weights.
MXFP4_LARGEST_E = 252


def e8m0_half(e) -> np.ndarray:
    """MXFP4's block scale 2^(e - 128) of e8m0 bytes `e` as float32 (ggml's
    `GGML_E8M0_TO_FP32_HALF`): the float32 bits (e - 1) << 23 for e >= 2,
    the subnormals 0x00200000 << e for e = 0, 1; exact for every byte."""
    e = np.asarray(e, np.uint8).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.view(np.float32)


def is_packed(dtype: str) -> bool:
    """Whether `dtype` names a packed format."""
    return dtype in FORMATS


def row_bytes(dtype: str, k: int) -> int:
    """Bytes of `k` values of `dtype` (k a multiple of its block)."""
    f = FORMATS[dtype]
    if k % f.block:
        raise ValueError(f"{dtype}: {k} values are not whole blocks of {f.block}")
    return k // f.block * f.nbytes


def storage_shape(shape, dtype: str) -> tuple:
    """The uint8 storage of a `dtype` tensor of `shape` (..., K): (...,
    bytes of K values). Dimensions other than the last may be symbols."""
    return (*shape[:-1], row_bytes(dtype, shape[-1]))


def check_storage(name: str, dtype: str, array, shape=None) -> None:
    """Raises an error naming tensor `name` when `array` is not the uint8
    storage of a `dtype` tensor (of `shape`, when given)."""
    f = FORMATS[dtype]
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{name!r}: a {dtype} tensor is stored as uint8 blocks of {f.nbytes} "
                        f"bytes, got {got}")
    if array.ndim == 0 or array.shape[-1] % f.nbytes:
        raise ValueError(f"{name!r}: {dtype} rows are whole blocks of {f.nbytes} bytes, got "
                         f"shape {array.shape}")
    if shape is not None and tuple(array.shape) != storage_shape(shape, dtype):
        raise ValueError(f"{name!r}: a {dtype} tensor of shape {tuple(shape)} is stored as "
                         f"{storage_shape(shape, dtype)} bytes, got {array.shape}")


def first_bad_block(raw: np.ndarray, dtype: str):
    """The index of the first block of storage `raw` whose float16 scale or
    minimum is not finite (a damaged tensor: every value of the block would
    be NaN or infinite), or None. An fp8_e4m3 block is bad when its float32
    scale is not finite or one of its values is e4m3's NaN; an mxfp4 block
    when its e is above MXFP4_LARGEST_E (no quantizer writes it: values
    of it overflow float32)."""
    f = FORMATS[dtype]
    blocks = raw.reshape(-1, f.nbytes)
    bad = np.zeros(blocks.shape[0], bool)
    if dtype == "fp8_e4m3":
        # The float32's exponent bits all set (bits 23-30: bytes 2 and 3).
        scale = ((blocks[:, 3] & 0x7F) == 0x7F) & ((blocks[:, 2] & 0x80) == 0x80)
        bad = scale | ((blocks[:, 4:] & 0x7F) == 0x7F).any(axis=-1)
    if dtype == "mxfp4":
        # A scale above any ggml's quantizer writes for finite weights
        # (floor(log2(float32 max)) - 2 + 127 = 252): 8 2^(253 - 128)
        # and more are infinite.
        bad = blocks[:, 0] > MXFP4_LARGEST_E
    for at in f.halves:
        # The exponent bits all set: an infinity or a NaN.
        bits = blocks[:, at + 1] & 0x7C
        bad |= bits == 0x7C
    found = np.flatnonzero(bad)
    return int(found[0]) if found.size else None


# ----------------------------------------------------------------------
# Dequantization (gguf's float32 operations, in its order)
# ----------------------------------------------------------------------


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block, as float32 (blocks, 1)."""
    return np.ascontiguousarray(raw[:, at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """32-value groups from 16 bytes each: low nibbles, then high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Bit j of each block's little-endian u32 `qh` (4 bytes), j < 32."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a Q4_K / Q5_K block's 12 bytes
    (ggml's `get_scale_min_k4`), as float32 (blocks, 8, 1)."""
    low, mid, high = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([low & 0x3F, (high & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (high >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32)[:, :, None], mn.astype(np.float32)[:, :, None]


def _k_groups(qs: np.ndarray) -> np.ndarray:
    """The 8 groups of 32 nibbles of a K-quant block's 128 bytes (blocks,
    8, 32): group 2g is the low nibbles of bytes 32g..32g+31, group 2g+1
    their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 8, 32)


def e4m3_values(q: np.ndarray) -> np.ndarray:
    """The float32 values of float8_e4m3fn bytes `q` (uint8; NaN bytes
    read as 480): the float16 of bits (q & 0x80) << 8 | (q & 0x7F) << 7,
    times 256, as the kernels compute them."""
    q = np.asarray(q, np.uint8).astype(np.uint16)
    bits = ((q & 0x80) << 8) | ((q & 0x7F) << 7)
    return bits.view(np.float16).astype(np.float32) * np.float32(256)


def to_e4m3(values) -> np.ndarray:
    """float32 `values` rounded to float8_e4m3fn bytes (uint8): to nearest,
    ties to even, saturating at +-448 (transformers' FP8 quantizer clamps
    to that range before rounding)."""
    x = np.asarray(values, np.float32)
    magnitude = np.minimum(np.abs(x), np.float32(448))
    _, exponent = np.frexp(magnitude)  # magnitude = f 2^exponent, 0.5 <= f < 1
    # The spacing of e4m3 values near each magnitude: 2^(e - 3) for normal
    # values 2^e <= |x| < 2^(e + 1), 2^-9 for subnormals (below 2^-6).
    step = np.ldexp(np.float32(1), np.maximum(exponent - 1, -6) - 3).astype(np.float32)
    rounded = np.rint(magnitude / step) * step  # exact: a power-of-two step
    # The value / 256 is a float16 whose top 7 bits below the sign are q's.
    half = (rounded / np.float32(256)).astype(np.float16).view(np.uint16)
    sign = np.signbit(x).astype(np.uint16) << 7
    return (((half >> 7) & 0x7F) | sign).astype(np.uint8)


def _dequantize_blocks(raw: np.ndarray, dtype: str) -> np.ndarray:
    """(blocks, nbytes) uint8 -> (blocks, block) float32."""
    if dtype == "fp8_e4m3":
        scale = np.ascontiguousarray(raw[:, :4]).view("<f4").astype(np.float32)
        return e4m3_values(raw[:, 4:]) * scale
    if dtype == "q8_0":
        return raw[:, 2:].view(np.int8).astype(np.float32) * _f16(raw, 0)
    if dtype == "mxfp4":
        with np.errstate(over="ignore"):  # e > 252 (`first_bad_block`): infinities, as ggml's
            return e8m0_half(raw[:, :1]) * MXFP4_VALUES[_nibbles(raw[:, 1:])].astype(np.float32)
    if dtype in ("q4_0", "iq4_nl"):
        q = _nibbles(raw[:, 2:])
        values = (q.astype(np.int8) - np.int8(8)) if dtype == "q4_0" else IQ4_NL_VALUES[q]
        return _f16(raw, 0) * values.astype(np.float32)
    if dtype == "q4_1":
        return _f16(raw, 0) * _nibbles(raw[:, 4:]).astype(np.float32) + _f16(raw, 2)
    if dtype in ("q5_0", "q5_1"):
        at = 2 if dtype == "q5_0" else 4
        q = _nibbles(raw[:, at + 4:]) | (_fifth_bits(raw[:, at:at + 4]) << 4)
        if dtype == "q5_0":
            return _f16(raw, 0) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)
        return _f16(raw, 0) * q.astype(np.float32) + _f16(raw, 2)
    if dtype in ("q4_k", "q5_k"):
        n = raw.shape[0]
        sc, mn = _k_scales(raw[:, 4:16])
        d = _f16(raw, 0)[:, :, None] * sc
        dm = _f16(raw, 2)[:, :, None] * mn
        if dtype == "q4_k":
            q = _k_groups(raw[:, 16:144])
        else:
            high = raw[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            q = _k_groups(raw[:, 48:176]) | ((high & 1) << 4)
        return (d * q.astype(np.float32) - dm).reshape(n, 256)
    if dtype == "q6_k":
        n = raw.shape[0]
        ql = raw[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        ql = (ql & 0x0F).reshape(n, 8, 32)
        qh = raw[:, 128:192].reshape(n, 2, 1, 32) >> \
            np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        qh = (qh & 0x03).reshape(n, 8, 32)
        q = ((ql | (qh << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16)
        scales = raw[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(raw, 208)[:, :, None] * scales[:, :, None]
        return (d * q.astype(np.float32)).reshape(n, 256)
    raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")


def dequantize(raw, dtype: str, shape=None) -> np.ndarray:
    """The float32 values of packed storage `raw` (uint8 (..., bytes per
    row)) of format `dtype`, shaped (..., K), or `shape` when given."""
    f = FORMATS.get(dtype)
    if f is None:
        raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim == 0 or raw.shape[-1] % f.nbytes:
        raise ValueError(f"{dtype} storage must be uint8 rows of whole {f.nbytes}-byte blocks, "
                         f"got {raw.dtype}{list(raw.shape)}")
    out_shape = (*raw.shape[:-1], raw.shape[-1] // f.nbytes * f.block)
    blocks = np.ascontiguousarray(raw).reshape(-1, f.nbytes)
    values = _dequantize_blocks(blocks, dtype).reshape(out_shape)
    return values if shape is None else values.reshape(shape)


def activation_block(dtypes) -> int:
    """The values per block of quantized activations with which the CPU's
    packed kernels multiply weights of `dtypes` (the formats one tile
    multiplies the same activations with): 256 where they are all
    K-quants (one scale per K-quant block, so that the sub-block scales
    multiply integers, as llama.cpp's Q8_K activations), else 32."""
    dtypes = list(dtypes)
    return 256 if dtypes and all(d in K_FORMATS for d in dtypes) else 32


def quantize_activations(x, block: int = 32) -> np.ndarray:
    """What the CPU's packed matmul kernels multiply a packed weight with:
    each block of `block` values (32, or 256 for K-quant weights:
    `activation_block`) of float32 `x` (..., K) rounded to q d, where
    d = max|x| / 127 and q = roundeven(x * (127 / max|x|)) (-127 .. 127;
    0 for a block of zeros), as float32. The kernels' product is that of
    these values and the dequantized weight, up to float32 rounding; the
    widened product differs by at most sum_k |w_k| d(k) / 2."""
    if block not in (32, 256):
        raise ValueError(f"quantize_activations: block must be 32 or 256, not {block!r}")
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, block)
    largest = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inverse = np.where(largest > 0, np.float32(127) / largest, np.float32(0))
    q = np.rint(blocks * inverse.astype(np.float32))
    return (q * (largest / np.float32(127))).astype(np.float32).reshape(x.shape)


# ----------------------------------------------------------------------
# Quantization (for tests and for packing float weights)
# ----------------------------------------------------------------------


def _round_away(x: np.ndarray) -> np.ndarray:
    """Rounds half away from zero (C's roundf)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _signed_max(x: np.ndarray) -> np.ndarray:
    """The value of largest magnitude of each row (keeping its sign)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1)[:, None], axis=-1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(blocks, 32) values < 16 -> (blocks, 16) bytes: j low, j + 16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _as_bytes(values: np.ndarray, dtype) -> np.ndarray:
    return np.ascontiguousarray(values.astype(dtype)).view(np.uint8).reshape(values.shape[0], -1)


def _quantize_k(x: np.ndarray, top: int, with_high: bool) -> np.ndarray:
    """Q4_K (top 15) or Q5_K (top 31) blocks of (blocks, 256) values: each
    group of 32 gets an affine scale and minimum (the minimum clipped to
    at most 0), both quantized to 6 bits against the block's d and dmin."""
    n = x.shape[0]
    groups = x.reshape(n, 8, 32)
    low = np.minimum(groups.min(axis=-1), 0)
    scale = (groups.max(axis=-1) - low) / top
    d = (scale.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    dmin = (-low.min(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale * _inverse(d)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(-low * _inverse(dmin)), 0, 63).astype(np.uint8)
    step = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    q = np.clip(np.rint((groups + offset) * _inverse(step)), 0, top).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
                             mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)], axis=-1)
    pairs = q.reshape(n, 4, 2, 32)
    qs = ((pairs[:, :, 0] & 0x0F) | ((pairs[:, :, 1] & 0x0F) << 4)).reshape(n, 128)
    parts = [_as_bytes(d, np.float16), _as_bytes(dmin, np.float16), scales]
    if with_high:
        bits = (q >> 4).reshape(n, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        parts.append(np.bitwise_or.reduce(bits, axis=1))
    return np.concatenate(parts + [qs], axis=-1).astype(np.uint8)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks: 16 groups of 16 values, each with an int8 scale against
    the block's d, values -32 .. 31."""
    n = x.shape[0]
    groups = x.reshape(n, 16, 16)
    scale = np.abs(groups).max(axis=-1) / 31
    d = (scale.max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale * _inverse(d)), -128, 127).astype(np.int8)
    step = (d * sc.astype(np.float32))[:, :, None]
    q = (np.clip(np.rint(groups * _inverse(step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 2, 4, 32)  # halves of 128, then their four runs of 32
    ql = np.concatenate([(q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4),
                         (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)], axis=-1)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | \
        ((q[:, :, 3] >> 4) << 6)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8),
                           _as_bytes(d, np.float16)], axis=-1)


def _quantize_blocks(x: np.ndarray, dtype: str) -> np.ndarray:
    """(blocks, block) float32 -> (blocks, nbytes) uint8."""
    if dtype == "fp8_e4m3":
        scale = (np.abs(x).max(axis=-1, keepdims=True) / np.float32(448)).astype(np.float32)
        return np.concatenate([_as_bytes(scale, "<f4"), to_e4m3(x * _inverse(scale))], axis=-1)
    if dtype == "q8_0":
        d = np.abs(x).max(axis=-1, keepdims=True) / 127
        q = _round_away(x * _inverse(d)).astype(np.int8)
        return np.concatenate([_as_bytes(d, np.float16), q.view(np.uint8)], axis=-1)
    if dtype in ("q4_0", "q5_0"):
        top = 8 if dtype == "q4_0" else 16
        d = _signed_max(x) / -top
        q = np.minimum(np.trunc(x * _inverse(d) + np.float32(top + 0.5)), 2 * top - 1)
        q = q.astype(np.uint8)
        parts = [_as_bytes(d, np.float16)]
        if dtype == "q5_0":
            parts.append(np.packbits(q >> 4, axis=-1, bitorder="little"))
        return np.concatenate(parts + [_pack_nibbles(q & 0x0F)], axis=-1)
    if dtype in ("q4_1", "q5_1"):
        top = 15 if dtype == "q4_1" else 31
        low = x.min(axis=-1, keepdims=True)
        d = (x.max(axis=-1, keepdims=True) - low) / top
        q = np.minimum(np.trunc((x - low) * _inverse(d) + np.float32(0.5)), top).astype(np.uint8)
        parts = [_as_bytes(d, np.float16), _as_bytes(low, np.float16)]
        if dtype == "q5_1":
            parts.append(np.packbits(q >> 4, axis=-1, bitorder="little"))
        return np.concatenate(parts + [_pack_nibbles(q & 0x0F)], axis=-1)
    if dtype == "iq4_nl":
        d = _signed_max(x) / np.float32(IQ4_NL_VALUES[0])
        d16 = d.astype(np.float16).astype(np.float32)
        scaled = x * _inverse(d16)
        q = np.abs(scaled[:, :, None] - IQ4_NL_VALUES.astype(np.float32)).argmin(axis=-1)
        return np.concatenate([_as_bytes(d, np.float16), _pack_nibbles(q.astype(np.uint8))],
                              axis=-1)
    if dtype == "mxfp4":
        # ggml's reference quantizer: e from the block's largest magnitude
        # (its top e2m1 value 6 then covers up to 1.5 2^floor(log2 max)),
        # each value the nearest of the 16 (the first of equals). Blocks
        # below 2^-125 get e = 0 (ggml's byte cast would wrap).
        largest = np.abs(x).max(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            e = np.where(largest > 0, np.floor(np.log2(largest)) - 2 + 127, 0)
        e = np.clip(e, 0, 255).astype(np.uint8)
        d = e8m0_half(e)[:, :, None]
        errors = np.abs(d * MXFP4_VALUES.astype(np.float32) - x[:, :, None])
        return np.concatenate([e, _pack_nibbles(errors.argmin(axis=-1).astype(np.uint8))],
                              axis=-1)
    if dtype in ("q4_k", "q5_k"):
        return _quantize_k(x, 15 if dtype == "q4_k" else 31, dtype == "q5_k")
    if dtype == "q6_k":
        return _quantize_q6_k(x)
    raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")


def quantize(values, dtype: str) -> np.ndarray:
    """Packs float `values` (..., K), K a multiple of the block, as `dtype`
    storage (uint8 (..., bytes of K values)). Q8_0, Q4_0, Q4_1, Q5_0,
    Q5_1 and MXFP4 follow ggml's reference quantizers; the K-quants, IQ4_NL and
    fp8_e4m3 (scale max|x| / 448) take a plain choice of scales (ggml
    searches for better ones): any valid blocks serve the kernels' tests,
    which compare against `dequantize`."""
    f = FORMATS.get(dtype)
    if f is None:
        raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")
    x = np.asarray(values, np.float32)
    if x.ndim == 0 or x.shape[-1] % f.block:
        raise ValueError(f"quantize: {dtype} packs rows of whole blocks of {f.block} values, got "
                         f"shape {x.shape}")
    blocks = np.ascontiguousarray(x).reshape(-1, f.block)
    with np.errstate(invalid="ignore"):
        raw = _quantize_blocks(blocks, dtype)
    return raw.reshape(storage_shape(x.shape, dtype))


# ----------------------------------------------------------------------
# The GPU layout (see the module docstring)
# ----------------------------------------------------------------------

#: Each repacked format's fields, in the order the GPU layout stores them:
#: (first byte in the GGUF block, bytes). The quants come first.
GPU_FIELDS = {
    "q8_0": ((2, 32), (0, 2)),
    "q4_0": ((2, 16), (0, 2)),
    "iq4_nl": ((2, 16), (0, 2)),
    "mxfp4": ((1, 16), (0, 1)),
    "q4_1": ((4, 16), (0, 4)),
    "q5_0": ((6, 16), (2, 4), (0, 2)),
    "q5_1": ((8, 16), (4, 4), (0, 4)),
    "q6_k": ((0, 192), (192, 16), (208, 2)),
    "fp8_e4m3": ((4, 32), (0, 4)),
}


def gpu_repacked(dtype: str) -> bool:
    """Whether the device copy of a `dtype` weight is in the GPU layout
    (False: in the GGUF layout, as q4_k and q5_k are)."""
    if dtype not in FORMATS:
        raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")
    return dtype in GPU_FIELDS


def gpu_field_offset(dtype: str, start: int) -> tuple[int, int, int]:
    """The field of `dtype`'s GPU layout holding GGUF block byte `start`:
    (bytes per block of the fields stored before it, its size, its first
    byte in the GGUF block). Block b's byte `start` + i of that field is at
    blocks x before + b x size + (start - first) + i."""
    before = 0
    for first, size in GPU_FIELDS[dtype]:
        if first <= start < first + size:
            return before, size, first
        before += size
    raise ValueError(f"{dtype}: byte {start} of a block is in no field")


def _gpu_check(raw, dtype: str, what: str) -> np.ndarray:
    f = FORMATS.get(dtype)
    if f is None:
        raise ValueError(f"unknown packed format {dtype!r}; known: {', '.join(FORMATS)}")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim == 0 or raw.shape[-1] % f.nbytes:
        raise ValueError(f"{what}: {dtype} storage must be uint8 rows of whole {f.nbytes}-byte "
                         f"blocks, got {raw.dtype}{list(raw.shape)}")
    return raw


def to_gpu_layout(raw, dtype: str) -> np.ndarray:
    """GGUF storage `raw` (uint8 (..., bytes per row)) of format `dtype` in
    the GPU layout (same shape; see the module docstring). Formats that
    keep the GGUF layout (`gpu_repacked` false) come back as they are."""
    raw = _gpu_check(raw, dtype, "to_gpu_layout")
    if not gpu_repacked(dtype):
        return np.ascontiguousarray(raw)
    blocks = np.ascontiguousarray(raw).reshape(-1, FORMATS[dtype].nbytes)
    return np.concatenate([blocks[:, first:first + size].reshape(-1)
                           for first, size in GPU_FIELDS[dtype]]).reshape(raw.shape)


def from_gpu_layout(raw, dtype: str) -> np.ndarray:
    """The GGUF storage of `raw`, `dtype` storage in the GPU layout (the
    inverse of `to_gpu_layout`)."""
    raw = _gpu_check(raw, dtype, "from_gpu_layout")
    if not gpu_repacked(dtype):
        return np.ascontiguousarray(raw)
    nbytes = FORMATS[dtype].nbytes
    count = raw.size // nbytes
    flat = np.ascontiguousarray(raw).reshape(-1)
    blocks = np.empty((count, nbytes), np.uint8)
    at = 0
    for first, size in GPU_FIELDS[dtype]:
        blocks[:, first:first + size] = flat[at:at + count * size].reshape(count, size)
        at += count * size
    return blocks.reshape(raw.shape)
