"""Baidu's ERNIE 4.5 text models, read as transformers' Ernie4_5Config and
Ernie4_5_MoeConfig read them (ERNIE-4.5-0.3B dense; ERNIE-4.5-21B-A3B and
300B-A47B MoE, the "-PT" repositories), and their GGUF files as llama.cpp's
converter writes them (`ernie4_5`, `ernie4_5-moe`).

ERNIE 4.5's layers are Llama's with RoPE on interleaved pairs (2i, 2i + 1)
of the whole head (transformers' `rotate_half` of even and odd dimensions,
cos and sin repeated pairwise: GPT-J's layout, which `partial_rotary`
permutes at load to the step graph's pairs, as for GLM-4). The MoE model's
sparse layers route by softmax, choose the top `moe_k` by score plus the
router's `e_score_correction_bias` (`moe_statics`: selection only), weight
the chosen experts by their unbiased scores divided by max(sum,
`moe_norm_min`), and add `moe_num_shared_experts` ungated shared experts
(one SwiGLU MLP that many times `moe_intermediate_size` wide). The
multi-token-prediction block (`mtp_*` tensors) is never run or read.
Each reader returns `ModelConfig` fields and raises `UnsupportedConfigError`
naming the field for what ETC would compute differently."""

from __future__ import annotations

import math

from .fields import UnsupportedConfigError, positive_int
from .moe_fields import _training_fields as training_fields

__all__ = ["ERNIE", "ERNIE_MOE", "ARCHITECTURES", "DEFAULT_THETA", "DEFAULT_HEAD_DIM",
           "NORM_MIN", "fields", "selection_bias", "gguf_config"]

#: ERNIE-4.5-0.3B (dense).
ERNIE = "Ernie4_5ForCausalLM"
#: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B (MoE).
ERNIE_MOE = "Ernie4_5_MoeForCausalLM"
ARCHITECTURES = (ERNIE, ERNIE_MOE)
#: Ernie4_5Config's and Ernie4_5_MoeConfig's RoPE base (`default_theta`).
DEFAULT_THETA = 500_000.0
#: Ernie4_5Config's head_dim when config.json has none (the MoE config has
#: no such field: hidden / heads).
DEFAULT_HEAD_DIM = {ERNIE: 128}
#: Ernie4_5_MoeConfig's `moe_norm_min`: the least the sum of the chosen
#: experts' scores is divided by.
NORM_MIN = 1e-12


def fields(config: dict, where: str, architecture: str, layers: int, need, flag) -> dict:
    """`ModelConfig` fields of an ERNIE 4.5 config (the attention's, and
    the MoE model's experts), as transformers reads them; `need(name)`
    reads a required positive integer, `flag(name, default)` a JSON
    boolean."""
    if flag("use_bias", False):
        raise UnsupportedConfigError(
            f"{where}: field 'use_bias' = True is not supported: ERNIE 4.5 then has biases on "
            f"every projection, its MLPs' included, and ETC's MLP projections have none (the "
            f"published ERNIE 4.5 models have no biases)")
    if not flag("use_rmsnorm", True):
        raise UnsupportedConfigError(
            f"{where}: field 'use_rmsnorm' = False is not supported (LayerNorm; ERNIE 4.5's "
            f"transformers classes, and ETC, norm by RMSNorm)")
    out = {"rope_interleaved": True}
    if architecture == ERNIE_MOE:
        out.update(_moe(config, where, layers, need, flag))
    return out


def _moe(config: dict, where: str, layers: int, need, flag) -> dict:
    """The MoE fields of Ernie4_5_MoeConfig: `moe_num_experts` experts of
    `moe_intermediate_size`, `moe_k` per token (`num_experts`,
    `num_experts_per_tok`: transformers' aliases), sparse the layers i with
    (i + 1) % `moe_layer_interval` == 0 from `moe_layer_start_index` to
    `moe_layer_end_index` (-1: the last) (transformers' defaults 1, -1,
    1), the others dense (`intermediate_size`); `moe_num_shared_experts`
    (default 2) shared experts; the selection bias read unless the
    original config's `moe_use_aux_free` is false (its checkpoints have
    none, and transformers' zeros change nothing)."""
    experts = _count(config, where, "moe_num_experts", "num_experts")
    per_token = _count(config, where, "moe_k", "num_experts_per_tok")
    if per_token > experts:
        raise UnsupportedConfigError(f"{where}: field 'moe_k' = {per_token} exceeds "
                                     f"moe_num_experts = {experts}")
    width = need("moe_intermediate_size")
    start = _index(config, where, "moe_layer_start_index", 1, layers)
    end = _index(config, where, "moe_layer_end_index", -1, layers)
    end = layers - 1 if end == -1 else end
    interval = config.get("moe_layer_interval")
    interval = 1 if interval is None else positive_int(where, "moe_layer_interval", interval)
    shared = config.get("moe_num_shared_experts")
    shared = 2 if shared is None else shared
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise UnsupportedConfigError(f"{where}: field 'moe_num_shared_experts' = {shared!r} "
                                     f"must be a non-negative integer")
    norm_min = config.get("moe_norm_min")
    norm_min = NORM_MIN if norm_min is None else norm_min
    if isinstance(norm_min, bool) or not isinstance(norm_min, (int, float)) or \
            not math.isfinite(norm_min) or norm_min < 0:
        raise UnsupportedConfigError(f"{where}: field 'moe_norm_min' = {norm_min!r} must be a "
                                     f"finite non-negative number")
    gate = config.get("moe_gate_act")
    if gate not in (None, "softmax"):
        raise UnsupportedConfigError(f"{where}: field 'moe_gate_act' = {gate!r} is not "
                                     f"supported (ERNIE 4.5's router scores by softmax)")
    kernel = config.get("moe_gate")  # the original code's router implementation, by name
    if kernel is not None and not isinstance(kernel, str):
        raise UnsupportedConfigError(f"{where}: field 'moe_gate' = {kernel!r} must be a string "
                                     f"(the original code's name of its router's kernel)")
    capacity = config.get("moe_capacity")
    if capacity is not None and not isinstance(capacity, list):
        raise UnsupportedConfigError(f"{where}: field 'moe_capacity' = {capacity!r} must be a "
                                     f"list (training's token capacities per expert)")
    nextn = config.get("num_nextn_predict_layers")
    if nextn is not None and (isinstance(nextn, bool) or not isinstance(nextn, int) or
                              nextn < 0):
        raise UnsupportedConfigError(f"{where}: field 'num_nextn_predict_layers' = {nextn!r} "
                                     f"must be a non-negative integer (the multi-token-"
                                     f"prediction block, which ETC does not run)")
    training_fields(config, where, flag)
    return {
        "num_experts": experts, "num_experts_per_tok": per_token,
        "moe_intermediate_size": width, "norm_topk_prob": True, "moe_norm_min": float(norm_min),
        "selection_bias": flag("moe_use_aux_free", True),
        "sparse_layers": tuple(i for i in range(layers)
                               if (i + 1) % interval == 0 and start <= i <= end),
        "shared_expert_intermediate_size": shared * width,
    }


def _count(config: dict, where: str, name: str, alias: str) -> int:
    """Required count `name`, or `alias`, its name in transformers'
    attribute_map (a contradicting pair refused)."""
    value, other = config.get(name), config.get(alias)
    if value is not None and other is not None and other != value:
        raise UnsupportedConfigError(f"{where}: field {alias!r} = {other!r} contradicts {name} = "
                                     f"{value!r} (transformers' alias of it); keep one")
    value = other if value is None else value
    if value is None:
        raise UnsupportedConfigError(f"{where}: field {name!r} is missing (required for "
                                     f"{ERNIE_MOE})")
    return positive_int(where, name, value)


def _index(config: dict, where: str, name: str, default: int, layers: int) -> int:
    """Layer index field `name` (-1 allowed: the last layer, as
    Ernie4_5_MoeConfig reads moe_layer_end_index)."""
    value = config.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < layers or \
            value == -1 and name != "moe_layer_end_index":
        raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a layer "
                                     f"index from 0 to num_hidden_layers - 1 = {layers - 1}" +
                                     (" (or -1: the last)" if name == "moe_layer_end_index"
                                      else ""))
    return value


def selection_bias(names, layer: int, experts: int) -> tuple:
    """The checkpoint plan's entry of sparse layer `layer`'s selection
    bias (`Checkpoint._plan`): (1, E) float32, `mlp.moe_statics.
    e_score_correction_bias` as the published checkpoints (and
    transformers' save_pretrained) name it, or `mlp.gate.moe_statics.
    ...` as transformers 5 holds it (`save_original_format=False`), where
    `names` (the checkpoint's tensor names) has that one."""
    p = f"model.layers.{layer}.mlp."
    name = p + "moe_statics.e_score_correction_bias"
    if name not in names and p + "gate." + name.removeprefix(p) in names:
        name = p + "gate." + name.removeprefix(p)
    return (f"l{layer}_selection_bias", name, (1, experts),
            f"layer {layer} router score correction bias (moe_statics)", "f32")


def gguf_config(ckpt, config: dict) -> dict:
    """config.json fields of an `ernie4_5-moe` GGUF file, as llama.cpp's
    converter writes them and llama.cpp reads them: `expert_count` experts
    of `expert_feed_forward_length`, `expert_used_count` per token, sparse
    the layers from `leading_dense_block_count` whose index + 1 is a
    multiple of `interleave_moe_layer_step` (to the last: the file keeps
    no end index), a shared expert `expert_shared_feed_forward_length`
    wide (what llama.cpp builds it with: a multiple of the experts' width,
    read as that many shared experts), the selection bias where the file
    has `exp_probs_b`; the sum of the chosen scores clamped at
    transformers' `moe_norm_min` (llama.cpp clamps at 2^-14: the two
    differ only when the chosen experts' scores sum below it)."""
    a = ckpt.architecture
    width = ckpt._key("expert_feed_forward_length")
    shared = ckpt._key("expert_shared_feed_forward_length", 0)
    if shared and isinstance(width, int) and width > 0 and shared % width:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata {a}.expert_shared_feed_forward_length = {shared} is "
            f"not a multiple of {a}.expert_feed_forward_length = {width} (ERNIE 4.5's shared "
            f"experts are each as wide as a routed one)")
    layers = config["num_hidden_layers"] or 0
    start = ckpt._key("leading_dense_block_count", 0)
    interval = ckpt._key("interleave_moe_layer_step", 1)
    first = next((i for i in range(layers) if isinstance(start, int) and i >= start and
                  isinstance(interval, int) and interval > 0 and (i + 1) % interval == 0), None)
    biased = first is not None and f"blk.{first}.exp_probs_b.bias" in ckpt._tensors
    return {"moe_num_experts": ckpt._key("expert_count"), "moe_k": ckpt._key("expert_used_count"),
            "moe_intermediate_size": width,
            "moe_num_shared_experts": shared // width if shared and width else 0,
            "moe_layer_start_index": start, "moe_layer_interval": interval,
            "moe_layer_end_index": -1, "moe_use_aux_free": biased}
