"""The config fields of Cohere's models, read as transformers 5 reads them:
`CohereForCausalLM` (Command R, Command R+, Aya 23, Aya Expanse) and
`Cohere2ForCausalLM` (Command R7B, Command A).

Their layers differ from Llama's in four ways, each a `ModelConfig` field:
every norm is a LayerNorm without bias (`CohereLayerNorm`: mean-centred,
float32 statistics; `layer_norm`, its epsilon `layer_norm_eps` in
`rms_norm_eps`); one norm per layer feeds the attention and the MLP in
parallel, out = x + attn(ln(x)) + mlp(ln(x)) (`parallel_block`: no
`post_attention_layernorm`); RoPE pairs (2i, 2i + 1) (the
`repeat_interleave` of its cos and sin and its `rotate_half` of x[::2],
x[1::2]: `rope_interleaved`, the q and k rows permuted at load by
`partial_rotary`); the logits multiplied by `logit_scale`; with
`use_qk_norm` (Command R+), a LayerNorm of each head of q and k before
RoPE with a weight for every head (`qk_norm`: `head_layernorm`). Cohere2 adds
sliding layers (`layer_types`, or every `sliding_window_pattern`-th layer
full, 4 by default) whose RoPE is the only one: its full-attention layers
have none (`nope_layers`).
"""

from __future__ import annotations

from .fields import UnsupportedConfigError, head_dim_from_heads, positive_number

__all__ = ["COHERE", "COHERE2", "COHERE_FAMILY", "DEFAULT_THETA", "fields"]

COHERE = "CohereForCausalLM"
COHERE2 = "Cohere2ForCausalLM"
COHERE_FAMILY = (COHERE, COHERE2)
#: transformers' RoPE base when config.json gives none (CohereConfig's
#: `default_theta`; Cohere2Config keeps PreTrainedConfig's 1e4).
DEFAULT_THETA = {COHERE: 500_000.0}
#: Fields of Cohere's own config.json files (Command R7B's) that
#: transformers never reads, with the values that say what it computes
#: anyway; any other value is refused, naming the field (llama.cpp's
#: converter honours `rotary_pct`, for one).
_FIXED = {"rotary_pct": ((1, 1.0), "transformers rotates whole heads"),
          "position_embedding_type": (("rope_gptj",), "RoPE in interleaved (GPT-J) pairs"),
          "order_of_interleaved_layers": (("local_attn_first",),
                                          "the sliding layers come before each full one"),
          "use_gated_activation": ((True,), "the MLP is gated (SwiGLU)")}


def fields(config: dict, where: str, architecture: str, sliding: tuple) -> dict:
    """The `ModelConfig` fields of a Cohere config (`layer_norm`,
    `parallel_block`, `rope_interleaved`, `logit_scale`, the norms'
    epsilon as `norm_eps`, `qk_norm` from `use_qk_norm`, Cohere2's
    `nope_layers`: its full layers, those not in `sliding`); {} for the
    other architectures. Refused by name: a null or non-positive
    `logit_scale` (transformers would multiply the logits by None), a
    `use_qk_norm` that is not a JSON boolean, or true for Cohere2 (whose
    class has no q/k norms), and for Cohere2 a `head_dim` other than
    hidden_size / num_attention_heads (Cohere2Config overwrites it)."""
    if architecture not in COHERE_FAMILY:
        return {}
    for name, (allowed, what) in _FIXED.items():
        value = config.get(name)
        if value is not None and not any(value == a and type(value) is type(a)
                                         for a in allowed):
            raise UnsupportedConfigError(f"{where}: field {name!r} = {value!r} is not supported "
                                         f"({what}: {', '.join(map(repr, allowed))})")
    use_qk_norm = config.get("use_qk_norm")
    if use_qk_norm not in (None, False, True):
        raise UnsupportedConfigError(f"{where}: field 'use_qk_norm' = {use_qk_norm!r} must be "
                                     f"true or false (a JSON boolean)")
    if use_qk_norm and architecture == COHERE2:
        raise UnsupportedConfigError(
            f"{where}: field 'use_qk_norm' = True is not supported (Cohere2ForCausalLM has no "
            f"q/k norms: transformers ignores the field, and a checkpoint that has them "
            f"would be misread)")
    if "logit_scale" in config and config["logit_scale"] is None:
        raise UnsupportedConfigError(f"{where}: field 'logit_scale' = None is not supported "
                                     f"(transformers multiplies the logits by it)")
    scale = positive_number(where, "logit_scale", config.get("logit_scale", 0.0625))
    eps = config.get("layer_norm_eps")
    eps = 1e-5 if eps is None else positive_number(where, "layer_norm_eps", eps)
    out = dict(layer_norm=True, parallel_block=True, rope_interleaved=True, norm_eps=eps,
               logit_scale=None if scale == 1.0 else scale, qk_norm=bool(use_qk_norm))
    if architecture == COHERE2:
        head_dim_from_heads(config, where, COHERE2, "Cohere2Config sets it to hidden_size / "
                            "num_attention_heads = {}")
        layers = config.get("num_hidden_layers")
        out["nope_layers"] = tuple(i for i in range(layers) if i not in sliding)
    return out
