"""The CPU chunk tile of attention (`etc.ops.attention`): a tile per KV
head of a chunk, all of the head's query heads against blocks of 16 keys,
each key and value row read once, on `vdpbf16ps` where the CPU has it.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .attention_chunk import AttentionChunk
from .attention_query_blocks import QueryBlocks, larger, largest_lane
from .base import EachSum, element_type
from .matmul_dpbf16 import dot_bf16


class AttentionChunkBlocks(QueryBlocks, AttentionChunk):
    """CPU tile (r, j S + s): KV heads s K .. s K + K - 1 of chunk j of
    request r (K = `kv_heads_per_tile`, S = H_kv / K), for all G = H / H_kv
    query heads of each and every new token, an online softmax over blocks
    of KEYS keys. Each key and value row is read once for its G heads (a
    tile per query head read it G times: Qwen3's and SmolLM2's 3, Llama
    3's 4), and a block's rows of the K KV heads one after another, so a
    tile reads K head_dim contiguous values of each row (all 384 bytes of
    SmolLM2's rows, where a tile per KV head read 128 of every 384); a
    key's dot products are `vdpbf16ps` on the bf16 rows where the CPU has
    them (else FMAs on the widened rows), each head's KEYS of them summed
    across lanes together (`block_scores`); a head's weights are one vector
    exponential, its running sums are rescaled once per block, and the
    weighted values are `vdpbf16ps` on pairs of keys too (`value_pairs`),
    else FMAs. Where the CPU has AMX (Intel's, whose `vdpbf16ps` runs at
    half of FMA's rate) decode takes the FMAs on widened rows instead
    (`decode_dot_products`).

    Where the blocks are `aligned` to the cache's (no window, P and C
    multiples of KEYS) a block reads its table entry once, its rows at
    constant offsets from the first, and prefetches the next block's rows
    (`prefetch`); only the last block of the tile is clamped and masked.
    Otherwise each key reads its own entry. Keys past k1 in the last block
    read the last live key's row (clamped) and weigh 0.

    Decode at 2,000 positions at SmolLM2-135M's shape (30 layers, one
    worker, 2026-11-28, a loaded machine): the row a key at a time, its
    table entry each, no prefetch, 11.1 ms; entry once a block and the
    prefetch 7.7 ms; with `vdpbf16ps` scores and FMAs 6.1-6.4 ms (the
    same rows in the caches: 0.10 -> 0.08 ms a layer); the weighted values on
    `vdpbf16ps` and the first block prefetched too, 0.94x that; the rows
    as one dimension, 0.95x that; the 3 KV heads in one tile, 0.90x that
    (0.95x with 2 workers; a 230-token prefill step after 256, 0.90x).
    Each ratio is of two kernels compiled in one process, runs
    alternating.

    Prefill (a request bringing QUERY_ROWS new tokens or more, with
    `value_pairs`) takes `emit_query_blocks`: Q = QUERY_ROWS tokens
    against each block of keys, packed once per KV head for the Q G
    queries. The floor: a 486-token first step at SmolLM2's shape is 30
    layers x 9 heads x 118,341 (query, key) pairs (486 x 487 / 2) x 256
    FLOP (2 x 64 for the score, 2 x 64 for the weighted value) = 8.2
    GFLOP, 16 ms at this CPU's `vdpbf16ps` rate (about 510 GFLOP/s a
    core). A token at a time took 94-101 ms with one worker (about 85
    GFLOP/s). What the blocking could save was known to be small: only a
    block's loads, prefetches and value shuffles are shared by the
    queries (about 2 of each query's 20 instructions a key); the rest is
    each query's own: 4 `vdpbf16ps` a key, and per 16 keys their sums
    across lanes, the largest, two exponentials and the rescaling of its
    sums. What moved the time was the per-query code on the packs:
    scores on keys transposed (no sums across lanes), the maxima as
    `vmaxps` trees (`largest_lane`), the rescalings' exponentials 16 to a
    vector, the weights' exponentials as `exp2_of`, `vcvtneps2bf16`, l
    kept per lane: 1,117 instructions for 6 queries' 384 `vdpbf16ps` a
    block. The 486-token first step, one worker, both paths compiled in
    one process, runs alternating (2026-11-28 05:03-05:05, load 3.3-3.9):
    QUERY_ROWS 1, 4, 8, 16: 96.8, 85.9, 76.0, 73.6 ms (74.0 against 94.4
    in another run: 0.78x, about 110 GFLOP/s, 4.6x the floor); a 256-token
    step after 230 cached: 66.4, 59.2, 51.5, 48.9 ms. 8, not 16: the
    stack buffers grow with Q G K (54 KB at SmolLM2's shape and Q = 8,
    37 KB of it the queries and their states).

    Where the CPU has AMX (or `kernels="amx"` emulates it) the queries go
    to the tile unit instead, 16 at a time against steps of TILE_KEYS keys
    (`attention_key_steps`, `query_tiles`): per 16
    keys a `tdpbf16ps` product per 32 columns for the scores, per 32 keys
    one per 16 columns for the weighted values, the online softmax per
    query row in AVX-512; measurements in their docstrings and
    docs/benchmarks.md."""

    part = "chunk_blocks"
    #: Keys per block (a 16-lane f32 vector of scores).
    KEYS = 16
    #: KV heads a tile takes at most: enough for SmolLM2's 3 and half of
    #: Qwen3's and Llama 3's 8, while the loop body (a copy of the block's
    #: code per KV head) and its softmax states stay small.
    KV_HEADS = 4
    #: New tokens of a request that a prefill tile takes together
    #: (`emit_query_blocks`; 1: a token at a time, as decode): each packed
    #: block serves QUERY_ROWS G K queries. Measured 4, 8, 16 (see the
    #: class docstring).
    QUERY_ROWS = 8
    #: Whether prefill takes the tile unit where the CPU has AMX
    #: (`key_steps`; False: `query_block` on `vdpbf16ps` there too).
    AMX = True
    #: New tokens of a request that a prefill tile takes together on AMX
    #: tiles (at least; `query_rows`): 16 (Qwen3's G = 2: 32 queries a KV
    #: head, 2 tiles) took 0.90x the CPU time of 8 (2026-11-28, a block of
    #: 16 keys at a time).
    TILE_ROWS = 16
    #: Rows whose G queries `query_block` interleaves (a run-time loop
    #: over the others): 2 of 1, 2, 4 was the fastest.
    ROWS_AT_ONCE = 2
    #: Whether decode (a token at a time) takes `vdpbf16ps` for its scores
    #: and weighted values (`decode_dot_products`); None: where the CPU has
    #: AVX-512 BF16 but no AMX. On the Intel AMX CPU `vdpbf16ps` runs at
    #: half of f32 FMA's rate (80-85 against 169 GFLOP/s a core), and the
    #: rows widened to f32 (a shift) with FMAs took 0.87-0.90x the time
    #: with one worker, 0.72-0.86x with two (see `decode_dot_products`);
    #: on the AMD CPU the pairs were the faster (0.94x for the values).
    DECODE_DPBF16 = None
    #: How many blocks of KEYS ahead `whole_blocks` prefetches (2 on the
    #: Intel AMX CPU, `prefetcht0`, contiguous blocks: 1.14-1.20x the time
    #: of 1).
    PREFETCH_BLOCKS = 1
    #: The prefetches' locality hint (0: `prefetchnta`, 3: `prefetcht0`;
    #: see `prefetch`).
    PREFETCH_LOCALITY = 3

    @classmethod
    def applies(cls, op, target) -> bool:
        return not target.gpu_kernels

    @classmethod
    def splits(cls, op) -> int:
        """A tile per `kv_heads_per_tile` KV heads of each chunk."""
        return op.params["kv_heads"] // cls.kv_heads_per_tile(op)

    @classmethod
    def kv_heads_per_tile(cls, op) -> int:
        """The most KV heads up to KV_HEADS that divide the model's."""
        kv_heads = op.params["kv_heads"]
        return max(k for k in range(1, min(cls.KV_HEADS, kv_heads) + 1) if kv_heads % k == 0)

    @classmethod
    def heads_per_item(cls, op) -> int:
        """The tile's KV heads' query heads."""
        return op.params["heads"] // op.params["kv_heads"] * cls.kv_heads_per_tile(op)

    def emit(self) -> None:
        """Tiles whose request brings `query_rows` new tokens or more (a
        prefill: QUERY_ROWS, on AMX tiles TILE_ROWS) take
        `emit_query_blocks` where the values take `value_pairs`, the others
        (decode) a token at a time: chosen per tile at run time."""
        if self.QUERY_ROWS == 1 or not self.value_pairs():
            super().emit()
            return
        r, js = self.ti
        _, new_tokens, _, _ = self.request_keys(r, arith.divui(js, self.cidx(self.splits(self.op))))
        branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, new_tokens,
                                     self.cidx(self.query_rows())), has_else=True)
        with ir.InsertionPoint(branch.then_block):
            self.emit_query_blocks()
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            super().emit()
            scf.yield_([])

    def softmax(self, queries, k_first, k1, where, kv_column) -> list:
        count = len(queries)
        init = [self.cf32(float("-inf")), self.cf32(0.0), self.splat(self.cf32(0.0))] * count
        blocks = self.whole_blocks if self.aligned() else self.key_rows
        out = blocks(queries, init, k_first, k1, where, kv_column)
        if self.decode_value_pairs():
            for g in range(count):
                out[3 * g + 2] = self.natural_order(out[3 * g + 2])
        return [tuple(out[3 * g:3 * g + 3]) for g in range(count)]

    def key_rows(self, queries, init, k_first, k1, where, kv_column) -> list:
        """The softmax states after keys [k_first, k1) in blocks of KEYS,
        each key's row from its own table entry (clamped to the last key)."""
        n, c = self.KEYS, self.cidx
        last = arith.subi(k1, c(1))
        caches = [self.buf(t) for t in self.op.operands[1:3]]
        blocks = scf.ForOp(k_first, k1, c(n), init)
        with ir.InsertionPoint(blocks.body):
            k0 = blocks.induction_variable
            rows = [[*where.at(arith.minsi(arith.addi(k0, c(i)), last)), kv_column]
                    for i in range(n)]
            scf.yield_(self.kv_heads_block(queries, list(blocks.inner_iter_args), caches, rows,
                                           arith.subi(k1, k0)))
        return list(blocks.results)

    def whole_blocks(self, queries, init, k_first, k1, where, kv_column) -> list:
        """The softmax states after keys [k_first, k1) when the blocks are
        `aligned`: whole blocks read their rows at constant offsets from
        the block's first in the caches seen as one dimension (so that
        LLVM folds them into the loads' addresses; indices into the 3-D
        memrefs were spilled registers), with no clamps or masks, and
        prefetch the next block's rows. Then the last keys, clamped to the
        last one and masked (`last_block`)."""
        op, n, c = self.op, self.KEYS, self.cidx
        last = arith.subi(k1, c(1))
        caches, row_of = self.flat_rows(where, kv_column)

        def prefetch(key, rolled):
            """Prefetches the rows of the block of `key`: in a paged cache
            the block's, whole; in a contiguous one no further than the
            last key."""
            first = arith.muli(arith.divui(key, c(n)), c(n))
            self.prefetch(caches, row_of(first) if "block_size" in op.params
                          else row_of(first, arith.subi(k1, first)), rolled)

        whole = arith.addi(k_first, arith.muli(arith.divui(arith.subi(k1, k_first), c(n)), c(n)))
        # The first block's values arrive while its scores compute.
        prefetch(k_first, True)
        blocks = scf.ForOp(k_first, whole, c(n), init)
        with ir.InsertionPoint(blocks.body):
            k0 = blocks.induction_variable
            prefetch(arith.minsi(arith.addi(k0, c(n * self.PREFETCH_BLOCKS)), last), False)
            scf.yield_(self.kv_heads_block(queries, list(blocks.inner_iter_args), caches,
                                           self.each_row(row_of(k0)), None))
        tail = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, whole, k1),
                        [v.type for v in init], has_else=True)
        with ir.InsertionPoint(tail.then_block):
            keys = arith.subi(k1, whole)
            scf.yield_(self.last_block(queries, list(blocks.results), caches,
                                       self.each_row(row_of(whole, keys)), keys))
        with ir.InsertionPoint(tail.else_block):
            scf.yield_(list(blocks.results))
        return list(tail.results)

    def flat_rows(self, where, kv_column) -> tuple:
        """The key and value caches seen as one dimension each, and
        `row_of(key, count=None)`: `row(i)`, the flat index of row i of the
        KEYS keys from `key` (its table entry `where.at(key)`, column
        `kv_column`), the first `count` keys' (None: all) their own, the
        others the last's. Whole blocks of keys (`aligned`) read their
        rows at constant offsets from the first (LLVM folds them into the
        loads' addresses; indices into the 3-D memrefs were spilled
        registers)."""
        op, c = self.op, self.cidx
        caches = [memref.collapse_shape(
            ir.MemRefType.get([ir.ShapedType.get_dynamic_size()],
                              ir.MemRefType(self.buf(t).type).element_type),
            self.buf(t), [[0, 1, 2]]) for t in op.operands[1:3]]
        rows_per_block, width = (self.dim(op.operands[1], d) for d in (1, 2))

        def row_of(key, count=None):
            block, row = where.at(key)
            first = arith.addi(arith.muli(arith.addi(arith.muli(block, rows_per_block), row),
                                          width), kv_column)

            def row(i):
                if count is not None:
                    i = arith.minsi(i, arith.subi(count, c(1)))
                return [arith.addi(first, arith.muli(i, width))]

            return row

        return caches, row_of

    def each_row(self, row) -> list:
        """The indices `row(i)` of the KEYS rows of a block, in order."""
        return [row(self.cidx(i)) for i in range(self.KEYS)]

    def interleaved_values(self, values, first: list, second: list) -> list:
        """Two keys' value rows (at `first` and `second` of memref
        `values`) interleaved in `value_pairs`' lane order: per 32 columns,
        `vpunpcklwd`'s pairs (columns 0-3, 8-11, 16-19, 24-27 of each),
        then `vpunpckhwd`'s (4-7, ...)."""
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        low = [i for lane in range(4) for j in range(4) for i in (8 * lane + j, 32 + 8 * lane + j)]
        high = [i + 4 for i in low]
        a, b = ([vector.load(bf16x32, values, self.column(at, 32 * h))
                 for h in range(self.op.params["head_dim"] // 32)] for at in (first, second))
        return [vector.shuffle(x, y, order) for x, y in zip(a, b) for order in (low, high)]

    def kv_heads_block(self, queries, carried: list, caches: list, rows: list, keys) -> list:
        """`key_block` for each of the tile's KV heads (G queries each, at
        head_dim columns after the one before), in turn for each block."""
        group = self.op.params["heads"] // self.op.params["kv_heads"]
        head_dim = self.op.params["head_dim"]
        out = []
        for i in range(len(queries) // group):
            out += self.key_block(queries[i * group:(i + 1) * group],
                                  carried[3 * group * i:3 * group * (i + 1)], caches,
                                  [self.column(at, i * head_dim) for at in rows], keys)
        return out

    def last_block(self, queries, carried: list, caches: list, rows: list, keys) -> list:
        """`kv_heads_block` as a loop over the tile's KV heads, the queries
        and their states (`carried`) in stack buffers around it: the
        tile's last keys, at most once per tile, so that the block's code
        is not emitted a second time per KV head (1,400 of the tile
        function's 8,700 lines of graph IR at SmolLM2's shape). Whole
        blocks keep their own copy per KV head, the states in registers:
        carried through memory in every block they took 1.2-1.3x the time
        of decode at 2,000 positions, and one masked copy for the whole
        blocks and the last 1.17x (see docs/benchmarks.md)."""
        op, c = self.op, self.cidx
        head_dim, group = op.params["head_dim"], op.params["heads"] // op.params["kv_heads"]
        count = len(queries)
        pairs = not isinstance(queries[0], ir.Value)  # `query_pairs`' halves
        element = element_type("bf16") if pairs else self.f32
        held = self.entry_alloca(ir.MemRefType.get([count, head_dim], element))
        states = self.entry_alloca(ir.MemRefType.get([count, head_dim + 2], self.f32))
        for g, query in enumerate(queries):
            for i, part in enumerate(query if pairs else [query]):
                vector.store(part, held, [c(g), c(32 * i)])
            m, l, acc = carried[3 * g:3 * g + 3]
            vector.store(acc, states, [c(g), c(0)])
            memref.store(m, states, [c(g), c(head_dim)])
            memref.store(l, states, [c(g), c(head_dim + 1)])
        acc_type = self.vtype(head_dim)
        heads = scf.ForOp(c(0), c(count // group), c(1))
        with ir.InsertionPoint(heads.body):
            kv = heads.induction_variable
            slots = [arith.addi(arith.muli(kv, c(group)), c(g)) for g in range(group)]
            if pairs:
                halves = ir.VectorType.get([32], element)
                head_queries = [[vector.load(halves, held, [slot, c(i)])
                                 for i in range(0, head_dim, 32)] for slot in slots]
            else:
                head_queries = [vector.load(acc_type, held, [slot, c(0)]) for slot in slots]
            head_carried = []
            for slot in slots:
                head_carried += [memref.load(states, [slot, c(head_dim)]),
                                 memref.load(states, [slot, c(head_dim + 1)]),
                                 vector.load(acc_type, states, [slot, c(0)])]
            column = arith.muli(kv, c(head_dim))
            out = self.key_block(head_queries, head_carried, caches,
                                 [[*at[:-1], arith.addi(at[-1], column)] for at in rows], keys)
            for g, slot in enumerate(slots):
                m, l, acc = out[3 * g:3 * g + 3]
                vector.store(acc, states, [slot, c(0)])
                memref.store(m, states, [slot, c(head_dim)])
                memref.store(l, states, [slot, c(head_dim + 1)])
            scf.yield_([])
        out = []
        for g in range(count):
            out += [memref.load(states, [c(g), c(head_dim)]),
                    memref.load(states, [c(g), c(head_dim + 1)]),
                    vector.load(acc_type, states, [c(g), c(0)])]
        return out

    def key_block(self, queries, carried: list, caches: list, rows: list, keys) -> list:
        """The softmax states (m, l, acc per query, `carried`) updated with
        the block of KEYS keys whose rows are at `rows` (indices into the
        key and value memrefs `caches`, the last the KV head's first
        column), of which the first `keys` count (None: all)."""
        op, n = self.op, self.KEYS
        v_cache = op.operands[2]
        scale = self.cf32(op.params["scale"])
        minus_inf = self.cf32(float("-inf"))
        live = None if keys is None else vector.create_mask(
            ir.VectorType.get([n], ir.IntegerType.get_signless(1)), [keys])
        dots = [self.block_scores() for _ in queries]
        for at in rows:
            for g, dot in enumerate(self.key_dots(queries, caches[0], at)):
                dots[g].add(dot)
        pairs = self.decode_value_pairs()
        weights, results = [], []
        for g in range(len(queries)):
            m, l, acc = carried[3 * g:3 * g + 3]
            block = self.capped(arith.mulf(dots[g].result(), self.vsplat(scale, n)))
            if live is not None:
                block = arith.select(live, block, self.vsplat(minus_inf, n))
            # A tree of vmaxps: vector.reduction's maximumf took 15 scalar
            # max with NaN checks one after another (`largest_lane`).
            m_new = larger(m, largest_lane(block))
            alpha = math.exp(arith.subf(m, m_new))
            w = math.exp(arith.subf(block, self.vsplat(m_new, n)))
            if live is not None:
                w = arith.select(live, w, self.vzero(n))
            if pairs:
                # The values are weighed in bf16: their sum l counts the
                # rounded weights, so that acc / l stays a weighted mean.
                w = arith.truncf(ir.VectorType.get([n], element_type("bf16")), w)
                total = self.tree_sum(arith.extf(self.vtype(n), w))
            else:
                total = self.tree_sum(w)
            weights.append(w)
            results.append([m_new, arith.addf(arith.mulf(l, alpha), total),
                            arith.mulf(acc, self.splat(alpha))])
        if pairs:
            self.weigh_value_pairs(caches[1], rows, weights, results)
            return [value for result in results for value in result]
        for i, at in enumerate(rows):
            value = self.cache_row(v_cache, caches[1], at)
            for g in range(len(queries)):
                weight = self.splat(vector.extract(weights[g], [], [i]))
                results[g][2] = math.fma(value, weight, results[g][2])
        return [value for result in results for value in result]

    def value_pairs(self) -> bool:
        """Whether the weighted values take `vdpbf16ps` too: with
        `dot_products` and a bf16 value cache, two keys' rows interleaved
        (value of key 2p, of key 2p + 1, column by column) against their
        two weights in bf16, a product pair per lane. A key's row then
        takes a load, a shuffle and head_dim / 32 dot products per head
        instead of widening and head_dim / 16 FMAs."""
        return self.dot_products() and self.op.operands[2].dtype == "bf16"

    def decode_dot_products(self) -> bool:
        """Whether decode's scores take `vdpbf16ps` (`dot_products` and
        DECODE_DPBF16, by default where the CPU has no AMX); else the key
        rows are widened to f32 and multiplied with FMAs. One decode
        token's attention, 30 layers at 2,000 positions, SmolLM2 shape
        (two kernels compiled in one process, runs alternating, the Intel
        AMX CPU, 2026-11-28 19:53, load 1.7-2.2): one worker 4.78 -> 4.17
        ms fastest, 5.83 -> 5.23 median; two workers 4.39 -> 3.16 fastest,
        7.89 -> 6.70 median; one layer with its rows in the caches 0.215 ->
        0.200 ms."""
        if not self.dot_products():
            return False
        if self.DECODE_DPBF16 is not None:
            return self.DECODE_DPBF16
        return not self.target.has("amx-bf16")

    def decode_value_pairs(self) -> bool:
        """`value_pairs` for decode's weighted values: with
        `decode_dot_products`."""
        return self.decode_dot_products() and self.value_pairs()

    def weigh_value_pairs(self, values, rows: list, weights: list, results: list) -> None:
        """Adds each head's bf16 `weights` of the block's value rows at
        `rows` of memref `values` to its acc (results[g][2]), in
        `interleaved_values`' lane order; `natural_order` puts them back."""
        halves = self.op.params["head_dim"] // 32
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        i32 = ir.IntegerType.get_signless(32)
        words = [vector.bitcast(ir.VectorType.get([len(rows) // 2], i32), w) for w in weights]
        parts = [[vector.extract_strided_slice(self.vtype(16), result[2], [16 * i], [16], [1])
                  for i in range(2 * halves)] for result in results]
        for p in range(len(rows) // 2):
            interleaved = self.interleaved_values(values, rows[2 * p], rows[2 * p + 1])
            for g, word in enumerate(words):
                pair = vector.bitcast(bf16x32, vector.broadcast(
                    ir.VectorType.get([16], i32), vector.extract(word, [], [p])))
                parts[g] = [dot_bf16(acc, two_keys, pair)
                            for acc, two_keys in zip(parts[g], interleaved)]
        for g, result in enumerate(results):
            acc = result[2]
            for i, part in enumerate(parts[g]):
                acc = vector.insert_strided_slice(part, acc, [16 * i], [1])
            result[2] = acc

    def natural_order(self, acc: ir.Value) -> ir.Value:
        """An acc in `weigh_value_pairs`' lane order, in column order."""
        order = []
        for column in range(self.op.params["head_dim"]):
            half, d = divmod(column, 32)
            lane, j = divmod(d, 8)
            order.append(32 * half + (4 * lane + j if j < 4 else 16 + 4 * lane + j - 4))
        return vector.shuffle(acc, acc, order)

    def aligned(self) -> bool:
        """Whether every key block starts at a multiple of KEYS inside one
        cache block: chunks start at multiples of KEYS (no window) and a
        paged cache's blocks hold a multiple of KEYS positions."""
        params = self.op.params
        block_size = params.get("block_size")
        return ("window" not in params and params["chunk"] % self.KEYS == 0
                and (block_size is None or block_size % self.KEYS == 0))

    def prefetch(self, caches: list, row, rolled: bool) -> None:
        """Asks for the key and value rows of a block of KEYS keys, row i
        at `row(i)` of `caches`, each row's values of the tile's KV heads a
        cache line at a time: they arrive while the block before computes.
        `rolled`: a loop over the rows (no slower before decode's loop of
        blocks and in prefill's), else unrolled: in the body of decode's
        loop of blocks a loop over the rows took 1.3-1.4x the time of
        decode at 2,000 positions (LLVM spilled the block's vectors around
        it). The hardware prefetcher alone left the rows, 128 bytes every
        384 at SmolLM2's shape, to stall each block.
        `prefetcht0` (PREFETCH_LOCALITY 3): on the Intel AMX CPU one decode
        token's attention, 30 layers at 2,000 positions, SmolLM2 shape,
        kernels compiled in one process, runs alternating (2026-11-28
        20:09-20:12, load 1.2-2.0), fastest run against `prefetchnta`'s
        (0, as on the AMD CPU, where t0 was not faster): the cache's blocks
        shuffled, 2 workers 11.12 -> 5.88 and 2.92 -> 2.64 ms (two
        processes), 1 worker 11.68 -> 6.49 (`prefetcht1` 10.65); blocks in
        order, 2 workers 2.87 -> 2.62."""
        columns = self.op.params["head_dim"] * self.kv_heads_per_tile(self.op)
        streams = list(zip(self.op.operands[1:3], caches))

        def lines(cache, memory, at):
            """The cache lines of the row at `at` of `memory`."""
            line = 64 // (4 if cache.dtype == "f32" else 2)
            for column in range(0, columns, line):
                memref.prefetch(memory, self.column(at, column), False,
                                self.PREFETCH_LOCALITY, True)

        if not rolled:
            rows = self.each_row(row)
            for cache, memory in streams:
                for at in rows:
                    lines(cache, memory, at)
            return
        c = self.cidx
        each = scf.ForOp(c(0), c(self.KEYS), c(1))
        with ir.InsertionPoint(each.body):
            at = row(each.induction_variable)
            for cache, memory in streams:
                lines(cache, memory, at)
            scf.yield_([])

    def column(self, at: list, offset: int) -> list:
        """The indices `at` of a row's first column, `offset` columns on."""
        return [*at[:-1], arith.addi(at[-1], self.cidx(offset))]

    def cache_row(self, cache, memory, at: list) -> ir.Value:
        """The head_dim values of `cache`'s row at `at` in `memory` (the
        cache's memref or a view of it), as f32."""
        storage = ir.VectorType.get([self.op.params["head_dim"]], element_type(cache.dtype))
        return self.widen(vector.load(storage, memory, at), cache)

    def block_scores(self):
        """What gathers a block's scores into one vector (lane i: key i's
        dot product) as `key_dots` forms them: their 16 lanes each summed
        across lanes together (`EachSum`: 15 vector adds for the 16 keys
        where a reduction each took about 10 instructions, each pair added
        as soon as both exist), or the dot products themselves."""
        if self.op.params["head_dim"] % 16 == 0:
            return EachSum(self)
        return _Scalars(self)

    def dot_products(self) -> bool:
        """Whether the scores take `vdpbf16ps`: bf16 queries and keys, rows
        of whole 32-value pairs, a CPU with avx512bf16."""
        op = self.op
        return (self.target.has("avx512bf16") and op.params["head_dim"] % 32 == 0
                and op.operands[0].dtype == op.operands[1].dtype == "bf16")

    def query_row(self, q, idx: list):
        """A decode query row: with `decode_dot_products`, `query_pairs`;
        else as f32."""
        if not self.decode_dot_products():
            return self.load_row(q, idx)
        return self.query_pairs(q, idx)

    def query_pairs(self, q, idx: list):
        """The row's 32-value halves in bf16 (a key's dot product then
        takes head_dim / 32 `vdpbf16ps`, and its row is never widened)."""
        pairs = ir.VectorType.get([32], element_type("bf16"))
        row, column = idx
        return [vector.load(pairs, self.buf(q), [row, arith.addi(column, self.cidx(i))])
                for i in range(0, self.op.params["head_dim"], 32)]

    def key_dots(self, queries: list, keys, at: list) -> list:
        """Per query, 16 lanes whose sum is its dot product with the key row
        at `at` of memref `keys` (the last index the row's first column):
        bf16 pair dot products, or the row's 16-lane slices of products
        added with FMAs; where head_dim is not a multiple of 16, the dot
        product itself (`block_scores`)."""
        k_cache = self.op.operands[1]
        head_dim = self.op.params["head_dim"]
        if self.decode_dot_products():
            pairs = ir.VectorType.get([32], element_type("bf16"))
            key = [vector.load(pairs, keys, self.column(at, i)) for i in range(0, head_dim, 32)]
            out = []
            for halves in queries:
                acc = self.vzero(16)
                for q_pair, k_pair in zip(halves, key):
                    acc = dot_bf16(acc, q_pair, k_pair)
                out.append(acc)
            return out
        key = self.cache_row(k_cache, keys, at)
        if head_dim % 16:
            return [self.tree_sum(arith.mulf(query, key)) for query in queries]

        def part(v, i):
            return vector.extract_strided_slice(self.vtype(16), v, [16 * i], [16], [1])

        out = []
        for query in queries:
            acc = arith.mulf(part(query, 0), part(key, 0))
            for i in range(1, head_dim // 16):
                acc = math.fma(part(query, i), part(key, i), acc)
            out.append(acc)
        return out


class _Scalars:
    """`EachSum`'s interface for scores that are scalars already: the
    vector of them."""

    def __init__(self, kernel):
        self.kernel, self.values = kernel, []

    def add(self, value: ir.Value) -> None:
        self.values.append(value)

    def result(self) -> ir.Value:
        return vector.from_elements(self.kernel.vtype(len(self.values)), self.values)
