"""Tiny random Hugging Face checkpoints, written with NumPy: the configs
(`tiny_config`, `shaped_config` at the real widths of `shapes.SHAPES`,
transformers 5's spelling, and the multimodal wrappers' from
`multimodal`), their random tensors, the byte-level BPE tokenizer, and
the safetensors directory (`write_checkpoint`, FP8 blocks by
`quantize_fp8`). Re-exported by `etc.models.testing`; the GGUF file of
the same checkpoint is `gguf_writer`'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..loading.safetensors import save_file
from . import cohere, deepseek, dense, ernie
from .multimodal import (MULTIMODAL, WRITERS, as_multimodal, multimodal_name,
                         multimodal_tensors)
from .mlp import gated_mlp, routed_experts
from .shapes import SHAPES

__all__ = ["tiny_config", "as_transformers5", "tensor_shapes", "write_checkpoint",
           "checkpoint_tensors", "write_tokenizer", "CHAT_TEMPLATE", "TEXT", "shaped_config",
           "SHAPES", "quantize_fp8", "GRANITE_MULTIPLIERS", "MULTIMODAL", "as_multimodal",
           "multimodal_tensors", "fuse_experts", "write_transformers5"]

#: What `write_tokenizer` trains on: a little English, with accents, CJK
#: and an emoji, so that some characters take several byte-level tokens.
TEXT = """\
The quick brown fox jumps over the lazy dog. A model reads text as tokens and
writes tokens back; the tokenizer turns one into the other. Hello, world!
Hello again: how are you today? I am fine, thank you, and you?
Numbers too: 1 2 3 4 5 6 7 8 9 10, 42, 2048. Café crème, naïve façade, über.
日本語のテキスト。 Привет, мир! 🙂 Résumé of the day: we serve models over HTTP.
"""

#: A ChatML chat template (as Qwen's), refusing roles it does not know.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

#: The special tokens of `write_tokenizer`, with ids 0, 1, 2.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def shaped_config(name: str, layers: int = 2, **overrides) -> dict:
    """The config.json of model `name` (a key of SHAPES) with `layers`
    layers; `overrides` replace or add fields."""
    fields = dict(SHAPES[name])
    architecture = fields.pop("architecture")
    return tiny_config(architecture, num_hidden_layers=layers, **{**fields, **overrides})


#: Hugging Face's `model_type` of each architecture.
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                "MixtralForCausalLM": "mixtral",
                "Qwen2ForCausalLM": "qwen2", "Gemma2ForCausalLM": "gemma2",
                "Phi3ForCausalLM": "phi3",
                "Gemma3ForCausalLM": "gemma3_text",
                "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                "GraniteForCausalLM": "granite", "GraniteMoeForCausalLM": "granitemoe",
                "SmolLM3ForCausalLM": "smollm3", "GptOssForCausalLM": "gpt_oss",
                "Qwen2MoeForCausalLM": "qwen2_moe",
                "GraniteMoeSharedForCausalLM": "granitemoeshared",
                "Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo3",
                "OlmoeForCausalLM": "olmoe", "Glm4ForCausalLM": "glm4",
                "Glm4MoeForCausalLM": "glm4_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
                "DeepseekV3ForCausalLM": "deepseek_v3", **ernie.MODEL_TYPES, **cohere.MODEL_TYPES}

#: The tiny Granite configs' multipliers: far from 1, so that a model that
#: drops one moves the logits by 0.7 (embedding) to 3 (attention) times
#: their rms (the tiny weights: `granite_multipliers_matter` in
#: test_granite.py), outside bf16's tolerance; logits_scaling below 1, so
#: that multiplying by it instead of dividing is seen too.
GRANITE_MULTIPLIERS = {"embedding_multiplier": 4.0, "attention_multiplier": 0.6,
                       "residual_multiplier": 2.2, "logits_scaling": 0.5}


def tiny_config(architecture: str = "Qwen3ForCausalLM", **overrides) -> dict:
    """A config.json of `architecture` with hidden size 32, 2 layers, 4 query
    and 2 KV heads of 16, vocabulary 96 (the MoE families: 4 experts, 2 per
    token; GLM-4.5: 8 in 2 groups), each family's own fields as its
    published config.json has them; `overrides` replace or add fields."""
    config = {
        "architectures": [architecture],
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": architecture not in ("LlamaForCausalLM", "MistralForCausalLM",
                                                    "MixtralForCausalLM", "Phi3ForCausalLM"),
        "attention_bias": False,
        "torch_dtype": "float32",
        "model_type": _MODEL_TYPES.get(architecture, dense.MODEL_TYPES.get(architecture,
                                                                            "unknown")),
    }
    if architecture in dense.ARCHITECTURES:  # EXAONE 4, Seed-OSS, Hunyuan dense
        config.update(dense.tiny_fields(architecture))
    if architecture == "LlamaForCausalLM":
        config["mlp_bias"] = False
    if architecture == "MistralForCausalLM":
        # As Mistral-7B-v0.1's config.json: no attention_bias field, a window.
        del config["attention_bias"]
        config["sliding_window"] = 5
    if architecture == "MixtralForCausalLM":
        # As Mixtral-8x7B's config.json: no attention_bias field, the
        # experts' width in intermediate_size (32: whole Q8_0 blocks, so
        # that a GGUF file's experts pack), training-only router fields,
        # no window (null).
        del config["attention_bias"]
        config.update({"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
                       "sliding_window": None, "output_router_logits": False,
                       "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
                       "rope_theta": 1000000.0})
    if architecture == "Qwen2ForCausalLM":
        # As Qwen2.5's config.json: q/k/v biases always (no attention_bias
        # field), a window that use_sliding_window leaves off.
        del config["attention_bias"]
        config.update({"use_sliding_window": False, "sliding_window": 128,
                       "max_window_layers": 1})
    if architecture == "Qwen2MoeForCausalLM":
        # As Qwen1.5-MoE-A2.7B's config.json: no attention_bias or qkv_bias
        # field (q/k/v biases), 4 experts of 32 (whole Q8_0 blocks) and 2
        # per token, weights not renormalised, a shared expert of 64 in
        # every layer, no window, training-only router fields.
        del config["attention_bias"]
        config.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "shared_expert_intermediate_size": 64, "norm_topk_prob": False,
                       "decoder_sparse_step": 1, "mlp_only_layers": [],
                       "use_sliding_window": False, "sliding_window": 128,
                       "max_window_layers": 2, "output_router_logits": False,
                       "router_aux_loss_coef": 0.001, "tie_word_embeddings": False})
    if architecture == "Glm4MoeForCausalLM":
        # As GLM-4.5's config.json (qk norms, routed_scaling_factor 2.5),
        # with DeepSeek-V3's expert groups: 8 experts of 32 (whole Q8_0
        # blocks) in 2 groups, the best 1 kept, 2 per token; one shared
        # expert; layer 0 dense; half of each head rotated; one
        # multi-token-prediction layer (weights after the last layer).
        config.update({"n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
                       "topk_group": 1, "moe_intermediate_size": 32, "n_shared_experts": 1,
                       "first_k_dense_replace": 1, "norm_topk_prob": True,
                       "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5,
                       "attention_bias": True, "use_qk_norm": True,
                       "num_nextn_predict_layers": 1, "tie_word_embeddings": False})
    if architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        # (`deepseek.tiny_fields`: DeepSeek-V2-Lite's and V3's shapes.)
        del config["head_dim"]
        config.update(deepseek.tiny_fields(architecture))
    if architecture == "Qwen3MoeForCausalLM":
        config.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                       "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
    if architecture == "Phi3ForCausalLM":
        # As Phi-3-mini-4k's config.json: no attention_bias field, dropout
        # fields (unused at inference), a window on every layer.
        del config["attention_bias"]
        config.update({"sliding_window": 5, "original_max_position_embeddings": 128,
                       "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
                       # transformers' default (32000) is outside the vocabulary.
                       "pad_token_id": 0})
    if architecture == "SmolLM3ForCausalLM":
        # As SmolLM3-3B's config.json: no RoPE on every 4th layer, written
        # out, no window.
        config.update({"no_rope_layer_interval": 4,
                       "no_rope_layers": [int((i + 1) % 4 != 0)
                                          for i in range(overrides.get("num_hidden_layers", 2))],
                       "use_sliding_window": False, "sliding_window": None, "mlp_bias": False,
                       "rope_theta": 5000000.0,
                       # transformers' default (128004) is outside the vocabulary.
                       "pad_token_id": 0})
    if architecture in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        # As Gemma's config.json (hidden_activation, not hidden_act), with a
        # query_pre_attn_scalar that is not head_dim and a window of 5 on
        # layer 0 (layer 1 full).
        del config["hidden_act"]
        config.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24,
                       "sliding_window": 5, "attn_logit_softcapping": None,
                       "final_logit_softcapping": None})
    if architecture in ("GraniteForCausalLM", "GraniteMoeForCausalLM",
                        "GraniteMoeSharedForCausalLM"):
        # As Granite 3.x's config.json: tied embeddings, the four
        # multipliers, mlp_bias and attention_dropout fields.
        config.update({"mlp_bias": False, "attention_dropout": 0.0, **GRANITE_MULTIPLIERS})
    if architecture in ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"):
        # As granite-3.0-1b-a400m's: the experts' width in
        # intermediate_size (32: whole Q8_0 blocks), training-only router
        # fields; GraniteMoeShared's shared MLP of 64.
        config.update({"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
                       "output_router_logits": False, "router_aux_loss_coef": 0.0})
    if architecture == "GraniteMoeSharedForCausalLM":
        config["shared_intermediate_size"] = 64
    if architecture == "Gemma2ForCausalLM":
        # Soft-capping that the tiny model's scores and logits reach.
        config.update({"attn_logit_softcapping": 2.0, "final_logit_softcapping": 4.0})
    if architecture == "Gemma3ForCausalLM":
        # Gemma 3 (4B and up) as transformers 4 writes it: the full layers'
        # base and linear scaling, the sliding layers' own base, every 2nd
        # layer full.
        del config["rope_theta"]
        config.update({"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                       "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                       "sliding_window_pattern": 2})
    if architecture == "GptOssForCausalLM":
        # As gpt-oss-20b's config.json: untied, biases on q/k/v/o, 4
        # experts of 32 (whole MXFP4 blocks), 2 per token, sliding (window
        # 3) and full layers alternating, yarn RoPE (truncate false); a
        # clamp of 1 (7 in gpt-oss) that the tiny activations reach.
        config.update({"attention_bias": True, "num_local_experts": 4, "num_experts_per_tok": 2,
                       "tie_word_embeddings": False,
                       "intermediate_size": 32, "sliding_window": 3,
                       "layer_types": ["sliding_attention", "full_attention"],
                       "rope_theta": 150000.0, "swiglu_limit": 1.0, "attention_dropout": 0.0,
                       "router_aux_loss_coef": 0.9, "output_router_logits": False,
                       "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "truncate": False,
                                        "original_max_position_embeddings": 32}})
    if architecture in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
        # As OLMo-2-1B's config.json: untied, no biases, no clip_qkv.
        config.update({"tie_word_embeddings": False, "attention_dropout": 0.0,
                       "rope_scaling": None, "pad_token_id": 1})
    if architecture == "Olmo3ForCausalLM":
        # OLMo 3's layer pattern at 2 layers: layer 0 sliding (window 5),
        # layer 1 full; its RoPE base (the only flat one both transformers
        # 4 and 5 give every layer) and, as OLMo 3 7B, yarn on the full
        # layers only (here a factor of 8 over 16 positions).
        config.update({"sliding_window": 5, "rope_theta": 500000.0,
                       "layer_types": ["sliding_attention", "full_attention"],
                       "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                        "original_max_position_embeddings": 16,
                                        "attention_factor": 1.2, "beta_fast": 32.0,
                                        "beta_slow": 1.0}})
    if architecture == "OlmoeForCausalLM":
        # As OLMoE-1B-7B's config.json: no head_dim (hidden / heads: its q
        # norm is hidden_size wide), as many KV heads as heads, 4 experts of
        # 32 (whole Q8_0 blocks) in intermediate_size, 2 per token, not
        # renormalised, clip_qkv null, training-only router fields, untied.
        del config["head_dim"]
        config.update({"num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
                       "intermediate_size": 32, "norm_topk_prob": False, "clip_qkv": None,
                       "output_router_logits": False, "router_aux_loss_coef": 0.01,
                       "tie_word_embeddings": False, "attention_dropout": 0.0,
                       "pad_token_id": 1})
    if architecture == "Glm4ForCausalLM":
        # As GLM-4-9B-0414's config.json: q/k/v biases, RoPE on half of
        # each head (8 of 16 dimensions), untied; transformers' default
        # pad_token_id (151329) is outside the vocabulary.
        config.update({"attention_bias": True, "partial_rotary_factor": 0.5,
                       "tie_word_embeddings": False, "attention_dropout": 0.0,
                       "pad_token_id": 0})
    if architecture in ernie.ARCHITECTURES:
        ernie.tiny_fields(config)
    if architecture in cohere.COHERE_FAMILY:
        cohere.cohere_fields(config, architecture)
    config.update(overrides)
    if config.get("layer_types", ()) is None:
        config.pop("layer_types")
    return config


def as_transformers5(config: dict) -> dict:
    """`config` as transformers 5 writes config.json: the RoPE base and
    scaling in `rope_parameters` (no flat `rope_theta` or `rope_scaling`),
    `layer_types`, `dtype` for `torch_dtype`."""
    config = dict(config)
    rope = dict(config.pop("rope_scaling", None) or {})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = config.pop("rope_theta", 10000.0)
    if "partial_rotary_factor" in config:
        rope["partial_rotary_factor"] = config.pop("partial_rotary_factor")
    config["rope_parameters"] = rope
    layers = config["num_hidden_layers"]
    architecture = config["architectures"][0]
    if architecture in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        pattern = config.pop("sliding_window_pattern", 6 if "3" in architecture else 2)
        config.setdefault("layer_types", ["sliding_attention" if (i + 1) % pattern else
                                          "full_attention" for i in range(layers)])
    if architecture == "Olmo3ForCausalLM":
        # RoPE per layer type, as Olmo3Config keeps it (it ignores flat
        # parameters): the sliding layers' plain, of the same base.
        config["rope_parameters"] = {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": rope["rope_theta"]}}
    if architecture == "Gemma3ForCausalLM":
        # RoPE per layer type: the full layers' (with rope_scaling) and the
        # sliding layers' own base.
        config["rope_parameters"] = {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": config.pop("rope_local_base_freq", 10000.0)}}
    elif architecture == "Qwen2ForCausalLM" and config.get("use_sliding_window"):
        # transformers' rule, written out as it saves it.
        first = config.get("max_window_layers", 28)
        config.setdefault("layer_types", ["sliding_attention" if i >= first else
                                          "full_attention" for i in range(layers)])
    elif architecture not in ("MistralForCausalLM", "MixtralForCausalLM",
                              "Phi3ForCausalLM"):  # they have none
        config.setdefault("layer_types", ["full_attention"] * layers)
    config["dtype"] = config.pop("torch_dtype", "float32")
    config["transformers_version"] = "5.23.0"
    return config


def fuse_experts(tensors: dict, prefix: str, experts: int) -> dict:
    """`tensors` with the per-expert projections `<prefix><j>.{gate,up,down}_proj.weight`
    stacked as transformers 5 holds them: `<prefix>gate_up_proj` (E, 2F, H:
    each expert's gate rows, then its up rows) and `<prefix>down_proj`
    (E, H, F); the other tensors as they are."""
    fused = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
    fused[prefix + "gate_up_proj"] = np.stack([np.concatenate(
        [tensors[f"{prefix}{j}.gate_proj.weight"], tensors[f"{prefix}{j}.up_proj.weight"]])
        for j in range(experts)])
    fused[prefix + "down_proj"] = np.stack([tensors[f"{prefix}{j}.down_proj.weight"]
                                            for j in range(experts)])
    return fused


def write_transformers5(path, config: dict, tensors: dict) -> Path:
    """A checkpoint directory at `path` as transformers 5 saves one with
    `save_original_format=False`: its config.json (`as_transformers5`) and
    `tensors` (e.g. `fuse_experts`'s) in one F32 safetensors file."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(as_transformers5(config)))
    save_file(path / "model.safetensors", tensors, "F32")
    return path


def tensor_shapes(config: dict) -> dict:
    """The tensors of a checkpoint of `config`, by Hugging Face name, and
    their shapes, in the order `write_checkpoint` writes them."""
    if config["architectures"][0] in ernie.ARCHITECTURES:
        return ernie.tensor_shapes(config)
    if config["architectures"][0] in dense.ARCHITECTURES:
        return dense.tensor_shapes(config)
    if config["architectures"][0] in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        return deepseek.tensor_shapes(config)
    h = config["hidden_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or \
        config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    qwen3 = config["architectures"][0].startswith("Qwen3")
    qwen2 = config["architectures"][0] == "Qwen2ForCausalLM" or \
        config["architectures"][0] == "Qwen2MoeForCausalLM" and config.get("qkv_bias", True)
    gemma = config["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    phi3 = config["architectures"][0] == "Phi3ForCausalLM"
    glm4_moe = config["architectures"][0] == "Glm4MoeForCausalLM"
    qwen2 = qwen2 or glm4_moe and config.get("attention_bias", False)
    qk_norm = qwen3 or config["architectures"][0] == "Gemma3ForCausalLM" or \
        glm4_moe and config.get("use_qk_norm", False)
    olmoe = config["architectures"][0] == "OlmoeForCausalLM"
    moe = olmoe or config["architectures"][0] in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")
    shared = config.get("shared_expert_intermediate_size") or \
        config.get("shared_intermediate_size") or 0
    if glm4_moe:
        shared = config.get("n_shared_experts", 1) * config["moe_intermediate_size"]
    mixtral = config["architectures"][0] == "MixtralForCausalLM"
    granite_moe = config["architectures"][0] in ("GraniteMoeForCausalLM",
                                                 "GraniteMoeSharedForCausalLM")
    gpt_oss = config["architectures"][0] == "GptOssForCausalLM"
    olmo = config["architectures"][0] in ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
    glm4 = config["architectures"][0] == "Glm4ForCausalLM"
    t = {"model.embed_tokens.weight": (vocab, h)}
    sparse = set(range(config["num_hidden_layers"])) if mixtral or granite_moe else set()
    if glm4_moe:
        sparse = set(range(config.get("first_k_dense_replace", 1), config["num_hidden_layers"]))
    elif moe:
        step = config.get("decoder_sparse_step", 1) or 1
        only = config.get("mlp_only_layers") or []
        sparse = {i for i in range(config["num_hidden_layers"])
                  if i not in only and (i + 1) % step == 0}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if not olmo:  # (OLMo 2 norms its blocks' outputs only)
            t[p + "input_layernorm.weight"] = (h,)
        if phi3:  # q, k, v fused
            t[p + "self_attn.qkv_proj.weight"] = ((heads + 2 * kv) * d, h)
        else:
            t[p + "self_attn.q_proj.weight"] = (heads * d, h)
            t[p + "self_attn.k_proj.weight"] = (kv * d, h)
            t[p + "self_attn.v_proj.weight"] = (kv * d, h)
        t[p + "self_attn.o_proj.weight"] = (h, heads * d)
        if gpt_oss:
            t[p + "self_attn.o_proj.bias"] = (h,)
            t[p + "self_attn.sinks"] = (heads,)
        if qwen2 or gpt_oss or glm4 and config.get("attention_bias", True):
            t[p + "self_attn.q_proj.bias"] = (heads * d,)
            t[p + "self_attn.k_proj.bias"] = (kv * d,)
            t[p + "self_attn.v_proj.bias"] = (kv * d,)
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = (d,)
            t[p + "self_attn.k_norm.weight"] = (d,)
        if config.get("use_qk_norm") and config["architectures"][0] in cohere.COHERE_FAMILY:
            t[p + "self_attn.q_norm.weight"] = (heads, d)  # Command R+: a weight per head
            t[p + "self_attn.k_norm.weight"] = (kv, d)
        if olmo or olmoe:  # over the whole projection
            t[p + "self_attn.q_norm.weight"] = (heads * d,)
            t[p + "self_attn.k_norm.weight"] = (kv * d,)
        if glm4:  # of the attention's output (post_attention_layernorm: the MLP's input)
            t[p + "post_self_attn_layernorm.weight"] = (h,)
        if config["architectures"][0] not in cohere.COHERE_FAMILY:  # (one norm, in parallel)
            t[p + "post_attention_layernorm.weight"] = (h,)
        if gemma:
            t[p + "pre_feedforward_layernorm.weight"] = (h,)
        if gemma or olmo:
            t[p + "post_feedforward_layernorm.weight"] = (h,)
        if glm4:
            t[p + "post_mlp_layernorm.weight"] = (h,)
        if gpt_oss:
            # transformers' (dequantized) layout: stacks (E, in, out), gate
            # and up interleaved (even, odd columns) (`write_checkpoint`'s
            # mxfp4 writes OpenAI's blocks and scales).
            e, f = config["num_local_experts"], config["intermediate_size"]
            t[p + "mlp.router.weight"] = (e, h)
            t[p + "mlp.router.bias"] = (e,)
            t[p + "mlp.experts.gate_up_proj"] = (e, h, 2 * f)
            t[p + "mlp.experts.gate_up_proj_bias"] = (e, 2 * f)
            t[p + "mlp.experts.down_proj"] = (e, f, h)
            t[p + "mlp.experts.down_proj_bias"] = (e, h)
        elif mixtral:
            # transformers 4's layout (transformers 5 saves it too): w1 the
            # gate, w2 the down, w3 the up projection.
            e, f = config["num_local_experts"], config["intermediate_size"]
            t[p + "block_sparse_moe.gate.weight"] = (e, h)
            for j in range(e):
                t[f"{p}block_sparse_moe.experts.{j}.w1.weight"] = (f, h)
                t[f"{p}block_sparse_moe.experts.{j}.w2.weight"] = (h, f)
                t[f"{p}block_sparse_moe.experts.{j}.w3.weight"] = (f, h)
        elif granite_moe:
            # The router, and the experts fused: gate rows then up rows.
            e, f = config["num_local_experts"], config["intermediate_size"]
            t[p + "block_sparse_moe.router.layer.weight"] = (e, h)
            t[p + "block_sparse_moe.input_linear.weight"] = (e, 2 * f, h)
            t[p + "block_sparse_moe.output_linear.weight"] = (e, h, f)
            if shared:  # GraniteMoeShared: gate rows then up rows, fused
                t[p + "shared_mlp.input_linear.weight"] = (2 * shared, h)
                t[p + "shared_mlp.output_linear.weight"] = (h, shared)
        elif i in sparse:
            e = config.get("num_experts") or config["n_routed_experts"]
            f = config["intermediate_size" if olmoe else "moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = (e, h)
            if glm4_moe:
                t[p + "mlp.gate.e_score_correction_bias"] = (e,)
            t.update(routed_experts(p + "mlp.experts.", e, f, h))
            if shared:  # Qwen2-MoE: the shared expert and its gate; GLM-4.5's, no gate
                t.update(gated_mlp(f"{p}mlp.shared_expert{'s' if glm4_moe else ''}.", shared, h))
                if not glm4_moe:
                    t[p + "mlp.shared_expert_gate.weight"] = (1, h)
        else:
            f = config["intermediate_size"]
            if phi3 or glm4:  # gate then up, fused
                t[p + "mlp.gate_up_proj.weight"] = (2 * f, h)
            else:
                t[p + "mlp.gate_proj.weight"] = (f, h)
                t[p + "mlp.up_proj.weight"] = (f, h)
            t[p + "mlp.down_proj.weight"] = (h, f)
    if glm4_moe:  # the multi-token-prediction layers' own weights (ETC skips them)
        for i in range(config["num_hidden_layers"],
                       config["num_hidden_layers"] + config.get("num_nextn_predict_layers", 0)):
            p = f"model.layers.{i}."
            t.update({p + "eh_proj.weight": (h, 2 * h), p + "enorm.weight": (h,),
                      p + "hnorm.weight": (h,), p + "shared_head.norm.weight": (h,)})
    t["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", gemma):
        t["lm_head.weight"] = (vocab, h)
    return t


def _tensors(config: dict, rng: np.random.Generator, sharp: bool = False) -> dict:
    """Random weights under Hugging Face's names, scaled so that activations
    stay near unit size and logits are not flat; `sharp`: see
    `write_checkpoint` (the same draws, so the other tensors are equal)."""
    h = config["hidden_size"]
    # Gemma's norms scale by 1 + w: its weights are stored near 0.
    one = 0.0 if config["architectures"][0] in ("Gemma2ForCausalLM", "Gemma3ForCausalLM") \
        else 1.0
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            draw = rng.standard_normal(shape)
            if sharp:
                gain = 1.4 if name.endswith(("q_norm.weight", "k_norm.weight")) else 1.0
                # The scale a norm applies; Gemma stores it minus 1.
                weight = gain * np.exp(0.5 * draw) - (1.0 - one)
            else:
                weight = one + 0.1 * draw
            tensors[name] = weight.astype(np.float32)
            continue
        if name.endswith((".bias", "_bias", ".sinks")):
            tensors[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
            continue
        # Embeddings smaller, the router's logits larger (unless sharp).
        fan_in = {"model.embed_tokens.weight": 16 * h}.get(name, shape[-1])
        if name.endswith(("gate_up_proj", "experts.down_proj")):  # (E, in, out) stacks
            fan_in = shape[-2]
        if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight",
                          "block_sparse_moe.router.layer.weight",
                          "mlp.router.weight")) and not sharp:
            fan_in = h / 8
        if sharp and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            fan_in /= 4
        tensors[name] = (rng.standard_normal(shape) * (1.0 / np.sqrt(fan_in))).astype(np.float32)
    return tensors


def checkpoint_tensors(config: dict, seed: int = 0, *, sharp: bool = False,
                       mxfp4: bool = False) -> dict:
    """The random tensors `write_checkpoint(..., seed=seed, sharp=sharp)`
    writes, float32, under Hugging Face's names; with `mxfp4`, gpt-oss's
    experts as `write_checkpoint(mxfp4=True)` quantizes them (dequantized,
    under the dequantized names)."""
    tensors = _tensors(config, np.random.default_rng(seed), sharp)
    if mxfp4:
        from ..loading import mxfp4 as mx

        for name, (blocks, scales) in _mxfp4_experts(tensors).items():
            tensors[name] = np.ascontiguousarray(mx.dequantize(blocks, scales).swapaxes(-1, -2))
    return tensors


def _mxfp4_experts(tensors: dict) -> dict:
    """gpt-oss's expert stacks of `tensors` (`mlp.experts.gate_up_proj`,
    `down_proj`, (E, in, out)) quantized as OpenAI's checkpoints store
    them: name -> (blocks (E, out, in / 32, 16), scales (E, out, in / 32))
    (ggml's MXFP4 quantizer, repacked)."""
    from ... import packed
    from ..loading import mxfp4 as mx

    out = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj",
                                                   "experts.down_proj"))]:
        rows = np.ascontiguousarray(tensors[name].swapaxes(-1, -2))  # (E, out, in)
        out[name] = mx.unpack(packed.quantize(rows, "mxfp4"))
    return out


def write_tokenizer(path, vocab_size: int, *, chat_template: Optional[str] = CHAT_TEMPLATE,
                    template_file: bool = False) -> Path:
    """Trains a byte-level BPE tokenizer of at most `vocab_size` ids (at
    least 300: the 256 bytes, the special tokens and some merges) on
    `TEXT` with the `tokenizers` package, and writes it to directory `path`
    as Hugging Face does: tokenizer.json, and tokenizer_config.json with
    the special tokens (EOS `<|im_end|>`) and `chat_template`, or the
    template in chat_template.jinja with `template_file`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 300:
        raise ValueError(f"write_tokenizer: vocab_size={vocab_size} is too small for a "
                         f"byte-level BPE (at least 300)")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(TEXT.splitlines(), trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_bos_token": False, "model_max_length": 131072}
    if chat_template is not None and template_file:
        (path / "chat_template.jinja").write_text(chat_template)
    elif chat_template is not None:
        config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return path


def write_checkpoint(path, config: Optional[dict] = None, *, dtype: str = "F32", seed: int = 0,
                     shards: int = 1, drop: tuple = (), tokenizer: bool = False,
                     sharp: bool = False, fp8_block: Optional[tuple] = None,
                     quantization: Optional[dict] = None, multimodal: Optional[str] = None,
                     mxfp4: bool = False, **tokenizer_options) -> Path:
    """Writes a random checkpoint of `config` (default `tiny_config()`) to
    directory `path`: config.json and `shards` safetensors files of `dtype`
    ("F32", "F16" or "BF16"). Tensors named in `drop` are left out (to test
    errors). `sharp`: as in trained models, norm weights spread
    log-normally (e^(z/2): 0.4 to 2.7; q/k norms 1.4 times that) instead of
    near 1, query and key projections twice as large, router logits not
    enlarged: every norm weight matters, attention is sharp enough that
    positions (RoPE) matter and the top-k renormalisation changes the
    experts' weights, so that a wrong model stands out of half-precision
    rounding (the goldens of test/python/hf_goldens.py). `fp8_block`
    (rows, columns): an FP8 checkpoint as the official Qwen3 FP8 releases
    are, every linear projection (`*_proj.weight`) quantized to e4m3 per
    block with its `weight_scale_inv` (`quantize_fp8`), config.json's
    `quantization_config` saying so (or `quantization`, to test
    refusals). `mxfp4`: a gpt-oss checkpoint as OpenAI's are, its experts
    MXFP4 (`*_blocks`, `*_scales` U8; `checkpoint_tensors(mxfp4=True)`
    are their values), config.json's quantization_config saying so.
    `multimodal` ("transformers4" or "transformers4.52"): the
    checkpoint of the multimodal model the causal LM of `config` ships
    inside (Gemma 3, Mistral 3: `as_multimodal`), its language model's
    tensors (the causal LM's, the same draws) under the names that
    transformers version writes, beside a few vision tensors
    (`multimodal_tensors`). With `tokenizer`,
    also a trained BPE tokenizer and chat template (`write_tokenizer`;
    `tokenizer_options` go to it; the config needs vocab_size >= 300),
    config.json's `eos_token_id` (`<|im_end|>`, unless the config sets one)
    and a generation_config.json that adds `<|endoftext|>`. Returns the
    path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(config or tiny_config())
    if tokenizer:
        write_tokenizer(path, config["vocab_size"], **tokenizer_options)
        end, turn_end = SPECIAL_TOKENS.index("<|endoftext|>"), SPECIAL_TOKENS.index("<|im_end|>")
        config.setdefault("eos_token_id", turn_end)
        (path / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [turn_end, end]}, indent=1))
    tensors = {k: v for k, v in _tensors(config, np.random.default_rng(seed), sharp).items()
               if k not in drop}
    dtypes = {}
    if fp8_block is not None:
        config.setdefault("quantization_config", {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": list(fp8_block)})
        # (DeepSeek's kv_a_proj_with_mqa too, as its FP8 releases have it.)
        for name in [n for n in tensors if n.endswith(("_proj.weight", "_with_mqa.weight"))]:
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8(tensors[name], fp8_block)
            dtypes[name] = "F8_E4M3"
            dtypes[name + "_scale_inv"] = "F32"
    if mxfp4:
        config.setdefault("quantization_config", {
            "quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                "lm_head"]})
        for name, (blocks, scales) in _mxfp4_experts(tensors).items():
            del tensors[name]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            dtypes[name + "_blocks"] = dtypes[name + "_scales"] = "U8"
    if quantization is not None:
        config["quantization_config"] = quantization
    if multimodal is not None:
        if multimodal not in WRITERS:
            raise ValueError(f"write_checkpoint: multimodal={multimodal!r} is not one of "
                             f"{', '.join(WRITERS)}")
        tensors = multimodal_tensors(config, tensors, multimodal, seed)
        dtypes = {multimodal_name(name, multimodal): kind for name, kind in dtypes.items()}
        config = as_multimodal(config)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    names = list(tensors)
    if shards == 1:
        save_file(path / "model.safetensors", tensors, dtype, metadata={"format": "pt"},
                  dtypes=dtypes)
        return path
    # Shards and their index, named as Hugging Face names them.
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard::shards]}
        save_file(path / file, part, dtype, metadata={"format": "pt"},
                  dtypes={n: t for n, t in dtypes.items() if n in part})
        weight_map.update({n: file for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return path


def quantize_fp8(weight: np.ndarray, block: tuple) -> tuple[np.ndarray, np.ndarray]:
    """`weight` (out, in) as an FP8 checkpoint stores it (transformers'
    `FineGrainedFP8` quantizer): per block of block[0] x block[1] values
    (partial at the edges), scale_inv = max|w| / 448 and the e4m3 bytes
    of w / scale_inv. Returns (bytes uint8, scale_inv float32)."""
    from ... import packed

    w = np.asarray(weight, np.float32)
    rows, cols = -(-w.shape[0] // block[0]), -(-w.shape[1] // block[1])
    scales = np.zeros((rows, cols), np.float32)
    values = np.zeros(w.shape, np.uint8)
    for i in range(rows):
        for j in range(cols):
            part = (slice(i * block[0], (i + 1) * block[0]),
                    slice(j * block[1], (j + 1) * block[1]))
            largest = np.abs(w[part]).max()
            scales[i, j] = largest / np.float32(448) if largest > 0 else np.float32(1)
            values[part] = packed.to_e4m3(w[part] / scales[i, j])
    return values, scales
