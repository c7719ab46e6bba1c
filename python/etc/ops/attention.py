"""Attention over the KV cache: causal, grouped-query, flash-decoding.

Each token t of a step's ragged batch (request r = token_request[t], at
position p = positions[t]) attends to the cached keys and values at
positions 0 .. p of its request's slot; query head h reads KV head
h // (H / H_kv). The cache has already been appended to (`kv_append`), so
the step's own earlier tokens are there.

The KV sequence is split into chunks of C positions and computed in two
tasks, ordered by one event whose counts depend on the request lengths:

    chunk    tile (r, j), grid (R, NC): the partial softmax of every new token
             of request r over the keys [j C, min(j C + C, p + 1)): its
             maximum m, its sum l and its weighted sum of values acc (D),
             into `partial[t, j]`. Live only while j < ceildiv(length[r], C):
             a request of length L runs ceildiv(L, C) chunk tiles, decided
             at run time from `request_length` (an `#event.live` bound).
    combine  tile t, grid (T): merges token t's chunks j <= p floordiv C,
             weighting each by exp(m_j - max m).

`done[r]` (R elements, no `count`) is notified by every live chunk tile of
request r, so the scheduled program counts ceildiv(length[r], C)
notifications into it before the run; combine tile t waits on
done[token_request[t]], an indirect wait. Nothing is padded: dead chunk
tiles never run, and no list of tiles is built on the host.

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
from mlir.dialects import arith, math, memref, scf

from ..dialects import event
from .base import TaskBuilder, TileKernel, box, index_map, live_bound, whole

KINDS = ("attention",)


class _AttentionKernel(TileKernel):
    """Rows of `head_dim` values as f32 vectors (`TileKernel.vload`)."""

    part = ""

    @classmethod
    def name(cls, op) -> str:
        return f"attention_{cls.part}"

    def load_row(self, t, idx: list) -> ir.Value:
        """head_dim consecutive values of `t` from `idx` on, as float32."""
        return self.vload(t, idx, self.op.params["head_dim"])

    def splat(self, value: ir.Value) -> ir.Value:
        return self.vsplat(value, self.op.params["head_dim"])


class AttentionChunk(_AttentionKernel):
    """Tile (r, j): one (new token, query head) of request r per lane
    iteration, an online softmax over the chunk's keys up to the token's
    position, stored as (acc, m, l) in `partial[t, j]`."""

    grid_rank = 2
    part = "chunk"

    @classmethod
    def tensors(cls, op) -> list:
        q, k_cache, v_cache, positions, _, request_slot, request_length, request_first = \
            op.operands
        return [q, k_cache, v_cache, positions, request_slot, request_length, request_first,
                op.buffers["partial"]]

    def emit(self) -> None:
        op, params = self.op, self.op.params
        q, k_cache, v_cache, positions, _, request_slot, request_length, request_first = \
            op.operands
        partial = op.buffers["partial"]
        head_dim, chunk = params["head_dim"], params["chunk"]
        heads, group = params["heads"], params["heads"] // params["kv_heads"]
        r, j = self.ti
        slot = self.load_index(request_slot, [r])
        length = self.load_index(request_length, [r])
        first = self.load_index(request_first, [r])
        new_tokens = arith.subi(length, self.load_index(positions, [first]))
        k0 = arith.muli(j, self.cidx(chunk))
        k_end = arith.minsi(arith.addi(k0, self.cidx(chunk)), length)
        loop = self.lane_loop(arith.muli(new_tokens, self.cidx(heads)))
        with ir.InsertionPoint(loop.body):
            e = loop.induction_variable
            t = arith.addi(first, arith.divui(e, self.cidx(heads)))
            h = arith.remui(e, self.cidx(heads))
            kv_column = arith.muli(arith.divui(h, self.cidx(group)), self.cidx(head_dim))
            # Causal: the token sees keys up to its own position.
            position = self.load_index(positions, [t])
            k1 = arith.minsi(k_end, arith.addi(position, self.cidx(1)))
            sees = arith.cmpi(arith.CmpIPredicate.slt, k0, k1)
            guard = scf.IfOp(sees)
            with ir.InsertionPoint(guard.then_block):
                query = self.load_row(q, [t, arith.muli(h, self.cidx(head_dim))])
                scale = self.cf32(params["scale"])
                keys = scf.ForOp(k0, k1, self.cidx(1),
                                 [self.cf32(float("-inf")), self.cf32(0.0),
                                  self.splat(self.cf32(0.0))])
                with ir.InsertionPoint(keys.body):
                    k = keys.induction_variable
                    m, l, acc = keys.inner_iter_args
                    key = self.load_row(k_cache, [slot, k, kv_column])
                    dot = self.vsum(arith.mulf(query, key))
                    score = arith.mulf(dot, scale)
                    m_new = arith.maximumf(m, score)
                    alpha = math.exp(arith.subf(m, m_new))
                    weight = math.exp(arith.subf(score, m_new))
                    value = self.load_row(v_cache, [slot, k, kv_column])
                    acc = arith.addf(arith.mulf(acc, self.splat(alpha)),
                                     arith.mulf(value, self.splat(weight)))
                    scf.yield_([m_new, arith.addf(arith.mulf(l, alpha), weight), acc])
                m, l, acc = keys.results
                base = arith.muli(h, self.cidx(head_dim + 2))
                self.vstore(acc, partial, [t, j, base])
                memref.store(m, self.buf(partial), [t, j, arith.addi(base, self.cidx(head_dim))])
                memref.store(l, self.buf(partial),
                             [t, j, arith.addi(base, self.cidx(head_dim + 1))])
                scf.yield_([])
            scf.yield_([])


class AttentionCombine(_AttentionKernel):
    """Tile t: one query head per lane iteration, merging the token's
    chunks: out = sum_j exp(m_j - m) acc_j / sum_j exp(m_j - m) l_j."""

    grid_rank = 1
    part = "combine"

    @classmethod
    def tensors(cls, op) -> list:
        return [op.operands[3], op.buffers["partial"], op.result]

    def emit(self) -> None:
        op, params = self.op, self.op.params
        positions, partial, out = op.operands[3], op.buffers["partial"], op.result
        head_dim, chunk, heads = params["head_dim"], params["chunk"], params["heads"]
        t = self.ti[0]
        chunks = arith.addi(arith.divui(self.load_index(positions, [t]), self.cidx(chunk)),
                            self.cidx(1))
        loop = self.lane_loop(self.cidx(heads))
        with ir.InsertionPoint(loop.body):
            h = loop.induction_variable
            base = arith.muli(h, self.cidx(head_dim + 2))
            m_at = arith.addi(base, self.cidx(head_dim))
            l_at = arith.addi(base, self.cidx(head_dim + 1))
            m = self.reduce_row(chunks, self.cf32(float("-inf")), lambda acc, j: arith.maximumf(
                acc, memref.load(self.buf(partial), [t, j, m_at])))
            merge = scf.ForOp(self.cidx(0), chunks, self.cidx(1),
                              [self.cf32(0.0), self.splat(self.cf32(0.0))])
            with ir.InsertionPoint(merge.body):
                j = merge.induction_variable
                l, acc = merge.inner_iter_args
                weight = math.exp(arith.subf(memref.load(self.buf(partial), [t, j, m_at]), m))
                l = arith.addf(l, arith.mulf(weight, memref.load(self.buf(partial), [t, j, l_at])))
                acc = arith.addf(acc, arith.mulf(self.load_row(partial, [t, j, base]),
                                                 self.splat(weight)))
                scf.yield_([l, acc])
            l, acc = merge.results
            self.vstore(arith.divf(acc, self.splat(l)), out,
                           [t, arith.muli(h, self.cidx(head_dim))])
            scf.yield_([])


def build_tasks(b: TaskBuilder, op) -> None:
    q, k_cache, v_cache, positions, token_request, request_slot, request_length, \
        request_first = op.operands
    partial = op.buffers["partial"]
    chunk = op.params["chunk"]
    requests = request_length.shape[0]
    grid = [b.grid_extent(requests, 1), b.grid_extent(partial.shape[1], 1)]
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
                [], AttentionChunk,
                waits=[(released, index_map("(d0, d1) -> ()"))] if released is not None else [],
                notifies=[(done, index_map("(d0, d1) -> (d0)"))],
                indices=[request_length],
                live=[live_bound(1, f"(d0) -> (d0 ceildiv {chunk})",
                                 "(d0, d1) -> (d0) indirect [0]")])
    tokens = b.grid_extent(q.shape[0], 1)
    notifies = []
    if op.params.get("shared_scratch"):
        released = event.AllocOp(ir.Type.parse("!event.tensor<>"), [], count=tokens).result
        b.events[key] = released
        notifies.append((released, index_map("(d0) -> ()")))
    b.emit_task(op, f"{op.name}_combine", [tokens], [],
                [(op.result, box(1, ["d0", "0"], [1, None]))], AttentionCombine,
                waits=[(done, index_map("(d0) -> (d0) indirect [0]"))],
                notifies=notifies, indices=[token_request])
