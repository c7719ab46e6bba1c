"""The operators of LLM inference, as methods of `etc.Graph`.

`Graph` inherits them from `LLMOperators`; they live here to keep graph.py
about the graph itself. Each method checks its operands (shapes, dtypes,
index tensors) with errors that name them and records one `Operation`; the
tasks and tile kernels are in the operator families of `etc.ops`
(embedding, rope, headnorm, splitnorm, kvcache, attention, sampling), the
NumPy meaning in `etc.reference`.

A step of a model takes a *ragged batch*: R requests, each bringing one or
more new tokens (a prompt to prefill, or one token to decode), T tokens in
all. `Graph.ragged_batch` declares the i32 index inputs that describe it
(`RaggedBatch`); `kv_append` and `attention` take them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from . import packed
from .graph_values import CeilDiv, Operation, Symbol, Tensor, describe, same_dim
from .ops.base import DEFAULT_ROWS, INDEX_DTYPE

#: Default KV positions per attention chunk task.
DEFAULT_CHUNK = 64


def norm_offset(kind: str, offset) -> dict:
    """The parameters an RMSNorm's `offset` adds (none for 0: the plain
    norm's kernels and IR), checked."""
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or \
            not math.isfinite(offset):
        raise ValueError(f"{kind}: 'offset' must be a finite float, got {offset!r}")
    return {"offset": float(offset)} if offset else {}


def norm_eps(kind: str, eps) -> float:
    """A norm's `eps` (RMSNorm's, LayerNorm's), checked: a finite number
    >= 0 (NaN would make every row NaN)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or \
            not 0 <= eps < math.inf:
        raise ValueError(f"{kind}: 'eps' must be a finite non-negative float, got {eps!r}")
    return float(eps)


@dataclass(frozen=True)
class RaggedBatch:
    """The index inputs (all i32) that describe a step's ragged batch of
    T tokens from R requests. Tokens of one request are consecutive, in
    position order.

    * `positions` (T,): each token's position in its sequence;
    * `token_request` (T,): each token's request, in [0, R);
    * `request_slot` (R,): each request's slot in contiguous KV caches
      (slots, length, W);
    * `block_table` (R, M), in place of `request_slot` for paged KV caches
      (blocks, P, W): row r lists request r's blocks, position p of the
      request living in block block_table[r, p // P] at row p % P;
    * `request_length` (R,): each request's sequence length after the step
      (its last new token's position + 1);
    * `request_first` (R,), `request_last` (R,): the indices of each
      request's first and last new token in the step.
    """

    tokens: Symbol
    requests: Symbol
    positions: Tensor
    token_request: Tensor
    request_slot: Optional[Tensor]
    request_length: Tensor
    request_first: Tensor
    request_last: Tensor
    block_table: Optional[Tensor] = None

    #: The per-token fields, then the per-request ones.
    TOKEN_FIELDS = ("positions", "token_request")
    REQUEST_FIELDS = ("request_slot", "request_length", "request_first", "request_last")

    @property
    def paged(self) -> bool:
        """Whether the batch addresses paged caches through `block_table`."""
        return self.block_table is not None

    @property
    def cache_addressing(self) -> Tensor:
        """What locates a request's cache rows: `block_table` or `request_slot`."""
        return self.block_table if self.paged else self.request_slot


class LLMOperators:
    """Embedding, RoPE, per-head RMSNorm, the RMSNorm of rows split over
    ranks, KV-cache append, attention over the cache, greedy and sampled
    token choice (mixed into `etc.Graph`)."""

    # -- shared checks ---------------------------------------------------

    def _check_index(self, kind: str, role: str, t, length=None, length_of: str = "") -> None:
        """`t` must be a 1-D i32 tensor of this graph (of `length` rows)."""
        if not isinstance(t, Tensor):
            raise ValueError(f"{kind}: operand '{role}' must be a Tensor, got {t!r}")
        if t.graph is not self:
            raise ValueError(f"{kind}: operand '{role}' ('{t.name}') belongs to graph "
                             f"'{t.graph.name}', not '{self.name}'")
        if t.dtype != INDEX_DTYPE or t.rank != 1:
            raise ValueError(f"{kind}: {describe(role, t)} must be a 1-D i32 tensor "
                             f"of indices")
        if length is not None and not same_dim(t.shape[0], length):
            raise ValueError(f"{kind}: {describe(role, t)} must have {length} rows "
                             f"({length_of})")

    def _check_batch(self, kind: str, batch) -> RaggedBatch:
        if not isinstance(batch, RaggedBatch):
            raise ValueError(f"{kind}: 'batch' must be a RaggedBatch (from "
                             f"Graph.ragged_batch), got {batch!r}")
        for field in RaggedBatch.TOKEN_FIELDS:
            self._check_index(kind, f"batch.{field}", getattr(batch, field), batch.tokens,
                              "one per token of the batch")
        for field in RaggedBatch.REQUEST_FIELDS:
            if field == "request_slot" and batch.paged:
                continue
            self._check_index(kind, f"batch.{field}", getattr(batch, field), batch.requests,
                              "one per request of the batch")
        if batch.paged:
            table = batch.block_table
            if not isinstance(table, Tensor) or table.graph is not self or \
                    table.dtype != INDEX_DTYPE or table.rank != 2 or \
                    not same_dim(table.shape[0], batch.requests):
                raise ValueError(f"{kind}: 'batch.block_table' must be a 2-D i32 tensor of "
                                 f"this graph with one row per request ({batch.requests} rows), "
                                 f"got {table!r}")
        return batch

    def _check_cache(self, kind: str, role: str, cache, batch: RaggedBatch) -> None:
        """A cache the batch can address: (slots, length, W), or for a paged
        batch (blocks, P, W) with a static block size P."""
        if batch.paged and not isinstance(cache.shape[1], int):
            raise ValueError(f"{kind}: {describe(role, cache)} is addressed through "
                             f"'batch.block_table', so it is a paged cache (blocks, P, width) "
                             f"whose block size P must be a static int")

    @staticmethod
    def _check_head_dim(kind: str, head_dim, width, role: str, even: bool = False) -> int:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"{kind}: 'head_dim' must be a positive int, got {head_dim!r}")
        if even and head_dim % 2:
            raise ValueError(f"{kind}: 'head_dim' = {head_dim} must be even (RoPE rotates "
                             f"pairs of columns)")
        if not isinstance(width, int) or width % head_dim:
            raise ValueError(f"{kind}: the last dimension of '{role}' ({width}) must be a "
                             f"static multiple of head_dim = {head_dim}")
        return head_dim

    def _record(self, kind: str, operands, result, tile, params, buffers=None):
        """Records an operator whose result is an existing tensor (a state
        updated in place) and returns it."""
        opname = self._next_name(kind)
        self._ops.append(Operation(kind, opname, tuple(operands), result, tile,
                                          dict(params), buffers=dict(buffers or {})))
        return result

    # -- declarations ----------------------------------------------------

    def ragged_batch(self, tokens, requests, prefix: str = "", *,
                     blocks_per_request=None) -> RaggedBatch:
        """Declares the i32 index inputs of a ragged batch of `tokens` (T)
        new tokens from `requests` (R) requests, named `<prefix>positions`,
        `<prefix>token_request`, `<prefix>request_slot`,
        `<prefix>request_length`, `<prefix>request_first` and
        `<prefix>request_last` (see `RaggedBatch`). With
        `blocks_per_request` (M, a symbol or an int) the batch addresses
        paged KV caches: `<prefix>block_table` (R, M) replaces
        `request_slot`."""
        for role, dim in (("tokens", tokens), ("requests", requests)):
            if not isinstance(dim, Symbol) or dim.graph is not self:
                raise ValueError(f"ragged_batch: '{role}' must be a symbol of graph "
                                 f"'{self.name}', got {dim!r}")
        width = blocks_per_request
        if width is not None and not (isinstance(width, Symbol) and width.graph is self) \
                and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
            raise ValueError(f"ragged_batch: 'blocks_per_request' must be a positive int or a "
                             f"symbol of graph '{self.name}', got {width!r}")
        fields = {}
        for field in RaggedBatch.TOKEN_FIELDS:
            fields[field] = self.input(prefix + field, (tokens,), INDEX_DTYPE)
        for field in RaggedBatch.REQUEST_FIELDS:
            if field == "request_slot" and width is not None:
                fields[field] = None
                continue
            fields[field] = self.input(prefix + field, (requests,), INDEX_DTYPE)
        if width is not None:
            fields["block_table"] = self.input(prefix + "block_table", (requests, width),
                                               INDEX_DTYPE)
        # What every ragged batch is; the operators that index caches with
        # it add their bounds (`attention`, `kv_append`: the slots or blocks).
        self.index_range(fields["positions"], low=0)
        self.index_range(fields["token_request"], below=requests)
        self.index_range(fields["block_table" if width is not None else "request_slot"], low=0)
        self.index_range(fields["request_length"], low=1)
        self.index_range(fields["request_first"], below=tokens)
        self.index_range(fields["request_last"], below=tokens)
        self._ragged_batches.append({field: t.name for field, t in fields.items()
                                     if t is not None})
        return RaggedBatch(tokens, requests, **fields)

    # -- operators -------------------------------------------------------

    def embedding(self, table, ids, *, tile=None, name: Optional[str] = None,
                  dtype: Optional[str] = None):
        """out[i] = table[ids[i]]: rows of `table` (V, H) gathered by the i32
        `ids` (N,); result (N, H) in the table's dtype. Ids outside [0, V)
        give zero rows. Gathers token embeddings, and the last token's
        hidden state of each request (ids = `batch.request_last`).
        `tile=(m,)` sets the ids per tile (default 32). A packed table (a
        format of `etc.packed`) gives rows dequantized to `dtype` (f32,
        f16 or bf16; required for a packed table)."""
        kind = "embedding"
        self._check_operand(kind, "table", table, ranks=(2,), packed_ok=True)
        self._check_index(kind, "ids", ids)
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), ids.shape)
        shape = (ids.shape[0], table.shape[1])
        if packed.is_packed(table.dtype):
            if dtype not in ("f32", "f16", "bf16"):
                raise ValueError(f"{kind}: {describe('table', table)} is a packed weight: "
                                 f"dtype= must name the rows' dtype (f32, f16 or bf16), got "
                                 f"{dtype!r}")
        elif dtype not in (None, table.dtype):
            raise ValueError(f"{kind}: dtype={dtype!r} differs from the table's "
                             f"{table.dtype}; only a packed table's rows take another dtype")
        return self._finish(kind, [("table", table), ("ids", ids)], shape,
                            dtype or table.dtype, tile, {}, None, name)

    def rope(self, x, positions, *, head_dim: int, theta: float = 10000.0, inv_freq=None,
             tile=None, name: Optional[str] = None):
        """Rotary position embedding of each head of x (T, n * head_dim) at
        the i32 `positions` (T,), in Hugging Face's `rotate_half`
        convention: frequencies 1 / theta^(2i / head_dim), or the float32
        `inv_freq` (head_dim / 2,) when given (scaled RoPE variants).
        `tile=(m,)` sets the tokens per tile (default 32)."""
        kind = "rope"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_head_dim(kind, head_dim, x.shape[1], "x", even=True)
        self._check_index(kind, "positions", positions, x.shape[0], "one per row of 'x'")
        operands = [("x", x), ("positions", positions)]
        params = {"head_dim": head_dim}
        if inv_freq is not None:
            self._check_operand(kind, "inv_freq", inv_freq, ranks=(1,))
            if inv_freq.dtype != "f32" or inv_freq.shape != (head_dim // 2,):
                raise ValueError(f"{kind}: {describe('inv_freq', inv_freq)} must be "
                                 f"an f32 tensor of shape ({head_dim // 2},) (head_dim / 2)")
            operands.append(("inv_freq", inv_freq))
        else:
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 1:
                raise ValueError(f"{kind}: 'theta' must be a float above 1, got {theta!r}")
            params["theta"] = float(theta)
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, operands, x.shape, x.dtype, tile, params, None, name)

    def head_rmsnorm(self, x, weight, *, head_dim: int, eps: float = 1e-6, offset: float = 0.0,
                     tile=None, name: Optional[str] = None):
        """RMSNorm of each head of x (T, n * head_dim) on its own, with the
        shared `weight` (head_dim,) (Qwen3's q_norm / k_norm), times
        (offset + weight) in float32 (Gemma 3's: offset 1).
        `tile=(m,)` sets the rows per tile (default 32)."""
        kind = "head_rmsnorm"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_operand(kind, "weight", weight, ranks=(1,))
        self._check_head_dim(kind, head_dim, x.shape[1], "x")
        if weight.shape != (head_dim,):
            raise ValueError(f"{kind}: {describe('weight', weight)} must have shape "
                             f"({head_dim},) (head_dim)")
        dtype = self._same_dtype(kind, [("x", x), ("weight", weight)])
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, [("x", x), ("weight", weight)], x.shape, dtype, tile,
                            {"head_dim": head_dim, "eps": norm_eps(kind, eps),
                             **norm_offset(kind, offset)}, None, name)

    def sum_squares(self, *xs, tile=None, name: Optional[str] = None):
        """(T, n) f32: column j the sum of the squares of each row of xs[j]
        (T, N_j), in float32; the operands have the same rows and dtype.
        A tensor-parallel rank's share of a whole-row norm's statistic
        (OLMo's q/k norms): an `all_reduce` of it gives the whole rows',
        which `split_rmsnorm` takes. `tile=(m,)` sets the rows per tile
        (default 32)."""
        kind = "sum_squares"
        if not xs:
            raise ValueError(f"{kind}: needs at least one operand")
        operands = [(f"x{j}", x) for j, x in enumerate(xs)]
        for role, x in operands:
            self._check_operand(kind, role, x, ranks=(2,))
            if not same_dim(x.shape[0], xs[0].shape[0]):
                raise ValueError(f"{kind}: {describe(role, x)} and {describe('x0', xs[0])} "
                                 f"differ in rows")
        self._same_dtype(kind, operands)
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), xs[0].shape[:1])
        return self._finish(kind, operands, (xs[0].shape[0], len(xs)), "f32", tile, {}, None,
                            name)

    def split_rmsnorm(self, x, weight, sum_squares, *, width: int, column: int = 0,
                      eps: float = 1e-6, offset: float = 0.0, tile=None,
                      name: Optional[str] = None):
        """RMSNorm of x (T, N), a share of rows `width` wide whose squares
        sum to sum_squares[:, column] ((T, n) f32, e.g. `all_reduce` of
        `sum_squares`): x / sqrt(sum_squares[:, column] / width + eps) *
        (offset + weight), weight (N,) the share's slice, in float32 and
        rounded once. On one rank with the row's own sums it is `rmsnorm`.
        `tile=(m,)` sets the rows per tile (default 32)."""
        kind = "split_rmsnorm"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_operand(kind, "weight", weight, ranks=(1,))
        self._check_operand(kind, "sum_squares", sum_squares, ranks=(2,))
        if weight.shape != (x.shape[1],):
            raise ValueError(f"{kind}: {describe('weight', weight)} must have shape "
                             f"({x.shape[1]},) to match the columns of {describe('x', x)}")
        dtype = self._same_dtype(kind, [("x", x), ("weight", weight)])
        if sum_squares.dtype != "f32" or not same_dim(sum_squares.shape[0], x.shape[0]):
            raise ValueError(f"{kind}: {describe('sum_squares', sum_squares)} must be f32 "
                             f"with the rows of {describe('x', x)}")
        columns = sum_squares.shape[1]
        if isinstance(column, bool) or not isinstance(column, int) or column < 0 or \
                (isinstance(columns, int) and column >= columns):
            raise ValueError(f"{kind}: 'column' = {column!r} is not a column of "
                             f"{describe('sum_squares', sum_squares)}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1 or \
                (isinstance(x.shape[1], int) and width < x.shape[1]):
            raise ValueError(f"{kind}: 'width' = {width!r} must be a positive int, the whole "
                             f"row's width, at least that of {describe('x', x)}")
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, [("x", x), ("weight", weight), ("sum_squares", sum_squares)],
                            x.shape, dtype, tile,
                            {"width": width, "column": column, "eps": norm_eps(kind, eps),
                             **norm_offset(kind, offset)}, None, name)

    def head_layernorm(self, x, weight, *, head_dim: int, eps: float = 1e-5, tile=None,
                       name: Optional[str] = None):
        """LayerNorm of each head of x (T, n * head_dim) on its own, (x - mean)
        / sqrt(var + eps) in float32, times that head's own weights: `weight`
        (n * head_dim,) (Command R+'s q_norm / k_norm, whose weight is
        (heads, head_dim)). `tile=(m,)` sets the rows per tile (default 32)."""
        kind = "head_layernorm"
        self._check_operand(kind, "x", x, ranks=(2,))
        self._check_operand(kind, "weight", weight, ranks=(1,))
        self._check_head_dim(kind, head_dim, x.shape[1], "x")
        if not same_dim(weight.shape[0], x.shape[1]):
            raise ValueError(f"{kind}: {describe('weight', weight)} must have one value per "
                             f"column of {describe('x', x)} (a weight for each head)")
        dtype = self._same_dtype(kind, [("x", x), ("weight", weight)])
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, [("x", x), ("weight", weight)], x.shape, dtype, tile,
                            {"head_dim": head_dim, "eps": norm_eps(kind, eps)}, None, name)

    def kv_append(self, cache, values, batch: RaggedBatch, *, tile=None):
        """Writes the new rows `values` (T, W) into the state `cache`
        (slots, length, W) in place: row t at
        cache[request_slot[token_request[t]], positions[t]]; or, for a paged
        batch, into the paged cache (blocks, P, W) at
        cache[block_table[token_request[t], positions[t] // P],
        positions[t] % P]. Returns the cache, so that attention reads it
        after the write. Tokens outside the cache (slot, block or position)
        write nothing. `tile=(m,)` sets the tokens per tile (default 32)."""
        kind = "kv_append"
        if not isinstance(cache, Tensor) or cache.graph is not self or \
                cache.kind != "state":
            raise ValueError(f"{kind}: operand 'cache' must be a state buffer of graph "
                             f"'{self.name}' (Graph.state), got {cache!r}")
        if cache.rank != 3 or cache.dtype not in ("f32", "f16", "bf16"):
            raise ValueError(f"{kind}: {describe('cache', cache)} must be a 3-D f32, "
                             f"f16 or bf16 state (slots, length, width)")
        self._check_operand(kind, "values", values, ranks=(2,))
        batch = self._check_batch(kind, batch)
        self._check_cache(kind, "cache", cache, batch)
        if not same_dim(values.shape[0], batch.tokens):
            raise ValueError(f"{kind}: {describe('values', values)} must have one row "
                             f"per token of the batch ({batch.tokens} rows)")
        if not same_dim(values.shape[1], cache.shape[2]):
            raise ValueError(f"{kind}: {describe('values', values)} and "
                             f"{describe('cache', cache)} differ in width")
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), values.shape[:1])
        params = {"block_size": cache.shape[1]} if batch.paged else {}
        return self._record(kind, (cache, values, batch.positions, batch.token_request,
                                   batch.cache_addressing), cache, tile, params)

    def attention(self, q, k_cache, v_cache, batch: RaggedBatch, *, head_dim: int,
                  chunk: int = DEFAULT_CHUNK, max_length=None, scale: Optional[float] = None,
                  window: Optional[int] = None, softcap: Optional[float] = None,
                  sinks=None, scratch_from=None, name: Optional[str] = None):
        """Causal grouped-query attention of each token of the batch over its
        request's KV cache slot (flash-decoding: see `etc.ops.attention`).

        q is (T, H * head_dim); k_cache and v_cache are (slots, length,
        H_kv * head_dim) with H a multiple of H_kv (query head h reads KV
        head h // (H / H_kv)), already appended to for this step. Token t
        attends to positions 0 .. positions[t] of slot
        request_slot[token_request[t]], with softmax(scale * q . k), scale
        1 / sqrt(head_dim) by default. A paged batch (`block_table`) reads
        paged caches (blocks, P, H_kv * head_dim) instead: position p of
        request r at block block_table[r, p // P], row p % P. The KV
        sequence is split into chunks of `chunk` positions: request r runs
        ceildiv(request_length[r], chunk) chunk tasks, decided at run time.
        The chunk grid holds ceil(L / chunk) chunks of a cache of length L,
        symbolic when L is: a paged cache's L is M x P, the positions its
        (R, M) block table holds (with a chunk that is not a multiple of P,
        ceil(max_length / chunk) chunks: then `max_length` is needed).
        `max_length` (optional) bounds the requests' lengths further.

        With a `window` W (sliding-window attention, as transformers masks
        it), token t attends to positions max(0, positions[t] - W + 1) ..
        positions[t] only, and a request's chunks start at the window of its
        first new token: s = max(0, p0 - W + 1) for p0 = positions[
        request_first[r]], chunk j covering [s + j chunk, s + (j + 1)
        chunk). The chunk grid then holds ceil((T + W - 1) / chunk) chunks
        (T the step's tokens: what a request's new tokens and their windows
        span at most), or the cache's chunks if fewer, and request r runs
        ceildiv(request_length[r], chunk) of them, decided at run time: a
        decode step of a request longer than the window runs about W /
        chunk tiles, whatever its length.

        With `softcap` c, the scaled scores are soft-capped before the
        softmax: c tanh(scale q . k / c) (Gemma 2).

        With `sinks` (H,) float32 (gpt-oss's attention sinks), query head
        h's softmax takes one more logit, sinks[h] (neither scaled nor
        soft-capped), whose value is zero: the weights of a token's keys
        are exp(s_j - m) / (exp(sinks[h] - m) + sum_k exp(s_k - m)), m the
        largest of the s_k and sinks[h], and sum to less than 1. It counts
        once per token, windowed or not: the combine tile starts its merge
        of the token's chunks from it (the chunk tiles never see it). Each
        run checks the batch's indices against the cache (the block table's
        entries against its blocks) and `max_length` before the kernel runs
        (`Graph.index_range`). Result (T, H * head_dim) in q's dtype.

        The chunks' partial results go to a float32 scratch buffer of
        T * ceil(L / chunk) * H * (head_dim + 2) values. `scratch_from=` an earlier
        attention's result reuses that attention's scratch (the layers of a
        model share one): an explicit event orders this attention's chunk
        tiles after every combine tile of the earlier one."""
        kind = "attention"
        self._check_operand(kind, "q", q, ranks=(2,))
        for role, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            self._check_operand(kind, role, cache, ranks=(3,))
        batch = self._check_batch(kind, batch)
        self._check_cache(kind, "k_cache", k_cache, batch)
        self._check_head_dim(kind, head_dim, q.shape[1], "q")
        self._check_head_dim(kind, head_dim, k_cache.shape[2], "k_cache")
        if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
            raise ValueError(f"{kind}: {describe('k_cache', k_cache)} and "
                             f"{describe('v_cache', v_cache)} must have the same "
                             f"shape and dtype")
        heads, kv_heads = q.shape[1] // head_dim, k_cache.shape[2] // head_dim
        if heads % kv_heads:
            raise ValueError(f"{kind}: {heads} query heads cannot be grouped over {kv_heads} "
                             f"KV heads (the query head count must be a multiple)")
        if not same_dim(q.shape[0], batch.tokens):
            raise ValueError(f"{kind}: {describe('q', q)} must have one row per token "
                             f"of the batch ({batch.tokens} rows)")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"{kind}: 'chunk' must be a positive int, got {chunk!r}")
        length = k_cache.shape[1]
        if max_length is not None and (isinstance(max_length, bool) or
                                       not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"{kind}: 'max_length' must be a positive int, got {max_length!r}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or
                                   window < 1):
            raise ValueError(f"{kind}: 'window' must be a positive int (positions a token sees, "
                             f"its own included) or None, got {window!r}")
        if softcap is not None and (isinstance(softcap, bool) or
                                    not isinstance(softcap, (int, float)) or not softcap > 0):
            raise ValueError(f"{kind}: 'softcap' must be a positive float or None, got "
                             f"{softcap!r}")
        if sinks is not None:
            self._check_operand(kind, "sinks", sinks, ranks=(1,))
            if sinks.dtype != "f32" or not same_dim(sinks.shape[0], heads):
                raise ValueError(f"{kind}: {describe('sinks', sinks)} must be f32 of shape "
                                 f"({heads},): one logit per query head")
        if scale is None:
            scale = 1.0 / math.sqrt(head_dim)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise ValueError(f"{kind}: 'scale' must be a float, got {scale!r}")
        if batch.paged:
            # A paged cache's second dimension is its block size; the
            # positions a request may reach are its table's: M x P.
            width = batch.block_table.shape[1]
            if isinstance(width, int):
                length = width * length
            elif chunk % length == 0:
                length = (width, length)
            elif max_length is None:
                raise ValueError(f"{kind}: the caches are paged in blocks of {length} "
                                 f"positions and the chunk ({chunk}) is not a multiple of them: "
                                 f"pass max_length= (the longest a request may be), which "
                                 f"sizes the chunk grid")
            else:
                length = None
        # The chunk tiles read the cache at these slots (blocks) and up to
        # these lengths, and the combine tiles as many chunks as a token's
        # position spans: out of range, they would read out of bounds.
        slots = k_cache.shape[0]
        for t, bound in ((batch.positions, dict(below=length)),
                         (batch.positions, dict(below=max_length)),
                         (batch.request_length, dict(at_most=length)),
                         (batch.request_length, dict(at_most=max_length)),
                         (batch.cache_addressing, dict(below=slots))):
            if t.kind == "input" and None not in bound.values():
                self.index_range(t, **bound)
        # The chunk grid follows the cache's length: a symbolic length gives
        # ceil(L / C) chunks, so a small chunk (more, shorter tiles: the
        # parallelism of a long prefill) does not cost a scratch sized for
        # the longest cache the model allows. Paged, L is the table's M x P
        # positions: ceil(M / (C / P)) chunks.
        if length is None:
            chunks = -(-max_length // chunk)
        elif isinstance(length, tuple):
            chunks = CeilDiv(length[0], chunk // length[1])
        else:
            chunks = -(-length // chunk) if isinstance(length, int) else \
                CeilDiv(length, chunk)
        operands = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("positions", batch.positions), ("token_request", batch.token_request),
                    ("block_table" if batch.paged else "request_slot",
                     batch.cache_addressing),
                    ("request_length", batch.request_length),
                    ("request_first", batch.request_first)]
        if sinks is not None:
            operands.append(("sinks", sinks))
        params = {"head_dim": head_dim, "heads": heads, "kv_heads": kv_heads, "chunk": chunk,
                  "chunks": chunks if isinstance(chunks, int) else chunks.name,
                  "scale": float(scale)}
        if batch.paged:
            params["block_size"] = k_cache.shape[1]
        if window is not None:
            params["window"] = window
        if softcap is not None:
            params["softcap"] = float(softcap)
        shape = (q.shape[0], chunks, heads * (head_dim + 2))
        partial = None
        if scratch_from is not None:
            earlier = next((op for op in self._ops if op.kind == kind and
                            op.result is scratch_from), None)
            if earlier is None:
                raise ValueError(f"{kind}: 'scratch_from' must be the result of an earlier "
                                 f"attention of graph '{self.name}', got {scratch_from!r}")
            partial = earlier.buffers["partial"]
            if len(partial.shape) != 3 or not all(
                    same_dim(a, b) for a, b in zip(partial.shape, shape)):
                raise ValueError(f"{kind}: the scratch of '{scratch_from.name}' has shape "
                                 f"{partial.shape}, but this attention needs {shape}")
        if partial is not None:
            # Every attention of a sharing group notifies the release event,
            # so that the layers' tile functions and families stay identical
            # (the last one's is notified and never waited on).
            earlier.params["shared_scratch"] = True
            params["shared_scratch"] = True
        result = self._finish(kind, operands, q.shape, q.dtype, (1,), params, None, name)
        if partial is None:
            partial = self._new_tensor(self._fresh_name(f"{result.name}_partial"), shape, "f32",
                                       "value")
        self._ops[-1].buffers = {"partial": partial}
        return result

    def argmax(self, x, *, tile=None, name: Optional[str] = None):
        """Greedy sampling: the i32 index of the largest value of each row
        of x (M, N), the first of equal values (NaN ranks above every
        number); result (M,). `tile=(m,)` sets the rows per tile (default 32)."""
        kind = "argmax"
        self._check_operand(kind, "x", x, ranks=(2,))
        tile = self._check_tile(kind, tile, 1, (DEFAULT_ROWS,), x.shape[:1])
        return self._finish(kind, [("x", x)], (x.shape[0],), INDEX_DTYPE, tile, {}, None,
                            name)

    def adjust_logits(self, logits, tokens, add, scale, *, mask=None, masked=None,
                      name: Optional[str] = None):
        """A copy of `logits` (R, V) with a few entries of each row changed,
        all data of the run: for each j, token t = tokens[r, j] (i32 (R, P);
        entries outside [0, V), -1 for padding, do nothing; a row's tokens
        distinct) gets x / s if x > 0 else x * s (s = scale[r, j]: a
        repetition penalty, 1 for none), plus add[r, j] (a bias, minus
        frequency and presence penalties, -inf to forbid it); `scale`,
        `add` f32 (R, P). Result (R, V) in logits' dtype. One task per row:
        the copy, then the row's entries
        (`etc.reference_sampling.adjust_logits`).

        With `mask` (R, ceil(V / 32)) i32 and `masked` (R,) i32, the rows
        whose `masked` is not 0 keep only the tokens whose bit is set (bit
        t % 32 of word t / 32: a structured-output bitmask): the others
        become -inf, whatever their entries, and the kept ones at least
        -FLT_MAX, so that a kept token is always chosen before a masked
        one, greedy or sampled."""
        kind = "adjust_logits"
        self._check_operand(kind, "logits", logits, ranks=(2,))
        rows = logits.shape[0]
        for role, t, dtype in (("tokens", tokens, INDEX_DTYPE), ("add", add, "f32"),
                               ("scale", scale, "f32")):
            if not isinstance(t, Tensor) or t.graph is not self:
                raise ValueError(f"{kind}: operand '{role}' must be a Tensor of graph "
                                 f"'{self.name}', got {t!r}")
            if t.rank != 2 or t.dtype != dtype or not same_dim(t.shape[0], rows) or \
                    not same_dim(t.shape[1], tokens.shape[1]):
                raise ValueError(f"{kind}: {describe(role, t)} must be a {dtype} tensor of "
                                 f"shape ({rows}, {tokens.shape[1]}) (entries of each row of "
                                 f"'logits')")
        operands = [("logits", logits), ("tokens", tokens), ("add", add), ("scale", scale)]
        if (mask is None) != (masked is None):
            raise ValueError(f"{kind}: give both 'mask' and 'masked', or neither")
        if mask is not None:
            words = -(-logits.shape[1] // 32) if isinstance(logits.shape[1], int) else None
            if not isinstance(mask, Tensor) or mask.graph is not self or mask.rank != 2 or \
                    mask.dtype != INDEX_DTYPE or not same_dim(mask.shape[0], rows) or \
                    words is None or mask.shape[1] != words:
                raise ValueError(f"{kind}: 'mask' must be an i32 tensor of shape ({rows}, "
                                 f"{words}) (a bit per column of a static 'logits' row)")
            self._check_index(kind, "masked", masked, rows, "one per row of 'logits'")
            operands += [("mask", mask), ("masked", masked)]
        return self._finish(kind, operands, logits.shape, logits.dtype, (1,), {}, None, name)

    def sample(self, logits, temperature, top_k, top_p, min_p, seed, position, *,
               logprobs=None, max_logprobs: int = 20, tile=None, name: Optional[str] = None):
        """Samples one token per row of `logits` (R, V) with each row's own
        parameters, all data of the run (one compiled kernel serves every
        mix of them): `temperature`, `top_p`, `min_p` f32 (R,), `top_k` i32
        (R,), `seed` i32 (R, 2) (a 64-bit key as its low and high words)
        and `position` i32 (R,) (the position of the token being sampled).
        Result (R,) i32.

        Temperature 0 (or below, or NaN) is `argmax`. Otherwise the row's
        weights exp((x - max) / T) are cut by top-k (0 < k < V: values
        below the k-th largest are dropped, ties with it kept), top-p
        (p < 1: the smallest set of largest values whose weight reaches p
        of what top-k kept) and min-p (weights below min_p times the
        largest's), and a token is drawn from what is left by one uniform
        number in [0, 1) from Philox-4x32-10, keyed by the seed with the
        position as counter: a row's token depends on its own logits and
        parameters only, not on the other rows, the schedule, the worker
        count or the target. `etc.reference_sampling.sample` is the exact
        definition. `tile=(m,)` sets the rows per tile (default 1: the
        rows are sampled in parallel).

        With `logprobs` (R,) i32, the result is (tokens, values, ids): row
        r with logprobs[r] >= 0 gets in values (R, 1 + max_logprobs) f32
        the log-probability of its token, then those of its
        min(logprobs[r], max_logprobs) most likely tokens, whose ids go to
        ids (R, max_logprobs) i32, under the distribution the token was
        drawn from (the filtered, renormalised softmax at the row's
        temperature; at temperature 0 the softmax of the logits); other
        entries are left as they were (`etc.reference_sampling.logprobs`)."""
        kind = "sample"
        self._check_operand(kind, "logits", logits, ranks=(2,))
        rows = logits.shape[0]
        for role, t in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
            self._check_operand(kind, role, t, ranks=(1,))
            if t.dtype != "f32" or not same_dim(t.shape[0], rows):
                raise ValueError(f"{kind}: {describe(role, t)} must be an f32 tensor "
                                 f"of shape ({rows},) (one per row of 'logits')")
        for role, t in (("top_k", top_k), ("position", position)):
            self._check_index(kind, role, t, rows, "one per row of 'logits'")
        if not isinstance(seed, Tensor):
            raise ValueError(f"{kind}: operand 'seed' must be a Tensor, got {seed!r}")
        if seed.graph is not self:
            raise ValueError(f"{kind}: operand 'seed' ('{seed.name}') belongs to graph "
                             f"'{seed.graph.name}', not '{self.name}'")
        if seed.dtype != INDEX_DTYPE or seed.rank != 2 or seed.shape[1] != 2 or \
                not same_dim(seed.shape[0], rows):
            raise ValueError(f"{kind}: {describe('seed', seed)} must be an i32 tensor "
                             f"of shape ({rows}, 2) (each row's 64-bit seed as its low and "
                             f"high words)")
        tile = self._check_tile(kind, tile, 1, (1,), logits.shape[:1])
        operands = [("logits", logits), ("temperature", temperature), ("top_k", top_k),
                    ("top_p", top_p), ("min_p", min_p), ("seed", seed), ("position", position)]
        if logprobs is None:
            return self._finish(kind, operands, (rows,), INDEX_DTYPE, tile, {}, None, name)
        self._check_index(kind, "logprobs", logprobs, rows, "one per row of 'logits'")
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or \
                not 1 <= max_logprobs <= 1024:
            raise ValueError(f"{kind}: max_logprobs={max_logprobs!r} must be an int in "
                             f"[1, 1024]")
        operands.append(("logprobs", logprobs))
        result = self._finish(kind, operands, (rows,), INDEX_DTYPE, tile,
                              {"max_logprobs": max_logprobs}, None, name)
        values = self._new_tensor(self._fresh_name(f"{result.name}_logprobs"),
                                  (rows, 1 + max_logprobs), "f32", "value")
        ids = self._new_tensor(self._fresh_name(f"{result.name}_logprob_ids"),
                               (rows, max_logprobs), INDEX_DTYPE, "value")
        self._ops[-1].extra_results = (values, ids)
        return result, values, ids
