"""One rank of the model families' tensor-parallel check (run by
test_families.py under `python -m etc.runtime.distributed -n N`): for each
`NAME=CONFIG` on the command line (CONFIG a config.json as JSON, whose
heads and MLP columns N divides), a tiny random checkpoint loaded whole and
with `tensor_parallel=N` generates the same tokens with logits equal within
float rounding. Prints `rank R: NAME tensor parallel matches` per family,
or raises."""

import json
import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models.testing import write_checkpoint


def main(families: list[str]) -> None:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    rank = MPI.COMM_WORLD.Get_rank()
    for family in families:
        name, config = family.split("=", 1)
        config = json.loads(config)
        with tempfile.TemporaryDirectory(prefix=f"etc-tp-{rank}-") as directory:
            path = write_checkpoint(os.path.join(directory, "tiny"), config, seed=7)
            options = dict(workers=1, max_seq_len=64, attention_chunk=4, cache=False)
            whole = etc.models.load(path, **options)
            split = etc.models.load(path, tensor_parallel=ranks, **options)
            prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8]]
            want = whole.generate(prompts, max_new_tokens=4, return_logits=True)
            got = split.generate(prompts, max_new_tokens=4, return_logits=True)
            assert got.tokens == want.tokens, (name, got.tokens, want.tokens)
            for a, b in zip(got.logits, want.logits):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
        print(f"rank {rank}: {name} tensor parallel matches", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
