"""bf16 GEMM on the CPU target against PyTorch's `a @ b` (oneDNN), 2 threads.

    C = A @ W^T      A (M, K), W (N, K) as Hugging Face stores weights, bf16

compiled once per (K, N) for the CPU target (symbolic M, static schedule,
`--workers` workers, the host's instruction set unless ETC_CPU_ISA says
otherwise) and run at each M, next to `torch.matmul(a, w.T)` on bf16
tensors in the same process with `torch.set_num_threads(workers)`, the two
alternated `--rounds` times (best time of each over all rounds). W is
bound once (`kernel.partial`), A is passed as bf16 bit patterns (uint16),
both 64-byte aligned as the runtime's buffers and loaded weights are, and
C is written as bf16 bit patterns into a 64-byte aligned `out=` array
(in place, as torch returns a bf16 tensor). ETC runs all its workers
whatever the load (`runtime.adapt_workers = False`), as torch runs its
threads. "ETC tiles ms" comes from a second compile of the graph with
`trace=True`, run alternating with the first: the best run's span from
its first tile's start to its last tile's end; the rest of an ETC run is
the runtime's own time (binding, the hand-off to the workers and back),
which a model's step pays once, not per matmul. "ETC tile work ms" is the
sum over the tiles of each tile's fastest traced run, over the workers:
the span the tiles would have if no other process took a core from a
worker (on a shared machine one slow core sets a run's span; this
measure of the kernel itself holds through that). The floor is the FLOPs
(2 M N K) over the machine's peak: `--peak` GFLOP/s (measure it with a
tight loop of the instruction the kernel runs: `vdpbf16ps` on AVX-512
BF16, `tdpbf16ps` on AMX). Prints a Markdown table: times, GFLOP/s, ETC /
torch speed.

torch (2.13.0 CPU) is an optional benchmark dependency; without it only
ETC's columns are printed. Shapes: M = 512, K = N = 2048 (the issue's), and
the SmolLM2-135M projections at a 486-token prompt (hidden 576, KV 192, FFN
1536), unless `--shapes M,K,N ...`.

Usage: .venv/bin/python bench/gemm_cpu.py [--workers 2] [--rounds 3] [--repeats 5]
       [--shapes 512,2048,2048 486,576,1536] [--peak GFLOPS]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import etc
from etc import bfloat16
from etc.runtime import aligned, isa

SHAPES = [(512, 2048, 2048), (486, 576, 576), (486, 576, 192), (486, 576, 1536),
          (486, 1536, 576)]


def gemm(k: int, n: int) -> etc.Graph:
    g = etc.Graph("gemm")
    m = g.symbol("M")
    a = g.input("a", (m, k), "bf16")
    w = g.input("w", (n, k), "bf16")
    g.output(g.matmul(a, w, transpose_b=True))
    return g


def best(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="M,K,N triples (default: the issue's and SmolLM2-135M's)")
    parser.add_argument("--peak", type=float, default=None,
                        help="the machine's measured bf16 peak in GFLOP/s, for the floor column")
    args = parser.parse_args()
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes
              else SHAPES)
    try:
        import torch
    except ImportError:
        torch = None
    else:
        torch.set_num_threads(args.workers)

    rng = np.random.default_rng(0)
    kernels: dict = {}
    rows = []
    for m, k, n in shapes:
        if (k, n) not in kernels:
            kernels[(k, n)] = tuple(etc.compile(gemm(k, n), target="cpu", workers=args.workers,
                                                trace=trace) for trace in (False, True))
        kernel, traced = kernels[(k, n)]
        # Both engines on `--workers` threads: the runtime would otherwise run
        # fewer workers while other processes keep the cores busy.
        kernel.runtime.adapt_workers = traced.runtime.adapt_workers = False
        # 64-byte aligned, as the runtime's own buffers and loaded weights are.
        a_bits = aligned.aligned(bfloat16.to_bits(rng.standard_normal((m, k)).astype(np.float32)))
        w_bits = aligned.aligned(bfloat16.to_bits(
            (rng.standard_normal((n, k)) / 16).astype(np.float32)))
        c_bits = aligned.empty((m, n), np.uint16)
        bound, bound_traced = kernel.partial(w=w_bits), traced.partial(w=w_bits)
        bound.run(a=a_bits, out=[c_bits])
        want = bfloat16.from_bits(a_bits).astype(np.float64) @ \
            bfloat16.from_bits(w_bits).astype(np.float64).T
        error = float(np.abs(bfloat16.from_bits(c_bits) - want).max()
                      / max(np.abs(want).max(), 1e-30))
        etc_s, torch_s, tiles_s = float("inf"), float("inf"), float("inf")
        fastest: dict = {}  # tile -> its fastest run's ns

        def traced_run():
            nonlocal tiles_s
            bound_traced.run(a=a_bits, out=[c_bits])
            events = traced.runtime.trace.events
            tiles_s = min(tiles_s, (max(e.end for e in events) - min(e.start for e in events))
                          / 1e9)
            for e in events:
                fastest[e.tile] = min(fastest.get(e.tile, e.duration), e.duration)
        if torch is not None:
            ta = torch.from_numpy(a_bits.view(np.int16)).view(torch.bfloat16)
            tw = torch.from_numpy(w_bits.view(np.int16)).view(torch.bfloat16)
        for _ in range(args.rounds):
            if torch is not None:
                torch_s = min(torch_s, best(lambda: torch.matmul(ta, tw.T), args.repeats))
                time.sleep(0.2)  # OpenMP's threads stop spinning
            etc_s = min(etc_s, best(lambda: bound.run(a=a_bits, out=[c_bits]), args.repeats))
            best(traced_run, args.repeats)
        work_s = sum(fastest.values()) / 1e9 / args.workers
        rows.append((m, k, n, etc_s, tiles_s, work_s, torch_s, error))

    load = os.getloadavg()
    print(f"bf16 GEMM C = A @ W^T, {args.workers} threads, {platform.node()} "
          f"({platform.processor() or platform.machine()}), ETC for {isa.chosen()}, "
          f"torch {torch.__version__ if torch else 'absent'}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load[0]:.2f} {load[1]:.2f}")
    print()
    head = "| M | K | N | ETC ms | ETC GFLOP/s | ETC tiles ms | ETC tile work ms |"
    line = "|---|---|---|---|---|---|---|"
    if args.peak:
        head += " floor ms |"
        line += "---|"
    if torch is not None:
        head += " torch ms | torch GFLOP/s | ETC / torch speed | ETC tiles / torch |"
        line += "---|---|---|---|"
    print(head + " max rel. error |")
    print(line + "---|")
    for m, k, n, etc_s, tiles_s, work_s, torch_s, error in rows:
        flops = 2.0 * m * k * n
        cells = [m, k, n, f"{etc_s * 1e3:.3f}", f"{flops / etc_s / 1e9:.1f}", f"{tiles_s * 1e3:.3f}",
                 f"{work_s * 1e3:.3f}"]
        if args.peak:
            cells.append(f"{flops / (args.peak * 1e9) * 1e3:.3f}")
        if torch is not None:
            cells += [f"{torch_s * 1e3:.3f}", f"{flops / torch_s / 1e9:.1f}",
                      f"{torch_s / etc_s:.2f}x", f"{torch_s / tiles_s:.2f}x"]
        cells.append(f"{error:.1e}")
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
