"""Decode-step throughput of an LLM on the CPU target, against llama.cpp and
Hugging Face transformers on the same weights, alone or beside a busy
process.

Models (random checkpoints written on the fly, or `--checkpoint DIR`):
  small  Qwen3-shaped: hidden 512, 4 layers, 8 query / 4 KV heads of 64, FFN
         1536, vocabulary 4096, tied embeddings (14.7 M parameters);
  smol   Llama-shaped like a 135 M chat model: hidden 576, 30 layers, 9
         query / 3 KV heads of 64, FFN 1536, vocabulary 49152, tied
         embeddings (134.5 M parameters);
  gemma3, qwen2.5, mistral, phi3  a family at a real model's per-layer
         shape (`FAMILIES`: Gemma-3-1B, Qwen2.5-0.5B, Mistral-7B, Phi-3-mini),
         with fewer layers than the real model where its bf16 weights would
         pass about 1.5 GB (`--layers` sets them; the default is in
         `FAMILIES`), written with `sharp` weights (etc.models.testing) so
         that a wrong model stands out of the rounding in `check_peer`.
For each batch size B, B prompts of `--prompt` tokens are prefilled, then
`--steps` decode steps (one new token per request) are timed: tokens per
second is B over the median step time. ETC runs `Model.step` (host
preparation and the NumPy outputs included). Peers (`--peer llama.cpp`,
`--peer transformers`) run in their own process under `--peer-python`
(bench/decode_peers.py; they are optional benchmark dependencies, see
docs/benchmarks.md), with as many threads as ETC has workers; llama.cpp
reads the same weights written as GGUF (every architecture but Llama's by
`write_family_gguf`, as model.gguf in the checkpoint directory unless one is
there), and before any timing `check_peer` compares its
logits with ETC's on a short sequence. Engines alternate over `--rounds`
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
  .venv/bin/python bench/llm_decode_cpu.py --model gemma3 --dtype bf16 \\
      --batches 1 8 --peer llama.cpp [--layers 6]
"""

from __future__ import annotations

import argparse
import json
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
from etc.models.loading.safetensors import SafetensorsFile
from etc.models.testing import shaped_config, tiny_config, write_checkpoint, write_gguf

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

#: Families at a real model's per-layer shape (a key of
#: etc.models.testing.SHAPES, or a config) and the layers they get by
#: default: about 1.5 GB of bf16 weights or fewer (the real models have
#: 26, 24, 32 and 32 layers).
FAMILIES = {
    # Two rounds of Gemma 3's pattern: 5 sliding-window layers, 1 global.
    "gemma3": ("gemma-3-1b", 12),
    "qwen2.5": ("qwen2.5-0.5b", 24),
    # Mistral-7B-v0.3's config.json (no window, vocabulary 32768).
    "mistral": (tiny_config("MistralForCausalLM", hidden_size=4096, intermediate_size=14336,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                            vocab_size=32768, max_position_embeddings=32768,
                            rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None), 2),
    "phi3": ("phi-3-mini-4k", 4),
}


def model_config(name: str, layers: int | None) -> dict:
    """The config.json of `--model name`, with `layers` layers if given."""
    if name in MODELS:
        architecture, shape = MODELS[name]
        config = tiny_config(architecture, **shape)
    else:
        shape, default = FAMILIES[name]
        config = shaped_config(shape, layers=default) if isinstance(shape, str) else \
            {**shape, "num_hidden_layers": default}
    if layers is not None:
        config["num_hidden_layers"] = layers
    return config


def write_family_gguf(directory: Path, config: dict) -> Path:
    """The checkpoint in `directory` as the GGUF file the llama.cpp peer
    loads (`model.gguf` beside it): `etc.models.testing.write_gguf`'s
    layout, llama.cpp's converter's (the `gguf` package's architecture,
    tensor names and metadata keys; Q and K rows permuted for Llama-style
    RoPE only, Mistral written as llama; Gemma's norms as 1 + w), the
    checkpoint's own bf16 values as BF16 matrices (norms and biases f32),
    and a placeholder vocabulary of the model's size (token ids go in
    directly)."""
    vocab = config["vocab_size"]
    files = [SafetensorsFile(f) for f in sorted(directory.glob("*.safetensors"))]
    tensors = {name: f.read(name, "f32") for f in files for name in f.keys()}
    metadata = {"tokenizer.ggml.model": "llama",
                "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(vocab)],
                "tokenizer.ggml.scores": [0.0] * vocab,
                "tokenizer.ggml.token_type": [1] * vocab,  # gguf.TokenType.NORMAL
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    return write_gguf(directory / "model.gguf", config, tensors=tensors, tensor_type="BF16",
                      metadata=metadata)


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

    def logits(self, ids: list, first: int) -> np.ndarray:
        """The peer's logits after each of `ids` from position `first` on."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "logits.npy"
            self.process.stdin.write(f"logits {path} {first} {' '.join(map(str, ids))}\n")
            self.process.stdin.flush()
            if self.process.stdout.readline().strip() != "ok":
                raise SystemExit(f"the {self.name} peer gave no logits")
            return np.load(path)

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


def check_peer(engine: ETC, peer: Peer, tokens: int = 12, first: int = 8) -> str:
    """Compares the peer's logits with ETC's after each token of a random
    sequence from position `first` - 1 on (ETC: a prefill of `first`
    tokens, then one token a step; the peer: one batch); raises SystemExit
    when they are not the same model's (correlation under 0.99, or fewer
    than half the greedy ids equal), else returns what it measured."""
    model = engine.model
    ids = np.random.default_rng(7).integers(0, model.config.vocab_size, tokens).tolist()
    cache = model.new_cache(1, tokens + 2)
    rows = [model.step(cache, [models.Request(0, 0, ids[:first])], return_logits=True)[0][0]]
    for position in range(first, tokens):
        rows.append(model.step(cache, [models.Request(0, position, [ids[position]])],
                               return_logits=True)[0][0])
    ours, theirs = np.stack(rows), peer.logits(ids, first - 1)
    if ours.shape != theirs.shape:
        raise SystemExit(f"{peer.name}: logits of shape {theirs.shape}, ETC's {ours.shape}")
    correlation = min(np.corrcoef(a, b)[0, 1] for a, b in zip(ours, theirs))
    greedy = np.mean(ours.argmax(1) == theirs.argmax(1))
    error = np.abs(ours - theirs).max() / ours.std()
    report = (f"{peer.name} against ETC, logits at positions {first - 1}-{tokens - 1}: "
              f"correlation >= {correlation:.5f}, greedy ids equal {greedy:.0%}, "
              f"max |difference| {error:.3f} logit standard deviations")
    if correlation < 0.99 or greedy < 0.5:
        raise SystemExit(f"not the same model: {report}")
    return report


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
    parser.add_argument("--model", default="small", choices=sorted(MODELS) + sorted(FAMILIES))
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the model (default: its own; FAMILIES')")
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
            if args.layers is not None and args.layers < 1:
                parser.error(f"--layers must be at least 1, not {args.layers}")
            config = model_config(args.model, args.layers)
            path = write_checkpoint(Path(tmp) / args.model, config, sharp=args.model in FAMILIES,
                                    dtype="BF16" if args.dtype == "bf16" else "F32")
        elif args.layers is not None:
            parser.error("--layers is for the random checkpoints, not --checkpoint")
        config = json.loads((path / "config.json").read_text())
        if "llama.cpp" in args.peer and not (path / "model.gguf").exists():
            start = time.perf_counter()
            write_family_gguf(path, config)
            print(f"wrote {path / 'model.gguf'} in {time.perf_counter() - start:.1f} s")
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
            if peer.name == "llama.cpp":
                print(check_peer(etc_engine, peer), flush=True)
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
