"""One rank of the model families' tensor-parallel check (run by
test_families.py under `python -m etc.runtime.distributed -n N`): for each
`NAME=CONFIG` on the command line (CONFIG a config.json as JSON, whose
heads and MLP columns N divides), a tiny random checkpoint loaded whole and
with `tensor_parallel=N` generates the same tokens with logits equal within
float rounding. Each family's whole model is loaded on one rank only (the
families dealt out over the ranks), whose answers all ranks then share.
Prints `rank R: NAME tensor parallel matches` per family, or raises."""

import json
import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models.testing import write_checkpoint


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8]]
OPTIONS = dict(workers=1, max_seq_len=64, attention_chunk=4)


def main(families: list[str]) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ranks = comm.Get_size()
    rank = comm.Get_rank()
    families = [family.split("=", 1) for family in families]
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-{rank}-") as directory:
        paths = {name: write_checkpoint(os.path.join(directory, name), json.loads(config),
                                        seed=7)
                 for name, config in families}
        # The whole models' tokens and logits: family i's from rank i mod N
        # (each rank's whole model would be the same), so that no rank
        # waits while another compiles.
        mine = {name: etc.models.load(paths[name], **OPTIONS).generate(
                    PROMPTS, max_new_tokens=4, return_logits=True)
                for i, (name, _) in enumerate(families) if i % ranks == rank}
        wanted = {name: out for part in comm.allgather(mine) for name, out in part.items()}
        for name, _ in families:
            split = etc.models.load(paths[name], tensor_parallel=ranks, **OPTIONS)
            want = wanted[name]
            got = split.generate(PROMPTS, max_new_tokens=4, return_logits=True)
            assert got.tokens == want.tokens, (name, got.tokens, want.tokens)
            for a, b in zip(got.logits, want.logits):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
            print(f"rank {rank}: {name} tensor parallel matches", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
