"""One MoE layer at Qwen3-30B-A3B width on the CPU, per expert storage.

    y = moe(x, router, gate, down, 8, w_up=up)   x (B, 2048), 32 experts,
                                                  each 2048 -> 768 -> 2048

compiled once per storage for the CPU target (`--workers` workers) and run
at each B of `--batches`, the storages alternating round by round
(`--rounds`, each the median of `--repeats` runs). Storages:

* `q4_k`: Q4_K gate/up, Q6_K down, (E, out, in), x f32 (a GGUF file's
  experts; `MoeUpPackedCPU` / `MoeDownPackedCPU`)
* `q6_k`: Q6_K gate/up/down, (E, out, in), x f32 (a Q6_K GGUF file's
  experts; the same tiles)
* `mxfp4`: MXFP4 gate/up/down, (E, out, in), x f32 (llama.cpp's MXFP4_MOE
  files' experts; the same tiles)
* `q4_0`: Q4_0 gate/up/down (the 32-value 4-bit format MXFP4 is set
  against: 18-byte blocks to its 17)
* `bf16`: bf16 (E, in, out), x bf16 (a bf16 safetensors checkpoint, widened
  at load to (in, out); the vector tiles' micro-tiles)
* `bf16_t`: bf16 (E, out, in), x bf16 (the dot products along K)
* `fp8`: fp8_e4m3 (E, out, in), x bf16 (an FP8 checkpoint)
* `scalar`: the `bf16` layer in the scalar tiles (`MoeUp` / `MoeDown`, the
  vector tiles turned off): what bf16 and f32 experts took before

Prints a Markdown table: per storage and B the median of the rounds'
medians (and their range), the experts' bytes the step reads (the
distinct experts routed to, times an expert's three matrices) and that
over the median time. The B = 1 floor is those bytes over the memory
bandwidth.

Usage: python bench/moe_cpu.py [--storages q4_k,bf16,fp8] [--batches 1 8 32]
       [--workers 2] [--rounds 5] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import etc
from etc import bfloat16, packed
from etc.ops import moe_experts
from etc.reference import round_bf16, topk

H, F, E, TOP_K = 2048, 768, 32, 8
STORAGES = ("q4_k", "q6_k", "mxfp4", "q4_0", "bf16", "bf16_t", "fp8", "scalar")


def layer(storage: str, workers: int):
    """The layer compiled for `workers` workers: its runner with the
    experts bound, x's dtype, and the bytes of one expert's three
    matrices."""
    formats, xdtype, transposed = {
        "q4_k": (("q4_k", "q4_k", "q6_k"), "f32", True),
        "q6_k": (("q6_k",) * 3, "f32", True),
        "mxfp4": (("mxfp4",) * 3, "f32", True),
        "q4_0": (("q4_0",) * 3, "f32", True),
        "bf16": (("bf16",) * 3, "bf16", False),
        "bf16_t": (("bf16",) * 3, "bf16", True),
        "fp8": (("fp8_e4m3",) * 3, "bf16", True),
        "scalar": (("bf16",) * 3, "bf16", False),
    }[storage]
    g = etc.Graph(f"moe_{storage}")
    T = g.symbol("T")
    x = g.input("x", (T, H), xdtype)
    router = g.input("router", (H, E), xdtype)
    up_shape, down_shape = ((E, F, H), (E, H, F)) if transposed else ((E, H, F), (E, F, H))
    names = ("gate", "up", "down")
    shapes = (up_shape, up_shape, down_shape)
    w = {name: g.input(name, shape, fmt) for name, shape, fmt in zip(names, shapes, formats)}
    g.output(g.moe(x, router, w["gate"], w["down"], TOP_K, w_up=w["up"], transpose_w=transposed))
    saved = {}
    if storage == "scalar":
        for tile in (moe_experts.MoeUpVectorCPU, moe_experts.MoeDownVectorCPU):
            saved[tile] = tile.__dict__["applies"]
            tile.applies = classmethod(lambda cls, op, target: False)
    try:
        kernel = etc.compile(g, target="cpu", workers=workers)
    finally:
        for tile, applies in saved.items():
            tile.applies = applies
    rng = np.random.default_rng(0)
    weights = {}
    for name, shape, fmt in zip(names, shapes, formats):
        k = shape[2] if transposed else shape[1]
        values = rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(k))
        weights[name] = packed.quantize(values, fmt) if packed.is_packed(fmt) else \
            bfloat16.to_bits(values) if fmt == "bf16" else values
    expert_bytes = sum(weights[name].nbytes for name in names) / E
    return kernel.partial(**weights), xdtype, expert_bytes


def inputs(b: int, xdtype: str) -> tuple[dict, int]:
    """x and router at batch b, and the distinct experts they route to."""
    rng = np.random.default_rng(100 + b)
    x = rng.standard_normal((b, H)).astype(np.float32)
    router = (rng.standard_normal((H, E)) / np.sqrt(H)).astype(np.float32)
    if xdtype == "bf16":
        x, router = round_bf16(x), round_bf16(router)
    experts = len(np.unique(topk(x @ router, TOP_K)[1]))
    return dict(x=x, router=router), experts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storages", default="q4_k,bf16,fp8")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    storages = args.storages.split(",")
    unknown = [s for s in storages if s not in STORAGES]
    if unknown:
        parser.error(f"--storages: unknown {unknown} (known: {', '.join(STORAGES)})")
    if min(args.batches) < 1 or min(args.workers, args.rounds, args.repeats) < 1:
        parser.error("--batches, --workers, --rounds and --repeats must be positive")
    layers = {s: layer(s, args.workers) for s in storages}
    feeds = {(s, b): inputs(b, layers[s][1]) for s in storages for b in args.batches}
    times = {key: [] for key in feeds}
    for _ in range(args.rounds):
        for key, (ins, _) in feeds.items():
            run = layers[key[0]][0]
            run.run(**ins)
            each = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                run.run(**ins)
                each.append(time.perf_counter() - t)
            times[key].append(statistics.median(each))
    print("| storage | B | experts read | MB read | median ms (range) | GB/s |")
    print("|---|---|---|---|---|---|")
    for (storage, b), (_, experts) in feeds.items():
        rounds = times[(storage, b)]
        median = statistics.median(rounds)
        mb = experts * layers[storage][2] / 1e6
        print(f"| {storage} | {b} | {experts} | {mb:.1f} | {median * 1e3:.1f} "
              f"({min(rounds) * 1e3:.1f}-{max(rounds) * 1e3:.1f}) | {mb / 1e3 / median:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
