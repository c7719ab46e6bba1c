"""One rank of the tensor-parallel model check (run by test_tensor_parallel.py
under `python -m etc.runtime.distributed -n N`): a tiny random Qwen3
checkpoint (heads and MLP columns divisible by N), loaded whole and with
`tensor_parallel=N`, generates the same tokens, with logits equal within
float rounding, and samples the same tokens (seeded, and unseeded on every
rank). The split model's step kernel uses the schedule given as the first
argument ("auto", which is static on several ranks, or "dynamic"). Rank 0
loads the whole model and sends its answers to the others. Prints
`rank R: tensor parallel matches` or raises."""

import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models import Request, SamplingParams
from etc.models.testing import tiny_config, write_checkpoint
from rank_zero import from_rank_zero


def draw(model, sampling: SamplingParams) -> list[int]:
    """Four tokens after [3, 1, 4], one step at a time, drawn by `sampling`."""
    cache = model.new_cache(1, 16)
    request = Request(0, 0, [3, 1, 4], sampling)
    drawn = []
    for _ in range(4):
        _, ids = model.step(cache, [request])
        drawn.append(int(ids[0]))
        request = Request(0, request.start + len(request.tokens), drawn[-1:], sampling)
    return drawn


def main(schedule: str) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ranks = comm.Get_size()
    rank = comm.Get_rank()
    config = tiny_config(num_attention_heads=2 * ranks, num_key_value_heads=ranks,
                         intermediate_size=16 * ranks, num_hidden_layers=1)
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-{rank}-") as directory:
        path = write_checkpoint(os.path.join(directory, "tiny"), config, seed=7)
        split = etc.models.load(path, workers=1, max_seq_len=64,
                               tensor_parallel=ranks, schedule=schedule)
        expected = "static" if schedule == "auto" else schedule
        assert split.kernels[0].abi.schedule == expected, split.kernels[0].abi.schedule
        prompts = [[1, 2, 3, 4, 5], [9, 8]]
        seeded = SamplingParams(1.0, seed=11)
        # The whole model's tokens and logits, and its seeded draws, from
        # rank 0 (each rank's whole model would be the same).
        def reference():
            whole = etc.models.load(path, workers=1, max_seq_len=64)
            return (whole.generate(prompts, max_new_tokens=4, return_logits=True),
                    draw(whole, seeded))

        want, want_seeded = from_rank_zero(comm, reference)
        got = split.generate(prompts, max_new_tokens=4, return_logits=True)
        assert got.tokens == want.tokens, (got.tokens, want.tokens)
        for a, b in zip(got.logits, want.logits):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        # Sampling: a seeded request draws the whole model's tokens, and one
        # without a seed the same tokens on every rank (rank 0's seeds).
        assert draw(split, seeded) == want_seeded, want_seeded
        every = comm.allgather(draw(split, SamplingParams(1.0)))
        assert all(t == every[0] for t in every), every
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
    main(sys.argv[1] if len(sys.argv) > 1 else "auto")
    sys.stdout.flush()
