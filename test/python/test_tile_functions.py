"""Tile kernels as functions and table-driven programs: identical layers share
their code, so a program does not grow with model depth.

* each distinct tile computation is one private `func.func {event.tile}`,
  called by every task that computes it;
* the scheduled program's code depends on the task *families*, not the
  tasks: adding identical layers adds rows to the constant tables only;
* the families' code runs every task right, whatever buffers and events its
  record names (numerics of deep stacks against NumPy, both schedules).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mlir import ir

import etc
from etc.reference import round_bf16
from ptxas_check import assemble, needs_ptxas


def stack(layers: int, hidden: int = 64, ffn: int = 96, dtype: str = "f32") -> etc.Graph:
    """A Llama-like decoder stack without attention, `layers` deep."""
    g = etc.Graph(f"stack{layers}")
    B = g.symbol("B")
    x = g.input("x", (B, hidden), dtype)
    for i in range(layers):
        norm = g.input(f"norm{i}", (hidden,), dtype)
        wg = g.input(f"wg{i}", (hidden, ffn), dtype)
        wu = g.input(f"wu{i}", (hidden, ffn), dtype)
        wd = g.input(f"wd{i}", (ffn, hidden), dtype)
        h = g.rmsnorm(x, norm)
        x = g.add(x, g.matmul(g.mul(g.silu(g.matmul(h, wg)), g.matmul(h, wu)), wd))
    g.output(x)
    return g


def tile_functions(text: str) -> list[str]:
    """The tile functions' names, without the `<graph>_` prefix."""
    return [name.split("_", 1)[1] for name in
            re.findall(r"func\.func private @(\w+)\(.*\{event\.tile\}", text)]


def count_ops(text: str) -> int:
    with ir.Context() as context:
        etc.register_dialects(context)
        module = ir.Module.parse(text)
        total = 0

        def walk(op):
            nonlocal total
            total += 1
            for region in op.regions:
                for block in region.blocks:
                    for child in block.operations:
                        walk(child.operation)
        walk(module.operation)
        return total


def test_identical_layers_share_their_tile_functions():
    one, two, eight = (tile_functions(stack(n).to_mlir()) for n in (1, 2, 8))
    # rmsnorm, the two matmul shapes, silu, mul, add: one function each.
    assert len(one) == 6, one
    assert two == one and eight == one
    text = stack(2).to_mlir()
    for name in one:
        calls = re.findall(rf"func\.call @stack2_{name}\(", text)
        assert len(calls) >= 2, (name, len(calls))  # every layer calls it


def test_aliased_operands_get_their_own_function():
    # add(x, x) reads x through its first parameter; add(x, y) must not
    # reuse that function, which would compute x + x.
    g = etc.Graph("alias")
    B = g.symbol("B")
    x = g.input("x", (B, 8))
    y = g.input("y", (B, 8))
    g.output(g.add(x, x), g.add(x, y))
    assert len(tile_functions(g.to_mlir())) == 2
    kernel = etc.compile(g)
    xs = np.arange(24, dtype=np.float32).reshape(3, 8)
    ys = np.ones((3, 8), np.float32)
    twice, plus = kernel.run(x=xs, y=ys)
    np.testing.assert_array_equal(twice, xs + xs)
    np.testing.assert_array_equal(plus, xs + ys)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_program_size_does_not_grow_with_depth(target, schedule):
    """More identical layers add table rows, not code. The first and last
    layers differ from the others (nothing before the first, no reader after
    the last); once the middle layers' families have two tasks (so that
    `tasks x tiles` no longer folds to `tiles`), the scheduled program keeps
    the same number of ops, and the lowered text grows by the tables'
    entries only."""
    sizes = {}
    for layers in (3, 4, 5, 8):
        kernel = etc.compile(stack(layers), target=target, schedule=schedule, workers=2)
        sizes[layers] = (count_ops(kernel.ir("scheduled")), len(kernel.ir("lowered")))
    assert sizes[4][0] == sizes[5][0] == sizes[8][0], sizes
    assert sizes[3][0] <= sizes[4][0] <= sizes[3][0] + 16, sizes
    per_layer = (sizes[8][1] - sizes[4][1]) / 4
    assert 0 < per_layer < 2000, sizes


def test_families_are_shared_by_identical_layers():
    kernel = etc.compile(stack(4), schedule="static")
    text = kernel.ir("scheduled")
    families = re.search(r"@stack4_task_family : memref<(\d+)xi32> = dense<\[([\d, ]+)\]>", text)
    assert families, text[:2000]
    ids = [int(v) for v in families.group(2).split(",")]
    assert len(ids) == 4 * 7  # seven tasks per layer
    # The first layer waits on nothing from before and the last layer's
    # result is read by nobody; the layers between repeat the same families.
    per_layer = [ids[7 * k:7 * k + 7] for k in range(4)]
    assert per_layer[1] == per_layer[2], per_layer
    assert len(set(ids)) == 9, ids


def _inputs(g: etc.Graph, batch: int, rng, dtype=np.float32) -> dict:
    inputs = {}
    for arg in g.arguments:
        if arg.kind != "input":
            continue
        shape = tuple(batch if d == "B" else d for d in arg.shape)
        scale = 0.3 if len(shape) == 2 and arg.name != "x" else 1.0
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        inputs[arg.name] = value
    return inputs


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("workers", [1, 3])
def test_deep_stacks_match_numpy(schedule, workers):
    """Every layer runs the family code with its own record: wrong buffer or
    event offsets would mix the layers' weights or order."""
    g = stack(5)
    kernel = etc.compile(g, schedule=schedule, workers=workers)
    rng = np.random.default_rng(5)
    for batch in (1, 7, 40):
        inputs = _inputs(g, batch, rng)
        (got,) = kernel.run(**inputs)
        (want,) = etc.reference.evaluate(g, **inputs)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_bf16_stack_matches_numpy():
    g = stack(3, dtype="bf16")
    kernel = etc.compile(g, schedule="dynamic", workers=2)
    rng = np.random.default_rng(9)
    inputs = {k: round_bf16(v) for k, v in _inputs(g, 9, rng).items()}
    (got,) = kernel.run(**inputs)
    (want,) = etc.reference.evaluate(g, **inputs)
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)


def test_ptx_of_a_deep_stack_has_few_parameters():
    """Buffers come through the table, so a 40-layer stack (161 buffers)
    still has a handful of kernel parameters."""
    g = stack(40)
    assert len([a for a in g.arguments if a.kind != "symbol"]) > 160
    ptx = etc.compile(g, target="cuda").ptx
    entry = re.search(r"\.entry stack40_worker\((.*?)\)", ptx, re.S).group(1)
    assert entry.count(".param") == 1 + 5 + 5  # B, the table, the counters


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_hundreds_of_buffers_assemble_with_ptxas(chip, schedule, tmp_path):
    """An 80-layer stack has 321 weight inputs and 561 intermediates, more
    than 4 times the ~77 buffers a kernel's 4 KB of parameters once held:
    its PTX assembles for the chip, and the worker's parameters stay few."""
    g = stack(80)
    inputs = [a for a in g.arguments if a.kind == "input"]
    buffers = [a for a in g.arguments if a.kind != "symbol"]
    assert len(inputs) == 321 and len(buffers) > 800
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule)
    entry = re.search(r"\.entry stack80_worker\((.*?)\)", kernel.ptx, re.S).group(1)
    assert entry.count(".param") == 1 + 5 + 5
    assemble(kernel.ptx, chip, tmp_path, "stack80")
