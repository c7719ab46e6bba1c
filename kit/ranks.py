#!/usr/bin/env python3
"""The GPU kit's benchmark on several ranks: the Event Tensor paper's two
fused patterns against GEMM then a separate collective.

    python3 gpu-kit/ranks.py [--ranks 2] [--one-gpu [--mps]] [--repeats 20] [--out report.md]

Patterns, bf16, on N ranks (one MPI process per GPU, NVSHMEM between them):

* all_gather + GEMM: y = all_gather(x) @ w, x (m, K) per rank;
* GEMM + reduce_scatter: z = reduce_scatter(x @ w), x (M, K) per rank.

Fused: the kit's artifacts of `g.matmul(g.all_gather(x), w)` and
`g.reduce_scatter(g.matmul(x, w))`, static and dynamic schedule, run by
ETC's NVSHMEM runtime (docs/distributed.md): one kernel per rank whose
collective tiles travel as soon as their GEMM tiles are done. Unfused:
NVSHMEM's own collective on the stream (`nvshmemx_bfloat16_fcollect_on_stream`,
`nvshmemx_bfloat16_sum_reducescatter_on_stream`, on symmetric buffers)
and the kit's one-GPU ETC kernel of the GEMM alone, one after the other.
Every variant is first checked against NumPy; each time is the median
wall time of a run between two MPI barriers on rank 0 (the slowest rank's;
runs on several ranks meet on the host twice, so small sizes measure that
too), rounds alternating between the variants.

It needs at least --ranks GPUs; on a machine with fewer it says so and
exits 0. `--one-gpu` runs the ranks on one GPU: NVSHMEM supports several
PEs per GPU, fully when an MPS server shares the GPU between them (their
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE adding up to at most 100), else in its
"limited" mode, where the processes' kernels take turns on the GPU (time
slices), so the times say nothing about overlap, and collectives on
streams end the process (so the unfused variant is left out unless
`--mps` says an MPS server shares the GPU); the kit does not start an MPS
server itself (docs/gpu.md). Needs numpy, cuda-bindings, mpi4py with
an MPI (the mpich wheel) and nvshmem4py-cu13; without them it says what to
install and exits 0. A kit built with --target cpu runs the same code on CPU
ranks (MPI's collectives for the unfused variant): the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KIT = Path(__file__).resolve().parent
sys.path.insert(0, str(KIT))
# As run.py: the kit's own etc/, not a developer's editable install.
sys.meta_path = [finder for finder in sys.meta_path
                 if not type(finder).__module__.startswith("_editable_")]

import numpy as np  # noqa: E402

PATTERNS = {"ag_mm": "all_gather + GEMM", "mm_rs": "GEMM + reduce_scatter"}


def log(*parts) -> None:
    print(*parts, flush=True)


def load_manifest() -> dict:
    return json.loads((KIT / "manifest.json").read_text())


def mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def missing(target: str) -> str | None:
    """What this machine lacks to run the ranks, or None."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed: pip install mpi4py==4.1.2 mpich==5.0.2"
    if mpiexec() is None:
        return "no mpiexec: pip install mpich==5.0.2"
    if target == "cuda":
        from etc.runtime.nvshmem import _bindings

        try:
            _bindings()
        except RuntimeError as error:
            return str(error)
    return None


# ---------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------

class Rank:
    """What one rank benchmarks with: its kernels, its MPI communicator and,
    on GPUs, NVSHMEM's bindings for the unfused collectives."""

    def __init__(self, manifest: dict, args):
        from mpi4py import MPI

        import etc.runtime

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()
        self.target = manifest["target"]
        self.args = args
        self.etc = etc
        entries = [e for e in manifest["artifacts"]
                   if e["kind"] == "ranks" and e["ranks"] == self.ranks]
        chips = sorted({e["chip"] for e in entries})
        #: The GPU of this rank: what ETC's NVSHMEM runtime picks (its local
        #: rank modulo the GPUs), also for the one-GPU GEMM of the unfused runs.
        self.ordinal = 0
        if self.target == "cuda":
            from etc.runtime.cuda import _check, _driver

            driver = _driver()
            local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            count = int(_check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount()))
            self.ordinal = local.Get_rank() % count
            local.Free()
            device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(self.ordinal))
            cc = tuple(int(_check(driver, "cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
                getattr(driver.CUdevice_attribute, name), device)))
                for name in ("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
                             "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
            own = f"sm_{cc[0]}{cc[1]}a"
            chips = [own] if own in chips else [c for c in chips if not c.endswith("a")
                                                  and int(c[3:]) <= 10 * cc[0] + cc[1]][-1:]
        self.entries = [e for e in entries if e["chip"] in chips[-1:]]
        self.kernels = {e["path"]: etc.runtime.load(KIT / e["path"]) for e in self.entries}
        for kernel in self.kernels.values():
            if hasattr(kernel.runtime, "device"):
                kernel.runtime.device = self.ordinal

    def timed(self, call) -> float:
        self.comm.Barrier()
        start = time.perf_counter()
        call()
        self.comm.Barrier()
        return time.perf_counter() - start

    # -- device memory -------------------------------------------------------

    def device(self, kernel, host: np.ndarray):
        """`host` as the kernel's input: a device copy on GPUs."""
        return kernel.runtime.device_array(host) if self.target == "cuda" else host

    def symmetric(self, runtime, shape, dtype):
        """A symmetric device buffer (NVSHMEM's heap) for the unfused
        collectives: collective, like every nvshmem_malloc."""
        from etc.runtime.cuda import DeviceArray

        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return DeviceArray(runtime._symmetric_malloc(nbytes), shape, dtype)

    # -- the patterns --------------------------------------------------------

    def variants(self, pattern: str, rows: int, k: int, n: int) -> dict:
        """{variant: run function}, each checked against NumPy once."""
        from etc import bfloat16
        from etc.reference import round_bf16

        found = {e["variant"]: self.kernels[e["path"]] for e in self.entries
                 if e["pattern"] == pattern and (e["rows"], e["k"], e["n"]) == (rows, k, n)}
        rng = np.random.default_rng(self.rank)
        x = round_bf16(rng.standard_normal((rows, k), np.float32))
        w = round_bf16(rng.standard_normal((k, n), np.float32) * 0.05)
        if pattern == "ag_mm":
            expected = np.concatenate(self.comm.allgather(x)) @ w
        else:  # every rank's own product, summed
            share = rows // self.ranks
            expected = sum(self.comm.allgather(x @ w))[share * self.rank:share * (self.rank + 1)]
        runs = {}
        for variant in ("static", "dynamic"):
            kernel = found[variant]
            xd, wd = self.device(kernel, bfloat16.to_bits(x)), self.device(kernel,
                                                                          bfloat16.to_bits(w))
            out = self.output(kernel, expected.shape)
            runs[f"fused, {variant}"] = self.check(
                lambda kernel=kernel, xd=xd, wd=wd, out=out: kernel.runtime.run(
                    {"x": xd, "w": wd}, out=out), expected, f"{pattern} fused {variant}")
        if self.target == "cuda" and self.args.one_gpu and not self.args.mps:
            # NVSHMEM's limited mode (several PEs per GPU without MPS) ends
            # the process on a collective on a stream.
            return runs
        runs["unfused"] = self.check(self.unfused(pattern, found["gemm"], x, w, found["static"]),
                                     expected, f"{pattern} unfused")
        return runs

    def output(self, kernel, shape):
        if self.target == "cuda":
            return [kernel.runtime.device_zeros(shape, np.uint16)]
        return None

    def check(self, run, expected, what: str):
        got = as_float(run()[0])
        error = float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30))
        if not error <= 2e-2:
            raise RuntimeError(f"rank {self.rank}: {what}: relative error {error:.3g} before "
                               "timing")
        return run

    def unfused(self, pattern: str, gemm, x, w, fused):
        """GEMM then the collective, one after the other."""
        from etc import bfloat16

        MPI, comm, ranks = self.MPI, self.comm, self.ranks
        rows, k = x.shape
        n = w.shape[1]
        if self.target != "cuda":
            if pattern == "ag_mm":
                gathered = np.empty((rows * ranks, k), np.uint16)
                bits = bfloat16.to_bits(x)

                def run():
                    comm.Allgather(bits, gathered)
                    return gemm.run(x=gathered, w=bfloat16.to_bits(w))
            else:
                part = np.empty((rows // ranks, n), np.float32)

                def run():
                    (y,) = gemm.run(x=bfloat16.to_bits(x), w=bfloat16.to_bits(w))
                    comm.Reduce_scatter_block(as_float(y), part, op=MPI.SUM)
                    return [part]
            return run
        # On GPUs: NVSHMEM's collectives on symmetric buffers, on the stream
        # the GEMM runs on (the fused kernel's runtime started NVSHMEM).
        runtime = fused.runtime
        bindings = runtime._bindings
        team = int(bindings.Team_id.TEAM_WORLD)
        wd = gemm.runtime.device_array(bfloat16.to_bits(w))
        stream = 0
        if pattern == "ag_mm":
            mine = self.symmetric(runtime, (rows, k), np.uint16)
            gathered = self.symmetric(runtime, (rows * ranks, k), np.uint16)
            host = bfloat16.to_bits(x)
            driver = runtime._driver
            driver.cuMemcpyHtoD(mine.pointer, host.ctypes.data, host.nbytes)
            out = [gemm.runtime.device_zeros((rows * ranks, n), np.uint16)]

            def run():
                bindings.bfloat16_fcollect_on_stream(team, gathered.pointer, mine.pointer,
                                                     rows * k, stream)
                return gemm.runtime.run({"x": gathered, "w": wd}, out=out, stream=stream)
        else:
            xd = gemm.runtime.device_array(bfloat16.to_bits(x))
            y = self.symmetric(runtime, (rows, n), np.uint16)
            part = self.symmetric(runtime, (rows // ranks, n), np.uint16)

            def run():
                gemm.runtime.run({"x": xd, "w": wd}, out=[y], stream=stream)
                bindings.bfloat16_sum_reducescatter_on_stream(team, part.pointer, y.pointer,
                                                              rows // ranks * n, stream)
                runtime._driver.cuStreamSynchronize(stream)
                return [part]
        return run

    def measure(self) -> list[dict]:
        sizes = sorted({(e["pattern"], e["rows"], e["k"], e["n"]) for e in self.entries})
        rows = []
        for pattern, m, k, n in sizes:
            runs = self.variants(pattern, m, k, n)
            times = {name: [] for name in runs}
            for _ in range(self.args.repeats):
                for name, run in runs.items():  # rounds alternate the variants
                    times[name].append(self.timed(run))
            rows.append({"pattern": pattern, "rows": m, "k": k, "n": n,
                         **{name: statistics.median(t) for name, t in times.items()}})
        return rows


def as_float(array) -> np.ndarray:
    """A result as float32: device arrays copied back, bf16 bits widened."""
    from etc import bfloat16

    if hasattr(array, "numpy"):
        array = array.numpy()
    return bfloat16.from_bits(array) if array.dtype == np.uint16 else np.asarray(array, np.float32)


def rank_main(args) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    manifest = load_manifest()
    try:
        rank = Rank(manifest, args)
        result = {"rows": rank.measure(), "device": rank_device(manifest["target"], rank.ordinal)}
    except Exception as error:
        result = {"error": f"rank {comm.Get_rank()}: {type(error).__name__}: {error}"}
    results = comm.gather(result, root=0)
    if comm.Get_rank() == 0:
        Path(args.result).write_text(json.dumps(results))
    # NVSHMEM and MPI finalise at exit; a failed rank leaves at once instead.
    if any("error" in r for r in comm.allgather(result)):
        os._exit(1)
    return 0


def rank_device(target: str, ordinal: int) -> str:
    if target != "cuda":
        return "CPU"
    from etc.runtime.cuda import _check, _driver

    driver = _driver()
    device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(ordinal))
    name = _check(driver, "cuDeviceGetName", driver.cuDeviceGetName(256, device))
    return name.split(b"\0")[0].decode()


# ---------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------

def table(results: list, ranks: int, one_gpu: bool, mps: bool) -> list[str]:
    lines = [f"## Fused vs unfused on {ranks} ranks"
             f"{' sharing one GPU' if one_gpu else ''} ({results[0]['device']})", "",
             "| pattern | per-rank shape | fused static ms | fused dynamic ms | unfused ms | "
             "static / unfused | dynamic / unfused |", "|---|---|---:|---:|---:|---:|---:|"]
    for row in results[0]["rows"]:
        static, dynamic = row["fused, static"] * 1e3, row["fused, dynamic"] * 1e3
        shape = (f"x {row['rows']}×{row['k']}, w {row['k']}×{row['n']}")
        if "unfused" in row:
            unfused = row["unfused"] * 1e3
            rest = f"{unfused:.3f} | {static / unfused:.2f} | {dynamic / unfused:.2f}"
        else:
            rest = "n/a | n/a | n/a"
        lines.append(f"| {PATTERNS[row['pattern']]} | {shape} | {static:.3f} | {dynamic:.3f} | "
                     f"{rest} |")
    if one_gpu and not mps:
        lines += ["", "(several PEs on one GPU without --mps: NVSHMEM's limited mode "
                  "time-slices the ranks' kernels, so these times measure turns on the GPU, "
                  "not overlap; it has no collectives on streams, so no unfused variant)"]
    elif one_gpu:
        lines += ["", "(several PEs on one GPU sharing it through MPS: each rank has part "
                  "of the SMs)"]
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks (processes) to run")
    parser.add_argument("--one-gpu", action="store_true",
                        help="run the ranks on one GPU (NVSHMEM's multiple PEs per GPU)")
    parser.add_argument("--mps", action="store_true",
                        help="with --one-gpu: an MPS server shares the GPU between the ranks "
                             "(started by you, with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE adding up "
                             "to at most 100), so NVSHMEM gives its full support")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per variant")
    parser.add_argument("--timeout", type=float, default=480, help="seconds for the ranks")
    parser.add_argument("--out", type=Path, default=None, help="append the report here")
    parser.add_argument("--internal-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.internal_rank:
        return rank_main(args)

    manifest = load_manifest()
    target = manifest["target"]

    def report(lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        log(text)
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(text)

    if not any(e["kind"] == "ranks" and e["ranks"] == args.ranks for e in manifest["artifacts"]):
        report([f"ranks.py: the kit has no artifacts for {args.ranks} ranks"])
        return 1
    env = dict(os.environ)
    if target == "cuda":
        from etc.runtime.cuda import _check, _driver, cuda_available

        if not cuda_available():
            report(["ranks.py: no CUDA GPU here; nothing to run (docs/gpu.md)."])
            return 0
        driver = _driver()
        gpus = int(_check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount()))
        if gpus < args.ranks and not args.one_gpu:
            report([f"ranks.py: {args.ranks} ranks need {args.ranks} GPUs and this machine has "
                    f"{gpus}: skipped (--one-gpu runs them on one GPU, docs/gpu.md)."])
            return 0
        if args.one_gpu:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    lack = missing(target)
    if lack:
        report([f"ranks.py: cannot run the ranks: {lack}"])
        return 0
    handle, result = tempfile.mkstemp(prefix="etc-kit-ranks-", suffix=".json")
    os.close(handle)
    command = [mpiexec(), "-disable-auto-cleanup", "-n", str(args.ranks), sys.executable,
               __file__, "--internal-rank", "--result", result, "--repeats", str(args.repeats),
               *(["--one-gpu"] if args.one_gpu else []), *(["--mps"] if args.mps else [])]
    start = time.perf_counter()
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                               env=env)
        output = (child.stdout + child.stderr).strip()
        results = json.loads(Path(result).read_text()) if Path(result).stat().st_size else None
    except subprocess.TimeoutExpired:
        output, results = f"no answer in {args.timeout:.0f} s (killed)", None
    finally:
        pass
    os.unlink(result)
    if not results or any("error" in r for r in results):
        errors = [r["error"] for r in results or [] if "error" in r]
        report(["ranks.py: FAILED: " + ("; ".join(errors) or output[-2000:])])
        return 1
    report(table(results, args.ranks, args.one_gpu, args.mps)
           + [f"({time.perf_counter() - start:.0f} s; {args.repeats} timed runs per variant)", ""])
    return 0


if __name__ == "__main__":
    sys.exit(main())
