"""bf16 matmuls on the CPU's dot-product and matrix units: the AVX-512 BF16
tile (`etc.ops.matmul_dpbf16.MatmulDPBF16`, chosen where the instruction
set has `avx512bf16`) and the AMX tile (`etc.ops.matmul_amx.MatmulAMX`,
where it has `amx-bf16`; on other CPUs with its tile instructions emulated,
`kernels="amx"`), against the NumPy reference at ragged M, K and N (not
multiples of the 2 x 8 blocks, of 16 or of 32), with a residual, on both
schedules; the GEMV below their crossovers in the same kernel; the AMX
tiles in the lowered IR and LLVM's machine code for them on any CPU; and
the same graphs compiled for x86-64-v3 (no AVX-512), which take
`MatmulCPU`.

Tolerance: the kernels sum K products in f32 in another order than NumPy
(in pairs, then across lanes), so a result may differ from the reference
by one unit in the last place of bf16 (at most 2^-7 of it: the two sums
round to neighbours) plus K f32 roundings of the sum of the products'
magnitudes (K 2^-24 |A| |B|^T).
"""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc import bfloat16
from etc.ops import Target
from etc.ops.matmul import choose_kernel
from etc.ops.matmul_amx import MatmulAMX
from etc.ops.matmul_cpu import MatmulCPU
from etc.ops.matmul_dpbf16 import MatmulDPBF16
from etc.runtime import isa

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

needs_avx512bf16 = pytest.mark.skipif(
    not isa.is_x86_64() or not isa.host_supports("x86-64-v4+avx512bf16"),
    reason="this x86-64 CPU has no AVX-512 BF16")
needs_v3 = pytest.mark.skipif(not isa.is_x86_64() or not isa.host_supports("x86-64-v3"),
                              reason="this CPU runs no x86-64-v3 code")


def _graph(k: int, n: int, *, residual: bool = False, name: str = "mm") -> etc.Graph:
    g = etc.Graph(name)
    m = g.symbol("M")
    a = g.input("a", (m, k), "bf16")
    w = g.input("w", (n, k), "bf16")
    r = g.input("r", (m, n), "bf16") if residual else None
    g.output(g.matmul(a, w, transpose_b=True, residual=r))
    return g


def _bf16(rng, shape, scale=1.0) -> np.ndarray:
    return bfloat16.from_bits(bfloat16.to_bits(
        (rng.standard_normal(shape) * scale).astype(np.float32)))


def assert_close_to_reference(got, want, a, w):
    """`got` within the f32-accumulation tolerance of the module docstring
    of `want` (the reference, rounded to bf16)."""
    k = a.shape[1]
    magnitude = np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64).T
    bound = np.abs(want) * 2.0 ** -7 + k * 2.0 ** -24 * magnitude + 1e-30
    excess = np.abs(got.astype(np.float64) - want) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 0, (f"at {worst}: got {got[worst]}, want {want[worst]}, "
                               f"tolerance {bound[worst]}")


def assert_close_with_residual(got, g, a, w, r):
    """`got`, graph `g`'s result (a matmul with residual `r`), within the
    product's tolerance, then r added and rounded to bf16 once more."""
    (want,) = etc.reference.evaluate(g, a=a, w=w, r=r)
    k, n = a.shape[1], w.shape[0]
    product = etc.reference.evaluate(_graph(k, n), a=a, w=w)[0].astype(np.float64)
    bound = (np.abs(product) * 2.0 ** -7 + k * 2.0 ** -24 *
             (np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64).T))
    excess = np.abs(got - want) - (bound + np.abs(want) * 2.0 ** -7 + 1e-30)
    assert excess.max() <= 0, f"M = {a.shape[0]}: {np.argwhere(excess > 0)[:5]}"


def _op(k, n, **kwargs):
    (op,) = _graph(k, n, **kwargs)._ops
    return op


def test_the_dot_product_tile_is_chosen_where_the_instruction_set_has_avx512bf16():
    op = _op(576, 192)
    with_bf16 = Target("cpu", workers=2, isa="x86-64-v4+avx512bf16")
    assert choose_kernel(op, with_bf16) is MatmulDPBF16
    for other in ("x86-64-v4", "x86-64-v3", None):
        assert choose_kernel(op, Target("cpu", workers=2, isa=other)) is MatmulCPU
    # Only bf16 operands, only B^T (N, K), only a static K.
    g = etc.Graph("f32")
    m = g.symbol("M")
    g.matmul(g.input("a", (m, 64), "f32"), g.input("w", (32, 64), "f32"), transpose_b=True)
    assert choose_kernel(g._ops[0], with_bf16) is MatmulCPU
    g = etc.Graph("kn")
    g.matmul(g.input("a", (g.symbol("M"), 64), "bf16"), g.input("w", (64, 32), "bf16"))
    assert choose_kernel(g._ops[0], with_bf16) is MatmulCPU


def test_the_tile_multiplies_with_vdpbf16ps_and_keeps_the_gemv_below_the_crossover():
    target = Target("cpu", workers=2, isa="x86-64-v4+avx512bf16")
    text = _graph(100, 40).build(target=target).operation.get_asm()
    assert "x86vector.avx512.dot" in text
    assert "matmul_dpbf16" in text
    # The GEMV of MatmulCPU for tiles of fewer rows, in the same function.
    assert "vector.fma" in text
    # Chosen by the tile's row count: the first comparison of the tile.
    first = next(line for line in text.splitlines() if "arith.cmpi" in line)
    assert f"arith.cmpi uge, %2, %c{MatmulDPBF16.CROSSOVER} : index" in first


@needs_avx512bf16
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("k, n", [(576, 192), (75, 37), (33, 100), (8, 20)])
def test_ragged_shapes_match_the_reference(schedule, k, n):
    rng = np.random.default_rng(k * n)
    g = _graph(k, n)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert "x86vector.avx512.dot" in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    for m in (1, 2, 3, 5, 31, 33, 70):
        a = _bf16(rng, (m, k))
        (got,) = kernel.run(a=a, w=w)
        (want,) = etc.reference.evaluate(g, a=a, w=w)
        assert_close_to_reference(got, want.astype(np.float64), a, w)


@needs_avx512bf16
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_k_past_one_chunk_carries_each_chunks_sums(schedule):
    """K = 2 PANEL_K + 37 takes three chunks along K (the last of 37: one
    step of 32 and a masked one of 5), each block's sums carried from one
    to the next: at ragged M (blocks of 2 past the last row, a last tile
    of 6 rows) and N = 21 (a group of 5 columns at the edge), within the
    tolerance of the module docstring; a chunk's sums lost, or carried
    into another row or column, are far outside it."""
    rng = np.random.default_rng(5)
    k, n = 2 * MatmulDPBF16.PANEL_K + 37, 21
    g = _graph(k, n)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert "x86vector.avx512.dot" in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    for m in (2, 3, 31, 33, 70):
        a = _bf16(rng, (m, k))
        (got,) = kernel.run(a=a, w=w)
        (want,) = etc.reference.evaluate(g, a=a, w=w)
        assert_close_to_reference(got, want.astype(np.float64), a, w)


@needs_avx512bf16
def test_the_residual_is_added_to_the_rounded_product():
    rng = np.random.default_rng(1)
    k, n = 130, 52
    g = _graph(k, n, residual=True)
    kernel = etc.compile(g, target="cpu", workers=2)
    w = _bf16(rng, (n, k))
    for m in (3, 4, 37):
        a, r = _bf16(rng, (m, k)), _bf16(rng, (m, n), 8.0)
        (got,) = kernel.run(a=a, w=w, r=r)
        assert_close_with_residual(got, g, a, w, r)


@needs_v3
def test_a_cpu_without_avx512_runs_the_same_graph(monkeypatch):
    rng = np.random.default_rng(2)
    k, n = 75, 37
    monkeypatch.setenv(isa.ENVIRONMENT, "x86-64-v3")
    kernel = etc.compile(_graph(k, n), target="cpu", workers=2)
    assert kernel.abi.isa == "x86-64-v3"
    assert "x86vector" not in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    a = _bf16(rng, (33, k))
    (got,) = kernel.run(a=a, w=w)
    (want,) = etc.reference.evaluate(_graph(k, n), a=a, w=w)
    assert_close_to_reference(got, want.astype(np.float64), a, w)


def test_the_dot_product_tile_stays_small():
    """The AVX-512 BF16 tile of a SmolLM2-shaped matmul (built for a CPU
    without AMX; no JIT) stays under 800 lines of graph-stage IR: its GEMV
    for one row emits only the dot groups one row takes (1,309 lines at
    bb69982, with `MatmulCPU.emit`'s panels and full 4 x 4 groups; 456
    now)."""
    g = etc.Graph("size")
    g.output(g.matmul(g.input("x", (g.symbol("T"), 576), "bf16"),
                      g.input("w", (576, 576), "bf16"), transpose_b=True))
    text = str(g.build(target=Target("cpu", workers=2, isa="x86-64-v4+avx512bf16")))
    start = text.index("func.func private @size_tile_matmul_dpbf16_0(")
    lines = text[start:text.index("\n  }\n", start)].count("\n")
    assert 300 < lines < 800, lines


def test_each_sum_gives_each_vectors_sum_in_its_lane():
    """The shuffle tree of `each_sum` for 1 to 16 vectors, run by the
    CPU target through a one-row elementwise graph whose tile is replaced:
    checked directly on the IR it builds, with NumPy's sums."""
    from mlir import ir
    from mlir.dialects import func, vector as vector_dialect
    from mlir.execution_engine import ExecutionEngine
    from mlir.passmanager import PassManager

    for count in (1, 2, 3, 4, 6, 8, 16):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.create()
            f32 = ir.F32Type.get()
            vtype = ir.VectorType.get([16], f32)
            memref_in = ir.MemRefType.get([count, 16], f32)
            lanes = 1
            while lanes < count:
                lanes *= 2
            memref_out = ir.MemRefType.get([lanes], f32)
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp("sums", ([memref_in, memref_out], []))
                fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
                entry = fn.add_entry_block()
                with ir.InsertionPoint(entry):
                    kernel = MatmulDPBF16.__new__(MatmulDPBF16)
                    kernel.block, kernel._consts = entry, {}
                    kernel.index, kernel.f32 = ir.IndexType.get(), f32
                    vectors = [vector_dialect.load(vtype, entry.arguments[0],
                                                   [kernel.cidx(i), kernel.cidx(0)])
                               for i in range(count)]
                    sums = kernel.each_sum(vectors)
                    vector_dialect.store(sums, entry.arguments[1], [kernel.cidx(0)])
                    func.ReturnOp([])
            PassManager.parse("builtin.module(convert-vector-to-llvm,finalize-memref-to-llvm,"
                              "convert-arith-to-llvm,convert-func-to-llvm,"
                              "reconcile-unrealized-casts)").run(module.operation)
            engine = ExecutionEngine(module)
            import ctypes

            from mlir.runtime import get_ranked_memref_descriptor
            values = np.random.default_rng(count).standard_normal((count, 16)).astype(np.float32)
            out = np.zeros(lanes, np.float32)
            engine.invoke("sums", ctypes.pointer(ctypes.pointer(
                get_ranked_memref_descriptor(values))), ctypes.pointer(ctypes.pointer(
                    get_ranked_memref_descriptor(out))))
            np.testing.assert_allclose(out[:count], values.sum(axis=1), rtol=1e-5, atol=1e-5)
            assert not out[count:].any()


# ----------------------------------------------------------------------
# AMX tiles
# ----------------------------------------------------------------------

AMX = "x86-64-v4+avx512bf16+amx-tile+amx-bf16"
needs_amx = pytest.mark.skipif(not isa.is_x86_64() or not isa.host_supports(AMX),
                               reason="this x86-64 CPU has no AMX tile unit")


def test_the_amx_tile_is_chosen_where_the_instruction_set_has_amx_or_it_is_emulated():
    op = _op(576, 192)
    assert choose_kernel(op, Target("cpu", workers=2, isa=AMX)) is MatmulAMX
    assert choose_kernel(op, Target("cpu", workers=2, isa="x86-64-v4+avx512bf16",
                                    emulate_amx=True)) is MatmulAMX
    assert choose_kernel(op, Target("cpu", workers=2, isa="x86-64-v4+avx512bf16")) \
        is MatmulDPBF16
    # N up to WHOLE_N in one column tile (the row tiles share the work out);
    # wider N in column tiles of whole groups of 32, as many for each
    # worker; TALL_ROWS rows from K = TALL_K on, SHORT_K_ROWS below.
    two = Target("cpu", workers=2, isa=AMX)
    assert (MatmulAMX.WHOLE_N, MatmulAMX.WIDEST) == (192, 288)
    assert MatmulAMX.tile_for(op, two) == (MatmulAMX.SHORT_K_ROWS, 192) == (64, 192)
    assert MatmulAMX.tile_for(_op(576, 64), two) == (64, 64)
    assert MatmulAMX.tile_for(_op(576, 576), two) == (64, 288)
    assert MatmulAMX.tile_for(_op(576, 1536), two) == (64, 256)
    assert MatmulAMX.tile_for(_op(576, 224), two) == (64, 32)  # 7 groups: 1 each is uneven
    tall = _op(MatmulAMX.TALL_K, 192)
    assert MatmulAMX.tile_for(tall, two) == (MatmulAMX.TALL_ROWS, 192) == (128, 192)
    assert MatmulAMX.tile_for(_op(MatmulAMX.TALL_K, 576), two) == (128, 288)
    assert MatmulAMX.tile_for(_op(576, 960), two) == (64, 160)  # 320 is past WIDEST


def test_amx_kernels_are_refused_without_avx512_bf16_to_emulate_them(monkeypatch):
    monkeypatch.setenv(isa.ENVIRONMENT, "x86-64-v3")
    if not isa.host_supports("x86-64-v3"):
        pytest.skip("this CPU runs no x86-64-v3 code")
    with pytest.raises(ValueError, match=r"kernels='amx' emulates the AMX tiles with AVX-512 "
                                         r"BF16, which the instruction set x86-64-v3 lacks"):
        etc.compile(_graph(64, 32), target="cpu", kernels="amx")


def _lowered_for_amx(g):
    """`g` built for an AMX instruction set and lowered to the LLVM
    dialect, whatever this CPU has (the stages of `etc.compile`, without
    its check that the host runs the code)."""
    from mlir import ir

    from etc import pipeline

    options = pipeline.Options(target="cpu", workers=2)
    module = g.build(ir.Context(), target=Target("cpu", workers=2, isa=AMX))
    graph_text = str(module)
    for stage, text in pipeline.stages(options).items():
        pipeline.run_stage(module, stage, text)
    return graph_text, module


def test_the_tile_unit_multiplies_in_the_lowered_ir_and_the_machine_code():
    g = _graph(100, 96, residual=True)
    graph_text, module = _lowered_for_amx(g)
    for op in ("amx.tile_load", "amx.tile_mulf", "amx.tile_store", "amx.tile_zero"):
        assert op in graph_text, op
    lowered = str(module)
    for intrinsic in ("llvm.x86.tileloadd64.internal", "llvm.x86.tdpbf16ps.internal",
                      "llvm.x86.tilestored64.internal", "llvm.x86.avx512bf16.dpbf16ps.512"):
        assert intrinsic in lowered, intrinsic
    # LLVM compiles it (tile configuration included) on any x86-64 CPU.
    import shutil
    import subprocess

    from etc.runtime import jit
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    engine = jit.create(module, "mm", 2, isa=AMX)
    jit.lookup(engine, "mm_worker", "mm")
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".o") as obj:
        engine.dump_to_object_file(obj.name)
        code = subprocess.run([objdump, "-d", "--no-show-raw-insn", obj.name],
                              capture_output=True, text=True, check=True).stdout
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"):
        assert instruction in code, instruction


def test_tiles_of_few_rows_prefetch_the_next_group_of_b(monkeypatch):
    """Each K step of a tile of at most 32 rows prefetches (into L2) the
    line at that K of each of the next group's 32 rows of B^T; PREFETCH_GROUPS
    0 turns it off."""
    from etc.ops.matmul_amx import MatmulAMX

    graph_text, _ = _lowered_for_amx(_graph(100, 96))
    prefetches = [line for line in graph_text.splitlines() if "memref.prefetch" in line]
    assert len(prefetches) == MatmulAMX.GROUP, len(prefetches)
    assert all("read, locality<2>, data" in line for line in prefetches), prefetches[0]
    assert "arith.cmpi ule" in graph_text
    monkeypatch.setattr(MatmulAMX, "PREFETCH_GROUPS", 0)
    graph_text, _ = _lowered_for_amx(_graph(100, 96))
    assert "memref.prefetch" not in graph_text


@pytest.mark.parametrize("level", [0, 2])
def test_at_o0_no_tile_crosses_a_block_and_llvm_generates_the_code(level, monkeypatch):
    """LLVM 22 aborts at -O0 on a tile carried around a loop (a phi of
    x86_amx): at ETC_CPU_OPT_LEVEL=0 the accumulators live in stack slots,
    at 2 in tile registers carried by the K loop. Code generation runs on
    any x86-64 CPU, so this holds on machines without AMX too."""
    import re

    from etc.runtime import jit
    monkeypatch.setenv("ETC_CPU_OPT_LEVEL", str(level))
    graph_text, module = _lowered_for_amx(_graph(100, 96, residual=True))
    carried = re.search(r"scf\.for .* iter_args\(.*\) -> \(!amx\.tile", graph_text)
    assert (carried is None) == (level == 0)
    engine = jit.create(module, "mm", level, isa=AMX)
    jit.lookup(engine, "mm_worker", "mm")


@needs_avx512bf16
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("k, n", [(100, 96), (75, 70), (64, 40)])
def test_amx_tiles_emulated_at_ragged_shapes_match_the_reference(schedule, k, n):
    """The AMX kernel's packing, groups, K tail, transposed stores and
    column edges, its tile instructions emulated (kernels="amx"):
    K = 75 has a tail of 11, N = 70 groups of 32 and 6 columns for the
    AVX-512 blocks, M up to 70 three 16-row blocks and a partial one."""
    rng = np.random.default_rng(k + n)
    g = _graph(k, n, residual=True)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2, kernels="amx")
    assert "matmul_amx" in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    for m in (1, 3, 4, 17, 33, 70):
        a, r = _bf16(rng, (m, k)), _bf16(rng, (m, n), 8.0)
        (got,) = kernel.run(a=a, w=w, r=r)
        assert_close_with_residual(got, g, a, w, r)


@pytest.mark.parametrize("k, n", [(576, 192), (576, 1536), (1536, 576)])
def test_amx_tiles_stay_small(k, n):
    """The tile function of a SmolLM2-shaped bf16 matmul stays under 2,000
    lines of graph-stage IR (built for an AMX CPU; no JIT). At bb69982 it
    was 19,407 / 19,719 / 19,407 lines: `MatmulAMX.ROWS` (its 128 rows per
    tile) also set `MatmulCPU`'s rows per dot group, so the GEMV below the
    crossover emitted a 128 x 4 group of dot products, never run, in every
    tile (2,696 / 3,010 / 2,697 without it). Now 1,192 / 1,506 / 1,193:
    the one-row GEMV without the panels and the full dot groups it never
    reaches, one copy of the dot-product blocks for the columns past the
    tile unit's groups and for tiles of 2 rows, the stores of a pair of
    row blocks once, in a loop (docs/benchmarks.md, "Compile time of a
    model's step kernel")."""
    g = etc.Graph("size")
    g.output(g.matmul(g.input("x", (g.symbol("T"), k), "bf16"), g.input("w", (n, k), "bf16"),
                      transpose_b=True))
    text = str(g.build(target=Target("cpu", workers=2, isa=AMX)))
    start = text.index("func.func private @size_tile_matmul_amx_0(")
    lines = text[start:text.index("\n  }\n", start)].count("\n")
    assert 800 < lines < 2000, lines


@needs_amx
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("n", [192, 576])
def test_whole_and_wide_column_tiles_match_the_reference_on_both_schedules(schedule, n):
    """N = 192 as one column tile of 64 rows, N = 576 as two of 288 (9
    groups): row tiles full, ragged (65, 130) and below the crossover,
    on the static and the dynamic schedule, one kernel for every M."""
    k = 64
    rng = np.random.default_rng(n)
    g = _graph(k, n)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
    assert "matmul_amx" in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    run = kernel.partial(w=w)
    for m in (2, 3, 64, 65, 130):
        a = _bf16(rng, (m, k))
        (got,) = run.run(a=a)
        (want,) = etc.reference.evaluate(g, a=a, w=w)
        assert_close_to_reference(got, want.astype(np.float64), a, w)


@needs_amx
@pytest.mark.parametrize("level", ["0", "2"])
@pytest.mark.parametrize("k, n", [(576, 192), (75, 70), (100, 576)])
def test_amx_tiles_match_the_reference(k, n, level, monkeypatch):
    """On the tile unit, at LLVM -O0 too (accumulators in stack slots
    there: LLVM 22's -O0 AMX lowering crashes on a tile carried around a
    loop) and at -O2 (accumulators in tile registers). Tiles of 64 rows
    (M = 70 and 130 ragged) by all 192 columns, or by 288 (9 groups, two
    column tiles), each row's 32 columns narrowed to bf16 at once."""
    monkeypatch.setenv("ETC_CPU_OPT_LEVEL", level)
    rng = np.random.default_rng(k * n)
    g = _graph(k, n)
    kernel = etc.compile(g, target="cpu", workers=2)
    assert "matmul_amx" in kernel.ir("graph") and "amx-tile" in kernel.abi.isa
    w = _bf16(rng, (n, k))
    for m in (1, 3, 4, 17, 33, 70, 130):
        a = _bf16(rng, (m, k))
        (got,) = kernel.run(a=a, w=w)
        (want,) = etc.reference.evaluate(g, a=a, w=w)
        assert_close_to_reference(got, want.astype(np.float64), a, w)


@needs_amx
@pytest.mark.parametrize("level", ["0", "2"])
def test_tiles_from_the_crossover_take_the_tile_unit(level, monkeypatch):
    """A tile of TILE_CROSSOVER rows takes the tile unit, one of a row
    fewer the dot products (chosen per tile at run time from its rows).
    The tile unit sums each element in one order whatever the tile's rows,
    so from the crossover on a few rows' results are bit for bit those
    rows of a 32-row tile; the dot products sum in another order, which
    shows in the row count below's results (sums that cancel, so that
    their rounding is all that is left), all within the reference's
    tolerance."""
    monkeypatch.setenv("ETC_CPU_OPT_LEVEL", level)
    k = n = 576
    rng = np.random.default_rng(3)
    g = _graph(k, n)
    kernel = etc.compile(g, target="cpu", workers=2)
    assert "matmul_amx" in kernel.ir("graph")
    # Each row's second half of the products cancels its first: the
    # result is the f32 rounding of the sums, which follows their order.
    w = np.tile(_bf16(rng, (n, k // 2)), 2)
    half = _bf16(rng, (32, k // 2))
    a = np.concatenate([half, -half], axis=1)
    run = kernel.partial(w=w)
    (full,) = run.run(a=a)
    crossover = MatmulAMX.TILE_CROSSOVER
    for m in (crossover - 1, crossover, crossover + 1):
        (got,) = run.run(a=a[:m])
        (want,) = etc.reference.evaluate(g, a=a[:m], w=w)
        assert_close_to_reference(got, want.astype(np.float64), a[:m], w)
        if m >= crossover:
            np.testing.assert_array_equal(got, full[:m])
        else:
            assert (got != full[:m]).any(), m


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("k, n", [(75, 70), (200, 64), (160, 96)])
def test_amx_k_chunks_and_row_tiles_match_the_reference(monkeypatch, schedule, k, n):
    """Chunks of K (K_CHUNK 64 here: K = 75 one whole chunk and a chunk of
    only the tail, 200 three and a tail of 8, 160 two and one step) whose
    sums carry through the accumulator buffer, B^T's K tail copied per
    tile, and row tiles of ROWS (64 here) with ragged last ones: on the
    tile unit where this CPU has one, else emulated."""
    monkeypatch.setattr(MatmulAMX, "K_CHUNK", 64)
    monkeypatch.setattr(MatmulAMX, "ROWS", 64)
    monkeypatch.setattr(MatmulAMX, "TALL_K", 64)
    if isa.is_x86_64() and isa.host_supports(AMX):
        kernels = "native"
    elif isa.is_x86_64() and isa.host_supports("x86-64-v4+avx512bf16"):
        kernels = "amx"
    else:
        pytest.skip("this CPU has neither AMX nor AVX-512 BF16")
    rng = np.random.default_rng(k + n)
    g = _graph(k, n, residual=True)
    kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2, kernels=kernels)
    assert "matmul_amx" in kernel.ir("graph")
    w = _bf16(rng, (n, k))
    for m in (4, 63, 64, 97, 150):
        a, r = _bf16(rng, (m, k)), _bf16(rng, (m, n), 8.0)
        (got,) = kernel.run(a=a, w=w, r=r)
        assert_close_with_residual(got, g, a, w, r)


def test_the_runtime_and_the_loaders_align_what_they_allocate(tmp_path):
    """64-byte aligned rows for the tiles' 64-byte loads: the runtime's
    intermediates (and large outputs: test_cpu_out), inputs it converts to
    bf16, weights read from safetensors."""
    from etc.models.loading.safetensors import SafetensorsFile, save_file
    from etc.runtime import aligned
    from etc.runtime.cpu import to_storage

    for shape in ((3, 5), (7,), (2, 3, 4)):
        assert aligned.is_aligned(aligned.empty(shape, np.float32))
        assert aligned.zeros(shape, np.uint16).shape == shape
    unaligned = np.zeros(17, np.uint16)[1:]
    assert not aligned.is_aligned(unaligned) and aligned.is_aligned(aligned.aligned(unaligned))
    for _ in range(8):  # NumPy places each new array anywhere 16 bytes apart
        assert aligned.is_aligned(to_storage(np.ones((3, 40), np.float32), "bf16"))
    g = etc.Graph("chain")
    m = g.symbol("M")
    a = g.input("a", (m, 64), "bf16")
    h = g.matmul(a, g.input("w", (32, 64), "bf16"), transpose_b=True)
    g.output(g.silu(h))
    kernel = etc.compile(g, target="cpu", workers=1)
    kernel.run(a=np.ones((5, 64), np.float32), w=np.ones((32, 64), np.float32))
    (workspace,) = kernel.runtime._workspaces.values()
    assert workspace.intermediates and all(aligned.is_aligned(x) for x in
                                           workspace.intermediates.values())
    save_file(tmp_path / "w.safetensors", {"w": np.ones((3, 40), np.uint16)}, "BF16")
    for dtype in ("bf16", "f32"):
        assert aligned.is_aligned(SafetensorsFile(tmp_path / "w.safetensors").read("w", dtype))
