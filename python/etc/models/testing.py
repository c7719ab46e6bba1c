"""Tiny random Hugging Face checkpoints, written with NumPy: what ETC's
tests, examples and benchmarks load without downloading anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from .safetensors import save_file

__all__ = ["tiny_config", "write_checkpoint"]


def tiny_config(architecture: str = "Qwen3ForCausalLM", **overrides) -> dict:
    """A config.json of `architecture` with hidden size 32, 2 layers, 4 query
    and 2 KV heads of 16, vocabulary 96 (Qwen3-MoE: 4 experts, 2 per
    token); `overrides` replace or add fields."""
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
        "tie_word_embeddings": architecture != "LlamaForCausalLM",
        "attention_bias": False,
        "torch_dtype": "float32",
        "model_type": {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
                       "Qwen3MoeForCausalLM": "qwen3_moe"}.get(architecture, "unknown"),
    }
    if architecture == "LlamaForCausalLM":
        config["mlp_bias"] = False
    if architecture == "Qwen3MoeForCausalLM":
        config.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                       "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
    config.update(overrides)
    return config


def _tensors(config: dict, rng: np.random.Generator) -> dict:
    """Random weights under Hugging Face's names, scaled so that activations
    stay near unit size and logits are not flat."""
    h = config["hidden_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or \
        config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    qwen3 = config["architectures"][0].startswith("Qwen3")
    moe = config["architectures"][0] == "Qwen3MoeForCausalLM"

    def normal(*shape, fan_in=None):
        scale = 1.0 / np.sqrt(fan_in if fan_in else shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": normal(vocab, h, fan_in=16 * h)}
    sparse = set()
    if moe:
        step = config.get("decoder_sparse_step", 1) or 1
        only = config.get("mlp_only_layers") or []
        sparse = {i for i in range(config["num_hidden_layers"])
                  if i not in only and (i + 1) % step == 0}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = normal(heads * d, h)
        t[p + "self_attn.k_proj.weight"] = normal(kv * d, h)
        t[p + "self_attn.v_proj.weight"] = normal(kv * d, h)
        t[p + "self_attn.o_proj.weight"] = normal(h, heads * d)
        if qwen3:
            t[p + "self_attn.q_norm.weight"] = norm(d)
            t[p + "self_attn.k_norm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        if i in sparse:
            e, f = config["num_experts"], config["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = normal(e, h, fan_in=h / 8)
            for j in range(e):
                t[f"{p}mlp.experts.{j}.gate_proj.weight"] = normal(f, h)
                t[f"{p}mlp.experts.{j}.up_proj.weight"] = normal(f, h)
                t[f"{p}mlp.experts.{j}.down_proj.weight"] = normal(h, f)
        else:
            f = config["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = normal(f, h)
            t[p + "mlp.up_proj.weight"] = normal(f, h)
            t[p + "mlp.down_proj.weight"] = normal(h, f)
    t["model.norm.weight"] = norm(h)
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = normal(vocab, h)
    return t


def write_checkpoint(path, config: Optional[dict] = None, *, dtype: str = "F32", seed: int = 0,
                     shards: int = 1, drop: tuple = ()) -> Path:
    """Writes a random checkpoint of `config` (default `tiny_config()`) to
    directory `path`: config.json and `shards` safetensors files of `dtype`
    ("F32", "F16" or "BF16"). Tensors named in `drop` are left out (to test
    errors). Returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = config or tiny_config()
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {k: v for k, v in _tensors(config, np.random.default_rng(seed)).items()
               if k not in drop}
    names = list(tensors)
    if shards == 1:
        save_file(path / "model.safetensors", tensors, dtype, metadata={"format": "pt"})
        return path
    # Shards and their index, named as Hugging Face names them.
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard::shards]}
        save_file(path / file, part, dtype, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return path
