"""The tiny configs of Cohere's models (`tiny_config("CohereForCausalLM")`,
`tiny_config("Cohere2ForCausalLM")`): their config.json fields as Command
R's and Command R7B's have them, at the tiny shape of `checkpoints`."""

from __future__ import annotations

__all__ = ["COHERE_FAMILY", "cohere_fields"]

COHERE_FAMILY = ("CohereForCausalLM", "Cohere2ForCausalLM")
#: Hugging Face's `model_type` of each.
MODEL_TYPES = {"CohereForCausalLM": "cohere", "Cohere2ForCausalLM": "cohere2"}


def cohere_fields(config: dict, architecture: str) -> None:
    """Turns `config` (tiny_config's common fields) into a Cohere one, in
    place: LayerNorm's `layer_norm_eps` for `rms_norm_eps`, tied embeddings,
    `logit_scale` 0.25 (Command R7B's: logits a quarter of the head's
    products, so that a model that drops it, or divides by it, is far
    off), no q/k norms; Cohere2 with layer 0 sliding (a window of 5, RoPE)
    and layer 1 full (no RoPE), as its every-4th-layer pattern has them,
    and no `head_dim` (Cohere2Config's is hidden / heads: 8 here)."""
    del config["rms_norm_eps"]
    config.update({"layer_norm_eps": 1e-5, "logit_scale": 0.25, "tie_word_embeddings": True,
                   "attention_dropout": 0.0, "pad_token_id": 0, "bos_token_id": 5,
                   "eos_token_id": 6})
    if architecture == "CohereForCausalLM":
        # (RoPE base 1e4, not Command R's 8e6: over the tests' 15 positions
        # every pair then turns, so that a wrong pairing shows)
        config["use_qk_norm"] = False
    else:
        del config["head_dim"]
        config.update({"sliding_window": 5, "rope_theta": 50000.0,
                       "layer_types": ["sliding_attention", "full_attention"]})
