"""The GGUF container, read directly: header, key/value metadata, tensor
table, and each tensor's bytes through a read-only memory map.

GGUF (llama.cpp's format, little-endian, versions 2 and 3):

    magic "GGUF", version u32, tensor count u64, metadata count u64,
    metadata: key (string), value type u32, value,
    tensors: name (string), dims u32, sizes u64 x dims (innermost
        first), GGML type u32, offset u64 (from the data section),
    padding to `general.alignment` (default 32), then the data section,

where a string is a u64 length and UTF-8 bytes, and an array value is an
element type u32, a count u64 and the elements. The `gguf` package's
reader builds a NumPy view per string (3.7 s for a 49,152-token
vocabulary) and importing the package takes 0.4 s, so the metadata is
parsed here with `struct`, the tensors are views of one `mmap` (nothing
is read before a tensor is used), and the type numbers are the gguf
package's (`GGUFValueType`; `GGMLQuantizationType` and `GGML_QUANT_SIZES`
for the types ETC loads, which `etc.packed` lists), written out here and
checked against the package by the tests; the package is imported only
to name a tensor type ETC does not load.

A file that is cut short or damaged raises `GGUFError` saying where: the
header field, or the tensor (name, type, the bytes it needs and the bytes
the file has).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import packed
from .checkpoint import CheckpointError

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "MAGIC"]

MAGIC = b"GGUF"
#: The GGUF versions read (1 stored counts in 32 bits).
VERSIONS = (2, 3)
#: ggml's limit on a tensor's dimensions.
MAX_DIMS = 4
#: GGUF's metadata value types (`gguf.GGUFValueType`) by number.
VALUE_TYPES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL",
               "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64")
#: GGML tensor types ETC loads (`gguf.GGMLQuantizationType`), by number:
#: (name, values per block, bytes per block).
TENSOR_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2),
                **{f.ggml_id: (f.ggml, f.block, f.nbytes) for f in packed.FORMATS.values()
                   if f.ggml is not None}}


class GGUFError(CheckpointError):
    """A file that is not a GGUF file ETC can read, or that holds something
    (a tensor type, a tokenizer) ETC does not load."""


def _other_type(kind: int):
    """(name, values per block, bytes per block) of a GGML type ETC does
    not load, from the gguf package when it knows it, else None."""
    try:
        import gguf

        qtype = gguf.GGMLQuantizationType(kind)
        return (qtype.name, *gguf.GGML_QUANT_SIZES[qtype])
    except (ImportError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: `shape` in NumPy order (outermost
    first), `type` the GGML type's name ("F32", "Q4_K", ...), `offset` the
    absolute position of its first byte, `nbytes` its size."""

    name: str
    shape: tuple
    type: str
    offset: int
    nbytes: int
    block: int
    block_bytes: int


class GGUFFile:
    """A GGUF file's metadata (`metadata`, key -> Python value: ints,
    floats, bools, strings, lists), tensor table (`tensors`, name ->
    `TensorInfo`, in file order) and tensor bytes (`raw`)."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self.size = f.seek(0, 2)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.size \
                    else b""
        except OSError as error:
            raise GGUFError(f"{self.path}: cannot read the file ({error})") from None
        self._at = 0
        if self._bytes(4, "the magic") != MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (it does not start with 'GGUF')")
        version = self._unpack("<I", "the version")
        if version & 0xFFFF == 0 and version:
            raise GGUFError(f"{self.path}: a big-endian GGUF file (version field "
                            f"{version:#x}); only little-endian files are read")
        if version not in VERSIONS:
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported "
                            f"(supported: {', '.join(map(str, VERSIONS))})")
        self.version = version
        tensor_count = self._unpack("<Q", "the tensor count")
        kv_count = self._unpack("<Q", "the metadata count")
        # Each entry takes at least 8 bytes: a count past that is damage.
        for what, count in (("tensor", tensor_count), ("metadata", kv_count)):
            if count > self.size // 8:
                raise GGUFError(f"{self.path}: the header claims {count} {what} entries in a "
                                f"file of {self.size} bytes: the file is damaged")
        self.metadata: dict = {}
        for _ in range(kv_count):
            key = self._string("a metadata key")
            kind = self._unpack("<I", f"the type of metadata {key!r}")
            self.metadata[key] = self._value(kind, key)
        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment = {alignment!r} is not a power "
                            f"of two")
        self.alignment = alignment
        table = [self._tensor_entry() for _ in range(tensor_count)]
        self.data_offset = -(-self._at // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, kind, offset in table:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} is listed twice")
            self.tensors[name] = self._tensor_info(name, dims, kind, offset)

    # -- the header --------------------------------------------------------

    def _bytes(self, count: int, what: str) -> bytes:
        end = self._at + count
        if count < 0 or end > self.size:
            raise GGUFError(f"{self.path}: the file ends inside {what} (byte {self._at} of "
                            f"{self.size}): it is truncated or damaged")
        data = self._map[self._at:end]
        self._at = end
        return data

    def _unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._bytes(size, what))[0]

    def _string(self, what: str) -> str:
        length = self._unpack("<Q", what)
        data = self._bytes(length, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} at byte {self._at - length} is not UTF-8: "
                            f"the file is damaged") from None

    #: struct formats and NumPy dtypes of the scalar value types, by name.
    _SCALARS = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I",
                "INT32": "<i", "UINT64": "<Q", "INT64": "<q", "FLOAT32": "<f", "FLOAT64": "<d",
                "BOOL": "<?"}

    def _value(self, kind: int, key: str):
        if not 0 <= kind < len(VALUE_TYPES):
            raise GGUFError(f"{self.path}: metadata {key!r} has unknown value type {kind}: "
                            f"the file is damaged")
        name = VALUE_TYPES[kind]
        if name == "STRING":
            return self._string(f"metadata {key!r}")
        if name in self._SCALARS:
            value = self._unpack(self._SCALARS[name], f"metadata {key!r}")
            return bool(value) if name == "BOOL" else value
        # An array: element type, count, elements.
        element = self._unpack("<I", f"the element type of metadata {key!r}")
        count = self._unpack("<Q", f"the length of metadata {key!r}")
        if not 0 <= element < len(VALUE_TYPES):
            raise GGUFError(f"{self.path}: metadata {key!r} is an array of unknown type "
                            f"{element}: the file is damaged")
        element_name = VALUE_TYPES[element]
        if element_name in self._SCALARS:
            fmt = self._SCALARS[element_name]
            raw = self._bytes(count * struct.calcsize(fmt), f"metadata {key!r}")
            values = np.frombuffer(raw, dtype=np.dtype(fmt), count=count).tolist()
            return [bool(v) for v in values] if element_name == "BOOL" else values
        if element_name == "STRING":
            return self._strings(count, key)
        return [self._value(element, key) for _ in range(count)]

    def _strings(self, count: int, key: str) -> list:
        """An array of `count` strings, read in one pass over the map."""
        data, at, size = self._map, self._at, self.size
        unpack = struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        try:
            for _ in range(count):
                (length,) = unpack(data, at)
                at += 8
                end = at + length
                if end > size:
                    raise IndexError
                append(data[at:end].decode("utf-8"))
                at = end
        except (IndexError, struct.error):
            raise GGUFError(f"{self.path}: the file ends inside metadata {key!r} (string "
                            f"{len(out)} of {count}): it is truncated or damaged") from None
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: metadata {key!r} string {len(out)} is not UTF-8: "
                            f"the file is damaged") from None
        self._at = at
        return out

    def _tensor_entry(self) -> tuple:
        name = self._string("a tensor name")
        dims = self._unpack("<I", f"the dimensions of tensor {name!r}")
        if not 1 <= dims <= MAX_DIMS:
            raise GGUFError(f"{self.path}: tensor {name!r} has {dims} dimensions (ggml has "
                            f"1 to {MAX_DIMS}): the file is damaged")
        sizes = [self._unpack("<Q", f"the shape of tensor {name!r}") for _ in range(dims)]
        kind = self._unpack("<I", f"the type of tensor {name!r}")
        offset = self._unpack("<Q", f"the offset of tensor {name!r}")
        return name, sizes, kind, offset

    def _tensor_info(self, name: str, sizes: list, kind: int, offset: int) -> TensorInfo:
        known = TENSOR_TYPES.get(kind) or _other_type(kind)
        if known is None:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown GGML type {kind}: the "
                            f"file is damaged or newer than the gguf package")
        type_name, block, block_bytes = known
        shape = tuple(int(n) for n in reversed(sizes))
        if sizes[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} ({type_name}) has rows of "
                            f"{sizes[0]} values, not whole blocks of {block}: the file is "
                            f"damaged")
        nbytes = int(np.prod(sizes, dtype=object)) // block * block_bytes
        start = self.data_offset + offset
        if offset % self.alignment:
            raise GGUFError(f"{self.path}: tensor {name!r} starts at data offset {offset}, not "
                            f"a multiple of the alignment {self.alignment}: the file is damaged")
        if start + nbytes > self.size:
            raise GGUFError(f"{self.path}: tensor {name!r} ({type_name}, shape {shape}) needs "
                            f"{nbytes} bytes from byte {start}, but the file ends at byte "
                            f"{self.size}: it is truncated")
        return TensorInfo(name, shape, type_name, start, nbytes, block, block_bytes)

    # -- tensors -----------------------------------------------------------

    def read(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes read into a new array (shaped as `raw`),
        without mapping its pages into the process."""
        info = self.tensors[name]
        per_row = info.shape[-1] // info.block * info.block_bytes
        data = np.fromfile(self.path, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        if data.size != info.nbytes:
            raise GGUFError(f"{self.path}: tensor {name!r} could not be read whole (the file "
                            f"changed while it was open?)")
        return data.reshape(*info.shape[:-1], per_row)

    def let_go(self, name: str) -> None:
        """Lets the process's resident pages of tensor `name` in the map go
        (`MADV_DONTNEED`, after its part was copied out): they come back
        from the file if read again."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = info.offset // page * page
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED") and info.nbytes:
            self._map.madvise(mmap.MADV_DONTNEED, start, info.offset + info.nbytes - start)

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes as a read-only uint8 view of the file,
        shaped (..., bytes per row)."""
        info = self.tensors[name]
        rows = info.shape[:-1]
        per_row = info.shape[-1] // info.block * info.block_bytes
        data = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return data.reshape(*rows, per_row)
