"""What each GGUF architecture's metadata says as config.json fields: the
per-family readers `GGUFCheckpoint._hf_config` (etc.models.loading.gguf)
calls once the fields every family shares are read.

Each function takes the checkpoint (its `_key` / `_per_layer` metadata
reader, `.path` for errors, `._tensors` for the tensors whose presence says
something, `.tensor` for LongRoPE's factors) and returns the fields to add,
spelled as the family's Hugging Face config.json spells them, so that
`ModelConfig.from_dict` checks a GGUF file exactly as it would the
config.json; what llama.cpp fixes without a key (Gemma's layer pattern,
SmolLM3's NoPE step, gpt-oss's SwiGLU clamp) is written out here.
"""

from __future__ import annotations

import math

import numpy as np

from . import rope
from .checkpoint import MissingTensorError
from .config import UnsupportedConfigError

#: SmolLM3's NoPE layers as llama.cpp fixes them (no key): every 4th.
SMOLLM3_NO_ROPE_STEP = 4
#: Gemma's layer pattern as llama.cpp fixes it (every n-th layer full),
#: and its layer count of the 27B models, whose attention scale llama.cpp
#: takes from hidden / heads instead of the head size.
GEMMA_LLAMA_CPP = {"gemma2": (2, 46), "gemma3": (6, 62)}


def decimal(value):
    """A float32 from the metadata as the shortest decimal that rounds to it
    (1e-06, not 9.99999997e-07): what the config.json it came from said."""
    if isinstance(value, float):
        return float(str(np.float32(value)))
    return value


def phi3_config(ckpt) -> dict:
    """Phi-3's (and Phi-4-mini's) plain fields: SiLU, the window
    (`attention.sliding_window`; llama.cpp writes 0 for none) and the
    original context of LongRoPE, Phi3Config's top-level field."""
    out = {"hidden_act": "silu", "sliding_window": ckpt._key("attention.sliding_window") or None}
    original = ckpt._key("rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = original
    return out


def smollm3_config(ckpt) -> dict:
    """llama.cpp's smollm3: no window; no RoPE on every 4th layer (no key)."""
    return {"hidden_act": "silu", "no_rope_layer_interval": SMOLLM3_NO_ROPE_STEP}


def qwen3moe_config(ckpt, config: dict) -> dict:
    """Qwen3-MoE's and Qwen2-MoE's experts (`expert_count`,
    `expert_used_count`, of `expert_feed_forward_length`; Qwen3-MoE's
    renormalised unless `expert_weights_norm` says not, Qwen2-MoE's never:
    llama.cpp's qwen2moe reads no key for it), every layer sparse but those
    without a router (`blk.<i>.ffn_gate_inp.weight`), and the shared
    expert's width (`expert_shared_feed_forward_length`; Qwen2-MoE's,
    absent or 0, is `feed_forward_length`, as llama.cpp's qwen2moe reads
    it); Qwen2-MoE's q/k/v biases where the file has them."""
    layers = config["num_hidden_layers"] or 0
    out = {
        "num_experts": ckpt._key("expert_count"),
        "num_experts_per_tok": ckpt._key("expert_used_count"),
        "moe_intermediate_size": ckpt._key("expert_feed_forward_length"),
        "norm_topk_prob": _never_renormalised(ckpt) if ckpt.architecture == "qwen2moe" else
        bool(ckpt._key("expert_weights_norm", True)),
        "decoder_sparse_step": 1,
        # The layers without a router are dense.
        "mlp_only_layers": [i for i in range(layers)
                            if f"blk.{i}.ffn_gate_inp.weight" not in ckpt._tensors],
        "shared_expert_intermediate_size": ckpt._key("expert_shared_feed_forward_length"),
    }
    if ckpt.architecture == "qwen2moe":
        out["qkv_bias"] = "blk.0.attn_q.bias" in ckpt._tensors
        # Every Qwen2-MoE layer has its shared expert.
        out["shared_expert_intermediate_size"] = out["shared_expert_intermediate_size"] or \
            config["intermediate_size"]
    return out


def olmoe_config(ckpt) -> dict:
    """OLMoE's experts as llama.cpp's olmoe reads them: `.expert_count`,
    `.expert_used_count`, each of `.feed_forward_length` (config.json's
    `intermediate_size`, read with the common keys), never renormalised."""
    return {"num_experts": ckpt._key("expert_count"),
            "num_experts_per_tok": ckpt._key("expert_used_count"),
            "norm_topk_prob": _never_renormalised(ckpt)}


def _never_renormalised(ckpt) -> bool:
    """False: the architecture's chosen expert weights are not renormalised
    (llama.cpp's qwen2moe and olmoe build their MoE without, and read no
    key for it); an `.expert_weights_norm` of true is refused."""
    norm = ckpt._key("expert_weights_norm")
    if norm:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata {ckpt.architecture}.expert_weights_norm = {norm!r} is "
            f"not supported (llama.cpp's {ckpt.architecture} never renormalises the chosen "
            f"weights)")
    return False


def longrope(ckpt, rotated: int) -> dict:
    """Phi-3's LongRoPE as llama.cpp's converter stores it: the long and
    short factors as tensors `rope_factors_long/short` (rotated / 2
    float32 each), the original context (`rope.scaling.
    original_context_length`) and the attention factor
    (`rope.scaling.attn_factor`)."""
    a = ckpt.architecture
    factors = {}
    for kind in ("long", "short"):
        name = f"rope_factors_{kind}.weight"
        if name not in ckpt._tensors:
            raise MissingTensorError(f"{ckpt.path}: tensor {name!r} (Phi-3's LongRoPE "
                                     f"{kind} factors) is missing from the GGUF file")
        factors[kind] = [float(v) for v in ckpt.tensor(name, (rotated // 2,),
                                                       f"LongRoPE {kind} factors")]
    original = ckpt._key("rope.scaling.original_context_length")
    if original is None:
        raise UnsupportedConfigError(f"{ckpt.path}: GGUF metadata "
                                     f"'{a}.rope.scaling.original_context_length' is "
                                     f"missing (LongRoPE's original context)")
    out = {"rope_type": "longrope", "long_factor": factors["long"],
           "short_factor": factors["short"], "original_max_position_embeddings": original}
    attention = ckpt._key("rope.scaling.attn_factor")
    context = ckpt._key("context_length")
    if attention is not None and context:
        # The converter writes transformers' default (from the context's
        # scale); kept only where the file says otherwise.
        derived = rope.attention_factor({**out, "factor": context / original})
        if not math.isclose(attention, derived, rel_tol=1e-6):
            out["attention_factor"] = decimal(attention)
    return out


def mixtral_config(ckpt, config: dict) -> dict:
    """A `llama` file with experts is Mixtral, as llama.cpp's converter
    writes it (and llama.cpp reads it: softmax over every expert, the
    chosen ones' weights renormalised): `expert_count` experts of
    `feed_forward_length` (an `expert_feed_forward_length` that
    differs is refused: llama.cpp's llama would not read it), of which
    `expert_used_count` per token; no window (the converter writes
    none); shared experts refused."""
    a = ckpt.architecture
    width = ckpt._key("expert_feed_forward_length")
    if width is not None and width != config["intermediate_size"]:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata {a}.expert_feed_forward_length = {width} differs "
            f"from {a}.feed_forward_length = {config['intermediate_size']}; llama.cpp's "
            f"llama (Mixtral) gives its experts feed_forward_length")
    for key in ("expert_shared_count", "expert_shared_feed_forward_length"):
        if ckpt._key(key):
            raise UnsupportedConfigError(
                f"{ckpt.path}: GGUF metadata {a}.{key} = {ckpt._key(key)} is not "
                f"supported: llama.cpp's llama (Mixtral) runs no shared experts")
    return {"architectures": ["MixtralForCausalLM"],
            "num_local_experts": ckpt._key("expert_count"),
            "num_experts_per_tok": ckpt._key("expert_used_count")}


def granite_config(ckpt, config: dict) -> dict:
    """Granite's multipliers as llama.cpp reads them (`embedding_scale`,
    `attention.scale`, `residual_scale`, `logit_scale`; absent or 0:
    llama.cpp's defaults, 1 and 1 / sqrt(head size) for the attention),
    and Granite MoE's experts (`expert_count`, `expert_used_count`, each
    of `feed_forward_length`, softmax weights renormalised over the
    chosen ones), with a shared MLP (GraniteMoeShared, which llama.cpp's
    converter writes as granitemoe: `expert_shared_feed_forward_length`,
    `ffn_{gate,up,down}_shexp` tensors)."""
    a = ckpt.architecture
    out = {}
    for field, key in (("embedding_multiplier", "embedding_scale"),
                       ("residual_multiplier", "residual_scale"),
                       ("logits_scaling", "logit_scale"),
                       ("attention_multiplier", "attention.scale")):
        value = ckpt._key(key)
        if value:  # llama.cpp reads 0 as "not set"
            out[field] = decimal(value)
    if "attention_multiplier" not in out:
        heads, hidden = config["num_attention_heads"], config["hidden_size"]
        head_dim = ckpt._key("attention.key_length") or (hidden // heads if heads else 1)
        out["attention_multiplier"] = 1 / float(np.sqrt(head_dim))
    if a == "granitemoe":
        # Absent or 0: no shared MLP (a file with its tensors anyway is
        # refused by `check_shared_experts`).
        shared = ckpt._key("expert_shared_feed_forward_length")
        if shared:
            out.update(architectures=["GraniteMoeSharedForCausalLM"],
                       shared_intermediate_size=shared)
        out.update({"num_local_experts": ckpt._key("expert_count"),
                    "num_experts_per_tok": ckpt._key("expert_used_count")})
    return out


def gpt_oss_config(ckpt, config: dict) -> dict:
    """gpt-oss's fields as llama.cpp reads a `gpt-oss` file: the
    experts (`expert_count`, `expert_used_count`, of
    `expert_feed_forward_length`), the window (`attention.sliding_window`)
    on the layers llama.cpp fixes (every second one, from layer 0),
    biases on q, k, v and o (always: the file must hold them), and
    the clamped SwiGLU with llama.cpp's constants (limit 7, alpha
    1.702: it reads no key for them)."""
    a = ckpt.architecture
    layers = config["num_hidden_layers"] or 0
    window = ckpt._key("attention.sliding_window")
    clamp = ckpt._key("swiglu_clamp_exp")
    if clamp is not None:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata {a}.swiglu_clamp_exp = {clamp!r} is not supported "
            f"(llama.cpp's gpt-oss clamps at 7 and reads no key)")
    return {"num_local_experts": ckpt._key("expert_count"),
            "num_experts_per_tok": ckpt._key("expert_used_count"),
            "intermediate_size": ckpt._key("expert_feed_forward_length"),
            "sliding_window": window,
            "layer_types": ["sliding_attention" if i % 2 == 0 and window else
                            "full_attention" for i in range(layers)],
            "attention_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702}


def yarn(ckpt) -> dict:
    """A `gpt-oss` file's yarn RoPE as config.json says it: the factor,
    the original context (`rope.scaling.original_context_length`),
    llama.cpp's beta_fast 32 and beta_slow 1 (or the file's
    `rope.scaling.yarn_beta_fast` / `_slow`), and truncate true: ggml
    rounds the correction range to whole dimensions (floor, ceil), as
    transformers does with truncate (gpt-oss's config.json says false:
    the two differ in one or two frequencies' blend)."""
    a = ckpt.architecture
    out = {"rope_type": "yarn", "factor": decimal(ckpt._key("rope.scaling.factor")),
           "beta_fast": decimal(ckpt._key("rope.scaling.yarn_beta_fast", 32.0)),
           "beta_slow": decimal(ckpt._key("rope.scaling.yarn_beta_slow", 1.0)),
           "truncate": True}
    original = ckpt._key("rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = original
    for key in ("rope.scaling.attn_factor", "rope.scaling.yarn_ext_factor",
                "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_log_multiplier"):
        if ckpt._key(key) is not None:
            raise UnsupportedConfigError(
                f"{ckpt.path}: GGUF metadata {a}.{key} = {ckpt._key(key)!r} is not "
                f"supported (yarn as llama.cpp derives it from the factor only)")
    return out


def gemma_config(ckpt, config: dict) -> dict:
    """Gemma 2's and 3's fields as llama.cpp reads them: the window
    (`attention.sliding_window`; none: every layer full), the layer
    pattern llama.cpp fixes (or `attention.sliding_window_pattern`, a
    flag per layer), the sliding layers' RoPE base (`rope.freq_base_swa`,
    else llama.cpp's 10000), the soft-capping keys, and the attention
    scale llama.cpp derives (1 / sqrt(head size), 1 / sqrt(hidden /
    heads) for the 27B models)."""
    a = ckpt.architecture
    pattern, layers_27b = GEMMA_LLAMA_CPP[a]
    layers = config["num_hidden_layers"] or 0
    window = ckpt._key("attention.sliding_window")
    flags = ckpt._key("attention.sliding_window_pattern")
    if isinstance(flags, list):
        types = ["sliding_attention" if flag else "full_attention" for flag in flags]
    else:
        pattern = pattern if flags is None else flags
        types = ["sliding_attention" if window is not None and (i + 1) % pattern else
                 "full_attention" for i in range(layers)]
    out = {"hidden_activation": "gelu_pytorch_tanh", "layer_types": types,
           "sliding_window": window}
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = ckpt._key("attention.key_length") or (hidden // heads if heads else None)
    out["query_pre_attn_scalar"] = hidden // heads if layers == layers_27b and heads else \
        head_dim
    if a == "gemma3":
        out["rope_local_base_freq"] = decimal(ckpt._key("rope.freq_base_swa", 10000.0))
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = ckpt._key(key)
        if value is not None:
            out[key] = decimal(value)
    return out


#: llama.cpp's Cohere architectures (command-r: Command R, Aya; cohere2:
#: Command R7B), the key of their LayerNorms' epsilon, and cohere2's layer
#: pattern as llama.cpp fixes it: every 4th layer full (and without RoPE).
COHERE = {"command-r": "CohereForCausalLM", "cohere2": "Cohere2ForCausalLM"}
NORM_EPS_KEYS = {a: "attention.layer_norm_epsilon" for a in COHERE}
COHERE2_LLAMA_CPP_PATTERN = 4


def cohere_config(ckpt, eps, config: dict) -> dict:
    """Cohere's fields as llama.cpp reads a `command-r` or `cohere2` file:
    the LayerNorms' epsilon (`attention.layer_norm_epsilon`), the logit
    scale (`logit_scale`, which llama.cpp requires), q/k norms where the
    file has `attn_q_norm` (Command R+'s; cohere2's refused by the config); cohere2's
    window (`attention.sliding_window`) on all but every 4th layer, as
    llama.cpp fixes it (a per-layer `attention.sliding_window_pattern`,
    which its cohere2 does not read, is refused)."""
    a = ckpt.architecture
    scale = ckpt._key("logit_scale")
    if scale is None:
        raise UnsupportedConfigError(f"{ckpt.path}: GGUF metadata key '{a}.logit_scale' is "
                                     f"missing (required for {a})")
    out = {"layer_norm_eps": eps, "logit_scale": decimal(scale),
           "use_qk_norm": "blk.0.attn_q_norm.weight" in ckpt._tensors}
    if a == "cohere2":
        pattern = ckpt._key("attention.sliding_window_pattern")
        if pattern is not None:
            raise UnsupportedConfigError(
                f"{ckpt.path}: GGUF metadata {a}.attention.sliding_window_pattern = "
                f"{pattern!r} is not supported (llama.cpp's cohere2 makes every "
                f"{COHERE2_LLAMA_CPP_PATTERN}th layer full and reads no pattern)")
        layers = config["num_hidden_layers"] or 0
        out.update(sliding_window=ckpt._key("attention.sliding_window"),
                   layer_types=["sliding_attention" if (i + 1) % COHERE2_LLAMA_CPP_PATTERN
                                else "full_attention" for i in range(layers)])
    return out


#: llama.cpp's olmo2 with a window (OLMo 3): every 4th layer full.
OLMO3_LLAMA_CPP_PATTERN = 4


def olmo2_config(ckpt, config: dict) -> dict:
    """An `olmo2` file with a window (`attention.sliding_window` > 0) is
    OLMo 3, as llama.cpp's converter writes it (and llama.cpp reads it):
    the window on the layers `attention.sliding_window_pattern` flags, else
    on all but every 4th (llama.cpp's fixed pattern), `rope.freq_base` the
    base of every layer (said per layer type, as Olmo3Config reads it);
    without one, OLMo 2."""
    window = ckpt._key("attention.sliding_window")
    if not window:
        return {}
    layers = config["num_hidden_layers"] or 0
    flags = ckpt._key("attention.sliding_window_pattern")
    if not isinstance(flags, list):
        flags = [(i + 1) % OLMO3_LLAMA_CPP_PATTERN != 0 for i in range(layers)]
    plain = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    return {"architectures": ["Olmo3ForCausalLM"], "sliding_window": window,
            "layer_types": ["sliding_attention" if flag else "full_attention" for flag in flags],
            "rope_parameters": {"full_attention": dict(plain), "sliding_attention": plain}}


#: llama.cpp's `expert_gating_func` values (its LLAMA_EXPERT_GATING_FUNC_TYPE).
_GATING = {1: "softmax", 2: "sigmoid"}


def glm4moe_config(ckpt, config: dict) -> dict:
    """GLM-4.5's fields as llama.cpp's converter writes them: the
    multi-token-prediction layers counted in `block_count`
    (`nextn_predict_layers` of them, after the decoder's: not run, their
    tensors not read), dense layers before `leading_dense_block_count`,
    `expert_count` experts of `expert_feed_forward_length` and
    `expert_shared_count` shared ones of the same width,
    `expert_used_count` per token, renormalised where
    `expert_weights_norm`, times `expert_weights_scale`, in
    `expert_group_count` groups of which `expert_group_used_count` are kept
    (default 1 and 1); `expert_gating_func` must be sigmoid (2); q/k norms
    where the file has `attn_q_norm`."""
    gating = ckpt._key("expert_gating_func")
    if gating != 2:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata glm4moe.expert_gating_func = {gating!r} is not "
            f"supported: GLM-4.5 routes by sigmoid scores (2); ETC reads no other "
            f"({_GATING.get(gating, 'unknown')})")
    nextn = ckpt._key("nextn_predict_layers", 0)
    if isinstance(nextn, bool) or not isinstance(nextn, int) or nextn < 0:
        raise UnsupportedConfigError(
            f"{ckpt.path}: GGUF metadata glm4moe.nextn_predict_layers = {nextn!r} must be a "
            f"non-negative integer (the multi-token-prediction layers in block_count)")
    out = {"num_hidden_layers": config["num_hidden_layers"] - nextn
           if isinstance(config["num_hidden_layers"], int) else None,
           "num_nextn_predict_layers": nextn,
           "n_routed_experts": ckpt._key("expert_count"),
           "num_experts_per_tok": ckpt._key("expert_used_count"),
           "moe_intermediate_size": ckpt._key("expert_feed_forward_length"),
           "n_shared_experts": ckpt._key("expert_shared_count", 0),
           "first_k_dense_replace": ckpt._key("leading_dense_block_count", 0),
           "norm_topk_prob": ckpt._key("expert_weights_norm", False),
           "routed_scaling_factor": decimal(ckpt._key("expert_weights_scale", 1.0)),
           "n_group": ckpt._key("expert_group_count", 1),
           "topk_group": ckpt._key("expert_group_used_count", 1),
           "use_qk_norm": "blk.0.attn_q_norm.weight" in ckpt._tensors}
    return out


def check_shared_experts(ckpt, read: set) -> None:
    """Refuses a file with shared-expert tensors (`blk.<i>.ffn_*_shexp.*`
    of a decoder layer) that the model does not read (`read`: the tensors
    of its plan): llama.cpp creates them only for a shared expert
    (granitemoe's where `expert_shared_feed_forward_length` is above 0)
    and refuses a file with tensors it did not create, so they are
    weights of a model other than the one the metadata describes. The
    error names the key that says the shared experts (deepseek2's and
    glm4moe's `expert_shared_count`)."""
    layers = ckpt.config.num_layers
    # (Past the decoder's layers: GLM-4.5's NextN layers, not run.)
    unread = sorted(name for name in ckpt._tensors if "_shexp." in name and name not in read
                    and not (name.startswith("blk.") and name.split(".")[1].isdigit()
                             and int(name.split(".")[1]) >= layers))
    if not unread:
        return
    # (deepseek2 and glm4moe count their shared experts; the others give a width)
    field = "expert_shared_count" if ckpt.architecture in ("deepseek2", "glm4moe") else \
        "expert_shared_feed_forward_length"
    key, value = f"{ckpt.architecture}.{field}", ckpt._key(field)
    said = "is missing" if value is None else f"= {value!r}"
    shown = ", ".join(unread[:3]) + (f" and {len(unread) - 3} more" if len(unread) > 3 else "")
    raise UnsupportedConfigError(
        f"{ckpt.path}: the file has shared-expert tensors ({shown}) that its model does not "
        f"read: GGUF metadata {key} {said}, so this {ckpt.architecture} model has no shared "
        f"expert (llama.cpp refuses such a file too)")
