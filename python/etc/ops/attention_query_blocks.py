"""The prefill path of the CPU attention tile (`attention_cpu.
AttentionChunkBlocks`, whose docstring has its floor and measurements):
QUERY_ROWS new tokens of a request against each block of KEYS keys,
packed once per KV head for their queries."""

from __future__ import annotations

from collections import namedtuple
from math import gcd

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .attention_key_steps import KeySteps, larger, largest_lane
from .base import element_type
from .kvcache import CacheRows
from .matmul_amx import AMXTiles, transpose16
from .matmul_dpbf16 import dot_bf16


class QueryBlocks(KeySteps):
    """`emit_query_blocks` and its parts, for `AttentionChunkBlocks`
    (QUERY_ROWS, ROWS_AT_ONCE, KEYS, its row loads and prefetches)."""

    def emit_query_blocks(self) -> None:
        """The tile's new tokens QUERY_ROWS at a time (Q; the last block's
        missing rows repeat its last token and store nothing), against
        blocks of KEYS keys from the rows' first key to their last: for
        each KV head, the block's keys transposed and its values paired
        once (`pack_block`), then each of the Q G queries of the KV head
        (a run-time loop: one copy of the code, its registers its own) its
        block of the online softmax (`query_block`) on the packs, which
        stay in L1 for all of them, each query masked to its row's keys
        [first_key, position + 1). The queries' states live in a stack
        buffer between blocks. With `amx_tiles`, `query_rows` tokens at a
        time, 16 queries at a time on the tile unit against steps of
        `tile_keys` keys (`key_steps`)."""
        op, params = self.op, self.op.params
        q, k_cache, _, positions, _, addressing, _, _ = op.operands[:8]
        head_dim, group = params["head_dim"], params["heads"] // params["kv_heads"]
        c, rows, n = self.cidx, self.query_rows(), self.KEYS
        tiles = self.amx_tiles()
        splits, per_split = self.splits(op), self.heads_per_item(op)
        kv_heads = self.kv_heads_per_tile(op)
        per_kv = rows * group  # queries per KV head
        r, js = self.ti
        j = arith.divui(js, c(splits))
        head0 = arith.muli(arith.remui(js, c(splits)), c(per_split))
        kv_column = arith.muli(arith.divui(head0, c(group)), c(head_dim))
        where = CacheRows(self, k_cache, addressing, params.get("block_size"), r)
        first, new_tokens, k0, k_end = self.request_keys(r, j)
        end = arith.addi(first, new_tokens)
        last = arith.subi(end, c(1))
        i32 = ir.IntegerType.get_signless(32)
        words, halves = head_dim // 2, head_dim // 32
        bf16 = element_type("bf16")
        if tiles is not None:
            shapes = self.pack_shapes(kv_heads, per_kv)
        else:
            shapes = (([kv_heads * per_kv, words], i32),
                      ([kv_heads * per_kv, head_dim + 32], self.f32),
                      ([kv_heads, words, n], i32), ([kv_heads, n // 2 * 2 * halves, 32], bf16))
        packs = _Packs(*(self.entry_alloca(ir.MemRefType.get(shape, element))
                         for shape, element in shapes))
        loop = self.lane_loop(arith.divui(arith.addi(new_tokens, c(rows - 1)), c(rows)))
        with ir.InsertionPoint(loop.body):
            t0 = arith.addi(first, arith.muli(loop.induction_variable, c(rows)))

            def bounds(row):
                """Row `row`'s token, first key and end of keys."""
                t = arith.minsi(arith.addi(t0, row), last)
                position = self.load_index(positions, [t])
                return (t, self.first_key(k0, position),
                        arith.minsi(k_end, arith.addi(position, c(1))))

            # The keys any row sees (positions increase along a request,
            # but nothing here counts on it).
            _, k_first, k1 = bounds(c(0))
            for row in range(1, rows):
                _, first_key, end_key = bounds(c(row))
                k_first, k1 = arith.minsi(k_first, first_key), arith.maxsi(k1, end_key)
            guard = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, k_first, k1))
            with ir.InsertionPoint(guard.then_block):
                each = scf.ForOp(c(0), c(kv_heads * per_kv), c(1))
                with ir.InsertionPoint(each.body):
                    qi = each.induction_variable
                    t, _, _ = bounds(arith.remui(arith.divui(qi, c(group)), c(rows)))
                    head = self.packed_head(head0, qi, rows, group)
                    for half, pair in enumerate(self.query_pairs(
                            q, [t, arith.muli(head, c(head_dim))])):
                        if tiles is None:
                            vector.store(vector.bitcast(ir.VectorType.get([16], i32), pair),
                                         packs.queries, [qi, c(16 * half)])
                        else:
                            vector.store(pair, packs.queries, [qi, c(32 * half)])
                    vector.store(self.splat(self.cf32(0.0)), packs.states, [qi, c(0)])
                    memref.store(self.cf32(float("-inf")), packs.states, [qi, c(head_dim)])
                    vector.store(self.vzero(n), packs.states, [qi, c(head_dim + 16)])
                    scf.yield_([])
                if tiles is not None:
                    self.transposed_queries(packs, kv_heads * per_kv)
                    self.key_steps(packs, where, kv_column, k_first, k1, bounds, tiles)
                else:
                    self.packed_keys(packs, where, kv_column, k_first, k1, bounds)
                partial = op.buffers["partial"]
                each = scf.ForOp(c(0), c(kv_heads * per_kv), c(1))
                with ir.InsertionPoint(each.body):
                    qi = each.induction_variable
                    row = arith.remui(arith.divui(qi, c(group)), c(rows))
                    t, row_first, row_end = bounds(row)
                    live = arith.andi(
                        arith.cmpi(arith.CmpIPredicate.slt, arith.addi(t0, row), end),
                        arith.cmpi(arith.CmpIPredicate.slt, row_first, row_end))
                    store = scf.IfOp(live)
                    with ir.InsertionPoint(store.then_block):
                        base = arith.muli(self.packed_head(head0, qi, rows, group),
                                          c(head_dim + 2))
                        acc = vector.load(self.vtype(head_dim), packs.states, [qi, c(0)])
                        self.vstore(self.natural_order(acc), partial, [t, j, base])
                        memref.store(memref.load(packs.states, [qi, c(head_dim)]),
                                     self.buf(partial), [t, j, arith.addi(base, c(head_dim))])
                        memref.store(self.tree_sum(vector.load(
                            self.vtype(n), packs.states, [qi, c(head_dim + 16)])),
                            self.buf(partial), [t, j, arith.addi(base, c(head_dim + 1))])
                        scf.yield_([])
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def exp2_of(self, x: ir.Value) -> ir.Value:
        """exp(x) for 16 lanes x <= 0 (below -87: about 1e-38), to about
        4e-5 relative, enough for weights rounded to bf16: 2^i 2^f for
        x log2(e) = i + f, |f| <= 1/2, 2^f a degree-4 polynomial, 2^i the
        exponent's bits. `math.exp`'s lowering (range checks, NaN
        handling) took twice the instructions: 0.97x the time of the
        prefill's attention with it."""
        n = self.KEYS
        i32x16 = ir.VectorType.get([n], ir.IntegerType.get_signless(32))
        t = arith.mulf(larger(x, self.vsplat(self.cf32(-87.0), n)),
                       self.vsplat(self.cf32(1.4426950408889634), n))
        whole = math.roundeven(t)
        f = arith.subf(t, whole)
        p = self.vsplat(self.cf32(0.0096181291), n)
        for coefficient in (0.0555041087, 0.2402265070, 0.6931471806, 1.0):
            p = math.fma(p, f, self.vsplat(self.cf32(coefficient), n))
        bits = arith.shli(arith.addi(arith.fptosi(i32x16, whole),
                                     vector.broadcast(i32x16, arith.constant(
                                         ir.IntegerType.get_signless(32), 127))),
                          vector.broadcast(i32x16, arith.constant(
                              ir.IntegerType.get_signless(32), 23)))
        return arith.mulf(p, vector.bitcast(self.vtype(n), bits))

    def packed_head(self, head0, qi, rows: int, group: int):
        """The query head of `emit_query_blocks`' query qi, in the order
        [KV head][row][query head of the KV head's G]."""
        c = self.cidx
        per_kv = rows * group
        return arith.addi(head0, arith.addi(arith.muli(arith.divui(qi, c(per_kv)), c(group)),
                                            arith.remui(qi, c(group))))

    def packed_keys(self, packs, where, kv_column, k_first, k1, bounds) -> None:
        """`emit_query_blocks`' loop over blocks of keys [k_first, k1): each
        key's row (clamped to the last key) from its table entry, or where
        the blocks are `aligned` from the block's first entry and with the
        next block's rows prefetched; per KV head `pack_block`, then
        `query_block` for each of its queries. (On AMX tiles: `key_steps`.)"""
        op, params, n, c = self.op, self.op.params, self.KEYS, self.cidx
        head_dim, group = params["head_dim"], params["heads"] // params["kv_heads"]
        rows = self.query_rows()
        per_kv = rows * group
        last = arith.subi(k1, c(1))
        aligned = self.aligned()
        if aligned:
            caches, row_of = self.flat_rows(where, kv_column)
        else:
            caches = [self.buf(t) for t in op.operands[1:3]]

        def block_rows(key):
            """`row(i)`, the indices of row i of the block from `key`,
            clamped to the last key."""
            if aligned:
                return row_of(key, arith.subi(k1, key))
            return lambda i: [*where.at(arith.minsi(arith.addi(key, i), last)), kv_column]

        kv_heads = self.kv_heads_per_tile(op)

        def pack(row, kv):
            """`pack_block` of KV head `kv` of the block whose row i is at
            `row(i)`."""
            column = arith.muli(kv, c(head_dim))

            def shifted(i):
                at = row(i)
                return [*at[:-1], arith.addi(at[-1], column)]

            self.pack_block(packs, kv, caches, shifted)

        # Each block is packed right before its queries, while the next
        # one's rows are prefetched (packing one block ahead into a second
        # buffer measured no faster).
        blocks = scf.ForOp(k_first, k1, c(n))
        with ir.InsertionPoint(blocks.body):
            key = blocks.induction_variable
            if aligned:
                ahead = arith.minsi(arith.addi(key, c(n)), last)
                self.prefetch(caches, row_of(ahead, arith.subi(k1, ahead)), True)
            at = block_rows(key)
            heads = scf.ForOp(c(0), c(kv_heads), c(1))
            with ir.InsertionPoint(heads.body):
                pack(at, heads.induction_variable)
                scf.yield_([])
            heads = scf.ForOp(c(0), c(kv_heads), c(1))
            with ir.InsertionPoint(heads.body):
                kv = heads.induction_variable
                step = self.ROWS_AT_ONCE
                each = scf.ForOp(c(0), c(rows), c(step))
                with ir.InsertionPoint(each.body):
                    queries, masks = [], []
                    for i in range(step):
                        row = arith.addi(each.induction_variable, c(i))
                        _, row_first, row_end = bounds(row)
                        qi = arith.addi(arith.muli(kv, c(per_kv)), arith.muli(row, c(group)))
                        queries += [arith.addi(qi, c(g)) for g in range(group)]
                        masks += [self.key_lanes(key, row_first, row_end)] * group
                    self.query_block(packs, kv, queries, masks)
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def key_lanes(self, key, first, end) -> ir.Value:
        """The lanes of the block of keys from `key` in [first, end)."""
        c, n = self.cidx, self.KEYS
        mask = ir.VectorType.get([n], ir.IntegerType.get_signless(1))

        def before(bound):
            return vector.create_mask(mask, [arith.maxsi(arith.minsi(
                arith.subi(bound, key), c(n)), c(0))])

        below = before(end)
        if "window" not in self.op.params:
            return below
        return arith.xori(below, before(arith.minsi(first, end)))

    def pack_block(self, packs, kv, caches: list, row) -> None:
        """The block's keys of a KV head (row i at `row(i)` of `caches`)
        transposed into slot `kv` of packs.keys (row p: the 16 keys' bf16
        pair p), and its values in `value_pairs`' pairs into packs.values',
        each a loop (over 16 pairs of columns, over pairs of keys)."""
        c, n = self.cidx, self.KEYS
        head_dim = self.op.params["head_dim"]
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        i32x16 = ir.VectorType.get([16], ir.IntegerType.get_signless(32))
        rows = self.each_row(row)
        each = scf.ForOp(c(0), c(head_dim // 2), c(16))
        with ir.InsertionPoint(each.body):
            first = each.induction_variable
            column = arith.muli(first, c(2))
            vecs = transpose16([vector.bitcast(i32x16, vector.load(
                bf16x32, caches[0], [*at[:-1], arith.addi(at[-1], column)])) for at in rows])
            for p, vec in enumerate(vecs):
                vector.store(vec, packs.keys, [kv, arith.addi(first, c(p)), c(0)])
            scf.yield_([])
        each = scf.ForOp(c(0), c(n // 2), c(1))
        with ir.InsertionPoint(each.body):
            p = each.induction_variable
            two = arith.muli(p, c(2))
            pairs = self.interleaved_values(caches[1], row(two), row(arith.addi(two, c(1))))
            for i, vec in enumerate(pairs):
                vector.store(vec, packs.values,
                             [kv, arith.addi(arith.muli(p, c(len(pairs))), c(i)), c(0)])
            scf.yield_([])

    def query_rows(self) -> int:
        """The new tokens a prefill tile takes together: QUERY_ROWS, or on
        AMX tiles (`amx_tiles`) the fewest at least TILE_ROWS whose G
        queries per KV head fill whole tiles of 16 rows."""
        if self.QUERY_ROWS == 1 or self.amx_tiles() is None:
            return self.QUERY_ROWS
        group = self.op.params["heads"] // self.op.params["kv_heads"]
        least = 16 // gcd(group, 16)
        return -(-self.TILE_ROWS // least) * least

    def amx_tiles(self):
        """`AMXTiles` for `key_steps` where the CPU has `amx-bf16` (or the
        target emulates it) and the queries, keys and values are bf16 rows
        of whole 32-value pairs (`value_pairs`); else None (`query_block`
        on `vdpbf16ps`). AMX False turns the tiles off (the benchmark's
        comparison)."""
        target = self.target
        if not (self.AMX and (target.has("amx-bf16") or target.emulate_amx)
                and self.value_pairs() and self.KEYS == 16):
            return None
        return AMXTiles(self, not target.has("amx-bf16"))

    def transposed_queries(self, packs, count: int) -> None:
        """The queries (`count` rows of packs.queries) in the VNNI layout,
        per 16 queries and 32 columns a tile of 16 rows (pair p of the
        columns, of each query): packs.pairs, for `key_steps`."""
        c = self.cidx
        halves = self.op.params["head_dim"] // 32
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        i32x16 = ir.VectorType.get([16], ir.IntegerType.get_signless(32))
        each = scf.ForOp(c(0), c(count // 16 * halves), c(1))
        with ir.InsertionPoint(each.body):
            tile, s = (f(each.induction_variable, c(halves)) for f in (arith.divui, arith.remui))
            first, column = arith.muli(tile, c(16)), arith.muli(s, c(32))
            rows = transpose16([vector.bitcast(i32x16, vector.load(
                bf16x32, packs.queries, [arith.addi(first, c(m)), column])) for m in range(16)])
            base = arith.muli(each.induction_variable, c(16))
            for p, pairs in enumerate(rows):
                vector.store(vector.bitcast(bf16x32, pairs), packs.pairs,
                             [arith.addi(base, c(p)), c(0)])
            scf.yield_([])

    def query_block(self, packs, kv, queries: list, masks: list) -> None:
        """The states in packs.states of `queries` (ROWS_AT_ONCE rows' G
        query heads, interleaved: each one's chain of dependent steps is
        long) updated with the packed block in slot `kv` (`pack_block`),
        each one's keys the lanes of its mask in `masks`: 16 scores as
        head_dim / 2 `vdpbf16ps` of a transposed row and the query's pair
        broadcast (no sums across lanes), the weighted values on the value
        pairs. A query that has seen no key yet keeps m = -inf, l = 0 and
        acc = 0 (its exponentials taken against 0, not -inf - -inf).
        Skipping the masks in blocks every row sees whole (a second copy
        of the loop) measured 0.98-0.99x: not kept."""
        op, n, c = self.op, self.KEYS, self.cidx
        head_dim = op.params["head_dim"]
        words, halves = head_dim // 2, head_dim // 32
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        i32 = ir.IntegerType.get_signless(32)
        i32x16 = ir.VectorType.get([16], i32)
        minus_inf = self.cf32(float("-inf"))
        # The scores' pairs `chains` at a time in a loop, a chain of sums
        # each (unrolled, the 32 pairs' products were 740 of the tile
        # function's 8,700 lines of graph IR at SmolLM2's shape; the loop
        # measured no slower).
        chains = 4
        each = scf.ForOp(c(0), c(words), c(chains), [self.vzero(n)] * (chains * len(queries)))
        with ir.InsertionPoint(each.body):
            sums = list(each.inner_iter_args)
            for i in range(chains):
                p = arith.addi(each.induction_variable, c(i))
                key = vector.bitcast(bf16x32, vector.load(i32x16, packs.keys, [kv, p, c(0)]))
                for g, qi in enumerate(queries):
                    word = memref.load(packs.queries, [qi, p])
                    sums[g * chains + i] = dot_bf16(
                        sums[g * chains + i], key,
                        vector.bitcast(bf16x32, vector.broadcast(i32x16, word)))
            scf.yield_(sums)
        sums = [list(each.results[g * chains:(g + 1) * chains]) for g in range(len(queries))]
        scale = self.vsplat(self.cf32(op.params["scale"]), n)
        blocks, tops = [], []
        for g, qi in enumerate(queries):
            total = sums[g][0]
            for other in sums[g][1:]:
                total = arith.addf(total, other)
            block = arith.select(masks[g], self.capped(arith.mulf(total, scale)),
                                 self.vsplat(minus_inf, n))
            m = memref.load(packs.states, [qi, c(head_dim)])
            m_new = larger(m, largest_lane(block))
            m_from = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, m_new, minus_inf),
                                  self.cf32(0.0), m_new)
            blocks.append(block)
            tops.append((m, m_new, m_from))
        # The queries' rescalings exp(m - m_new) as one vector exponential
        # (a scalar one each was as costly as a vector).
        alphas = []
        for first in range(0, len(queries), n):
            some = [arith.subf(m, m_from) for m, _, m_from in tops[first:first + n]]
            both = self.exp2_of(vector.from_elements(
                self.vtype(n), some + [self.cf32(0.0)] * (n - len(some))))
            alphas += [vector.extract(both, [], [i]) for i in range(len(some))]
        weights = self.entry_alloca(ir.MemRefType.get([len(queries), n // 2], i32))
        parts = []
        for g, qi in enumerate(queries):
            _, _, m_from = tops[g]
            w = arith.select(masks[g], self.exp2_of(arith.subf(blocks[g], self.vsplat(m_from, n))),
                             self.vzero(n))
            # In bf16 (`vcvtneps2bf16`), as `key_block`'s: l counts the
            # rounded weights. l is kept per lane, summed at the end.
            w = ir.Operation.create("x86vector.avx512.cvt.packed.f32_to_bf16",
                                    results=[ir.VectorType.get([n], element_type("bf16"))],
                                    operands=[w]).result
            alpha16 = self.vsplat(alphas[g], 16)
            lanes = vector.load(self.vtype(n), packs.states, [qi, c(head_dim + 16)])
            vector.store(arith.addf(arith.mulf(lanes, alpha16), arith.extf(self.vtype(n), w)),
                         packs.states, [qi, c(head_dim + 16)])
            memref.store(tops[g][1], packs.states, [qi, c(head_dim)])
            parts.append([arith.mulf(vector.load(self.vtype(16), packs.states,
                                                 [qi, c(16 * i)]), alpha16)
                          for i in range(2 * halves)])
            vector.store(vector.bitcast(ir.VectorType.get([n // 2], i32), w), weights,
                         [c(g), c(0)])
        # The weighted values a pair of keys at a time in a loop, each
        # query's weights of the pair a word of a stack buffer (unrolled,
        # the 8 pairs were 300 more lines; no slower either).
        each = scf.ForOp(c(0), c(n // 2), c(1), [part for row in parts for part in row])
        with ir.InsertionPoint(each.body):
            p = each.induction_variable
            first = arith.muli(p, c(2 * halves))
            values = [vector.load(bf16x32, packs.values, [kv, arith.addi(first, c(i)), c(0)])
                      for i in range(2 * halves)]
            sums = []
            for g in range(len(queries)):
                pair = vector.bitcast(bf16x32, vector.broadcast(
                    i32x16, memref.load(weights, [c(g), p])))
                sums += [dot_bf16(part, value, pair) for part, value in zip(
                    each.inner_iter_args[2 * halves * g:2 * halves * (g + 1)], values)]
            scf.yield_(sums)
        for g, qi in enumerate(queries):
            for i in range(2 * halves):
                vector.store(each.results[2 * halves * g + i], packs.states, [qi, c(16 * i)])


#: `emit_query_blocks`' stack buffers: the queries' bf16 pairs as i32
#: (query, pair); their softmax states (query: acc at 0, m at head_dim, l
#: per lane from head_dim + 16); the block's keys transposed (KV head,
#: pair, key) and values paired (KV head, pair of keys x 32 columns, 32)
#: (`packed_keys`). On AMX tiles (`key_steps`) 2-D, rows of tiles: see
#: `KeySteps.pack_shapes`. Without tiles the last five are None.
_Packs = namedtuple("_Packs",
                    "queries states keys values scores weights rescales products pairs",
                    defaults=(None,) * 5)
