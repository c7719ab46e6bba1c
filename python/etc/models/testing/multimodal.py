"""The multimodal checkpoints a tiny causal LM ships inside for the tests
(Gemma 3's and Mistral 3's text models): their config.json
(`as_multimodal`), vision tensors and the language model's tensor names by
the transformers that wrote them (`multimodal_tensors`); `checkpoints`'
`write_checkpoint(multimodal=...)` writes them."""

from __future__ import annotations

import numpy as np

__all__ = ["MULTIMODAL", "WRITERS", "as_multimodal", "multimodal_tensors", "multimodal_name"]

#: The multimodal architecture each causal LM ships inside (Gemma 3 from
#: 4B up, Mistral Small 3.1/3.2): its config.json's `model_type`, a tiny
#: vision config, the top-level fields transformers writes, and a few
#: vision tower and projector tensors (names as the published checkpoints
#: have them, shapes of the tiny vision config and hidden size 32) that a
#: text-only load must never read.
MULTIMODAL = {
    "Gemma3ForCausalLM": dict(
        architecture="Gemma3ForConditionalGeneration", model_type="gemma3",
        vision_config={"model_type": "siglip_vision_model", "hidden_size": 16,
                       "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        fields={"mm_tokens_per_image": 4, "boi_token_index": 93, "eoi_token_index": 94,
                "image_token_index": 95, "initializer_range": 0.02},
        vision_tensors={
            "vision_tower.vision_model.embeddings.patch_embedding.weight": (16, 3, 14, 14),
            "vision_tower.vision_model.post_layernorm.weight": (16,),
            "multi_modal_projector.mm_input_projection_weight": (16, 32)}),
    "MistralForCausalLM": dict(
        architecture="Mistral3ForConditionalGeneration", model_type="mistral3",
        vision_config={"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8,
                       "image_size": 28, "patch_size": 14},
        fields={"image_token_index": 10, "projector_hidden_act": "gelu",
                "multimodal_projector_bias": False, "spatial_merge_size": 2,
                "vision_feature_layer": -1},
        vision_tensors={"vision_tower.patch_conv.weight": (16, 3, 14, 14),
                        "vision_tower.ln_pre.weight": (16,),
                        "multi_modal_projector.linear_1.weight": (32, 16),
                        "multi_modal_projector.norm.weight": (16,)}),
}

#: Where a multimodal checkpoint's language model's tensors are, by the
#: transformers that wrote it: (prefix of the `model.*` tensors, LM head).
WRITERS = {"transformers4": ("language_model.model.", "language_model.lm_head.weight"),
                     "transformers4.52": ("model.language_model.", "lm_head.weight")}


def as_multimodal(config: dict) -> dict:
    """Causal LM config.json `config` (an architecture of `MULTIMODAL`) as
    the config.json of the multimodal model it ships inside: the text
    model's fields in `text_config` (its `model_type` included), the
    architecture, dtype, version and quantization at the top level (where
    transformers reads them), with the tiny vision
    config and the wrapper's own fields."""
    wrap = MULTIMODAL[config["architectures"][0]]
    top_level = ("architectures", "torch_dtype", "dtype", "transformers_version",
                 "quantization_config")
    text = {k: v for k, v in config.items() if k not in top_level}
    return {"architectures": [wrap["architecture"]], "model_type": wrap["model_type"],
            **{k: config[k] for k in top_level[1:] if k in config},
            **wrap["fields"], "text_config": text, "vision_config": dict(wrap["vision_config"])}


def multimodal_tensors(config: dict, tensors: dict, written_by: str, seed: int = 0) -> dict:
    """A causal LM's `tensors` as the multimodal checkpoint of `config`
    (the causal LM's config.json) holds them: the vision tower's and the
    projector's random tensors (`MULTIMODAL`) first, then the language
    model's under the names `written_by` ("transformers4": under
    `language_model.`, as transformers 4 before 4.52 and 5 write them;
    "transformers4.52": under `model.language_model.`, the head
    `lm_head.weight`, as 4.52 to 4.57 did)."""
    if written_by not in WRITERS:
        raise ValueError(f"multimodal_tensors: written_by={written_by!r} is not one of "
                         f"{', '.join(WRITERS)}")
    rng = np.random.default_rng(seed + 1000)
    out = {name: (0.1 * rng.standard_normal(shape)).astype(np.float32)
           for name, shape in MULTIMODAL[config["architectures"][0]]["vision_tensors"].items()}
    out.update({multimodal_name(name, written_by): array for name, array in tensors.items()})
    return out


def multimodal_name(name: str, written_by: str) -> str:
    """A causal LM's tensor `name` in a multimodal checkpoint `written_by`."""
    prefix, head = WRITERS[written_by]
    return head if name == "lm_head.weight" else prefix + name.removeprefix("model.")
