"""The LLM inference operators (embedding, rope, head_rmsnorm, kv_append,
argmax; attention has its own file) against NumPy on the CPU target, their
errors, i32 inputs and state buffers updated in place."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import reference_llm

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

TOKENS = [1, 5, 33, 40]  # 5, 33 and 40 are not multiples of the 32-row tile


def _rng(seed):
    return np.random.default_rng(seed)


def _check(kernel, g, inputs, rtol=1e-5, atol=1e-5):
    got = kernel.run(**inputs)
    want = etc.reference.evaluate(g, **inputs)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------
# Operators against NumPy
# ----------------------------------------------------------------------


@pytest.mark.parametrize("schedule, workers", [("static", 1), ("static", 3), ("dynamic", 3)])
def test_embedding_gathers_rows_and_zeroes_ids_outside_the_table(schedule, workers):
    g = etc.Graph("emb")
    T = g.symbol("T")
    table = g.input("table", (50, 24), "f32")
    ids = g.input("ids", (T,), "i32")
    g.output(g.embedding(table, ids))
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    rng = _rng(workers)
    for tokens in TOKENS:
        inputs = {"table": rng.standard_normal((50, 24)).astype(np.float32),
                  "ids": rng.integers(0, 50, tokens).astype(np.int32)}
        _check(kernel, g, inputs, rtol=0, atol=0)
        np.testing.assert_array_equal(kernel.run(**inputs)[0], inputs["table"][inputs["ids"]])
    inputs["ids"][:] = 0
    inputs["ids"][0], inputs["ids"][-1] = -1, 50
    (out,) = kernel.run(**inputs)
    assert not out[0].any() and not out[-1].any()
    np.testing.assert_array_equal(out[1:-1], inputs["table"][inputs["ids"][1:-1]])


def _hf_rope(x, positions, head_dim, theta):
    """Hugging Face's formulation, written out: inv_freq, cos/sin of
    cat(freqs, freqs), x * cos + rotate_half(x) * sin."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    freqs = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    heads = x.reshape(x.shape[0], -1, head_dim)
    rotated = np.concatenate([-heads[..., head_dim // 2:], heads[..., :head_dim // 2]], axis=-1)
    return (heads * cos[:, None] + rotated * sin[:, None]).reshape(x.shape)


def test_reference_rope_is_hugging_face_rotate_half():
    rng = _rng(0)
    x = rng.standard_normal((7, 48)).astype(np.float32)
    positions = rng.integers(0, 4000, 7).astype(np.int32)
    np.testing.assert_allclose(reference_llm.rope(x, positions, 16, 1e6),
                               _hf_rope(x, positions, 16, 1e6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_inv_freq", [False, True])
@pytest.mark.parametrize("schedule, workers", [("static", 2), ("dynamic", 3)])
def test_rope_matches_numpy(with_inv_freq, schedule, workers):
    g = etc.Graph("rope")
    T = g.symbol("T")
    x = g.input("x", (T, 48), "f32")
    positions = g.input("positions", (T,), "i32")
    inv_freq = g.input("inv_freq", (8,), "f32") if with_inv_freq else None
    g.output(g.rope(x, positions, head_dim=16, theta=500000.0, inv_freq=inv_freq))
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=workers)
    rng = _rng(3)
    for tokens in TOKENS:
        inputs = {"x": rng.standard_normal((tokens, 48)).astype(np.float32),
                  "positions": rng.integers(0, 2048, tokens).astype(np.int32)}
        if with_inv_freq:
            inputs["inv_freq"] = (reference_llm.rope_inv_freq(16, 500000.0) / 8).astype(np.float32)
        _check(kernel, g, inputs, rtol=1e-4, atol=1e-4)
        if not with_inv_freq:
            np.testing.assert_allclose(kernel.run(**inputs)[0],
                                       _hf_rope(inputs["x"], inputs["positions"], 16, 500000.0),
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_head_rmsnorm_normalises_each_head(dtype):
    g = etc.Graph("qnorm")
    T = g.symbol("T")
    x = g.input("x", (T, 64), dtype)
    w = g.input("w", (16,), dtype)
    g.output(g.head_rmsnorm(x, w, head_dim=16, eps=1e-6))
    kernel = etc.compile(g, target="cpu", workers=2)
    rng = _rng(4)
    for tokens in TOKENS:
        inputs = {"x": rng.standard_normal((tokens, 64)).astype(np.float32),
                  "w": rng.standard_normal(16).astype(np.float32)}
        tol = 1e-5 if dtype == "f32" else 2e-2
        _check(kernel, g, inputs, rtol=tol, atol=tol)
    if dtype == "f32":
        heads = inputs["x"].reshape(-1, 4, 16)
        manual = heads / np.sqrt((heads ** 2).mean(-1, keepdims=True) + 1e-6) * inputs["w"]
        np.testing.assert_allclose(etc.reference.evaluate(g, **inputs)[0], manual.reshape(-1, 64),
                                   rtol=1e-5, atol=1e-5)


def test_argmax_takes_the_first_maximum_and_ranks_nan_first():
    g = etc.Graph("argmax")
    M = g.symbol("M")
    x = g.input("x", (M, 37), "f32")
    g.output(g.argmax(x))
    kernel = etc.compile(g, target="cpu", workers=2)
    rng = _rng(5)
    x = rng.standard_normal((40, 37)).astype(np.float32)
    x[1, 3] = x[1, 20] = 50.0               # a tie: the first wins
    x[2, :] = -np.inf                       # all -inf: index 0
    x[3, 30] = np.nan                       # NaN above every number
    x[4, 5] = np.inf
    (got,) = kernel.run(x=x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, etc.reference.evaluate(g, x=x)[0])
    assert got[1] == 3 and got[2] == 0 and got[3] == 30 and got[4] == 5
    np.testing.assert_array_equal(got[5:], np.argmax(x[5:], axis=1))


# ----------------------------------------------------------------------
# State buffers
# ----------------------------------------------------------------------


def _append_graph(dtype="f32"):
    g = etc.Graph("append")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    v = g.input("v", (T, 8), "f32")
    batch = g.ragged_batch(T, R)
    cache = g.state("cache", (S, L, 8), dtype)
    cache = g.kv_append(cache, g.scale(v, 2.0), batch)
    # A read of the cache after the write: the sum of each slot's first row.
    g.output(g.embedding(g.input("table", (4, 8), "f32"), batch.request_slot))
    return g


def _batch(lengths_before, new_tokens, slots):
    """The index inputs of a ragged batch: request r had lengths_before[r]
    tokens and brings new_tokens[r]."""
    positions, token_request, first, last = [], [], [], []
    for r, (before, new) in enumerate(zip(lengths_before, new_tokens)):
        first.append(len(positions))
        positions += list(range(before, before + new))
        token_request += [r] * new
        last.append(len(positions) - 1)
    i32 = lambda v: np.array(v, np.int32)
    return {"positions": i32(positions), "token_request": i32(token_request),
            "request_slot": i32(slots),
            "request_length": i32([b + n for b, n in zip(lengths_before, new_tokens)]),
            "request_first": i32(first), "request_last": i32(last)}


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_kv_append_updates_the_callers_cache_in_place_across_runs(schedule, dtype):
    g = _append_graph(dtype)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=3)
    rng = _rng(6)
    storage = np.float32 if dtype == "f32" else np.float16
    cache = np.zeros((3, 12, 8), storage)
    mirror = cache.copy()
    table = rng.standard_normal((4, 8)).astype(np.float32)
    lengths = [0, 0]
    for new in ([5, 2], [1, 1], [3, 1]):  # a prefill, then decode and a mixed step
        batch = _batch(lengths, new, slots=[2, 0])
        v = rng.standard_normal((sum(new), 8)).astype(np.float32)
        kernel.run(v=v, table=table, cache=cache, **batch)
        etc.reference.evaluate(g, v=v, table=table, cache=mirror, **batch)
        lengths = [a + b for a, b in zip(lengths, new)]
        np.testing.assert_array_equal(cache, mirror)
    # Slot 2 holds request 0's 9 rows, slot 0 request 1's 4; nothing else.
    assert cache[2, :9].all() and not cache[2, 9:].any()
    assert cache[0, :4].all() and not cache[0, 4:].any() and not cache[1].any()


def test_kv_append_skips_tokens_outside_the_cache():
    g = _append_graph()
    kernel = etc.compile(g, target="cpu", workers=2)
    cache = np.zeros((1, 4, 8), np.float32)
    batch = _batch([2], [3], slots=[0])  # positions 2, 3, 4: 4 is past the end
    v = np.ones((3, 8), np.float32)
    kernel.run(v=v, table=np.zeros((4, 8), np.float32), cache=cache, **batch)
    assert cache[0, 2:].all() and not cache[0, :2].any()


def test_state_errors_name_the_state():
    g = _append_graph()
    kernel = etc.compile(g, target="cpu", workers=1)
    batch = _batch([0], [2], slots=[0])
    common = dict(v=np.ones((2, 8), np.float32), table=np.zeros((4, 8), np.float32), **batch)
    with pytest.raises(TypeError, match=r"state 'cache' has dtype float64, expected float32 .*in place"):
        kernel.run(cache=np.zeros((1, 4, 8)), **common)
    with pytest.raises(ValueError, match=r"state 'cache' must be a writeable C-contiguous"):
        kernel.run(cache=np.zeros((1, 8, 4), np.float32).transpose(0, 2, 1), **common)
    with pytest.raises(ValueError, match=r"state 'cache' has rank 2"):
        kernel.run(cache=np.zeros((4, 8), np.float32), **common)
    with pytest.raises(TypeError, match=r"missing inputs \['cache'\]"):
        kernel.run(**common)
    # A cache that ran once and was made read-only since is checked again.
    cache = np.zeros((1, 4, 8), np.float32)
    kernel.run(cache=cache, **common)
    cache.flags.writeable = False
    with pytest.raises(ValueError, match=r"state 'cache' must be a writeable C-contiguous"):
        kernel.run(cache=cache, **common)


def test_state_declaration_errors():
    g = etc.Graph("bad")
    T = g.symbol("T")
    with pytest.raises(ValueError, match=r"state 'c': unknown dtype 'f64'"):
        g.state("c", (T, 4), "f64")
    cache = g.state("cache", (T, 4, 8), "f32")
    with pytest.raises(ValueError, match=r"output: tensor 'cache' is a state buffer"):
        g.output(cache)
    x = g.input("x", (T, 8), "f32")
    batch = g.ragged_batch(T, g.symbol("R"))
    with pytest.raises(ValueError, match=r"kv_append: operand 'cache' must be a state buffer"):
        g.kv_append(x, x, batch)
    with pytest.raises(ValueError, match=r"kv_append: 'batch' must be a RaggedBatch"):
        g.kv_append(cache, x, {"positions": x})


def test_state_is_an_argument_after_the_inputs():
    g = _append_graph()
    kinds = [(a.kind, a.name) for a in g.arguments if a.kind in ("input", "state", "output")]
    assert kinds[-2:] == [("state", "cache"), ("output", "embedding_0")]
    assert g.states == ["cache"]
    text = g.to_mlir()
    # The cache is an ordinary buffer argument (not an intermediate) that a
    # task writes with a whole-buffer footprint.
    assert "%cache: memref<?x?x8xf32>," in text
    assert "writes(%cache : memref<?x?x8xf32> (d0) -> (0, 0, 0) [?, ?, ?])" in text


# ----------------------------------------------------------------------
# i32 inputs and operand errors
# ----------------------------------------------------------------------


def test_i32_inputs_are_only_for_index_operands():
    g = etc.Graph("ints")
    T = g.symbol("T")
    ids = g.input("ids", (T,), "i32")
    x = g.input("x", (T, 16), "f32")
    with pytest.raises(ValueError, match=r"silu: operand 'x' \('ids'.*is an integer tensor"):
        g.silu(ids)
    with pytest.raises(ValueError, match=r"embedding: operand 'ids' \('x'.*must be a 1-D i32"):
        g.embedding(x, x)
    with pytest.raises(ValueError, match=r"rope: operand 'positions' \('x'.*must be a 1-D i32"):
        g.rope(x, x, head_dim=8)
    with pytest.raises(ValueError, match=r"unknown dtype 'i64'"):
        g.input("bad", (T,), "i64")


def test_operator_parameter_errors():
    g = etc.Graph("params")
    T = g.symbol("T")
    x = g.input("x", (T, 24), "f32")
    positions = g.input("positions", (T,), "i32")
    with pytest.raises(ValueError, match=r"rope: 'head_dim' = 5 must be even"):
        g.rope(x, positions, head_dim=5)
    with pytest.raises(ValueError, match=r"rope: the last dimension of 'x' \(24\) must be a static "
                                         r"multiple of head_dim = 16"):
        g.rope(x, positions, head_dim=16)
    with pytest.raises(ValueError, match=r"rope: .*'inv_freq'.*must be an f32 tensor of shape \(4,\)"):
        g.rope(x, positions, head_dim=8, inv_freq=g.input("f", (3,), "f32"))
    with pytest.raises(ValueError, match=r"head_rmsnorm: .*'weight'.*must have shape \(8,\)"):
        g.head_rmsnorm(x, g.input("w", (24,), "f32"), head_dim=8)
    other = g.input("other", (g.symbol("U"),), "i32")
    with pytest.raises(ValueError, match=r"rope: .*'positions'.*must have T rows"):
        g.rope(x, other, head_dim=8)
