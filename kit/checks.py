"""The GPU check kit's checks: every artifact against the NumPy reference
in poisoned runs (a child process per family), the watchdog's broken
artifacts, and compute-sanitizer on one small artifact.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

import etc.reference
import etc.runtime
import families
from etc.runtime import WatchdogError
from harness import (KIT, RUN, Device, Report, child_options, load_manifest, log, resource_table,
                     resources, run_child, runnable)

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
#: The artifacts compute-sanitizer runs, by family and schedule, and its
#: tools for each: a small one with lane reductions under every tool, and
#: the examples whose notifies reduce over the CTA (`bar.red`) under the
#: fast tools (racecheck of a spinning megakernel is slow).
SANITIZER_TARGETS = (("op_rmsnorm", "static", SANITIZER_TOOLS),
                     ("example_mlp", "dynamic", ("memcheck", "synccheck")),
                     ("example_moe", "static", ("memcheck", "synccheck")))
#: Seconds per compute-sanitizer tool (racecheck of a spinning megakernel is slow).
SANITIZER_TIMEOUT = 90


# ---------------------------------------------------------------------------
# Poisoned runs against the reference
# ---------------------------------------------------------------------------

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


#: CUDA errors that end the process's context: every later call fails with
#: the same error, so the family's other artifacts go to a new child.
STICKY_ERRORS = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                 "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
                 "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT",
                 "CUDA_ERROR_HARDWARE_STACK_ERROR")


def family_entries(manifest: dict, name: str, device: Device | None) -> list[dict]:
    """The check artifacts of family `name` that run on `device`."""
    return [e for e in manifest["artifacts"] if e["kind"] == "check"
            and e["family"] == name and runnable(e, device)]


def family_child(name: str, args, device: Device | None) -> dict:
    """In a child process: the runnable check artifacts of family `name`
    from the `--internal-skip`-th on, up to the first whose failure ended
    the CUDA context (then `stopped`)."""
    results = []
    for entry in family_entries(load_manifest(), name, device)[args.internal_skip:]:
        results.append(check_artifact(entry, args.runs, device, args.plant_misaligned == name))
        if any(error in failure for failure in results[-1]["failures"]
               for error in STICKY_ERRORS):
            return {"results": results, "stopped": True}
    return {"results": results, "stopped": False}


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
        count = len(family_entries(manifest, name, device))
        results, lines, done = [], [], 0
        while done < count:
            result, text = run_child(["--internal-family", name, "--internal-skip", str(done),
                                      *child_options(args)], args.family_timeout)
            if result is None:
                total += count - done
                report.failed += 1
                lines.append(f"- FAILED family {name} ({count - done} artifacts): the child "
                             f"process died: {text}")
                break
            results += result["results"]
            done += len(result["results"])
            if not result["results"]:
                break
            if result["stopped"] and done < count:
                results[-1]["failures"].append(
                    "(this ended its process's CUDA context: the family's next artifacts ran "
                    "in a new process)")
        for r in results:
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


# ---------------------------------------------------------------------------
# The watchdog's broken artifacts
# ---------------------------------------------------------------------------

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
            child = subprocess.run([sys.executable, str(RUN), "--internal-watchdog",
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


# ---------------------------------------------------------------------------
# compute-sanitizer
# ---------------------------------------------------------------------------

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
    for family, schedule, tools in SANITIZER_TARGETS:
        entry = next((e for e in manifest["artifacts"] if e["kind"] == "check"
                      and e["family"] == family and e["requested_schedule"] == schedule
                      and runnable(e, device)), None)
        if entry is None:
            report.add([f"## compute-sanitizer: no runnable {family} artifact ({schedule}); "
                        "skipped", ""])
            continue
        lines = [f"## compute-sanitizer on {entry['path']}", ""]
        env = dict(os.environ, ETC_KIT_RECIPE=json.dumps(entry["recipe"]))
        for name in tools:
            start = time.perf_counter()
            first = []
            try:
                child = subprocess.run([tool, "--tool", name, "--error-exitcode", "7",
                                        "--print-limit", "3", sys.executable, str(RUN),
                                        "--internal-once", str(KIT / entry["path"])],
                                       capture_output=True, text=True,
                                       timeout=SANITIZER_TIMEOUT, env=env)
                output = (child.stdout + child.stderr).splitlines()
                # The count ("N errors"), not --print-limit's "M were not printed".
                summary = [line for line in output
                           if ("ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line)
                           and "not printed" not in line]
                verdict = ("ok" if child.returncode == 0 else f"FAILED (exit {child.returncode})")
                detail = summary[-1].strip() if summary else "\n".join(output)[-300:]
                if child.returncode != 0:
                    # The first error and where it was: what to look at.
                    first = [line.strip("= ").strip() for line in output
                             if line.startswith("=========") and "Host Frame" not in line
                             and "backtrace" not in line and line.strip("= ").strip()][:4]
            except subprocess.TimeoutExpired:
                verdict, detail = "TIMEOUT", f"no answer in {SANITIZER_TIMEOUT} s"
            report.failed += verdict != "ok"
            lines.append(f"- compute-sanitizer {name}: {verdict}: {detail} "
                         f"({time.perf_counter() - start:.0f} s)")
            lines += [f"    - {line}" for line in first]
        report.add(lines + [""])
