"""The CPU attention tiles alone: one decode token's attention over a long
paged KV cache (or `--new` tokens' of a prefill step), the `smol`
(SmolLM2-135M) shape: 9 query heads, 3 KV heads, head_dim 64, bf16 queries
and cache, blocks of 16 positions (`--heads 16 --kv-heads 8 --head-dim 128`:
Qwen3-0.6B's).

`--layers` attention layers (each its own cache: at 30 layers and 2,000
positions the caches are 46 MB, more than L2 but less than some L3s: see
`--evict`; one layer's 1.5 MB stay in L2) compiled into one kernel and run
`--runs` times; prints the fastest, 10th-percentile and median run. Each
run also carries the runtime's fixed cost (about 0.07 ms on this VM: time
`--positions 40` for it). The floor is the layers' keys and values read
once, 30 x 2 x 2,000 x 192 x 2 bytes = 46 MB, over the bandwidth the
workers reach.

Each run's process CPU time (all threads) is printed too: on a machine
shared with other work, the CPU time of a run is less moved by waiting
for a core than its wall time.

On the Intel AMX VM the L3 is 300 MB, so the 46 MB stay in it between
runs: `--evict MB` reads a buffer of MB megabytes (untimed) before each
run, as a `smol` decode step's 269 MB of weights pass through the L3
between one step's attention of a layer and the next's (`--evict 600`
for the time a decode step sees).

`--new N`: the step's last N positions are new tokens (a prefill step
after positions - N cached; `--new` = `--positions` is a first step).
`--compare` compiles the kernel four times in one process: as built
(the prefill's query blocks on AMX tiles where the CPU has them, in steps
of `TILE_KEYS` keys), in steps of 128 keys (`TILE_KEYS` 128), with the
query blocks on `vdpbf16ps`
(`AMX` False; where there is no AMX, the same kernel again), and a token
at a time (`QUERY_ROWS` 1), and times them alternating.

Usage: .venv/bin/python bench/attention_cpu.py [--positions 2000] [--layers 30]
       [--workers 1] [--chunk 128] [--runs 200] [--new 1] [--compare]
       [--heads 9] [--kv-heads 3] [--head-dim 64] [--evict 600]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import etc
from etc import bfloat16
from etc.ops.attention_cpu import AttentionChunkBlocks

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def graph(layers: int, chunk: int, max_length: int, heads: int = HEADS,
          kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> etc.Graph:
    """`layers` attentions of one ragged batch, each over its own paged
    caches, sharing one scratch as a model's layers do."""
    g = etc.Graph("attention")
    T, R, N, M = (g.symbol(name) for name in "TRNM")
    batch = g.ragged_batch(T, R, blocks_per_request=M)
    previous = None
    for i in range(layers):
        q = g.input(f"q{i}", (T, heads * head_dim), "bf16")
        k = g.state(f"k{i}", (N, BLOCK, kv_heads * head_dim), "bf16")
        v = g.state(f"v{i}", (N, BLOCK, kv_heads * head_dim), "bf16")
        previous = g.attention(q, k, v, batch, head_dim=head_dim, chunk=chunk,
                               max_length=max_length, scratch_from=previous)
        g.output(previous)
    return g


def compile_kernel(args, blocks: int, **settings):
    """The kernel, with `settings` (QUERY_ROWS, AMX) as AttentionChunkBlocks'
    class attributes (else as they are)."""
    saved = {name: getattr(AttentionChunkBlocks, name) for name in settings}
    for name, value in settings.items():
        setattr(AttentionChunkBlocks, name, value)
    try:
        return etc.compile(graph(args.layers, args.chunk, blocks * BLOCK, args.heads,
                                 args.kv_heads, args.head_dim), target="cpu",
                           schedule="dynamic", workers=args.workers)
    finally:
        for name, value in saved.items():
            setattr(AttentionChunkBlocks, name, value)


def evict_buffer(megabytes: int) -> np.ndarray:
    """`megabytes` MB (2^20 bytes) of ones, written once here so that its
    pages exist; the runs only read it (`.sum()`), leaving no dirty lines
    for the timed run to write back."""
    if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 1:
        raise ValueError(f"evict_buffer: megabytes={megabytes!r} must be a positive int")
    return np.ones(megabytes << 17, np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--new", type=int, default=1)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--kv-heads", type=int, default=KV_HEADS)
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--evict", type=int, default=0, metavar="MB")
    args = parser.parse_args()
    if args.evict < 0:
        parser.error(f"--evict must be >= 0 megabytes, got {args.evict}")
    if not 1 <= args.new <= args.positions:
        parser.error(f"--new must be in [1, --positions], got {args.new}")
    blocks = -(-args.positions // BLOCK)
    variants = {"as built": compile_kernel(args, blocks)}
    if args.compare:
        variants = {"as built": variants["as built"],
                    "TILE_KEYS=128": compile_kernel(args, blocks, TILE_KEYS=128),
                    "AMX=False": compile_kernel(args, blocks, AMX=False),
                    "QUERY_ROWS=1": compile_kernel(args, blocks, QUERY_ROWS=1)}
    rng = np.random.default_rng(0)
    new, cached = args.new, args.positions - args.new
    inputs = {"positions": np.arange(cached, args.positions, dtype=np.int32),
              "token_request": np.zeros(new, np.int32),
              "request_length": np.array([args.positions], np.int32),
              "request_first": np.zeros(1, np.int32),
              "request_last": np.array([new - 1], np.int32),
              "block_table": np.arange(blocks, dtype=np.int32)[None]}
    for i in range(args.layers):
        inputs[f"q{i}"] = bfloat16.to_bits(
            rng.standard_normal((new, args.heads * args.head_dim)).astype(np.float32))
        for name in "kv":
            inputs[f"{name}{i}"] = bfloat16.to_bits(rng.standard_normal(
                (blocks, BLOCK, args.kv_heads * args.head_dim)).astype(np.float32))
    outputs = {}
    for name, kernel in variants.items():
        for _ in range(3):
            outputs[name] = kernel.run(**inputs)
    if len(outputs) > 1:
        first, *others = (np.asarray(out[0], np.float32) for out in outputs.values())
        difference = max(np.abs(first - other).max() for other in others)
        print(f"largest difference between the variants: {difference:.3g}")
    evict = evict_buffer(args.evict) if args.evict else None
    times = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    for _ in range(args.runs):
        for name, kernel in variants.items():
            if evict is not None:
                evict.sum()
            start, used = time.perf_counter(), time.process_time()
            kernel.run(**inputs)
            times[name].append((time.perf_counter() - start) * 1e3)
            cpu[name].append((time.process_time() - used) * 1e3)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    # Attention's multiply-adds: each new token's heads against the keys
    # up to its position, 2 head_dim for the score and 2 head_dim for the
    # weighted value.
    seen = sum(range(cached + 1, args.positions + 1))
    flop = args.layers * args.heads * seen * 4 * args.head_dim
    for name, runs in times.items():
        runs.sort()
        used = sorted(cpu[name])
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, load {load}: {name}: {args.layers} layers "
              f"at {args.positions} positions, {new} new, {args.workers} workers, chunk "
              f"{args.chunk}{f', {args.evict} MB read before each' if args.evict else ''}: fastest {runs[0]:.3f} ms ({flop / runs[0] / 1e6:.1f} GFLOP/s), "
              f"p10 {runs[len(runs) // 10]:.3f}, median {runs[len(runs) // 2]:.3f}; "
              f"process CPU time fastest {used[0]:.3f}, median {used[len(used) // 2]:.3f}")


if __name__ == "__main__":
    main()
