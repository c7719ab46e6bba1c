"""The CPU attention tiles alone: one decode token's attention over a long
paged KV cache, the `smol` (SmolLM2-135M) shape: 9 query heads, 3 KV
heads, head_dim 64, bf16 queries and cache, blocks of 16 positions.

`--layers` attention layers (each its own cache, so that at 30 layers and
2,000 positions the caches, 46 MB, come from memory as in a decode step;
one layer's 1.5 MB stay in the caches) compiled into one kernel and run
`--runs` times; prints the fastest, 10th-percentile and median run. Each
run also carries the runtime's fixed cost (about 0.07 ms on this VM: time
`--positions 40` for it). The floor is the layers' keys and values read
once, 30 x 2 x 2,000 x 192 x 2 bytes = 46 MB, over the bandwidth the
workers reach.

Usage: .venv/bin/python bench/attention_cpu.py [--positions 2000] [--layers 30]
       [--workers 1] [--chunk 128] [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import etc
from etc import bfloat16

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def graph(layers: int, chunk: int, max_length: int) -> etc.Graph:
    """`layers` attentions of one ragged batch, each over its own paged
    caches, sharing one scratch as a model's layers do."""
    g = etc.Graph("attention")
    T, R, N, M = (g.symbol(name) for name in "TRNM")
    batch = g.ragged_batch(T, R, blocks_per_request=M)
    previous = None
    for i in range(layers):
        q = g.input(f"q{i}", (T, HEADS * HEAD_DIM), "bf16")
        k = g.state(f"k{i}", (N, BLOCK, KV_HEADS * HEAD_DIM), "bf16")
        v = g.state(f"v{i}", (N, BLOCK, KV_HEADS * HEAD_DIM), "bf16")
        previous = g.attention(q, k, v, batch, head_dim=HEAD_DIM, chunk=chunk,
                               max_length=max_length, scratch_from=previous)
        g.output(previous)
    return g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    blocks = -(-args.positions // BLOCK)
    kernel = etc.compile(graph(args.layers, args.chunk, blocks * BLOCK), target="cpu",
                         schedule="dynamic", workers=args.workers)
    rng = np.random.default_rng(0)
    inputs = {"positions": np.array([args.positions - 1], np.int32),
              "token_request": np.zeros(1, np.int32),
              "request_length": np.array([args.positions], np.int32),
              "request_first": np.zeros(1, np.int32), "request_last": np.zeros(1, np.int32),
              "block_table": np.arange(blocks, dtype=np.int32)[None]}
    for i in range(args.layers):
        inputs[f"q{i}"] = rng.standard_normal((1, HEADS * HEAD_DIM)).astype(np.float32)
        for name in "kv":
            inputs[f"{name}{i}"] = bfloat16.to_bits(rng.standard_normal(
                (blocks, BLOCK, KV_HEADS * HEAD_DIM)).astype(np.float32))
    for _ in range(3):
        kernel.run(**inputs)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        kernel.run(**inputs)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load {load}: {args.layers} layers at "
          f"{args.positions} positions, {args.workers} workers, chunk {args.chunk}: "
          f"fastest {times[0]:.3f} ms, p10 {times[len(times) // 10]:.3f}, "
          f"median {times[len(times) // 2]:.3f}")


if __name__ == "__main__":
    main()
