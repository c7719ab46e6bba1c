"""The CPU matmul tiles (`etc.ops.matmul_cpu.MatmulCPU`): the tile width the
CPU picks per worker count, and numerics of every micro-tile shape (up to
16 rows streamed over the whole tile width in groups of 4 and the 1, 2 or 3
left; more rows in groups of 4 on 64-column chunks), for both schedules."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc.ops import Target
from etc.ops.matmul_cpu import MatmulCPU

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)


def _matmul(k: int, n: int, *, tile=None, transpose_b: bool = False) -> etc.Graph:
    g = etc.Graph("mm")
    B = g.symbol("B")
    x = g.input("x", (B, k), "f32")
    w = g.input("w", (n, k) if transpose_b else (k, n), "f32")
    g.output(g.matmul(x, w, tile=tile, transpose_b=transpose_b))
    return g


@pytest.mark.parametrize("n, workers, width, width_t", [
    (2816, 2, 1408, 176),  # A @ B: a tile each; B^T: at most 256: 256 gives 11 tiles, 176 16
    (1024, 2, 512, 256),  # A @ B: 2 tiles; B^T: 4
    (1024, 4, 256, 128),  # B^T: 256 would give 4 tiles for 4 workers
    (1024, 8, 128, 64),
    (1024, 32, 64, 16),   # A @ B never narrower than 64 columns; B^T: 64 tiles of 16
    (1024, 3, 128, 128),  # no width gives 3 workers equal shares: 8 tiles
    (384, 1, 384, 192),   # B^T: 256 does not divide 384
    (192, 2, 96, 48),     # B^T: 4 tiles of 48
    (576, 2, 288, 144),   # B^T: 64 would give 9 tiles (5 + 4)
    (1536, 2, 768, 256),
])
def test_tile_width_gives_every_worker_column_tiles(n, workers, width, width_t):
    target = Target("cpu", workers=workers)
    (op,) = _matmul(64, n)._ops
    assert MatmulCPU.tile_for(op, target) == (32, width)
    (op,) = _matmul(64, n, transpose_b=True)._ops
    assert MatmulCPU.tile_for(op, target) == (32, width_t)


def test_a_tile_wider_than_the_streamed_rows_take_matches_numpy():
    """A user's tile wider than STREAMED_WIDEST takes the register
    micro-tiles at every row count (the stack buffer of the streamed rows is
    sized for the tiles the CPU picks)."""
    rng = np.random.default_rng(3)
    k, n = 75, 2 * MatmulCPU.STREAMED_WIDEST
    target = Target("cpu", workers=2)
    assert "memref<4x704xf32>" in _matmul(k, 1408).build(target=target).operation.get_asm()
    g = _matmul(k, n, tile=(32, n))
    assert "memref.alloca" not in g.build(target=target).operation.get_asm()
    kernel = etc.compile(g, target="cpu", workers=2)
    w = rng.standard_normal((k, n)).astype(np.float32)
    for batch in [1, 3, 4, 7, 17]:
        x = rng.standard_normal((batch, k)).astype(np.float32)
        (got,) = kernel.run(x=x, w=w)
        np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4,
                                   err_msg=f"B = {batch}")


def test_tile_is_kept_when_no_width_divides_n_or_the_user_chose_it():
    (op,) = _matmul(64, 80)._ops
    assert MatmulCPU.tile_for(op, Target("cpu", workers=2)) == (32, 64)
    g = _matmul(64, 1024, tile=(8, 32))
    kernel = etc.compile(g, target="cpu", workers=2, trace=True)
    kernel.run(x=np.ones((1, 64), np.float32), w=np.ones((64, 1024), np.float32))
    assert len(kernel.trace.events) == 1024 // 32


def test_chosen_tile_sets_the_task_count():
    g = _matmul(64, 1024)
    kernel = etc.compile(g, target="cpu", workers=2, trace=True)
    kernel.run(x=np.ones((3, 64), np.float32), w=np.ones((64, 1024), np.float32))
    assert len(kernel.trace.events) == 1024 // 512


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("n, workers", [(1024, 1), (1024, 3), (384, 2), (192, 2), (80, 2)])
@pytest.mark.parametrize("k", [72, 75])
def test_every_micro_tile_matches_numpy(n, workers, schedule, k):
    """B from 1 to 9 leaves 0 to 3 rows after the 4-row groups, streamed;
    17, 31 and 33 take the chunks, and 33 crosses the 32-row tile. K = 72 is
    not a multiple of the vector width; 75 not one of the streamed steps
    (4 rows of B, 2 for groups of 4 rows of A) either."""
    rng = np.random.default_rng(n + workers + k)
    g = _matmul(k, n)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    w = rng.standard_normal((k, n)).astype(np.float32)
    for batch in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 31, 33]:
        x = rng.standard_normal((batch, k)).astype(np.float32)
        (got,) = kernel.run(x=x, w=w)
        np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4,
                                   err_msg=f"B = {batch}")


def _half_precision_matches(dtype: str, k: int, n: int, batches: list, *,
                            transpose_b: bool = False) -> None:
    """C = A @ B (or A @ B^T) in `dtype` on 2 workers matches the reference
    at each batch."""
    rng = np.random.default_rng(k + n)
    g = etc.Graph("mmh")
    B = g.symbol("B")
    w = g.input("w", (n, k) if transpose_b else (k, n), dtype)
    g.output(g.matmul(g.input("x", (B, k), dtype), w, transpose_b=transpose_b))
    kernel = etc.compile(g, target="cpu", workers=2)
    host = np.float16 if dtype == "f16" else np.float32
    w = rng.standard_normal(w.shape).astype(host)
    for batch in batches:
        x = rng.standard_normal((batch, k)).astype(host)
        (got,) = kernel.run(x=x, w=w)
        np.testing.assert_allclose(got, etc.reference.evaluate(g, x=x, w=w)[0], rtol=2e-2,
                                   atol=2e-2 * np.sqrt(k) / 8, err_msg=f"B = {batch}")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_streamed_half_precision_rows_match_the_reference(dtype):
    """bf16 and f16 A and B on the streamed rows (and the chunks at B = 17)
    with a wide tile (1408 columns on 2 workers: 2 tiles of 704)."""
    _half_precision_matches(dtype, 75, 1408, [1, 3, 4, 7, 17])


@pytest.mark.parametrize("n", [1024, 100, 102])
def test_transposed_tiles_match_numpy(n):
    """B >= 4 takes the 4-row panels (33: eight, then 1 row in the next row
    tile; 7: one, and 3 rows of dot groups); 102 columns make an odd-width
    edge tile."""
    rng = np.random.default_rng(n)
    k = 72
    g = _matmul(k, n, transpose_b=True)
    kernel = etc.compile(g, target="cpu", workers=2)
    w = rng.standard_normal((n, k)).astype(np.float32)
    for batch in [1, 2, 3, 5, 6, 7, 12, 33]:
        x = rng.standard_normal((batch, k)).astype(np.float32)
        (got,) = kernel.run(x=x, w=w)
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4,
                                   err_msg=f"B = {batch}")


@pytest.mark.parametrize("dtype, k", [("bf16", 75), ("f16", 64), ("bf16", 4200)])
def test_transposed_half_precision_panels_match_the_reference(dtype, k):
    """bf16 and f16 A is widened into the stack panel, with a K that is not
    a multiple of the panel's vectors (75); at K = 4200 a panel would pass
    PANEL_BYTES (6 x 4200 x 4 bytes), so every row takes the dot groups."""
    _half_precision_matches(dtype, k, 96, [1, 5, 6, 13, 32], transpose_b=True)


@pytest.mark.parametrize("count, tn, chunk", [(4, 256, 64), (4, 704, 64), (4, 80, 16),
                                               (4, 48, 48)])
def test_chunk_fits_the_accumulators_and_divides_the_tile(count, tn, chunk):
    assert MatmulCPU.chunk(count, tn) == chunk
