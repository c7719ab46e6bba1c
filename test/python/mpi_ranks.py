"""Helpers of the tests of graphs on several ranks (test_distributed.py,
test_nvshmem.py, test_tensor_parallel.py): running a rank script of
distributed/ as MPI processes, and a small all_gather + matmul graph."""

from __future__ import annotations

import os

import etc
from etc.runtime import distributed

SCRIPTS = os.path.join(os.path.dirname(__file__), "distributed")


def launch(ranks: int, script: str, *args: str, timeout: float = 240,
           env_extra: dict | None = None):
    """Runs distributed/`script` with `args` as `ranks` MPI processes
    (`python -m etc.runtime.distributed`'s launcher, the mpich wheel's
    mpiexec); returns the result and its stdout and stderr together."""
    env = dict(os.environ, ETC_PIN_WORKERS="0", **(env_extra or {}))
    result = distributed.launch(ranks, [os.path.join(SCRIPTS, script), *args], timeout=timeout,
                                env=env)
    return result, result.stdout + result.stderr


def gather_graph(ranks: int = 2, rows: int = 32, tile=None):
    """all_gather of `rows` rows of 16 per rank, then a matmul by (16, 8);
    returns the graph and the gathered tensor."""
    g = etc.Graph("ag", ranks=ranks)
    x = g.input("x", (rows, 16))
    gathered = g.all_gather(x)
    g.output(g.matmul(gathered, g.input("w", (16, 8)), tile=tile))
    return g, gathered
