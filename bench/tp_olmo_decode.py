"""CPU ranks: the decode step of OLMo 2, whose q/k norms span the whole
projections, against a Qwen3 of the same shape (per-head q/k norms), on
the N ranks of the MPI job.

Random models of hidden size 256, 4 layers, 8 query and 8 KV heads of 32
(OLMo 2's equal counts), MLP width 1024, vocabulary 1024, loaded with
`tensor_parallel=N`: on several ranks OLMo 2's layers add one all_reduce
each (its (T, 2) sums of squares of q and k) to Qwen3's two. After a
prefill of 16 tokens per sequence, decode steps of a batch of 4, the
models alternating step by step; each step timed on rank 0 between two
barriers (the slowest rank's time). Prints the median of all but the
first 5 steps per model and their ratio; run it with -n 1 and -n 2 to
compare the ranks.

Usage: python -m etc.runtime.distributed -n 2 bench/tp_olmo_decode.py [--workers W] [--steps 40]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

import etc.models
from etc.models.testing import tiny_config, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_tp_decode import COMM, decode_medians  # noqa: E402

SHAPE = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=8, head_dim=32, vocab_size=1024)
MODELS = {"olmo2": "Olmo2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    options = parser.parse_args()
    ranks, rank = COMM.Get_size(), COMM.Get_rank()
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-olmo-bench-{rank}-") as directory:
        models = {}
        for name, architecture in MODELS.items():
            path = write_checkpoint(os.path.join(directory, name),
                                    tiny_config(architecture, **SHAPE), seed=3)
            models[name] = etc.models.load(path, workers=options.workers, max_seq_len=128,
                                           tensor_parallel=ranks)
        olmo, qwen = decode_medians(models, options.steps).values()
    if rank == 0:
        print(f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}, {ranks} rank(s) x {options.workers} worker(s)")
        print(f"| decode step, batch 4 | OLMo 2 {olmo:.2f} ms | Qwen3 {qwen:.2f} ms | "
              f"OLMo 2 / Qwen3 {olmo / qwen:.2f} |")


if __name__ == "__main__":
    main()
