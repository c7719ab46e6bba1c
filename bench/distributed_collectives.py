"""CPU ranks: fused GEMM + collective versus GEMM then a separate collective.

The two patterns of the Event Tensor paper, on N MPI processes (one per
rank) of this machine:

* all-gather + GEMM: y = all_gather(x) @ w, x (m, K) per rank, w (K, N);
* GEMM + reduce-scatter: z = reduce_scatter(x @ w), x (M, K), w (K, N).

Fused: one ETC kernel per rank (`g.matmul(g.all_gather(x), w)`,
`g.reduce_scatter(g.matmul(x, w))`): the collective's tiles wait on the
GEMM's tiles (or the GEMM's on the gathered rows) through symmetric events,
and travel with MPI puts while other tiles compute; on the static schedule
and on the dynamic one (whose idle workers poll for the remote tiles). Unfused: MPI's own
collective (`Allgather` / `Reduce_scatter_block`, mpi4py) and an ETC
kernel of the GEMM alone, one after the other.

Each row: median wall time over `--repeats` runs after a warm-up, taken on
rank 0 between two barriers (so it is the slowest rank's time), and the
ratios fused / unfused (below 1: fused is faster) for each schedule,
measured in the same run, rounds alternating.

Usage: python -m etc.runtime.distributed -n 2 bench/distributed_collectives.py [--repeats N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import numpy as np
from mpi4py import MPI

import etc

COMM = MPI.COMM_WORLD


def timed(call) -> float:
    COMM.Barrier()
    start = time.perf_counter()
    call()
    COMM.Barrier()
    return time.perf_counter() - start


def gather_matmul(ranks: int, rows: int, k: int, n: int, workers: int):
    rng = np.random.default_rng(COMM.Get_rank())
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    g = etc.Graph("fused", ranks=ranks)
    g.output(g.matmul(g.all_gather(g.input("x", (rows, k))), g.input("w", (k, n))))
    static = etc.compile(g, target="cpu", workers=workers)
    dynamic = etc.compile(g, target="cpu", schedule="dynamic", workers=workers)
    h = etc.Graph("gemm")
    h.output(h.matmul(h.input("x", (rows * ranks, k)), h.input("w", (k, n))))
    gemm = etc.compile(h, target="cpu", workers=workers)
    gathered = np.empty((rows * ranks, k), np.float32)

    def unfused():
        COMM.Allgather(x, gathered)
        return gemm.run(x=gathered, w=w)

    (b,) = unfused()
    for fused in (static, dynamic):
        (a,) = fused.run(x=x, w=w)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    return (lambda: static.run(x=x, w=w)), (lambda: dynamic.run(x=x, w=w)), unfused


def matmul_scatter(ranks: int, rows: int, k: int, n: int, workers: int):
    rng = np.random.default_rng(COMM.Get_rank())
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    g = etc.Graph("fused", ranks=ranks)
    g.output(g.reduce_scatter(g.matmul(g.input("x", (rows, k)), g.input("w", (k, n)))))
    static = etc.compile(g, target="cpu", workers=workers)
    dynamic = etc.compile(g, target="cpu", schedule="dynamic", workers=workers)
    h = etc.Graph("gemm")
    h.output(h.matmul(h.input("x", (rows, k)), h.input("w", (k, n))))
    gemm = etc.compile(h, target="cpu", workers=workers)
    part = np.empty((rows // ranks, n), np.float32)

    def unfused():
        (y,) = gemm.run(x=x, w=w)
        COMM.Reduce_scatter_block(y, part, op=MPI.SUM)
        return part

    b = unfused()
    for fused in (static, dynamic):
        (a,) = fused.run(x=x, w=w)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    return (lambda: static.run(x=x, w=w)), (lambda: dynamic.run(x=x, w=w)), unfused


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sizes", choices=("all", "small"), default="all",
                        help="small: the first size of each pattern only")
    options = parser.parse_args()
    ranks, rank = COMM.Get_size(), COMM.Get_rank()
    cases = [("all-gather + GEMM", gather_matmul, rows, k, n)
             for rows, k, n in ((32, 256, 256), (128, 512, 512), (256, 1024, 1024))]
    cases += [("GEMM + reduce-scatter", matmul_scatter, rows, k, n)
              for rows, k, n in ((64, 256, 256), (256, 512, 512), (512, 1024, 1024))]
    if options.sizes == "small":
        cases = [cases[0], cases[3]]
    lines = []
    for title, build, rows, k, n in cases:
        runs = build(ranks, rows, k, n, options.workers)
        times = [[] for _ in runs]
        for _ in range(options.repeats):
            for run, spent in zip(runs, times):
                spent.append(timed(run))
        static, dynamic, unfused = (statistics.median(t) for t in times)
        lines.append(f"| {title} | {rows} x {k} x {n} | {static * 1e3:.2f} | "
                     f"{dynamic * 1e3:.2f} | {unfused * 1e3:.2f} | {static / unfused:.2f} | "
                     f"{dynamic / unfused:.2f} |")
    if rank == 0:
        print(f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}, {ranks} ranks x {options.workers} worker(s), "
              f"median of {options.repeats}")
        print("| pattern | rows x K x N (per rank) | fused static ms | fused dynamic ms | "
              "unfused ms | static / unfused | dynamic / unfused |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
