"""The safetensors format, read and written with NumPy alone.

A file is an 8-byte little-endian header length N, N bytes of JSON (one
entry per tensor: `dtype`, `shape`, `data_offsets` [begin, end) relative to
the end of the header; an optional `__metadata__` of strings), then the raw
little-endian data. BF16 has no NumPy dtype: its 16-bit patterns are the
upper halves of float32 values and are widened on load (`etc.bfloat16`).
F8_E4M3 tensors (FP8 checkpoints) are read as their bytes (`read_bytes`),
which `etc.models.loading.fp8` dequantizes or repacks with their scales.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Iterator, Mapping, Optional

import numpy as np

from ... import bfloat16
from ...runtime import aligned

__all__ = ["SafetensorsError", "SafetensorsFile", "save_file", "DTYPES", "BYTE_DTYPES"]

#: The dtypes a checkpoint's weights may have, and their NumPy storage.
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
#: The safetensors dtype whose storage each ETC dtype is (`SafetensorsFile.read`).
_STORAGE = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
#: The largest header the format allows (the reference reader's limit).
MAX_HEADER_BYTES = 100_000_000
#: The dtypes read as their bytes only (`SafetensorsFile.read_bytes`).
BYTE_DTYPES = {"F8_E4M3": np.dtype(np.uint8), "U8": np.dtype(np.uint8)}
#: Further dtypes recognised (so that errors can name them) but not loaded.
_KNOWN = ("F64", "I64", "I32", "I16", "I8", "BOOL", "F8_E5M2")


class SafetensorsError(ValueError):
    """A file that is not valid safetensors, or a tensor ETC cannot load."""


class SafetensorsFile:
    """The tensors of one .safetensors file, read on demand through a
    memory map (loading one tensor reads only its bytes)."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                prefix = f.read(8)
                if len(prefix) != 8:
                    raise SafetensorsError(f"{self.path}: too short for a safetensors header")
                (length,) = struct.unpack("<Q", prefix)
                size = self.path.stat().st_size
                if length > size - 8:
                    raise SafetensorsError(f"{self.path}: header length {length} exceeds the "
                                           f"file size {size}")
                if length > MAX_HEADER_BYTES:
                    raise SafetensorsError(f"{self.path}: header length {length} exceeds the "
                                           f"format's limit of {MAX_HEADER_BYTES} bytes")
                header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SafetensorsError(f"{self.path}: the header is not JSON ({error})") from None
        except RecursionError:
            raise SafetensorsError(f"{self.path}: the header nests JSON too deeply to be a "
                                   f"safetensors header") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise SafetensorsError(f"{self.path}: '__metadata__' is not a JSON object")
        self.metadata: dict = metadata
        self._data_start = 8 + length
        self._data_size = size - self._data_start
        self._entries: dict[str, dict] = {}
        for name, entry in header.items():
            dtype, shape, offsets = _parse_entry(entry)
            if dtype is None:
                raise SafetensorsError(f"{self.path}: tensor {name!r} has a malformed header "
                                       f"entry {entry!r} (expected a string 'dtype', a "
                                       f"'shape' of non-negative integers and two integer "
                                       f"'data_offsets')")
            begin, end = offsets
            if not 0 <= begin <= end <= self._data_size:
                raise SafetensorsError(f"{self.path}: tensor {name!r} has data offsets "
                                       f"[{begin}, {end}) outside the {self._data_size} data "
                                       f"bytes")
            storage = DTYPES.get(dtype, BYTE_DTYPES.get(dtype))
            if storage is not None and end - begin != storage.itemsize * math.prod(shape):
                raise SafetensorsError(f"{self.path}: tensor {name!r} ({dtype}, shape {shape}) "
                                       f"has {end - begin} bytes of data")
            self._entries[name] = {"dtype": dtype, "shape": shape, "offsets": (begin, end)}
        # Two tensors must not share bytes: a writer that did so is broken,
        # and a weight would silently be another's data.
        spans = sorted((e["offsets"], n) for n, e in self._entries.items() if e["offsets"][0] <
                       e["offsets"][1])
        for ((_, end), first), ((begin, _), second) in zip(spans, spans[1:]):
            if begin < end:
                raise SafetensorsError(f"{self.path}: tensors {first!r} and {second!r} overlap "
                                       f"(data offsets {self._entries[first]['offsets']} and "
                                       f"{self._entries[second]['offsets']})")

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def dtype(self, name: str) -> str:
        """The safetensors dtype of tensor `name` ("F32", "BF16", ...)."""
        return self._entries[name]["dtype"]

    def shape(self, name: str) -> tuple:
        return self._entries[name]["shape"]

    def get(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 (F32 as stored, F16 and BF16 widened)."""
        return self.read(name, "f32")

    def read(self, name: str, dtype: str = "f32") -> np.ndarray:
        """Tensor `name` in the storage of ETC dtype `dtype`: "f32" (a
        float32 array), "f16" (float16) or "bf16" (uint16 bit patterns).
        A tensor stored in that form is read straight into the array it is
        returned in, without a wider copy; others are converted, one tensor
        at a time."""
        entry = self._entries[name]
        stored = entry["dtype"]
        if stored not in DTYPES:
            if stored in BYTE_DTYPES:
                raise SafetensorsError(f"{self.path}: tensor {name!r} is {stored}, read with "
                                       f"its scales (an FP8 checkpoint's config.json has a "
                                       f"quantization_config with quant_method 'fp8'; U8 "
                                       f"tensors are gpt-oss's MXFP4 *_blocks and *_scales)")
            what = "an unknown dtype" if stored not in _KNOWN else "a dtype ETC does not load"
            raise SafetensorsError(f"{self.path}: tensor {name!r} has {what} {stored!r}; "
                                   f"supported: {', '.join((*DTYPES, *BYTE_DTYPES))}")
        if dtype not in _STORAGE:
            raise ValueError(f"read: dtype {dtype!r} is not one of {', '.join(_STORAGE)}")
        values = self._read_stored(name, DTYPES[stored])
        if not values.dtype.isnative:
            values = values.astype(values.dtype.newbyteorder("="))
        if _STORAGE[dtype] == stored:
            return values
        if dtype == "bf16":  # from F32 or F16
            return aligned.aligned(bfloat16.to_bits(values.astype(np.float32, copy=False)))
        wide = bfloat16.from_bits(values) if stored == "BF16" else values
        return aligned.aligned(wide.astype(np.float16 if dtype == "f16" else np.float32,
                                           copy=False))

    def read_into(self, name: str, dtype: str, out: np.ndarray) -> bool:
        """Reads tensor `name` straight into `out` (a C-contiguous array of
        its shape, e.g. one expert's place in a stack) when the file stores
        it in the storage of ETC dtype `dtype` (bf16 bits in a uint16
        array, ...) and returns True; returns False, reading nothing, when
        it must be converted (`read` does that)."""
        entry = self._entries[name]
        if _STORAGE.get(dtype) != entry["dtype"] or not DTYPES[entry["dtype"]].isnative:
            return False
        if out.shape != tuple(entry["shape"]) or out.dtype != DTYPES[entry["dtype"]] or \
                not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"read_into: {name!r} ({entry['dtype']}, shape {entry['shape']}) "
                             f"does not fit out ({out.dtype}, shape {out.shape}, C-contiguous "
                             f"{out.flags.c_contiguous})")
        self._read_to(name, out, *entry["offsets"])
        return True

    def read_bytes(self, name: str, rows: Optional[slice] = None) -> np.ndarray:
        """Tensor `name` of a dtype of BYTE_DTYPES (F8_E4M3, U8: MXFP4
        blocks and scales) as its bytes: a
        uint8 array of its shape, or of its `rows` (a slice of the first
        dimension, step 1), so that a large tensor can be read a part at
        a time."""
        stored = self._entries[name]["dtype"]
        if stored not in BYTE_DTYPES:
            raise SafetensorsError(f"{self.path}: tensor {name!r} is {stored}, not one of "
                                   f"{', '.join(BYTE_DTYPES)}")
        return self._read_stored(name, BYTE_DTYPES[stored], rows)

    def _read_stored(self, name: str, storage: np.dtype,
                     rows: Optional[slice] = None) -> np.ndarray:
        """Tensor `name`'s data (or its `rows`) as an array of `storage`,
        64-byte aligned (as the CPU's vector and matrix units load rows)."""
        entry = self._entries[name]
        shape = entry["shape"]
        begin, end = entry["offsets"]
        if rows is not None:
            start, stop, _ = rows.indices(shape[0])
            row_bytes = storage.itemsize * math.prod(shape[1:])
            shape = (max(stop - start, 0), *shape[1:])
            begin, end = begin + start * row_bytes, begin + start * row_bytes + \
                shape[0] * row_bytes
        values = aligned.empty(shape, storage)
        self._read_to(name, values, begin, end)
        return values

    def _read_to(self, name: str, values: np.ndarray, begin: int, end: int) -> None:
        """Reads data bytes [begin, end) of tensor `name` into `values`."""
        with open(self.path, "rb") as f:
            # Read into the array, not through a memory map: the file's pages
            # are not mapped into the process, so they do not add to its
            # resident memory next to the copy.
            f.seek(self._data_start + begin)
            view = memoryview(values.reshape(-1).view(np.uint8))
            done = 0
            while done < end - begin:
                count = f.readinto(view[done:])
                if not count:
                    raise SafetensorsError(f"{self.path}: tensor {name!r} is cut short")
                done += count


def _parse_entry(entry) -> tuple:
    """(dtype, shape, (begin, end)) of a header entry, or (None, None, None)
    when it is malformed: a float or negative dimension is not truncated
    into a shape."""
    integer = lambda value: isinstance(value, int) and not isinstance(value, bool)
    if not isinstance(entry, dict):
        return None, None, None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or \
            not all(integer(d) and d >= 0 for d in shape) or not isinstance(offsets, list) or \
            len(offsets) != 2 or not all(integer(o) for o in offsets):
        return None, None, None
    return dtype, tuple(shape), tuple(offsets)


def save_file(path, tensors: Mapping[str, np.ndarray], dtype: str = "F32",
              metadata: Optional[Mapping[str, str]] = None,
              dtypes: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (float arrays) to a safetensors file, every tensor
    stored as `dtype` ("F32", "F16" or "BF16", rounded to nearest even;
    uint16 arrays are taken as bf16 bit patterns already), or as
    `dtypes[name]` where given: one of those, or "F8_E4M3" for a uint8
    array of float8_e4m3fn bytes (`etc.packed.to_e4m3`), or "U8" for
    other bytes (MXFP4 blocks and scales)."""
    dtypes = dict(dtypes or {})
    unknown = sorted(set(dtypes) - set(tensors))
    if unknown:
        raise ValueError(f"save_file: dtypes names {unknown[0]!r}, which is not one of the "
                         f"tensors")
    for kind in (dtype, *dtypes.values()):
        if kind not in DTYPES and kind not in BYTE_DTYPES:
            raise ValueError(f"save_file: dtype {kind!r} is not one of "
                             f"{', '.join((*DTYPES, *BYTE_DTYPES))}")
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, array in tensors.items():
        array = np.asarray(array)
        kind = dtypes.get(name, dtype)
        if kind in BYTE_DTYPES:
            if array.dtype != np.uint8:
                raise ValueError(f"save_file: {kind} tensor {name!r} must be uint8 bytes, got "
                                 f"{array.dtype}")
            data = array.tobytes()
        elif kind == "BF16":
            bits = array if array.dtype == np.uint16 else bfloat16.to_bits(array)
            data = bits.astype("<u2", copy=False).tobytes()
        else:
            data = array.astype(DTYPES[kind], copy=False).tobytes()
        header[name] = {"dtype": kind, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    # The data starts 8-byte aligned, as the reference writer pads it.
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
