"""One rank of the CUDA programs on several ranks, run by ETC's NVSHMEM
runtime on the fake CUDA driver and the fake NVSHMEM (test/python/fake_cuda):
every host step of a real run (MPI checks, the unique-id bootstrap, the
symmetric block, the driver's link, `nvshmemx_cumodule_init`, the meetings,
the launches, the end-of-run checks) with the kernels played by the CPU
build of the same program over an MPI window. Usage: nvshmem_fake.py
SCHEDULE [hang]. Prints "rank R: nvshmem fake: N checks passed" or, with
`hang` (rank 1 skips the second run), how the other ranks failed."""

import hashlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fake_cuda"))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import etc  # noqa: E402
import fake_driver  # noqa: E402
import fake_nvshmem  # noqa: E402

schedule = sys.argv[1]
hang = len(sys.argv) > 2 and sys.argv[2] == "hang"
comm = MPI.COMM_WORLD
rank, ranks = comm.Get_rank(), comm.Get_size()


def gather_matmul():
    g = etc.Graph("ag_mm", ranks=ranks)
    x = g.input("x", (32, 32))
    w = g.input("w", (32, 16))
    g.output(g.matmul(g.all_gather(x), w))
    return g


def matmul_reduce_scatter():
    g = etc.Graph("mm_rs", ranks=ranks)
    x = g.input("x", (32 * ranks, 24))
    w = g.input("w", (24, 16))
    g.output(g.reduce_scatter(g.matmul(x, w)))
    return g


programs, kernels = {}, []
for build in (gather_matmul, matmul_reduce_scatter):
    graph = build()
    watchdog = 1.0 if hang else 5.0
    cpu = etc.compile(graph, target="cpu", schedule=schedule, workers=2, watchdog=watchdog)
    gpu = etc.compile(graph, target="cuda", chip="sm_90a", schedule=schedule, watchdog=watchdog)
    programs[hashlib.sha256(gpu.ptx.encode()).hexdigest()] = cpu
    kernels.append(gpu)
fake_driver.install(fake_driver.build(programs))
fake_nvshmem.install()
gather, scatter = kernels
comm.Barrier()  # the ranks compiled at their own pace; the runs' meetings wait 1 s
rng = np.random.default_rng(rank)

if hang:
    x = rng.standard_normal((32, 32), dtype=np.float32)
    w = rng.standard_normal((32, 16), dtype=np.float32)
    gather.run(x=x, w=w)
    if rank == 1:
        time.sleep(5)  # never comes to the second run
        print(f"rank {rank}: stayed away", flush=True)
        os._exit(0)
    began = time.monotonic()
    try:
        gather.run(x=x, w=w)
        print(f"rank {rank}: no error", flush=True)
    except Exception as error:
        print(f"rank {rank}: {type(error).__name__} after {time.monotonic() - began:.1f} s: "
              f"{error}", flush=True)
    os._exit(0)

checks = 0
for _ in range(3):  # the workspace (and its symmetric block) is reused
    x = rng.standard_normal((32, 32), dtype=np.float32)
    w = rng.standard_normal((32, 16), dtype=np.float32)
    everyone = comm.allgather(x)
    (y,) = gather.run(x=x, w=w)
    np.testing.assert_allclose(y, np.concatenate(everyone) @ w, rtol=1e-4, atol=1e-4)
    checks += 1

x = rng.standard_normal((32 * ranks, 24), dtype=np.float32)
w = rng.standard_normal((24, 16), dtype=np.float32)
total = sum(comm.allgather(x @ w))
(y,) = scatter.run(x=x, w=w)
np.testing.assert_allclose(y, total[32 * rank:32 * (rank + 1)], rtol=1e-4, atol=1e-4)
checks += 1

# Saved and loaded, as the GPU kit carries it: the artifact holds NVSHMEM's
# device library PTX, and the loaded kernel runs on the same runtime.
path = os.path.join(os.environ["ETC_TEST_DIR"], f"mm_rs-{rank}.etc")
scatter.save(path)
loaded = etc.runtime.load(path)
assert type(loaded.runtime).__name__ == "NVSHMEMRuntime", type(loaded.runtime)
(again,) = loaded.run(x=x, w=w)
np.testing.assert_allclose(again, y, rtol=0, atol=0)
checks += 1

gather.runtime.free_workspaces()
assert len(fake_nvshmem.STATE.get("freed", [])) == 1, fake_nvshmem.STATE.get("freed")
print(f"rank {rank}: nvshmem fake: {checks} checks passed", flush=True)
