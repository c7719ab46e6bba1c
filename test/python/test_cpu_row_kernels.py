"""The CPU kernels that work a row at a time (`RopeCPU`, `KVAppendCPU`,
`EmbeddingCPU`) give the bits of the portable kernels they replace, at
LLVM's -O0 and -O2: vectors of 16 along each row, a scalar tail where the
row is not a multiple of 16."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import reference_llm
from etc.ops import embedding as embedding_ops
from etc.ops import kvcache as kvcache_ops
from etc.ops import rope as rope_ops

OPT_LEVELS = ["0", "2"]


def _compile(g, monkeypatch, opt_level, portable_instead_of=None):
    """`g` compiled for the CPU at `opt_level`; with the portable kernel
    where `portable_instead_of` (a CPU kernel class) would apply."""
    with monkeypatch.context() as patch:
        patch.setenv("ETC_CPU_OPT_LEVEL", opt_level)
        if portable_instead_of is not None:
            patch.setattr(portable_instead_of, "applies",
                          classmethod(lambda cls, op, target: False))
        kernel = etc.compile(g, target="cpu", workers=2)
    return kernel


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) if a.dtype == np.float32 else a


# ----------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------


def _rope_graph(head_dim, heads, dtype, with_inv_freq):
    g = etc.Graph("rope")
    T = g.symbol("T")
    x = g.input("x", (T, heads * head_dim), dtype)
    positions = g.input("positions", (T,), "i32")
    inv_freq = g.input("inv_freq", (head_dim // 2,), "f32") if with_inv_freq else None
    g.output(g.rope(x, positions, head_dim=head_dim, theta=500000.0, inv_freq=inv_freq))
    return g


# head_dim 64: two whole vectors of pairs; 40: one and a tail of 4; 16: a
# tail only.
@pytest.mark.parametrize("opt_level", OPT_LEVELS)
@pytest.mark.parametrize("head_dim, heads, dtype, with_inv_freq", [
    (64, 3, "f32", False), (64, 2, "bf16", True), (40, 2, "f32", True), (16, 3, "bf16", False)])
def test_rope_cpu_gives_the_scalar_kernels_bits(head_dim, heads, dtype, with_inv_freq,
                                               opt_level, monkeypatch):
    g = _rope_graph(head_dim, heads, dtype, with_inv_freq)
    vector = _compile(g, monkeypatch, opt_level)
    assert "rope_cpu" in vector.ir("event")
    scalar = _compile(g, monkeypatch, opt_level, portable_instead_of=rope_ops.RopeCPU)
    rng = np.random.default_rng(head_dim)
    for tokens in (45, 3):  # ragged: 45 is not a multiple of the 32-row tile
        inputs = {"x": rng.standard_normal((tokens, heads * head_dim)).astype(np.float32),
                  # Far past 2 pi: the range reduction decides the bits.
                  "positions": rng.integers(0, 1 << 20, tokens).astype(np.int32)}
        inputs["positions"][:3] = [0, 5, 1000]
        if with_inv_freq:
            inputs["inv_freq"] = (reference_llm.rope_inv_freq(head_dim, 500000.0)
                                  / 8).astype(np.float32)
        (got,) = vector.run(**inputs)
        (want,) = scalar.run(**inputs)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        if dtype == "f32":
            # NumPy's powf may differ from libm's by an ulp, which a far
            # position magnifies: without inv_freq, only the near rows.
            near = slice(None) if with_inv_freq else inputs["positions"] < 2048
            np.testing.assert_allclose(got[near], etc.reference.evaluate(g, **inputs)[0][near],
                                       rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------
# KV append
# ----------------------------------------------------------------------


def _append_graph(width, values_dtype, cache_dtype, paged):
    g = etc.Graph("append")
    T, R = g.symbol("T"), g.symbol("R")
    values = g.input("v", (T, width), values_dtype)
    if paged:
        batch = g.ragged_batch(T, R, blocks_per_request=g.symbol("M"))
        shape = (g.symbol("N"), 4, width)
    else:
        batch = g.ragged_batch(T, R)
        shape = (g.symbol("S"), g.symbol("L"), width)
    g.kv_append(g.state("cache", shape, cache_dtype), values, batch)
    # A read ordered after the write keeps the append in the program.
    g.output(g.embedding(g.input("table", (8, 4), "f32"), batch.positions))
    return g


def _append_inputs(rng, width, paged, storage):
    """Request 0 brings positions 8 to 13, of which 12 and 13 lie past a
    contiguous cache's 12 positions and past a paged request's 3 blocks of
    4; request 1 brings positions 0 to 2, whose block (paged) lies outside
    the pool."""
    inputs = {"v": rng.standard_normal((9, width)).astype(np.float32),
              "positions": np.array([8, 9, 10, 11, 12, 13, 0, 1, 2], np.int32),
              "token_request": np.array([0] * 6 + [1] * 3, np.int32),
              "request_length": np.array([14, 3], np.int32),
              "request_first": np.array([0, 6], np.int32),
              "request_last": np.array([5, 8], np.int32),
              "table": np.zeros((8, 4), np.float32)}
    if paged:
        inputs["block_table"] = np.array([[4, 0, 2], [9, 3, 1]], np.int32)
        inputs["cache"] = np.zeros((5, 4, width), storage)
    else:
        inputs["request_slot"] = np.array([1, 0], np.int32)
        inputs["cache"] = np.zeros((2, 12, width), storage)
    return inputs


@pytest.mark.parametrize("opt_level", OPT_LEVELS)
@pytest.mark.parametrize("width, values_dtype, cache_dtype, paged", [
    (40, "f32", "f32", False), (40, "bf16", "bf16", True), (48, "f32", "bf16", False),
    (7, "bf16", "bf16", False), (32, "f32", "f32", True)])
def test_kv_append_cpu_writes_the_rows_the_portable_kernel_does(
        width, values_dtype, cache_dtype, paged, opt_level, monkeypatch):
    """Rows of 40 (two vectors and a tail of 8), 48, 7 (a tail only), 32;
    bf16 values copied as they are or f32 ones rounded into a bf16 cache;
    tokens outside the cache write nothing."""
    g = _append_graph(width, values_dtype, cache_dtype, paged)
    vector = _compile(g, monkeypatch, opt_level)
    assert "kv_append_cpu" in vector.ir("event")
    portable = _compile(g, monkeypatch, opt_level, portable_instead_of=kvcache_ops.KVAppendCPU)
    storage = np.float32 if cache_dtype == "f32" else np.uint16
    inputs = _append_inputs(np.random.default_rng(width), width, paged, storage)
    caches = [inputs["cache"].copy() for _ in range(3)]
    vector.run(**{**inputs, "cache": caches[0]})
    portable.run(**{**inputs, "cache": caches[1]})
    etc.reference.evaluate(g, **{**inputs, "cache": caches[2]})
    np.testing.assert_array_equal(caches[0], caches[1])
    np.testing.assert_array_equal(caches[0], caches[2])
    # 7 of the 9 rows landed (4 paged), each a whole row; nothing else.
    written = (caches[0] != 0).any(axis=-1)
    assert written.sum() == (4 if paged else 7) and (caches[0] != 0).sum() == (caches[0][written] != 0).sum()


# ----------------------------------------------------------------------
# Embedding
# ----------------------------------------------------------------------


@pytest.mark.parametrize("opt_level", OPT_LEVELS)
@pytest.mark.parametrize("width, dtype", [(40, "f32"), (40, "bf16"), (5, "f32")])
def test_embedding_cpu_gathers_the_rows_the_portable_kernel_does(width, dtype, opt_level,
                                                                monkeypatch):
    g = etc.Graph("emb")
    T = g.symbol("T")
    g.output(g.embedding(g.input("table", (50, width), dtype), g.input("ids", (T,), "i32")))
    vector = _compile(g, monkeypatch, opt_level)
    assert "embedding_cpu" in vector.ir("event")
    portable = _compile(g, monkeypatch, opt_level,
                        portable_instead_of=embedding_ops.EmbeddingCPU)
    rng = np.random.default_rng(width)
    table = rng.standard_normal((50, width)).astype(np.float32)
    ids = rng.integers(0, 50, 37).astype(np.int32)
    ids[[0, 9, 36]] = [-1, 50, 1 << 30]  # outside the table: zero rows
    (got,) = vector.run(table=table, ids=ids)
    (want,) = portable.run(table=table, ids=ids)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert not got[[0, 9, 36]].any() and got[1:9].all()
    if dtype == "f32":
        np.testing.assert_array_equal(got[1:9], table[ids[1:9]])
