"""The GPU kernels for packed weights, without a GPU: `MatmulPackedGPU` (the
GEMV) and `MatmulPackedMMA` (tensor cores from 16 rows) for every block
format under the CPU lane simulation (`kernels="cuda"`), against the
widened reference, at ragged shapes; both read whole blocks' quants in
16-byte loads from the GPU layout (`etc.packed.to_gpu_layout`, made once
as a weight is uploaded: checked here on the fake CUDA driver). The PTX
of real-width packed step graphs
(every shape of `etc.models.testing.SHAPES`, their matrices and stacks of
experts in the packed formats in turn) is assembled by ptxas for sm_80
and sm_90a with no spills in test_model_ptx.py; the packed MoE tiles'
numerics under the lane simulation are in test_moe_packed.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc import packed
from etc.reference import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent / "fake_cuda"))
import fake_driver  # noqa: E402
from ptxas_check import assemble, assert_no_spills, needs_ptxas  # noqa: E402
from test_cuda_fake import use_fake_driver  # noqa: E402

FORMATS = list(packed.FORMATS)


def _every_format(k: int, n: int, chip: str, tile=None, seed: int = 0):
    """x (T, k) bf16 times a (n, k) weight in each format; the graph (whose
    tiles, checked here, are the packed GEMV paired with the tensor cores),
    its lane-simulated CPU kernel, the weights and a generator."""
    g = etc.Graph("gpu")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    g.output(*[g.matmul(x, g.input(f"w_{fmt}", (n, k), fmt), transpose_b=True, tile=tile,
                        name=f"y_{fmt}") for fmt in FORMATS])
    module = str(g.build(target=etc.ops.Target(kind="cuda", chip=chip)))
    assert set(re.findall(r"@gpu_tile_(matmul_\w+?)_\d+\(", module)) == \
        {f"matmul_{fmt}_gemv_mma" for fmt in FORMATS}
    rng = np.random.default_rng(seed)
    weights = {f"w_{fmt}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
               for fmt in FORMATS}
    return g, etc.compile(g, target="cpu", kernels="cuda", workers=2), weights, rng


def test_every_format_under_the_lane_simulation():
    """Each value is dequantized in registers and accumulated in f32, as
    the widened product is: only the order of the sums differs (relative
    1e-5 of sum |a||w|). 40 weight rows (a tile of 8 columns: 4 warps,
    two rows of B^T each), every decode batch 1 to 15 (passes of 4, the
    one-row pass, and the rows left of a pass); K = 1536: 48 chunks of 32
    values (lanes 0-15 take two), 24 K-quant chunks of 64."""
    k = 1536
    g, kernel, weights, rng = _every_format(k, 40, "sm_90a")
    for rows in range(1, 16):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        got = kernel.run(x=a, **weights)
        want = evaluate(g, x=a, **weights)
        for fmt, out, ref in zip(FORMATS, got, want):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            scale = np.abs(a) @ np.abs(w).T
            # C and the reference are bf16, each rounded from f32 sums in
            # another order: a unit of it apart at most, plus that order.
            assert np.all(np.abs(out - ref) <= np.abs(ref) * 2**-7 + 1e-5 * scale), fmt


def test_every_format_on_the_tensor_cores_under_the_lane_simulation():
    """Tiles of 16 rows or more dequantize B^T into the shared tile, rounded
    to A's dtype, and multiply on the (emulated) tensor cores: C = A @
    round(W)^T up to the order of the sums; a tile's rows below 16 take the
    GEMV (f32 weights). Row tiles of 32: 16 rows (one tile on the tensor
    cores, its rows past the matrix never stored), 33 (32 + a GEMV row), 50
    (32 + 18), 70 (32 + 32 + 6); K = 3 x 256 (three of the K-quants' 256-value
    blocks) and 96 columns in tiles of 8, so every chunk of 8 values of a
    block is read."""
    k = 768
    _, kernel, weights, rng = _every_format(k, 96, "sm_80", tile=(32, 8), seed=1)
    for rows in (16, 33, 50, 70):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        # Which rows the tensor cores computed: those of tiles of >= 16 rows.
        wide = np.array([min(32, rows - r // 32 * 32) >= 16 for r in range(rows)])
        got = kernel.run(x=a, **weights)
        for fmt, out in zip(FORMATS, got):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            want = np.where(wide[:, None], a @ etc.reference.round_bf16(w).T, a @ w.T)
            scale = np.abs(a) @ np.abs(w).T
            assert np.all(np.abs(out - want) <= np.abs(want) * 2**-8 + 1e-5 * scale), \
                (fmt, rows)


def test_every_format_with_a_ragged_last_tile_under_the_lane_simulation():
    """Rows of B^T that no tile width divides (as Granite 3.x's 49,159-token
    LM head): 7 (one tile of 8) and 33 (4 tiles of 8 and one row). The
    packed GEMV takes every batch, 1 to 17 (the tensor cores need whole
    column tiles), its rows past N reading row N - 1, unstored; K = 256
    (one K-quant block)."""
    k = 256
    g = etc.Graph("gpu_odd")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    shapes = [(fmt, n) for fmt in FORMATS for n in (7, 33)]
    g.output(*[g.matmul(x, g.input(f"w_{fmt}_{n}", (n, k), fmt), transpose_b=True,
                        name=f"y_{fmt}_{n}") for fmt, n in shapes])
    module = str(g.build(target=etc.ops.Target(kind="cuda", chip="sm_90a")))
    assert set(re.findall(r"@gpu_odd_tile_(matmul_\w+?)_\d+\(", module)) == \
        {f"matmul_{fmt}_gemv" for fmt in FORMATS}
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    rng = np.random.default_rng(8)
    weights = {f"w_{fmt}_{n}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32),
                                               fmt) for fmt, n in shapes}
    for rows in range(1, 18):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        got = kernel.run(x=a, **weights)
        for (fmt, n), out in zip(shapes, got):
            w = packed.dequantize(weights[f"w_{fmt}_{n}"], fmt)
            want = a @ w.T
            assert out.shape == (rows, n)
            assert np.all(np.abs(out - want) <= np.abs(want) * 2**-7 + 1e-5 *
                          (np.abs(a) @ np.abs(w).T)), (fmt, n, rows)


def test_the_gpu_layout_is_a_permutation_with_aligned_quants():
    """`to_gpu_layout` keeps the storage's shape and bytes (a permutation:
    `from_gpu_layout` undoes it) and puts every block's quants at a
    multiple of 16 bytes, each other field at a multiple of its size;
    q4_k and q5_k keep the GGUF layout. A stack of 3 x 5 rows of 512."""
    rng = np.random.default_rng(2)
    for fmt in FORMATS:
        raw = packed.quantize(rng.standard_normal((3, 5, 512)).astype(np.float32), fmt)
        gpu = packed.to_gpu_layout(raw, fmt)
        assert gpu.shape == raw.shape and gpu.dtype == np.uint8
        np.testing.assert_array_equal(packed.from_gpu_layout(gpu, fmt), raw)
        if not packed.gpu_repacked(fmt):
            np.testing.assert_array_equal(gpu, raw)
            assert packed.FORMATS[fmt].nbytes % 16 == 0
            continue
        f = packed.FORMATS[fmt]
        count = raw.size // f.nbytes
        blocks = raw.reshape(count, f.nbytes)
        flat = gpu.reshape(-1)
        for first, size in packed.GPU_FIELDS[fmt]:
            before, got_size, got_first = packed.gpu_field_offset(fmt, first + size - 1)
            assert (got_size, got_first) == (size, first)
            assert (count * before) % (16 if before == 0 else size) == 0, (fmt, first)
            for b in (0, 1, count - 1):
                at = count * before + b * size
                np.testing.assert_array_equal(flat[at:at + size], blocks[b, first:first + size])
        assert packed.GPU_FIELDS[fmt][0][1] % 16 == 0  # the quants first, 16-byte multiples
    with pytest.raises(ValueError, match="q8_0 storage must be uint8 rows of whole 34-byte"):
        packed.to_gpu_layout(np.zeros((2, 33), np.uint8), "q8_0")
    with pytest.raises(ValueError, match="unknown packed format 'q3_k'"):
        packed.to_gpu_layout(np.zeros((2, 34), np.uint8), "q3_k")


def _shift_scales(raw, dtype):
    """A wrong GPU layout: the last field (the scale d, or fp8's float32
    scale, q4_1 / q5_1's d and m) of every block taken from the next block."""
    gpu = packed.to_gpu_layout(raw, dtype)
    if not packed.gpu_repacked(dtype):
        return gpu
    count = raw.size // packed.FORMATS[dtype].nbytes
    size = packed.GPU_FIELDS[dtype][-1][1]
    flat = gpu.reshape(-1).copy()
    tail = flat[flat.size - count * size:].reshape(count, size)
    flat[flat.size - count * size:] = np.roll(tail, -1, axis=0).reshape(-1)
    return flat.reshape(raw.shape)


def test_a_wrongly_repacked_weight_fails(monkeypatch):
    """The kernels read the layout `to_gpu_layout` makes: with the scales of
    the repacked copy shifted by one block, or with no repacking at all,
    every repacked format's product leaves the tolerance of the first test
    (which the right layout meets), at one row (the GEMV) and 16 (the
    tensor cores)."""
    from etc.runtime import cpu

    k = 512
    g, kernel, weights, rng = _every_format(k, 40, "sm_80", seed=3)
    for wrong in (_shift_scales, lambda raw, dtype: np.ascontiguousarray(raw)):
        monkeypatch.setattr(cpu, "to_gpu_layout", wrong)
        for rows in (1, 16):
            a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
            got = kernel.run(x=a, **weights)
            for fmt, out in zip(FORMATS, got):
                w = packed.dequantize(weights[f"w_{fmt}"], fmt)
                want = a @ (w if rows < 16 else etc.reference.round_bf16(w)).T
                close = np.all(np.abs(out - want) <= np.abs(want) * 2**-8 + 1e-5 *
                               (np.abs(a) @ np.abs(w).T))
                assert close != packed.gpu_repacked(fmt), (fmt, rows)


def test_the_upload_repacks_once_on_the_fake_driver(monkeypatch):
    """`device_array(blocks, dtype=...)` repacks a weight's GGUF blocks once
    and records it; runs with that device array repack nothing more and
    equal the run on the host blocks (repacked at each bind) and the
    reference. A device copy of the GGUF bytes (no dtype) is refused for a
    repacked format. The fake driver runs the lane-simulated CPU build of
    the same graph on the bytes the runtime copied."""
    from etc.runtime import cuda

    g = etc.Graph("packed_up")
    T = g.symbol("T")
    x = g.input("x", (T, 512), "bf16")
    g.output(g.matmul(x, g.input("w", (16, 512), "q6_k"), transpose_b=True, name="y6"),
             g.matmul(x, g.input("v", (16, 512), "q8_0"), transpose_b=True, name="y8"))
    kernel = etc.compile(g, target="cuda", schedule="static")
    build = etc.compile(g, target="cpu", kernels="cuda", workers=fake_driver.SMS,
                        schedule="static")
    use_fake_driver(monkeypatch, kernel, build)
    rng = np.random.default_rng(5)
    w = packed.quantize(rng.standard_normal((16, 512)).astype(np.float32), "q6_k")
    v = packed.quantize(rng.standard_normal((16, 512)).astype(np.float32), "q8_0")
    calls = []
    real = cuda.to_gpu_layout
    monkeypatch.setattr(cuda, "to_gpu_layout", lambda raw, dtype: calls.append(dtype) or
                        real(raw, dtype))
    w_device = kernel.runtime.device_array(w, dtype="q6_k")
    v_device = kernel.runtime.device_array(v, dtype="q8_0")
    assert calls == ["q6_k", "q8_0"]
    assert w_device.packed_layout == ("q6_k", "gpu")
    np.testing.assert_array_equal(w_device.numpy(), packed.to_gpu_layout(w, "q6_k"))
    for rows in (1, 3, 16):
        a = etc.reference.round_bf16(rng.standard_normal((rows, 512)))
        on_device = kernel.run(x=a, w=w_device, v=v_device)
        assert calls == ["q6_k", "q8_0"]
        on_host = kernel.run(x=a, w=w, v=v)
        assert calls[2:] == ["q6_k", "q8_0"]
        del calls[2:]
        want = evaluate(g, x=a, w=w, v=v)
        for got, host, ref in zip(on_device, on_host, want):
            np.testing.assert_array_equal(got, host)
            np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    with pytest.raises(TypeError, match=r"input 'w' \(q6_k\) is read by the GPU kernels in the "
                       r"GPU layout.*device_array\(blocks, dtype='q6_k'\), got a device array "
                       r"\(DeviceArray\) not repacked"):
        kernel.run(x=a, w=kernel.runtime.device_array(w), v=v_device)
    with pytest.raises(TypeError, match="got a device array repacked for q8_0"):
        kernel.run(x=a, w=v_device, v=v_device)


def test_the_fake_driver_gives_a_native_cpu_build_the_gguf_bytes(monkeypatch):
    """A CPU build of native kernels standing in for the CUDA program (the
    GPU kit's fake-driver run) reads GGUF blocks: the fake driver undoes
    the GPU layout of a repacked input while its worker runs and puts it
    back after, so the product matches the reference and the device copy
    is unchanged."""
    g = etc.Graph("packed_native")
    T = g.symbol("T")
    g.output(g.matmul(g.input("x", (T, 256), "bf16"), g.input("w", (24, 256), "q8_0"),
                      transpose_b=True))
    kernel = etc.compile(g, target="cuda", schedule="static")
    use_fake_driver(monkeypatch, kernel, etc.compile(g, target="cpu", workers=fake_driver.SMS,
                                                     schedule="static"))
    rng = np.random.default_rng(6)
    w = packed.quantize(rng.standard_normal((24, 256)).astype(np.float32), "q8_0")
    device = kernel.runtime.device_array(w, dtype="q8_0")
    a = etc.reference.round_bf16(rng.standard_normal((3, 256)))
    got = kernel.run(x=a, w=device)[0]
    # The CPU's int8 products: A's blocks quantized (`quantize_activations`).
    weights = packed.dequantize(w, "q8_0")
    want = packed.quantize_activations(a) @ weights.T
    assert np.all(np.abs(got - want) <= np.abs(want) * 2**-8 + 1e-5 * (np.abs(a) @ np.abs(
        weights).T)), np.abs(got - want).max()
    np.testing.assert_array_equal(device.numpy(), packed.to_gpu_layout(w, "q8_0"))


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_mxfp4_moe_tiles_assemble_without_spills(chip, tmp_path):
    """A step's layer as llama.cpp's MXFP4_MOE files hold it, at
    Qwen3-30B-A3B's widths: the attention output projection in q8_0 and
    the stacks of experts in mxfp4 (128 experts, 8 per token, H 2048, F
    768), each stack's rows of 17-byte blocks read in 16-byte loads from
    the GPU layout with the scale byte beside them: ptxas assembles the
    packed GEMV, the tensor cores' dequantization and the MoE tiles with
    no spills. (test_model_ptx.py's mixed step graphs give every format,
    MXFP4 too, a weight of a real-width model.)"""
    h, f, e = 2048, 768, 128
    g = etc.Graph("mxfp4")
    T = g.symbol("T")
    x = g.input("x", (T, h), "bf16")
    y = g.matmul(x, g.input("wo", (h, h), "q8_0"), transpose_b=True)
    y = g.matmul(y, g.input("w", (h, h), "mxfp4"), transpose_b=True)
    out = g.moe(y, g.input("router", (h, e), "bf16"), g.input("gate", (e, f, h), "mxfp4"),
                g.input("down", (e, h, f), "mxfp4"), 8, w_up=g.input("up", (e, f, h), "mxfp4"),
                transpose_w=True, name="out")
    g.output(out)
    kernel = etc.compile(g, target="cuda", chip=chip)
    kinds = set(re.findall(r"_tile_(\w+?)_\d+\(", kernel.ir("graph")))
    assert {"matmul_mxfp4_gemv_mma", "matmul_q8_0_gemv_mma", "moe_up", "moe_down"} <= kinds
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, "mxfp4"))
