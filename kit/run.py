#!/usr/bin/env python3
"""ETC's GPU check kit: checks and measures saved CUDA kernels on this machine.

Needs Python >= 3.10, numpy and cuda-bindings (PyTorch, and transformers for
the decode baseline, optional). No MLIR: the kernels are saved artifacts
(artifacts/*.etc, listed in manifest.json) and etc/ holds only ETC's runtime
and its NumPy reference. Without a GPU it says so and exits 0.

What it does, in order (docs/gpu.md):
  1. checks every artifact that this GPU can run at each size of its recipe,
     --runs times with fresh inputs and outputs poisoned (0xFF bytes, NaN)
     before each run, against the NumPy reference: an error that appears in
     some runs only is a race;
  2. runs the deliberately broken artifacts (a notify missing) in a child
     process and expects the watchdog's error within its timeout, not a hang;
  3. runs compute-sanitizer (memcheck, racecheck, synccheck) on one small
     artifact, when the tool exists;
  4. prints Markdown tables of benchmarks (CUDA events, medians after
     warm-up): device-to-device copy bandwidth, notify->wake latency, per-task
     overhead, bf16 GEMV in GB/s, the MLP block and a decode step against
     PyTorch eager and CUDA graphs (with a static variant built without the
     weight prefetch, for its effect), a 4096^3 bf16 GEMM against PyTorch,
     and the x·Wᵀ kernels with symbolic rows at prefill sizes.

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


# ---------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------

class Device:
    """The current CUDA device through cuda-bindings' driver API."""

    def __init__(self):
        from etc.runtime.cuda import _check, _driver

        self.check = _check
        self.driver = d = _driver()
        device = _check(d, "cuDeviceGet", d.cuDeviceGet(0))
        attr = d.CUdevice_attribute

        def attribute(name):
            return int(_check(d, "cuDeviceGetAttribute",
                              d.cuDeviceGetAttribute(getattr(attr, name), device)))

        self.cc = (attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                   attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
        self.sms = attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        name = _check(d, "cuDeviceGetName", d.cuDeviceGetName(256, device))
        self.name = name.split(b"\0")[0].decode()
        self.driver_version = int(_check(d, "cuDriverGetVersion", d.cuDriverGetVersion()))
        context = _check(d, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(device))
        _check(d, "cuCtxSetCurrent", d.cuCtxSetCurrent(context))

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


def poisoned_run(kernel, inputs: dict, device: Device | None) -> list:
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
    launch.enqueue()
    launch.check()
    return launch.outputs()


def inputs_shape(kernel, inputs: dict, arg) -> list[int]:
    from etc.binding import bind_symbols

    shapes = {a.name: np.shape(inputs[a.name]) for a in kernel.arguments
              if a.kind in ("input", "state")}
    symbols = bind_symbols(kernel.arguments, shapes)
    return [symbols[d] if isinstance(d, str) else d for d in arg.shape]


def check_artifact(entry: dict, runs: int, device: Device | None) -> dict:
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
                outputs = poisoned_run(kernel, inputs, device)
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


def run_checks(manifest: dict, args, device: Device | None) -> list[dict]:
    entries = [e for e in manifest["artifacts"] if e["kind"] == "check"
               and fnmatch.fnmatch(e["family"], args.only)]
    skipped = [e["path"] for e in entries if not runnable(e, device)]
    entries = [e for e in entries if runnable(e, device)]
    log(f"## Checks: {len(entries)} artifacts x sizes x {args.runs} poisoned runs"
        + (f" ({len(skipped)} skipped: their chip is not this GPU's)" if skipped else ""))
    results = []
    deadline = time.perf_counter() + args.check_budget
    for index, entry in enumerate(entries):
        if time.perf_counter() > deadline:
            log(f"  the --check-budget of {args.check_budget:.0f} s is spent: "
                f"{len(entries) - index} artifacts NOT checked")
            results.append({"artifact": f"{len(entries) - index} artifacts", "checks": 0,
                            "worst": 0.0, "seconds": 0.0,
                            "failures": ["not checked: over the --check-budget"]})
            break
        result = check_artifact(entry, args.runs, device)
        status = "ok" if not result["failures"] else "FAILED"
        log(f"  {status:6} {entry['path']}: {result['checks']} checks, worst relative error "
            f"{result['worst']:.2g}, {result['seconds']:.1f} s")
        for failure in result["failures"][:5]:
            log(f"         {failure}")
        if len(result["failures"]) > 1:
            log(f"         ({len(result['failures'])} failing checks: an error in some runs only "
                "is a race)" if len(result["failures"]) < result["checks"] else "")
        results.append(result)
    return results


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


def run_watchdog(manifest: dict, device: Device | None) -> list[dict]:
    entries = [e for e in manifest["artifacts"] if e["kind"] == "watchdog" and
               runnable(e, device)]
    log(f"## Watchdog: {len(entries)} broken artifacts must raise WatchdogError, not hang")
    results = []
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
        log(f"  {'ok' if ok else 'FAILED':6} {entry['path']} ({seconds:.1f} s): "
            f"{text.splitlines()[-1] if text else ''}")
        results.append({"artifact": entry["path"], "ok": ok, "text": text})
    return results


def once_child(path: str, size: int) -> int:
    """In a child process (under compute-sanitizer): one checked run."""
    entry = {"path": os.path.relpath(path, KIT), "recipe": json.loads(
        os.environ["ETC_KIT_RECIPE"])}
    result = check_artifact(entry, 1, Device())
    log(json.dumps(result))
    return 0 if not result["failures"] else 1


def run_sanitizer(manifest: dict, device: Device) -> list[str]:
    tool = shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/compute-sanitizer"),) if p.exists()), None)
    if tool is None:
        log("## compute-sanitizer: not found on PATH or in /usr/local/cuda/bin; skipped")
        return []
    entry = next((e for e in manifest["artifacts"] if e["kind"] == "check"
                  and e["family"] == SANITIZER_FAMILY and e["requested_schedule"] == "static"
                  and runnable(e, device)), None)
    if entry is None:
        log("## compute-sanitizer: no runnable artifact; skipped")
        return []
    log(f"## compute-sanitizer on {entry['path']}")
    lines = []
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
        line = f"{name}: {verdict}: {detail} ({time.perf_counter() - start:.0f} s)"
        log("  " + line)
        lines.append(line)
    return lines


# ---------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------

def bench_entries(manifest, device, kind, **match):
    return [e for e in manifest["artifacts"] if e["kind"] == kind and runnable(e, device)
            and e["chip"] == best_chip(manifest, device)
            and all(e.get(k) == v for k, v in match.items())]


def best_chip(manifest: dict, device: Device) -> str:
    chips = sorted({e["chip"] for e in manifest["artifacts"] if runnable(e, device)})
    # The arch-specific chip when there is one (sm_90a on an H100), else the newest.
    return next((c for c in chips if c.endswith("a")), chips[-1] if chips else "")


def copy_bandwidth(device: Device, timer, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read and written."""
    d, check = device.driver, device.check
    src = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    dst = check(d, "cuMemAlloc", d.cuMemAlloc(nbytes))
    check(d, "cuMemsetD8", d.cuMemsetD8(src, 1, nbytes))
    try:
        ms = timer(lambda s: check(d, "cuMemcpyDtoDAsync", d.cuMemcpyDtoDAsync(dst, src, nbytes,
                                                                                s)))
    finally:
        check(d, "cuMemFree", d.cuMemFree(src))
        check(d, "cuMemFree", d.cuMemFree(dst))
    return 2 * nbytes / ms / 1e6


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_time(torch, fn, repeats: int, graph: bool = False) -> float:
    """Median ms of `fn` with torch CUDA events (`graph`: captured once as a
    CUDA graph and replayed)."""
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
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def verified(launch, expected, tolerance: float, what: str) -> None:
    """Never time wrong outputs (or zeros): the bound run must match."""
    launch.enqueue()
    launch.check()
    got = launch.outputs()[0]
    error = families.relative_error(got, expected)
    if not error <= tolerance:
        raise RuntimeError(f"{what}: relative error {error:.3g} > {tolerance:g} before timing")


def bench_latency(manifest, device, timer) -> list[str]:
    rows = ["| chain length K | worker CTAs | megakernel µs | per hop µs |",
            "|---:|---:|---:|---:|"]
    base = None
    for entry in sorted(bench_entries(manifest, device, "latency"), key=lambda e: e["length"]):
        kernel = etc.runtime.load(KIT / entry["path"])
        launch = kernel.runtime.bind({"x": np.ones((1, 96), np.float32)})
        ms = timer(launch.enqueue)
        k = entry["length"]
        hop = "—" if base is None else f"{(ms - base[1]) * 1000 / (k - base[0]):.2f}"
        base = base or (k, ms)
        rows.append(f"| {k} | {kernel.runtime.workers} | {ms * 1000:.1f} | {hop} |")
    return rows


def bench_overhead(manifest, device, timer, tasks=(1024, 16384)) -> list[str]:
    rows = ["| tasks | static µs | static ns/task | dynamic µs | dynamic ns/task |",
            "|---:|---:|---:|---:|---:|"]
    kernels = {e["schedule"]: etc.runtime.load(KIT / e["path"])
               for e in bench_entries(manifest, device, "overhead")}
    for n in tasks:
        cells = [str(n)]
        x = np.ones((n, 96), np.float32)
        for schedule in ("static", "dynamic"):
            launch = kernels[schedule].runtime.bind({"x": x})
            verified(launch, 2 * x, 1e-6, f"wide {schedule}")
            ms = timer(launch.enqueue)
            cells += [f"{ms * 1000:.1f}", f"{ms * 1e6 / n:.0f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_gemv(manifest, device, timer, copy_gbs, torch) -> list[str]:
    rows = ["| y = x·W | W stored | B | ETC µs | ETC GB/s | % of copy | PyTorch µs | PyTorch GB/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(0)
    for entry in bench_entries(manifest, device, "gemv"):
        k, n, transposed = entry["k"], entry["n"], entry.get("transposed", False)
        kernel = etc.runtime.load(KIT / entry["path"])
        w = round_bf16(rng.standard_normal((n, k) if transposed else (k, n), np.float32) * 0.02)
        w_device = kernel.runtime.device_array(etc.bfloat16.to_bits(w))
        tw = torch.from_numpy(w).to("cuda", torch.bfloat16) if torch else None
        for batch in BATCHES:
            x = round_bf16(rng.standard_normal((batch, k), np.float32))
            launch = kernel.runtime.bind({"x": x, "w": w_device})
            verified(launch, x @ (w.T if transposed else w), 2e-2, f"{entry['path']} B={batch}")
            ms = timer(launch.enqueue)
            nbytes = 2 * (k * n + batch * k + batch * n)
            gbs = nbytes / ms / 1e6
            cells = [f"K={k}, N={n}", "(N, K): x·Wᵀ" if transposed else "(K, N)", str(batch),
                     f"{ms * 1000:.1f}", f"{gbs:.0f}", f"{100 * gbs / copy_gbs:.0f}%"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                tms = torch_time(torch, (lambda: torch.nn.functional.linear(tx, tw)) if transposed
                                 else (lambda: torch.matmul(tx, tw)), timer.repeats)
                cells += [f"{tms * 1000:.1f}", f"{nbytes / tms / 1e6:.0f}"]
            else:
                cells += ["n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def variants(entries) -> dict:
    """Benchmark entries by variant ("static", "dynamic", "static, no
    prefetch"; kits built before variants: the schedule), static first."""
    found = {e.get("variant", e["schedule"]): e for e in entries}
    return dict(sorted(found.items(), key=lambda item: item[0] != "static"))


def bench_mlp(manifest, device, timer, torch) -> list[str]:
    entries = variants(bench_entries(manifest, device, "mlp"))
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
            + " | PyTorch eager µs | PyTorch CUDA graph µs | static vs graph |",
            "|---:|" + "---:|" * (len(entries) + 3)]
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
        for schedule, kernel in kernels.items():
            launch = kernel.runtime.bind({"x": x, **device_weights[schedule]})
            verified(launch, expected, 3e-2, f"mlp {schedule} B={batch}")
            times[schedule] = timer(launch.enqueue)
            cells.append(f"{times[schedule] * 1000:.1f}")
        if torch:
            tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
            eager = torch_time(torch, lambda: torch_block(tx), timer.repeats)
            graph = torch_time(torch, lambda: torch_block(tx), timer.repeats, graph=True)
            cells += [f"{eager * 1000:.1f}", f"{graph * 1000:.1f}",
                      f"{times['static'] / graph:.2f}×"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_gemm(manifest, device, timer, torch) -> list[str]:
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | PyTorch ms | PyTorch TFLOP/s | ETC / PyTorch |",
            "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(2)
    for entry in bench_entries(manifest, device, "gemm"):
        size = entry["size"]
        kernel = etc.runtime.load(KIT / entry["path"])
        a = round_bf16(rng.standard_normal((size, size), np.float32))
        b = round_bf16(rng.standard_normal((size, size), np.float32) * 0.02)
        launch = kernel.runtime.bind({"a": a, "b": b})
        launch.enqueue()
        launch.check()
        rows_checked = slice(0, 64)
        error = families.relative_error(launch.outputs()[0][rows_checked], a[rows_checked] @ b)
        if not error <= 2e-2:
            raise RuntimeError(f"gemm {size}: relative error {error:.3g} before timing")
        ms = timer.within(launch.enqueue)
        flops = 2 * size ** 3
        cells = [f"{size}³", f"{ms:.2f}", f"{flops / ms / 1e9:.1f}"]
        if torch:
            ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
            tb = torch.from_numpy(b).to("cuda", torch.bfloat16)
            tms = torch_time(torch, lambda: torch.matmul(ta, tb), 20)
            cells += [f"{tms:.2f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
        else:
            cells += ["n/a", "n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


#: Rows of the prefill products (tokens of a prompt, or of a batch of them).
PREFILL_ROWS = (128, 512, 2048)


def bench_prefill(manifest, device, timer, torch) -> list[str]:
    """The x·Wᵀ GEMV artifacts (symbolic rows) at prefill sizes: each tile
    of 16 rows or more takes the tensor cores, on the column tiles chosen
    for decode (few, narrow: issue #11 leaves wider prefill tiles open);
    TFLOP/s next to PyTorch's linear."""
    rows = ["| M×N×K | ETC ms | ETC TFLOP/s | PyTorch ms | PyTorch TFLOP/s | ETC / PyTorch |",
            "|---|---:|---:|---:|---:|---:|"]
    rng = np.random.default_rng(3)
    for entry in bench_entries(manifest, device, "gemv"):
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
            ms = timer.within(launch.enqueue)
            flops = 2 * m * n * k
            cells = [f"{m}×{n}×{k}", f"{ms:.3f}", f"{flops / ms / 1e9:.1f}"]
            if torch:
                tx = torch.from_numpy(x).to("cuda", torch.bfloat16)
                tms = torch_time(torch, lambda: torch.nn.functional.linear(tx, tw), 20)
                cells += [f"{tms:.3f}", f"{flops / tms / 1e9:.1f}", f"{tms / ms:.3f}"]
            else:
                cells += ["n/a", "n/a", "n/a"]
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def bench_roofline(manifest, device, timer, copy_gbs) -> list[str]:
    """One line per CUDA tile kernel: bytes (inputs and outputs, each moved
    once) and FLOPs over the time, next to the copy bandwidth."""
    rows = ["| kernel | rows | µs | GB/s | % of copy | TFLOP/s |",
            "|---|---:|---:|---:|---:|---:|"]
    sizes = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}
    for entry in bench_entries(manifest, device, "roofline"):
        kernel = etc.runtime.load(KIT / entry["path"])
        symbols = {a.name: entry["size"] for a in kernel.arguments if a.kind == "symbol"}
        rng = np.random.default_rng(4)
        recipe = families.Recipe(scales={"w": 0.02, "b": 0.02, "z": 1.0})
        inputs = families.make_inputs(kernel.arguments, symbols, recipe, rng)
        launch = kernel.runtime.bind(inputs)
        expected = etc.reference.evaluate(kernel, **inputs)[0]
        verified(launch, expected, 3e-2, entry["title"])
        ms = timer.within(launch.enqueue)
        nbytes = 0
        for arg in kernel.arguments:
            if arg.kind in ("input", "output"):
                shape = [entry["size"] if isinstance(d, str) else d for d in arg.shape]
                nbytes += int(np.prod(shape)) * sizes[arg.dtype]
        gbs = nbytes / ms / 1e6
        tflops = f"{entry['flops'] / ms / 1e9:.2f}" if entry.get("flops") else "—"
        rows.append(f"| {entry['title']} | {entry['size']} | {ms * 1000:.1f} | {gbs:.0f} | "
                    f"{100 * gbs / copy_gbs:.0f}% | {tflops} |")
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
              "request_slot": i32(range(batch)), "request_length": i32([prompt + 1] * batch),
              "request_first": i32(range(batch)), "request_last": i32(range(batch)),
              "inv_freq": np.asarray(entry["inv_freq"], np.float32)}
    length = prompt + 8
    for arg in kernel.arguments:
        if arg.kind == "state":
            shape = [batch if d == "S" else length if d == "L" else d for d in arg.shape]
            inputs[arg.name] = kernel.runtime.device_zeros(tuple(shape), np.float32)
        elif arg.kind == "input" and arg.name not in inputs:
            if arg.name.endswith("norm"):
                values = np.ones(arg.shape, np.float32)
            else:
                values = round_bf16(rng.standard_normal(arg.shape, np.float32) * 0.02)
            inputs[arg.name] = kernel.runtime.device_array(
                etc.bfloat16.to_bits(values) if arg.dtype == "bf16" else values)
    return inputs


def torch_decode(torch, entry, batch: int, repeats: int) -> tuple:
    """(eager ms, CUDA graph ms, note): one decode step of the same model in
    transformers, bf16, random weights."""
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
        eager_ms = torch_time(torch, eager, repeats)
        graph_ms = None
        try:
            static = transformers.StaticCache(config=model.config, max_cache_len=prompt + 1)
            model(ids, past_key_values=static, use_cache=True,
                  cache_position=torch.arange(prompt, device="cuda"))
            position = torch.tensor([prompt], device="cuda")
            graph_ms = torch_time(
                torch, lambda: model(token, past_key_values=static, cache_position=position),
                repeats, graph=True)
        except Exception as error:  # best effort across transformers versions
            note += f"; CUDA graph capture failed: {type(error).__name__}: {error}"
    return eager_ms, graph_ms, note


def bench_decode(manifest, device, timer, torch) -> list[str]:
    entries = variants(bench_entries(manifest, device, "decode"))
    if not entries:
        return []
    entry = entries["static"]
    config = entry["hf_config"]
    rows = [f"Model: random Qwen3 (hidden {config['hidden_size']}, {config['num_hidden_layers']} "
            f"layers, vocab {config['vocab_size']}), bf16 weights, f32 KV cache, "
            f"{entry['prompt']} positions in the cache.", "",
            "| B | " + " | ".join(f"ETC {v} ms" for v in entries)
            + " | PyTorch eager ms | PyTorch CUDA graph ms |",
            "|---:|" + "---:|" * (len(entries) + 2)]
    kernels = {s: etc.runtime.load(KIT / e["path"]) for s, e in entries.items()}
    note = ""
    for batch in DECODE_BATCHES:
        cells = [str(batch)]
        for schedule in entries:
            rng = np.random.default_rng(batch)
            inputs = decode_inputs(kernels[schedule], entry, batch, rng)
            launch = kernels[schedule].runtime.bind(inputs)
            launch.enqueue()
            launch.check()
            logits = launch.outputs()[0]
            if not np.all(np.isfinite(logits)) or not np.any(logits):
                raise RuntimeError(f"decode {schedule} B={batch}: logits are not finite or all 0")
            cells.append(f"{timer(launch.enqueue):.3f}")
        if torch:
            eager, graph, note = torch_decode(torch, entry, batch, timer.repeats)
            cells += [f"{eager:.3f}" if eager else "n/a", f"{graph:.3f}" if graph else "n/a"]
        else:
            cells += ["n/a", "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    if note:
        rows += ["", f"PyTorch: {note}"]
    return rows


def run_benchmarks(manifest, args, device) -> list[str]:
    torch = torch_or_none()
    timer = Timer(device.driver, args.repeats)
    deadline = time.perf_counter() + args.bench_budget
    copy_gbs = copy_bandwidth(device, timer, args.copy_mib << 20)
    lines = [f"Median of {args.repeats} timed runs after 5 warm-ups (CUDA events); artifacts "
             f"for {best_chip(manifest, device)}; PyTorch "
             f"{torch.__version__ if torch else 'not available'}.", "",
             f"Device-to-device copy ({args.copy_mib} MiB, bytes read + written): "
             f"**{copy_gbs:.0f} GB/s**", ""]
    sections = [("Notify → wake latency (static chain, one hop per CTA)", bench_latency, ()),
                ("Per-task overhead (independent 1-row tiles)", bench_overhead, ()),
                ("bf16 GEMV (bytes: weights + x + y)", bench_gemv, (copy_gbs, torch)),
                ("Roofline: one line per tile kernel", bench_roofline, (copy_gbs,)),
                ("5-operator MLP block, bf16", bench_mlp, (torch,)),
                ("Decode step", bench_decode, (torch,)),
                ("bf16 GEMM", bench_gemm, (torch,)),
                ("bf16 prefill x·Wᵀ, symbolic rows (decode-sized column tiles)",
                 bench_prefill, (torch,))]
    for title, bench, extra in sections:
        if time.perf_counter() > deadline:
            lines += [f"### {title}", "", "skipped: over the --bench-budget of "
                      f"{args.bench_budget:.0f} s", ""]
            continue
        log(f"  benchmark: {title} ...")
        start = time.perf_counter()
        try:
            table = bench(manifest, device, timer, *extra)
        except Exception as error:
            table = [f"FAILED: {type(error).__name__}: {error}"]
        lines += [f"### {title}", "", *table, "",
                  f"({time.perf_counter() - start:.0f} s)", ""]
    return lines


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
    parser.add_argument("--check-budget", type=float, default=330,
                        help="seconds after which the remaining artifacts are not checked "
                             "(reported as failures)")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-watchdog", action="store_true")
    parser.add_argument("--skip-sanitizer", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per benchmark")
    parser.add_argument("--bench-budget", type=float, default=200,
                        help="seconds after which the remaining benchmarks are skipped")
    parser.add_argument("--copy-mib", type=int, default=1024,
                        help="size of the device-to-device copy that measures bandwidth")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the report (Markdown) to this file")
    parser.add_argument("--internal-watchdog", help=argparse.SUPPRESS)
    parser.add_argument("--internal-once", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.internal_watchdog:
        return watchdog_child(args.internal_watchdog)
    if args.internal_once:
        return once_child(args.internal_once, 5)

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
    start = time.perf_counter()
    header = [f"# ETC GPU kit report, {time.strftime('%Y-%m-%d %H:%M')}", "",
              f"Device: {device.describe() if device else 'CPU (a --target cpu kit)'}",
              f"Kit: {len(manifest['artifacts'])} artifacts built {manifest['built']}", ""]
    log("\n".join(header))
    report = list(header)
    failed = 0
    if not args.skip_checks:
        results = run_checks(manifest, args, device)
        bad = [r for r in results if r["failures"]]
        failed += len(bad)
        report += [f"Checks: {len(results) - len(bad)}/{len(results)} artifacts passed "
                   f"({sum(r['checks'] for r in results)} output checks, {args.runs} poisoned "
                   f"runs per size)."]
        report += [f"- FAILED {r['artifact']}: {r['failures'][0]} ({len(r['failures'])} "
                   "failing checks)" for r in bad]
    if not args.skip_watchdog:
        results = run_watchdog(manifest, device)
        bad = [r for r in results if not r["ok"]]
        failed += len(bad)
        report += [f"Watchdog: {len(results) - len(bad)}/{len(results)} broken artifacts "
                   "raised WatchdogError."]
        report += [f"- FAILED {r['artifact']}: {r['text'][-300:]}" for r in bad]
    if device is not None and not args.skip_sanitizer:
        lines = run_sanitizer(manifest, device)
        failed += sum(1 for line in lines if ": ok:" not in line)
        report += [f"compute-sanitizer {line}" for line in lines]
    if device is not None and not args.skip_bench:
        log("## Benchmarks")
        report += ["", "## Benchmarks", "", *run_benchmarks(manifest, args, device)]
    report += ["", f"Total {time.perf_counter() - start:.0f} s; "
               f"{'all passed' if not failed else f'{failed} FAILED'}."]
    text = "\n".join(report)
    log("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
