"""The quantized race: ETC's packed weights against llama.cpp on the same
quantized GGUF files (issue 33's goals).

Models: random-weight Llama-shaped checkpoints written as F32 GGUF files
with the `gguf` package (a byte-level BPE vocabulary of the model's size,
so both engines load the tokenizer), quantized by llama.cpp's own
quantizer (`llama_model_quantize`) to Q4_K_M and Q8_0:
  smol  SmolLM2-135M's shape: hidden 576, 30 layers, 9 / 3 heads of 64,
        FFN 1536, vocabulary 49152, tied embeddings;
  1b    Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 / 8 heads of 64,
        FFN 8192, vocabulary 128256, tied embeddings.

For each file, first the floor: the bytes a decode token reads (every
matrix, the tied embeddings as the LM head) over the memory bandwidth
measured here (2 threads reading a 1 GiB array), as tokens per second.
Then, with 2 threads each, engines alternating over `--rounds` rounds,
medians of all steps:
  decode tokens/s at B = 1, 2, 4, 8, 16 (B prompts of `--prompt` tokens,
    then `--steps` steps of one token each; ETC's `Model.step`);
  peak resident memory (VmHWM) of a fresh process that loads the file,
    prefills a prompt and decodes 16 tokens;
  warm start to first token: that process's time from its start to the
    first token (ETC's step kernel from a warm compile cache).
llama.cpp (llama-cpp-python, under `--peer-python`, bench/quant_peer.py)
runs with use_extra_bufts = False (--no-repack): its repacking and AMX
buffer types segfault on quantized files in the 0.3.36 build on this VM.

Usage:
  .venv/bin/python bench/quant_race.py --model smol --types Q8_0,Q4_K_M \\
      --peer-python /path/to/venv-with-llama-cpp/bin/python
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from llm_decode_cpu import ETC

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "smol": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                 max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=True),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
               max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=True),
}


def big_tokenizer(size: int, seed: int = 0):
    """A byte-level BPE `tokenizers.Tokenizer` of `size` tokens: the 256
    byte symbols and random merges of them (for files whose vocabulary
    must be the model's size; the text it gives does not matter)."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    rng = np.random.default_rng(seed)
    tokens = sorted(ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    while len(tokens) < size:
        a = tokens[rng.integers(len(tokens))]
        b = tokens[rng.integers(min(len(tokens), 2000))]
        if a + b in vocab or len(a + b) > 16:
            continue
        vocab[a + b] = len(tokens)
        tokens.append(a + b)
        merges.append((a, b))
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def bandwidth(threads: int = 2, size: int = 1 << 30) -> float:
    """Bytes per second `threads` threads read (NumPy sums of their share
    of a `size`-byte array; the best of 5)."""
    data = np.ones(size // 4, np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return size / best


def bytes_per_token(path: Path) -> int:
    """What a decode token reads of a GGUF file: every matrix but the
    token embeddings (one row), which tied embeddings read whole as the
    LM head."""
    from etc.models.loading.gguf_file import GGUFFile

    tensors = GGUFFile(path).tensors
    tied = "output.weight" not in tensors
    return sum(t.nbytes for name, t in tensors.items()
               if len(t.shape) == 2 and (name != "token_embd.weight" or tied))


def write_files(directory: Path, model: str, types: list, python: str) -> dict:
    """The model's F32 file and its quantizations (written once)."""
    from etc.models.testing import tiny_config, write_gguf

    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{model}-F32.gguf"
    if not source.exists():
        config = tiny_config("LlamaForCausalLM", **MODELS[model])
        write_gguf(source, config, tokenizer=big_tokenizer(config["vocab_size"]), pre="smollm",
                   bos_token=None, eos_token=None)
    files = {}
    for kind in types:
        target = directory / f"{model}-{kind}.gguf"
        if not target.exists():
            subprocess.run([python, str(ROOT / "bench" / "quant_peer.py"), "quantize",
                            str(source), str(target), kind], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        files[kind] = target
    return files


ETC_FIRST = """
import sys, time
import numpy as np
import etc.models as models
path, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = models.load(path, workers=threads, max_seq_len=256)
ids = np.random.default_rng(1).integers(0, model.config.vocab_size, prompt).tolist()
cache = model.new_cache(1, prompt + 20)
_, next_ids = model.step(cache, [models.Request(0, 0, ids)])
print("first", flush=True)
for step in range(16):
    _, next_ids = model.step(cache, [models.Request(0, prompt + step, [int(next_ids[0])])])
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print("rss", int(line.split()[1]) * 1024, flush=True)
"""

def run_first(command: list) -> tuple[float, int]:
    """(seconds from the process's start to its "first" line, its peak
    resident bytes or 0)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    first, peak = None, 0
    for line in process.stdout:
        if line.startswith("first") and first is None:
            first = time.perf_counter() - start
        elif line.startswith("rss"):
            peak = int(line.split()[1])
    if process.wait() != 0 or first is None:
        raise SystemExit(f"{command[:3]} failed")
    return first, peak


class Peer:
    """bench/quant_peer.py's `serve` in its own process."""

    name = "llama.cpp"

    def __init__(self, python: str, path: Path, threads: int):
        self.process = subprocess.Popen(
            [python, str(ROOT / "bench" / "quant_peer.py"), "serve", str(path), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline().split(maxsplit=1)
        if not line or line[0] != "ready":
            raise SystemExit(f"the llama.cpp peer did not start under {python}")
        self.version = line[1].strip()

    def ask(self, command: str) -> list:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().split()

    def decode_ms(self, batch: int, prompt: int, steps: int) -> list:
        return [float(w) for w in self.ask(f"decode {batch} {prompt} {steps}")[1:]]

    def close(self) -> None:
        self.ask("quit")
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="smol")
    parser.add_argument("--types", default="Q8_0,Q4_K_M")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-python", required=True)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/etc-quant-race"))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at start")
    speed = bandwidth(args.threads)
    print(f"floor: memory bandwidth {speed / 1e9:.1f} GB/s ({args.threads} threads reading "
          f"1 GiB)")
    files = write_files(args.dir, args.model, args.types.split(","), args.peer_python)
    for kind, path in files.items():
        size, read = path.stat().st_size, bytes_per_token(path)
        print(f"\n{args.model} {kind}: file {size / 1e6:.1f} MB, {read / 1e6:.1f} MB per token: "
              f"floor {speed / read:.0f} tok/s at B = 1")
        # Warm the compile cache, then the fresh processes.
        etc_first = [sys.executable, "-c", ETC_FIRST, str(path), str(args.threads),
                     str(args.prompt)]
        run_first(etc_first)
        peer_first = [args.peer_python, str(ROOT / "bench" / "quant_peer.py"), "first",
                      str(path), str(args.threads), str(args.prompt)]
        starts = {"ETC": [], "llama.cpp": []}
        peaks = {"ETC": 0, "llama.cpp": 0}
        for _ in range(args.rounds):
            for name, command in (("ETC", etc_first), ("llama.cpp", peer_first)):
                first, peak = run_first(command)
                starts[name].append(first)
                peaks[name] = max(peaks[name], peak)
        engines = [ETC(path, args.threads, "auto", "f32", 256),
                   Peer(args.peer_python, path, args.threads)]
        results: dict = {}
        for _ in range(args.rounds):
            for batch in batches:
                for engine in engines:
                    time.sleep(0.2)
                    results.setdefault((engine.name, batch), []).extend(
                        engine.decode_ms(batch, args.prompt, args.steps))
        engines[1].close()
        print(f"{'B':>3} {'ETC tok/s':>10} {'llama.cpp':>10} {'ratio':>6}")
        for batch in batches:
            ours = batch * 1e3 / statistics.median(results[("ETC", batch)])
            theirs = batch * 1e3 / statistics.median(results[("llama.cpp", batch)])
            print(f"{batch:>3} {ours:>10.1f} {theirs:>10.1f} {ours / theirs:>6.2f}")
        print(f"peak memory of a process that loads the file and decodes 16 tokens: ETC "
              f"{peaks['ETC'] / 1e6:.0f} MB, llama.cpp {peaks['llama.cpp'] / 1e6:.0f} MB (ratio "
              f"{peaks['ETC'] / max(peaks['llama.cpp'], 1):.2f})")
        ours, theirs = statistics.median(starts["ETC"]), statistics.median(starts["llama.cpp"])
        print(f"warm start to first token: ETC {ours:.2f} s, llama.cpp {theirs:.2f} s (ratio "
              f"{ours / theirs:.2f})")
    print(f"\nload at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
