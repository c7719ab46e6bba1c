"""Compiles the GPU kit's programs on several ranks (kit/build.py's
`ranks_graphs` at its SMALL shapes) for the CPU, in an MPI job of that many
ranks (a CPU program on several ranks compiles there), and rank 0 saves
them to OUT as `<pattern>-<variant>.etc`: the CPU builds the fake CUDA
driver plays the kit's CUDA artifacts with (test_gpu_kit_ranks.py).
Usage: save_cpu_ranks.py OUT"""

import os
import sys

from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "kit"))

import build  # noqa: E402  (kit/build.py)

import etc  # noqa: E402

out = sys.argv[1]
comm = MPI.COMM_WORLD
for pattern, rows, k, n in build.SMALL.ranks:
    fused, gemm = build.ranks_graphs(pattern, rows, k, n, comm.Get_size())
    for schedule in ("static", "dynamic"):
        kernel = etc.compile(fused, target="cpu", schedule=schedule, workers=2)
        if comm.Get_rank() == 0:
            kernel.save(os.path.join(out, f"{pattern}-{schedule}.etc"))
    if comm.Get_rank() == 0:
        etc.compile(gemm, target="cpu", workers=2).save(os.path.join(out, f"{pattern}-gemm.etc"))
comm.Barrier()
print(f"rank {comm.Get_rank()}: saved", flush=True)
