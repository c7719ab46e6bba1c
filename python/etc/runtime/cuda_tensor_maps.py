"""The tensor maps of a program whose Hopper matmul tiles load with TMA
(`MatmulWGMMA.tma`, `etc.ops.tma`): encoded by the driver
(`cuTensorMapEncodeTiled`) for the buffers of each bound run and handed to
the kernels through the module's directory global.

Why a directory and not kernel parameters: the worker's parameters are the
symbols, the buffer table and the counters whatever the graph (a
`__grid_constant__` CUtensorMap per operand would make them grow with the
graph and change the ABI every runtime and artifact shares), and one tile
function serves every task of its shape, each with its own buffers, so a
tile finds the map of the buffer it was handed by that buffer's address.

What is encoded: for every 2-D f16 or bf16 buffer of the run whose rows are
whole 16-byte units (the maps' stride rule), one map per swizzle mode the
tile may stage in (128B with 64-column boxes, 64B with 32-column ones; 64
rows each: `tensor_maps.operand_map`), at the slot its key hashes to
(linear probing, at most half the slots used). Each bound `Launch` keeps its
directory image in device memory of its own and copies it into the
module's global on its stream before each worker launch (a device-to-device
copy, which CUDA-graph capture records), so launches bound to different
arrays each run on their own maps; two launches of one program must not
run at the same time on different streams (they would share the global).
"""

from __future__ import annotations

import numpy as np

from . import tensor_maps as tma
from .cuda_driver import _check, _error_name

#: Swizzle modes a map is encoded in for each buffer (`MatmulWGMMA.LAYOUTS`).
MODES = ("128B", "64B")


class TensorMaps:
    """The directory of one loaded module: its global's device address
    (None when the program has no TMA tile) and the images of bound runs."""

    def __init__(self, driver, module, ptx: str):
        self.driver = driver
        self.address = None
        if tma.DIRECTORY not in ptx:  # no TMA tile: nothing to ask the driver
            return
        err, pointer, size = driver.cuModuleGetGlobal(module, tma.DIRECTORY.encode())
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleGetGlobal({tma.DIRECTORY}) failed: "
                               f"{_error_name(driver, err)}")
        if int(size) != tma.DIRECTORY_BYTES:
            raise RuntimeError(f"the module's {tma.DIRECTORY} has {int(size)} bytes, "
                               f"expected {tma.DIRECTORY_BYTES}: the PTX was compiled by "
                               "another version of ETC")
        self.address = int(pointer)

    @property
    def used(self) -> bool:
        return self.address is not None

    def encode(self, driver, arguments, buffers: dict) -> np.ndarray:
        """The directory image (bytes) of a run on `buffers` (DeviceArrays
        by argument name)."""
        image = np.zeros(tma.DIRECTORY_BYTES, np.uint8)
        maps = image[:tma.SLOTS * tma.MAP_BYTES].view(np.uint64).reshape(tma.SLOTS, 16)
        keys = image[tma.SLOTS * tma.MAP_BYTES:].view(np.uint64)
        used = 0
        for arg in arguments:
            if arg.kind == "symbol" or arg.dtype not in tma.DATA_TYPE:
                continue
            array = buffers[arg.name]
            if len(array.shape) != 2:
                continue
            rows, cols = (int(d) for d in array.shape)
            address = int(array.pointer)
            if rows < 1 or cols < 1 or (cols * 2) % 16 or address % 16:
                continue  # no TMA tile can read it (MatmulWGMMA.applies)
            for mode in MODES:
                key = tma.key(address, mode)
                slot = tma.probe_start(key)
                while keys[slot] not in (0, key):
                    slot = (slot + 1) % tma.SLOTS
                if keys[slot] == key:
                    continue  # the same array bound to two arguments
                used += 1
                if 2 * used > tma.SLOTS:
                    raise RuntimeError(
                        f"the run binds more 2-D f16/bf16 buffers than the tensor-map "
                        f"directory holds ({tma.SLOTS // 2 // len(MODES)}); compile with "
                        "MatmulWGMMA.tma off")
                keys[slot] = key
                maps[slot] = encode_tiled(driver, tma.operand_map(rows, cols, arg.dtype, mode),
                                          address, arg.dtype, f"{arg.kind} {arg.name!r}")
        return image


def encode_tiled(driver, tensor_map: tma.TensorMap, address: int, dtype: str,
                 what: str) -> list[int]:
    """The 16 words of the CUtensorMap the driver encodes for `tensor_map`
    over the buffer at `address` (`tensor_maps.check` first, so that a bad
    map names its field)."""
    try:
        tma.check(tensor_map, address, dtype)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    (cols, rows), (box_cols, box_rows) = tensor_map.dims, tensor_map.box
    result = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType(tma.DATA_TYPE[dtype]), 2, address, [cols, rows],
        [tensor_map.stride], [box_cols, box_rows], [1, 1],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle(tma.SWIZZLE[tensor_map.swizzle]),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    encoded = _check(driver, f"cuTensorMapEncodeTiled ({what})", result)
    return [int(word) for word in encoded.opaque]


def upload(launch, stream: int) -> None:
    """Encodes the maps of `launch`'s buffers and copies them to its device
    image on `stream` (a `Launch.upload` step; nothing without TMA tiles)."""
    rt = launch.runtime
    directory = rt._tensor_maps
    if not directory.used:
        return
    image = directory.encode(rt._driver, rt.arguments, launch.buffers)
    # A `run` (the workspace's table) reuses the workspace's image; a bound
    # launch has its own, as it has its own table.
    owner = launch.workspace if launch.table is launch.workspace.table else launch
    if getattr(owner, "tensor_map_image", None) is None:
        owner.tensor_map_image = rt._alloc((tma.DIRECTORY_BYTES,), np.uint8)
    launch.tensor_map_image = owner.tensor_map_image
    # Pageable host memory: the copy has read it when the call returns.
    _check(rt._driver, "cuMemcpyHtoDAsync (tensor maps)", rt._driver.cuMemcpyHtoDAsync(
        launch.tensor_map_image.pointer, image.ctypes.data, image.nbytes, stream))


def install(launch, stream: int) -> None:
    """Copies `launch`'s maps into the module's directory on `stream`,
    before its worker (a `Launch.enqueue` step)."""
    rt = launch.runtime
    directory = rt._tensor_maps
    if not directory.used:
        return
    _check(rt._driver, "cuMemcpyDtoDAsync (tensor maps)", rt._driver.cuMemcpyDtoDAsync(
        directory.address, launch.tensor_map_image.pointer, tma.DIRECTORY_BYTES, stream))
