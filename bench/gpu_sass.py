"""What the CUDA tile kernels compile to, without a GPU: each kernel alone in
a graph, compiled for a chip, assembled by ptxas and disassembled by
nvdisasm; prints a Markdown table of registers, spills, loads by width,
FMAs and shuffles of its worker (the tile function is inlined into it), the
material of the roofline estimates in docs/benchmarks.md.

    python bench/gpu_sass.py [--chip sm_90a] [--nvdisasm PATH]

Needs ptxas (CUDA toolkit) and nvdisasm (`pip install --target DIR
nvidia-cuda-nvdisasm`, then --nvdisasm DIR/nvidia/cu13/bin/nvdisasm).
Runs with any ETC version that has the graphs' operators, so that the same
script measures the kernels before and after a change.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import etc


def attention_graph(heads: int, kv_heads: int, head_dim: int, cache: str, chunk: int = 256):
    """Decode attention over a cache, as a step graph has it."""
    g = etc.Graph(f"attention_{heads}x{head_dim}_{cache}")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    q = g.input("q", (T, heads * head_dim), cache if cache != "f32" else "f32")
    batch = g.ragged_batch(T, R)
    kc = g.state("kc", (S, L, kv_heads * head_dim), cache)
    vc = g.state("vc", (S, L, kv_heads * head_dim), cache)
    g.output(g.attention(q, kc, vc, batch, head_dim=head_dim, chunk=chunk, max_length=4096))
    return g


def gemv_t_graph(n: int, k: int):
    g = etc.Graph(f"gemv_t_{n}x{k}")
    B = g.symbol("B")
    g.output(g.matmul(g.input("x", (B, k), "bf16"), g.input("w", (n, k), "bf16"),
                      transpose_b=True))
    return g


def rmsnorm_graph(width: int):
    g = etc.Graph(f"rmsnorm_{width}")
    B = g.symbol("B")
    x = g.input("x", (B, width), "bf16")
    g.output(g.rmsnorm(x, g.input("w", (width,), "bf16")))
    return g


def kv_append_graph(width: int, cache: str):
    g = etc.Graph(f"kv_append_{width}_{cache}")
    T, R, S, L = (g.symbol(n) for n in "TRSL")
    v = g.input("v", (T, width), "bf16")
    batch = g.ragged_batch(T, R)
    appended = g.kv_append(g.state("c", (S, L, width), cache), v, batch)
    # An output that reads the cache, so that the append is kept.
    g.output(g.embedding(g.input("table", (4, width), "bf16"), batch.positions))
    del appended
    return g


def kernels(after: bool):
    """(label, graph builder): the attention of Llama-3.2-1B, Qwen3-0.6B and
    Qwen3-30B-A3B shapes (bf16 cache after, float32 before: the old
    models kept float32 caches), their GEMVs, a norm."""
    cache = "bf16" if after else "f32"
    return [
        (f"attention Llama-3.2-1B (32/8 heads of 64), {cache} cache",
         lambda: attention_graph(32, 8, 64, cache)),
        (f"attention Qwen3-0.6B (16/8 heads of 128), {cache} cache",
         lambda: attention_graph(16, 8, 128, cache)),
        (f"attention Qwen3-30B-A3B (32/4 heads of 128), {cache} cache",
         lambda: attention_graph(32, 4, 128, cache)),
        ("GEMV x·Wᵀ bf16, W 2048×8192 (Llama-1B down)", lambda: gemv_t_graph(2048, 8192)),
        ("GEMV x·Wᵀ bf16, W 8192×2048 (Llama-1B gate)", lambda: gemv_t_graph(8192, 2048)),
        ("rmsnorm bf16, 2048 wide", lambda: rmsnorm_graph(2048)),
        (f"kv_append 512 wide, {cache} cache", lambda: kv_append_graph(512, cache)),
    ]


def sass_counts(text: str) -> dict:
    """Instruction counts of a disassembled worker."""
    counts = {"LDG.128": len(re.findall(r"\bLDG\.E\.128", text)),
              "LDG.64": len(re.findall(r"\bLDG\.E\.64", text)),
              "LDG.32-": len(re.findall(r"\bLDG\.E(\.(U8|S8|U16|S16))?\s", text)),
              "LD generic": len(re.findall(r"\bLD\.E", text)),
              "FFMA": len(re.findall(r"\bFFMA\b", text)),
              "SHFL": len(re.findall(r"\bSHFL\.", text)),
              "STL/LDL": len(re.findall(r"\b(STL|LDL)\b", text))}
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", default="sm_90a")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    parser.add_argument("--before", action="store_true",
                        help="the shapes of the kernels before issue #19 (float32 caches)")
    args = parser.parse_args()
    ptxas = shutil.which("ptxas")
    print(f"| kernel ({args.chip}) | registers | spill B | LDG.128 | LDG.64 | LDG ≤32 | "
          "generic LD | FFMA | SHFL | local LD/ST |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as directory:
        for label, build in kernels(not args.before):
            graph = build()
            kernel = etc.compile(graph, target="cuda", chip=args.chip, schedule="static")
            ptx = Path(directory) / "k.ptx"
            cubin = Path(directory) / "k.cubin"
            ptx.write_text(kernel.ptx)
            report = subprocess.run([ptxas, f"-arch={args.chip}", "-v", str(ptx), "-o",
                                     str(cubin)], capture_output=True, text=True, check=True)
            worker = report.stderr.split(f"'{graph.name}_worker'")[1]
            registers = int(re.search(r"Used (\d+) registers", worker).group(1))
            spills = sum(int(v) for v in re.search(
                r"(\d+) bytes spill stores, (\d+) bytes spill loads", worker).groups())
            counts = {}
            if args.nvdisasm:
                text = subprocess.run([args.nvdisasm, "-fun", f"{graph.name}_worker",
                                       str(cubin)], capture_output=True, text=True).stdout
                if not text:  # older nvdisasm: the whole cubin
                    text = subprocess.run([args.nvdisasm, str(cubin)], capture_output=True,
                                          text=True, check=True).stdout
                counts = sass_counts(text)
            cells = [label, str(registers), str(spills)] + [
                str(counts.get(k, "—")) for k in ("LDG.128", "LDG.64", "LDG.32-", "LD generic",
                                                   "FFMA", "SHFL", "STL/LDL")]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
