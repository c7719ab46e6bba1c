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

This file is the entry point: it parses the options and runs the sections
in order, each in the module that holds it: `checks.py` (1 to 3),
`probe.py` (0) and `benchmarks.py` (4), on `harness.py` (the report, the
device, the child processes, the manifest).

Exit status: 0 when every check passed (or there is no GPU), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

KIT = Path(__file__).resolve().parent
sys.path.insert(0, str(KIT))
# The kit runs its own copy of etc/. A developer's editable install of ETC
# (pip install -e) resolves `etc.*` through a meta-path finder ahead of
# sys.path; set it aside so that what is checked here is what travels.
sys.meta_path = [finder for finder in sys.meta_path
                 if not type(finder).__module__.startswith("_editable_")]

from benchmarks import SECTIONS, bench_child, run_benchmarks  # noqa: E402
from checks import (family_child, once_child, run_checks, run_sanitizer,  # noqa: E402
                    run_watchdog, watchdog_child)
from harness import Device, Report, load_manifest, log, write_result  # noqa: E402
from probe import probe_child, run_probe  # noqa: E402


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
    parser.add_argument("--jit-opt-level", type=int, choices=range(5), default=None,
                        help="the driver JIT's optimization level for every kernel (0 to 4; "
                             "default: the driver's): a triage knob, e.g. a failure that goes "
                             "away at 0 points at the code ptxas optimises (docs/gpu.md)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the report (Markdown) to this file, section by "
                             "section as they finish")
    parser.add_argument("--plant-misaligned", default=None, metavar="FAMILY",
                        help=argparse.SUPPRESS)  # tests: a fault in one family's child
    parser.add_argument("--copy-gbs", type=float, default=float("nan"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--internal-family", help=argparse.SUPPRESS)
    parser.add_argument("--internal-skip", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--internal-bench", help=argparse.SUPPRESS)
    parser.add_argument("--internal-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--internal-watchdog", help=argparse.SUPPRESS)
    parser.add_argument("--internal-once", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jit_opt_level is not None:  # this process and its children
        from etc.runtime.cuda_driver import JIT_OPT_LEVEL_VARIABLE

        os.environ[JIT_OPT_LEVEL_VARIABLE] = str(args.jit_opt_level)
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
