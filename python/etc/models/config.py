"""Hugging Face `config.json` of the supported architectures, checked.

`ModelConfig.from_dict` accepts `LlamaForCausalLM`, `Qwen3ForCausalLM` and
`Qwen3MoeForCausalLM` configs and raises `UnsupportedConfigError` naming the
field for anything the compiled model would compute differently (biases,
sliding windows, other RoPE scalings, ...), rather than silently ignoring it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["ARCHITECTURES", "ModelConfig", "UnsupportedConfigError"]

#: The architectures `etc.models.load` builds.
ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


class UnsupportedConfigError(ValueError):
    """A config.json that names an architecture or sets a field ETC's models
    do not implement."""


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
    #: Per-head RMSNorm of q and k before RoPE (Qwen3).
    qk_norm: bool
    #: `rope_scaling` (Llama 3's "llama3" type), or None.
    rope_scaling: Optional[dict] = None
    #: Mixture-of-Experts (Qwen3-MoE): experts, experts per token, expert
    #: width, renormalised top-k weights, and which layers are sparse.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    sparse_layers: tuple = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    @classmethod
    def from_dict(cls, config: dict, where: str = "config.json") -> "ModelConfig":
        """Checks and reads a Hugging Face config (the parsed config.json)."""
        architectures = config.get("architectures") or []
        if not isinstance(architectures, list) or len(architectures) != 1:
            raise UnsupportedConfigError(
                f"{where}: 'architectures' must name exactly one architecture, got "
                f"{architectures!r}; supported: {', '.join(ARCHITECTURES)}")
        architecture = architectures[0]
        if architecture not in ARCHITECTURES:
            raise UnsupportedConfigError(f"{where}: architecture {architecture!r} is not "
                                         f"supported; supported: {', '.join(ARCHITECTURES)}")

        def need(name: str, kind=int):
            if name not in config or config[name] is None:
                raise UnsupportedConfigError(f"{where}: field {name!r} is missing (required "
                                             f"for {architecture})")
            value = config[name]
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or
                                value < 1):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a "
                                             f"positive integer")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} must be a "
                                             f"positive number")
            return kind(value)

        def refuse(name: str, allowed, why: str):
            value = config.get(name)
            if value not in allowed:
                raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} is not "
                                             f"supported ({why})")

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        kv_heads = config.get("num_key_value_heads") or heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or \
                heads % kv_heads:
            raise UnsupportedConfigError(f"{where}: field 'num_key_value_heads' = {kv_heads!r} "
                                         f"must divide num_attention_heads = {heads}")
        head_dim = config.get("head_dim") or hidden // heads
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or \
                head_dim % 2:
            raise UnsupportedConfigError(f"{where}: field 'head_dim' = {head_dim!r} must be an "
                                         f"even positive integer")
        refuse("hidden_act", ("silu", None), "only SiLU-gated MLPs are implemented")
        refuse("attention_bias", (False, None), "q/k/v/o projections have no bias")
        refuse("mlp_bias", (False, None), "MLP projections have no bias")
        refuse("use_sliding_window", (False, None), "attention is full, not windowed")
        refuse("attention_dropout", (0, 0.0, None), "inference uses no dropout")
        refuse("pretraining_tp", (1, None), "tensor-parallel slicing of the MLP")
        scaling = config.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("default", "llama3"):
                raise UnsupportedConfigError(
                    f"{where}: field 'rope_scaling' has type {kind!r}; supported: 'default' "
                    f"and 'llama3'")
            if kind == "default":
                scaling = None
            else:
                for key in ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"):
                    if key not in scaling:
                        raise UnsupportedConfigError(f"{where}: field 'rope_scaling' of type "
                                                     f"'llama3' lacks {key!r}")
        moe = {}
        if architecture == "Qwen3MoeForCausalLM":
            layers = need("num_hidden_layers")
            mlp_only = config.get("mlp_only_layers") or []
            step = config.get("decoder_sparse_step", 1) or 1
            experts = need("num_experts")
            moe = {
                "num_experts": experts,
                "num_experts_per_tok": need("num_experts_per_tok"),
                "moe_intermediate_size": need("moe_intermediate_size"),
                "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
                # Hugging Face's rule for which layers are sparse.
                "sparse_layers": tuple(i for i in range(layers) if i not in mlp_only and
                                       (i + 1) % step == 0),
            }
            if moe["num_experts_per_tok"] > experts:
                raise UnsupportedConfigError(
                    f"{where}: field 'num_experts_per_tok' = {moe['num_experts_per_tok']} "
                    f"exceeds num_experts = {experts}")
            if config.get("shared_expert_intermediate_size"):
                raise UnsupportedConfigError(f"{where}: field 'shared_expert_intermediate_size'"
                                             f" is not supported (no shared experts)")
        dense_layers = not moe or len(moe["sparse_layers"]) < need("num_hidden_layers")
        return cls(
            architecture=architecture,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            num_layers=need("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=need("intermediate_size") if dense_layers
            else int(config.get("intermediate_size") or 0),
            rms_norm_eps=need("rms_norm_eps", float),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            max_position_embeddings=need("max_position_embeddings"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=architecture.startswith("Qwen3"),
            rope_scaling=scaling,
            **moe,
        )

    def rope_inv_freq(self):
        """The RoPE frequencies (head_dim / 2 float32), as Hugging Face
        computes them, with Llama 3's scaling when configured."""
        import numpy as np

        from ..reference_llm import rope_inv_freq

        inv_freq = rope_inv_freq(self.head_dim, self.rope_theta)
        if self.rope_scaling is None:
            return inv_freq
        s = self.rope_scaling
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_context = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
