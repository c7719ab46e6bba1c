"""The CPU runtime's hand-off: how long a run takes to reach its workers and
to come back from them.

Two kernels with 2 workers (`--workers`), every run on all of them (the
worker adapter off, so that the count does not follow the machine's load):
  * `tiny`: exp of a (1, 64) f32 array, one tile: the whole run is overhead
    (binding, init, hand-off, check);
  * `mlp`: the decode-shaped SwiGLU MLP of `bench/cpu_tiles.py` at B = 1,
    compiled with trace=True: from the traces, the time from handing the
    run to the worker threads (`etc.runtime.cpu.run_interruptible` called)
    to each worker's first tile, and from the last tile's end back to the
    caller (`run_interruptible` returned).
  * `gemm`: `bench/gemm_cpu.py`'s bf16 GEMM at M, K, N = 486, 576, 192
    (W bound once, C written in place into an aligned `out=` array of bf16
    bits), traced: the Python before the hand-off (`run` called to
    `run_interruptible` called), the hand-off to each worker's first tile,
    the tiles' span, the last tile back to `run_interruptible`'s return and
    the Python after it (to `run`'s return), medians and minimums; and the
    tiles each worker ran.
  * `python`: the same GEMM (untraced)'s run with the hand-off left out (the
    runtime's native launcher and worker replaced by no-ops, so nothing is
    computed): the Python of a run, with the last run's arrays again (the
    bind plan: `etc.runtime.bind_plan`) and with two arrays of A in turn
    (bound, checked and paired at every run), minimums of 5 x 2,000 runs.
Runs follow each other after `--gap` ms of sleep (0: back to back; a decode
step's host work is about 0.8 ms). Prints medians over `--runs` runs.

Usage: .venv/bin/python bench/cpu_handoff.py [--workers 2] [--runs 400] [--gap 0.5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import etc
from etc import bfloat16
from etc.runtime import aligned, cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_tiles import FFN, HIDDEN, swiglu  # noqa: E402
from gemm_cpu import gemm  # noqa: E402


def tiny() -> etc.Graph:
    g = etc.Graph("tiny")
    B = g.symbol("B")
    g.output(g.exp(g.input("x", (B, 64), "f32")))
    return g


def pause(gap_s: float) -> None:
    if gap_s:
        time.sleep(gap_s)


class _NoHandOff:
    """An `Entry` whose launcher and worker do nothing (see `python`)."""

    worker = 0

    @staticmethod
    def launch(*arguments) -> int:
        return 0

    @staticmethod
    def call(*arguments) -> None:
        return None


def python_only(workers: int, graph: etc.Graph, w, a, c) -> None:
    kernel = etc.compile(graph, target="cpu", workers=workers)  # untraced
    kernel.runtime.adapt_workers = False
    bound = kernel.partial(w=w)
    runtime = kernel.runtime
    entry, runtime._pool_entry = runtime._pool_entry, _NoHandOff()
    other = aligned.aligned(a.copy())
    try:
        def best(run) -> float:
            times = []
            for _ in range(5):
                start = time.perf_counter_ns()
                for _ in range(1000):
                    run()
                times.append((time.perf_counter_ns() - start) / 1000)
            return min(times) / 1e3
        same = best(lambda: (bound.run(a=a, out=[c]), bound.run(a=a, out=[c])))
        turns = best(lambda: (bound.run(a=a, out=[c]), bound.run(a=other, out=[c])))
    finally:
        runtime._pool_entry = entry
    print(f"gemm python, us per run (no hand-off): the same arrays {same / 2:.1f}; "
          f"new ones {turns / 2:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--gap", type=float, default=0.5, help="ms of sleep between runs")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; workers={args.workers}, runs={args.runs}, "
          f"gap={args.gap} ms, load {os.getloadavg()[0]:.1f}")
    gap_s = args.gap / 1e3

    kernel = etc.compile(tiny(), target="cpu", workers=args.workers)
    kernel.runtime.adapt_workers = False
    x = np.zeros((1, 64), np.float32)
    for _ in range(20):
        kernel.run(x=x)
    runs = []
    for _ in range(args.runs):
        pause(gap_s)
        start = time.perf_counter()
        kernel.run(x=x)
        runs.append(time.perf_counter() - start)
    print(f"tiny: run {statistics.median(runs) * 1e6:.1f} us")

    mlp = etc.compile(swiglu(), target="cpu", schedule="static", workers=args.workers,
                      trace=True)
    mlp.runtime.adapt_workers = False
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal(shape) * 0.03).astype(np.float32)
               for name, shape in [("wg", (HIDDEN, FFN)), ("wu", (HIDDEN, FFN)),
                                   ("wd", (FFN, HIDDEN))]}
    step = mlp.partial(**weights)
    x = rng.standard_normal((1, HIDDEN)).astype(np.float32)
    stamps = {}
    handed = cpu.run_interruptible

    def timed(*call, **options):
        stamps["in"] = time.monotonic_ns()
        try:
            return handed(*call, **options)
        finally:
            stamps["out"] = time.monotonic_ns()
    cpu.run_interruptible = timed
    for _ in range(20):
        step.run(x=x)
    first = {worker: [] for worker in range(args.workers)}
    back, whole = [], []
    for _ in range(args.runs):
        pause(gap_s)
        start = time.perf_counter()
        step.run(x=x)
        whole.append(time.perf_counter() - start)
        events = mlp.trace.events
        for worker in first:
            starts = [e.start for e in events if e.worker == worker]
            if starts:
                first[worker].append(min(starts) - stamps["in"])
        back.append(stamps["out"] - max(e.end for e in events))
    cells = ", ".join(f"worker {worker} {statistics.median(times) / 1e3:.1f} us "
                      f"({len(times)} runs with tiles)" for worker, times in first.items() if times)
    print(f"mlp B=1 traced: run {statistics.median(whole) * 1e3:.3f} ms; hand-off to the first "
          f"tile: {cells}; last tile back to the caller {statistics.median(back) / 1e3:.1f} us")

    m, k, n = 486, 576, 192
    kernel = etc.compile(gemm(k, n), target="cpu", workers=args.workers, trace=True)
    kernel.runtime.adapt_workers = False
    a = aligned.aligned(bfloat16.to_bits(rng.standard_normal((m, k)).astype(np.float32)))
    w = aligned.aligned(bfloat16.to_bits((rng.standard_normal((n, k)) / 16).astype(np.float32)))
    c = aligned.empty((m, n), np.uint16)
    bound = kernel.partial(w=w)
    for _ in range(20):
        bound.run(a=a, out=[c])
    parts = {part: [] for part in ("run", "before", "first", "span", "back", "after")}
    tiles = {worker: [] for worker in range(args.workers)}
    for _ in range(args.runs):
        pause(gap_s)
        start = time.monotonic_ns()
        bound.run(a=a, out=[c])
        end = time.monotonic_ns()
        events = kernel.trace.events
        first, last = min(e.start for e in events), max(e.end for e in events)
        for part, ns in [("run", end - start), ("before", stamps["in"] - start),
                         ("first", first - stamps["in"]), ("span", last - first),
                         ("back", stamps["out"] - last), ("after", end - stamps["out"])]:
            parts[part].append(ns / 1e3)
        for worker in tiles:
            tiles[worker].append(sum(e.worker == worker for e in events))
    cpu.run_interruptible = handed
    python_only(args.workers, gemm(k, n), w, a, c)
    print(f"gemm {m}x{k}x{n} bf16 traced, us (median / min): " + "; ".join(
        f"{part} {statistics.median(v):.1f} / {min(v):.1f}" for part, v in parts.items())
        + "; tiles per worker (median) " + "/".join(
            f"{statistics.median(v):g}" for v in tiles.values()))


if __name__ == "__main__":
    main()
