"""CPU ranks: a tensor-parallel model's decode step on the static and the
dynamic schedule.

A random Qwen3 of hidden size 256, 4 layers, 8 query and 4 KV heads of 32,
MLP width 1024, vocabulary 1024, split over the N ranks of the MPI job
(`etc.models.load(path, tensor_parallel=N, schedule=...)`), both schedules
loaded side by side. After a prefill of 16 tokens per sequence, 40 decode
steps of a batch of 4, alternating the schedules step by step; each step
timed on rank 0 between two barriers (the slowest rank's time). Prints the
median of the last 35 steps per schedule and their ratio.

Usage: python -m etc.runtime.distributed -n 2 bench/distributed_tp_decode.py [--workers W]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import tempfile
import time

from mpi4py import MPI

import etc.models
from etc.models import Request
from etc.models.testing import tiny_config, write_checkpoint

COMM = MPI.COMM_WORLD
SCHEDULES = ("static", "dynamic")


def decode_medians(models: dict, steps: int) -> dict[str, float]:
    """Per model (by name): the median ms of its decode steps but the first
    5, after a prefill of 16 tokens for 4 sequences; `steps` steps of a
    batch of 4, the models alternating step by step, each timed between two
    barriers (the slowest rank's time)."""
    caches = {name: model.new_cache(4, 128) for name, model in models.items()}
    prompts = [[1 + (i * 7 + j) % 900 for j in range(16)] for i in range(4)]
    for name, model in models.items():
        model.step(caches[name], [Request(i, 0, prompts[i]) for i in range(4)])
    times = {name: [] for name in models}
    for step in range(steps):
        for name, model in models.items():
            requests = [Request(i, 16 + step, [5 + i]) for i in range(4)]
            COMM.Barrier()
            start = time.perf_counter()
            model.step(caches[name], requests)
            COMM.Barrier()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t[5:]) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    options = parser.parse_args()
    ranks, rank = COMM.Get_size(), COMM.Get_rank()
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                         vocab_size=1024)
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-bench-{rank}-") as directory:
        path = write_checkpoint(os.path.join(directory, "model"), config, seed=3)
        models = {s: etc.models.load(path, workers=options.workers, max_seq_len=128,
                                     cache=False, tensor_parallel=ranks, schedule=s)
                  for s in SCHEDULES}
        static, dynamic = decode_medians(models, options.steps).values()
    if rank == 0:
        print(f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}, {ranks} ranks x {options.workers} worker(s)")
        print(f"| decode step, batch 4 | static {static:.2f} ms | dynamic {dynamic:.2f} ms | "
              f"dynamic / static {dynamic / static:.2f} |")


if __name__ == "__main__":
    main()
