"""A Hugging Face checkpoint directory: config.json and the weights of its
*.safetensors files, under the usual tensor names, checked and arranged the
way the step graph takes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .config import ModelConfig, UnsupportedConfigError
from .safetensors import SafetensorsError, SafetensorsFile

__all__ = ["Checkpoint", "MissingTensorError", "CheckpointError", "STORAGE"]

#: The NumPy storage of each compute dtype's weights (bf16: bit patterns).
STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
           "bf16": np.dtype(np.uint16)}


class CheckpointError(ValueError):
    """A checkpoint directory ETC cannot read."""


class MissingTensorError(CheckpointError, KeyError):
    """A tensor the architecture needs is in none of the checkpoint's files."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class Checkpoint:
    """The config and tensors of one checkpoint directory."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a directory (expected a Hugging Face "
                                  f"checkpoint: config.json and *.safetensors)")
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"{self.path}: no config.json")
        try:
            raw = json.loads(config_path.read_text())
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{config_path}: not JSON ({error})") from None
        self.raw_config = raw
        self.config = ModelConfig.from_dict(raw, str(config_path))
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path}: no *.safetensors files (ETC reads safetensors "
                                  f"checkpoints only)")
        self._where: dict[str, SafetensorsFile] = {}
        for file in files:
            tensors = SafetensorsFile(file)
            for name in tensors:
                if name in self._where:
                    raise CheckpointError(f"{self.path}: tensor {name!r} is in both "
                                          f"{self._where[name].path.name} and {file.name}")
                self._where[name] = tensors

    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a generated sequence: config.json's
        `eos_token_id` (an int or a list) and generation_config.json's,
        in that order without repeats; if neither has any, the tokenizer's
        EOS token. Empty when nothing names one."""
        ids: list[int] = []
        sources = [("config.json", self.raw_config)]
        generation = self.path / "generation_config.json"
        if generation.is_file():
            try:
                sources.append(("generation_config.json", json.loads(generation.read_text())))
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{generation}: not JSON ({error})") from None
        for file, raw in sources:
            value = raw.get("eos_token_id") if isinstance(raw, dict) else None
            values = value if isinstance(value, list) else [] if value is None else [value]
            for token in values:
                if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                    raise CheckpointError(f"{self.path / file}: eos_token_id {value!r} must be "
                                          f"a non-negative int or a list of them")
                if token not in ids:
                    ids.append(token)
        if not ids:
            tokenizer = self.tokenizer()
            if tokenizer is not None and tokenizer.eos_token_id is not None:
                ids.append(tokenizer.eos_token_id)
        return tuple(ids)

    def tokenizer(self):
        """The checkpoint's `Tokenizer` (tokenizer.json, tokenizer_config.json,
        chat_template.jinja), or None when it has no tokenizer.json."""
        from .tokenizer import Tokenizer

        return Tokenizer.from_directory(self.path)

    def names(self) -> list[str]:
        return sorted(self._where)

    def dtypes(self) -> set[str]:
        """The safetensors dtypes of the checkpoint's tensors."""
        return {f.dtype(n) for n, f in self._where.items()}

    def tensor(self, name: str, shape: tuple, what: str, dtype: str = "f32") -> np.ndarray:
        """Tensor `name` as an array of `shape` in the storage of `dtype`
        (see `SafetensorsFile.read`: float32 by default); errors name the
        tensor and `what` it is for."""
        file = self._where.get(name)
        if file is None:
            raise MissingTensorError(f"{self.path}: tensor {name!r} ({what}) is missing from "
                                     f"the checkpoint")
        if file.shape(name) != tuple(shape):
            raise CheckpointError(f"{file.path}: tensor {name!r} ({what}) has shape "
                                  f"{file.shape(name)}, expected {tuple(shape)} from config.json")
        return file.read(name, dtype)

    def weights(self, dtype: str = "f32", progress: Optional[Callable[[int, int], None]] = None
                ) -> dict[str, np.ndarray]:
        """Every weight the step graph takes, by graph input name (see
        `etc.models.step.graph`), in the storage of the compute `dtype`:
        float32 for "f32", float16 for "f16", bf16 bit patterns (uint16)
        for "bf16"; contiguous and owned (not views of the files). A tensor
        stored in that dtype is read as it is, never widened, so loading
        takes about the weights' size in memory; others are converted one
        at a time. Projections keep Hugging Face's (out, in) layout (the
        graph multiplies by their transposes); MoE experts are stacked as
        `g.moe` takes them. `progress(done, total)` is called after each
        graph weight."""
        if dtype not in STORAGE:
            raise ValueError(f"weights: dtype {dtype!r} is not one of {', '.join(STORAGE)}")
        c = self.config
        h, d = c.hidden_size, c.head_dim
        out: dict[str, np.ndarray] = {}
        per_layer = [4 + (3 if c.qkv_bias else 0) + (2 if c.qk_norm else 0) + 1 +
                     (2 if c.sandwich_norms else 0) + (4 if c.is_sparse(i) else 3)
                     for i in range(c.num_layers)]
        total = 2 + sum(per_layer) + (0 if c.tie_word_embeddings else 1)

        def report() -> None:
            if progress is not None:
                progress(len(out), total)

        def take(key: str, name: str, shape: tuple, what: str) -> None:
            out[key] = np.ascontiguousarray(self.tensor(name, shape, what, dtype))
            report()

        def split(name: str, shape: tuple, what: str, parts: list) -> None:
            """A fused projection's rows as graph weights: (key, start, stop)."""
            fused = self.tensor(name, shape, what, dtype)
            for key, start, stop in parts:
                out[key] = np.ascontiguousarray(fused[start:stop])
                report()
            del fused

        fused = c.architecture == "Phi3ForCausalLM"

        take("embed", "model.embed_tokens.weight", (c.vocab_size, h), "token embeddings")
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            take(f"l{i}_attn_norm", p + "input_layernorm.weight", (h,), f"layer {i} norm")
            q, kv = c.num_heads * d, c.num_kv_heads * d
            if fused:
                # Phi-3: q, k and v in one projection, split at load.
                split(p + "self_attn.qkv_proj.weight", (q + 2 * kv, h),
                      f"layer {i} fused q/k/v projection",
                      [(f"l{i}_wq", 0, q), (f"l{i}_wk", q, q + kv), (f"l{i}_wv", q + kv, q + 2 * kv)])
            else:
                take(f"l{i}_wq", p + "self_attn.q_proj.weight", (q, h),
                     f"layer {i} query projection")
                take(f"l{i}_wk", p + "self_attn.k_proj.weight", (kv, h),
                     f"layer {i} key projection")
                take(f"l{i}_wv", p + "self_attn.v_proj.weight", (kv, h),
                     f"layer {i} value projection")
            take(f"l{i}_wo", p + "self_attn.o_proj.weight", (h, c.num_heads * d),
                 f"layer {i} output projection")
            if c.qkv_bias:
                for key, proj, heads in (("bq", "q", c.num_heads), ("bk", "k", c.num_kv_heads),
                                         ("bv", "v", c.num_kv_heads)):
                    take(f"l{i}_{key}", f"{p}self_attn.{proj}_proj.bias", (heads * d,),
                         f"layer {i} {proj} projection bias")
            if c.qk_norm:
                take(f"l{i}_q_norm", p + "self_attn.q_norm.weight", (d,), f"layer {i} q_norm")
                take(f"l{i}_k_norm", p + "self_attn.k_norm.weight", (d,), f"layer {i} k_norm")
            if c.sandwich_norms:
                # Gemma: post_attention_layernorm norms the attention's
                # output; the MLP's input norm is pre_feedforward_layernorm.
                take(f"l{i}_post_attn_norm", p + "post_attention_layernorm.weight", (h,),
                     f"layer {i} post-attention norm")
                take(f"l{i}_mlp_norm", p + "pre_feedforward_layernorm.weight", (h,),
                     f"layer {i} pre-feedforward norm")
                take(f"l{i}_post_mlp_norm", p + "post_feedforward_layernorm.weight", (h,),
                     f"layer {i} post-feedforward norm")
            else:
                take(f"l{i}_mlp_norm", p + "post_attention_layernorm.weight", (h,),
                     f"layer {i} post-attention norm")
            if c.is_sparse(i):
                e, f = c.num_experts, c.moe_intermediate_size
                router = self.tensor(p + "mlp.gate.weight", (e, h), f"layer {i} router", dtype)
                out[f"l{i}_router"] = np.ascontiguousarray(router.T)
                report()

                def experts(proj: str, shape: tuple, transpose: bool) -> np.ndarray:
                    stacked = np.empty((e,) + (shape[::-1] if transpose else shape),
                                       STORAGE[dtype])
                    for j in range(e):
                        w = self.tensor(f"{p}mlp.experts.{j}.{proj}.weight", shape,
                                        f"layer {i} expert {j} {proj}", dtype)
                        stacked[j] = w.T if transpose else w
                    return stacked
                # g.moe takes (E, H, F) up and gate, (E, F, H) down.
                for key, proj, shape in (("gate", "gate_proj", (f, h)), ("up", "up_proj", (f, h)),
                                         ("down", "down_proj", (h, f))):
                    out[f"l{i}_experts_{key}"] = experts(proj, shape, True)
                    report()
            else:
                f = c.intermediate_size
                if fused:
                    # Phi-3: gate then up in one projection (transformers'
                    # chunk(2)), split at load.
                    split(p + "mlp.gate_up_proj.weight", (2 * f, h),
                          f"layer {i} fused MLP gate/up",
                          [(f"l{i}_w_gate", 0, f), (f"l{i}_w_up", f, 2 * f)])
                else:
                    take(f"l{i}_w_gate", p + "mlp.gate_proj.weight", (f, h),
                         f"layer {i} MLP gate")
                    take(f"l{i}_w_up", p + "mlp.up_proj.weight", (f, h), f"layer {i} MLP up")
                take(f"l{i}_w_down", p + "mlp.down_proj.weight", (h, f), f"layer {i} MLP down")
        take("final_norm", "model.norm.weight", (h,), "final norm")
        if not c.tie_word_embeddings:
            take("lm_head", "lm_head.weight", (c.vocab_size, h), "LM head")
        return out
