"""One rank of the fused-collective checks (run by test_distributed.py
under `python -m etc.runtime.distributed -n N`).

Every rank builds the same graphs, compiles each for the static schedule
(2 workers) and the dynamic schedule (1 and 2 workers), runs them on its
own inputs and compares its outputs with NumPy, which every rank can
compute since each rank's inputs come from a seed of its rank. Prints one
line `rank R: <n> checks passed (<k> dynamic)` or raises."""

import sys

import numpy as np

import etc

# (schedule, workers per rank) of every configuration below.
SCHEDULES = (("static", 2), ("dynamic", 1), ("dynamic", 2))


def inputs(rank: int, shapes: dict) -> dict:
    rng = np.random.default_rng(1000 + rank)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def compiled(graph, schedule: str, workers: int):
    kernel = etc.compile(graph, target="cpu", schedule=schedule, workers=workers)
    assert kernel.abi.schedule == schedule, (kernel.abi.schedule, schedule)
    return kernel


def main() -> None:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    rank = MPI.COMM_WORLD.Get_rank()
    everyone = range(ranks)
    checks = dynamic = 0

    # all_gather + matmul: rows of x per rank, K, N, matmul tile.
    for rows, k, n, tile in ((32, 48, 40, None), (16, 24, 72, (16, 32)), (8, 16, 24, (8, 8))):
        g = etc.Graph("gather_matmul", ranks=ranks)
        x = g.input("x", (rows, k))
        w = g.input("w", (k, n))
        g.output(g.matmul(g.all_gather(x), w, tile=tile))
        data = [inputs(r, {"x": (rows, k), "w": (k, n)}) for r in everyone]
        want = np.concatenate([d["x"] for d in data]) @ data[rank]["w"]
        for schedule, workers in SCHEDULES:
            (y,) = compiled(g, schedule, workers).run(**data[rank])
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{schedule} x{workers} {rows, k, n, tile}")
            checks += 1
            dynamic += schedule == "dynamic"

    # matmul + reduce_scatter: rows per rank after the scatter, K, N, tile.
    for local, k, n, tile in ((32, 40, 48, None), (8, 16, 40, (8, 16)), (16, 24, 16, (16, 8))):
        g = etc.Graph("matmul_scatter", ranks=ranks)
        x = g.input("x", (local * ranks, k))
        w = g.input("w", (k, n))
        g.output(g.reduce_scatter(g.matmul(x, w), tile=tile))
        data = [inputs(r, {"x": (local * ranks, k), "w": (k, n)}) for r in everyone]
        total = sum(d["x"] @ d["w"] for d in data)
        for schedule, workers in SCHEDULES:
            (z,) = compiled(g, schedule, workers).run(**data[rank])
            np.testing.assert_allclose(z, total[rank * local:(rank + 1) * local], rtol=1e-4,
                                       atol=1e-4,
                                       err_msg=f"{schedule} x{workers} {local, k, n, tile}")
            checks += 1
            dynamic += schedule == "dynamic"

    # matmul + all_reduce over a symbolic row count, then a local operator.
    for tile in (None, (16, 16)):
        g = etc.Graph("matmul_allreduce", ranks=ranks)
        rows = g.symbol("B")
        x = g.input("x", (rows, 32))
        w = g.input("w", (32, 40))
        summed = g.all_reduce(g.matmul(x, w), tile=tile)
        g.output(g.add(summed, summed))
        for schedule, workers in SCHEDULES:
            kernel = compiled(g, schedule, workers)
            for batch in (5, 37):
                data = [inputs(r, {"x": (batch, 32), "w": (32, 40)}) for r in everyone]
                (z,) = kernel.run(**data[rank])
                total = sum(d["x"] @ d["w"] for d in data)
                np.testing.assert_allclose(z, 2 * total, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{schedule} x{workers} {batch, tile}")
                # Every rank adds the slots in rank order: the same bits.
                gathered = MPI.COMM_WORLD.allgather(z.tobytes())
                assert all(b == gathered[0] for b in gathered), "ranks disagree on all_reduce"
                checks += 1
                dynamic += schedule == "dynamic"

    # "auto" keeps graphs on several ranks on the static schedule.
    g = etc.Graph("auto", ranks=ranks)
    x = g.input("x", (32, 16))
    g.output(g.matmul(g.all_gather(x), g.input("w", (16, 16))))
    assert etc.compile(g, target="cpu", schedule="auto").abi.schedule == "static"
    checks += 1

    print(f"rank {rank}: {checks} checks passed ({dynamic} dynamic)", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
