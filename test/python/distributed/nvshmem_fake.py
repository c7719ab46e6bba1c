"""One rank of the CUDA programs on several ranks, run by ETC's NVSHMEM
runtime on the fake CUDA driver and the fake NVSHMEM (test/python/fake_cuda):
every host step of a real run (MPI checks, the unique-id bootstrap, the
symmetric block, the driver's link, `nvshmemx_cumodule_init`, the meetings,
the launches, the end-of-run checks) with the kernels played by the CPU
build of the same program over an MPI window. Usage: nvshmem_fake.py
SCHEDULE [hang | rules]. Prints "rank R: nvshmem fake: N checks passed"
(then how a run whose flushes deliver nothing, a program without
nvshmem_quiet, fails) or, with `hang` (rank 1 skips the second run), how
the other ranks failed, or, with `rules`, how the fake NVSHMEM refuses
collectives on buffers outside the symmetric heap, bad frees, reads of a
collective's result without waiting for its stream, and puts that a
notify overtakes (in ETC_TEST_DIR/rules-RANK.json)."""

import hashlib
import json
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
mode = sys.argv[2] if len(sys.argv) > 2 else "run"
hang = mode == "hang"
comm = MPI.COMM_WORLD
rank, ranks = comm.Get_rank(), comm.Get_size()


#: What `rules` found, by check (written to ETC_TEST_DIR/rules-RANK.json).
FOUND: dict = {}


def refused(what: str, call, error=Exception) -> None:
    """Notes how `call` was refused (or that it was not)."""
    try:
        call()
        FOUND[what] = "accepted"
    except error as failure:
        FOUND[what] = f"{type(failure).__name__}: {failure}"


def rules() -> None:
    """The fake NVSHMEM's rules, on the fake driver, without a program."""
    import ctypes

    from etc.runtime import nvshmem
    from etc.runtime.cuda import _check

    driver = fake_driver.build({})
    fake_driver.install(driver)
    fake_nvshmem.install()
    bindings = nvshmem._Process.start(comm, rank, ranks)
    team, count = int(bindings.Team_id.TEAM_WORLD), 8
    mine, gathered = bindings.malloc(2 * count), bindings.malloc(2 * count * ranks)
    private = int(_check(driver, "cuMemAlloc", driver.cuMemAlloc(2 * count * ranks)))
    host = np.full(count, rank + 1, np.uint16)
    _check(driver, "cuMemcpyHtoD", driver.cuMemcpyHtoD(mine, host.ctypes.data, host.nbytes))
    refused("fcollect from private memory", lambda: bindings.bfloat16_fcollect_on_stream(
        team, gathered, private, count, 0), fake_nvshmem.NvshmemError)
    refused("fcollect into private memory", lambda: bindings.bfloat16_fcollect_on_stream(
        team, private, mine, count, 0), fake_nvshmem.NvshmemError)
    refused("reduce-scatter past its block", lambda: bindings.bfloat16_sum_reducescatter_on_stream(
        team, mine, gathered + 2, count, 0), fake_nvshmem.NvshmemError)
    block = bindings.malloc(64)
    bindings.free(block)
    refused("a second free", lambda: bindings.free(block), fake_nvshmem.NvshmemError)

    # A put that no flush completes before the notify: the violation the
    # worker would fault with; a put outside the heap is refused.
    transport = fake_nvshmem.transport()
    window = fake_nvshmem._handle(fake_nvshmem.STATE["window"])
    other = (rank + 1) % ranks
    displacement = gathered - fake_nvshmem.STATE["base"]
    status = transport._put(host.ctypes.data, 16, transport.byte, other,
                            fake_nvshmem.HEAP_BYTES, 16, transport.byte, window)
    FOUND["a put outside the heap"] = f"status {status}"
    transport._put(host.ctypes.data, 16, transport.byte, other, displacement, 16,
                   transport.byte, window)
    one = ctypes.c_int32(0)
    transport._accumulate(ctypes.addressof(one), 1, fake_nvshmem._handle(MPI.INT), other,
                          displacement, 1, fake_nvshmem._handle(MPI.INT),
                          fake_nvshmem._handle(MPI.SUM), window)
    FOUND["violations"] = transport.finished()
    comm.Barrier()

    # A collective on a non-blocking stream runs in that stream's order:
    # read without waiting for the stream, its result is not there yet.
    stream = _check(driver, "cuStreamCreate", driver.cuStreamCreate(1))
    bindings.bfloat16_fcollect_on_stream(team, gathered, mine, count, stream)
    _check(driver, "cuStreamSynchronize", driver.cuStreamSynchronize(stream))
    result = np.zeros(count * ranks, np.uint16)
    _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(result.ctypes.data, gathered,
                                                      result.nbytes))
    FOUND["after the stream"] = result.tolist()
    host[:] = 7 * (rank + 1)
    _check(driver, "cuMemcpyHtoD", driver.cuMemcpyHtoD(mine, host.ctypes.data, host.nbytes))
    bindings.bfloat16_fcollect_on_stream(team, gathered, mine, count, stream)
    _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(result.ctypes.data, gathered,
                                                      result.nbytes))
    FOUND["without waiting"] = result.tolist()
    refused("the wait after the early read",
            lambda: driver.cuStreamSynchronize(stream), fake_driver.RaceError)
    with open(os.path.join(os.environ["ETC_TEST_DIR"], f"rules-{rank}.json"), "w") as f:
        json.dump(FOUND, f)
    os._exit(0)


if mode == "rules":
    rules()


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

# On a non-blocking stream (PyTorch's kind), with a new workspace and the
# inputs on the device (nothing staged): its symmetric block is zeroed
# before the stream's work uses it (the zeroing is queued on the legacy
# stream, which such a stream does not wait for).
driver = gather.runtime._driver
stream = driver.cuStreamCreate(1)[1]
x = rng.standard_normal((32, 32), dtype=np.float32)
w = rng.standard_normal((32, 16), dtype=np.float32)
everyone = comm.allgather(x)
on_device = {"x": gather.runtime.device_array(x), "w": gather.runtime.device_array(w)}
(y,) = gather.run(**on_device, stream=stream)
np.testing.assert_allclose(y, np.concatenate(everyone) @ w, rtol=1e-4, atol=1e-4)
checks += 1

transport = fake_nvshmem.transport()
assert transport.delivered > 0 and transport.notified > 0, (transport.delivered,
                                                            transport.notified)
print(f"rank {rank}: nvshmem fake: {checks} checks passed", flush=True)

# A program whose notifies are not preceded by a quiet: flushes that
# deliver nothing. The fake holds puts until a flush, so the notify
# overtakes them, and the worker faults saying so.
transport.quiet = False
try:
    gather.run(x=x, w=w)
    print(f"rank {rank}: without quiet: no error", flush=True)
except Exception as error:
    print(f"rank {rank}: without quiet: {type(error).__name__}: {error}", flush=True)
os._exit(0)
