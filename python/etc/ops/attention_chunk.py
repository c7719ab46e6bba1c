"""The portable chunk tile of attention (`etc.ops.attention`, whose
docstring describes the tasks): one query head of a chunk per tile, and
the row loads every attention tile shares. The CPU and GPU chunk tiles
(`attention_cpu`, `attention.AttentionChunkWarps`) build on it."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math, memref, scf

from .kvcache import CacheRows
from .variants import PartKernel


class _AttentionKernel(PartKernel):
    """Rows of `head_dim` values as f32 vectors (`TileKernel.vload`)."""

    def load_row(self, t, idx: list) -> ir.Value:
        """head_dim consecutive values of `t` from `idx` on, as float32."""
        return self.vload(t, idx, self.op.params["head_dim"])

    def splat(self, value: ir.Value) -> ir.Value:
        return self.vsplat(value, self.op.params["head_dim"])

    def chunk_start(self, j: ir.Value, first_position: ir.Value) -> ir.Value:
        """The first key of chunk j of a request whose first new token is at
        `first_position`: j C, or with a window from `window_start` on."""
        k0 = arith.muli(j, self.cidx(self.op.params["chunk"]))
        if "window" not in self.op.params:
            return k0
        return arith.addi(self.window_start(first_position), k0)

    def request_keys(self, r: ir.Value, j: ir.Value) -> tuple:
        """Request r's first new token (its row of the step), how many new
        tokens it has, and the keys [k0, k_end) of its chunk j."""
        _, _, _, positions, _, _, request_length, request_first = self.op.operands[:8]
        length = self.load_index(request_length, [r])
        first = self.load_index(request_first, [r])
        first_position = self.load_index(positions, [first])
        k0 = self.chunk_start(j, first_position)
        k_end = arith.minsi(arith.addi(k0, self.cidx(self.op.params["chunk"])), length)
        return first, arith.subi(length, first_position), k0, k_end

    def capped(self, score: ir.Value) -> ir.Value:
        """A scaled score, soft-capped when the attention has a `softcap`
        c: c tanh(score / c) (Gemma 2)."""
        if "softcap" not in self.op.params:
            return score
        return self.unary("softcap", score, self.op.params["softcap"])

    def window_start(self, first_position: ir.Value) -> ir.Value:
        """Where a windowed request's chunks start: the first position its
        first new token (at `first_position`) sees."""
        window = self.op.params["window"]
        return arith.maxsi(arith.subi(first_position, self.cidx(window - 1)), self.cidx(0))

    def first_key(self, k0: ir.Value, position: ir.Value) -> ir.Value:
        """The first key of the chunk from `k0` that the token at `position`
        sees: k0, or with a window no key before position - W + 1."""
        window = self.op.params.get("window")
        if window is None:
            return k0
        return arith.maxsi(k0, arith.subi(position, self.cidx(window - 1)))

    def token_chunks(self, t: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The first chunk of token t's keys and how many chunks they span:
        None (chunk 0) and p // C + 1, or with a window those of
        max(0, p - W + 1) .. p in its request's chunks (`window_start`)."""
        op, params = self.op, self.op.params
        positions, token_request, request_first = (op.operands[i] for i in (3, 4, 7))
        chunk, window = params["chunk"], params.get("window")
        c = self.cidx
        position = self.load_index(positions, [t])
        if window is None:
            return None, arith.addi(arith.divui(position, c(chunk)), c(1))
        first = self.load_index(request_first, [self.load_index(token_request, [t])])
        start = self.window_start(self.load_index(positions, [first]))
        lowest = arith.maxsi(arith.subi(position, c(window - 1)), c(0))
        first_chunk = arith.divui(arith.subi(lowest, start), c(chunk))
        last_chunk = arith.divui(arith.subi(position, start), c(chunk))
        return first_chunk, arith.addi(arith.subi(last_chunk, first_chunk), c(1))

    def merge_chunks(self, t, first_chunk, chunks, m_at, l_at, row, splat, zero, head):
        """Token t's (l, acc) for query head `head`, merged over its chunks
        (from `first_chunk`, None: chunk 0): the chunks' sums weighted by
        exp(m_j - m), m the largest m_j. `row(j)` loads chunk j's weighted
        values, `splat` broadcasts a weight over them, `zero` is their
        start. With sinks the merge starts from the head's sink as one more
        chunk of sum 1 and no values: m also covers sinks[h], and l starts
        at exp(sinks[h] - m). Here, once per token, and nowhere else."""
        partial = self.buf(self.op.buffers["partial"])
        at = (lambda j: j) if first_chunk is None else (lambda j: arith.addi(first_chunk, j))
        sink = self.sink(head)
        m = self.reduce_row(chunks, self.cf32(float("-inf")) if sink is None else sink,
                            lambda acc, j: arith.maximumf(
                                acc, memref.load(partial, [t, at(j), m_at])))
        start, end = (self.cidx(0), chunks) if first_chunk is None else \
            (first_chunk, arith.addi(first_chunk, chunks))
        l0 = self.cf32(0.0) if sink is None else math.exp(arith.subf(sink, m))
        merge = scf.ForOp(start, end, self.cidx(1), [l0, zero])
        with ir.InsertionPoint(merge.body):
            j = merge.induction_variable
            l, acc = merge.inner_iter_args
            weight = math.exp(arith.subf(memref.load(partial, [t, j, m_at]), m))
            l = arith.addf(l, arith.mulf(weight, memref.load(partial, [t, j, l_at])))
            acc = arith.addf(acc, arith.mulf(row(j), splat(weight)))
            scf.yield_([l, acc])
        return merge.results

    def sink(self, head):
        """sinks[head] (the attention's optional ninth operand), or None."""
        if not has_sinks(self.op):
            return None
        return memref.load(self.buf(self.op.operands[8]), [head])


def has_sinks(op) -> bool:
    """Whether attention `op` has `sinks` (a ninth operand)."""
    return len(op.operands) > 8


class AttentionChunk(_AttentionKernel):
    """Tile (r, j S + s): the query heads of split s (H / S heads from
    s H / S on) of chunk j of request r, one (new token, query head) per
    lane iteration, an online softmax over the chunk's keys up to the
    token's position, stored as (acc, m, l) in `partial[t, j]`.

    S = H, a tile per query head: a decode step brings one token per
    request, and a tile per chunk was one worker's work for all heads while
    the others waited (36 us per layer of a 9-head model at B = 1: 6% of
    the workers' time)."""

    grid_rank = 2
    part = "chunk"

    @staticmethod
    def splits(op) -> int:
        """S, the tiles each chunk of a request is split into."""
        return op.params["heads"]

    @classmethod
    def tensors(cls, op) -> list:
        q, k_cache, v_cache, positions, _, addressing, request_length, request_first = \
            op.operands[:8]
        return [q, k_cache, v_cache, positions, addressing, request_length, request_first,
                op.buffers["partial"]]

    @staticmethod
    def heads_per_item(op) -> int:
        """The query heads a lane iteration takes together (one KV head's,
        or a part of them): one."""
        return 1

    def emit(self) -> None:
        op, params = self.op, self.op.params
        q, k_cache, v_cache, positions, _, addressing, _, _ = op.operands[:8]
        partial = op.buffers["partial"]
        head_dim = params["head_dim"]
        heads, group = params["heads"], params["heads"] // params["kv_heads"]
        c = self.cidx
        splits, per_item = self.splits(op), self.heads_per_item(op)
        per_split = heads // splits
        items = per_split // per_item  # lane iterations per token
        r, js = self.ti
        j = arith.divui(js, c(splits))
        head0 = arith.muli(arith.remui(js, c(splits)), c(per_split))
        where = CacheRows(self, k_cache, addressing, params.get("block_size"), r)
        first, new_tokens, k0, k_end = self.request_keys(r, j)
        loop = self.lane_loop(arith.muli(new_tokens, c(items)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            t = arith.addi(first, arith.divui(e, c(items)))
            h = arith.addi(head0, arith.muli(arith.remui(e, c(items)), c(per_item)))
            kv_column = arith.muli(arith.divui(h, c(group)), c(head_dim))
            # Causal: the token sees keys up to its own position.
            position = self.load_index(positions, [t])
            k1 = arith.minsi(k_end, arith.addi(position, c(1)))
            k_first = self.first_key(k0, position)
            guard = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, k_first, k1))
            with ir.InsertionPoint(guard.then_block):
                item = [arith.addi(h, c(i)) for i in range(per_item)]
                queries = [self.query_row(q, [t, arith.muli(head, c(head_dim))]) for head in item]
                states = self.softmax(queries, k_first, k1, where, kv_column)
                for head, (m, l, acc) in zip(item, states):
                    base = arith.muli(head, c(head_dim + 2))
                    self.vstore(acc, partial, [t, j, base])
                    memref.store(m, self.buf(partial), [t, j, arith.addi(base, c(head_dim))])
                    memref.store(l, self.buf(partial), [t, j, arith.addi(base, c(head_dim + 1))])
                scf.yield_([])
            scf.yield_([])

    def query_row(self, q, idx: list):
        """A query head's row from `idx`, as `softmax` takes it."""
        return self.load_row(q, idx)

    def softmax(self, queries, k_first, k1, where, kv_column) -> list:
        """[(m, l, acc)] of the online softmax of each of `queries` over keys
        [k_first, k1) of KV column `kv_column`: a key at a time."""
        op = self.op
        k_cache, v_cache = op.operands[1], op.operands[2]
        scale = self.cf32(op.params["scale"])
        (query,) = queries
        keys = scf.ForOp(k_first, k1, self.cidx(1),
                         [self.cf32(float("-inf")), self.cf32(0.0), self.splat(self.cf32(0.0))])
        with ir.InsertionPoint(keys.body):
            k = keys.induction_variable
            m, l, acc = keys.inner_iter_args
            at = where.at(k)
            key = self.load_row(k_cache, [*at, kv_column])
            dot = self.vsum(arith.mulf(query, key))
            score = self.capped(arith.mulf(dot, scale))
            m_new = arith.maximumf(m, score)
            alpha = math.exp(arith.subf(m, m_new))
            weight = math.exp(arith.subf(score, m_new))
            value = self.load_row(v_cache, [*at, kv_column])
            acc = arith.addf(arith.mulf(acc, self.splat(alpha)),
                             arith.mulf(value, self.splat(weight)))
            scf.yield_([m_new, arith.addf(arith.mulf(l, alpha), weight), acc])
        return [tuple(keys.results)]
