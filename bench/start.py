"""Cold and warm start to the first token: `etc.models.load` then one
generated token, in a fresh process each time, with an empty compile cache
(cold: the step kernel compiles) and with the kernel in the cache (warm).

    .venv/bin/python bench/start.py --model small --rounds 3

Rounds alternate cold and warm so that the machine's load hits both alike.
Prints a table of medians: the time from `load` to the first token, split
into reading the weights, compiling or loading the kernel, and the first
step (a 16-token prompt's prefill); the whole process (Python and imports
included); and warm/cold ratios. Random checkpoints are written first
(no downloads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from etc.models.testing import tiny_config, write_checkpoint

#: Model shapes: the test suite's tiny model, a small one, and SmolLM2-135M's
#: shape (Llama, 30 layers of 576, vocabulary 49152; random weights).
MODELS = {
    "tiny": tiny_config("Qwen3ForCausalLM"),
    "small": tiny_config("Qwen3ForCausalLM", hidden_size=256, intermediate_size=768,
                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         head_dim=32, vocab_size=8192, max_position_embeddings=1024),
    "smollm2-135m": tiny_config("LlamaForCausalLM", hidden_size=576, intermediate_size=1536,
                                num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                max_position_embeddings=2048, tie_word_embeddings=True),
}

_CHILD = textwrap.dedent("""
    import json, sys, time
    import etc.models as models
    start = time.perf_counter()
    model = models.load(sys.argv[1], cache=sys.argv[2], max_seq_len=int(sys.argv[3]))
    loaded = time.perf_counter()
    cache = model.new_cache(1, 32)
    model.step(cache, [models.Request(0, 0, list(range(1, 17)))])
    first = time.perf_counter()
    print(json.dumps({"source": model.kernel_source, "timings": model.timings,
                      "first_step": first - loaded, "load_to_first": first - start}))
""")


def _round(path: Path, cache: Path, max_seq_len: int) -> dict:
    started = time.time()
    env = dict(os.environ, ETC_CACHE="1")
    result = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(cache),
                             str(max_seq_len)], capture_output=True, text=True, env=env,
                            timeout=1800)
    if result.returncode:
        raise SystemExit(result.stderr)
    data = json.loads(result.stdout.splitlines()[-1])
    data["process"] = time.time() - started
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), action="append",
                        help="model shapes (repeatable; default: tiny and small)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-seq-len", type=int, default=256)
    args = parser.parse_args()
    names = args.model or ["tiny", "small"]
    print(f"load average: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print("| model | start | load -> first token (s) | weights (s) | kernel (s) | "
          "first step (s) | process (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="etc-start-") as root:
        root = Path(root)
        for name in names:
            path = write_checkpoint(root / name, MODELS[name])
            cache = root / f"cache-{name}"
            rows = {"cold": [], "warm": []}
            for _ in range(args.rounds):
                shutil.rmtree(cache, ignore_errors=True)
                cold = _round(path, cache, args.max_seq_len)
                assert cold["source"] == "compiled", cold
                warm = _round(path, cache, args.max_seq_len)
                assert warm["source"] == "cache", warm
                rows["cold"].append(cold)
                rows["warm"].append(warm)
            medians = {}
            for kind, runs in rows.items():
                m = lambda f: statistics.median(f(r) for r in runs)  # noqa: E731
                medians[kind] = m(lambda r: r["load_to_first"])
                kernel = m(lambda r: r["timings"].get("compile", r["timings"].get("cache", 0)))
                print(f"| {name} | {kind} | {medians[kind]:.3f} | "
                      f"{m(lambda r: r['timings']['weights']):.3f} | {kernel:.3f} | "
                      f"{m(lambda r: r['first_step']):.3f} | {m(lambda r: r['process']):.2f} |")
            print(f"| {name} | warm / cold | {medians['warm'] / medians['cold']:.3f} | | | | |")


if __name__ == "__main__":
    main()
