"""The packed matmul tiles' global loads by width, without a GPU: x (B, K)
bf16 times W (N, K) in each block format given, compiled for a chip; counts
the PTX `ld.global` instructions of the packed tile function (the GEMV
passes and the tensor cores' B staging) by width and reads its stack frame
and spills from `ptxas -v`. Prints a Markdown table (docs/benchmarks.md,
"GPU packed weights").

    python bench/gpu_packed_loads.py [--formats q4_k,q6_k,q8_0,q5_0] [--chip sm_90a]

Needs ptxas (CUDA toolkit). Runs with any ETC version that has packed
matmuls on CUDA, so that the same script measures before and after a
change. Counts are static (instructions in the code, loops counted once).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import etc

_LOAD = re.compile(r"\bld\.global(?:\.nc)?\.((?:v\d\.)?[bsu]\d+)")
_FRAME = r"Function properties for {}\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="q4_k,q6_k,q8_0,q5_0")
    parser.add_argument("--chip", default="sm_90a")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    args = parser.parse_args()
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        raise SystemExit("ptxas (CUDA toolkit) is not on PATH")
    print("| W | loads (width x count) | stack B | spill B | f32 FMAs |")
    print("|---|---|---:|---:|---:|")
    for fmt in args.formats.split(","):
        g = etc.Graph(f"p_{fmt}")
        B = g.symbol("B")
        g.output(g.matmul(g.input("x", (B, args.k), "bf16"),
                          g.input("w", (args.n, args.k), fmt), transpose_b=True))
        ptx = etc.compile(g, target="cuda", chip=args.chip).ptx
        names = re.findall(rf"\.func (p_{fmt}_tile_matmul_\w+?)\(", ptx)
        if not names:
            raise SystemExit(f"{fmt}: no packed tile function in the PTX")
        name = names[0]
        body = ptx.split(f".func {name}(")[1].split("\n}\n")[0]
        loads = _LOAD.findall(body)
        counts = ", ".join(f"{w} x {loads.count(w)}" for w in sorted(set(loads)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "k.ptx"
            path.write_text(ptx)
            report = subprocess.run([ptxas, f"-arch={args.chip}", "-v", str(path), "-o",
                                     "/dev/null"], capture_output=True, text=True, check=True)
        frame = re.search(_FRAME.format(name), report.stderr)
        stack, spill = frame.groups() if frame else ("?", "?")
        fmas = len(re.findall(r"\bfma\.rn\.f32", body))
        print(f"| {fmt.upper()} {args.n}×{args.k} | {counts} | {stack} | {spill} | {fmas} |")


if __name__ == "__main__":
    main()
