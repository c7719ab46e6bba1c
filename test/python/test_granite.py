"""IBM Granite 3.x (GraniteForCausalLM) and Granite MoE
(GraniteMoeForCausalLM): Llama's layers with four scalar multipliers
(embeddings, attention scale, residual branches, logits), Granite MoE's
fused experts and its router. What is specific to them: their configs and
refusals, that each multiplier matters at the tiny configs' values, the
router's equality with ETC's renormalised top-k, the fused experts' halves,
the logits scaling reaching the on-device log-probabilities, and their
GGUF files (`granite`, `granitemoe`) against llama.cpp itself. The rest
(teacher forcing, paged, chunked, batched, static schedule, CUDA lanes,
half precision, transformers' goldens, GGUF Q8_0 packed, tensor parallel)
is test_families.py's, parametrised over them."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.testing import (GRANITE_MULTIPLIERS, as_transformers5, checkpoint_tensors,
                                tiny_config, write_checkpoint, write_gguf)

import hf_goldens_families as goldens

DENSE, MOE = "GraniteForCausalLM", "GraniteMoeForCausalLM"
SEQUENCE = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 3, 40, 2]


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


@pytest.mark.parametrize("architecture", [DENSE, MOE])
def test_granite_configs_follow_transformers(architecture):
    """The multipliers in both config styles; the attention multiplier is
    the attention scale itself; transformers' defaults when the fields are
    absent (1.0 each: the attention scale 1, not 1 / sqrt(head_dim)) and an
    untied head when tie_word_embeddings is; Granite MoE's experts in every
    layer, their weights renormalised over the chosen ones."""
    raw = tiny_config(architecture)
    config = ModelConfig.from_dict(raw)
    assert config == ModelConfig.from_dict(as_transformers5(raw))
    assert (config.embedding_multiplier, config.attention_multiplier,
            config.residual_multiplier, config.logits_scaling) == (4.0, 0.6, 2.2, 0.5)
    assert config.attention_scale == config.attention_scale_of(1) == 0.6
    assert config.tie_word_embeddings
    bare = {k: v for k, v in raw.items()
            if k not in (*GRANITE_MULTIPLIERS, "tie_word_embeddings")}
    default = ModelConfig.from_dict(bare)
    assert (default.embedding_multiplier, default.residual_multiplier,
            default.logits_scaling) == (None, None, None)
    assert default.attention_scale == 1.0 and not default.tie_word_embeddings
    # 1.0 written out is the default (no task), null too.
    assert ModelConfig.from_dict({**bare, "embedding_multiplier": 1.0,
                                  "logits_scaling": None}) == default
    if architecture == MOE:
        assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.intermediate_size) == (4, 2, 32, 0)
        assert config.sparse_layers == (0, 1) and config.norm_topk_prob


#: Granite 3.x 8B's config.json (3.1 to 3.3), every field as published.
GRANITE_8B = {
    "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0,
    "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12800, "logits_scaling": 16.0, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "granite", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.49.0", "use_cache": True, "vocab_size": 49159}


def test_published_granite_config_reads():
    """Granite 3.x 8B's own config.json: read whole (no field refused), its
    attention scale 1/128 (not 1 / sqrt(128)), and the same config as
    `SHAPES["granite-3.3-8b"]` (test_model_ptx.py's real-width graph)."""
    from etc.models.testing import shaped_config

    config = ModelConfig.from_dict(GRANITE_8B)
    assert (config.head_dim, config.num_kv_heads, config.attention_scale) == (128, 8, 1 / 128)
    assert (config.embedding_multiplier, config.residual_multiplier, config.logits_scaling) == \
        (12.0, 0.22, 16.0)
    assert config.tie_word_embeddings and config.rope_theta == 1e7
    assert ModelConfig.from_dict(shaped_config("granite-3.3-8b", layers=40)) == config


@pytest.mark.parametrize("field", list(GRANITE_MULTIPLIERS))
@pytest.mark.parametrize("value", [0, -1.5, "2", True, math.inf, math.nan])
def test_granite_refuses_a_multiplier_that_is_not_a_positive_number(field, value):
    with pytest.raises(UnsupportedConfigError,
                       match=rf"field '{field}' = .* must be a finite positive number"):
        ModelConfig.from_dict(tiny_config(DENSE, **{field: value}))


def test_granite_refusals_name_the_architecture_and_why():
    """Granite 4 (hybrid Mamba) is refused by name, saying why
    (GraniteMoeShared is test_shared_moe.py's); a Granite MoE config
    without its experts names the field; Granite's projections have no
    biases."""
    with pytest.raises(UnsupportedConfigError,
                       match=r"'GraniteMoeHybridForCausalLM' is not supported \(Granite 4: "
                             r"hybrid Mamba-2"):
        ModelConfig.from_dict(tiny_config(DENSE, architectures=["GraniteMoeHybridForCausalLM"]))
    no_experts = {k: v for k, v in tiny_config(MOE).items() if k != "num_local_experts"}
    with pytest.raises(UnsupportedConfigError, match=r"field 'num_local_experts' is missing "
                                                     r"\(required for GraniteMoeForCausalLM\)"):
        ModelConfig.from_dict(no_experts)
    with pytest.raises(UnsupportedConfigError, match=r"field 'attention_bias' = True"):
        ModelConfig.from_dict(tiny_config(DENSE, attention_bias=True))


# ----------------------------------------------------------------------
# Numerics
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    """Each architecture's tiny checkpoint (the goldens' seeds)."""
    root = tmp_path_factory.mktemp("granite")
    return {a: Checkpoint(write_checkpoint(root / a, tiny_config(a),
                                           seed=goldens.SEEDS["granite" if a == DENSE
                                                              else "granite_moe"]))
            for a in (DENSE, MOE)}


@pytest.mark.parametrize("architecture", [DENSE, MOE])
def test_granite_multipliers_matter(architecture, granite):
    """At the tiny configs' values, dropping any one multiplier moves the
    logits by more than bf16's tolerance against transformers (so the
    goldens catch a model that forgets one), and a model that multiplies
    the logits by logits_scaling instead of dividing misses too."""
    checkpoint = granite[architecture]
    c, weights = checkpoint.config, checkpoint.weights()
    base = reference.forward(c, weights, SEQUENCE)
    rms = np.sqrt(np.mean(np.square(base), axis=-1, keepdims=True))
    tol = goldens.tolerance(tiny_config(architecture), "bf16")

    def miss(config):
        return float((np.abs(reference.forward(config, weights, SEQUENCE) - base) / rms).max())

    for field in GRANITE_MULTIPLIERS:
        assert miss(dataclasses.replace(c, **{field: None})) > tol, field
    assert miss(dataclasses.replace(c, logits_scaling=1 / c.logits_scaling)) > tol


def test_granite_moe_router_is_etcs_renormalised_top_k():
    """transformers' GraniteMoeTopKRouter (top-k of the logits, softmax over
    those k) gives the weights of ETC's MoE layer with `normalize`
    (Mixtral's and Qwen3-MoE's: softmax over every expert, top-k,
    renormalised), which Granite MoE's config selects: the NumPy forward
    pass uses it, and reading without the renormalisation changes the
    logits."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 8)).astype(np.float32) * 3
    k = 2
    chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, chosen, axis=-1)
    granite = np.exp(top - top.max(-1, keepdims=True))
    granite /= granite.sum(-1, keepdims=True)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    etc_weights = np.take_along_axis(probs, chosen, axis=-1)
    etc_weights /= etc_weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(granite, etc_weights, rtol=1e-6)
    assert ModelConfig.from_dict(tiny_config(MOE)).norm_topk_prob


def test_granite_moe_fused_experts_are_gate_rows_then_up_rows(granite):
    """`block_sparse_moe.input_linear` (E, 2f, h) holds each expert's gate
    rows then its up rows (transformers' chunk(2)), `output_linear` (E, h, f)
    its down projection, `router.layer` (E, h) the router: read as such, and
    the halves swapped give other logits."""
    checkpoint = granite[MOE]
    c, weights = checkpoint.config, checkpoint.weights()
    raw = checkpoint_tensors(tiny_config(MOE), goldens.SEEDS["granite_moe"])
    f = c.moe_intermediate_size
    for i in range(c.num_layers):
        p = f"model.layers.{i}.block_sparse_moe."
        fused = raw[p + "input_linear.weight"]
        np.testing.assert_array_equal(weights[f"l{i}_experts_gate"], fused[:, :f])
        np.testing.assert_array_equal(weights[f"l{i}_experts_up"], fused[:, f:])
        np.testing.assert_array_equal(weights[f"l{i}_experts_down"],
                                      raw[p + "output_linear.weight"])
        np.testing.assert_array_equal(weights[f"l{i}_router"], raw[p + "router.layer.weight"].T)
    swapped = {**weights, "l0_experts_gate": weights["l0_experts_up"],
               "l0_experts_up": weights["l0_experts_gate"]}
    assert np.abs(reference.forward(c, swapped, SEQUENCE) -
                  reference.forward(c, weights, SEQUENCE)).max() > 0.1


def test_granite_moe_reads_transformers5_in_memory_names(granite, tmp_path):
    """A Granite MoE checkpoint saved by transformers 5 with
    `save_original_format=False` (its in-memory names: `router.weight`,
    `experts.gate_up_proj`, `experts.down_proj`) reads as the original
    layout; a missing stack is named."""
    from etc.models.loading.safetensors import save_file

    config = tiny_config(MOE)
    raw = checkpoint_tensors(config, goldens.SEEDS["granite_moe"])
    renamed = {name.replace("router.layer.weight", "router.weight")
               .replace("input_linear.weight", "experts.gate_up_proj")
               .replace("output_linear.weight", "experts.down_proj"): array
               for name, array in raw.items()}
    assert renamed.keys() != raw.keys()
    path = tmp_path / "v5"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(as_transformers5(config)))
    save_file(path / "model.safetensors", renamed)
    want = granite[MOE].weights()
    got = Checkpoint(path).weights()
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    save_file(path / "model.safetensors", {k: v for k, v in renamed.items()
                                           if k != "model.layers.1.block_sparse_moe.experts."
                                                   "down_proj"})
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.layers.1.block_sparse_moe.experts.down_proj' \(layer 1 "
                             r"expert down projections\) is missing"):
        Checkpoint(path).weights()


def test_tied_head_and_logits_scaling_reach_the_logprobs(granite):
    """Granite ties its head to the embeddings: the embedding multiplier
    scales the embedded tokens, not the stored matrix (the head reads it
    unscaled), and the logits divided by logits_scaling are what the
    step's logits, its greedy tokens and its on-device log-probabilities
    are computed from."""
    checkpoint = granite[DENSE]
    c, weights = checkpoint.config, checkpoint.weights()
    assert "lm_head" not in weights
    raw = checkpoint_tensors(tiny_config(DENSE), goldens.SEEDS["granite"])
    np.testing.assert_array_equal(weights["embed"], raw["model.embed_tokens.weight"])
    model = models.load(checkpoint.path, workers=2, max_seq_len=32, attention_chunk=4,
                        kv_block_size=4)
    cache = model.new_cache(1, len(SEQUENCE))
    logits, ids, (values, top) = model.step(
        cache, [models.Request(0, 0, SEQUENCE, sampling=models.SamplingParams(logprobs=5))],
        return_logits=True, return_logprobs=True)
    want = reference.forward(c, weights, SEQUENCE)[-1]
    np.testing.assert_allclose(logits[0], want, rtol=2e-4, atol=2e-4)
    assert int(ids[0]) == int(np.argmax(want))
    log_softmax = want - want.max() - np.log(np.sum(np.exp(want - want.max())))
    np.testing.assert_allclose(values[0, 0], log_softmax[ids[0]], atol=1e-4)
    np.testing.assert_array_equal(top[0, :5], np.argsort(-log_softmax, kind="stable")[:5])
    np.testing.assert_allclose(values[0, 1:6], np.sort(log_softmax)[::-1][:5], atol=1e-4)


# ----------------------------------------------------------------------
# GGUF
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["granite", "granite_moe"])
def test_granite_gguf_computes_what_llama_cpp_computes(name, tmp_path):
    """Granite and Granite MoE GGUF files as llama.cpp's converter lays them
    out (`granite`, `granitemoe`: the four scales as metadata keys, Q and K
    rows permuted, the fused experts split into gate and up stacks), run by
    llama.cpp itself (llama-cpp-python 0.3.36; its logits in
    goldens/gguf-<name>-llama-cpp.npz by gguf_goldens.py --runs): the NumPy
    forward pass on what ETC reads from the file is within 0.05 of the
    logits' rms of llama.cpp's at every position (measured 0.005 and
    0.011: llama.cpp keeps its KV cache in f16), and dropping any one
    scale misses by over 0.3 (measured 0.50 to 1.75)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(name, tmp_path)

    def error(config):
        ours = reference.forward(config, weights, run["sequence"])
        return gguf_goldens.run_error(run, ours)

    assert error(gg.config) < 0.05
    for field in GRANITE_MULTIPLIERS:
        assert error(dataclasses.replace(gg.config, **{field: None})) > 0.3, field


def test_granite_gguf_keys_as_llama_cpp_reads_them(tmp_path):
    """Absent scale keys take llama.cpp's defaults (1, and 1 / sqrt(head
    size) for the attention: not transformers' 1.0, which the converter
    would have written); a negative one is refused as config.json's would
    be, naming the field (a granitemoe file with shared experts is
    GraniteMoeShared: test_shared_moe.py)."""
    config = tiny_config(DENSE)
    keys = {f"granite.{key}": None for key in ("embedding_scale", "residual_scale",
                                               "logit_scale", "attention.scale")}
    bare = GGUFCheckpoint(write_gguf(tmp_path / "bare.gguf", config, metadata=keys)).config
    assert (bare.embedding_multiplier, bare.residual_multiplier, bare.logits_scaling) == \
        (None, None, None)
    assert bare.attention_scale == pytest.approx(1 / math.sqrt(16))
    read = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config)).config
    assert read == ModelConfig.from_dict(config)
    negative = write_gguf(tmp_path / "negative.gguf", config,
                          metadata={"granite.residual_scale": -0.5})
    with pytest.raises(UnsupportedConfigError, match=r"GGUF metadata\): field "
                                                     r"'residual_multiplier' = -0.5 must be a "
                                                     r"finite positive number"):
        GGUFCheckpoint(negative)
