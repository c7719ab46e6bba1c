"""Cohere (CohereForCausalLM: Command R, Command R+, Aya 23, Aya Expanse) and Cohere2
(Cohere2ForCausalLM: Command R7B, Command A): LayerNorms without bias, the
attention and the MLP in parallel on the layer's one norm (x + attn(ln(x))
+ mlp(ln(x))), RoPE in interleaved pairs, tied embeddings, logits times
`logit_scale`; Command R+'s per-head LayerNorms of q and k, a weight for
every head (`use_qk_norm`); Cohere2's sliding layers with RoPE and full
ones without.
What is specific to them: their configs and refusals, their weights'
layout (no post-attention norm, q/k rows permuted for the pairs), the step
graph's one all-reduce per layer on several ranks, and the NumPy forward
pass against transformers' goldens with the mistakes those would catch.
The rest (teacher forcing, paged, chunked, static schedule, CUDA lanes,
half precision, transformers' goldens of the compiled model and its
greedy tokens, tensor parallelism on 2 ranks) is test_families.py's,
parametrised over them (`cohere`, `cohere2`, `cohere_qk`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from etc.models.loading import partial_rotary
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.testing import as_transformers5, checkpoint_tensors, tiny_config, write_checkpoint

import hf_goldens_families as goldens

COHERE, COHERE2 = "CohereForCausalLM", "Cohere2ForCausalLM"


def read(architecture: str, **fields) -> ModelConfig:
    return ModelConfig.from_dict(tiny_config(architecture, **fields))


def bare(architecture: str, *drop: str) -> dict:
    return {k: v for k, v in tiny_config(architecture).items() if k not in drop}


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


def test_cohere_config():
    """LayerNorms (eps from layer_norm_eps), a parallel block, interleaved
    pairs over the whole head, tied, logits times 0.25; no window, no
    q/k norms, no biases."""
    c = read(COHERE)
    assert c.layer_norm and c.parallel_block and c.rope_interleaved and c.tie_word_embeddings
    assert (c.rms_norm_eps, c.logit_scale, c.logits_multiplier) == (1e-5, 0.25, 0.25)
    assert c.rotary_dim is None and c.sliding_layers == () and c.nope_layers == ()
    assert not c.qk_norm and not c.qkv_bias and not c.sandwich_norms
    assert ModelConfig.from_dict(as_transformers5(tiny_config(COHERE))) == c


def test_cohere_defaults_are_cohere_configs():
    """CohereConfig's defaults where config.json is silent: RoPE base
    500000 (its default_theta), logit_scale 0.0625, layer_norm_eps 1e-5,
    tied embeddings; a scale of 1 is no task."""
    c = ModelConfig.from_dict(bare(COHERE, "rope_theta", "logit_scale", "layer_norm_eps",
                                   "tie_word_embeddings"))
    assert (c.rope_theta, c.logit_scale, c.rms_norm_eps) == (500000.0, 0.0625, 1e-5)
    assert c.tie_word_embeddings
    assert read(COHERE, logit_scale=1.0).logits_multiplier is None
    assert not read(COHERE, tie_word_embeddings=False).tie_word_embeddings


def test_cohere2_layers_follow_transformers():
    """Command R7B: the sliding layers (layer_types, else every 4th layer
    full: Cohere2Config's sliding_window_pattern, 4 by default) have RoPE
    and a window; the full layers neither (nope_layers); head_dim is
    hidden / heads; RoPE base 1e4 by default."""
    c = read(COHERE2)
    assert (c.sliding_window, c.sliding_layers, c.nope_layers) == (5, (0,), (1,))
    assert c.head_dim == 8 and c.layer_norm and c.parallel_block and c.rope_interleaved
    assert c.uses_rope(0) and not c.uses_rope(1) and c.window(1) is None
    eight = ModelConfig.from_dict(bare(COHERE2, "layer_types") | {"num_hidden_layers": 8})
    assert eight.sliding_layers == (0, 1, 2, 4, 5, 6) and eight.nope_layers == (3, 7)
    three = ModelConfig.from_dict(bare(COHERE2, "layer_types") |
                                  {"num_hidden_layers": 6, "sliding_window_pattern": 3})
    assert three.sliding_layers == (0, 1, 3, 4) and three.nope_layers == (2, 5)
    assert ModelConfig.from_dict(bare(COHERE2, "rope_theta")).rope_theta == 10000.0
    assert ModelConfig.from_dict(bare(COHERE2, "sliding_window")).sliding_window == 4096
    # Only the sliding layers' RoPE: one frequency table.
    assert set(c.rope_tables()) == {"inv_freq"}


def test_command_r_plus_qk_norms(tmp_path):
    """use_qk_norm (Command R+): per-head q/k LayerNorms whose weights
    (heads, head_dim) are read as one vector per projection, q's rows
    permuted per head as the projection's (the interleaved pairs); on 2
    ranks each rank takes its heads' weights; the step graph norms with
    `head_layernorm`."""
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import shard_config, shard_weights

    config = tiny_config(COHERE, use_qk_norm=True)
    checkpoint = Checkpoint(write_checkpoint(tmp_path / "plus", config, seed=6))
    c, weights = checkpoint.config, checkpoint.weights()
    assert c.qk_norm and not c.qk_norm_projection and c.layer_norm
    raw = checkpoint_tensors(config, 6)["model.layers.0.self_attn.q_norm.weight"]
    d = c.head_dim
    perm = partial_rotary.permutation(d, d, interleaved=True)
    np.testing.assert_array_equal(weights["l0_q_norm"], raw[:, perm].reshape(-1))
    assert weights["l0_k_norm"].shape == (c.num_kv_heads * d,)
    shard = shard_weights(c, weights, 2, 1)
    np.testing.assert_array_equal(shard["l0_q_norm"], weights["l0_q_norm"][2 * d:])
    np.testing.assert_array_equal(shard["l0_k_norm"], weights["l0_k_norm"][d:])
    kinds = [op.kind for op in build_step_graph(shard_config(c, 2), max_seq_len=16, chunk=4,
                                                ranks=2)._ops]
    assert kinds.count("head_layernorm") == 2 * c.num_layers and "head_rmsnorm" not in kinds


@pytest.mark.parametrize("architecture, fields, match", [
    (COHERE, {"use_qk_norm": "yes"}, r"field 'use_qk_norm' = 'yes' must be true or false"),
    (COHERE2, {"use_qk_norm": True}, r"field 'use_qk_norm' = True is not supported "
                                     r"\(Cohere2ForCausalLM has no q/k norms"),
    (COHERE, {"logit_scale": None}, r"field 'logit_scale' = None is not supported"),
    (COHERE, {"logit_scale": -0.5}, r"field 'logit_scale' = -0.5 must be a finite positive"),
    (COHERE, {"layer_norm_eps": "small"}, r"field 'layer_norm_eps' = 'small' must be a finite"),
    (COHERE, {"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    (COHERE, {"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu' is not supported"),
    (COHERE, {"sliding_window": 5, "use_sliding_window": True},
     r"field 'use_sliding_window' = True is not supported for CohereForCausalLM"),
    (COHERE, {"partial_rotary_factor": 0.5}, r"'partial_rotary_factor' = 0.5 is not supported "
                                             r"for CohereForCausalLM"),
    (COHERE2, {"head_dim": 16}, r"field 'head_dim' = 16 is not supported for "
                                r"Cohere2ForCausalLM: Cohere2Config sets it to hidden_size / "
                                r"num_attention_heads = 8"),
    (COHERE2, {"sliding_window": None}, r"field 'sliding_window' is null, but layers \[0\]"),
    (COHERE2, {"layer_types": ["chunked_attention", "full_attention"]},
     r"field 'layer_types' lists 'chunked_attention'"),
    (COHERE2, {"rotary_pct": 0.5}, r"field 'rotary_pct' = 0.5 is not supported \(transformers "
                                   r"rotates whole heads"),
    (COHERE2, {"position_embedding_type": "rope"},
     r"field 'position_embedding_type' = 'rope' is not supported"),
    (COHERE2, {"order_of_interleaved_layers": "global_attn_first"},
     r"field 'order_of_interleaved_layers' = 'global_attn_first' is not supported"),
    (COHERE, {"use_gated_activation": False}, r"field 'use_gated_activation' = False"),
])
def test_refusals_name_the_field(architecture, fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        read(architecture, **fields)


def test_real_shapes_read():
    """A config of Command R7B's widths (32 layers of 4096, 32 heads over 8
    KV heads, every 4th layer full) and of Command R's (64 heads of 128,
    RoPE base 8e6, logits times 0.0625)."""
    r7b = ModelConfig.from_dict(tiny_config(
        COHERE2, vocab_size=256000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=132096, rope_theta=50000.0, sliding_window=4096,
        layer_types=None, sliding_window_pattern=4, rotary_pct=1.0,
        position_embedding_type="rope_gptj", order_of_interleaved_layers="local_attn_first",
        use_gated_activation=True, use_embedding_sharing=True, layer_switch=4,
        cache_implementation="hybrid"))
    assert (r7b.head_dim, r7b.num_kv_heads, r7b.sliding_window) == (128, 8, 4096)
    assert len(r7b.sliding_layers) == 24 and r7b.nope_layers == tuple(range(3, 32, 4))
    r = ModelConfig.from_dict(tiny_config(
        COHERE, vocab_size=256000, hidden_size=8192, intermediate_size=22528,
        num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=64, head_dim=None,
        rope_theta=8000000.0, logit_scale=0.0625))
    assert (r.head_dim, r.rope_theta, r.logit_scale) == (128, 8000000.0, 0.0625)


# ----------------------------------------------------------------------
# Weights and the step graph
# ----------------------------------------------------------------------


@pytest.mark.parametrize("architecture", [COHERE, COHERE2])
def test_weights_layout(architecture, tmp_path):
    """One norm per layer (input_layernorm: no l<i>_mlp_norm), the tied
    head, the q and k rows of each head permuted so that pair (2i, 2i + 1)
    lands on the step graph's (i, i + d / 2), v and o as they are; a
    checkpoint without a layer's norm names it."""
    import etc.models as models

    config = tiny_config(architecture)
    checkpoint = Checkpoint(write_checkpoint(tmp_path / "m", config, seed=4))
    c, weights = checkpoint.config, checkpoint.weights()
    raw = checkpoint_tensors(config, 4)
    assert not any(k.endswith("mlp_norm") for k in weights) and "lm_head" not in weights
    d = c.head_dim
    perm = partial_rotary.permutation(d, d, interleaved=True)
    assert perm.tolist()[:2] == [0, 2] and perm.tolist()[d // 2:d // 2 + 2] == [1, 3]
    order = (np.arange(c.num_kv_heads)[:, None] * d + perm).ravel()
    p = "model.layers.1."
    np.testing.assert_array_equal(weights["l1_wk"], raw[p + "self_attn.k_proj.weight"][order])
    np.testing.assert_array_equal(weights["l1_wv"], raw[p + "self_attn.v_proj.weight"])
    np.testing.assert_array_equal(weights["l1_attn_norm"], raw[p + "input_layernorm.weight"])
    path = write_checkpoint(tmp_path / "missing", config, seed=4,
                            drop=("model.layers.0.input_layernorm.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.layers.0.input_layernorm.weight' \(layer 0 norm\) is "
                             r"missing"):
        Checkpoint(path).weights()


def test_step_graph_norms_and_reduces_once_per_layer():
    """Every norm a layernorm task (one per layer and the final one), no
    rmsnorm; on 2 ranks the attention's and the MLP's
    partial products are added before one all-reduce per layer (Llama's
    layers take two); the logits are scaled by logit_scale."""
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import shard_config

    c = read(COHERE)
    for ranks in (1, 2):
        g = build_step_graph(shard_config(c, ranks), max_seq_len=16, chunk=4, ranks=ranks)
        kinds = [op.kind for op in g._ops]
        assert kinds.count("layernorm") == c.num_layers + 1 and "rmsnorm" not in kinds
        assert kinds.count("all_reduce") == (c.num_layers if ranks == 2 else 0)
        scale = next(op for op in g._ops if op.result.name == "logits")
        assert scale.kind == "scale" and scale.params["c"] == 0.25
    llama = shard_config(read("LlamaForCausalLM"), 2)
    kinds = [op.kind for op in build_step_graph(llama, max_seq_len=16, chunk=4, ranks=2)._ops]
    assert kinds.count("all_reduce") == 2 * llama.num_layers


@pytest.mark.parametrize("change", [dict(residual_multiplier=0.5), dict(input_norms=False),
                                    dict(sandwich_norms=True), dict(o_bias=True),
                                    dict(qk_norm_projection=True)])
def test_step_graph_refuses_what_cohere_layers_do_not_compose_with(change):
    """A field of another family that the parallel block or the LayerNorms
    would leave out (the NumPy forward pass computes it) is refused by
    name, not built into a different model."""
    from etc.models.step.graph import build_step_graph

    config = dataclasses.replace(read(COHERE), **change)
    with pytest.raises(NotImplementedError, match="Cohere's"):
        build_step_graph(config, max_seq_len=16, chunk=4)


def test_after_rope_norms_compose_with_the_parallel_block():
    """Hunyuan's q/k norms after RoPE in Cohere's layers: the head norms
    follow the rope tasks (each feature is its own branch of the graph)."""
    from etc.models.step.graph import build_step_graph

    config = dataclasses.replace(read(COHERE), qk_norm=True, qk_norm_after_rope=True)
    kinds = [op.kind for op in build_step_graph(config, max_seq_len=16, chunk=4)._ops]
    first_rope, first_norm = kinds.index("rope"), kinds.index("head_layernorm")
    assert first_rope < first_norm and kinds.count("head_layernorm") == 2 * config.num_layers


# ----------------------------------------------------------------------
# Against transformers, and what it catches
# ----------------------------------------------------------------------


def first_heads(config, weights):
    """Command R+'s q/k norms read as one weight shared by the heads
    (Qwen3's kind): the first head's, for every head."""
    d = config.head_dim
    return config, {**weights, **{
        f"l{i}_{n}_norm": np.tile(weights[f"l{i}_{n}_norm"][:d], count)
        for i in range(config.num_layers)
        for n, count in (("q", config.num_heads), ("k", config.num_kv_heads))}}


def half_pairs(config, weights):
    """Cohere read as if its pairs were rotate_half's (i, i + d / 2)."""
    hf = partial_rotary.to_hf_layout(config, weights)
    return dataclasses.replace(config, rope_interleaved=False), hf


def sequential(config, weights):
    """Llama's order: x + attn(ln(x)), then the MLP on the norm of that
    (the same norm weights)."""
    return (dataclasses.replace(config, parallel_block=False),
            {**weights, **{f"l{i}_mlp_norm": weights[f"l{i}_attn_norm"]
                           for i in range(config.num_layers)}})


MISTAKES = {
    "RMSNorm instead of LayerNorm": lambda c, w: (dataclasses.replace(c, layer_norm=False), w),
    "attention and MLP one after the other": sequential,
    "RoPE pairs (i, i + d / 2)": half_pairs,
    "no logit_scale": lambda c, w: (dataclasses.replace(c, logit_scale=None), w),
    "logits divided by logit_scale":
        lambda c, w: (dataclasses.replace(c, logit_scale=1 / c.logit_scale), w),
}


@pytest.mark.parametrize("name, mutations", [
    ("cohere-transformers4-f32", MISTAKES),
    ("cohere-transformers5-f32", {}),
    ("cohere2-transformers4-f32", {
        **MISTAKES,
        "RoPE on the full layers too": lambda c, w: (dataclasses.replace(c, nope_layers=()), w),
        "no window": lambda c, w: (dataclasses.replace(c, sliding_layers=()), w)}),
    ("cohere2-transformers5-f32", {}),
    # (an RMSNorm there would need Qwen3's one weight for every head)
    ("cohere_qk-transformers4-f32", {
        **{what: f for what, f in MISTAKES.items() if "RMSNorm" not in what},
        "no q/k norms": lambda c, w: (dataclasses.replace(c, qk_norm=False), w),
        "the first head's q/k norm weights for every head": first_heads}),
    ("cohere_qk-transformers5-f32", {}),
])
def test_numpy_forward_matches_transformers_and_the_mistakes_do_not(name, mutations, tmp_path):
    """The NumPy forward pass on the config and weights ETC reads is
    transformers' (the golden's logits within tolerance), and the
    plausible misreadings miss them: an RMSNorm, a sequential block,
    rotate_half's pairs, the logit scale dropped or inverted; Cohere2 with
    RoPE on its full layers, or without its window (the golden's sequences
    outgrow it); Command R+ without its q/k norms or with one head's
    weights for all."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), mutations)


@pytest.mark.parametrize("arch", ["cohere", "cohere2"])
def test_gguf_files_run_by_llama_cpp(arch, tmp_path):
    """llama.cpp (llama-cpp-python) on the F32 GGUF file `write_gguf` writes
    (gguf_goldens.RUNS: `command-r`, and `cohere2` with llama.cpp's fixed
    pattern, layers 0 to 2 sliding with RoPE, layer 3 full without): the
    NumPy forward pass on the config and weights ETC reads from it is
    within 0.02 of the logits' rms at every position (measured 0.0025 and
    0.0048: llama.cpp keeps its KV cache in f16), and the misreadings miss
    by over 1 (measured 1.4 to 60: an RMSNorm, a sequential block,
    rotate_half's pairs, the scale dropped or inverted, RoPE on cohere2's
    full layer)."""
    import gguf_goldens
    from etc.models.step import reference

    gg, weights, run = gguf_goldens.read_run(arch, tmp_path)

    def error(config, read=weights):
        return gguf_goldens.run_error(run, reference.forward(config, read, run["sequence"]))

    c = gg.config
    assert c.layer_norm and c.parallel_block and c.rope_interleaved and c.logit_scale == 0.25
    assert error(c) < 0.02
    mistakes = dict(MISTAKES)
    if arch == "cohere2":
        assert (c.sliding_layers, c.nope_layers, c.sliding_window) == ((0, 1, 2), (3,), 5)
        mistakes["RoPE on the full layer"] = \
            lambda c, w: (dataclasses.replace(c, nope_layers=()), w)
    for what, misread in mistakes.items():
        assert error(*misread(c, weights)) > 1, what


def test_gguf_keys_as_llama_cpp_reads_them(tmp_path):
    """The LayerNorms' epsilon from `attention.layer_norm_epsilon` (the RMS
    key is not required); `logit_scale`, which llama.cpp requires, missing
    is refused by name, as is a cohere2 `sliding_window_pattern` llama.cpp
    would not read; Command R+'s q/k norm tensors (heads, head_dim) are
    read as its checkpoint's; the `command-r` pre-tokenizer splits digits
    apart, then as GPT-2."""
    from etc.models.loading.gguf import PRE_TOKENIZERS, GGUFCheckpoint
    from etc.models.testing import write_gguf

    config = tiny_config(COHERE, layer_norm_eps=2e-5)
    c = GGUFCheckpoint(write_gguf(tmp_path / "r.gguf", config)).config
    assert c.rms_norm_eps == 2e-5 and c == read(COHERE, layer_norm_eps=2e-5)
    with pytest.raises(UnsupportedConfigError, match=r"GGUF metadata key 'command-r.logit_scale' "
                                                     r"is missing"):
        GGUFCheckpoint(write_gguf(tmp_path / "noscale.gguf", config,
                                  metadata={"command-r.logit_scale": None}))
    four = tiny_config(COHERE2, num_hidden_layers=4, layer_types=None)
    with pytest.raises(UnsupportedConfigError, match=r"cohere2.attention.sliding_window_pattern"
                                                     r" = 2 is not supported"):
        GGUFCheckpoint(write_gguf(tmp_path / "pattern.gguf", four,
                                  metadata={"cohere2.attention.sliding_window_pattern": 2}))
    plus = tiny_config(COHERE, use_qk_norm=True)
    gg = GGUFCheckpoint(write_gguf(tmp_path / "qk.gguf", plus, seed=2))
    st = Checkpoint(write_checkpoint(tmp_path / "qk", plus, seed=2))
    assert gg.config == st.config and gg.config.qk_norm
    want = st.weights()
    got = gg.weights()
    for key in ("l0_q_norm", "l1_k_norm", "l1_wq"):
        np.testing.assert_array_equal(got[key], want[key])
    assert PRE_TOKENIZERS["command-r"] == PRE_TOKENIZERS["smollm"]
