"""The GGUF writer of the tests: `write_gguf` writes a tiny checkpoint of
`checkpoints` (or given tensors) as one GGUF file the way llama.cpp's
converter lays it out (the `gguf` package's keys and tensor names, Llama's
Q and K rows permuted, experts stacked, K-quants packed by `etc.packed`),
with `gguf_tensor_name` for the names. Re-exported by `etc.models.testing`."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Optional

import numpy as np

from . import deepseek, dense
from .checkpoints import checkpoint_tensors, tiny_config

__all__ = ["write_gguf", "gguf_tensor_name"]


# llama.cpp's converter writes Mistral as llama (without its window).
_GGUF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
                       "MixtralForCausalLM": "llama",
                       "Qwen2ForCausalLM": "qwen2",
                       "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe",
                       "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
                       "Phi3ForCausalLM": "phi3", "SmolLM3ForCausalLM": "smollm3",
                       "GraniteForCausalLM": "granite", "GraniteMoeForCausalLM": "granitemoe",
                       "GptOssForCausalLM": "gpt-oss", "Qwen2MoeForCausalLM": "qwen2moe",
                       # (the converter's GraniteMoeModel writes both)
                       "GraniteMoeSharedForCausalLM": "granitemoe",
                       "Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo2",
                       "OlmoeForCausalLM": "olmoe", "Glm4ForCausalLM": "glm4",
                       "Glm4MoeForCausalLM": "glm4moe",
                       "Ernie4_5ForCausalLM": "ernie4_5", "Ernie4_5_MoeForCausalLM": "ernie4_5-moe",
                       "DeepseekV2ForCausalLM": "deepseek2", "DeepseekV3ForCausalLM": "deepseek2",
                       "CohereForCausalLM": "command-r", "Cohere2ForCausalLM": "cohere2",
                       **dense.GGUF_ARCHITECTURES}
#: The GGUF architectures whose Q and K rows llama.cpp's converter permutes
#: (its LlamaModel's, rotated in pairs by llama.cpp's NORM RoPE).
_PERMUTED = ("llama", "granite", "granitemoe", "smollm3")


def gguf_tensor_name(architecture: str, name: str, layers: int) -> str:
    """The GGUF name of Hugging Face tensor `name` (an expert's stacked as
    `model.layers.<i>.mlp.experts.<proj>.weight`, as llama.cpp's converter
    merges them) in a file of GGUF `architecture`, from the `gguf`
    package's own name map (`gguf.tensor_mapping`). llama.cpp's qwen3moe
    has no dense MLP layers: those of a Qwen3-MoE with `mlp_only_layers`
    take llama's names, as ETC reads them."""
    for arch in (architecture, "llama"):
        found = _gguf_name_map(arch, layers).get_name(name, try_suffixes=(".weight", ".bias"))
        if found is not None:
            return found
    raise KeyError(f"gguf's name map has no GGUF name for {name!r} in {architecture}")


@functools.lru_cache(maxsize=16)
def _gguf_name_map(architecture: str, layers: int):
    """gguf's name map of an architecture, made once (it formats every name
    of every layer: 16 ms at 62 layers, once per tensor before)."""
    import gguf

    kind = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == architecture)
    return gguf.get_tensor_name_map(kind, layers)


def write_gguf(path, config: Optional[dict] = None, *, seed: int = 0, tensor_type: str = "F32",
               fallback_type: str = "F32", tensors: Optional[dict] = None, tokenizer=None,
               pre: str = "qwen2",
               chat_template: Optional[str] = None, eos_token: Optional[str] = None,
               bos_token: Optional[str] = None, add_bos_token: bool = False,
               rope_freqs: Optional[np.ndarray] = None, drop: tuple = (),
               metadata: Optional[dict] = None, raw_tensors: Optional[dict] = None,
               tensor_types: Optional[dict] = None, legacy_experts: bool = False,
               legacy_kv_b: bool = False) -> Path:
    """Writes the checkpoint `write_checkpoint(config, seed=seed)` writes (or
    `tensors`, under Hugging Face's names) as one GGUF file at `path`, as
    llama.cpp's converter lays it out: the `gguf` package's metadata keys
    (`GGUFWriter`) and tensor names (`gguf_tensor_name`), Llama's Q and K
    rows permuted, experts stacked (E, out, in).

    `tensor_type` ("F32", "F16", "BF16", or a packed format of
    `etc.packed`: "Q8_0", "Q4_K", ...) is that of every matrix whose rows
    split into whole blocks; the others take `fallback_type` where their
    rows split into its blocks (as llama.cpp's quantizer falls back, e.g.
    Q4_K to Q5_0), else stay F32, as the norms do. Formats the gguf
    package cannot write (the K-quants, IQ4_NL) are packed by
    `etc.packed.quantize`; it writes MXFP4 (as ggml's reference quantizer,
    which `etc.packed.quantize` equals byte for byte): an MXFP4_MOE file
    is `tensor_type="Q8_0"` with `tensor_types` naming the expert stacks
    (`blk.<i>.ffn_{gate,up,down}_exps.weight`) "MXFP4". `tensor_types` (GGUF name -> type) overrides
    `tensor_type` for the tensors it names. `tokenizer` (a
    `tokenizers.Tokenizer` with a byte-level BPE model) goes into the
    metadata as a "gpt2" tokenizer with `pre`-tokenizer name `pre`, its
    special added tokens as control tokens; `eos_token`, `bos_token` name
    tokens of it. `rope_freqs` is written as `rope_freqs.weight` (Llama 3's
    frequency factors). `metadata` adds or replaces keys (None removes
    one); names in `drop` (GGUF names) are left out. `raw_tensors` adds
    tensors as stored bytes: GGUF name -> (uint8 array (rows, bytes per
    row), GGML type name). `legacy_experts`: each expert's projections as
    their own tensors, `blk.<i>.ffn_{gate,up,down}.<j>.weight`, as llama.cpp
    wrote Mixtral before it merged them. `legacy_kv_b`: DeepSeek's
    kv_b_proj whole (`attn_kv_b`), one KV head per head, as older
    converters wrote `deepseek2` (`deepseek.gguf_tensors`)."""
    import gguf

    config = config or tiny_config()
    architecture = _GGUF_ARCHITECTURES[config["architectures"][0]]
    gemma = architecture in ("gemma2", "gemma3")
    tensors = tensors if tensors is not None else checkpoint_tensors(config, seed)
    if architecture == "deepseek2":
        tensors = deepseek.gguf_tensors(config, tensors, legacy_kv_b)
    h = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    from ... import packed

    def quantized(array, kind):
        """`array` as GGUF tensor data of type `kind`, or None when its rows
        are not whole blocks of it."""
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32" or array.ndim < 2 or array.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
            return None
        if kind == "F16":
            return array.astype(np.float16), None
        try:
            return gguf.quants.quantize(array, qtype), qtype
        except NotImplementedError:
            return packed.quantize(array, kind.lower()), qtype

    def permute(w, n):
        # llama.cpp's converter: each head's rotary halves interleaved.
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
            w.shape)

    layers = config["num_hidden_layers"]
    # GLM-4.5's multi-token-prediction layers follow the decoder's: llama.cpp
    # counts them in block_count.
    nextn = config.get("num_nextn_predict_layers", 0) if architecture == "glm4moe" else 0
    out: dict = {}
    gpt_oss = architecture == "gpt-oss"
    for name, array in tensors.items():
        if ".experts." in name or name.startswith("model.mtp_"):
            continue  # stacked below; (ERNIE 4.5's multi-token prediction: not converted)
        if gpt_oss and name.endswith(".sinks"):
            name += ".weight"  # (llama.cpp's converter adds it)
        if architecture in _PERMUTED and name.endswith("self_attn.q_proj.weight"):
            array = permute(array, heads)
        elif architecture in _PERMUTED and name.endswith("self_attn.k_proj.weight"):
            array = permute(array, kv_heads)
        if name.endswith("block_sparse_moe.input_linear.weight"):
            # Granite MoE: the converter splits the fused experts, gate rows
            # then up rows.
            i, f = name.split(".")[2], array.shape[1] // 2
            out[f"blk.{i}.ffn_gate_exps.weight"] = array[:, :f]
            out[f"blk.{i}.ffn_up_exps.weight"] = array[:, f:]
            continue
        if name.endswith("shared_mlp.input_linear.weight"):
            # GraniteMoeShared: the shared MLP split too.
            i, f = name.split(".")[2], array.shape[0] // 2
            out[f"blk.{i}.ffn_gate_shexp.weight"] = array[:f]
            out[f"blk.{i}.ffn_up_shexp.weight"] = array[f:]
            continue
        if name.endswith("mlp.shared_expert_gate.weight"):
            # Qwen2-MoE's shared expert gate (1, h), a vector as llama.cpp
            # creates it ({n_embd}).
            array = array.reshape(-1)
        if name.endswith(".e_score_correction_bias"):
            # (the converter's map names `e_score_correction`; it adds ".bias")
            out[gguf_tensor_name(architecture, name[:-5], layers) + ".bias"] = array
            continue
        out[gguf_tensor_name(architecture, name, layers + nextn)] = array
    if gemma:
        # llama.cpp's converter stores Gemma's norms as 1 + w.
        out = {name: array + np.float32(1.0) if name.endswith("norm.weight") else array
               for name, array in out.items()}
    mixtral = config["architectures"][0] == "MixtralForCausalLM"
    if architecture in ("qwen3moe", "qwen2moe", "glm4moe", "olmoe", "ernie4_5-moe",
                        "deepseek2") or mixtral:
        p, projs, experts = ("block_sparse_moe.experts.", ("w1", "w3", "w2"),
                             config["num_local_experts"]) if mixtral else \
            ("mlp.experts.", ("gate_proj", "up_proj", "down_proj"),
             config.get("num_experts") or config.get("n_routed_experts") or
             config.get("moe_num_experts"))
        for i in range(layers):
            p_i = f"model.layers.{i}.{p}"
            if f"{p_i}0.{projs[0]}.weight" not in tensors:
                continue
            for proj, legacy in zip(projs, ("gate", "up", "down")):
                if legacy_experts:
                    # Older llama.cpp files: one tensor per expert.
                    for j in range(experts):
                        out[f"blk.{i}.ffn_{legacy}.{j}.weight"] = tensors[f"{p_i}{j}.{proj}.weight"]
                    continue
                stacked = gguf_tensor_name(architecture, f"{p_i}{proj}.weight", layers)
                out[stacked] = np.stack([tensors[f"{p_i}{j}.{proj}.weight"]
                                         for j in range(experts)])
    if gpt_oss:
        # llama.cpp's converter: gate_up (E, in, 2 f) split into its even
        # (gate) and odd (up) columns, every stack turned (E, out, in).
        for i in range(layers):
            p_i = f"model.layers.{i}.mlp.experts."
            gate_up, bias = tensors[p_i + "gate_up_proj"], tensors[p_i + "gate_up_proj_bias"]
            for proj, parity in (("gate", 0), ("up", 1)):
                out[f"blk.{i}.ffn_{proj}_exps.weight"] = np.ascontiguousarray(
                    gate_up[:, :, parity::2].swapaxes(-1, -2))
                out[f"blk.{i}.ffn_{proj}_exps.bias"] = np.ascontiguousarray(bias[:, parity::2])
            out[f"blk.{i}.ffn_down_exps.weight"] = np.ascontiguousarray(
                tensors[p_i + "down_proj"].swapaxes(-1, -2))
            out[f"blk.{i}.ffn_down_exps.bias"] = tensors[p_i + "down_proj_bias"]
    if rope_freqs is not None:
        out["rope_freqs.weight"] = np.asarray(rope_freqs, np.float32)

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config["num_hidden_layers"] + nextn)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    # llama.cpp's converter: Phi-3's rotated dimensions, int(factor x
    # hidden) // heads; GLM-4's and GLM-4.5's int(head_dim x factor) (0.5 by
    # default).
    rotated = int(config.get("partial_rotary_factor", 1.0) * h) // heads \
        if architecture == "phi3" else \
        int(head_dim * config.get("partial_rotary_factor", 0.5)) \
        if architecture in ("glm4", "glm4moe") else head_dim
    writer.add_rope_dimension_count(rotated)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    if architecture in ("command-r", "cohere2"):
        _add_cohere_keys(writer, config)
    else:
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    if architecture == "phi3":
        # llama.cpp's converter: the window (0: none) and the original context.
        writer.add_sliding_window(config.get("sliding_window") or 0)
        writer.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings",
                                                        config["max_position_embeddings"]))
        if scaling.get("rope_type", scaling.get("type")) in ("longrope", "su"):
            # LongRoPE: both sets of factors as tensors, and the attention
            # factor transformers derives from the context's scale.
            original = config.get("original_max_position_embeddings", 4096)
            scale = config["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
            for kind in ("long", "short"):
                out[f"rope_factors_{kind}.weight"] = np.asarray(scaling[f"{kind}_factor"],
                                                                np.float32)
    if architecture == "olmo2" and config.get("sliding_window") is not None:
        # OLMo 3, as llama.cpp's converter writes it: the window and a flag
        # per layer.
        writer.add_sliding_window(config["sliding_window"])
        writer.add_sliding_window_pattern([t == "sliding_attention"
                                           for t in config["layer_types"]])
    if gemma:
        # What llama.cpp's converter writes; it fixes the layer pattern, the
        # sliding layers' RoPE base and the attention scale itself.
        writer.add_sliding_window(config.get("sliding_window", 4096))
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if config.get(key) is not None:
                getattr(writer, f"add_{key}")(config[key])
    if gpt_oss:
        # What llama.cpp's converter writes (the window; yarn's factor and
        # original context; it fixes the layer pattern and the clamp).
        writer.add_sliding_window(config["sliding_window"])
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["intermediate_size"])
        if scaling.get("rope_type") == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(scaling["factor"])
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if architecture in ("qwen3moe", "qwen2moe", "olmoe") or mixtral:
        # (llama.cpp's converter: Mixtral is llama with experts, each of
        # feed_forward_length, softmax weights renormalised over the chosen;
        # OLMoE's of feed_forward_length too, never renormalised.)
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if architecture == "qwen3moe":
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_weights_norm(bool(config.get("norm_topk_prob", False)))
    if architecture == "qwen2moe":
        # (llama.cpp's qwen2moe never renormalises: no key for it.)
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if architecture in ("granite", "granitemoe"):
        _add_granite_keys(writer, config)
    if architecture == "glm4moe":
        _add_glm4moe_keys(writer, config, nextn)
    if architecture == "ernie4_5-moe":
        _add_ernie_moe_keys(writer, config)
    if config["architectures"][0] in dense.ARCHITECTURES:
        dense.gguf_extras(writer, config, out)
    if architecture == "deepseek2":
        deepseek.add_gguf_keys(writer, config, legacy_kv_b)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer, pre, eos_token, bos_token, add_bos_token)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for key, value in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)
        if value is not None:
            _add_value(writer, key, value)
    for name, array in out.items():
        if name in drop:
            continue
        array = np.asarray(array, np.float32)
        kind = (tensor_types or {}).get(name, tensor_type)
        # (llama.cpp quantizes weights only: gpt-oss's (E, f) biases stay F32.)
        data = None if name.endswith(".bias") else \
            quantized(array, kind) or quantized(array, fallback_type)
        if data is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, data[0], raw_dtype=data[1])
    for name, (raw, kind) in (raw_tensors or {}).items():
        writer.add_tensor(name, np.asarray(raw, np.uint8),
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _add_granite_keys(writer, config: dict) -> None:
    """Granite's keys as llama.cpp's converter writes them: the four
    multipliers (each only when config.json has it), and Granite MoE's
    expert counts (its experts of `feed_forward_length`)."""
    for field, add in (("embedding_multiplier", writer.add_embedding_scale),
                       ("residual_multiplier", writer.add_residual_scale),
                       ("logits_scaling", writer.add_logit_scale),
                       ("attention_multiplier", writer.add_attention_scale)):
        if config.get(field) is not None:
            add(config[field])
    if config["architectures"][0] in ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"):
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if config.get("shared_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])


def _add_cohere_keys(writer, config: dict) -> None:
    """Cohere's keys as llama.cpp's converter writes them: the LayerNorms'
    epsilon, the logit scale, no RoPE scaling; Cohere2's window (llama.cpp
    fixes its layer pattern)."""
    import gguf

    writer.add_layer_norm_eps(config.get("layer_norm_eps", 1e-5))
    writer.add_logit_scale(config.get("logit_scale", 0.0625))
    writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if config["architectures"][0] == "Cohere2ForCausalLM":
        writer.add_sliding_window(config.get("sliding_window", 4096))


def _add_glm4moe_keys(writer, config: dict, nextn: int) -> None:
    """GLM-4.5's keys as llama.cpp's converter writes them (the expert
    groups only where config.json has more than one)."""
    import gguf

    writer.add_leading_dense_block_count(config.get("first_k_dense_replace", 1))
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_shared_count(config.get("n_shared_experts", 1))
    writer.add_expert_weights_scale(config.get("routed_scaling_factor", 1.0))
    writer.add_expert_weights_norm(bool(config.get("norm_topk_prob", True)))
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_nextn_predict_layers(nextn)
    if config.get("n_group", 1) > 1:
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])


def _add_ernie_moe_keys(writer, config: dict) -> None:
    """ERNIE 4.5 MoE's keys as llama.cpp's converter writes them: the
    shared expert's width as intermediate_size / num_key_value_heads (its
    formula: right for the published 21B-A3B, whose 12288 / 4 is its two
    shared experts of 1536; a tiny config must be shaped alike for
    llama.cpp to load the file), no end index of the MoE layers."""
    writer.add_expert_count(config["moe_num_experts"])
    writer.add_expert_used_count(config["moe_k"])
    writer.add_interleave_moe_layer_step(config.get("moe_layer_interval", 1))
    writer.add_leading_dense_block_count(config.get("moe_layer_start_index", 1))
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    shared = config.get("moe_num_shared_experts", 2)
    writer.add_expert_shared_count(shared)
    if shared:
        writer.add_expert_shared_feed_forward_length(
            config["intermediate_size"] // config["num_key_value_heads"])


def _add_value(writer, key: str, value) -> None:
    """Metadata `key` = `value` with the GGUF type Python's type implies."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise TypeError(f"write_gguf: metadata {key!r} = {value!r}: unsupported type "
                        f"{type(value).__name__}")


def _add_tokenizer(writer, tokenizer, pre: str, eos_token, bos_token, add_bos_token) -> None:
    """A byte-level BPE `tokenizers.Tokenizer` as llama.cpp's "gpt2"
    tokenizer metadata: tokens by id, merges as "a b", token types."""
    import json as _json

    import gguf

    model = _json.loads(tokenizer.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"write_gguf: the tokenizer's model is {model.get('type')!r}, not BPE")
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        tokens[index] = token
    added = tokenizer.get_added_tokens_decoder()
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    for index, token in added.items():
        types[index] = int(gguf.TokenType.CONTROL if token.special
                           else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if eos_token is not None:
        writer.add_eos_token_id(vocab[eos_token])
    if bos_token is not None:
        writer.add_bos_token_id(vocab[bos_token])
    writer.add_add_bos_token(add_bos_token)
