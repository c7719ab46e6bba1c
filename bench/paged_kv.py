"""The paged KV cache's numbers on the CPU target: time to first token with a
cached system prompt, how many sequences fit in a memory budget, and decode
speed paged against contiguous.

1. TTFT: a request whose prompt is a `--system`-token system prompt plus a
   short question, on an engine with a fresh pool ("cold": everything is
   prefilled) and on the same pool after another question with the same
   system prompt ran ("cached": only the blocks after the system prompt's
   last full block are prefilled). Rounds alternate cold and cached; each
   cell is the median over the rounds.
2. Capacity: how many sequences of `--length` positions fit in `--memory`
   bytes of KV cache, paged (blocks of 16 positions, a sequence holds
   ceil(length / 16)) and contiguous (a slot of `--max-model-len` per
   sequence, what the cache did before pages): the arithmetic for real
   models' shapes, and, for the benchmark's model, checked by allocating
   the arrays and admitting sequences into the block manager until it
   refuses.
3. Decode: tokens per second of decode steps at B = 1 and 8 after
   `--prompts`-token prefills, with the paged step kernel and the
   contiguous one, alternating over `--rounds` rounds; median step time per
   cell, and the ratio paged / contiguous measured in the same run.
4. Sliding windows: the KV positions one request holds, summed over the
   layers, when its sequence reaches `--window-length` positions, on a
   model with Gemma-3-1B's layers (26: every 6th full, the others sliding
   with a window of 512) and tiny widths, run through the engine: against
   the goal, full layers x length + sliding layers x window, and against
   every layer x length (what the cache held before sliding layers gave
   their blocks back); the most the sliding layers held while the
   prompt was prefilled (a step's new tokens on top of the window); and
   what the engine's pool allocates, its sliding pool sized for the
   windows of its sequences.

The model of 1 to 3 is bench/llm_decode_cpu.py's "small" one (Qwen3-shaped:
hidden 512, 4 layers, 8 query / 4 KV heads of 64, vocabulary 4096), random
weights, written to a temporary directory.

Usage:
  .venv/bin/python bench/paged_kv.py [--dtype bf16] [--rounds 5]
      [--skip ttft capacity decode window] [--window-length 8192]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import etc.models as models
from etc.models.engine import Engine
from etc.models.engine.slots import PagedSlots
from etc.models.testing import SHAPES, shaped_config, tiny_config, write_checkpoint

SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096,
             max_position_embeddings=4096)


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- 1. time to first token ------------------------------------------------------


def ttft(model, system: int, question: int, rounds: int, rng) -> None:
    length = system + question + 8
    rows = {"cold": [], "cached": []}
    cached_tokens = None
    for _ in range(rounds):
        prompt = rng.integers(3, model.config.vocab_size, system).tolist()
        questions = [rng.integers(3, model.config.vocab_size, question).tolist()
                     for _ in range(2)]
        engine = Engine(model, max_num_seqs=1, max_model_len=length, kv_cache_tokens=length)
        # Cold: a fresh pool, the whole prompt prefilled.
        cold = engine.submit(prompt + questions[0], max_new_tokens=1, ignore_eos=True).result()
        # Cached: the system prompt's full blocks are in the pool.
        warm = engine.submit(prompt + questions[1], max_new_tokens=1, ignore_eos=True).result()
        assert cold.cached_tokens == 0
        rows["cold"].append(cold.time_to_first_token)
        rows["cached"].append(warm.time_to_first_token)
        cached_tokens = warm.cached_tokens
    cold_ms = statistics.median(rows["cold"]) * 1e3
    warm_ms = statistics.median(rows["cached"]) * 1e3
    print(f"\n### Time to first token: a {system}-token system prompt + a {question}-token "
          f"question ({rounds} rounds, alternating; {load_average()})\n")
    print("| system prompt | prompt tokens prefilled | TTFT ms (median) | vs cold |")
    print("|---|---:|---:|---:|")
    total = system + question
    print(f"| not cached | {total} | {cold_ms:.1f} | 1.00x |")
    print(f"| cached ({cached_tokens} tokens from the cache) | {total - cached_tokens} | "
          f"{warm_ms:.1f} | {cold_ms / warm_ms:.1f}x faster |")


# -- 2. capacity ---------------------------------------------------------------


def capacity(model, memory: int, length: int, max_model_len: int, block: int) -> None:
    print(f"\n### Sequences of {length} positions in {memory / 2**30:.2f} GiB of KV cache "
          f"(contiguous: a slot of {max_model_len} positions each; paged: blocks of {block})\n")
    print("| model | KV dtype | bytes per position | contiguous | paged | paged / contiguous |")
    print("|---|---|---:|---:|---:|---:|")
    for name in ("qwen3-0.6b", "llama-3.2-1b"):
        config = models.ModelConfig.from_dict(shaped_config(
            name, layers={"qwen3-0.6b": 28, "llama-3.2-1b": 16}[name]))
        per_position = models.KVCache.bytes_for(config, 1, 1, "bf16")
        contiguous = memory // (per_position * max_model_len)
        paged = memory // (per_position * block) // -(-length // block)
        ratio = f"{paged / contiguous:.1f}x" if contiguous else "—"
        print(f"| {name} ({config.num_layers} layers) | bf16 | {per_position:,} | {contiguous} "
              f"| {paged} | {ratio} |")
    # The benchmark's model, allocated: the arrays and the block manager.
    config = model.config
    per_position = models.KVCache.bytes_for(config, 1, 1, model.kv_dtype)
    slots = 0
    while models.KVCache.bytes_for(config, slots + 1, max_model_len, model.kv_dtype) <= memory:
        slots += 1
    contiguous = models.KVCache(config, slots, max_model_len, dtype=model.kv_dtype)
    assert contiguous.nbytes <= memory
    pool = model.new_paged_cache(memory // model.kv_cache_bytes_per_block * block)
    assert pool.nbytes <= memory
    manager = PagedSlots(pool, 1 << 20)
    admitted = 0
    rng = np.random.default_rng(0)
    while manager.admit(rng.integers(0, 100, length).tolist(), length) is not None:
        admitted += 1
    arithmetic = memory // (per_position * block) // -(-length // block)
    assert admitted == arithmetic, (admitted, arithmetic)
    print(f"| this benchmark's model, allocated | {model.kv_dtype} | {per_position:,} | "
          f"{slots} ({contiguous.nbytes / 2**20:.0f} MiB) | {admitted} "
          f"({pool.nbytes / 2**20:.0f} MiB, {pool.num_blocks} blocks) | "
          f"{admitted / slots:.1f}x |" if slots else "— |")


# -- 3. decode speed -------------------------------------------------------------


def decode_ms(model, batch: int, prompt: int, steps: int, rng) -> list:
    cache = model.new_cache(batch, prompt + steps + 1)
    requests = [models.Request(r, 0, rng.integers(3, model.config.vocab_size, prompt).tolist())
                for r in range(batch)]
    # The prefill in steps of at most max_step_tokens tokens.
    done = 0
    while done < prompt:
        take = min(prompt - done, model.max_step_tokens // batch)
        _, next_ids = model.step(cache, [models.Request(q.slot, done, q.tokens[done:done + take])
                                         for q in requests])
        done += take
    times = []
    for step in range(steps):
        step_requests = [models.Request(r, prompt + step, [int(next_ids[r])])
                         for r in range(batch)]
        start = time.perf_counter()
        _, next_ids = model.step(cache, step_requests)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def decode(paged, contiguous, batches, prompts, steps: int, rounds: int, rng) -> None:
    results: dict = {}
    loads = []
    for _ in range(rounds):
        for prompt in prompts:
            for batch in batches:
                for name, model in (("paged", paged), ("contiguous", contiguous)):
                    results.setdefault((name, prompt, batch), []).extend(
                        decode_ms(model, batch, prompt, steps, rng))
        loads.append(os.getloadavg()[0])
    print(f"\n### Decode: paged (blocks of {paged.kv_block_size}) vs contiguous ({rounds} rounds "
          f"x {steps} steps, alternating; 1-minute load {min(loads):.1f} .. {max(loads):.1f})\n")
    print("| prompt | B | contiguous tokens/s | paged tokens/s | paged / contiguous |")
    print("|---:|---:|---:|---:|---:|")
    for prompt in prompts:
        for batch in batches:
            rate = {name: batch / statistics.median(results[(name, prompt, batch)]) * 1e3
                    for name in ("paged", "contiguous")}
            print(f"| {prompt} | {batch} | {rate['contiguous']:.1f} | {rate['paged']:.1f} | "
                  f"{rate['paged'] / rate['contiguous']:.3f} |")


# -- 4. sliding windows -----------------------------------------------------------


def windows(directory: Path, length: int, dtype: str, workers) -> None:
    shape = SHAPES["gemma-3-1b"]
    layers, window = 26, shape["sliding_window"]
    config = tiny_config("Gemma3ForCausalLM", num_hidden_layers=layers, sliding_window=window,
                         sliding_window_pattern=shape["sliding_window_pattern"],
                         max_position_embeddings=2 * length, vocab_size=512)
    start = time.perf_counter()
    model = models.load(write_checkpoint(directory / "gemma3", config), workers=workers,
                        dtype=dtype, max_seq_len=length + 8, cache=False)
    compiled = time.perf_counter() - start
    block = model.kv_block_size
    sliding = len(model.config.sliding_layers)
    full = layers - sliding
    engine = Engine(model, max_num_seqs=1, max_model_len=length + 8)
    pool = engine.cache.cache
    held = {}  # tokens generated -> (full layers' blocks, sliding layers' blocks)

    def record(output) -> None:
        held[output.num_tokens] = (pool.manager.used_blocks, pool.window_manager.used_blocks)

    # The prompt is length - 1 tokens: with the first new token computed
    # (the step that chooses the second), the cache holds `length` positions.
    prompt = np.random.default_rng(0).integers(3, 512, length - 1).tolist()
    engine.submit(prompt, max_new_tokens=3, ignore_eos=True, on_output=record)
    peak = 0
    start = time.perf_counter()
    while engine.step():
        if pool.window_manager.used_blocks:
            peak = max(peak, pool.window_manager.used_blocks)
    ran = time.perf_counter() - start
    full_blocks, sliding_blocks = held[2]
    # The goal, within a block per layer.
    assert 0 <= full_blocks * block - length < block, (full_blocks, length)
    assert 0 <= sliding_blocks * block - window <= block, (sliding_blocks, window)
    goal = full * length + sliding * window
    before = layers * length
    bf16 = 2 * shape["num_key_value_heads"] * shape["head_dim"] * 2  # K and V, bytes
    print(f"\n### Sliding windows: KV positions one request holds at {length:,} positions "
          f"(Gemma-3-1B's layers: {full} full + {sliding} sliding, window {window}; blocks "
          f"of {block}, steps of {model.max_step_tokens} tokens; compiled in "
          f"{compiled:.1f} s, ran in {ran:.1f} s; {load_average()})\n")
    print("| | full layers | sliding layers | layer-positions held | goal: full x length + "
          "sliding x window | held / goal | every layer x length | Gemma-3-1B bf16 KV held |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    total = full * full_blocks * block + sliding * sliding_blocks * block
    print(f"| at {length:,} positions | {full} x {full_blocks * block:,} | {sliding} x "
          f"{sliding_blocks * block:,} | {total:,} | {goal:,} | {total / goal:.3f} | "
          f"{before:,} ({before / total:.1f}x) | {total * bf16 / 2**20:.0f} MiB (not freed: "
          f"{before * bf16 / 2**20:.0f} MiB) |")
    print(f"| most while prefilling | — | {sliding} x {peak * block:,} | | | | | |")
    # What the engine's pool allocates (K and V arrays per layer).
    allocated = sum(array.shape[0] for array in pool.arrays.values()) // 2 * block
    every = layers * pool.num_blocks * block
    print(f"\nThe engine's pool (max_num_seqs 1, max_model_len {length + 8:,}) allocates "
          f"{allocated:,} layer-positions ({allocated * bf16 / 2**20:.0f} MiB at Gemma-3-1B's "
          f"bf16 KV); every layer at max_model_len: {every:,} ({every * bf16 / 2**20:.0f} MiB, "
          f"{every / allocated:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("f32", "bf16", "f16"))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--system", type=int, default=1000)
    parser.add_argument("--question", type=int, default=24)
    parser.add_argument("--memory", type=float, default=1.0, help="GiB of KV cache (capacity)")
    parser.add_argument("--length", type=int, default=500, help="positions per sequence")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--prompts", type=int, nargs="+", default=[256, 1024],
                        help="decode: prompt tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-length", type=int, default=8192,
                        help="sliding windows: positions the request reaches")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=("ttft", "capacity", "decode", "window"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"{load_average()}; dtype {args.dtype}")
    with tempfile.TemporaryDirectory() as tmp:
        if "window" not in args.skip:
            windows(Path(tmp), args.window_length, args.dtype, args.workers)
        if not {"ttft", "capacity", "decode"} - set(args.skip):
            return
        path = write_checkpoint(Path(tmp) / "small", tiny_config("Qwen3ForCausalLM", **SMALL))
        options = dict(workers=args.workers, dtype=args.dtype, max_seq_len=args.max_model_len,
                       cache=False)
        start = time.perf_counter()
        paged = models.load(path, **options)
        print(f"compiled the small model's paged step kernel (Qwen3-shaped, 4 layers, hidden "
              f"512) in {time.perf_counter() - start:.0f} s")
        if "ttft" not in args.skip:
            ttft(paged, args.system, args.question, args.rounds, rng)
        if "capacity" not in args.skip:
            capacity(paged, int(args.memory * 2**30), args.length, args.max_model_len,
                     paged.kv_block_size)
        if "decode" not in args.skip:
            contiguous = models.load(path, kv_block_size=None, **options)
            decode(paged, contiguous, args.batches, args.prompts, args.steps, args.rounds, rng)


if __name__ == "__main__":
    main()
