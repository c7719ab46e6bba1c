"""etc.Graph: operators, L1 IR content, error messages, and round-trips through etc-opt."""

import ctypes
import re

import numpy as np
import pytest
from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.passmanager import PassManager
from mlir.runtime import get_ranked_memref_descriptor

import etc
from etc.graph_values import Argument
from etc.dialects import event
from etc.reference import bind_symbols, evaluate, round_bf16


def mlp(dtype="f32"):
    g = etc.Graph("mlp")
    B = g.symbol("B")
    x = g.input("x", (B, 256), dtype)
    w1 = g.input("w1", (256, 512), dtype)
    w2 = g.input("w2", (512, 256), dtype)
    h = g.matmul(x, w1)
    a = g.silu(h)
    y = g.add(g.matmul(a, w2), x)
    g.output(y)
    return g


def tasks(module):
    graph = module.body.operations[0]
    return [op for op in graph.regions[0].blocks[0].operations if op.operation.name == "event.task"]


def task_text(text, name):
    """The header line of task `name` in printed IR."""
    (line,) = [l for l in text.splitlines() if f'event.task "{name}"' in l]
    return line


def one_op_graph(op, dtype="f32", rows="B", cols=48):
    """A graph with a single operator of kind `op` on x: (rows, cols)."""
    g = etc.Graph(f"g_{op}")
    if rows == "B":
        rows = g.symbol("B")
    x = g.input("x", (rows, cols), dtype)
    if op == "matmul":
        w = g.input("w", (cols, 40), dtype)
        y = g.matmul(x, w)
    elif op == "matmul_t":
        w = g.input("w", (40, cols), dtype)
        y = g.matmul(x, w, transpose_b=True)
    elif op in ("add", "mul"):
        z = g.input("z", (rows, cols), dtype)
        y = getattr(g, op)(x, z)
    elif op in ("add_bcast", "mul_bcast"):
        b = g.input("b", (cols,), dtype)
        y = getattr(g, op.split("_")[0])(x, b)
    elif op == "scale":
        y = g.scale(x, 0.5)
    elif op == "rmsnorm":
        w = g.input("w", (cols,), dtype)
        y = g.rmsnorm(x, w, 1e-5)
    else:
        y = getattr(g, op)(x)
    g.output(y)
    return g


ALL_OPS = ["matmul", "matmul_t", "add", "mul", "add_bcast", "mul_bcast", "silu", "gelu",
           "exp", "scale", "rmsnorm", "softmax", "sum"]


# ----------------------------------------------------------------------
# Every operator builds, verifies and round-trips
# ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("op", ALL_OPS)
def test_every_operator_builds_and_verifies(op, dtype):
    g = one_op_graph(op, dtype)
    module = g.build()
    assert module.operation.verify()
    (task,) = tasks(module)
    assert isinstance(task, event.TaskOp)
    assert task.attributes["name"] == ir.StringAttr.get(f"{op.split('_')[0]}_0",
                                                        context=module.context)
    text = g.to_mlir()
    assert "event.lane_id" in text and "event.lane_count" in text
    if dtype != "f32":
        assert "arith.extf" in text and "arith.truncf" in text
    else:
        assert "arith.extf" not in text and "arith.truncf" not in text
    # Only target-neutral ops in the tile bodies.
    dialects = set(re.findall(r"= ([a-z_]+)\.[a-z_]+", text)) | set(
        re.findall(r"^\s+([a-z_]+)\.[a-z_]+ ", text, re.M))
    assert dialects <= {"arith", "math", "memref", "scf", "event", "affine", "func"}, dialects
    math_ops = set(re.findall(r"math\.([a-z]+)", text))
    assert math_ops <= {"exp", "sqrt", "rsqrt"}


@pytest.mark.parametrize("op", ALL_OPS)
def test_round_trip_through_etc_opt(op, etc_opt):
    text = one_op_graph(op, "f16").to_mlir()
    once = etc_opt(text)
    twice = etc_opt(once)
    assert once == twice
    assert "event.task" in once


def test_mlp_round_trip(etc_opt):
    text = mlp().to_mlir()
    once = etc_opt(text)
    assert etc_opt(once) == once
    # The generic form also parses back to the same IR.
    generic = etc_opt(text, "--mlir-print-op-generic")
    assert etc_opt(generic) == once


def test_build_in_caller_context():
    with ir.Context() as ctx:
        module = mlp().build(ctx)
        assert module.context is ctx
        assert isinstance(tasks(module)[0], event.TaskOp)


# ----------------------------------------------------------------------
# IR content
# ----------------------------------------------------------------------


def test_mlp_arguments_and_metadata():
    g = mlp()
    assert g.name == "mlp"
    assert g.symbols == ["B"]
    assert g.outputs == ["add_0"]
    assert g.arguments == [
        Argument("symbol", "B", (), "index"),
        Argument("input", "x", ("B", 256), "f32"),
        Argument("input", "w1", (256, 512), "f32"),
        Argument("input", "w2", (512, 256), "f32"),
        Argument("output", "add_0", ("B", 256), "f32"),
        Argument("intermediate", "matmul_0", ("B", 512), "f32"),
        Argument("intermediate", "silu_0", ("B", 512), "f32"),
        Argument("intermediate", "matmul_1", ("B", 256), "f32"),
    ]
    text = g.to_mlir()
    header = text.splitlines()[[i for i, l in enumerate(text.splitlines())
                                if "event.graph" in l][0]]
    assert header.strip().startswith(
        "event.graph @mlp(%B: index, %x: memref<?x256xf32>, %w1: memref<256x512xf32>, "
        "%w2: memref<512x256xf32>, %add_0: memref<?x256xf32>, "
        "%matmul_0: memref<?x512xf32> {event.intermediate}, "
        "%silu_0: memref<?x512xf32> {event.intermediate}, "
        "%matmul_1: memref<?x256xf32> {event.intermediate})")


def test_mlp_tasks_grids_and_footprints():
    text = mlp().to_mlir()
    names = re.findall(r'event\.task "([a-z_0-9]+)"', text)
    assert names == ["matmul_0", "silu_0", "matmul_1", "add_0"]
    # One symbolic extent, shared by every task.
    assert len(re.findall(r"affine\.apply", text)) == 1
    assert "affine_map<()[s0] -> (s0 ceildiv 32)>" in text
    rows = re.search(r"(%\w+) = affine\.apply #map\(\)\[%B\]", text).group(1)
    assert re.search(r"%c8 = arith.constant 8 : index", text)
    assert re.search(r"%c4 = arith.constant 4 : index", text)
    mm0 = task_text(text, "matmul_0")
    assert f"grid({rows}, %c8)" in mm0
    assert "reads(%x : memref<?x256xf32> (d0, d1) -> (d0 * 32, 0) [32, ?], " \
           "%w1 : memref<256x512xf32> (d0, d1) -> (0, d1 * 64) [?, 64])" in mm0
    assert "writes(%matmul_0 : memref<?x512xf32> (d0, d1) -> (d0 * 32, d1 * 64) [32, 64])" in mm0
    silu = task_text(text, "silu_0")
    assert f"grid({rows}, %c8)" in silu
    assert "reads(%matmul_0 : memref<?x512xf32> (d0, d1) -> (d0 * 32, d1 * 64) [32, 64])" in silu
    add = task_text(text, "add_0")
    assert f"grid({rows}, %c4)" in add
    assert "%x : memref<?x256xf32> (d0, d1) -> (d0 * 32, d1 * 64) [32, 64]" in add
    assert "waits" not in text and "notifies" not in text  # L1: no events yet


def test_edge_tiles_clipped_with_memref_dim_and_minsi():
    text = mlp().to_mlir()
    body = text.split("func.func private @mlp_tile_silu_0")[1].split("func.func")[0]
    assert "memref.dim" in body and "arith.minsi" in body
    assert re.search(r"scf\.for %\w+ = %\d+ to %\d+ step %\d+", body)


def test_static_divisible_shapes_need_no_clipping():
    g = etc.Graph("s")
    x = g.input("x", (64, 128))
    g.output(g.exp(x))
    text = g.to_mlir()
    assert "arith.minsi" not in text and "memref.dim" not in text
    assert "grid(%c2, %c2)" in text


def test_static_ragged_shapes_are_clipped():
    g = etc.Graph("s")
    x = g.input("x", (40, 100))
    g.output(g.exp(x))
    text = g.to_mlir()
    assert "grid(%c2, %c2)" in text
    assert text.count("arith.minsi") == 2


def test_tiles_clamped_to_small_static_dims():
    g = etc.Graph("s")
    B = g.symbol("B")
    x = g.input("x", (B, 16))
    w = g.input("w", (16, 8))
    y = g.matmul(x, w)
    g.output(g.silu(y))
    text = g.to_mlir()
    assert "(d0, d1) -> (d0 * 32, d1 * 8) [32, 8]" in task_text(text, "matmul_0")
    assert "(d0, d1) -> (d0 * 32, d1 * 8) [32, 8]" in task_text(text, "silu_0")


def test_matmul_tile_override_and_transpose_b():
    g = etc.Graph("t")
    B = g.symbol("B")
    x = g.input("x", (B, 64))
    w = g.input("w", (256, 64))
    g.output(g.matmul(x, w, transpose_b=True, tile=(16, 128)))
    line = task_text(g.to_mlir(), "matmul_0")
    assert "%x : memref<?x64xf32> (d0, d1) -> (d0 * 16, 0) [16, ?]" in line
    assert "%w : memref<256x64xf32> (d0, d1) -> (d1 * 128, 0) [128, ?]" in line
    assert "(d0, d1) -> (d0 * 16, d1 * 128) [16, 128]" in line
    assert "affine_map<()[s0] -> (s0 ceildiv 16)>" in g.to_mlir()


def test_rowwise_footprints():
    g = etc.Graph("r")
    B = g.symbol("B")
    x = g.input("x", (B, 96))
    w = g.input("w", (96,))
    n = g.rmsnorm(x, w, 1e-5)
    s = g.softmax(n)
    t = g.sum(s, tile=(8,))
    g.output(t)
    text = g.to_mlir()
    rms = task_text(text, "rmsnorm_0")
    assert "%x : memref<?x96xf32> (d0) -> (d0 * 32, 0) [32, ?]" in rms
    assert "%w : memref<96xf32> (d0) -> (0) [?]" in rms
    assert "writes(%rmsnorm_0 : memref<?x96xf32> (d0) -> (d0 * 32, 0) [32, ?])" in rms
    assert "writes(%sum_0 : memref<?xf32> (d0) -> (d0 * 8) [8])" in task_text(text, "sum_0")
    assert "math.rsqrt" in text and "arith.maxnumf" in text


def test_broadcast_footprint_and_1d_elementwise():
    g = etc.Graph("b")
    B = g.symbol("B")
    x = g.input("x", (B, 200))
    bias = g.input("bias", (200,))
    y = g.add(x, bias)
    z = g.mul(bias, y)
    v = g.exp(bias)
    g.output(z, v)
    text = g.to_mlir()
    assert "%bias : memref<200xf32> (d0, d1) -> (d1 * 64) [64]" in task_text(text, "add_0")
    assert "%bias : memref<200xf32> (d0, d1) -> (d1 * 64) [64]" in task_text(text, "mul_0")
    assert "grid(%c4)" in task_text(text, "exp_0")
    assert "(d0) -> (d0 * 64) [64]" in task_text(text, "exp_0")
    assert g.outputs == ["mul_0", "exp_0"]


def test_grid_values_are_shared():
    g = etc.Graph("c")
    B = g.symbol("B")
    S = g.symbol("S")
    x = g.input("x", (B, 64))
    y = g.input("y", (S, 64))
    a = g.exp(x)
    b = g.exp(y)
    c = g.silu(a)
    g.output(b, c)
    text = g.to_mlir()
    assert text.count("affine.apply") == 2  # one per (symbol, tile)
    graph = text.split("event.graph")[1].split("\n  }\n")[0]
    graph_level = [l for l in graph.splitlines() if l.startswith("    %")]
    assert len([l for l in graph_level if "arith.constant" in l]) == 1  # the shared %c1


def test_named_results_out_and_intermediates():
    g = etc.Graph("n")
    B = g.symbol("B")
    x = g.input("x", (B, 32))
    scratch = g.tensor("buf", (B, 32))
    unused = g.tensor("unused", (4,))
    a = g.exp(x, name="a")
    r = g.silu(a, out=scratch)
    assert r is scratch
    b = g.scale(scratch, 2.0)
    g.gelu(b, out=scratch)   # reuse: the buffer is written a second time
    c = g.add(scratch, x)
    g.output(c)
    kinds = [(a.kind, a.name) for a in g.arguments]
    assert kinds == [("symbol", "B"), ("input", "x"), ("output", "add_0"),
                     ("intermediate", "buf"), ("intermediate", "unused"),
                     ("intermediate", "a"), ("intermediate", "scale_0")]
    text = g.to_mlir()
    assert "%buf: memref<?x32xf32> {event.intermediate}" in text
    assert "%unused: memref<4xf32> {event.intermediate}" in text
    assert "writes(%buf" in task_text(text, "silu_0")
    assert "writes(%buf" in task_text(text, "gelu_0")
    assert "reads(%buf" in task_text(text, "add_0")


def test_output_order_is_call_order():
    g = etc.Graph("o")
    x = g.input("x", (8, 8))
    a = g.exp(x)
    b = g.silu(x)
    g.output(b)
    g.output(a)
    assert g.outputs == ["silu_0", "exp_0"]
    assert [a.name for a in g.arguments if a.kind == "output"] == ["silu_0", "exp_0"]


def test_dtypes_in_memref_types():
    for dtype, elem in [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16")]:
        text = mlp(dtype).to_mlir()
        assert f"%x: memref<?x256x{elem}>" in text


def test_symbol_name_strings_in_shapes():
    g = etc.Graph("s")
    g.symbol("B")
    x = g.input("x", ("B", 8))
    assert g.arguments[1].shape == ("B", 8)
    assert x.symbolic_shape == ("B", 8)


# ----------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------


def test_matmul_shape_mismatch_names_operator_operands_and_shapes():
    g = etc.Graph("e")
    B = g.symbol("B")
    x = g.input("x", (B, 256))
    w = g.input("w", (128, 512))
    with pytest.raises(ValueError, match=r"matmul.*'a'.*\(B, 256\).*'b'.*\(128, 512\)"):
        g.matmul(x, w)
    with pytest.raises(ValueError, match=r"matmul.*'b'.*\(128, 512\)"):
        g.matmul(x, w, transpose_b=True)


def test_symbolic_dims_must_match():
    g = etc.Graph("e")
    B, S = g.symbol("B"), g.symbol("S")
    x = g.input("x", (B, 16))
    y = g.input("y", (S, 16))
    with pytest.raises(ValueError, match=r"add: shapes do not match.*'a'.*\(B, 16\).*'b'.*\(S, 16\)"):
        g.add(x, y)
    w = g.input("w", (S, 16))
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ.*\(B, 16\).*\(S, 16\)"):
        g.matmul(x, w)


def test_broadcast_mismatch():
    g = etc.Graph("e")
    x = g.input("x", (4, 16))
    b = g.input("b", (8,))
    with pytest.raises(ValueError, match=r"mul: shapes do not match.*\(4, 16\).*\(8,\)"):
        g.mul(x, b)


def test_rmsnorm_weight_mismatch():
    g = etc.Graph("e")
    x = g.input("x", (4, 16))
    w = g.input("w", (15,))
    with pytest.raises(ValueError, match=r"rmsnorm: operand 'weight' \('w', shape \(15,\).*\(16,\)"):
        g.rmsnorm(x, w, 1e-6)
    with pytest.raises(ValueError, match=r"softmax: expects a 2-D operand.*'x'.*\(15,\)"):
        g.softmax(w)


def test_rmsnorm_eps_is_a_finite_non_negative_float():
    """NaN or inf would make every row NaN or zero: refused by name."""
    g = etc.Graph("t")
    x, w = g.input("x", (4, 8), "f32"), g.input("w", (8,), "f32")
    for bad in (-1.0, float("nan"), float("inf"), "1e-5", True):
        with pytest.raises(ValueError, match=r"rmsnorm: 'eps' must be a finite non-negative"):
            g.rmsnorm(x, w, bad)


def test_unknown_dtype_names_the_argument():
    g = etc.Graph("e")
    with pytest.raises(ValueError, match=r"input 'x'.*unknown dtype 'f64'.*'dtype'"):
        g.input("x", (4, 4), "f64")
    with pytest.raises(ValueError, match=r"tensor 't'.*unknown dtype 'int8'"):
        g.tensor("t", (4, 4), "int8")


def test_mixed_dtypes():
    g = etc.Graph("e")
    x = g.input("x", (4, 4), "f32")
    y = g.input("y", (4, 4), "f16")
    with pytest.raises(ValueError, match=r"add: mixed dtypes.*'x'.*f32.*'y'.*f16"):
        g.add(x, y)
    with pytest.raises(ValueError, match=r"matmul: mixed dtypes"):
        g.matmul(x, y)


def test_output_from_another_graph():
    g, h = etc.Graph("g"), etc.Graph("h")
    x = h.input("x", (4, 4))
    y = h.exp(x)
    with pytest.raises(ValueError, match=r"output: tensor 'exp_0' is not produced by graph 'g'"):
        g.output(y)
    gx = g.input("x", (4, 4))
    with pytest.raises(ValueError, match=r"add: operand 'b' \('exp_0'\) belongs to graph 'h'"):
        g.add(gx, y)


def test_no_outputs():
    g = etc.Graph("e")
    x = g.input("x", (4, 4))
    g.exp(x)
    with pytest.raises(ValueError, match=r"Graph 'e' has no outputs"):
        g.to_mlir()


def test_output_input_or_twice():
    g = etc.Graph("e")
    x = g.input("x", (4, 4))
    with pytest.raises(ValueError, match=r"output: tensor 'x' is an input"):
        g.output(x)
    y = g.exp(x)
    g.output(y)
    with pytest.raises(ValueError, match=r"output: tensor 'exp_0' is already an output"):
        g.output(y)


def test_unwritten_tensor_read_is_a_cycle():
    g = etc.Graph("e")
    x = g.input("x", (4, 4))
    t = g.tensor("t", (4, 4))
    with pytest.raises(ValueError, match=r"add: operand 'b' reads tensor 't' before anything writes it"):
        g.add(x, t)
    # The classic cycle: t = exp(t) with nothing having written t.
    with pytest.raises(ValueError, match=r"exp: operand 'x' reads tensor 't' before anything writes it"):
        g.exp(t, out=t)
    with pytest.raises(ValueError, match=r"output: tensor 't' is never produced"):
        g.output(t)


def test_out_errors():
    g = etc.Graph("e")
    x = g.input("x", (4, 4))
    t = g.tensor("t", (4, 8))
    with pytest.raises(ValueError, match=r"exp: out= tensor 't' has shape \(4, 8\).*result has shape \(4, 4\)"):
        g.exp(x, out=t)
    with pytest.raises(ValueError, match=r"exp: out= tensor 'x' is an input tensor"):
        g.exp(x, out=x)
    u = g.tensor("u", (4, 4))
    g.exp(x, out=u)
    with pytest.raises(ValueError, match=r"silu: out= tensor 'u' is also operand 'x'"):
        g.silu(u, out=u)
    v = g.tensor("v", (4, 4), "f16")
    with pytest.raises(ValueError, match=r"dtype f16.*dtype f32"):
        g.exp(x, out=v)


def test_names_and_shapes_are_checked():
    g = etc.Graph("e")
    g.input("x", (4, 4))
    with pytest.raises(ValueError, match=r"name 'x' is already used"):
        g.input("x", (4, 4))
    with pytest.raises(ValueError, match=r"name must be a Python identifier"):
        g.input("bad name", (4, 4))
    with pytest.raises(ValueError, match=r"unknown symbol 'N'"):
        g.input("y", ("N", 4))
    with pytest.raises(ValueError, match=r"rank 4; ranks 1 to 3"):
        g.input("z", (2, 2, 2, 2))
    with pytest.raises(ValueError, match=r"must be positive"):
        g.input("z", (0, 2))
    with pytest.raises(ValueError, match=r"input 'z': dimension 9223372036854775808 in shape "
                                         r"\(2, 9223372036854775808\) does not fit a 64-bit index"):
        g.input("z", (2, 2**63))
    with pytest.raises(ValueError, match=r"tensor 't': dimension 18446744073709551616 .* 64-bit"):
        g.tensor("t", (2**64,))
    assert g.input("big", (2**63 - 1,)).shape == (2**63 - 1,)
    other = etc.Graph("o").symbol("B")
    with pytest.raises(ValueError, match=r"symbol 'B' belongs to graph 'o'"):
        g.input("z", (other, 2))


def test_bad_tiles_and_constants():
    g = etc.Graph("e")
    x = g.input("x", (4, 4))
    with pytest.raises(ValueError, match=r"matmul: tile \(0, 4\) must be 2 positive"):
        g.matmul(x, x, tile=(0, 4))
    with pytest.raises(ValueError, match=r"scale: constant 'c' must be a Python float"):
        g.scale(x, "2")


# ----------------------------------------------------------------------
# Tile bodies run on the CPU through the upstream bindings
# ----------------------------------------------------------------------

def to_func(text):
    """Rewrites printed L1 IR into a func.func that runs every task's tiles in
    order with one lane (lane id 0, lane count 1)."""
    out = []
    rank_stack = None
    in_graph = False
    for line in text.splitlines():
        if "event.graph @" in line:
            in_graph = True
            line = re.sub(r" \{event\.intermediate\}", "", line)
            line = line.replace("event.graph @", "func.func @").rstrip(" {") + " attributes {llvm.emit_c_interface} {"
            out.append(line)
            out.append("    %zero_x = arith.constant 0 : index")
            out.append("    %one_x = arith.constant 1 : index")
            continue
        m = re.match(r"(\s+)event\.task \"\w+\" grid\(([^)]*)\)", line)
        if m:
            grid = m.group(2).split(", ")
            pending = grid
            continue
        m = re.match(r"\s+\^bb0\((.*)\):", line)
        if m:
            idx = [a.split(":")[0] for a in m.group(1).split(", ")]
            for v, n in zip(idx, pending):
                out.append(f"    scf.for {v} = %zero_x to {n} step %one_x {{")
            rank_stack = len(idx)
            continue
        if rank_stack and line == "    }":
            out.append("    " + "} " * rank_stack)
            rank_stack = None
            continue
        if line == "  }" and in_graph:
            out.append("    return")
            in_graph = False
        line = line.replace("event.lane_id", "arith.constant 0 : index").replace("event.lane_count", "arith.constant 1 : index")
        out.append(line)
    return "\n".join(out)

PIPE = ("builtin.module(lower-affine, convert-scf-to-cf, arith-expand{include-bf16=true}, convert-math-to-llvm, "
        "expand-strided-metadata, finalize-memref-to-llvm, convert-arith-to-llvm, convert-index-to-llvm, "
        "convert-func-to-llvm, convert-cf-to-llvm, reconcile-unrealized-casts)")

def run_on_cpu(g, **inputs):
    """Runs the tile bodies of `g` with the upstream ExecutionEngine; returns
    (outputs, reference outputs)."""
    syms = bind_symbols(g, inputs)
    text = to_func(g.to_mlir())
    ctx = ir.Context()
    with ctx:
        m = ir.Module.parse(text)
        PassManager.parse(PIPE).run(m.operation)
        ee = ExecutionEngine(m, opt_level=0)
    args, outs = [], {}
    keep = []
    for a in g.arguments:
        if a.kind == "symbol":
            v = ctypes.c_int64(syms[a.name]); keep.append(v); args.append(ctypes.pointer(v)); continue
        shape = tuple(syms[d] if isinstance(d, str) else d for d in a.shape)
        if a.kind == "input":
            arr = inputs[a.name]
        else:
            arr = np.zeros(shape, np.float32)
        if a.dtype == "f16": arr = np.ascontiguousarray(arr.astype(np.float16)).view(np.uint16)
        elif a.dtype == "bf16": arr = (np.ascontiguousarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else: arr = np.ascontiguousarray(arr, np.float32)
        outs[a.name] = arr
        d = get_ranked_memref_descriptor(arr); keep.append(d)
        args.append(ctypes.pointer(ctypes.pointer(d)))
    ee.invoke(g.name, *args)
    res = []
    for a in g.arguments:
        if a.kind != "output": continue
        arr = outs[a.name]
        if a.dtype == "f16": arr = arr.view(np.float16)
        elif a.dtype == "bf16": arr = (arr.astype(np.uint32) << 16).view(np.float32)
        res.append(arr)
    return res, evaluate(g, **inputs)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_tile_bodies_compute_the_reference(dtype):
    """Every operator's tile bodies, run sequentially on the CPU with one lane,
    match etc.reference at several values of the symbolic dimension."""
    rng = np.random.default_rng(1)
    g = etc.Graph("ops")
    B = g.symbol("B")
    x = g.input("x", (B, 70), dtype)
    z = g.input("z", (B, 70), dtype)
    w = g.input("w", (70, 90), dtype)
    wt = g.input("wt", (90, 70), dtype)
    b = g.input("b", (70,), dtype)
    t = g.tensor("t", (B, 70), dtype)
    g.exp(z, out=t)
    outs = [g.matmul(x, w), g.matmul(x, wt, transpose_b=True, tile=(8, 16)), g.add(x, t),
            g.mul(b, x, tile=(5, 7)), g.silu(x), g.gelu(x), g.exp(x), g.scale(x, 0.25),
            g.rmsnorm(x, b, 1e-5, tile=(3,)), g.softmax(x), g.sum(x), g.exp(b, tile=(32,))]
    g.output(*outs)
    npd = np.float16 if dtype == "f16" else np.float32
    tol = {"f32": 1e-4, "f16": 2e-2, "bf16": 8e-2}[dtype]
    for rows in (1, 33, 70):
        ins = {n: rng.standard_normal(s).astype(npd) for n, s in
               [("x", (rows, 70)), ("z", (rows, 70)), ("w", (70, 90)), ("wt", (90, 70)),
                ("b", (70,))]}
        if dtype == "bf16":
            ins = {k: round_bf16(v) for k, v in ins.items()}
        got, ref = run_on_cpu(g, **ins)
        assert len(got) == len(ref) == 12
        for name, a, r in zip(g.outputs, got, ref):
            assert a.shape == r.shape, name
            a32, r32 = a.astype(np.float32), r.astype(np.float32)
            err = float(np.max(np.abs(a32 - r32) / (1 + np.abs(r32))))
            assert err < tol, f"{name} at B={rows}: relative error {err}"
