"""One rank of the failure checks (run by test_distributed.py): rank 1
dies between two runs (`die`), or hangs in the middle of one (`hang`: it
runs a kernel of the same name and shapes that never sends its rows, so
the others wait for notifies that never come), under the static or the
dynamic schedule (the second argument). Every other rank must report an
error within its watchdog instead of hanging. Prints
`rank R: <ErrorType> after <s> s: ...` and ends the process at once (MPI
cannot finalise with a dead rank)."""

import os
import sys
import time

import numpy as np

import etc


def gather_matmul(ranks: int, send: bool, schedule: str):
    g = etc.Graph("gather_matmul", ranks=ranks)
    x = g.input("x", (32, 16))
    w = g.input("w", (16, 16))
    rows = g.all_gather(x) if send else g.add(g.matmul(x, w), g.matmul(x, w))
    g.output(g.matmul(rows, w))
    return etc.compile(g, target="cpu", schedule=schedule, workers=2, watchdog=1.0)


def main(mode: str, schedule: str) -> None:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    rank = MPI.COMM_WORLD.Get_rank()
    data = {"x": np.ones((32, 16), np.float32), "w": np.ones((16, 16), np.float32)}
    silent = mode == "hang" and rank == 1
    kernel = gather_matmul(ranks, send=not silent, schedule=schedule)
    if mode == "die":
        kernel.run(**data)  # one good run: every rank is up
        if rank == 1:
            os._exit(9)
    start = time.monotonic()
    try:
        kernel.run(**data)
        print(f"rank {rank}: no error", flush=True)
    except Exception as error:  # noqa: BLE001 - reported to the test
        print(f"rank {rank}: {type(error).__name__} after {time.monotonic() - start:.1f} s: "
              f"{error}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
