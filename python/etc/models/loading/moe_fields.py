"""The MoE fields of the MoE configs and of the shared experts, read for
`config.ModelConfig.from_dict`: Qwen3-MoE's and Qwen2-MoE's routed experts
(`qwen_moe`; Qwen2-MoE's shared expert with its sigmoid gate too), OLMoE's
(`olmoe`), Mixtral's (and Granite MoE's, gpt-oss's: `mixtral`), Granite
MoE's shared MLP (`granite_shared`) and GLM-4.5's sigmoid-routed experts,
shared experts and attention fields (`glm4_moe`); and the check that a
checkpoint holds no shared expert its config leaves out
(`check_shared_tensors`)."""

from __future__ import annotations

import math
import re

from .fields import UnsupportedConfigError, positive_int, positive_number

__all__ = ["QWEN_MOE", "GLM4_MOE", "qwen_moe", "olmoe", "mixtral", "granite_shared",
           "glm4_moe", "check_shared_tensors", "check_group_capacity"]

#: GLM-4.5's architecture (GLM-4.5, GLM-4.5-Air, GLM-4.6).
GLM4_MOE = "Glm4MoeForCausalLM"

#: The Qwen MoE architectures: experts in the layers `decoder_sparse_step`
#: and `mlp_only_layers` choose, the others dense.
QWEN_MOE = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")


def qwen_moe(config: dict, where: str, architecture: str, layers: int, need, flag) -> dict:
    """The MoE fields of a Qwen MoE config (`ModelConfig`'s MoE fields), as
    transformers reads them: `num_experts` experts of
    `moe_intermediate_size`, `num_experts_per_tok` per token, their softmax
    weights renormalised when `norm_topk_prob` (default false), sparse the
    layers `(i + 1) % decoder_sparse_step == 0` not in `mlp_only_layers`.
    Qwen2-MoE adds a shared expert to every sparse layer (a SwiGLU MLP of
    `shared_expert_intermediate_size`, gated by sigmoid(x . w)) and reads
    `qkv_bias` (default true: biases on q, k and v); its training-only
    fields are checked to be what they mean. Qwen3-MoE has no shared
    expert: a `shared_expert_intermediate_size` there is refused."""
    mlp_only = config.get("mlp_only_layers")
    mlp_only = [] if mlp_only is None else mlp_only
    if not isinstance(mlp_only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
        raise UnsupportedConfigError(f"{where}: field 'mlp_only_layers' = {mlp_only!r} "
                                     f"must be a list of layer indices")
    outside = [i for i in mlp_only if not 0 <= i < layers]
    if outside:
        # (transformers skips them: a model meant to have dense layers
        # would run sparse ones where they are.)
        raise UnsupportedConfigError(f"{where}: field 'mlp_only_layers' = {mlp_only!r} names "
                                     f"layers {outside} outside 0 to {layers - 1} "
                                     f"(num_hidden_layers = {layers})")
    step = config.get("decoder_sparse_step")
    step = 1 if step is None else positive_int(where, "decoder_sparse_step", step)
    experts = need("num_experts")
    out = {
        "num_experts": experts,
        "num_experts_per_tok": need("num_experts_per_tok"),
        "moe_intermediate_size": need("moe_intermediate_size"),
        "norm_topk_prob": flag("norm_topk_prob", False),
        # Hugging Face's rule for which layers are sparse.
        "sparse_layers": tuple(i for i in range(layers) if i not in mlp_only and
                               (i + 1) % step == 0),
    }
    if out["num_experts_per_tok"] > experts:
        raise UnsupportedConfigError(
            f"{where}: field 'num_experts_per_tok' = {out['num_experts_per_tok']} "
            f"exceeds num_experts = {experts}")
    if architecture == "Qwen3MoeForCausalLM":
        if config.get("shared_expert_intermediate_size"):
            raise UnsupportedConfigError(f"{where}: field 'shared_expert_intermediate_size' "
                                         f"is not supported for {architecture} (its layers "
                                         f"have no shared expert)")
        return out
    _training_fields(config, where, flag)
    out.update(shared_expert_intermediate_size=need("shared_expert_intermediate_size"),
               shared_expert_gate=True, qkv_bias=flag("qkv_bias", True))
    return out


def olmoe(config: dict, where: str, layers: int, need, flag) -> dict:
    """OLMoE's MoE fields (`ModelConfig`'s MoE fields), as transformers'
    OlmoeConfig and OlmoeTopKRouter read them: a sparse block in every
    layer, `num_experts` experts (`num_local_experts`, its alias, accepted;
    a contradicting one refused) of width `intermediate_size`,
    `num_experts_per_tok` per token, the softmax over every expert's logit,
    top-k, the k weights renormalised only when `norm_topk_prob` (default
    false, as in the published configs). `output_router_logits` and
    `router_aux_loss_coef` (training only) are checked to be what they
    mean."""
    experts, per_token = _expert_count(config, where, need, "OlmoeForCausalLM",
                                       ("num_experts", "num_local_experts"))
    _training_fields(config, where, flag)
    return {"num_experts": experts, "num_experts_per_tok": per_token,
            "moe_intermediate_size": need("intermediate_size"),
            "norm_topk_prob": flag("norm_topk_prob", False),
            "sparse_layers": tuple(range(layers))}


def _expert_count(config: dict, where: str, need, architecture: str,
                  names: tuple) -> tuple:
    """The number of experts and of experts per token: the field `names[0]`
    or its alias `names[1]` (transformers reads either; both, disagreeing,
    are refused), and `num_experts_per_tok`, at most that many."""
    field, alias_field = names
    experts, alias = config.get(field), config.get(alias_field)
    if experts is None:
        experts = alias
    elif alias is not None and alias != experts:
        raise UnsupportedConfigError(f"{where}: field {alias_field!r} = {alias!r} contradicts "
                                     f"{field} = {experts!r} (transformers' alias of it); "
                                     f"keep one")
    if experts is None:
        raise UnsupportedConfigError(f"{where}: field {field!r} is missing (required for "
                                     f"{architecture})")
    experts = positive_int(where, field, experts)
    per_token = need("num_experts_per_tok")
    if per_token > experts:
        raise UnsupportedConfigError(f"{where}: field 'num_experts_per_tok' = {per_token} "
                                     f"exceeds {field} = {experts}")
    return experts, per_token


def _training_fields(config: dict, where: str, flag) -> None:
    """Checks the router's training-only fields, which inference does not
    use: `output_router_logits` a JSON boolean, `router_aux_loss_coef` (the
    load-balancing loss's weight) a finite number."""
    flag("output_router_logits", False)
    coef = config.get("router_aux_loss_coef")
    if coef is not None and (isinstance(coef, bool) or not isinstance(coef, (int, float)) or
                             not math.isfinite(coef)):
        raise UnsupportedConfigError(f"{where}: field 'router_aux_loss_coef' = {coef!r} must "
                                     f"be a finite number (training-only loss weight)")


def mixtral(config: dict, where: str, layers: int, need, flag,
            architecture: str = "MixtralForCausalLM") -> dict:
    """Mixtral's MoE fields (`ModelConfig`'s MoE fields), as transformers 4
    and 5 read them (Granite MoE's too: the same fields; its router's
    softmax of the top-k logits gives the same weights): a sparse block in
    every layer, `num_local_experts` experts (`num_experts` is transformers' alias of it) of width
    `intermediate_size`, `num_experts_per_tok` per token, their softmax
    weights renormalised over the chosen ones (MixtralTopKRouter: softmax
    over every expert, top-k, divided by the sum of the k), which is
    Qwen3-MoE's `norm_topk_prob`. The training-only fields are accepted,
    checked to be what they mean: `router_jitter_noise` (transformers
    multiplies the MoE input by noise only in training mode: inference,
    and so ETC, compute the same with any value), `output_router_logits`
    and `router_aux_loss_coef` (the load-balancing loss). gpt-oss reads
    the same fields (its router takes the top-k logits, then their
    softmax: the same weights), and has no jitter."""
    experts, per_token = _expert_count(config, where, need, architecture,
                                       ("num_local_experts", "num_experts"))
    jitter = config.get("router_jitter_noise")
    if jitter is not None and architecture == "GptOssForCausalLM":
        raise UnsupportedConfigError(f"{where}: field 'router_jitter_noise' is not a gpt-oss "
                                     f"field (its router has no noise)")
    if jitter is not None and (isinstance(jitter, bool) or
                               not isinstance(jitter, (int, float)) or
                               not math.isfinite(jitter) or jitter < 0):
        raise UnsupportedConfigError(f"{where}: field 'router_jitter_noise' = {jitter!r} must "
                                     f"be a non-negative number (training-only noise)")
    _training_fields(config, where, flag)
    return {"num_experts": experts, "num_experts_per_tok": per_token,
            "moe_intermediate_size": need("intermediate_size"), "norm_topk_prob": True,
            "sparse_layers": tuple(range(layers))}


def granite_shared(config: dict, where: str) -> dict:
    """Granite MoE's shared MLP (GraniteMoeSharedForCausalLM), as
    transformers reads it: `shared_intermediate_size` (default 0: none,
    the layers are Granite MoE's) wide, beside the experts of every layer,
    its output added to theirs, no gate."""
    width = config.get("shared_intermediate_size")
    if width is None or type(width) is int and width == 0:
        return {}
    return {"shared_expert_intermediate_size":
            positive_int(where, "shared_intermediate_size", width)}


def glm4_moe(config: dict, where: str, layers: int, need, flag) -> dict:
    """GLM-4.5's MoE and attention fields (`ModelConfig`'s), as
    transformers' Glm4MoeConfig reads them: `n_routed_experts` experts of
    `moe_intermediate_size`, `num_experts_per_tok` per token, routed by
    sigmoid scores plus the router's `e_score_correction_bias` (selection
    only) among the `topk_group` best of `n_group` expert groups, weights
    renormalised when `norm_topk_prob` (default true) and times
    `routed_scaling_factor` (default 1); `n_shared_experts` (default 1)
    shared experts of the same width, one SwiGLU MLP n times as wide, no
    gate; dense layers before `first_k_dense_replace` (default 1).
    `attention_bias` (default false) puts biases on q, k and v (o has
    none), `use_qk_norm` (default false) per-head RMSNorms on q and k. The
    multi-token-prediction layers (`num_nextn_predict_layers`, transformers
    5's `num_mtp_layers`) are extra layers after the last, which a decoder
    never runs: their count is checked, their weights are not read."""
    experts = need("n_routed_experts")
    per_token = need("num_experts_per_tok")
    groups = config.get("n_group")
    groups = 1 if groups is None else positive_int(where, "n_group", groups)
    kept = config.get("topk_group")
    kept = 1 if kept is None else positive_int(where, "topk_group", kept)
    if experts % groups or (groups > 1 and experts // groups < 2):
        raise UnsupportedConfigError(f"{where}: field 'n_group' = {groups} must divide "
                                     f"n_routed_experts = {experts} into groups of at least 2")
    if kept > groups:
        raise UnsupportedConfigError(f"{where}: field 'topk_group' = {kept} exceeds n_group = "
                                     f"{groups}")
    check_group_capacity(where, per_token, experts, groups, kept)
    dense = config.get("first_k_dense_replace")
    dense = 1 if dense is None else dense
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense <= layers:
        raise UnsupportedConfigError(f"{where}: field 'first_k_dense_replace' = {dense!r} must "
                                     f"be an integer from 0 to num_hidden_layers = {layers}")
    shared = config.get("n_shared_experts")
    shared = 1 if shared is None else shared
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise UnsupportedConfigError(f"{where}: field 'n_shared_experts' = {shared!r} must be "
                                     f"a non-negative integer")
    for name in ("num_nextn_predict_layers", "num_mtp_layers"):
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                  value < 0):
            raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a "
                                         f"non-negative integer (layers ETC does not run)")
    _training_fields(config, where, flag)
    scale = config.get("routed_scaling_factor")
    width = need("moe_intermediate_size")
    return {
        "num_experts": experts, "num_experts_per_tok": per_token, "moe_intermediate_size": width,
        "norm_topk_prob": flag("norm_topk_prob", True), "moe_scoring": "sigmoid",
        "selection_bias": True, "n_group": groups, "topk_group": kept,
        "routed_scaling_factor": 1.0 if scale is None else
        positive_number(where, "routed_scaling_factor", scale),
        "sparse_layers": tuple(range(dense, layers)),
        "shared_expert_intermediate_size": shared * width,
        "qkv_bias": flag("attention_bias", False), "qk_norm": flag("use_qk_norm", False),
    }


#: A shared expert's tensor of decoder layer <i>, as each family names it:
#: Qwen2-MoE's `mlp.shared_expert[_gate]`, Granite's `shared_mlp`,
#: GLM-4.5's `mlp.shared_experts`.
_SHARED_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\..*?\b(?:shared_expert|shared_expert_gate|"
                            r"shared_experts|shared_mlp)\.")
#: The config field that gives each family its shared expert.
_SHARED_FIELD = {"GraniteMoeForCausalLM": "shared_intermediate_size",
                 "GraniteMoeSharedForCausalLM": "shared_intermediate_size",
                 GLM4_MOE: "n_shared_experts",
                 "Qwen2MoeForCausalLM": "shared_expert_intermediate_size",
                 # (families_deepseek's and families_ernie's, which import this module)
                 "DeepseekV2ForCausalLM": "n_shared_experts",
                 "DeepseekV3ForCausalLM": "n_shared_experts",
                 "Ernie4_5_MoeForCausalLM": "moe_num_shared_experts"}


def check_shared_tensors(config, names, where: str) -> None:
    """Refuses a checkpoint (tensor `names`) with a shared expert's tensors
    in a decoder layer that `config` (a `ModelConfig`) gives none: a
    Granite MoE whose `shared_intermediate_size` is 0, a GLM-4.5 with
    `n_shared_experts` 0, a layer the config makes dense, a family without
    shared experts. transformers leaves such weights unused (with a
    warning), so the model would not be the one the weights are of.
    Layers past the decoder's (GLM-4.5's prediction layers) are not run."""
    for name in sorted(names):
        found = _SHARED_TENSOR.search(name)
        if found is None:
            continue
        layer = int(found.group(1))
        if layer >= config.num_layers or (config.is_sparse(layer) and
                                          config.shared_expert_intermediate_size):
            continue
        field = _SHARED_FIELD.get(config.architecture)
        if not config.is_sparse(layer):
            why = f"layer {layer} is dense"
        elif field is None:
            why = f"{config.architecture} has no shared expert"
        else:
            why = f"field {field!r} gives none"
        raise UnsupportedConfigError(
            f"{where}: tensor {name!r} is a shared expert's, but config.json's model has none "
            f"in layer {layer} ({why}): the weights would go unused")


def check_group_capacity(where: str, per_token: int, experts: int, groups: int,
                         kept: int) -> None:
    """Refuses `num_experts_per_tok` beyond the experts of the `topk_group`
    = `kept` groups (of `groups`) a token chooses from: transformers would
    then choose zero-scored experts outside them (GLM-4.5, DeepSeek)."""
    if per_token > kept * (experts // groups):
        raise UnsupportedConfigError(
            f"{where}: field 'num_experts_per_tok' = {per_token} exceeds the "
            f"{kept * (experts // groups)} experts of the topk_group = {kept} groups")
