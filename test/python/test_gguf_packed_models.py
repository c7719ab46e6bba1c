"""Models from quantized GGUF files run their weights packed (the default
on the CPU): every architecture, with its matrices and a MoE layer's
stacks of experts in every block format of `etc.packed` (assigned round
robin over the tensors), generates the greedy tokens the same weights
widened to float32 generate, up to ties; the process that loads and runs
a packed file, a MoE one included, holds about the file in memory (a
subprocess, measured from /proc).

Tie tolerance. The packed kernels differ from the widened model only by
rounding each matmul's (and expert product's) activations to int8 blocks
(scale max|x| / 127): errors of at most d/2 per value, uniform, about
0.55% of a Gaussian block's rms, which perturb each product by about that
fraction of its rms and add up over a model's 15 matmuls into logit
errors of a few percent of the logits' standard deviation (8-12% at the
largest of 300 logits on these models, measured: Llama 9.1%, Qwen3 9.2%,
Qwen3-MoE 10.7%; 2026-11-28). A tile whose weights are all K-quants
rounds per 256 values (`etc.packed.activation_block`: max|x| over 256
is about 1.4x that over 32, and so are its errors): on files with every
matrix in Q4_K or in Q6_K 11-19% (Qwen3-MoE's Q6_K 18.5%), above T;
these mixed files keep most tiles at blocks of 32. While both models have produced the
same tokens they run on the same inputs: there, every step's logits must
agree within T = 0.15 x the widened logits' standard deviation, and the
first token that differs must be one where the widened model's two best
logits are within 2T (a tie the rounding may break either way)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import etc.models as models
from etc import packed
from etc.models.testing import checkpoint_tensors, tiny_config, write_gguf

import memory_growth

SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=300)
CONFIGS = {
    "llama": tiny_config("LlamaForCausalLM", **SHAPE),
    "qwen3": tiny_config("Qwen3ForCausalLM", **SHAPE),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0],
                             moe_intermediate_size=256, **SHAPE),
}
TYPES = [packed.FORMATS[f].ggml for f in packed.GGML_FORMATS]
LOAD = dict(workers=2, max_seq_len=64, attention_chunk=16)
PROMPTS = [[5, 6, 7], list(range(1, 20)), [250]]
TIE = 0.15


def _mixed_file(path, config):
    """`config`'s GGUF file with its matrices and stacks of experts in
    every packed format in turn (a format covers several tensors of each
    kind)."""
    names = []
    probe = write_gguf(path, config, tensor_type="F32")
    from etc.models.loading.gguf_file import GGUFFile

    for name, info in GGUFFile(probe).tensors.items():
        if len(info.shape) in (2, 3) and "norm" not in name:
            names.append(name)
    types = {name: TYPES[i % len(TYPES)] for i, name in enumerate(sorted(names))}
    return write_gguf(path, config, tensors=checkpoint_tensors(config), tensor_types=types,
                      fallback_type="Q8_0")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_models_generate_the_widened_models_tokens_up_to_ties(name, tmp_path):
    path = _mixed_file(tmp_path / "m.gguf", CONFIGS[name])
    fast = models.load(path, **LOAD)
    assert set(fast.weight_formats.values()) == set(packed.GGML_FORMATS)
    if name == "qwen3_moe":  # the experts run packed too, each stack its own format
        experts = {fast.weight_formats[f"l1_experts_{p}"] for p in ("gate", "up", "down")}
        assert len(experts) == 3 and "l1_router" not in fast.weight_formats
    reference = models.load(path, packed=False, **LOAD)
    assert reference.weight_formats == {}
    assert fast.num_parameters == reference.num_parameters
    got = fast.generate(PROMPTS, 10, return_logits=True)
    want = reference.generate(PROMPTS, 10, return_logits=True)
    for tokens, wanted, logits, wanted_logits in zip(got.tokens, want.tokens, got.logits,
                                                     want.logits):
        for step, (token, expected) in enumerate(zip(tokens, wanted)):
            here, there = np.asarray(logits[step]), np.asarray(wanted_logits[step])
            tolerance = TIE * there.std()
            assert np.abs(here - there).max() <= tolerance, (name, step)
            if token != expected:
                best = np.sort(there)[-2:]
                assert best[1] - best[0] <= 2 * tolerance, (name, step, best)
                break


def test_packed_options_and_the_simulated_gpu_kernels(tmp_path):
    """packed=True runs the GPU kernels for packed weights (here with their
    lanes simulated on the CPU), which accumulate the dequantized values in
    f32: the widened model's tokens, logits within float rounding; by
    default those kernels widen (not yet run on a GPU)."""
    from etc.models.step.kernel import packed_weights

    path = _mixed_file(tmp_path / "m.gguf", CONFIGS["llama"])
    options = dict(LOAD, kernels="cuda", max_seq_len=32)
    gpu = models.load(path, packed=True, **options)
    assert set(gpu.weight_formats.values()) == set(packed.GGML_FORMATS)
    assert models.load(path, **options).weight_formats == {}
    widened = models.load(path, packed=False, **LOAD)
    got = gpu.generate(PROMPTS[:2], 4, return_logits=True)
    want = widened.generate(PROMPTS[:2], 4, return_logits=True)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="packed='yes' must be True, False or None"):
        models.load(path, packed="yes", **LOAD)
    # Over 2 ranks every packed weight stays packed, each rank its rows or
    # its K blocks (this file's output and down projections are in
    # 32-value formats; test_tensor_parallel.py runs such splits, and the
    # K-quant output projections that must widen, and down projections padded
    # to whole K-quant blocks).
    from etc.models.loading import open_checkpoint

    checkpoint = open_checkpoint(path)
    assert packed_weights(checkpoint, True, tensor_parallel=2) == \
        packed_weights(checkpoint, True) == gpu.weight_formats
    # A safetensors checkpoint has nothing packed: packed= changes nothing.
    from etc.models.testing import write_checkpoint

    directory = write_checkpoint(tmp_path / "st", CONFIGS["qwen3"])
    assert models.load(directory, **LOAD).weight_formats == {}


def test_moe_experts_stay_packed_per_layer_or_are_refused(tmp_path):
    """A layer's experts run packed when all three of its stacks are in
    block formats; a layer with a float stack (here an F16 up stack) reads
    all three widened. A stack in a type ETC cannot run (Q2_K) is refused
    at load, naming the tensor and its type."""
    from etc.models.loading.gguf import GGUFCheckpoint, GGUFError

    config = CONFIGS["qwen3_moe"]
    path = write_gguf(tmp_path / "f16.gguf", config, tensor_type="Q8_0",
                      tensor_types={"blk.1.ffn_up_exps.weight": "F16"})
    formats = GGUFCheckpoint(path).weight_formats()
    assert "l1_wq" in formats and not any("experts" in name for name in formats)
    e, h, f = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    q2_k = np.zeros((e, h, f // 256 * 84), np.uint8)  # 84-byte blocks of 256 values
    path = write_gguf(tmp_path / "q2_k.gguf", config, tensor_type="Q8_0",
                      drop=("blk.1.ffn_down_exps.weight",),
                      raw_tensors={"blk.1.ffn_down_exps.weight": (q2_k, "Q2_K")})
    with pytest.raises(GGUFError, match=r"'blk.1.ffn_down_exps.weight' .layer 1 expert down "
                                        r"projections. has type Q2_K, which ETC does not load"):
        models.load(path, **LOAD)




#: Files for the memory test: a 42 MB Q8_0 Qwen3 and a 37 MB Q4_K
#: Qwen3-MoE (16 experts, 4 per token) whose experts are 77% of the file.
MEMORY_FILES = {
    "qwen3": (tiny_config("Qwen3ForCausalLM", hidden_size=1024, intermediate_size=4096,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                          vocab_size=8192), "Q8_0"),
    "qwen3_moe": (tiny_config("Qwen3MoeForCausalLM", hidden_size=1024, intermediate_size=4096,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                              vocab_size=8192, num_experts=16, num_experts_per_tok=4,
                              moe_intermediate_size=512), "Q4_K"),
}


@pytest.mark.parametrize("name", list(MEMORY_FILES))
def test_a_packed_model_holds_about_its_file_in_memory(name, tmp_path):
    """The file, loaded (the step kernel from the compile cache) and run in
    a fresh process: the process's peak resident memory grows by at most
    1.25 x the file (the weights are the file's pages, mapped, a MoE
    layer's experts included: 1.10 x and 1.12 x measured; widened to
    float32 they took 5.5 x the Q8_0 file, 10.6 x the Q4_K one, and
    8.9 x it when only the experts were widened, before they ran packed)."""
    from etc.models.loading.gguf import GGUFCheckpoint

    config, tensor_type = MEMORY_FILES[name]
    path = write_gguf(tmp_path / "m.gguf", config, tensor_type=tensor_type)
    size = path.stat().st_size
    cache = str(tmp_path / "cache")
    grown = {True: memory_growth.grown(path, cache, packed=True)}
    assert grown[True] <= 1.25 * size, (grown, size)
    if name == "qwen3":  # the check can fail (once is enough)
        grown[False] = memory_growth.grown(path, cache, packed=False)
        assert grown[False] > 2.5 * size, (grown, size)
    # `etc cache` says which kernel runs packed weights, in which formats:
    # every matrix (and stack of experts) of the file.
    formats = GGUFCheckpoint(path).weight_formats()
    assert set(formats.values()) == {tensor_type.lower()}
    summaries = sorted(entry.summary for entry in models.KernelCache(cache).entries())
    assert len(summaries) == len(grown)
    packed_line = f"dtype=f32 packed: {tensor_type.lower()}x{len(formats)} "
    assert sum(packed_line in line for line in summaries) == 1


def test_the_command_line_runs_packed_weights_unless_told_to_widen(tmp_path):
    """`etc compile` of a Q8_0 file compiles the packed kernel, `--widen`
    the widened one; `etc cache list` tells them apart."""
    path = write_gguf(tmp_path / "m.gguf", CONFIGS["qwen3"], tensor_type="Q8_0")
    cache = tmp_path / "cache"

    def etc(*args):
        result = subprocess.run([sys.executable, "-m", "etc.cli", *map(str, args)],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        return result.stdout

    small = ("--workers", "2", "--max-model-len", "64", "--cache-dir", cache)
    etc("compile", path, *small)
    etc("compile", path, "--widen", *small)
    listing = [line for line in etc("cache", "list", "--cache-dir", cache).splitlines()
               if "Qwen3ForCausalLM" in line]
    packed_lines = [line for line in listing if "packed: q8_0x15" in line]
    assert len(listing) == 2 and len(packed_lines) == 1, listing
