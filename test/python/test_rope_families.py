"""Phi-4-mini (partial rotary, LongRoPE) and SmolLM3 (NoPE layers): their
configs read as transformers reads them and refused where ETC would
compute otherwise, partial rotary's q/k layout (`etc.models.loading.
partial_rotary`), and the NumPy forward pass against transformers' goldens
and llama.cpp's runs of their GGUF files, with the mistakes those would
catch (no permutation, NoPE layers misplaced). The compiled models of both
are checked in test_families.py (the families `phi4_mini` and `smollm3`:
teacher forcing, paged, chunked, goldens in every dtype, GGUF, tensor
parallel)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from etc.models.loading import partial_rotary
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ARCHITECTURES, ModelConfig, UnsupportedConfigError
from etc.models.step import reference
from etc.models.testing import as_transformers5, checkpoint_tensors, tiny_config, write_checkpoint

import hf_goldens_families as goldens

PHI4 = goldens.FAMILIES["phi4_mini"]
SMOL = goldens.FAMILIES["smollm3"]


def read(base: dict, **fields) -> ModelConfig:
    return ModelConfig.from_dict({**base, **fields})


# ----------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------


def test_phi4_mini_config_partial_rotary_and_longrope():
    """partial_rotary_factor 0.75 of head size 8: 6 rotated dimensions;
    LongRoPE's factors, its original context (Phi3Config's top-level field,
    4096 when absent, preferred to a nested one as transformers prefers
    it), its attention factor sqrt(1 + ln(128 / 32) / ln 32) on the rotated
    dimensions only (not in the attention scale); the step graph's tables
    padded with frequency 0 for the pair left alone, short factors up to a
    context of the original 32 positions, long ones past it."""
    c = ModelConfig.from_dict(PHI4)
    assert (c.rotary_dim, c.rotated, c.head_dim) == (6, 6, 8)
    s = c.rope_scaling
    assert (s["rope_type"], s["short_factor"], s["long_factor"]) == \
        ("longrope", (1.0, 1.25, 2.0), (1.5, 3.0, 8.0))
    assert (s["original_max_position_embeddings"], s["factor"]) == (32, 4.0)
    assert c.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(32)))
    assert c.attention_scale_of(0) == c.attention_scale == 1 / math.sqrt(8)
    plain = 1 / 10000.0 ** (np.arange(0, 6, 2) / 6)
    for context, factors in ((32, s["short_factor"]), (33, s["long_factor"])):
        table = c.rope_tables(context)["inv_freq"]
        np.testing.assert_allclose(table, np.append(plain / factors, 0.0), rtol=1e-6)
    np.testing.assert_array_equal(c.rope_tables()["inv_freq"], c.rope_tables(32)["inv_freq"])
    # The original context: top-level wins over nested, else 4096.
    nested = {**PHI4["rope_scaling"], "original_max_position_embeddings": 8}
    assert read(PHI4, rope_scaling=nested).rope_scaling[
        "original_max_position_embeddings"] == 32
    absent = {k: v for k, v in PHI4.items() if k != "original_max_position_embeddings"}
    assert ModelConfig.from_dict(absent).rope_scaling["original_max_position_embeddings"] == 4096
    # An attention factor given is taken as given.
    given = {**PHI4["rope_scaling"], "attention_factor": 1.5}
    assert read(PHI4, rope_scaling=given).rope_attention_factor == 1.5
    # transformers 5's nesting reads the same.
    assert ModelConfig.from_dict(as_transformers5(PHI4)) == c
    assert "partial_rotary_factor" in as_transformers5(PHI4)["rope_parameters"]


@pytest.mark.parametrize("fields, match", [
    (dict(partial_rotary_factor=0), r"'partial_rotary_factor' = 0 must be a number in \(0, 1\]"),
    (dict(partial_rotary_factor=1.5), r"'partial_rotary_factor' = 1.5 must be"),
    (dict(partial_rotary_factor="0.75"), r"'partial_rotary_factor' = '0.75' must be"),
    (dict(partial_rotary_factor=0.625), r"rotates int\(8 x 0.625\) = 5 dimensions of each "
                                        r"head: RoPE needs an even count"),
    (dict(partial_rotary_factor=0.5), r"LongRoPE has 3 short_factor and long_factor values; 4 "
                                      r"rotated dimensions per head need 2"),
    (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 2.0, 3.0],
                        "long_factor": [1.0, 2.0]}),
     r"has 3 short_factor and 2 long_factor values: they must be as many"),
    (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 2.0, 3.0]}),
     r"of rope_type 'longrope' lacks 'long_factor'"),
    (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 0.0, 3.0],
                        "long_factor": [1.0, 2.0, 3.0]}),
     r"'rope_scaling.short_factor' = \[1.0, 0.0, 3.0\] must be a list of positive numbers"),
    (dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 2.0, 3.0],
                        "long_factor": [1.0, 2.0, 3.0], "beta_fast": 32}),
     r"has 'beta_fast', which ETC does not implement"),
])
def test_phi4_mini_config_refusals(fields, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        read(PHI4, **fields)


@pytest.mark.parametrize("architecture", [a for a in ARCHITECTURES
                                          if a not in ("Phi3ForCausalLM", "Glm4ForCausalLM",
                                                       "Glm4MoeForCausalLM")])
def test_partial_rotary_is_refused_where_transformers_rotates_whole_heads(architecture):
    """Of the architectures ETC loads, only transformers' Phi-3, GLM-4 and
    GLM-4.5 (test_glm4_moe.py) honour partial_rotary_factor (their
    apply_rotary_pos_emb rotates the table's
    width and passes the rest through); the others' rotate_half spans the
    whole head, so a factor < 1 breaks them there (cos of r dimensions
    against q of head_dim): refused by name, flat or nested as
    transformers 5 writes it. A factor of 1 is the whole head anywhere."""
    config = tiny_config(architecture)
    for raw in (dict(config, partial_rotary_factor=0.5),
                as_transformers5(dict(config, partial_rotary_factor=0.5))):
        with pytest.raises(UnsupportedConfigError,
                           match=rf"partial_rotary_factor['\"] = 0.5 is not supported for "
                                 rf"{architecture}: its transformers class rotates whole heads"):
            ModelConfig.from_dict(raw)
    assert ModelConfig.from_dict(dict(config, partial_rotary_factor=1.0)) == \
        ModelConfig.from_dict(config)


def test_smollm3_config_nope_layers_and_windows():
    """SmolLM3 as transformers reads it: no_rope_layers (1: RoPE), else
    no RoPE on every no_rope_layer_interval-th layer (4 by default);
    embeddings tied and RoPE base 2e6 by default; with use_sliding_window
    and a window, the NoPE layers slide (or those layer_types names),
    without it none does; a NoPE layer's attention scale has no RoPE
    attention factor; the tables only where some layer rotates."""
    c = ModelConfig.from_dict(SMOL)
    assert (c.nope_layers, c.uses_rope(0), c.uses_rope(1)) == ((1,), True, False)
    assert (c.rope_theta, c.tie_word_embeddings, c.sliding_layers) == (5e6, True, ())
    eight = {k: v for k, v in SMOL.items() if k != "no_rope_layers"}
    eight["num_hidden_layers"] = 8
    assert ModelConfig.from_dict(eight).nope_layers == (3, 7)
    assert read(eight, no_rope_layer_interval=3).nope_layers == (2, 5)
    defaults = {k: v for k, v in eight.items() if k not in ("rope_theta", "tie_word_embeddings",
                                                            "no_rope_layer_interval")}
    default = ModelConfig.from_dict(defaults)
    assert (default.nope_layers, default.rope_theta, default.tie_word_embeddings) == \
        ((3, 7), 2e6, True)
    windowed = read(eight, use_sliding_window=True, sliding_window=5)
    assert (windowed.sliding_layers, windowed.window(3), windowed.window(0)) == ((3, 7), 5, None)
    assert read(eight, sliding_window=5).sliding_layers == ()
    types = ["sliding_attention", "full_attention"] * 4
    assert read(eight, use_sliding_window=True, sliding_window=5,
                layer_types=types).sliding_layers == (0, 2, 4, 6)
    assert read(eight, layer_types=types).sliding_layers == ()
    yarn = read(SMOL, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32})
    assert yarn.attention_scale_of(0) > yarn.attention_scale_of(1) == 1 / math.sqrt(16)
    # SmolLM3-3B's config says pretraining_tp 2, which its transformers
    # class never reads (Llama's refuses it).
    assert read(SMOL, pretraining_tp=2) == c
    with pytest.raises(UnsupportedConfigError, match=r"'pretraining_tp' = 2 is not supported"):
        read(tiny_config("LlamaForCausalLM"), pretraining_tp=2)
    none = read(SMOL, no_rope_layers=[0, 0])
    assert none.rope_tables() == {} and set(ModelConfig.from_dict(SMOL).rope_tables()) == \
        {"inv_freq"}
    for fields, match in [
            (dict(no_rope_layers=[1]), r"'no_rope_layers' = \[1\] must list 1 \(RoPE\) or 0"),
            (dict(no_rope_layers=[1, 2]), r"'no_rope_layers' = \[1, 2\] must list"),
            (dict(no_rope_layers=[True, False]), r"'no_rope_layers' = \[True, False\]"),
            (dict(no_rope_layers=None, no_rope_layer_interval=0),
             r"'no_rope_layer_interval' = 0"),
            (dict(use_sliding_window=True, layer_types=["full_attention", "sliding_attention"]),
             r"'sliding_window' is null, but layers \[1\] are 'sliding_attention'"),
            (dict(attention_bias=True), r"'attention_bias' = True is not supported"),
            (dict(partial_rotary_factor=0.5), r"not supported for SmolLM3ForCausalLM"),
            (dict(pretraining_tp="2"), r"'pretraining_tp' = '2'")]:
        with pytest.raises(UnsupportedConfigError, match=match):
            read(SMOL, **fields)


# ----------------------------------------------------------------------
# Partial rotary's layout
# ----------------------------------------------------------------------


def test_partial_rotary_layout(tmp_path):
    """Each head's q and k rows in the step graph's order: Hugging Face's
    pairs (i, i + 3) of the 6 rotated dimensions at (i, i + 4), the pass-
    through pair after them; q's rotated rows scaled by the attention
    factor's square; `to_hf_layout` undoes it; a bf16 load is the float32
    one rounded; packed rows move whole and refuse to be scaled."""
    assert partial_rotary.permutation(8, 6).tolist() == [0, 1, 2, 6, 3, 4, 5, 7]
    big = partial_rotary.permutation(128, 96)
    assert sorted(big.tolist()) == list(range(128))
    assert big[:48].tolist() == list(range(48)) and big[64:112].tolist() == list(range(48, 96))
    path = write_checkpoint(tmp_path / "phi4", PHI4, seed=goldens.SEEDS["phi4_mini"])
    checkpoint = Checkpoint(path)
    c, weights = checkpoint.config, checkpoint.weights()
    raw = checkpoint_tensors(PHI4, goldens.SEEDS["phi4_mini"])
    qkv = raw["model.layers.1.self_attn.qkv_proj.weight"]
    order = (np.arange(4)[:, None] * 8 + partial_rotary.permutation(8, 6)).ravel()
    square = np.float32(c.rope_attention_factor ** 2)
    rotated = np.isin(np.arange(32) % 8, [0, 1, 2, 4, 5, 6])
    np.testing.assert_array_equal(weights["l1_wq"],
                                  qkv[:32][order] * np.where(rotated, square, 1)[:, None])
    np.testing.assert_array_equal(weights["l1_wk"], qkv[32:48][order[:16]])
    np.testing.assert_array_equal(weights["l1_wv"], qkv[48:])
    back = partial_rotary.to_hf_layout(c, weights)
    np.testing.assert_allclose(back["l1_wq"], qkv[:32], rtol=1e-6)
    np.testing.assert_array_equal(back["l1_wk"], qkv[32:48])
    from etc import bfloat16

    half = bfloat16.from_bits(checkpoint.weights("bf16")["l1_wq"]).reshape(32, 32)
    # Rounded twice (read, then scaled): within 2 u of bf16.
    np.testing.assert_allclose(half, weights["l1_wq"], rtol=2 ** -7, atol=0)
    packed = np.arange(32 * 4, dtype=np.uint8).reshape(32, 4)
    np.testing.assert_array_equal(
        partial_rotary.to_step_layout(c, "l0_wk", packed[:16], packed=True),
        packed[:16][order[:16]])
    with pytest.raises(NotImplementedError, match=r"l0_wq: a packed weight's rows cannot be "
                                                  r"scaled"):
        partial_rotary.to_step_layout(c, "l0_wq", packed, packed=True)
    assert partial_rotary.unpacked_keys(c) == {"l0_wq", "l1_wq"}


# ----------------------------------------------------------------------
# Against transformers and llama.cpp, and what they catch
# ----------------------------------------------------------------------


def unscaled(config, weights: dict) -> dict:
    """`weights` (step layout) as a loader that forgot the attention factor
    would lay them out: q's rotated rows unscaled."""
    plain = dataclasses.replace(config, rope_scaling={**config.rope_scaling,
                                                      "attention_factor": 1.0})
    return {key: partial_rotary.to_step_layout(plain, key, array) for key, array in
            partial_rotary.to_hf_layout(config, weights).items()}


@pytest.mark.parametrize("name, mutations", [
    ("phi4_mini-transformers4-f32", {
        "q/k rows left in Hugging Face's order":
            lambda c, w: (c, partial_rotary.to_hf_layout(c, w)),
        "no attention factor": lambda c, w: (c, unscaled(c, w))}),
    ("smollm3-transformers4-f32", {
        "RoPE on every layer": lambda c, w: (dataclasses.replace(c, nope_layers=()), w),
        "layer 0 without RoPE instead":
            lambda c, w: (dataclasses.replace(c, nope_layers=(0,)), w)}),
])
def test_numpy_forward_matches_transformers_and_the_mistakes_do_not(name, mutations, tmp_path):
    """The NumPy forward pass on the config and weights ETC reads is
    transformers' (the golden's logits within tolerance), and reading the
    config wrong misses them: partial rotary without the permutation (the
    rows left in Hugging Face's order), or the attention factor dropped;
    SmolLM3's NoPE layer ignored or misplaced."""
    golden = goldens.Golden.load(name)
    checkpoint = Checkpoint(golden.write_checkpoint(tmp_path / name))
    golden.check_reference(checkpoint.config, checkpoint.weights(), mutations)


@pytest.mark.parametrize("arch", ["phi4_mini", "smollm3"])
def test_gguf_files_run_by_llama_cpp(arch, tmp_path):
    """llama.cpp (llama-cpp-python 0.3.36) on the F32 GGUF file `write_gguf`
    writes (gguf_goldens.RUNS): the NumPy forward pass on the config and
    weights ETC reads from it is within 0.05 of the logits' rms at every
    position (measured 0.008 for both: llama.cpp keeps its KV cache in
    f16). Phi-4-mini's with the frequencies of a context of llama.cpp's
    n_ctx (256, past the original 16: the long factors, as llama.cpp picks
    them); the short ones miss by over 1 (measured 5.5), and so do q/k
    rows left in Hugging Face's order, or the attention factor dropped
    (over 0.5). SmolLM3's
    NoPE layer (3, llama.cpp's fixed rule) ignored misses by over 0.5
    (measured 1.3)."""
    import gguf_goldens

    gg, weights, run = gguf_goldens.read_run(arch, tmp_path)

    def error(config, context=None, read=weights):
        tables = {} if context is None else {"inv_freq": config.rope_tables(context)["inv_freq"]}
        ours = reference.forward(config, {**read, **tables}, run["sequence"])
        return gguf_goldens.run_error(run, ours)

    c = gg.config
    if arch == "phi4_mini":
        assert (c.rotary_dim, c.rope_scaling["original_max_position_embeddings"]) == (6, 16)
        assert error(c, 256) < 0.05
        assert error(c, 16) > 1
        assert error(c, 256, partial_rotary.to_hf_layout(c, weights)) > 1
        assert error(c, 256, unscaled(c, weights)) > 0.5
    else:
        assert c.nope_layers == (3,)
        assert error(c) < 0.05
        assert error(dataclasses.replace(c, nope_layers=())) > 0.5


def test_real_widths_read():
    """Phi-4-mini's and SmolLM3-3B's shapes (`SHAPES`) at their 32 and 36
    layers: 96 of 128 dimensions rotated, LongRoPE of 48 factors per set
    (short up to a context of 4096, long past it), attention factor
    sqrt(1 + ln 32 / ln 4096) on q's rotated rows, so one q projection of
    each layer unpacked; the window of 262144 on every layer; SmolLM3's
    NoPE layers 3, 7, ..., 35."""
    from etc.models.testing import shaped_config

    phi = ModelConfig.from_dict(shaped_config("phi-4-mini", layers=32))
    assert (phi.head_dim, phi.rotary_dim, len(phi.rope_scaling["long_factor"])) == (128, 96, 48)
    assert phi.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(32) /
                                                                math.log(4096)))
    short, long = (phi.rope_tables(n)["inv_freq"] for n in (4096, 4097))
    assert short.shape == long.shape == (64,) and not short[48:].any()
    np.testing.assert_allclose(short[:48] / long[:48], np.arange(1, 49) / (1 + np.arange(48) / 48),
                               rtol=1e-6)
    assert len(partial_rotary.unpacked_keys(phi)) == 32
    assert (phi.sliding_window, len(phi.sliding_layers)) == (262144, 32)
    smol = ModelConfig.from_dict(shaped_config("smollm3-3b", layers=36))
    assert smol.nope_layers == tuple(range(3, 36, 4)) and smol.sliding_layers == ()


def test_fp8_checkpoint_keeps_permuted_rows_packed(tmp_path):
    """An FP8 (block-scaled) Phi-4-mini checkpoint: each row packs with its
    own scales (`etc.packed` fp8_e4m3: a float32 scale per 32 values), so
    k's permuted rows stay packed, equal to the dequantized weight's
    permuted rows; q's, scaled at load, are dequantized."""
    from etc import packed

    path = write_checkpoint(tmp_path / "fp8", PHI4, seed=3, fp8_block=(16, 32))
    checkpoint = Checkpoint(path)
    formats = checkpoint.weight_formats()
    assert formats["l0_wk"] == "fp8_e4m3" and "l0_wq" not in formats
    kept, wide = checkpoint.weights(formats=formats), checkpoint.weights()
    np.testing.assert_array_equal(packed.dequantize(kept["l1_wk"], "fp8_e4m3").reshape(16, 32),
                                  wide["l1_wk"])
    np.testing.assert_array_equal(kept["l1_wq"], wide["l1_wq"])


def test_phi4_mini_with_a_bf16_kv_cache_and_as_its_own_draft(tmp_path):
    """What reads q and k after the permutation stays consistent: a bf16 KV
    cache rounds each (permuted) key as the NumPy forward pass rounds
    Hugging Face's (the same values, elsewhere in the row), so teacher
    forcing holds as tightly as in float32 and misses the unrounded pass;
    the model as its own draft (speculative decoding: the draft's cache
    rolled back, the target verifying several rows a step) generates the
    same greedy tokens."""
    import etc.models as models
    from etc.models import Speculative

    prompts = goldens.PROMPTS
    path = write_checkpoint(tmp_path / "phi4", PHI4, seed=goldens.SEEDS["phi4_mini"])
    checkpoint = Checkpoint(path)
    weights = checkpoint.weights()
    model = models.load(path, kv_dtype="bf16", workers=3, max_seq_len=32, attention_chunk=4,
                        kv_block_size=4)
    out = model.generate(prompts, 3, return_logits=True)

    def forced(kv_dtype):
        for r, prompt in enumerate(prompts):
            sequence = list(prompt) + out.tokens[r]
            want = reference.forward(checkpoint.config, weights, sequence[:-1], kv_dtype=kv_dtype)
            np.testing.assert_allclose(out.logits[r], want[len(prompt) - 1:], rtol=2e-4,
                                       atol=2e-4, err_msg=f"prompt {r}")

    forced("bf16")
    with pytest.raises(AssertionError):
        forced("f32")
    spec = Speculative(draft=path, tokens=3, adaptive=False, step_tokens=None)
    assert model.generate(prompts, 3, ignore_eos=True, speculative=spec).tokens == \
        model.generate(prompts, 3, ignore_eos=True).tokens


def test_partial_rotary_with_per_head_norms():
    """With per-head q/k norms (none of today's partial-rotary families has
    them, but the layout is general) the norm weights are permuted alike
    and q's norm, not its projection, carries the attention factor's
    square; a norm of 1 + w (Gemma's) cannot, and is refused."""
    c = dataclasses.replace(ModelConfig.from_dict(PHI4), qk_norm=True)
    norm = np.arange(1, 9, dtype=np.float32)
    square = np.float32(c.rope_attention_factor ** 2)
    scale = np.array([square] * 3 + [1] + [square] * 3 + [1], np.float32)
    np.testing.assert_allclose(partial_rotary.to_step_layout(c, "l0_q_norm", norm),
                               norm[[0, 1, 2, 6, 3, 4, 5, 7]] * scale, rtol=1e-7)
    np.testing.assert_array_equal(partial_rotary.to_step_layout(c, "l0_k_norm", norm),
                                  norm[[0, 1, 2, 6, 3, 4, 5, 7]])
    wq = np.ones((32, 32), np.float32)
    np.testing.assert_array_equal(partial_rotary.to_step_layout(c, "l0_wq", wq), wq)
    assert partial_rotary.unpacked_keys(c) == set()
    with pytest.raises(NotImplementedError, match=r"l0_q_norm: a q norm of 1.0 \+ w"):
        partial_rotary.to_step_layout(dataclasses.replace(c, norm_offset=1.0), "l0_q_norm", norm)
