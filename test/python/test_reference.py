"""etc.reference.evaluate against straightforward NumPy on small cases."""

import numpy as np
import pytest

import etc
from etc.reference import evaluate, round_bf16

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def test_mlp_matches_numpy():
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 16))
    w1 = g.input("w1", (16, 24))
    w2 = g.input("w2", (24, 16))
    g.output(g.add(g.matmul(g.silu(g.matmul(x, w1)), w2), x))
    for rows in (1, 5, 33):
        xv, w1v, w2v = rand(rows, 16), rand(16, 24), rand(24, 16)
        (y,) = evaluate(g, x=xv, w1=w1v, w2=w2v)
        h = xv @ w1v
        expected = (h / (1 + np.exp(-h))) @ w2v + xv
        assert y.dtype == np.float32 and y.shape == (rows, 16)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_every_operator():
    g = etc.Graph("ops")
    x = g.input("x", (6, 10))
    z = g.input("z", (6, 10))
    w = g.input("w", (12, 10))
    b = g.input("b", (10,))
    outs = [g.matmul(x, w, transpose_b=True), g.add(x, z), g.mul(x, b), g.add(b, x),
            g.silu(x), g.gelu(x), g.exp(x), g.scale(x, -1.5), g.rmsnorm(x, b, 1e-3),
            g.softmax(x), g.sum(x), g.exp(b)]
    g.output(*outs)
    xv, zv, wv, bv = rand(6, 10), rand(6, 10), rand(12, 10), rand(10)
    got = evaluate(g, x=xv, z=zv, w=wv, b=bv)
    gelu = 0.5 * xv * (1 + np.tanh(np.sqrt(2 / np.pi) * (xv + 0.044715 * xv ** 3)))
    rms = xv / np.sqrt((xv ** 2).mean(-1, keepdims=True) + 1e-3) * bv
    sm = np.exp(xv) / np.exp(xv).sum(-1, keepdims=True)
    expected = [xv @ wv.T, xv + zv, xv * bv, xv + bv, xv / (1 + np.exp(-xv)), gelu,
                np.exp(xv), -1.5 * xv, rms, sm, xv.sum(-1), np.exp(bv)]
    assert len(got) == len(expected)
    for name, a, e in zip(g.outputs, got, expected):
        assert a.shape == e.shape, name
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-5, err_msg=name)


def test_softmax_is_stable_for_large_inputs():
    g = etc.Graph("s")
    x = g.input("x", (2, 3))
    g.output(g.softmax(x))
    (y,) = evaluate(g, x=np.array([[1000, 1001, 1002], [-1000, 0, 1000]], np.float32))
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-6)


def test_out_buffer_reuse_follows_call_order():
    g = etc.Graph("r")
    x = g.input("x", (3, 4))
    t = g.tensor("t", (3, 4))
    g.exp(x, out=t)
    a = g.scale(t, 2.0)
    g.add(a, x, out=t)          # overwrite t
    g.output(g.mul(t, x), t)
    xv = rand(3, 4)
    y, tv = evaluate(g, x=xv)
    np.testing.assert_allclose(tv, 2 * np.exp(xv) + xv, rtol=1e-6)
    np.testing.assert_allclose(y, (2 * np.exp(xv) + xv) * xv, rtol=1e-6)


def test_f16_rounds_every_result_and_returns_float16():
    g = etc.Graph("h")
    x = g.input("x", (4, 8), "f16")
    w = g.input("w", (8, 8), "f16")
    g.output(g.scale(g.matmul(x, w), 3.0))
    xv, wv = rand(4, 8, dtype=np.float16), rand(8, 8, dtype=np.float16)
    (y,) = evaluate(g, x=xv, w=wv)
    assert y.dtype == np.float16
    h = (xv.astype(np.float32) @ wv.astype(np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(y, (h * 3).astype(np.float16))


def test_round_bf16():
    v = np.array([1.0, 1.00390625, 1.005859375, 3.4e38, -2.5, np.inf, 0.0], np.float32)
    r = round_bf16(v)
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: ties go to even (1.0);
    # 3.4e38 is above the largest bfloat16 (0x7F7F) and rounds to infinity.
    np.testing.assert_array_equal(r, np.array([1.0, 1.0, 1.0078125, np.inf, -2.5, np.inf, 0.0],
                                              np.float32))
    assert np.all(r.view(np.uint32) & 0xFFFF == 0)
    assert np.isnan(round_bf16(np.array([np.nan], np.float32)))[0]
    # A NaN whose payload would carry into the exponent stays NaN, sign kept.
    nans = np.array([0x7FFFFFFF, 0xFF800001, 0x7F800001], np.uint32).view(np.float32)
    bits = round_bf16(nans).view(np.uint32) >> 16
    assert list(bits) == [0x7FFF, 0xFFC0, 0x7FC0]


def test_bf16_inputs_and_outputs():
    g = etc.Graph("bf")
    x = g.input("x", (4, 8), "bf16")
    g.output(g.scale(x, 1.0 / 3.0))
    xv = round_bf16(rand(4, 8))
    (y,) = evaluate(g, x=xv)
    assert y.dtype == np.float32
    assert np.all(y.view(np.uint32) & 0xFFFF == 0)
    np.testing.assert_array_equal(y, round_bf16(xv * np.float32(1.0 / 3.0)))
    # Inputs that bf16 cannot hold are rounded, as the runtimes round them.
    raw = rand(4, 8) + np.float32(1e-3)
    (rounded,) = evaluate(g, x=raw)
    np.testing.assert_array_equal(rounded, round_bf16(round_bf16(raw) * np.float32(1.0 / 3.0)))


def test_input_checks():
    g = etc.Graph("c")
    B = g.symbol("B")
    x = g.input("x", (B, 8))
    y = g.input("y", (B, 8))
    g.output(g.add(x, y))
    # The same mistakes raise the same errors as the runtimes (etc.binding).
    with pytest.raises(ValueError, match=r"symbol 'B' is bound to 3 by input 'x' but input 'y' dim 0 is 4"):
        evaluate(g, x=rand(3, 8), y=rand(4, 8))
    with pytest.raises(TypeError, match=r"missing inputs \['y'\]"):
        evaluate(g, x=rand(3, 8))
    with pytest.raises(TypeError, match=r"unexpected inputs \['q'\]"):
        evaluate(g, x=rand(3, 8), y=rand(3, 8), q=rand(3, 8))
    with pytest.raises(ValueError, match=r"input 'x' has rank 1 \(shape \(8,\)\), expected rank 2"):
        evaluate(g, x=rand(8), y=rand(3, 8))
    with pytest.raises(TypeError, match=r"input 'x' has dtype float64, expected float32"):
        evaluate(g, x=rand(3, 8).astype(np.float64), y=rand(3, 8))
    with pytest.raises(ValueError, match=r"input 'y' dim 1 is 9, expected 8"):
        evaluate(g, x=rand(3, 8), y=rand(3, 9))


def test_unused_scratch_with_a_free_symbol_is_fine():
    g = etc.Graph("u")
    S = g.symbol("S")
    x = g.input("x", (4, 4))
    g.tensor("t", (S, 4))
    g.output(g.exp(x))
    (y,) = evaluate(g, x=rand(4, 4))
    assert y.shape == (4, 4) and np.all(y > 0)


def test_an_input_may_be_called_g():
    g = etc.Graph("named_g")
    x = g.input("g", (2, 4))
    g.output(g.exp(x))
    xv = rand(2, 4)
    (y,) = evaluate(g, g=xv)
    np.testing.assert_allclose(y, np.exp(xv), rtol=1e-6)


def test_zero_width_rows():
    """A symbolic dimension bound to 0 gives empty rows: row-wise operators
    return empty results (sum: zeros), without NumPy's empty-reduction errors."""
    g = etc.Graph("zw")
    B, N = g.symbol("B"), g.symbol("N")
    x = g.input("x", (B, N))
    w = g.input("w", (N,))
    g.output(g.softmax(x), g.rmsnorm(x, w), g.sum(x))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        soft, norm, total = evaluate(g, x=rand(3, 0), w=rand(0))
    assert soft.shape == norm.shape == (3, 0)
    np.testing.assert_array_equal(total, np.zeros(3, np.float32))


def test_topk_ranks_nan_above_every_number():
    x = np.array([[1.0, np.nan, np.inf, 3.0, np.nan, -np.inf, 3.0]], np.float32)
    values, indices = etc.reference.topk(x, 7)
    assert indices.tolist() == [[1, 4, 2, 3, 6, 0, 5]]
    np.testing.assert_array_equal(values, x[:, [1, 4, 2, 3, 6, 0, 5]])
    # Without NaN it is the plain descending order, ties by lower index.
    values, indices = etc.reference.topk(np.array([[2, 5, 5, 1]], np.float32), 3)
    assert indices.tolist() == [[1, 2, 0]] and values.tolist() == [[5, 5, 2]]
