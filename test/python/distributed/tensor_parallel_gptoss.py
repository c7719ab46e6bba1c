"""One rank of the tensor-parallel gpt-oss check (run by
test_tensor_parallel.py under `python -m etc.runtime.distributed -n 2`,
with the cases to run as arguments): a tiny random gpt-oss (sinks, q/k/v/o
biases, router and expert biases, clamped SwiGLU, a sliding and a full
layer) split over the ranks generates the tokens of the whole model on one
rank (rank 0 loads it and sends its answers), logits within float rounding:

* `float`: a float32 checkpoint;
* `mxfp4`: OpenAI's MXFP4 experts, kept packed on every rank (each its
  rows of gate and up, its 32-value blocks of down: an expert width of 64,
  32 per rank);
* `gguf`: a `gpt-oss` GGUF file as MXFP4_MOE lays it out (experts MXFP4,
  the other matrices Q8_0), every packed weight split as its blocks;
* `mxfp4-padded`, `gguf-padded`: the same with an expert width of 160 (5
  blocks of 32), whose share per rank (80 on 2 ranks, 40 on 4) is not
  whole blocks: each rank takes whole blocks (3 or 2) and pads them up
  with zero columns, the experts still packed.

Each rank's attention has its heads' sinks, the o_proj bias is added after
the all-reduce and an expert's down bias only in rank 0's partial sum: a
sink given to the wrong heads or a bias added on both ranks moves the
logits far beyond the tolerance. Prints `rank R: tensor parallel gpt-oss
CASE matches` per case, or raises."""

import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models.testing import tiny_config, write_checkpoint, write_gguf
from rank_zero import from_rank_zero

#: An expert width of 64: 32 values of the down experts' K per rank, whole
#: MXFP4 and Q8_0 blocks.
CONFIG = tiny_config("GptOssForCausalLM", intermediate_size=64)
# f32 whatever the file (activations quantized to the same 32-value blocks
# on one rank and on two), chunks and KV blocks of 4 (the prompts outgrow
# the sliding window of 3).
#: An expert width of 5 MXFP4 blocks, and KV heads for 4 ranks.
PADDED = dict(CONFIG, intermediate_size=160, num_key_value_heads=4)
LOAD = dict(workers=1, max_seq_len=32, attention_chunk=4, kv_block_size=4, dtype="f32")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [50, 3]]
#: MXFP4_MOE's layout: experts MXFP4, the other matrices Q8_0.
MXFP4_MOE = {f"blk.{i}.ffn_{p}_exps.weight": "MXFP4" for i in range(2)
             for p in ("gate", "up", "down")}


def write(case: str, directory: str):
    base = case.removesuffix("-padded")
    config = PADDED if base != case else CONFIG
    if base == "float":
        return write_checkpoint(os.path.join(directory, case), config, seed=7)
    if base == "mxfp4":
        return write_checkpoint(os.path.join(directory, case), config, seed=7, mxfp4=True)
    if base == "gguf":
        return write_gguf(os.path.join(directory, f"{case}.gguf"),
                          dict(config, swiglu_limit=7.0), seed=7, tensor_type="Q8_0",
                          tensor_types=MXFP4_MOE)
    raise ValueError(f"unknown case {case!r} (float, mxfp4, gguf, mxfp4-padded, gguf-padded)")


def check(comm, case: str, path) -> None:
    ranks, rank = comm.Get_size(), comm.Get_rank()
    split = etc.models.load(path, tensor_parallel=ranks, **LOAD)
    assert split.widened_weights == {}, (case, split.widened_weights)
    experts = {k: v for k, v in split.weight_formats.items() if "_experts_" in k}
    if case != "float":
        assert set(experts.values()) == {"mxfp4"} and len(experts) == 6, (case, experts)
    # A padded width: each rank's share rounded up to whole blocks.
    width = split.config.moe_intermediate_size
    share = -(-width // (ranks * 32)) * 32 if case.endswith("-padded") else width // ranks
    assert split.padded_widths == ({"moe_intermediate_size": 32} if share * ranks > width
                                   else {}), (case, split.padded_widths)
    assert split._shard.moe_intermediate_size == share, (case, split._shard)
    assert split._weights["l0_experts_gate_b"].shape[-1] == share
    # Rank r's sinks are its heads'; the experts' down bias is rank 0's.
    heads = split.config.num_heads // ranks
    assert split._weights["l0_sinks"].shape == (heads,), split._weights["l0_sinks"].shape
    assert (np.count_nonzero(split._weights["l1_experts_down_b"]) > 0) == (rank == 0)
    want = from_rank_zero(comm, lambda: etc.models.load(path, **LOAD).generate(
        PROMPTS, max_new_tokens=4, return_logits=True))
    got = split.generate(PROMPTS, max_new_tokens=4, return_logits=True)
    assert got.tokens == want.tokens, (case, got.tokens, want.tokens)
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=case)
    largest = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                  for a, b in zip(got.logits, want.logits))
    print(f"rank {rank}: {case}: logits within {largest:.2g}", flush=True)


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-gptoss-{rank}-") as directory:
        for case in sys.argv[1:]:
            check(comm, case, write(case, directory))
            print(f"rank {rank}: tensor parallel gpt-oss {case} matches", flush=True)


if __name__ == "__main__":
    main()
