"""Mixtral (MixtralForCausalLM) without compiling: its config.json read as
transformers 4 and 5 read it, and its weights in every layout they come
in (transformers 4's and 5's checkpoints, llama.cpp's GGUF files, merged
or per expert) read alike. The compiled models: test_families.py (the
family's parametrisations), test_models.py and test_goldens.py (against
transformers' goldens)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.testing import as_transformers5, checkpoint_tensors, write_checkpoint, write_gguf

from test_families import FAMILIES



def test_mixtral_config_follows_transformers():
    """Mixtral's fields as transformers reads them (MixtralConfig and
    MixtralSparseMoeBlock / MixtralTopKRouter, checked in transformers
    5.24.0 and 4.5x): a MoE block in every layer, the experts' width in
    intermediate_size, the softmax weights of the chosen experts
    renormalised (Qwen3-MoE's norm_topk_prob); RoPE base 1e6 and no window
    when the fields are absent (MixtralConfig's defaults, where
    MistralConfig's are 1e4 and 4096), a window on every layer when set;
    `num_experts` read as transformers' alias of num_local_experts; the
    training-only router fields accepted whatever their value (transformers
    applies the jitter noise in training mode only) but checked; the
    refusals name the field."""
    raw = FAMILIES["mixtral"]
    c = ModelConfig.from_dict(raw)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 32)
    assert (c.sparse_layers, c.intermediate_size, c.norm_topk_prob) == ((0, 1), 0, True)
    assert (c.sliding_window, c.sliding_layers, c.rope_theta, c.tie_word_embeddings) == \
        (None, (), 1e6, False)
    absent = {k: v for k, v in raw.items() if k not in ("sliding_window", "rope_theta")}
    assert (ModelConfig.from_dict(absent).sliding_window,
            ModelConfig.from_dict(absent).rope_theta) == (None, 1e6)
    t5 = as_transformers5(absent)
    del t5["rope_parameters"]["rope_theta"]
    assert ModelConfig.from_dict(t5).rope_theta == 1e6
    mistral = ModelConfig.from_dict({**absent, "architectures": ["MistralForCausalLM"]})
    assert (mistral.sliding_window, mistral.rope_theta, mistral.is_moe) == (4096, 1e4, False)
    windowed = ModelConfig.from_dict({**raw, "sliding_window": 5})
    assert windowed.sliding_layers == (0, 1) and windowed.window(1) == 5
    renamed = {k: v for k, v in raw.items() if k != "num_local_experts"}
    assert ModelConfig.from_dict({**renamed, "num_experts": 4}) == c
    assert ModelConfig.from_dict({**raw, "num_experts": 4}) == c
    for fields in (dict(router_jitter_noise=0.1), dict(router_jitter_noise=None),
                   dict(output_router_logits=True), dict(router_aux_loss_coef=0.0)):
        assert ModelConfig.from_dict({**raw, **fields}) == c, fields
    for fields, match in [
            (dict(num_local_experts=None), r"field 'num_local_experts' is missing"),
            (dict(num_local_experts=0), r"'num_local_experts' = 0 must be a positive integer"),
            (dict(num_experts=8), r"'num_experts' = 8 contradicts num_local_experts = 4"),
            (dict(num_experts_per_tok=5), r"'num_experts_per_tok' = 5 exceeds "
                                          r"num_local_experts = 4"),
            (dict(intermediate_size=None), r"field 'intermediate_size' is missing"),
            (dict(router_jitter_noise=-0.1), r"'router_jitter_noise' = -0.1 must be a "
                                             r"non-negative number"),
            (dict(router_jitter_noise="0"), r"'router_jitter_noise' = '0' must be"),
            (dict(output_router_logits="no"), r"'output_router_logits' = 'no' must be true or "
                                              r"false"),
            (dict(router_aux_loss_coef=float("nan")), r"'router_aux_loss_coef' = nan must be "
                                                      r"a finite number"),
            (dict(attention_bias=True), r"'attention_bias' = True is not supported"),
            (dict(use_sliding_window=True), r"'use_sliding_window' = True is not supported for "
                                            r"MixtralForCausalLM")]:
        with pytest.raises(UnsupportedConfigError, match=match):
            ModelConfig.from_dict({**raw, **fields})


def _mixtral_fused(config: dict, raw: dict) -> dict:
    """`raw` (transformers 4's tensors) with the experts as transformers 5
    holds them and saves them with save_original_format=False: `mlp.gate`,
    `mlp.experts.gate_up_proj` (E, 2 f, h: w1's rows, then w3's) and
    `mlp.experts.down_proj` (E, h, f)."""
    out = {k: v for k, v in raw.items() if ".block_sparse_moe." not in k}
    experts = range(config["num_local_experts"])
    for i in range(config["num_hidden_layers"]):
        p, q = f"model.layers.{i}.block_sparse_moe.", f"model.layers.{i}.mlp."
        out[q + "gate.weight"] = raw[p + "gate.weight"]
        out[q + "experts.gate_up_proj"] = np.stack([np.concatenate(
            [raw[f"{p}experts.{j}.w1.weight"], raw[f"{p}experts.{j}.w3.weight"]]) for j in experts])
        out[q + "experts.down_proj"] = np.stack([raw[f"{p}experts.{j}.w2.weight"]
                                                 for j in experts])
    return out


def test_mixtral_checkpoint_layouts_and_gguf_files_read_alike(tmp_path):
    """Mixtral's experts as transformers 4 saves them
    (`block_sparse_moe.experts.<j>.w1/w2/w3`: gate, down, up; transformers
    5 saves them so too unless told otherwise), as transformers 5 holds
    them (`_mixtral_fused`), and in GGUF files, merged (`ffn_*_exps`) or one
    tensor per expert (`ffn_gate.<j>`, older llama.cpp files): the same
    graph weights, bit for bit, and a Q8_0 file's experts the same packed
    blocks either way; a missing expert is named."""
    from etc.models.loading.gguf import GGUFCheckpoint
    from etc.models.loading.safetensors import save_file

    config = FAMILIES["mixtral"]
    raw = checkpoint_tensors(config, 3)
    want = Checkpoint(write_checkpoint(tmp_path / "v4", config, seed=3)).weights()
    p = "model.layers.1.block_sparse_moe."
    for key, w in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
        np.testing.assert_array_equal(want[f"l1_experts_{key}"][2],
                                      raw[f"{p}experts.2.{w}.weight"])
    np.testing.assert_array_equal(want["l1_router"], raw[p + "gate.weight"].T)
    fused = tmp_path / "v5"
    fused.mkdir()
    (fused / "config.json").write_text(json.dumps(as_transformers5(config)))
    save_file(fused / "model.safetensors", _mixtral_fused(config, raw), "F32")
    got = Checkpoint(fused).weights()
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    save_file(fused / "model.safetensors", _mixtral_fused(config, raw), "BF16")
    assert Checkpoint(fused).default_dtype() == "bf16"  # the stacks count as matrices
    for legacy in (False, True):
        gg = GGUFCheckpoint(write_gguf(tmp_path / f"{legacy}.gguf", config, seed=3,
                                       legacy_experts=legacy))
        assert gg.config == Checkpoint(tmp_path / "v4").config
        assert ("blk.1.ffn_up.3.weight" in gg.names()) == legacy
        got = gg.weights()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    packed = [GGUFCheckpoint(write_gguf(tmp_path / f"q{legacy}.gguf", config, seed=3,
                                        tensor_type="Q8_0", legacy_experts=legacy))
              for legacy in (False, True)]
    formats = packed[0].weight_formats()
    assert formats == packed[1].weight_formats() and formats["l1_experts_down"] == "q8_0"
    merged, each = (q.weights(formats=formats) for q in packed)
    for key in ("l0_experts_gate", "l1_experts_up", "l1_experts_down"):
        assert merged[key].dtype == np.uint8
        np.testing.assert_array_equal(each[key], merged[key], err_msg=key)
    drop = write_gguf(tmp_path / "drop.gguf", config, legacy_experts=True,
                      drop=("blk.1.ffn_up.3.weight",))
    with pytest.raises(models.MissingTensorError, match=r"tensor 'blk.1.ffn_up.3.weight' \(layer "
                                                        r"1 expert up projections\) is missing"):
        GGUFCheckpoint(drop).weights()
    drop = write_checkpoint(tmp_path / "drop", config, drop=(p + "experts.3.w2.weight",))
    with pytest.raises(models.MissingTensorError, match=r"experts.3.w2.weight' \(layer 1 down "
                                                        r"experts \(w2\)\) is missing"):
        Checkpoint(drop).weights()
    wide = write_gguf(tmp_path / "wide.gguf", config,
                      metadata={"llama.expert_feed_forward_length": 16})
    with pytest.raises(UnsupportedConfigError, match=r"llama.expert_feed_forward_length = 16 "
                                                     r"differs from llama.feed_forward_length"):
        GGUFCheckpoint(wide)
    shared = write_gguf(tmp_path / "shared.gguf", config, metadata={"llama.expert_shared_count": 1})
    with pytest.raises(UnsupportedConfigError, match=r"expert_shared_count = 1 is not supported"):
        GGUFCheckpoint(shared)


def test_mixtral_gguf_computes_what_llama_cpp_computes(tmp_path):
    """A Mixtral GGUF file as llama.cpp's converter lays it out (llama with
    experts), run by llama.cpp itself (llama-cpp-python 0.3.36, its logits
    kept in goldens/gguf-mixtral-llama-cpp.npz by gguf_goldens.py --runs):
    the NumPy forward pass on the config and weights ETC reads from the
    file is within 0.05 of the logits' rms of llama.cpp's at every
    position (measured 0.012: llama.cpp keeps its KV cache in f16), and a
    reading without the renormalised routing misses by over 0.5 (measured
    1.19). (Current llama.cpp no longer loads the older per-expert files
    that ETC also reads: test_mixtral_checkpoint_layouts_and_gguf_files_read_alike.)"""
    import dataclasses

    import gguf_goldens
    from etc.models.step import reference

    gg, weights, run = gguf_goldens.read_run("mixtral", tmp_path)

    def error(config):
        ours = reference.forward(config, weights, run["sequence"])
        return gguf_goldens.run_error(run, ours)

    assert error(gg.config) < 0.05
    assert error(dataclasses.replace(gg.config, norm_topk_prob=False)) > 0.5
