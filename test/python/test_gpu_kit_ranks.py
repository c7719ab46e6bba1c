"""The GPU kit's benchmark on several ranks (kit/ranks.py) without a GPU:
its CUDA artifacts (kit/build.py's `Builder.ranks` at the SMALL shapes)
run on the fake CUDA driver and the fake NVSHMEM (test/python/fake_cuda),
each kernel played by the CPU build of the same program, in two MPI
processes that ranks.py starts as on a GPU machine: the fused patterns and
the unfused ones (the GEMM alone and NVSHMEM's own collective) are checked
against NumPy before they are timed; with fewer GPUs than ranks it skips,
saying why."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mpi4py  # noqa: F401,E402  (a test dependency: a broken import fails)

from etc.runtime import distributed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "kit"))

import build  # noqa: E402  (kit/build.py)


@pytest.fixture(scope="module")
def ranks_kit(tmp_path_factory):
    """A kit of the ranks artifacts only (sm_90a), and the fake driver's map
    from each artifact's PTX to the CPU build of the same program."""
    import etc

    kit = tmp_path_factory.mktemp("ranks-kit")
    build.copy_runtime(kit)
    builder = build.Builder(kit, "cuda", ["sm_90a"])
    builder.ranks(build.SMALL)
    (kit / "manifest.json").write_text(json.dumps(
        {"format": 1, "target": "cuda", "built": "test", "artifacts": builder.entries}))
    cpu = tmp_path_factory.mktemp("ranks-cpu")
    result = distributed.launch(2, [str(HERE / "distributed" / "save_cpu_ranks.py"), str(cpu)],
                                timeout=300, env=dict(os.environ, ETC_PIN_WORKERS="0"))
    assert result.returncode == 0, result.stdout + result.stderr
    programs = {}
    for entry in builder.entries:
        ptx = etc.runtime.load(kit / entry["path"]).ptx
        programs[hashlib.sha256(ptx.encode()).hexdigest()] = str(
            cpu / f"{entry['pattern']}-{entry['variant']}.etc")
    (kit / "fake-map.json").write_text(json.dumps(programs))
    return kit


def _ranks_py(kit: Path, *args: str, devices: int = 1):
    env = dict(os.environ, PYTHONPATH=str(HERE / "fake_cuda"), ETC_PIN_WORKERS="0",
               ETC_FAKE_CUDA_MAP=str(kit / "fake-map.json"), ETC_FAKE_NVSHMEM="1",
               ETC_FAKE_CUDA_DEVICES=str(devices), UCX_LOG_LEVEL="error")
    # mpiexec beside this Python (the mpich wheel's), as on a GPU machine's PATH.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run([sys.executable, str(kit / "ranks.py"), *args], capture_output=True,
                          text=True, timeout=400, env=env)


def test_ranks_benchmark_on_the_fake_driver(ranks_kit, tmp_path):
    """Two GPUs (fake): every variant of both patterns runs, matches NumPy
    and gets a time; the table has their ratios."""
    result = _ranks_py(ranks_kit, "--repeats", "2", "--out", str(tmp_path / "report.md"),
                       devices=2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    report = (tmp_path / "report.md").read_text()
    assert "## Fused vs unfused on 2 ranks (Fake CUDA device (CPU))" in report, report
    for pattern in ("all_gather + GEMM", "GEMM + reduce_scatter"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {pattern} |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert all(float(cell) > 0 for cell in cells[2:]), row


def test_ranks_benchmark_skips_on_one_gpu_unless_asked(ranks_kit):
    """One GPU: ranks.py says it needs two and exits 0; --one-gpu runs both
    ranks on it (NVSHMEM's several PEs per GPU) and says what its times mean."""
    result = _ranks_py(ranks_kit, "--repeats", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 ranks need 2 GPUs and this machine has 1: skipped" in result.stdout, result.stdout
    result = _ranks_py(ranks_kit, "--repeats", "1", "--one-gpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "on 2 ranks sharing one GPU" in result.stdout, result.stdout
    assert "time-slices the ranks' kernels" in result.stdout, result.stdout
