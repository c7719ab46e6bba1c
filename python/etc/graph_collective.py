"""The collectives over the ranks of a graph, as methods of `etc.Graph`.

`Graph` inherits `all_gather`, `reduce_scatter` and `all_reduce` from
`CollectiveOperators`, beside the LLM operators of `etc.graph_llm`. A graph
made with `etc.Graph(name, ranks=N)` runs on N ranks at once, each its own
copy on its own inputs; each method checks its operand against the rank
count, records one `Operation` and declares the buffers that live in the
symmetric heap (the ones other ranks put into: no footprint says which rank
a tile writes). The send and reduce tasks and the tile kernel are in
`etc.ops.collective`, the whole design in docs/distributed.md.
"""

from __future__ import annotations

from typing import Optional

from .graph_values import Tensor
from .ops.base import DEFAULT_COLS, DEFAULT_ROWS


def row_tile(rows: int) -> int:
    """The largest block of at most DEFAULT_ROWS rows that divides `rows`."""
    return max(t for t in range(1, DEFAULT_ROWS + 1) if rows % t == 0)


class CollectiveOperators:
    """`all_gather`, `reduce_scatter` and `all_reduce` (mixed into
    `etc.Graph`)."""

    def _check_ranks(self, kind: str) -> int:
        if self.ranks < 2:
            raise ValueError(f"{kind}: graph '{self.name}' runs on one device; collectives need "
                             f"a graph on several ranks: etc.Graph({self.name!r}, ranks=N)")
        return self.ranks

    def _symmetric(self, name: str, shape: tuple, dtype: str) -> Tensor:
        t = self._new_tensor(self._fresh_name(name), shape, dtype, "value")
        self._symmetric_tensors.add(id(t))
        return t

    def all_gather(self, x: Tensor, *, name: Optional[str] = None) -> Tensor:
        """Concatenates every rank's x (m, K) along the rows: (ranks m, K),
        rank r's rows at [r m, (r + 1) m). m must be static. The result
        lives in the symmetric heap: read it with operators (in blocks of
        `row_tile(m)` rows), it cannot be an output."""
        kind = "all_gather"
        ranks = self._check_ranks(kind)
        self._check_operand(kind, "x", x, ranks=(2,))
        rows, cols = x.shape
        if not isinstance(rows, int):
            raise ValueError(f"{kind}: the rows of operand 'x' ('{x.name}') must be static: "
                             f"rank r's rows land at r * rows on every rank")
        tile = (row_tile(rows),)
        result = self._finish(kind, [("x", x)], (ranks * rows, cols), x.dtype, tile,
                              {"ranks": ranks}, None, name)
        self._symmetric_tensors.add(id(result))
        return result

    def reduce_scatter(self, y: Tensor, *, tile=None, name: Optional[str] = None) -> Tensor:
        """Sums y (M, N) over the ranks and gives rank r rows
        [r M/ranks, (r + 1) M/ranks) of the sum: (M/ranks, N). M must be
        static and a multiple of the rank count. `tile=(m, n)` sets the
        tiles that travel (default: the largest block of at most 32 rows
        dividing M/ranks, 64 columns)."""
        kind = "reduce_scatter"
        ranks = self._check_ranks(kind)
        self._check_operand(kind, "y", y, ranks=(2,))
        rows, cols = y.shape
        if not isinstance(rows, int) or rows % ranks:
            raise ValueError(f"{kind}: the rows of operand 'y' ('{y.name}', {rows}) must be a "
                             f"static multiple of the {ranks} ranks")
        local = rows // ranks
        tile = self._check_tile(kind, tile, 2, (row_tile(local), DEFAULT_COLS), (local, cols))
        if local % tile[0]:
            raise ValueError(f"{kind}: tile rows {tile[0]} must divide the {local} rows each "
                             f"rank gets, so that no tile straddles two ranks")
        result = self._finish(kind, [("y", y)], (local, cols), y.dtype, tile,
                              {"ranks": ranks}, None, name)
        self._ops[-1].buffers = {
            "staging": self._symmetric(f"{result.name}_staging", (ranks, local, cols), y.dtype)}
        return result

    def all_reduce(self, y: Tensor, *, tile=None, name: Optional[str] = None) -> Tensor:
        """Sums y (M, N) over the ranks; every rank gets the whole sum, added
        in rank order (the same bits on every rank). M may be symbolic.
        `tile=(m, n)` sets the tiles that travel (default 32 x 64)."""
        kind = "all_reduce"
        ranks = self._check_ranks(kind)
        self._check_operand(kind, "y", y, ranks=(2,))
        tile = self._check_tile(kind, tile, 2, (DEFAULT_ROWS, DEFAULT_COLS), y.shape)
        result = self._finish(kind, [("y", y)], y.shape, y.dtype, tile, {"ranks": ranks},
                              None, name)
        self._ops[-1].buffers = {
            "staging": self._symmetric(f"{result.name}_staging", (ranks, *y.shape), y.dtype)}
        return result
