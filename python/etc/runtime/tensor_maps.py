"""What a tensor map of ETC's TMA loads is, without MLIR (the CUDA runtime
encodes them; `etc.ops.tma` emulates and issues the copies): the fields
`cuTensorMapEncodeTiled` is given for a row-major 2-D operand, the driver's
rules for them, and the directory the kernels find them in (its global's
name and layout, the key of a map and the slot a key is looked for from).

The functions are written over Python integers or `etc.ops.wgmma.Index`
values (IR index values with the same operators), so that a simulated
kernel decodes exactly the fields the runtime encodes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes of one CUtensorMap (the driver's opaque object); its slots in the
#: 128-byte-aligned directory meet the driver's 64-byte alignment.
MAP_BYTES = 128
#: CUtensorMapSwizzle of each swizzle mode, and its code in a directory key.
SWIZZLE = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
#: CUtensorMapDataType of the operand dtypes.
DATA_TYPE = {"f16": 6, "bf16": 9}
#: Bytes of a row of a swizzle mode's atom (the most a swizzled box's row
#: may span).
SPAN = {"32B": 32, "64B": 64, "128B": 128}
#: Rows of the box of an operand map (64 rows: one wgmma block of A).
BOX_ROWS = 64
#: Maps the directory holds (a power of two), and the module global it is.
SLOTS = 2048
DIRECTORY = "etc_tensor_map_directory"
#: Bytes of the directory: the maps, then one 8-byte key per slot.
DIRECTORY_BYTES = SLOTS * (MAP_BYTES + 8)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class TensorMap:
    """The fields of a tiled 2-D tensor map over a row-major matrix: dims
    (columns, rows), the row stride in bytes, box (columns, rows), element
    bytes, swizzle mode. Fields are ints (the host) or `Index` values (a
    simulated kernel decoding the map of its buffer)."""

    dims: tuple
    stride: object
    box: tuple
    element_bytes: int
    swizzle: str


def matrix_map(rows, cols, dtype: str, box_rows: int, box_cols: int, swizzle: str) -> TensorMap:
    """The map a wgmma operand is loaded through: the whole (rows, cols)
    row-major matrix, a box of box_rows x box_cols elements."""
    element = 2 if dtype in DATA_TYPE else 4
    return TensorMap((cols, rows), cols * element, (box_cols, box_rows), element, swizzle)


def operand_map(rows, cols, dtype: str, swizzle: str) -> TensorMap:
    """The map of a wgmma operand (A or B^T, K-major) loaded in `swizzle`
    mode: boxes of BOX_ROWS rows of one swizzle span (64 16-bit elements
    in 128B mode, 32 in 64B mode)."""
    return matrix_map(rows, cols, dtype, BOX_ROWS, SPAN[swizzle] // 2, swizzle)


def check(tensor_map: TensorMap, address: int, dtype: str) -> None:
    """cuTensorMapEncodeTiled's rules for a 2-D tiled map without
    interleave, as ValueError naming the field: the driver refuses the
    same with CUDA_ERROR_INVALID_VALUE, without saying which."""
    cols, rows = tensor_map.dims
    box_cols, box_rows = tensor_map.box
    if dtype not in DATA_TYPE:
        raise ValueError(f"tensor map: dtype {dtype!r} is not f16 or bf16")
    if address % 16:
        raise ValueError(f"tensor map: global address {address:#x} is not 16-byte aligned")
    for name, size in (("columns", cols), ("rows", rows)):
        if not 1 <= size <= 1 << 32:
            raise ValueError(f"tensor map: global dim ({name}) {size} is not in [1, 2^32]")
    if tensor_map.stride % 16 or not 0 < tensor_map.stride < 1 << 40:
        raise ValueError(f"tensor map: row stride {tensor_map.stride} bytes is not a positive "
                         "multiple of 16 below 2^40")
    for name, size in (("columns", box_cols), ("rows", box_rows)):
        if not 1 <= size <= 256:
            raise ValueError(f"tensor map: box {name} {size} is not in [1, 256]")
    inner = box_cols * tensor_map.element_bytes
    if inner % 16:
        raise ValueError(f"tensor map: the box's rows are {inner} bytes, not a multiple of 16")
    if tensor_map.swizzle not in SWIZZLE:
        raise ValueError(f"tensor map: unknown swizzle {tensor_map.swizzle!r}")
    if tensor_map.swizzle != "none" and inner > SPAN[tensor_map.swizzle]:
        raise ValueError(f"tensor map: the box's rows are {inner} bytes, more than the "
                         f"{tensor_map.swizzle} swizzle's span")


def key(address, swizzle: str):
    """The directory key of the map over the buffer at `address` (16-byte
    aligned, so its low 4 bits hold the swizzle's code)."""
    return address | SWIZZLE[swizzle]


def probe_start(key_value, slots: int = SLOTS):
    """The first slot a key is looked for in (Fibonacci hashing of the
    address's 16-byte units)."""
    bits = slots.bit_length() - 1
    return (((key_value >> 4) * _GOLDEN) & _MASK64) >> (64 - bits)
