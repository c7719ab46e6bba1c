"""CPU ranks: the resident memory of a packed GGUF model on each rank, one
rank against several (docs/distributed.md, "Packed weights over ranks").

Writes (once, into --dir) a random Qwen3 of hidden size 1024, 2 layers, 8
query and 4 KV heads of 128, MLP width 4096, vocabulary 8192, as a Q8_0
GGUF file (42 MB), or with --moe a Qwen3-MoE of 16 experts of width 512, 4
per token, in Q4_K (37 MB); loads it (the step kernel from the compile
cache in --dir: run the command twice, the first run compiles) on every
rank of the MPI job, split over them when there are several, MPI started
before the baseline; generates 4 tokens; prints one JSON line per rank:
how much its peak and current resident memory grew, the bytes of its
weights, how many stay packed and which the split widened.

Usage: python bench/tp_packed_memory.py --dir /tmp/tpmem [--moe] [--widen]
       python -m etc.runtime.distributed -n 2 bench/tp_packed_memory.py --dir /tmp/tpmem
"""

from __future__ import annotations

import argparse
import json
import os

from mpi4py import MPI

import etc.models
from etc.models.testing import tiny_config, write_gguf

COMM = MPI.COMM_WORLD
SHAPE = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=8,
             num_key_value_heads=4, head_dim=128, vocab_size=8192)


def status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--widen", action="store_true", help="packed=False (the reference)")
    options = parser.parse_args()
    ranks, rank = COMM.Get_size(), COMM.Get_rank()
    os.makedirs(options.dir, exist_ok=True)
    path = os.path.join(options.dir, "q4_k_moe.gguf" if options.moe else "q8_0.gguf")
    if rank == 0 and not os.path.exists(path):
        config = tiny_config("Qwen3MoeForCausalLM", num_experts=16, num_experts_per_tok=4,
                             moe_intermediate_size=512, **SHAPE) if options.moe else \
            tiny_config("Qwen3ForCausalLM", **SHAPE)
        write_gguf(path, config, tensor_type="Q4_K" if options.moe else "Q8_0")
    COMM.Barrier()
    before = status("VmRSS:")
    split = dict(tensor_parallel=ranks) if ranks > 1 else {}
    model = etc.models.load(path, workers=1, max_seq_len=64, attention_chunk=16,
                            cache=os.path.join(options.dir, "cache"),
                            packed=False if options.widen else None, **split)
    model.generate([[1, 2, 3]], 4)
    print(json.dumps({"rank": rank, "ranks": ranks, "kernel": model.kernel_source,
                      "file_mb": round(os.path.getsize(path) / 1e6, 1),
                      "peak_growth_mb": round((status("VmHWM:") - before) / 1e6, 1),
                      "rss_growth_mb": round((status("VmRSS:") - before) / 1e6, 1),
                      "weights_mb": round(sum(a.nbytes for a in model._weights.values()) / 1e6,
                                          1),
                      "packed": len(model.weight_formats),
                      "widened": sorted(model.widened_weights)}), flush=True)


if __name__ == "__main__":
    main()
