"""One rank of the tensor-parallel check of the whole-projection q/k norms
(run by test_tensor_parallel.py under `python -m etc.runtime.distributed
-n N`): OLMo 2, OLMo 3 and OLMoE, whose q and k norms span every head's
projection, split by heads over the ranks (each rank's squares summed,
one all_reduce of q's and k's sums, `split_rmsnorm` by the whole widths),
against the same model on one rank (rank 0 computes it and sends its
answers). Their f32 checkpoints are test_families.py's tensor-parallel
check (the same tokens, logits within 1e-4); here:

* the checkpoints computed in bf16: the ranks' partial attention and MLP
  outputs are rounded to bf16 before the all_reduce adds them (as for
  every family), so the logits differ by bf16 roundings: the first token
  of each prompt the same, and each step's logits, up to the first token
  that differs, within a relative error (‖split − whole‖ / ‖whole‖) of
  2e-2 (measured 1.4e-2; Qwen3's and Llama's tiny models 1.1e-2 and
  1.0e-2);
* OLMo 2 in f32 on the dynamic schedule: the same tokens, logits within
  1e-4;
* GGUF files in Q8_0 (OLMo 2, OLMoE), kept packed: the same tokens, logits
  within 1e-4 (a rank quantizes the same 32-value blocks of the
  activations as one rank does).

Prints `rank R: tensor parallel NAME CASE matches` per model and case, or
raises."""

import os
import sys
import tempfile

import numpy as np

import etc.models
from etc.models.testing import tiny_config, write_checkpoint, write_gguf
from rank_zero import from_rank_zero

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [90, 3]]
LOAD = dict(workers=1, max_seq_len=32, attention_chunk=4)
#: 4 query heads and 2 KV heads of 16: one KV head per rank on 2 ranks.
MODELS = {
    "olmo2": tiny_config("Olmo2ForCausalLM"),
    "olmo3": tiny_config("Olmo3ForCausalLM"),
    "olmoe": tiny_config("OlmoeForCausalLM"),
}
#: Q8_0 files: K = 128 and each rank's 64 columns of q, of o_proj's K, of
#: the MLP and of every expert are whole blocks of 32.
GGUF = dict(hidden_size=128, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=160)
GGUF_MODELS = {
    "olmo2": tiny_config("Olmo2ForCausalLM", **GGUF),
    "olmoe": tiny_config("OlmoeForCausalLM", moe_intermediate_size=64, **GGUF),
}


def generate(model):
    out = model.generate(PROMPTS, max_new_tokens=4, return_logits=True)
    return out.tokens, [np.asarray(step, np.float32) for step in out.logits]


def relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ranks, rank = comm.Get_size(), comm.Get_rank()
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-olmo-{rank}-") as directory:
        paths = {name: write_checkpoint(os.path.join(directory, name), config, seed=9)
                 for name, config in MODELS.items()}
        runs = [(name, "bf16", path, dict(dtype="bf16")) for name, path in paths.items()]
        runs.append(("olmo2", "dynamic", paths["olmo2"], dict(dtype="f32", schedule="dynamic")))
        for name, config in GGUF_MODELS.items():
            path = write_gguf(os.path.join(directory, f"{name}.gguf"), config, seed=4,
                              tensor_type="Q8_0")
            runs.append((name, "gguf", path, dict(dtype="f32")))
        for name, case, path, options in runs:
            want_tokens, want_logits = from_rank_zero(
                comm, lambda: generate(etc.models.load(path, **LOAD, **options)))
            split = etc.models.load(path, tensor_parallel=ranks, **LOAD, **options)
            if case == "gguf":  # every Q8_0 weight's share stays packed
                assert split.weight_formats and not split.widened_weights, name
            tokens, logits = generate(split)
            assert len(logits) == len(want_logits), (name, case)
            if case == "bf16":
                assert [t[0] for t in tokens] == [t[0] for t in want_tokens], \
                    (name, tokens, want_tokens)
                # Each request's steps while its tokens agree (a bf16
                # near-tie may take another token, after which they differ).
                for got, want, a, b in zip(tokens, want_tokens, logits, want_logits):
                    for step in range(len(b)):
                        error = relative(a[step], b[step])
                        assert error <= 2e-2, (name, case, step, error)
                        if got[step] != want[step]:
                            break
            else:
                assert tokens == want_tokens, (name, case, tokens, want_tokens)
                for a, b in zip(logits, want_logits):
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4,
                                               err_msg=f"{name} {case}")
            print(f"rank {rank}: tensor parallel {name} {case} matches", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
