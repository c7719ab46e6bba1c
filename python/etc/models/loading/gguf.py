"""GGUF files (llama.cpp's format) as checkpoints, read by
`gguf_file.GGUFFile` with the `gguf` package's type numbers.

A GGUF file holds, in one file, what a Hugging Face directory spreads over
config.json, the safetensors shards and tokenizer.json: key/value metadata
(`general.architecture`, `<arch>.embedding_length`, ...,
`tokenizer.ggml.tokens`, `tokenizer.chat_template`) and the tensors, under
llama.cpp's names (`token_embd.weight`, `blk.<i>.attn_q.weight`, ...),
possibly quantized in blocks.

`GGUFCheckpoint` turns that into what `Model` takes from a `Checkpoint`:
`.config` (a `ModelConfig`, built from the metadata through the same
validation as a config.json), `.weights()` (the step graph's weights,
dequantized to float32 by `etc.packed`, in Hugging Face's layouts, with
llama.cpp's row permutation of Llama's Q and K projections undone),
`.path`, plus the tokenizer and end-of-sequence ids of the metadata.
The fields only some architectures have (Gemma's layer pattern, experts,
LongRoPE, yarn, Granite's multipliers, ...) are read by `gguf_families`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ... import bfloat16, packed
from ...runtime import aligned
from . import (families_ernie as ernie, gguf_deepseek, gguf_dense, gguf_families as families,
               gguf_pretokenizers, mla_layout, partial_rotary)
from .checkpoint import MissingTensorError
from .config import ModelConfig, UnsupportedConfigError
from .gguf_families import decimal
from .gguf_file import MAGIC, GGUFError, GGUFFile

__all__ = ["GGUFCheckpoint", "GGUFError", "ARCHITECTURES", "TENSOR_TYPES", "PRE_TOKENIZERS",
           "is_gguf"]

#: GGUF `general.architecture` values, and the Hugging Face architecture
#: each is checked and built as; where llama.cpp's converter writes two
#: architectures as one, the metadata tells them apart (`gguf_families`):
#: a `llama` file with experts is `MixtralForCausalLM`, a `granitemoe` one
#: with shared experts `GraniteMoeSharedForCausalLM`, an `olmo2` one with a
#: window `Olmo3ForCausalLM`.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "granite": "GraniteForCausalLM",
                 "granitemoe": "GraniteMoeForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                 "gpt-oss": "GptOssForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM",
                 "olmo2": "Olmo2ForCausalLM", "olmoe": "OlmoeForCausalLM",
                 "glm4": "Glm4ForCausalLM", "glm4moe": "Glm4MoeForCausalLM",
                 "ernie4_5": ernie.ERNIE, "ernie4_5-moe": ernie.ERNIE_MOE,
                 **gguf_dense.ARCHITECTURES, **families.COHERE,
                 # (V3 where the experts' gating is sigmoid: `gguf_deepseek`)
                 "deepseek2": "DeepseekV2ForCausalLM"}
#: The architectures whose RoPE rotates the first rope.dimension_count of
#: each head (llama.cpp's phi3, glm4 and glm4moe; GLM-4's in interleaved
#: pairs).
_PARTIAL_ROTARY = ("phi3", "glm4", "glm4moe")
#: The architectures whose Q and K rows llama.cpp's converter permutes
#: (each head's rotary halves interleaved: LlamaModel's conversion), undone
#: at load.
_PERMUTED = ("llama", "granite", "granitemoe", "smollm3")
#: The architectures whose llama3 RoPE llama.cpp's converter writes as
#: frequency factors (`rope_freqs.weight`) instead of metadata.
_ROPE_FREQS = (*_PERMUTED, "exaone4")
#: The tensor types loaded: the float types, and every GGML format of
#: `etc.packed` (llama.cpp's Q4_K_M, Q5_K_M, Q6_K, Q8_0 and Q4_0 files hold
#: no other).
TENSOR_TYPES = ("F32", "F16", "BF16", *(packed.FORMATS[f].ggml for f in packed.GGML_FORMATS))
#: The packed format of each quantized GGML type.
_PACKED = {packed.FORMATS[f].ggml: f for f in packed.GGML_FORMATS}
#: `tokenizer.ggml.pre` values of byte-level BPE ("gpt2") tokenizers, and the
#: split llama.cpp applies before byte-level BPE for each (a regex, regexes
#: applied in turn (`gguf_pretokenizers`), or "gpt2": GPT-2's own regex, or
#: "smollm": digits apart, then GPT-2's).
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                 r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = gguf_pretokenizers.QWEN2
_GPT4O_SPLIT = gguf_pretokenizers.GPT4O
PRE_TOKENIZERS = {"default": "gpt2", "gpt-2": "gpt2", "gpt2": "gpt2", "smollm": "smollm",
                  "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                  "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt-4o": _GPT4O_SPLIT,
                  # GLM-4's (llama.cpp's CHATGLM4: llama3's split, merges kept).
                  "glm4": _LLAMA3_SPLIT, "command-r": "smollm",
                  **gguf_pretokenizers.PRE_TOKENIZERS}
#: The pre-tokenizers whose BPE takes a word found whole in the vocabulary
#: as one token without merging (llama.cpp's `ignore_merges`: llama3's).
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe")


def is_gguf(path) -> bool:
    """Whether `path` is a file that starts with GGUF's magic."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


class GGUFCheckpoint:
    """The metadata and tensors of one GGUF file (see the module docstring)."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such file")
        if not is_gguf(self.path):
            raise GGUFError(f"{self.path}: not a GGUF file (it does not start with 'GGUF')")
        self._file = GGUFFile(self.path)
        self.metadata: dict = self._file.metadata
        self._tensors = self._file.tensors
        self.architecture = self.metadata.get("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedConfigError(
                f"{self.path}: GGUF architecture {self.architecture!r} (general.architecture) "
                f"is not supported; supported: {', '.join(ARCHITECTURES)}")
        #: The metadata as a Hugging Face config.json would say it.
        self.raw_config = self._hf_config()
        self.config = ModelConfig.from_dict(self.raw_config, f"{self.path} (GGUF metadata)")
        if self.architecture in _ROPE_FREQS and self.config.rope_scaling is None and \
                "rope_freqs.weight" in self._tensors:
            self._check_shape("rope_freqs.weight", (self.config.head_dim // 2,),
                              "RoPE frequency factors")
        families.check_shared_experts(self, {n for _, name, _, _, how in self._plan()
                                             for n in _tensor_names(name, how)})

    # -- metadata ------------------------------------------------------------

    def _key(self, name: str, default=None):
        """Metadata `<architecture>.<name>`."""
        return self.metadata.get(f"{self.architecture}.{name}", default)

    def _per_layer(self, name: str, default=None):
        """A hyper-parameter GGUF may give per layer (an array): one value,
        or an error naming the key when layers differ."""
        value = self._key(name, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise UnsupportedConfigError(
                    f"{self.path}: GGUF metadata {self.architecture}.{name} differs between "
                    f"layers ({value}); ETC's models use one value for every layer")
            value = value[0]
        return value

    def _hf_config(self) -> dict:
        """The Hugging Face config fields of the metadata; checking them is
        left to `ModelConfig.from_dict`, so that a GGUF file is refused for
        exactly what a config.json would be."""
        a = self.architecture
        eps = families.NORM_EPS_KEYS.get(a, "attention.layer_norm_rms_epsilon")
        for name in ("embedding_length", "block_count", "attention.head_count", eps,
                     "context_length"):
            if self._key(name) is None:
                raise UnsupportedConfigError(f"{self.path}: GGUF metadata key '{a}.{name}' is "
                                             f"missing (required for {a})")
        heads = self._per_layer("attention.head_count")
        hidden = self._key("embedding_length")
        config = {
            "architectures": [ARCHITECTURES[a]],
            "hidden_size": hidden,
            "num_hidden_layers": self._key("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self._per_layer("attention.head_count_kv", heads),
            "intermediate_size": self._per_layer("feed_forward_length"),
            "rms_norm_eps": decimal(self._key(eps)),
            "rope_theta": decimal(self._key("rope.freq_base", 10000.0)),
            "max_position_embeddings": self._key("context_length"),
            "tie_word_embeddings": "output.weight" not in self._tensors,
        }
        if a in families.GEMMA_LLAMA_CPP:
            config.update(families.gemma_config(self, config))
        elif a == "phi3":
            config.update(families.phi3_config(self))
        elif a == "smollm3":
            config.update(families.smollm3_config(self))
        else:
            config["hidden_act"] = "silu"
        embedding = self._tensors.get("token_embd.weight")
        vocab = self._key("vocab_size")
        if vocab is None and "tokenizer.ggml.tokens" in self.metadata:
            vocab = len(self.metadata["tokenizer.ggml.tokens"])
        if vocab is None and embedding is not None:
            vocab = int(embedding.shape[0])
        config["vocab_size"] = vocab
        if a == "deepseek2":  # MLA's widths, yarn, experts: its own keys
            config.update(gguf_deepseek.config(self, config))
            return config
        key_length = self._key("attention.key_length")
        value_length = self._key("attention.value_length", key_length)
        if key_length is not None:
            if value_length != key_length:
                raise UnsupportedConfigError(
                    f"{self.path}: GGUF metadata {a}.attention.value_length = {value_length} "
                    f"differs from {a}.attention.key_length = {key_length}; ETC's attention "
                    f"uses one head size for keys and values")
            config["head_dim"] = key_length
        head_dim = key_length or (hidden // heads if hidden and heads else None)
        rope_dims = self._key("rope.dimension_count")
        if rope_dims is not None and head_dim is not None and rope_dims != head_dim:
            if a not in _PARTIAL_ROTARY or not isinstance(rope_dims, int) or \
                    not 0 < rope_dims < head_dim:
                raise UnsupportedConfigError(
                    f"{self.path}: GGUF metadata {a}.rope.dimension_count = {rope_dims} is not "
                    f"the head size {head_dim}: partial rotary embeddings are supported for "
                    f"{', '.join(_PARTIAL_ROTARY)} only (llama.cpp rotates their first n_rot "
                    f"dimensions)")
            # Phi-4-mini, GLM-4, GLM-4.5: RoPE on the first rope_dims of each head.
            config["partial_rotary_factor"] = rope_dims / head_dim
            if int(head_dim * config["partial_rotary_factor"]) != rope_dims:
                raise UnsupportedConfigError(
                    f"{self.path}: GGUF metadata {a}.rope.dimension_count = {rope_dims} of head "
                    f"size {head_dim} is no partial_rotary_factor transformers would read back")
        elif a in ("glm4", "glm4moe"):
            # The whole head, stated (Glm4Config's and Glm4MoeConfig's
            # default is half; llama.cpp's, with no key, the whole head).
            config["partial_rotary_factor"] = 1.0
        if a == "phi3" and "rope_factors_long.weight" in self._tensors:
            config["rope_scaling"] = families.longrope(self, rope_dims or head_dim)
        scaling = self._key("rope.scaling.type")
        if a == "gpt-oss" and scaling == "yarn":
            config["rope_scaling"] = families.yarn(self)
            scaling = None
        elif a == "gpt-oss" and scaling in (None, "none"):
            # Plain RoPE (config.json's default would be yarn).
            config["rope_parameters"] = {"rope_type": "default"}
        if scaling not in (None, "none", "linear"):
            # config.json's yarn (and others) take parameters llama.cpp
            # spells its own way; only linear maps one to one.
            raise UnsupportedConfigError(
                f"{self.path}: GGUF metadata {a}.rope.scaling.type = {scaling!r}: rope_scaling "
                f"of type {scaling!r} is not supported from GGUF (only 'linear')")
        if scaling not in (None, "none"):
            config["rope_scaling"] = {"rope_type": scaling,
                                      "factor": decimal(self._key("rope.scaling.factor"))}
        if a in ("qwen2", "qwen2moe"):
            # Qwen2's q/k/v projections have biases (read with the weights),
            # its output projection none.
            if "blk.0.attn_output.bias" in self._tensors:
                raise UnsupportedConfigError(
                    f"{self.path}: tensor 'blk.0.attn_output.bias' is not supported (Qwen2's "
                    f"output projection has no bias)")
        elif any(f"blk.0.attn_{p}.bias" in self._tensors for p in ("q", "k", "v", "output")):
            config["attention_bias"] = True
        elif a == "glm4":  # (Glm4Config's default is biases)
            config["attention_bias"] = False
        if a == "llama" and self._key("expert_count"):
            config.update(families.mixtral_config(self, config))
        if a in ("granite", "granitemoe"):
            config.update(families.granite_config(self, config))
        if a == "gpt-oss":
            config.update(families.gpt_oss_config(self, config))
        if a in ("qwen3moe", "qwen2moe"):
            config.update(families.qwen3moe_config(self, config))
        if a == "olmo2":
            config.update(families.olmo2_config(self, config))
        if a == "glm4moe":
            config.update(families.glm4moe_config(self, config))
        if a == "olmoe":
            config.update(families.olmoe_config(self))
        if a == "ernie4_5-moe":
            config.update(ernie.gguf_config(self, config))
        if a in gguf_dense.ARCHITECTURES:
            config.update(gguf_dense.config(self, config))
        if a in families.COHERE:
            config.update(families.cohere_config(self, config.pop("rms_norm_eps"), config))
        return config

    # -- tensors -------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def dtypes(self) -> set[str]:
        """The GGML types of the file's tensors ("F32", "Q4_K", ...)."""
        return {t.type for t in self._tensors.values()}

    def default_dtype(self) -> str:
        """The compute dtype `load(dtype=None)` picks: "f32" when any weight
        matrix the step graph reads is in a block format (the packed
        kernels' activations; llama.cpp computes in f32 too); else the float
        storage of those matrices when it is one (all BF16 -> "bf16", all
        F16 -> "f16": nothing widened, nothing rounded), else "f32". See
        docs/models.md, "The compute dtype"."""
        stored = set()
        for _, name, _, _, how in self._plan():
            if how == "flat":  # (a float32 vector stored (1, n): not a weight's storage)
                continue
            for one in _tensor_names(name, how):
                entry = self._tensors.get(one)
                if entry is not None and len(entry.shape) >= 2:
                    stored.add(entry.type)
        if stored in ({"F16"}, {"BF16"}):
            return stored.pop().lower()
        return "f32"

    def _check_shape(self, name: str, shape: tuple, what: str):
        entry = self._tensors.get(name)
        if entry is None:
            raise MissingTensorError(f"{self.path}: tensor {name!r} ({what}) is missing from "
                                     f"the GGUF file")
        stored = entry.shape
        if stored != tuple(shape):
            raise GGUFError(f"{self.path}: tensor {name!r} ({what}) has shape {stored}, "
                            f"expected {tuple(shape)} from the metadata")
        return entry

    def tensor(self, name: str, shape: tuple, what: str) -> np.ndarray:
        """Tensor `name` as a float32 array of `shape` (NumPy order),
        dequantized; errors name the tensor and `what` it is for."""
        entry = self._check_shape(name, shape, what)
        kind = entry.type
        if kind not in TENSOR_TYPES:
            raise GGUFError(f"{self.path}: tensor {name!r} ({what}) has type {kind}, which ETC "
                            f"does not load; supported: {', '.join(TENSOR_TYPES)}")
        raw = self._file.raw(name)
        if kind in _PACKED:
            self._check_blocks(name, what, raw, _PACKED[kind])
        if kind == "F32":
            values = raw.view(np.float32)
        elif kind == "F16":
            values = raw.view(np.float16).astype(np.float32)
        elif kind == "BF16":
            values = bfloat16.from_bits(raw.view(np.uint16))
        else:
            values = packed.dequantize(raw, _PACKED[kind])
        return np.ascontiguousarray(values.reshape(shape), dtype=np.float32)

    def _packed(self, name: str, what: str, dtype: str, heads, part=None) -> np.ndarray:
        """Tensor `name`'s blocks (uint8, rows of bytes), checked; with
        `heads`, Llama's permuted Q or K rows put back in order. `part(raw)`,
        when given, is the share of them to keep and check (a copy of
        mapped blocks lets the file's pages of the tensor go)."""
        kind = self._tensors[name].type
        if _PACKED.get(kind) != dtype:
            raise GGUFError(f"{self.path}: tensor {name!r} ({what}) has type {kind}, not the "
                            f"{dtype} the step kernel was built for")
        if heads is None:
            raw = self._file.raw(name)
            kept = raw if part is None else part(raw)
            if not np.may_share_memory(kept, raw):
                self._file.let_go(name)
        else:
            # Read, not mapped: the reordered copy is the only one resident.
            kept = _unpermute_rows(self._file.read(name), heads)
            kept = kept if part is None else part(kept)
        self._check_blocks(name, what, kept, dtype, share=part is not None)
        return kept

    def _check_blocks(self, name: str, what: str, raw: np.ndarray, dtype: str,
                      share: bool = False) -> None:
        """Raises GGUFError naming the tensor when a block's scale is not
        finite (a damaged file: the whole block would be NaN); `share`:
        `raw` is a rank's share of it (its blocks and rows counted there)."""
        bad = packed.first_bad_block(raw, dtype)
        if bad is not None:
            f = packed.FORMATS[dtype]
            per_row = raw.shape[-1] // f.nbytes
            where = " of this rank's share" if share else ""
            raise GGUFError(f"{self.path}: tensor {name!r} ({what}, {f.ggml}) has a non-finite "
                            f"scale in block {bad % per_row} of row {bad // per_row}{where}: "
                            f"the file is damaged")

    def _plan(self) -> list[tuple]:
        """Every weight of the step graph: (graph input name, GGUF tensor,
        shape, what it is, layout: None, the head count of Llama's permuted
        Q and K rows, "T" for a transposed matrix, "experts" for a MoE
        layer's stack of one projection (E, out, in), "expert_list" for an
        older file's experts of one projection (the name a list of each
        expert's tensor, the shape an expert's), or ("rows", start,
        stop) for a part of a fused matrix, Phi-3's)."""
        c = self.config
        h, d = c.hidden_size, c.head_dim
        plan: list[tuple] = [("embed", "token_embd.weight", (c.vocab_size, h),
                              "token embeddings", None)]
        unpermute = self.architecture in _PERMUTED
        fused = self.architecture == "phi3"
        fused_mlp = fused or self.architecture == "glm4"  # (GLM-4: q, k, v apart)
        for i in range(c.num_layers):
            b = f"blk.{i}."
            q, kv = c.num_heads * d, c.num_kv_heads * d
            if c.input_norms:  # (OLMo 2 has none)
                plan.append((f"l{i}_attn_norm", b + "attn_norm.weight", (h,), f"layer {i} norm",
                             None))
            if c.mla is not None:  # DeepSeek's latent attention, o too
                plan += gguf_deepseek.plan(self, i)
            elif fused:
                # Phi-3: q, k and v in one tensor, split by rows.
                plan += [(key, b + "attn_qkv.weight", (q + 2 * kv, h),
                          f"layer {i} fused q/k/v projection", ("rows", start, stop))
                         for key, start, stop in ((f"l{i}_wq", 0, q), (f"l{i}_wk", q, q + kv),
                                                  (f"l{i}_wv", q + kv, q + 2 * kv))]
            else:
                plan += [
                    (f"l{i}_wq", b + "attn_q.weight", (q, h),
                     f"layer {i} query projection", c.num_heads if unpermute else None),
                    (f"l{i}_wk", b + "attn_k.weight", (kv, h),
                     f"layer {i} key projection", c.num_kv_heads if unpermute else None),
                    (f"l{i}_wv", b + "attn_v.weight", (kv, h),
                     f"layer {i} value projection", None)]
            if c.mla is None:
                plan.append((f"l{i}_wo", b + "attn_output.weight", (h, q),
                             f"layer {i} output projection", None))
            if c.qkv_bias:
                plan += [(f"l{i}_b{p}", f"{b}attn_{p}.bias", (heads * d,),
                          f"layer {i} {p} projection bias", None)
                         for p, heads in (("q", c.num_heads), ("k", c.num_kv_heads),
                                          ("v", c.num_kv_heads))]
            if c.o_bias:
                plan.append((f"l{i}_bo", b + "attn_output.bias", (h,),
                             f"layer {i} o projection bias", None))
            if c.attention_sinks:
                plan.append((f"l{i}_sinks", b + "attn_sinks.weight", (c.num_heads,),
                             f"layer {i} attention sinks", None))
            if c.qk_norm:
                # Per head (d), OLMo 2's over the whole projection, or Command
                # R+'s a weight per head ((heads, d), read as one vector).
                q_size, k_size = (q, kv) if c.qk_norm_projection else (d, d)
                shapes, how = (((c.num_heads, d), (c.num_kv_heads, d)), "flat") \
                    if c.layer_norm else (((q_size,), (k_size,)), None)
                plan += [(f"l{i}_q_norm", b + "attn_q_norm.weight", shapes[0],
                          f"layer {i} q_norm", how),
                         (f"l{i}_k_norm", b + "attn_k_norm.weight", shapes[1],
                          f"layer {i} k_norm", how)]
            if c.sandwich_norms:
                # Gemma, GLM-4: ffn_norm is the pre-feedforward norm (OLMo 2
                # has none); the sublayers' outputs have their own.
                plan += [(f"l{i}_post_attn_norm", b + "post_attention_norm.weight", (h,),
                          f"layer {i} post-attention norm", None)]
                if c.input_norms:
                    plan.append((f"l{i}_mlp_norm", b + "ffn_norm.weight", (h,),
                                 f"layer {i} pre-feedforward norm", None))
                plan.append((f"l{i}_post_mlp_norm", b + "post_ffw_norm.weight", (h,),
                             f"layer {i} post-feedforward norm", None))
            elif not c.parallel_block:  # (Cohere's MLP reads attn_norm's output)
                # (gpt-oss's converter names the MLP's norm by its HF name.)
                norm = "post_attention_norm" if self.architecture in ("gpt-oss", "glm4moe",
                                                                      "seed_oss") else "ffn_norm"
                plan.append((f"l{i}_mlp_norm", f"{b}{norm}.weight", (h,),
                             f"layer {i} post-attention norm", None))
            if c.is_sparse(i) and b + "ffn_gate_exps.weight" not in self._tensors and \
                    b + "ffn_gate.0.weight" in self._tensors:
                e, f = c.num_experts, c.moe_intermediate_size
                # Older llama.cpp files (Mixtral): a tensor per expert,
                # `ffn_{gate,up,down}.<j>`, stacked at load.
                plan.append((f"l{i}_router", b + "ffn_gate_inp.weight", (e, h),
                             f"layer {i} router", "T"))
                plan += [(f"l{i}_experts_{p}", [f"{b}ffn_{p}.{j}.weight" for j in range(e)],
                          shape, f"layer {i} expert {p} projections", "expert_list")
                         for p, shape in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f)))]
            elif c.is_sparse(i):
                e, f = c.num_experts, c.moe_intermediate_size
                # llama.cpp stacks each projection's experts as (E, out, in),
                # as g.moe takes them (transpose_w), float or packed.
                plan += [
                    (f"l{i}_router", b + "ffn_gate_inp.weight", (e, h), f"layer {i} router",
                     "T"),
                    (f"l{i}_experts_gate", b + "ffn_gate_exps.weight", (e, f, h),
                     f"layer {i} expert gate projections", "experts"),
                    (f"l{i}_experts_up", b + "ffn_up_exps.weight", (e, f, h),
                     f"layer {i} expert up projections", "experts"),
                    (f"l{i}_experts_down", b + "ffn_down_exps.weight", (e, h, f),
                     f"layer {i} expert down projections", "experts"),
                ]
                if c.router_bias:
                    plan.append((f"l{i}_router_b", b + "ffn_gate_inp.bias", (e,),
                                 f"layer {i} router bias", None))
                if c.selection_bias:  # GLM-4.5's; ERNIE 4.5's (1, E) `moe_statics`
                    entry = self._tensors.get(b + "exp_probs_b.bias")
                    matrix = entry is not None and len(entry.shape) == 2
                    plan.append((f"l{i}_selection_bias", b + "exp_probs_b.bias",
                                 (1, e) if matrix else (e,), f"layer {i} expert selection bias",
                                 "flat" if matrix else None))
                if c.expert_bias:
                    plan += [(f"l{i}_experts_{p}_b", f"{b}ffn_{p}_exps.bias", (e, width),
                              f"layer {i} expert {p} biases", None)
                             for p, width in (("gate", f), ("up", f), ("down", h))]
                if c.shared_expert_intermediate_size:
                    plan += self._shared_expert(i)
                if b + "ffn_gate_up_exps.weight" in self._tensors:
                    raise GGUFError(f"{self.path}: tensor {b + 'ffn_gate_up_exps.weight'!r} "
                                    f"(gate and up experts fused) is not supported; ETC reads "
                                    f"ffn_gate_exps and ffn_up_exps")
            else:
                f = c.intermediate_size
                if fused_mlp:
                    # Phi-3, GLM-4: gate then up in ffn_up, split by rows.
                    plan += [(key, b + "ffn_up.weight", (2 * f, h), f"layer {i} fused MLP gate/up",
                              ("rows", start, stop))
                             for key, start, stop in ((f"l{i}_w_gate", 0, f),
                                                      (f"l{i}_w_up", f, 2 * f))]
                else:
                    plan += [(f"l{i}_w_gate", b + "ffn_gate.weight", (f, h),
                              f"layer {i} MLP gate", None),
                             (f"l{i}_w_up", b + "ffn_up.weight", (f, h), f"layer {i} MLP up",
                              None)]
                plan.append((f"l{i}_w_down", b + "ffn_down.weight", (h, f),
                             f"layer {i} MLP down", None))
        plan.append(("final_norm", "output_norm.weight", (h,), "final norm", None))
        if not c.tie_word_embeddings:
            plan.append(("lm_head", "output.weight", (c.vocab_size, h), "LM head", None))
        return plan

    def _shared_expert(self, i: int) -> list[tuple]:
        """`_plan`'s entries of sparse layer `i`'s shared expert, as
        llama.cpp names them: `ffn_{gate,up,down}_shexp`, and Qwen2-MoE's
        gate `ffn_gate_inp_shexp`, a vector (h,) (or (1, h)) read as the
        (1, h) matrix the step graph takes (layout "row")."""
        c, b = self.config, f"blk.{i}."
        h, f = c.hidden_size, c.shared_expert_intermediate_size
        plan = [(f"l{i}_shexp_{p}", f"{b}ffn_{p}_shexp.weight", shape,
                 f"layer {i} shared expert {p} projection", None)
                for p, shape in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f)))]
        if c.shared_expert_gate:
            entry = self._tensors.get(b + "ffn_gate_inp_shexp.weight")
            shape = (1, h) if entry is not None and len(entry.shape) == 2 else (h,)
            plan.append((f"l{i}_shexp_gate_inp", b + "ffn_gate_inp_shexp.weight", shape,
                         f"layer {i} shared expert gate", "row"))
        return plan

    def weight_formats(self) -> dict[str, str]:
        """The weights that can stay packed, graph input name -> format of
        `etc.packed`: those stored in a block format that the step graph
        reads by rows (the projections, the embeddings, the LM head, and a
        MoE layer's experts in llama.cpp's (E, out, in) layout, or an older
        file's experts one by one, all of one type, stacked, when all three
        of its stacks are packed; a router is read widened)."""
        formats, experts = {}, {}
        for key, name, shape, _, how in self._plan():
            # (An older file's experts: packed when all are of one type.)
            types = {self._tensors[n].type if n in self._tensors else None
                     for n in _tensor_names(name, how)}
            packed_type = _PACKED.get(types.pop()) if len(types) == 1 else None
            if how in ("experts", "expert_list"):  # a layer's gate, up or down experts
                experts.setdefault(key.split("_experts_")[0], {})[key] = packed_type
            elif how not in ("T", "row", "flat") and packed_type is not None:
                formats[key] = packed_type
        for stacks in experts.values():
            if None not in stacks.values():
                formats.update(stacks)
        for key in partial_rotary.unpacked_keys(self.config) | \
                mla_layout.unpacked_keys(self.config):  # rows scaled or padded at load
            formats.pop(key, None)
        return formats

    def weights(self, progress: Optional[Callable[[int, int], None]] = None,
                formats: Optional[dict] = None,
                shard: Optional[Callable] = None) -> dict[str, np.ndarray]:
        """Every weight the step graph takes, by graph input name (as
        `Checkpoint.weights` names them), float32 and in Hugging Face's
        layouts; `inv_freq` too when the file has Llama 3's RoPE frequency
        factors (`rope_freqs.weight`). The weights named in `formats` (a
        subset of `weight_formats()`) stay packed: their blocks, read in
        place from the file's memory map (Llama's Q and K, whose rows are
        reordered, read into memory; experts in the file's (E, out, in)
        layout). `shard(key, array)`, when given, takes each weight as it
        is read and returns the part to keep (a rank's share of a
        tensor-parallel model): a packed weight's blocks are checked in
        that part only, and the file's pages of a part copied out of the
        map are let go, so that a rank holds its share of the file.
        `progress(done, total)` is called after each tensor."""
        c, d = self.config, self.config.head_dim
        plan = self._plan()
        formats = formats or {}
        # Check every name and shape before the (slow) dequantization.
        for _, name, shape, what, how in plan:
            for one in _tensor_names(name, how):
                self._check_shape(one, shape, what)
        out: dict[str, np.ndarray] = {}
        last = (None, None)  # a fused tensor, dequantized once for its parts
        for done, (key, name, shape, what, how) in enumerate(plan, 1):
            if how == "expert_list":  # an older file's experts, one tensor each
                stack = None
                for j, one in enumerate(name):
                    w = self._packed(one, what, formats[key], None) if key in formats else \
                        self.tensor(one, shape, what)
                    if stack is None:
                        stack = aligned.empty((len(name),) + w.shape, w.dtype)
                    stack[j] = w
                out[key] = stack if shard is None else shard(key, stack)
                if progress is not None:
                    progress(done, len(plan))
                continue
            if key in formats:
                heads = how if isinstance(how, int) else None  # Llama's permuted Q, K
                raw = self._packed(name, what, formats[key], heads, shard and
                                   (lambda raw: shard(key, raw[how[1]:how[2]]
                                                      if isinstance(how, tuple) else raw)))
                # A fused tensor's part: its rows of blocks; partial rotary's
                # q/k rows (whole heads: a rank's share alike) in the step
                # graph's order.
                out[key] = partial_rotary.to_step_layout(
                    c, key, raw[how[1]:how[2]] if isinstance(how, tuple) and not shard else raw,
                    packed=True)
                out[key] = mla_layout.to_step_layout(c, key, out[key], packed=True)
                if progress is not None:
                    progress(done, len(plan))
                continue
            array = last[1] if last[0] == name else self.tensor(name, shape, what)
            last = (name, array)
            if c.norm_offset and name.endswith("norm.weight"):
                # llama.cpp's converter stores Gemma's norms as 1 + w.
                array = array - np.float32(c.norm_offset)
            if isinstance(how, tuple):  # ("rows", start, stop) of a fused tensor
                array = np.ascontiguousarray(array[how[1]:how[2]])
            elif how == "T":
                array = np.ascontiguousarray(np.swapaxes(array, -1, -2))
            elif how in ("row", "flat"):
                array = array.reshape(1, -1) if how == "row" else array.reshape(-1)
            elif isinstance(how, int):
                array = _unpermute_rows(array, how)
            elif how in ("heads", "heads_T"):  # DeepSeek's k_b (transposed) and v_b, per head
                per_head = np.swapaxes(array, -1, -2) if how == "heads_T" else array
                array = np.ascontiguousarray(per_head).reshape(-1, per_head.shape[-1])
            array = partial_rotary.to_step_layout(c, key, array)
            array = mla_layout.to_step_layout(c, key, array)
            out[key] = array if shard is None else shard(key, array)
            if progress is not None:
                progress(done, len(plan))
        if self.architecture in _ROPE_FREQS and c.rope_scaling is None and \
                "rope_freqs.weight" in self._tensors:
            # llama.cpp's converter stores Llama 3's frequency scaling as
            # per-frequency divisors instead of rope_scaling metadata.
            factors = self.tensor("rope_freqs.weight", (d // 2,), "RoPE frequency factors")
            out["inv_freq"] = (c.rope_inv_freq() / factors).astype(np.float32)
        return out

    # -- tokenizer -----------------------------------------------------------

    def _token(self, key: str) -> Optional[str]:
        """The text of the token whose id metadata `key` holds, or None."""
        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        index = self.metadata.get(key)
        if index is None or not 0 <= index < len(tokens):
            return None
        return tokens[index]

    def eos_token_ids(self) -> list[int]:
        """The ids that end a sequence: `tokenizer.ggml.eos_token_id`, and
        the end-of-turn and end-of-message ids where the file names them."""
        ids = []
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                    "tokenizer.ggml.eom_token_id"):
            value = self.metadata.get(key)
            if value is not None and value not in ids:
                ids.append(int(value))
        return ids

    @property
    def chat_template(self) -> Optional[str]:
        """`tokenizer.chat_template`, or None."""
        return self.metadata.get("tokenizer.chat_template")

    def tokenizer(self):
        """The file's tokenizer and chat template as an
        `etc.models.loading.tokenizer.Tokenizer` (see `tokenizer_backend`), or None
        when the file has no tokenizer."""
        if "tokenizer.ggml.model" not in self.metadata:
            return None
        from .tokenizer import Tokenizer

        return Tokenizer(self.tokenizer_backend(), chat_template=self.chat_template,
                         bos_token=self._token("tokenizer.ggml.bos_token_id"),
                         eos_token=self._token("tokenizer.ggml.eos_token_id"),
                         add_bos_token=bool(self.metadata.get("tokenizer.ggml.add_bos_token",
                                                              False)),
                         add_eos_token=bool(self.metadata.get("tokenizer.ggml.add_eos_token",
                                                              False)))

    def _sentencepiece(self):
        """The file's SentencePiece BPE tokenizer (`spm.spm_backend`)."""
        from .spm import spm_backend

        pieces, scores, types = _sentencepiece_tokens(self.metadata, self.path)
        unknown = self._token("tokenizer.ggml.unknown_token_id")
        return spm_backend(pieces, scores, types, unknown=unknown, add_space_prefix=bool(
            self.metadata.get("tokenizer.ggml.add_space_prefix", True)))

    def tokenizer_backend(self):
        """The file's tokenizer as a `tokenizers.Tokenizer`: byte-level BPE
        (`tokenizer.ggml.model` = "gpt2") with the split that
        `tokenizer.ggml.pre` names, or SentencePiece BPE ("llama": Gemma,
        Phi-3, Mistral; `spm`); control tokens are special tokens and
        user-defined tokens added tokens, as llama.cpp treats them. Other
        tokenizer models raise `GGUFError` naming them."""
        model = self.metadata.get("tokenizer.ggml.model")
        if model is None:
            raise GGUFError(f"{self.path}: the GGUF file has no tokenizer "
                            f"(tokenizer.ggml.model is missing)")
        if model == "llama":
            return self._sentencepiece()
        if model != "gpt2":
            raise GGUFError(f"{self.path}: tokenizer.ggml.model = {model!r} is not supported; "
                            f"supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE)")
        pre = self.metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise GGUFError(f"{self.path}: tokenizer.ggml.pre = {pre!r} is not supported; "
                            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        from .spm import add_typed_tokens

        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        merges = self.metadata.get("tokenizer.ggml.merges") or []
        types = self.metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if len(types) != len(tokens):
            raise GGUFError(f"{self.path}: tokenizer.ggml.token_type has {len(types)} entries "
                            f"for {len(tokens)} tokens")
        vocab = {}
        for index, token in enumerate(tokens):
            vocab.setdefault(token, index)
        pairs = []
        for merge in merges:
            parts = merge.split(" ")
            if len(parts) != 2:
                raise GGUFError(f"{self.path}: tokenizer.ggml.merges entry {merge!r} is not two "
                                f"tokens separated by a space")
            pairs.append((parts[0], parts[1]))
        split = PRE_TOKENIZERS[pre]
        backend = Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _IGNORE_MERGES))
        if split == "gpt2":
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=True)
        elif split == "smollm":
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        else:
            backend.pre_tokenizer = gguf_pretokenizers.regex_splits(split)
        backend.decoder = decoders.ByteLevel()
        add_typed_tokens(backend, tokens, types)
        return backend


def _sentencepiece_tokens(metadata: dict, path) -> tuple[list, list, list]:
    """The pieces, scores and token types of a "llama" tokenizer, checked."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    scores = metadata.get("tokenizer.ggml.scores")
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if scores is None:
        raise GGUFError(f"{path}: tokenizer.ggml.scores is missing (a SentencePiece "
                        f"tokenizer's merges follow its pieces' scores)")
    for key, values in (("scores", scores), ("token_type", types)):
        if len(values) != len(tokens):
            raise GGUFError(f"{path}: tokenizer.ggml.{key} has {len(values)} entries for "
                            f"{len(tokens)} tokens")
    return tokens, [float(x) for x in scores], [int(t) for t in types]


def _unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's permutation of a Llama Q or K projection's rows:
    its converter reorders each head's rows from Hugging Face's
    (first halves, second halves) rotary layout to interleaved pairs,
    `w.reshape(heads, 2, d / 2, in).swapaxes(1, 2)`; this is the inverse."""
    rows = weight.shape[0]
    restored = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(restored.reshape(weight.shape))


def _tensor_names(name, how) -> list:
    """The GGUF tensors of a `_plan` entry: `name`, or the list of an
    older file's experts ("expert_list")."""
    return name if how == "expert_list" else [name]
