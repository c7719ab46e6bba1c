"""The tiny checkpoints of EXAONE 4, Seed-OSS and Hunyuan dense
(`loading.families_dense`): their config.json fields, as the published
config.json files have them (`tiny_fields`, which `tiny_config` applies),
their tensors by Hugging Face name (`tensor_shapes`, which
`checkpoints.tensor_shapes` returns for them) and what llama.cpp's
converter writes for them into a GGUF file beyond the common keys
(`gguf_extras`, for `gguf_writer.write_gguf`)."""

from __future__ import annotations

import math

import numpy as np

from ..loading.families_dense import ARCHITECTURES, EXAONE4, HUNYUAN_DENSE, SEED_OSS

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "GGUF_ARCHITECTURES", "tiny_fields", "tensor_shapes",
           "gguf_extras"]

#: Hugging Face's `model_type` of each architecture.
MODEL_TYPES = {EXAONE4: "exaone4", SEED_OSS: "seed_oss", HUNYUAN_DENSE: "hunyuan_v1_dense"}
#: llama.cpp's `general.architecture` of each.
GGUF_ARCHITECTURES = {EXAONE4: "exaone4", SEED_OSS: "seed_oss", HUNYUAN_DENSE: "hunyuan-dense"}


def tiny_fields(architecture: str) -> dict:
    """The fields `tiny_config(architecture)` sets beyond the common ones."""
    if architecture == EXAONE4:
        # As EXAONE-4.0-32B's config.json: untied, a window (5) on the 'L'
        # layers of "LLLG" written out in layer_types (layer 0 sliding with
        # RoPE, layer 1 full without), llama3 RoPE scaling (here over 16
        # original positions, so that the tiny heads' frequencies span all
        # three of its bands).
        return {"tie_word_embeddings": False, "sliding_window": 5,
                "sliding_window_pattern": "LLLG",
                "layer_types": ["sliding_attention", "full_attention"],
                "rope_theta": 1000000.0, "attention_dropout": 0.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 16}}
    if architecture == SEED_OSS:
        # As Seed-OSS-36B's config.json: q/k/v biases, training-only
        # dropouts, untied; with an o projection bias too (attention_out_bias,
        # false in the 36B) so that it is exercised.
        return {"attention_bias": True, "attention_out_bias": True, "mlp_bias": False,
                "attention_dropout": 0.1, "residual_dropout": 0.1,
                "tie_word_embeddings": False, "rope_theta": 10000000.0}
    if architecture == HUNYUAN_DENSE:
        # As Hunyuan-7B-Instruct's config.json: tied, q/k norms, NTK-alpha
        # RoPE (alpha 1000 and the dynamic-scaling fields transformers
        # ignores), a dropout field, the MoE class's fields of a dense
        # model; heads of hidden / heads (8), the size llama.cpp's
        # converter takes for the alpha's exponent.
        return {"head_dim": 8, "tie_word_embeddings": True, "use_qk_norm": True,
                "use_cla": False, "use_mla": False, "num_experts": 1, "mlp_bias": False,
                "attention_dropout": 0.1, "rope_theta": 10000.0,
                "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1,
                                 "factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                 "type": "dynamic"}}
    raise KeyError(architecture)


def tensor_shapes(config: dict) -> dict:
    """The tensors of a checkpoint of `config` (one of `ARCHITECTURES`) by
    Hugging Face name, with their shapes."""
    architecture = config["architectures"][0]
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or h // heads
    f, vocab = config["intermediate_size"], config["vocab_size"]
    t = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if architecture != EXAONE4:  # (EXAONE 4 norms its blocks' outputs only)
            t[p + "input_layernorm.weight"] = (h,)
        for proj, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            t[f"{p}self_attn.{proj}_proj.weight"] = (rows, h)
        t[p + "self_attn.o_proj.weight"] = (h, heads * d)
        if architecture == SEED_OSS and config.get("attention_bias", True):
            for proj, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
                t[f"{p}self_attn.{proj}_proj.bias"] = (rows,)
        if architecture == SEED_OSS and config.get("attention_out_bias", False):
            t[p + "self_attn.o_proj.bias"] = (h,)
        if architecture == EXAONE4:
            t[p + "self_attn.q_norm.weight"] = t[p + "self_attn.k_norm.weight"] = (d,)
        if architecture == HUNYUAN_DENSE:
            t[p + "self_attn.query_layernorm.weight"] = (d,)
            t[p + "self_attn.key_layernorm.weight"] = (d,)
        t[p + "post_attention_layernorm.weight"] = (h,)
        if architecture == EXAONE4:
            t[p + "post_feedforward_layernorm.weight"] = (h,)
        t[p + "mlp.gate_proj.weight"] = t[p + "mlp.up_proj.weight"] = (f, h)
        t[p + "mlp.down_proj.weight"] = (h, f)
    t["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", False):
        t["lm_head.weight"] = (vocab, h)
    return t


def gguf_extras(writer, config: dict, out: dict) -> None:
    """What llama.cpp's converter writes for these architectures beyond
    the common keys: EXAONE 4's window and per-layer sliding flags, and its
    llama3 RoPE as frequency factors (`rope_freqs.weight`, added to `out`,
    the tensors); Hunyuan's NTK-alpha folded into the RoPE base (its
    exponent from hidden / heads, as the converter takes it). `writer` is
    the `gguf.GGUFWriter`."""
    import gguf

    architecture = config["architectures"][0]
    scaling = config.get("rope_scaling") or {}
    if architecture == EXAONE4:
        if config.get("sliding_window") is not None:
            writer.add_sliding_window(config["sliding_window"])
            writer.add_sliding_window_pattern(_sliding_flags(config))
        if scaling.get("rope_type") == "llama3":
            out["rope_freqs.weight"] = _llama3_factors(config, scaling)
    if architecture == HUNYUAN_DENSE and scaling.get("type") == "dynamic":
        d = config["hidden_size"] // config["num_attention_heads"]
        writer.kv_data[0].pop(gguf.Keys.Rope.FREQ_BASE.format(arch=writer.arch))
        writer.add_rope_freq_base(config.get("rope_theta", 10000.0) *
                                  scaling["alpha"] ** (d / (d - 2)))
        writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        writer.add_rope_scaling_factor(1)


def _sliding_flags(config: dict) -> list:
    """EXAONE 4's per-layer sliding flags as the converter derives them:
    from `layer_types`, else `sliding_window_pattern` (a string of 'L' and
    'G' repeated, or every n-th layer full)."""
    count = config["num_hidden_layers"]
    if "layer_types" in config:
        return [t == "sliding_attention" for t in config["layer_types"]]
    pattern = config.get("sliding_window_pattern", 4)
    if isinstance(pattern, str):
        return [pattern[i % len(pattern)] == "L" for i in range(count)]
    return [(i + 1) % pattern != 0 for i in range(count)]


def _llama3_factors(config: dict, scaling: dict) -> np.ndarray:
    """llama.cpp's converter's divisors of the plain RoPE frequencies for
    llama3 scaling: 1 above the high band, `factor` below the low one,
    smoothed between."""
    d = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = config.get("rope_theta", 10000.0)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, d, 2):
        wavelength = 2 * math.pi * base ** (i / d)
        if wavelength < old / high:
            out.append(1.0)
        elif wavelength > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)
