"""`out=` on the CUDA target's host path, run on the fake driver
(test/python/fake_cuda, whose launches run the CPU build of the same
program): NumPy `out=` arrays follow the CPU target's rules, so one call
works on both targets (a bf16 output's uint16 bit patterns copied from the
device as they are, float32 widened, strided views filled, wrong arrays
refused with the CPU's messages); `bind` refuses NumPy `out=` arrays it
would never fill and `Launch.collect` fills them; `out=` arrays that share
memory are refused on both targets, host and device ones."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.runtime import aligned, cuda, cuda_arrays

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "python" / "fake_cuda"))
import fake_driver  # noqa: E402
from test_cpu_out import _inputs, gemm_graph  # noqa: E402
from test_cuda_fake import use_fake_driver  # noqa: E402

# A uint16 of 0xFFFF is a NaN's upper half: an element the copy missed stays so.
GARBAGE = 0xFFFF


@pytest.fixture(scope="module")
def programs():
    """test_cpu_out's GEMM graph (a bf16 output C, f32 outputs S and D)
    compiled for CUDA, for the fake driver (its CPU build) and for the CPU."""
    g = gemm_graph("out_both", doubled=True)
    kernel = etc.compile(g, target="cuda")
    return (kernel, etc.compile(g, target="cpu", workers=fake_driver.SMS),
            etc.compile(g, target="cpu", workers=2))


@pytest.fixture
def fake(monkeypatch, programs):
    """The CUDA kernel on a new fake driver, and the CPU kernel."""
    kernel, build, cpu = programs
    return kernel, cpu, use_fake_driver(monkeypatch, kernel, build)


def _garbage(shape, dtype) -> np.ndarray:
    array = aligned.empty(shape, dtype)
    array.view(np.uint16).fill(GARBAGE)
    return array


def test_bf16_bits_out_gets_the_device_bits_as_they_are(fake, monkeypatch):
    """A uint16 `out=` array for a bf16 output: the device's bits copied
    straight into it (no host copy to widen), the same bits the CPU target
    writes in place; float32 and strided views get their values too."""
    kernel, cpu, _ = fake
    inputs = _inputs(np.random.default_rng(1), 5)
    c32, s32, d32 = kernel.run(**inputs)
    cpu_bits = _garbage((5, 48), np.uint16)
    cpu.run(**inputs, out={"c": cpu_bits})
    bits, s = _garbage((5, 48), np.uint16), _garbage((5, 48), np.float32)
    # The C-contiguous arrays in the storage dtype take no host copy.
    monkeypatch.setattr(cuda_arrays, "copy_out", lambda *args: pytest.fail(
        "a C-contiguous out= array in the storage dtype went through a host copy"),
        raising=False)
    filled = kernel.run(**inputs, out={"c": bits, "s": s})
    assert filled[0] is bits and filled[1] is s
    np.testing.assert_array_equal(bits, c32.view(np.uint32) >> 16)
    np.testing.assert_array_equal(bits, cpu_bits)
    np.testing.assert_array_equal(s, s32)
    monkeypatch.undo()
    # Strided views, and float32 for the bf16 output: copied through the host.
    wide = np.full((5, 96), np.nan, np.float32)
    narrow = np.full((5, 96), GARBAGE, np.uint16)
    d = np.full((5, 96), np.nan, np.float32)
    kernel.run(**inputs, out=[wide[:, ::2], s, d[:, 1::2]])
    np.testing.assert_array_equal(wide[:, ::2], c32)
    assert np.isnan(wide[:, 1::2]).all()
    np.testing.assert_array_equal(d[:, 1::2], d32)
    kernel.run(**inputs, out={"c": narrow[:, 1::2]})
    np.testing.assert_array_equal(narrow[:, 1::2], bits)
    assert (narrow[:, ::2] == GARBAGE).all()


def _wrong_out(m: int) -> list:
    readonly = np.empty((m, 48), np.uint16)
    readonly.flags.writeable = False
    return [{"c": np.empty((m, 48), np.float16)}, {"s": np.empty((m, 48), np.uint16)},
            {"c": np.empty((m + 1, 48), np.uint16)}, {"c": readonly},
            {"d": np.empty((m, 48), np.float64)}]


def test_wrong_host_out_arrays_get_the_cpu_targets_errors(fake, monkeypatch):
    """The same wrong `out=` arrays raise the same errors, word for word, on
    both targets (and on CUDA before any launch)."""
    kernel, cpu, _ = fake
    inputs = _inputs(np.random.default_rng(2), 4)
    kernel.run(**inputs)  # loaded; the runs below must launch nothing
    monkeypatch.setattr(kernel.runtime, "_launch", lambda *args, **kwargs: pytest.fail(
        "a launch with a wrong out= array"))
    for out in _wrong_out(4):
        with pytest.raises((TypeError, ValueError)) as on_cpu:
            cpu.run(**inputs, out=out)
        with pytest.raises(type(on_cpu.value)) as on_cuda:
            kernel.run(**inputs, out=out)
        assert str(on_cuda.value) == str(on_cpu.value)
        assert f"out[{next(iter(out))!r}]" in str(on_cuda.value)


def test_bind_refuses_host_out_and_collect_fills_it(fake):
    """A bound launch is enqueued any number of times without copies, so a
    NumPy `out=` array given to `bind` would never be filled (it was taken
    and left as it was): refused, naming the output. `Launch.collect`
    copies a launch's outputs into NumPy arrays by the same rules as `run`;
    device arrays bound as `out=` are written in place, bf16 as bits."""
    kernel, _, driver = fake
    inputs = _inputs(np.random.default_rng(3), 6)
    c32, s32, _ = kernel.run(**inputs)
    runtime = kernel.runtime
    with pytest.raises(TypeError, match=r"out\['c'\] is a NumPy array: bind\(\) takes device "
                                        r"arrays for out=.*launch.collect"):
        runtime.bind(inputs, out={"c": np.empty((6, 48), np.float32)})
    device_bits = runtime.device_zeros((6, 48), np.uint16)
    launch = runtime.bind(inputs, out={"c": device_bits})
    launch.enqueue()
    launch.check()
    np.testing.assert_array_equal(device_bits.numpy(), c32.view(np.uint32) >> 16)
    bits, s = _garbage((6, 48), np.uint16), _garbage((6, 48), np.float32)
    wide = np.full((6, 48), np.nan, np.float32)
    assert launch.collect(inputs, {"c": bits, "s": s}) == [bits, s]
    np.testing.assert_array_equal(bits, c32.view(np.uint32) >> 16)
    np.testing.assert_array_equal(s, s32)
    assert launch.collect(inputs, {"c": wide})[0] is wide
    np.testing.assert_array_equal(wide, c32)
    with pytest.raises(TypeError, match=r"out\['c'\] has dtype float16; output 'c' is bf16"):
        launch.collect(inputs, {"c": np.empty((6, 48), np.float16)})


def test_out_arrays_sharing_memory_are_refused_on_both_targets(fake):
    """Two `out=` arrays over the same bytes could hold only one of the two
    outputs after the run: refused naming both, before the run; arrays that
    interleave without sharing an element are not."""
    kernel, cpu, driver = fake
    inputs = _inputs(np.random.default_rng(4), 3)
    _, s32, d32 = cpu.run(**inputs)
    both = aligned.empty((2, 3, 48), np.float32)
    for target in (cpu, kernel):
        for s, d in [(both[0], both[0]), (both[0], both.reshape(6, 48)[1:4])]:
            with pytest.raises(ValueError, match=r"out\['s'\] and out\['d'\] share memory"):
                target.run(**inputs, out={"s": s, "d": d})
        interleaved = np.full((3, 96), np.nan, np.float32)
        target.run(**inputs, out={"s": interleaved[:, ::2], "d": interleaved[:, 1::2]})
        np.testing.assert_array_equal(interleaved[:, ::2], s32)
        np.testing.assert_array_equal(interleaved[:, 1::2], d32)
    # Device arrays: overlapping byte ranges of one allocation.
    runtime = kernel.runtime
    device = runtime.device_zeros((4, 48), np.float32)
    first = cuda.DeviceArray(device.pointer, (3, 48), np.float32)
    second = cuda.DeviceArray(device.pointer + 48 * 4, (3, 48), np.float32)
    with pytest.raises(ValueError, match=r"device out\['s'\] and out\['d'\] share memory"):
        kernel.run(**inputs, out={"s": first, "d": second})
    with pytest.raises(ValueError, match=r"device out\['s'\] and out\['d'\] share memory"):
        runtime.bind(inputs, out={"s": first, "d": second})
    assert driver.fault() is None
