"""Attention over the KV cache: causal, grouped-query, flash-decoding.

Each token t of a step's ragged batch (request r = token_request[t], at
position p = positions[t]) attends to the cached keys and values at
positions 0 .. p of its request's slot, or, in a paged cache, of the
blocks its block table lists (key k at block block_table[r, k // P], row
k % P: the chunk tiles read the table, see `etc.ops.kvcache.CacheRows`);
query head h reads KV head h // (H / H_kv). The cache has already been
appended to (`kv_append`), so the step's own earlier tokens are there.

The KV sequence is split into chunks of C positions and computed in two
tasks, ordered by one event whose counts depend on the request lengths:

    chunk    tile (r, j S + s), grid (R, NC S): the partial softmax of every
             new token of request r over the keys [j C, min(j C + C, p + 1)),
             for the query heads of split s (S splits: one per up to 4 KV
             heads on the CPU, `attention_cpu.AttentionChunkBlocks`; one
             for all on the GPU, whose warps share them; one per query head
             in the portable `AttentionChunk`): its maximum m, its sum l
             and its weighted sum of values acc (D),
             into `partial[t, j]`. Live only while j < ceildiv(length[r], C):
             a request of length L runs S ceildiv(L, C) chunk tiles, decided
             at run time from `request_length` (an `#event.live` bound).
    combine  tile t, grid (T): merges token t's chunks j <= p floordiv C,
             weighting each by exp(m_j - max m).

`done[r]` (R elements, no `count`) is notified by every live chunk tile of
request r, so the scheduled program counts S ceildiv(length[r], C)
notifications into it before the run; combine tile t waits on
done[token_request[t]], an indirect wait. Nothing is padded: dead chunk
tiles never run, and no list of tiles is built on the host.

With `softcap` c the scaled scores are c tanh(score / c) (Gemma 2's
attention-logit soft-capping).

With `sinks` (gpt-oss; the ninth operand, (H,) float32) query head h's
softmax has one more logit sinks[h] of value zero. Only the combine tile
sees it: its merge of token t's chunks starts from the sink as a chunk
of sum 1 and no values (m = max(sinks[h], max_j m_j), l starting at
exp(sinks[h] - m)), so the chunk tiles (CPU, AMX, GPU) are the same with
or without sinks, and the sink counts once per token however many chunks
its keys span.

A sliding-window attention (`window` W: token t sees positions
max(0, p - W + 1) .. p) starts request r's chunks at the window of its
first new token, s = max(0, p0 - W + 1) (p0 = positions[request_first[r]]):
chunk j covers [s + j C, s + j C + C), and combine tile t merges the chunks
its own window spans. Its grid holds min(NC, ceil((T + W - 1) / C))
chunks, what any request's new tokens and their windows can span, with the
same live bound: a request runs min(that, ceildiv(length[r], C)) chunk
tiles, so a decode step of a long request reads about W keys, not L.

`partial` (T, NC, H (D + 2)) float32 has no footprints: which rows a chunk
tile writes is runtime data, and `done` orders it. The chunk count NC is
ceil(L / C) of the cache length L (symbolic when L is), which bounds the
grid. Several
attentions may share one `partial` (the layers of a model): every combine
tile then notifies a `released` event (count T), and the next attention
using the scratch waits on it in every chunk tile before overwriting it.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import affine, arith, math, memref, scf

from ..dialects import event
from .base import TaskBuilder, box, index_map, live_bound, whole
from .attention_chunk import AttentionChunk, _AttentionKernel
from .attention_cpu import AttentionChunkBlocks
from .kvcache import CacheRows

KINDS = ("attention",)


class AttentionCombine(_AttentionKernel):
    """Tile t: one query head per lane iteration, merging the token's
    chunks: out = sum_j exp(m_j - m) acc_j / sum_j exp(m_j - m) l_j (with
    sinks, plus exp(sinks[h] - m) in the denominator and in m)."""

    grid_rank = 1
    part = "combine"

    @classmethod
    def tensors(cls, op) -> list:
        # A window's chunks start where the request's first token's window
        # does: the token's request and that token locate them.
        indices = [op.operands[i] for i in ((3, 4, 7) if "window" in op.params else (3,))]
        return [*indices, *op.operands[8:], op.buffers["partial"], op.result]

    def emit(self) -> None:
        op, params = self.op, self.op.params
        partial, out = op.buffers["partial"], op.result
        head_dim, heads = params["head_dim"], params["heads"]
        t = self.ti[0]
        first_chunk, chunks = self.token_chunks(t)
        loop = self.lane_loop(self.cidx(heads))
        with ir.InsertionPoint(loop.body):
            h = loop.induction_variable
            base = arith.muli(h, self.cidx(head_dim + 2))
            m_at = arith.addi(base, self.cidx(head_dim))
            l_at = arith.addi(base, self.cidx(head_dim + 1))
            l, acc = self.merge_chunks(t, first_chunk, chunks, m_at, l_at,
                                       lambda j: self.load_row(partial, [t, j, base]),
                                       self.splat, self.splat(self.cf32(0.0)), h)
            self.vstore(arith.divf(acc, self.splat(l)), out,
                           [t, arith.muli(h, self.cidx(head_dim))])
            scf.yield_([])


class AttentionChunkWarps(AttentionChunk):
    """GPU tile (r, j): a warp per (new token, KV head) of request r, its
    lanes along head_dim, reading each key and value row of the chunk once
    for the G = H / H_kv query heads that share it.

    A row of D cache values is P = D / VEC lanes, each loading VEC values
    (16 bytes: 8 bf16 or f16, 4 f32); the warp's 32 / P row groups take
    consecutive keys, and each takes UNROLL keys per iteration (loads first),
    so a warp has 32 x 16 x UNROLL bytes of keys and as many of values in
    flight. Per key a lane forms its part of the G dot products, the row
    group sums them (`lane_reduce` over P lanes) and every lane of the group
    updates the same online softmax (m, l) and its VEC columns of the
    weighted sum. After the chunk's keys the row groups' states are merged
    (max of m, then sums rescaled by exp(m_group - m)) and the first row
    group stores (acc, m, l) into `partial[t, j]`, like `AttentionChunk`.

    When P does not divide the warp (head_dim 96: 12 lanes of 8 bf16), a
    row takes the next power of two of lanes and the lanes past P are idle:
    they load a clamped column, add 0 to the dot products and store nothing.

    Warps take the tile's (token, KV head) items round-robin; every lane
    runs every round and key iteration (items and keys past the end are
    masked, with clamped addresses), so the warp's shuffles are never
    divergent and the simulated lanes see the same loops. In a paged cache
    each row group reads its key's block from the table (`CacheRows`).
    """

    part = "chunk_warps"

    @staticmethod
    def splits(op) -> int:
        """One tile per chunk: its warps share the heads."""
        return 1
    #: Keys per row group and iteration.
    UNROLL = 4
    #: Query heads one warp takes at most: a KV head of more query heads
    #: (Llama-3.2-1B and Gemma 3 1B: 4, Qwen3-30B-A3B: 8) is split between
    #: warps, which then read its keys and values once each (together: the
    #: second from L1), so that a lane's softmax states and its UNROLL x
    #: heads dot products stay in registers. At 4 heads (16 dot products)
    #: Llama-3.2-1B's and Qwen3-30B-A3B's plain bf16 step workers reached
    #: 255 registers and spilled 8 and 36 bytes on sm_90a (docs/gpu.md,
    #: "Registers of the step worker").
    MAX_HEADS = 2

    @staticmethod
    def vec(op) -> int:
        """Cache values in 16 bytes."""
        return 16 // (4 if op.operands[1].dtype == "f32" else 2)

    @classmethod
    def threads(cls, op) -> tuple[int, int]:
        """(lanes per cache row, of them the lanes with columns): P = D / VEC,
        rounded up to a power of two so that it divides the warp."""
        used = op.params["head_dim"] // cls.vec(op)
        return 1 << max(used - 1, 0).bit_length(), used

    @classmethod
    def applies(cls, op, target) -> bool:
        d = op.params["head_dim"]
        threads, _ = cls.threads(op)
        return (target.gpu_kernels and d % cls.vec(op) == 0 and 1 <= threads <= target.warp
                and target.warp % threads == 0 and target.lanes % target.warp == 0)

    def emit(self) -> None:
        op, params = self.op, self.op.params
        q, k_cache, v_cache, positions, _, addressing, _, _ = op.operands[:8]
        partial = op.buffers["partial"]
        head_dim = params["head_dim"]
        heads, kv_heads = params["heads"], params["kv_heads"]
        group = heads // kv_heads
        per_item = max(h for h in range(1, min(group, self.MAX_HEADS) + 1) if group % h == 0)
        splits = group // per_item
        vec = self.vec(op)
        lanes = self.lanes()
        threads, used = self.threads(op)          # P: lanes per cache row
        row_groups = lanes.warp // threads        # keys a warp reads at once
        warps = lanes.count // lanes.warp
        unroll = self.UNROLL
        c = self.cidx
        r, j = self.ti
        cache_rows = CacheRows(self, k_cache, addressing, params.get("block_size"), r)
        first, new_tokens, k0, k_end = self.request_keys(r, j)
        last_key = arith.subi(k_end, c(1))
        items = arith.muli(new_tokens, c(kv_heads * splits))
        rounds = arith.ceildivui(items, c(warps))
        scale = params["scale"]
        round_loop = scf.ForOp(c(0), rounds, c(1))
        with ir.InsertionPoint(round_loop.body):
            round_index = round_loop.induction_variable

            def where(lane):
                """This lane's item (token t, KV head, its first query head)
                and place in its warp."""
                warp = arith.divui(lane, c(lanes.warp))
                in_warp = arith.remui(lane, c(lanes.warp))
                item = arith.addi(arith.muli(round_index, c(warps)), warp)
                valid = arith.cmpi(arith.CmpIPredicate.slt, item, items)
                item = arith.minsi(item, arith.subi(items, c(1)))
                t = arith.addi(first, arith.divui(item, c(kv_heads * splits)))
                rest = arith.remui(item, c(kv_heads * splits))
                kv_head = arith.divui(rest, c(splits))
                head0 = arith.addi(arith.muli(kv_head, c(group)),
                                   arith.muli(arith.remui(rest, c(splits)), c(per_item)))
                position = self.load_index(positions, [t])
                k1 = arith.minsi(k_end, arith.addi(position, c(1)))
                part = arith.remui(in_warp, c(threads))
                # Lanes past the row's columns (P rounded up) read the last
                # columns and keep out of the sums and stores.
                active = None if used == threads else \
                    arith.cmpi(arith.CmpIPredicate.slt, part, c(used))
                if active is not None:
                    part = arith.minui(part, c(used - 1))
                return dict(valid=valid, t=t, head0=head0, k1=k1, part=part, active=active,
                            k_first=self.first_key(k0, position),
                            row_group=arith.divui(in_warp, c(threads)),
                            column=arith.addi(arith.muli(kv_head, c(head_dim)),
                                              arith.muli(part, c(vec))))

            def load_queries(lane):
                w = where(lane)
                return [self.vload(q, [w["t"], arith.addi(
                    arith.muli(arith.addi(w["head0"], c(g)), c(head_dim)),
                    arith.muli(w["part"], c(vec)))], vec, aligned=True)
                        for g in range(per_item)]

            queries = lanes.each(load_queries)
            state = lanes.each(lambda lane: [v for _ in range(per_item) for v in (
                self.cf32(float("-inf")), self.cf32(0.0), self.vzero(vec))])

            def key_of(k, w, u):
                """The key of unroll step u, and that key clamped into the chunk."""
                key = arith.addi(k, arith.addi(c(u * row_groups), w["row_group"]))
                return key, arith.minsi(key, last_key)

            def iteration(k, state):
                def dots(lane):
                    w = where(lane)
                    qs = lanes.get(queries, lane)
                    out = []
                    for u in range(unroll):
                        _, key = key_of(k, w, u)
                        kv = self.vload(k_cache, [*cache_rows.at(key), w["column"]], vec,
                                        aligned=True)
                        dots = [self.vsum(arith.mulf(qs[g], kv)) for g in range(per_item)]
                        if w["active"] is not None:
                            dots = [arith.select(w["active"], v, self.cf32(0.0)) for v in dots]
                        out += dots
                    return out

                scores = lanes.reduce(lanes.each(dots), "add", threads)

                def update(lane):
                    w = where(lane)
                    got = lanes.get(scores, lane)
                    now = list(lanes.get(state, lane))
                    for u in range(unroll):
                        key, clamped = key_of(k, w, u)
                        sees = arith.andi(w["valid"],
                                          arith.cmpi(arith.CmpIPredicate.slt, key, w["k1"]))
                        if "window" in params:
                            sees = arith.andi(sees, arith.cmpi(arith.CmpIPredicate.sge, key,
                                                               w["k_first"]))
                        value = self.vload(v_cache, [*cache_rows.at(clamped), w["column"]],
                                           vec, aligned=True)
                        for g in range(per_item):
                            m, l, acc = now[3 * g:3 * g + 3]
                            score = self.capped(arith.mulf(got[u * per_item + g],
                                                           self.cf32(scale)))
                            m_new = arith.maximumf(m, score)
                            alpha = math.exp(arith.subf(m, m_new))
                            weight = math.exp(arith.subf(score, m_new))
                            l_new = arith.addf(arith.mulf(l, alpha), weight)
                            acc_new = arith.addf(arith.mulf(acc, self.vsplat(alpha, vec)),
                                                 arith.mulf(value, self.vsplat(weight, vec)))
                            now[3 * g:3 * g + 3] = [arith.select(sees, m_new, m),
                                                    arith.select(sees, l_new, l),
                                                    arith.select(sees, acc_new, acc)]
                    return now

                return lanes.each(update)

            state = lanes.loop(k0, k_end, c(row_groups * unroll), state, iteration)
            # The row groups' softmax states merged: the largest m, then the
            # sums rescaled to it (a group that saw no key has m = -inf and
            # counts 0).
            most = lanes.reduce(lanes.each(lambda lane: lanes.get(state, lane)[0::3]),
                                "maxnumf", row_groups, threads)

            def rescaled(lane):
                now = lanes.get(state, lane)
                top = lanes.get(most, lane)
                out = []
                for g in range(per_item):
                    m, l, acc = now[3 * g:3 * g + 3]
                    empty = arith.cmpf(arith.CmpFPredicate.OEQ, m, self.cf32(float("-inf")))
                    factor = arith.select(empty, self.cf32(0.0),
                                          math.exp(arith.subf(m, top[g])))
                    out += [arith.mulf(l, factor), arith.mulf(acc, self.vsplat(factor, vec))]
                return out

            sums = lanes.reduce(lanes.each(rescaled), "add", row_groups, threads)

            def store(lane):
                w = where(lane)
                leads = arith.andi(w["valid"], arith.andi(
                    arith.cmpi(arith.CmpIPredicate.eq, w["row_group"], c(0)),
                    arith.cmpi(arith.CmpIPredicate.slt, w["k_first"], w["k1"])))
                if w["active"] is not None:
                    leads = arith.andi(leads, w["active"])
                branch = scf.IfOp(leads)
                with ir.InsertionPoint(branch.then_block):
                    top = lanes.get(most, lane)
                    got = lanes.get(sums, lane)
                    first_part = arith.cmpi(arith.CmpIPredicate.eq, w["part"], c(0))
                    for g in range(per_item):
                        h = arith.addi(w["head0"], c(g))
                        base = arith.muli(h, c(head_dim + 2))
                        self.vstore(got[2 * g + 1], partial,
                                    [w["t"], j, arith.addi(base, arith.muli(w["part"], c(vec)))])
                        scalars = scf.IfOp(first_part)
                        with ir.InsertionPoint(scalars.then_block):
                            memref.store(top[g], self.buf(partial),
                                         [w["t"], j, arith.addi(base, c(head_dim))])
                            memref.store(got[2 * g], self.buf(partial),
                                         [w["t"], j, arith.addi(base, c(head_dim + 1))])
                            scf.yield_([])
                    scf.yield_([])
            lanes.each(store)
            scf.yield_([])


class AttentionCombineLanes(AttentionCombine):
    """GPU tile t: lanes along head_dim, VEC = 4 float32 columns of one
    query head each (consecutive lanes, consecutive columns), merging the
    token's chunks as `AttentionCombine` does; no lane holds more than its
    own columns."""

    part = "combine_lanes"
    VEC = 4

    @classmethod
    def applies(cls, op, target) -> bool:
        return target.gpu_kernels and op.params["head_dim"] % cls.VEC == 0

    def emit(self) -> None:
        op, params = self.op, self.op.params
        partial, out = op.buffers["partial"], op.result
        head_dim, heads = params["head_dim"], params["heads"]
        vec = self.VEC
        threads = head_dim // vec
        c = self.cidx
        t = self.ti[0]
        first_chunk, chunks = self.token_chunks(t)
        loop = self.lane_loop(c(heads * threads))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            h = arith.divui(e, c(threads))
            column = arith.muli(arith.remui(e, c(threads)), c(vec))
            base = arith.muli(h, c(head_dim + 2))
            m_at = arith.addi(base, c(head_dim))
            l_at = arith.addi(base, c(head_dim + 1))
            l, acc = self.merge_chunks(
                t, first_chunk, chunks, m_at, l_at,
                lambda j: self.vload(partial, [t, j, arith.addi(base, column)], vec),
                lambda weight: self.vsplat(weight, vec), self.vzero(vec), h)
            self.vstore(arith.divf(acc, self.vsplat(l, vec)), out,
                        [t, arith.addi(arith.muli(h, c(head_dim)), column)])
            scf.yield_([])


def _window_chunks(b: TaskBuilder, tokens, chunks, window: int, chunk: int,
                   splits: int) -> ir.Value:
    """The chunk grid of a sliding-window attention (times `splits`):
    min(chunks, ceil((T + W - 1) / C)), T the step's tokens. A request's
    new tokens (at most T) and their windows span at most T + W - 1 keys
    from its chunks' start."""
    index = ir.IndexType.get()
    if isinstance(tokens, int):
        span = arith.constant(index, -(-(tokens + window - 1) // chunk))
    else:
        spanned = ir.AffineMap.get(1, 0, [ir.AffineExpr.get_ceil_div(
            ir.AffineExpr.get_add(ir.AffineDimExpr.get(0),
                                  ir.AffineConstantExpr.get(window - 1)),
            ir.AffineConstantExpr.get(chunk))])
        span = affine.apply(spanned, [b.grid_extent(tokens, 1)])
    extent = arith.minui(span, b.grid_extent(chunks, 1))
    return extent if splits == 1 else arith.muli(extent, arith.constant(index, splits))


def build_tasks(b: TaskBuilder, op) -> None:
    q, k_cache, v_cache, positions, token_request, _, request_length, request_first = \
        op.operands[:8]
    partial = op.buffers["partial"]
    chunk = op.params["chunk"]
    requests = request_length.shape[0]
    kernel = next(k for k in (AttentionChunkWarps, AttentionChunkBlocks, AttentionChunk)
                  if k is AttentionChunk or k.applies(op, b.target))
    splits = kernel.splits(op)
    grid = [b.grid_extent(requests, 1), b.grid_extent(partial.shape[1], 1, scale=splits)]
    window = op.params.get("window")
    if window is not None:
        grid[1] = _window_chunks(b, q.shape[0], partial.shape[1], window, chunk, splits)
    if isinstance(requests, int):
        done_type, sizes = ir.Type.parse(f"!event.tensor<{requests}>"), []
    else:
        done_type, sizes = ir.Type.parse("!event.tensor<?>"), [grid[0]]
    # No `count`: each request's element expects one notify per live chunk
    # tile, ceildiv(length, C), which the scheduled program counts.
    done = event.AllocOp(done_type, sizes).result
    # A scratch shared with an earlier attention: wait until all of its
    # combine tiles have read it.
    key = ("attention_scratch", id(partial))
    released = b.events.get(key)
    b.emit_task(op, f"{op.name}_chunk", grid,
                [(q, whole(2, q)), (k_cache, whole(2, k_cache)), (v_cache, whole(2, v_cache))],
                [], kernel,
                waits=[(released, index_map("(d0, d1) -> ()"))] if released is not None else [],
                notifies=[(done, index_map("(d0, d1) -> (d0)"))],
                indices=[request_length],
                live=[live_bound(1, f"(d0) -> ((d0 ceildiv {chunk}) * {splits})"
                                 if splits > 1 else f"(d0) -> (d0 ceildiv {chunk})",
                                 "(d0, d1) -> (d0) indirect [0]")])
    tokens = b.grid_extent(q.shape[0], 1)
    notifies = []
    if op.params.get("shared_scratch"):
        released = event.AllocOp(ir.Type.parse("!event.tensor<>"), [], count=tokens).result
        b.events[key] = released
        notifies.append((released, index_map("(d0) -> ()")))
    sinks = [(t, whole(1, t)) for t in op.operands[8:]]
    b.emit_task(op, f"{op.name}_combine", [tokens], sinks,
                [(op.result, box(1, ["d0", "0"], [1, None]))],
                AttentionCombineLanes if AttentionCombineLanes.applies(op, b.target)
                else AttentionCombine,
                waits=[(done, index_map("(d0) -> (d0) indirect [0]"))],
                notifies=notifies, indices=[token_request])
