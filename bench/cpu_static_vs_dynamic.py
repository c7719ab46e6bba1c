"""CPU benchmark: static schedule (round-robin, fixed order) versus dynamic
schedule (on-device task queue) on the same compiled graphs.

1. A regular MLP (rmsnorm, matmul+gelu, matmul+add, 4 layers): every tile of
   one operator costs the same, the static order is already balanced, and the
   dynamic schedule pays for its queue (an atomic pop per tile, a pending
   decrement and a push per readied tile).
2. If the MoE operator has landed (`etc.Graph.moe`): a MoE layer with skewed
   routing (most tokens pick the same two experts), where tile costs differ
   and the static round-robin order leaves workers idle behind heavy tiles.

Each row: median wall time of `kernel.run` (which includes g_init, starting
the worker threads and g_check) over `--repeats` runs after one warm-up, and
the ratio dynamic / static (below 1: dynamic is faster).

Usage: .venv/bin/python bench/cpu_static_vs_dynamic.py [--repeats N]
Prints Markdown tables (paste into docs/benchmarks.md with date and machine).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import numpy as np

import etc


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp(layers: int, width: int) -> etc.Graph:
    g = etc.Graph(f"mlp{layers}")
    B = g.symbol("B")
    x = g.input("x", (B, width), "f32")
    for i in range(layers):
        nw = g.input(f"nw{i}", (width,), "f32")
        w1 = g.input(f"w1_{i}", (width, 2 * width), "f32")
        w2 = g.input(f"w2_{i}", (2 * width, width), "f32")
        h = g.rmsnorm(x, nw, 1e-6)
        x = g.add(g.matmul(g.gelu(g.matmul(h, w1)), w2), x)
    g.output(x)
    return g


def mlp_inputs(rng, layers: int, width: int, batch: int) -> dict:
    inputs = {"x": _rand(rng, (batch, width))}
    for i in range(layers):
        inputs[f"nw{i}"] = _rand(rng, (width,))
        inputs[f"w1_{i}"] = _rand(rng, (width, 2 * width), 0.05)
        inputs[f"w2_{i}"] = _rand(rng, (2 * width, width), 0.05)
    return inputs


def moe(hidden: int, ffn: int, experts: int) -> etc.Graph:
    g = etc.Graph("moe")
    T = g.symbol("T")
    x = g.input("x", (T, hidden), "f32")
    router = g.input("router", (hidden, experts), "f32")
    w1 = g.input("w1", (experts, hidden, ffn), "f32")
    w2 = g.input("w2", (experts, ffn, hidden), "f32")
    g.output(g.moe(x, router, w1, w2, 2))
    return g


def moe_inputs(rng, hidden: int, ffn: int, experts: int, tokens: int) -> dict:
    """Skewed routing: feature 0 of every token is large and the router maps
    it to experts 0 and 1, so almost every token picks those two."""
    x = _rand(rng, (tokens, hidden))
    x[:, 0] = 4.0
    router = _rand(rng, (hidden, experts), 0.05)
    router[0, 0], router[0, 1] = 3.0, 2.5
    return {"x": x, "router": router,
            "w1": _rand(rng, (experts, hidden, ffn), 0.05),
            "w2": _rand(rng, (experts, ffn, hidden), 0.05)}


def median_run_ms(kernel, inputs: dict, repeats: int) -> float:
    kernel.run(**inputs)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel.run(**inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compare(title: str, g: etc.Graph, cases: list[tuple[str, dict]], repeats: int,
            workers_list=(1, 2, 4)) -> None:
    print(f"\n### {title}\n")
    print("| workers | size | static ms | dynamic ms | dynamic / static |")
    print("|---:|---|---:|---:|---:|")
    for workers in workers_list:
        static = etc.compile(g, schedule="static", workers=workers)
        dynamic = etc.compile(g, schedule="dynamic", workers=workers)
        for label, inputs in cases:
            for got, want in zip(dynamic.run(**inputs), static.run(**inputs)):
                np.testing.assert_array_equal(got, want)
            static_ms = median_run_ms(static, inputs, repeats)
            dynamic_ms = median_run_ms(dynamic, inputs, repeats)
            print(f"| {workers} | {label} | {static_ms:.2f} | {dynamic_ms:.2f} "
                  f"| {dynamic_ms / static_ms:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"date: {datetime.date.today()}; machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.platform()}, Python {platform.python_version()}; repeats={args.repeats}")
    rng = np.random.default_rng(0)

    layers, width = 4, 128
    g = mlp(layers, width)
    compare(f"Regular MLP ({layers} layers, width {width}, 5 operators per layer)", g,
            [(f"B={b}", mlp_inputs(rng, layers, width, b)) for b in (32, 256)], args.repeats)

    if hasattr(etc.Graph, "moe"):
        hidden, ffn, experts = 64, 128, 8
        g = moe(hidden, ffn, experts)
        compare(f"MoE, skewed routing (H={hidden}, F={ffn}, E={experts}, top-2; "
                "most tokens on experts 0 and 1)", g,
                [(f"T={t}", moe_inputs(rng, hidden, ffn, experts, t)) for t in (64, 512)],
                args.repeats)
    else:
        print("\n(MoE operator not available: etc.Graph has no `moe`; skipped)")


if __name__ == "__main__":
    main()
