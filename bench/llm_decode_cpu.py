"""Decode-step throughput of a small LLM on the CPU target, against Hugging
Face transformers (PyTorch, CPU) on the same checkpoint when installed.

The model is a random Qwen3-shaped checkpoint written on the fly (hidden
512, 4 layers, 8 query / 4 KV heads of 64, FFN 1536, vocabulary 4096, tied
embeddings: 14.7 M parameters, 59 MB of float32 weights), or
`--checkpoint DIR`. For each
batch size B, B prompts of `--prompt` tokens are prefilled, then decode
steps (one new token per request) are timed: median ms per step and tokens
per second (B / step time). ETC runs the step kernel through `Model.step`
(host preparation and the NumPy outputs included); transformers runs one
forward pass of B tokens with its KV cache under `torch.no_grad()`, with as
many threads as ETC has workers (`--torch-threads`). Prints a Markdown
table. On a machine shared with other work, PyTorch's spinning threads
make its times vary widely; compare medians of quiet runs.

Usage: .venv/bin/python bench/llm_decode_cpu.py [--workers 2] [--batches 1 4 16]
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
from etc.models.testing import tiny_config, write_checkpoint

SMALL = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=4096,
             max_position_embeddings=512)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def etc_decode_ms(model, batch: int, prompt: int, repeats: int) -> float:
    """ms per decode step of `batch` requests after prompts of `prompt` tokens."""
    rng = np.random.default_rng(batch)
    cache = model.new_cache(batch, prompt + repeats + 2)
    requests = [models.Request(r, 0, rng.integers(0, model.config.vocab_size, prompt).tolist())
                for r in range(batch)]
    _, next_ids = model.step(cache, requests)
    position = [prompt]

    def decode():
        nonlocal next_ids
        _, next_ids = model.step(cache, [models.Request(r, position[0], [int(next_ids[r])])
                                         for r in range(batch)])
        position[0] += 1
    return median_ms(decode, repeats)


def transformers_decode_ms(path: Path, batch: int, prompt: int, repeats: int, threads: int):
    try:
        import torch
        import transformers
    except ImportError as error:
        return None, f"not installed ({error.name})"
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    rng = np.random.default_rng(batch)
    ids = torch.tensor(rng.integers(0, model.config.vocab_size, (batch, prompt)))
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past = out.past_key_values
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)

        def decode():
            nonlocal past, next_ids
            step = model(next_ids, past_key_values=past, use_cache=True)
            past = step.past_key_values
            next_ids = step.logits[:, -1].argmax(-1, keepdim=True)
        return median_ms(decode, repeats), f"transformers {transformers.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--schedule", default="auto", choices=("auto", "static", "dynamic"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="PyTorch's threads (default: --workers)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
          f"Python {platform.python_version()}; workers={args.workers}, "
          f"schedule={args.schedule}, median of {args.repeats} steps")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or write_checkpoint(
            Path(tmp) / "small", tiny_config("Qwen3ForCausalLM", **SMALL))
        start = time.perf_counter()
        model = models.load(path, workers=args.workers, schedule=args.schedule,
                            max_seq_len=args.prompt + args.repeats + 8)
        print(f"{model}: {model.num_parameters / 1e6:.1f} M parameters, compiled in "
              f"{time.perf_counter() - start:.2f} s\n")
        print("| B | ETC ms/step | ETC tokens/s | transformers ms/step | transformers tokens/s "
              "| ETC speed-up |")
        print("|---:|---:|---:|---:|---:|---:|")
        note = ""
        for batch in args.batches:
            etc_ms = etc_decode_ms(model, batch, args.prompt, args.repeats)
            hf_ms, note = transformers_decode_ms(path, batch, args.prompt, args.repeats,
                                                 args.torch_threads or args.workers)
            hf_cells = (f"{hf_ms:.2f} | {batch / hf_ms * 1e3:.0f} | {hf_ms / etc_ms:.2f}x"
                        if hf_ms else "n/a | n/a | n/a")
            print(f"| {batch} | {etc_ms:.2f} | {batch / etc_ms * 1e3:.0f} | {hf_cells} |",
                  flush=True)
        print(f"\ntransformers: {note}")


if __name__ == "__main__":
    main()
