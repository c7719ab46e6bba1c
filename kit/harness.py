"""The GPU check kit's harness: what its checks, probe and benchmarks share.

The Markdown report (`Report`), the CUDA device through cuda-bindings'
driver API (`Device`), the child processes every piece of work runs in
(`run_child`: run.py again with an --internal-* option, its result as
JSON), the kit's manifest and which of its artifacts run here, and the
worker kernels' resources (registers, spills, shared memory, occupancy).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

KIT = Path(__file__).resolve().parent
#: The kit's entry point, which each child process runs.
RUN = KIT / "run.py"


def log(*parts) -> None:
    print(*parts, flush=True)


class Report:
    """The Markdown report: printed, and appended to `path` (if any) and
    flushed to disk section by section."""

    def __init__(self, path: Path | None):
        self.path = path
        self.failed = 0
        if path is not None:
            path.write_text("")

    def add(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        log(text)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------

class Device:
    """The current CUDA device through cuda-bindings' driver API."""

    def __init__(self):
        from etc.runtime.cuda import _check, _driver

        self.check = _check
        self.driver = d = _driver()
        self.handle = device = _check(d, "cuDeviceGet", d.cuDeviceGet(0))
        self.cc = (self.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                   self.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
        self.sms = self.attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        name = _check(d, "cuDeviceGetName", d.cuDeviceGetName(256, device))
        self.name = name.split(b"\0")[0].decode()
        self.driver_version = int(_check(d, "cuDriverGetVersion", d.cuDriverGetVersion()))
        context = _check(d, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(device))
        _check(d, "cuCtxSetCurrent", d.cuCtxSetCurrent(context))

    def attribute(self, name: str) -> int:
        d = self.driver
        return int(self.check(d, "cuDeviceGetAttribute", d.cuDeviceGetAttribute(
            getattr(d.CUdevice_attribute, name), self.handle)))

    def runs(self, chip: str) -> bool:
        """Whether PTX for `chip` runs here: sm_XY needs compute capability
        >= X.Y; the arch-specific sm_XYa only X.Y itself."""
        digits = chip[3:].rstrip("a")
        want = (int(digits[:-1]), int(digits[-1]))
        return self.cc == want if chip.endswith("a") else self.cc >= want

    def describe(self) -> str:
        try:
            from cuda import bindings
            version = getattr(bindings, "__version__", "?")
        except ImportError:
            version = "?"
        major, minor = divmod(self.driver_version, 1000)
        return (f"{self.name}, sm_{self.cc[0]}{self.cc[1]}, {self.sms} SMs; CUDA driver "
                f"{major}.{minor // 10}; cuda-bindings {version}; Python "
                f"{platform.python_version()}; numpy {np.__version__}")

    def memset(self, array, stream=0) -> None:
        if array.nbytes:
            self.check(self.driver, "cuMemsetD8Async",
                       self.driver.cuMemsetD8Async(array.pointer, 0xFF, array.nbytes, stream))


# ---------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------

def run_child(arguments: list[str], timeout: float, env=None) -> tuple[dict | None, str]:
    """Runs this script with `arguments` in a child process that writes its
    result as JSON; returns (result or None, the child's output). A child
    that crashes, faults or hangs (killed at `timeout` seconds) returns
    None with what it printed."""
    handle, path = tempfile.mkstemp(prefix="etc-kit-", suffix=".json")
    os.close(handle)
    try:
        try:
            child = subprocess.run([sys.executable, str(RUN), *arguments, "--result", path],
                                   capture_output=True, text=True, timeout=timeout, env=env)
            text = (child.stdout + child.stderr).strip()
            status = f"exit status {child.returncode}"
        except subprocess.TimeoutExpired as expired:
            text = ((expired.stdout or b"").decode(errors="replace") if isinstance(
                expired.stdout, bytes) else (expired.stdout or ""))
            status = f"no answer in {timeout:.0f} s (killed)"
        try:
            with open(path) as f:
                return json.load(f), text
        except (OSError, ValueError):
            return None, f"{status}; {text[-1500:]}"
    finally:
        os.unlink(path)


def write_result(path: str, result) -> None:
    with open(path, "w") as f:
        json.dump(result, f)


def child_options(args) -> list[str]:
    """The options a child process needs from this one's."""
    options = ["--runs", str(args.runs), "--repeats", str(args.repeats),
               "--copy-mib", str(args.copy_mib)]
    if args.plant_misaligned:
        options += ["--plant-misaligned", args.plant_misaligned]
    return options


# ---------------------------------------------------------------------------
# Artifacts
# ---------------------------------------------------------------------------

def load_manifest() -> dict:
    path = KIT / "manifest.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: build the kit with `make gpu-kit`")
    return json.loads(path.read_text())


def runnable(entry: dict, device: Device | None) -> bool:
    return device is None or device.runs(entry["chip"])


def best_chip(manifest: dict, device: Device) -> str:
    chips = sorted({e["chip"] for e in manifest["artifacts"] if runnable(e, device)})
    # The arch-specific chip when there is one (sm_90a on an H100), else the newest.
    return next((c for c in chips if c.endswith("a")), chips[-1] if chips else "")


def resources(kernel, label: str) -> dict:
    """What the driver says about `kernel`'s worker (after a run), and the
    JIT's line about it (ptxas registers and spills)."""
    row = {"artifact": label, **kernel.runtime.resources(), "workers": kernel.runtime.workers}
    worker = f"{kernel.abi.name}_worker"
    log_lines = kernel.runtime.jit_log.splitlines()
    for i, line in enumerate(log_lines):
        if worker in line and "Function properties" not in line:
            row["jit"] = " ".join(part.split(":", 1)[-1].strip()
                                  for part in log_lines[i:i + 2])
            break
    return row


def resource_table(rows: list[dict]) -> list[str]:
    """The worker kernels' resources, one line per artifact."""
    lines = ["### Worker kernels (driver JIT of the PTX)", "",
             "| artifact | registers | local B | static shared B | dynamic shared B | lanes | "
             "CTAs/SM | workers | JIT |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['artifact']} | {r['registers']} | {r['local_bytes']} | "
                     f"{r['static_shared_bytes']} | {r['dynamic_shared_bytes']} | {r['lanes']} | "
                     f"{r['ctas_per_sm']} | {r['workers']} | {r.get('jit', '')} |")
    return lines + [""]
