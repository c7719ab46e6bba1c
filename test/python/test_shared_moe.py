"""MoE layers with a shared expert: Qwen2-MoE (Qwen2MoeForCausalLM: a
SwiGLU shared expert gated per token by sigmoid(x . w), q/k/v biases,
weights not renormalised) and Granite MoE with shared experts
(GraniteMoeSharedForCausalLM: Granite MoE plus an ungated shared MLP,
fused gate/up). What is specific to them: the `sigmoid_mul` operator
(the gate, a column broadcast over its row), their configs and refusals,
that the shared expert and its gate matter, Qwen2-MoE's dense layers
(`mlp_only_layers`, `decoder_sparse_step`), tensor-parallel shards of the
shared expert, their GGUF files (`qwen2moe`, `granitemoe` with
`ffn_*_shexp`) against llama.cpp itself. The rest (teacher forcing,
paged, chunked, static schedule, CUDA lanes, half precision,
transformers' goldens and greedy tokens, GGUF Q8_0 packed, tensor
parallel over MPI) is test_families.py's, parametrised over them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import etc
import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig, UnsupportedConfigError
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.step import reference
from etc.models.step.parallel import shard_config, shard_weights
from etc.models.testing import as_transformers5, tiny_config, write_checkpoint, write_gguf
from test_family_ops import KERNELS, _check

import hf_goldens_families as goldens
from reference_change import rms_change

QWEN, GRANITE = "Qwen2MoeForCausalLM", "GraniteMoeSharedForCausalLM"
GLM = "Glm4MoeForCausalLM"
PROMPTS = [[5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=4, kv_block_size=4)


# ----------------------------------------------------------------------
# sigmoid_mul
# ----------------------------------------------------------------------


@pytest.mark.parametrize("options", KERNELS, ids=["cpu", "cuda"])
@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("bf16", 2e-2)])
def test_sigmoid_mul_gates_each_row(options, dtype, tol):
    """sigmoid(gate) * x with the gate a column (R, 1), from a matmul of one
    output column (the shared expert's gate logit): every row scaled by
    its own gate, full tiles and a partial edge one (96 = 64 + 32
    columns), logits where exp overflows and vanishes."""
    g = etc.Graph("gate")
    R = g.symbol("R")
    h = g.input("h", (R, 32), dtype)
    w = g.input("w", (1, 32), dtype)
    x = g.input("x", (R, 96), dtype)
    g.output(g.sigmoid_mul(g.matmul(h, w, transpose_b=True), x))
    rng = np.random.default_rng(7)
    hs = rng.standard_normal((5, 32)).astype(np.float32)
    ws = rng.standard_normal((1, 32)).astype(np.float32) / 4
    hs[0] = 400.0 * np.sign(ws[0])  # the logit far past exp's range: gate 1
    hs[1] = -hs[0]  # and gate 0
    xs = rng.standard_normal((5, 96)).astype(np.float32)
    _check(g, {"h": hs, "w": ws, "x": xs}, dtype, options, tol)
    if dtype != "f32":
        return
    got, = etc.reference.evaluate(g, h=hs, w=ws, x=xs)
    with np.errstate(over="ignore"):  # exp(400): inf, the gate 0
        want = xs / (1 + np.exp(-(hs @ ws.T)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[0], xs[0])
    assert np.abs(got[1]).max() == 0


def test_sigmoid_mul_needs_a_column_per_row():
    g = etc.Graph("bad")
    R, S = g.symbol("R"), g.symbol("S")
    x = g.input("x", (R, 64))
    for shape in ((R, 2), (S, 1), (64,)):
        gate = g.input(f"g{len(g.inputs)}", shape)
        with pytest.raises(ValueError,
                           match=r"sigmoid_mul: .*(must be a column \(R, 1\)|rank 1)"):
            g.sigmoid_mul(gate, x)
    with pytest.raises(ValueError, match=r"sigmoid_mul: mixed dtypes"):
        g.sigmoid_mul(g.input("g16", (R, 1), "bf16"), x)
    with pytest.raises(ValueError, match=r"sigmoid_mul: out= tensor 'small' has shape"):
        g.sigmoid_mul(g.input("g", (R, 1)), x, out=g.tensor("small", (R, 32)))


def test_sigmoid_mul_writes_out():
    """`out=` takes the result as it does for silu_mul and gelu_mul."""
    g = etc.Graph("gate_out")
    R = g.symbol("R")
    gate, x = g.input("gate", (R, 1)), g.input("x", (R, 64))
    buf = g.tensor("buf", (R, 64))
    assert g.sigmoid_mul(gate, x, out=buf) is buf
    g.output(g.add(buf, x))
    gs = np.array([[0.0], [2.0], [-3.0]], np.float32)
    xs = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    got, = etc.reference.evaluate(g, gate=gs, x=xs)
    np.testing.assert_allclose(got, xs / (1 + np.exp(-gs)) + xs, rtol=1e-6)


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


#: Qwen1.5-MoE-A2.7B's config.json, every field as published.
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}


def test_qwen2_moe_config_follows_transformers():
    """Qwen1.5-MoE-A2.7B's published config: 60 experts of 1408, 4 per
    token, not renormalised, a gated shared expert of 5632 in every layer,
    q/k/v biases, no window; both config styles alike; transformers'
    rule for the sparse layers; `qkv_bias` false drops the biases."""
    config = ModelConfig.from_dict(QWEN15_MOE)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size) == (60, 4, 1408, 5632)
    assert config.shared_expert_gate and config.qkv_bias and not config.norm_topk_prob
    assert config.sparse_layers == tuple(range(24)) and config.sliding_window is None
    assert config.rope_theta == 1e6 and not config.qk_norm
    tiny = tiny_config(QWEN)
    assert ModelConfig.from_dict(as_transformers5(tiny)) == ModelConfig.from_dict(tiny)
    mixed = ModelConfig.from_dict(tiny_config(QWEN, num_hidden_layers=6, decoder_sparse_step=2,
                                              mlp_only_layers=[3]))
    assert mixed.sparse_layers == (1, 5) and mixed.intermediate_size == 48
    assert not ModelConfig.from_dict(tiny_config(QWEN, qkv_bias=False)).qkv_bias


def test_granite_moe_shared_config_follows_transformers():
    """GraniteMoeShared: Granite MoE's fields and multipliers, and the
    shared MLP's width; `shared_intermediate_size` 0 or absent (its
    default) is Granite MoE's layer, without a shared MLP."""
    config = ModelConfig.from_dict(tiny_config(GRANITE))
    assert (config.num_experts, config.moe_intermediate_size,
            config.shared_expert_intermediate_size, config.shared_expert_gate) == (4, 32, 64,
                                                                                  False)
    assert config.residual_multiplier == 2.2 and config.sparse_layers == (0, 1)
    assert ModelConfig.from_dict(as_transformers5(tiny_config(GRANITE))) == config
    for none in ({"shared_intermediate_size": 0}, {}):
        raw = {k: v for k, v in tiny_config(GRANITE).items() if k != "shared_intermediate_size"}
        assert ModelConfig.from_dict({**raw, **none}).shared_expert_intermediate_size == 0


@pytest.mark.parametrize("architecture, fields, message", [
    (QWEN, {"shared_expert_intermediate_size": None},
     r"field 'shared_expert_intermediate_size' is missing \(required for Qwen2MoeForCausalLM\)"),
    (QWEN, {"shared_expert_intermediate_size": -8},
     r"field 'shared_expert_intermediate_size' = -8 must be a positive integer"),
    (QWEN, {"use_sliding_window": True},
     r"field 'use_sliding_window' = True is not supported for Qwen2MoeForCausalLM"),
    (QWEN, {"qkv_bias": "yes"}, r"field 'qkv_bias' = 'yes' must be true or false"),
    (QWEN, {"num_experts_per_tok": 5}, r"'num_experts_per_tok' = 5 exceeds num_experts = 4"),
    (QWEN, {"mlp_bias": True}, r"field 'mlp_bias' = True is not supported"),
    (QWEN, {"hidden_act": "gelu"}, r"field 'hidden_act' = 'gelu' is not supported"),
    (QWEN, {"output_router_logits": 1}, r"field 'output_router_logits' = 1 must be true or"),
    ("Qwen3MoeForCausalLM", {"shared_expert_intermediate_size": 64},
     r"'shared_expert_intermediate_size' is not supported for Qwen3MoeForCausalLM"),
    (GRANITE, {"shared_intermediate_size": 2.5},
     r"field 'shared_intermediate_size' = 2.5 must be a positive integer"),
    (GRANITE, {"shared_intermediate_size": True},
     r"field 'shared_intermediate_size' = True must be a positive integer"),
    (GRANITE, {"num_local_experts": None},
     r"field 'num_local_experts' is missing \(required for GraniteMoeSharedForCausalLM\)"),
])
def test_malformed_configs_are_refused_naming_the_field(architecture, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        ModelConfig.from_dict(tiny_config(architecture, **fields))


# ----------------------------------------------------------------------
# Numerics
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    return {a: Checkpoint(write_checkpoint(root / a, tiny_config(a), seed=4))
            for a in (QWEN, GRANITE)}


@pytest.mark.parametrize("architecture", [QWEN, GRANITE])
def test_the_shared_expert_and_its_gate_matter(architecture, checkpoints):
    """The tiny models' logits move by a good part of their rms without the
    shared expert (its down projection zero), and Qwen2-MoE's without its
    gate (a gate of 1: logits 0 of the gate vector would give 1/2)."""
    c = checkpoints[architecture]
    weights = c.weights()
    zero = {k: np.zeros_like(v) if k.endswith("shexp_down") else v for k, v in weights.items()}
    assert rms_change(c.config, weights, changed_weights=zero) > 0.1
    if architecture == QWEN:
        ungated = dataclasses.replace(c.config, shared_expert_gate=False)
        assert rms_change(c.config, weights, ungated) > 0.1


@pytest.mark.parametrize("name", [n for n in goldens.cases()
                                  if n.startswith(("qwen2_moe-", "granite_moe_shared-"))])
def test_numpy_forward_matches_the_transformers_goldens(name, tmp_path):
    """The NumPy forward pass on the golden checkpoints (float32 compute,
    the bf16 case's weights as stored) is within the goldens' tolerance
    of transformers' logits at every position (measured 0.011 and 0.034 of
    it in f32, 0.08 and 0.21 against transformers' bf16), and far outside
    it without the shared expert (over 2 times it in bf16, thousands in
    f32)."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), {
        "no shared expert": lambda c, w: (c, {k: np.zeros_like(v) if k.endswith("shexp_down")
                                              else v for k, v in w.items()})}, miss=2)


def test_granite_shared_mlp_is_gate_rows_then_up_rows(checkpoints):
    """input_linear's first half is the gate, its second the up projection
    (transformers' chunk(2)), as split at load."""
    c = checkpoints[GRANITE]
    weights = c.weights()
    fused = c.tensor("model.layers.1.shared_mlp.input_linear.weight", (128, 32), "fused")
    np.testing.assert_array_equal(weights["l1_shexp_gate"], fused[:64])
    np.testing.assert_array_equal(weights["l1_shexp_up"], fused[64:])


def test_qwen2_moe_dense_and_sparse_layers_compile_as_numpy(tmp_path):
    """Qwen2-MoE with layer 1 dense (`mlp_only_layers`) and layer 0 with
    experts and a shared expert, no q/k/v biases: the compiled model's
    logits are the NumPy forward pass's (teacher forcing)."""
    config = tiny_config(QWEN, mlp_only_layers=[1], qkv_bias=False)
    path = write_checkpoint(tmp_path / "mixed", config, seed=9)
    checkpoint = Checkpoint(path)
    assert checkpoint.config.sparse_layers == (0,) and not checkpoint.config.qkv_bias
    weights = checkpoint.weights()
    assert "l0_shexp_gate_inp" in weights and "l1_w_down" in weights
    assert not any(k.startswith("l1_shexp") or k.endswith("_bq") for k in weights)
    out = models.load(path, **LOAD).generate(PROMPTS, 3, return_logits=True)
    for r, prompt in enumerate(PROMPTS):
        sequence = list(prompt) + out.tokens[r]
        want = reference.forward(checkpoint.config, weights, sequence[:-1])[len(prompt) - 1:]
        np.testing.assert_allclose(out.logits[r], want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("architecture, change, match", [
    # Granite MoE's shared MLP switched off: its tensors would go unused.
    (GRANITE, {"shared_intermediate_size": 0},
     r"'model\.layers\.0\.shared_mlp\.input_linear\.weight' is a shared expert's, but .* "
     r"layer 0 \(field 'shared_intermediate_size' gives none\)"),
    (GLM, {"n_shared_experts": 0}, r"'model\.layers\.1\.mlp\.shared_experts\.down_proj\.weight'"
                                   r".*field 'n_shared_experts' gives none"),
    # Layer 1 made dense: its shared expert too.
    (QWEN, {"mlp_only_layers": [1]}, r"'model\.layers\.1\.mlp\.shared_expert\.down_proj\.weight'"
                                     r" .* \(layer 1 is dense\)"),
    # Another family's weights under a family without shared experts.
    (QWEN, {"architectures": ["Qwen3MoeForCausalLM"], "shared_expert_intermediate_size": None},
     r"\(Qwen3MoeForCausalLM has no shared expert\)"),
    ("DeepseekV3ForCausalLM", {"n_shared_experts": 0}, r"field 'n_shared_experts' gives none"),
    ("Ernie4_5_MoeForCausalLM", {"moe_num_shared_experts": 0},
     r"field 'moe_num_shared_experts' gives none"),
])
def test_shared_expert_weights_a_config_leaves_out_are_refused(tmp_path, architecture, change,
                                                               match):
    """A checkpoint with a shared expert's weights where config.json has
    none (transformers would leave them unused, with a warning) is
    refused naming a tensor, the layer and the field."""
    path = write_checkpoint(tmp_path / "ckpt", tiny_config(architecture), seed=1)
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    (path / "config.json").write_text(json.dumps(
        {k: v for k, v in config.items() if v is not None}))
    with pytest.raises(UnsupportedConfigError, match=match):
        Checkpoint(path)


@pytest.mark.parametrize("architecture", [QWEN, GRANITE])
def test_tensor_parallel_shards_split_the_shared_expert(architecture, checkpoints):
    """Over 2 ranks each keeps half the shared expert's columns (gate and
    up rows, down columns) and the whole gate vector; the ranks' shards
    of the NumPy forward pass's MLP sum to the whole one (the partial sums
    the all-reduce adds)."""
    c = checkpoints[architecture]
    weights = c.weights()
    config = shard_config(c.config, 2)
    assert config.shared_expert_intermediate_size == 32
    for rank in range(2):
        shard = shard_weights(c.config, weights, 2, rank)
        rows = slice(32 * rank, 32 * (rank + 1))
        np.testing.assert_array_equal(shard["l0_shexp_gate"], weights["l0_shexp_gate"][rows])
        np.testing.assert_array_equal(shard["l0_shexp_up"], weights["l0_shexp_up"][rows])
        np.testing.assert_array_equal(shard["l0_shexp_down"], weights["l0_shexp_down"][:, rows])
        if architecture == QWEN:
            np.testing.assert_array_equal(shard["l0_shexp_gate_inp"],
                                          weights["l0_shexp_gate_inp"])
    with pytest.raises(ValueError, match=r"shared_expert_intermediate_size = 64 is not "
                                         r"divisible by 3"):
        shard_config(dataclasses.replace(c.config, num_heads=6, num_kv_heads=3,
                                         moe_intermediate_size=33), 3)


# ----------------------------------------------------------------------
# GGUF
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2_moe", "granite_moe_shared"])
def test_gguf_computes_what_llama_cpp_computes(name, tmp_path):
    """Qwen2-MoE and GraniteMoeShared GGUF files as llama.cpp's converter
    lays them out (`qwen2moe`: ffn_*_shexp and the gate vector
    ffn_gate_inp_shexp; `granitemoe` with expert_shared_feed_forward_length
    and the shared MLP split into ffn_{gate,up}_shexp), run by llama.cpp
    itself (its logits in goldens/gguf-<name>-llama-cpp.npz by
    gguf_goldens.py --runs; llama-cpp-python 0.3.36): the NumPy forward
    pass on what ETC reads from the file is within 0.05 of the logits' rms
    of llama.cpp's at every position (measured 0.011 and 0.014), and misses
    by far without the shared expert (3.1 and 6.4), Qwen2-MoE's without its
    gate (1.8) or with its weights renormalised (1.1)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(name, tmp_path)
    assert gg.config.shared_expert_intermediate_size == 64

    def error(w, config=gg.config):
        return gguf_goldens.run_error(run, reference.forward(config, w, run["sequence"]))

    assert error(weights) < 0.05
    zero = {k: np.zeros_like(v) if k.endswith("shexp_down") else v for k, v in weights.items()}
    assert error(zero) > 1
    if gg.config.shared_expert_gate:
        assert error(weights, dataclasses.replace(gg.config, shared_expert_gate=False)) > 0.5
        assert error(weights, dataclasses.replace(gg.config, norm_topk_prob=True)) > 0.5


def test_gguf_shared_expert_keys_and_refusals(tmp_path):
    """A qwen2moe file's gate vector (h,), as llama.cpp creates it, is read
    as the checkpoint's (1, h); a Q8_0 file's shared expert stays packed; a
    file that says llama.cpp would
    renormalise is refused; a
    granitemoe file with shared tensors but no width key is refused,
    naming the key."""
    config = tiny_config(QWEN)
    st = Checkpoint(write_checkpoint(tmp_path / "st", config, seed=3))
    flat = GGUFCheckpoint(write_gguf(tmp_path / "flat.gguf", config, seed=3))
    assert flat._tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (32,)
    np.testing.assert_array_equal(flat.weights()["l0_shexp_gate_inp"],
                                  st.weights()["l0_shexp_gate_inp"])
    assert flat.config == st.config
    # Quantized, the shared expert's projections stay packed as dense ones
    # do (test_families.py runs them); the gate vector is F32, widened.
    q8 = GGUFCheckpoint(write_gguf(tmp_path / "q8.gguf", config, seed=3, tensor_type="Q8_0"))
    formats = q8.weight_formats()
    assert {f"l{i}_shexp_{p}": "q8_0" for i in range(2) for p in ("gate", "up", "down")}.items() \
        <= formats.items() and "l0_shexp_gate_inp" not in formats
    renormalised = write_gguf(tmp_path / "norm.gguf", config,
                              metadata={"qwen2moe.expert_weights_norm": True})
    with pytest.raises(UnsupportedConfigError, match=r"qwen2moe.expert_weights_norm = True is "
                                                     r"not supported"):
        GGUFCheckpoint(renormalised)
    unsized = write_gguf(tmp_path / "unsized.gguf", tiny_config(GRANITE),
                         metadata={"granitemoe.expert_shared_feed_forward_length": None})
    with pytest.raises(UnsupportedConfigError, match=r"granitemoe.expert_shared_feed_forward_"
                                                     r"length is missing"):
        GGUFCheckpoint(unsized)


@pytest.mark.parametrize("width", [0, None])
def test_gguf_shared_tensors_the_metadata_leaves_unread_are_refused(tmp_path, width):
    """A granitemoe file with the shared MLP's tensors but a width key of 0
    or none describes a model without one (llama.cpp then creates no
    shared tensors and refuses the file: "wrong number of tensors"): the
    tensors are refused by name with the key, not left unread."""
    path = write_gguf(tmp_path / "shared.gguf", tiny_config(GRANITE),
                      metadata={"granitemoe.expert_shared_feed_forward_length": width})
    said = "= 0" if width == 0 else "is missing"
    with pytest.raises(UnsupportedConfigError,
                       match=rf"shared-expert tensors \(blk\.0\.ffn_down_shexp\.weight, .* "
                             rf"and 3 more\) .*granitemoe\.expert_shared_feed_forward_length "
                             rf"{said}"):
        GGUFCheckpoint(path)
    # Without the tensors, the same metadata is Granite MoE without a shared MLP.
    plain = write_gguf(tmp_path / "plain.gguf", tiny_config(GRANITE),
                       metadata={"granitemoe.expert_shared_feed_forward_length": width},
                       drop=tuple(f"blk.{i}.ffn_{p}_shexp.weight" for i in range(2)
                                  for p in ("gate", "up", "down")))
    assert GGUFCheckpoint(plain).config.architecture == "GraniteMoeForCausalLM"


def test_gguf_shared_tensors_of_a_family_without_them_are_refused(tmp_path):
    """An olmoe file (a family without shared experts) with a shared
    expert's tensor: refused as granitemoe's without the width."""
    shexp = np.zeros((48, 32), np.float32)
    olmoe = write_gguf(tmp_path / "olmoe.gguf", tiny_config("OlmoeForCausalLM"), raw_tensors={
        "blk.1.ffn_up_shexp.weight": (shexp.view(np.uint8).reshape(48, 128), "F32")})
    with pytest.raises(UnsupportedConfigError, match=r"\(blk\.1\.ffn_up_shexp\.weight\) .* "
                                                     r"this olmoe model has no shared expert"):
        GGUFCheckpoint(olmoe)


@pytest.mark.parametrize("architecture, arch", [("DeepseekV3ForCausalLM", "deepseek2"),
                                                ("Glm4MoeForCausalLM", "glm4moe")])
def test_gguf_shared_tensors_name_the_count_key(tmp_path, architecture, arch):
    """deepseek2 and glm4moe files say their shared experts by count: with
    expert_shared_count 0 and the tensors there, the refusal names that key."""
    path = write_gguf(tmp_path / "m.gguf", tiny_config(architecture),
                      metadata={f"{arch}.expert_shared_count": 0})
    with pytest.raises(UnsupportedConfigError, match=rf"GGUF metadata {arch}\.expert_shared_count "
                                                     rf"= 0, so this {arch} model has no shared"):
        GGUFCheckpoint(path)


def test_gguf_qwen2moe_shared_width_defaults_to_the_mlps(tmp_path):
    """Without expert_shared_feed_forward_length (or 0), llama.cpp's
    qwen2moe gives the shared expert feed_forward_length's width (its
    tensors required): the same model as with the key (llama-cpp-python
    0.3.36 computes the same logits for both files); a width the tensors
    do not have is refused naming the tensor."""
    config = tiny_config(QWEN, intermediate_size=64)
    assert config["shared_expert_intermediate_size"] == 64
    keyed = GGUFCheckpoint(write_gguf(tmp_path / "keyed.gguf", config, seed=3))
    for width in (None, 0):
        unkeyed = GGUFCheckpoint(write_gguf(
            tmp_path / f"unkeyed{width}.gguf", config, seed=3,
            metadata={"qwen2moe.expert_shared_feed_forward_length": width}))
        assert unkeyed.config == keyed.config
        assert unkeyed.config.shared_expert_intermediate_size == 64
    weights = unkeyed.weights()
    np.testing.assert_array_equal(weights["l1_shexp_down"], keyed.weights()["l1_shexp_down"])
    narrow = write_gguf(tmp_path / "narrow.gguf", tiny_config(QWEN), seed=3,
                        metadata={"qwen2moe.expert_shared_feed_forward_length": None})
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_shexp\.weight' .* has shape "
                                         r"\(64, 32\), expected \(48, 32\)"):
        GGUFCheckpoint(narrow).weights()
