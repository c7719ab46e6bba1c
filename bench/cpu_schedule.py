"""CPU benchmarks of the static scheduler.

1. Compile time versus graph size: chains of matmul+silu layers built with
   etc.Graph, timed per stage (graph build, inference, scheduling, lowering,
   JIT). Tile-task counts are for B=256.
2. Scheduling overhead per tile task: a chain of tasks with *empty* tile bodies
   (so only wait/notify/loop cost remains), each tile waiting on the matching
   tile of the previous task; run with 1, 2 and 4 workers. Reported as
   microseconds per tile task, and relative to 1 worker in the same run.

Usage: .venv/bin/python bench/cpu_schedule.py [--repeats N]
Prints Markdown tables (paste into docs/benchmarks.md with date and machine).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from types import SimpleNamespace

import numpy as np
from mlir import ir

import etc
from etc import pipeline
from etc.graph_values import Argument
from etc.compiler import compile_module


def layered_mlp(layers: int) -> etc.Graph:
    g = etc.Graph(f"mlp{layers}")
    B = g.symbol("B")
    x = g.input("x", (B, 256), "f32")
    for i in range(layers):
        w = g.input(f"w{i}", (256, 256), "f32")
        x = g.silu(g.matmul(x, w))
    g.output(x)
    return g


def bench_compile(repeats: int) -> None:
    print("\n### Compile time versus graph size (CPU target, static schedule, 4 workers)\n")
    print("| operators | tile tasks (B=256) | build L1 ms | infer ms | schedule ms | lower ms | JIT ms | total ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in (1, 4, 16, 32):
        totals = []
        for _ in range(repeats):
            g = layered_mlp(layers)
            start = time.perf_counter()
            kernel = etc.compile(g, workers=4)
            totals.append((time.perf_counter() - start, dict(kernel.timings)))
        total, timings = sorted(totals, key=lambda t: t[0])[len(totals) // 2]
        ops = 2 * layers
        tiles = ops * (256 // 32) * (256 // 64)
        ms = {k: v * 1e3 for k, v in timings.items()}
        print(f"| {ops} | {tiles} | {ms['graph']:.1f} | {ms['event']:.1f} | {ms['scheduled']:.1f} "
              f"| {ms['lowered']:.1f} | {ms['jit']:.1f} | {total * 1e3:.1f} |")


def empty_chain_ir(tasks: int, tiles: int) -> str:
    """L1 IR: `tasks` tasks of `tiles` empty tile bodies, tile i of task k
    reading tile i of task k-1's buffer."""
    args = ", ".join(f"%b{k}: memref<{tiles}xf32>" for k in range(tasks + 1))
    lines = [f"event.graph @chain({args}) {{", f"  %n = arith.constant {tiles} : index"]
    for k in range(tasks):
        lines += [
            f'  event.task "t{k}" grid(%n)',
            f"      reads(%b{k} : memref<{tiles}xf32> (d0) -> (d0) [1])",
            f"      writes(%b{k + 1} : memref<{tiles}xf32> (d0) -> (d0) [1]) {{",
            "  ^bb0(%i: index):",
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines)


def empty_chain_runtime(tasks: int, tiles: int, workers: int):
    module = ir.Module.parse(empty_chain_ir(tasks, tiles), context=ir.Context())
    options = pipeline.Options(workers=workers)
    spec = SimpleNamespace(
        name="chain",
        arguments=[Argument("input" if k == 0 else "output", f"b{k}", (tiles,), "f32")
                   for k in range(tasks + 1)],
        outputs=[f"b{k}" for k in range(1, tasks + 1)],
    )
    return compile_module(module, spec, options, stage="graph").runtime


def bench_overhead(repeats: int) -> None:
    tasks, tiles = 16, 256
    total = tasks * tiles
    print(f"\n### Per-task scheduling overhead, empty tile bodies ({tasks} tasks x {tiles} tiles "
          f"= {total} tile tasks, chained tile by tile)\n")
    print("| workers | run ms (median) | us per tile task | vs 1 worker |")
    print("|---:|---:|---:|---:|")
    baseline = None
    x = np.zeros(tiles, np.float32)
    for workers in (1, 2, 4):
        runtime = empty_chain_runtime(tasks, tiles, workers)
        runtime.run({"b0": x})  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            runtime.run({"b0": x})
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        baseline = baseline or median
        print(f"| {workers} | {median * 1e3:.2f} | {median / total * 1e6:.3f} | {median / baseline:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
          f"Python {platform.python_version()}; repeats={args.repeats}")
    bench_compile(max(1, args.repeats // 2))
    bench_overhead(args.repeats)


if __name__ == "__main__":
    main()
