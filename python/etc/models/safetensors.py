"""The safetensors format, read and written with NumPy alone.

A file is an 8-byte little-endian header length N, N bytes of JSON (one
entry per tensor: `dtype`, `shape`, `data_offsets` [begin, end) relative to
the end of the header; an optional `__metadata__` of strings), then the raw
little-endian data. BF16 has no NumPy dtype: its 16-bit patterns are the
upper halves of float32 values and are widened on load (`etc.bfloat16`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator, Mapping, Optional

import numpy as np

from .. import bfloat16

__all__ = ["SafetensorsError", "SafetensorsFile", "save_file", "DTYPES"]

#: The dtypes a checkpoint's weights may have, and their NumPy storage.
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
#: Further dtypes recognised (so that errors can name them) but not loaded.
_KNOWN = ("F64", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2")


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
                header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SafetensorsError(f"{self.path}: the header is not JSON ({error})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: the header is not a JSON object")
        self.metadata: dict = header.pop("__metadata__", None) or {}
        self._data_start = 8 + length
        self._data_size = size - self._data_start
        self._entries: dict[str, dict] = {}
        for name, entry in header.items():
            try:
                dtype, shape = entry["dtype"], [int(d) for d in entry["shape"]]
                begin, end = (int(o) for o in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise SafetensorsError(f"{self.path}: tensor {name!r} has a malformed header "
                                       f"entry {entry!r}") from None
            if not 0 <= begin <= end <= self._data_size:
                raise SafetensorsError(f"{self.path}: tensor {name!r} has data offsets "
                                       f"[{begin}, {end}) outside the {self._data_size} data "
                                       f"bytes")
            if dtype in DTYPES and end - begin != DTYPES[dtype].itemsize * int(np.prod(shape)):
                raise SafetensorsError(f"{self.path}: tensor {name!r} ({dtype}, shape {shape}) "
                                       f"has {end - begin} bytes of data")
            self._entries[name] = {"dtype": dtype, "shape": tuple(shape),
                                   "offsets": (begin, end)}
        self._map: Optional[np.memmap] = None

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
        entry = self._entries[name]
        dtype = entry["dtype"]
        if dtype not in DTYPES:
            what = "an unknown dtype" if dtype not in _KNOWN else "a dtype ETC does not load"
            raise SafetensorsError(f"{self.path}: tensor {name!r} has {what} {dtype!r}; "
                                   f"supported: {', '.join(DTYPES)}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        begin, end = entry["offsets"]
        raw = self._map[self._data_start + begin:self._data_start + end]
        values = raw.view(DTYPES[dtype]).reshape(entry["shape"])
        if dtype == "BF16":
            return bfloat16.from_bits(values).reshape(entry["shape"])
        return np.asarray(values, dtype=np.float32)


def save_file(path, tensors: Mapping[str, np.ndarray], dtype: str = "F32",
              metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (float arrays) to a safetensors file, every tensor
    stored as `dtype` ("F32", "F16" or "BF16", rounded to nearest even)."""
    if dtype not in DTYPES:
        raise ValueError(f"save_file: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, array in tensors.items():
        array = np.asarray(array, dtype=np.float32)
        if dtype == "BF16":
            data = bfloat16.to_bits(array).astype("<u2").tobytes()
        else:
            data = array.astype(DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
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
