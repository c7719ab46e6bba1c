"""OLMoE (OlmoeForCausalLM: Llama's pre-norm layers, q/k RMSNorms over the
whole projections as OLMo 2's, a sparse MoE block in every layer whose
top-k softmax weights are not renormalised by default). What is specific to
it: its config (OLMoE-1B-7B's as published) and refusals, its weights as
the graph names them, its q/k norms split over ranks, the NumPy forward
pass against transformers' goldens with the mistakes those would catch,
and its GGUF file (`olmoe`) against llama.cpp itself. The rest (teacher
forcing, paged, chunked, batched, static schedule, CUDA lanes, half
precision, transformers' goldens of the compiled model and its greedy
tokens, GGUF Q8_0 packed) is test_families.py's, parametrised over it
(`olmoe`)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.testing import (as_transformers5, checkpoint_tensors, tiny_config,
                                write_checkpoint, write_gguf)

import hf_goldens_families as goldens
from test_olmo_glm import per_head_norms

OLMOE = "OlmoeForCausalLM"

#: OLMoE-1B-7B-0924's config.json (0125 and the Instruct releases have the
#: same fields and shape).
OLMOE_1B_7B = {
    "architectures": [OLMOE], "attention_bias": False, "attention_dropout": 0.0,
    "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
    "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
    "num_key_value_heads": 16, "output_router_logits": False, "pad_token_id": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 50304}


def read(**fields) -> ModelConfig:
    return ModelConfig.from_dict(tiny_config(OLMOE, **fields))


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


def test_published_config():
    """OLMoE-1B-7B: 64 experts of 1024 in every layer (no dense MLP), 8 per
    token, not renormalised; Llama's input norms, q/k norms over the whole
    projections (2048 values each), heads of 128, RoPE base 1e4, untied;
    both config styles alike."""
    c = ModelConfig.from_dict(OLMOE_1B_7B)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
            c.intermediate_size) == (64, 8, 1024, 0)
    assert c.sparse_layers == tuple(range(16)) and not c.norm_topk_prob
    assert c.input_norms and not c.sandwich_norms and c.qk_norm and c.qk_norm_projection
    assert (c.head_dim, c.num_kv_heads, c.rope_theta, c.rope_scaling) == (128, 16, 1e4, None)
    assert not c.qkv_bias and not c.tie_word_embeddings and c.sliding_layers == ()
    assert not c.shared_expert_intermediate_size
    assert c.attention_scale == pytest.approx(128 ** -0.5)
    assert ModelConfig.from_dict(as_transformers5(OLMOE_1B_7B)) == c
    tiny = tiny_config(OLMOE)
    assert ModelConfig.from_dict(as_transformers5(tiny)) == ModelConfig.from_dict(tiny)


def test_config_fields_as_olmoe_config_reads_them():
    """`norm_topk_prob` read (default false, OlmoeConfig's); transformers'
    alias `num_local_experts` read as `num_experts`; a `head_dim` of hidden
    / heads, stated, is the default's; grouped-query attention's k_norm is
    (hidden / heads) x KV heads wide."""
    assert read(norm_topk_prob=True).norm_topk_prob
    bare = {k: v for k, v in tiny_config(OLMOE).items() if k != "norm_topk_prob"}
    assert not ModelConfig.from_dict(bare).norm_topk_prob
    alias = {k: v for k, v in tiny_config(OLMOE).items() if k != "num_experts"}
    assert ModelConfig.from_dict({**alias, "num_local_experts": 4}) == read()
    assert read(head_dim=8) == read()
    assert read(num_key_value_heads=2).num_kv_heads == 2


@pytest.mark.parametrize("fields, match", [
    ({"clip_qkv": 8.0}, r"field 'clip_qkv' = 8.0 is not supported \(OLMo 1's clamping"),
    ({"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    ({"head_dim": 16}, r"field 'head_dim' = 16 is not supported for OlmoeForCausalLM: its "
                       r"q_norm and k_norm are of hidden_size / num_attention_heads = 8"),
    ({"sliding_window": 4}, r"field 'sliding_window' = 4 is not supported for "
                            r"OlmoeForCausalLM"),
    ({"use_sliding_window": True}, r"'use_sliding_window' = True is not supported"),
    ({"num_local_experts": 8}, r"field 'num_local_experts' = 8 contradicts num_experts = 4"),
    ({"num_experts": None}, r"field 'num_experts' is missing \(required for "
                            r"OlmoeForCausalLM\)"),
    ({"num_experts_per_tok": 5}, r"'num_experts_per_tok' = 5 exceeds num_experts = 4"),
    ({"norm_topk_prob": "no"}, r"field 'norm_topk_prob' = 'no' must be true or false"),
    ({"router_aux_loss_coef": "x"}, r"'router_aux_loss_coef' = 'x' must be a finite number"),
    ({"output_router_logits": 1}, r"'output_router_logits' = 1 must be true or false"),
    ({"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu' is not supported"),
    ({"partial_rotary_factor": 0.5}, r"'partial_rotary_factor' = 0.5 is not supported for "
                                     r"OlmoeForCausalLM"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, r"dynamic NTK scaling"),
])
def test_refusals_name_the_field(fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        read(**fields)


# ----------------------------------------------------------------------
# Weights and tensor parallelism
# ----------------------------------------------------------------------


def test_weights_as_the_graph_names_them(tmp_path):
    """Llama's norms (`input_layernorm`, `post_attention_layernorm` before
    the MLP), q/k norms of the whole projections (32 values each: 4 heads,
    4 KV heads of 8), the router transposed (H, E) and each projection's
    experts stacked (E, out, in) from transformers' per-expert tensors (as
    transformers 5 saves them too); no dense MLP; a missing expert is
    named."""
    config = tiny_config(OLMOE)
    weights = Checkpoint(write_checkpoint(tmp_path / "olmoe", config, seed=2)).weights()
    raw = checkpoint_tensors(config, 2)
    p = "model.layers.1."
    np.testing.assert_array_equal(weights["l1_attn_norm"], raw[p + "input_layernorm.weight"])
    np.testing.assert_array_equal(weights["l1_mlp_norm"],
                                  raw[p + "post_attention_layernorm.weight"])
    np.testing.assert_array_equal(weights["l1_q_norm"], raw[p + "self_attn.q_norm.weight"])
    assert weights["l1_q_norm"].shape == weights["l1_k_norm"].shape == (32,)
    np.testing.assert_array_equal(weights["l1_router"], raw[p + "mlp.gate.weight"].T)
    assert weights["l1_experts_up"].shape == (4, 32, 32)
    np.testing.assert_array_equal(weights["l1_experts_down"][3],
                                  raw[p + "mlp.experts.3.down_proj.weight"])
    assert not any(key.endswith(("_w_gate", "_post_attn_norm")) for key in weights)
    path = write_checkpoint(tmp_path / "missing", config, seed=2,
                            drop=(p + "mlp.experts.2.up_proj.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.layers.1.mlp.experts.2.up_proj.weight' \(layer 1 up_proj "
                             r"experts\) is missing"):
        Checkpoint(path).weights()


def test_transformers5_fused_experts_read_alike(tmp_path):
    """The experts as transformers 5 holds them and saves them with
    `save_original_format=False` (`mlp.experts.gate_up_proj` (E, 2F, H):
    each expert's gate rows then its up rows; `mlp.experts.down_proj` (E,
    H, F)): the per-expert checkpoint's graph weights, bit for bit."""
    from etc.models.loading.safetensors import save_file

    config = tiny_config(OLMOE)
    raw = checkpoint_tensors(config, 3)
    want = Checkpoint(write_checkpoint(tmp_path / "v4", config, seed=3)).weights()
    fused = {k: v for k, v in raw.items() if ".mlp.experts." not in k}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        fused[p + "gate_up_proj"] = np.stack([np.concatenate(
            [raw[f"{p}{j}.gate_proj.weight"], raw[f"{p}{j}.up_proj.weight"]]) for j in range(4)])
        fused[p + "down_proj"] = np.stack([raw[f"{p}{j}.down_proj.weight"] for j in range(4)])
    path = tmp_path / "v5"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(as_transformers5(config)))
    save_file(path / "model.safetensors", fused, "F32")
    got = Checkpoint(path).weights()
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_shards_split_the_qk_norms_by_heads(tmp_path):
    """OLMoE over 2 ranks: the q/k norm weights split with the heads, the
    router and experts' columns as Qwen3-MoE's; the step graph all-reduces
    each layer's (T, 2) sums of squares of q and k once and norms them by
    the whole widths (the 2-rank model against one rank:
    test_tensor_parallel.py and test_families.py)."""
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import shard_config, shard_weights

    c = read()
    shard = shard_config(c, 2)
    q, kv = shard.num_heads * c.head_dim, shard.num_kv_heads * c.head_dim
    weights = Checkpoint(write_checkpoint(tmp_path / "olmoe", tiny_config(OLMOE),
                                          seed=3)).weights()
    part = shard_weights(c, weights, 2, 1)
    np.testing.assert_array_equal(part["l0_q_norm"], weights["l0_q_norm"][q:])
    np.testing.assert_array_equal(part["l0_k_norm"], weights["l0_k_norm"][kv:])
    np.testing.assert_array_equal(part["l0_router"], weights["l0_router"])
    ops = build_step_graph(shard, max_seq_len=16, chunk=4, ranks=2).operations
    norms = [(op.params["width"], op.params["column"]) for op in ops
             if op.kind == "split_rmsnorm"]
    assert norms == [(2 * q, 0), (2 * kv, 1)] * c.num_layers
    assert sum(op.kind == "sum_squares" for op in ops) == c.num_layers


# ----------------------------------------------------------------------
# Against transformers and llama.cpp, and what they catch
# ----------------------------------------------------------------------


def renormalised(config, weights):
    """The chosen experts' weights renormalised (Mixtral's routing)."""
    return dataclasses.replace(config, norm_topk_prob=True), weights


def post_norms(config, weights):
    """OLMo 2's layers: the same norms applied to the blocks' outputs."""
    return (dataclasses.replace(config, input_norms=False, sandwich_norms=True),
            {**weights, **{f"l{i}_post_{k}": weights[f"l{i}_{k}"]
                           for i in range(config.num_layers) for k in ("attn_norm", "mlp_norm")}})


@pytest.mark.parametrize("name", ["olmoe-transformers4-f32", "olmoe-transformers4-bf16"])
def test_numpy_forward_matches_transformers_and_the_mistakes_do_not(name, tmp_path):
    """The NumPy forward pass on the config and weights ETC reads is
    transformers' (the golden's logits within tolerance: measured 0.027
    of it in f32, 0.18 against transformers' bf16), and the plausible
    misreadings miss them (measured 3,200 to 21,000 times the tolerance in
    f32, 1.1 to 7.0 in bf16): the top-k weights renormalised, the q/k
    norms per head, OLMo 2's post-norms."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(),
                           {f.__name__: f for f in (renormalised, per_head_norms, post_norms)})


def test_gguf_file_run_by_llama_cpp(tmp_path):
    """llama.cpp (llama-cpp-python) on the F32 GGUF file `write_gguf` writes
    (gguf_goldens.RUNS["olmoe"]): the NumPy forward pass on the config and
    weights ETC reads from it is within 0.05 of the logits' rms at every
    position (measured 0.007), and the misreadings miss by over 0.3
    (measured: renormalised 1.5, per-head q/k norms 5.2)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run("olmoe", tmp_path)

    def error(config, read=weights):
        return gguf_goldens.run_error(run, reference.forward(config, read, run["sequence"]))

    c = gg.config
    assert (c.architecture, c.num_experts, c.norm_topk_prob) == (OLMOE, 4, False)
    assert error(c) < 0.05
    assert error(*renormalised(c, weights)) > 0.3
    assert error(*per_head_norms(c, weights)) > 0.3


def test_gguf_keys_as_llama_cpp_reads_them(tmp_path):
    """An olmoe file: experts of `.feed_forward_length`, Q and K as the
    converter leaves them (unpermuted: llama.cpp's olmoe rotates NeoX
    halves, as transformers does), never renormalised, whatever the
    checkpoint's norm_topk_prob (llama.cpp's olmoe has no key for it); an
    `.expert_weights_norm` of true is refused by name."""
    config = tiny_config(OLMOE, norm_topk_prob=True)
    path = write_gguf(tmp_path / "m.gguf", config, seed=1)
    gg = GGUFCheckpoint(path)
    assert gg.architecture == "olmoe" and not gg.config.norm_topk_prob
    assert gg.config == dataclasses.replace(ModelConfig.from_dict(config), norm_topk_prob=False)
    raw = checkpoint_tensors(config, 1)
    np.testing.assert_array_equal(gg.weights()["l0_wq"],
                                  raw["model.layers.0.self_attn.q_proj.weight"])
    bad = write_gguf(tmp_path / "norm.gguf", config, metadata={"olmoe.expert_weights_norm": True})
    with pytest.raises(UnsupportedConfigError, match=r"olmoe.expert_weights_norm = True is not "
                                                     r"supported"):
        GGUFCheckpoint(bad)
