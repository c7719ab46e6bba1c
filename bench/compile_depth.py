"""Compile time versus model depth.

A Llama-3.2-1B-shaped decoder stack (hidden 2048, FFN 8192, bf16; attention
stood in by one 2048x2048 projection, since the front end has no attention
operator yet), 10 operators per layer:

    h = rmsnorm(x); x = x + h @ Wo
    h = rmsnorm(x); x = x + (silu(h @ Wg) * (h @ Wu)) @ Wd

compiled for every depth, schedule and target, timed per stage (graph build,
dependency inference, scheduling, lowering, and the CPU JIT or nothing for
CUDA, whose PTX is assembled by the driver at load time). Prints a Markdown
table and the ratio of each depth's total to the smallest depth's.

Usage: .venv/bin/python bench/compile_depth.py [--depths 2 4 8 16 32]
       [--targets cpu cuda] [--schedules static dynamic] [--repeats 1]
"""

from __future__ import annotations

import argparse
import platform
import time

import etc

HIDDEN, FFN = 2048, 8192


def llama_stack(layers: int, dtype: str = "bf16") -> etc.Graph:
    g = etc.Graph(f"stack{layers}")
    B = g.symbol("B")
    x = g.input("x", (B, HIDDEN), dtype)
    for i in range(layers):
        norm1 = g.input(f"norm1_{i}", (HIDDEN,), dtype)
        wo = g.input(f"wo_{i}", (HIDDEN, HIDDEN), dtype)
        norm2 = g.input(f"norm2_{i}", (HIDDEN,), dtype)
        wg = g.input(f"wg_{i}", (HIDDEN, FFN), dtype)
        wu = g.input(f"wu_{i}", (HIDDEN, FFN), dtype)
        wd = g.input(f"wd_{i}", (FFN, HIDDEN), dtype)
        x = g.add(x, g.matmul(g.rmsnorm(x, norm1), wo))
        h = g.rmsnorm(x, norm2)
        x = g.add(x, g.matmul(g.mul(g.silu(g.matmul(h, wg)), g.matmul(h, wu)), wd))
    g.output(x)
    return g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--targets", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--schedules", nargs="+", default=["static", "dynamic"])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    print(f"machine: {platform.machine()}, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}")
    print("\n| target | schedule | layers | tasks | build ms | infer ms | schedule ms "
          "| lower ms | JIT ms | total s | vs smallest |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for target in args.targets:
        for schedule in args.schedules:
            first = None
            for layers in args.depths:
                runs = []
                for _ in range(args.repeats):
                    g = llama_stack(layers)
                    start = time.perf_counter()
                    kernel = etc.compile(g, target=target, schedule=schedule, workers=4)
                    runs.append((time.perf_counter() - start, dict(kernel.timings)))
                total, timings = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
                first = first or total
                ms = {k: v * 1e3 for k, v in timings.items()}
                print(f"| {target} | {schedule} | {layers} | {len(g.operations)} "
                      f"| {ms['graph']:.0f} | {ms['event']:.0f} | {ms['scheduled']:.0f} "
                      f"| {ms['lowered']:.0f} | {ms.get('jit', 0):.0f} | {total:.2f} "
                      f"| {total / first:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
