"""Decode-step throughput of an LLM on the CPU target, against llama.cpp and
Hugging Face transformers on the same weights, alone or beside a busy
process.

Models (random checkpoints written on the fly, or `--checkpoint DIR`):
  small  Qwen3-shaped: hidden 512, 4 layers, 8 query / 4 KV heads of 64, FFN
         1536, vocabulary 4096, tied embeddings (14.7 M parameters);
  smol   Llama-shaped like a 135 M chat model: hidden 576, 30 layers, 9
         query / 3 KV heads of 64, FFN 1536, vocabulary 49152, tied
         embeddings (134.5 M parameters).
For each batch size B, B prompts of `--prompt` tokens are prefilled, then
`--steps` decode steps (one new token per request) are timed: tokens per
second is B over the median step time. ETC runs `Model.step` (host
preparation and the NumPy outputs included). Peers (`--peer llama.cpp`,
`--peer transformers`) run in their own process under `--peer-python`
(bench/decode_peers.py; they are optional benchmark dependencies, see
docs/benchmarks.md), with as many threads as ETC has workers; llama.cpp
reads the same weights written as GGUF. Engines alternate over `--rounds`
rounds, and each cell is the median over all rounds' steps.

`--contention` measures every engine alone and beside a busy process (a
Python loop on one core), and ETC with one worker too, and prints the ratios
the CPU runtime's goals are stated in.

`--prefill` times the prefill instead: B new random prompts of `--prompt`
tokens each run (none cached), to the first token (ETC:
`Model.generate(prompts, 1)`, in steps of at most `--max-step-tokens`,
after an untimed run that builds its workspace; llama.cpp: one
`llama_decode` of the prompts in a new context, the last tokens' logits
asked for; transformers: one forward pass keeping the last logits),
`--steps` runs per round; the table gives ms per prefill (median) and
tokens/s.

Usage:
  .venv/bin/python bench/llm_decode_cpu.py --model smol --dtype bf16 \\
      --batches 1 --peer llama.cpp [--contention]
  .venv/bin/python bench/llm_decode_cpu.py --model smol --dtype bf16 --prefill \\
      --prompt 486 --batches 1 --steps 3 --peer llama.cpp
"""

from __future__ import annotations

import argparse
import os
import re
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import etc
import etc.models as models
from etc.models.testing import tiny_config, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "small": ("Qwen3ForCausalLM",
              dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096,
                   max_position_embeddings=512)),
    "smol": ("LlamaForCausalLM",
             dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                  max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=True)),
}

#: A process that keeps one core busy.
BUSY = "while True: pass\n"


class ETC:
    name = "ETC"

    def __init__(self, path: Path, workers: int, schedule: str, dtype: str, max_seq_len: int,
                 max_step_tokens: int = 256):
        start = time.perf_counter()
        self.model = models.load(path, workers=workers, schedule=schedule, dtype=dtype,
                                 max_seq_len=max_seq_len, max_step_tokens=max_step_tokens)
        self.compile_seconds = time.perf_counter() - start
        self.workers = workers

    def prefill_ms(self, batch: int, prompt: int, runs: int) -> list[float]:
        """The first run untimed (it builds the workspace of these sizes);
        new random prompts every run, so that no prefix is in the paged
        cache already."""
        rng = np.random.default_rng()
        times = []
        for run in range(runs + 1):
            prompts = [rng.integers(0, self.model.config.vocab_size, prompt).tolist()
                       for _ in range(batch)]
            start = time.perf_counter()
            self.model.generate(prompts, 1)
            if run:
                times.append((time.perf_counter() - start) * 1e3)
        return times

    def decode_ms(self, batch: int, prompt: int, steps: int) -> list[float]:
        model = self.model
        rng = np.random.default_rng(batch)
        cache = model.new_cache(batch, prompt + steps + 2)
        requests = [models.Request(r, 0, rng.integers(0, model.config.vocab_size,
                                                      prompt).tolist())
                    for r in range(batch)]
        _, next_ids = model.step(cache, requests)
        times = []
        for step in range(steps):
            requests = [models.Request(r, prompt + step, [int(next_ids[r])])
                        for r in range(batch)]
            start = time.perf_counter()
            _, next_ids = model.step(cache, requests)
            times.append((time.perf_counter() - start) * 1e3)
        return times


class Peer:
    """An engine of bench/decode_peers.py in its own process."""

    def __init__(self, engine: str, python: str, path: Path, threads: int,
                 verbose: bool = False):
        self.name = engine
        self.process = subprocess.Popen(
            [python, str(ROOT / "bench" / "decode_peers.py"), engine, str(path), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=None if verbose else subprocess.DEVNULL)
        line = self.process.stdout.readline().split(maxsplit=1)
        if not line or line[0] != "ready":
            raise SystemExit(f"the {engine} peer did not start (is it installed for "
                             f"{python}? see docs/benchmarks.md)")
        self.version = line[1].strip()

    def decode_ms(self, batch: int, prompt: int, steps: int) -> list[float]:
        return self._ask("decode", batch, prompt, steps)

    def prefill_ms(self, batch: int, prompt: int, runs: int) -> list[float]:
        return self._ask("prefill", batch, prompt, runs)

    def _ask(self, command: str, batch: int, prompt: int, count: int) -> list[float]:
        self.process.stdin.write(f"{command} {batch} {prompt} {count}\n")
        self.process.stdin.flush()
        words = self.process.stdout.readline().split()
        if not words or words[0] != "ms":
            raise SystemExit(f"the {self.name} peer failed")
        return [float(w) for w in words[1:]]

    def close(self) -> None:
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
        except OSError:
            pass
        self.process.wait(timeout=60)


def measure(engines, batches, prompt, steps, rounds, rest, prefill=False) -> dict:
    """{(engine name, B): [step (or prefill) ms over all rounds]}, engines
    alternating."""
    results: dict = {}
    for _ in range(rounds):
        for batch in batches:
            for engine in engines:
                time.sleep(rest)  # other engines' threads stop spinning
                run = engine.prefill_ms if prefill else engine.decode_ms
                results.setdefault((engine.name, batch), []).extend(run(batch, prompt, steps))
    return results


def tokens_per_second(results, name, batch) -> float:
    return batch / statistics.median(results[(name, batch)]) * 1e3


def family(task: str) -> str:
    """The operator family of a task name ("attention_3_chunk" ->
    "attention_chunk")."""
    return re.sub(r"_\d+", "", task)


def trace_step(engine: ETC, batch: int, prompt: int, steps: int, schedule: str) -> None:
    """Compiles the step graph again with trace=True, runs `steps` decode
    steps and prints where the workers' time goes, per operator family."""
    model = engine.model
    kernel = etc.compile(model.graph, target="cpu", schedule=schedule, workers=engine.workers,
                         trace=True)
    rng = np.random.default_rng(batch)
    cache = model.new_cache(batch, prompt + steps + 2)
    requests = [models.Request(r, 0, rng.integers(0, model.config.vocab_size, prompt).tolist())
                for r in range(batch)]
    _, next_ids, *_ = kernel.run(**model.step_inputs(cache, requests))
    busy: dict = {}
    idle: dict = {}
    spans, tiles = [], []
    for step in range(steps):
        requests = [models.Request(r, prompt + step, [int(next_ids[r])]) for r in range(batch)]
        _, next_ids, *_ = kernel.run(**model.step_inputs(cache, requests))
        events = kernel.runtime.trace.events
        spans.append(max(e.end for e in events) - min(e.start for e in events))
        tiles.append(len(events))
        for e in events:
            busy[family(e.task)] = busy.get(family(e.task), 0) + e.duration
        # A worker's idle time before a tile is charged to the tile's family:
        # it waited there for the tiles that family depends on.
        last_end: dict = {}
        for e in events:
            if e.worker in last_end:
                gap = max(0, e.start - last_end[e.worker])
                idle[family(e.task)] = idle.get(family(e.task), 0) + gap
            last_end[e.worker] = max(last_end.get(e.worker, 0), e.end)
    span = statistics.median(spans) / 1e3
    total = sum(busy.values()) / steps / 1e3
    print(f"\ntrace of a decode step at B = {batch} ({engine.workers} workers, median of {steps} "
          f"steps): {span:.0f} us from the first tile's start to the last tile's end, "
          f"{tiles[0]} tile tasks; workers busy {total:.0f} us of "
          f"{span * engine.workers:.0f} us\n")
    print("| operator family | us per step (all workers) | share of busy time "
          "| idle us before its tiles |")
    print("|---|---:|---:|---:|")
    for name, ns in sorted(busy.items(), key=lambda item: -item[1]):
        print(f"| {name} | {ns / steps / 1e3:.0f} | {ns / sum(busy.values()):.1%} "
              f"| {idle.get(name, 0) / steps / 1e3:.0f} |")


def print_prefill(results, names, peers, batches, prompt) -> None:
    """Median ms per prefill of each engine, prompt tokens per second, and
    ETC's speed over each peer's."""
    for condition, result in results.items():
        print(f"{condition}, prefill of B prompts of {prompt} tokens:\n")
        print("| B | " + " | ".join(f"{n} ms | {n} tok/s" for n in names)
              + "".join(f" | ETC / {p.name} speed" for p in peers) + " |")
        print("|---:|" + "---:|---:|" * len(names) + "---:|" * len(peers))
        for batch in batches:
            ms = {n: statistics.median(result[(n, batch)]) for n in names}
            cells = " | ".join(f"{ms[n]:.1f} | {batch * prompt / ms[n] * 1e3:.0f}"
                               for n in names)
            versus = "".join(f" | {ms[p.name] / ms['ETC']:.2f}x" for p in peers)
            print(f"| {batch} | {cells}{versus} |")
        print()


def load_average() -> str:
    """The load average and the memory bandwidth a NumPy sum of 256 MB
    reaches now: a decode step at B = 1 reads every weight once, so its
    floor is bytes per token over this bandwidth."""
    data = np.ones(64 * 2**20, np.float32)
    data.sum()
    start = time.perf_counter()
    for _ in range(3):
        data.sum()
    bandwidth = 3 * data.nbytes / (time.perf_counter() - start) / 1e9
    return ("load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
            + f"; NumPy read bandwidth {bandwidth:.1f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--schedule", default="auto", choices=("auto", "static", "dynamic"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest", type=float, default=0.5,
                        help="seconds between engines' measurements")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--peer", action="append", default=[],
                        choices=("llama.cpp", "transformers"))
    default_peer_python = ROOT / ".venv-peer" / "bin" / "python"
    parser.add_argument("--peer-python", default=str(default_peer_python)
                        if default_peer_python.exists() else sys.executable)
    parser.add_argument("--contention", action="store_true",
                        help="also measure beside a busy process, and ETC with one worker")
    parser.add_argument("--verbose", action="store_true", help="show the peers' logs")
    parser.add_argument("--trace", action="store_true",
                        help="print where a decode step's time goes, per operator family")
    parser.add_argument("--prefill", action="store_true",
                        help="time the prefill of the prompts instead of decode steps")
    parser.add_argument("--max-step-tokens", type=int, default=256,
                        help="ETC's tokens per step (a longer prefill takes several)")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; machine: {platform.machine()}, "
          f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}; "
          f"{load_average()}")
    print(f"command: {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            architecture, shape = MODELS[args.model]
            path = write_checkpoint(Path(tmp) / args.model, tiny_config(architecture, **shape),
                                    dtype="BF16" if args.dtype == "bf16" else "F32")
        max_seq_len = args.prompt + args.steps + 8
        etc_engine = ETC(path, args.workers, args.schedule, args.dtype, max_seq_len,
                         args.max_step_tokens)
        weight_bytes = sum(w.nbytes for w in etc_engine.model._weights.values())
        print(f"{etc_engine.model}: {etc_engine.model.num_parameters / 1e6:.1f} M parameters "
              f"({weight_bytes / 1e6:.0f} MB read per decode step at B = 1), "
              f"{args.workers} workers, compiled in {etc_engine.compile_seconds:.1f} s")
        if args.trace:
            trace_step(etc_engine, args.batches[0], args.prompt, args.steps, args.schedule)
        engines = [etc_engine]
        single = None
        if args.contention and args.workers > 1:
            single = ETC(path, 1, args.schedule, args.dtype, max_seq_len, args.max_step_tokens)
            single.name = "ETC 1 worker"
            engines.append(single)
        peers = [Peer(p, args.peer_python, path, args.workers, args.verbose) for p in args.peer]
        engines += peers
        for peer in peers:
            print(f"{peer.name}: {peer.version}, {args.workers} threads")
        try:
            conditions = [("alone", None)]
            if args.contention:
                conditions.append(("busy", BUSY))
            results = {}
            for condition, program in conditions:
                busy = subprocess.Popen([sys.executable, "-c", program]) if program else None
                try:
                    if busy:
                        time.sleep(1.0)
                    print(f"\n{condition}: {load_average()}", flush=True)
                    results[condition] = measure(engines, args.batches, args.prompt,
                                                 args.steps, args.rounds, args.rest,
                                                 args.prefill)
                finally:
                    if busy:
                        busy.kill()
                        busy.wait()
        finally:
            for peer in peers:
                peer.close()
    print()
    names = [e.name for e in engines]
    if args.prefill:
        print_prefill(results, names, peers, args.batches, args.prompt)
        return
    header = " | ".join(f"{n} tok/s" for n in names)
    ratios = " | ".join(f"ETC / {p.name}" for p in peers)
    for condition, result in results.items():
        print(f"{condition}:\n")
        print(f"| B | {header} |{' ' + ratios + ' |' if ratios else ''}")
        print("|---:|" + "---:|" * (len(names) + len(peers)))
        for batch in args.batches:
            speeds = {n: tokens_per_second(result, n, batch) for n in names}
            cells = " | ".join(f"{speeds[n]:.1f}" for n in names)
            versus = " | ".join(f"{speeds['ETC'] / speeds[p.name]:.2f}" for p in peers)
            print(f"| {batch} | {cells} |{' ' + versus + ' |' if versus else ''}")
        print()
    if args.contention:
        print("beside a busy process / alone (same engine):\n")
        print("| B | " + " | ".join(names) + " | ETC busy / ETC 1 worker busy |")
        print("|---:|" + "---:|" * (len(names) + 1))
        for batch in args.batches:
            alone = {n: tokens_per_second(results["alone"], n, batch) for n in names}
            busy = {n: tokens_per_second(results["busy"], n, batch) for n in names}
            cells = " | ".join(f"{busy[n] / alone[n]:.2f}" for n in names)
            one = f"{busy['ETC'] / busy['ETC 1 worker']:.2f}" if single else "n/a"
            print(f"| {batch} | {cells} | {one} |")


if __name__ == "__main__":
    main()
