"""The prefill of one long prompt from a quantized GGUF file, on the CPU.

A random-weight checkpoint at Llama-3.2-1B's per-layer shape (`--layers`
of its 16 layers; hidden 2048, FFN 8192, vocabulary 128256) is written as
GGUF (`etc.models.testing.write_gguf`) in each of `--types`: Q8_0, and
Q4_K_M as llama.cpp's quantizer mixes it (Q4_K, with Q6_K for every
layer's attn_v and ffn_down; llama.cpp gives Q6_K to half of those, and to
the output matrix), into `--dir` unless the files are there. Each is
loaded (`etc.models.load`, 2 workers) and prefills a new random prompt of
`--prompt` tokens to its first token (`Model.generate(prompts, 1)`, as
`bench/llm_decode_cpu.py --prefill` times it) `--runs` times after one
untimed run: wall and process CPU milliseconds per run.

Usage: .venv/bin/python bench/quant_prefill.py [--types Q4_K_M,Q8_0]
       [--layers 4] [--prompt 486] [--runs 3] [--dir /tmp/etc-quant-prefill]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from etc import models
from etc.models.testing import shaped_config, write_gguf

TYPES = ("Q4_K_M", "Q8_0")


def write(path: Path, kind: str, layers: int) -> None:
    config = shaped_config("llama-3.2-1b", layers=layers)
    if kind == "Q4_K_M":
        six = {f"blk.{i}.{t}.weight": "Q6_K" for i in range(layers)
               for t in ("attn_v", "ffn_down")}
        write_gguf(path, config, tensor_type="Q4_K", fallback_type="Q5_0", tensor_types=six)
    else:
        write_gguf(path, config, tensor_type=kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=486)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/etc-quant-prefill"))
    args = parser.parse_args()
    kinds = args.types.split(",")
    for kind in kinds:
        if kind not in TYPES:
            parser.error(f"--types: {kind!r} is not one of {', '.join(TYPES)}")
    if args.layers < 1 or args.prompt < 1 or args.runs < 1 or args.workers < 1:
        parser.error("--layers, --prompt, --runs and --workers must be positive")
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    for kind in kinds:
        path = args.dir / f"llama-1b-{args.layers}-layers-{kind}.gguf"
        if not path.exists():
            write(path, kind, args.layers)
        model = models.load(path, workers=args.workers, max_seq_len=args.prompt + 16,
                            max_step_tokens=256)
        rng = np.random.default_rng()
        times = []
        for run in range(args.runs + 1):
            prompt = rng.integers(0, model.config.vocab_size, args.prompt).tolist()
            wall, cpu = time.perf_counter(), time.process_time()
            model.generate([prompt], 1)
            if run:
                times.append(((time.perf_counter() - wall) * 1e3,
                              (time.process_time() - cpu) * 1e3))
        print(f"{kind}: {path.stat().st_size / 1e6:.1f} MB, prefill of {args.prompt} tokens, "
              "ms wall / CPU: " + ", ".join(f"{w:.0f} / {c:.0f}" for w, c in times), flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
