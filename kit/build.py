"""Builds the GPU check kit (`make gpu-kit`): everything a GPU machine without
MLIR needs to check and measure ETC's CUDA kernels.

    python kit/build.py [--out build/gpu-kit] [--chips sm_80 sm_90a] [--quick]
                        [--target cuda|cpu]

Writes OUT/ with
  run.py              the checker and benchmark driver (numpy + cuda-bindings),
                      with harness.py, checks.py, probe.py and benchmarks.py
  ranks.py            the fused-vs-unfused benchmark on several GPUs (mpi4py +
                      nvshmem4py besides)
  families.py         the input recipes (numpy only)
  etc/                the MLIR-free part of the etc package: etc.runtime and
                      the NumPy reference (etc.reference)
  artifacts/*.etc     saved kernels: every family of kit/families.py for the
                      static, dynamic and auto schedules and every chip; the
                      watchdog's broken program; the benchmark kernels;
                      the fused patterns on 2 ranks (CUDA kits)
  manifest.json       what each artifact is and how to check or time it

`--target cpu` builds the same kit with CPU artifacts (the tests run the
kit's checks on the CPU with it); `--quick` keeps a few families, the
`packed` family with three of its block formats (QUICK_PACKED_FORMATS), and
the benchmarks at toy sizes (for tests).
The kit must stay under 32 MiB; the build says its size and fails beyond.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import families  # noqa: E402

#: The kit's size limit (issue #9).
MAX_BYTES = 32 << 20
#: The etc modules that need no MLIR (the runtime and the NumPy reference).
RUNTIME_FILES = ("__init__.py", "bfloat16.py", "binding.py", "packed.py", "reference.py",
                 "reference_llm.py",
                 "reference_sampling.py",
                 "runtime/__init__.py", "runtime/abi.py", "runtime/aligned.py", "runtime/artifact.py",
                 "runtime/bind_plan.py",
                 "runtime/cpu.py", "runtime/cuda.py", "runtime/cuda_arrays.py",
                 "runtime/cuda_driver.py", "runtime/cuda_launch.py", "runtime/cuda_timing.py",
                 "runtime/cuda_tensor_maps.py", "runtime/tensor_maps.py",
                 "runtime/isa.py", "runtime/kernel.py", "runtime/layout.py",
                 "runtime/probes.py", "runtime/program.py", "runtime/distributed.py",
                 "runtime/nvshmem.py",
                 "runtime/ranges.py", "runtime/trace.py", "runtime/workers.py")
#: The kit's own files: its two entry points and the modules they import
#: (numpy and cuda-bindings only).
KIT_FILES = ("run.py", "harness.py", "checks.py", "probe.py", "benchmarks.py", "ranks.py",
             "families.py")
SCHEDULES = ("static", "dynamic", "auto")
#: The benchmark variant compiled without the weight prefetch (issue #11).
NO_PREFETCH = "static, no prefetch"
#: The decode benchmark's variant with 256-lane worker CTAs (issue #38).
LANES_256 = "static, 256 lanes"
QUICK_FAMILIES = ("op_add", "op_rmsnorm", "mlp_bf16", "moe", "packed")
#: The block formats of the quick kit's `packed` family: a 32-value GGML
#: format, a 256-value K-quant and fp8_e4m3 (scales beside the blocks):
#: the kit's code for packed arguments (inputs quantized by dtype, the GPU
#: layout, the staging) is the same for every format, and each format's
#: tiles are checked in test_matmul_packed.py, test_matmul_packed_amx.py
#: and test_packed_gpu.py. The 10 formats took about 40 s a schedule to
#: compile for the CPU kit, three quarters of its build (2026-11-29).
QUICK_PACKED_FORMATS = ("q8_0", "q4_k", "fp8_e4m3")

#: The block formats of the packed benchmark: Q4_K_M files' (q4_k, q6_k),
#: Q8_0, and q5_0 (Q5_0 files, and the fifth bits' read).
PACKED_BENCH = ("q4_k", "q6_k", "q8_0", "q5_0")


@dataclass(frozen=True)
class BenchShapes:
    """Benchmark shapes (issue #9): bf16 GEMV weights (K, N); the MLP block's
    hidden and FFN sizes (Llama-3.2-1B's MLP without its gate); the GEMM's
    square size; the rows of the row-wise roofline kernels and their widths;
    the decode-step model (bench/llm_decode_cpu.py's SMALL) and its cached
    positions. `SMALL` keeps every benchmark kind at toy sizes, so that the
    tests run the kit's benchmark code on the CPU: the packed benchmark
    with two of its formats (a K-quant and a 32-value one: its code is the
    same for each), the decode step with one layer (its code is the same
    for any number; the CPU kit's compile of a 2-layer step took 45 s)."""

    gemv: tuple = ((4096, 4096), (2048, 8192))
    mlp: tuple = (2048, 8192)
    gemm: int = 4096
    rows: int = 4096
    width: int = 8192
    chain: tuple = (1, 64, 256)
    decode: dict = field(default_factory=lambda: dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, head_dim=64, vocab_size=4096, max_position_embeddings=512))
    prompt: int = 128
    #: The block formats of the packed benchmark.
    packed: tuple = PACKED_BENCH
    #: x·Wᵀ with known rows (M, N, K), W stored (N, K): the Hopper tile at
    #: M = 512 and 4096 with K = N = 4096, and Llama-3.1-8B's MLP (gate/up
    #: N = 14336, down K = 14336) at 4096 rows.
    hopper: tuple = ((512, 4096, 4096), (4096, 4096, 4096), (4096, 14336, 4096),
                     (4096, 4096, 14336))
    #: The fused patterns on several ranks (ranks.py): (pattern, rows per
    #: rank, K, N), bf16: all_gather + GEMM gathers `rows` per rank (the
    #: GEMM is (ranks x rows) x K x N on every rank); GEMM + reduce_scatter
    #: multiplies `rows` x K x N on every rank and each keeps rows / ranks.
    ranks: tuple = (("ag_mm", 1024, 4096, 4096), ("mm_rs", 4096, 4096, 4096))


#: Ranks of the kit's benchmark on several GPUs (ranks.py).
RANKS = 2
FULL = BenchShapes()
SMALL = BenchShapes(gemv=((256, 512),), mlp=(64, 128), gemm=64, rows=64, width=256,
                    chain=(1, 64), decode=dict(num_hidden_layers=1), prompt=12,
                    packed=("q4_k", "q8_0"),
                    hopper=((64, 64, 128), (130, 128, 192)),
                    ranks=(("ag_mm", 32, 64, 32), ("mm_rs", 64, 32, 32)))


# ---------------------------------------------------------------------------
# Benchmark graphs
# ---------------------------------------------------------------------------

def chain_graph(length: int):
    """K dependent one-tile `scale` tasks: each hop crosses CTAs (SMs)."""
    import etc

    g = etc.Graph(f"chain{length}")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    for _ in range(length):
        x = g.scale(x, 1.0)
    g.output(x)
    return g


def wide_graph():
    """One `scale` over B independent one-row tiles: per-task overhead."""
    import etc

    g = etc.Graph("wide")
    B = g.symbol("B")
    g.output(g.scale(g.input("x", (B, 96), "f32"), 2.0, tile=(1, 96)))
    return g


def gemv_graph(k: int, n: int, transposed: bool = False):
    """x (B, K) times bf16 weights W (K, N), or W^T with W stored (N, K) as
    Hugging Face linear layers store it."""
    import etc

    g = etc.Graph(f"gemv{'_t' if transposed else ''}_{k}x{n}")
    B = g.symbol("B")
    w = g.input("w", (n, k) if transposed else (k, n), "bf16")
    g.output(g.matmul(g.input("x", (B, k), "bf16"), w, transpose_b=transposed))
    return g


def packed_t_graph(k: int, n: int, fmt: str):
    """x (B, K) bf16 times a packed weight W (N, K) in block format `fmt`
    (`etc.packed`), x·Wᵀ: the packed GEMV for few rows, the tensor cores on
    dequantized tiles from 16 rows."""
    import etc

    g = etc.Graph(f"packed_{fmt}_{k}x{n}")
    B = g.symbol("B")
    w = g.input("w", (n, k), fmt)
    g.output(g.matmul(g.input("x", (B, k), "bf16"), w, transpose_b=True))
    return g


def gemm_graph(size: int):
    """A square bf16 GEMM with static shapes: the tensor-core kernel gets
    tiles chosen for them (a symbolic row count gets the GEMV's tiles, sized
    for decode)."""
    import etc

    g = etc.Graph(f"gemm_{size}")
    g.output(g.matmul(g.input("a", (size, size), "bf16"), g.input("b", (size, size), "bf16")))
    return g


def hopper_gemm_graph(m: int, n: int, k: int):
    """x·Wᵀ in bf16 with known rows, W stored (N, K) as Hugging Face
    linear layers store it: on sm_90a the wgmma tile on the tiles chosen
    for the shape (`matmul_wgmma.MatmulWGMMA`), mma.sync on sm_80."""
    import etc

    g = etc.Graph(f"hopper_{m}x{n}x{k}")
    g.output(g.matmul(g.input("x", (m, k), "bf16"), g.input("w", (n, k), "bf16"),
                      transpose_b=True))
    return g


#: One graph per CUDA tile kernel for the roofline table: (name, builder,
#: symbol value, FLOPs at that value or None). Bytes are those of the
#: inputs and outputs (each read or written once: the floor).
def roofline_graphs(shapes: BenchShapes):
    import etc

    def one(name, build, size, flops=None):
        return name, build, size, flops

    def unary(kind, width, dtype):
        def build():
            g = etc.Graph(f"roof_{kind}_{dtype}")
            B = g.symbol("B")
            x = g.input("x", (B, width), dtype)
            if kind == "rmsnorm":
                g.output(g.rmsnorm(x, g.input("w", (width,), dtype)))
            elif kind == "add":
                g.output(g.add(x, g.input("z", (B, width), dtype)))
            else:
                g.output(getattr(g, kind)(x))
            return g
        return build

    def gemv_t(n, k):
        def build():
            g = etc.Graph(f"roof_gemv_t_{n}x{k}")
            B = g.symbol("B")
            g.output(g.matmul(g.input("x", (B, k), "bf16"), g.input("w", (n, k), "bf16"),
                              transpose_b=True))
            return g
        return build

    w, half, n, m = shapes.width, shapes.width // 2, shapes.gemv[0][0], shapes.gemm
    return [one(f"silu bf16 (B×{w})", unary("silu", w, "bf16"), shapes.rows),
            one(f"add bf16 (B×{w})", unary("add", w, "bf16"), shapes.rows),
            one(f"rmsnorm bf16 (B×{half})", unary("rmsnorm", half, "bf16"), shapes.rows),
            one(f"softmax f32 (B×{half})", unary("softmax", half, "f32"), shapes.rows),
            one(f"GEMV bf16 x·W, W {n}×{n}", lambda: gemv_graph(n, n), 1, 2 * n * n),
            one(f"GEMV bf16 x·Wᵀ, W {n}×{n}", gemv_t(n, n), 1, 2 * n * n),
            one(f"GEMM bf16 {m}³", lambda: gemm_graph(m), m, 2 * m ** 3)]


def ranks_graphs(pattern: str, rows: int, k: int, n: int, ranks: int):
    """The fused pattern on `ranks` ranks, and the GEMM alone that the
    unfused variant runs after (all_gather) or before (reduce_scatter)
    NVSHMEM's collective."""
    import etc

    g = etc.Graph(pattern, ranks=ranks)
    x, w = g.input("x", (rows, k), "bf16"), g.input("w", (k, n), "bf16")
    g.output(g.matmul(g.all_gather(x), w) if pattern == "ag_mm"
             else g.reduce_scatter(g.matmul(x, w)))
    h = etc.Graph(f"{pattern}_gemm")
    gemm_rows = rows * ranks if pattern == "ag_mm" else rows
    h.output(h.matmul(h.input("x", (gemm_rows, k), "bf16"), h.input("w", (k, n), "bf16")))
    return g, h


def decode_step_graph(shapes: BenchShapes):
    """The decode step as `etc.models.load` builds it by default: bf16, with
    the paged KV cache (blocks of `etc.models.step.kv_blocks.DEFAULT_BLOCK_SIZE` positions
    addressed through the step's block table)."""
    from etc.models.step.graph import build_step_graph
    from etc.models.loading.config import ModelConfig
    from etc.models.step.kv_blocks import DEFAULT_BLOCK_SIZE

    config = ModelConfig.from_dict(decode_hf_config(shapes), "kit")
    graph = build_step_graph(config, dtype="bf16", max_seq_len=shapes.prompt + 8,
                             chunk=max(4, shapes.prompt // 2), name="decode_step",
                             kv_block_size=DEFAULT_BLOCK_SIZE)
    return graph, config


def decode_hf_config(shapes: BenchShapes) -> dict:
    """The decode model's Hugging Face config.json (Qwen3, random weights)."""
    from etc.models.testing import tiny_config

    return tiny_config("Qwen3ForCausalLM", **shapes.decode)


# ---------------------------------------------------------------------------
# The kit
# ---------------------------------------------------------------------------

def copy_runtime(out: Path) -> None:
    source = ROOT / "python" / "etc"
    for name in RUNTIME_FILES:
        target = out / "etc" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target)
    for name in KIT_FILES:
        shutil.copyfile(HERE / name, out / name)


def deflate(path: Path) -> None:
    """Rewrites the artifact at `path` with its members deflated: the same
    files (its checksums are of the members' bytes, which `zipfile` inflates
    as it reads them), a sixth of the size (PTX is text): the kit's
    artifacts take about 6 MiB instead of 32."""
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    temporary = path.with_name(path.name + ".part")
    with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    os.replace(temporary, path)


class Builder:
    def __init__(self, out: Path, target: str, chips: list[str], quick: bool = False):
        self.out, self.target, self.chips, self.quick = out, target, chips, quick
        self.entries: list[dict] = []
        #: The CPU kernels built so far, by what their code depends on.
        self.cpu_kernels: dict = {}
        (out / "artifacts").mkdir(parents=True, exist_ok=True)

    def save(self, kernel, stem: str, **entry) -> dict:
        path = Path("artifacts") / f"{stem}.etc"
        kernel.save(self.out / path)
        deflate(self.out / path)
        record = {"path": str(path), "name": kernel.abi.name, "schedule": kernel.abi.schedule,
                  "chip": kernel.abi.chip, **entry}
        self.entries.append(record)
        return record

    def compile(self, graph, schedule: str, chip: str, tma: bool = False, ws: bool = False,
                **options):
        """`graph` for `chip` (or the CPU); `tma`: the Hopper tile loads
        with TMA (`matmul_wgmma.tma_loads`); `ws`: warp-specialised with
        TMA (`matmul_wgmma.warp_specialised`) at `families.WS_BOUNDS`
        (CUDA; the CPU kit's build of the same graph is the plain one, as
        for `lanes`, which only CUDA workers have)."""
        import etc
        from etc import reference
        from etc.ops.matmul_wgmma import tma_loads, warp_specialised

        if self.target == "cpu":
            # The Hopper variants (tma, ws) and the static schedule without
            # the prefetch (which the CPU never does) build the same CPU
            # code as the plain graph, byte for byte (the artifacts'
            # members compared, 2026-11-29): compiled once, saved under
            # each name; so does a 256-lane build (`lanes`: CUDA workers').
            options = {**{k: v for k, v in options.items() if k != "lanes"},
                       "prefetch": bool(options.get("prefetch"))}
            key = (json.dumps(reference.describe(graph), sort_keys=True, default=str),
                   schedule, tuple(sorted(options.items())))
            if key not in self.cpu_kernels:
                self.cpu_kernels[key] = etc.compile(graph, target="cpu", schedule=schedule,
                                                    workers=2, **options)
            return self.cpu_kernels[key]
        with contextlib.ExitStack() as stack:
            if tma or ws:
                stack.enter_context(tma_loads())
            if ws:
                stack.enter_context(warp_specialised())
                options = {**families.WS_BOUNDS, **options}
            return etc.compile(graph, target="cuda", schedule=schedule, chip=chip, **options)

    def chips_for(self, benchmark: bool) -> list[str]:
        # CPU artifacts have no chip; a CPU kit builds each once.
        return self.chips if self.target == "cuda" else ["host"]

    def checks(self, names) -> None:
        table = families.families()
        for name in names:
            build, recipe = table[name]
            if name == "packed" and self.quick:
                build = lambda: families.packed_graph(QUICK_PACKED_FORMATS)  # noqa: E731
            ws = name in families.WS_FAMILIES
            for chip in self.chips_for(False):
                if ws and chip not in ("sm_90a", "host"):  # wgmma is sm_90a's
                    continue
                for schedule in SCHEDULES:
                    kernel = self.compile(build(), schedule, chip,
                                          tma=name in families.TMA_FAMILIES, ws=ws)
                    self.save(kernel, f"{name}-{schedule}-{chip}", kind="check", family=name,
                              requested_schedule=schedule, recipe=recipe.to_json())

    def watchdog(self) -> None:
        """The program with a missing notify (see test/python/test_watchdog.py)
        compiled with the schedule check skipped: a run must raise the
        watchdog error within its timeout."""
        from mlir import ir

        from etc import pipeline
        from etc.compiler import compile_module

        for chip in self.chips_for(False):
            for schedule in ("static", "dynamic"):
                options = pipeline.Options(target=self.target, workers=2, watchdog=1.0,
                                           chip=chip if self.target == "cuda" else "sm_90a")
                module = ir.Module.parse(families.HANG, ir.Context())
                scheduler = f"event-{schedule}-schedule"
                pipeline.run_stage(module, "scheduled",
                                   f"builtin.module({scheduler}{{workers=2 check=false}})")
                kernel = compile_module(module, families.hang_signature(), options,
                                        stage="scheduled")
                self.save(kernel, f"hang-{schedule}-{chip}", kind="watchdog", timeout_s=1.0)

    def ranks(self, shapes: BenchShapes) -> None:
        """The fused patterns on RANKS GPUs and their one-GPU GEMMs
        (ranks.py). CUDA only: a CPU program on several ranks compiles in
        an MPI job of that many processes."""
        if self.target != "cuda":
            return
        for chip in self.chips:
            for pattern, rows, k, n in shapes.ranks:
                fused, gemm = ranks_graphs(pattern, rows, k, n, RANKS)
                size = dict(pattern=pattern, rows=rows, k=k, n=n, ranks=RANKS)
                for schedule in ("static", "dynamic"):
                    self.save(self.compile(fused, schedule, chip),
                              f"{pattern}_{rows}x{k}x{n}-{schedule}-{chip}", kind="ranks",
                              variant=schedule, **size)
                self.save(self.compile(gemm, "static", chip),
                          f"{pattern}_{rows}x{k}x{n}-gemm-{chip}", kind="ranks", variant="gemm",
                          **size)

    def benchmarks(self, shapes: BenchShapes) -> None:
        for chip in self.chips_for(True):
            for length in shapes.chain:
                self.save(self.compile(chain_graph(length), "static", chip),
                          f"chain{length}-{chip}", kind="latency", length=length)
            for schedule in ("static", "dynamic"):
                self.save(self.compile(wide_graph(), schedule, chip), f"wide-{schedule}-{chip}",
                          kind="overhead")
            for k, n in shapes.gemv:
                for transposed in (False, True):
                    stem = f"gemv{'_t' if transposed else ''}_{k}x{n}-{chip}"
                    self.save(self.compile(gemv_graph(k, n, transposed), "static", chip), stem,
                              kind="gemv", k=k, n=n, transposed=transposed)
            k, n = shapes.gemv[0]
            for fmt in shapes.packed:
                self.save(self.compile(packed_t_graph(k, n, fmt), "static", chip),
                          f"packed_{fmt}_{k}x{n}-{chip}", kind="packed", k=k, n=n, format=fmt)
            hidden, ffn = shapes.mlp
            mlp = families.mlp_block("mlp_bench", hidden=hidden, ffn=ffn, dtype="bf16")
            for schedule in ("static", "dynamic"):
                self.save(self.compile(mlp, schedule, chip), f"mlp_bench-{schedule}-{chip}",
                          kind="mlp", hidden=hidden, ffn=ffn, variant=schedule)
            # The weight prefetch's effect: the static MLP without it.
            self.save(self.compile(mlp, "static", chip, prefetch=False),
                      f"mlp_bench-static-noprefetch-{chip}", kind="mlp", hidden=hidden, ffn=ffn,
                      variant=NO_PREFETCH)
            self.save(self.compile(gemm_graph(shapes.gemm), "static", chip),
                      f"gemm_{shapes.gemm}-{chip}", kind="gemm", size=shapes.gemm)
            for m, n, k in shapes.hopper:
                self.save(self.compile(hopper_gemm_graph(m, n, k), "static", chip),
                          f"hopper_{m}x{n}x{k}-{chip}", kind="hopper", m=m, n=n, k=k,
                          variant="cp.async")
                if chip in ("sm_90a", "host"):  # TMA is Hopper's (the CPU kit: the fake's)
                    self.save(self.compile(hopper_gemm_graph(m, n, k), "static", chip, tma=True),
                              f"hopper_{m}x{n}x{k}-tma-{chip}", kind="hopper", m=m, n=n, k=k,
                              variant="TMA")
                    # Warp-specialised: 256 lanes, a TMA producer warpgroup.
                    self.save(self.compile(hopper_gemm_graph(m, n, k), "static", chip, ws=True),
                              f"hopper_{m}x{n}x{k}-ws-{chip}", kind="hopper", m=m, n=n, k=k,
                              variant="TMA, warp-specialised")
            for index, (title, build, size, flops) in enumerate(roofline_graphs(shapes)):
                self.save(self.compile(build(), "static", chip), f"roofline{index}-{chip}",
                          kind="roofline", title=title, size=size, flops=flops)
            graph, config = decode_step_graph(shapes)
            # The last: the step worker at 256 lanes (`models.load(lanes=
            # 256)`), twice the warps a CTA, one CTA an SM above 128 registers.
            for schedule, prefetch, lanes, variant in (("static", None, None, "static"),
                                                       ("dynamic", None, None, "dynamic"),
                                                       ("static", False, None, NO_PREFETCH),
                                                       ("static", None, 256, LANES_256)):
                stem = (f"decode_step-{schedule}{'' if prefetch is None else '-noprefetch'}"
                        f"{'' if lanes is None else f'-{lanes}lanes'}-{chip}")
                kernel = self.compile(graph, schedule, chip, prefetch=prefetch, lanes=lanes)
                self.save(kernel, stem, kind="decode", prompt=shapes.prompt,
                          hf_config=decode_hf_config(shapes),
                          inv_freq=[float(v) for v in config.rope_inv_freq()], variant=variant)


def kit_size(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-kit")
    parser.add_argument("--chips", nargs="+", default=["sm_80", "sm_90a"])
    parser.add_argument("--target", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help=f"only the families {', '.join(QUICK_FAMILIES)} (packed with the "
                             f"formats {', '.join(QUICK_PACKED_FORMATS)}), and the benchmarks "
                             "at toy sizes (for tests)")
    parser.add_argument("--families", nargs="+", default=None, help="check only these families")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    copy_runtime(args.out)
    builder = Builder(args.out, args.target, args.chips, quick=args.quick)
    names = args.families or (QUICK_FAMILIES if args.quick else list(families.families()))
    unknown = [n for n in names if n not in families.families()]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {list(families.families())}")
    print(f"gpu-kit: {args.target} artifacts of {len(names)} families x {len(SCHEDULES)} "
          f"schedules x {len(builder.chips_for(False))} chips ...", flush=True)
    builder.checks(names)
    print("gpu-kit: watchdog and benchmark artifacts ...", flush=True)
    builder.watchdog()
    builder.benchmarks(SMALL if args.quick else FULL)
    if not args.quick:  # test_gpu_kit_ranks.py builds them at SMALL shapes itself
        builder.ranks(FULL)
    manifest = {"format": 1, "target": args.target, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                "artifacts": builder.entries}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = kit_size(args.out)
    print(f"gpu-kit: {len(builder.entries)} artifacts, {size / 2**20:.1f} MiB in {args.out} "
          f"({time.perf_counter() - start:.0f} s)")
    if size > MAX_BYTES:
        print(f"error: the kit is larger than {MAX_BYTES >> 20} MiB", file=sys.stderr)
        return 1
    print(f"take it to a GPU machine and run: python3 {args.out.name}/run.py  (docs/gpu.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
