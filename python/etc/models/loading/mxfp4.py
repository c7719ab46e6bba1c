"""gpt-oss's MXFP4 experts as OpenAI's and Hugging Face's checkpoints store
them, repacked into `etc.packed`'s mxfp4 rows (ggml's block_mxfp4).

A checkpoint stores one projection of every expert as two U8 tensors:
`<name>_blocks` (E, out, in / 32, 16), the 4-bit codes of 32 values per
block, and `<name>_scales` (E, out, in / 32), each block's e8m0 exponent
byte. transformers' `convert_moe_packed_tensors` reads value 2 j of a
block from byte j's low nibble and value 2 j + 1 from its high nibble, as
FP4_VALUES[code] * 2^(scale - 127), FP4_VALUES e2m1's values (0, 0.5, 1,
1.5, 2, 3, 4, 6 and their negatives). ggml's block_mxfp4 holds the same
numbers otherwise: its byte e is the same exponent (its table is e2m1
doubled, its scale 2^(e - 128)), but byte j of its 16 holds value j (low
nibble) and value j + 16 (high nibble). Repacking is so a permutation of
nibbles, exact.
"""

from __future__ import annotations

import numpy as np

from ... import packed
from ...runtime import aligned

__all__ = ["repack", "BLOCK"]

#: Values per block.
BLOCK = 32


def repack(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Checkpoint MXFP4 `blocks` (..., G, 16) and `scales` (..., G) uint8 ->
    `etc.packed` mxfp4 storage (..., G * 17): per block its scale byte,
    then ggml's 16 bytes (value j in byte j's low nibble, value j + 16 in
    its high one)."""
    blocks = np.asarray(blocks, np.uint8)
    scales = np.asarray(scales, np.uint8)
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"mxfp4 blocks {blocks.shape} and scales {scales.shape}: expected "
                         f"(..., G, 16) and (..., G)")
    codes = np.empty(blocks.shape[:-1] + (BLOCK,), np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    out = aligned.empty(blocks.shape[:-2] + (blocks.shape[-2] * 17,), np.uint8)
    view = out.reshape(blocks.shape[:-1] + (17,))
    view[..., 0] = scales
    view[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out


def unpack(storage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `repack`: `etc.packed` mxfp4 storage (..., G * 17) ->
    checkpoint (blocks (..., G, 16), scales (..., G)) (for writing test
    checkpoints)."""
    storage = np.asarray(storage, np.uint8)
    view = storage.reshape(storage.shape[:-1] + (storage.shape[-1] // 17, 17))
    qs = view[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(view[..., 0])


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Checkpoint MXFP4 `blocks`, `scales` -> float32 (..., G * 32)."""
    storage = repack(blocks, scales)
    shape = storage.shape[:-1] + (storage.shape[-1] // 17 * BLOCK,)
    return packed.dequantize(storage, "mxfp4", shape)
