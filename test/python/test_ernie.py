"""ERNIE 4.5 (Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM): Llama's layers
with RoPE on interleaved pairs of the whole head, tied embeddings; the MoE
model's softmax routing that chooses by score + `moe_statics.
e_score_correction_bias` and weights by the unbiased scores divided by
max(sum, moe_norm_min), ungated shared experts, dense layers outside
moe_layer_start_index .. moe_layer_end_index (every moe_layer_interval-th);
the multi-token-prediction block's weights skipped. What is specific to it:
its configs (the published shapes) and refusals, the weights read (both of
transformers' layouts), that the interleaved pairs, the selection bias, the
clamp and the shared expert matter, the NumPy forward pass against
transformers' goldens; its GGUF files (`ernie4_5`, `ernie4_5-moe`) as the
checkpoint and as llama.cpp computes them. The rest (teacher forcing,
paged, chunked, static schedule, CUDA lanes, half precision, transformers'
goldens and greedy tokens, GGUF Q8_0, tensor parallel over MPI) is
test_families.py's, parametrised over it (`hf_goldens_families.FAMILIES`);
the routing operator's paths are test_moe_softmax_bias.py's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from etc.models.loading import partial_rotary
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.step.parallel import shard_config, shard_weights
from etc.models.testing import (as_transformers5, checkpoint_tensors, fuse_experts,
                                tiny_config, write_checkpoint, write_gguf, write_transformers5)

import hf_goldens_families as goldens
from reference_change import rms_change

DENSE, MOE = "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM"

#: ERNIE-4.5-0.3B's config.json fields.
ERNIE_03B = {
    "architectures": [DENSE], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 131072,
    "model_type": "ernie4_5", "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 128, "num_hidden_layers": 18, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "use_cache": False, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
#: ERNIE-4.5-21B-A3B's config.json fields (the original code's MoE fields
#: among them: moe_capacity, moe_gate, moe_use_aux_free, the multi-token
#: prediction layer).
ERNIE_21B = {
    "architectures": [MOE], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072,
    "model_type": "ernie4_5_moe", "num_attention_heads": 20, "num_key_value_heads": 4,
    "num_hidden_layers": 28, "pad_token_id": 0, "rms_norm_eps": 1e-05, "use_cache": False,
    "vocab_size": 103424, "rope_theta": 500000, "use_bias": False, "tie_word_embeddings": True,
    "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
    "moe_layer_end_index": 27, "moe_intermediate_size": 1536, "moe_capacity": [64, 64, 64],
    "moe_gate": "topk", "moe_k": 6, "moe_layer_interval": 1, "moe_use_aux_free": True,
    "num_nextn_predict_layers": 1, "multi_token_pred_lambda": 0.3, "torch_dtype": "bfloat16"}


def test_published_configs_follow_transformers():
    """0.3B: head_dim 128 (also its default), interleaved pairs, tied,
    RoPE base 500000 (also the default). 21B-A3B: 64 experts of 1536, 6
    per token, softmax, selection bias, the clamp at 1e-12, two shared
    experts (3072), layer 0 dense (12288), head_dim 2560 / 20. The tiny
    configs alike in both config styles; the MoE layers where
    Ernie4_5_MoeConfig puts them."""
    dense = ModelConfig.from_dict(ERNIE_03B)
    assert (dense.head_dim, dense.rope_theta, dense.tie_word_embeddings, dense.rope_interleaved,
            dense.rotary_dim, dense.qkv_bias, dense.is_moe) == (128, 5e5, True, True, None,
                                                                False, False)
    unsaid = {k: v for k, v in ERNIE_03B.items()
              if k not in ("head_dim", "rope_theta", "tie_word_embeddings")}
    assert ModelConfig.from_dict(unsaid) == dense
    moe = ModelConfig.from_dict(ERNIE_21B)
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size, moe.intermediate_size, moe.head_dim) == \
        (64, 6, 1536, 3072, 12288, 128)
    assert (moe.moe_scoring, moe.selection_bias, moe.norm_topk_prob, moe.moe_norm_min,
            moe.shared_expert_gate, moe.n_group) == ("softmax", True, True, 1e-12, False, 1)
    assert moe.sparse_layers == tuple(range(1, 28)) and moe.rope_interleaved
    for name in (DENSE, MOE):
        tiny = tiny_config(name)
        assert ModelConfig.from_dict(as_transformers5(tiny)) == ModelConfig.from_dict(tiny)
    read = lambda **fields: ModelConfig.from_dict({**ERNIE_21B, **fields})
    assert read(moe_layer_start_index=0, moe_layer_end_index=9, moe_layer_interval=3) \
        .sparse_layers == (2, 5, 8)
    assert read(moe_layer_end_index=-1).sparse_layers == tuple(range(1, 28))
    assert read(moe_num_shared_experts=None).shared_expert_intermediate_size == 2 * 1536
    assert read(moe_num_shared_experts=0).shared_expert_intermediate_size == 0
    # The original code's aux-free bias off: no moe_statics to read (transformers' zeros).
    assert not read(moe_use_aux_free=False).selection_bias
    assert read(moe_norm_min=0).moe_norm_min == 0.0
    # transformers' attribute_map names.
    assert read(moe_num_experts=None, num_experts=64, moe_k=None, num_experts_per_tok=6) == moe


@pytest.mark.parametrize("fields, message", [
    ({"use_bias": True}, r"field 'use_bias' = True is not supported: ERNIE 4.5 then has biases"),
    ({"use_bias": 1}, r"field 'use_bias' = 1 must be true or false"),
    ({"use_rmsnorm": False}, r"field 'use_rmsnorm' = False is not supported \(LayerNorm"),
    ({"moe_num_experts": None}, r"field 'moe_num_experts' is missing"),
    ({"num_experts": 4}, r"field 'num_experts' = 4 contradicts moe_num_experts = 8 \(transf"),
    ({"num_experts_per_tok": 1}, r"field 'num_experts_per_tok' = 1 contradicts moe_k = 2"),
    ({"moe_num_experts": [64, 64]}, r"field 'moe_num_experts' = \[64, 64\] must be a positive"),
    ({"moe_k": 9}, r"field 'moe_k' = 9 exceeds moe_num_experts = 8"),
    ({"moe_layer_start_index": [1, 1]}, r"'moe_layer_start_index' = \[1, 1\] must be a layer"),
    ({"moe_layer_start_index": -1}, r"'moe_layer_start_index' = -1 must be a layer index"),
    ({"moe_layer_end_index": 2}, r"'moe_layer_end_index' = 2 must be a layer index from 0 to "
                                 r"num_hidden_layers - 1 = 1 \(or -1: the last\)"),
    ({"moe_layer_interval": 0}, r"field 'moe_layer_interval' = 0 must be a positive"),
    ({"moe_num_shared_experts": -1}, r"'moe_num_shared_experts' = -1 must be a non-negative"),
    ({"moe_norm_min": -1e-12}, r"'moe_norm_min' = -1e-12 must be a finite non-negative"),
    ({"moe_gate_act": "sigmoid"}, r"'moe_gate_act' = 'sigmoid' is not supported \(ERNIE 4.5's "
                                  r"router scores by softmax\)"),
    ({"moe_gate": 2}, r"field 'moe_gate' = 2 must be a string"),
    ({"moe_capacity": 8}, r"field 'moe_capacity' = 8 must be a list"),
    ({"moe_use_aux_free": "yes"}, r"field 'moe_use_aux_free' = 'yes' must be true or false"),
    ({"num_nextn_predict_layers": -1}, r"'num_nextn_predict_layers' = -1 must be a non-neg"),
    ({"router_aux_loss_coef": "x"}, r"'router_aux_loss_coef' = 'x' must be a finite number"),
    ({"partial_rotary_factor": 0.5}, r"'partial_rotary_factor' = 0.5 is not supported for "
                                     r"Ernie4_5_MoeForCausalLM"),
    ({"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    ({"intermediate_size": None}, r"field 'intermediate_size' is missing"),
])
def test_malformed_configs_are_refused_naming_the_field(fields, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        ModelConfig.from_dict(tiny_config(MOE, **fields))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return Checkpoint(write_checkpoint(tmp_path_factory.mktemp("ernie") / "moe",
                                       tiny_config(MOE), seed=4))


def test_weights_read_and_the_prediction_block_skipped(checkpoint):
    """Layer 0 dense, layer 1 sparse with the router, its float32 (1, E)
    selection bias read as (E,) in every dtype (a bf16 checkpoint's
    compute dtype stays bf16), stacked experts and the shared experts (no
    gate); q and k rows permuted to the step graph's pairs; nothing of the
    multi-token-prediction block."""
    weights = checkpoint.weights(dtype="bf16")
    assert {"l0_w_gate", "l1_router", "l1_experts_gate", "l1_shexp_down",
            "l1_selection_bias"} <= set(weights)
    assert weights["l1_selection_bias"].dtype == np.float32
    assert weights["l1_selection_bias"].shape == (8,)
    assert not any(k.startswith("mtp") or "shexp_gate_inp" in k for k in weights)
    assert "lm_head" not in weights and "l0_selection_bias" not in weights
    raw = checkpoint_tensors(tiny_config(MOE), 4)
    np.testing.assert_array_equal(checkpoint.weights()["l1_selection_bias"],
                                  raw["model.layers.1.mlp.moe_statics.e_score_correction_bias"][0])
    q = raw["model.layers.0.self_attn.q_proj.weight"]
    perm = partial_rotary.permutation(16, 16, interleaved=True)
    np.testing.assert_array_equal(checkpoint.weights()["l0_wq"][:16], q[perm])


def test_bf16_checkpoint_computes_in_bf16(tmp_path):
    """The float32 (1, E) selection bias beside bf16 weights (as
    transformers keeps it) leaves the compute dtype bf16."""
    path = write_checkpoint(tmp_path / "bf16", tiny_config(MOE), dtype="BF16", seed=4)
    assert Checkpoint(path).default_dtype() == "bf16"


def test_transformers5_layout_reads_alike(checkpoint, tmp_path):
    """The experts and the selection bias as transformers 5 holds them
    and saves them with `save_original_format=False`
    (`mlp.experts.gate_up_proj` (E, 2F, H), `mlp.experts.down_proj`
    (E, H, F), `mlp.gate.moe_statics.e_score_correction_bias`): the
    published layout's graph weights, bit for bit."""
    config = tiny_config(MOE)
    p = "model.layers.1.mlp."
    fused = fuse_experts(checkpoint_tensors(config, 4), p + "experts.", config["moe_num_experts"])
    fused[p + "gate.moe_statics.e_score_correction_bias"] = \
        fused.pop(p + "moe_statics.e_score_correction_bias")
    path = write_transformers5(tmp_path / "v5", config, fused)
    got, want = Checkpoint(path).weights(), checkpoint.weights()
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_routing_parts_matter(checkpoint):
    """The tiny model's logits move by a good part of their rms without the
    selection bias, the clamp, the shared expert, or read with RoPE's
    halves paired instead of interleaved pairs."""
    c, weights = checkpoint.config, checkpoint.weights()
    unbiased = {k: np.zeros_like(v) if k.endswith("selection_bias") else v
                for k, v in weights.items()}
    assert rms_change(c, weights, changed_weights=unbiased) > 0.1
    assert rms_change(c, weights, dataclasses.replace(c, moe_norm_min=1e-12)) > 0.1
    unshared = {k: np.zeros_like(v) if k.endswith("shexp_down") else v
                for k, v in weights.items()}
    assert rms_change(c, weights, changed_weights=unshared) > 0.1
    halves = partial_rotary.to_hf_layout(c, weights)
    assert rms_change(c, weights, dataclasses.replace(c, rope_interleaved=False), halves) > 0.1


def _halves(config, weights):
    """The misreading of RoPE's pairs as Llama's halves."""
    return (dataclasses.replace(config, rope_interleaved=False),
            partial_rotary.to_hf_layout(config, weights))


@pytest.mark.parametrize("name", [n for n in goldens.cases() if n.startswith("ernie")])
def test_numpy_forward_matches_the_transformers_goldens(name, tmp_path):
    """The NumPy forward pass on the golden checkpoints (float32 compute,
    the bf16 cases' weights as stored) is within the goldens' tolerance of
    transformers' logits at every position (measured 0.017 of it for the
    dense model and 0.016 for the MoE in f32; 0.14 and 0.091 against
    transformers' bf16), and outside it with RoPE's halves paired, and
    for the MoE without the selection bias or without the clamp at
    moe_norm_min: thousands of times in f32 (more than 2 asked); 10, 6.3,
    2.0 and 1.7 times against bf16 (more than 1 asked: bf16's tolerance is
    0.4 of the logits' rms)."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    misreadings = {"RoPE halves": _halves}
    if checkpoint.config.is_moe:
        misreadings.update({
            "no selection bias": lambda c, w: (c, {k: np.zeros_like(v)
                                                   if k.endswith("selection_bias") else v
                                                   for k, v in w.items()}),
            "no clamp": lambda c, w: (dataclasses.replace(c, moe_norm_min=0.0), w)})
    golden.check_reference(checkpoint.config, checkpoint.weights(), misreadings,
                           miss=2 if golden.dtype == "f32" else 1)


def test_tensor_parallel_shards(checkpoint):
    """Over 2 ranks each keeps half of every expert's, the shared experts'
    and the dense MLP's columns and the whole router and selection bias
    (every rank routes alike, the clamp on the whole sum; test_families.py
    runs the shards over MPI)."""
    weights = checkpoint.weights()
    config = shard_config(checkpoint.config, 2)
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size,
            config.intermediate_size, config.moe_norm_min) == (16, 16, 24, 0.5)
    for rank in range(2):
        shard = shard_weights(checkpoint.config, weights, 2, rank)
        rows = slice(16 * rank, 16 * (rank + 1))
        for key in ("l1_router", "l1_selection_bias"):
            np.testing.assert_array_equal(shard[key], weights[key])
        np.testing.assert_array_equal(shard["l1_experts_up"], weights["l1_experts_up"][:, rows])
        np.testing.assert_array_equal(shard["l1_shexp_gate"], weights["l1_shexp_gate"][rows])


# ----------------------------------------------------------------------
# GGUF
# ----------------------------------------------------------------------


@pytest.mark.parametrize("architecture", [DENSE, MOE])
def test_gguf_reads_as_the_checkpoint(architecture, tmp_path):
    """An ernie4_5 / ernie4_5-moe file as llama.cpp's converter lays it out
    (q and k unpermuted, exp_probs_b (1, E), the MoE keys, the shared
    expert's width intermediate_size / KV heads, no multi-token
    prediction) reads as the checkpoint: the same config and weights; an
    exp_probs_b of (E,) too; a shared width no multiple of an expert's is
    refused, and a file without exp_probs_b has no selection bias."""
    config = tiny_config(architecture, intermediate_size=64, moe_norm_min=None)
    st = Checkpoint(write_checkpoint(tmp_path / "st", config, seed=4))
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, seed=4))
    assert gg.config == st.config
    weights, want = gg.weights(), st.weights()
    assert set(weights) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(weights[key], value, err_msg=key)
    if architecture == DENSE:
        return
    tensors = checkpoint_tensors(config, 4)
    name = "model.layers.1.mlp.moe_statics.e_score_correction_bias"
    flat = GGUFCheckpoint(write_gguf(tmp_path / "flat.gguf", config, tensors={
        **tensors, name: tensors[name].reshape(-1)}))
    np.testing.assert_array_equal(flat.weights()["l1_selection_bias"], want["l1_selection_bias"])
    with pytest.raises(UnsupportedConfigError, match=r"ernie4_5-moe.expert_shared_feed_forward_"
                                                     r"length = 24 is not a multiple of "
                                                     r"ernie4_5-moe.expert_feed_forward_length"):
        GGUFCheckpoint(write_gguf(tmp_path / "shared.gguf", config, metadata={
            "ernie4_5-moe.expert_shared_feed_forward_length": 24})).config
    unbiased = GGUFCheckpoint(write_gguf(tmp_path / "unbiased.gguf", config,
                                         drop=("blk.1.exp_probs_b.bias",)))
    assert not unbiased.config.selection_bias and "l1_selection_bias" not in unbiased.weights()


@pytest.mark.parametrize("arch", ["ernie", "ernie_moe"])
def test_gguf_computes_what_llama_cpp_computes(arch, tmp_path):
    """ERNIE 4.5 GGUF files run by llama.cpp itself (its logits in
    goldens/gguf-<arch>-llama-cpp.npz by gguf_goldens.py --runs;
    llama-cpp-python 0.3.36): the NumPy forward pass on what ETC reads
    from the file is within 0.05 of the logits' rms of llama.cpp's at
    every position (measured 0.0087 dense, 0.010 MoE), and misses by far
    with RoPE's halves paired (4.2, 6.7) and, for the MoE, without the
    selection bias (2.1) or the shared expert (4.1)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(arch, tmp_path)

    def error(w, config=gg.config):
        return gguf_goldens.run_error(run, reference.forward(config, w, run["sequence"]))

    assert error(weights) < 0.05
    halves_config, halves = _halves(gg.config, weights)
    assert error(halves, halves_config) > 1
    if gg.config.is_moe:
        for suffix in ("selection_bias", "shexp_down"):
            assert error({k: np.zeros_like(v) if k.endswith(suffix) else v
                          for k, v in weights.items()}) > 1, suffix
