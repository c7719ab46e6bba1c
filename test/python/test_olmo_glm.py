"""OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM: no input norms,
the attention's and MLP's outputs normed before their residual adds, q/k
RMSNorms over the whole projections; OLMo 3's sliding layers) and GLM-4
(Glm4ForCausalLM: q/k/v biases, four norms, a fused gate/up projection,
RoPE on half of each head in GPT-J's interleaved pairs). What is specific
to them: their configs and refusals, GLM-4's interleaved layout
(`partial_rotary`), OLMo's q/k norms split over ranks, the NumPy
forward pass against transformers' goldens with the mistakes those would
catch, and their GGUF files (`olmo2`, `glm4`) against llama.cpp itself.
The rest (teacher forcing, paged, chunked, batched, static schedule, CUDA
lanes, half precision, transformers' goldens of the compiled model and its
greedy tokens, GGUF Q8_0 packed) is test_families.py's, parametrised over
them (`olmo2`, `olmo3`, `glm4`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from etc.models.loading import partial_rotary
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.testing import (as_transformers5, checkpoint_tensors, shaped_config,
                                tiny_config, write_checkpoint, write_gguf)

import hf_goldens_families as goldens

OLMO2, OLMO3, GLM4 = "Olmo2ForCausalLM", "Olmo3ForCausalLM", "Glm4ForCausalLM"


def read(architecture: str, **fields) -> ModelConfig:
    return ModelConfig.from_dict(tiny_config(architecture, **fields))


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


def test_olmo2_config():
    """No input norms, the blocks' outputs normed (sandwich norms without
    the pre-feedforward one), q/k norms over the whole projections, no
    biases, no window, untied."""
    c = read(OLMO2)
    assert not c.input_norms and c.sandwich_norms and c.qk_norm and c.qk_norm_projection
    assert not c.qkv_bias and c.rotary_dim is None and not c.rope_interleaved
    assert c.sliding_layers == () and not c.tie_word_embeddings and c.norm_offset == 0
    assert c.attention_scale == 1 / math.sqrt(16)


def test_olmo3_windows_follow_transformers():
    """OLMo 3: `layer_types` names the sliding layers; without it, all but
    every 4th slide (Olmo3Config's rule), with a window of 4096 by
    default; a window of null with sliding layers is refused."""
    c = read(OLMO3)
    assert (c.sliding_window, c.sliding_layers) == (5, (0,))
    assert c.qk_norm_projection and not c.input_norms
    default = {k: v for k, v in tiny_config(OLMO3, num_hidden_layers=8).items()
               if k not in ("layer_types", "sliding_window")}
    c = ModelConfig.from_dict(default)
    assert (c.sliding_window, c.sliding_layers) == (4096, (0, 1, 2, 4, 5, 6))
    with pytest.raises(UnsupportedConfigError, match=r"field 'sliding_window' is null, but "
                                                     r"layers \[0\] are 'sliding_attention'"):
        read(OLMO3, sliding_window=None)


def test_olmo3_rope_per_layer_type():
    """OLMo 3's RoPE as transformers 5's Olmo3Config keeps it, by layer
    type: a flat rope_scaling is the full layers' only (the sliding ones
    plain, their own table); rope_parameters keyed by layer type read as
    written; what Olmo3Config would misread or ignore is refused: flat
    rope_parameters, and a flat rope_theta other than its 500000 (which it
    gives the full layers only)."""
    c = read(OLMO3)
    assert (c.rope_type, c.local_rope_theta, c.local_rope_scaling) == ("yarn", 500000.0, None)
    assert set(c.rope_tables()) == {"inv_freq", "inv_freq_local"}
    plain = read(OLMO3, rope_scaling=None)
    assert (plain.rope_theta, plain.local_rope_theta) == (500000.0, None)
    assert set(plain.rope_tables()) == {"inv_freq"}
    scaled = read(OLMO3, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert scaled.rope_type == "linear" and scaled.local_rope_theta == 500000.0
    assert scaled.local_rope_scaling is None and scaled.local_rope(0) and \
        not scaled.local_rope(1)
    assert set(scaled.rope_tables()) == {"inv_freq", "inv_freq_local"}
    assert ModelConfig.from_dict(as_transformers5(tiny_config(
        OLMO3, rope_scaling={"rope_type": "linear", "factor": 2.0}))) == scaled
    # OLMo 3 7B's kind: yarn on the full layers (every 4th), whose scale
    # carries its attention factor; the sliding layers' plain.
    yarn = read(OLMO3, num_hidden_layers=8, layer_types=None,
                rope_scaling={"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.2,
                              "original_max_position_embeddings": 16})
    assert yarn.sliding_layers == (0, 1, 2, 4, 5, 6) and yarn.rope_type == "yarn"
    assert yarn.attention_scale_of(0) == pytest.approx(0.25)
    assert yarn.attention_scale_of(3) == pytest.approx(1.2 ** 2 * 0.25)
    nested = {k: v for k, v in tiny_config(OLMO3).items()
              if k not in ("rope_theta", "rope_scaling")}
    nested["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                 "sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 2e4}}
    c = ModelConfig.from_dict(nested)
    assert (c.rope_theta, c.local_rope_theta) == (1e4, 2e4)
    with pytest.raises(UnsupportedConfigError, match=r"field 'rope_theta' = 10000.0 is not "
                                                     r"supported for Olmo3ForCausalLM"):
        read(OLMO3, rope_theta=10000.0)
    flat = {k: v for k, v in tiny_config(OLMO3).items()
            if k not in ("rope_theta", "rope_scaling")}
    with pytest.raises(UnsupportedConfigError, match=r"field 'rope_parameters' = .* unless "
                                                     r"keyed by layer type"):
        ModelConfig.from_dict({**flat, "rope_parameters": {"rope_type": "default",
                                                           "rope_theta": 500000.0}})


def test_glm4_config_and_its_defaults():
    """GLM-4: q/k/v biases, the four norms of w, 8 of 16 dimensions rotated
    in interleaved pairs; Glm4Config's defaults where config.json is
    silent: biases, head_dim 128, partial_rotary_factor 0.5; a factor of 1
    still pairs interleaved, over the whole head."""
    c = read(GLM4)
    assert c.qkv_bias and not c.o_bias and c.sandwich_norms and c.input_norms
    assert (c.rotary_dim, c.rope_interleaved, c.norm_offset) == (8, True, 0.0)
    assert not c.qk_norm and not c.tie_word_embeddings and c.attention_scale == 0.25
    np.testing.assert_allclose(c.rope_tables()["inv_freq"],
                               [1, 1e4 ** -0.25, 1e4 ** -0.5, 1e4 ** -0.75, 0, 0, 0, 0],
                               rtol=1e-6)
    assert ModelConfig.from_dict(as_transformers5(tiny_config(GLM4))) == c
    bare = {k: v for k, v in tiny_config(GLM4).items()
            if k not in ("attention_bias", "head_dim", "partial_rotary_factor")}
    c = ModelConfig.from_dict(bare)
    assert (c.qkv_bias, c.head_dim, c.rotary_dim) == (True, 128, 64)
    assert not read(GLM4, attention_bias=False).qkv_bias
    whole = read(GLM4, partial_rotary_factor=1.0)
    assert whole.rotary_dim is None and whole.rope_interleaved


@pytest.mark.parametrize("architecture, fields, match", [
    (OLMO2, {"attention_bias": True}, r"field 'attention_bias' = True is not supported"),
    (OLMO2, {"clip_qkv": 8.0}, r"field 'clip_qkv' = 8.0 is not supported \(OLMo 1's clamping"),
    (OLMO2, {"partial_rotary_factor": 0.5}, r"'partial_rotary_factor' = 0.5 is not supported "
                                            r"for Olmo2ForCausalLM"),
    (OLMO2, {"use_sliding_window": True}, r"'use_sliding_window' = True is not supported for "
                                          r"Olmo2ForCausalLM"),
    (OLMO2, {"layer_types": ["sliding_attention", "full_attention"]},
     r"field 'layer_types' lists 'sliding_attention'"),
    (OLMO3, {"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu' is not supported"),
    (GLM4, {"mlp_bias": True}, r"field 'mlp_bias' = True is not supported"),
    (GLM4, {"attention_bias": "yes"}, r"field 'attention_bias' = 'yes' must be true or false"),
    (GLM4, {"partial_rotary_factor": 0.1}, r"rotates int\(16 x 0.1\) = 1 dimensions"),
    (GLM4, {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     r"dynamic NTK scaling"),
])
def test_refusals_name_the_field(architecture, fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        read(architecture, **fields)


def test_real_shapes_read():
    """OLMo-2-1B's and GLM-4-9B's shapes (`SHAPES`): OLMo's q/k norms of
    16 x 128 values, its attention scale 1 / sqrt(128); GLM-4's 64 of 128
    dimensions rotated, 32 query heads over 2 KV heads."""
    olmo = ModelConfig.from_dict(shaped_config("olmo-2-1b", layers=16))
    assert (olmo.head_dim, olmo.num_kv_heads, olmo.rope_theta) == (128, 16, 500000.0)
    assert olmo.qk_norm_projection and olmo.attention_scale == 1 / math.sqrt(128)
    glm = ModelConfig.from_dict(shaped_config("glm-4-9b", layers=40))
    assert (glm.head_dim, glm.rotary_dim, glm.num_heads, glm.num_kv_heads) == (128, 64, 32, 2)
    assert glm.rope_tables()["inv_freq"][32:].tolist() == [0.0] * 32


# ----------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------


def test_glm4_interleaved_layout(tmp_path):
    """GLM-4's pairs (2i, 2i + 1) of the first 8 dimensions land on the
    step graph's (i, i + 8), the pass-through dimensions 8..15 after them;
    q, k and their biases move alike (v, o untouched), nothing is scaled;
    `to_hf_layout` undoes it; the fused gate/up splits gate rows first."""
    perm = partial_rotary.permutation(16, 8, interleaved=True)
    assert perm.tolist() == [0, 2, 4, 6, 8, 9, 10, 11, 1, 3, 5, 7, 12, 13, 14, 15]
    assert partial_rotary.permutation(4, 4, interleaved=True).tolist() == [0, 2, 1, 3]
    config = tiny_config(GLM4)
    checkpoint = Checkpoint(write_checkpoint(tmp_path / "glm4", config, seed=2))
    c, weights = checkpoint.config, checkpoint.weights()
    raw = checkpoint_tensors(config, 2)
    p = "model.layers.1."
    order = (np.arange(4)[:, None] * 16 + perm).ravel()
    np.testing.assert_array_equal(weights["l1_wq"], raw[p + "self_attn.q_proj.weight"][order])
    np.testing.assert_array_equal(weights["l1_bk"], raw[p + "self_attn.k_proj.bias"][order[:32]])
    np.testing.assert_array_equal(weights["l1_wv"], raw[p + "self_attn.v_proj.weight"])
    assert partial_rotary.unpacked_keys(c) == set()
    back = partial_rotary.to_hf_layout(c, weights)
    np.testing.assert_array_equal(back["l1_wq"], raw[p + "self_attn.q_proj.weight"])
    fused = raw[p + "mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(weights["l1_w_gate"], fused[:48])
    np.testing.assert_array_equal(weights["l1_w_up"], fused[48:])
    norms = {"l1_attn_norm": "input_layernorm", "l1_post_attn_norm": "post_self_attn_layernorm",
             "l1_mlp_norm": "post_attention_layernorm", "l1_post_mlp_norm": "post_mlp_layernorm"}
    for key, name in norms.items():
        np.testing.assert_array_equal(weights[key], raw[f"{p}{name}.weight"], err_msg=key)


def test_olmo2_weights(tmp_path):
    """OLMo 2's norms as the graph names them: no input norms, the post-
    attention and post-feedforward norms of the outputs, q/k norms of the
    whole projections (64 and 32 values); a checkpoint without one names
    it."""
    config = tiny_config(OLMO2)
    weights = Checkpoint(write_checkpoint(tmp_path / "olmo2", config, seed=2)).weights()
    raw = checkpoint_tensors(config, 2)
    assert "l0_attn_norm" not in weights and "l0_mlp_norm" not in weights
    np.testing.assert_array_equal(weights["l0_post_attn_norm"],
                                  raw["model.layers.0.post_attention_layernorm.weight"])
    np.testing.assert_array_equal(weights["l0_post_mlp_norm"],
                                  raw["model.layers.0.post_feedforward_layernorm.weight"])
    assert weights["l0_q_norm"].shape == (64,) and weights["l0_k_norm"].shape == (32,)
    import etc.models as models

    path = write_checkpoint(tmp_path / "missing", config, seed=2,
                            drop=("model.layers.1.post_feedforward_layernorm.weight",))
    with pytest.raises(models.MissingTensorError,
                       match=r"'model.layers.1.post_feedforward_layernorm.weight' \(layer 1 "
                             r"post-feedforward norm\) is missing"):
        Checkpoint(path).weights()


def test_olmo_shards_split_the_qk_norms_by_heads(tmp_path):
    """OLMo 2 and 3 split over 2 ranks: each rank's q/k norm weights are
    its heads' slices; the step graph sums each rank's squares of q and k
    into one (T, 2) f32 tensor, all-reduces it once per layer, and norms q
    and k by the whole widths; the ranks' split norms of their shares are
    the whole rows' RMSNorm (NumPy). GLM-4 (per-head layout, biases split
    by heads) shards too. The 2-rank models against one rank:
    test_tensor_parallel.py and test_families.py."""
    from etc import reference_llm
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import shard_config, shard_weights

    for architecture in (OLMO2, OLMO3):
        c = read(architecture)
        shard = shard_config(c, 2)
        q, kv = shard.num_heads * c.head_dim, shard.num_kv_heads * c.head_dim
        weights = Checkpoint(write_checkpoint(tmp_path / architecture, tiny_config(architecture),
                                              seed=3)).weights()
        for rank in (0, 1):
            part = shard_weights(c, weights, 2, rank)
            np.testing.assert_array_equal(part["l1_q_norm"],
                                          weights["l1_q_norm"][rank * q:(rank + 1) * q])
            np.testing.assert_array_equal(part["l1_k_norm"],
                                          weights["l1_k_norm"][rank * kv:(rank + 1) * kv])
        g = build_step_graph(shard, max_seq_len=16, chunk=4, ranks=2)
        ops = g.operations
        sums = [op for op in ops if op.kind == "sum_squares"]
        norms = [op for op in ops if op.kind == "split_rmsnorm"]
        assert len(sums) == c.num_layers and len(norms) == 2 * c.num_layers
        assert all(op.result.shape[1] == 2 and op.result.dtype == "f32" for op in sums)
        reduced = {op.operands[0].name for op in ops if op.kind == "all_reduce"}
        assert {op.result.name for op in sums} <= reduced
        assert [(op.params["width"], op.params["column"]) for op in norms[:2]] == \
            [(2 * q, 0), (2 * kv, 1)]
        one_rank = build_step_graph(c, max_seq_len=16, chunk=4).operations
        count = lambda ops: sum(op.kind == "rmsnorm" for op in ops)
        assert count(ops) == count(one_rank) - 2 * c.num_layers
        rng = np.random.default_rng(0)
        x = rng.standard_normal((3, 2 * q)).astype(np.float32)
        w = weights["l0_q_norm"]
        halves = [x[:, :q], x[:, q:]]
        totals = sum(reference_llm.sum_squares(h) for h in halves)
        split = np.concatenate([reference_llm.split_rmsnorm(
            h, w[r * q:(r + 1) * q], totals, 2 * q, 0, c.rms_norm_eps)
            for r, h in enumerate(halves)], axis=1)
        whole = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + c.rms_norm_eps) * w
        np.testing.assert_allclose(split, whole, rtol=1e-6, atol=1e-6)
    assert shard_config(read(GLM4), 2).num_heads == 2


# ----------------------------------------------------------------------
# Against transformers and llama.cpp, and what they catch
# ----------------------------------------------------------------------


def half_pairs(config, weights):
    """GLM-4 read as if its pairs were (i, i + r / 2) (rotate_half's)."""
    hf = partial_rotary.to_hf_layout(config, weights)
    plain = dataclasses.replace(config, rope_interleaved=False)
    return plain, {key: partial_rotary.to_step_layout(plain, key, array)
                   for key, array in hf.items()}


def per_head_norms(config, weights):
    """OLMo 2's q/k norms applied per head (Qwen3's), with the first head's
    share of each weight."""
    d = config.head_dim
    return (dataclasses.replace(config, qk_norm_projection=False),
            {**weights, **{f"l{i}_{n}_norm": weights[f"l{i}_{n}_norm"][:d]
                           for i in range(config.num_layers) for n in "qk"}})


@pytest.mark.parametrize("name, mutations", [
    ("olmo2-transformers4-f32", {
        "pre-norms (Llama's order) instead of post-norms":
            lambda c, w: (dataclasses.replace(c, input_norms=True, sandwich_norms=False),
                          {**w, **{f"l{i}_{k}": w[f"l{i}_post_{k}"]
                                   for i in range(c.num_layers)
                                   for k in ("attn_norm", "mlp_norm")}}),
        "q/k norms per head": per_head_norms}),
    ("olmo3-transformers5-f32", {
        "no window": lambda c, w: (dataclasses.replace(c, sliding_layers=()), w),
        "yarn on the sliding layers too":
            lambda c, w: (dataclasses.replace(c, local_rope_theta=None), w)}),
    ("glm4-transformers4-f32", {
        "pairs (i, i + r / 2)": half_pairs,
        "q/k rows left in Hugging Face's order":
            lambda c, w: (c, partial_rotary.to_hf_layout(c, w)),
        "no post-norms": lambda c, w: (dataclasses.replace(c, sandwich_norms=False), w)}),
])
def test_numpy_forward_matches_transformers_and_the_mistakes_do_not(name, mutations, tmp_path):
    """The NumPy forward pass on the config and weights ETC reads is
    transformers' (the golden's logits within tolerance), and the
    plausible misreadings miss them: OLMo 2 as a pre-norm model or with
    per-head q/k norms, OLMo 3 without its window (the golden's sequences
    outgrow it) or with its full layers' yarn on the sliding ones, GLM-4 rotating rotate_half's pairs or unpermuted rows, or
    without its output norms."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), mutations)


@pytest.mark.parametrize("arch", ["olmo2", "olmo3", "glm4"])
def test_gguf_files_run_by_llama_cpp(arch, tmp_path):
    """llama.cpp (llama-cpp-python) on the F32 GGUF file `write_gguf` writes
    (gguf_goldens.RUNS): the NumPy forward pass on the config and weights
    ETC reads from it is within 0.05 of the logits' rms at every position
    (measured 0.012, 0.004, 0.003: llama.cpp keeps its KV cache in f16),
    and the misreadings miss by over 0.3 (measured 6.9, 4.5, 4.5): OLMo's
    q/k norms per head, OLMo 3's window dropped, GLM-4's pairs as
    rotate_half's."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(arch, tmp_path)

    def error(config, read=weights):
        return gguf_goldens.run_error(run, reference.forward(config, read, run["sequence"]))

    c = gg.config
    assert error(c) < 0.05
    if arch == "olmo2":
        assert error(*per_head_norms(c, weights)) > 0.3
    elif arch == "olmo3":
        assert c.sliding_layers == (0, 1, 2) and c.sliding_window == 5
        assert error(dataclasses.replace(c, sliding_layers=())) > 0.3
    else:
        assert c.rotary_dim == 8 and c.rope_interleaved
        assert error(*half_pairs(c, weights)) > 0.3


def test_gguf_keys_as_llama_cpp_reads_them(tmp_path):
    """glm4's rope.dimension_count is the rotated width (the whole head
    stated when it says so: Glm4Config's default would be half); a glm4
    file without biases has none (Glm4Config's default would have them);
    an olmo2 file with a window is OLMo 3, its window on all but every 4th
    layer when no per-layer flags say otherwise (llama.cpp's rule), its
    RoPE base every layer's."""
    config = tiny_config(GLM4)
    whole = write_gguf(tmp_path / "whole.gguf", config,
                       metadata={"glm4.rope.dimension_count": 16})
    c = GGUFCheckpoint(whole).config
    assert c.rotary_dim is None and c.rope_interleaved
    tensors = {k: v for k, v in checkpoint_tensors(config, 0).items() if not k.endswith(".bias")}
    assert not GGUFCheckpoint(write_gguf(tmp_path / "nobias.gguf", config,
                                         tensors=tensors)).config.qkv_bias
    olmo3 = tiny_config(OLMO3, num_hidden_layers=4, rope_scaling=None,
                        layer_types=["sliding_attention"] * 3 + ["full_attention"])
    path = write_gguf(tmp_path / "olmo3.gguf", olmo3,
                      metadata={"olmo2.attention.sliding_window_pattern": None})
    c = GGUFCheckpoint(path).config
    assert (c.architecture, c.sliding_window, c.sliding_layers) == (OLMO3, 5, (0, 1, 2))
    assert c == ModelConfig.from_dict(olmo3)
    # llama.cpp's base is every layer's (not Olmo3Config's flat rope_theta,
    # which would be the full layers' only).
    based = write_gguf(tmp_path / "base.gguf", olmo3, metadata={"olmo2.rope.freq_base": 1e4})
    c = GGUFCheckpoint(based).config
    assert (c.rope_theta, c.local_rope_theta) == (1e4, None)
