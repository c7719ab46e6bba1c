"""Packed GGUF weights on the AMX tile unit (`etc.ops.matmul_packed_amx`):
tiles of TILE_CROSSOVER rows or more dequantize 32 columns of the weight
at a time into a bf16 panel and multiply them with the tile's rows of A,
rounded to bf16, by `tdpbf16ps`; fewer rows take the int8 VNNI products
of `MatmulPackedCPU` in the same kernel.

Checked against the widened product (A @ dequantize(W)^T) within the
int8 kernel's bound (`test_matmul_packed.py`: sum_k |w_k| d_a(k) / 2, d_a
the activations' step per block); the rows of tiles on the tile unit also
within bf16's rounding (sum_k |w_k| |x_k| 2^-8) and not equal to the int8
products, the rows of tiles below the crossover (32 rows) equal to the
int8 kernel's emulation. Shapes are ragged: N = 70 (two groups of 32 and
6 columns for the VNNI products), rows 1 to 170 (150: a tile of 128 rows
on the tile unit and one of 22 by VNNI; 170: a second tile of 42, a
partial block of 16), K = 288 (9 blocks of 32) for the 32-value formats
and 512 for all. The tile instructions run emulated in AVX-512 BF16
vector code (`kernels="amx"`) on any CPU with it, and on the tile unit,
at LLVM -O0 and -O2, where the CPU has AMX. (The emulation compiles at
the suite's -O0: at -O2 the nine formats' kernels took a minute.)"""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import packed
from etc.ops.base import Target
from etc.ops.matmul import choose_kernel as choose_packed
from etc.ops.matmul_packed import MatmulPackedCPU
from etc.ops.matmul_packed_amx import MatmulPackedAMX
from etc.reference import evaluate
from etc.runtime import isa

AMX = "x86-64-v4+avx512bf16+amx-tile+amx-bf16"
needs_amx = pytest.mark.skipif(not isa.is_x86_64() or not isa.host_supports(AMX),
                               reason="this x86-64 CPU has no AMX tile unit")
needs_bf16 = pytest.mark.skipif(
    not isa.is_x86_64() or not isa.host_supports("x86-64-v4+avx512bf16+avx512vnni"),
    reason="the AMX emulation needs AVX-512 BF16 (and the int8 products VNNI)")

FORMATS = list(packed.GGML_FORMATS)
N = 70
ROWS = (1, 15, 31, 32, 33, 70, 150, 170)


def _op(k: int, n: int, fmt: str):
    g = etc.Graph("choice")
    x = g.input("x", (g.symbol("T"), k), "f32")
    g.output(g.matmul(x, g.input("w", (n, k), fmt), transpose_b=True))
    (op,) = g._ops
    return op


def test_the_amx_kernel_is_chosen_where_the_instruction_set_has_amx_or_it_is_emulated():
    op = _op(2048, 8192, "q4_k")
    assert choose_packed(op, Target("cpu", workers=2, isa=AMX)) is MatmulPackedAMX
    assert choose_packed(op, Target("cpu", workers=2, isa="x86-64-v4+avx512bf16",
                                    emulate_amx=True)) is MatmulPackedAMX
    assert choose_packed(op, Target("cpu", workers=2, isa="x86-64-v4+avx512vnni")) \
        is MatmulPackedCPU
    # 128-row tiles, fewer where the bf16 panel of A would pass 1 MB.
    assert MatmulPackedAMX.tile_for(op, Target("cpu", workers=2, isa=AMX)) == (128, 1024)
    long_k = _op(8192, 2048, "q4_k")
    assert MatmulPackedAMX.tile_for(long_k, Target("cpu", workers=2, isa=AMX))[0] == 64


def _graph(k: int, formats: list):
    """x (T, k) times a 70 x k weight of each format (q4_k's with a
    residual)."""
    g = etc.Graph("amxq")
    T = g.symbol("T")
    x = g.input("x", (T, k), "f32")
    r = g.input("r", (T, N), "f32")
    outs = [g.matmul(x, g.input(f"w_{fmt}", (N, k), fmt), transpose_b=True,
                     residual=r if fmt == "q4_k" else None, name=f"y_{fmt}")
            for fmt in formats]
    g.output(*outs)
    return g


def _check(got, a, raw, fmt, widened, rows):
    block = packed.activation_block([fmt])
    w = packed.dequantize(raw, fmt).astype(np.float64)
    x = packed.quantize_activations(a, block).astype(np.float64)
    k = a.shape[1]
    steps = np.abs(a.reshape(a.shape[0], -1, block)).max(-1) / 127
    int8_bound = (np.abs(w).reshape(N, -1, block).sum(-1)[None] * steps[:, None]).sum(-1) / 2
    assert np.all(np.abs(got - widened) <= int8_bound * 1.001 + 1e-4), (fmt, rows, k)
    # Which rows the tile unit took: those of tiles of TILE_CROSSOVER rows or more.
    tile = MatmulPackedAMX.ROW_TILE
    in_tile = np.minimum(tile, rows - np.arange(rows) // tile * tile)
    tiled = in_tile >= MatmulPackedAMX.TILE_CROSSOVER
    # The int8 products' emulation.
    scale = np.abs(x) @ np.abs(w).T + 1e-30
    assert (np.abs(got - x @ w.T) / scale)[~tiled].max(initial=0) < 1e-5, (fmt, rows, k)
    # bf16 A and W: 2^-9 of each value, 2^-8 of each product.
    bf16_bound = np.abs(a.astype(np.float64)) @ np.abs(w).T * 2.0**-8
    assert np.all((np.abs(got - widened) <= bf16_bound * 1.001 + 1e-4)[tiled]), (fmt, rows, k)
    # The tile unit's rows are not the int8 products (the kernel took them).
    if tiled.any():
        assert (np.abs(got - x @ w.T) / scale)[tiled].max() > 1e-4, (fmt, rows, k)


def _run_and_check(kernel, g, weights, k, formats):
    run = kernel.partial(**weights)
    for rows in ROWS:
        rng = np.random.default_rng(rows + k)
        a = rng.standard_normal((rows, k)).astype(np.float32)
        a[0, :32] = 0  # a block of zeros
        residual = rng.standard_normal((rows, N)).astype(np.float32)
        got = run.run(x=a, r=residual)
        want = evaluate(g, x=a, r=residual, **weights)
        for fmt, out, ref in zip(formats, got, want):
            if fmt == "q4_k":
                out, ref = out - residual, ref - residual
            _check(out, a, weights[f"w_{fmt}"], fmt, ref.astype(np.float64), rows)


def _weights(k: int, formats: list) -> dict:
    rng = np.random.default_rng(k)
    return {f"w_{fmt}": packed.quantize(rng.standard_normal((N, k)).astype(np.float32), fmt)
            for fmt in formats}


@needs_bf16
@pytest.mark.parametrize("schedule, k, formats", [
    ("static", 512, ["q8_0", "q4_k", "q5_k", "q6_k", "q5_0"]),
    # K = 288: 9 blocks of 32 (a K-quant's block is 256).
    ("dynamic", 288, ["q4_0", "q4_1", "q5_1", "iq4_nl", "mxfp4", "q8_0"])])
def test_emulated_tiles_match_the_widened_product(schedule, k, formats):
    g = _graph(k, formats)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2, kernels="amx")
    assert all(f"matmul_{fmt}_amx" in kernel.ir("graph") for fmt in formats)
    _run_and_check(kernel, g, _weights(k, formats), k, formats)


@needs_amx
@pytest.mark.parametrize("level, schedule, formats", [
    ("0", "static", ["q8_0", "q4_k", "q6_k", "q5_0", "mxfp4"]),
    ("2", "dynamic", ["q4_k", "q8_0", "mxfp4"])])
def test_amx_tiles_match_the_widened_product(level, schedule, formats, monkeypatch):
    """On the tile unit at -O0 (accumulators in stack slots) and -O2."""
    monkeypatch.setenv("ETC_CPU_OPT_LEVEL", level)
    k = 512
    g = _graph(k, formats)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert "amx-bf16" in kernel.abi.isa
    assert all(f"matmul_{fmt}_amx" in kernel.ir("graph") for fmt in formats)
    _run_and_check(kernel, g, _weights(k, formats), k, formats)


@pytest.mark.parametrize("fmt, n, k, most", [
    ("q4_k", 576, 1536, 5000), ("q6_k", 576, 1536, 5000),
    ("q8_0", 1536, 576, 3600), ("q5_0", 1536, 576, 3600)])
def test_packed_amx_tiles_stay_small(fmt, n, k, most):
    """The tile function of a SmolLM2-shaped packed matmul stays under
    `most` lines of graph-stage IR (built for an AMX + VNNI CPU; no JIT):
    its VNNI products are emitted once, not again for the columns past
    the tile unit's groups, a K-quant's single row only as one row, and
    no code for single columns where every count of columns is a
    multiple of 4. (At 4cc5646 they were 32,823, 30,703, 5,682 and 6,960
    lines; 4,238, 4,278, 2,690 and 3,212 after; the LLVM JIT's time grows
    with them: docs/benchmarks.md, "Compile time of a model's step
    kernel".)"""
    g = etc.Graph("size")
    x = g.input("x", (g.symbol("T"), k), "f32")
    g.output(g.matmul(x, g.input("w", (n, k), fmt), transpose_b=True))
    text = str(g.build(target=Target("cpu", workers=2, isa=AMX + "+avx512vnni")))
    start = text.index(f"func.func private @size_tile_matmul_{fmt}_amx_0(")
    lines = text[start:text.index("\n  }\n", start)].count("\n")
    assert 1000 < lines < most, (fmt, lines)
