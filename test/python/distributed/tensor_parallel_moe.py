"""One rank of the tensor-parallel Mixture-of-Experts check (run by
test_tensor_parallel.py under `python -m etc.runtime.distributed -n N`): a tiny
random Qwen3-MoE checkpoint (one sparse layer, one dense: every expert's
width and the dense MLP's divisible by N), loaded whole and with
`tensor_parallel=N`, generates the same tokens with logits equal within
float rounding (rank 0 loads the whole model and sends its answers to the
others); an expert width N does not divide is a ValueError naming
`moe_intermediate_size`. Prints `rank R: tensor parallel MoE matches` or
raises."""

import os
import tempfile

import numpy as np

import etc.models
from etc.models.testing import tiny_config, write_checkpoint
from rank_zero import from_rank_zero


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ranks = comm.Get_size()
    rank = comm.Get_rank()
    # Layer 0 dense (mlp_only_layers), layer 1 sparse: both kinds split.
    config = tiny_config("Qwen3MoeForCausalLM", num_attention_heads=2 * ranks,
                         num_key_value_heads=ranks, intermediate_size=16 * ranks,
                         moe_intermediate_size=8 * ranks, mlp_only_layers=[0])
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-moe-{rank}-") as directory:
        path = write_checkpoint(os.path.join(directory, "tiny-moe"), config, seed=5)
        split = etc.models.load(path, workers=1, max_seq_len=32, attention_chunk=8,
                                tensor_parallel=ranks)
        assert split.config.is_sparse(1) and not split.config.is_sparse(0)
        prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
        want = from_rank_zero(comm, lambda: etc.models.load(
            path, workers=1, max_seq_len=32, attention_chunk=8).generate(
                prompts, max_new_tokens=4, return_logits=True))
        got = split.generate(prompts, max_new_tokens=4, return_logits=True)
        assert got.tokens == want.tokens, (got.tokens, want.tokens)
        for a, b in zip(got.logits, want.logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        # An expert width the ranks do not divide.
        odd = tiny_config("Qwen3MoeForCausalLM", num_attention_heads=2 * ranks,
                          num_key_value_heads=ranks, intermediate_size=16 * ranks,
                          moe_intermediate_size=8 * ranks + 1)
        path = write_checkpoint(os.path.join(directory, "odd-moe"), odd, seed=5)
        try:
            etc.models.load(path, workers=1, max_seq_len=32, cache=False,
                            tensor_parallel=ranks)
        except ValueError as error:
            assert "moe_intermediate_size" in str(error) and "not divisible" in str(error), \
                error
        else:
            raise AssertionError("an expert width the ranks do not divide was accepted")
    print(f"rank {rank}: tensor parallel MoE matches", flush=True)


if __name__ == "__main__":
    main()
