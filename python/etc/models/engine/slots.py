"""The engine's view of the KV cache: which sequence runs in which slot and
what it may grow to. `SlotCache` gives each running sequence a contiguous
slot of the model length; `PagedSlots` gives it blocks of the model's paged
pool (`etc.models.step.kv_cache.PagedKVCache`), reusing cached prefixes.
Both answer the same calls (`admit`, `reserve`, `slide`, `trim`, `commit`,
`release`, and `cache`: the arrays the step kernel takes), and say what
their prefix cache could reuse (`block_hashes`, `cached_blocks`) so that
the scheduler computes a prefix shared by requests submitted together
once."""

from __future__ import annotations

from typing import Optional, Sequence

from ..step.kv_blocks import block_hashes
from ..step.kv_cache import PagedKVCache

__all__ = ["SlotCache", "PagedSlots"]


class SlotCache:
    """A contiguous KV cache for the engine: `slots` sequences of `length`
    positions (`model.new_cache`), a slot per running sequence.

    `admit(tokens, n)` takes a free slot for a sequence of `tokens` that
    will reach `n` positions and returns (slot, tokens already cached:
    always 0 here), or None when no slot is free (it waits);
    `reserve(slot, n)` says a running sequence is about to reach `n`
    positions (always true here: a slot holds the whole length),
    `slide(slot, start)` that its steps compute positions from `start` on
    (nothing to free here), and `trim(slot, n)` that it needs only `n`
    (speculative positions rolled back: nothing to return here);
    `commit(slot, tokens)` says which ids the slot's first positions hold
    (nothing to do here); `release(slot)` gives the slot back. The paged
    cache's `PagedSlots` answers the same calls with
    blocks."""

    evictions = 0

    def __init__(self, model, slots: int, length: int):
        self.cache = model.new_cache(slots, length)
        self.slots, self.length = slots, length
        self.block_size = None
        self._free = list(range(slots - 1, -1, -1))

    @property
    def capacity(self) -> int:
        """The positions one sequence may reach."""
        return self.length

    def block_hashes(self, tokens) -> list:
        """No prefix reuse here: no blocks to name."""
        return []

    def cached_blocks(self, tokens) -> int:
        return 0

    def admit(self, tokens, positions: int) -> Optional[tuple[int, int]]:
        return (self._free.pop(), 0) if self._free else None

    def reserve(self, slot: int, positions: int) -> bool:
        return positions <= self.length

    def slide(self, slot: int, start: int) -> None:
        pass

    def trim(self, slot: int, positions: int) -> None:
        pass

    def commit(self, slot: int, tokens) -> None:
        pass

    def release(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def used(self) -> int:
        return self.slots - len(self._free)


class PagedSlots:
    """The engine's KV cache manager over a `PagedKVCache`: at most `slots`
    sequences at once, each a slot number that is its key in the block
    manager (and the `Request.slot` of its steps), fresh for each sequence
    (`PagedKVCache.new_key`), so that several engines may share one pool
    and its cached prefixes.

    `admit(tokens, positions)` opens a sequence for `tokens` (a prompt, or a
    preempted sequence's prompt and generated ids) when a slot is free and
    the pool has blocks for `positions` positions past what its cached
    prefix covers, and returns (slot, cached tokens), else None (the
    sliding layers' table, if any, takes only its cached prefix: `reserve`
    grows it step by step, and `slide` shrinks it from the front);
    `reserve(slot, positions)` grows it (False when the pool lacks blocks:
    the engine preempts); `slide(slot, start)` says its steps compute
    positions from `start` on, which gives back the sliding layers' blocks
    that no window sees any more; `trim(slot, positions)` gives back the
    blocks past `positions` (rejected speculative positions);
    `commit(slot, tokens)` registers its computed full blocks for reuse;
    `release(slot)` frees the slot and its blocks."""

    def __init__(self, cache: PagedKVCache, slots: int):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"PagedSlots: slots={slots!r} must be a positive int")
        self.cache = cache
        self.manager = cache.manager
        self.slots = slots
        self.block_size = cache.block_size
        self._held: set[int] = set()

    @property
    def capacity(self) -> int:
        """The positions the whole pool holds: a longer sequence never fits."""
        return self.cache.tokens

    def block_hashes(self, tokens: Sequence[int]) -> list:
        """The hashes that name the full blocks of `tokens` in the prefix
        cache (none when the pool does not cache prefixes)."""
        if not self.manager.prefix_caching:
            return []
        return block_hashes(tokens, self.block_size)

    def cached_blocks(self, tokens: Sequence[int]) -> int:
        """How many blocks of `tokens`' longest cached prefix a sequence
        admitted now would reuse."""
        with self.cache.lock:
            return self.cache.match(tokens)

    @property
    def evictions(self) -> int:
        """Cached blocks the pool has evicted to make room (all its users)."""
        return self.manager.evictions

    def admit(self, tokens: Sequence[int], positions: int) -> Optional[tuple[int, int]]:
        if len(self._held) >= self.slots:
            return None
        with self.cache.lock:
            slot = self.cache.new_key()
            cached = self.cache.admit(slot, tokens, positions, window_positions=0)
        if cached is None:
            return None
        self._held.add(slot)
        return slot, cached

    def reserve(self, slot: int, positions: int) -> bool:
        with self.cache.lock:
            return self.cache.reserve(slot, positions)

    def slide(self, slot: int, start: int) -> None:
        with self.cache.lock:
            self.cache.slide(slot, start)

    def trim(self, slot: int, positions: int) -> None:
        with self.cache.lock:
            self.cache.trim(slot, positions)

    def commit(self, slot: int, tokens: Sequence[int]) -> None:
        with self.cache.lock:
            self.cache.commit(slot, tokens)

    def release(self, slot: int) -> None:
        with self.cache.lock:
            self.cache.release(slot)
        self._held.discard(slot)

    @property
    def used(self) -> int:
        """Slots in use."""
        return len(self._held)
