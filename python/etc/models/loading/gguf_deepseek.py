"""GGUF files of llama.cpp's `deepseek2` architecture (DeepSeek-V2, V2-Lite,
V3, R1, Kimi K2, Moonlight), read as the config.json fields and weights of
`DeepseekV2ForCausalLM` or `DeepseekV3ForCausalLM` (`families_deepseek`,
`mla_layout`), as llama.cpp's converter (convert_hf_to_gguf.py's
DeepseekV2Model) writes them and llama.cpp reads them.

The converter writes MLA as MQA of one KV head: `attention.head_count_kv`
1, `attention.key_length` kv_lora_rank + qk_rope_head_dim,
`attention.value_length` kv_lora_rank, and the per-head widths in
`attention.key_length_mla` (qk_nope_head_dim + qk_rope_head_dim) and
`attention.value_length_mla` (v_head_dim); older files have no `_mla`
keys and the per-head widths in key_length / value_length, and one
head_count_kv per head. `rope.dimension_count` is qk_rope_head_dim;
q and k rows are not permuted (llama.cpp's deepseek2 rotates adjacent
pairs, DeepSeek's own). kv_b_proj is split into `attn_k_b` (each head's
k_nope rows transposed: (H, kv_lora_rank, nope)) and `attn_v_b` ((H, v,
kv_lora_rank)); older files have the whole `attn_kv_b`. The expert
gating function (`expert_gating_func`, softmax when absent, as llama.cpp
reads older files) tells V3's sigmoid routing from V2's softmax. yarn's
`rope.scaling.yarn_log_multiplier` is 0.1 mscale_all_dim; llama.cpp takes
yarn's attention factor as 1 (mscale = mscale_all_dim)."""

from __future__ import annotations

from .config import UnsupportedConfigError
from .families_deepseek import DEEPSEEK_V2, DEEPSEEK_V3
from .gguf_families import decimal as _decimal
from .mla_layout import query_latent_plan

__all__ = ["config", "plan"]

#: llama.cpp's `expert_gating_func` values (LLAMA_EXPERT_GATING_FUNC_TYPE).
_GATING = {1: "softmax", 2: "sigmoid"}


def config(ckpt, base: dict) -> dict:
    """The config.json fields of a `deepseek2` file beyond `base` (the
    fields every architecture shares)."""
    key = ckpt._key
    where = f"{ckpt.path}: GGUF metadata deepseek2"
    gating = key("expert_gating_func", 1)
    if gating not in _GATING:
        raise UnsupportedConfigError(f"{where}.expert_gating_func = {gating!r} is not "
                                     f"supported (1: softmax, DeepSeek-V2; 2: sigmoid, V3)")
    v3 = gating == 2
    heads = base["num_attention_heads"]
    rope_dim = key("rope.dimension_count")
    mla_k, mla_v = key("attention.key_length_mla"), key("attention.value_length_mla")
    if mla_k is None:  # an older file: the per-head widths under the plain keys
        mla_k, mla_v = key("attention.key_length"), key("attention.value_length")
    for name, value in (("rope.dimension_count", rope_dim), ("attention.key_length_mla", mla_k),
                        ("attention.value_length_mla", mla_v),
                        ("attention.kv_lora_rank", key("attention.kv_lora_rank"))):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UnsupportedConfigError(f"{where}.{name} = {value!r} must be a positive "
                                         f"integer")
    if mla_k <= rope_dim:
        raise UnsupportedConfigError(f"{where}.attention.key_length_mla = {mla_k} must exceed "
                                     f"rope.dimension_count = {rope_dim} (nope + pe dimensions)")
    groups, kept = key("expert_group_count", 1), key("expert_group_used_count", 1)
    out = {"architectures": [DEEPSEEK_V3 if v3 else DEEPSEEK_V2], "hidden_act": "silu",
           "num_key_value_heads": heads,
           "q_lora_rank": key("attention.q_lora_rank"),
           "kv_lora_rank": key("attention.kv_lora_rank"),
           "qk_nope_head_dim": mla_k - rope_dim, "qk_rope_head_dim": rope_dim,
           "v_head_dim": mla_v,
           "first_k_dense_replace": key("leading_dense_block_count", 0),
           "n_routed_experts": key("expert_count"),
           "num_experts_per_tok": key("expert_used_count"),
           "moe_intermediate_size": key("expert_feed_forward_length"),
           "n_shared_experts": key("expert_shared_count", 0),
           "routed_scaling_factor": _decimal(key("expert_weights_scale", 1.0)),
           "norm_topk_prob": bool(key("expert_weights_norm", False)),
           "scoring_func": _GATING[gating]}
    if v3:
        out.update(topk_method="noaux_tc", n_group=groups, topk_group=kept)
    elif kept != groups:
        # (Measured: llama-cpp-python 0.3.36 ranks them by their two best.)
        raise UnsupportedConfigError(
            f"{where}.expert_group_used_count = {kept} of expert_group_count = {groups} with "
            f"softmax gating is not supported: DeepSeek-V2's group_limited_greedy ranks "
            f"groups by their best expert, llama.cpp by the sum of their two best; the two "
            f"compute different models")
    scaling = key("rope.scaling.type")
    if scaling == "yarn":
        log_mul = key("rope.scaling.yarn_log_multiplier")
        out["rope_scaling"] = {"type": "yarn", "factor": _decimal(key("rope.scaling.factor")),
                               "beta_fast": _decimal(key("rope.scaling.yarn_beta_fast", 32.0)),
                               "beta_slow": _decimal(key("rope.scaling.yarn_beta_slow", 1.0)),
                               "original_max_position_embeddings":
                                   key("rope.scaling.original_context_length")}
        if log_mul is not None:
            # llama.cpp's softmax scale: mscale(factor, 10 log_mul)^2; its
            # RoPE's attention factor 1 (mscale equal to mscale_all_dim).
            # (The float32 key times 10, to the 6 digits it holds: 0.707.)
            mscale = float(f"{float(log_mul) * 10:.6g}")
            out["rope_scaling"].update(mscale=mscale, mscale_all_dim=mscale)
    elif scaling not in (None, "none"):
        raise UnsupportedConfigError(f"{where}.rope.scaling.type = {scaling!r} is not supported "
                                     f"(yarn or none)")
    return out


def plan(ckpt, i: int) -> list[tuple]:
    """`GGUFCheckpoint._plan`'s entries of layer `i`'s attention, under the
    step graph's names (`mla_layout.plan`'s), from the file's tensors:
    kv_b as `attn_k_b` ("heads_T": each head's block transposed) and
    `attn_v_b` ("heads"), or the whole `attn_kv_b`."""
    c = ckpt.config
    m, h, heads = c.mla, c.hidden_size, c.num_heads
    b = f"blk.{i}."
    rank = m.kv_lora_rank
    out = query_latent_plan(c, i, {
        "q": b + "attn_q.weight", "q_a": b + "attn_q_a.weight",
        "q_a_norm": b + "attn_q_a_norm.weight", "q_b": b + "attn_q_b.weight",
        "kv_a": b + "attn_kv_a_mqa.weight", "kv_a_norm": b + "attn_kv_a_norm.weight"})
    if b + "attn_kv_b.weight" in ckpt._tensors and b + "attn_k_b.weight" not in ckpt._tensors:
        rows = heads * (m.nope_dim + m.v_dim)
        out += [(key, b + "attn_kv_b.weight", (rows, rank), f"layer {i} KV up-projection",
                 ("rows", 0, rows)) for key in (f"l{i}_wk_b", f"l{i}_wv_b")]
    else:
        out += [(f"l{i}_wk_b", b + "attn_k_b.weight", (heads, rank, m.nope_dim),
                 f"layer {i} key up-projection", "heads_T"),
                (f"l{i}_wv_b", b + "attn_v_b.weight", (heads, m.v_dim, rank),
                 f"layer {i} value up-projection", "heads")]
    return out + [(f"l{i}_wo", b + "attn_output.weight", (h, heads * m.v_dim),
                   f"layer {i} output projection", None)]
