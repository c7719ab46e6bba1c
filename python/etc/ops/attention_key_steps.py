"""Wide steps of keys for the CPU prefill attention on AMX tiles
(`AttentionChunkBlocks`, `QueryBlocks.emit_query_blocks`): TILE_KEYS keys
(a multiple of 32) per step of the online softmax instead of one block of
KEYS = 16.

A block of 16 keys at a time (the kernel before, 23aab0a) updated 16
queries' states after every 16 keys: the row's
rescaling of its head_dim sums (a load, an FMA and a store per 16 of
them), its largest score and the rescaling's exponential, and a weighted
values product whose K is half empty (16 keys of a tile's 32). Per 16
queries x 16 keys at head_dim 128 that bookkeeping is about as many
AVX-512 instructions as the scores' exponentials themselves. A step of
TILE_KEYS keys (`key_steps`, `query_tiles`) pays it once per step:
the scores of each 16 keys a tile product as before (the keys' rows times
the queries in the VNNI layout, transposed back to a row a query), each
row's largest over the step, its weights for all of them, and the
weighted values as TILE_KEYS / 32 full `tdpbf16ps` per 16 columns summed
in the tile before one store.

Where the blocks are `aligned` in a paged cache (every 16 keys from a
multiple of 16 lie in one cache block) the keys' tiles load straight from
the cache (`tileloadd` with the cache's row stride, the tile's KV head's
columns): nothing is copied for the scores. The values are paired for the
VNNI layout (`interleaved_values`) once per KV head and step, for all the
tile's queries of that head.

Keys past the tile's last are the last block's again (aligned) or the last
key's row (clamped), their scores masked to -inf and their weights 0: a
row of stale cache holds finite or NaN values that `select` discards, and
the values' rows are always live rows."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref, scf, vector

from .base import element_type
from .matmul_amx import transpose16


class KeySteps:
    """`key_steps` and `query_tiles`, for `QueryBlocks` on AMX tiles."""

    #: Keys per step of the online softmax on AMX tiles (a multiple of 32).
    #: Qwen3-0.6B's shape, 256 new tokens after 1,792 cached, 2 layers, one
    #: worker (2026-11-28, load 0.3-0.8, fastest of 20): a block of 16 keys
    #: at a time (the tile kernel before this one, 23aab0a) 97.8 ms, steps
    #: of 32 69.1, 64 69.3, 128 68.8 (the last step of a 128-key chunk's
    #: tile is then often mostly masked: 64).
    TILE_KEYS = 64

    def tile_keys(self) -> int:
        """TILE_KEYS, which must be a positive multiple of 32 (a whole K of
        the weighted values' tiles)."""
        steps = self.TILE_KEYS
        if not isinstance(steps, int) or steps < 32 or steps % 32:
            raise ValueError(f"{type(self).__name__}.TILE_KEYS must be a positive multiple of "
                             f"32 (the weighted values' tiles take 32 keys), got {steps!r}")
        return steps

    def pack_shapes(self, kv_heads: int, per_kv: int) -> tuple:
        """The stack buffers of `key_steps` (see `_Packs`): queries, states,
        keys (rows of a step where they are copied), values (a tile per 32
        keys and 16 columns), scores and weights (a row a query, a column a
        key of the step), rescalings, weighted values, queries in VNNI."""
        head_dim, steps = self.op.params["head_dim"], self.tile_keys()
        halves = head_dim // 32
        bf16 = element_type("bf16")
        return (([kv_heads * per_kv, head_dim], bf16),
                ([kv_heads * per_kv, head_dim + 32], self.f32),
                ([steps, head_dim], bf16), ([steps // 32 * 2 * halves * 16, 32], bf16),
                ([16, steps], self.f32), ([16, steps], bf16), ([16], self.f32),
                ([2 * halves * 16, 16], self.f32),
                ([kv_heads * per_kv * halves, 32], bf16))

    def direct_keys(self):
        """The key cache as a 2-D memref (cache row, column) whose tiles of
        16 rows `key_steps` loads in place, or None: only where the blocks
        are `aligned` in a paged cache (16 keys from a multiple of 16 never
        cross a cache block, so the tile's rows exist)."""
        if not self.aligned() or self.op.params.get("block_size") is None:
            return None
        cache = self.buf(self.op.operands[1])
        source = ir.MemRefType(cache.type)
        dynamic = ir.ShapedType.get_dynamic_size()
        blocks, rows, width = source.shape
        rows = dynamic if dynamic in (blocks, rows) else blocks * rows
        return memref.collapse_shape(ir.MemRefType.get([rows, width], source.element_type),
                                     cache, [[0, 1], [2]])

    def key_steps(self, packs, where, kv_column, k_first, k1, bounds, tiles) -> None:
        """`packed_keys` in steps of `tile_keys` keys: per step and KV head
        its values paired (and its keys copied unless `direct_keys`), then
        `query_tiles` for each 16 of its queries."""
        op, params, n, c = self.op, self.op.params, self.KEYS, self.cidx
        head_dim, group = params["head_dim"], params["heads"] // params["kv_heads"]
        steps = self.tile_keys()
        per_kv = self.query_rows() * group
        last = arith.subi(k1, c(1))
        aligned = self.aligned()
        if aligned:
            caches, row_of = self.flat_rows(where, kv_column)
            # The last block's first key: every block of the step starts
            # at or before it, so its 16 rows are in one cache block.
            last_start = arith.addi(k_first, arith.muli(
                arith.divui(arith.subi(last, k_first), c(n)), c(n)))
        else:
            caches = [self.buf(t) for t in op.operands[1:3]]
        direct = self.direct_keys()
        if direct is not None:
            rows_per_block = self.dim(op.operands[1], 1)

        def aligned_rows(start):
            """`row_of` the block from key `start`, the last block's start
            at most, clamped to the last key."""
            start = arith.minsi(start, last_start)
            return row_of(start, arith.subi(k1, start))

        def block_rows(start):
            """The 16 rows of the block from key `start`, clamped to the last
            key; aligned blocks from the last block's start at most."""
            if aligned:
                return self.each_row(aligned_rows(start))
            return [[*where.at(arith.minsi(arith.addi(start, c(i)), last)), kv_column]
                    for i in range(n)]

        loop = scf.ForOp(k_first, k1, c(steps))
        with ir.InsertionPoint(loop.body):
            key = loop.induction_variable
            starts = [arith.addi(key, c(n * g)) for g in range(steps // n)]
            at = [block_rows(start) for start in starts]
            if aligned:
                for start in starts:
                    self.prefetch(caches, aligned_rows(arith.addi(start, c(steps))), False)
            if direct is not None:
                cache_rows = []
                for start in starts:
                    block, row = where.at(arith.minsi(start, last_start))
                    cache_rows.append(arith.addi(arith.muli(block, rows_per_block), row))
            heads = scf.ForOp(c(0), c(self.kv_heads_per_tile(op)), c(1))
            with ir.InsertionPoint(heads.body):
                kv = heads.induction_variable
                column = arith.muli(kv, c(head_dim))
                shifted = [[a[:-1] + [arith.addi(a[-1], column)] for a in rows] for rows in at]
                self.pair_step_values(packs, caches[1], shifted)
                if direct is not None:
                    first_column = arith.addi(kv_column, column)
                    keys = [(direct, row, first_column) for row in cache_rows]
                else:
                    keys = self.copy_step_keys(packs, caches[0], shifted)
                each = scf.ForOp(c(0), c(per_kv), c(16))
                with ir.InsertionPoint(each.body):
                    self.query_tiles(tiles, packs, kv, key, each.induction_variable, bounds,
                                     keys)
                    scf.yield_([])
                scf.yield_([])
            scf.yield_([])

    def copy_step_keys(self, packs, cache, blocks: list) -> list:
        """The step's key rows (16 a block, at `blocks`) copied into
        packs.keys; (memref, row, column) of each block's tile there."""
        c = self.cidx
        head_dim = self.op.params["head_dim"]
        bf16x32 = ir.VectorType.get([32], element_type("bf16"))
        for g, rows in enumerate(blocks):
            for i, at in enumerate(rows):
                for column in range(0, head_dim, 32):
                    vector.store(vector.load(bf16x32, cache, self.column(at, column)),
                                 packs.keys, [c(16 * g + i), c(column)])
        return [(packs.keys, c(16 * g), c(0)) for g in range(len(blocks))]

    def pair_step_values(self, packs, cache, blocks: list) -> None:
        """The step's value rows (16 a block, at `blocks`) in the VNNI layout
        of the weighted values' tiles: per 32 keys h and 16 columns i (in
        `interleaved_values`' lane order) a 16 x 32 tile whose row p pairs
        keys 32 h + 2 p and 32 h + 2 p + 1."""
        c = self.cidx
        tiles_per_row = self.op.params["head_dim"] // 16
        rows = [at for block in blocks for at in block]
        for h in range(len(rows) // 32):
            for p in range(16):
                pairs = self.interleaved_values(cache, rows[32 * h + 2 * p],
                                                rows[32 * h + 2 * p + 1])
                for i, vec in enumerate(pairs):
                    vector.store(vec, packs.values,
                                 [c((h * tiles_per_row + i) * 16 + p), c(0)])

    def query_tiles(self, tiles, packs, kv, key, first, bounds, keys: list) -> None:
        """The states of 16 queries of KV head `kv` (`emit_query_blocks`'
        queries `first` .. `first` + 15 of it) updated with the step of
        keys from `key`: each block's 16 x 16 scores (keys' tiles `keys`
        times the queries' pairs, transposed back to a row a query), each
        row's online softmax over the step's masked scores, the weighted
        values as the step's weights times its value pairs per 16 columns,
        added to each row's rescaled sums."""
        op, c, n = self.op, self.cidx, self.KEYS
        head_dim, group = op.params["head_dim"], op.params["heads"] // op.params["kv_heads"]
        halves, steps = head_dim // 32, self.tile_keys()
        per_kv = self.query_rows() * group
        base = arith.addi(arith.muli(kv, c(per_kv)), first)
        pairs_row = arith.muli(arith.divui(base, c(16)), c(halves))
        for g, (memory, row, column) in enumerate(keys):
            scores = tiles.zero()
            for s in range(halves):
                scores = tiles.mul(tiles.load(memory, row, arith.addi(column, c(32 * s))),
                                   tiles.load(packs.pairs, arith.muli(
                                       arith.addi(pairs_row, c(s)), c(16)), c(0)),
                                   scores)
            tiles.store(packs.scores, c(0), c(16 * g), scores)
        for g in range(len(keys)):
            rows = transpose16([vector.load(self.vtype(n), packs.scores, [c(i), c(16 * g)])
                                for i in range(16)])
            for i, values in enumerate(rows):
                vector.store(values, packs.scores, [c(i), c(16 * g)])
        scale = self.vsplat(self.cf32(op.params["scale"]), n)
        minus_inf = self.cf32(float("-inf"))
        bf16x16 = ir.VectorType.get([n], element_type("bf16"))
        each = scf.ForOp(c(0), c(16), c(1))
        with ir.InsertionPoint(each.body):
            r = each.induction_variable
            qi = arith.addi(base, r)
            _, row_first, row_end = bounds(arith.divui(arith.addi(first, r), c(group)))
            masks, blocks = [], []
            for g in range(len(keys)):
                mask = self.key_lanes(arith.addi(key, c(n * g)), row_first, row_end)
                masks.append(mask)
                blocks.append(arith.select(mask, self.capped(arith.mulf(
                    vector.load(self.vtype(n), packs.scores, [r, c(16 * g)]), scale)),
                    self.vsplat(minus_inf, n)))
            top = blocks[0]
            for block in blocks[1:]:
                top = larger(top, block)
            m = memref.load(packs.states, [qi, c(head_dim)])
            m_new = larger(m, largest_lane(top))
            m_from = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, m_new, minus_inf),
                                  self.cf32(0.0), m_new)
            memref.store(m_new, packs.states, [qi, c(head_dim)])
            memref.store(arith.subf(m, m_from), packs.rescales, [r])
            for g, (mask, block) in enumerate(zip(masks, blocks)):
                w = arith.select(mask, self.exp2_of(arith.subf(block, self.vsplat(m_from, n))),
                                 self.vzero(n))
                w = ir.Operation.create("x86vector.avx512.cvt.packed.f32_to_bf16",
                                        results=[bf16x16], operands=[w]).result
                vector.store(w, packs.weights, [r, c(16 * g)])
            scf.yield_([])
        vector.store(self.exp2_of(vector.load(self.vtype(n), packs.rescales, [c(0)])),
                     packs.rescales, [c(0)])
        # At -O0 (`AMXTiles.in_memory`) each product loads its own weights:
        # LLVM's register allocator failed on a weights tile live across
        # the products there ("Remaining virtual register"). Else the
        # step's weights stay in tiles for every column's products.
        parts = steps // 32
        weights = None if tiles.in_memory else [
            tiles.load(packs.weights, c(0), c(32 * h)) for h in range(parts)]
        for i in range(2 * halves):
            part = tiles.zero()
            for h in range(parts):
                part = tiles.mul(weights[h] if weights is not None else tiles.load(
                    packs.weights, c(0), c(32 * h)), tiles.load(
                    packs.values, c((h * 2 * halves + i) * 16), c(0)), part)
            tiles.store(packs.products, c(16 * i), c(0), part)
        each = scf.ForOp(c(0), c(16), c(1))
        with ir.InsertionPoint(each.body):
            r = each.induction_variable
            qi = arith.addi(base, r)
            alpha = self.vsplat(memref.load(packs.rescales, [r]), 16)
            lanes = arith.mulf(vector.load(self.vtype(n), packs.states, [qi, c(head_dim + 16)]),
                               alpha)
            for g in range(len(keys)):
                lanes = arith.addf(lanes, arith.extf(self.vtype(n), vector.load(
                    bf16x16, packs.weights, [r, c(16 * g)])))
            vector.store(lanes, packs.states, [qi, c(head_dim + 16)])
            for i in range(2 * halves):
                acc = vector.load(self.vtype(16), packs.states, [qi, c(16 * i)])
                part = vector.load(self.vtype(16), packs.products,
                                   [arith.addi(r, c(16 * i)), c(0)])
                vector.store(math.fma(acc, alpha, part), packs.states, [qi, c(16 * i)])
            scf.yield_([])


def largest_lane(v: ir.Value) -> ir.Value:
    """The largest of the 16 lanes of `v`, which holds no NaN: a tree of
    halves and `vmaxps` without NaN checks (a `vector.reduction` took
    15 scalar max with a NaN check each, one after another)."""
    width = 16
    while width > 1:
        half = width // 2
        v = larger(vector.shuffle(v, v, list(range(half))),
                    vector.shuffle(v, v, list(range(half, width))))
        width = half
    return vector.extract(v, [], [0])


def larger(a: ir.Value, b: ir.Value) -> ir.Value:
    """a > b ? a : b, which is `vmaxps`'s own rule (arith's maximumf and
    maxnumf lower with NaN and signed-zero checks besides)."""
    return arith.select(arith.cmpf(arith.CmpFPredicate.OGT, a, b), a, b)
