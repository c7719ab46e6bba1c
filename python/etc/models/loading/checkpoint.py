"""A Hugging Face checkpoint directory: config.json and the weights of its
*.safetensors files, under the usual tensor names, checked and arranged the
way the step graph takes them. An FP8 checkpoint's e4m3 weights (`fp8`)
stay packed where the step graph reads them by rows, else are
dequantized."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from . import (families_deepseek, families_dense as dense, families_ernie, fp8, mla_layout,
               moe_fields, multimodal, mxfp4, partial_rotary)
from ... import bfloat16, packed
from ...runtime import aligned
from .config import ModelConfig, UnsupportedConfigError
from .safetensors import SafetensorsFile

__all__ = ["Checkpoint", "MissingTensorError", "CheckpointError", "STORAGE", "config_dtype"]

#: The NumPy storage of each compute dtype's weights (bf16: bit patterns).
STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16),
           "bf16": np.dtype(np.uint16)}

#: The compute dtype of each safetensors float dtype.
_COMPUTE = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

#: config.json's `torch_dtype` (transformers v5: `dtype`) as a compute dtype.
_CONFIG_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _mxfp4_config(raw: dict, where: str) -> bool:
    """Whether config.json's `quantization_config` is gpt-oss's MXFP4
    (quant_method "mxfp4": its experts' `*_blocks` / `*_scales` tensors,
    `modules_to_not_convert` the float ones), checked; False for any other
    (or none)."""
    q = raw.get("quantization_config") if isinstance(raw, dict) else None
    if not isinstance(q, dict) or q.get("quant_method") != "mxfp4":
        return False
    unknown = sorted(set(q) - {"quant_method", "modules_to_not_convert", "dequantize"})
    if unknown:
        raise UnsupportedConfigError(f"{where}: field 'quantization_config.{unknown[0]}' is "
                                     f"not supported (an mxfp4 quantization_config has "
                                     f"quant_method, modules_to_not_convert, dequantize)")
    return True


def config_dtype(raw: dict) -> Optional[str]:
    """The compute dtype config.json names (`dtype`, else `torch_dtype`;
    "torch." prefixes allowed), or None when it names none ETC computes
    in."""
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key) if isinstance(raw, dict) else None
        if isinstance(value, str) and value.removeprefix("torch.") in _CONFIG_DTYPES:
            return _CONFIG_DTYPES[value.removeprefix("torch.")]
    return None


#: The Hugging Face names of the sandwich norms (`ModelConfig.
#: sandwich_norms`): of the attention's output, of the MLP's input (None:
#: none, OLMo 2's `input_norms` False) and of the MLP's output.
_SANDWICH = {"Gemma": ("post_attention_layernorm", "pre_feedforward_layernorm",
                       "post_feedforward_layernorm"),
             "Olmo2ForCausalLM": ("post_attention_layernorm", None, "post_feedforward_layernorm"),
             "Olmo3ForCausalLM": ("post_attention_layernorm", None, "post_feedforward_layernorm"),
             dense.EXAONE4: ("post_attention_layernorm", None, "post_feedforward_layernorm"),
             "Glm4ForCausalLM": ("post_self_attn_layernorm", "post_attention_layernorm",
                                 "post_mlp_layernorm")}


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
        #: An FP8 checkpoint's block scaling (`fp8.Fp8Quantization`), or None.
        #: gpt-oss's "mxfp4" quantization_config says its experts are MXFP4
        #: (`mxfp4`): the tensors say it too, and are read as they are.
        self.quantization = None if _mxfp4_config(raw, str(config_path)) else \
            fp8.read_quantization(raw, str(config_path))
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
        if multimodal.is_multimodal(raw):
            self._text_model(raw)
        moe_fields.check_shared_tensors(self.config, self._where, str(self.path))

    #: The language model's tensor names of a multimodal checkpoint: the
    #: prefix of its `model.*` tensors and its LM head's name (None: the
    #: names are a causal LM's).
    _text_names: Optional[tuple[str, str]] = None
    #: What of a multimodal checkpoint is not loaded, in words (None for a
    #: causal LM's checkpoint): ETC runs its text model.
    not_loaded: Optional[str] = None

    def _text_model(self, raw: dict) -> None:
        """A multimodal checkpoint (`multimodal`): finds its language model's
        tensors under either prefix transformers writes, decides the LM
        head's tying where config.json does not (`multimodal.tie_stated`)
        and says what is not loaded."""
        found = [(prefix, head) for prefix, head in multimodal.PREFIXES
                 if prefix + "embed_tokens.weight" in self._where]
        if not found:
            first, second = (prefix + "embed_tokens.weight" for prefix, _ in multimodal.PREFIXES)
            raise MissingTensorError(
                f"{self.path}: tensor {first!r} (the text model's token embeddings; "
                f"{second!r} as transformers 4.52 to 4.57 name it) is missing from the "
                f"checkpoint")
        if len(found) > 1:
            raise CheckpointError(f"{self.path}: the checkpoint holds the text model twice, "
                                  f"under {found[0][0]!r} and {found[1][0]!r}")
        prefix, head = self._text_names = found[0]
        if multimodal.tie_stated(raw, str(self.path / "config.json")) is None:
            self.config = replace(self.config, tie_word_embeddings=head not in self._where)
        parts = multimodal.other_parts(self._where, prefix, head)
        unread = ", ".join(f"{part} ({count} tensor{'s' * (count != 1)})"
                           for part, count in sorted(parts.items()))
        self.not_loaded = f"{raw['architectures'][0]}: its text model only" + (
            f"; not loaded: {unread}" if unread else " (the checkpoint has nothing else)")

    def _named(self, plan: list[tuple]) -> list[tuple]:
        """`plan` with the tensor names of this checkpoint: a multimodal
        one's language model's names (`_text_names`) for a causal LM's."""
        if self._text_names is None:
            return plan
        prefix, head = self._text_names

        def name(hf: str) -> str:
            return head if hf == "lm_head.weight" else prefix + hf.removeprefix("model.")

        return [(key, [name(n) for n in names] if isinstance(names, list) else name(names),
                 *rest) for key, names, *rest in plan]

    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a generated sequence: config.json's
        `eos_token_id` (an int or a list) and generation_config.json's,
        in that order without repeats; if neither has any, the tokenizer's
        EOS token. Empty when nothing names one."""
        ids: list[int] = []
        sources = [("config.json", self.raw_config)]
        if self._text_names is not None:
            # The text model's ids too (transformers 5 writes them there).
            sources.append(("config.json text_config", self.raw_config["text_config"]))
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

    def default_dtype(self) -> str:
        """The compute dtype `load(dtype=None)` picks: the storage of the
        weight matrices the step graph reads (the embeddings, projections,
        router, experts and LM head; an FP8 checkpoint's e4m3 ones aside,
        they stay packed or are dequantized), so that nothing is widened or
        rounded: all BF16 -> "bf16", all F16 -> "f16", all F32 -> "f32".
        Matrices of several dtypes: config.json's `dtype` / `torch_dtype`
        when it is one of them, else "f32" (it holds every one exactly).
        No float matrix at all (every one FP8): config.json's, else
        "bf16". Where config.json names a dtype the matrices are not all
        stored in, the storage wins: it is what the file holds, and config
        fields are often stale. docs/models.md, "The compute dtype"."""
        stored = set()
        for _, name, _, _, how in self._plan():
            if how == "f32":  # (float32 whatever the dtype: not a weight's storage)
                continue
            for tensor in (name if how == "experts" else [name]):
                file = self._where.get(tensor)
                if file is not None and file.dtype(tensor) in _COMPUTE and \
                        len(file.shape(tensor)) >= 2:
                    stored.add(_COMPUTE[file.dtype(tensor)])
        said = config_dtype(self.raw_config) or config_dtype(self.raw_config.get("text_config"))
        if len(stored) == 1:
            return stored.pop()
        if not stored:
            return said or "bf16"
        return said if said in stored else "f32"

    def _file(self, name: str, shape: tuple, what: str) -> SafetensorsFile:
        """The file of tensor `name`, whose shape must be `shape`."""
        file = self._where.get(name)
        if file is None:
            raise MissingTensorError(f"{self.path}: tensor {name!r} ({what}) is missing from "
                                     f"the checkpoint")
        if file.shape(name) != tuple(shape):
            raise CheckpointError(f"{file.path}: tensor {name!r} ({what}) has shape "
                                  f"{file.shape(name)}, expected {tuple(shape)} from config.json")
        return file

    def is_fp8(self, name: str) -> bool:
        """Whether tensor `name` is stored as float8 bytes (F8_E4M3)."""
        file = self._where.get(name)
        return file is not None and file.dtype(name) == "F8_E4M3"

    def tensor(self, name: str, shape: tuple, what: str, dtype: str = "f32") -> np.ndarray:
        """Tensor `name` as an array of `shape` in the storage of `dtype`
        (see `SafetensorsFile.read`: float32 by default; an FP8 weight
        dequantized with its scales, then rounded to `dtype`); errors name
        the tensor and `what` it is for."""
        file = self._file(name, shape, what)
        if not self.is_fp8(name):
            return file.read(name, dtype)
        out = aligned.empty(shape, STORAGE[dtype])
        for rows, values, row_scales in self._fp8_parts(name, shape, what):
            wide = fp8.dequantize(values, row_scales, self.quantization.block)
            out[rows] = bfloat16.to_bits(wide) if dtype == "bf16" else wide
        return out

    def packed_tensor(self, name: str, shape: tuple, what: str) -> np.ndarray:
        """FP8 weight `name` (out, in), `in` a multiple of 32, in
        `etc.packed`'s fp8_e4m3 storage (`fp8.pack`)."""
        self._file(name, shape, what)
        out = aligned.empty(packed.storage_shape(shape, "fp8_e4m3"), np.uint8)
        for rows, values, row_scales in self._fp8_parts(name, shape, what):
            fp8.pack(values, row_scales, self.quantization.block, out[rows])
        return out

    #: Rows of an FP8 weight read at a time: no whole-tensor temporaries.
    FP8_ROWS = 256

    def _fp8_parts(self, name: str, shape: tuple, what: str):
        """FP8 weight `name` a part at a time: (rows (a slice), their e4m3
        bytes, their rows' float32 block scales), checked: the checkpoint
        must say how it is quantized, the scales must have the shape the
        blocks give and be finite, no value may be NaN."""
        where = self._where[name].path
        if self.quantization is None:
            raise CheckpointError(f"{where}: tensor {name!r} ({what}) is F8_E4M3, but "
                                  f"config.json has no quantization_config (quant_method "
                                  f"'fp8', weight_block_size) to say how it is scaled")
        if len(shape) != 2:
            raise CheckpointError(f"{where}: tensor {name!r} ({what}) is F8_E4M3; ETC reads "
                                  f"FP8 weights of 2-D linear layers only")
        block = self.quantization.block
        scale_name = fp8.scale_name(name)
        scales = self.tensor(scale_name, fp8.scale_shape(shape, block),
                             f"the block scales of {what}")
        if not np.isfinite(scales).all():
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(scales))[0])
            raise CheckpointError(f"{self._where[scale_name].path}: tensor {scale_name!r} has "
                                  f"a non-finite scale at block {bad}: the file is damaged")
        for start in range(0, shape[0], self.FP8_ROWS):
            rows = slice(start, min(start + self.FP8_ROWS, shape[0]))
            values = self._where[name].read_bytes(name, rows)
            nan = (values & 0x7F) == 0x7F
            if nan.any():
                row, column = (int(i) for i in np.argwhere(nan)[0])
                raise CheckpointError(f"{where}: tensor {name!r} ({what}) holds an e4m3 NaN at "
                                      f"{(start + row, column)}: the file is damaged")
            yield rows, values, scales[np.arange(rows.start, rows.stop) // block[0]]

    def _plan(self) -> list[tuple]:
        """Every weight the step graph takes: (graph input name, tensor
        name(s), shape, what it is, layout), the layout None, ("rows",
        start, stop) for a part of a fused projection (Phi-3), ("expert_rows",
        start, stop) for those rows of every expert of a stack (E, rows, in)
        (transformers 5's fused experts), "T" for a
        transposed matrix (a router), "flat" for a matrix read as one vector
        (Command R+'s q/k norms), or "experts" for a MoE layer's stack
        of one projection (the name a list of each expert's tensor, the
        shape an expert's); gpt-oss's ("mxfp4", ...), ("stack_T", ...),
        ("columns", ...) (`_gpt_oss_experts`) and "f32" (a float32
        tensor whatever the dtype: attention sinks)."""
        c = self.config
        h, d = c.hidden_size, c.head_dim
        plan: list[tuple] = [("embed", "model.embed_tokens.weight", (c.vocab_size, h),
                              "token embeddings", None)]
        fused = c.architecture == "Phi3ForCausalLM"
        # GLM-4: q, k, v apart, gate and up fused as Phi-3's.
        fused_mlp = fused or c.architecture == "Glm4ForCausalLM"
        # The norms of the attention's and MLP's outputs, and of the MLP's
        # input, by architecture (sandwich_norms; OLMo 2 has no input norms).
        post_attn, pre_mlp, post_mlp = _SANDWICH.get(c.architecture, _SANDWICH["Gemma"])
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            if c.input_norms:
                plan.append((f"l{i}_attn_norm", p + "input_layernorm.weight", (h,),
                             f"layer {i} norm", None))
            q, kv = c.num_heads * d, c.num_kv_heads * d
            if c.mla is not None:  # DeepSeek: latent attention, o_proj too
                plan += mla_layout.plan(c, i, p)
            elif fused:
                # Phi-3: q, k and v in one projection, split at load.
                plan += [(key, p + "self_attn.qkv_proj.weight", (q + 2 * kv, h),
                          f"layer {i} fused q/k/v projection", ("rows", start, stop))
                         for key, start, stop in ((f"l{i}_wq", 0, q), (f"l{i}_wk", q, q + kv),
                                                  (f"l{i}_wv", q + kv, q + 2 * kv))]
            else:
                plan += [(f"l{i}_wq", p + "self_attn.q_proj.weight", (q, h),
                          f"layer {i} query projection", None),
                         (f"l{i}_wk", p + "self_attn.k_proj.weight", (kv, h),
                          f"layer {i} key projection", None),
                         (f"l{i}_wv", p + "self_attn.v_proj.weight", (kv, h),
                          f"layer {i} value projection", None)]
            if c.mla is None:
                plan.append((f"l{i}_wo", p + "self_attn.o_proj.weight", (h, q),
                             f"layer {i} output projection", None))
            if c.qkv_bias:
                plan += [(f"l{i}_{key}", f"{p}self_attn.{proj}_proj.bias", (heads * d,),
                          f"layer {i} {proj} projection bias", None)
                         for key, proj, heads in (("bq", "q", c.num_heads),
                                                  ("bk", "k", c.num_kv_heads),
                                                  ("bv", "v", c.num_kv_heads))]
            if c.o_bias:
                plan.append((f"l{i}_bo", p + "self_attn.o_proj.bias", (h,),
                             f"layer {i} o projection bias", None))
            if c.attention_sinks:
                plan.append((f"l{i}_sinks", p + "self_attn.sinks", (c.num_heads,),
                             f"layer {i} attention sinks", "f32"))
            if c.qk_norm and c.layer_norm:  # Command R+: (heads, d), a weight per head
                plan += [(f"l{i}_{n}_norm", f"{p}self_attn.{n}_norm.weight", (heads, d),
                          f"layer {i} {n}_norm", "flat")
                         for n, heads in (("q", c.num_heads), ("k", c.num_kv_heads))]
            elif c.qk_norm:
                # Per head (d), or OLMo 2's over the whole projection.
                q_size, k_size = (q, kv) if c.qk_norm_projection else (d, d)
                qn, kn = dense.QK_NORM_NAMES.get(c.architecture, ("q_norm", "k_norm"))
                plan += [(f"l{i}_q_norm", f"{p}self_attn.{qn}.weight", (q_size,),
                          f"layer {i} q_norm", None),
                         (f"l{i}_k_norm", f"{p}self_attn.{kn}.weight", (k_size,),
                          f"layer {i} k_norm", None)]
            if c.sandwich_norms:
                plan += [(key, f"{p}{name}.weight", (h,), f"layer {i} {what}", None)
                         for key, name, what in (
                             (f"l{i}_post_attn_norm", post_attn, "post-attention norm"),
                             (f"l{i}_mlp_norm", pre_mlp, "pre-feedforward norm"),
                             (f"l{i}_post_mlp_norm", post_mlp, "post-feedforward norm"))
                         if name is not None]
            elif not c.parallel_block:  # (Cohere's MLP reads the input norm)
                plan.append((f"l{i}_mlp_norm", p + "post_attention_layernorm.weight", (h,),
                             f"layer {i} post-attention norm", None))
            if c.is_sparse(i) and c.architecture == "MixtralForCausalLM":
                plan += self._mixtral_experts(i)
            elif c.is_sparse(i) and c.architecture in ("GraniteMoeForCausalLM",
                                                       "GraniteMoeSharedForCausalLM"):
                plan += self._granite_moe_experts(i)
            elif c.is_sparse(i) and c.architecture == "GptOssForCausalLM":
                plan += self._gpt_oss_experts(i)
            elif c.is_sparse(i) and self._fused_experts_in(i):
                plan += self._fused_experts(i)
            elif c.is_sparse(i):
                e, f = c.num_experts, c.moe_intermediate_size
                plan.append((f"l{i}_router", p + "mlp.gate.weight", (e, h), f"layer {i} router",
                             "T"))
                plan += [(f"l{i}_experts_{key}",
                          [f"{p}mlp.experts.{j}.{proj}.weight" for j in range(e)], shape,
                          f"layer {i} {proj} experts", "experts")
                         for key, proj, shape in (("gate", "gate_proj", (f, h)),
                                                  ("up", "up_proj", (f, h)),
                                                  ("down", "down_proj", (h, f)))]
            else:
                f = c.intermediate_size
                if fused_mlp:
                    # Phi-3, GLM-4: gate then up in one projection (transformers'
                    # chunk(2)), split at load.
                    plan += [(key, p + "mlp.gate_up_proj.weight", (2 * f, h),
                              f"layer {i} fused MLP gate/up", ("rows", start, stop))
                             for key, start, stop in ((f"l{i}_w_gate", 0, f),
                                                      (f"l{i}_w_up", f, 2 * f))]
                else:
                    plan += [(f"l{i}_w_gate", p + "mlp.gate_proj.weight", (f, h),
                              f"layer {i} MLP gate", None),
                             (f"l{i}_w_up", p + "mlp.up_proj.weight", (f, h),
                              f"layer {i} MLP up", None)]
                plan.append((f"l{i}_w_down", p + "mlp.down_proj.weight", (h, f),
                             f"layer {i} MLP down", None))
            if c.is_sparse(i) and c.selection_bias:
                # GLM-4.5's (either experts' layout), ERNIE 4.5's (1, E)
                # `moe_statics`, float32 in the checkpoint and the graph.
                plan.append(families_ernie.selection_bias(self._where, i, c.num_experts)
                            if c.architecture == families_ernie.ERNIE_MOE else
                            (f"l{i}_selection_bias", p + "mlp.gate.e_score_correction_bias",
                             (c.num_experts,), f"layer {i} router score correction bias", "f32"))
            if c.is_sparse(i) and c.shared_expert_intermediate_size:
                plan += self._shared_expert(i)
        plan.append(("final_norm", "model.norm.weight", (h,), "final norm", None))
        if not c.tie_word_embeddings:
            plan.append(("lm_head", "lm_head.weight", (c.vocab_size, h), "LM head", None))
        return self._named(plan)

    def _mixtral_experts(self, i: int) -> list[tuple]:
        """`_plan`'s entries of Mixtral's layer `i`: its router and experts
        as transformers 4 (and 5, by default) saves them,
        `block_sparse_moe.gate` and `block_sparse_moe.experts.<j>.w1/w2/w3`
        (gate, down, up); or as transformers 5 keeps them in memory and
        saves them with `save_original_format=False`, `mlp.gate` and two
        stacks, `mlp.experts.gate_up_proj` (E, 2 f, h: gate rows then up
        rows, the concatenation of w1 and w3) and `mlp.experts.down_proj`
        (E, h, f)."""
        c = self.config
        h, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
        if self._fused_experts_in(i):
            return self._fused_experts(i)
        p = f"model.layers.{i}.block_sparse_moe."
        return [(f"l{i}_router", p + "gate.weight", (e, h), f"layer {i} router", "T")] + [
            (f"l{i}_experts_{key}", [f"{p}experts.{j}.{w}.weight" for j in range(e)], shape,
             f"layer {i} {key} experts ({w})", "experts")
            for key, w, shape in (("gate", "w1", (f, h)), ("up", "w3", (f, h)),
                                  ("down", "w2", (h, f)))]

    def _fused_experts_in(self, i: int) -> bool:
        """Whether layer `i`'s experts are stacked as transformers 5 holds
        them (`mlp.experts.gate_up_proj`, `down_proj`)."""
        fused = f"model.layers.{i}.mlp.experts."
        return fused + "gate_up_proj" in self._where or fused + "down_proj" in self._where

    def _fused_experts(self, i: int) -> list[tuple]:
        """`_plan`'s entries of layer `i`'s router (`mlp.gate`) and experts
        as transformers 5 holds them and saves them with
        `save_original_format=False` (Mixtral's, OLMoE's, the Qwen MoEs'
        and GLM-4.5's classes alike): `mlp.experts.gate_up_proj` (E, 2 f, h: gate rows
        then up rows, as `chunk(2)` splits them) and `mlp.experts.down_proj`
        (E, h, f)."""
        c = self.config
        h, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
        fused = f"model.layers.{i}.mlp.experts."
        return [(f"l{i}_router", f"model.layers.{i}.mlp.gate.weight", (e, h),
                 f"layer {i} router", "T"),
                (f"l{i}_experts_gate", fused + "gate_up_proj", (e, 2 * f, h),
                 f"layer {i} fused expert gate/up projections", ("expert_rows", 0, f)),
                (f"l{i}_experts_up", fused + "gate_up_proj", (e, 2 * f, h),
                 f"layer {i} fused expert gate/up projections", ("expert_rows", f, 2 * f)),
                (f"l{i}_experts_down", fused + "down_proj", (e, h, f),
                 f"layer {i} expert down projections", None)]

    def _shared_expert(self, i: int) -> list[tuple]:
        """`_plan`'s entries of the shared expert of sparse layer `i`:
        Qwen2-MoE's `mlp.shared_expert.{gate,up,down}_proj` and its gate
        `mlp.shared_expert_gate` (1, h); Granite MoE's `shared_mlp.
        input_linear` (2 f, h: gate rows then up rows, split at load) and
        `shared_mlp.output_linear` (h, f); GLM-4.5's
        `mlp.shared_experts.{gate,up,down}_proj`, no gate."""
        c = self.config
        h, f = c.hidden_size, c.shared_expert_intermediate_size
        p = f"model.layers.{i}."
        if c.architecture == "GraniteMoeSharedForCausalLM":
            return [(f"l{i}_shexp_{key}", p + "shared_mlp.input_linear.weight", (2 * f, h),
                     f"layer {i} fused shared MLP gate/up", ("rows", start, stop))
                    for key, start, stop in (("gate", 0, f), ("up", f, 2 * f))] + [
                (f"l{i}_shexp_down", p + "shared_mlp.output_linear.weight", (h, f),
                 f"layer {i} shared MLP down", None)]
        experts = "shared_experts" if c.architecture in ("Glm4MoeForCausalLM",
                                                         families_ernie.ERNIE_MOE,
                                                         *families_deepseek.ARCHITECTURES) \
            else "shared_expert"
        projections = [(f"l{i}_shexp_{key}", f"{p}mlp.{experts}.{key}_proj.weight", shape,
                        f"layer {i} shared expert {key}", None)
                       for key, shape in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f)))]
        if not c.shared_expert_gate:
            return projections
        return projections + [
            (f"l{i}_shexp_gate_inp", p + "mlp.shared_expert_gate.weight", (1, h),
             f"layer {i} shared expert gate", None)]

    def _granite_moe_experts(self, i: int) -> list[tuple]:
        """`_plan`'s entries of Granite MoE's layer `i`, as its checkpoints
        store them (transformers 4's layout, which transformers 5 saves
        too): the router `block_sparse_moe.router.layer` (E, h), and the
        experts fused, `block_sparse_moe.input_linear` (E, 2 f, h: gate rows
        then up rows, as `chunk(2)` splits them) and
        `block_sparse_moe.output_linear` (E, h, f); or as transformers 5
        holds them (saved with `save_original_format=False`): the same
        tensors named `block_sparse_moe.router.weight`,
        `block_sparse_moe.experts.gate_up_proj` and `.experts.down_proj`."""
        c = self.config
        h, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
        p = f"model.layers.{i}.block_sparse_moe."
        names = ("router.layer.weight", "input_linear.weight", "output_linear.weight")
        if p + "experts.gate_up_proj" in self._where or p + "experts.down_proj" in self._where:
            names = ("router.weight", "experts.gate_up_proj", "experts.down_proj")
        router, gate_up, down = (p + name for name in names)
        return [(f"l{i}_router", router, (e, h), f"layer {i} router", "T"),
                (f"l{i}_experts_gate", gate_up, (e, 2 * f, h),
                 f"layer {i} fused expert gate/up projections", ("expert_rows", 0, f)),
                (f"l{i}_experts_up", gate_up, (e, 2 * f, h),
                 f"layer {i} fused expert gate/up projections", ("expert_rows", f, 2 * f)),
                (f"l{i}_experts_down", down, (e, h, f),
                 f"layer {i} expert down projections", None)]

    def _gpt_oss_experts(self, i: int) -> list[tuple]:
        """`_plan`'s entries of gpt-oss's layer `i`: its router
        (`mlp.router.weight` (E, h), `.bias` (E,)) and experts, as OpenAI's
        checkpoints store them, MXFP4 (`mlp.experts.gate_up_proj_blocks` /
        `_scales`, (E, 2 f, h / 32, 16) and (E, 2 f, h / 32);
        `down_proj_blocks` / `_scales` (E, h, f / 32, 16) and (E, h, f /
        32): each expert's rows (out, in), layout ("mxfp4", parity)), or as
        transformers saves a dequantized model (`mlp.experts.gate_up_proj`
        (E, h, 2 f) and `down_proj` (E, f, h), (in, out): layout
        ("stack_T", parity)); and their biases `gate_up_proj_bias` (E, 2 f)
        and `down_proj_bias` (E, h) (layout ("columns", parity)). gate and
        up are interleaved in gate_up: gate the even output columns, up the
        odd ones (transformers' `_apply_gate`), split at load (parity 0,
        1; None: the whole)."""
        c = self.config
        h, e, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
        p = f"model.layers.{i}.mlp."
        x = p + "experts."
        plan = [(f"l{i}_router", p + "router.weight", (e, h), f"layer {i} router", "T"),
                (f"l{i}_router_b", p + "router.bias", (e,), f"layer {i} router bias", None)]
        if x + "gate_up_proj_blocks" in self._where or x + "down_proj_blocks" in self._where:
            for size in (h, f):
                if size % mxfp4.BLOCK:
                    raise CheckpointError(
                        f"{self.path}: layer {i}'s MXFP4 experts need hidden_size and "
                        f"intermediate_size multiples of {mxfp4.BLOCK}, got {h} and {f}")
            plan += [(f"l{i}_experts_gate", x + "gate_up_proj", (e, 2 * f, h),
                      f"layer {i} MXFP4 expert gate/up projections", ("mxfp4", 0)),
                     (f"l{i}_experts_up", x + "gate_up_proj", (e, 2 * f, h),
                      f"layer {i} MXFP4 expert gate/up projections", ("mxfp4", 1)),
                     (f"l{i}_experts_down", x + "down_proj", (e, h, f),
                      f"layer {i} MXFP4 expert down projections", ("mxfp4", None))]
        else:
            plan += [(f"l{i}_experts_gate", x + "gate_up_proj", (e, h, 2 * f),
                      f"layer {i} expert gate/up projections", ("stack_T", 0)),
                     (f"l{i}_experts_up", x + "gate_up_proj", (e, h, 2 * f),
                      f"layer {i} expert gate/up projections", ("stack_T", 1)),
                     (f"l{i}_experts_down", x + "down_proj", (e, f, h),
                      f"layer {i} expert down projections", ("stack_T", None))]
        return plan + [
            (f"l{i}_experts_gate_b", x + "gate_up_proj_bias", (e, 2 * f),
             f"layer {i} expert gate/up biases", ("columns", 0)),
            (f"l{i}_experts_up_b", x + "gate_up_proj_bias", (e, 2 * f),
             f"layer {i} expert gate/up biases", ("columns", 1)),
            (f"l{i}_experts_down_b", x + "down_proj_bias", (e, h),
             f"layer {i} expert down biases", None)]

    def _mxfp4_stack(self, name: str, shape: tuple, what: str, parity, dtype: str,
                     keep: bool) -> np.ndarray:
        """The MXFP4 experts `name` (`name`_blocks / `name`_scales, stack
        `shape` (E, out, in)), their rows of `parity` (None: all), as
        `etc.packed` mxfp4 storage (`keep`) or dequantized into the storage
        of `dtype`; an expert at a time."""
        e, rows, k = shape
        groups = k // mxfp4.BLOCK
        blocks = self._file(name + "_blocks", (e, rows, groups, 16), f"the blocks of {what}")
        scales = self._file(name + "_scales", (e, rows, groups), f"the scales of {what}")
        for file, tensor in ((blocks, name + "_blocks"), (scales, name + "_scales")):
            if file.dtype(tensor) != "U8":
                raise CheckpointError(f"{file.path}: tensor {tensor!r} ({what}) is "
                                      f"{file.dtype(tensor)}, expected U8 (MXFP4 bytes)")
        pick = slice(None) if parity is None else slice(parity, None, 2)
        out_rows = rows if parity is None else rows // 2
        if keep:
            out = aligned.empty(packed.storage_shape((e, out_rows, k), "mxfp4"), np.uint8)
        else:
            out = aligned.empty((e, out_rows, k), STORAGE[dtype])
        for j in range(e):
            one = slice(j, j + 1)
            raw = mxfp4.repack(blocks.read_bytes(name + "_blocks", one)[0][pick],
                               scales.read_bytes(name + "_scales", one)[0][pick])
            bad = packed.first_bad_block(raw, "mxfp4")
            if bad is not None:
                raise CheckpointError(f"{blocks.path}: tensor {name + '_scales'!r} ({what}) "
                                      f"expert {j}: block {bad} has a scale above "
                                      f"{packed.MXFP4_LARGEST_E} (no quantizer writes it): the "
                                      f"file is damaged")
            if keep:
                out[j] = raw
            else:
                wide = packed.dequantize(raw, "mxfp4", (out_rows, k))
                out[j] = bfloat16.to_bits(wide) if dtype == "bf16" else wide
        return out

    def _stack(self, names: list, shape: tuple, what: str, dtype: str,
               packed_read: Optional[Callable] = None) -> np.ndarray:
        """One projection's experts `names` (each `shape`, (out, in)) as a
        stack (E, out, in): packed by `packed_read` when given, else in the
        storage of `dtype`, read in place into the stack when the file
        stores that dtype (a float checkpoint's experts, unconverted),
        converted an expert at a time otherwise."""
        if packed_read is not None:
            stack = None
            for j, expert in enumerate(names):
                w = packed_read(expert)
                if stack is None:
                    stack = aligned.empty((len(names),) + w.shape, w.dtype)
                stack[j] = w
            return stack
        stack = aligned.empty((len(names),) + tuple(shape), STORAGE[dtype])
        for j, expert in enumerate(names):
            file = self._file(expert, shape, what)
            if not file.read_into(expert, dtype, stack[j]):
                stack[j] = self.tensor(expert, shape, what, dtype)
        return stack

    def weight_formats(self) -> dict[str, str]:
        """The weights that can stay packed, graph input name -> format of
        `etc.packed` (fp8_e4m3, mxfp4): gpt-oss's MXFP4 experts, and an FP8
        checkpoint's e4m3 matrices that
        the step graph reads by rows (the projections, and a MoE layer's
        stacks of experts when every expert of all three is FP8), whose
        rows are whole blocks of 32 values. Others are dequantized."""
        block = packed.FORMATS["fp8_e4m3"].block
        formats, experts = {}, {}
        for key, name, shape, _, how in self._plan():
            if isinstance(how, tuple) and how[0] == "mxfp4":
                formats[key] = "mxfp4"  # gpt-oss's experts, as stored
                continue
            names = name if how == "experts" else [name]
            fits = len(shape) == 2 and shape[-1] % block == 0 and \
                all(self.is_fp8(n) for n in names)
            if how == "experts":
                experts.setdefault(key.split("_experts_")[0], {})[key] = fits
            elif how != "T" and fits:
                formats[key] = "fp8_e4m3"
        for stacks in experts.values():
            if all(stacks.values()):
                formats.update(dict.fromkeys(stacks, "fp8_e4m3"))
        for key in partial_rotary.unpacked_keys(self.config) | \
                mla_layout.unpacked_keys(self.config):  # rows scaled or padded at load
            formats.pop(key, None)
        return formats

    def weights(self, dtype: str = "f32", progress: Optional[Callable[[int, int], None]] = None,
                formats: Optional[dict] = None,
                shard: Optional[Callable] = None) -> dict[str, np.ndarray]:
        """Every weight the step graph takes, by graph input name (see
        `etc.models.step.graph`), in the storage of the compute `dtype`:
        float32 for "f32", float16 for "f16", bf16 bit patterns (uint16)
        for "bf16"; contiguous and owned (not views of the files). A tensor
        stored in that dtype is read as it is, never widened, so loading
        takes about the weights' size in memory; others are converted one
        at a time (FP8 weights dequantized with their scales). The weights
        named in `formats` (a subset of `weight_formats()`) stay packed,
        as fp8_e4m3 storage (`packed_tensor`). Projections keep Hugging
        Face's (out, in) layout (the graph multiplies by their
        transposes), and so do MoE experts, stacked (E, out, in) (`g.moe`
        with transpose_w), each expert's bytes read straight into its
        place in the stack when the file stores the compute dtype (no
        transposed or temporary copy). With partial rotary, the q and k
        weights' rows are in the step graph's order (`partial_rotary`).
        `shard(key, array)`, when given,
        takes each weight as it is read and returns the part to keep (a
        rank's share of a tensor-parallel model). `progress(done, total)`
        is called after each graph weight."""
        if dtype not in STORAGE:
            raise ValueError(f"weights: dtype {dtype!r} is not one of {', '.join(STORAGE)}")
        formats = formats or {}
        plan = self._plan()
        out: dict[str, np.ndarray] = {}
        fused = (None, None)  # a fused projection, read once for its parts
        for done, (key, name, shape, what, how) in enumerate(plan, 1):
            stay = key in formats
            read = (lambda n: self.packed_tensor(n, shape, what)) if stay else \
                (lambda n: self.tensor(n, shape, what, dtype))
            if how == "experts":
                out[key] = self._stack(name, shape, what, dtype, read if stay else None)
            elif isinstance(how, tuple) and how[0] == "mxfp4":
                out[key] = self._mxfp4_stack(name, shape, what, how[1], dtype, stay)
            elif isinstance(how, tuple) and how[0] in ("stack_T", "columns"):
                # gpt-oss: gate and up interleaved in the last dimension;
                # the dequantized stacks (in, out), turned (out, in).
                if fused[0] != (name, False):
                    fused = ((name, False), self.tensor(name, shape, what, dtype))
                part = fused[1] if how[1] is None else fused[1][..., how[1]::2]
                out[key] = np.ascontiguousarray(part.swapaxes(-1, -2) if how[0] == "stack_T"
                                                else part)
            elif how == "f32":  # attention sinks, selection biases: float32 whatever the
                # dtype ((E,), from ERNIE 4.5's (1, E))
                out[key] = np.ascontiguousarray(self.tensor(name, shape, what, "f32").reshape(-1))
            elif isinstance(how, tuple):  # ("rows" or "expert_rows", start, stop) of a
                if fused[0] != (name, stay):  # fused projection (or stack of experts)
                    fused = ((name, stay), read(name))
                rows = slice(how[1], how[2])
                out[key] = np.ascontiguousarray(fused[1][:, rows] if how[0] == "expert_rows"
                                                else fused[1][rows])
            elif how == "T":
                out[key] = np.ascontiguousarray(self.tensor(name, shape, what, dtype).T)
            elif how == "flat":  # (Command R+'s q/k norms: (heads, d) as one vector)
                out[key] = np.ascontiguousarray(read(name)).reshape(-1)
            else:
                out[key] = np.ascontiguousarray(read(name))
            # Partial rotary: q/k rows in the step graph's order.
            out[key] = partial_rotary.to_step_layout(self.config, key, out[key], dtype, stay)
            out[key] = mla_layout.to_step_layout(self.config, key, out[key], dtype, stay)
            if shard is not None:
                out[key] = shard(key, out[key])
            if progress is not None:
                progress(done, len(plan))
        return out
