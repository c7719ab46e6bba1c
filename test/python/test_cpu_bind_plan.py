"""The CPU runtime's bind plan (`etc.runtime.bind_plan`): a run given the
very arrays of the last run reuses its binding, and anything else is bound,
checked and refused as without a plan: another array of the same shape, an
array whose data moved or whose shape or dtype changed in place, a view, an
array made read-only, index inputs whose values changed."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import bfloat16
from etc.runtime import aligned, bind_plan
from etc.runtime.ranges import IndexRangeError
from test_index_ranges import _graph as _attention_graph, _inputs as _attention_inputs

N = 16


def _graph(dtype="f32"):
    g = etc.Graph("plan")
    m = g.symbol("M")
    x = g.input("x", (m, N), dtype)
    y = g.input("y", (m, N), dtype)
    g.output(g.add(x, y), g.mul(x, y))
    return g


@pytest.fixture(scope="module")
def kernel():
    return etc.compile(_graph(), target="cpu", workers=2)


@pytest.fixture(scope="module")
def bf16_kernel():
    return etc.compile(_graph("bf16"), target="cpu", workers=2)


def _aligned(values: np.ndarray) -> np.ndarray:
    """`values` in a 64-byte aligned view (of memory its base keeps)."""
    array = aligned.empty(values.shape, values.dtype)
    array[...] = values
    return array


def _arrays(m=5, seed=0):
    rng = np.random.default_rng(seed)
    return (_aligned(rng.standard_normal((m, N)).astype(np.float32)),
            _aligned(rng.standard_normal((m, N)).astype(np.float32)))


def _expect(outs, x, y):
    np.testing.assert_allclose(outs[0], x + y, rtol=1e-6)
    np.testing.assert_allclose(outs[1], x * y, rtol=1e-6)


def _no_binding(runtime, monkeypatch):
    """Makes binding from scratch fail: a run that does it missed its plan."""
    def bind(*args, **kwargs):
        raise AssertionError("bound again")
    monkeypatch.setattr(runtime, "_bind", bind)


def test_the_data_word_reads_the_arrays_address():
    a = np.arange(12.0).reshape(3, 4)
    for view in (a, a[1:], a[:, ::2], a.T):
        assert bind_plan.data_word(view).value == view.ctypes.data


def test_the_same_arrays_reuse_the_plan_and_see_new_contents(kernel, monkeypatch):
    x, y = _arrays()
    out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
    kernel.run(x=x, y=y, out=out)
    assert kernel.runtime._plan is None  # made when the arrays come again
    kernel.run(x=x, y=y, out=out)
    plan = kernel.runtime._plan
    assert plan is not None
    _no_binding(kernel.runtime, monkeypatch)
    x[:] += 1  # contents are read at every run
    result = kernel.run(x=x, y=y, out=out)
    assert all(r is o for r, o in zip(result, out))
    _expect(out, x, y)
    assert kernel.runtime._plan is plan
    # Without out=: new arrays at every run, from the plan of the first.
    monkeypatch.undo()
    kernel.run(x=x, y=y)
    kernel.run(x=x, y=y)
    _no_binding(kernel.runtime, monkeypatch)
    first = kernel.run(x=x, y=y)
    second = kernel.run(x=x, y=y)
    assert first[0] is not second[0]
    _expect(second, x, y)


def test_new_arrays_at_every_run_make_no_plan(kernel, monkeypatch):
    made = []
    real = bind_plan.BindPlan.make
    monkeypatch.setattr(bind_plan.BindPlan, "make",
                        classmethod(lambda cls, *a: made.append(1) or real(*a)))
    for seed in range(3):
        x, y = _arrays(seed=seed)
        out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
        kernel.run(x=x, y=y, out=out)
        _expect(out, x, y)
    assert not made and kernel.runtime._plan is None


def test_another_array_of_the_same_shape_is_bound(kernel):
    x, y = _arrays()
    kernel.run(x=x, y=y)
    x2, _ = _arrays(seed=1)
    _expect(kernel.run(x=x2, y=y), x2, y)
    # The last run's arrays again, after another's.
    _expect(kernel.run(x=x, y=y), x, y)


def test_an_array_whose_data_moved_is_bound_again(kernel):
    x, y = _arrays()
    out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
    kernel.run(x=x, y=y, out=out)
    kernel.run(x=x, y=y, out=out)  # a plan now (the _seen path: the same with one run)
    address, old_memory = x.ctypes.data, x.base  # kept: the new data lies elsewhere
    assert old_memory is not None
    values = np.arange(5 * N, dtype=np.float32).reshape(5, N)
    x.__setstate__((1, (5, N), np.dtype(np.float32), False, values.tobytes()))
    assert x.ctypes.data != address
    kernel.run(x=x, y=y, out=out)
    _expect(out, values, y)
    # The out= array's data moves too: the run writes the new one.
    old, old_memory = out[0].ctypes.data, out[0].base
    out[0].__setstate__((1, (5, N), np.dtype(np.float32), False, bytes(5 * N * 4)))
    assert out[0].ctypes.data != old
    kernel.run(x=x, y=y, out=out)
    _expect(out, values, y)


def test_a_changed_shape_binds_the_symbols_again(kernel):
    x, y = _arrays(6)
    kernel.run(x=x, y=y)
    x.shape = y.shape = (3, 2 * N)  # in place: the same objects
    with pytest.raises(ValueError, match=r"input 'x' dim 1 is 32, expected 16"):
        kernel.run(x=x, y=y)
    x.shape = y.shape = (6, N)
    kernel.run(x=x, y=y)
    kernel.run(x=x, y=y)
    x2, y2 = x[:3], y[:3]
    _expect(kernel.run(x=x2, y=y2), x2, y2)


def test_a_changed_dtype_is_refused(kernel):
    x, y = _arrays()
    out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
    kernel.run(x=x, y=y, out=out)
    kernel.run(x=x, y=y, out=out)
    x.dtype = np.int32
    with pytest.raises(TypeError, match=r"input 'x' has dtype int32, expected float32"):
        kernel.run(x=x, y=y, out=out)
    x.dtype = np.float32
    kernel.run(x=x, y=y, out=out)
    kernel.run(x=x, y=y, out=out)
    out[1].dtype = np.int32
    with pytest.raises(TypeError, match=r"out\['out1'\] has dtype int32|has dtype int32"):
        kernel.run(x=x, y=y, out=out)


def test_views_and_read_only_out_arrays(kernel):
    x, y = _arrays()
    big = aligned.empty((5, 2 * N), np.float32)
    out = [big[:, ::2], aligned.empty((5, N), np.float32)]
    kernel.run(x=x, y=y, out=out)
    kernel.run(x=x, y=y, out=out)
    _expect(out, x, y)
    # A strided input: read through a contiguous copy, at every run.
    wide = aligned.aligned(np.random.default_rng(2).standard_normal((5, 2 * N))
                           .astype(np.float32))
    view = wide[:, 1::2]
    _expect(kernel.run(x=view, y=y), view, y)
    wide[:] += 1
    _expect(kernel.run(x=view, y=y), view, y)
    kernel.run(x=x, y=y, out=out)
    kernel.run(x=x, y=y, out=out)
    out[1].flags.writeable = False
    with pytest.raises(ValueError, match=r"is read-only"):
        kernel.run(x=x, y=y, out=out)


def test_out_arrays_that_now_share_memory_are_refused(kernel):
    x, y = _arrays()
    out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
    kernel.run(x=x, y=y, out=out)
    with pytest.raises(ValueError, match=r"share memory"):
        kernel.run(x=x, y=y, out=[out[0], out[0]])
    # A list that is another object with the same arrays hits the plan.
    kernel.run(x=x, y=y, out=list(out))
    _expect(out, x, y)
    # A dict by name, in another order, and an iterator.
    swapped = {name: array for name, array in zip(kernel.abi.outputs[::-1], out[::-1])}
    kernel.run(x=x, y=y, out=swapped)
    kernel.run(x=x, y=y, out=swapped)
    _expect(out, x, y)
    kernel.run(x=x, y=y, out=iter(out))
    _expect(out, x, y)


def test_converted_inputs_are_converted_at_every_run(bf16_kernel):
    x, y = _arrays()
    bits = bfloat16.to_bits(y)
    first = bf16_kernel.run(x=x, y=bits)
    x[:] *= 2  # a float32 input for bf16 is copied: the next run copies it again
    second = bf16_kernel.run(x=x, y=bits)
    rounded = bfloat16.from_bits(bfloat16.to_bits(x))
    np.testing.assert_allclose(second[0], rounded + bfloat16.from_bits(bits), rtol=1e-2)
    assert not np.array_equal(first[0], second[0])


def test_partial_kernels_plan_with_their_constants(kernel, monkeypatch):
    x, y = _arrays()
    bound = kernel.partial(y=y)
    out = [aligned.empty((5, N), np.float32), aligned.empty((5, N), np.float32)]
    bound.run(x=x, out=out)
    bound.run(x=x, out=out)
    _expect(out, x, y)
    other = kernel.partial(y=x)
    other.run(x=x, out=out)  # other constants: another plan
    _expect(out, x, x)
    # An out= array that is a bound constant is copied into, never written in place.
    bound.run(x=x, out=[y.copy(), out[1]])
    with pytest.raises(TypeError, match=r"bound as constants and given to run\(\) too"):
        bound.run(x=x, y=y)


@pytest.fixture(scope="module")
def attention():
    return etc.compile(_attention_graph(), target="cpu", schedule="dynamic", workers=2)


def test_index_inputs_are_range_checked_at_every_run(attention):
    inputs = _attention_inputs()
    attention.run(**inputs)
    attention.run(**inputs)
    assert attention.runtime._plan is not None
    inputs["positions"][0] = -1
    with pytest.raises(IndexRangeError, match=r"input 'positions'\[0\] = -1"):
        attention.run(**inputs)


def test_a_state_made_read_only_is_refused(attention):
    inputs = _attention_inputs()
    attention.run(**inputs)
    attention.run(**inputs)
    assert attention.runtime._plan is not None
    inputs["kc"].flags.writeable = False
    with pytest.raises(ValueError, match=r"state 'kc' must be a writeable"):
        attention.run(**inputs)
