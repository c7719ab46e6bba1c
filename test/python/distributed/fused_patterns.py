"""One rank of the fused-collective checks (run by test_distributed.py
under `python -m etc.runtime.distributed -n N`).

Every rank builds the same graphs, compiles them once, runs them on its own
inputs and compares its outputs with NumPy, which every rank can compute
since each rank's inputs come from a seed of its rank. Prints one line
`rank R: <n> checks passed` or raises."""

import sys

import numpy as np

import etc
from etc.pipeline import PipelineError


def inputs(rank: int, shapes: dict) -> dict:
    rng = np.random.default_rng(1000 + rank)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def main() -> None:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    rank = MPI.COMM_WORLD.Get_rank()
    everyone = range(ranks)
    checks = 0

    # all_gather + matmul: rows of x per rank, K, N, matmul tile, schedule.
    for rows, k, n, tile, schedule in ((32, 48, 40, None, "static"),
                                       (16, 24, 72, (16, 32), "auto")):
        g = etc.Graph("gather_matmul", ranks=ranks)
        x = g.input("x", (rows, k))
        w = g.input("w", (k, n))
        g.output(g.matmul(g.all_gather(x), w, tile=tile))
        kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
        data = [inputs(r, {"x": (rows, k), "w": (k, n)}) for r in everyone]
        (y,) = kernel.run(**data[rank])
        want = np.concatenate([d["x"] for d in data]) @ data[rank]["w"]
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        checks += 1

    # matmul + reduce_scatter: rows per rank after the scatter, K, N, tile.
    for local, k, n, tile, schedule in ((32, 40, 48, None, "static"),
                                        (8, 16, 40, (8, 16), "auto")):
        g = etc.Graph("matmul_scatter", ranks=ranks)
        x = g.input("x", (local * ranks, k))
        w = g.input("w", (k, n))
        g.output(g.reduce_scatter(g.matmul(x, w), tile=tile))
        kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
        data = [inputs(r, {"x": (local * ranks, k), "w": (k, n)}) for r in everyone]
        (z,) = kernel.run(**data[rank])
        total = sum(d["x"] @ d["w"] for d in data)
        np.testing.assert_allclose(z, total[rank * local:(rank + 1) * local], rtol=1e-4,
                                   atol=1e-4)
        checks += 1

    # matmul + all_reduce over a symbolic row count, then a local operator.
    for tile, schedule in ((None, "static"), ((16, 16), "auto")):
        g = etc.Graph("matmul_allreduce", ranks=ranks)
        rows = g.symbol("B")
        x = g.input("x", (rows, 32))
        w = g.input("w", (32, 40))
        summed = g.all_reduce(g.matmul(x, w), tile=tile)
        g.output(g.add(summed, summed))
        kernel = etc.compile(g, target="cpu", schedule=schedule, workers=2)
        for batch in (5, 37):
            data = [inputs(r, {"x": (batch, 32), "w": (32, 40)}) for r in everyone]
            (z,) = kernel.run(**data[rank])
            total = sum(d["x"] @ d["w"] for d in data)
            np.testing.assert_allclose(z, 2 * total, rtol=1e-4, atol=1e-4)
            # Every rank adds the slots in rank order: the same bits.
            gathered = MPI.COMM_WORLD.allgather(z.tobytes())
            assert all(b == gathered[0] for b in gathered), "ranks disagree on all_reduce"
            checks += 1

    # The dynamic schedule cannot ready tasks other ranks notify.
    g = etc.Graph("dynamic", ranks=ranks)
    x = g.input("x", (32, 16))
    g.output(g.matmul(g.all_gather(x), g.input("w", (16, 16))))
    try:
        etc.compile(g, target="cpu", schedule="dynamic")
    except PipelineError as error:
        assert "dynamic schedule cannot ready tasks that other ranks notify" in str(error)
        checks += 1
    else:
        raise AssertionError("the dynamic schedule accepted a graph on several ranks")

    print(f"rank {rank}: {checks} checks passed", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
