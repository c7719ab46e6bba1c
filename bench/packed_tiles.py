"""One packed matmul at the Llama-3.2-1B FFN shape, per block format.

    y = x @ W^T      x (B, 2048) f32, W (8192, 2048) packed (GGUF blocks)

compiled once for the CPU target (`--workers` workers) and run at each B of
`--batches`, the formats in turn (one run of each per round, so that the
load of other processes hits them alike and their ratios mean something).
Prints a Markdown table: the median and best time, the weight bytes
streamed per second (the B = 1 floor is the memory bandwidth, about
38.6 GB/s on the 2-core VM; this one weight fits its 32 MB L3 cache, so
the larger formats read faster) and the int8 products per second (the B = 16
floor is vpdpbusd's rate: 64 per 512-bit instruction, at most one a cycle
per core). Where a Q4_K or Q6_K tile's time goes is read against the Q8_0
row, whose unpacking is one xor per 32 weights (and whose code the
K-quants' integer sub-block scales, `ops/packed_k_dots.py`, left alone).

`--shape 2048x8192` gives the FFN's down projection instead (N x K).

Usage: .venv/bin/python bench/packed_tiles.py [--types q4_k,q6_k,q8_0]
       [--batches 1 16] [--workers 2] [--repeats 15] [--shape 8192x2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import etc
from etc import packed



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="q4_k,q6_k,q8_0")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shape", default="8192x2048", help="the weight's N x K")
    args = parser.parse_args()
    try:
        N, K = (int(n) for n in args.shape.split("x"))
    except ValueError:
        parser.error(f"--shape: expected N x K as 8192x2048, not {args.shape!r}")
    if N < 1 or K < 1 or K % 256:
        parser.error(f"--shape: N must be positive and K a multiple of 256, not {args.shape}")
    if min(args.batches) < 1 or args.workers < 1 or args.repeats < 1:
        parser.error("--batches, --workers and --repeats must be positive")
    print("| type | MB | B | median ms | best ms | GB/s (best) | G int8 products/s (best) |")
    print("|---|---|---|---|---|---|---|")
    runs = {}
    for fmt in args.types.split(","):
        if fmt not in packed.FORMATS:
            raise SystemExit(f"--types: unknown format {fmt!r}")
        g = etc.Graph("packed_tile")
        T = g.symbol("T")
        x = g.input("x", (T, K), "f32")
        w = g.input("w", (N, K), fmt)
        g.output(g.matmul(x, w, transpose_b=True, name="y"))
        kernel = etc.compile(g, target="cpu", workers=args.workers)
        raw = packed.quantize(np.random.default_rng(0).standard_normal((N, K))
                              .astype(np.float32), fmt)
        runs[fmt] = (kernel.partial(w=raw), raw.nbytes)
    rows = {fmt: [] for fmt in runs}  # each format's lines, B by B
    for b in args.batches:
        a = np.random.default_rng(b).standard_normal((b, K)).astype(np.float32)
        for run, _ in runs.values():
            for _ in range(3):
                run.run(x=a)
        # The formats in turn, one run each per round: the machine's load
        # swings (other processes) hit them alike.
        times = {fmt: [] for fmt in runs}
        for _ in range(args.repeats):
            for fmt, (run, _) in runs.items():
                t = time.perf_counter()
                run.run(x=a)
                times[fmt].append(time.perf_counter() - t)
        for fmt, (_, nbytes) in runs.items():
            best = min(times[fmt])
            rows[fmt].append(f"| {fmt} | {nbytes / 1e6:.1f} | {b} | "
                             f"{statistics.median(times[fmt]) * 1e3:.2f} | {best * 1e3:.2f} | "
                             f"{nbytes / best / 1e9:.1f} | {b * N * K / best / 1e9:.1f} |")
    for lines in rows.values():
        print("\n".join(lines))


if __name__ == "__main__":
    main()
