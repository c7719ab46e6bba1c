"""The operators the model families added, against NumPy on the CPU target
with the CPU kernels and the CUDA ones (lanes simulated), in f32 and bf16:
RMSNorm times (offset + weight) (Gemma's 1 + w, whole rows and per head),
gelu(a) * b (GeGLU), soft-capping c tanh(x / c) of logits and of attention
scores; their errors; and that a zero offset keeps the plain kernels."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import bfloat16
from test_llm_ops import _batch

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

KERNELS = [dict(), dict(kernels="cuda")]


def _storage(array: np.ndarray, dtype: str) -> np.ndarray:
    return bfloat16.to_bits(array) if dtype == "bf16" else array.astype(np.float32)


def _values(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint16:
        return bfloat16.from_bits(array).reshape(array.shape)
    return np.asarray(array, np.float32)


def _check(g, inputs: dict, dtype: str, options: dict, tol: float) -> None:
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2, **options)
    data = {name: _storage(a, dtype) if a.dtype == np.float32 else a
            for name, a in inputs.items()}
    got = kernel.run(**data)
    want = etc.reference.evaluate(g, **data)
    for a, b in zip(got, want):
        np.testing.assert_allclose(_values(a), _values(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("options", KERNELS, ids=["cpu", "cuda"])
@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("bf16", 2e-2)])
@pytest.mark.parametrize("width", [64, 37])
def test_rmsnorm_with_an_offset(options, dtype, tol, width):
    """x / rms(x) * (1 + w): the weight near 0 (as Gemma stores it), which
    the offset turns into a scale near 1; a weight of 0 gives the plain
    normalised row."""
    g = etc.Graph("norm")
    R = g.symbol("R")
    x = g.input("x", (R, width), dtype)
    w = g.input("w", (width,), dtype)
    g.output(g.rmsnorm(x, w, 1e-6, offset=1.0), g.rmsnorm(x, w, 1e-6))
    rng = np.random.default_rng(width)
    xs = rng.standard_normal((5, width)).astype(np.float32)
    ws = (0.1 * rng.standard_normal(width)).astype(np.float32)
    _check(g, {"x": xs, "w": ws}, dtype, options, tol)
    if dtype == "f32":
        offset, plain = etc.reference.evaluate(g, x=xs, w=np.zeros(width, np.float32))
        want = xs / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(offset, want, rtol=1e-5, atol=1e-5)
        assert np.abs(plain).max() == 0


@pytest.mark.parametrize("options", KERNELS, ids=["cpu", "cuda"])
def test_head_rmsnorm_with_an_offset(options):
    g = etc.Graph("heads")
    T = g.symbol("T")
    x = g.input("x", (T, 4 * 16), "f32")
    w = g.input("w", (16,), "f32")
    g.output(g.head_rmsnorm(x, w, head_dim=16, eps=1e-6, offset=1.0))
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((3, 64)).astype(np.float32)
    ws = (0.1 * rng.standard_normal(16)).astype(np.float32)
    _check(g, {"x": xs, "w": ws}, "f32", options, 1e-5)
    heads = xs.reshape(3, 4, 16)
    want = heads / np.sqrt(np.mean(heads ** 2, axis=-1, keepdims=True) + 1e-6) * (1 + ws)
    np.testing.assert_allclose(etc.reference.evaluate(g, x=xs, w=ws)[0], want.reshape(3, 64),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", KERNELS, ids=["cpu", "cuda"])
@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("bf16", 2e-2)])
def test_gelu_mul_and_softcap(options, dtype, tol):
    """gelu(a) * b (the tanh approximation, transformers'
    gelu_pytorch_tanh) and c tanh(x / c) for values far past c."""
    g = etc.Graph("geglu")
    R = g.symbol("R")
    a = g.input("a", (R, 96), dtype)
    b = g.input("b", (R, 96), dtype)
    g.output(g.gelu_mul(a, b), g.softcap(a, 3.0))
    rng = np.random.default_rng(5)
    xs = (4 * rng.standard_normal((4, 96))).astype(np.float32)
    ys = rng.standard_normal((4, 96)).astype(np.float32)
    xs[0, :4] = [1e4, -1e4, 200.0, -200.0]  # exp overflows and vanishes
    _check(g, {"a": xs, "b": ys}, dtype, options, tol)
    if dtype != "f32":
        return
    gelu, capped = etc.reference.evaluate(g, a=xs, b=ys)
    tanh_gelu = 0.5 * xs * (1 + np.tanh(np.sqrt(2 / np.pi) * (xs + 0.044715 * xs ** 3)))
    np.testing.assert_allclose(gelu, tanh_gelu * ys, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(capped, 3 * np.tanh(xs / 3), rtol=1e-6, atol=1e-6)
    assert np.abs(capped).max() <= 3.0


@pytest.mark.parametrize("options", KERNELS, ids=["cpu", "cuda"])
@pytest.mark.parametrize("window", [None, 5])
def test_attention_soft_capping(options, window):
    """Scores soft-capped before the softmax (Gemma 2), with and without a
    window, over ragged steps; and the cap changes the result."""
    heads, kv_heads, d = 4, 2, 16
    g = etc.Graph("capped")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, heads * d), "f32")
    k = g.input("k", (T, kv_heads * d), "f32")
    v = g.input("v", (T, kv_heads * d), "f32")
    batch = g.ragged_batch(T, R)
    kc = g.kv_append(g.state("kc", (S, L, kv_heads * d)), k, batch)
    vc = g.kv_append(g.state("vc", (S, L, kv_heads * d)), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=d, chunk=4, max_length=24, scale=0.5,
                         window=window, softcap=2.0))
    kernel = etc.compile(g, target="cpu", schedule="dynamic", workers=2, **options)
    rng = np.random.default_rng(7)
    caches = [np.zeros((2, 24, kv_heads * d), np.float32) for _ in range(4)]
    lengths = [0, 0]
    for new in ([9, 3], [1, 1], [4, 1]):
        b = _batch(lengths, new, [1, 0])
        n = sum(new)
        data = {"q": 3 * rng.standard_normal((n, heads * d)).astype(np.float32),
                "k": rng.standard_normal((n, kv_heads * d)).astype(np.float32),
                "v": rng.standard_normal((n, kv_heads * d)).astype(np.float32), **b}
        (got,) = kernel.run(**data, kc=caches[0], vc=caches[1])
        (want,) = etc.reference.evaluate(g, **data, kc=caches[2], vc=caches[3])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        lengths = [a + m for a, m in zip(lengths, new)]
    from etc.reference_llm import attention

    args = (data["q"], caches[2], caches[3], b["positions"], b["token_request"],
            b["request_slot"], d, 0.5)
    assert not np.allclose(attention(*args, window=window, softcap=2.0),
                           attention(*args, window=window), atol=1e-3)


def test_a_zero_offset_is_the_plain_norm_and_errors_name_the_argument():
    g = etc.Graph("plain")
    R = g.symbol("R")
    x = g.input("x", (R, 32), "f32")
    w = g.input("w", (32,), "f32")
    g.rmsnorm(x, w, offset=0.0)
    assert g._ops[-1].params == {"eps": 1e-6}
    for bad in (float("nan"), "1", True):
        with pytest.raises(ValueError, match=r"rmsnorm: 'offset' must be a finite float"):
            g.rmsnorm(x, w, offset=bad)
    with pytest.raises(ValueError, match=r"head_rmsnorm: 'offset' must be a finite float"):
        g.head_rmsnorm(x, w, head_dim=32, offset=float("inf"))
    for bad in (0.0, -1.0, None):
        with pytest.raises(ValueError, match=r"softcap: constant 'c' must be a positive"):
            g.softcap(x, bad)
    T, R2, S, L = (g.symbol(n) for n in ("T", "R2", "S", "L"))
    q = g.input("q", (T, 16), "f32")
    batch = g.ragged_batch(T, R2)
    kc = g.state("kc", (S, L, 16))
    for bad in (0, -2.0, "5"):
        with pytest.raises(ValueError, match=r"attention: 'softcap' must be a positive float"):
            g.attention(q, kc, kc, batch, head_dim=8, max_length=16, softcap=bad)


@pytest.mark.parametrize("head_dim, dtype, window", [(24, "f32", None), (96, "bf16", 5),
                                                     (48, "bf16", None)])
def test_gpu_attention_with_rows_that_do_not_divide_the_warp(head_dim, dtype, window):
    """The warp kernel for head sizes whose row of 16-byte slices does not
    divide the warp (24 f32: 6 lanes, 96 bf16 (Phi-3): 12, 48 bf16: 6):
    the row takes the next power of two of lanes, the others idle; ragged
    steps with the lanes simulated match NumPy."""
    heads, kv_heads = 4, 2
    g = etc.Graph("odd")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, heads * head_dim), dtype)
    k = g.input("k", (T, kv_heads * head_dim), dtype)
    v = g.input("v", (T, kv_heads * head_dim), dtype)
    batch = g.ragged_batch(T, R)
    kc = g.kv_append(g.state("kc", (S, L, kv_heads * head_dim), dtype), k, batch)
    vc = g.kv_append(g.state("vc", (S, L, kv_heads * head_dim), dtype), v, batch)
    g.output(g.attention(q, kc, vc, batch, head_dim=head_dim, chunk=4, max_length=24,
                         window=window))
    kernel = etc.compile(g, target="cpu", kernels="cuda", schedule="dynamic", workers=2)
    assert "attention_chunk_warps" in kernel.ir("graph")
    rng = np.random.default_rng(head_dim)
    width = kv_heads * head_dim
    caches = [_storage(np.zeros((2, 24, width), np.float32), dtype) for _ in range(4)]
    lengths = [0, 0]
    tol = 1e-5 if dtype == "f32" else 3e-2
    for new in ([9, 3], [1, 1], [4, 1]):
        b = _batch(lengths, new, [1, 0])
        n = sum(new)
        data = {name: _storage(rng.standard_normal((n, cols)).astype(np.float32), dtype)
                for name, cols in (("q", heads * head_dim), ("k", width), ("v", width))}
        (got,) = kernel.run(**data, **b, kc=caches[0], vc=caches[1])
        (want,) = etc.reference.evaluate(g, **data, **b, kc=caches[2], vc=caches[3])
        np.testing.assert_allclose(_values(got), _values(want), rtol=tol, atol=tol)
        lengths = [a + m for a, m in zip(lengths, new)]
