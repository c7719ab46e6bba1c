"""`out=` on the CPU target: the program writes the caller's arrays in place
(bf16 outputs as uint16 bit patterns, no widening), a float32 array for a
bf16 output still gets the widened values, wrong arrays are refused naming
the output, and an array that holds garbage before the run, overlaps an
input, or is a strided or misaligned view gets the right values all the
same. Also: a traced run copies its records, so a trace read later is
still its own run's."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import bfloat16
from etc.runtime import aligned, cpu

# Every float32 word whose upper half is 0xFFFF is a NaN: a run that left an
# element unwritten leaves it NaN.
GARBAGE = 0xFFFF


def gemm_graph(name: str = "gemm_out", doubled: bool = False) -> etc.Graph:
    """C = A @ W^T in bf16 (the benchmark's GEMM) beside an f32 sum S = X +
    Z: one bf16 and one f32 output (`doubled`: and a second f32 one, D =
    2 X)."""
    g = etc.Graph(name)
    m = g.symbol("M")
    a = g.input("a", (m, 64), "bf16")
    w = g.input("w", (48, 64), "bf16")
    x = g.input("x", (m, 48), "f32")
    z = g.input("z", (m, 48), "f32")
    outputs = [g.matmul(a, w, transpose_b=True, name="c"), g.add(x, z, name="s")]
    g.output(*outputs, *([g.scale(x, 2.0, name="d")] if doubled else []))
    return g


@pytest.fixture(scope="module")
def gemm():
    g = gemm_graph()
    return g, etc.compile(g, target="cpu", workers=2)


def _inputs(rng, m: int) -> dict:
    return dict(a=bfloat16.to_bits(rng.standard_normal((m, 64)).astype(np.float32)),
                w=bfloat16.to_bits(rng.standard_normal((48, 64)).astype(np.float32)),
                x=rng.standard_normal((m, 48)).astype(np.float32),
                z=rng.standard_normal((m, 48)).astype(np.float32))


def _kept_outputs(kernel) -> set:
    """The outputs some kept workspace holds a buffer of (written by the
    program instead of the caller's array, then copied)."""
    return {name for w in kernel.runtime._workspaces.values() for name in w.outputs}


@pytest.mark.parametrize("m", [1, 5, 33])  # 5 and 33: partial row tiles
def test_bf16_bits_out_is_written_in_place_with_the_float32_paths_values(gemm, m):
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(m), m)
    c32, s32 = kernel.run(**inputs)
    kernel.runtime.free_workspaces()
    c16 = aligned.empty((m, 48), np.uint16)
    c16.fill(GARBAGE)
    s = aligned.empty((m, 48), np.float32)
    s.view(np.uint32).fill(0xFFFFFFFF)
    filled = kernel.run(**inputs, out=[c16, s])
    assert filled[0] is c16 and filled[1] is s
    np.testing.assert_array_equal(c16, c32.view(np.uint32) >> 16)
    np.testing.assert_array_equal(s, s32)
    # Both written in place: no output went through a buffer of the runtime.
    assert _kept_outputs(kernel) == set()


def test_a_float32_out_for_a_bf16_output_gets_the_widened_values(gemm):
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(1), 7)
    c32, _ = kernel.run(**inputs)
    # A strided view is filled too (by a copy).
    wide = np.full((7, 96), np.nan, np.float32)
    kernel.run(**inputs, out={"c": wide[:, ::2]})
    np.testing.assert_array_equal(wide[:, ::2], c32)
    assert np.isnan(wide[:, 1::2]).all()


def test_outputs_left_out_of_out_and_misaligned_arrays_still_get_their_values(gemm):
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(2), 6)
    c32, s32 = kernel.run(**inputs)
    raw = aligned.empty((6 * 48 + 8,), np.uint16)
    raw.fill(GARBAGE)
    misaligned = raw[1:1 + 6 * 48].reshape(6, 48)  # 2 bytes past a 64-byte line
    assert misaligned.ctypes.data % 16 != 0
    kernel.runtime.free_workspaces()
    (filled,) = kernel.run(**inputs, out={"c": misaligned})
    assert filled is misaligned
    np.testing.assert_array_equal(misaligned, c32.view(np.uint32) >> 16)
    assert _kept_outputs(kernel) == {"c", "s"}
    # The kept buffers are not what the caller holds: a later run without
    # out= returns new arrays.
    again = kernel.run(**inputs)
    np.testing.assert_array_equal(again[1], s32)
    assert again[1] is not kernel.run(**inputs)[1]


def test_wrong_out_arrays_are_refused_naming_the_output(gemm):
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(3), 4)
    with pytest.raises(TypeError, match=r"out\['c'\] has dtype float16; output 'c' is bf16, "
                                        r"expected uint16 \(bf16 bit patterns\) or float32"):
        kernel.run(**inputs, out={"c": np.empty((4, 48), np.float16)})
    with pytest.raises(TypeError, match=r"out\['s'\] has dtype uint16; output 's' is f32, "
                                        r"expected float32"):
        kernel.run(**inputs, out={"s": np.empty((4, 48), np.uint16)})
    with pytest.raises(ValueError, match=r"out\['c'\] has shape \[5, 48\], expected \[4, 48\]"):
        kernel.run(**inputs, out={"c": np.empty((5, 48), np.uint16)})
    readonly = np.empty((4, 48), np.uint16)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"out\['c'\] is read-only"):
        kernel.run(**inputs, out={"c": readonly})
    with pytest.raises(TypeError, match=r"out\['c'\] must be a numpy.ndarray"):
        kernel.run(**inputs, out={"c": [[0] * 48] * 4})
    with pytest.raises(TypeError, match=r"out= names \['d'\] are not outputs"):
        kernel.run(**inputs, out={"d": np.empty((4, 48), np.uint16)})


@pytest.fixture(scope="module")
def square():
    """Y = X @ W (f32, 64 x 64 x 64): an out= array that is X or W must not
    be written while the tiles still read it."""
    g = etc.Graph("square")
    m = g.symbol("M")
    g.output(g.matmul(g.input("x", (m, 64), "f32"), g.input("w", (64, 64), "f32")))
    return g, etc.compile(g, target="cpu", workers=2)


def test_an_out_array_that_is_an_input_gets_the_product_of_the_old_values(square):
    g, kernel = square
    rng = np.random.default_rng(4)
    x = aligned.aligned(rng.standard_normal((64, 64)).astype(np.float32))
    w = aligned.aligned(rng.standard_normal((64, 64)).astype(np.float32))
    (want,) = kernel.run(x=x, w=w)
    kernel.run(x=x, w=w, out=[x])
    np.testing.assert_array_equal(x, want)
    # A bound constant too.
    x = aligned.aligned(rng.standard_normal((64, 64)).astype(np.float32))
    (want,) = kernel.run(x=x, w=w)
    kernel.partial(w=w).run(x=x, out=[w])
    np.testing.assert_array_equal(w, want)


def test_a_bound_kernel_writes_bf16_bits_in_place(gemm):
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(5), 9)
    c32, s32 = kernel.run(**inputs)
    bound = kernel.partial(w=inputs.pop("w"))
    kernel.runtime.free_workspaces()
    c16 = aligned.empty((9, 48), np.uint16)
    c16.fill(GARBAGE)
    s = aligned.empty((9, 48), np.float32)
    assert bound.run(**inputs, out={"s": s, "c": c16}) == [s, c16]
    np.testing.assert_array_equal(c16, c32.view(np.uint32) >> 16)
    np.testing.assert_array_equal(s, s32)
    assert _kept_outputs(kernel) == set()


def test_rows_an_embedding_leaves_zero_are_written_into_garbage():
    """Ids outside the table give zero rows: written by the tiles, not left
    to a zeroed buffer (out= may hold anything)."""
    g = etc.Graph("emb_out")
    t = g.symbol("T")
    g.output(g.embedding(g.input("table", (50, 64), "bf16"), g.input("ids", (t,), "i32")))
    kernel = etc.compile(g, target="cpu", workers=2)
    table = np.random.default_rng(6).standard_normal((50, 64)).astype(np.float32)
    ids = np.array([1, 70, -1, 3, 49], np.int32)
    out = aligned.empty((5, 64), np.uint16)
    out.fill(GARBAGE)
    kernel.run(table=table, ids=ids, out=[out])
    np.testing.assert_array_equal(out, bfloat16.to_bits(etc.reference.evaluate(
        g, table=table, ids=ids)[0]))
    assert not out[1:3].any()


def test_a_trace_read_after_a_later_run_is_still_its_own_runs():
    g = etc.Graph("traced_out")
    m = g.symbol("M")
    g.output(g.matmul(g.input("a", (m, 64), "f32"), g.input("w", (64, 64), "f32")))
    kernel = etc.compile(g, target="cpu", workers=2, trace=True)
    a, w = np.ones((256, 64), np.float32), np.ones((64, 64), np.float32)
    kernel.run(a=a, w=w)
    first = kernel.trace
    kernel.run(a=a, w=w)  # the same size: the same counter buffer
    second = kernel.trace
    assert len(second.events) == len(first.events) > 0
    assert max(e.end for e in first.events) < min(e.start for e in second.events)


def test_out_arrays_sharing_bytes_are_refused_naming_both(gemm):
    """A bf16 output's bits and an f32 output over the same bytes (both
    would be written in place): refused before the run, and by `fill_out`
    (the distributed runtime's copies) too; outputs `out=` leaves out and
    disjoint halves of one buffer are fine."""
    _, kernel = gemm
    inputs = _inputs(np.random.default_rng(7), 4)
    c32, s32 = kernel.run(**inputs)
    raw = aligned.empty((2 * 4 * 48 * 4,), np.uint8)
    bits = raw[:4 * 48 * 2].view(np.uint16).reshape(4, 48)
    floats = raw[:4 * 48 * 4].view(np.float32).reshape(4, 48)
    with pytest.raises(ValueError, match=r"out\['c'\] and out\['s'\] share memory"):
        kernel.run(**inputs, out={"c": bits, "s": floats})
    with pytest.raises(ValueError, match=r"out\['c'\] and out\['s'\] share memory"):
        cpu.fill_out(kernel.abi, [bits, floats], {"c": bfloat16.to_bits(c32), "s": s32})
    apart = raw[4 * 48 * 4:].view(np.float32).reshape(4, 48)
    assert kernel.run(**inputs, out=[bits, apart]) == [bits, apart]
    np.testing.assert_array_equal(bits, c32.view(np.uint32) >> 16)
    np.testing.assert_array_equal(apart, s32)


def test_new_outputs_are_numpy_arrays_when_small_and_64_byte_aligned_when_large(gemm):
    """Without `out=`, a small f32 output is NumPy's own allocation (one
    array, 16-byte aligned: what the tiles' accesses claim), a large one a
    64-byte aligned view (full-line stores); both get their values."""
    _, kernel = gemm
    rng = np.random.default_rng(3)
    small = 4  # 4 x 48 f32: well under SMALL_OUTPUT_BYTES
    large = aligned.SMALL_OUTPUT_BYTES // (48 * 4) + 3
    for m in (small, large, small):
        inputs = _inputs(rng, m)
        _, s = kernel.run(**inputs)
        np.testing.assert_array_equal(s, inputs["x"] + inputs["z"])
        assert s.ctypes.data % cpu.OUT_ALIGNMENT == 0
        if m == small:
            assert s.base is None and s.flags.owndata
        else:
            assert s.nbytes >= aligned.SMALL_OUTPUT_BYTES and aligned.is_aligned(s)
