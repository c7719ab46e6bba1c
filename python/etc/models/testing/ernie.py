"""Tiny ERNIE 4.5 checkpoints (`Ernie4_5ForCausalLM`,
`Ernie4_5_MoeForCausalLM`): the config.json fields `checkpoints.tiny_config`
gives them and the tensors `checkpoints.tensor_shapes` lists, under the
names of Baidu's published "-PT" checkpoints (what transformers' save_pretrained
writes back): Llama's layers, the MoE model's per-expert projections, the
router's (1, E) `moe_statics` selection bias, the shared experts, and the
multi-token-prediction block's tensors, which nothing reads."""

from __future__ import annotations

from .mlp import gated_mlp, routed_experts

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "tiny_fields", "sparse_layers", "tensor_shapes",
           "mtp_tensor"]

ARCHITECTURES = ("Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM")
#: Hugging Face's `model_type` of each.
MODEL_TYPES = {"Ernie4_5ForCausalLM": "ernie4_5", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe"}


def tiny_fields(config: dict) -> None:
    """Makes `tiny_config`'s common fields `config` an ERNIE 4.5 tiny
    config, as the published config.json has them: no attention_bias
    (`use_bias` false), tied embeddings, RoPE base 500000; the MoE model's
    8 experts of 32 (whole Q8_0 blocks), 2 per token, one shared expert,
    layer 0 dense (moe_layer_start_index 1), one multi-token-prediction
    layer, and a `moe_norm_min` of 0.5 (the published one is 1e-12) so
    that dividing the chosen scores by at least it is seen."""
    del config["attention_bias"]
    config.update({"use_bias": False, "tie_word_embeddings": True, "rope_theta": 500000.0,
                   "use_cache": False, "pad_token_id": 0})
    if config["architectures"][0] == "Ernie4_5_MoeForCausalLM":
        config.update({"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 32,
                       "moe_num_shared_experts": 1, "moe_layer_start_index": 1,
                       "moe_layer_end_index": -1, "moe_layer_interval": 1,
                       "moe_norm_min": 0.5, "moe_use_aux_free": True,
                       "num_nextn_predict_layers": 1, "moe_gate": "topk",
                       "moe_capacity": [8, 8, 8]})


def sparse_layers(config: dict) -> set:
    """The MoE layers of ERNIE 4.5 MoE config `config` (Ernie4_5_MoeConfig's rule)."""
    layers = config["num_hidden_layers"]
    end = config.get("moe_layer_end_index", -1)
    end = layers - 1 if end in (-1, None) else end
    start, step = config.get("moe_layer_start_index", 1), config.get("moe_layer_interval", 1)
    return {i for i in range(layers) if (i + 1) % step == 0 and start <= i <= end}


def mtp_tensor(name: str) -> bool:
    """Whether `name` is the multi-token-prediction block's (never read)."""
    return name.startswith("model.mtp_")


def tensor_shapes(config: dict) -> dict:
    """The tensors of a checkpoint of ERNIE 4.5 `config` by Hugging Face
    name, and their shapes, in writing order."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    moe = config["architectures"][0] == "Ernie4_5_MoeForCausalLM"
    d = config.get("head_dim") or (h // heads if moe else 128)
    sparse = sparse_layers(config) if moe else set()
    t = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (h,)
        t[p + "self_attn.q_proj.weight"] = (heads * d, h)
        t[p + "self_attn.k_proj.weight"] = (kv * d, h)
        t[p + "self_attn.v_proj.weight"] = (kv * d, h)
        t[p + "self_attn.o_proj.weight"] = (h, heads * d)
        t[p + "post_attention_layernorm.weight"] = (h,)
        if i in sparse:
            e, f = config["moe_num_experts"], config["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = (e, h)
            if config.get("moe_use_aux_free", True):
                t[p + "mlp.moe_statics.e_score_correction_bias"] = (1, e)
            t.update(routed_experts(p + "mlp.experts.", e, f, h))
            shared = config.get("moe_num_shared_experts", 2) * f
            if shared:
                t.update(gated_mlp(p + "mlp.shared_experts.", shared, h))
        else:
            t.update(gated_mlp(p + "mlp.", config["intermediate_size"], h))
    for k in range(config.get("num_nextn_predict_layers", 0) if moe else 0):
        # The multi-token-prediction block, as Baidu's checkpoints hold it.
        t.update({f"model.mtp_emb_norm.{k}.weight": (h,), f"model.mtp_hidden_norm.{k}.weight": (h,),
                  f"model.mtp_linear_proj.{k}.weight": (h, 2 * h),
                  f"model.mtp_block.{k}.input_layernorm.weight": (h,)})
    t["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", True):
        t["lm_head.weight"] = (vocab, h)
    return t
