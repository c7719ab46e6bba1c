"""config.json as transformers 4 and 5 write it: RoPE parameters read from
`rope_parameters` (transformers 5) or `rope_scaling` and a flat
`rope_theta` (transformers 4), every RoPE variant implemented or refused by
name, and values that are not what their field means refused naming the
field. Whole models with such configs are checked against the NumPy forward
pass and against Hugging Face transformers: its goldens (hf_goldens.py:
frequencies, attention factors, logits and tokens), and live when torch and
transformers import."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import etc.models as models
import hf_goldens
from etc.models.step import reference
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.config import ModelConfig
from etc.models.testing import as_transformers5, tiny_config

PROMPTS = [[5, 17, 3, 44, 60, 2, 9, 81, 33, 12, 7], [4, 90]]
NEW = 4
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8)

#: Written the way transformers 5 writes them (`rope_parameters`, no flat
#: `rope_theta`): a Qwen3 with a RoPE base of 100000 (a Qwen-style chat
#: model), and a Llama with yarn scaling (its attention factor scales the
#: logits).
V5_CONFIGS = hf_goldens.V5_CONFIGS


def _expected_inv_freq(d: int, theta: float, kind: str, p: dict, max_positions: int):
    """The frequencies of each variant, written from the formulas of the
    papers as transformers states them (float64, independent of
    `ModelConfig.rope_inv_freq`)."""
    base = 1.0 / theta ** (np.arange(0, d, 2) / d)
    if kind == "default":
        return base
    if kind == "linear":
        return base / p["factor"]
    if kind == "llama3":
        old = p.get("original_max_position_embeddings", max_positions)
        factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        out = []
        for f in base:
            wavelength = 2 * math.pi / f
            if wavelength < old / high:
                out.append(f)
            elif wavelength > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelength - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return np.array(out)
    assert kind == "yarn"
    old = p.get("original_max_position_embeddings", max_positions)
    fast, slow = p.get("beta_fast", 32), p.get("beta_slow", 1)
    # The dimension whose wavelength makes `rotations` turns over `old`.
    dim = lambda rotations: d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = max(math.floor(dim(fast)), 0), min(math.ceil(dim(slow)), d - 1)
    out = []
    for i, f in enumerate(base):
        interpolate = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)
        out.append(f / p["factor"] * interpolate + f * (1 - interpolate))
    return np.array(out)


@pytest.mark.parametrize("case", range(len(hf_goldens.ROPE_CASES)),
                         ids=[f"{kind}{i}" for i, (kind, _) in enumerate(hf_goldens.ROPE_CASES)])
@pytest.mark.parametrize("written_by", ["transformers4", "transformers5"])
def test_every_rope_variant_gives_hugging_faces_frequencies(case, written_by):
    kind, params = hf_goldens.ROPE_CASES[case]
    theta = hf_goldens.ROPE_THETA
    raw = hf_goldens.rope_config(kind, params, written_by)
    if written_by == "transformers5":
        assert "rope_theta" not in raw and raw["rope_parameters"]["rope_theta"] == theta
    config = ModelConfig.from_dict(raw)
    assert config.rope_theta == theta and config.rope_type == kind
    want = _expected_inv_freq(32, theta, kind, params, raw["max_position_embeddings"])
    np.testing.assert_allclose(config.rope_inv_freq(), want, rtol=2e-6)
    if kind == "yarn":
        mscale = lambda m: 0.1 * m * math.log(params["factor"]) + 1
        factor = (mscale(params["mscale"]) / mscale(params["mscale_all_dim"])
                  if "mscale" in params else mscale(1))
        assert config.rope_attention_factor == pytest.approx(factor)
        assert config.attention_scale == pytest.approx(factor ** 2 / math.sqrt(32))
    else:
        assert config.rope_attention_factor == 1.0
        assert config.attention_scale == 1 / math.sqrt(32)
    # transformers' own functions, as the goldens recorded them (and live
    # when it imports): the frequencies and the attention factor.
    golden = hf_goldens.load_rope()[f"{case}-{written_by}"]
    np.testing.assert_allclose(config.rope_inv_freq(), golden[1:], rtol=1e-5)
    assert config.rope_attention_factor == pytest.approx(golden[0])
    _compare_with_transformers(raw, config)


def _compare_with_transformers(raw: dict, config: ModelConfig) -> None:
    """The frequencies and attention factor transformers computes for the
    same config.json, when torch and transformers import."""
    try:
        import torch  # noqa: F401
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return  # the goldens stand in for it
    hf = transformers.AutoConfig.for_model(raw["model_type"], **{
        k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    rope = getattr(hf, "rope_parameters", None) or {"rope_type": "default"}
    if rope.get("rope_type", "default") == "default":
        want = 1.0 / (hf.rope_parameters["rope_theta"] **
                      (np.arange(0, config.head_dim, 2, dtype=np.float32) / config.head_dim))
        factor = 1.0
    else:
        inv_freq, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
        want = inv_freq.numpy()
    np.testing.assert_allclose(config.rope_inv_freq(), want, rtol=1e-5)
    assert config.rope_attention_factor == pytest.approx(factor)


# ----------------------------------------------------------------------
# Whole models from transformers 5 configs
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def v5_checkpoints(tmp_path_factory):
    """The goldens' checkpoints (their weights checked to be the goldens')."""
    root = tmp_path_factory.mktemp("v5")
    return {name: hf_goldens.Golden.load(f"{name}-transformers5-f32").write_checkpoint(
        root / name) for name in V5_CONFIGS}


@pytest.fixture(scope="module")
def v5_models(v5_checkpoints):
    return {name: models.load(path, **LOAD) for name, path in v5_checkpoints.items()}


@pytest.mark.parametrize("name", list(V5_CONFIGS))
def test_transformers5_checkpoints_match_numpy(name, v5_models, v5_checkpoints):
    model = v5_models[name]
    theta = V5_CONFIGS[name]["rope_parameters"]["rope_theta"]
    assert model.config.rope_theta == theta  # not the 10000 of a missing flat field
    out = model.generate(PROMPTS, NEW, return_logits=True)
    checkpoint = Checkpoint(v5_checkpoints[name])
    weights = checkpoint.weights()
    # The NumPy forward pass with the frequencies written out here and
    # Hugging Face's cos/sin scaling, independent of the config's methods.
    c = checkpoint.config
    params = V5_CONFIGS[name]["rope_parameters"]
    inv_freq = _expected_inv_freq(c.head_dim, theta, params["rope_type"], params,
                                  c.max_position_embeddings).astype(np.float32)
    np.testing.assert_allclose(c.rope_inv_freq(), inv_freq, rtol=2e-6)
    for r, prompt in enumerate(PROMPTS):
        sequence = list(prompt) + out.tokens[r]
        want = reference.forward(c, weights, sequence[:-1])
        np.testing.assert_allclose(out.logits[r], want[len(prompt) - 1:], rtol=2e-4, atol=2e-4)
        assert out.tokens[r] == [int(np.argmax(row)) for row in out.logits[r]]


def test_rope_base_changes_the_tokens(v5_models, v5_checkpoints, tmp_path):
    """The same weights read with the default base of 10000 give other
    logits: what a loader that ignores `rope_parameters` computes."""
    config = dict(V5_CONFIGS["qwen3_theta"])
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    c = ModelConfig.from_dict(config)
    weights = Checkpoint(v5_checkpoints["qwen3_theta"]).weights()
    ours = v5_models["qwen3_theta"].generate(PROMPTS[:1], NEW, return_logits=True)
    wrong = reference.forward(c, weights, PROMPTS[0] + ours.tokens[0][:-1])
    assert np.abs(ours.logits[0] - wrong[len(PROMPTS[0]) - 1:]).max() > 1e-2


@pytest.mark.parametrize("name", list(V5_CONFIGS))
def test_transformers5_checkpoints_match_hugging_face_goldens(name, v5_models):
    """transformers' logits at every position of three prompts and their
    greedy continuations, within the f32 tolerance (hf_goldens.tolerance),
    and its greedy tokens."""
    hf_goldens.check_model(hf_goldens.Golden.load(f"{name}-transformers5-f32"), v5_models[name])


@pytest.mark.parametrize("name", list(V5_CONFIGS))
def test_transformers5_checkpoints_match_hugging_face(name, v5_models, v5_checkpoints):
    torch = pytest.importorskip("torch", reason="torch is not installed: the comparison with "
                                                "Hugging Face transformers needs torch and "
                                                "transformers")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                                              "the comparison needs it")
    hf = transformers.AutoModelForCausalLM.from_pretrained(v5_checkpoints[name],
                                                           dtype=torch.float32)
    hf.eval()
    ours = v5_models[name].generate(PROMPTS, NEW, return_logits=True)
    for r, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            result = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 pad_token_id=0)
        np.testing.assert_allclose(ours.logits[r], torch.stack(result.logits)[:, 0].numpy(),
                                   rtol=2e-4, atol=2e-4)
        assert ours.tokens[r] == result.sequences[0, len(prompt):].tolist()


# ----------------------------------------------------------------------
# Refused, naming the field
# ----------------------------------------------------------------------


def _refused(config: dict, match: str) -> None:
    with pytest.raises(models.UnsupportedConfigError, match=match):
        ModelConfig.from_dict(config)


@pytest.mark.parametrize("kind, why", [
    ("dynamic", "changes the frequencies with the sequence length"),
    # (LongRoPE is implemented: test_rope_families.py; without its factors
    # it is refused.)
    ("longrope", "lacks 'short_factor'"),
    ("proportional", "only part of each head"),
    ("su", r"; supported: 'default', 'linear', 'llama3', 'yarn', 'longrope'"),
])
@pytest.mark.parametrize("written_by", ["transformers4", "transformers5"])
def test_rope_variants_not_implemented_are_refused_by_name(kind, why, written_by):
    config = tiny_config("Qwen3ForCausalLM", rope_scaling={"rope_type": kind, "factor": 2.0})
    if written_by == "transformers5":
        config = as_transformers5(config)
    _refused(config, rf"'{kind}'.*{why}")


V5 = as_transformers5(tiny_config("Qwen3ForCausalLM"))


@pytest.mark.parametrize("change, match", [
    ({"rope_theta": 0}, r"field 'rope_theta' = 0 must be a finite positive number"),
    ({"rope_theta": -10000.0}, r"field 'rope_theta' = -10000.0 must be a finite positive"),
    ({"rope_theta": float("nan")}, r"field 'rope_theta' = nan must be a finite positive"),
    ({"rope_theta": float("inf")}, r"field 'rope_theta' = inf must be a finite positive"),
    ({"rope_theta": "1000000"}, r"field 'rope_theta' = '1000000' must be a finite positive"),
    ({"rope_theta": True}, r"field 'rope_theta' = True must be a finite positive"),
    ({"tie_word_embeddings": "false"},
     r"field 'tie_word_embeddings' = 'false' must be true or false"),
    ({"tie_word_embeddings": 0}, r"field 'tie_word_embeddings' = 0 must be true or false"),
    ({"rope_scaling": "llama3"}, r"field 'rope_scaling' = 'llama3' must be an object"),
    ({"rope_scaling": {"type": 3}}, r"field 'rope_scaling.type' = 3 must be a string"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
     r"rope_type 'llama3' lacks 'high_freq_factor'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                       "high_freq_factor": 2.0}}, r"low_freq_factor = high_freq_factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}},
     r"field 'rope_scaling.factor' = '2' must be a finite positive number"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "mrope_section": [2, 3, 3]}},
     r"'mrope_section', which ETC does not implement"),
    ({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 8}},
     r"rope_type 'yarn' lacks 'factor'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}},
     r"'rope_scaling.truncate' = 'no' must be true or false"),
    ({"rope_theta": 5e5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
     r"'rope_theta' = 500000.0 contradicts rope_parameters.rope_theta = 1000000.0"),
    ({"partial_rotary_factor": 0.5}, r"'partial_rotary_factor' = 0.5 is not supported"),
    ({"rms_norm_eps": float("inf")}, r"field 'rms_norm_eps' = inf must be a finite positive"),
    ({"rms_norm_eps": "1e-6"}, r"field 'rms_norm_eps' = '1e-6' must be a finite positive"),
    ({"num_key_value_heads": 0}, r"field 'num_key_value_heads' = 0 must divide"),
    ({"head_dim": 0}, r"field 'head_dim' = 0 must be an even positive integer"),
    ({"attention_bias": "false"}, r"field 'attention_bias' = 'false' is not supported"),
    ({"pretraining_tp": True}, r"field 'pretraining_tp' = True is not supported"),
])
def test_invalid_values_are_refused_naming_the_field(change, match):
    _refused({**tiny_config("Qwen3ForCausalLM"), **change}, match)


@pytest.mark.parametrize("change, match", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}},
     r"field 'rope_parameters.rope_theta' = 0.0 must be a finite positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e6"}},
     r"field 'rope_parameters.rope_theta' = '1e6' must be a finite positive number"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     r"field 'rope_parameters' of rope_type 'llama3' lacks 'low_freq_factor'"),
    ({"rope_parameters": [1e6]}, r"field 'rope_parameters' = \[1000000.0\] must be an object"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     r"field 'layer_types' lists 'sliding_attention' \(layers \[1\]\); only 'full_attention'"),
    ({"layer_types": ["full_attention"]}, r"'layer_types' .* must list one type for each of "
                                          r"the 2 layers"),
])
def test_invalid_transformers5_values_are_refused_naming_the_field(change, match):
    _refused({**V5, **change}, match)


def test_moe_fields_are_checked():
    moe = tiny_config("Qwen3MoeForCausalLM")
    _refused({**moe, "norm_topk_prob": "false"}, r"'norm_topk_prob' = 'false' must be true or")
    _refused({**moe, "mlp_only_layers": "0"}, r"'mlp_only_layers' = '0' must be a list")
    # A layer the model does not have (1-based, or from another size).
    _refused({**moe, "mlp_only_layers": [0, 2]}, r"'mlp_only_layers' = \[0, 2\] names layers "
                                                 r"\[2\] outside 0 to 1 \(num_hidden_layers = 2\)")
    _refused({**moe, "mlp_only_layers": [-1]}, r"names layers \[-1\]")
    _refused({**moe, "decoder_sparse_step": 0}, r"'decoder_sparse_step' = 0 must be a positive")


def test_nested_rope_parameters_and_legacy_type_key():
    """transformers 5 may nest the parameters by layer type; transformers 4
    wrote `type` for `rope_type`."""
    nested = {**V5, "rope_parameters": {"full_attention": {"rope_type": "linear",
                                                           "rope_theta": 1e6, "factor": 2.0}}}
    config = ModelConfig.from_dict(nested)
    assert (config.rope_theta, config.rope_type) == (1e6, "linear")
    legacy = tiny_config("Qwen3ForCausalLM", rope_scaling={"type": "linear", "factor": 2.0})
    assert ModelConfig.from_dict(legacy).rope_type == "linear"
    # A flat base equal to the nested one is not a contradiction.
    same = {**V5, "rope_theta": 10000.0}
    assert ModelConfig.from_dict(same).rope_theta == 10000.0
