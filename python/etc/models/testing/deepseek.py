"""Tiny DeepSeek-V2 and DeepSeek-V3 checkpoints (`checkpoints.tiny_config`
and `tensor_shapes` of their architectures): config.json fields as the
published ones have them, and the tensors under Hugging Face's names; and
their `deepseek2` GGUF files' tensors and keys (`gguf_writer`)."""

from __future__ import annotations

import numpy as np

from ..loading.families_deepseek import DEEPSEEK_V2, DEEPSEEK_V3
from .mlp import gated_mlp, routed_experts

__all__ = ["tiny_fields", "tensor_shapes", "gguf_tensors", "add_gguf_keys"]


def tiny_fields(architecture: str) -> dict:
    """The fields a tiny config of `architecture` sets on top of the common
    ones (hidden 32, 4 heads, 2 layers, vocabulary 96).

    DeepSeek-V2-Lite's shape: q in one projection, a latent of 16, heads
    of 8 nope + 4 pe dimensions (v 6: v_head_dim differs from both), 4
    experts of 32 (whole Q8_0 blocks) scored by softmax, 2 per token,
    greedy, not renormalised, times 2 (V2-Lite's is 1, V2's 16: the scale
    must be seen), 2 shared experts, layer 0 dense; yarn RoPE with
    V2-Lite's mscale = mscale_all_dim (no attention factor, a softmax scale
    of mscale(4, 0.707)^2) over 32 original positions.

    DeepSeek-V3's shape: q through a low-rank latent of 24, 8 experts of
    32 in 2 groups (the best 1 kept), sigmoid scores with the selection
    bias, 2 per token, renormalised, times 2.5, one shared expert, layer 0
    dense, interleaved RoPE pairs, yarn with mscale 1 and mscale_all_dim
    0.8 (an attention factor of 1.025 on the pe dimensions), and one
    multi-token-prediction layer (its weights after the last layer,
    skipped)."""
    common = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
              "v_head_dim": 6, "num_key_value_heads": 4, "moe_intermediate_size": 32,
              "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
              "aux_loss_alpha": 0.001, "seq_aux": True, "tie_word_embeddings": False,
              "max_position_embeddings": 128}
    if architecture == DEEPSEEK_V2:
        return {**common, "q_lora_rank": None, "n_routed_experts": 4, "n_shared_experts": 2,
                "n_group": 1, "topk_group": 1, "topk_method": "greedy",
                "scoring_func": "softmax", "norm_topk_prob": False, "routed_scaling_factor": 2.0,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                 "mscale": 0.707, "mscale_all_dim": 0.707,
                                 "original_max_position_embeddings": 32}}
    assert architecture == DEEPSEEK_V3, architecture
    return {**common, "q_lora_rank": 24, "n_routed_experts": 8, "n_shared_experts": 1,
            "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rope_interleave": True,
            "num_nextn_predict_layers": 1,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                             "mscale": 1.0, "mscale_all_dim": 0.8,
                             "original_max_position_embeddings": 32}}


def tensor_shapes(config: dict) -> dict:
    """The tensors of a DeepSeek checkpoint of `config`, by Hugging Face
    name, with their shapes (the per-expert layout DeepSeek publishes)."""
    v3 = config["architectures"][0] == DEEPSEEK_V3
    h, heads, vocab = config["hidden_size"], config["num_attention_heads"], config["vocab_size"]
    nope, pe, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    rank, q_rank = config["kv_lora_rank"], config.get("q_lora_rank")
    e, f = config["n_routed_experts"], config["moe_intermediate_size"]
    shared = config["n_shared_experts"] * f
    layers = config["num_hidden_layers"]
    t = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t[p + "input_layernorm.weight"] = (h,)
        if q_rank is None:
            t[a + "q_proj.weight"] = (heads * (nope + pe), h)
        else:
            t[a + "q_a_proj.weight"] = (q_rank, h)
            t[a + "q_a_layernorm.weight"] = (q_rank,)
            t[a + "q_b_proj.weight"] = (heads * (nope + pe), q_rank)
        t[a + "kv_a_proj_with_mqa.weight"] = (rank + pe, h)
        t[a + "kv_a_layernorm.weight"] = (rank,)
        t[a + "kv_b_proj.weight"] = (heads * (nope + v), rank)
        t[a + "o_proj.weight"] = (h, heads * v)
        t[p + "post_attention_layernorm.weight"] = (h,)
        if i < config["first_k_dense_replace"]:
            t.update(gated_mlp(p + "mlp.", config["intermediate_size"], h))
            continue
        t[p + "mlp.gate.weight"] = (e, h)
        if v3:
            t[p + "mlp.gate.e_score_correction_bias"] = (e,)
        t.update(routed_experts(p + "mlp.experts.", e, f, h))
        t.update(gated_mlp(p + "mlp.shared_experts.", shared, h))
    for i in range(layers, layers + config.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}."  # the multi-token-prediction layer (ETC skips it)
        t.update({p + "eh_proj.weight": (h, 2 * h), p + "enorm.weight": (h,),
                  p + "hnorm.weight": (h,), p + "shared_head.norm.weight": (h,)})
    t["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = (vocab, h)
    return t


def gguf_tensors(config: dict, tensors: dict, legacy_kv_b: bool = False) -> dict:
    """`tensors` (Hugging Face's names) as llama.cpp's converter hands them
    to its name map for a `deepseek2` file: the multi-token-prediction
    layers dropped, and each kv_b_proj split into `k_b_proj` (each head's
    k_nope rows, transposed: (H, kv_lora_rank, nope)) and `v_b_proj` ((H,
    v, kv_lora_rank)); with `legacy_kv_b`, kv_b_proj kept whole, as older
    converters wrote it."""
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    nope, v = config["qk_nope_head_dim"], config["v_head_dim"]
    out = {}
    for name, array in tensors.items():
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= layers:
            continue
        if name.endswith("self_attn.kv_b_proj.weight") and not legacy_kv_b:
            per_head = array.reshape(heads, nope + v, array.shape[-1])
            out[name.replace("kv_b_proj", "k_b_proj")] = \
                np.ascontiguousarray(per_head[:, :nope].swapaxes(1, 2))
            out[name.replace("kv_b_proj", "v_b_proj")] = np.ascontiguousarray(per_head[:, nope:])
            continue
        out[name] = array
    return out


def add_gguf_keys(writer, config: dict, legacy_kv_b: bool = False) -> None:
    """The `deepseek2` keys llama.cpp's converter writes (replacing the
    generic head_count_kv, key_length, value_length and
    rope.dimension_count): MLA as MQA of one KV head of kv_lora_rank + pe
    (older converters, `legacy_kv_b`: one per head of nope + pe, and no
    `_mla` keys), the experts, their gating, groups and scale, yarn."""
    import gguf

    arch = "deepseek2"
    for key in ("attention.head_count_kv", "attention.key_length", "attention.value_length",
                "rope.dimension_count"):
        writer.kv_data[0].pop(f"{arch}.{key}", None)
    heads, rank = config["num_attention_heads"], config["kv_lora_rank"]
    nope, pe, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    if legacy_kv_b:
        writer.add_head_count_kv(heads)
        writer.add_key_length(nope + pe)
        writer.add_value_length(v)
    else:
        writer.add_head_count_kv(1)
        writer.add_key_length(rank + pe)
        writer.add_value_length(rank)
        writer.add_key_length_mla(nope + pe)
        writer.add_value_length_mla(v)
    writer.add_rope_dimension_count(pe)
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    writer.add_expert_group_count(config.get("n_group", 1))
    writer.add_expert_group_used_count(config.get("topk_group", 1))
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID
                                  if config.get("scoring_func") == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type", scaling.get("rope_type")) == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        if scaling.get("mscale_all_dim") is not None:
            writer.add_rope_scaling_yarn_log_mul(0.1 * scaling["mscale_all_dim"])
