"""The step worker's registers and spills, without a GPU: the plain bf16
step graph (every weight bf16, what a Hugging Face bf16 checkpoint compiles
to) of each shape of `etc.models.testing.SHAPES` at 2 layers, paged KV
blocks of 16, schedule "auto", compiled for each chip and assembled with
`ptxas -v`. Prints a Markdown table: the worker entry's registers, stack
frame and spill bytes, and the tile functions it calls instead of having
them inlined (docs/gpu.md, "Registers of the step worker").

    python bench/gpu_step_registers.py [--shapes llama-3.2-1b,qwen3-0.6b] [--chips sm_90a,sm_80]

Needs ptxas (CUDA toolkit). About 10 s a graph here.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import etc
from etc.models.loading.config import ModelConfig
from etc.models.step.graph import build_step_graph
from etc.models.testing import SHAPES, shaped_config

_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def worker_report(ptx: str, chip: str, name: str, ptxas: str) -> dict:
    """Registers, stack frame and spill bytes of `name`'s worker entry."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.ptx"
        path.write_text(ptx)
        result = subprocess.run([ptxas, f"-arch={chip}", "-v", str(path), "-o", "/dev/null"],
                                capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"ptxas -arch={chip} rejected the PTX:\n{result.stderr}")
    worker = result.stderr.split(f"Compiling entry function '{name}_worker'")[1]
    frame, stores, loads = _FRAME.search(worker).groups()
    return dict(registers=int(re.search(r"Used (\d+) registers", worker).group(1)),
                frame=int(frame), stores=int(stores), loads=int(loads))


def called(ptx: str, name: str) -> list:
    """The tile functions (stems) the worker entry calls."""
    worker = ptx.split(f".entry {name}_worker(")[1].split("\n}\n")[0]
    return sorted(set(re.findall(
        rf"call(?:\.uni)?\s+(?:\([^)]*\),\s*)?{name}_tile_(\w+?)_\d+,", worker)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--chips", default="sm_90a,sm_80")
    args = parser.parse_args()
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        raise SystemExit("ptxas (CUDA toolkit) is not on PATH")
    shapes = args.shapes.split(",")
    for shape in shapes:
        if shape not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    print("| shape | chip | registers | stack B | spill stores B | spill loads B | called |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        config = ModelConfig.from_dict(shaped_config(shape, layers=2))
        graph = build_step_graph(config, dtype="bf16", max_seq_len=4096, chunk=256,
                                 kv_block_size=16)
        for chip in args.chips.split(","):
            ptx = etc.compile(graph, target="cuda", chip=chip, schedule="auto").ptx
            r = worker_report(ptx, chip, graph.name, ptxas)
            print(f"| {shape} | {chip} | {r['registers']} | {r['frame']} | {r['stores']} | "
                  f"{r['loads']} | {', '.join(called(ptx, graph.name))} |", flush=True)


if __name__ == "__main__":
    main()
