#!/usr/bin/env python3
"""ETC's GPU check kit: checks and measures saved CUDA kernels on this machine.

Needs Python >= 3.10, numpy and cuda-bindings (PyTorch, and transformers for
the decode baseline, optional). No MLIR: the kernels are saved artifacts
(artifacts/*.etc, listed in manifest.json) and etc/ holds only ETC's runtime
and its NumPy reference. Without a GPU it says so and exits 0.

Every piece of work runs in a child process of its own, so that a kernel
that faults (a sticky CUDA error ends its process's context) fails that
piece only: each check family, each broken watchdog artifact, each
compute-sanitizer tool, the probe and each benchmark section. The report
(--out) is appended and flushed after every section, so a command stopped
at its time limit keeps what it finished.

What it does, in order (docs/gpu.md):
  0. with --probe: answers what the static schedule assumes of the hardware
     (which SM each worker CTA lands on and how many are resident at once),
     whether a cooperative launch can be captured in a CUDA graph, and the
     resolution of %globaltimer;
  1. checks every artifact that this GPU can run at each size of its recipe,
     --runs times with fresh inputs and outputs poisoned (0xFF bytes, NaN)
     before each run, against the NumPy reference (an error that appears in
     some runs only is a race), and reports each worker kernel's registers,
     local (spill) bytes, shared memory and CTAs per SM;
  2. runs the deliberately broken artifacts (a notify missing) and expects
     the watchdog's error within its timeout, not a hang;
  3. runs compute-sanitizer (memcheck, racecheck, synccheck) on one small
     artifact, when the tool exists;
  4. prints Markdown tables of benchmarks in GPU time (CUDA events around
     GPU work only: a spin kernel keeps the GPU busy while the host queues
     each timed run; "cold" runs follow an L2 flush): device-to-device copy
     bandwidth, notify->wake latency, per-task overhead, bf16 GEMV in GB/s,
     one line per tile kernel, the MLP block and a decode step against
     PyTorch eager and CUDA graphs (ETC also as a CUDA graph where the
     driver can capture it), a bf16 GEMM and the x·Wᵀ kernels at prefill
     sizes.

Exit status: 0 when every check passed (or there is no GPU), 1 otherwise.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

KIT = Path(__file__).resolve().parent
sys.path.insert(0, str(KIT))
# The kit runs its own copy of etc/. A developer's editable install of ETC
# (pip install -e) resolves `etc.*` through a meta-path finder ahead of
# sys.path; set it aside so that what is checked here is what travels.
sys.meta_path = [finder for finder in sys.meta_path
                 if not type(finder).__module__.startswith("_editable_")]

import numpy as np  # noqa: E402

import etc.bfloat16  # noqa: E402  (the kit's own copy: runtime + reference, no MLIR)
import etc.reference  # noqa: E402
import etc.runtime  # noqa: E402
import families  # noqa: E402
from etc.reference import round_bf16  # noqa: E402
from etc.runtime import WatchdogError  # noqa: E402
from etc.runtime.cpu import _STORAGE as STORAGE  # noqa: E402
from etc.runtime.cuda import EventTimer as Timer  # noqa: E402

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
#: The artifact compute-sanitizer runs (small, with lane reductions).
SANITIZER_FAMILY = "op_rmsnorm"
#: Seconds per compute-sanitizer tool (racecheck of a spinning megakernel is slow).
SANITIZER_TIMEOUT = 90
BATCHES = (1, 2, 4, 8, 16)
DECODE_BATCHES = (1, 4, 16, 64)


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
            child = subprocess.run([sys.executable, __file__, *arguments, "--result", path],
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


def symbol_of(kernel) -> str:
    return next(a.name for a in kernel.arguments if a.kind == "symbol")


def plant_misaligned(launch) -> str:
    """Moves the first staged input of `launch` 4 bytes off its 16-byte
    alignment behind the runtime's back (its own check refuses such
    arrays): what a kernel bug would do. The next launch faults with a
    sticky CUDA_ERROR_MISALIGNED_ADDRESS, which ends the process's context."""
    from etc.runtime.cuda import DeviceArray

    for name, buffer in launch.buffers.items():
        if any(buffer is staged for staged, _ in launch._copies):
            launch.buffers[name] = DeviceArray(buffer.pointer + 4, buffer.shape, buffer.dtype)
            launch.upload()
            return name
    raise RuntimeError("no staged input to misalign")


def poisoned_run(kernel, inputs: dict, device: Device | None, plant: bool = False) -> list:
    """One run with every output (and, on the GPU, every intermediate)
    filled with 0xFF bytes first: NaN for floats, -1 for integers."""
    if device is None:
        out = []
        for arg in kernel.arguments:
            if arg.kind == "output":
                shape = tuple(inputs_shape(kernel, inputs, arg))
                dtype = np.int32 if arg.dtype == "i32" else (
                    np.float16 if arg.dtype == "f16" else np.float32)
                out.append(np.full(shape, -1 if dtype == np.int32 else np.nan, dtype))
        return kernel.run(out=out, **inputs)
    launch = kernel.runtime.bind(inputs)
    for arg in kernel.arguments:
        if arg.kind in ("output", "intermediate"):
            device.memset(launch.buffers[arg.name])
    if plant:
        plant_misaligned(launch)
    launch.enqueue()
    launch.check()
    return launch.outputs()


def inputs_shape(kernel, inputs: dict, arg) -> list[int]:
    from etc.binding import bind_symbols

    shapes = {a.name: np.shape(inputs[a.name]) for a in kernel.arguments
              if a.kind in ("input", "state")}
    symbols = bind_symbols(kernel.arguments, shapes)
    return [symbols[d] if isinstance(d, str) else d for d in arg.shape]


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


def check_artifact(entry: dict, runs: int, device: Device | None, plant: bool = False) -> dict:
    """Runs one artifact `runs` times at each size; returns a result row."""
    path = KIT / entry["path"]
    recipe = families.recipe_from_json(entry["recipe"])
    result = {"artifact": entry["path"], "checks": 0, "worst": 0.0, "failures": []}
    start = time.perf_counter()
    try:
        kernel = etc.runtime.load(path)
        symbol = symbol_of(kernel)
        rng = np.random.default_rng(zlib.crc32(entry["path"].encode()))
        for size in recipe.sizes:
            for run in range(runs):
                inputs = families.make_inputs(kernel.arguments, {symbol: size}, recipe, rng)
                outputs = poisoned_run(kernel, inputs, device, plant)
                if device is not None and "resources" not in result:
                    result["resources"] = resources(kernel, entry["path"])
                expected = etc.reference.evaluate(kernel, **inputs)
                for index, (got, want) in enumerate(zip(outputs, expected, strict=True)):
                    error = families.relative_error(got, want)
                    result["checks"] += 1
                    result["worst"] = max(result["worst"], error)
                    if not error <= recipe.tolerance:
                        result["failures"].append(
                            f"{symbol}={size} run {run} output {index}: relative error "
                            f"{error:.3g} > {recipe.tolerance:g}")
    except Exception as error:  # one broken artifact must not stop the others
        result["failures"].append(f"{type(error).__name__}: {error}")
    result["seconds"] = time.perf_counter() - start
    return result


def family_child(name: str, args, device: Device | None) -> dict:
    """In a child process: every runnable check artifact of family `name`."""
    manifest = load_manifest()
    entries = [e for e in manifest["artifacts"] if e["kind"] == "check"
               and e["family"] == name and runnable(e, device)]
    return {"results": [check_artifact(e, args.runs, device, args.plant_misaligned == name)
                        for e in entries]}


def run_checks(manifest: dict, args, device: Device | None, report: Report) -> None:
    entries = [e for e in manifest["artifacts"] if e["kind"] == "check"
               and fnmatch.fnmatch(e["family"], args.only)]
    skipped = [e["path"] for e in entries if not runnable(e, device)]
    names = list(dict.fromkeys(e["family"] for e in entries if runnable(e, device)))
    count = sum(1 for e in entries if runnable(e, device))
    report.add([f"## Checks: {count} artifacts of {len(names)} families x sizes x {args.runs} "
                "poisoned runs, a child process per family"
                + (f" ({len(skipped)} skipped: their chip is not this GPU's)" if skipped else ""),
                ""])
    deadline = time.perf_counter() + args.check_budget
    passed = total = 0
    rows = []
    for index, name in enumerate(names):
        if time.perf_counter() > deadline:
            report.add([f"- NOT CHECKED: families {', '.join(names[index:])} (the "
                        f"--check-budget of {args.check_budget:.0f} s is spent)"])
            report.failed += len(names) - index
            break
        start = time.perf_counter()
        result, text = run_child(["--internal-family", name, *child_options(args)],
                                 args.family_timeout)
        lines = []
        if result is None:
            family_entries = [e for e in entries if e["family"] == name]
            total += len(family_entries)
            report.failed += 1
            lines.append(f"- FAILED family {name} ({len(family_entries)} artifacts): the child "
                         f"process died: {text}")
        else:
            for r in result["results"]:
                total += 1
                ok = not r["failures"]
                passed += ok
                report.failed += not ok
                status = "ok" if ok else "FAILED"
                lines.append(f"- {status} {r['artifact']}: {r['checks']} checks, worst relative "
                             f"error {r['worst']:.2g}, {r['seconds']:.1f} s")
                lines += [f"    - {failure}" for failure in r["failures"][:5]]
                if 1 < len(r["failures"]) < r["checks"]:
                    lines.append(f"    - ({len(r['failures'])} failing checks: an error in some "
                                 "runs only is a race)")
                if "resources" in r:
                    rows.append(r["resources"])
        lines.append(f"  ({name}: {time.perf_counter() - start:.1f} s)")
        report.add(lines)
    report.add(["", f"Checks: {passed}/{total} artifacts passed ({args.runs} poisoned runs per "
                "size).", ""])
    if rows:
        report.add(resource_table(rows))


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


def child_options(args) -> list[str]:
    """The options a child process needs from this one's."""
    options = ["--runs", str(args.runs), "--repeats", str(args.repeats),
               "--copy-mib", str(args.copy_mib)]
    if args.plant_misaligned:
        options += ["--plant-misaligned", args.plant_misaligned]
    return options


def watchdog_child(path: str) -> int:
    """In a child process: runs a broken artifact; exit 0 if the watchdog
    error came (printing it), 2 if the run returned, 3 on another error."""
    kernel = etc.runtime.load(path)
    start = time.perf_counter()
    try:
        kernel.run(x=np.ones(64, np.float32))
    except WatchdogError as error:
        log(f"watchdog after {time.perf_counter() - start:.2f} s: {error}")
        return 0
    except Exception as error:
        log(f"unexpected {type(error).__name__}: {error}")
        return 3
    log("the broken program returned without an error")
    return 2


def run_watchdog(manifest: dict, device: Device | None, report: Report) -> None:
    entries = [e for e in manifest["artifacts"] if e["kind"] == "watchdog" and
               runnable(e, device)]
    lines = [f"## Watchdog: {len(entries)} broken artifacts must raise WatchdogError, not hang",
             ""]
    good = 0
    for entry in entries:
        limit = 30 + 10 * entry["timeout_s"]
        start = time.perf_counter()
        try:
            child = subprocess.run([sys.executable, __file__, "--internal-watchdog",
                                    str(KIT / entry["path"])], capture_output=True, text=True,
                                   timeout=limit)
            seconds = time.perf_counter() - start
            text = (child.stdout + child.stderr).strip()
            ok = child.returncode == 0 and "watchdog" in text
        except subprocess.TimeoutExpired:
            seconds, text, ok = limit, f"HUNG: no answer in {limit:.0f} s (killed)", False
        good += ok
        report.failed += not ok
        last = text.splitlines()[-1] if text else ""
        lines.append(f"- {'ok' if ok else 'FAILED'} {entry['path']} ({seconds:.1f} s): "
                     f"{last if ok else text[-300:]}")
    lines += ["", f"Watchdog: {good}/{len(entries)} broken artifacts raised WatchdogError.", ""]
    report.add(lines)


def once_child(path: str) -> int:
    """In a child process (under compute-sanitizer): one checked run."""
    entry = {"path": os.path.relpath(path, KIT), "recipe": json.loads(
        os.environ["ETC_KIT_RECIPE"])}
    result = check_artifact(entry, 1, Device())
    log(json.dumps(result))
    return 0 if not result["failures"] else 1


def run_sanitizer(manifest: dict, device: Device, report: Report) -> None:
    tool = shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/compute-sanitizer"),) if p.exists()), None)
    if tool is None:
        report.add(["## compute-sanitizer: not found on PATH or in /usr/local/cuda/bin; "
                    "skipped", ""])
        return
    entry = next((e for e in manifest["artifacts"] if e["kind"] == "check"
                  and e["family"] == SANITIZER_FAMILY and e["requested_schedule"] == "static"
                  and runnable(e, device)), None)
    if entry is None:
        report.add(["## compute-sanitizer: no runnable artifact; skipped", ""])
        return
    lines = [f"## compute-sanitizer on {entry['path']}", ""]
    env = dict(os.environ, ETC_KIT_RECIPE=json.dumps(entry["recipe"]))
    for name in SANITIZER_TOOLS:
        start = time.perf_counter()
        try:
            child = subprocess.run([tool, "--tool", name, "--error-exitcode", "7",
                                    sys.executable, __file__, "--internal-once",
                                    str(KIT / entry["path"])], capture_output=True, text=True,
                                   timeout=SANITIZER_TIMEOUT, env=env)
            summary = [line for line in (child.stdout + child.stderr).splitlines()
                       if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line]
            verdict = ("ok" if child.returncode == 0 else f"FAILED (exit {child.returncode})")
            detail = summary[-1].strip() if summary else (child.stdout + child.stderr)[-300:]
        except subprocess.TimeoutExpired:
            verdict, detail = "TIMEOUT", f"no answer in {SANITIZER_TIMEOUT} s"
        report.failed += verdict != "ok"
        lines.append(f"- compute-sanitizer {name}: {verdict}: {detail} "
                     f"({time.perf_counter() - start:.0f} s)")
    report.add(lines + [""])


# ---------------------------------------------------------------------------
# The probe: what the static schedule assumes of the hardware
# ---------------------------------------------------------------------------

def probe_child(args, device: Device) -> dict:
    """In a child process: the answers of the --probe section (see
    `etc.runtime.probes`)."""
    from etc.runtime import probes
    from etc.runtime.cuda import _check, _Parameters, load_module

    d = device.driver
    module, _ = load_module(d, probes.PTX)

    def function(name: str):
        return _check(d, "cuModuleGetFunction", d.cuModuleGetFunction(module, name.encode()))

    def alloc(nbytes: int) -> int:
        pointer = _check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
        _check(d, "cuMemsetD8", d.cuMemsetD8(pointer, 0, nbytes))
        return pointer

    def read(pointer: int, count: int) -> np.ndarray:
        host = np.zeros(count, np.uint64)
        _check(d, "cuMemcpyDtoH", d.cuMemcpyDtoH(host.ctypes.data, pointer, host.nbytes))
        return host

    lines = []
    manifest = load_manifest()
    chip = best_chip(manifest, device)
    entry = next((e for e in manifest["artifacts"] if e["kind"] == "check" and
                  e["schedule"] == "static" and e["chip"] == chip), None)
    kernel = etc.runtime.load(KIT / entry["path"])
    per_sm, lanes = kernel.runtime.ctas_per_sm, kernel.runtime.lanes
    probe_sm = function("etc_probe_sm")

    def occupancy(shared: int) -> int:
        return int(_check(d, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                          d.cuOccupancyMaxActiveBlocksPerMultiprocessor(probe_sm, lanes, shared)))

    # Dynamic shared memory that lets exactly as many probe CTAs share an
    # SM as the worker's occupancy does (the smallest that is not more).
    limit = device.attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    shared = 0
    if occupancy(0) > per_sm:
        low, high = 0, limit
        while high - low > 256:
            middle = (low + high) // 2
            low, high = (middle, high) if occupancy(middle) > per_sm else (low, middle)
        shared = high
        if shared > 48 << 10:
            _check(d, "cuFuncSetAttribute", d.cuFuncSetAttribute(
                probe_sm, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared))
    grid = device.sms * per_sm
    spin_ns = 200_000
    out = alloc(32 * grid)
    parameters = _Parameters([out, spin_ns])
    lines += [f"Worker of {entry['path']}: {lanes} threads, {per_sm} CTAs per SM by the "
              f"occupancy calculator; the probe kernel ran {grid} CTAs ({device.sms} SMs x "
              f"{per_sm}) cooperatively with {shared} bytes of dynamic shared memory "
              f"(occupancy {occupancy(shared)}), each spinning {spin_ns // 1000} us.", ""]
    error = d.cuLaunchCooperativeKernel(probe_sm, grid, 1, 1, lanes, 1, 1, shared, 0,
                                        parameters.pointer_array())[0]
    if error != d.CUresult.CUDA_SUCCESS:
        from etc.runtime.cuda import _error_name

        lines.append(f"- The cooperative launch was refused: {_error_name(d, error)}")
    else:
        _check(d, "cuCtxSynchronize", d.cuCtxSynchronize())
        records = read(out, 4 * grid).reshape(grid, 4)
        sm, start, end = records[:, 0], records[:, 1], records[:, 2]
        first = sm[:device.sms]
        per = np.bincount(sm.astype(np.int64), minlength=device.sms)
        used = per[per > 0]
        lines += [
            f"- CTAs 0..{device.sms - 1} land on {len(set(first.tolist()))} distinct SMs "
            f"(of {device.sms}): {'yes' if len(set(first.tolist())) == device.sms else 'NO'}, "
            "distinct SMs as the static schedule assumes.",
            f"- All {grid} CTAs: {len(used)} SMs used, {int(used.min())} to {int(used.max())} "
            f"CTAs per SM (expected {per_sm} each): "
            f"{'yes' if used.min() == used.max() == per_sm else 'NO'}.",
            f"- Resident at once (every CTA started before any finished): "
            f"{'yes' if start.max() < end.min() else 'NO'} (starts spread over "
            f"{(start.max() - start.min()) / 1000:.1f} us).",
            f"- SM of CTA b for b = 0..15: {sm[:16].astype(int).tolist()}; CTA b on SM "
            f"b mod {device.sms}: {'yes' if np.all(sm == np.arange(grid) % device.sms) else 'no'}"
            f"; %nsmid {int(records[0, 3])}."]
    # A cooperative launch captured in a CUDA graph, then replayed.
    _check(d, "cuMemsetD8", d.cuMemsetD8(out, 0, 32 * grid))
    stream = _check(d, "cuStreamCreate", d.cuStreamCreate(0))
    step = "cuStreamBeginCapture"
    try:
        _check(d, step, d.cuStreamBeginCapture(
            stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        step = "cuLaunchCooperativeKernel (captured)"
        launched = d.cuLaunchCooperativeKernel(probe_sm, grid, 1, 1, lanes, 1, 1, shared,
                                               stream, parameters.pointer_array())
        graph = d.cuStreamEndCapture(stream)
        _check(d, step, launched)
        step = "cuStreamEndCapture"
        graph = _check(d, step, graph)
        step = "cuGraphInstantiate"
        executable = _check(d, step, d.cuGraphInstantiate(graph, 0))
        step = "cuGraphLaunch"
        _check(d, step, d.cuGraphLaunch(executable, stream))
        _check(d, "cuStreamSynchronize", d.cuStreamSynchronize(stream))
        ran = int(np.count_nonzero(read(out, 4 * grid).reshape(grid, 4)[:, 1]))
        lines.append(f"- A cooperative launch captured in a CUDA graph: captured, instantiated "
                     f"and replayed; {ran}/{grid} CTAs ran: "
                     f"{'yes' if ran == grid else 'NO'}.")
    except RuntimeError as failure:
        lines.append(f"- A cooperative launch captured in a CUDA graph: NO, {step} failed: "
                     f"{failure}")
    # %globaltimer: consecutive reads on one thread.
    reads = 4096
    times = alloc(8 * reads)
    timer_parameters = _Parameters([times, reads])
    _check(d, "cuLaunchKernel(etc_probe_timer)", d.cuLaunchKernel(
        function("etc_probe_timer"), 1, 1, 1, 1, 1, 1, 0, 0,
        timer_parameters.pointer_array(), 0))
    _check(d, "cuCtxSynchronize", d.cuCtxSynchronize())
    deltas = np.diff(read(times, reads).astype(np.int64))
    steps = deltas[deltas > 0]
    if len(steps):
        lines.append(f"- %globaltimer over {reads} consecutive reads: it advanced "
                     f"{len(steps)} times, by {int(steps.min())} ns at least and "
                     f"{int(np.median(steps))} ns typically (median); "
                     f"{int((deltas == 0).sum())} reads saw no change: a resolution of about "
                     f"{int(np.median(steps))} ns.")
    else:
        lines.append(f"- %globaltimer did not advance over {reads} reads.")
    return {"lines": lines}


def run_probe(args, report: Report) -> None:
    result, text = run_child(["--internal-probe", *child_options(args)], args.section_timeout)
    if result is None:
        report.failed += 1
        report.add(["## Probe", "", f"FAILED: the probe's child process died: {text}", ""])
        return
    report.add(["## Probe: what the static schedule assumes", "", *result["lines"], ""])


# ---------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------

class Bench:
    """What a benchmark section works with (in its child process)."""

    def __init__(self, manifest, device: Device, args):
        self.manifest, self.device, self.args = manifest, device, args
        self.torch = torch_or_none()
        self.timer = Timer(device.driver, args.repeats)
        self.copy_gbs = args.copy_gbs
        self.resources: list[dict] = []

    def entries(self, kind, **match):
        return bench_entries(self.manifest, self.device, kind, **match)

    def note(self, kernel, label: str) -> None:
        """Records `kernel`'s worker resources (after it has run) once."""
        if not any(r["artifact"] == label for r in self.resources):
            self.resources.append(resources(kernel, label))

    def torch_ms(self, fn, graph: bool = False, repeats: int | None = None) -> float:
        return torch_time(self.torch, self.timer, fn, repeats or self.timer.repeats, graph)


def bench_entries(manifest, device, kind, **match):
    return [e for e in manifest["artifacts"] if e["kind"] == kind and runnable(e, device)
            and e["chip"] == best_chip(manifest, device)
            and all(e.get(k) == v for k, v in match.items())]


def best_chip(manifest: dict, device: Device) -> str:
    chips = sorted({e["chip"] for e in manifest["artifacts"] if runnable(e, device)})
    # The arch-specific chip when there is one (sm_90a on an H100), else the newest.
    return next((c for c in chips if c.endswith("a")), chips[-1] if chips else "")


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_time(torch, timer, fn, repeats: int, graph: bool = False) -> float:
    """Median GPU ms of `fn` (`graph`: captured once as a CUDA graph and
    replayed) between torch CUDA events, each timed run queued behind the
    timer's spin kernel, so that the window holds GPU work only (PyTorch
    eager's host time is not in it)."""
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        fn = captured.replay
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    fn()
    end.record()
    host_ns = (time.perf_counter() - began) * 1e9
    torch.cuda.synchronize()
    spin = int(min(max(4 * host_ns, Timer.MIN_SPIN_NS), Timer.MAX_SPIN_NS))
    times = []
    for _ in range(repeats):
        timer.spin(stream.cuda_stream, spin)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def etc_graph_ms(b: Bench, launch) -> tuple[float | None, str]:
    """GPU ms of `launch` captured as a CUDA graph, or None and why not."""
    try:
        replay = b.timer.graph(launch.enqueue)
        replay(b.timer.stream)
        launch.check(b.timer.stream)
    except RuntimeError as error:
        return None, f"ETC as a CUDA graph: capture failed: {error}"
    return b.timer(replay), ""


def verified(launch, expected, tolerance: float, what: str) -> None:
    """Never time wrong outputs (or zeros): the bound run must match."""
    launch.enqueue()
    launch.check()
    got = launch.outputs()[0]
    error = families.relative_error(got, expected)
    if not error <= tolerance:
        raise RuntimeError(f"{what}: relative error {error:.3g} > {tolerance:g} before timing")


def bench_copy(b: Bench) -> list[str]:
    """Device-to-device copy, GB/s counting bytes read and written."""
    d, check = b.device.driver, b.device.check
    nbytes = b.args.copy_mib << 20
    src = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    dst = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    check(d, "cuMemsetD8", d.cuMemsetD8(src, 1, nbytes))
    try:
        ms = b.timer(lambda s: check(d, "cuMemcpyDtoDAsync", d.cuMemcpyDtoDAsync(dst, src, nbytes,
                                                                                  s)))
    finally:
        check(d, "cuMemFree", d.cuMemFree(src))
        check(d, "cuMemFree", d.cuMemFree(dst))
    b.copy_gbs = 2 * nbytes / ms / 1e6
    return [f"Device-to-device copy ({b.args.copy_mib} MiB, bytes read + written): "
            f"**{b.copy_gbs:.0f} GB/s**"]


def bench_latency(b: Bench) -> list[str]:
    rows = ["| chain length K | worker CTAs | megakernel µs | per hop µs |",
            "|---:|---:|---:|---:|"]
    base = None
    for entry in sorted(b.entries("latency"), key=lambda e: e["length"]):
        kernel = etc.runtime.load(KIT / entry["path"])
        launch = kernel.runtime.bind({"x": np.ones((1, 96), np.float32)})
        ms = b.timer(launch.enqueue)
        b.note(kernel, entry["path"])
        k = entry["length"]
        hop = "—" if base is None else f"{(ms - base[1]) * 1000 / (k - base[0]):.2f}"
        base = base or (k, ms)
        rows.append(f"| {k} | {kernel.runtime.workers} | {ms * 1000:.1f} | {hop} |")
    return rows


def bench_overhead(b: Bench, tasks=(1024, 16384)) -> list[str]:
    rows = ["| tasks | static µs | static ns/task | dynamic µs | dynamic ns/task |",
            "|---:|---:|---:|---:|---:|"]
    kernels = {e["schedule"]: (etc.runtime.load(KIT / e["path"]), e["path"])
               for e in b.entries("overhead")}
    for n in tasks:
        cells = [str(n)]
        x = np.ones((n, 96), np.float32)
        for schedule in ("static", "dynamic"):
            kernel, path = kernels[schedule]
            launch = kernel.runtime.bind({"x": x})
            verified(launch, 2 * x, 1e-6, f"wide {schedule}")
            b.note(kernel, path)
            ms = b.timer(launch.enqueue)
            cells += [f"{ms * 1000:.1f}", f"{ms * 1e6 / n:.0f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_gemv(b: Bench) -> list[str]:
    """Cold: the weights come from device memory (L2 flushed before each
    run); hot: back-to-back runs, the weights partly in L2."""
    torch = b.torch
    rows = ["| y = x·W | W stored | B | ETC µs cold | ETC GB/s cold | % of copy | ETC µs hot | "
            "PyTorch µs cold | PyTorch GB/s cold |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(0)
    for entry in b.entries("gemv"):
        k, n, transposed = entry["k"], entry["n"], entry.get("transposed", False)
        kernel = etc.runtime.load(KIT / entry["path"])
        w = round_bf16(rng.standard_normal((n, k) if transposed else (k, n), np.float32) * 0.02)
        w_device = kernel.runtime.device_array(etc.bfloat16.to_bits(w))
        tw = torch.from_numpy(w).to("cuda", torch.bfloat16) if torch else None
        for batch in BATCHES:
            x = round_bf16(rng.standard_normal((batch, k), np.float32))
            launch = kernel.runtime.bind({"x": x, "w": w_device})
            verified(launch, x @ (w.T if transposed else w), 2e-2, f"{entry['path']} B={batch}")
            b.note(kernel, entry["path"])
            cold = b.timer(launch.enqueue, cold=True)
            hot = b.timer(launch.enqueue)
            nbytes = 2 * (k * n + batch * k + batch * n)
            gbs = nbytes / cold / 1e6
            cells = [f"K={k}, N={n}", "(N, K): x·Wᵀ" if transposed else "(K, N)", str(batch),
                     f"{cold * 1000:.1f}", f"{gbs:.0f}", f"{100 * gbs / b.copy_gbs:.0f}%",
                     f"{hot * 1000:.1f}"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                fn = ((lambda: torch.nn.functional.linear(tx, tw)) if transposed
                      else (lambda: torch.matmul(tx, tw)))
                tms = torch_time_cold(b, fn)
                cells += [f"{tms * 1000:.1f}", f"{nbytes / tms / 1e6:.0f}"]
            else:
                cells += ["n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def torch_time_cold(b: Bench, fn) -> float:
    """`torch_time` with the L2 flushed before each timed run (the flush
    queued on PyTorch's stream, before the start event)."""
    torch = b.torch
    stream = torch.cuda.current_stream().cuda_stream

    def flushed():
        b.timer.flush(stream)
        start.record()
        fn()
        end.record()

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(b.timer.repeats):
        b.timer.spin(stream, Timer.MIN_SPIN_NS)
        flushed()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def variants(entries) -> dict:
    """Benchmark entries by variant ("static", "dynamic", "static, no
    prefetch"; kits built before variants: the schedule), static first."""
    found = {e.get("variant", e["schedule"]): e for e in entries}
    return dict(sorted(found.items(), key=lambda item: item[0] != "static"))


def bench_mlp(b: Bench) -> list[str]:
    torch = b.torch
    entries = variants(b.entries("mlp"))
    if not entries:
        return []
    hidden, ffn = entries["static"]["hidden"], entries["static"]["ffn"]
    rng = np.random.default_rng(1)
    weights = {"nw": round_bf16(1 + 0.1 * rng.standard_normal(hidden, np.float32)),
               "w1": round_bf16(rng.standard_normal((hidden, ffn), np.float32) * 0.02),
               "w2": round_bf16(rng.standard_normal((ffn, hidden), np.float32) * 0.02)}
    kernels = {s: etc.runtime.load(KIT / e["path"]) for s, e in entries.items()}
    device_weights = {s: {name: k.runtime.device_array(etc.bfloat16.to_bits(w))
                          for name, w in weights.items()} for s, k in kernels.items()}
    rows = ["| B | " + " | ".join(f"ETC {v} µs" for v in entries)
            + " | ETC static, CUDA graph µs | PyTorch eager µs | PyTorch CUDA graph µs | "
              "static vs PyTorch graph |",
            "|---:|" + "---:|" * (len(entries) + 4)]
    notes = set()
    if torch:
        tw = {n: torch.from_numpy(w).to("cuda", torch.bfloat16) for n, w in weights.items()}

        def torch_block(tx):
            h = tx.float()
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
            h = h * tw["nw"]
            a = torch.nn.functional.silu(h @ tw["w1"])
            return a @ tw["w2"] + tx
    for batch in BATCHES:
        x = round_bf16(rng.standard_normal((batch, hidden), np.float32))
        expected = etc.reference.evaluate(kernels["static"], x=x, **weights)[0]
        cells = [str(batch)]
        times = {}
        for variant, kernel in kernels.items():
            launch = kernel.runtime.bind({"x": x, **device_weights[variant]})
            verified(launch, expected, 3e-2, f"mlp {variant} B={batch}")
            b.note(kernel, entries[variant]["path"])
            times[variant] = b.timer(launch.enqueue)
            cells.append(f"{times[variant] * 1000:.1f}")
            if variant == "static":
                graph_ms, note = etc_graph_ms(b, launch)
                notes.add(note)
        cells.append(f"{graph_ms * 1000:.1f}" if graph_ms else "n/a")
        if torch:
            tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
            eager = b.torch_ms(lambda: torch_block(tx))
            graph = b.torch_ms(lambda: torch_block(tx), graph=True)
            cells += [f"{eager * 1000:.1f}", f"{graph * 1000:.1f}",
                      f"{times['static'] / graph:.2f}×"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows + [f"({note})" for note in sorted(notes) if note]


def bench_gemm(b: Bench) -> list[str]:
    torch = b.torch
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | PyTorch ms | PyTorch TFLOP/s | ETC / PyTorch |",
            "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(2)
    for entry in b.entries("gemm"):
        size = entry["size"]
        kernel = etc.runtime.load(KIT / entry["path"])
        a = round_bf16(rng.standard_normal((size, size), np.float32))
        w = round_bf16(rng.standard_normal((size, size), np.float32) * 0.02)
        launch = kernel.runtime.bind({"a": a, "b": w})
        launch.enqueue()
        launch.check()
        b.note(kernel, entry["path"])
        rows_checked = slice(0, 64)
        error = families.relative_error(launch.outputs()[0][rows_checked], a[rows_checked] @ w)
        if not error <= 2e-2:
            raise RuntimeError(f"gemm {size}: relative error {error:.3g} before timing")
        ms = b.timer.within(launch.enqueue)
        flops = 2 * size ** 3
        cells = [f"{size}³", f"{ms:.2f}", f"{flops / ms / 1e9:.1f}"]
        if torch:
            ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
            tb = torch.from_numpy(w).to("cuda", torch.bfloat16)
            tms = b.torch_ms(lambda: torch.matmul(ta, tb), repeats=20)
            cells += [f"{tms:.2f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


#: Rows of the prefill products (tokens of a prompt, or of a batch of them).
PREFILL_ROWS = (128, 512, 2048)


def bench_prefill(b: Bench) -> list[str]:
    """The x·Wᵀ GEMV artifacts (symbolic rows) at prefill sizes: each tile
    of 16 rows or more takes the tensor cores, on the column tiles chosen
    for decode (few, narrow: issue #11 leaves wider prefill tiles open);
    TFLOP/s next to PyTorch's linear."""
    torch = b.torch
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | PyTorch ms | PyTorch TFLOP/s | ETC / PyTorch |",
            "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(3)
    for entry in b.entries("gemv"):
        if not entry.get("transposed"):
            continue
        k, n = entry["k"], entry["n"]
        kernel = etc.runtime.load(KIT / entry["path"])
        w = round_bf16(rng.standard_normal((n, k), np.float32) * 0.02)
        w_device = kernel.runtime.device_array(etc.bfloat16.to_bits(w))
        tw = torch.from_numpy(w).to("cuda", torch.bfloat16) if torch else None
        for m in PREFILL_ROWS:
            x = round_bf16(rng.standard_normal((m, k), np.float32))
            launch = kernel.runtime.bind({"x": x, "w": w_device})
            launch.enqueue()
            launch.check()
            checked = slice(0, 32)
            error = families.relative_error(launch.outputs()[0][checked], x[checked] @ w.T)
            if not error <= 2e-2:
                raise RuntimeError(f"prefill {m}x{n}x{k}: relative error {error:.3g} "
                                   "before timing")
            ms = b.timer.within(launch.enqueue)
            flops = 2 * m * n * k
            cells = [f"{m}×{n}×{k}", f"{ms:.3f}", f"{flops / ms / 1e9:.1f}"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                tms = b.torch_ms(lambda: torch.nn.functional.linear(tx, tw), repeats=20)
                cells += [f"{tms:.3f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
            else:
                cells += ["n/a", "n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_roofline(b: Bench) -> list[str]:
    """One line per CUDA tile kernel: bytes (inputs and outputs, each moved
    once) and FLOPs over the cold time (L2 flushed), next to the copy
    bandwidth."""
    rows = ["| kernel | rows | µs cold | GB/s | % of copy | TFLOP/s | µs hot |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    sizes = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}
    for entry in b.entries("roofline"):
        kernel = etc.runtime.load(KIT / entry["path"])
        symbols = {a.name: entry["size"] for a in kernel.arguments if a.kind == "symbol"}
        rng = np.random.default_rng(4)
        recipe = families.Recipe(scales={"w": 0.02, "b": 0.02, "z": 1.0})
        inputs = families.make_inputs(kernel.arguments, symbols, recipe, rng)
        launch = kernel.runtime.bind(inputs)
        expected = etc.reference.evaluate(kernel, **inputs)[0]
        verified(launch, expected, 3e-2, entry["title"])
        b.note(kernel, entry["path"])
        cold = b.timer.within(launch.enqueue, cold=True)
        hot = b.timer.within(launch.enqueue)
        nbytes = 0
        for arg in kernel.arguments:
            if arg.kind in ("input", "output"):
                shape = [entry["size"] if isinstance(d, str) else d for d in arg.shape]
                nbytes += int(np.prod(shape)) * sizes[arg.dtype]
        gbs = nbytes / cold / 1e6
        tflops = f"{entry['flops'] / cold / 1e9:.2f}" if entry.get("flops") else "—"
        rows.append(f"| {entry['title']} | {entry['size']} | {cold * 1000:.1f} | {gbs:.0f} | "
                    f"{100 * gbs / b.copy_gbs:.0f}% | {tflops} | {hot * 1000:.1f} |")
    return rows


def decode_inputs(kernel, entry, batch: int, rng) -> dict:
    """Inputs of one decode step: `batch` requests, one new token each at
    position `prompt` (the cache rows before it hold zeros: the work, not
    the values, is what is timed); random bf16 weights (norms 1)."""
    prompt = entry["prompt"]
    config = entry["hf_config"]
    i32 = lambda values: np.asarray(values, np.int32)
    inputs = {"ids": i32(rng.integers(0, config["vocab_size"], batch)),
              "positions": i32([prompt] * batch), "token_request": i32(range(batch)),
              "request_length": i32([prompt + 1] * batch),
              "request_first": i32(range(batch)), "request_last": i32(range(batch)),
              "inv_freq": np.asarray(entry["inv_freq"], np.float32)}
    length = prompt + 8
    # A paged cache (pools (N, P, width)): each request's blocks are spread
    # over the pool in a shuffled order, as a serving engine's become.
    pools = [arg for arg in kernel.arguments if arg.kind == "state" and "N" in arg.shape]
    symbols = {"S": batch, "L": length}
    if pools:
        block = pools[0].shape[1]
        per_request = -(-length // block)
        symbols["N"] = batch * per_request
        order = rng.permutation(batch * per_request)
        inputs["block_table"] = i32(order.reshape(batch, per_request))
    else:
        inputs["request_slot"] = i32(range(batch))
    # Greedy sampling (temperature 0: the argmax), as a serving engine asks
    # for most often.
    f32 = lambda value: np.full(batch, value, np.float32)
    inputs.update(temperature=f32(0.0), top_p=f32(1.0), min_p=f32(0.0),
                  top_k=np.zeros(batch, np.int32), seed=np.zeros((batch, 2), np.int32))
    for arg in kernel.arguments:
        if arg.kind == "state":
            shape = [symbols.get(d, d) for d in arg.shape]
            inputs[arg.name] = kernel.runtime.device_zeros(tuple(shape), STORAGE[arg.dtype])
        elif arg.kind == "input" and arg.name not in inputs:
            if arg.name.endswith("norm"):
                values = np.ones(arg.shape, np.float32)
            else:
                values = round_bf16(rng.standard_normal(arg.shape, np.float32) * 0.02)
            inputs[arg.name] = kernel.runtime.device_array(
                etc.bfloat16.to_bits(values) if arg.dtype == "bf16" else values)
    return inputs


def torch_decode(b: Bench, entry, batch: int) -> tuple:
    """(eager ms, CUDA graph ms, note): one decode step of the same model in
    transformers, bf16, random weights."""
    torch = b.torch
    try:
        import transformers
    except ImportError:
        return None, None, "transformers not installed"
    transformers.logging.set_verbosity_error()
    config = dict(entry["hf_config"])
    model_type = config.pop("model_type")
    config.pop("architectures", None)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(model_type, **config), torch_dtype=torch.bfloat16)
    model = model.cuda().eval()
    prompt = entry["prompt"]
    ids = torch.randint(0, config["vocab_size"], (batch, prompt), device="cuda")
    note = f"transformers {transformers.__version__}"
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        length = past.get_seq_length()

        def eager():
            past.crop(length)
            model(token, past_key_values=past, use_cache=True)
        eager_ms = b.torch_ms(eager)
        graph_ms = None
        try:
            static = transformers.StaticCache(config=model.config, max_cache_len=prompt + 1)
            model(ids, past_key_values=static, use_cache=True,
                  cache_position=torch.arange(prompt, device="cuda"))
            position = torch.tensor([prompt], device="cuda")
            graph_ms = b.torch_ms(
                lambda: model(token, past_key_values=static, cache_position=position),
                graph=True)
        except Exception as error:  # best effort across transformers versions
            note += f"; CUDA graph capture failed: {type(error).__name__}: {error}"
    return eager_ms, graph_ms, note


def bench_decode(b: Bench) -> list[str]:
    entries = variants(b.entries("decode"))
    if not entries:
        return []
    entry = entries["static"]
    config = entry["hf_config"]
    kernels = {s: etc.runtime.load(KIT / e["path"]) for s, e in entries.items()}
    cache = next(a.dtype for a in kernels["static"].arguments if a.kind == "state")
    rows = [f"Model: random Qwen3 (hidden {config['hidden_size']}, {config['num_hidden_layers']} "
            f"layers, vocab {config['vocab_size']}), bf16 weights, {cache} KV cache, "
            f"{entry['prompt']} positions in the cache.", "",
            "| B | " + " | ".join(f"ETC {v} ms" for v in entries)
            + " | ETC static, CUDA graph ms | PyTorch eager ms | PyTorch CUDA graph ms |",
            "|---:|" + "---:|" * (len(entries) + 3)]
    notes = set()
    for batch in DECODE_BATCHES:
        cells = [str(batch)]
        graph_ms = None
        for variant, kernel in kernels.items():
            rng = np.random.default_rng(batch)
            inputs = decode_inputs(kernel, entry, batch, rng)
            launch = kernel.runtime.bind(inputs)
            launch.enqueue()
            launch.check()
            b.note(kernel, entries[variant]["path"])
            logits = launch.outputs()[0]
            if not np.all(np.isfinite(logits)) or not np.any(logits):
                raise RuntimeError(f"decode {variant} B={batch}: logits are not finite or all 0")
            cells.append(f"{b.timer(launch.enqueue):.3f}")
            if variant == "static":
                graph_ms, note = etc_graph_ms(b, launch)
                notes.add(note)
        cells.append(f"{graph_ms:.3f}" if graph_ms else "n/a")
        if b.torch:
            eager, graph, note = torch_decode(b, entry, batch)
            notes.add(f"PyTorch: {note}")
            cells += [f"{eager:.3f}" if eager else "n/a", f"{graph:.3f}" if graph else "n/a"]
        else:
            cells += ["n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows + [""] + [f"({note})" for note in sorted(notes) if note]


#: The benchmark sections, in the order they run: key, title, function.
SECTIONS = (
    ("latency", "Notify → wake latency (static chain, one hop per CTA)", bench_latency),
    ("overhead", "Per-task overhead (independent 1-row tiles)", bench_overhead),
    ("gemv", "bf16 GEMV (bytes: weights + x + y)", bench_gemv),
    ("roofline", "Roofline: one line per tile kernel", bench_roofline),
    ("mlp", "5-operator MLP block, bf16", bench_mlp),
    ("decode", "Decode step", bench_decode),
    ("gemm", "bf16 GEMM", bench_gemm),
    ("prefill", "bf16 prefill x·Wᵀ, symbolic rows (decode-sized column tiles)", bench_prefill),
)


def bench_child(key: str, args, device: Device) -> dict:
    """In a child process: one benchmark section (or the copy bandwidth)."""
    b = Bench(load_manifest(), device, args)
    if key == "copy":
        lines = bench_copy(b)
        return {"lines": lines, "copy_gbs": b.copy_gbs, "resources": []}
    function = next(f for k, _, f in SECTIONS if k == key)
    try:
        lines = function(b)
    except Exception as error:  # reported; the child's context may be gone
        lines = [f"FAILED: {type(error).__name__}: {error}"]
    if b.timer.gap_us > 5:
        lines.append(f"(the last timing's GPU waited {b.timer.gap_us:.0f} µs for the host "
                     "after the spin: its window may hold host time)")
    return {"lines": lines, "resources": b.resources}


def run_benchmarks(manifest, args, device: Device, report: Report) -> None:
    torch = torch_or_none()
    patterns = args.bench.split(",")
    keys = [k for k, _, _ in SECTIONS if any(fnmatch.fnmatch(k, p) for p in patterns)]
    report.add(["## Benchmarks", "",
                f"GPU time: median of {args.repeats} timed runs after 5 warm-ups, between CUDA "
                "events that hold GPU work only (each run queued behind a spin kernel longer "
                "than the host takes to queue it); cold runs follow an L2 flush. Artifacts for "
                f"{best_chip(manifest, device)}; PyTorch "
                f"{torch.__version__ if torch else 'not available'}; a child process per "
                "section.", ""])
    result, text = run_child(["--internal-bench", "copy", *child_options(args)],
                             args.section_timeout)
    if result is None:
        report.add([f"FAILED: the copy bandwidth's child process died: {text}", ""])
        args.copy_gbs = float("nan")
    else:
        args.copy_gbs = result["copy_gbs"]
        report.add(result["lines"] + [""])
    deadline = time.perf_counter() + args.bench_budget
    rows = []
    for key in keys:
        title = next(t for k, t, _ in SECTIONS if k == key)
        if time.perf_counter() > deadline:
            report.add([f"### {title}", "", "skipped: over the --bench-budget of "
                        f"{args.bench_budget:.0f} s", ""])
            continue
        start = time.perf_counter()
        result, text = run_child(["--internal-bench", key, "--copy-gbs", str(args.copy_gbs),
                                  *child_options(args)], args.section_timeout)
        if result is None:
            table = [f"FAILED: the section's child process died: {text}"]
        else:
            table = result["lines"]
            rows += result["resources"]
        report.add([f"### {title}", "", *table, "", f"({time.perf_counter() - start:.0f} s)", ""])
    if rows:
        report.add(resource_table(rows))


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="ETC's GPU check kit: check and benchmark saved CUDA kernels (no MLIR "
                    "needed; see docs/gpu.md).")
    parser.add_argument("--runs", type=int, default=20,
                        help="poisoned runs per artifact and size (default 20)")
    parser.add_argument("--only", default="*", help="check only families matching this glob")
    parser.add_argument("--probe", action="store_true",
                        help="first answer what the static schedule assumes of the hardware "
                             "(CTA placement, residency, graph capture of a cooperative "
                             "launch, %%globaltimer's resolution)")
    parser.add_argument("--check-budget", type=float, default=330,
                        help="seconds after which the remaining families are not checked "
                             "(reported as failures)")
    parser.add_argument("--family-timeout", type=float, default=240,
                        help="seconds a family's child process may take (then it is killed "
                             "and the family fails)")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-watchdog", action="store_true")
    parser.add_argument("--skip-sanitizer", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--bench", default="*",
                        help="benchmark sections to run, comma-separated globs of "
                             f"{', '.join(k for k, _, _ in SECTIONS)} (default: all)")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per benchmark")
    parser.add_argument("--bench-budget", type=float, default=200,
                        help="seconds after which the remaining benchmark sections are skipped")
    parser.add_argument("--section-timeout", type=float, default=300,
                        help="seconds a benchmark section's (or the probe's) child may take")
    parser.add_argument("--copy-mib", type=int, default=1024,
                        help="size of the device-to-device copy that measures bandwidth")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the report (Markdown) to this file, section by "
                             "section as they finish")
    parser.add_argument("--plant-misaligned", default=None, metavar="FAMILY",
                        help=argparse.SUPPRESS)  # tests: a fault in one family's child
    parser.add_argument("--copy-gbs", type=float, default=float("nan"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--internal-family", help=argparse.SUPPRESS)
    parser.add_argument("--internal-bench", help=argparse.SUPPRESS)
    parser.add_argument("--internal-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--internal-watchdog", help=argparse.SUPPRESS)
    parser.add_argument("--internal-once", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.internal_watchdog:
        return watchdog_child(args.internal_watchdog)
    if args.internal_once:
        return once_child(args.internal_once)

    manifest = load_manifest()
    device = None
    if manifest["target"] == "cuda":
        from etc.runtime.cuda import cuda_available

        if not cuda_available():
            log("ETC GPU kit: no CUDA GPU here (no driver, no device, or cuda-bindings is not "
                "installed: pip install cuda-bindings); nothing to check. Take this folder to a "
                "GPU machine (docs/gpu.md).")
            return 0
        device = Device()
    if args.internal_family:
        write_result(args.result, family_child(args.internal_family, args, device))
        return 0
    if args.internal_probe:
        write_result(args.result, probe_child(args, device))
        return 0
    if args.internal_bench:
        write_result(args.result, bench_child(args.internal_bench, args, device))
        return 0

    start = time.perf_counter()
    report = Report(args.out)
    report.add([f"# ETC GPU kit report, {time.strftime('%Y-%m-%d %H:%M')}", "",
                f"Device: {device.describe() if device else 'CPU (a --target cpu kit)'}",
                f"Kit: {len(manifest['artifacts'])} artifacts built {manifest['built']}; "
                f"command: run.py {' '.join(argv if argv is not None else sys.argv[1:])}", ""])
    if args.probe and device is not None:
        run_probe(args, report)
    if not args.skip_checks:
        run_checks(manifest, args, device, report)
    if not args.skip_watchdog:
        run_watchdog(manifest, device, report)
    if device is not None and not args.skip_sanitizer:
        run_sanitizer(manifest, device, report)
    if device is not None and not args.skip_bench:
        run_benchmarks(manifest, args, device, report)
    report.add([f"Total {time.perf_counter() - start:.0f} s; "
                f"{'all passed' if not report.failed else f'{report.failed} FAILED'}."])
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
