"""The KV caches the step kernel updates in place: `KVCache`, a contiguous
slot of the full length per sequence, and `PagedKVCache`, a pool of blocks
with a block table per sequence (its host bookkeeping is
`kv_blocks.BlockManager`; docs/models.md, "The paged KV cache").

A model with sliding-window layers and full ones gives the sliding layers
a pool and a block table of their own (`window_block_table`), whose blocks
go back to the pool as they leave every window, while the full layers'
table keeps the whole sequence; a model whose every layer slides has the
one table, with the window."""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from .kv_blocks import DEFAULT_BLOCK_SIZE, BlockManager

if TYPE_CHECKING:
    from ..loading.config import ModelConfig

__all__ = ["KVCache", "PagedKVCache", "KV_DTYPES", "KV_STORAGE", "WINDOW_TABLE",
           "layer_tables"]

#: The dtypes a KV cache may have, and the array that holds one (bf16: its
#: bit patterns, as for bf16 weights; on CUDA a device array of the same
#: storage).
KV_DTYPES = ("f32", "f16", "bf16")
KV_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
              "bf16": np.dtype(np.uint16)}


#: The step's input that addresses the sliding layers' caches of a model
#: with full layers too (`block_table` addresses the others).
WINDOW_TABLE = "window_block_table"


def layer_tables(config) -> list[str]:
    """The block table input each layer's caches are addressed through:
    `block_table`, or `WINDOW_TABLE` for the sliding layers of a model
    that has full layers too."""
    sliding = set(getattr(config, "sliding_layers", ()) or ())
    mixed = bool(sliding) and len(sliding) < config.num_layers
    return [WINDOW_TABLE if mixed and i in sliding else "block_table"
            for i in range(config.num_layers)]


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
    """The paged K and V caches of every layer: arrays (blocks,
    `block_size`, kv_heads * head_dim) of the KV dtype's storage, which the
    step kernel updates in place, and the `BlockManager`s of their tables.

    `manager` admits sequences and holds the tables of the full layers
    (`num_blocks` blocks); `window_manager` (None without sliding layers)
    those of the sliding layers, `window_blocks` blocks (default
    `num_blocks`), with the window: a sequence holds the blocks its
    windows see, not its whole length. When every layer slides,
    `manager` only keeps the books (admission, prefix hashes): no array
    uses its blocks. `tables` maps each table input of the step to its
    manager. A sequence is opened, grown and closed in every table at once
    (`admit`, `reserve`, `slide`, `trim`, `commit`, `release`), reusing
    the same cached prefix in each.

    `Model.step` takes a `Request`'s slot as a sequence key and passes the
    kernel the block tables of the step's sequences."""

    def __init__(self, config, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 storage=np.float32, dtype: str = "f32",
                 allocate: Optional[Callable] = None, prefix_caching: bool = True,
                 window_blocks: Optional[int] = None):
        self.manager = BlockManager(num_blocks, block_size, prefix_caching=prefix_caching)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype = dtype
        self.storage = np.dtype(storage)
        names = layer_tables(config)
        self.window_manager: Optional[BlockManager] = None
        if getattr(config, "sliding_layers", ()):
            self.window_manager = BlockManager(
                num_blocks if window_blocks is None else window_blocks, block_size,
                prefix_caching=prefix_caching, window=config.sliding_window)
        # Every layer sliding: the one table is the window's.
        every_layer_slides = self.window_manager is not None and WINDOW_TABLE not in names
        #: The manager of each table input of the step.
        self.tables: dict[str, BlockManager] = {
            name: self.window_manager if name == WINDOW_TABLE or every_layer_slides
            else self.manager for name in names}
        width = config.num_kv_heads * config.head_dim
        allocate = allocate or (lambda shape, storage: np.zeros(shape, storage))
        self.arrays = {f"l{i}_{kind}_cache": allocate(
            (self.tables[name].num_blocks, block_size, width), self.storage)
            for i, name in enumerate(names) for kind in ("k", "v")}
        self._keys = itertools.count()
        #: Held by every `PagedSlots` call and `block_tables`: the engines
        #: that share the pool run in threads of their own.
        self.lock = threading.RLock()

    @property
    def managers(self) -> list[BlockManager]:
        """`manager`, and `window_manager` when there is one."""
        return [m for m in (self.manager, self.window_manager) if m is not None]

    @property
    def window_tokens(self) -> Optional[int]:
        """The positions the sliding layers' pool holds (None: no sliding
        layers)."""
        manager = self.window_manager
        return None if manager is None else manager.num_blocks * self.block_size

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

    # -- sequences, in every table -----------------------------------------------

    def match(self, tokens: Sequence[int]) -> int:
        """How many blocks of the longest cached prefix of `tokens` every
        table can reuse (`BlockManager.match`). Changes nothing."""
        count = len(self.manager.match(tokens))
        if self.window_manager is not None:
            count = len(self.window_manager.match(tokens, count))
        return count

    def admit(self, key, tokens: Sequence[int], positions: Optional[int] = None, *,
              window_positions: Optional[int] = None) -> Optional[int]:
        """Opens sequence `key` in every table (`BlockManager.admit`), each
        reusing the same cached prefix of `tokens`, with blocks for
        `positions` positions (default: len(tokens)), in the sliding layers'
        table for `window_positions` (default: `positions`; fewer, and
        `reserve` takes the rest as the steps need them). Returns the
        tokens already cached, or None when a pool lacks the blocks
        (nothing changes then)."""
        limit = self.match(tokens)
        window = self.window_manager
        if window is not None and not window.can_admit(
                tokens, positions if window_positions is None else window_positions, limit):
            return None
        cached = self.manager.admit(key, tokens, positions, limit=limit)
        if cached is not None and window is not None:
            window.admit(key, tokens, positions if window_positions is None else
                         window_positions, limit=limit)
        return cached

    def reserve(self, key, positions: int) -> bool:
        """Grows sequence `key`'s tables to hold `positions` positions;
        False (and nothing taken) when a pool lacks the blocks."""
        if not all(m.can_reserve(key, positions) for m in self.managers):
            return False
        for manager in self.managers:
            manager.reserve(key, positions)
        return True

    def slide(self, key, start: int) -> None:
        """Sequence `key`'s steps compute positions `start` and later: the
        sliding layers' blocks no window from there sees go back to the
        pool (`BlockManager.slide`)."""
        if self.window_manager is not None:
            self.window_manager.slide(key, start)

    def trim(self, key, positions: int) -> None:
        """Gives back sequence `key`'s blocks past its first `positions`
        positions (`BlockManager.trim`)."""
        for manager in self.managers:
            manager.trim(key, positions)

    def commit(self, key, tokens: Sequence[int]) -> None:
        """Sequence `key`'s first len(tokens) positions hold `tokens`' keys
        and values: its full blocks become reusable (`BlockManager.commit`)."""
        for manager in self.managers:
            manager.commit(key, tokens)

    def release(self, key) -> None:
        """Gives sequence `key`'s blocks back, in every table."""
        for manager in self.managers:
            manager.release(key)

    # -- the step's tables ---------------------------------------------------------

    def block_tables(self, keys: Sequence, positions: Sequence[int]) -> dict[str, np.ndarray]:
        """The i32 (len(keys), M) block tables of sequences `keys`, by input
        name (`tables`), each checked to cover its `positions`; M is the
        longest table rounded up to a power of two (few distinct widths, so
        few bindings), the same for every input; entries no position reads
        (past a table's end, or given back by `slide`) hold block 0."""
        with self.lock:
            return self._block_tables(keys, positions)

    def _block_tables(self, keys: Sequence, positions: Sequence[int]) -> dict[str, np.ndarray]:
        rows = {name: [] for name in self.tables}
        for r, (key, needed) in enumerate(zip(keys, positions)):
            for name, manager in self.tables.items():
                if key not in manager:
                    raise ValueError(f"step: request {r} uses sequence {key!r}, which the "
                                     f"paged cache has not admitted")
                table = manager.table(key)
                if len(table) * self.block_size < needed:
                    raise ValueError(f"step: request {r} reaches position {needed - 1}, but "
                                     f"its block table holds {len(table) * self.block_size} "
                                     f"positions (reserve blocks first)")
                if manager.window is not None:  # given-back entries: block 0
                    table = [0 if block is None else block for block in table]
                rows[name].append(table)
        width = 1
        longest = max((len(t) for tables in rows.values() for t in tables), default=1)
        while width < longest:
            width *= 2
        out = {}
        for name, tables in rows.items():
            out[name] = np.zeros((len(tables), width), np.int32)
            for r, table in enumerate(tables):
                out[name][r, :len(table)] = table
        return out
