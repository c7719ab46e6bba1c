"""DeepSeek-V2 and DeepSeek-V3 configs (DeepSeek-V2/V2-Lite, Coder-V2, V3, R1,
Kimi K2, Moonlight): multi-head latent attention (MLA) and DeepSeek's
routed and shared experts, read as transformers 5's DeepseekV2Config /
DeepseekV3Config and their modelling code read them.

MLA (`MlaShape`): q = x Wq (or, with `q_lora_rank`, q_b(norm(q_a(x))));
each head's q is [nope (qk_nope_head_dim), pe (qk_rope_head_dim)];
kv_a_proj_with_mqa maps x to a latent c (kv_lora_rank) and one pe key
shared by every head; c is normed (kv_a_layernorm) and kv_b_proj expands it
to each head's [k_nope, v (v_head_dim)]. RoPE rotates the pe parts only,
in interleaved pairs (2i, 2i + 1): DeepSeek-V2's complex rotation, and
DeepSeek-V3's with `rope_interleave` (its default; false: rotate_half
pairs). The step graph's layout of these weights is `etc.models.step.mla`'s.

Experts: `n_routed_experts` of `moe_intermediate_size`, `n_shared_experts`
shared ones (one SwiGLU MLP that many times as wide, ungated), dense layers
before `first_k_dense_replace`. DeepSeek-V2 scores by softmax and takes
the top k greedily (`topk_method` "greedy"), the weights never
renormalised, times `routed_scaling_factor`; DeepSeek-V3 by sigmoid plus
the router's `e_score_correction_bias` among the `topk_group` best of
`n_group` groups (a group's score the sum of its two best: "noaux_tc"),
renormalised when `norm_topk_prob`, times `routed_scaling_factor`.
DeepSeek-V2's "group_limited_greedy" keeps the experts of the `topk_group`
of `n_group` groups whose best score is highest (`Graph.moe`'s
group_score "max").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .fields import UnsupportedConfigError, positive_int, positive_number
from .moe_fields import check_group_capacity

__all__ = ["DEEPSEEK_V2", "DEEPSEEK_V3", "ARCHITECTURES", "MlaShape", "head_dim", "deepseek"]

DEEPSEEK_V2 = "DeepseekV2ForCausalLM"
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"
#: The architectures read here.
ARCHITECTURES = (DEEPSEEK_V2, DEEPSEEK_V3)
#: transformers' defaults where config.json has no value (DeepseekV2Config,
#: DeepseekV3Config).
_DEFAULTS = {
    DEEPSEEK_V2: {"q_lora_rank": 1536, "first_k_dense_replace": 0, "n_shared_experts": 2,
                  "n_routed_experts": 64, "moe_intermediate_size": 1407,
                  "routed_scaling_factor": 1.0, "norm_topk_prob": False},
    DEEPSEEK_V3: {"q_lora_rank": 1536, "first_k_dense_replace": 3, "n_shared_experts": 1,
                  "n_routed_experts": 256, "moe_intermediate_size": 2048,
                  "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 8,
                  "topk_group": 4, "num_experts_per_tok": 8},
}
_SHAPE_DEFAULTS = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128}


@dataclass(frozen=True)
class MlaShape:
    """The shape of one model's multi-head latent attention."""

    #: The rank of q's low-rank projection (q_a_proj, q_a_layernorm,
    #: q_b_proj), or None for one q_proj.
    q_lora_rank: Optional[int]
    #: The width of the latent c that kv_b_proj expands into k_nope and v.
    kv_lora_rank: int
    #: Per head: the dimensions of q and k without RoPE, with RoPE (the key
    #: part shared by every head), and of v.
    nope_dim: int
    rope_dim: int
    v_dim: int
    #: RoPE pairs (2i, 2i + 1) of the pe dimensions (else (i, i + rope_dim / 2)).
    interleaved: bool
    #: The attention logits' scale: (nope_dim + rope_dim)^-1/2, times yarn's
    #: mscale(factor, mscale_all_dim) squared where rope_scaling has
    #: mscale_all_dim (transformers' `yarn_apply_mscale`).
    softmax_scale: float


def _int_field(config: dict, where: str, name: str, architecture: str) -> int:
    value = config.get(name)
    if value is None:
        value = _SHAPE_DEFAULTS.get(name, _DEFAULTS[architecture].get(name))
    if value is None:
        raise UnsupportedConfigError(f"{where}: field {name!r} is missing (required for "
                                     f"{architecture})")
    return positive_int(where, name, value)


def head_dim(config: dict, where: str, architecture: str) -> int:
    """The step graph's head width of q and k: qk_nope_head_dim +
    qk_rope_head_dim. transformers overwrites `head_dim` with
    qk_rope_head_dim (the RoPE's width) and writes that back, and
    `qk_head_dim` with their sum: any other value in config.json is
    refused, naming it."""
    nope = _int_field(config, where, "qk_nope_head_dim", architecture)
    rope_dim = _int_field(config, where, "qk_rope_head_dim", architecture)
    if rope_dim % 2:
        raise UnsupportedConfigError(f"{where}: field 'qk_rope_head_dim' = {rope_dim} must be "
                                     f"even (RoPE rotates pairs)")
    given = config.get("head_dim")
    if given is not None and given != rope_dim:
        raise UnsupportedConfigError(
            f"{where}: field 'head_dim' = {given!r} is not supported for {architecture}: "
            f"transformers sets it to qk_rope_head_dim = {rope_dim} (q and k heads are "
            f"qk_nope_head_dim + qk_rope_head_dim wide, v heads v_head_dim)")
    written = config.get("qk_head_dim")  # (transformers 5 writes it back too)
    if written is not None and written != nope + rope_dim:
        raise UnsupportedConfigError(
            f"{where}: field 'qk_head_dim' = {written!r} contradicts qk_nope_head_dim + "
            f"qk_rope_head_dim = {nope + rope_dim}")
    return nope + rope_dim


def _mscale(scale: float, m: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def deepseek(config: dict, where: str, architecture: str, layers: int, heads: int,
             scaling: Optional[dict], need, flag) -> dict:
    """The `ModelConfig` fields of a DeepSeek-V2 or V3 config other than the
    generic ones: `mla` (`MlaShape`) and the MoE fields; `scaling` is the
    RoPE variant `rope.read` made of it. Refused by name: KV heads other
    than the heads (transformers' repeat_kv would not fit), moe_layer_freq
    other than 1, V2's norm_topk_prob true (transformers' DeepseekV2 never
    renormalises, DeepSeek's own code did), and a scoring_func or
    topk_method the class does not compute."""
    defaults = _DEFAULTS[architecture]
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise UnsupportedConfigError(
            f"{where}: field 'num_key_value_heads' = {kv_heads!r} is not supported for "
            f"{architecture}: MLA expands its latent into every one of the "
            f"num_attention_heads = {heads} heads")
    rank = config.get("q_lora_rank", defaults["q_lora_rank"])
    rank = None if rank is None else positive_int(where, "q_lora_rank", rank)
    interleaved = True
    if architecture == DEEPSEEK_V3:
        interleaved = flag("rope_interleave", True)
    elif config.get("rope_interleave") is not None:
        raise UnsupportedConfigError(f"{where}: field 'rope_interleave' is not a {architecture} "
                                     f"field (its RoPE pairs are always interleaved)")
    widths = {name: _int_field(config, where, name, architecture)
              for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    nope, rope_dim = widths["qk_nope_head_dim"], widths["qk_rope_head_dim"]
    scale = (nope + rope_dim) ** -0.5
    if scaling and scaling.get("mscale_all_dim"):
        scale *= _mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    mla = MlaShape(q_lora_rank=rank, kv_lora_rank=widths["kv_lora_rank"], nope_dim=nope,
                   rope_dim=rope_dim, v_dim=widths["v_head_dim"], interleaved=interleaved,
                   softmax_scale=scale)
    if mla.v_dim > mla.nope_dim + mla.rope_dim:
        raise UnsupportedConfigError(
            f"{where}: field 'v_head_dim' = {mla.v_dim} is not supported above "
            f"qk_nope_head_dim + qk_rope_head_dim = {mla.nope_dim + mla.rope_dim} (the step "
            f"graph's v heads are as wide as its q and k heads)")
    return {"mla": mla,
            **_experts(config, where, architecture, layers, need, flag)}


def _count(config: dict, where: str, name: str, default, low: int = 1) -> int:
    value = config.get(name, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be an integer "
                                     f"of at least {low}")
    return value


def _experts(config: dict, where: str, architecture: str, layers: int, need, flag) -> dict:
    """DeepSeek's MoE fields (see the module docstring)."""
    defaults = _DEFAULTS[architecture]
    experts = _count(config, where, "n_routed_experts", defaults["n_routed_experts"])
    per_token = config.get("num_experts_per_tok", defaults.get("num_experts_per_tok"))
    if per_token is None:
        per_token = need("num_experts_per_tok")  # (V2 has no default: the error names it)
    per_token = positive_int(where, "num_experts_per_tok", per_token)
    groups = _count(config, where, "n_group", defaults.get("n_group", 1))
    kept = _count(config, where, "topk_group", defaults.get("topk_group", 1))
    if experts % groups:
        raise UnsupportedConfigError(f"{where}: field 'n_group' = {groups} must divide "
                                     f"n_routed_experts = {experts}")
    if kept > groups:
        raise UnsupportedConfigError(f"{where}: field 'topk_group' = {kept} exceeds n_group = "
                                     f"{groups}")
    if per_token > experts:
        raise UnsupportedConfigError(f"{where}: field 'num_experts_per_tok' = {per_token} "
                                     f"exceeds n_routed_experts = {experts}")
    freq = config.get("moe_layer_freq")
    if freq is not None and (type(freq) is not int or freq != 1):
        raise UnsupportedConfigError(f"{where}: field 'moe_layer_freq' = {freq!r} is not "
                                     f"supported (transformers makes every layer from "
                                     f"first_k_dense_replace on sparse: 1)")
    dense = _count(config, where, "first_k_dense_replace", defaults["first_k_dense_replace"],
                   low=0)
    if dense > layers:
        raise UnsupportedConfigError(f"{where}: field 'first_k_dense_replace' = {dense} exceeds "
                                     f"num_hidden_layers = {layers}")
    shared = _count(config, where, "n_shared_experts", defaults["n_shared_experts"], low=0)
    scale = config.get("routed_scaling_factor")
    scale = defaults["routed_scaling_factor"] if scale is None else \
        positive_number(where, "routed_scaling_factor", scale)
    normalize = flag("norm_topk_prob", defaults["norm_topk_prob"])
    for name in ("num_nextn_predict_layers", "num_mtp_layers"):
        # Multi-token-prediction layers after the last: a decoder never
        # runs them, and their weights are not read.
        _count(config, where, name, 0, low=0)
    width = _count(config, where, "moe_intermediate_size", defaults["moe_intermediate_size"])
    out = {"num_experts": experts, "num_experts_per_tok": per_token,
           "moe_intermediate_size": width, "routed_scaling_factor": scale,
           "sparse_layers": tuple(range(dense, layers)),
           "shared_expert_intermediate_size": shared * width}
    scoring, method = config.get("scoring_func"), config.get("topk_method")
    if architecture == DEEPSEEK_V2:
        if scoring not in (None, "softmax"):
            raise UnsupportedConfigError(f"{where}: field 'scoring_func' = {scoring!r} is not "
                                         f"supported for {architecture} (transformers scores "
                                         f"its experts by softmax)")
        if normalize:
            raise UnsupportedConfigError(
                f"{where}: field 'norm_topk_prob' = True is not supported for {architecture}: "
                f"transformers' DeepseekV2 never renormalises the top-k weights, DeepSeek's "
                f"own modelling code does; the two compute different models")
        if method not in (None, "greedy", "group_limited_greedy"):
            raise UnsupportedConfigError(f"{where}: field 'topk_method' = {method!r} is not "
                                         f"supported for {architecture} ('greedy', "
                                         f"'group_limited_greedy')")
        out.update(norm_topk_prob=False, moe_scoring="softmax")
        if method != "group_limited_greedy" or kept == groups:
            return out  # greedy over every expert: the groups do not limit the choice
        check_group_capacity(where, per_token, experts, groups, kept)
        # The experts of the topk_group groups whose best score is highest.
        return {**out, "n_group": groups, "topk_group": kept, "moe_group_score": "max"}
    if scoring not in (None, "sigmoid"):
        raise UnsupportedConfigError(f"{where}: field 'scoring_func' = {scoring!r} is not "
                                     f"supported for {architecture} (transformers scores its "
                                     f"experts by sigmoid)")
    if method not in (None, "noaux_tc"):
        raise UnsupportedConfigError(f"{where}: field 'topk_method' = {method!r} is not "
                                     f"supported for {architecture} (transformers routes by "
                                     f"'noaux_tc': the selection bias, groups scored by their "
                                     f"two best)")
    if groups > 1 and experts // groups < 2:
        raise UnsupportedConfigError(f"{where}: field 'n_group' = {groups} leaves groups of "
                                     f"fewer than 2 of the n_routed_experts = {experts}")
    check_group_capacity(where, per_token, experts, groups, kept)
    return {**out, "norm_topk_prob": normalize, "moe_scoring": "sigmoid",
            "selection_bias": True, "n_group": groups, "topk_group": kept}
