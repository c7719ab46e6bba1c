"""The host time of a decode step: what `Model.step` spends outside its
kernel's run (building the step data, binding it, the `out=` arrays, the
counters' init, the checks after the run), with the step's arrays kept
between steps (`run_step(..., keep=True)`, what `Model.step` does) and
without (new arrays bound every step, as before commit a807db7), the two
alternating in one process.

    .venv/bin/python bench/step_host.py --layers 30 --batches 1 16 --rounds 8

A random checkpoint of the SmolLM2-135M shape (`llm_decode_cpu.py`'s
`smol`, `--layers` of them) in bf16, 2 workers; each round prefills B
prompts of 20 tokens into a new cache and times `--steps` decode steps
(the first 5 untimed). The kernel's run is timed around the CPU runtime's
`run_interruptible`; host = step - run. Prints medians and 10th
percentiles in us.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_decode_cpu  # noqa: E402

from etc import models  # noqa: E402
from etc.runtime import cpu  # noqa: E402

_RUNS: list = []
_run_interruptible = cpu.run_interruptible


def _timed_run(*args, **kwargs):
    start = time.perf_counter_ns()
    try:
        return _run_interruptible(*args, **kwargs)
    finally:
        _RUNS.append(time.perf_counter_ns() - start)


def measure(model, batch: int, rounds: int, steps: int) -> dict:
    rng = np.random.default_rng(batch)
    results = {True: [], False: []}
    for round_ in range(rounds):
        for keep in (True, False) if round_ % 2 == 0 else (False, True):
            cache = model.new_cache(batch, 20 + steps + 1)
            requests = [models.Request(r, 0, rng.integers(0, 1000, 20).tolist())
                        for r in range(batch)]
            _, ids = model.step(cache, requests)
            for step in range(steps):
                requests = [models.Request(r, 20 + step, [int(ids[r])]) for r in range(batch)]
                _RUNS.clear()
                start = time.perf_counter_ns()
                data = model._step_data(cache, requests)
                _, ids = model.run_step(data, len(data["sample_rows"]), cache=cache, keep=keep)
                total = time.perf_counter_ns() - start
                if step >= 5:
                    results[keep].append((total - sum(_RUNS)) / 1e3)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    cpu.run_interruptible = _timed_run
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} cores; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        config = llm_decode_cpu.model_config("smol", args.layers)
        path = llm_decode_cpu.write_checkpoint(Path(tmp) / "smol", config, sharp=False,
                                               dtype="BF16")
        model = models.load(path, workers=2, dtype="bf16", max_seq_len=400)
        print("\n| B | new arrays: median us | p10 | kept: median us | p10 |")
        print("|---:|---:|---:|---:|---:|")
        for batch in args.batches:
            results = measure(model, batch, args.rounds, args.steps)
            cells = []
            for keep in (False, True):
                values = sorted(results[keep])
                cells += [f"{statistics.median(values):.0f}", f"{values[len(values) // 10]:.0f}"]
            print(f"| {batch} | " + " | ".join(cells) + " |")
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
