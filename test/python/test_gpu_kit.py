"""The GPU check kit (kit/build.py, kit/run.py): it builds, its run.py needs
no MLIR, and its checks (poisoned runs against the NumPy reference, the
watchdog's broken programs) pass on a kit of CPU artifacts and fail when an
artifact is wrong."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from etc.runtime.cuda import cuda_available

ROOT = Path(__file__).resolve().parents[2]

#: Runs the kit's run.py in a process where `import mlir` fails.
WITHOUT_MLIR = ("import runpy, sys; sys.modules['mlir'] = None; "
                "sys.argv = [sys.argv[1]] + sys.argv[2:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")


def build(out: Path, *extra: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "kit" / "build.py"), "--out", str(out),
                             "--quick", *extra], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def run_kit(kit: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_MLIR, str(kit / "run.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_kit(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kit") / "cpu-kit"
    build(out, "--target", "cpu")
    return out


@pytest.fixture(scope="module")
def cuda_kit(tmp_path_factory) -> tuple[Path, str]:
    """The CUDA kit for sm_90a, built once for this file's tests, and its
    build's output. (`make gpu-kit` builds sm_80 too: the same graphs
    through the same pipeline with the other chip option, about half of
    the build's time; test_cuda_ptx.py and test_model_ptx.py assemble sm_80
    PTX of the operators and the models.)"""
    out = tmp_path_factory.mktemp("kit") / "gpu-kit"
    return out, build(out, "--chips", "sm_90a")


def test_cuda_kit_builds_and_runs_without_mlir(cuda_kit):
    out, log = cuda_kit
    manifest = json.loads((out / "manifest.json").read_text())
    kinds = {e["kind"] for e in manifest["artifacts"]}
    assert {"check", "watchdog", "latency", "overhead", "gemv", "mlp", "gemm", "hopper",
            "roofline", "decode"} <= kinds
    assert {e["chip"] for e in manifest["artifacts"]} == {"sm_90a"}
    assert {e["requested_schedule"] for e in manifest["artifacts"] if e["kind"] == "check"} == {
        "static", "dynamic", "auto"}
    assert not (out / "etc" / "compiler.py").exists() and not list(out.rglob("_etc*.so"))
    assert "MiB" in log
    help_text = run_kit(out, "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--runs" in help_text.stdout
    if not cuda_available():
        result = run_kit(out)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "no CUDA GPU here" in result.stdout


def test_kit_checks_and_watchdog_pass_on_cpu_artifacts(cpu_kit):
    result = run_kit(cpu_kit, "--runs", "2", "--out", str(cpu_kit / "report.md"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = (cpu_kit / "report.md").read_text()
    assert "Checks: 15/15 artifacts passed" in report
    assert "Watchdog: 2/2 broken artifacts raised WatchdogError" in report
    assert "all passed" in report


def test_kit_reports_a_wrong_artifact(cpu_kit):
    """An artifact whose code computes something else than its graph says
    fails the kit: the code of x * z saved with the ABI (and so the NumPy
    reference) of x + z."""
    import etc
    from etc.runtime import artifact

    def kernel(op: str):
        g = etc.Graph("swapped")
        B = g.symbol("B")
        g.output(getattr(g, op)(g.input("x", (B, 96), "f32"), g.input("z", (B, 96), "f32")))
        path = cpu_kit / f"swapped_{op}.etc"
        etc.compile(g, target="cpu", workers=2).save(path)
        return artifact.read(path)

    _, add_abi, _ = kernel("add")
    _, _, mul_code = kernel("mul")
    artifact.write(cpu_kit / "artifacts" / "swapped.etc", add_abi, mul_code)
    manifest_path = cpu_kit / "manifest.json"
    original = manifest_path.read_text()
    manifest = json.loads(original)
    good = next(e for e in manifest["artifacts"] if e["path"].endswith("op_add-static-host.etc"))
    manifest["artifacts"].append(dict(good, path="artifacts/swapped.etc"))
    manifest_path.write_text(json.dumps(manifest))
    try:
        result = run_kit(cpu_kit, "--runs", "1", "--only", "op_add", "--skip-watchdog")
    finally:
        manifest_path.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"FAILED artifacts/swapped.etc: .*\n +- B=1 run 0 output 0: relative error",
                     result.stdout), result.stdout
    assert "Checks: 3/4 artifacts passed" in result.stdout


@pytest.fixture(scope="module")
def fake_driver_run(tmp_path_factory, cpu_kit, cuda_kit):
    """The CUDA runtime and the kit's CUDA code paths, end to end, on a
    stand-in for cuda.bindings.driver whose launches run the CPU build of
    the same program (test/python/fake_cuda): binding, staging copies,
    poisoned device buffers, cooperative launches, the run header and
    g_check, the watchdog in a child process, the probe, the benchmark
    tables. One family gets a misaligned array planted behind the runtime's
    back: its child process faults (a sticky error, as on a GPU) and that
    family fails, while every other family's results, and the report
    written so far, are kept. Returns run.py's result, its report and the
    fake driver's log of launches (`how name schedule` lines)."""
    from etc.runtime import load

    tmp_path = tmp_path_factory.mktemp("fake-driver")
    gpu_kit = shutil.copytree(cuda_kit[0], tmp_path / "gpu-kit")
    manifest = json.loads((gpu_kit / "manifest.json").read_text())
    cpu_paths = {e["path"].replace("-host.etc", ""): cpu_kit / e["path"]
                 for e in json.loads((cpu_kit / "manifest.json").read_text())["artifacts"]}
    mapping = {}
    for entry in manifest["artifacts"]:
        ptx = load(gpu_kit / entry["path"]).ptx
        mapping[hashlib.sha256(ptx.encode()).hexdigest()] = str(
            cpu_paths[entry["path"].replace("-sm_90a.etc", "")])
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    env = dict(os.environ, ETC_FAKE_CUDA_MAP=str(tmp_path / "map.json"),
               ETC_FAKE_CUDA_LOG=str(tmp_path / "launches.log"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "test" / "python" / "fake_cuda"),
                                           os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_MLIR, str(gpu_kit / "run.py"), "--runs", "2",
         "--skip-sanitizer", "--repeats", "3", "--copy-mib", "4", "--probe",
         "--plant-misaligned", "op_add", "--out", str(tmp_path / "report.md")],
        capture_output=True, text=True, timeout=900, env=env)
    output = result.stdout + result.stderr
    assert (tmp_path / "report.md").is_file() and (tmp_path / "launches.log").is_file(), output
    report = (tmp_path / "report.md").read_text()
    launches = [line.split() for line in (tmp_path / "launches.log").read_text().splitlines()]
    return result, report, launches


def test_kit_on_a_fake_driver_fails_only_the_planted_family(fake_driver_run):
    """run.py exits 1; the planted fault fails op_add's three artifacts and
    nothing else; the watchdog's broken artifacts raise."""
    result, report, _ = fake_driver_run
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Fake CUDA device (CPU), sm_90, 2 SMs" in report
    failed = re.findall(r"- FAILED (\S+): ", report)
    assert failed == [f"artifacts/op_add-{s}-sm_90a.etc" for s in ("static", "dynamic", "auto")]
    assert report.count("CUDA_ERROR_MISALIGNED_ADDRESS") >= 3, report
    assert "Checks: 12/15 artifacts passed" in report
    assert report.strip().endswith("3 FAILED.")
    assert "Watchdog: 2/2 broken artifacts raised WatchdogError" in report


def test_kit_on_a_fake_driver_reports_each_workers_resources(fake_driver_run):
    """The worker kernels' table: registers, stack, shared memory and
    occupancy as the driver reports them."""
    _, report, _ = fake_driver_run
    workers = report.split("### Worker kernels")[1].split("###")[0]
    assert re.search(r"\| artifacts/mlp_bf16-static-sm_90a.etc \| 40 \| 0 \| 16 \| \d+ \| 128 \| "
                     r"1 \| 2 \|", workers), workers


def test_kit_on_a_fake_driver_probes_the_device(fake_driver_run):
    _, report, _ = fake_driver_run
    probe = report.split("## Probe")[1].split("## Checks")[0]
    assert "land on 2 distinct SMs (of 2): yes" in probe, probe
    assert "captured in a CUDA graph: captured, instantiated and replayed; 2/2 CTAs ran: yes" \
        in probe, probe
    assert "%globaltimer over 4096 consecutive reads" in probe, probe


def test_kit_on_a_fake_driver_fills_every_benchmark_table(fake_driver_run):
    """Every benchmark table has its rows; the static MLP and decode step
    also without the weight prefetch (its A/B) and replayed as CUDA graphs."""
    _, report, _ = fake_driver_run
    latency = report.split("### Notify")[1].split("###")[0]
    assert re.search(r"\| 1 \| 2 \| [\d.]+ \| — \|", latency), latency
    overhead = report.split("### Per-task overhead")[1].split("###")[0]
    assert re.search(r"\| 16384 \| [\d.]+ \| \d+ \| [\d.]+ \| \d+ \|", overhead), overhead
    for title, rows in (("### bf16 GEMV", 10), ("### Roofline", 7), ("### 5-operator MLP", 5),
                        ("### Decode step", 4), ("### bf16 GEMM", 1), ("### bf16 x·Wᵀ GEMM", 6),
                        ("### bf16 prefill", 3), ("### Packed weights", 10)):
        table = [line for line in report.split(title)[1].split("###")[0].splitlines()
                 if re.match(r"\| \d|\| \w.*\| [\d.]+ \|", line)]
        assert len(table) == rows, (title, table)
    for title in ("### 5-operator MLP", "### Decode step"):
        section = report.split(title)[1].split("###")[0]
        assert "| ETC static, no prefetch " in section, section
        assert "| ETC static, CUDA graph" in section and "capture failed" not in section
    decode = report.split("### Decode step")[1].split("###")[0]
    assert "| ETC static, 256 lanes ms |" in decode, decode
    benchmarks = report.split("## Benchmarks")[1].split("\nTotal ")[0]
    assert "FAILED" not in benchmarks


def test_kit_on_a_fake_driver_times_the_warp_specialised_tile(fake_driver_run, cuda_kit):
    """The "hopper" table has the warp-specialised variant beside cp.async
    and TMA at each shape: its artifacts are compiled at 256 lanes (the
    ABI's, the worker's `.maxntid`, which the fake driver holds each launch
    to), checked against NumPy and timed."""
    from etc.runtime import load

    _, report, _ = fake_driver_run
    section = report.split("### bf16 x·Wᵀ GEMM, known rows")[1].split("###")[0]
    for m, n, k in ((64, 64, 128), (130, 128, 192)):
        for loads in ("cp.async", "TMA", "TMA, warp-specialised"):
            assert f"| {m}×{n}×{k} | {loads} | " in section, section
        kernel = load(cuda_kit[0] / "artifacts" / f"hopper_{m}x{n}x{k}-ws-sm_90a.etc")
        assert kernel.abi.lanes == 256 and ".maxntid 256, 1, 1" in kernel.ptx
        assert "setmaxnreg" in kernel.ptx
    # The decode step's 256-lane worker (models.load(lanes=256)), beside
    # the 128-lane one, in the same table.
    wide = load(cuda_kit[0] / "artifacts" / "decode_step-static-256lanes-sm_90a.etc")
    plain = load(cuda_kit[0] / "artifacts" / "decode_step-static-sm_90a.etc")
    assert (wide.abi.lanes, plain.abi.lanes) == (256, 128)
    assert ".maxntid 256, 1, 1" in wide.ptx and ".maxntid" not in plain.ptx


def test_kit_on_a_fake_driver_launches_static_workers_cooperatively(fake_driver_run):
    """Static workers need every CTA resident: always a cooperative launch;
    everything else (dynamic workers, _init, _check, _counters) is plain."""
    launches = fake_driver_run[2]
    workers = {(how, schedule) for how, name, schedule in launches if name.endswith("_worker")}
    assert workers == {("cooperative", "static"), ("plain", "dynamic")}, workers
    assert all(how == "plain" for how, name, _ in launches if not name.endswith("_worker"))
