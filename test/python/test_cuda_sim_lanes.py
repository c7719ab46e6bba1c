"""Every CUDA tile family at other lane counts than 128, under the lane
simulation, against NumPy: `etc.compile(g, target="cpu", kernels="cuda",
lanes=N)` builds the tiles for N threads per worker CTA (`Target.lanes`)
and runs the N lanes one after another, so a tile that assumes 128 lanes
(a hard-coded 128, a reduction group, a scratch size, warps per CTA) gives
wrong numbers here without a GPU. 128 is covered by the families' own
modules (test_gpu_*.py, test_attention.py, test_sampling.py, ...).

The counts: 256 (two warpgroups, what the warp-specialised Hopper tile
needs) and 96 (3 warps: not a power of two, and below 128 lanes, where a
tile that assumes 4 warps skips work) for every family; since
`etc.compile` accepts any multiple of 32, every accepted count from 32 to
1,024 on one graph of the tiles whose work split depends on the warps.
Which tile each task gets is asserted: a change that makes a family fall
back to another tile at some count fails here, not silently. Also the
whole small model (`etc.models.load(..., lanes=)`): its logits, ids and
caches at 256 and 96 lanes are those at 128, its tiles those of 128 but
for wgmma.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import etc
import etc.models as models
from etc import bfloat16, packed
from etc.models.testing import tiny_config, write_checkpoint
from etc.ops.base import Lanes, LaneValues
from etc.ops.matmul_wgmma import tma_loads, warp_specialised
from etc.reference import round_bf16
import test_attention as attention_tests
import test_paged_attention as paged_tests
import test_sampling as sampling_tests
from ptxas_check import assemble, assert_no_spills, needs_ptxas
from test_llm_ops import _batch

#: Two warpgroups (8 warps), and 3 warps: not a power of two, and fewer
#: than 128 lanes (a tile that assumes 4 warps skips work there, where at
#: more lanes its extra warps would only repeat the first four's). The
#: sweep runs every other count on the tiles whose split depends on them.
LANES = [256, 96]


def _compile(g: etc.Graph, lanes: int, **options):
    options = {"workers": 2, **options}
    return etc.compile(g, target="cpu", kernels="cuda", lanes=lanes, **options)


def _tiles(kernel) -> dict:
    """Task name -> the tile kernel it calls (`matmul_gemv_t`, ...)."""
    text = kernel.ir("graph")
    name = kernel.graph.name
    found = {}
    for task, body in re.findall(r'event\.task "(\w+)"(.*?)\n    \}', text, re.S):
        calls = re.findall(rf"func\.call @{name}_tile_(\w+?)_\d+\(", body)
        found[task] = calls[0] if len(calls) == 1 else tuple(calls)
    return found


def _close(got, want, tol: float, label: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=label)


def _random(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    value = (rng.standard_normal(shape) * scale).astype(np.float32)
    if dtype == "f16":
        return value.astype(np.float16)
    return round_bf16(value) if dtype == "bf16" else value


def _check_rows(g: etc.Graph, kernel, dtype: str, rows_values, tol: float, seed: int = 0,
                exact: tuple = ()) -> None:
    """`kernel` against the reference for inputs of each row count (the
    symbol "B"); outputs named in `exact` must be equal."""
    rng = np.random.default_rng(seed)
    for rows in rows_values:
        inputs = {}
        for arg in g.arguments:
            if arg.kind == "input":
                shape = tuple(rows if d == "B" else d for d in arg.shape)
                inputs[arg.name] = _random(rng, shape, dtype, 1.0 if shape[0] == rows else 0.1)
        got = kernel.run(**inputs)
        want = etc.reference.evaluate(g, **inputs)
        for name, a, b in zip(g.outputs, got, want):
            if name in exact:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} at B={rows}")
            else:
                _close(a, b, tol, f"{name} at B={rows}")


# ----------------------------------------------------------------------
# The dense tiles: GEMVs (both layouts of B), the tensor cores' row tiles,
# rowwise, elementwise, top-k
# ----------------------------------------------------------------------


def _dense(dtype: str) -> etc.Graph:
    """x·W (B (K, N), K = 2048: more chunks of K than the lanes' K groups,
    so each group takes several) and x·Wᵀ (B (N, K), K = 1000 in f32: not
    a multiple of the warp's chunks), norms and softmax over rows of 96
    (streamed) and 1024 (held in registers), elementwise, top-k: a
    symbolic row count."""
    g = etc.Graph("dense")
    B = g.symbol("B")
    k_t = 1000 if dtype == "f32" else 256
    x = g.input("x", (B, 2048), dtype)
    xt = g.input("xt", (B, k_t), dtype)
    wide = g.input("wide", (B, 1024), dtype)
    narrow = g.input("narrow", (B, 96), dtype)
    w = g.input("w", (2048, 256), dtype)
    wt = g.input("wt", (64, k_t), dtype)
    nw = g.input("nw", (1024,), dtype)
    b = g.input("b", (96,), dtype)
    g.output(g.matmul(x, w, name="gemv"), g.matmul(xt, wt, transpose_b=True, name="gemv_t"),
             g.rmsnorm(wide, nw, name="norm"), g.softmax(narrow, name="softmax"),
             g.sum(wide, name="sum"), g.silu(narrow, name="silu"),
             g.mul(b, narrow, name="mul"), g.gelu(narrow, name="gelu"))
    values, indices = g.topk(narrow, 5, name="topk")
    g.output(values, indices)
    return g


#: The tile of each task, the same at every count of `LANES`: f32 matmuls
#: take the GEMVs, bf16 ones with K a multiple of 16 the tensor cores
#: paired with a GEMV for tiles of few rows (sm_90a's wgmma needs 128
#: lanes; at 96 the transposed GEMV's last row group is partial).
ROWWISE = {"rmsnorm_0": "rmsnorm_gpu", "softmax_0": "softmax_gpu", "sum_0": "sum_gpu",
           "silu_0": "silu_gpu", "mul_0": "mul_gpu", "gelu_0": "gelu_gpu", "topk_0": "topk_gpu"}
CHOICE = {"f32": {"matmul_0": "matmul_gemv", "matmul_1": "matmul_gemv_t", **ROWWISE},
          "bf16": {"matmul_0": "matmul_gemv_mma", "matmul_1": "matmul_gemv_t_mma", **ROWWISE}}


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_dense_tiles(lanes, dtype):
    """Row counts 1 (the one-row pass), 5, 16 (one tensor-core tile in
    bf16) and 37 (a tile of 32 and one of 5)."""
    g = _dense(dtype)
    kernel = _compile(g, lanes)
    assert _tiles(kernel) == CHOICE[dtype]
    _check_rows(g, kernel, dtype, (1, 5, 16, 37), 1e-4 if dtype == "f32" else 2e-2,
                seed=lanes, exact=("topk_indices",))


@needs_ptxas
@pytest.mark.parametrize("lanes, chip", [(96, "sm_80"), (256, "sm_90a")])
def test_dense_ptx(lanes, chip, tmp_path):
    """The same tiles compiled for the GPU (the transposed GEMV's partial
    last row group at 3 warps): the worker carries `.maxntid lanes` and
    ptxas assembles everything without spills."""
    kernel = etc.compile(_dense("bf16"), target="cuda", chip=chip, lanes=lanes)
    assert _tiles(kernel) == CHOICE["bf16"]
    assert re.search(rf"\.entry dense_worker\([^)]*\)\s*\.maxntid {lanes}, 1, 1", kernel.ptx)
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, "dense"))


@pytest.mark.parametrize("kind, group, stride", [("add", 64, 1), ("add", 16, 4),
                                                  ("maxnumf", 3, 1), ("min", 2, 1)])
def test_simulated_reductions_stay_within_a_warp(kind, group, stride):
    """The simulation could combine any lanes, the GPU's shuffles only a
    warp's: `Lanes.reduce` refuses the others in both (at 256 lanes a
    group of 64 would otherwise pass here and fail on the GPU)."""
    lanes = Lanes(None, 256, 32, simulate=True)
    with pytest.raises(ValueError, match=r"lanes: reduce\(.*within a warp of 32"):
        lanes.reduce(LaneValues([]), kind, group, stride)


# ----------------------------------------------------------------------
# MatmulMMA at ragged shapes, and the choice against wgmma
# ----------------------------------------------------------------------


def _mma() -> etc.Graph:
    """Known rows not a multiple of 16, K a multiple of 16 but not 32, N
    of 16-column tiles, both layouts of B, a user tile with four warps'
    worth of rows."""
    g = etc.Graph("mma")
    a = g.input("a", (23, 48), "f16")
    b = g.input("b", (48, 80), "f16")
    c = g.input("c", (50, 160), "bf16")
    ct = g.input("ct", (32, 160), "bf16")
    d = g.input("d", (100, 64), "f16")
    dt = g.input("dt", (384, 64), "f16")
    g.output(g.matmul(a, b, name="mma_b"), g.matmul(c, ct, transpose_b=True, name="mma_bt"),
             g.matmul(d, dt, transpose_b=True, tile=(64, 32), name="mma_tile"))
    return g


@pytest.mark.parametrize("lanes", LANES)
def test_mma_ragged_shapes(lanes):
    g = _mma()
    kernel = _compile(g, lanes, chip="sm_80")
    assert set(_tiles(kernel).values()) == {"matmul_mma"}
    rng = np.random.default_rng(lanes)
    inputs = {arg.name: _random(rng, arg.shape, arg.dtype, 1.0 if arg.name in ("a", "c", "d") else 0.1)
              for arg in g.arguments if arg.kind == "input"}
    for name, got, want in zip(g.outputs, kernel.run(**inputs),
                               etc.reference.evaluate(g, **inputs)):
        _close(got, want, 2e-2, name)


def _hopper() -> etc.Graph:
    g = etc.Graph("hopper")
    x = g.input("x", (70, 128), "bf16")
    w = g.input("w", (96, 128), "bf16")
    g.output(g.matmul(x, w, transpose_b=True, name="y"))
    return g


def test_hopper_tile_choice_by_lanes():
    """On sm_90a, bf16 A·Bᵀ with K a multiple of 64 takes wgmma at 128
    lanes; its one-warpgroup tile needs exactly 128 lanes, so at 256 the
    matmul takes `MatmulMMA` (and is right); the warp-specialised variant
    (TMA, 256 lanes, min_ctas) takes wgmma at 256 again."""
    g = _hopper()
    assert _tiles(_compile(g, 128, chip="sm_90a")) == {"matmul_0": "matmul_wgmma"}
    kernel = _compile(g, 256, chip="sm_90a")
    assert _tiles(kernel) == {"matmul_0": "matmul_mma"}
    _check_rows(g, kernel, "bf16", (70,), 2e-2)
    with tma_loads(), warp_specialised():
        kernel = _compile(g, 256, chip="sm_90a", min_ctas=2)
        assert _tiles(kernel) == {"matmul_0": "matmul_wgmma"}
    _check_rows(g, kernel, "bf16", (70,), 2e-2, seed=1)


# ----------------------------------------------------------------------
# The sweep: every accepted lane count
# ----------------------------------------------------------------------


def _sweep() -> etc.Graph:
    """The tiles whose split depends on the warps per CTA: the GEMV (K
    groups over the warps, partials through scratch), the transposed GEMV
    (rows of Bᵀ over the warps: 256 rows in tiles of 8, a partial last row
    group where the warps are not a power of two), a row per warp (a norm
    held in registers, a softmax streamed, top-k), a row per CTA
    (sampling's passes over 300 logits, its scratch of a value per warp
    and per lane; the logits' adjustments), elements over the lanes
    (silu)."""
    g = etc.Graph("sweep")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "f32")
    w = g.input("w", (128, 64), "f32")
    wt = g.input("wt", (256, 128), "f32")
    nw = g.input("nw", (128,), "f32")
    logits = g.input("logits", (B, 300), "f32")
    params = [g.input("temperature", (B,), "f32"), g.input("top_k", (B,), "i32"),
              g.input("top_p", (B,), "f32"), g.input("min_p", (B,), "f32"),
              g.input("seed", (B, 2), "i32"), g.input("position", (B,), "i32")]
    g.output(g.matmul(x, w, name="gemv"), g.matmul(x, wt, transpose_b=True, name="gemv_t"),
             g.rmsnorm(x, nw, name="norm"), g.softmax(logits, name="softmax"),
             g.silu(x, name="silu"), *g.topk(logits, 3, name="topk"),
             g.sample(logits, *params, name="token"),
             g.adjust_logits(logits, g.input("tokens", (B, 4), "i32"),
                             g.input("add", (B, 4), "f32"), g.input("scale", (B, 4), "f32"),
                             name="adjusted"))
    return g


@pytest.mark.parametrize("lanes", range(32, 1025, 32))
def test_every_accepted_lane_count(lanes):
    """Rows 1 and 6 (two passes of 4 rows in the GEMVs, more rows than
    warps at 32 and 64 lanes); the sampled tokens and top-k indices exactly
    the reference's."""
    g = _sweep()
    kernel = _compile(g, lanes, workers=1)
    assert _tiles(kernel) == {
        "matmul_0": "matmul_gemv", "matmul_1": "matmul_gemv_t", "rmsnorm_0": "rmsnorm_gpu",
        "softmax_0": "softmax_gpu", "silu_0": "silu_gpu", "topk_0": "topk_gpu",
        "sample_0": "sample_gpu", "adjust_logits_0": "adjust_logits"}
    rng = np.random.default_rng(lanes)
    for rows in (1, 6):
        inputs = sampling_tests._inputs(
            (rng.standard_normal((rows, 300)) * 3).astype(np.float32),
            temperature=rng.choice([0.0, 0.7, 1.5], rows), top_k=rng.choice([0, 5, 299], rows),
            top_p=rng.choice([1.0, 0.8], rows), min_p=rng.choice([0.0, 0.05], rows),
            seeds=rng.integers(0, 2 ** 63, rows))
        inputs.update(x=rng.standard_normal((rows, 128)).astype(np.float32),
                      w=(0.1 * rng.standard_normal((128, 64))).astype(np.float32),
                      wt=(0.1 * rng.standard_normal((256, 128))).astype(np.float32),
                      nw=rng.standard_normal(128).astype(np.float32),
                      tokens=np.stack([rng.choice(np.arange(-1, 300), 4, replace=False)
                                       for _ in range(rows)]).astype(np.int32),
                      add=rng.standard_normal((rows, 4)).astype(np.float32),
                      scale=rng.uniform(0.5, 2.0, (rows, 4)).astype(np.float32))
        got = kernel.run(**inputs)
        want = etc.reference.evaluate(g, **inputs)
        for name, a, b in zip(g.outputs, got, want):
            if a.dtype == np.int32:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} at B={rows}")
            else:
                _close(a, b, 1e-4, f"{name} at B={rows}")


def test_a_user_tile_with_a_partial_row_group_at_128_lanes():
    """Tiles of 24 columns at 4 warps of 4 rows of Bᵀ: a group of 16 rows,
    then one of 8 (warps 2 and 3 idle), where an even split was required
    before (the scalar kernel ran)."""
    g = etc.Graph("user")
    B = g.symbol("B")
    x = g.input("x", (B, 200), "f32")
    wt = g.input("wt", (72, 200), "f32")
    g.output(g.matmul(x, wt, transpose_b=True, tile=(4, 24), name="y"))
    kernel = etc.compile(g, target="cpu", kernels="cuda", workers=2)
    assert _tiles(kernel) == {"matmul_0": "matmul_gemv_t"}
    _check_rows(g, kernel, "f32", (1, 3, 9), 1e-4)


# ----------------------------------------------------------------------
# Attention: chunk tiles and their combine, kv_append, paged caches,
# soft-capping and windows
# ----------------------------------------------------------------------


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("head_dim, cache_dtype, heads, kv_heads", [
    (16, "f32", 4, 2),     # 4 lanes per cache row
    (64, "bf16", 4, 1)])   # 8 lanes per row, 4 query heads per KV head
def test_attention_decode_chunks_and_combine(lanes, head_dim, cache_dtype, heads, kv_heads):
    """Ragged prefill, decode and mixed steps across chunk boundaries."""
    g = attention_tests._graph(heads=heads, kv_heads=kv_heads, head_dim=head_dim, chunk=4,
                              max_length=24, cache_dtype=cache_dtype,
                              q_dtype="bf16" if cache_dtype == "bf16" else "f32")
    kernel = _compile(g, lanes, schedule="dynamic")
    assert set(_tiles(kernel).values()) >= {"attention_chunk_warps", "attention_combine_lanes",
                                             "kv_append_vector"}
    storage = np.uint16 if cache_dtype == "bf16" else np.float32
    attention_tests._run_steps(kernel, g, attention_tests.STEPS[:4], [2, 0, 1],
                              np.random.default_rng(head_dim + lanes), heads * head_dim,
                              kv_heads * head_dim, (3, 24, kv_heads * head_dim), storage,
                              tol=2e-2 if cache_dtype == "bf16" else 1e-5)


@pytest.mark.parametrize("lanes", LANES)
def test_paged_attention(lanes):
    """Requests' blocks shuffled over the pool; tables of changing width."""
    g = paged_tests._graph(True)
    kernel = _compile(g, lanes, schedule="dynamic")
    P, W, length = paged_tests.P, paged_tests.W, paged_tests.MAX_LENGTH
    rng = np.random.default_rng(lanes)
    pool = 3 * length // P + 2
    order = rng.permutation(pool)
    blocks = [order[r * length // P:(r + 1) * length // P] for r in range(3)]
    caches = [np.zeros((pool, P, W), np.float32) for _ in range(4)]
    lengths = [0, 0, 0]
    for step, new in enumerate(paged_tests.STEPS):
        batch = _batch(lengths, new, [2, 0, 1])
        del batch["request_slot"]
        lengths = [a + b for a, b in zip(lengths, new)]
        table = paged_tests._tables(lengths, blocks, pad_to=6 if step % 2 else None)
        n = sum(new)
        data = {"q": rng.standard_normal((n, paged_tests.HEADS * paged_tests.D)),
                "k": rng.standard_normal((n, W)), "v": rng.standard_normal((n, W))}
        data = {name: a.astype(np.float32) for name, a in data.items()}
        (got,) = kernel.run(**data, **batch, block_table=table, kc=caches[0], vc=caches[1])
        (want,) = etc.reference.evaluate(g, **data, **batch, block_table=table, kc=caches[2],
                                         vc=caches[3])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
        np.testing.assert_array_equal(caches[0], caches[2])
        np.testing.assert_array_equal(caches[1], caches[3])


# ----------------------------------------------------------------------
# The families' operators: norms with an offset (whole rows, per head),
# GeGLU, soft-capping of logits and of attention scores with a window
# ----------------------------------------------------------------------


@pytest.mark.parametrize("lanes", LANES)
def test_family_ops(lanes):
    heads, kv_heads, d = 4, 2, 16
    g = etc.Graph("family")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    x = g.input("x", (T, heads * d), "bf16")
    w = g.input("w", (heads * d,), "bf16")
    hw = g.input("hw", (d,), "bf16")
    q = g.input("q", (T, heads * d), "f32")
    k = g.input("k", (T, kv_heads * d), "f32")
    v = g.input("v", (T, kv_heads * d), "f32")
    batch = g.ragged_batch(T, R)
    kc = g.kv_append(g.state("kc", (S, L, kv_heads * d)), k, batch)
    vc = g.kv_append(g.state("vc", (S, L, kv_heads * d)), v, batch)
    g.output(g.rmsnorm(x, w, 1e-6, offset=1.0, name="norm"),
             g.head_rmsnorm(x, hw, head_dim=d, eps=1e-6, offset=1.0, name="head_norm"),
             g.gelu_mul(x, x, name="geglu"), g.softcap(x, 3.0, name="softcap"),
             g.attention(q, kc, vc, batch, head_dim=d, chunk=4, max_length=24, scale=0.5,
                         window=5, softcap=2.0, name="attention"))
    kernel = _compile(g, lanes, schedule="dynamic")
    rng = np.random.default_rng(lanes)
    caches = [np.zeros((2, 24, kv_heads * d), np.float32) for _ in range(4)]
    lengths = [0, 0]
    for new in ([9, 3], [1, 1], [4, 1]):
        n = sum(new)
        data = {"x": bfloat16.to_bits(2 * rng.standard_normal((n, heads * d))),
                "w": bfloat16.to_bits(0.1 * rng.standard_normal(heads * d)),
                "hw": bfloat16.to_bits(0.1 * rng.standard_normal(d)),
                "q": 3 * rng.standard_normal((n, heads * d)).astype(np.float32),
                "k": rng.standard_normal((n, kv_heads * d)).astype(np.float32),
                "v": rng.standard_normal((n, kv_heads * d)).astype(np.float32),
                **_batch(lengths, new, [1, 0])}
        got = kernel.run(**data, kc=caches[0], vc=caches[1])
        want = etc.reference.evaluate(g, **data, kc=caches[2], vc=caches[3])
        for name, a, b in zip(g.outputs, got, want):
            if a.dtype == np.uint16:
                a, b = bfloat16.from_bits(a), bfloat16.from_bits(b)
            tol = 1e-5 if name == "attention" else 2e-2
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{name} at {new}")
        lengths = [a + m for a, m in zip(lengths, new)]


# ----------------------------------------------------------------------
# Sampling: a row per CTA
# ----------------------------------------------------------------------


@pytest.mark.parametrize("lanes", [256, 96, 1024])
def test_sampling(lanes):
    """A vocabulary of 1,000 (not a multiple of the lanes; at 1,024 lanes
    fewer values than lanes), every filter on some rows, log-probabilities:
    the reference's tokens exactly, its log-probabilities within 1e-5."""
    g = sampling_tests._graph(1000, max_logprobs=4)
    kernel = _compile(g, lanes)
    assert _tiles(kernel) == {"sample_0": "sample_gpu"}
    rng = np.random.default_rng(lanes)
    rows = 24
    inputs = sampling_tests._inputs(
        (rng.standard_normal((rows, 1000)) * 3).astype(np.float32),
        temperature=rng.choice([0.0, 0.5, 1.0, 2.0], rows),
        top_k=rng.choice([0, 1, 7, 300, 1000], rows), top_p=rng.choice([1.0, 0.9, 0.3], rows),
        min_p=rng.choice([0.0, 0.1], rows), seeds=rng.integers(0, 2 ** 63, rows),
        position=rng.integers(0, 4096, rows))
    inputs["logprobs"] = rng.integers(-1, 5, rows).astype(np.int32)
    tokens, values, ids = kernel.run(**inputs)
    want_tokens, want_values, want_ids = etc.reference.evaluate(g, **inputs)
    np.testing.assert_array_equal(tokens, want_tokens)
    for r, count in enumerate(inputs["logprobs"]):
        if count >= 0:
            np.testing.assert_allclose(values[r, :1 + count], want_values[r, :1 + count],
                                       rtol=1e-6, atol=1e-5, err_msg=f"row {r}")
            np.testing.assert_array_equal(ids[r, :count], want_ids[r, :count])


# ----------------------------------------------------------------------
# Packed weights: the packed GEMV and its tensor-core tiles
# ----------------------------------------------------------------------

PACKED = ["q8_0", "q4_k", "q6_k"]


@pytest.mark.parametrize("lanes", LANES)
def test_packed_weights(lanes):
    """x (T, 512) bf16 times (N, 512) weights in three block formats (a
    32-value one, two K-quants): decode rows take the packed GEMV, tiles
    of 16 rows or more the tensor cores over the dequantized tile (B^T
    rounded to bf16). Within the order of the sums of the widened product."""
    k, n = 512, 64
    g = etc.Graph("packed")
    T = g.symbol("T")
    x = g.input("x", (T, k), "bf16")
    g.output(*[g.matmul(x, g.input(f"w_{fmt}", (n, k), fmt), transpose_b=True,
                        tile=(32, 8), name=fmt) for fmt in PACKED])
    kernel = _compile(g, lanes)
    assert set(_tiles(kernel).values()) == {f"matmul_{fmt}_gemv_mma" for fmt in PACKED}
    rng = np.random.default_rng(lanes)
    weights = {f"w_{fmt}": packed.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
               for fmt in PACKED}
    for rows in (1, 5, 16, 40):
        a = round_bf16(rng.standard_normal((rows, k)))
        got = kernel.run(x=a, **weights)
        wide = np.array([min(32, rows - r // 32 * 32) >= 16 for r in range(rows)])
        for fmt, out in zip(PACKED, got):
            w = packed.dequantize(weights[f"w_{fmt}"], fmt)
            want = np.where(wide[:, None], a @ round_bf16(w).T, a @ w.T)
            scale = np.abs(a) @ np.abs(w).T
            assert np.all(np.abs(out - want) <= np.abs(want) * 2 ** -7 + 1e-5 * scale), \
                (fmt, rows)


# ----------------------------------------------------------------------
# A whole model's step graph
# ----------------------------------------------------------------------


#: A 2-layer Qwen3 (bf16, head_dim 64, hidden 256: the bf16 GEMVs paired
#: with the tensor cores, warps per cache row) with the CUDA kernels.
MODEL = dict(kernels="cuda", dtype="bf16", workers=2, max_seq_len=32, attention_chunk=4,
             cache=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = tiny_config("Qwen3ForCausalLM", hidden_size=256, intermediate_size=512,
                         head_dim=64, vocab_size=160)
    return write_checkpoint(tmp_path_factory.mktemp("model") / "qwen3", config, seed=3)


@pytest.fixture(scope="module")
def narrow(checkpoint):
    """The model at the default 128 lanes."""
    return models.load(checkpoint, **MODEL)


@pytest.mark.parametrize("lanes", LANES)
def test_a_model_step_is_the_step_at_128_lanes(checkpoint, narrow, lanes):
    """The model loaded at 256 (and 96) lanes (`models.load(...,
    lanes=)`): a prefill of ragged prompts, then decode steps (each fed
    the 128-lane model's tokens), give the logits, greedy ids and KV
    caches of the 128-lane model (within the rounding of bf16 activations
    summed in another order)."""
    wide = models.load(checkpoint, lanes=lanes, **MODEL)
    assert narrow.kernels[0].abi.lanes == 128 and wide.kernels[0].abi.lanes == lanes
    # The default chip is sm_90a: the tiles of 128 lanes, but wgmma's
    # (one warpgroup) taken by the tensor-core tiles of mma.sync.
    tiles = _tiles(narrow.kernels[0])
    assert "matmul_gemv_t_wgmma" in tiles.values()
    assert _tiles(wide.kernels[0]) == {task: tile.replace("wgmma", "mma")
                                       for task, tile in tiles.items()}
    caches = {model: model.new_cache(3, 32) for model in (narrow, wide)}
    prompts = [[5, 1, 2, 3, 4, 6, 7], [9], [11, 12, 13, 14, 15]]
    new, starts = prompts, [0, 0, 0]
    for step in range(4):
        requests = [models.Request(r, starts[r], new[r]) for r in range(3)]
        (logits, ids), (wide_logits, wide_ids) = (
            model.kernels[0].run(**model.step_inputs(caches[model], requests))[:2]
            for model in (narrow, wide))
        _close(wide_logits, logits, 2e-2, f"step {step}")
        # The same greedy ids wherever the best logit leads clearly.
        top2 = np.sort(logits, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 0.05 * max(float(np.abs(logits).max()), 1.0)
        np.testing.assert_array_equal(wide_ids[clear], ids[clear])
        assert clear.any()
        for name, array in caches[narrow].arrays.items():
            _close(bfloat16.from_bits(caches[wide].arrays[name]), bfloat16.from_bits(array),
                   2e-2, f"{name} after step {step}")
        starts = [s + len(t) for s, t in zip(starts, new)]
        new = [[int(i)] for i in ids]
