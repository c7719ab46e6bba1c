"""Whether any CUDA worker of a GPU check kit lets a warp reach a reducing
barrier diverged, without a GPU: each artifact's PTX assembled by ptxas,
disassembled by cuobjdump, and every branch whose target is a `BAR.RED`
listed. ptxas reconverges a warp before a barrier only inside the region
that a divergent branch opens (BSSY ... BSYNC); a plain branch straight to
the barrier's address lets the threads that take it arrive before the
others. On an H200 a worker with such branches stopped with
CUDA_ERROR_ILLEGAL_INSTRUCTION (docs/gpu.md, "What the first GPU found").

    make gpu-kit
    python bench/gpu_barriers.py [--kit build/gpu-kit] [--cuobjdump PATH]

Needs ptxas (CUDA toolkit) and cuobjdump (`pip install --target DIR
nvidia-cuda-cuobjdump`, then --cuobjdump DIR/nvidia/cu13/bin/cuobjdump).
`sm_80` PTX is assembled for sm_90, as an H100/H200's driver JIT builds
it. Exits 1 when a worker has such a branch.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def function_lines(listing: str, function: str) -> list[tuple[int, str]]:
    """(address, instruction) of `function` in cuobjdump's SASS `listing`."""
    lines, inside = [], False
    for line in listing.splitlines():
        if "Function :" in line:
            inside = line.split("Function :")[1].strip() == function
        elif inside and (match := _INSTRUCTION.search(line)):
            lines.append((int(match.group(1), 16), match.group(2)))
    return lines


def worker_sass(ptx: str, arch: str, function: str, ptxas: str, cuobjdump: str,
                scratch: Path) -> list[tuple[int, str]]:
    """(address, instruction) of `function` in the SASS of `ptx`."""
    source, cubin = scratch / "kernel.ptx", scratch / "kernel.cubin"
    source.write_text(ptx)
    subprocess.run([ptxas, f"-arch={arch}", str(source), "-o", str(cubin)], check=True,
                   capture_output=True)
    listing = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True,
                             text=True).stdout
    return function_lines(listing, function)


def branches_to_reducing_barriers(lines: list[tuple[int, str]]) -> tuple[int, list[str]]:
    """(number of BAR.RED, the branches whose target is one)."""
    barriers = {address for address, text in lines if text.startswith("BAR.RED")}
    targets = {f"BRA {hex(address)}" for address in barriers}
    found = [f"{hex(address)}: {text}" for address, text in lines
             if any(text.endswith(target) for target in targets)]
    return len(barriers), found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=Path("build/gpu-kit"))
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    parser.add_argument("--ptxas", default=shutil.which("ptxas"))
    args = parser.parse_args()
    if not args.ptxas or not args.cuobjdump:
        sys.exit("needs ptxas and cuobjdump (--ptxas, --cuobjdump; see the docstring)")
    artifacts = sorted((args.kit / "artifacts").glob("*.etc"))
    if not artifacts:
        sys.exit(f"no artifacts in {args.kit}/artifacts: run `make gpu-kit` first")
    print("| artifact | worker | BAR.RED | branches straight to one |")
    print("|---|---|---:|---|")
    workers = bad = 0
    with tempfile.TemporaryDirectory() as scratch:
        for path in artifacts:
            ptx = zipfile.ZipFile(path).read("kernel.ptx").decode()
            chip = re.search(r"^\.target (\w+)", ptx, re.M).group(1)
            if "nvshmem" in ptx or chip not in ("sm_80", "sm_90a"):
                continue  # NVSHMEM's artifacts need its device library to link
            arch = "sm_90" if chip == "sm_80" else chip
            for function in re.findall(r"\.entry (\w+_worker)\(", ptx):
                lines = worker_sass(ptx, arch, function, args.ptxas, args.cuobjdump,
                                    Path(scratch))
                count, found = branches_to_reducing_barriers(lines)
                workers += 1
                bad += bool(found)
                if count:
                    print(f"| {path.name} | {function} | {count} | {'; '.join(found) or '-'} |")
    print(f"\n{workers} workers; {bad} with a branch straight to a reducing barrier.")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
