"""gpt-oss (GptOssForCausalLM): its config.json as transformers 5.24's
GptOssConfig reads it (defaults, every field, refusals by name), its
checkpoints (MXFP4 experts as OpenAI's `*_blocks` / `*_scales`, repacked
to ggml's block order and kept packed; the float stacks transformers saves,
gate and up interleaved), the NumPy forward pass against transformers'
goldens (test/python/goldens/gpt_oss*, `hf_goldens_families.py`), and the
compiled step against that forward pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from etc import packed
from etc.models.loading import mxfp4
from etc.models.loading.checkpoint import Checkpoint, CheckpointError, MissingTensorError
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.step import reference
from etc.models.testing import (as_transformers5, checkpoint_tensors, shaped_config, tiny_config,
                                write_checkpoint, write_gguf)

import hf_goldens_families as goldens

TINY = tiny_config("GptOssForCausalLM")

#: gpt-oss-20b's config.json as OpenAI published it (the fields beyond
#: GptOssConfig's too: experts_per_token, initial_context_length,
#: quantization_config).
REAL = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


# ----------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------


def test_gpt_oss_20b_config():
    c = ModelConfig.from_dict(REAL)
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == \
        (2880, 24, 64, 8, 64)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (32, 4, 2880)
    assert c.intermediate_size == 0 and c.sparse_layers == tuple(range(24))
    assert c.norm_topk_prob  # softmax of the top-k logits: renormalised
    assert c.qkv_bias and c.o_bias and c.attention_sinks and c.router_bias and c.expert_bias
    assert (c.expert_activation, c.swiglu_limit, c.swiglu_alpha) == ("swiglu_oai", 7.0, 1.702)
    assert c.sliding_window == 128 and c.sliding_layers == tuple(range(0, 24, 2))
    assert c.window(0) == 128 and c.window(1) is None
    assert c.rope_theta == 150000.0 and not c.tie_word_embeddings
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False,
                              "original_max_position_embeddings": 4096}
    # yarn's attention factor 0.1 ln(32) + 1, squared, scales the logits.
    assert c.attention_scale == pytest.approx((0.1 * np.log(32) + 1) ** 2 / 8)
    # transformers 5's spelling reads alike.
    assert ModelConfig.from_dict(as_transformers5(REAL)) == c


def test_defaults_are_gpt_oss_configs():
    """Fields left out take GptOssConfig's defaults: sliding layers 0, 2,
    ... (window 128), yarn x32 over 4096 positions (base 150000, truncate
    false), q/k/v/o biases, limit 7 and alpha 1.702."""
    bare = {k: v for k, v in REAL.items() if k not in (
        "layer_types", "sliding_window", "rope_scaling", "rope_theta", "attention_bias",
        "swiglu_limit", "experts_per_token")}
    assert ModelConfig.from_dict(bare) == ModelConfig.from_dict(REAL)
    alpha = ModelConfig.from_dict({**REAL, "swiglu_alpha": 1.5, "swiglu_limit": 3.0})
    assert (alpha.swiglu_alpha, alpha.swiglu_limit) == (1.5, 3.0)
    plain = ModelConfig.from_dict({**REAL, "attention_bias": False})
    assert not plain.qkv_bias and not plain.o_bias and plain.attention_sinks
    # The experts' own activation: transformers never reads hidden_act.
    assert ModelConfig.from_dict({**REAL, "hidden_act": "gelu"}) == ModelConfig.from_dict(REAL)


@pytest.mark.parametrize("fields, match", [
    ({"experts_per_token": 2}, "'experts_per_token' = 2 contradicts num_experts_per_tok"),
    ({"num_experts": 8}, "'num_experts' = 8 contradicts num_local_experts"),
    ({"num_experts_per_tok": 40, "experts_per_token": 40}, "'num_experts_per_tok' = 40 exceeds"),
    ({"router_jitter_noise": 0.0}, "'router_jitter_noise' is not a gpt-oss field"),
    ({"swiglu_limit": -1.0}, "swiglu_limit"),
    ({"swiglu_alpha": "1.7"}, "swiglu_alpha"),
    ({"attention_bias": 1}, "'attention_bias' = 1 must be true or false"),
    ({"hidden_act": 3}, "'hidden_act' = 3 must be a string"),
    ({"attention_dropout": 0.1}, "attention_dropout"),
    ({"layer_types": ["sliding_attention", "chunked_attention"] * 12}, "chunked_attention"),
    ({"layer_types": ["full_attention"] * 3}, "one type for each of the 24 layers"),
    ({"sliding_window": None}, "'sliding_window' is null"),
    ({"rope_scaling": {**REAL["rope_scaling"], "truncate": "no"}}, "truncate"),
    ({"router_aux_loss_coef": "x"}, "router_aux_loss_coef"),
    ({"output_router_logits": 0}, "output_router_logits"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_refusals_name_the_field(fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        ModelConfig.from_dict({**REAL, **fields})


def test_quantization_config_checked(tmp_path):
    bad = {"quant_method": "mxfp4", "group_size": 32}
    with pytest.raises(UnsupportedConfigError, match="quantization_config.group_size"):
        Checkpoint(write_checkpoint(tmp_path / "q", TINY, mxfp4=True, quantization=bad))


# ----------------------------------------------------------------------
# MXFP4 blocks
# ----------------------------------------------------------------------

#: transformers' FP4_VALUES (e2m1), which its converter scales by
#: 2^(scale - 127).
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_repack_follows_transformers_nibble_order():
    """Value 2 j of a checkpoint block is byte j's low nibble, 2 j + 1 its
    high one (transformers' `convert_moe_packed_tensors`), scaled by
    2^(scale - 127); the repacked ggml rows hold the same values."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 5, 2, 16), dtype=np.uint8)
    scales = rng.integers(100, 140, (3, 5, 2), dtype=np.uint8)
    table = np.array(E2M1, np.float32)
    want = np.empty((3, 5, 2, 32), np.float32)
    want[..., 0::2] = table[blocks & 15]
    want[..., 1::2] = table[blocks >> 4]
    want *= np.exp2(scales.astype(np.float32) - 127)[..., None]
    storage = mxfp4.repack(blocks, scales)
    assert storage.shape == (3, 5, 34)
    np.testing.assert_array_equal(packed.dequantize(storage, "mxfp4", (3, 5, 64)),
                                  want.reshape(3, 5, 64))
    back = mxfp4.unpack(storage)
    np.testing.assert_array_equal(back[0], blocks)
    np.testing.assert_array_equal(back[1], scales)
    with pytest.raises(ValueError, match="expected"):
        mxfp4.repack(blocks[..., :8], scales)


# ----------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptoss")
    return {"float": write_checkpoint(root / "float", TINY, seed=goldens.GPT_OSS_SEED),
            "mxfp4": write_checkpoint(root / "mxfp4", TINY, seed=goldens.GPT_OSS_SEED,
                                      mxfp4=True)}


def test_float_layout_splits_gate_and_up(written):
    """transformers' stacks (E, in, 2 f): gate the even columns, up the odd
    ones, turned to (E, out, in); biases split alike."""
    raw = checkpoint_tensors(TINY, goldens.GPT_OSS_SEED)
    w = Checkpoint(written["float"]).weights()
    p = "model.layers.1.mlp.experts."
    np.testing.assert_array_equal(w["l1_experts_gate"], raw[p + "gate_up_proj"][:, :, 0::2]
                                  .transpose(0, 2, 1))
    np.testing.assert_array_equal(w["l1_experts_up"], raw[p + "gate_up_proj"][:, :, 1::2]
                                  .transpose(0, 2, 1))
    np.testing.assert_array_equal(w["l1_experts_down"], raw[p + "down_proj"].transpose(0, 2, 1))
    np.testing.assert_array_equal(w["l1_experts_gate_b"], raw[p + "gate_up_proj_bias"][:, 0::2])
    np.testing.assert_array_equal(w["l1_experts_up_b"], raw[p + "gate_up_proj_bias"][:, 1::2])
    np.testing.assert_array_equal(w["l1_router"], raw["model.layers.1.mlp.router.weight"].T)
    np.testing.assert_array_equal(w["l1_bo"], raw["model.layers.1.self_attn.o_proj.bias"])
    assert Checkpoint(written["float"]).weight_formats() == {}


def test_mxfp4_experts_stay_packed(written):
    """OpenAI's MXFP4 experts: kept packed (mxfp4 storage, gate and up rows
    split), or dequantized to the values transformers' converter gives
    (checkpoint_tensors(mxfp4=True)); sinks stay float32 in bf16."""
    ck = Checkpoint(written["mxfp4"])
    formats = ck.weight_formats()
    assert formats == {f"l{i}_experts_{k}": "mxfp4" for i in range(2)
                       for k in ("gate", "up", "down")}
    kept = ck.weights("bf16", formats=formats)
    wide = ck.weights("f32")
    want = checkpoint_tensors(TINY, goldens.GPT_OSS_SEED, mxfp4=True)
    p = "model.layers.0.mlp.experts."
    assert kept["l0_experts_gate"].dtype == np.uint8 and \
        kept["l0_experts_gate"].shape == (4, 32, 17)
    for key, value in (("gate", want[p + "gate_up_proj"][:, :, 0::2].transpose(0, 2, 1)),
                       ("up", want[p + "gate_up_proj"][:, :, 1::2].transpose(0, 2, 1)),
                       ("down", want[p + "down_proj"].transpose(0, 2, 1))):
        np.testing.assert_array_equal(wide[f"l0_experts_{key}"], value)
        np.testing.assert_array_equal(
            packed.dequantize(kept[f"l0_experts_{key}"], "mxfp4", value.shape), value)
    assert kept["l0_sinks"].dtype == np.float32 and kept["l0_bq"].dtype == np.uint16


def test_checkpoint_errors_name_the_tensor(tmp_path):
    path = write_checkpoint(tmp_path / "a", TINY, mxfp4=True,
                            drop=("model.layers.1.self_attn.sinks",))
    with pytest.raises(MissingTensorError, match="model.layers.1.self_attn.sinks"):
        Checkpoint(path).weights()
    path = write_checkpoint(tmp_path / "b", TINY, drop=("model.layers.0.mlp.router.bias",))
    with pytest.raises(MissingTensorError, match="router.bias"):
        Checkpoint(path).weights()
    # A scale no quantizer writes (above 252): the file is damaged.
    path = write_checkpoint(tmp_path / "c", TINY, mxfp4=True)
    from etc.models.loading.safetensors import SafetensorsFile, save_file

    file = SafetensorsFile(path / "model.safetensors")
    tensors = {n: (file.read_bytes(n) if file.dtype(n) == "U8" else file.read(n)) for n in file}
    name = "model.layers.1.mlp.experts.down_proj_scales"
    tensors[name][2, 3, 0] = 255
    save_file(path / "model.safetensors", tensors,
              dtypes={n: "U8" for n in file if file.dtype(n) == "U8"})
    with pytest.raises(CheckpointError, match="expert 2: block 3 has a scale above 252"):
        Checkpoint(path).weights()


# ----------------------------------------------------------------------
# The forward pass against transformers
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n in goldens.cases() if n.startswith("gpt_oss")))
def test_numpy_forward_matches_transformers(name, tmp_path):
    """The NumPy forward pass (float32) over the checkpoint as ETC reads it
    (MXFP4 experts repacked) is transformers' within the golden's dtype
    tolerance: biases, sinks, windows, yarn, the router's bias and the
    clamped SwiGLU as transformers computes them."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    weights = checkpoint.weights()
    rows = np.concatenate([reference.forward(checkpoint.config, weights, s[:-1])
                           for s in golden.sequences()])
    golden.check_logits(rows)


def test_real_width_step_graph_builds():
    """gpt-oss-20b's widths (hidden 2880, not a power of two; 32 experts,
    MXFP4) in a 2-layer step graph: one sliding and one full layer; and
    one rank's shard of it over 2 ranks (its 32 query heads and their
    sinks, 1440 columns of every expert: 45 whole MXFP4 blocks of the down
    experts' K). Over 4 and 8 ranks, 720 and 360 columns are not whole
    blocks: each rank's share is 23 and 12 blocks, padded, and the experts
    stay packed."""
    from etc.models.step.graph import build_step_graph
    from etc.models.step.parallel import padded_blocks, shard_config, unaligned_packed

    config = ModelConfig.from_dict(shaped_config("gpt-oss-20b"))
    assert config.sliding_layers == (0,)
    formats = {f"l{i}_experts_{k}": "mxfp4" for i in range(2) for k in ("gate", "up", "down")}
    g = build_step_graph(config, dtype="bf16", max_seq_len=256, chunk=64,
                         weight_formats=formats)
    assert g is not None
    assert unaligned_packed(config, formats, 2) == {}
    shard = shard_config(config, 2)
    assert (shard.num_heads, shard.num_kv_heads, shard.moe_intermediate_size) == (32, 4, 1440)
    g = build_step_graph(shard, dtype="bf16", max_seq_len=256, chunk=64, ranks=2,
                         weight_formats=formats)
    assert g is not None
    for ranks, share in ((4, 736), (8, 384)):
        padding = padded_blocks(config, formats, ranks)
        assert padding == {"moe_intermediate_size": 32}
        assert unaligned_packed(config, formats, ranks) == {}
        shard = shard_config(config, ranks, padding)
        assert shard.moe_intermediate_size == share
        g = build_step_graph(shard, dtype="bf16", max_seq_len=256, chunk=64, ranks=ranks,
                             weight_formats=formats)
        assert g is not None


# ----------------------------------------------------------------------
# The compiled step
# ----------------------------------------------------------------------

PROMPTS = goldens.PROMPTS
#: Chunks of 4 positions, blocks of 4 (the prompts outgrow the window of 3).
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=4, kv_block_size=4)


def test_compiled_matches_numpy_by_teacher_forcing(written):
    """float32, float experts: each new token's logits are the NumPy
    forward pass's (sinks, o bias, windows, router bias, expert biases and
    clamps in the compiled kernels), and each token their argmax."""
    import etc.models as models

    checkpoint = Checkpoint(written["float"])
    out = models.load(written["float"], **LOAD).generate(PROMPTS, goldens.NEW,
                                                         return_logits=True)
    weights = checkpoint.weights()
    for r, prompt in enumerate(PROMPTS):
        sequence = list(prompt) + out.tokens[r]
        want = reference.forward(checkpoint.config, weights, sequence[:-1])
        np.testing.assert_allclose(out.logits[r], want[len(prompt) - 1:], rtol=2e-4,
                                   atol=2e-4, err_msg=f"prompt {r}")
        assert out.tokens[r] == [int(np.argmax(row)) for row in out.logits[r]]


def test_compiled_mxfp4_matches_the_transformers_golden(tmp_path):
    """bf16, MXFP4 experts kept packed (the packed expert tiles, int8
    activations): every prefix's logits within the bf16 tolerance of
    transformers', and `generate`'s greedy tokens transformers' (paged
    cache)."""
    import etc.models as models

    golden = goldens.Golden.load("gpt_oss_mxfp4-transformers4-bf16")
    model = models.load(golden.write_checkpoint(tmp_path / "m"), dtype="bf16", **LOAD)
    assert set(model.weight_formats.values()) == {"mxfp4"}
    golden.check_model(model)


# ----------------------------------------------------------------------
# GGUF (llama.cpp's `gpt-oss`)
# ----------------------------------------------------------------------

#: MXFP4_MOE's layout: experts MXFP4, the other matrices Q8_0.
MXFP4_MOE = {f"blk.{i}.ffn_{p}_exps.weight": "MXFP4" for i in range(2)
             for p in ("gate", "up", "down")}


def test_gguf_reads_as_the_checkpoint(tmp_path):
    """A `gpt-oss` file (as llama.cpp's converter writes it: sinks as
    attn_sinks.weight, the MLP norm as post_attention_norm, gate/up split,
    expert biases, yarn's factor and original context) reads as the
    checkpoint does, but for yarn's truncate: llama.cpp rounds the
    correction range (truncate true). Its MXFP4 experts stay packed."""
    from etc.models.loading.gguf import GGUFCheckpoint

    config = tiny_config("GptOssForCausalLM", swiglu_limit=7.0)  # llama.cpp's clamp
    ours = Checkpoint(write_checkpoint(tmp_path / "c", config, seed=3))
    gg = GGUFCheckpoint(write_gguf(tmp_path / "f32.gguf", config, seed=3))
    assert gg.config.rope_scaling == {**ours.config.rope_scaling, "truncate": True}
    assert dataclasses.replace(gg.config, rope_scaling=ours.config.rope_scaling) == ours.config
    want, got = ours.weights(), gg.weights()
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    packed_file = GGUFCheckpoint(write_gguf(tmp_path / "mx.gguf", config, seed=3,
                                            tensor_type="Q8_0", tensor_types=MXFP4_MOE))
    formats = packed_file.weight_formats()
    assert {k: v for k, v in formats.items() if "experts" in k} == \
        {f"l{i}_experts_{p}": "mxfp4" for i in range(2) for p in ("gate", "up", "down")}
    kept = packed_file.weights(formats=formats)
    np.testing.assert_array_equal(kept["l1_experts_up"],
                                  packed.quantize(want["l1_experts_up"], "mxfp4"))


def test_gguf_refusals_name_the_key(tmp_path):
    from etc.models.loading.gguf import GGUFCheckpoint, GGUFError

    config = tiny_config("GptOssForCausalLM", swiglu_limit=7.0)
    for metadata, match in (({"gpt-oss.swiglu_clamp_exp": 3.0}, "swiglu_clamp_exp"),
                            ({"gpt-oss.rope.scaling.attn_factor": 2.0}, "attn_factor"),
                            # yarn as llama.cpp derives it from the factor: no
                            # key that would change it is ignored.
                            ({"gpt-oss.rope.scaling.yarn_ext_factor": 0.5},
                             r"yarn_ext_factor = 0\.5 is not supported"),
                            ({"gpt-oss.rope.scaling.yarn_attn_factor": 1.2},
                             "yarn_attn_factor"),
                            ({"gpt-oss.rope.scaling.yarn_log_multiplier": 0.1},
                             "yarn_log_multiplier")):
        path = write_gguf(tmp_path / "m.gguf", config, metadata=metadata)
        with pytest.raises(UnsupportedConfigError, match=match):
            GGUFCheckpoint(path)
    fused = np.zeros((4, 64, 32), np.float32)
    path = write_gguf(tmp_path / "fused.gguf", config, raw_tensors={
        "blk.0.ffn_gate_up_exps.weight": (fused.view(np.uint8).reshape(4, 64, 128), "F32")})
    with pytest.raises(GGUFError, match="ffn_gate_up_exps"):
        GGUFCheckpoint(path).weights()


def test_gguf_matches_llama_cpp(tmp_path):
    """llama.cpp (llama-cpp-python 0.3.36) on a `gpt-oss` file
    `write_gguf` wrote (gguf_goldens.RUNS): the NumPy forward pass on the
    config and weights ETC reads from the same file is within 0.05 of the
    logits' rms at every position (measured 0.005: llama.cpp's KV cache is
    f16); yarn without llama.cpp's rounding of the correction range
    (truncate false, what config.json says) misses by over 0.3 (measured
    0.66), and so does attention without sinks."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run("gpt_oss", tmp_path)

    def error(config, weights=weights):
        ours = reference.forward(config, weights, run["sequence"])
        return gguf_goldens.run_error(run, ours)

    assert error(gg.config) < 0.05
    untruncated = {**gg.config.rope_scaling, "truncate": False}
    assert error(dataclasses.replace(gg.config, rope_scaling=untruncated)) > 0.3
    no_sinks = {k: (np.full_like(v, -1e30) if k.endswith("_sinks") else v)
                for k, v in weights.items()}
    assert error(gg.config, no_sinks) > 0.3
