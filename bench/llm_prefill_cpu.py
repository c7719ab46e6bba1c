"""A long prompt's prefill on the CPU target, by attention chunk.

The default watchdog (5 s) is raised to 600 s: with a chunk of 2,560, one
chunk tile of a 256-token step can run for more than 5 s on a busy 2-core
machine while the other worker waits (a WatchdogError). The model is a
random Qwen3-0.6B-shaped checkpoint (hidden 1024, 16 query /
8 KV heads of 128, FFN 3072, vocabulary 151,936, `max_position_embeddings`
40,960) with `--layers` layers (default 4; attention and the MLP scale
alike with depth), bf16 weights computed in bf16, written on the fly. The
model is compiled with the default `max_seq_len` (the config's 40,960) for
each attention chunk of `--chunks`, and a prompt of `--prompt` tokens is
prefilled by `generate(prompt, max_new_tokens=1)` (a new prompt each round:
the same one again would be a prefix-cache hit) in steps of
`max_step_tokens` = 256: seconds per prefill, best of `--repeats`, the
chunks alternated round by round. 2,560 is what the chunk was before it
was chosen for speed (max_seq_len / 16), so its row is the baseline; the
table gives each chunk's time relative to it.

`--trace` then prefills one more prompt with the first chunk's step graph
compiled again with trace=True, step by step, and prints the workers' busy
time per operator family with each family's FLOP rate where it is known
(the projections' and the attention's), next to the floor: the prompt's
FLOP over `--peak` (GFLOP/s).

Usage: .venv/bin/python bench/llm_prefill_cpu.py [--prompt 2500] [--chunks 2560 128 64]
       [--trace [--peak 1030]]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import etc
import etc.compiler
import etc.models as models
from llm_decode_cpu import family
from etc.models.loading.safetensors import save_file
from etc.models.testing import tensor_shapes, tiny_config

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936,
                 max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                 tie_word_embeddings=True)


def write(path: Path, layers: int) -> None:
    config = tiny_config("Qwen3ForCausalLM", num_hidden_layers=layers, **QWEN3_06B)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(__import__("json").dumps(config))
    rng = np.random.default_rng(0)
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, np.float32)
        else:  # small random bf16 values, as bit patterns
            tensors[name] = rng.integers(0x3A00, 0x3C00, size=shape, dtype=np.uint16) | \
                (rng.integers(0, 2, size=shape, dtype=np.uint16) << 15)
    save_file(path / "model.safetensors", tensors, "BF16")


def prompt_flops(config, prompt: int) -> tuple[float, float]:
    """(the projections', the causal attention's) FLOP of prefilling
    `prompt` tokens: 2 per weight and token for every layer's matrices (the
    LM head only for the last token), 4 head_dim per (query, key) pair and
    query head (scores and weighted values)."""
    hidden, heads, kv = config.hidden_size, config.num_heads, config.num_kv_heads
    head_dim, ffn, layers = config.head_dim, config.intermediate_size, config.num_layers
    per_layer = hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * ffn
    projections = 2.0 * per_layer * layers * prompt + 2.0 * hidden * config.vocab_size
    pairs = prompt * (prompt + 1) / 2
    return projections, 4.0 * head_dim * heads * layers * pairs


def trace_prefill(model, prompt: list[int], workers: int | None, peak: float | None) -> None:
    """Prefills `prompt` in steps of 256 with the step graph compiled with
    trace=True; prints where the workers' time goes."""
    kernel = etc.compile(model.graph, target="cpu", workers=workers, trace=True, watchdog=600.0)
    cache = model.new_cache(1, len(prompt) + 4)
    busy: dict = {}
    spans = 0.0
    for start in range(0, len(prompt), 256):
        kernel.run(**model.step_inputs(cache, [models.Request(0, start,
                                                              prompt[start:start + 256])]))
        events = kernel.runtime.trace.events
        spans += (max(e.end for e in events) - min(e.start for e in events)) / 1e9
        for e in events:
            busy[family(e.task)] = busy.get(family(e.task), 0.0) + e.duration / 1e9
    projections, attention = prompt_flops(model.config, len(prompt))
    rates = {"matmul": projections, "attention_chunk": attention}
    total = sum(busy.values())
    floor = (f"; floor {(projections + attention) / (peak * 1e9):.2f} s at {peak:.0f} GFLOP/s"
             if peak else "")
    print(f"\ntrace of the prefill ({kernel.runtime.workers} workers): tiles span {spans:.2f} s, "
          f"workers busy {total:.2f} s; {(projections + attention) / 1e9:.0f} GFLOP "
          f"({attention / 1e9:.0f} of them attention){floor}\n")
    print("| operator family | worker-s | share | GFLOP/s per worker |")
    print("|---|---:|---:|---:|")
    for name, seconds in sorted(busy.items(), key=lambda item: -item[1]):
        rate = f"{rates[name] / seconds / 1e9:.0f}" if name in rates else ""
        print(f"| {name} | {seconds:.3f} | {seconds / total:.1%} | {rate} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=2500)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--chunks", type=int, nargs="+", default=[2560, 128, 64, 256])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--trace", action="store_true",
                        help="then trace one more prefill with the first chunk")
    parser.add_argument("--peak", type=float, default=None,
                        help="the machine's bf16 GFLOP/s, for the trace's floor")
    args = parser.parse_args()
    if args.peak is not None and not args.trace:
        parser.error("--peak is the floor of --trace's table: give --trace too")
    directory = args.checkpoint or Path(tempfile.mkdtemp(prefix="etc-prefill-"))
    if not (directory / "config.json").exists():
        write(directory, args.layers)
    # A new prompt each round (the same for every chunk in it): the model's
    # paged cache keeps a prompt's blocks, and the same prompt again would
    # be a prefix-cache hit (0.02 s), not a prefill.
    prompts = [np.random.default_rng(1 + round_).integers(0, 151936, args.prompt).tolist()
               for round_ in range(args.repeats)]
    # One chunk tile of 2,560 positions runs for seconds on a busy machine,
    # while the other workers wait for it longer than the default watchdog.
    etc.compiler.compile = functools.partial(etc.compiler.compile, watchdog=600.0)
    loaded = {}
    for chunk in args.chunks:
        start = time.perf_counter()
        loaded[chunk] = models.load(directory, dtype="bf16", attention_chunk=chunk,
                                    workers=args.workers, cache=False)
        print(f"chunk {chunk}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
    best = {chunk: float("inf") for chunk in args.chunks}
    tokens = {}
    for round_ in range(args.repeats):
        for chunk, model in loaded.items():
            out = model.generate([prompts[round_]], 1)
            assert out.cached_tokens[0] == 0, out.cached_tokens  # a prefill, not a cache hit
            best[chunk] = min(best[chunk], out.seconds)
            tokens.setdefault(chunk, out.tokens[0])
            print(f"round {round_}, chunk {chunk}: {out.seconds:.2f} s", flush=True)
    base = args.chunks[0]
    print(f"\n{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{args.layers}-layer Qwen3-0.6B-shaped bf16, max_seq_len 40960, prompt "
          f"{args.prompt} tokens, 256 per step\n")
    print("| attention chunk | chunk tiles per layer (last step) | prefill s | vs chunk "
          f"{base} |")
    print("|---|---|---|---|")
    for chunk in args.chunks:
        print(f"| {chunk} | {-(-args.prompt // chunk)} | {best[chunk]:.2f} | "
              f"{best[base] / best[chunk]:.2f}x |")
    same = len({tuple(t) for t in tokens.values()}) == 1
    print(f"\nsame first token with every chunk: {same}")
    if args.trace:
        prompt = np.random.default_rng(1000).integers(0, 151936, args.prompt).tolist()
        trace_prefill(loaded[base], prompt, args.workers, args.peak)


if __name__ == "__main__":
    main()
