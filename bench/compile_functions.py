"""Where a model's step kernel spends its compile: the seconds of each
stage of one cold compile (graph build, dependency inference, scheduling,
lowering, JIT) and the size of every tile function in the graph IR, the
largest first.

The model is `bench/llm_decode_cpu.py`'s `--model` (random weights, written
once into `--checkpoint` or a temporary directory), compiled as
`etc.models.load` does (`compile_checkpoint`, the compile cache off). The
JIT's optimisation level is `ETC_CPU_OPT_LEVEL`'s (default 2), and
`--kernels amx` builds the AMX tile kernels where the CPU has none (their
tile instructions emulated).

Usage: ETC_CPU_OPT_LEVEL=2 .venv/bin/python bench/compile_functions.py
       [--model smol] [--layers 2] [--dtype bf16] [--checkpoint DIR]
       [--kernels native] [--workers 2] [--top 8]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from etc.models.step.kernel import compile_checkpoint
from etc.models.testing import write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_decode_cpu import model_config  # noqa: E402

FUNCTION = re.compile(r"^\s*func\.func (?:private )?@([\w$.-]+)")


def function_sizes(text: str) -> dict[str, tuple[int, int]]:
    """(lines, bytes) of each `func.func` in the IR `text`, by name."""
    sizes: dict[str, list[int]] = {}
    name = None
    for line in text.splitlines(keepends=True):
        found = FUNCTION.match(line)
        if found:
            name = found.group(1)
            sizes[name] = [0, 0]
        if name is not None:
            sizes[name][0] += 1
            sizes[name][1] += len(line)
    return {name: (lines, size) for name, (lines, size) in sizes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smol")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="the model's directory (written there if it has no config.json)")
    parser.add_argument("--kernels", default="native", choices=("native", "amx"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=8, help="functions listed")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        path = args.checkpoint or Path(scratch) / "model"
        if not (path / "config.json").exists():
            write_checkpoint(path, model_config(args.model, args.layers),
                             dtype=args.dtype.upper())
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        start = time.perf_counter()
        cpu = time.process_time()
        result = compile_checkpoint(path, workers=args.workers, cache=False,
                                    kernels=args.kernels)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    kernel = result.kernel
    graph = kernel.ir("graph")
    stages = ", ".join(f"{name} {seconds:.2f}" for name, seconds in kernel.timings.items())
    print(f"{args.model} ({args.layers} layers, {args.dtype}, kernels {args.kernels}), "
          f"ETC_CPU_OPT_LEVEL={os.environ.get('ETC_CPU_OPT_LEVEL', '2')}, load {load}")
    print(f"compile {wall:.2f} s wall, {cpu:.2f} s CPU; stages: {stages}")
    print(f"graph IR {len(graph) / 1e6:.2f} MB, {graph.count(chr(10)):,} lines")
    sizes = function_sizes(graph)
    print("| function | lines | KB |\n|---|---:|---:|")
    for name, (lines, size) in sorted(sizes.items(), key=lambda item: -item[1][1])[:args.top]:
        print(f"| {name} | {lines:,} | {size / 1e3:.0f} |")


if __name__ == "__main__":
    main()
