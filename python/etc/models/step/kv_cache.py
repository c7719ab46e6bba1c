"""The KV caches the step kernel updates in place: `KVCache`, a contiguous
slot of the full length per sequence, and `PagedKVCache`, a pool of blocks
with a block table per sequence (its host bookkeeping is
`kv_blocks.BlockManager`; docs/models.md, "The paged KV cache")."""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from .kv_blocks import DEFAULT_BLOCK_SIZE, BlockManager

if TYPE_CHECKING:
    from ..loading.config import ModelConfig

__all__ = ["KVCache", "PagedKVCache", "KV_DTYPES", "KV_STORAGE"]

#: The dtypes a KV cache may have, and the array that holds one (bf16: its
#: bit patterns, as for bf16 weights; on CUDA a device array of the same
#: storage).
KV_DTYPES = ("f32", "f16", "bf16")
KV_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
              "bf16": np.dtype(np.uint16)}


class KVCache:
    """The K and V caches of every layer: arrays (slots, length,
    kv_heads * head_dim) of `dtype` ("f32", "f16", or "bf16" held as uint16
    bit patterns) that the step kernel updates in place."""

    def __init__(self, config: ModelConfig, slots: int, length: int, allocate=None,
                 dtype: str = "f32"):
        self.slots, self.length = slots, length
        self.dtype = dtype
        storage = KV_STORAGE[dtype]
        shape = (slots, length, config.num_kv_heads * config.head_dim)
        allocate = allocate or (lambda shape, storage: np.zeros(shape, storage))
        self.arrays = {f"l{i}_{kind}_cache": allocate(shape, storage)
                       for i in range(config.num_layers) for kind in ("k", "v")}

    @staticmethod
    def bytes_for(config: ModelConfig, slots: int, length: int, dtype: str = "f32") -> int:
        """The memory the caches of `slots` sequences of `length` positions
        take: 2 (K and V) x layers x slots x length x kv_heads x head_dim x
        bytes per value (4 for f32, 2 for f16 and bf16)."""
        return (2 * config.num_layers * slots * length * config.num_kv_heads *
                config.head_dim * KV_STORAGE[dtype].itemsize)

    @property
    def nbytes(self) -> int:
        itemsize = KV_STORAGE[self.dtype].itemsize
        return sum(int(np.prod(a.shape)) * itemsize for a in self.arrays.values())


class PagedKVCache:
    """The paged K and V caches of every layer: arrays (`num_blocks`,
    `block_size`, kv_heads * head_dim) of the KV dtype's storage, which the
    step kernel updates in place, and their `BlockManager`.

    `Model.step` takes a `Request`'s slot as a sequence key of `manager`
    and passes the kernel the block tables of the step's sequences."""

    def __init__(self, config, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 storage=np.float32, dtype: str = "f32",
                 allocate: Optional[Callable] = None, prefix_caching: bool = True):
        self.manager = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype = dtype
        self.storage = np.dtype(storage)
        shape = (num_blocks, block_size, config.num_kv_heads * config.head_dim)
        allocate = allocate or (lambda shape, storage: np.zeros(shape, storage))
        self.arrays = {f"l{i}_{kind}_cache": allocate(shape, self.storage)
                       for i in range(config.num_layers) for kind in ("k", "v")}
        self._keys = itertools.count()
        #: Held by every `PagedSlots` call and `block_tables`: the engines
        #: that share the pool run in threads of their own.
        self.lock = threading.RLock()

    def new_key(self) -> int:
        """A sequence key no sequence of the pool has had: the engines that
        share the pool never collide."""
        key = next(self._keys)
        while key in self.manager:
            key = next(self._keys)
        return key

    @staticmethod
    def bytes_per_block(config, block_size: int, itemsize: int) -> int:
        """2 (K and V) x layers x block_size x kv_heads x head_dim x itemsize."""
        return (2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim *
                itemsize)

    @property
    def tokens(self) -> int:
        """The positions the pool holds."""
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * self.storage.itemsize for a in self.arrays.values())

    def block_tables(self, keys: Sequence, positions: Sequence[int]) -> np.ndarray:
        """The i32 (len(keys), M) block tables of sequences `keys`, each
        checked to cover its `positions`; M is the longest table rounded
        up to a power of two (few distinct widths, so few bindings), rows
        padded with block 0, which no position reads."""
        with self.lock:
            return self._block_tables(keys, positions)

    def _block_tables(self, keys: Sequence, positions: Sequence[int]) -> np.ndarray:
        tables = []
        for r, (key, needed) in enumerate(zip(keys, positions)):
            if key not in self.manager:
                raise ValueError(f"step: request {r} uses sequence {key!r}, which the paged "
                                 f"cache has not admitted")
            table = self.manager.table(key)
            if len(table) * self.block_size < needed:
                raise ValueError(f"step: request {r} reaches position {needed - 1}, but its "
                                 f"block table holds {len(table) * self.block_size} positions "
                                 f"(reserve blocks first)")
            tables.append(table)
        width = 1
        longest = max((len(t) for t in tables), default=1)
        while width < longest:
            width *= 2
        out = np.zeros((len(tables), width), np.int32)
        for r, table in enumerate(tables):
            out[r, :len(table)] = table
        return out
