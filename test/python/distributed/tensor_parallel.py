"""One rank of the tensor-parallel model check (run by test_distributed.py
under `python -m etc.runtime.distributed -n N`): a tiny random Qwen3
checkpoint (heads and MLP columns divisible by N), loaded whole and with
`tensor_parallel=N`, generates the same tokens, with logits equal within
float rounding. Prints `rank R: tensor parallel matches` or raises."""

import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models.testing import tiny_config, write_checkpoint


def main() -> None:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    rank = MPI.COMM_WORLD.Get_rank()
    config = tiny_config(num_attention_heads=2 * ranks, num_key_value_heads=ranks,
                         intermediate_size=16 * ranks, num_hidden_layers=1)
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-{rank}-") as directory:
        path = write_checkpoint(os.path.join(directory, "tiny"), config, seed=7)
        whole = etc.models.load(path, workers=1, max_seq_len=64, cache=False)
        split = etc.models.load(path, workers=1, max_seq_len=64, cache=False,
                               tensor_parallel=ranks)
        prompts = [[1, 2, 3, 4, 5], [9, 8]]
        want = whole.generate(prompts, max_new_tokens=4, return_logits=True)
        got = split.generate(prompts, max_new_tokens=4, return_logits=True)
        assert got.tokens == want.tokens, (got.tokens, want.tokens)
        for a, b in zip(got.logits, want.logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        # Heads that N does not divide are an error naming the field.
        try:
            etc.models.load(path, workers=1, max_seq_len=64, cache=False,
                            tensor_parallel=ranks + 1)
        except ValueError as error:
            assert "is not divisible by" in str(error), error
        else:
            raise AssertionError(f"tensor_parallel={ranks + 1} was accepted")
    print(f"rank {rank}: tensor parallel matches", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
