"""One rank of the tensor-parallel packed-weights check (run by
test_tensor_parallel.py under `python -m etc.runtime.distributed -n 2`):
tiny random models whose quantized weights stay packed when split over the
ranks, each generating the tokens of the same model packed on one rank
(rank 0 loads it and sends its answers), logits within float rounding (the
partial sums are added in another order; a rank quantizes the same
32-value blocks of the activations as one rank does):

* a Qwen3-MoE GGUF file in Q8_0 (a dense layer and a sparse one: the
  projections' rows and K blocks split, every expert's too);
* a Qwen3 GGUF file in Q4_K whose down projection's K share (768 / 2) is
  not whole blocks of 256: it is split in whole blocks (2 and 1), padded
  with zero columns to 512 per rank, and stays packed; its output
  projection's (2 heads of 64 per rank) cannot be padded: packed=None
  widens only that weight on every rank (and says so), packed=True is a
  ValueError naming it;
* a Qwen3 FP8 checkpoint (e4m3 blocks of 32 with their scales).

Prints `rank R: tensor parallel packed matches` or raises."""

import os
import tempfile
import warnings

import numpy as np

import etc.models
from etc import packed
from etc.models.loading import open_checkpoint
from etc.models.testing import tiny_config, write_checkpoint, write_gguf
from rank_zero import from_rank_zero

SHAPE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300)
# f32, as the GGUF files compute by default (the FP8 checkpoint would be bf16).
LOAD = dict(workers=1, max_seq_len=32, attention_chunk=8, dtype="f32")
PROMPTS = [[5, 6, 7, 8, 9], [250, 3]]


def files(directory: str) -> dict:
    """name -> (path, the weights the split widens, the widths it pads)."""
    moe = tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0], moe_intermediate_size=64,
                      head_dim=64, **SHAPE)
    q4_k = tiny_config("Qwen3ForCausalLM", head_dim=64, num_hidden_layers=1,
                       **dict(SHAPE, intermediate_size=768))
    fp8 = tiny_config("Qwen3ForCausalLM", head_dim=64, num_hidden_layers=1, **SHAPE)
    return {
        "q8_0 moe": (write_gguf(os.path.join(directory, "moe.gguf"), moe, seed=3,
                                tensor_type="Q8_0"), set(), {}),
        "q4_k": (write_gguf(os.path.join(directory, "q4_k.gguf"), q4_k, seed=4,
                            tensor_type="Q4_K"), {"l0_wo"}, {"intermediate_size": 256}),
        "fp8": (write_checkpoint(os.path.join(directory, "fp8"), fp8, dtype="BF16", seed=5,
                                 fp8_block=(128, 128)), set(), {}),
    }


def check(comm, name: str, path, widened: set, padded: dict) -> None:
    ranks = comm.Get_size()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = etc.models.load(path, tensor_parallel=ranks, **LOAD)
    whole_formats = open_checkpoint(path).weight_formats()
    assert set(split.widened_weights) == widened, (name, split.widened_weights)
    assert split.padded_widths == padded, (name, split.padded_widths)
    assert split.weight_formats == {k: v for k, v in whole_formats.items() if k not in widened}
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert all(any(repr(n) in s for s in said) for n in widened), (name, said)
    # Each rank holds its share of the blocks: a row-parallel weight's
    # K bytes (a padded width's whole blocks) and a column-parallel one's
    # rows, as packed storage.
    for key, fmt in split.weight_formats.items():
        array = split._weights[key]
        assert array.dtype == np.uint8, (name, key, array.dtype)
        c, whole = split._shard, split.config
        k = {"wo": c.num_heads * c.head_dim, "w_down": c.intermediate_size,
             "experts_down": c.moe_intermediate_size}.get(key.partition("_")[2])
        if k is not None:
            assert array.shape[-1] == packed.row_bytes(fmt, k), (name, key, array.shape)
    for field, block in padded.items():
        share = -(-getattr(whole, field) // (ranks * block)) * block
        assert getattr(split._shard, field) == share > getattr(whole, field) // ranks
    for key in widened:
        assert split._weights[key].dtype == np.float32, (name, key)
    want = from_rank_zero(comm, lambda: etc.models.load(path, **LOAD).generate(
        PROMPTS, max_new_tokens=4, return_logits=True))
    got = split.generate(PROMPTS, max_new_tokens=4, return_logits=True)
    assert got.tokens == want.tokens, (name, got.tokens, want.tokens)
    # A widened weight's product is exact where the packed one quantizes
    # the activations: only there do the logits move by more than rounding.
    tolerance = 0.05 if widened else 1e-4
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance, err_msg=name)
    largest = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                  for a, b in zip(got.logits, want.logits))
    print(f"rank {comm.Get_rank()}: {name}: logits within {largest:.2g}", flush=True)
    if widened:
        try:
            etc.models.load(path, tensor_parallel=ranks, packed=True, **LOAD)
        except ValueError as error:
            text = str(error)
            assert all(part in text for part in ("'l0_wo'", "q4_k", "blocks of 256",
                                                 f"tensor_parallel={ranks}")), text
        else:
            raise AssertionError(f"{name}: packed=True split a weight across a block")


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    with tempfile.TemporaryDirectory(prefix=f"etc-tp-packed-{rank}-") as directory:
        for name, (path, widened, padded) in files(directory).items():
            check(comm, name, path, widened, padded)
    print(f"rank {rank}: tensor parallel packed matches", flush=True)


if __name__ == "__main__":
    main()
