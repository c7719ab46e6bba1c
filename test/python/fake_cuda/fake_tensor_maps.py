"""The fake driver's tensor maps (`cuTensorMapEncodeTiled`) and module
globals (`cuModuleGetGlobal`), for the TMA loads of the Hopper matmul tile
(`etc.runtime.cuda_tensor_maps`).

`encode_tiled` applies the driver's documented rules for a tiled map
(returning CUDA_ERROR_INVALID_VALUE and the reason, as the driver refuses
without one) and encodes the fields into the 16 words of a CUtensorMap in
a layout of its own (`FIELDS`, after the word MAGIC), which `decode`
reads back: the real object is opaque, so a test checks what the runtime
asked for, field by field.
"""

from __future__ import annotations

import re

#: The first word of a fake tensor map, then the fields in this order.
MAGIC = 0x50414D54_43544500  # "\0ETCTMAP"
FIELDS = ("dtype", "rank", "address", "dim0", "dim1", "stride0", "box0", "box1",
          "element_stride0", "element_stride1", "interleave", "swizzle", "l2", "oob")
#: Bytes per element of each CUtensorMapDataType (0..12).
ELEMENT_BYTES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4,
                 12: 4}
#: Bytes a row of the box may span in each swizzle mode (NONE: unbounded).
SWIZZLE_SPAN = {0: None, 1: 32, 2: 64, 3: 128}


def rules(dtype: int, rank: int, address: int, dims: list, strides: list, box: list,
          element_strides: list, interleave: int, swizzle: int) -> str | None:
    """Why the driver refuses these arguments, or None."""
    if dtype not in ELEMENT_BYTES:
        return f"tensorDataType {dtype} is not a CUtensorMapDataType"
    if not 1 <= rank <= 5 or (interleave != 0 and rank < 3):
        return f"tensorRank {rank} is not in [1, 5] (at least 3 with interleave)"
    if len(dims) != rank or len(strides) != rank - 1 or len(box) != rank \
            or len(element_strides) != rank:
        return "globalDim, boxDim, elementStrides need tensorRank entries, globalStrides one fewer"
    element = ELEMENT_BYTES[dtype]
    alignment = 32 if interleave == 2 else 16
    if address % alignment:
        return f"globalAddress {address:#x} is not {alignment}-byte aligned"
    for i, size in enumerate(dims):
        if not 1 <= size <= 1 << 32:
            return f"globalDim[{i}] = {size} is not in [1, 2^32]"
    for i, stride in enumerate(strides):
        if stride % alignment or stride >= 1 << 40:
            return f"globalStrides[{i}] = {stride} is not a multiple of {alignment} below 2^40"
    if strides and strides[0] < dims[0] * element:
        return f"globalStrides[0] = {strides[0]} is less than a row ({dims[0] * element} bytes)"
    for i, size in enumerate(box):
        if not 1 <= size <= 256:
            return f"boxDim[{i}] = {size} is not in [1, 256]"
    for i, step in enumerate(element_strides):
        if not 1 <= step <= 8:
            return f"elementStrides[{i}] = {step} is not in [1, 8]"
    if interleave == 0:
        inner = box[0] * element
        if inner % 16:
            return f"boxDim[0] * element size = {inner} bytes is not a multiple of 16"
        if swizzle not in SWIZZLE_SPAN:
            return f"swizzle {swizzle} is not supported here"
        span = SWIZZLE_SPAN[swizzle]
        if span is not None and inner > span:
            return f"boxDim[0] * element size = {inner} bytes exceeds the swizzle's {span}"
    return None


def encode(fields: dict) -> list[int]:
    words = [MAGIC] + [int(fields[name]) for name in FIELDS]
    return words + [0] * (16 - len(words))


def decode(words) -> dict:
    """The fields of a fake tensor map (16 words), or ValueError."""
    words = [int(w) for w in words]
    if words[0] != MAGIC:
        raise ValueError("not a tensor map the fake driver encoded")
    return dict(zip(FIELDS, words[1:]))


def global_size(ptx: str, name: str) -> int | None:
    """Bytes of the module global `name` the PTX declares (`.b8 name[n]`), or None."""
    found = re.search(rf"^\s*(?:\.visible\s+)?\.global\s+(?:\.align\s+\d+\s+)?\.b8\s+"
                      rf"{re.escape(name)}\[(\d+)\]", ptx, re.M)
    return int(found.group(1)) if found else None
