"""GLM-4.5 (Glm4MoeForCausalLM): sigmoid-routed experts with a selection
bias (`mlp.gate.e_score_correction_bias`) among expert groups, weights
times `routed_scaling_factor`, ungated shared experts
(`mlp.shared_experts`), dense layers before `first_k_dense_replace`, q/k/v
biases, optional q/k norms, half of each head rotated; the
multi-token-prediction layer's weights skipped. What is specific to it:
its config (GLM-4.5-Air's as published) and refusals, the weights read,
that the selection bias, the groups and the scale matter, and the NumPy
forward pass against transformers' goldens; its GGUF file (`glm4moe`) as
the checkpoint and as llama.cpp computes it. The rest (teacher forcing,
paged, chunked, static schedule, CUDA lanes, half precision, transformers'
goldens and greedy tokens, tensor parallel over MPI) is
test_families.py's, parametrised over it (`hf_goldens_families.FAMILIES`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.step.parallel import shard_config, shard_weights
from etc.models.testing import (as_transformers5, checkpoint_tensors, fuse_experts,
                                tiny_config, write_checkpoint, write_gguf, write_transformers5)

import hf_goldens_families as goldens
from reference_change import rms_change

GLM = "Glm4MoeForCausalLM"

#: zai-org/GLM-4.5-Air's config.json.
GLM45_AIR = {
    "architectures": [GLM], "attention_bias": True, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": False,
    "vocab_size": 151552}


def test_glm45_air_config_follows_transformers():
    """GLM-4.5-Air: 128 experts of 1408, 8 per token, sigmoid scores with
    the selection bias, one group, renormalised, one shared expert, layer 0
    dense (10944), q/k/v biases, no q/k norms, RoPE on 64 of 128
    dimensions; the tiny config in both config styles alike, with its
    groups, scale and q/k norms; partial rotary 0.5 where no factor is
    given (transformers' default)."""
    config = ModelConfig.from_dict(GLM45_AIR)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size, config.intermediate_size) == \
        (128, 8, 1408, 1408, 10944)
    assert (config.moe_scoring, config.selection_bias, config.n_group, config.topk_group,
            config.routed_scaling_factor) == ("sigmoid", True, 1, 1, 1.0)
    assert config.sparse_layers == tuple(range(1, 46)) and config.num_layers == 46
    assert config.qkv_bias and not config.o_bias and not config.qk_norm
    assert config.norm_topk_prob and not config.shared_expert_gate
    assert config.rotary_dim == 64 and config.rope_theta == 1e6
    tiny = tiny_config(GLM)
    config = ModelConfig.from_dict(tiny)
    assert ModelConfig.from_dict(as_transformers5(tiny)) == config
    assert (config.n_group, config.topk_group, config.routed_scaling_factor, config.qk_norm,
            config.rotary_dim, config.sparse_layers) == (2, 1, 2.5, True, 8, (1,))
    unsaid = {k: v for k, v in tiny.items() if k != "partial_rotary_factor"}
    assert ModelConfig.from_dict(unsaid).rotary_dim == 8
    assert ModelConfig.from_dict({**tiny, "n_shared_experts": 0}) \
        .shared_expert_intermediate_size == 0


@pytest.mark.parametrize("fields, message", [
    ({"n_group": 3}, r"field 'n_group' = 3 must divide n_routed_experts = 8"),
    ({"n_group": 8, "topk_group": 1}, r"'n_group' = 8 must divide .* groups of at least 2"),
    ({"topk_group": 3}, r"field 'topk_group' = 3 exceeds n_group = 2"),
    ({"num_experts_per_tok": 5}, r"'num_experts_per_tok' = 5 exceeds the 4 experts of the "
                                 r"topk_group = 1 groups"),
    ({"n_routed_experts": None}, r"field 'n_routed_experts' is missing"),
    ({"first_k_dense_replace": 3}, r"'first_k_dense_replace' = 3 must be an integer from 0"),
    ({"n_shared_experts": -1}, r"field 'n_shared_experts' = -1 must be a non-negative"),
    ({"num_nextn_predict_layers": "1"}, r"'num_nextn_predict_layers' = '1' must be a non-neg"),
    ({"num_mtp_layers": -1}, r"field 'num_mtp_layers' = -1 must be a non-negative"),
    ({"routed_scaling_factor": 0}, r"'routed_scaling_factor' = 0 must be a finite positive"),
    ({"use_qk_norm": "yes"}, r"field 'use_qk_norm' = 'yes' must be true or false"),
    ({"attention_bias": 1}, r"field 'attention_bias' = 1 must be true or false"),
    ({"norm_topk_prob": None, "n_group": 0}, r"field 'n_group' = 0 must be a positive"),
    ({"router_aux_loss_coef": "x"}, r"'router_aux_loss_coef' = 'x' must be a finite number"),
    ({"mlp_bias": True}, r"field 'mlp_bias' = True is not supported"),
])
def test_malformed_configs_are_refused_naming_the_field(fields, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        ModelConfig.from_dict(tiny_config(GLM, **fields))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return Checkpoint(write_checkpoint(tmp_path_factory.mktemp("glm") / "glm",
                                       tiny_config(GLM), seed=4))


def test_weights_read_and_the_prediction_layer_skipped(checkpoint):
    """Layer 0 dense, layer 1 sparse with the router, its float32 selection
    bias, stacked experts and the shared expert (no gate); q/k/v biases
    and norms; nothing of layer 2 (the multi-token-prediction layer)."""
    weights = checkpoint.weights(dtype="bf16")
    assert {"l0_w_gate", "l1_router", "l1_experts_gate", "l1_shexp_down", "l1_bq",
            "l0_q_norm"} <= set(weights)
    assert weights["l1_selection_bias"].dtype == np.float32
    assert weights["l1_selection_bias"].shape == (8,)
    assert not any(k.startswith("l2_") or k.endswith("shexp_gate_inp") for k in weights)
    assert "l0_selection_bias" not in weights and "l1_w_gate" not in weights


def test_transformers5_fused_experts_read_alike(checkpoint, tmp_path):
    """The experts as transformers 5 holds them and saves them with
    `save_original_format=False` (`mlp.experts.gate_up_proj` (E, 2F, H),
    `mlp.experts.down_proj` (E, H, F)): the per-expert checkpoint's graph
    weights, bit for bit, the router's selection bias among them."""
    config = tiny_config(GLM)
    fused = fuse_experts(checkpoint_tensors(config, 4), "model.layers.1.mlp.experts.",
                         config["n_routed_experts"])  # (layer 0 is dense)
    path = write_transformers5(tmp_path / "v5", config, fused)
    got, want = Checkpoint(path).weights(), checkpoint.weights()
    assert set(got) == set(want) and "l1_selection_bias" in got
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_routing_parts_matter(checkpoint):
    """The tiny model's logits move by a good part of their rms without the
    selection bias, the groups, the scale or the shared expert."""
    c, weights = checkpoint.config, checkpoint.weights()
    unbiased = {k: np.zeros_like(v) if k.endswith("selection_bias") else v
                for k, v in weights.items()}
    assert rms_change(c, weights, changed_weights=unbiased) > 0.1
    assert rms_change(c, weights, dataclasses.replace(c, n_group=1, topk_group=1)) > 0.1
    assert rms_change(c, weights, dataclasses.replace(c, routed_scaling_factor=1.0)) > 0.1
    unshared = {k: np.zeros_like(v) if k.endswith("shexp_down") else v
                for k, v in weights.items()}
    assert rms_change(c, weights, changed_weights=unshared) > 0.1


@pytest.mark.parametrize("name", [n for n in goldens.cases() if n.startswith("glm4_moe-")])
def test_numpy_forward_matches_the_transformers_goldens(name, tmp_path):
    """The NumPy forward pass on the golden checkpoints (float32 compute,
    the bf16 case's weights as stored) is within the goldens' tolerance
    of transformers' logits at every position (measured 0.0093 of it in
    f32, 0.084 against transformers' bf16), and far outside it without the
    selection bias (7 times it in bf16, thousands in f32)."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), {
        "no selection bias": lambda c, w: (c, {k: np.zeros_like(v) if k.endswith("selection_bias")
                                               else v for k, v in w.items()})}, miss=2)


def test_tensor_parallel_shards(checkpoint):
    """Over 2 ranks each keeps half of every expert's and of the shared
    expert's columns, and the whole router and selection bias (every rank
    routes alike; test_families.py runs the shards over MPI)."""
    weights = checkpoint.weights()
    config = shard_config(checkpoint.config, 2)
    assert (config.moe_intermediate_size, config.shared_expert_intermediate_size) == (16, 16)
    for rank in range(2):
        shard = shard_weights(checkpoint.config, weights, 2, rank)
        rows = slice(16 * rank, 16 * (rank + 1))
        for key in ("l1_router", "l1_selection_bias"):
            np.testing.assert_array_equal(shard[key], weights[key])
        np.testing.assert_array_equal(shard["l1_experts_gate"], weights["l1_experts_gate"][:, rows])
        np.testing.assert_array_equal(shard["l1_experts_down"],
                                      weights["l1_experts_down"][:, :, rows])
        np.testing.assert_array_equal(shard["l1_shexp_up"], weights["l1_shexp_up"][rows])


# ----------------------------------------------------------------------
# GGUF
# ----------------------------------------------------------------------


def test_gguf_reads_as_the_checkpoint(checkpoint, tmp_path):
    """A glm4moe file as llama.cpp's converter lays it out (block_count
    counting the multi-token-prediction layer, exp_probs_b, the expert
    keys, rope.dimension_count half the head) reads as the checkpoint:
    the same config and weights; a softmax gating function and a
    nextn_predict_layers that is no count are refused, and a
    rope.dimension_count of the whole head is read as such."""
    config = tiny_config(GLM)
    gg = GGUFCheckpoint(write_gguf(tmp_path / "glm.gguf", config, seed=4))
    assert gg.config == checkpoint.config and gg.config.num_layers == 2
    weights, want = gg.weights(), checkpoint.weights()
    assert set(weights) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(weights[key], value, err_msg=key)
    with pytest.raises(UnsupportedConfigError, match=r"glm4moe.expert_gating_func = 1 is not "
                                                     r"supported: GLM-4.5 routes by sigmoid"):
        GGUFCheckpoint(write_gguf(tmp_path / "softmax.gguf", config,
                                  metadata={"glm4moe.expert_gating_func": 1})).config
    with pytest.raises(UnsupportedConfigError, match=r"glm4moe.nextn_predict_layers = '1' "
                                                     r"must be a non-negative integer"):
        GGUFCheckpoint(write_gguf(tmp_path / "nextn.gguf", config,
                                  metadata={"glm4moe.nextn_predict_layers": "1"})).config
    whole = write_gguf(tmp_path / "whole.gguf", config,
                       metadata={"glm4moe.rope.dimension_count": 16})
    assert GGUFCheckpoint(whole).config.rotary_dim is None


def test_gguf_computes_what_llama_cpp_computes(tmp_path):
    """A GLM-4.5 GGUF file (2 groups of 4 experts, the best 1 kept) run by
    llama.cpp itself (its logits in goldens/gguf-glm4_moe-llama-cpp.npz by
    gguf_goldens.py --runs; llama-cpp-python 0.3.36): the NumPy forward
    pass on what ETC reads from the file is within 0.05 of the logits' rms
    of llama.cpp's at every position (measured 0.0032), and misses by far
    without the selection bias (4.1), the groups (2.3), the scale (1.5) or
    the shared expert (2.1)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run("glm4_moe", tmp_path)

    def error(w, config=gg.config):
        return gguf_goldens.run_error(run, reference.forward(config, w, run["sequence"]))

    assert error(weights) < 0.05
    for suffix in ("selection_bias", "shexp_down"):
        assert error({k: np.zeros_like(v) if k.endswith(suffix) else v
                      for k, v in weights.items()}) > 1, suffix
    assert error(weights, dataclasses.replace(gg.config, n_group=1, topk_group=1)) > 1
    assert error(weights, dataclasses.replace(gg.config, routed_scaling_factor=1.0)) > 1
