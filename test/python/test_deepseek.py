"""DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM):
multi-head latent attention in the step graph's attention (`mla_layout`,
`etc.models.step.mla`), DeepSeek's routed and shared experts. Their configs
(the published ones) and refusals, the weights' layout, the NumPy forward
pass and the compiled step (f32 and bf16, paged and contiguous) against
transformers' goldens (hf_goldens_deepseek.py), and that each part of MLA
matters."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import etc
import etc.models as models
from etc.models.loading import mla_layout
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.step.parallel import shard_config, shard_weights
from etc.models.testing import (checkpoint_tensors, fuse_experts, tiny_config, write_checkpoint,
                                write_gguf, write_transformers5)

import gguf_goldens
import hf_goldens_deepseek as goldens
from ptxas_check import assemble, assert_no_spills, needs_ptxas
from reference_change import PROMPT, rms_change
from test_paged_models import decode, same, shuffled_cache

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
LOAD = dict(workers=3, max_seq_len=32, attention_chunk=4, kv_block_size=4)

#: deepseek-ai/DeepSeek-V2-Lite's config.json (its auto_map left out).
V2_LITE = {
    "architectures": [V2], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.39.3", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400}

#: deepseek-ai/DeepSeek-V3's config.json (its auto_map and FP8
#: quantization_config left out).
V3_CONFIG = {
    "architectures": [V3], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280}


def test_published_configs_follow_transformers():
    """V2-Lite: q in one projection, heads of 128 + 64 (v 128), 16 KV heads
    (every head's own expanded K and V), 64 experts of 1408 by softmax, 6
    a token, not renormalised, 2 shared experts, layer 0 dense, a softmax
    scale of 192^-1/2 mscale(40, 0.707)^2; V3: q through a rank of 1536,
    sigmoid routing with the selection bias among 4 of 8 groups, times 2.5,
    one shared expert, 3 dense layers, interleaved RoPE, the attention
    factor 1 (mscale = mscale_all_dim)."""
    lite = ModelConfig.from_dict(V2_LITE)
    mscale = 0.1 * 0.707 * np.log(40) + 1
    assert lite.mla == mla_layout_shape(None, 192 ** -0.5 * mscale ** 2)
    assert (lite.head_dim, lite.num_heads, lite.num_kv_heads) == (192, 16, 16)
    assert (lite.num_experts, lite.num_experts_per_tok, lite.moe_intermediate_size,
            lite.shared_expert_intermediate_size, lite.intermediate_size) == \
        (64, 6, 1408, 2816, 10944)
    assert (lite.moe_scoring, lite.norm_topk_prob, lite.selection_bias, lite.n_group,
            lite.routed_scaling_factor) == ("softmax", False, False, 1, 1.0)
    assert lite.sparse_layers == tuple(range(1, 27)) and lite.rope_attention_factor == 1.0
    assert lite.rotated == 64 and len(lite.rope_tables()["inv_freq"]) == 96
    v3 = ModelConfig.from_dict(V3_CONFIG)
    assert v3.mla.q_lora_rank == 1536 and v3.mla.interleaved
    assert (v3.moe_scoring, v3.selection_bias, v3.n_group, v3.topk_group, v3.norm_topk_prob,
            v3.routed_scaling_factor) == ("sigmoid", True, 8, 4, True, 2.5)
    assert v3.sparse_layers == tuple(range(3, 61)) and v3.shared_expert_intermediate_size == 2048
    assert v3.attention_scale == pytest.approx(192 ** -0.5 * (0.1 * np.log(40) + 1) ** 2)
    # As transformers 5 writes the config back: head_dim the pe width, qk_head_dim the sum.
    assert ModelConfig.from_dict({**V3_CONFIG, "head_dim": 64, "qk_head_dim": 192}) == v3


def mla_layout_shape(q_lora_rank, softmax_scale):
    from etc.models.loading.families_deepseek import MlaShape

    return MlaShape(q_lora_rank=q_lora_rank, kv_lora_rank=512, nope_dim=128, rope_dim=64,
                    v_dim=128, interleaved=True, softmax_scale=pytest.approx(softmax_scale))


@pytest.mark.parametrize("architecture, fields, message", [
    (V2, {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1,
          "num_experts_per_tok": 3}, r"'num_experts_per_tok' = 3 exceeds the 2 experts of the "
                                     r"topk_group = 1 groups"),
    (V2, {"norm_topk_prob": True}, r"'norm_topk_prob' = True is not supported for "
                                   r"DeepseekV2ForCausalLM: transformers' DeepseekV2 never"),
    (V2, {"scoring_func": "sigmoid"}, r"'scoring_func' = 'sigmoid' is not supported for Deepseek"),
    (V2, {"topk_method": "noaux_tc"}, r"'topk_method' = 'noaux_tc' is not supported"),
    (V2, {"rope_interleave": False}, r"'rope_interleave' is not a DeepseekV2ForCausalLM field"),
    (V3, {"scoring_func": "softmax"}, r"'scoring_func' = 'softmax' is not supported"),
    (V3, {"topk_method": "greedy"}, r"'topk_method' = 'greedy' is not supported for DeepseekV3"),
    (V3, {"moe_layer_freq": 2}, r"'moe_layer_freq' = 2 is not supported"),
    (V3, {"num_key_value_heads": 2}, r"'num_key_value_heads' = 2 is not supported for "
                                     r"DeepseekV3ForCausalLM: MLA expands"),
    (V3, {"head_dim": 12}, r"'head_dim' = 12 is not supported for DeepseekV3ForCausalLM: "
                           r"transformers sets it to qk_rope_head_dim = 4"),
    (V3, {"qk_rope_head_dim": 3}, r"'qk_rope_head_dim' = 3 must be even"),
    (V3, {"qk_head_dim": 16}, r"'qk_head_dim' = 16 contradicts qk_nope_head_dim \+ "
                              r"qk_rope_head_dim = 12"),
    (V3, {"v_head_dim": 13}, r"'v_head_dim' = 13 is not supported above"),
    (V3, {"q_lora_rank": 0}, r"'q_lora_rank' = 0 must be a positive integer"),
    (V3, {"attention_bias": True}, r"'attention_bias' = True is not supported"),
    (V3, {"n_group": 3}, r"'n_group' = 3 must divide n_routed_experts = 8"),
    (V3, {"topk_group": 3}, r"'topk_group' = 3 exceeds n_group = 2"),
    (V3, {"num_experts_per_tok": 5}, r"'num_experts_per_tok' = 5 exceeds the 4 experts"),
    (V3, {"first_k_dense_replace": 3}, r"'first_k_dense_replace' = 3 exceeds"),
    (V3, {"num_nextn_predict_layers": "1"}, r"'num_nextn_predict_layers' = '1' must be an "
                                            r"integer"),
    (V3, {"rope_interleave": 1}, r"'rope_interleave' = 1 must be true or false"),
])
def test_refused_fields_are_named(architecture, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        ModelConfig.from_dict(tiny_config(architecture, **fields))


def test_v2_group_limited_greedy():
    """DeepSeek-V2's group_limited_greedy: the experts of the topk_group
    groups whose best softmax score is highest (`Graph.moe`'s group_score
    "max"), as DeepSeek-V2 (236B) routes (8 groups, 3 kept); keeping every
    group it chooses as greedy does, and is read as greedy."""
    config = ModelConfig.from_dict({**V2_LITE, "topk_method": "group_limited_greedy",
                                    "n_group": 8, "topk_group": 3})
    assert (config.moe_scoring, config.n_group, config.topk_group, config.moe_group_score) == \
        ("softmax", 8, 3, "max")
    every = ModelConfig.from_dict(tiny_config(V2, topk_method="group_limited_greedy",
                                              n_group=2, topk_group=2))
    assert every == ModelConfig.from_dict(tiny_config(V2))


@pytest.fixture(scope="module", params=[V2, V3])
def checkpoint(request, tmp_path_factory):
    return Checkpoint(write_checkpoint(tmp_path_factory.mktemp("deepseek") / "m",
                                       tiny_config(request.param), seed=4))


def test_weights_in_the_step_layout(checkpoint):
    """Each layer's MLA tensors in the step layout: q (and k_b, v_b) of H
    heads of D = nope + pe rows, o of H D columns, zero rows and columns
    where v is narrower; `to_hf_layout` gives back Hugging Face's tensors
    bit for bit; the multi-token-prediction layer is not read."""
    c, weights = checkpoint.config, checkpoint.weights()
    raw = checkpoint_tensors(json.loads((checkpoint.path / "config.json").read_text()), 4)
    heads, d, m = c.num_heads, c.head_dim, c.mla
    q = "wq" if m.q_lora_rank is None else "wq_b"
    assert weights[f"l0_{q}"].shape[0] == heads * d and weights["l0_wo"].shape == (32, heads * d)
    assert weights["l0_wk_b"].shape == weights["l0_wv_b"].shape == (heads * d, m.kv_lora_rank)
    np.testing.assert_array_equal(weights["l0_wv_b"].reshape(heads, d, -1)[:, m.v_dim:], 0)
    np.testing.assert_array_equal(weights["l0_wo"].reshape(32, heads, d)[:, :, m.v_dim:], 0)
    assert not any(k.startswith("l2_") for k in weights) and "l1_experts_gate" in weights
    assert ("l1_selection_bias" in weights) == (c.architecture == V3)
    back = mla_layout.to_hf_layout(c, weights)
    for i in range(2):
        a = f"model.layers.{i}.self_attn."
        tensors = {"kv_a_proj_with_mqa": "kv_a_proj_with_mqa", "kv_b_proj": "kv_b_proj",
                   "o_proj": "o_proj", "q_proj" if q == "wq" else "q_b_proj":
                   "q_proj" if q == "wq" else "q_b_proj"}
        for key, name in tensors.items():
            want = raw[a + name + ".weight"]
            if key in ("q_proj", "q_b_proj"):  # the attention factor's square, undone
                np.testing.assert_allclose(back[f"l{i}_{key}"], want, rtol=1e-6, err_msg=key)
            else:
                np.testing.assert_array_equal(back[f"l{i}_{key}"], want, err_msg=key)


def test_transformers5_fused_experts_read_alike(checkpoint, tmp_path):
    """The experts as transformers 5 holds them and saves them with
    `save_original_format=False` (`mlp.experts.gate_up_proj` (E, 2F, H),
    `mlp.experts.down_proj` (E, H, F)): the per-expert checkpoint's graph
    weights, bit for bit (V3's selection bias among them)."""
    config = json.loads((checkpoint.path / "config.json").read_text())
    fused = fuse_experts(checkpoint_tensors(config, 4), "model.layers.1.mlp.experts.",
                         config["n_routed_experts"])  # (layer 0 is dense)
    path = write_transformers5(tmp_path / "v5", config, fused)
    got, want = Checkpoint(path).weights(), checkpoint.weights()
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_place_copies_the_shared_key_into_every_head(checkpoint):
    """`PLACE` holds one 1 per pe position of each head, none elsewhere."""
    c = checkpoint.config
    place = mla_layout.place(c).reshape(c.num_heads, c.head_dim, c.mla.rope_dim)
    assert place.sum() == c.num_heads * c.mla.rope_dim
    np.testing.assert_array_equal(place.sum(axis=(0, 1)), c.num_heads)
    pe_rows = np.flatnonzero(mla_layout.order(c) >= c.mla.nope_dim)
    np.testing.assert_array_equal(np.flatnonzero(place[0].sum(axis=1)), pe_rows)


def test_each_part_of_the_attention_matters(checkpoint):
    """The logits move by a good part of their rms with RoPE's pairs
    de-interleaved, without yarn's softmax mscale, or without the latent
    norm's weight."""
    c, weights = checkpoint.config, checkpoint.weights()
    flat = dataclasses.replace(c, mla=dataclasses.replace(c.mla, interleaved=False))
    assert rms_change(c, weights, flat, prompt=PROMPT[:8]) > 0.02
    plain = dataclasses.replace(c, mla=dataclasses.replace(
        c.mla, softmax_scale=c.head_dim ** -0.5))
    assert rms_change(c, weights, plain, prompt=PROMPT[:8]) > 0.02
    unnormed = {k: np.ones_like(v) if k.endswith("kv_a_norm") else v for k, v in weights.items()}
    assert rms_change(c, weights, changed_weights=unnormed, prompt=PROMPT[:8]) > 0.02


@pytest.mark.parametrize("name", [n for n in goldens.cases() if n.endswith("-f32")])
def test_numpy_forward_matches_the_transformers_goldens(name, tmp_path):
    """The NumPy forward pass on the golden checkpoints is within the
    goldens' float32 tolerance of transformers' logits at every position
    (measured 0.025 of it for V2, 0.031 for V3), and outside it with the
    RoPE pairs de-interleaved or V3's attention factor (1.025) left out
    (930 times it)."""
    golden = goldens.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    misreadings = {"rotate_half pairs": lambda c, w: (dataclasses.replace(
        c, mla=dataclasses.replace(c.mla, interleaved=False)), w)}
    if checkpoint.config.rope_attention_factor != 1.0:
        misreadings["no attention factor"] = lambda c, w: (c, _without_attention_factor(c, w))
    if checkpoint.config.n_group > 1:
        misreadings["no groups"] = lambda c, w: (
            dataclasses.replace(c, n_group=1, topk_group=1), w)
        if checkpoint.config.moe_group_score == "max":
            misreadings["groups by their two best"] = lambda c, w: (
                dataclasses.replace(c, moe_group_score="top2"), w)
    golden.check_reference(checkpoint.config, checkpoint.weights(), misreadings)


def _without_attention_factor(config, weights: dict) -> dict:
    """`weights` with q's pe rows divided by the factor's square they carry
    (`mla_layout.q_scale`): the pe products as if yarn's attention factor
    were 1."""
    out, heads, d = dict(weights), config.num_heads, config.head_dim
    pe = np.flatnonzero(mla_layout.order(config) >= config.mla.nope_dim)
    key = "wq" if config.mla.q_lora_rank is None else "wq_b"
    for i in range(config.num_layers):
        q = out[f"l{i}_{key}"].reshape(heads, d, -1).copy()
        q[:, pe] /= np.float32(mla_layout.q_scale(config))
        out[f"l{i}_{key}"] = q.reshape(heads * d, -1)
    return out


def test_the_goldens_are_what_transformers_computes_now():
    """Where torch and transformers import: the goldens regenerate bit for
    bit (else they are stale, or transformers changed)."""
    pytest.importorskip("torch", reason="torch is not installed: the goldens stand in for "
                                        "transformers")
    pytest.importorskip("transformers", reason="transformers is not installed: the goldens "
                                               "stand in for it")
    assert goldens.make(check=True) == []


@pytest.mark.parametrize("name", list(goldens.cases()))
def test_compiled_step_matches_the_transformers_goldens(name, tmp_path):
    """The compiled step (f32 or bf16) of the golden checkpoints: the
    logits of every prefix (prefill) within the dtype's tolerance of
    transformers', and the greedy tokens `generate` picks (prefill, then
    decode through the paged cache) transformers'."""
    golden = goldens.load(name)
    golden.check_model(models.load(golden.write_checkpoint(tmp_path / name),
                                   dtype=golden.dtype, **LOAD))


#: Prompts of the schedule and cache checks (one outgrowing a block of 4).
PROMPTS = [[3, 4, 5, 6, 7], [9], [10, 11, 12, 13, 14, 15, 16, 17, 18]]


@pytest.mark.parametrize("name", list(goldens.FAMILIES))
def test_schedules_caches_and_simulated_cuda_match_numpy(name, tmp_path):
    """The contiguous cache, the static schedule and the CUDA tile kernels
    with their lanes simulated on the CPU: every generated token's logits
    those of the NumPy forward pass of the sequence so far (teacher
    forcing, 2e-4); the paged cache with its blocks shuffled over the pool
    and prefill chunks of 3 tokens a step: the contiguous cache's tokens
    and logits."""
    path = write_checkpoint(tmp_path / "m", goldens.FAMILIES[name], seed=6)
    checkpoint = Checkpoint(path)
    weights = checkpoint.weights()
    contiguous = models.load(path, **{**LOAD, "kv_block_size": None})
    for model in (contiguous, models.load(path, **LOAD, schedule="static"),
                  models.load(path, **LOAD, kernels="cuda")):
        out = model.generate(PROMPTS, 3, return_logits=True)
        for prompt, tokens, logits in zip(PROMPTS, out.tokens, out.logits):
            want = reference.forward(checkpoint.config, weights, prompt + tokens[:-1])
            np.testing.assert_allclose(np.asarray(logits), want[len(prompt) - 1:], rtol=2e-4,
                                       atol=2e-4)
            assert list(tokens) == [int(np.argmax(row)) for row in logits]
    paged = models.load(path, **LOAD)
    same(decode(paged, PROMPTS, 3, budget=3, cache=shuffled_cache(paged, 3, 16, seed=2)),
         decode(contiguous, PROMPTS, 3), tol=1e-5)


def test_rotate_half_pairs_compiled(tmp_path):
    """DeepSeek-V3 with `rope_interleave` false (transformers'
    apply_rotary_pos_emb: pairs (i, i + pe / 2), 1.9e-6 of the logits' rms
    from transformers' float32 forward pass when measured): the compiled
    step's logits of every position those of the NumPy forward pass."""
    path = write_checkpoint(tmp_path / "m", tiny_config(V3, rope_interleave=False), seed=9)
    checkpoint = Checkpoint(path)
    assert not checkpoint.config.mla.interleaved
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    model = models.load(path, **LOAD)
    logits, _ = model.step(model.new_cache(1, len(prompt)),
                           [models.Request(0, 0, prompt, choices=len(prompt))],
                           return_logits=True)
    want = reference.forward(checkpoint.config, checkpoint.weights(), prompt)
    np.testing.assert_allclose(logits, want, rtol=2e-4, atol=2e-4)


def test_tensor_parallel_shards_split_the_heads(checkpoint):
    """Over 2 ranks each keeps its 2 heads' rows of q (or q_b), k_b and v_b
    and columns of o, and the latent's, the pe key's and q's down
    projections and norms whole."""
    c, weights = checkpoint.config, checkpoint.weights()
    assert (shard_config(c, 2).num_heads, shard_config(c, 2).num_kv_heads) == (2, 2)
    q = "wq" if c.mla.q_lora_rank is None else "wq_b"
    for rank in range(2):
        shard = shard_weights(c, weights, 2, rank)
        rows = slice(rank * 2 * c.head_dim, (rank + 1) * 2 * c.head_dim)
        for key in (q, "wk_b", "wv_b"):
            np.testing.assert_array_equal(shard[f"l0_{key}"], weights[f"l0_{key}"][rows])
        np.testing.assert_array_equal(shard["l0_wo"], weights["l0_wo"][:, rows])
        for key in ("wkv_a", "wk_pe", "kv_a_norm") + (("wq_a", "q_a_norm") if q == "wq_b" else ()):
            np.testing.assert_array_equal(shard[f"l0_{key}"], weights[f"l0_{key}"])


def test_tensor_parallel_matches_one_rank():
    """V2 and V3 split over 2 MPI ranks (2 heads each, half of every
    expert's and MLP's columns) generate the whole model's tokens, with
    logits within float rounding (distributed/tensor_parallel_families.py)."""
    import os

    from etc.runtime import distributed

    script = os.path.join(os.path.dirname(__file__), "distributed",
                          "tensor_parallel_families.py")
    families = [f"{name}={json.dumps(config)}" for name, config in goldens.FAMILIES.items()]
    result = distributed.launch(2, [script, *families], timeout=400,
                                env=dict(os.environ, ETC_PIN_WORKERS="0"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in range(2):
        for name in goldens.FAMILIES:
            assert f"rank {rank}: {name} tensor parallel matches" in output, output


# ----------------------------------------------------------------------
# GGUF (deepseek2)
# ----------------------------------------------------------------------


def _gguf_config(architecture):
    """The tiny config with yarn's mscale = mscale_all_dim: a deepseek2 file
    says the latter only (llama.cpp takes RoPE's attention factor as 1)."""
    config = tiny_config(architecture)
    return {**config, "rope_scaling": {**config["rope_scaling"],
                                       "mscale": config["rope_scaling"]["mscale_all_dim"]}}


@pytest.mark.parametrize("legacy", [False, True], ids=["k_b-v_b", "kv_b"])
@pytest.mark.parametrize("architecture", [V2, V3])
def test_gguf_reads_as_the_checkpoint(architecture, legacy, tmp_path):
    """A deepseek2 file as llama.cpp's converter writes it (MLA as MQA of
    one KV head with the `_mla` widths, kv_b split into attn_k_b /
    attn_v_b; or an older converter's whole attn_kv_b and per-head widths)
    reads as the checkpoint: the same config (V3 by its sigmoid gating)
    and weights, bit for bit; the multi-token-prediction layer is not in
    the file."""
    config = _gguf_config(architecture)
    checkpoint = Checkpoint(write_checkpoint(tmp_path / "m", config, seed=4))
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, seed=4, legacy_kv_b=legacy))
    assert gg.config == checkpoint.config
    weights, want = gg.weights(), checkpoint.weights()
    assert set(weights) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(weights[key], value, err_msg=key)


@pytest.mark.parametrize("metadata, message", [
    ({"deepseek2.expert_gating_func": 3}, r"deepseek2.expert_gating_func = 3 is not supported"),
    ({"deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 1},
     r"expert_group_used_count = 1 of expert_group_count = 2 with softmax gating"),
    ({"deepseek2.rope.scaling.type": "linear"}, r"rope.scaling.type = 'linear' is not supported"),
    ({"deepseek2.attention.key_length_mla": 4}, r"key_length_mla = 4 must exceed "
                                                r"rope.dimension_count = 4"),
])
def test_gguf_refusals_name_the_key(metadata, message, tmp_path):
    path = write_gguf(tmp_path / "m.gguf", _gguf_config(V2), metadata=metadata)
    with pytest.raises(UnsupportedConfigError, match=message):
        GGUFCheckpoint(path)


@pytest.mark.parametrize("architecture", [V2, V3])
def test_packed_gguf_generates_as_numpy_computes_it(architecture, tmp_path):
    """A Q8_0 file compiled on the CPU, widened: every generated token's
    logits those of the NumPy forward pass of its dequantized weights
    (teacher forcing); packed (the default: the matrices whose rows are
    whole blocks, q or q_a, kv_a's two parts, experts, shared experts,
    embeddings, LM head; k_b, v_b and o widened for their zero rows and
    columns): within the rounding of its activations to int8 blocks (0.15
    of the logits' standard deviation, test_families.py's bound)."""
    path = write_gguf(tmp_path / "q8.gguf", _gguf_config(architecture), seed=5,
                      tensor_type="Q8_0")
    gg = GGUFCheckpoint(path)
    weights = gg.weights()
    prompt = [3, 4, 5, 6, 7]
    for packed in (False, True):
        model = models.load(path, packed=packed, **LOAD)
        formats = model.weight_formats
        if packed:
            assert formats["l1_experts_gate"] == formats["l0_wkv_a"] == "q8_0"
            assert not {"l0_wk_b", "l0_wv_b", "l0_wo"} & set(formats)
        out = model.generate([prompt], 4, return_logits=True)
        sequence = prompt + list(out.tokens[0])
        want = reference.forward(gg.config, weights, sequence[:-1])[len(prompt) - 1:]
        got = np.asarray(out.logits[0])
        if packed:
            assert np.all(np.abs(got - want).max(axis=-1) <= 0.15 * want.std(axis=-1))
        else:
            np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("architecture", [V2, V3])
def test_packed_gguf_split_as_it_is_read(architecture, tmp_path):
    """Over 2 ranks a Q8_0 file's packed weights are cut to each rank's
    share as they are read, before q's rows are laid out (V2's `wq`: its
    heads reordered alike, rows of whole blocks): each share is the rank's
    slice of the whole packed weight. (Such files on 2 MPI ranks generate
    the tokens of one rank, logits within 5e-7.)"""
    from etc.models.step.parallel import padded_blocks, shard_weight, unaligned_packed

    gg = GGUFCheckpoint(write_gguf(tmp_path / "q8.gguf", _gguf_config(architecture), seed=5,
                                   tensor_type="Q8_0"))
    c, formats = gg.config, gg.weight_formats()
    formats = {k: v for k, v in formats.items() if k not in unaligned_packed(c, formats, 2)}
    assert formats["l0_wkv_a"] == "q8_0"
    assert architecture == V3 or formats["l0_wq"] == "q8_0"
    padding, whole = padded_blocks(c, formats, 2), gg.weights(formats=formats)
    for rank in range(2):
        cut = (lambda key, array: shard_weight(c, key, array, 2, rank, formats.get(key), padding))
        split = gg.weights(formats=formats, shard=cut)
        assert set(split) == set(whole)
        for key, array in whole.items():
            np.testing.assert_array_equal(split[key], cut(key, array), err_msg=key)


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3"])
def test_gguf_logits_match_llama_cpp(name, tmp_path):
    """The NumPy forward pass of the deepseek2 file `write_gguf` writes
    (gguf_goldens.RUNS: V2's softmax experts with q through a low rank,
    V3's sigmoid routing in groups; yarn) is within 0.02 of llama.cpp's
    logits' rms at every position (measured 0.0058 and 0.0063), and 3 to 4
    times that rms away with rotate_half's pairs (V3: or without the expert
    groups)."""
    gg, weights, run = gguf_goldens.read_run(name, tmp_path)

    def error(config):
        return gguf_goldens.run_error(run, reference.forward(config, weights, run["sequence"]))

    c = gg.config
    assert error(c) < 0.02
    assert error(dataclasses.replace(c, mla=dataclasses.replace(c.mla, interleaved=False))) > 1
    if c.n_group > 1:
        assert error(dataclasses.replace(c, n_group=1, topk_group=1)) > 1


@pytest.mark.parametrize("architecture", [V2, V3])
def test_fp8_checkpoint_runs_packed_as_numpy_computes_it(architecture, tmp_path):
    """An FP8 checkpoint (e4m3 blocks with `weight_scale_inv`, as DeepSeek-V3,
    R1 and Kimi K2 are published; here blocks of 32 x 32): the projections
    whose rows are whole 32-value blocks stay packed (q or q_a, kv_a's two
    parts, the dense MLP's gate and up, experts, shared experts), k_b, v_b
    and o are
    widened for their zero rows and columns; the compiled step's logits are
    the NumPy forward pass's of the dequantized weights within 1e-4, and its
    greedy tokens theirs."""
    path = write_checkpoint(tmp_path / "fp8", tiny_config(architecture), seed=8,
                            fp8_block=(32, 32))
    model = models.load(path, dtype="f32", **LOAD)
    q = "l0_wq" if architecture == V2 else "l0_wq_a"
    assert {q, "l0_wkv_a", "l0_wk_pe", "l0_w_gate", "l1_experts_gate", "l1_shexp_up"} <= \
        set(model.weight_formats)
    assert not {"l0_wk_b", "l0_wv_b", "l0_wo"} & set(model.weight_formats)
    checkpoint = Checkpoint(path)
    prompt = [3, 4, 5, 6, 7]
    out = model.generate([prompt], 4, return_logits=True)
    sequence = prompt + list(out.tokens[0])
    want = reference.forward(checkpoint.config, checkpoint.weights("f32"),
                             sequence[:-1])[len(prompt) - 1:]
    assert list(want.argmax(-1)) == list(out.tokens[0])
    np.testing.assert_allclose(np.asarray(out.logits[0]), want, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------
# Graph.moe's group_score="max" (DeepSeek-V2's group_limited_greedy)
# ----------------------------------------------------------------------


def _v2_router(logits: np.ndarray, top_k: int, groups: int, kept: int, scale: float):
    """transformers' DeepseekV2TopkRouter (group_limited_greedy), in NumPy:
    softmax, groups scored by their best, the others' scores 0, top k."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    tokens, experts = p.shape
    best = p.reshape(tokens, groups, experts // groups).max(-1)
    keep = np.argsort(-best, axis=-1, kind="stable")[:, :kept]
    mask = np.zeros((tokens, groups), bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, experts // groups, axis=1), p, 0.0)
    chosen = np.argsort(-masked, axis=-1, kind="stable")[:, :top_k]
    return chosen, np.take_along_axis(masked, chosen, axis=1) * scale


def _group_max_graph():
    """A softmax MoE layer of 16 experts in 4 groups scored by their best, 2
    kept, 3 experts a token, weights times 2 (not renormalised)."""
    e, k, groups, kept, h, f = 16, 3, 4, 2, 24, 16
    g = etc.Graph("group_max")
    T = g.symbol("T")
    inp = lambda role, shape: g.input(role, shape, "f32")
    g.output(g.moe(inp("x", (T, h)), inp("router", (h, e)), inp("w1", (e, f, h)),
                   inp("w2", (e, h, f)), k, w_up=inp("w_up", (e, f, h)), transpose_w=True,
                   normalize=False, routed_scale=2.0, n_group=groups, topk_group=kept,
                   group_score="max", tile=8, name="y"))
    return g


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_moe_group_max_assembles(chip, tmp_path):
    """The CUDA router tile with groups scored by their best assembles
    (sm_80, sm_90a) without spills."""
    kernel = etc.compile(_group_max_graph(), target="cuda", chip=chip)
    assert_no_spills(assemble(kernel.ptx, chip, tmp_path, "group_max"))


@pytest.mark.parametrize("kernels", ["native", "cuda"])
def test_moe_group_max_routes_as_deepseek_v2(kernels):
    """`g.moe(scoring="softmax", n_group=4, topk_group=2, group_score="max")`
    on the CPU's tiles and on the CUDA tiles with their lanes simulated,
    for 1 to 33 tokens: the reference's output, whose routing is
    transformers' V2 router's (same experts, same weights), and far from
    the two-best group rule's and from no groups'."""
    from etc.reference import evaluate, moe as moe_reference, moe_route

    e, k, groups, kept, h, f = 16, 3, 4, 2, 24, 16
    g = _group_max_graph()
    kernel = etc.compile(g, target="cpu", kernels=kernels)
    rng = np.random.default_rng(3)
    weights = {role: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
               for role, shape in (("w1", (e, f, h)), ("w2", (e, h, f)), ("w_up", (e, f, h)))}
    for tokens in (1, 5, 33):
        x = rng.standard_normal((tokens, h)).astype(np.float32)
        router = (rng.standard_normal((h, e)) * 0.6).astype(np.float32)
        chosen, routing = moe_route(x @ router, k, False, n_group=groups, topk_group=kept,
                                    group_score="max", routed_scale=2.0)
        want_chosen, want_routing = _v2_router(x @ router, k, groups, kept, 2.0)
        np.testing.assert_array_equal(np.sort(chosen, -1), np.sort(want_chosen, -1))
        np.testing.assert_allclose(np.sort(routing, -1), np.sort(want_routing, -1), rtol=1e-6)
        inputs = dict(x=x, router=router, **weights)
        want = evaluate(g, **inputs)[0]
        (got,) = kernel.run(**inputs)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        swapped = {role: np.swapaxes(weights[role], -1, -2) for role in weights}
        for other in (dict(group_score="top2"), dict(n_group=1, topk_group=1)):
            far = moe_reference(x, router, swapped["w1"], swapped["w2"], k, swapped["w_up"],
                                False, routed_scale=2.0, **{**dict(n_group=groups,
                                                                   topk_group=kept), **other})
            if tokens == 33:
                assert np.abs(far - want).max() > 0.1 * np.abs(want).max(), other


def test_moe_group_score_refusals():
    g = etc.Graph("refused")
    x, router = g.input("x", (4, 8), "f32"), g.input("router", (8, 8), "f32")
    w1, w2 = g.input("w1", (8, 8, 4), "f32"), g.input("w2", (8, 4, 8), "f32")
    with pytest.raises(ValueError, match=r"group_score 'sum' is not one ETC knows"):
        g.moe(x, router, w1, w2, 2, n_group=2, group_score="sum")
    with pytest.raises(ValueError, match=r"n_group = 2 is a parameter of scoring='sigmoid' "
                                         r"routing .* take group_score='max'"):
        g.moe(x, router, w1, w2, 2, n_group=2)
