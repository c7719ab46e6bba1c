"""The paged KV cache's bookkeeping: a pool of blocks of P positions per
layer, a block table per sequence, and prefix reuse across sequences (the
arrays themselves are `kv_cache.PagedKVCache`).

Each layer's K and V caches are one array (blocks, P, kv_heads * head_dim);
position p of a sequence lives in block table[p // P] at row p % P. The
step kernel takes the tables of its requests as an i32 input (R, M), so
which blocks a sequence uses is data of the step, never a recompile.

`BlockManager` is the host side, NumPy-free: which blocks are free, which
sequence holds which, and which hold a reusable prefix. A block that is
full and computed is identified by a hash of its token ids and of every
token before them (the hash of the previous block chained with its own
ids), so two sequences whose first n blocks have the same ids share those
n blocks: a new sequence reuses the blocks of its longest cached prefix and
computes only the rest. Blocks are reference-counted; a cached block no
sequence holds stays in the pool, reusable, until a new block is needed and
none is free: then the least recently released cached block is evicted.

Only full blocks are shared, and a sequence writes only positions past
those it reused, so a shared block is never written: no copy-on-write.
A prompt that is entirely cached still computes its last token (its logits
are needed), so reuse stops one token short of the prompt's end.

A manager with a `window` W keeps the tables of sliding-window layers,
where position p sees keys p - W + 1 .. p only. `slide(key, start)` says
the sequence's steps from now on compute positions `start` and later: no
query of it will see a position before start - W + 1 again, so the blocks
wholly before that go back to the pool, and their table entries become
None. Such a block, when cached, stays reusable like any released one: its
contents are still the keys and values of the ids its hash names. A prefix
of n blocks is reused when the blocks the window of position n P sees are
cached (the blocks before them are never read: None in the new table).
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence

import numpy as np

__all__ = ["BlockManager", "DEFAULT_BLOCK_SIZE", "block_hashes"]

#: Positions per block unless told otherwise: vLLM's default, a 16-row
#: block of a 128-wide bf16 head is 4 KB, and chunked attention reads whole
#: blocks when the chunk is a multiple of it.
DEFAULT_BLOCK_SIZE = 16


def block_hashes(tokens: Sequence[int], block_size: int, parent: bytes = b"",
                 start: int = 0) -> list[bytes]:
    """The chained hashes of the full blocks of `tokens` from block `start`
    on: block i's hash is SHA-256 of the previous block's hash (`parent`
    for block `start`) and its `block_size` token ids, so it identifies the
    block's ids and everything before them."""
    out = []
    ids = np.asarray(tokens, dtype=np.int64)
    for i in range(start, len(ids) // block_size):
        parent = hashlib.sha256(parent + ids[i * block_size:(i + 1) * block_size].tobytes()
                                ).digest()
        out.append(parent)
    return out


@dataclass
class _SequenceBlocks:
    """A sequence's blocks in position order (None: given back, outside
    every window), and the hashes of its first full, computed ones."""

    blocks: list = field(default_factory=list)
    hashes: list = field(default_factory=list)


class BlockManager:
    """The host-side bookkeeping of a paged KV cache of `num_blocks` blocks
    of `block_size` positions (see the module's docstring).

    A sequence is a key (any hashable: the engine uses small ints).
    `admit(key, tokens, positions)` opens it, reusing its longest cached
    prefix, and returns how many of `tokens` are already in the cache (None
    when the pool lacks the blocks: nothing changes); `reserve(key,
    positions)` grows its table to cover `positions` (False when the pool
    lacks the blocks), `trim(key, positions)` shrinks it to what
    `positions` need; `commit(key, tokens)` says its first len(tokens)
    positions now hold these ids' keys and values, which makes its full
    blocks reusable; `release(key)` gives its blocks back. With a `window`
    (sliding layers' tables), `slide(key, start)` gives back the blocks no
    window from `start` on sees.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 prefix_caching: bool = True, window: Optional[int] = None):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("window", 1 if window is None else window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BlockManager: {name}={value!r} must be a positive int")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = prefix_caching
        #: The positions a query sees, its own included (None: every one
        #: before it).
        self.window = window
        # Blocks holding nothing reusable, taken from the end (block 0 first).
        self._free = list(range(num_blocks - 1, -1, -1))
        # Cached blocks no sequence holds, least recently released first.
        self._evictable: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._sequences: dict[Hashable, _SequenceBlocks] = {}
        #: Prompt tokens admitted, and how many of them came from the cache.
        self.queried_tokens = 0
        self.cached_tokens = 0
        #: Cached blocks evicted to make room.
        self.evictions = 0

    # -- sizes ---------------------------------------------------------------

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold `positions` positions."""
        return -(-positions // self.block_size)

    @property
    def free_blocks(self) -> int:
        """Blocks a sequence may take: the free ones and the cached ones no
        sequence holds (evicted when taken)."""
        return len(self._free) + len(self._evictable)

    @property
    def used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.free_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks whose contents are registered for reuse (held or not)."""
        return len(self._block_of)

    def __contains__(self, key) -> bool:
        return key in self._sequences

    def __len__(self) -> int:
        return len(self._sequences)

    def table(self, key) -> list[Optional[int]]:
        """The blocks of sequence `key`, in position order (None where a
        block left every window: `slide`)."""
        return list(self._sequence(key).blocks)

    def held(self, key) -> int:
        """How many blocks sequence `key` holds."""
        return sum(block is not None for block in self._sequence(key).blocks)

    def ref_count(self, block: int) -> int:
        """How many sequences hold `block`."""
        return self._refs[block]

    # -- sequences -------------------------------------------------------------

    def match(self, tokens: Sequence[int], limit: Optional[int] = None) -> list:
        """The blocks of the longest cached prefix of `tokens` (at most
        `limit` blocks), in order: whole blocks only, ending at least one
        token before the end (the last token is always computed). With a
        window, the blocks before those the prefix's end sees are None
        (they need not be cached). Changes nothing."""
        return self._match(tokens, limit)[0]

    def _match(self, tokens: Sequence[int], limit: Optional[int]) -> tuple[list, list]:
        """`match`, and the hashes of the blocks it returns."""
        if not self.prefix_caching:
            return [], []
        usable = max(0, len(tokens) - 1) // self.block_size
        if limit is not None:
            usable = min(usable, limit)
        hashes = block_hashes(tokens[:usable * self.block_size], self.block_size)
        found = [self._block_of.get(h) for h in hashes]
        if self.window is None:
            count = found.index(None) if None in found else len(found)
            return found[:count], hashes[:count]
        # The longest prefix whose end's window is cached.
        for count in range(len(found), 0, -1):
            first = self.first_seen(count * self.block_size)
            if None not in found[first:count]:
                return [None] * first + found[first:count], hashes[:count]
        return [], []

    def first_seen(self, start: int) -> int:
        """The first block a query at position `start` or later sees: 0, or
        with a window the block of start - W + 1."""
        if self.window is None:
            return 0
        return max(0, start - self.window + 1) // self.block_size

    def admit(self, key, tokens: Sequence[int], positions: Optional[int] = None, *,
              limit: Optional[int] = None) -> Optional[int]:
        """Opens sequence `key` for `tokens` with blocks for `positions`
        positions (default: len(tokens)), reusing the blocks of the longest
        cached prefix of `tokens`, of at most `limit` blocks (none may be
        given: a sequence whose ids the caller keeps to itself). Returns the
        number of tokens already in the cache (a multiple of the block
        size), or None when the pool lacks free blocks for the rest
        (nothing changes then). With `positions` fewer than the tokens the
        table holds what is reused, and `reserve` grows it step by step."""
        if key in self._sequences:
            raise ValueError(f"BlockManager.admit: sequence {key!r} is already admitted")
        admission = self._admission(tokens, positions, limit)
        if admission is None:
            return None
        reused, hashes, needed = admission
        for block in reused:
            if block is None:
                continue
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
        sequence = _SequenceBlocks(list(reused), hashes)
        sequence.blocks += [self._take() for _ in range(needed)]
        self._sequences[key] = sequence
        cached = len(reused) * self.block_size
        self.queried_tokens += len(tokens)
        self.cached_tokens += cached
        return cached

    def can_admit(self, tokens: Sequence[int], positions: Optional[int] = None,
                  limit: Optional[int] = None) -> bool:
        """Whether `admit(key, tokens, positions, limit=limit)` would succeed
        (for a key not yet admitted)."""
        return self._admission(tokens, positions, limit) is not None

    def _admission(self, tokens: Sequence[int], positions: Optional[int],
                   limit: Optional[int]) -> Optional[tuple[list, list, int]]:
        """What `admit` reuses (blocks and hashes) and takes (a count), or
        None when the pool lacks the blocks."""
        positions = len(tokens) if positions is None else positions
        reused, hashes = self._match(tokens, limit)
        needed = max(0, self.blocks_for(positions) - len(reused))
        # Reused blocks that nobody holds are counted as free: they leave
        # the free count without adding to what is available.
        idle = sum(1 for b in reused if b is not None and self._refs[b] == 0)
        if needed > self.free_blocks - idle:
            return None
        return reused, hashes, needed

    def reserve(self, key, positions: int) -> bool:
        """Grows sequence `key`'s table to hold `positions` positions; False
        (and nothing taken) when the pool lacks the blocks."""
        sequence = self._sequence(key)
        needed = self.blocks_for(positions) - len(sequence.blocks)
        if needed > self.free_blocks:
            return False
        sequence.blocks += [self._take() for _ in range(needed)]
        return True

    def trim(self, key, positions: int) -> None:
        """Shrinks sequence `key`'s table to the blocks that hold its first
        `positions` positions, giving the others back (free: blocks past
        what a sequence computed for good, such as a rejected speculative
        run's, are never registered for reuse)."""
        sequence = self._sequence(key)
        keep = max(self.blocks_for(positions), len(sequence.hashes))
        while len(sequence.blocks) > keep:
            block = sequence.blocks.pop()
            if block is not None:
                self._drop(block)

    def slide(self, key, start: int) -> None:
        """Sequence `key`'s steps compute positions `start` and later: with a
        window, the blocks that hold only positions before start - W + 1 go
        back to the pool (cached ones stay reusable), their entries None.
        Without a window, nothing."""
        sequence = self._sequence(key)
        for i in range(min(self.first_seen(start), len(sequence.blocks))):
            if sequence.blocks[i] is not None:
                self._drop(sequence.blocks[i])
                sequence.blocks[i] = None

    def can_reserve(self, key, positions: int) -> bool:
        """Whether `reserve(key, positions)` would succeed."""
        return self.blocks_for(positions) - len(self._sequence(key).blocks) <= self.free_blocks

    def commit(self, key, tokens: Sequence[int]) -> None:
        """Sequence `key`'s first len(tokens) positions now hold the keys and
        values of `tokens`: its full blocks among them become reusable by
        later sequences with the same prefix. A block whose contents another
        block already holds stays private (freed, not cached, at release)."""
        sequence = self._sequence(key)
        full = min(len(tokens) // self.block_size, len(sequence.blocks))
        if not self.prefix_caching or full <= len(sequence.hashes):
            return
        parent = sequence.hashes[-1] if sequence.hashes else b""
        for i, h in enumerate(block_hashes(tokens[:full * self.block_size], self.block_size,
                                           parent, len(sequence.hashes)),
                              start=len(sequence.hashes)):
            sequence.hashes.append(h)
            block = sequence.blocks[i]
            if block is not None and h not in self._block_of and block not in self._hash_of:
                self._block_of[h] = block
                self._hash_of[block] = h

    def release(self, key) -> None:
        """Gives sequence `key`'s blocks back: a block no other sequence
        holds is free, or, when it is cached, evictable (the sequence's
        first blocks last, so that a shared prefix outlives its tails)."""
        sequence = self._sequences.pop(key, None)
        if sequence is None:
            raise KeyError(f"BlockManager.release: no sequence {key!r}")
        for block in reversed(sequence.blocks):
            if block is not None:
                self._drop(block)

    def clear_cached(self) -> int:
        """Forgets every cached block that no sequence holds (they become
        free); returns how many."""
        count = len(self._evictable)
        for block in self._evictable:
            del self._block_of[self._hash_of.pop(block)]
            self._free.append(block)
        self._evictable.clear()
        return count

    # -- internals ---------------------------------------------------------------

    def _sequence(self, key) -> _SequenceBlocks:
        sequence = self._sequences.get(key)
        if sequence is None:
            raise KeyError(f"BlockManager: no sequence {key!r} (admit it first)")
        return sequence

    def _drop(self, block: int) -> None:
        """One holder fewer for `block`: with none left it is free, or, when
        it is cached, evictable."""
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _take(self) -> int:
        """A block for a sequence: a free one, else the least recently
        released cached one, evicted."""
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
            self.evictions += 1
        self._refs[block] = 1
        return block

    def check(self) -> None:
        """Raises AssertionError when the bookkeeping is inconsistent (for
        tests): reference counts, the free and evictable sets, the hashes."""
        held = collections.Counter(b for s in self._sequences.values() for b in s.blocks
                                   if b is not None)
        for block in range(self.num_blocks):
            assert self._refs[block] == held[block], (block, self._refs[block], held[block])
        free, idle = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & idle
        assert free | idle == {b for b in range(self.num_blocks) if not held[b]}
        assert not free & set(self._hash_of) and idle <= set(self._hash_of)
        assert {self._block_of[h] for h in self._hash_of.values()} == set(self._hash_of)
