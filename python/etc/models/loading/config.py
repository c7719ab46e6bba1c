"""Hugging Face `config.json` of the supported architectures, checked.

`ModelConfig.from_dict` accepts the configs of `ARCHITECTURES` (Llama,
Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Gemma 2, Gemma 3, Phi-3,
SmolLM3, Granite, Granite MoE (with shared experts too), gpt-oss, OLMo 2, OLMo 3,
OLMoE, GLM-4, GLM-4.5, ERNIE 4.5 (dense and MoE), EXAONE 4, Seed-OSS, Hunyuan dense, DeepSeek-V2
and V3, Cohere, Cohere2; and the text
model of Gemma 3's and Mistral 3's multimodal configs, `multimodal`), written by
transformers 4 (flat `rope_theta`, `rope_scaling`) or 5 (`rope_parameters`,
`layer_types`), and raises `UnsupportedConfigError` naming the field for
anything the compiled model would compute differently (biases, sliding
windows where the architecture has none, RoPE variants it does not
implement, ...) and for values that are not what the field means (a string
where a flag or a number belongs, a non-finite or non-positive RoPE base,
...), rather than silently ignoring or misreading them. RoPE parameters are
read by `rope`, sliding windows by `windows`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from . import (config_families as families, families_cohere, families_deepseek as deepseek,
               families_dense as dense, families_ernie as ernie, moe_fields, multimodal, rope,
               windows)
from .fields import UnsupportedConfigError, positive_int, positive_number
from .rope import ROPE_TYPES

__all__ = ["ARCHITECTURES", "ROPE_TYPES", "ModelConfig", "UnsupportedConfigError"]

#: The architectures `etc.models.load` builds.
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
                 "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                 "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                 "SmolLM3ForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM",
                 "GptOssForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeSharedForCausalLM",
                 *families.OLMO, families.OLMOE, families.GLM4, moe_fields.GLM4_MOE,
                 *ernie.ARCHITECTURES, *dense.ARCHITECTURES, *deepseek.ARCHITECTURES,
                 *families_cohere.COHERE_FAMILY)
#: Gemma's generations: the architectures with Gemma's layers (four norms
#: of x (1 + w), a GeGLU MLP, scaled embeddings).
_GEMMA = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 3}
#: IBM Granite 3.x: Llama's layers with four scalar multipliers (`config_families.granite`).
_GRANITE = ("GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")
#: The MoE architectures with a sparse block in every layer, read by
#: `moe_fields.mixtral` (OLMoE's by `moe_fields.olmoe`): their
#: `intermediate_size` is the experts' width.
_EVERY_LAYER_SPARSE = ("MixtralForCausalLM", "GraniteMoeForCausalLM", "GptOssForCausalLM",
                       "GraniteMoeSharedForCausalLM", families.OLMOE)
#: Architectures refused by name, with why (not merely "not supported").
_REFUSED = {
    "GraniteMoeHybridForCausalLM": "Granite 4: hybrid Mamba-2 and attention layers; ETC "
                                   "implements attention layers only",
}
#: The architectures whose transformers class rotates part of each head
#: when `partial_rotary_factor` < 1 (Phi-3's, GLM-4's and GLM-4.5's
#: apply_rotary_pos_emb split q and k at the table's width); the others'
#: rotate_half spans the whole head, and their configs with a factor < 1
#: are refused.
_PARTIAL_ROTARY = ("Phi3ForCausalLM", families.GLM4, moe_fields.GLM4_MOE)


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of one decoder-only model."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: RMSNorm of q and k before RoPE (after it with `qk_norm_after_rope`):
    #: per head (Qwen3, Gemma 3, GLM-4.5's `use_qk_norm`, EXAONE 4, Hunyuan
    #: dense; with `layer_norm`, Command R+'s LayerNorms, a weight per
    #: head), or over the projection (`qk_norm_projection`).
    qk_norm: bool
    #: Biases of the q, k and v projections (Qwen2, Qwen2-MoE, GLM-4,
    #: GLM-4.5, Seed-OSS; o's is `o_bias`).
    qkv_bias: bool = False
    #: q_norm and k_norm over the whole q and k projections (OLMo 2, OLMo 3,
    #: OLMoE: weights of num_heads * head_dim and num_kv_heads * head_dim),
    #: not per head.
    qk_norm_projection: bool = False
    #: The parameters of a scaled RoPE variant ("linear", "llama3", "yarn"
    #: or "longrope": `rope.ROPE_TYPES`; its "rope_type" included, defaults
    #: filled in), or None for plain RoPE.
    rope_scaling: Optional[dict] = None
    #: Mixture-of-Experts (`moe_fields`: Qwen3-MoE, Mixtral, ...): experts,
    #: experts per token, expert width, renormalised top-k weights, and which layers are
    #: sparse (Mixtral: every one; `intermediate_size` is then 0, no layer
    #: has a dense MLP).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    sparse_layers: tuple = field(default_factory=tuple)
    #: A shared expert beside the routed ones in every sparse layer
    #: (Qwen2-MoE, Granite MoE shared; GLM-4.5's, DeepSeek's and ERNIE
    #: 4.5's n shared experts as one n times as wide): a SwiGLU MLP this wide (0: none)
    #: that every token runs, its output added to the experts'; with
    #: `shared_expert_gate` (Qwen2-MoE) scaled per token first by
    #: sigmoid(x . w) of a learnt (H,) vector.
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    #: Routing (`Graph.moe`'s scoring, routed_scale, n_group, topk_group):
    #: softmax or sigmoid scores; with `selection_bias` a learnt (E,) bias
    #: on the scores that choose (GLM-4.5, DeepSeek-V3; ERNIE 4.5's, on
    #: softmax scores).
    moe_scoring: str = "softmax"
    selection_bias: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    #: The least the chosen scores' sum is divided by when renormalised
    #: (ERNIE 4.5's `moe_norm_min`; 0: none).
    moe_norm_min: float = 0.0
    #: How an expert group is scored (`Graph.moe`'s group_score): "top2"
    #: (DeepSeek-V3, GLM-4.5) or "max" (DeepSeek-V2's group_limited_greedy).
    moe_group_score: str = "top2"
    #: Sliding-window attention: the positions a token of a sliding layer
    #: sees (its own included), and which layers slide (the others attend
    #: to the whole sequence).
    sliding_window: Optional[int] = None
    sliding_layers: tuple = field(default_factory=tuple)
    #: The MLP's gate activation: "silu" (SwiGLU) or "gelu_pytorch_tanh"
    #: (GeGLU, Gemma).
    hidden_act: str = "silu"
    #: Gemma's layers: every RMSNorm computes x (norm_offset + w) in float32
    #: (1: Gemma's 1 + w); the attention and MLP outputs are normed too
    #: before their residual adds (`sandwich_norms`: post-attention,
    #: pre- and post-feedforward norms); the embeddings are scaled by
    #: `embedding_scale` (sqrt(hidden_size), rounded to the compute dtype
    #: as transformers rounds it).
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    #: False (OLMo 2): no norm of a layer's input before its attention or
    #: MLP (no `l<i>_attn_norm`, `l<i>_mlp_norm`); `sandwich_norms` then
    #: norms their outputs only.
    input_norms: bool = True
    embedding_scale: Optional[float] = None
    #: Attention scores scaled by query_pre_attn_scalar^-1/2 instead of
    #: head_dim^-1/2 (Gemma), and soft-capped, c tanh(x / c): the
    #: attention scores (`attn_logit_softcapping`) and the final logits.
    query_pre_attn_scalar: Optional[float] = None
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    #: The RoPE of the sliding layers where it differs from the others'
    #: (Gemma 3: `rope_local_base_freq`, `rope_parameters
    #: ['sliding_attention']`): its base and variant.
    local_rope_theta: Optional[float] = None
    local_rope_scaling: Optional[dict] = None
    #: Granite's multipliers (None: none, as 1 but no task): the embeddings
    #: times `embedding_multiplier` (unrounded, unlike Gemma's
    #: `embedding_scale`), the attention scale `attention_multiplier` itself
    #: (instead of 1 / sqrt(head_dim)), each attention and MLP block's
    #: output times `residual_multiplier` before its residual add, the
    #: logits divided by `logits_scaling`.
    embedding_multiplier: Optional[float] = None
    attention_multiplier: Optional[float] = None
    residual_multiplier: Optional[float] = None
    logits_scaling: Optional[float] = None
    #: The dimensions of each head RoPE rotates, the first `rotary_dim` of
    #: Hugging Face's layout (Phi-4-mini's `partial_rotary_factor`), or
    #: None for the whole head. The step graph rotates pairs (i, i +
    #: head_dim / 2): its q and k weights are permuted at load so that
    #: Hugging Face's pairs (i, i + rotary_dim / 2) land there
    #: (`etc.models.loading.partial_rotary`).
    rotary_dim: Optional[int] = None
    #: RoPE pairs (2i, 2i + 1) of the rotated dimensions (GLM-4, ERNIE 4.5,
    #: Cohere: GPT-J's interleaved layout) instead of (i, i + rotated / 2); the q and k
    #: rows are permuted at load to the step graph's pairs too.
    rope_interleaved: bool = False
    #: The layers without RoPE (SmolLM3's NoPE layers, EXAONE 4's and
    #: Cohere2's full layers).
    nope_layers: tuple = field(default_factory=tuple)
    #: The per-head q/k norms after RoPE instead of before (Hunyuan dense).
    qk_norm_after_rope: bool = False
    #: gpt-oss: a bias on the attention's output projection too (Seed-OSS's
    #: `attention_out_bias` as well; `qkv_bias` the others'), one learnt sink logit per query head
    #: (`Graph.attention`'s `sinks`), a bias on the router's logits and on
    #: each expert's projections (`Graph.moe`'s `router_b`, `b1`, `b_up`,
    #: `b2`), and the experts' activation: "silu" (SwiGLU) or "swiglu_oai"
    #: (gpt-oss's clamped SwiGLU, `swiglu_limit` and `swiglu_alpha`).
    o_bias: bool = False
    attention_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    expert_activation: str = "silu"
    swiglu_limit: Optional[float] = None
    swiglu_alpha: Optional[float] = None
    #: DeepSeek-V2/V3's multi-head latent attention (`families_deepseek`),
    #: or None: q and k heads are then `head_dim` (nope + pe) wide, as many
    #: KV heads as heads, their v padded to it (`etc.models.step.mla`).
    mla: Optional[deepseek.MlaShape] = None
    #: Cohere (`families_cohere`): every norm a LayerNorm without bias
    #: (`rms_norm_eps` its epsilon) instead of an RMSNorm; the attention and
    #: the MLP in parallel on the layer's one input norm, x + attn(ln(x)) +
    #: mlp(ln(x)) (no `l<i>_mlp_norm`); the logits times `logit_scale`.
    layer_norm: bool = False
    parallel_block: bool = False
    logit_scale: Optional[float] = None

    @property
    def logits_multiplier(self) -> Optional[float]:
        """What the logits are multiplied by before sampling: Cohere's
        `logit_scale`, 1 / Granite's `logits_scaling`; None for neither."""
        if self.logit_scale is not None:
            return self.logit_scale
        return None if self.logits_scaling is None else 1.0 / self.logits_scaling

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sliding(self, layer: int) -> bool:
        return layer in self.sliding_layers

    def window(self, layer: int) -> Optional[int]:
        """The attention window of `layer`: `sliding_window` for a sliding
        layer, None (the whole sequence) for the others."""
        return self.sliding_window if layer in self.sliding_layers else None

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    @property
    def rope_type(self) -> str:
        """Hugging Face's name of the RoPE variant ("default", "linear",
        "llama3" or "yarn") of the full-attention layers."""
        return self.rope_scaling["rope_type"] if self.rope_scaling else "default"

    def uses_rope(self, layer: int) -> bool:
        """Whether `layer` rotates q and k (not a NoPE layer)."""
        return layer not in self.nope_layers

    @property
    def rotated(self) -> int:
        """The dimensions of each head RoPE rotates (`rotary_dim`, else the
        whole head)."""
        if self.mla is not None:  # the pe part of each head
            return self.mla.rope_dim
        return self.rotary_dim or self.head_dim

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` uses the sliding layers' own RoPE (Gemma 3)."""
        return self.local_rope_theta is not None and layer in self.sliding_layers

    def _rope_of(self, local: bool) -> tuple[float, Optional[dict]]:
        if local:
            return self.local_rope_theta, self.local_rope_scaling
        return self.rope_theta, self.rope_scaling

    @property
    def rope_attention_factor(self) -> float:
        """The factor Hugging Face multiplies cos and sin by (yarn's
        `attention_factor`, 1 for the other variants) in the full-attention
        layers: q . k scales by its square."""
        return rope.attention_factor(self.rope_scaling)

    def attention_scale_of(self, layer: int) -> float:
        """The scale of `layer`'s attention logits: 1 / sqrt(head_dim) (or
        1 / sqrt(query_pre_attn_scalar)), times the square of the RoPE
        attention factor of its layer type (rotated q and k both carry
        it). Not for a NoPE layer; nor with partial rotary, whose rotated
        dimensions alone carry it (the q weights' rotated rows are scaled by
        its square at load: `partial_rotary`); MLA's is its own
        (`MlaShape.softmax_scale`; its pe rows carry the factor: `mla`)."""
        if self.mla is not None:
            return self.mla.softmax_scale
        factor = rope.attention_factor(self._rope_of(self.local_rope(layer))[1]) \
            if self.uses_rope(layer) and self.rotary_dim is None else 1.0
        return factor ** 2 * self._base_attention_scale

    @property
    def attention_scale(self) -> float:
        """`attention_scale_of` a full-attention layer with RoPE."""
        if self.mla is not None:
            return self.mla.softmax_scale
        factor = self.rope_attention_factor if self.rotary_dim is None else 1.0
        return factor ** 2 * self._base_attention_scale

    @property
    def _base_attention_scale(self) -> float:
        """1 / sqrt(head_dim), 1 / sqrt(query_pre_attn_scalar) (Gemma) or
        attention_multiplier (Granite)."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return 1 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    def rope_inv_freq(self, local: bool = False, long: bool = False):
        """The RoPE frequencies (rotated dimensions / 2 float32), as Hugging
        Face computes them for the configured variant; with `local`, those
        of the sliding layers' own RoPE (`local_rope_theta`); LongRoPE's
        long ones with `long`."""
        return rope.inv_freq(self.rotated, *self._rope_of(local), long=long)

    def rope_tables(self, max_seq_len: Optional[int] = None) -> dict:
        """The step graph's RoPE frequency inputs (head_dim / 2 float32
        each, a frequency of 0 for the pairs partial rotary leaves alone):
        `inv_freq`, and `inv_freq_local` for the sliding layers' own RoPE
        (Gemma 3); those that some layer uses. LongRoPE's long frequencies
        for a context `max_seq_len` past `original_max_position_embeddings`
        (`rope.uses_long`), else its short ones."""
        import numpy as np

        def padded(table):
            return np.concatenate([table, np.zeros(self.head_dim // 2 - len(table),
                                                   np.float32)]).astype(np.float32)

        used = {self.local_rope(i) for i in range(self.num_layers) if self.uses_rope(i)}
        tables = {}
        if False in used:
            long = max_seq_len is not None and rope.uses_long(self.rope_scaling, max_seq_len)
            tables["inv_freq"] = padded(self.rope_inv_freq(long=long))
        if True in used:
            tables["inv_freq_local"] = padded(self.rope_inv_freq(local=True))
        return tables

    @classmethod
    def from_dict(cls, config: dict, where: str = "config.json") -> "ModelConfig":
        """Checks and reads a Hugging Face config (the parsed config.json)."""
        if not isinstance(config, dict):
            raise UnsupportedConfigError(f"{where}: expected a JSON object, got "
                                         f"{type(config).__name__}")
        architectures = config.get("architectures") or []
        if not isinstance(architectures, list) or len(architectures) != 1:
            raise UnsupportedConfigError(
                f"{where}: 'architectures' must name exactly one architecture, got "
                f"{architectures!r}; supported: {_supported()}")
        architecture = architectures[0]
        if architecture in multimodal.WRAPPERS:
            # The text model alone, as the causal LM it is.
            return cls.from_dict(*multimodal.text_config(config, where))
        if architecture in _REFUSED:
            raise UnsupportedConfigError(f"{where}: architecture {architecture!r} is not "
                                         f"supported ({_REFUSED[architecture]}); supported: "
                                         f"{_supported()}")
        if architecture not in ARCHITECTURES:
            raise UnsupportedConfigError(f"{where}: architecture {architecture!r} is not "
                                         f"supported; supported: {_supported()}")

        def need(name: str, kind=int):
            if name not in config or config[name] is None:
                raise UnsupportedConfigError(f"{where}: field {name!r} is missing (required "
                                             f"for {architecture})")
            if kind is int:
                return positive_int(where, name, config[name])
            return positive_number(where, name, config[name])

        def refuse(name: str, allowed, why: str):
            value = config.get(name)
            # `1 == True` in Python: compare types too, so that a flag is not
            # taken for a count.
            if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} is not "
                                             f"supported ({why})")

        def flag(name: str, default: bool) -> bool:
            value = config.get(name)
            if value is None:
                return default
            if not isinstance(value, bool):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be "
                                             f"true or false (a JSON boolean)")
            return value

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        layers = need("num_hidden_layers")
        kv_heads = config.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else kv_heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or \
                heads % kv_heads:
            raise UnsupportedConfigError(f"{where}: field 'num_key_value_heads' = {kv_heads!r} "
                                         f"must divide num_attention_heads = {heads}")
        head_dim = config.get("head_dim")
        if head_dim is None:
            # Gemma's default is 256, whatever the hidden size.
            head_dim = 256 if architecture in _GEMMA else \
                {**families.DEFAULT_HEAD_DIM, **ernie.DEFAULT_HEAD_DIM,
                 **dense.DEFAULT_HEAD_DIM}.get(architecture, hidden // heads)
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or \
                head_dim % 2:
            raise UnsupportedConfigError(f"{where}: field 'head_dim' = {head_dim!r} must be an "
                                         f"even positive integer")
        if architecture in deepseek.ARCHITECTURES:  # q and k: nope + pe
            head_dim = deepseek.head_dim(config, where, architecture)
        if architecture == "GptOssForCausalLM":
            # transformers' gpt-oss never reads hidden_act (its experts'
            # clamped SwiGLU is fixed): any name computes the same.
            if not isinstance(config.get("hidden_act", "silu"), str):
                raise UnsupportedConfigError(f"{where}: field 'hidden_act' = "
                                             f"{config['hidden_act']!r} must be a string")
        elif architecture not in _GEMMA:  # Gemma reads hidden_activation (below)
            refuse("hidden_act", ("silu", None), "only SiLU-gated MLPs are implemented")
        if architecture not in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM",
                                families.GLM4, moe_fields.GLM4_MOE, dense.SEED_OSS):
            # Qwen2's q/k/v projections always have biases (Qwen2-MoE's:
            # `qkv_bias`) and its o projection never has one: transformers
            # ignores the field. gpt-oss, GLM-4, GLM-4.5 and Seed-OSS read it
            # (`_gpt_oss`, `config_families`, `moe_fields`, `families_dense`).
            refuse("attention_bias", (False, None), "q/k/v/o projections have no bias")
        refuse("mlp_bias", (False, None), "MLP projections have no bias")
        if architecture not in dense.DROPOUT_FIELDS:  # (read by `dense.layers`)
            refuse("attention_dropout", (0, 0.0, None), "inference uses no dropout")
        if architecture == "SmolLM3ForCausalLM":
            # SmolLM3's config has one (2); its transformers class never
            # reads it (no sliced matmuls), and so neither does ETC.
            if config.get("pretraining_tp") is not None:
                positive_int(where, "pretraining_tp", config["pretraining_tp"])
        else:
            refuse("pretraining_tp", (1, None), "tensor-parallel slicing of the MLP")
        window, sliding = windows.sliding_layers(config, where, architecture, layers)
        max_positions = need("max_position_embeddings")
        # Gemma's or gpt-oss's own fields (with their RoPE).
        family = _gemma(config, where, architecture, hidden, max_positions) \
            if architecture in _GEMMA else {}
        if architecture == "GptOssForCausalLM":
            family = _gpt_oss(config, where, max_positions, flag)
        family.update(families.family_layers(config, where, architecture, flag))
        family.update(dense.layers(config, where, architecture, flag, sliding, head_dim,
                                   lambda plain: _rope(plain, where, max_positions)))
        family.update(families_cohere.fields(config, where, architecture, sliding))
        if "rope_theta" in family:
            rope_theta, scaling = family.pop("rope_theta"), family.pop("rope_scaling")
        else:
            # transformers' default RoPE base: 1e6 for Mixtral, 2e6 for
            # SmolLM3, 5e5 for OLMo 3, 1e4 for the others.
            rope_theta, scaling = _rope(
                _phi3_rope_type(config) if architecture == "Phi3ForCausalLM" else config,
                where, max_positions, default_theta=_DEFAULT_THETA.get(architecture, 10_000.0))
            if architecture == "Olmo3ForCausalLM":
                family.update(families.olmo3_rope(config, where, (rope_theta, scaling),
                                                  lambda **kw: _rope(config, where, max_positions,
                                                                     **kw)))
        rotary = _rotary_dim(config, where, architecture, head_dim)
        if scaling and scaling["rope_type"] == "longrope" and \
                len(scaling["short_factor"]) != rotary // 2:
            raise UnsupportedConfigError(
                f"{where}: LongRoPE has {len(scaling['short_factor'])} short_factor and "
                f"long_factor values; {rotary} rotated dimensions per head need {rotary // 2}")
        moe = {}
        if architecture in moe_fields.QWEN_MOE:
            moe = moe_fields.qwen_moe(config, where, architecture, layers, need, flag)
        elif architecture == moe_fields.GLM4_MOE:
            moe = moe_fields.glm4_moe(config, where, layers, need, flag)
        elif architecture in deepseek.ARCHITECTURES:  # (its `mla` too)
            moe = deepseek.deepseek(config, where, architecture, layers, heads, scaling, need,
                                    flag)
        elif architecture == families.OLMOE:
            moe = moe_fields.olmoe(config, where, layers, need, flag)
        elif architecture in ernie.ARCHITECTURES:  # (its RoPE pairs' field too)
            moe = ernie.fields(config, where, architecture, layers, need, flag)
        elif architecture in _EVERY_LAYER_SPARSE:
            moe = moe_fields.mixtral(config, where, layers, need, flag, architecture)
            if architecture == "GraniteMoeSharedForCausalLM":
                moe.update(moe_fields.granite_shared(config, where))
        granite = families.granite(config, where) if architecture in _GRANITE else {}
        # Qwen2's q/k/v biases always; Qwen2-MoE's where `qkv_bias` says.
        qkv_bias = moe.pop("qkv_bias", architecture == "Qwen2ForCausalLM")
        dense_layers = len(moe.get("sparse_layers", ())) < layers
        if architecture in _EVERY_LAYER_SPARSE:
            intermediate = 0  # every layer sparse: the field is the experts' width
        elif dense_layers:
            intermediate = need("intermediate_size")
        else:
            intermediate = config.get("intermediate_size")
            intermediate = 0 if intermediate is None else \
                positive_int(where, "intermediate_size", intermediate)
        return cls(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            # (Cohere: its LayerNorms' layer_norm_eps)
            rms_norm_eps=family.pop("norm_eps") if "norm_eps" in family else
            need("rms_norm_eps", float),
            rope_theta=rope_theta,
            max_position_embeddings=need("max_position_embeddings"),
            # transformers' default: tied for Gemma and SmolLM3, untied for
            # the others.
            tie_word_embeddings=flag("tie_word_embeddings", architecture in _GEMMA or
                                     architecture == "SmolLM3ForCausalLM" or
                                     architecture in ernie.ARCHITECTURES or
                                     architecture in families_cohere.COHERE_FAMILY),
            # (both pops run: neither flag may reach **moe / **family)
            qk_norm=any((architecture.startswith("Qwen3"), architecture == "Gemma3ForCausalLM",
                         family.pop("qk_norm", False), moe.pop("qk_norm", False))),
            qkv_bias=qkv_bias or family.pop("attention_bias", False),
            rope_scaling=scaling,
            sliding_window=window,
            sliding_layers=sliding,
            rotary_dim=rotary if rotary < head_dim else None,
            nope_layers=families.nope_layers(config, where, layers)
            if architecture == "SmolLM3ForCausalLM" else family.pop("nope_layers", ()),
            **moe,
            **family,
            **granite,
        )


def _rope(config: dict, where: str, max_positions: int, *,
          layer_type: str = "full_attention", flat: str = "rope_theta",
          default_theta: float = 10000.0) -> tuple[float, Optional[dict]]:
    """The RoPE base and the parameters of a scaled variant (or None) of
    the layers of `layer_type`, read as transformers reads them:
    `rope_scaling` (transformers 4; full-attention layers only) or else
    `rope_parameters` (transformers 5, possibly nested by layer type), with
    the flat field `flat` (else `default_theta`) as the default base."""
    chosen, params = None, None
    names = ("rope_scaling", "rope_parameters") if layer_type == "full_attention" else \
        ("rope_parameters",)
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be an "
                                         f"object of RoPE parameters")
        if name == "rope_parameters" and isinstance(value.get(layer_type), dict):
            # Nested by layer type.
            name, value = f"rope_parameters[{layer_type!r}]", value[layer_type]
        elif name == "rope_parameters" and layer_type != "full_attention":
            continue  # the sliding layers' own RoPE comes nested or from `flat`
        if params is None and value:
            chosen, params = name, dict(value)
    params = params or {}
    chosen = chosen or "rope_parameters"
    theta = config.get(flat)
    if theta is not None:
        theta = positive_number(where, flat, theta)
    nested = params.get("rope_theta")
    if nested is not None and theta is not None and \
            positive_number(where, f"{chosen}.rope_theta", nested) != theta:
        raise UnsupportedConfigError(
            f"{where}: field {flat!r} = {theta!r} contradicts {chosen}.rope_theta = "
            f"{nested!r}; keep one")
    original = config.get("original_max_position_embeddings")
    if config.get("architectures") == ["Phi3ForCausalLM"] and original is None:
        original = 4096  # Phi3Config's default, which transformers prefers
    if original is not None:
        original = positive_int(where, "original_max_position_embeddings", original)
    return rope.read(params, chosen, where, default_theta if theta is None else theta,
                     max_positions, original)


def _gemma(config: dict, where: str, architecture: str, hidden: int,
           max_positions: int) -> dict:
    """The fields of Gemma's layers (`ModelConfig`'s Gemma fields), read as
    transformers reads Gemma 2's and Gemma 3's configs; Gemma 3's RoPE per
    layer type too (`rope_theta`, `rope_scaling`, `local_rope_theta`,
    `local_rope_scaling`)."""
    generation = _GEMMA[architecture]
    act = config.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise UnsupportedConfigError(f"{where}: field 'hidden_activation' = {act!r} is not "
                                     f"supported (only 'gelu_pytorch_tanh', the tanh "
                                     f"approximation, is implemented)")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedConfigError(f"{where}: field 'use_bidirectional_attention' = "
                                     f"{config['use_bidirectional_attention']!r} is not "
                                     f"supported (attention is causal)")
    caps = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0} \
        if generation == 2 else {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    for name, default in caps.items():
        value = config.get(name, default)
        caps[name] = None if value is None else positive_number(where, name, value)
    if generation == 3:
        # transformers' Gemma 3 attention never applies the field.
        caps["attn_logit_softcapping"] = None
    scalar = config.get("query_pre_attn_scalar", 256)
    out = dict(hidden_act="gelu_pytorch_tanh", norm_offset=1.0, sandwich_norms=True,
               embedding_scale=math.sqrt(hidden),
               query_pre_attn_scalar=positive_number(where, "query_pre_attn_scalar", scalar),
               **caps)
    if generation == 3:
        out["rope_theta"], out["rope_scaling"] = _rope(config, where, max_positions,
                                                       default_theta=1_000_000.0)
        out["local_rope_theta"], out["local_rope_scaling"] = _rope(
            config, where, max_positions, layer_type="sliding_attention",
            flat="rope_local_base_freq", default_theta=10_000.0)
    return out


#: transformers' default RoPE base where it is not 1e4.
_DEFAULT_THETA = {"MixtralForCausalLM": 1_000_000.0, "SmolLM3ForCausalLM": 2_000_000.0,
                  "Olmo3ForCausalLM": families.OLMO3_THETA,
                  **dict.fromkeys(ernie.ARCHITECTURES, ernie.DEFAULT_THETA),
                  **families_cohere.DEFAULT_THETA}

#: GptOssConfig's RoPE when config.json gives none: yarn, factor 32 over
#: 4096 positions, base 150000.
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}


def _gpt_oss(config: dict, where: str, max_positions: int, flag) -> dict:
    """gpt-oss's own fields (`ModelConfig`'s gpt-oss fields, its RoPE
    `rope_theta` / `rope_scaling`), as transformers' GptOssConfig and
    modelling read them: `attention_bias` (default true) puts biases on
    q, k, v and o; every attention has sinks, every layer a router and
    experts with biases; `swiglu_limit` (7.0) and `swiglu_alpha` (1.702)
    shape the experts' clamped SwiGLU; the RoPE is yarn (`_GPT_OSS_ROPE`)
    when config.json gives none. OpenAI's config.json also carries
    `experts_per_token` (checked equal to num_experts_per_tok) and
    `initial_context_length` (yarn's original length, read from
    rope_scaling)."""
    bias = flag("attention_bias", True)
    alias = config.get("experts_per_token")
    if alias is not None and alias != config.get("num_experts_per_tok"):
        raise UnsupportedConfigError(f"{where}: field 'experts_per_token' = {alias!r} "
                                     f"contradicts num_experts_per_tok = "
                                     f"{config.get('num_experts_per_tok')!r}; keep one")
    limits = {}
    for name, default in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)):
        value = config.get(name)
        limits[name] = default if value is None else positive_number(where, name, value)
    if config.get("rope_scaling") is None and config.get("rope_parameters") is None:
        config = dict(config, rope_parameters=dict(_GPT_OSS_ROPE))
    theta, scaling = _rope(config, where, max_positions, default_theta=150_000.0)
    return dict(attention_bias=bias, o_bias=bias, attention_sinks=True, router_bias=True,
                expert_bias=True, expert_activation="swiglu_oai", rope_theta=theta,
                rope_scaling=scaling, **limits)


def _phi3_rope_type(config: dict) -> dict:
    """`config` with Phi-3's RoPE types as transformers' Phi3Config reads
    them: "su" and "yarn" are LongRoPE."""
    out = dict(config)
    for name in ("rope_scaling", "rope_parameters"):
        value = config.get(name)
        if isinstance(value, dict):
            kind = value.get("rope_type", value.get("type"))
            if kind in ("su", "yarn"):
                value = {k: v for k, v in value.items() if k != "type"}
                out[name] = {**value, "rope_type": "longrope"}
    return out


def _rotary_dim(config: dict, where: str, architecture: str, head_dim: int) -> int:
    """The dimensions of each head RoPE rotates: `partial_rotary_factor`
    (in `rope_parameters` or `rope_scaling` as transformers 5 writes it,
    else top-level) of an architecture whose transformers class honours
    it (`_PARTIAL_ROTARY`); a factor < 1 elsewhere is refused."""
    given = [("partial_rotary_factor", config.get("partial_rotary_factor"))]
    for nest in ("rope_scaling", "rope_parameters"):
        value = config.get(nest)
        if isinstance(value, dict):
            given.append((f"{nest}.partial_rotary_factor", value.get("partial_rotary_factor")))
            # transformers 5's RoPE per layer type (Gemma 3).
            given += [(f"{nest}[{kind!r}].partial_rotary_factor",
                       params.get("partial_rotary_factor"))
                      for kind, params in value.items() if isinstance(params, dict)]
    given = [(name, partial) for name, partial in given if partial is not None]
    dims = {name: rope.rotary_dim(head_dim, partial, where, name) for name, partial in given}
    for name, partial in given:
        if dims[name] < head_dim and architecture not in _PARTIAL_ROTARY:
            raise UnsupportedConfigError(
                f"{where}: field {name!r} = {partial!r} is not supported for {architecture}: "
                f"its transformers class rotates whole heads (partial rotary is implemented "
                f"for {', '.join(_PARTIAL_ROTARY)})")
    # A nested factor wins (transformers: setdefault from the flat one).
    if not given:  # (GLM-4's and GLM-4.5's configs' default factor)
        return rope.rotary_dim(head_dim, families.DEFAULT_PARTIAL_ROTARY.get(architecture, 1.0),
                               where)
    return dims[given[-1][0]]


def _supported() -> str:
    """The architectures config.json may name: the causal LMs, and the
    multimodal models whose text model ETC runs."""
    return ", ".join((*ARCHITECTURES, *multimodal.WRAPPERS))
