"""EXAONE 4 (Exaone4ForCausalLM: no input norms, the attention's and MLP's
outputs normed, q/k norms per head; with a window, RoPE on the sliding
layers only), Seed-OSS (SeedOssForCausalLM: Llama with q/k/v biases and an
o bias) and Hunyuan dense (HunYuanDenseV1ForCausalLM: q/k norms per head
after RoPE, NTK-alpha RoPE). What is specific to them: their configs and
refusals (`families_dense`), their weights' names, the NumPy forward pass
against transformers' goldens with the misreadings those would catch, and
their GGUF files (`exaone4`, `seed_oss`, `hunyuan-dense`: `gguf_dense`)
against llama.cpp itself. The rest (teacher forcing, paged, chunked,
batched, static schedule, CUDA lanes, half precision, transformers'
goldens of the compiled model and its greedy tokens, tensor parallelism
on 2 ranks, GGUF Q8_0 packed) is test_families.py's, parametrised over
them (`exaone4`, `seed_oss`, `hunyuan_dense`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.testing import (as_transformers5, checkpoint_tensors, tiny_config,
                                write_checkpoint, write_gguf)

import hf_goldens_families as goldens

EXAONE4, SEED, HUNYUAN = "Exaone4ForCausalLM", "SeedOssForCausalLM", "HunYuanDenseV1ForCausalLM"


def read(architecture: str, **fields) -> ModelConfig:
    return ModelConfig.from_dict(tiny_config(architecture, **fields))


def without(architecture: str, *names, **fields) -> dict:
    """The tiny config of `architecture` without the fields `names`."""
    return {k: v for k, v in tiny_config(architecture, **fields).items() if k not in names}


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


def test_exaone4_config():
    """EXAONE 4 (the 32B's kind): no input norms, the blocks' outputs
    normed, q/k norms per head, layer 0 sliding with llama3 RoPE, layer 1
    full without RoPE, untied, no biases."""
    c = read(EXAONE4)
    assert not c.input_norms and c.sandwich_norms and c.qk_norm and not c.qk_norm_projection
    assert (c.sliding_window, c.sliding_layers, c.nope_layers) == (5, (0,), (1,))
    assert c.rope_type == "llama3" and c.rope_theta == 1e6 and not c.tie_word_embeddings
    assert not c.qkv_bias and not c.o_bias and not c.qk_norm_after_rope
    assert set(c.rope_tables()) == {"inv_freq"} and c.attention_scale == 0.25


def test_exaone4_windows_follow_transformers():
    """Exaone4Config's rules: without layer_types, all but every
    `sliding_window_pattern`-th layer slide (default 4), a string pattern
    repeats 'L' and 'G' with the last layer global; every full layer is
    without RoPE when a window is set (its default: 4096), even if none
    slides; with `sliding_window` null, no window and RoPE everywhere (the
    1.2B)."""
    c = ModelConfig.from_dict(without(EXAONE4, "layer_types", "sliding_window_pattern",
                                      num_hidden_layers=8))
    assert (c.sliding_layers, c.nope_layers) == ((0, 1, 2, 4, 5, 6), (3, 7))
    c = ModelConfig.from_dict(without(EXAONE4, "layer_types", num_hidden_layers=6))
    assert (c.sliding_layers, c.nope_layers) == ((0, 1, 2, 4), (3, 5))
    c = ModelConfig.from_dict(without(EXAONE4, "layer_types", num_hidden_layers=5,
                                      sliding_window_pattern=2))
    assert (c.sliding_layers, c.nope_layers) == ((0, 2, 4), (1, 3))
    c = ModelConfig.from_dict(without(EXAONE4, "layer_types", "sliding_window"))
    assert (c.sliding_window, c.sliding_layers, c.nope_layers) == (4096, (0,), (1,))
    full = read(EXAONE4, layer_types=["full_attention"] * 2)
    assert (full.sliding_window, full.sliding_layers, full.nope_layers) == (None, (), (0, 1))
    dense = read(EXAONE4, sliding_window=None, sliding_window_pattern=None,
                 layer_types=["full_attention"] * 2, tie_word_embeddings=True)
    assert (dense.sliding_window, dense.sliding_layers, dense.nope_layers) == (None, (), ())
    assert dense.tie_word_embeddings
    assert ModelConfig.from_dict(without(EXAONE4, "layer_types", sliding_window=None)) == \
        dataclasses.replace(dense, tie_word_embeddings=False)


def test_seed_oss_config_and_its_defaults():
    """Seed-OSS: q/k/v biases (default present), an o bias where
    attention_out_bias says (default absent), head_dim 128 where
    config.json has none, its training-only dropouts read and left."""
    c = read(SEED)
    assert c.qkv_bias and c.o_bias and c.input_norms and not c.sandwich_norms
    assert not c.qk_norm and c.rope_theta == 1e7 and not c.tie_word_embeddings
    bare = ModelConfig.from_dict(without(SEED, "attention_bias", "attention_out_bias",
                                         "head_dim", "attention_dropout", "residual_dropout"))
    assert (bare.qkv_bias, bare.o_bias, bare.head_dim) == (True, False, 128)
    assert not read(SEED, attention_bias=False).qkv_bias
    assert ModelConfig.from_dict(as_transformers5(tiny_config(SEED))) == c


def test_hunyuan_config_and_ntk_alpha():
    """Hunyuan dense: q/k norms per head after RoPE; "dynamic" RoPE with an
    alpha is transformers' NTK-alpha, plain RoPE of base theta x
    alpha^(d / (d - 2)) (here 1e4 x 1000^(8/6) = 1e8), its other keys
    ignored as transformers ignores them; the base nested in
    rope_parameters too; tied."""
    c = read(HUNYUAN)
    assert c.qk_norm and c.qk_norm_after_rope and not c.qk_norm_projection
    assert c.rope_scaling is None and c.rope_theta == pytest.approx(1e8, rel=1e-12)
    assert c.tie_word_embeddings and c.head_dim == 8 and not c.qkv_bias
    np.testing.assert_allclose(c.rope_tables()["inv_freq"], [1, 1e-2, 1e-4, 1e-6], rtol=1e-6)
    assert ModelConfig.from_dict(as_transformers5(tiny_config(HUNYUAN))) == c
    plain = read(HUNYUAN, rope_scaling=None)
    assert (plain.rope_theta, plain.rope_scaling) == (1e4, None)
    nested = without(HUNYUAN, "rope_theta", "rope_scaling")
    nested["rope_parameters"] = {"rope_type": "dynamic", "alpha": 8.0, "rope_theta": 500.0}
    assert ModelConfig.from_dict(nested).rope_theta == pytest.approx(500 * 8 ** (8 / 6))
    assert read(HUNYUAN, rope_scaling={"rope_type": "linear", "factor": 2.0}).rope_type == "linear"


@pytest.mark.parametrize("architecture, fields, match", [
    (EXAONE4, {"sliding_window": None}, r"field 'sliding_window' is null, but layers \[0\] "
                                         r"are 'sliding_attention'"),
    (EXAONE4, {"layer_types": None, "sliding_window_pattern": "LLXG"},
     r"'sliding_window_pattern' = 'LLXG' must be a string of 'L' \(local\) and 'G'"),
    (EXAONE4, {"layer_types": None, "sliding_window_pattern": 0},
     r"'sliding_window_pattern' = 0 must be a positive integer"),
    (EXAONE4, {"layer_types": ["chunked_attention", "full_attention"]},
     r"field 'layer_types' lists 'chunked_attention'"),
    (EXAONE4, {"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    (EXAONE4, {"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu' is not supported"),
    (EXAONE4, {"attention_dropout": 1.0}, r"'attention_dropout' = 1.0 must be a probability"),
    (SEED, {"mlp_bias": True}, r"field 'mlp_bias' = True is not supported"),
    (SEED, {"attention_out_bias": "yes"}, r"'attention_out_bias' = 'yes' must be true or false"),
    (SEED, {"residual_dropout": -0.1}, r"'residual_dropout' = -0.1 must be a probability"),
    (SEED, {"sliding_window": 8, "layer_types": ["sliding_attention"] * 2},
     r"only 'full_attention' is supported"),
    (HUNYUAN, {"use_cla": True}, r"'use_cla' = True is not supported .*cross-layer attention"),
    (HUNYUAN, {"use_mla": True}, r"'use_mla' = True is not supported"),
    (HUNYUAN, {"num_experts": 8}, r"'num_experts' = 8 is not supported .*HunYuanMoEV1"),
    (HUNYUAN, {"use_qk_norm": False}, r"'use_qk_norm' = False is not supported"),
    (HUNYUAN, {"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    (HUNYUAN, {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"dynamic NTK scaling"),
    (HUNYUAN, {"rope_scaling": {"type": "dynamic", "alpha": 10.0, "low_freq_factor": 1.0}},
     r"NTK-alpha\) has 'low_freq_factor', which ETC does not implement"),
    (HUNYUAN, {"rope_scaling": {"type": "dynamic", "alpha": -1.0}},
     r"'rope_scaling.alpha' = -1.0 must be a finite positive number"),
    (HUNYUAN, {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
     r"rope_type 'yarn' is not supported for HunYuanDenseV1ForCausalLM"),
])
def test_refusals_name_the_field(architecture, fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        read(architecture, **fields)


# ----------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------


def test_weights_as_the_graph_names_them(tmp_path):
    """EXAONE 4's post-attention and post-feedforward norms and no input
    norms; Hunyuan's query_layernorm / key_layernorm as the q/k norms (a
    missing one named); Seed-OSS's q/k/v and o biases."""
    import etc.models as models

    cases = {}
    for architecture in (EXAONE4, SEED, HUNYUAN):
        config = tiny_config(architecture)
        cases[architecture] = (Checkpoint(write_checkpoint(tmp_path / architecture, config,
                                                           seed=2)).weights(),
                               checkpoint_tensors(config, 2))
    weights, raw = cases[EXAONE4]
    p = "model.layers.1."
    assert "l0_attn_norm" not in weights and "l0_mlp_norm" not in weights
    np.testing.assert_array_equal(weights["l1_post_attn_norm"],
                                  raw[p + "post_attention_layernorm.weight"])
    np.testing.assert_array_equal(weights["l1_post_mlp_norm"],
                                  raw[p + "post_feedforward_layernorm.weight"])
    assert weights["l1_q_norm"].shape == (16,)
    weights, raw = cases[HUNYUAN]
    np.testing.assert_array_equal(weights["l1_q_norm"], raw[p + "self_attn.query_layernorm.weight"])
    np.testing.assert_array_equal(weights["l1_k_norm"], raw[p + "self_attn.key_layernorm.weight"])
    assert "lm_head" not in weights
    weights, raw = cases[SEED]
    np.testing.assert_array_equal(weights["l1_bo"], raw[p + "self_attn.o_proj.bias"])
    np.testing.assert_array_equal(weights["l1_bk"], raw[p + "self_attn.k_proj.bias"])
    path = write_checkpoint(tmp_path / "missing", tiny_config(HUNYUAN), seed=2,
                            drop=("model.layers.0.self_attn.key_layernorm.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.layers.0.self_attn.key_layernorm.weight' \(layer 0 "
                             r"k_norm\) is missing"):
        Checkpoint(path).weights()


def test_tensor_parallel_shards_split_by_heads():
    """Per-head q/k norms and biases split by heads: each family shards
    over 2 ranks (test_families.py checks their logits against one rank's);
    the o bias counts once, after the all-reduce (`graph`)."""
    from etc.models.step.parallel import shard_config

    for architecture in (EXAONE4, SEED, HUNYUAN):
        c = read(architecture)
        shard = shard_config(c, 2)
        assert (shard.num_heads, shard.num_kv_heads) == (2, 1)
        assert (shard.nope_layers, shard.qk_norm_after_rope, shard.o_bias) == \
            (c.nope_layers, c.qk_norm_after_rope, c.o_bias)


# ----------------------------------------------------------------------
# Against transformers and llama.cpp, and what they catch
# ----------------------------------------------------------------------


def replaced(**fields):
    return lambda c, w: (dataclasses.replace(c, **fields), w)


@pytest.mark.parametrize("name, mutations", [
    ("exaone4-transformers4-f32", {
        "RoPE on the full layers too": replaced(nope_layers=()),
        "no window": replaced(sliding_layers=()),
        "plain RoPE (llama3 scaling dropped)": replaced(rope_scaling=None)}),
    ("exaone4-transformers5-f32", {"RoPE on the full layers too": replaced(nope_layers=())}),
    ("seed_oss-transformers4-f32", {
        "no o bias": replaced(o_bias=False),
        "no q/k/v biases": replaced(qkv_bias=False)}),
    ("hunyuan_dense-transformers4-f32", {
        "q/k norms before RoPE": replaced(qk_norm_after_rope=False),
        "alpha ignored (the base 1e4)": replaced(rope_theta=1e4)}),
    ("hunyuan_dense-transformers5-f32", {
        "q/k norms before RoPE": replaced(qk_norm_after_rope=False)}),
])
def test_numpy_forward_matches_transformers_and_the_mistakes_do_not(name, mutations, tmp_path):
    """The NumPy forward pass on the config and weights ETC reads is
    transformers' (the golden's logits within tolerance), and the
    plausible misreadings miss them: EXAONE 4 rotating its full layers,
    without its window (the golden's sequences outgrow it) or without
    llama3's scaling; Seed-OSS without either bias; Hunyuan's norms
    before RoPE or its alpha ignored."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), mutations)


@pytest.mark.parametrize("arch", ["exaone4", "exaone4_dense", "seed_oss", "hunyuan_dense"])
def test_gguf_files_run_by_llama_cpp(arch, tmp_path):
    """llama.cpp (llama-cpp-python 0.3.36) on the F32 GGUF file `write_gguf`
    writes (gguf_goldens.RUNS): the NumPy forward pass on the config and
    weights ETC reads from it is within 0.05 of the logits' rms at every
    position (measured 0.006, 0.010, 0.004), the 64 layers of EXAONE 4's
    hybrid within 0.25 with keys and values rounded to f16 as llama.cpp
    keeps them (measured 0.14: its sharp layers compound the rounding); and
    the misreadings miss by over 2 (measured 2.1 to 5.1): EXAONE 4's full
    layers rotated, its window dropped, its llama3 factors (rope_freqs)
    dropped; Seed-OSS's biases dropped; Hunyuan's norms before RoPE."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(arch, tmp_path)
    kv = "f16" if arch == "exaone4" else "f32"

    def error(config, read=weights):
        return gguf_goldens.run_error(run, reference.forward(config, read, run["sequence"],
                                                             kv_dtype=kv))

    c = gg.config
    assert error(c) < (0.25 if arch == "exaone4" else 0.05)
    misread = []
    if arch.startswith("exaone4"):
        assert "inv_freq" in weights and c.rope_scaling is None
        misread.append(error(c, {k: v for k, v in weights.items() if k != "inv_freq"}))
    if arch == "exaone4":
        assert c.sliding_layers[:4] == (0, 1, 2, 4) and c.nope_layers[:2] == (3, 7)
        misread += [error(dataclasses.replace(c, nope_layers=())),
                    error(dataclasses.replace(c, sliding_layers=()))]
    if arch == "seed_oss":
        assert c.qkv_bias and not c.o_bias
        misread.append(error(dataclasses.replace(c, qkv_bias=False)))
    if arch == "hunyuan_dense":
        assert c.qk_norm_after_rope and c.rope_theta == 1e8
        misread.append(error(dataclasses.replace(c, qk_norm_after_rope=False)))
    assert misread and min(misread) > 2, misread


def test_gguf_keys_as_llama_cpp_reads_them(tmp_path):
    """exaone4: the window on the layers the per-layer flags name (without
    them, all but every 4th); a file without window keys is the 1.2B's
    kind (no window, RoPE everywhere),
    but at 64 layers llama.cpp's rule for the 32B (window 4096 on all but
    every 4th layer); the llama3 scaling's rope_freqs factors give
    transformers' frequencies; flags of another count are refused.
    seed_oss: biases as the tensors say, the head size hidden / heads
    without key_length (llama.cpp's; SeedOssConfig's would be 128).
    hunyuan-dense: NTK-alpha as the converter folds it into the base."""
    config = tiny_config(EXAONE4, num_hidden_layers=4,
                         layer_types=["sliding_attention", "full_attention"] * 2)
    c = GGUFCheckpoint(write_gguf(tmp_path / "e.gguf", config)).config
    assert (c.sliding_window, c.sliding_layers, c.nope_layers) == (5, (0, 2), (1, 3))
    assert c == dataclasses.replace(ModelConfig.from_dict(config), rope_scaling=None)
    c = GGUFCheckpoint(write_gguf(tmp_path / "unflagged.gguf", config, metadata={
        "exaone4.attention.sliding_window_pattern": None})).config
    assert (c.sliding_window, c.sliding_layers, c.nope_layers) == (5, (0, 1, 2), (3,))
    gg = GGUFCheckpoint(write_gguf(tmp_path / "bare.gguf", config, metadata={
        "exaone4.attention.sliding_window": None,
        "exaone4.attention.sliding_window_pattern": None}))
    assert (gg.config.sliding_window, gg.config.nope_layers) == (None, ())
    np.testing.assert_allclose(gg.weights()["inv_freq"][:8],
                               ModelConfig.from_dict(config).rope_tables()["inv_freq"],
                               rtol=1e-6)
    deep = tiny_config(EXAONE4, num_hidden_layers=64, layer_types=None)
    c = GGUFCheckpoint(write_gguf(tmp_path / "deep.gguf", deep, metadata={
        "exaone4.attention.sliding_window": None,
        "exaone4.attention.sliding_window_pattern": None})).config
    assert c.sliding_window == 4096 and c.nope_layers == tuple(range(3, 64, 4))
    with pytest.raises(UnsupportedConfigError, match=r"sliding_window_pattern has 3 flags for "
                                                     r"4 layers"):
        GGUFCheckpoint(write_gguf(tmp_path / "odd.gguf", config, metadata={
            "exaone4.attention.sliding_window_pattern": [True, False, True]}))
    seed = tiny_config(SEED, attention_out_bias=False, head_dim=8)
    tensors = {k: v for k, v in checkpoint_tensors(seed, 0).items() if not k.endswith(".bias")}
    c = GGUFCheckpoint(write_gguf(tmp_path / "s.gguf", seed, tensors=tensors, metadata={
        "seed_oss.attention.key_length": None, "seed_oss.attention.value_length": None,
        "seed_oss.rope.dimension_count": None})).config
    assert (c.qkv_bias, c.o_bias, c.head_dim) == (False, False, 8)
    hunyuan = GGUFCheckpoint(write_gguf(tmp_path / "h.gguf", tiny_config(HUNYUAN))).config
    assert hunyuan.rope_theta == 1e8 and hunyuan.qk_norm_after_rope
    assert hunyuan == dataclasses.replace(read(HUNYUAN), rope_theta=1e8)
    assert math.isclose(read(HUNYUAN).rope_theta, 1e8, rel_tol=1e-12)
