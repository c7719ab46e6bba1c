"""Numerics of compiled graphs on the CPU target against the NumPy reference.

One compile per graph and worker count serves several values of every
symbolic dimension; worker counts above the core count must still finish.
"""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

import etc

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)


def test_a_file_marked_for_o2_compiles_at_o2():
    """conftest.py compiles the suite's kernels at -O0 and this file's at
    -O2: a broken marker would leave no tile kernel tested as users run it."""
    from etc.runtime import isa

    assert str(isa.opt_level()) == os.environ.get("ETC_TEST_USER_OPT_LEVEL", "2")

WORKERS = [1, 2, 3, 8]
BATCHES = [1, 5, 33, 64]  # 5 and 33 are not multiples of the 32-row tile


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _graph(kind: str) -> tuple[etc.Graph, dict]:
    """A one- or two-operator graph per operator kind, and its static inputs."""
    g = etc.Graph(f"op_{kind}")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    extra: dict = {}
    if kind == "matmul":
        w = g.input("w", (96, 80), "f32")
        y = g.matmul(x, w)
        extra["w"] = (96, 80)
    elif kind == "matmul_t":
        w = g.input("w", (80, 96), "f32")
        y = g.matmul(x, w, transpose_b=True)
        extra["w"] = (80, 96)
    elif kind in ("add", "mul", "silu_mul"):
        z = g.input("z", (B, 96), "f32")
        y = getattr(g, kind)(x, z)
        extra["z"] = ("B", 96)
    elif kind in ("add_row", "mul_row"):
        r = g.input("r", (96,), "f32")
        y = getattr(g, kind[:3])(x, r)
        extra["r"] = (96,)
    elif kind in ("silu", "gelu", "exp", "softmax", "sum"):
        y = getattr(g, kind)(x)
    elif kind == "scale":
        y = g.scale(x, -0.5)
    elif kind == "rmsnorm":
        w = g.input("w", (96,), "f32")
        y = g.rmsnorm(x, w, 1e-5)
        extra["w"] = (96,)
    elif kind == "layernorm":
        y = g.layernorm(x, g.input("w", (96,), "f32"), g.input("r", (96,), "f32"), 1e-5)
        extra.update(w=(96,), r=(96,))
    else:
        raise AssertionError(kind)
    g.output(y)
    return g, extra


def _inputs(rng, extra: dict, batch: int) -> dict:
    inputs = {"x": _rand(rng, (batch, 96))}
    for name, shape in extra.items():
        inputs[name] = _rand(rng, tuple(batch if d == "B" else d for d in shape), 0.3)
    return inputs


def _check(kernel, g, inputs):
    outputs = kernel.run(**inputs)
    expected = etc.reference.evaluate(g, **inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


OPERATORS = ["matmul", "matmul_t", "add", "mul", "silu_mul", "add_row", "mul_row", "silu", "gelu",
             "exp", "scale", "rmsnorm", "layernorm", "softmax", "sum"]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("kind", OPERATORS)
def test_operator_matches_numpy_for_every_batch(kind, workers):
    rng = np.random.default_rng(len(kind) * 31 + workers)
    g, extra = _graph(kind)
    kernel = etc.compile(g, target="cpu", schedule="static", workers=workers)
    for batch in BATCHES:
        _check(kernel, g, _inputs(rng, extra, batch))


def _mlp() -> etc.Graph:
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 128), "f32")
    nw = g.input("nw", (128,), "f32")
    w1 = g.input("w1", (128, 192), "f32")
    w2 = g.input("w2", (192, 128), "f32")
    h = g.rmsnorm(x, nw, 1e-6)
    a = g.gelu(g.matmul(h, w1))
    y = g.add(g.matmul(a, w2), x)
    g.output(y, g.softmax(y))
    return g


@pytest.mark.parametrize("workers", WORKERS)
def test_mlp_one_compile_serves_every_batch(workers):
    rng = np.random.default_rng(workers)
    g = _mlp()
    kernel = etc.compile(g, target="cpu", schedule="static", workers=workers)
    for batch in BATCHES:
        inputs = {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
                  "w1": _rand(rng, (128, 192), 0.1), "w2": _rand(rng, (192, 128), 0.1)}
        _check(kernel, g, inputs)


def test_two_symbols_bound_independently():
    g = etc.Graph("two_syms")
    M, N = g.symbol("M"), g.symbol("N")
    a = g.input("a", (M, 64), "f32")
    b = g.input("b", (N, 64), "f32")
    g.output(g.matmul(a, b, transpose_b=True))
    kernel = etc.compile(g, workers=2)
    rng = np.random.default_rng(7)
    for m, n in [(1, 1), (40, 3), (3, 70)]:
        _check(kernel, g, {"a": _rand(rng, (m, 64)), "b": _rand(rng, (n, 64))})


@pytest.fixture(scope="module")
def add_kernel():
    g, _ = _graph("add")
    return g, etc.compile(g, workers=2)


def test_wrong_dtype_is_rejected_not_cast(add_kernel):
    _, kernel = add_kernel
    x = np.zeros((4, 96), np.float64)
    with pytest.raises(TypeError, match=r"input 'x' has dtype float64, expected float32"):
        kernel.run(x=x, z=np.zeros((4, 96), np.float32))


def test_wrong_rank_is_rejected(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"input 'x' has rank 1"):
        kernel.run(x=np.zeros(96, np.float32), z=np.zeros((4, 96), np.float32))


def test_static_dim_mismatch_is_rejected(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"input 'z' dim 1 is 95, expected 96"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((4, 95), np.float32))


def test_inconsistent_symbol_binding_names_both_inputs(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(ValueError, match=r"symbol 'B' is bound to 4 by input 'x' but input 'z'"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((5, 96), np.float32))


def test_missing_and_unknown_inputs(add_kernel):
    _, kernel = add_kernel
    with pytest.raises(TypeError, match=r"missing inputs \['z'\]"):
        kernel.run(x=np.zeros((4, 96), np.float32))
    with pytest.raises(TypeError, match=r"unexpected inputs \['q'\]"):
        kernel.run(x=np.zeros((4, 96), np.float32), z=np.zeros((4, 96), np.float32),
                   q=np.zeros(1, np.float32))


def test_every_stage_is_inspectable(add_kernel):
    _, kernel = add_kernel
    assert "event.task" in kernel.ir("graph") and "event.alloc" not in kernel.ir("graph")
    assert "event.wait" not in kernel.ir("event")
    assert "func.func @op_add_worker" in kernel.ir("scheduled")
    assert "event.wait" not in kernel.ir("lowered") and "llvm.func" in kernel.ir("lowered")
    with pytest.raises(ValueError, match="unknown stage 'ptx'"):
        kernel.ir("ptx")


def test_bad_options_are_rejected():
    g, _ = _graph("exp")
    with pytest.raises(ValueError, match=r"workers=0 must be a positive integer"):
        etc.compile(g, workers=0)
    with pytest.raises(ValueError, match=r"target='tpu' is not supported"):
        etc.compile(g, target="tpu")
    with pytest.raises(ValueError, match=r"prefetch='yes' must be True, False or None"):
        etc.compile(g, prefetch="yes")


def test_kernel_runs_what_was_compiled_after_the_graph_changes():
    g = etc.Graph("edited")
    x = g.input("x", (8, 16), "f32")
    y = g.exp(x)
    doubled = g.scale(x, 2.0)
    g.output(y)
    kernel = etc.compile(g, workers=2)
    # `doubled` was an intermediate when compiled; now it is an output too.
    g.output(doubled)
    xv = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    outputs = kernel.run(x=xv)
    assert len(outputs) == 1 and kernel.signature.outputs == ("exp_0",)
    np.testing.assert_allclose(outputs[0], np.exp(xv), rtol=1e-6)
    assert [a.kind for a in kernel.signature.arguments] == ["input", "output", "intermediate"]


def test_an_input_may_be_called_self():
    g = etc.Graph("selfish")
    x = g.input("self", (4, 8), "f32")
    g.output(g.exp(x))
    xv = np.ones((4, 8), np.float32)
    (y,) = etc.compile(g, workers=1).run(**{"self": xv})
    np.testing.assert_allclose(y, np.exp(xv), rtol=1e-6)
    (ref,) = etc.reference.evaluate(g, **{"self": xv})
    np.testing.assert_allclose(y, ref, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_graphs_run_through_etc_compile(dtype):
    """Every operator on f16 and bf16 through the public path, against the
    reference. bf16 conversions must not be left to LLVM: it would call
    compiler-rt's __truncsfbf2, which the JIT cannot resolve on hosts without
    native bf16 conversions."""
    rng = np.random.default_rng(11)
    g = etc.Graph(f"half_{dtype}")
    B = g.symbol("B")
    x = g.input("x", (B, 70), dtype)
    w = g.input("w", (70, 40), dtype)
    b = g.input("b", (70,), dtype)
    outs = [g.matmul(x, w), g.add(x, x), g.mul(b, x), g.silu(x), g.gelu(x), g.exp(x),
            g.scale(x, 0.25), g.rmsnorm(x, b, 1e-5), g.softmax(x), g.sum(x)]
    values, _ = g.topk(x, 3)
    g.output(*outs, values)
    kernel = etc.compile(g, target="cpu", workers=3)
    assert not re.search(r"llvm\.fptrunc .* to bf16", kernel.ir("lowered"))
    storage = np.float16 if dtype == "f16" else np.float32
    for rows in (1, 33):
        inputs = {name: rng.standard_normal(shape).astype(storage)
                  for name, shape in [("x", (rows, 70)), ("w", (70, 40)), ("b", (70,))]}
        if dtype == "bf16":
            inputs = {name: etc.reference.round_bf16(v) for name, v in inputs.items()}
        got = kernel.run(**inputs)
        ref = etc.reference.evaluate(g, **inputs)
        for name, a, r in zip(g.outputs, got, ref):
            assert a.dtype == r.dtype and a.shape == r.shape, name
            a32, r32 = a.astype(np.float32), r.astype(np.float32)
            err = float(np.max(np.abs(a32 - r32) / (1 + np.abs(r32))))
            assert err < 8e-2, f"{name} at B={rows}: relative error {err}"


#: `convert(x: f32) -> f16` calling `callee`, with the C interface name
#: that `ExecutionEngine.invoke("convert", ...)` looks for.
_CALLS = """
llvm.func @{callee}(f32) -> f16
llvm.func @_mlir_ciface_convert(%x: f32) -> f16 {{
  %0 = llvm.call @{callee}(%x) : (f32) -> f16
  llvm.return %0 : f16
}}
"""


def test_jit_gets_the_f16_builtins():
    """Hosts without F16C convert f16 through __truncsfhf2, which no library
    exports to the JIT's search; the CPU runtime gives it libgcc_s's."""
    from mlir import ir

    from etc.runtime import jit

    module = ir.Module.parse(_CALLS.format(callee="__truncsfhf2"), context=ir.Context())
    engine = jit.create(module, "convert")
    jit.lookup(engine, "convert", "convert")
    result = ctypes.c_uint16(0)
    # The packed interface of `convert`: an array of pointers to its arguments.
    arguments = [ctypes.pointer(ctypes.c_float(1.5)), ctypes.pointer(result)]
    packed = (ctypes.c_void_p * 2)(*(ctypes.cast(a, ctypes.c_void_p) for a in arguments))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup("_mlir_ciface_convert"))(packed)
    assert result.value == np.array(1.5, np.float16).view(np.uint16)


def test_jit_failure_names_the_missing_symbol():
    from mlir import ir

    from etc.runtime import jit

    module = ir.Module.parse(_CALLS.format(callee="etc_no_such_symbol"), context=ir.Context())
    engine = jit.create(module, "g")
    with pytest.raises(jit.JITError, match=r"g: the CPU JIT could not compile and link 'convert': "
                                           r"the compiled code calls etc_no_such_symbol, which no "
                                           r"library loaded in this process exports"):
        jit.lookup(engine, "convert", "g")


def test_jit_translation_failure_shows_mlir_diagnostics():
    from mlir import ir

    from etc.runtime import jit

    module = ir.Module.parse("func.func @f() { return }", context=ir.Context())
    with pytest.raises(jit.JITError, match=r"could not translate the lowered module to LLVM IR:\n"
                                           r".*cannot be converted to LLVM IR"):
        jit.create(module, "g")


def test_zero_sized_symbolic_dims_agree_with_the_reference():
    """Zero rows or zero-width rows: kernel and reference both return the
    empty (for sum over empty rows: zero) results, and neither raises."""
    g = etc.Graph("zero_sized")
    B, N = g.symbol("B"), g.symbol("N")
    x = g.input("x", (B, N))
    w = g.input("w", (N,))
    g.output(g.softmax(x), g.rmsnorm(x, w), g.sum(x), g.exp(x))
    kernel = etc.compile(g, workers=2)
    for rows, width in [(3, 0), (0, 5), (0, 0)]:
        inputs = {"x": np.ones((rows, width), np.float32), "w": np.ones(width, np.float32)}
        got = kernel.run(**inputs)
        ref = etc.reference.evaluate(g, **inputs)
        for name, a, r in zip(g.outputs, got, ref):
            assert a.shape == r.shape, (name, rows, width)
            np.testing.assert_array_equal(a, r)


def test_bf16_inputs_are_rounded_alike_by_kernel_and_reference():
    """float32 values that bf16 cannot hold (ties, overflow to infinity, NaN
    payloads) are rounded to nearest even on both sides."""
    g = etc.Graph("bf16_round")
    x = g.input("x", (2, 8), "bf16")
    g.output(g.scale(x, 1.0))
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7FFFFF, 0xFF7FFFFF,
                     0x7FFFFFFF, 0x7F800001, 0x00000001] * 2, np.uint32)
    xv = bits.view(np.float32).reshape(2, 8)
    (got,) = etc.compile(g, workers=1).run(x=xv)
    (ref,) = etc.reference.evaluate(g, x=xv)
    np.testing.assert_array_equal(got, ref)
    expected = np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80], np.uint32) << 16
    np.testing.assert_array_equal(got[0, :5].view(np.uint32), expected)
    assert np.isnan(got[0, 5:7]).all()



def test_bf16_inputs_may_be_given_as_bit_patterns():
    """A uint16 array is taken as bf16 bit patterns, without conversion (a
    model converts its weights once, not at every step); the reference
    reads them alike, and other integer dtypes are still refused."""
    g = etc.Graph("bf16_bits")
    B = g.symbol("B")
    x = g.input("x", (B, 16), "bf16")
    w = g.input("w", (16, 32), "bf16")
    g.output(g.matmul(x, w))
    kernel = etc.compile(g, workers=2)
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((3, 16)).astype(np.float32)
    wv = rng.standard_normal((16, 32)).astype(np.float32)
    bits = etc.bfloat16.to_bits(wv)
    (from_floats,) = kernel.run(x=xv, w=wv)
    (from_bits,) = kernel.run(x=xv, w=bits)
    np.testing.assert_array_equal(from_bits, from_floats)
    np.testing.assert_array_equal(etc.reference.evaluate(g, x=xv, w=bits)[0],
                                  etc.reference.evaluate(g, x=xv, w=wv)[0])
    with pytest.raises(TypeError, match=r"input 'w' has dtype int16, expected float32 or uint16 "
                                        r"bf16 bit patterns for bf16"):
        kernel.run(x=xv, w=bits.view(np.int16))

#: Runs a program that never finishes (its worker cannot make progress), sends
#: itself SIGINT while `run` waits, and reports what is left afterwards.
_INTERRUPTED_RUN = r"""
import os, re, signal, sys, threading, time
import numpy as np
from mlir import ir
import etc
from etc import pipeline
from etc.compiler import compile_module
from etc.runtime import workers

schedule, spin = sys.argv[1], int(sys.argv[2])
g = etc.Graph("stuck")
B = g.symbol("B")
x = g.input("x", (B, 64))
g.output(g.exp(g.exp(x)))
options = pipeline.Options(schedule=schedule, workers=3)
module = ir.Module.parse(g.to_mlir(), context=ir.Context())
for stage in ("event", "scheduled"):
    pipeline.run_stage(module, stage, pipeline.stages(options)[stage])
text = str(module)
worker = text.index("func.func @stuck_worker")
end = text.index("func.func", worker + 1)
# static: no notifies, so every wait spins forever; dynamic: no pushes from
# the worker, so pops spin forever on slots nobody publishes.
removed = r"^\s*event\.(notify|queue_push) .*$"
text = text[:worker] + re.sub(removed, "", text[worker:end], flags=re.M) + text[end:]
module = ir.Module.parse(text, context=module.context)
runtime = compile_module(module, g, options, stage="scheduled").runtime
runtime.spin_microseconds = spin


def interrupt_once_the_workers_spin():
    while sum(t.name.startswith("etc-worker") for t in threading.enumerate()) < 3:
        time.sleep(0.01)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=interrupt_once_the_workers_spin, daemon=True).start()
start = time.monotonic()
try:
    runtime.run({"x": np.ones((256, 64), np.float32)})
    print("finished")
except KeyboardInterrupt:
    # The worker threads stay parked for the next run; none may still be
    # in a call of this one.
    print(f"interrupted after {time.monotonic() - start:.1f} s; "
          f"workers busy: {workers.busy()}")
"""


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("spin", [0, 10_000_000])
def test_ctrl_c_stops_and_joins_the_workers(schedule, spin):
    """Ctrl-C during `run` stops the workers (their waits see the stop flag,
    whether they poll or block: a futex wait lasts 10 ms at most) and waits
    for their calls to return before the buffers they write are freed; then
    the KeyboardInterrupt propagates. Before, the workers went on spinning (and
    writing into freed buffers): the process hung or died of SIGSEGV."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_RUN, schedule, str(spin)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"interrupted after \d+\.\d s; workers busy: 0\n", proc.stdout), \
        proc.stdout + proc.stderr


def test_topk_with_nan_matches_the_reference():
    """NaN ranks above every number in kernel and reference alike, so rows
    with NaNs give NaN values first and distinct indices (the kernel used to
    return -inf values and repeat an index)."""
    g = etc.Graph("topk_nan")
    x = g.input("x", (4, 6))
    values, indices = g.topk(x, 4)
    g.output(values, indices)
    xv = np.array([[1, np.nan, 3, np.nan, np.inf, 2],
                   [np.nan] * 6,
                   [-np.inf, -np.inf, np.nan, -np.inf, -1, -np.inf],
                   [5, 5, 0, 5, -0.0, 5]], np.float32)
    got_values, got_indices = etc.compile(g, workers=2).run(x=xv)
    ref_values, ref_indices = etc.reference.evaluate(g, x=xv)
    np.testing.assert_array_equal(got_indices, ref_indices)
    np.testing.assert_array_equal(got_values, ref_values)
    assert got_indices.tolist()[:3] == [[1, 3, 4, 2], [0, 1, 2, 3], [2, 4, 0, 1]]
    assert all(len(set(row)) == 4 for row in got_indices.tolist())


@pytest.fixture(scope="module")
def bf16_matmul():
    g = etc.Graph("bf16mm")
    B = g.symbol("B")
    g.output(g.matmul(g.input("x", (B, 16), "bf16"), g.input("w", (16, 32), "bf16")))
    return g, etc.compile(g, workers=2)


def test_arrays_seen_before_are_read_again_at_every_run(bf16_matmul):
    """The runtime skips the checks of an array it saw at an earlier run
    (same object, shape, strides and dtype, read as it is), but reads its
    values at every run: changes in place are seen, and so is a new array."""
    g, kernel = bf16_matmul
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = etc.bfloat16.to_bits(rng.standard_normal((16, 32)).astype(np.float32))
    first = kernel.run(x=x, w=w)[0]
    w[:] = etc.bfloat16.to_bits(rng.standard_normal((16, 32)).astype(np.float32))
    x[:] = rng.standard_normal((3, 16))
    np.testing.assert_array_equal(kernel.run(x=x, w=w)[0],
                                  etc.reference.evaluate(g, x=x, w=w)[0])
    assert not np.array_equal(kernel.run(x=x, w=w)[0], first)
    other = w.copy()
    other[0] += 1
    np.testing.assert_array_equal(kernel.run(x=x, w=other)[0],
                                  etc.reference.evaluate(g, x=x, w=other)[0])


def test_converted_inputs_are_converted_at_every_run(bf16_matmul):
    """A float32 array for a bf16 input is rounded into a copy at each run,
    so changes to it in place are seen too."""
    g, kernel = bf16_matmul
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    kernel.run(x=x, w=w)
    w *= 2
    np.testing.assert_array_equal(kernel.run(x=x, w=w)[0],
                                  etc.reference.evaluate(g, x=x, w=w)[0])


def test_an_array_changed_since_an_earlier_run_is_checked_again(bf16_matmul):
    _, kernel = bf16_matmul
    x = np.ones((2, 16), np.float32)
    w = np.ones((16, 32), np.float32)
    kernel.run(x=x, w=w)
    with pytest.raises(TypeError, match=r"input 'w' has dtype float64"):
        kernel.run(x=x, w=w.astype(np.float64))
    with pytest.raises(ValueError, match=r"input 'w' dim 0 is 8, expected 16"):
        kernel.run(x=x, w=np.ones((8, 64), np.float32))
    with pytest.raises(TypeError, match=r"missing inputs \['w'\]"):
        kernel.run(x=x)



def test_partial_binds_inputs_once_and_reads_them_at_every_run(bf16_matmul, tmp_path):
    """`kernel.partial(w=...)` runs like `kernel.run(w=..., x=...)`, reads the
    bound array's current values at every run, and keeps its addresses right
    when runs with and without the bound arrays share a workspace; a saved
    and loaded kernel has it too."""
    g, kernel = bf16_matmul
    rng = np.random.default_rng(7)
    w = etc.bfloat16.to_bits(rng.standard_normal((16, 32)).astype(np.float32))
    x = rng.standard_normal((3, 16)).astype(np.float32)
    bound = kernel.partial(w=w)
    np.testing.assert_array_equal(bound.run(x=x)[0], etc.reference.evaluate(g, x=x, w=w)[0])
    other = etc.bfloat16.to_bits(rng.standard_normal((16, 32)).astype(np.float32))
    # A run on another w in the same workspace (B = 3), then the bound one again.
    np.testing.assert_array_equal(kernel.run(x=x, w=other)[0],
                                  etc.reference.evaluate(g, x=x, w=other)[0])
    np.testing.assert_array_equal(bound.run(x=x)[0], etc.reference.evaluate(g, x=x, w=w)[0])
    w[:] = other
    out = np.empty((3, 32), np.float32)
    bound.run(x=x, out=[out])
    np.testing.assert_array_equal(out, etc.reference.evaluate(g, x=x, w=other)[0])
    kernel.save(tmp_path / "mm.etc")
    loaded = etc.runtime.load(tmp_path / "mm.etc").partial(w=w)
    np.testing.assert_array_equal(loaded.run(x=x[:1])[0],
                                  etc.reference.evaluate(g, x=x[:1], w=w)[0])


def test_partial_rejects_what_it_cannot_bind(bf16_matmul):
    _, kernel = bf16_matmul
    w = np.ones((16, 32), np.float32)
    with pytest.raises(TypeError, match=r"constants \['v'\] are not inputs"):
        kernel.partial(v=w)
    with pytest.raises(ValueError, match=r"input 'w' dim 0 is 8, expected 16"):
        kernel.partial(w=np.ones((8, 32), np.float32))
    with pytest.raises(TypeError, match=r"input 'w' has dtype float64"):
        kernel.partial(w=w.astype(np.float64))
    bound = kernel.partial(w=w)
    with pytest.raises(TypeError, match=r"inputs \['w'\] are bound as constants"):
        bound.run(x=np.ones((2, 16), np.float32), w=w)
    with pytest.raises(TypeError, match=r"missing inputs \['x'\]"):
        bound.run()


def test_partial_binds_the_symbols_of_its_arrays():
    """A bound array of symbolic shape (a KV cache) binds its symbols for
    every run with it: the other inputs must agree, and an error names both."""
    g = etc.Graph("sum")
    m = g.symbol("M")
    a, b = g.input("a", (m, 8)), g.input("b", (m, 8))
    g.output(g.add(a, b))
    kernel = etc.compile(g, workers=2)
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((3, 8)).astype(np.float32) for _ in range(2))
    bound = kernel.partial(a=x)
    np.testing.assert_array_equal(bound.run(b=y)[0], x + y)
    x[:] = 1.0  # read again at the next run
    np.testing.assert_array_equal(bound.run(b=y)[0], 1.0 + y)
    with pytest.raises(ValueError, match=r"symbol 'M' is bound to 3 by input 'a' but input "
                                         r"'b' dim 0 is 4"):
        bound.run(b=np.ones((4, 8), np.float32))
    # Unbound runs of other sizes share the runtime meanwhile.
    np.testing.assert_array_equal(kernel.run(a=np.ones((5, 8), np.float32),
                                             b=np.ones((5, 8), np.float32))[0], 2.0)
    np.testing.assert_array_equal(bound.run(b=y)[0], 1.0 + y)


def test_partial_refuses_index_inputs():
    g = etc.Graph("gather")
    table = g.input("table", (8, 4), "f32")
    ids = g.input("ids", (4,), "i32")
    g.index_range(ids, below=8)
    g.output(g.embedding(table, ids))
    kernel = etc.compile(g, workers=1)
    with pytest.raises(ValueError, match=r"constant 'ids' is an index input"):
        kernel.partial(ids=np.zeros(4, np.int32))
    bound = kernel.partial(table=np.arange(32, dtype=np.float32).reshape(8, 4))
    np.testing.assert_array_equal(bound.run(ids=np.array([7, 0, 1, 2], np.int32))[0][0],
                                  [28, 29, 30, 31])
