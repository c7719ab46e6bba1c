"""The paged KV cache's host side (`etc.models.step.kv_blocks` and
`kv_cache`, and the engine's `slots`): block allocation, block tables,
prefix reuse by chained hashes, reference counts and LRU eviction, and the
sliding layers' tables, which give back the blocks that leave every
window. NumPy only, no kernel."""

import random
from types import SimpleNamespace

import numpy as np
import pytest

from etc.models.engine.slots import PagedSlots
from etc.models.step.kv_blocks import BlockManager, block_hashes
from etc.models.step.kv_cache import PagedKVCache

P = 4


def ids(n, start=0):
    return list(range(start, start + n))


def test_admit_reserve_release_tables():
    m = BlockManager(6, P)
    assert m.admit("a", ids(5)) == 0
    assert m.table("a") == [0, 1]
    assert m.reserve("a", 8) and m.table("a") == [0, 1]
    assert m.reserve("a", 9) and m.table("a") == [0, 1, 2]
    assert m.admit("b", ids(3, 100), positions=10) == 0
    assert m.table("b") == [3, 4, 5]
    assert m.free_blocks == 0 and m.used_blocks == 6
    # No room: nothing taken.
    assert not m.reserve("a", 13)
    assert m.table("a") == [0, 1, 2]
    assert m.admit("c", ids(1, 200)) is None and "c" not in m
    m.release("b")
    assert m.free_blocks == 3
    assert m.reserve("a", 13) and len(m.table("a")) == 4
    m.check()
    with pytest.raises(ValueError, match="already admitted"):
        m.admit("a", ids(2))
    with pytest.raises(KeyError, match="no sequence 'zzz'"):
        m.reserve("zzz", 1)
    # Fewer positions than tokens: a table `reserve` grows step by step.
    m.release("a")
    assert m.admit("d", ids(5), positions=3) == 0 and len(m.table("d")) == 1


def test_prefix_reuse_shares_full_blocks():
    m = BlockManager(10, P)
    prompt = ids(10)
    assert m.admit("a", prompt) == 0
    m.commit("a", prompt)  # two full blocks registered, the third is partial
    assert m.cached_blocks == 2
    # Same first 9 ids: both full blocks of them reused.
    other = prompt[:9] + [99, 98]
    assert m.admit("b", other) == 8
    assert m.table("b")[:2] == m.table("a")[:2]
    assert m.table("b")[2] not in m.table("a")
    assert [m.ref_count(b) for b in m.table("a")[:2]] == [2, 2]
    # A differing id in the first block: nothing reused, although the
    # second block's ids are the same (the hash covers everything before).
    assert m.admit("c", [7] + prompt[1:]) == 0
    assert m.queried_tokens == 10 + 11 + 10 and m.cached_tokens == 8
    m.check()


def test_reuse_leaves_the_last_token_to_compute():
    m = BlockManager(10, P)
    prompt = ids(8)
    m.admit("a", prompt)
    m.commit("a", prompt)
    assert m.cached_blocks == 2
    # Two full cached blocks cover the whole prompt: the last is computed
    # again (its logits are needed), so only the first is reused.
    assert m.admit("b", prompt) == 4
    assert m.admit("c", prompt + [50]) == 8
    assert m.match(prompt[:1]) == []


def test_commit_registers_generated_tokens_and_is_incremental():
    m = BlockManager(10, P)
    seq = ids(3)
    m.admit("a", seq, positions=12)
    for t in range(3, 12):
        seq.append(t)
        m.commit("a", seq[:-1])  # the pending token is not in the cache yet
    assert m.cached_blocks == 2
    assert [m._block_of[h] for h in block_hashes(seq, P)[:2]] == m.table("a")[:2]


def test_released_blocks_stay_reusable_until_evicted_lru():
    m = BlockManager(6, P)
    a, b = ids(9), ids(9, 100)
    m.admit("a", a)
    m.commit("a", a)
    m.release("a")           # 2 cached blocks idle, the partial third free
    m.admit("b", b)
    m.commit("b", b)
    m.release("b")
    assert m.cached_blocks == 4 and m.free_blocks == 6 and m.evictions == 0
    assert len(m.match(a)) == 2 and len(m.match(b)) == 2
    # A new unrelated sequence of 4 blocks takes the 2 free ones, then
    # evicts the least recently released cached ones: a's tail block, then
    # a's first (a sequence's first blocks are released last, so they
    # outlive its tail).
    tail_of_a, first_of_a = m.match(a)[1], m.match(a)[0]
    m.admit("c", ids(13, 500))
    assert m.evictions == 2 and m.match(a) == [] and len(m.match(b)) == 2
    assert m.table("c")[2:] == [tail_of_a, first_of_a]
    m.check()


def test_idle_reused_blocks_are_not_counted_twice():
    m = BlockManager(3, P)
    a = ids(9)
    m.admit("a", a)
    m.commit("a", a)
    m.release("a")            # 2 idle cached blocks + 1 free
    # Reusing both idle blocks leaves one block for the rest: 12 positions fit...
    assert m.admit("b", a, positions=12) == 8
    m.release("b")
    # ...13 do not, and a sequence reusing nothing cannot take 4 blocks.
    assert m.admit("c", a, positions=13) is None
    assert m.admit("d", ids(13, 40)) is None
    m.check()


def test_duplicate_contents_stay_private():
    m = BlockManager(8, P)
    p = ids(8)
    m.admit("a", p + [1])
    m.admit("b", p + [2])     # admitted before a committed: nothing to reuse
    m.commit("a", p)
    m.commit("b", p)
    assert m.cached_blocks == 2 and m.match(p + [3]) == m.table("a")[:2]
    m.release("b")            # b's copies were never registered: free
    assert m.free_blocks == 8 - 3
    m.check()


def test_prefix_caching_off():
    m = BlockManager(8, P, prefix_caching=False)
    p = ids(9)
    m.admit("a", p)
    m.commit("a", p)
    assert m.cached_blocks == 0 and m.admit("b", p) == 0


def test_clear_cached():
    m = BlockManager(4, P)
    p = ids(9)
    m.admit("a", p)
    m.commit("a", p)
    m.release("a")
    assert m.clear_cached() == 2 and m.cached_blocks == 0 and m.free_blocks == 4
    m.check()


@pytest.mark.parametrize("window", [None, 6])
def test_random_operations_keep_the_books(window):
    rng = random.Random(0)
    m = BlockManager(12, P, window=window)
    prefixes = [ids(rng.randrange(1, 14), 1000 * i) for i in range(3)]
    live: dict = {}
    for step in range(2000):
        op = rng.random()
        if op < 0.35 and len(live) < 6:
            seq = rng.choice(prefixes)[:rng.randrange(1, 14)] + ids(rng.randrange(0, 6), step)
            if not seq:
                continue
            cached = m.admit(step, seq, positions=len(seq) + rng.randrange(0, 4))
            if cached is not None:
                assert cached % P == 0 and cached < len(seq)
                # Reused blocks hold exactly these ids' prefix.
                assert m.table(step)[:cached // P] == m.match(seq)[:cached // P]
                live[step] = seq
        elif op < 0.6 and live:
            key = rng.choice(list(live))
            m.commit(key, live[key][:len(m.table(key)) * P])
        elif op < 0.7 and live:
            key = rng.choice(list(live))
            m.reserve(key, len(m.table(key)) * P + rng.randrange(1, 6))
        elif op < 0.8 and live:
            key = rng.choice(list(live))
            m.slide(key, rng.randrange(len(m.table(key)) * P + 1))
        elif live:
            key = rng.choice(list(live))
            m.release(key)
            del live[key]
        m.check()
    assert m.evictions > 0 and m.cached_tokens > 0


def test_paged_cache_arrays_and_block_tables():
    config = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8)
    cache = PagedKVCache(config, 6, P, storage=np.float16, dtype="f16")
    assert sorted(cache.arrays) == ["l0_k_cache", "l0_v_cache", "l1_k_cache", "l1_v_cache"]
    assert cache.arrays["l0_k_cache"].shape == (6, P, 16)
    assert cache.arrays["l0_k_cache"].dtype == np.float16
    assert cache.nbytes == PagedKVCache.bytes_per_block(config, P, 2) * 6 == 4 * 6 * P * 16 * 2
    assert cache.tokens == 24
    cache.manager.admit(7, ids(9))
    cache.manager.admit(3, ids(2))
    (tables,) = cache.block_tables([3, 7], [2, 9]).values()
    assert tables.dtype == np.int32 and tables.shape == (2, 4)
    assert tables.tolist() == [[3, 0, 0, 0], [0, 1, 2, 0]]
    with pytest.raises(ValueError, match="reaches position 12.*holds 12 positions"):
        cache.block_tables([7], [13])
    with pytest.raises(ValueError, match="request 1 uses sequence 5"):
        cache.block_tables([7, 5], [1, 1])


def test_paged_slots_admission_and_reuse():
    config = SimpleNamespace(num_layers=1, num_kv_heads=1, head_dim=4)
    slots = PagedSlots(PagedKVCache(config, 5, P), 2)
    assert slots.capacity == 20
    prompt = ids(9)
    assert slots.block_hashes(prompt) == block_hashes(prompt, P) and \
        len(slots.block_hashes(prompt)) == 2
    assert slots.admit(prompt, 10) == (0, 0)
    assert slots.cached_blocks(prompt + [7]) == 0     # computed, not yet committed
    slots.commit(0, prompt)
    assert slots.cached_blocks(prompt + [7]) == 2 and slots.cached_blocks(prompt[:8]) == 1
    assert slots.admit(prompt + [7], 12) == (1, 8)    # shares 2 blocks, takes 1
    assert slots.used == 2
    assert slots.admit(ids(2), 2) is None              # no slot left
    assert slots.reserve(1, 16) and not slots.reserve(1, 21)
    slots.release(0)
    assert slots.admit(ids(30, 50), 30) is None         # no blocks (slot 0 is free)
    slot, cached = slots.admit(ids(3, 50), 3)            # a fresh key
    assert slot not in (0, 1) and cached == 0
    assert slots.used == 2 and sorted(slots.manager._sequences) == [1, slot]
    # A second user of the pool never takes a key the first holds.
    slots.release(slot)
    other = PagedSlots(slots.cache, 2)
    assert other.admit(ids(1, 70), 1)[0] not in (0, 1, slot)
    slots.manager.check()


def test_sequences_without_ids_are_allocated_only():
    m = BlockManager(4, P)
    assert m.admit(0, (), positions=8) == 0 and m.table(0) == [0, 1]
    m.commit(0, ())
    assert m.cached_blocks == 0


# ----------------------------------------------------------------------
# Sliding windows: tables that keep only the blocks a window sees
# ----------------------------------------------------------------------


def test_a_window_gives_back_the_blocks_it_no_longer_sees():
    """Window 6, blocks of 4: once the steps start at 10 (seeing 5 .. 10),
    block 0 (0 .. 3) goes back, its entry None; a sequence holds at most
    ceil(6 / 4) + 1 blocks however long it grows, and another takes the
    blocks it gave back."""
    m = BlockManager(8, P, window=6)
    assert m.admit("a", ids(3), positions=0) == 0 and m.table("a") == []
    assert m.reserve("a", 10) and m.table("a") == [0, 1, 2]
    m.slide("a", 10)
    assert m.table("a") == [None, 1, 2] and m.held("a") == 2 and m.free_blocks == 6
    m.slide("a", 9)                 # an earlier start gives nothing back twice
    assert m.table("a") == [None, 1, 2]
    assert m.reserve("a", 14) and m.table("a") == [None, 1, 2, 0]  # block 0 again
    for start in range(14, 60):     # decoding: a token a step
        m.slide("a", start)
        assert m.reserve("a", start + 1) and m.held("a") <= -(-6 // P) + 1
        m.check()
    assert len(m.table("a")) == 15 and m.table("a")[:12] == [None] * 12
    assert m.held("a") == 2
    # The other 6, block 0 (a's first) among them, are another's.
    assert m.admit("b", ids(24, 100)) == 0
    assert set(m.table("b")) == set(range(8)) - set(m.table("a")) and 0 in m.table("b")
    m.release("a")
    m.release("b")
    assert m.free_blocks == 8 and m.used_blocks == 0
    m.check()
    # Without a window, nothing is given back.
    full = BlockManager(8, P)
    full.admit("a", ids(12))
    full.slide("a", 12)
    assert full.table("a") == [0, 1, 2]


def test_a_window_reuses_a_prefix_whose_window_is_cached():
    """A cached prefix of n blocks is reused when the blocks the window of
    position n P sees are cached: those before may be gone (given back,
    evicted), and when one it sees is gone, a shorter prefix is reused."""
    m = BlockManager(8, P, window=6)
    prompt = ids(17)
    m.admit("a", prompt)
    m.commit("a", prompt)           # 4 full blocks cached
    m.slide("a", 17)                # sees 12 .. 17: blocks 0 .. 2 go back, cached
    a = m.table("a")
    assert a[:3] == [None] * 3 and m.cached_blocks == 4 and m.free_blocks == 6
    assert m.admit("c", ids(16, 500)) == 0  # 3 free blocks, then block 0 evicted
    assert m.evictions == 1
    # Position 16 sees 11 .. 16: blocks 2 and 3 (the evicted block 0 is not needed).
    other = prompt[:16] + [99]
    assert m.match(other) == [None, None, 2, a[3]]
    assert m.admit("b", other) == 16 and m.table("b")[:4] == [None, None, 2, a[3]]
    assert m.ref_count(2) == 1 and m.ref_count(a[3]) == 2
    m.check()
    # Released whole, a sequence's tail is evicted first: a window that
    # sees it reuses a shorter prefix, one whose window is still cached.
    m = BlockManager(6, P, window=6)
    m.admit("a", prompt)
    m.commit("a", prompt)
    m.release("a")                  # 4 cached (block 3 least recently), 2 free
    m.admit("c", ids(12, 500))      # takes the free ones and evicts block 3
    assert m.match(prompt) == [None, 1, 2]  # position 12 sees 7 .. 12
    full = BlockManager(6, P)
    full.admit("a", prompt)
    full.commit("a", prompt)
    full.release("a")
    full.admit("c", ids(12, 500))
    assert full.match(prompt) == [0, 1, 2]


def _mixed(window_blocks=None, sliding=(0, 1)):
    config = SimpleNamespace(num_layers=3, num_kv_heads=1, head_dim=4, sliding_layers=sliding,
                             sliding_window=6)
    return PagedKVCache(config, 10, P, window_blocks=window_blocks)


def test_sliding_layers_have_a_pool_and_table_of_their_own():
    cache = _mixed(window_blocks=5)
    assert cache.tables == {"block_table": cache.manager,
                            "window_block_table": cache.window_manager}
    assert cache.arrays["l0_k_cache"].shape == (5, P, 4)
    assert cache.arrays["l2_v_cache"].shape == (10, P, 4)
    assert cache.window_tokens == 20 and cache.tokens == 40
    # Admitted with the sliding table's blocks left to `reserve`.
    assert cache.admit(1, ids(9), window_positions=0) == 0
    assert cache.manager.table(1) == [0, 1, 2] and cache.window_manager.table(1) == []
    assert cache.reserve(1, 9) and cache.window_manager.table(1) == [0, 1, 2]
    cache.commit(1, ids(8))         # computed (blocks 0 and 1 cached), then
    cache.slide(1, 9)               # the steps see 4 .. 9 on: block 0 goes
    tables = cache.block_tables([1], [9])
    assert tables["block_table"].tolist() == [[0, 1, 2, 0]]
    assert tables["window_block_table"].tolist() == [[0, 1, 2, 0]]
    assert cache.window_manager.table(1) == [None, 1, 2]
    # Either pool short: nothing taken from the other.
    assert not cache.reserve(1, 25) and len(cache.manager.table(1)) == 3
    assert cache.admit(2, ids(4), window_positions=16) is None and 2 not in cache.manager
    cache.release(1)
    # A second sequence reuses the prefix in both tables.
    assert cache.match(ids(9)) == 2
    assert cache.admit(3, ids(9), window_positions=0) == 8
    # Position 8 sees 3 .. 8: block 0, given back but cached, is reused.
    assert cache.window_manager.table(3) == [0, 1]
    for manager in cache.managers:
        manager.release(3)
        assert manager.used_blocks == 0
        manager.check()


def test_every_layer_sliding_has_one_table_with_the_window():
    cache = _mixed(sliding=(0, 1, 2))
    assert cache.tables == {"block_table": cache.window_manager}
    assert cache.window_manager.window == 6
    assert {a.shape for a in cache.arrays.values()} == {(10, P, 4)}
    cache.admit(0, ids(12))
    cache.slide(0, 13)              # sees 8 .. 13
    assert cache.block_tables([0], [12])["block_table"].tolist() == [[0, 0, 2, 0]]
    assert cache.manager.table(0) == [0, 1, 2]  # the books of admission
