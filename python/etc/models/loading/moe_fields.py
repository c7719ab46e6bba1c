"""The MoE fields of the Qwen MoE configs, OLMoE's and the shared experts,
read for `config.ModelConfig.from_dict`: Qwen3-MoE's and Qwen2-MoE's routed
experts (`qwen_moe`; Qwen2-MoE's shared expert with its sigmoid gate too),
OLMoE's (`olmoe`) and Granite MoE's shared MLP (`granite_shared`)."""

from __future__ import annotations

from .fields import UnsupportedConfigError, positive_int

__all__ = ["QWEN_MOE", "qwen_moe", "olmoe", "granite_shared"]

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
    experts, alias = config.get("num_experts"), config.get("num_local_experts")
    if experts is None:
        experts = alias
    elif alias is not None and alias != experts:
        raise UnsupportedConfigError(f"{where}: field 'num_local_experts' = {alias!r} "
                                     f"contradicts num_experts = {experts!r} (OlmoeConfig's "
                                     f"alias of it); keep one")
    if experts is None:
        raise UnsupportedConfigError(f"{where}: field 'num_experts' is missing (required for "
                                     f"OlmoeForCausalLM)")
    experts = positive_int(where, "num_experts", experts)
    per_token = need("num_experts_per_tok")
    if per_token > experts:
        raise UnsupportedConfigError(f"{where}: field 'num_experts_per_tok' = {per_token} "
                                     f"exceeds num_experts = {experts}")
    _training_fields(config, where, flag)
    return {"num_experts": experts, "num_experts_per_tok": per_token,
            "moe_intermediate_size": need("intermediate_size"),
            "norm_topk_prob": flag("norm_topk_prob", False),
            "sparse_layers": tuple(range(layers))}


def _training_fields(config: dict, where: str, flag) -> None:
    """Checks the router's training-only fields: `output_router_logits` a
    JSON boolean, `router_aux_loss_coef` a number."""
    flag("output_router_logits", False)
    coef = config.get("router_aux_loss_coef")
    if coef is not None and (isinstance(coef, bool) or not isinstance(coef, (int, float))):
        raise UnsupportedConfigError(f"{where}: field 'router_aux_loss_coef' = {coef!r} must "
                                     f"be a number (training-only loss weight)")


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
