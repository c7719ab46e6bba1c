"""The values an i32 index input may hold, and the check every runtime makes
before a launch.

Operators that index with an input (a position into a cache, a request's
slot, a token's request) read out of bounds when it is out of range: a
crash on the CPU, garbage or a hang on the GPU. So each declares the range
it needs (`Graph.index_range`), in terms of the graph's dimensions (ints
and symbols, so one compiled kernel checks every binding); the range
travels in the kernel's ABI (saved artifacts included), and the CPU and
CUDA runtimes check the arrays against it, with the symbols bound, before
the kernel runs. The error names the input, the first index out of range,
its value and the bound.

Needs only NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

__all__ = ["IndexRange", "IndexRangeError", "check", "check_ragged", "RAGGED_FIELDS",
           "RAGGED_LAYOUTS"]


class IndexRangeError(IndexError, ValueError):
    """An index input holds a value its kernel cannot use."""


@dataclass(frozen=True)
class IndexRange:
    """`low <= value <= dim + offset` for every (dim, offset) of `highs`;
    a dim is an int, a symbol's name, or "name*factor" (the symbol times an
    int)."""

    low: int = 0
    highs: tuple = ()

    def merged(self, other: "IndexRange") -> "IndexRange":
        """The values both ranges allow."""
        highs = self.highs + tuple(h for h in other.highs if h not in self.highs)
        return IndexRange(max(self.low, other.low), highs)

    def high(self, symbols: Mapping[str, int]):
        """The largest value allowed with `symbols` bound, and how it was
        reached ("L - 1 = 31"); (None, "") without an upper bound."""
        best, why = None, ""
        for dim, offset in self.highs:
            if isinstance(dim, int):
                value = dim + offset
            else:
                name, _, factor = dim.partition("*")
                value = symbols[name] * int(factor or 1) + offset
            if best is None or value < best:
                best = value
                if isinstance(dim, int):
                    why = ""
                else:
                    term = dim if not offset else f"{dim} {'+' if offset > 0 else '-'} " \
                                                  f"{abs(offset)}"
                    why = f" ({term} = {value})"
        return best, why

    def to_json(self) -> dict:
        return {"low": self.low, "highs": [[dim, offset] for dim, offset in self.highs]}

    @classmethod
    def from_json(cls, data: dict) -> "IndexRange":
        highs = []
        for dim, offset in data["highs"]:
            if isinstance(dim, bool) or not isinstance(dim, (int, str)) or \
                    isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"malformed index range bound {[dim, offset]!r}")
            highs.append((dim, offset))
        low = data["low"]
        if isinstance(low, bool) or not isinstance(low, int):
            raise ValueError(f"malformed index range low {low!r}")
        return cls(low, tuple(highs))


#: Arrays of at most this many elements are checked in Python: a NumPy
#: reduction costs microseconds of call overhead, and a decode step's
#: dozen index arrays of one element each took 0.3 ms to check that way.
SMALL = 64


def check(graph_name: str, ranges: Mapping[str, IndexRange], arrays: Mapping,
          symbols: Mapping[str, int], ragged_batches=()) -> None:
    """Raises IndexRangeError when an index input of `arrays` (NumPy arrays;
    others, e.g. device arrays, are the caller's to keep in range) holds a
    value outside its range, `symbols` bound, or a ragged batch of
    `ragged_batches` (role -> input name dicts) is inconsistent."""
    for name, allowed in ranges.items():
        array = arrays.get(name)
        if not isinstance(array, np.ndarray) or not array.size:
            continue
        high, why = allowed.high(symbols)
        if array.size <= SMALL:
            values = array.ravel().tolist()
            lowest, highest = min(values), max(values)
        else:
            lowest, highest = array.min(), array.max()
        if lowest >= allowed.low and (high is None or highest <= high):
            continue
        flat = array.reshape(-1)
        outside = (flat < allowed.low) if high is None else \
            (flat < allowed.low) | (flat > high)
        index = int(np.flatnonzero(outside)[0])
        where = np.unravel_index(index, array.shape)
        where = where[0] if len(where) == 1 else tuple(int(i) for i in where)
        bound = f"[{allowed.low}, {high}]{why}" if high is not None else f">= {allowed.low}"
        raise IndexRangeError(f"{graph_name}: input {name!r}[{where}] = {int(flat[index])} is "
                              f"outside its valid range {bound}: the kernel would index out "
                              f"of bounds with it")
    for batch in ragged_batches:
        check_ragged(graph_name, batch, arrays)


#: The roles of a ragged batch's index inputs (`Graph.ragged_batch`).
RAGGED_FIELDS = ("positions", "token_request", "request_slot", "request_length",
                 "request_first", "request_last")
#: The sets of roles a ragged batch has: with a slot per request
#: (contiguous KV caches), or with block tables (paged ones).
RAGGED_LAYOUTS = (frozenset(RAGGED_FIELDS),
                  frozenset(RAGGED_FIELDS) - {"request_slot"} | {"block_table"})


def check_ragged(graph_name: str, batch: Mapping[str, str], arrays: Mapping) -> None:
    """Raises IndexRangeError unless the ragged batch whose inputs `batch`
    names (role -> input name) is consistent: the tokens of request r are
    request_first[r] .. request_last[r], those with token_request r, at the
    positions that end at request_length[r] - 1. (The attention tiles of a
    request loop over that many tokens from request_first: a longer span
    would read past the batch.) Ranges are checked first (`check`); device
    arrays are skipped."""
    values = {role: arrays.get(name) for role, name in batch.items()}
    if not all(isinstance(v, np.ndarray) for v in values.values()):
        return
    positions, token_request = values["positions"], values["token_request"]
    if token_request.size <= SMALL and _consistent(
            *(values[role].tolist() for role in ("positions", "token_request", "request_first",
                                                 "request_last", "request_length"))):
        return
    first, last, length = (values[role].astype(np.int64) for role in
                           ("request_first", "request_last", "request_length"))
    name = batch.__getitem__

    def fail(message: str):
        raise IndexRangeError(f"{graph_name}: ragged batch: {message}")

    empty = np.flatnonzero(last < first)
    if empty.size:
        r = int(empty[0])
        fail(f"input {name('request_last')!r}[{r}] = {last[r]} is before "
             f"{name('request_first')!r}[{r}] = {first[r]} (every request brings a token)")
    counts = np.bincount(token_request, minlength=len(first))[:len(first)]
    wrong = np.flatnonzero(counts != last - first + 1)
    if wrong.size:
        r = int(wrong[0])
        fail(f"request {r} spans tokens {first[r]} .. {last[r]} ({name('request_first')!r}, "
             f"{name('request_last')!r}), but {counts[r]} tokens have "
             f"{name('token_request')!r} = {r}")
    requests = token_request.astype(np.int64)
    tokens = np.arange(len(token_request))
    outside = np.flatnonzero((tokens < first[requests]) | (tokens > last[requests]))
    if outside.size:
        t = int(outside[0])
        r = int(requests[t])
        fail(f"input {name('token_request')!r}[{t}] = {r}, but request {r} spans tokens "
             f"{first[r]} .. {last[r]}")
    expected = length[requests] - 1 - (last[requests] - tokens)
    wrong = np.flatnonzero(positions != expected)
    if wrong.size:
        t = int(wrong[0])
        r = int(requests[t])
        fail(f"input {name('positions')!r}[{t}] = {positions[t]}, but token {t} is token "
             f"{t - first[r]} of the {last[r] - first[r] + 1} new tokens of request {r}, whose "
             f"{name('request_length')!r} is {length[r]}: its position must be {expected[t]}")


def _consistent(positions: list, token_request: list, first: list, last: list,
                length: list) -> bool:
    """Whether a small ragged batch is consistent, in Python (what
    `check_ragged` checks; it finds and names the first fault)."""
    requests = len(first)
    counts = [0] * requests
    for t, r in enumerate(token_request):
        if not 0 <= r < requests or not first[r] <= t <= last[r] or \
                positions[t] != length[r] - 1 - (last[r] - t):
            return False
        counts[r] += 1
    return all(count == l - f + 1 and l >= f for count, f, l in zip(counts, first, last))
