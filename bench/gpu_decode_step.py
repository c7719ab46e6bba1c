"""Decode-step time of a small LLM on an NVIDIA GPU: ETC's step megakernel
against the same model in PyTorch eager and as a CUDA graph (needs a GPU,
its driver and cuda-python; PyTorch and transformers for the baselines;
without a GPU it says so and exits 0).

The model is the random Qwen3-shaped checkpoint of bench/llm_decode_cpu.py
(or `--checkpoint DIR`). For B = 1, 2, 4, ..., 64 requests, each with a
prompt of `--prompt` tokens already in the KV cache, one decode step (B new
tokens) is timed on the device with CUDA events, median of `--repeats`:

* ETC: the step kernel bound once to device weights and caches
  (`CUDARuntime.bind`), then `_init` + the persistent worker enqueued per
  step; static and dynamic schedules, one compile each for every B;
* PyTorch eager: one forward pass of B tokens with a dynamic KV cache;
* CUDA graph: the same forward pass over a static KV cache, captured once
  per B and replayed (the honest baseline of design.md).

Prints a Markdown table (paste into docs/benchmarks.md with date and GPU).
Usage: .venv/bin/python bench/gpu_decode_step.py [--repeats 50] [--prompt 128]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import etc.models as models
from etc.models.testing import tiny_config, write_checkpoint
from etc.runtime.cuda import _driver, cuda_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_megakernel import Timer, device_chip  # noqa: E402
from llm_decode_cpu import SMALL  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def etc_decode(model, timer, batch: int, prompt: int) -> float:
    """Median ms of one decode step of `batch` requests on the device."""
    rng = np.random.default_rng(batch)
    cache = model.new_cache(batch, prompt + 2)
    vocab = model.config.vocab_size
    _, next_ids = model.step(cache, [models.Request(r, 0, rng.integers(0, vocab, prompt).tolist())
                                     for r in range(batch)])
    inputs = model.step_inputs(cache, [models.Request(r, prompt, [int(next_ids[r])])
                                       for r in range(batch)])
    # Every step rewrites the same cache row: the work of a decode step at
    # position `prompt`, repeated.
    launch = model.kernels[0].runtime.bind(inputs)
    return timer(launch.enqueue)


def torch_decode(path: Path, batch: int, prompt: int, repeats: int) -> tuple:
    """(eager ms, CUDA-graph ms, note) for one decode step in PyTorch."""
    try:
        import torch
        import transformers
    except ImportError as error:
        return None, None, f"not installed ({error.name})"
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(step) -> float:
        for _ in range(5):
            step()
        times = []
        for _ in range(repeats):
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times))

    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        length = past.get_seq_length()

        def eager():
            # Drop the token appended by the previous call, so every step
            # attends to `prompt` cached positions.
            past.crop(length)
            model(token, past_key_values=past, use_cache=True)
        eager_ms = timed(eager)

        graph_ms, note = None, f"transformers {transformers.__version__}"
        try:
            static = transformers.StaticCache(config=model.config, max_cache_len=prompt + 1)
        except TypeError:
            static = transformers.StaticCache(model.config, batch, prompt + 1, "cuda",
                                              torch.float32)
        try:
            model(ids, past_key_values=static, use_cache=True,
                  cache_position=torch.arange(prompt, device="cuda"))
            position = torch.tensor([prompt], device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(token, past_key_values=static, cache_position=position)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(token, past_key_values=static, cache_position=position)
            graph_ms = timed(graph.replay)
        except Exception as error:  # the baseline is best effort across versions
            note += f"; CUDA graph capture failed: {type(error).__name__}: {error}"
    return eager_ms, graph_ms, note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--checkpoint", type=Path, default=None)
    args = parser.parse_args()
    if not cuda_available():
        print("bench/gpu_decode_step.py needs an NVIDIA GPU, its driver and cuda-python; none "
              "is available here, nothing to measure.")
        return 0
    driver = _driver()
    chip, name = device_chip(driver)
    timer = Timer(driver, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or write_checkpoint(
            Path(tmp) / "small", tiny_config("Qwen3ForCausalLM", **SMALL))
        compiled = {s: models.load(path, target="cuda", chip=chip, schedule=s,
                                   max_seq_len=args.prompt + 8)
                    for s in ("static", "dynamic")}
        print(f"GPU: {name} ({chip}); {compiled['static']}; prompt {args.prompt} tokens in the "
              f"cache; median of {args.repeats} steps\n")
        print("| B | ETC static ms | ETC dynamic ms | PyTorch eager ms | PyTorch CUDA graph ms |")
        print("|---:|---:|---:|---:|---:|")
        note = ""
        for batch in args.batches:
            cells = [f"{etc_decode(compiled[s], timer, batch, args.prompt):.3f}"
                     for s in ("static", "dynamic")]
            eager, graph, note = torch_decode(path, batch, args.prompt, args.repeats)
            cells += [f"{eager:.3f}" if eager else "n/a", f"{graph:.3f}" if graph else "n/a"]
            print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)
        print(f"\nPyTorch: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
