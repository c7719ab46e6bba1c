"""TMA loads of the Hopper matmul tile (`MatmulWGMMA.tma`, `etc.ops.tma`):
the tile under lane simulation, where each `cp.async.bulk.tensor` is
emulated from its tensor map's fields (stride, dims with zero fill, box,
swizzle) and completes its bytes on the mbarrier's transaction count,
against NumPy at ragged M, N and K; each broken map field, destination
swizzle or expected byte count computing a wrong result (or NaN, for a
phase that would never complete); the driver's rules for a map, applied
by `etc.ops.tma.check` and by the fake driver; the runtime's directory of
maps on the fake driver; and the PTX, which ptxas assembles for sm_90a
with no spills.

No GPU needed: the kit (kit/benchmarks.py, "hopper") times the tile with
TMA beside cp.async and cuBLAS on one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.ops import tma, wgmma
from etc.ops.matmul_wgmma import tma_loads
from etc.runtime import cuda, tensor_maps
from etc.runtime.cuda_tensor_maps import encode_tiled
import test_gpu_wgmma as wgmma_tests
from ptxas_check import assemble, assert_no_spills, needs_ptxas

sys.path.insert(0, str(Path(__file__).resolve().parent / "fake_cuda"))
import fake_driver  # noqa: E402
import fake_tensor_maps  # noqa: E402


@pytest.fixture(autouse=True)
def with_tma():
    with tma_loads():
        yield


def _check(g, dtype, rows_values, seed=3):
    wgmma_tests._check(g, dtype, rows_values, seed=seed)


def _matmul(m, k, n, dtype, tile=None):
    return wgmma_tests._matmul(m, k, n, dtype, tile=tile)


# ----------------------------------------------------------------------
# The tile under lane simulation
# ----------------------------------------------------------------------

# (rows, K, N, tile): five steps round the three-stage ring; K past a
# multiple of 64 by 8 (the last box zero-filled past K), N past the tile
# (B^T's rows zero-filled, columns past N not stored), rows past the
# tile's 64-row blocks; 16 rows and 16 columns (B^T's box padded to 64).
SHAPES = [(70, 320, 64, None), (130, 328, 72, (128, 64)), (16, 136, 40, (64, 16)),
          (200, 200, 144, (192, 128))]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s[:3])) for s in SHAPES])
def test_tma_shapes(shape, dtype):
    m, k, n, tile = shape
    _check(_matmul(m, k, n, dtype, tile=tile), dtype, (m,), seed=m + k + n)


def test_tma_needs_only_whole_16_bytes():
    """With TMA, K and N need only be multiples of 8 (16-byte rows, column
    pairs); without it the tile keeps K a multiple of 64 and N of the tile."""
    g = _matmul(130, 328, 72, "bf16", tile=(128, 64))
    assert wgmma_tests.HOPPER.search(etc.compile(g, target="cpu", kernels="cuda",
                                                 chip="sm_90a", workers=2).ir("graph"))
    with tma_loads(False):
        text = etc.compile(g, target="cpu", kernels="cuda", chip="sm_90a", workers=2).ir("graph")
        assert not wgmma_tests.HOPPER.search(text)


def test_tma_symbolic_rows():
    """The symbolic-rows kernel's ring of 64-byte-swizzled stages (32
    K-columns: 64-row boxes of the 64B maps) and the GEMV for few rows."""
    _check(_matmul(None, 320, 256, "bf16", tile=(128, 128)), "bf16", (5, 100, 130))


# ----------------------------------------------------------------------
# Mutations
# ----------------------------------------------------------------------

RING = (70, 328, 64)


def _fails(monkeypatch, target, name, replacement) -> None:
    monkeypatch.setattr(target, name, replacement)
    with pytest.raises(AssertionError):
        _check(_matmul(*RING, "f16"), "f16", (RING[0],))


@pytest.mark.parametrize("field", ["swizzle", "box", "stride", "rows"])
def test_broken_map_fails(monkeypatch, field):
    """A map whose swizzle (32B), box (32 rows), row stride (16 bytes
    more) or rows (one fewer: the last row zero-filled) is not the
    operand's."""
    right = tma.operand_map

    def broken(rows, cols, dtype, swizzle):
        good = right(rows, cols, dtype, swizzle)
        if field == "swizzle":
            return dataclasses.replace(good, swizzle="32B" if swizzle == "128B" else "128B")
        if field == "box":
            return dataclasses.replace(good, box=(good.box[0], 32))
        if field == "stride":
            return dataclasses.replace(good, stride=good.stride + 16)
        return dataclasses.replace(good, dims=(good.dims[0], good.dims[1] - 1))
    _fails(monkeypatch, tma, "operand_map", broken)


def test_unswizzled_destination_fails(monkeypatch):
    """The TMA unit placing chunks without the swizzle the descriptors read."""
    right = tma.destination
    _fails(monkeypatch, tma, "destination",
           lambda dst, row, chunk, row_bytes, swizzle: right(dst, row, chunk, row_bytes, "none"))


@pytest.mark.parametrize("extra", [16, -16])
def test_wrong_expected_bytes_fail(monkeypatch, extra):
    """A producer expecting 16 bytes more (the phase never completes) or
    fewer (the count goes below zero) than its copies bring: the consumer's
    wait would hang, and the emulation turns the tile into NaN."""
    right = wgmma.Barriers.arrive_expect_tx
    _fails(monkeypatch, wgmma.Barriers, "arrive_expect_tx",
           lambda self, barrier, nbytes: right(self, barrier, nbytes + extra))


# ----------------------------------------------------------------------
# Tensor maps: the driver's rules
# ----------------------------------------------------------------------


def test_operand_maps():
    """128B: boxes of 64 x 64 elements; 64B: 64 rows x 32 columns; the
    row stride in bytes; both pass the driver's rules."""
    wide = tma.operand_map(4096, 512, "bf16", "128B")
    assert (wide.dims, wide.stride, wide.box) == ((512, 4096), 1024, (64, 64))
    narrow = tma.operand_map(5, 320, "f16", "64B")
    assert (narrow.dims, narrow.stride, narrow.box) == ((320, 5), 640, (32, 64))
    for tensor_map in (wide, narrow):
        tma.check(tensor_map, 1 << 20, "bf16")


BROKEN = [("address", dict(), 8, "not 16-byte aligned"),
          ("stride", dict(stride=648), 0, "multiple of 16"),
          ("box rows", dict(box=(64, 257)), 0, r"box rows 257 is not in \[1, 256\]"),
          ("box bytes", dict(box=(12, 64)), 0, "not a multiple of 16"),
          ("swizzle span", dict(swizzle="64B"), 0, "more than the 64B swizzle's span"),
          ("dims", dict(dims=(320, 0)), 0, r"rows\) 0 is not in")]


@pytest.mark.parametrize("what, change, offset, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_map_rules(what, change, offset, message):
    """Each rule of cuTensorMapEncodeTiled, named by `tma.check`, and
    refused by the fake driver with CUDA_ERROR_INVALID_VALUE (the runtime
    calls it only after `check`: here the check is skipped)."""
    good = tma.operand_map(70, 320, "bf16", "128B")
    broken = dataclasses.replace(good, **change)
    address = (1 << 20) + offset
    with pytest.raises(ValueError, match=message):
        tma.check(broken, address, "bf16")
    driver = fake_driver.build({})
    base = int(driver.cuMemAlloc(1 << 20)[1])
    encode_tiled(driver, good, base, "bf16", "x")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tensor_maps, "check", lambda *args: None)
        with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE"):
            encode_tiled(driver, broken, base + offset, "bf16", "x")
    assert "cuTensorMapEncodeTiled" in driver.why()


# ----------------------------------------------------------------------
# The runtime's directory, on the fake driver
# ----------------------------------------------------------------------


def _directory(driver, address: int) -> dict:
    """The maps of the module's directory by key (decoded fake maps)."""
    image = np.frombuffer(ctypes.string_at(address, tma.DIRECTORY_BYTES), np.uint8)
    keys = image[tma.SLOTS * tma.MAP_BYTES:].view(np.uint64)
    maps = image[:tma.SLOTS * tma.MAP_BYTES].view(np.uint64).reshape(tma.SLOTS, 16)
    return {int(keys[s]): fake_tensor_maps.decode(maps[s]) for s in np.nonzero(keys)[0]}


def _lookup(entries_by_slot: dict, key: int) -> int:
    """The slot the kernel's probe (`tma.lookup`) stops at for `key`."""
    slot = tma.probe_start(key)
    while entries_by_slot.get(slot, key) != key:
        slot = (slot + 1) % tma.SLOTS
    return slot


def test_runtime_directory(monkeypatch):
    """A run and two bound launches on the fake driver: each copies the
    maps of its own buffers (both swizzles, the operand's dims, stride and
    box, bf16) into the module's directory before its worker, at the slot
    the kernel's probe finds them; the result is the product."""
    g = etc.Graph("mm")
    # f16: the CPU build the fake driver runs then has no AMX tiles.
    x = g.input("x", (130, 320), "f16")
    w = g.input("w", (64, 320), "f16")
    g.output(g.matmul(x, w, transpose_b=True))
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    assert "cp.async.bulk.tensor" in kernel.ptx
    cpu = etc.compile(g, target="cpu", workers=fake_driver.SMS)
    driver = fake_driver.build({hashlib.sha256(kernel.ptx.encode()).hexdigest(): cpu})
    monkeypatch.setattr(cuda, "_driver", lambda: driver)
    rng = np.random.default_rng(0)
    runtime = kernel.runtime

    def expect(buffers):
        directory = _directory(driver, runtime._tensor_maps.address)
        for name, rows in (("x", 130), ("w", 64)):
            for mode, box_cols in (("128B", 64), ("64B", 32)):
                key = tma.key(buffers[name].pointer, mode)
                fields = directory[key]
                assert (fields["dim0"], fields["dim1"], fields["stride0"]) == (320, rows, 640)
                assert (fields["box0"], fields["box1"]) == (box_cols, 64)
                assert fields["swizzle"] == tma.SWIZZLE[mode] and fields["dtype"] == 6
                assert fields["address"] == buffers[name].pointer

    inputs = {"x": rng.standard_normal((130, 320)).astype(np.float16),
              "w": rng.standard_normal((64, 320)).astype(np.float16)}
    got = kernel.run(**inputs)[0]
    np.testing.assert_allclose(got, etc.reference.evaluate(g, **inputs)[0], atol=0.1, rtol=1e-2)
    expect({name: runtime._workspace({}).staging[name] for name in ("x", "w")})
    launches = []
    for seed in (1, 2):
        arrays = {name: runtime.device_array(
            np.random.default_rng(seed).standard_normal(shape).astype(np.float16))
            for name, shape in (("x", (130, 320)), ("w", (64, 320)))}
        launches.append((runtime.bind(arrays), arrays))
    for launch, arrays in launches:
        launch.enqueue()
        launch.check()
        expect(arrays)
    # The probe from each key's start finds it (the slots hold no other key
    # first that the kernel would stop at).
    directory = _directory(driver, runtime._tensor_maps.address)
    image = np.frombuffer(ctypes.string_at(runtime._tensor_maps.address, tma.DIRECTORY_BYTES),
                          np.uint8)[tma.SLOTS * tma.MAP_BYTES:].view(np.uint64)
    by_slot = {int(s): int(image[s]) for s in np.nonzero(image)[0]}
    for key in directory:
        assert by_slot[_lookup(by_slot, key)] == key


def test_program_without_tma_has_no_directory(monkeypatch):
    """cp.async tiles: no directory global, nothing encoded or copied."""
    with tma_loads(False):
        g = _matmul(64, 128, 64, "bf16")
        kernel = etc.compile(g, target="cuda", chip="sm_90a")
    assert tma.DIRECTORY not in kernel.ptx and ".version 8.0" in kernel.ptx


# ----------------------------------------------------------------------
# PTX
# ----------------------------------------------------------------------


@needs_ptxas
@pytest.mark.parametrize("rows", ["known", "symbolic"])
def test_tma_ptx(tmp_path, rows):
    """The producer lane's map lookup (the directory global, the
    tensor-map proxy's acquire), expect_tx and 2-D bulk tensor copies into
    shared memory completing on the mbarrier, and no cp.async; ptxas
    assembles it for sm_90a with no spills or stack; known rows inline
    their wgmma unserialised."""
    g = etc.Graph("gemm")
    batch = g.symbol("B") if rows == "symbolic" else 512
    for dtype in ("f16", "bf16"):
        x = g.input(f"x_{dtype}", (batch, 512), dtype)
        wt = g.input(f"wt_{dtype}", (1024, 512), dtype)
        g.output(g.matmul(x, wt, transpose_b=True))
    ptx = etc.compile(g, target="cuda", chip="sm_90a").ptx
    assert ".version 8.3" in ptx
    for instruction in (f".global .align 128 .b8 {tma.DIRECTORY}[{tma.DIRECTORY_BYTES}]",
                        "fence.proxy.tensormap::generic.acquire.sys",
                        "mbarrier.arrive.expect_tx.shared.b64",
                        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::"
                        "complete_tx::bytes", "mbarrier.try_wait.parity.shared.b64"):
        assert instruction in ptx, instruction
    assert not re.search(r"cp\.async\.(cg|ca)\.shared\.global", ptx)
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert_no_spills(report, stack=True)
    if rows == "known":
        assert "C7510" not in report, report
