"""The goldens of hf_goldens.py (transformers' logits and greedy tokens for
every architecture's tiny checkpoints, both config.json styles, f32, f16
and bf16) and their tolerances, without compiling: the files are the cases
hf_goldens.py names, made from the weights etc.models.testing draws; the
NumPy forward pass (`etc.models.step.reference`, on the weights and config
ETC's loader reads) is within the tolerance of every golden; and a model
with one thing wrong is outside it by at least twice, for each
architecture and dtype: a norm weight dropped (the attention and MLP norms,
q/k norms, the final norm), two projections swapped (gate/up, the experts'
gate/up, k/v), RoPE's base or scaling changed, an untied head read as tied,
MoE weights not renormalised. (No supported architecture has a bias: a
config that sets one is refused, test_models.py.) The compiled models in
f16 and bf16 are compared here, and three wrong ones (a norm weight
dropped) fail; the f32 ones where their modules compile them anyway
(test_models.py, test_model_config.py). Where torch imports, the goldens
are recomputed and must equal the files."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import etc.models as models
import gguf_goldens
import hf_goldens
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.safetensors import SafetensorsFile, save_file
from etc.models.step import reference

GOLDENS = list(hf_goldens.cases())
#: The half-precision goldens, run through ETC here (one compile each per
#: architecture and dtype; the transformers 5 configs' from the cache).
HALF = [name for name, case in hf_goldens.cases().items() if case["dtype"] != "f32"]
LOAD = dict(workers=3, max_seq_len=32, attention_chunk=4)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each golden's checkpoint, read by ETC's loader: (config, weights)."""
    root = tmp_path_factory.mktemp("goldens")
    out = {}
    for name in GOLDENS:
        golden = hf_goldens.Golden.load(name)
        checkpoint = Checkpoint(golden.write_checkpoint(root / name))
        out[name] = (golden, checkpoint.config, checkpoint.weights())
    return out


def _reference_logits(golden, config, weights) -> np.ndarray:
    """The NumPy forward pass over each golden sequence: rows as
    `golden.prefixes()`."""
    return np.concatenate([reference.forward(config, weights, s[:-1])
                           for s in golden.sequences()])


def _swap(weights: dict, a: str, b: str) -> dict:
    weights = dict(weights)
    weights[a], weights[b] = weights[b], weights[a]
    return weights


def _ones(weights: dict, keys) -> dict:
    weights = dict(weights)
    for key in keys:
        weights[key] = np.ones_like(weights[key])
    return weights


def _mutations(config) -> dict:
    """What a wrong model computes: name -> (config, weights) -> (config,
    weights), those that apply to `config`'s architecture."""
    layers = range(config.num_layers)
    dense = [i for i in layers if not config.is_sparse(i)]
    sparse = [i for i in layers if config.is_sparse(i)]

    def swap_all(pairs):
        def mutate(c, w):
            for a, b in pairs:
                w = _swap(w, a, b)
            return c, w
        return mutate

    other_base = 10000.0 if config.rope_theta != 10000.0 else 1000000.0
    out = {
        "final norm dropped": lambda c, w: (c, _ones(w, ["final_norm"])),
        "attention norms dropped": lambda c, w: (c, _ones(w, [f"l{i}_attn_norm" for i in layers])),
        "MLP norms dropped": lambda c, w: (c, _ones(w, [f"l{i}_mlp_norm" for i in layers])),
        "k and v swapped": swap_all([(f"l{i}_wk", f"l{i}_wv") for i in layers]),
        f"RoPE base {other_base:g}": lambda c, w: (dataclasses.replace(c, rope_theta=other_base),
                                                   w),
    }
    if config.qk_norm:
        out["q norms dropped"] = lambda c, w: (c, _ones(w, [f"l{i}_q_norm" for i in layers]))
        out["k norms dropped"] = lambda c, w: (c, _ones(w, [f"l{i}_k_norm" for i in layers]))
    if dense:
        out["gate and up swapped"] = swap_all([(f"l{i}_w_gate", f"l{i}_w_up") for i in dense])
    if sparse:
        out["experts' gate and up swapped"] = swap_all(
            [(f"l{i}_experts_gate", f"l{i}_experts_up") for i in sparse])
        out["top-k weights not renormalised"] = lambda c, w: (
            dataclasses.replace(c, norm_topk_prob=not c.norm_topk_prob), w)
    if config.rope_scaling is not None:
        out["RoPE scaling ignored"] = lambda c, w: (dataclasses.replace(c, rope_scaling=None), w)
    if not config.tie_word_embeddings:
        out["head tied to the embedding"] = lambda c, w: (
            dataclasses.replace(c, tie_word_embeddings=True), w)
    return out


def test_every_case_has_a_golden_of_its_weights():
    """The files are the cases hf_goldens.py names (every architecture, both
    styles, every dtype), made from the weights drawn now, with the
    versions they were made with."""
    goldens = hf_goldens.load_all()
    assert {(g.case["group"], g.dtype) for g in goldens.values()} >= {
        (arch, dtype) for arch in hf_goldens.ARCHITECTURES for dtype in hf_goldens.DTYPES}
    for name, golden in goldens.items():
        assert golden.digest == hf_goldens.weights_digest(golden.config, golden.seed,
                                                          golden.sharp), name
        assert golden.versions["transformers"].startswith("5."), name
        assert [len(p) for p in golden.prompts] == list(hf_goldens.PROMPT_LENGTHS)
        assert all(len(t) == hf_goldens.NEW for t in golden.tokens)
        # Well-conditioned: the greedy tokens are determined (f32, f16), and
        # no MoE routing is within rounding of a tie.
        if golden.dtype != "bf16":
            assert hf_goldens.determined_tokens(golden) == [hf_goldens.NEW] * 3, name
        if golden.config["architectures"][0] in ("Qwen3MoeForCausalLM", "MixtralForCausalLM"):
            gaps = [g for row in golden.router_gaps for g in row]
            assert len(gaps) == len(golden.prefixes())
            assert min(gaps) > 2 * hf_goldens.router_tolerance(golden.config, golden.dtype)


def test_tolerances_follow_from_the_unit_roundoff():
    """The bound of `hf_goldens.tolerance` for the tiny configs: 26
    roundings and 668 float32 terms on the longest path, gain 2, two
    implementations."""
    config = hf_goldens.ARCHITECTURES["qwen3"]
    assert hf_goldens.roundings(config) == (26, 668)
    want = {"f32": 4 * (26 + 668) * 2.0 ** -24, "f16": 4 * (26 * 2.0 ** -11 + 668 * 2.0 ** -24),
            "bf16": 4 * (26 * 2.0 ** -8 + 668 * 2.0 ** -24)}
    for dtype, value in want.items():
        assert hf_goldens.tolerance(config, dtype) == pytest.approx(value)
    assert hf_goldens.tolerance(config, "f32") < 2e-4
    assert 0.05 < hf_goldens.tolerance(config, "f16") < 0.052
    assert 0.40 < hf_goldens.tolerance(config, "bf16") < 0.41


@pytest.mark.parametrize("name", GOLDENS)
def test_numpy_forward_matches_the_golden_and_mutations_do_not(name, checkpoints):
    """The reference forward pass on the weights and config ETC reads is
    within the tolerance at every position (its greedy tokens, teacher
    forced, are transformers'); each mutation misses by more than twice the
    tolerance somewhere, so a model with that fault, even with its own
    rounding, fails the comparison."""
    golden, config, weights = checkpoints[name]
    ours = _reference_logits(golden, config, weights)
    errors = hf_goldens.check_logits(golden, ours, "the NumPy forward pass")
    assert errors.max() < 0.6  # one implementation: within half the bound, and some slack
    greedy = [[int(np.argmax(row)) for row in rows[len(p) - 1:]]
              for p, rows in zip(golden.prompts, np.split(ours, np.cumsum(
                  [len(s) - 1 for s in golden.sequences()])[:-1]))]
    hf_goldens.check_tokens(golden, greedy, "the NumPy forward pass")
    missed = {}
    for mutation, mutate in _mutations(config).items():
        c, w = mutate(config, weights)
        errors = hf_goldens.logit_errors(_reference_logits(golden, c, w),
                                         golden.stacked_logits(), golden.config, golden.dtype)
        missed[mutation] = float(errors.max())
        with pytest.raises(AssertionError, match="times the tolerance"):
            hf_goldens.check_logits(golden, _reference_logits(golden, c, w), mutation)
    # A top-k renormalisation dropped changes only the sparse layer's
    # weights (by about 1.5 here): in bf16 it is caught, but not twice over.
    narrow = {"top-k weights not renormalised"} if golden.dtype == "bf16" else set()
    caught_narrowly = {m: round(e, 2) for m, e in missed.items() if e <= (1 if m in narrow else 2)}
    assert not caught_narrowly, f"{name}: mutations within twice the tolerance"
    assert len(missed) >= (7 if config.qk_norm else 6)


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def golden_models(tmp_path_factory, kernel_cache):
    """The compiled model of each golden's checkpoint, loaded when first
    asked for."""
    root = tmp_path_factory.mktemp("models")
    found = {}

    def model(name: str):
        if name not in found:
            golden = hf_goldens.Golden.load(name)
            path = golden.write_checkpoint(root / name)
            found[name] = (golden, models.load(path, dtype=golden.dtype, cache=kernel_cache,
                                               **LOAD))
        return found[name]
    return model


@pytest.mark.parametrize("name", HALF)
def test_half_precision_models_match_the_goldens(name, golden_models):
    """Weights, activations and the KV cache in f16 or bf16: transformers'
    logits at every position within the dtype's tolerance (0.051, 0.41 of
    the logits' rms), and its greedy tokens (in bf16 those rounding cannot
    change), for config.json as transformers 4 and 5 write it."""
    golden, model = golden_models(name)
    hf_goldens.check_model(golden, model)
    if "-transformers5-" in name:
        # The transformers 4 config's kernel: the two configs mean the same.
        _, same = golden_models(name.replace("-transformers5-", "-transformers4-"))
        assert model.kernel_source == "cache" and model.config == same.config


@pytest.mark.parametrize("name, dropped", [
    ("llama", "model.norm.weight"),
    ("qwen3", "self_attn.q_norm.weight"),
    ("qwen3_moe", "self_attn.k_norm.weight"),
    ("mixtral", "post_attention_layernorm.weight"),
])
def test_a_model_that_ignores_a_norm_weight_fails_the_golden(name, dropped, golden_models,
                                                             kernel_cache, tmp_path):
    """The comparison end to end on wrong models: each architecture's bf16
    checkpoint with a norm weight set to ones in every layer (what a
    loader that misses it computes: the final norm, q norms, k norms),
    loaded and run by ETC in bf16, is outside the tolerance (Mixtral: the
    norm before the experts)."""
    golden, _ = golden_models(f"{name}-transformers4-bf16")
    path = golden.write_checkpoint(tmp_path / "wrong")
    file = next(path.glob("*.safetensors"))
    tensors = {n: SafetensorsFile(file).get(n) for n in SafetensorsFile(file)}
    hit = [n for n in tensors if n.endswith(dropped)]
    assert hit
    tensors.update({n: np.ones_like(tensors[n]) for n in hit})
    save_file(file, tensors, "BF16")
    wrong = models.load(path, dtype="bf16", cache=kernel_cache, **LOAD)
    assert wrong.kernel_source == "cache"
    out = wrong.generate(golden.prefixes(), 1, return_logits=True)
    with pytest.raises(AssertionError, match="times the tolerance"):
        hf_goldens.check_logits(golden, np.stack([row[0] for row in out.logits]))


def test_goldens_are_what_transformers_computes():
    """With torch: the goldens recomputed now (prompts chosen again,
    tokens, logits, RoPE) are the files'."""
    pytest.importorskip("torch", reason="torch is not installed: the goldens are checked "
                                        "against transformers where it is")
    pytest.importorskip("transformers", reason="transformers is not installed")
    assert hf_goldens.make(check=True) == []


def test_gguf_goldens_are_what_transformers_computes(tmp_path):
    """With torch: transformers' tokens and logits of the GGUF files' source
    checkpoints, recomputed now, are gguf_goldens.py's files'."""
    pytest.importorskip("torch", reason="torch is not installed: the goldens are checked "
                                        "against transformers where it is")
    pytest.importorskip("transformers", reason="transformers is not installed")
    for arch in gguf_goldens.CONFIGS:
        golden = gguf_goldens.load(arch)
        tokens, logits = gguf_goldens.reference_logits(
            gguf_goldens.source_checkpoint(arch, tmp_path))
        assert tokens == golden["tokens"], arch
        tol = hf_goldens.tolerance(golden["config"], "f32")
        for got, want in zip(logits, golden["logits"]):
            rms = np.sqrt(np.mean(np.square(want.astype(np.float64)), axis=-1))
            assert np.all(np.max(np.abs(got - want), axis=-1) <= 0.1 * tol * rms), arch
