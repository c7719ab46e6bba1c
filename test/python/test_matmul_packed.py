"""Packed weights in the tiles: `matmul` with a `b` in a block format of
`etc.packed` and `embedding` of a packed table, on the CPU target.

The CPU kernel multiplies int8 blocks of quantized activations with the
weight's blocks (`ops/matmul_packed.py`). Each result is checked two ways:
against the product of `etc.packed.quantize_activations(A)` and the
dequantized weight (what the kernel computes, up to float32 rounding:
relative 1e-5 of sum |a||w|), and against the widened reference
(`etc.reference.evaluate`, the dequantized weight times A) within the
activations' rounding bound sum_k |w_k| d(k) / 2. Shapes are ragged: 37
weight rows (not a multiple of the kernel's 4 columns or a tile), 1 to 33
rows of A (not a multiple of its 2), K of 5 blocks of 32.

fp8_e4m3 weights (FP8 checkpoints) are not integers times a scale: the
CPU's f32 matmul tile reads them (`MatmulFp8CPU`), each vector of B
dequantized as it is loaded, and accumulates in f32 as the widened
product does."""

from __future__ import annotations

import os

import numpy as np
import pytest

import etc
from etc import packed
from etc.reference import evaluate

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)


@pytest.fixture(scope="module", autouse=True)
def _int8_kernel():
    """These tests check the int8 products exactly (their emulation to
    1e-5): on a CPU with AMX, whose tiles of 16 rows or more take bf16
    tiles instead (`test_matmul_packed_amx.py`), the host's instruction
    set without AMX."""
    from etc.runtime import isa

    host = isa.host() if isa.is_x86_64() else None
    if host is None or "amx-" not in host or os.environ.get(isa.ENVIRONMENT):
        yield
        return
    level, extensions = isa.parse(host)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(isa.ENVIRONMENT, "+".join(
            [level] + [e for e in extensions if not e.startswith("amx-")]))
        yield

#: The formats of the int8 kernel (the GGML block formats).
FORMATS = list(packed.GGML_FORMATS)
N = 37


def _weights(fmt: str, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return packed.quantize(rng.standard_normal((N, k)).astype(np.float32), fmt)


def _check(got, a, raw, fmt, want_widened):
    """`got` = A @ W^T by the kernel, for W the dequantized `raw` (A
    quantized per 32 values, per 256 for the K-quants)."""
    block = packed.activation_block([fmt])
    w = packed.dequantize(raw, fmt).astype(np.float64)
    x = packed.quantize_activations(a, block).astype(np.float64)
    scale = np.abs(x) @ np.abs(w).T + 1e-30
    assert (np.abs(got - x @ w.T) / scale).max() < 1e-5
    steps = np.abs(a.reshape(a.shape[0], -1, block)).max(-1) / 127  # d per block of A
    bound = (np.abs(w).reshape(N, -1, block).sum(-1)[None] * steps[:, None]).sum(-1) / 2
    assert np.all(np.abs(got - want_widened) <= bound * 1.001 + 1e-4)


@pytest.fixture(scope="module")
def every_format():
    """One graph: x (T, 512) times a 37 x 512 weight of every format, one
    with a residual; compiled once."""
    k = 512
    g = etc.Graph("packed")
    T = g.symbol("T")
    x = g.input("x", (T, k), "f32")
    r = g.input("r", (T, N), "f32")
    outs = []
    for fmt in FORMATS:
        w = g.input(f"w_{fmt}", (N, k), fmt)
        outs.append(g.matmul(x, w, transpose_b=True,
                             residual=r if fmt == "q4_k" else None, name=f"y_{fmt}"))
    g.output(*outs)
    weights = {f"w_{fmt}": _weights(fmt, k, seed) for seed, fmt in enumerate(FORMATS)}
    return g, etc.compile(g, target="cpu", workers=2), weights


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33])
def test_every_format_against_its_emulation_and_the_widened_product(every_format, rows):
    g, kernel, weights = every_format
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 512)).astype(np.float32)
    a[0, :32] = 0  # a block of zeros: scale 0
    residual = rng.standard_normal((rows, N)).astype(np.float32)
    got = kernel.partial(**weights).run(x=a, r=residual)
    want = evaluate(g, x=a, r=residual, **weights)
    for fmt, out, ref in zip(FORMATS, got, want):
        if fmt == "q4_k":
            out, ref = out - residual, ref - residual
        _check(out, a, weights[f"w_{fmt}"], fmt, ref)


def _extreme_blocks(fmt: str, n: int, k: int, seed: int) -> np.ndarray:
    """(n, k) of `fmt` whose blocks' bytes are random but for finite
    scales (float16 0.001 .. 0.06), every third block's quantized bytes
    and scales all set (Q4_K / Q5_K: every scale and minimum 63, every q
    15 or 31; Q6_K: every q 63 and scales -128 and 127 alternating)."""
    f = packed.FORMATS[fmt]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n * k // f.block, f.nbytes), dtype=np.uint8)
    halves = [208] if fmt == "q6_k" else [0, 2]
    for at in halves:
        raw[:, at:at + 2] = rng.uniform(0.001, 0.06, (len(raw), 1)).astype(np.float16) \
            .view(np.uint8)
    full = raw[::3]
    if fmt == "q6_k":
        full[:, :192] = 0xFF
        full[:, 192:208] = np.array([128, 127] * 8, np.uint8)
    else:
        full[:, 4:f.nbytes] = 0xFF
    return raw.reshape(n, -1)


#: K of the extreme-value tests: 3 blocks of 256 (an odd number of 512-bit
#: pairs of steps) and 11 (the panel path's chunks of `CHUNK` = 2048
#: values: 8 and 3 blocks, `partials` carried between them).
EXTREME_KS = (768, 2816)


@pytest.fixture(scope="module", params=["static", "dynamic"])
def k_quants(request):
    """x (T, K) times a 37 x K weight of each K-quant for each K of
    EXTREME_KS, compiled once per schedule."""
    g = etc.Graph("kq")
    T = g.symbol("T")
    formats = packed.K_FORMATS
    outs, weights = [], {}
    for k in EXTREME_KS:
        x = g.input(f"x{k}", (T, k), "f32")
        for seed, fmt in enumerate(formats):
            outs.append(g.matmul(x, g.input(f"w_{fmt}_{k}", (N, k), fmt), transpose_b=True))
            weights[f"w_{fmt}_{k}"] = _extreme_blocks(fmt, N, k, seed + k)
    g.output(*outs)
    kernel = etc.compile(g, target="cpu", workers=2, schedule=request.param)
    return formats, kernel.partial(**weights), weights


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16, 17, 33])
def test_k_quants_integer_scales_at_the_extremes(k_quants, rows):
    """The K-quants' products with their sub-block scales in integers
    (`ops/packed_k_dots.py`: 16-bit pair sums of unsigned weights and
    activations, times 16-bit scales into 32-bit lanes; from 8 rows the
    panel path, K in chunks) equal the emulated product (A quantized per
    256 values) where the integers are largest: weights of every bit
    pattern, blocks with every scale and q at its largest (Q6_K: scales
    -128 and 127), activations all at +-max|x| (every q +-127), single
    outliers per block (the others' q 0 or +-1), and a row of zeros."""
    formats, run, weights = k_quants
    rng = np.random.default_rng(rows)
    inputs = {}
    for k in EXTREME_KS:
        a = rng.standard_normal((rows, k)).astype(np.float32)
        a[0] = np.where(np.arange(k) % 3 == 0, -5.0, 5.0)  # every q -127 or 127
        if rows > 1:
            a[1] = 1e-3 * rng.standard_normal(k)
            a[1, ::256] = 300.0  # one outlier per block of 256
        if rows > 2:
            a[2] = 0.0
        inputs[f"x{k}"] = a
    got = iter(run.run(**inputs))
    for k in EXTREME_KS:
        x = packed.quantize_activations(inputs[f"x{k}"], 256).astype(np.float64)
        for fmt in formats:
            w = packed.dequantize(weights[f"w_{fmt}_{k}"], fmt).astype(np.float64)
            scale = np.abs(x) @ np.abs(w).T + 1e-30
            assert (np.abs(next(got) - x @ w.T) / scale).max() < 1e-5, (fmt, k)


def test_q8_0_with_k_of_five_blocks_and_bf16_activations():
    """K = 160 (5 blocks: not a multiple of 64 or 256), bf16 A and C."""
    k = 160
    g = etc.Graph("q8")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    w = g.input("w", (N, k), "q8_0")
    g.output(g.matmul(x, w, transpose_b=True))
    kernel = etc.compile(g, target="cpu", workers=2)
    raw = _weights("q8_0", k, 3)
    for rows in (1, 6, 33):
        a = etc.reference.round_bf16(np.random.default_rng(rows).standard_normal((rows, k)))
        (got,) = kernel.run(x=a, w=raw)
        # C is rounded to bf16 (half a unit: 2^-9 of it) from the emulated product.
        w_values = packed.dequantize(raw, "q8_0").astype(np.float64)
        emulated = packed.quantize_activations(a).astype(np.float64) @ w_values.T
        scale = np.abs(packed.quantize_activations(a)) @ np.abs(w_values).T
        assert np.all(np.abs(got - emulated) <= np.abs(emulated) * 2**-8 + 1e-5 * scale)


def test_the_plain_vector_and_vnni_paths_equal_avx2(monkeypatch):
    """Compiled for x86-64-v2 (no AVX2) the kernel's int8 products are plain
    vector code, and with VNNI unsigned weights less a zero point: the
    same integers, so the same results."""
    from etc.runtime import isa

    if not isa.host_supports("x86-64-v3"):
        pytest.skip("the host does not run x86-64-v3 (AVX2) code to compare with")
    k = 256
    results = []
    levels = ["x86-64-v3", "x86-64-v2"] + [
        v for v in ("x86-64-v3+avxvnni", "x86-64-v4+avx512vnni") if isa.host_supports(v)]
    for level in levels:
        monkeypatch.setenv("ETC_CPU_ISA", level)
        g = etc.Graph("isa")
        T = g.symbol("T")
        x = g.input("x", (T, k), "f32")
        ws = [g.input(f"w_{fmt}", (N, k), fmt) for fmt in FORMATS]
        g.output(*[g.matmul(x, w, transpose_b=True) for w in ws])
        kernel = etc.compile(g, target="cpu", workers=1)
        assert kernel.abi.isa == level
        a = np.random.default_rng(5).standard_normal((3, k)).astype(np.float32)
        results.append(kernel.run(x=a, **{f"w_{f}": _weights(f, k, 9)
                                          for f in FORMATS}))
    for other in results[1:]:
        for want, got in zip(results[0], other):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("level, products", [
    ("x86-64-v2", []), ("x86-64-v3", ["pmadd.ub.sw"]), ("x86-64-v4", ["pmadd.ub.sw"]),
    ("x86-64-v3+avxvnni", ["vpdpbusd.256"]),
    ("x86-64-v4+avx512bf16+avx512vnni+avxvnni", ["vpdpbusd.256", "vpdpbusd.512"])])
def test_every_instruction_set_takes_its_byte_products(level, products):
    """The kernel's int8 products use the best byte instructions of the
    instruction set it is compiled for, extensions included: AVX-512
    VNNI's `vpdpbusd` on 512-bit vectors (256-bit ones for the rows'
    starting sums), AVX-VNNI's on 256-bit ones, else AVX2's
    `vpmaddubsw`, else plain vector code (the host's set is
    `x86-64-v4+...` on AVX-512 machines: a check of the bare level names
    once sent those to the plain vector code, 1.6x slower decode)."""
    from mlir import ir

    from etc.ops.base import Target

    g = etc.Graph("isa")
    x = g.input("x", (g.symbol("T"), 64), "f32")
    g.output(g.matmul(x, g.input("w", (N, 64), "q8_0"), transpose_b=True))
    text = str(g.build(ir.Context(), target=Target("cpu", workers=1, isa=level)))
    assert "matmul_q8_0_cpu" in text
    found = [p for p in ("pmadd.ub.sw", "vpdpbusd.256", "vpdpbusd.512")
             if f"llvm.x86.avx2.{p}" in text or f"llvm.x86.avx512.{p}" in text]
    assert found == products


def test_embedding_of_packed_tables_equals_dequantize():
    """The embedding gather reads a packed table value by value
    (`ops/packed_loads.py`): rows equal `etc.packed.dequantize` bit for bit
    (f32 rows), rounded once for bf16 rows; ids outside the table give
    zeros. MXFP4 blocks take the extreme scales too."""
    h = 512
    g = etc.Graph("gather")
    T = g.symbol("T")
    ids = g.input("ids", (T,), "i32")
    outs = []
    for fmt in packed.FORMATS:
        table = g.input(f"t_{fmt}", (N, h), fmt)
        outs.append(g.embedding(table, ids, dtype="f32", name=f"e_{fmt}"))
    outs.append(g.embedding(g.input("half", (N, h), "q6_k"), ids, dtype="bf16", name="e_bf16"))
    g.output(*outs)
    tables = {f"t_{fmt}": _weights(fmt, h, 20 + i) for i, fmt in enumerate(packed.FORMATS)}
    tables["half"] = _weights("q6_k", h, 40)
    # MXFP4's scales at their ends: the subnormal 2^-128 and 2^-127, 2^-126
    # and the largest a quantizer writes (2^124), in row 0's first blocks.
    tables["t_mxfp4"][0, 0:4 * 17:17] = [0, 1, 2, packed.MXFP4_LARGEST_E]
    kernel = etc.compile(g, target="cpu", workers=2)
    picked = np.array([0, 36, 5, 5, -1, 37, 17], np.int32)
    got = kernel.run(ids=picked, **tables)
    inside = (picked >= 0) & (picked < N)
    for fmt, rows in zip([*packed.FORMATS, "bf16"], got):
        raw = tables["half"] if fmt == "bf16" else tables[f"t_{fmt}"]
        want = np.zeros((len(picked), h), np.float32)
        want[inside] = packed.dequantize(raw, "q6_k" if fmt == "bf16" else fmt)[picked[inside]]
        if fmt == "bf16":
            want = etc.reference.round_bf16(want)
        np.testing.assert_array_equal(rows.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_fp8_e4m3_in_the_vector_tile_equals_the_widened_product(dtype):
    """An fp8_e4m3 weight on the CPU (`ops/matmul_fp8.py`; no int8
    rounding of A), K = 160 (5 blocks of 32, not a multiple of 128), 37
    rows (edge columns), 1 to 17 rows of A (the dot groups, the panels of
    4 rows and what is left of them; the bf16 blocks of 2 x 8): the widened
    product up to the order of the sums (relative 1e-5 of sum |a||w|),
    plus half a unit of bf16 C. With bf16 A on AVX-512 BF16, tiles of 2
    rows or more take `MatmulFp8DPBF16`, whose weight is the dequantized
    one rounded to bf16 (as a bf16 model widened at load has it)."""
    from etc.ops.base import Target
    from etc.runtime import isa

    k = 160
    g = etc.Graph("fp8")
    x = g.input("x", (g.symbol("T"), k), dtype)
    g.output(g.matmul(x, g.input("w", (N, k), "fp8_e4m3"), transpose_b=True))
    level = isa.chosen()
    dots = dtype == "bf16" and isa.has(level, "avx512bf16")
    text = str(g.build(target=Target("cpu", workers=1, isa=level)))
    assert ("matmul_fp8_e4m3_dpbf16" if dots else "matmul_fp8_e4m3_cpu") in text
    raw = _weights("fp8_e4m3", k, 3)
    w = packed.dequantize(raw, "fp8_e4m3")
    kernel = etc.compile(g, target="cpu", workers=2)
    rng = np.random.default_rng(4)
    for rows in (1, 2, 3, 4, 5, 8, 9, 17):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        (got,) = kernel.run(x=a, w=raw)
        used = etc.reference.round_bf16(w) if dots and rows >= 2 else w
        want = a.astype(np.float64) @ used.T.astype(np.float64)
        scale = np.abs(a) @ np.abs(w).T
        half_unit = np.abs(want) * 2**-8 if dtype == "bf16" else 0
        assert np.all(np.abs(got - want) <= half_unit + 1e-5 * scale), rows
    if dtype == "f32":
        # Rows of the identity pick B's values out: dequantize's, bit for bit.
        (got,) = kernel.run(x=np.eye(k, dtype=np.float32), w=raw)
        np.testing.assert_array_equal(got.T.view(np.uint32), w.view(np.uint32))


def test_fp8_e4m3_dot_blocks_take_k_past_one_panel():
    """K = 12352 (Qwen3-8B's down projection is 12288) is more than the
    old limit of `MatmulFp8DPBF16` (one panel of all of K up to 6144) and
    not a multiple of its chunks (PANEL_K = 1024: 12 whole and a last one
    of 64): the dot blocks still take it (not the f32 dot products), their
    sums carried from chunk to chunk. 2, 3, 17
    and 37 rows (blocks of 2 past the last row; 37 a second tile of 32
    rows) against the product of A and the bf16-rounded weight, with the
    tolerance of the test above; 1 row takes `MatmulFp8CPU` in the same
    kernel."""
    from etc.ops.base import Target
    from etc.runtime import isa

    level = isa.chosen()
    if not isa.has(level, "avx512bf16"):
        pytest.skip("MatmulFp8DPBF16 needs AVX-512 BF16")
    k = 12352
    g = etc.Graph("fp8_long_k")
    x = g.input("x", (g.symbol("T"), k), "bf16")
    g.output(g.matmul(x, g.input("w", (N, k), "fp8_e4m3"), transpose_b=True))
    text = str(g.build(target=Target("cpu", workers=1, isa=level)))
    assert "matmul_fp8_e4m3_dpbf16" in text and "matmul_fp8_e4m3_cpu" not in text
    raw = _weights("fp8_e4m3", k, 5)
    w = packed.dequantize(raw, "fp8_e4m3")
    kernel = etc.compile(g, target="cpu", workers=2)
    rng = np.random.default_rng(6)
    for rows in (1, 2, 3, 17, 37):
        a = etc.reference.round_bf16(rng.standard_normal((rows, k)))
        (got,) = kernel.run(x=a, w=raw)
        used = etc.reference.round_bf16(w) if rows >= 2 else w
        want = a.astype(np.float64) @ used.T.astype(np.float64)
        scale = np.abs(a) @ np.abs(w).T
        assert np.all(np.abs(got - want) <= np.abs(want) * 2**-8 + 1e-5 * scale), rows


def test_packed_tiles_are_wide_and_equal_the_emulation():
    """Packed matmuls take column tiles up to `MatmulPackedCPU.WIDEST`
    wide (every worker the same number, at least two each; `MatmulCPU`'s
    where none divides N so), and such a tile's products equal the
    emulated ones: a 2048-column weight on 2 workers takes 4 tiles of
    512, from the float path at B = 1 to the panels' at B = 9 and 16 (2,
    3, 6 and 7 rows: the last row step of each count of rows left, and
    the K-quants' panels below PANEL_ROWS rows)."""
    from etc.ops.base import Target
    from etc.ops.matmul_cpu import MatmulCPU
    from etc.ops.matmul_packed import MatmulPackedCPU

    def op(n):
        g = etc.Graph("wide")
        g.matmul(g.input("x", (g.symbol("T"), 256), "f32"), g.input("w", (n, 256), "q4_k"),
                 transpose_b=True)
        return g.operations[-1]

    two = Target("cpu", workers=2)
    assert MatmulPackedCPU.tile_for(op(8192), two)[1] == 1024
    assert MatmulPackedCPU.tile_for(op(128256), two)[1] == 384  # 334 tiles; 768: 167
    assert MatmulPackedCPU.tile_for(op(N), two) == MatmulCPU.tile_for(op(N), two)
    n, k = 2048, 512
    g = etc.Graph("wide")
    x = g.input("x", (g.symbol("T"), k), "f32")
    formats = ["q4_k", "q6_k", "q8_0"]
    g.output(*[g.matmul(x, g.input(f"w_{fmt}", (n, k), fmt), transpose_b=True)
               for fmt in formats])
    rng = np.random.default_rng(3)
    weights = {f"w_{fmt}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
               for fmt in formats}
    run = etc.compile(g, target="cpu", workers=2).partial(**weights)
    for rows in (1, 2, 3, 6, 7, 9, 16):
        a = rng.standard_normal((rows, k)).astype(np.float32)
        for fmt, got in zip(formats, run.run(x=a)):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt).astype(np.float64)
            xq = packed.quantize_activations(a, packed.activation_block([fmt])).astype(np.float64)
            scale = np.abs(xq) @ np.abs(w).T + 1e-30
            assert (np.abs(got - xq @ w.T) / scale).max() < 1e-5, (fmt, rows)


def test_packed_inputs_are_checked():
    g = etc.Graph("errors")
    x = g.input("x", (4, 64), "f32")
    with pytest.raises(ValueError, match="q4_k weight is 2-D .N, K., or 3-D .E, N, K. for "
                                         "stacked experts, with K a static multiple of its "
                                         "block of 256"):
        g.input("bad", (8, 64), "q4_k")
    w = g.input("w", (8, 64), "q8_0")
    with pytest.raises(ValueError, match="packed weight, stored by rows.*transpose_b=True"):
        g.matmul(x, w)
    with pytest.raises(ValueError, match="add: operand 'b' .* is a packed weight"):
        g.add(x, w)
    with pytest.raises(ValueError, match="dtype= must name the rows' dtype"):
        g.embedding(w, g.input("ids", (4,), "i32"))
    g = etc.Graph("errors")
    x = g.input("x", (4, 64), "f32")
    w = g.input("w", (8, 64), "q8_0")
    g.output(g.matmul(x, w, transpose_b=True))
    kernel = etc.compile(g, target="cpu", workers=1)
    a = np.ones((4, 64), np.float32)
    with pytest.raises(TypeError, match="input 'w' has dtype float32, expected uint8 .the q8_0 "
                                        "blocks"):
        kernel.run(x=a, w=np.ones((8, 64), np.float32))
    with pytest.raises(ValueError, match=r"input 'w' dim 1 is 64, expected 68 \(shape \(8, 64\), "
                                         r"stored as \(8, 68\) bytes of q8_0 blocks\)"):
        kernel.run(x=a, w=np.zeros((8, 64), np.uint8))
