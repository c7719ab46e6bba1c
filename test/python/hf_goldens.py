"""Goldens from Hugging Face transformers: what `AutoModelForCausalLM`
computes for ETC's tiny test checkpoints, kept as small files in
test/python/goldens/ so that the tests compare ETC with an outside
implementation where torch is not installed (CI), and the tolerances those
comparisons use, derived from each dtype's rounding.

    make goldens                  # where torch and transformers import
    python test/python/hf_goldens.py [--check]

regenerates every file (`--check` compares instead of writing: what
test_goldens.py does when torch imports). Made with torch 2.13.0 (CPU) and
transformers 5.24.0; the files record the versions.

A golden case is an architecture's tiny checkpoint (`write_checkpoint` with
`sharp=True`, so that every norm weight and RoPE matter), written with
config.json as transformers 4 or 5 writes it, stored and computed in one
dtype; the file holds the case (config, seed, dtype, prompts), a SHA-256 of
the random weights (so that a changed generator is seen, not misread as a
wrong model), the greedy tokens `generate` picks and the logits of every
position of each prompt plus its tokens. The prompts are chosen, from a
seeded stream, so that nothing compared sits within rounding of a tie: at
every position the greedy token leads the next by more than twice the
tolerance, and (MoE) the k-th chosen expert's router logit leads the next
by more than twice what rounding can move it, in every dtype.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from etc.models.testing import as_transformers5, checkpoint_tensors, tiny_config, write_checkpoint

DIRECTORY = Path(__file__).resolve().parent / "goldens"
#: ETC's compute dtypes and the safetensors dtype their checkpoints are stored in.
DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
STYLES = ("transformers4", "transformers5")
NEW = 4
#: Prompt lengths: one token, one across attention chunks of 4, one across three.
PROMPT_LENGTHS = (1, 6, 11)

#: The architectures' tiny configs, as test_models.py compiles them: Llama 3
#: style (llama3 RoPE scaling, an untied LM head), Qwen3, Qwen3-MoE with one
#: dense layer and one sparse one, Mixtral with one layer (sparse, 4
#: experts, 2 per token; test_families.py tests a 2-layer one): every Mixtral
#: layer is sparse, and a second layer's router sits behind a whole layer
#: of bf16 rounding (`router_tolerance` 0.11 of its logits' rms), within
#: twice that of a tie at so many positions that `choose_prompts` had not
#: found well-conditioned prompts for two layers after 13 minutes (for one:
#: seconds).
ARCHITECTURES = {
    "llama": tiny_config("LlamaForCausalLM", rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "qwen3": tiny_config("Qwen3ForCausalLM"),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0]),
    "mixtral": tiny_config("MixtralForCausalLM", num_hidden_layers=1),
}
SEEDS = {"llama": 0, "qwen3": 1, "qwen3_moe": 2, "mixtral": 5}

#: Written only as transformers 5 writes them (test_model_config.py): a
#: Qwen3 with a RoPE base of 100000 and a Llama with yarn scaling, float32,
#: weights as `write_checkpoint` draws them by default.
V5_CONFIGS = {
    "qwen3_theta": as_transformers5(tiny_config("Qwen3ForCausalLM", rope_theta=100000.0)),
    "llama_yarn": as_transformers5(tiny_config(
        "LlamaForCausalLM", rope_theta=50000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                      "beta_fast": 8, "beta_slow": 1})),
}
V5_SEEDS = {"qwen3_theta": 3, "llama_yarn": 4}

#: The RoPE cases of test_model_config.py whose frequencies and attention
#: factor transformers' own functions give (rope_type, its parameters); each
#: written both ways, with RoPE base 250000 and head size 32.
ROPE_CASES = [
    ("default", {}),
    ("linear", {"factor": 2.5}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 32}),
    ("yarn", {"factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 16,
              "beta_slow": 2, "mscale": 0.8, "mscale_all_dim": 0.5}),
]
ROPE_THETA = 250000.0


def rope_config(kind: str, params: dict, written_by: str) -> dict:
    """The config.json of ROPE_CASES' case (`kind`, `params`) as
    `written_by` ("transformers4" or "transformers5") writes it."""
    v4 = tiny_config("LlamaForCausalLM", head_dim=32, rope_theta=ROPE_THETA,
                     rope_scaling={"rope_type": kind, **params} if kind != "default" else None)
    return as_transformers5(v4) if written_by == "transformers5" else v4


# ----------------------------------------------------------------------
# Tolerances
# ----------------------------------------------------------------------

#: Unit roundoff u = 2^-p of each dtype (p significant bits, round to
#: nearest): the largest relative error of one rounding.
UNIT_ROUNDOFF = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
#: The gain of a relative error through the two layers of these models
#: (see `tolerance`).
ERROR_GAIN = 2.0


def roundings(config: dict) -> tuple[int, int]:
    """(k, n) of `tolerance` for `config`: k, the roundings of stored
    intermediates on the longest path from the embedding to a logit, and n,
    the terms summed (in float32) along it."""
    layers, h = config["num_hidden_layers"], config["hidden_size"]
    heads = config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    f = max(config["intermediate_size"], config.get("moe_intermediate_size") or 0)
    positions = max(PROMPT_LENGTHS) + NEW
    # Per layer, each result stored in the compute dtype: the attention
    # norm, q/k/v, their norms, RoPE, the KV cache, the attention output,
    # o_proj plus the residual, the MLP norm, gate/up, silu(gate) * up,
    # down_proj plus the residual; then the final norm and the logits.
    k = 12 * layers + 2
    # Per layer, the sums: norms (h) and q/k norms (d), q/k/v (h), scores
    # (d), softmax and the weighted values (positions each), o_proj
    # (heads d), gate/up (h), down (f); the final norm and the LM head (h).
    n = layers * (2 * h + 2 * d + h + 2 * positions + heads * d + h + f) + 2 * h
    return k, n


def tolerance(config: dict, dtype: str) -> float:
    """The largest difference allowed between two implementations' logits
    at one position, relative to the root mean square of that position's
    logits, for models of `config` computed in `dtype`.

    Derivation. Each rounding of a stored intermediate (weights are
    stored, not rounded, in the compute dtype) moves it by at most u
    relative, u the dtype's unit roundoff; a float32 sum of n terms adds at
    most n u32 relative to the sum of the terms' magnitudes. The logits are
    z = W x (W the LM head, x the final normed state), and RMSNorm is
    scale-invariant, so a relative error e of the hidden state gives errors
    of z of about e rms(z). Along the longest path there are k roundings and
    n summed terms (`roundings`: k = 26 and n = 668 for the tiny configs),
    each error carried on with a gain of at most g = ERROR_GAIN = 2 (a
    residual block passes the stream's error on and adds its own; the
    softmax of scores of size ~4 doubles a relative error of q and k at
    most). One implementation is then within g (k u + n u32) rms(z) of the
    exact logits, and two within twice that:

        tol = 2 g (k u + n u32)  ->  bf16 0.41, f16 0.051, f32 1.7e-4

    (relative to rms(z)). Measured, ETC against transformers: at most 0.055
    of the tolerance in f32, 0.57 in f16, 0.54 in bf16 (the NumPy forward
    pass: 0.04, 0.31, 0.35); a model that drops a norm weight, swaps two
    projections or changes RoPE's base or scaling misses by 2.7 (bf16) to
    47,000 (f32) times it (test_goldens.py)."""
    k, n = roundings(config)
    return 2 * ERROR_GAIN * (k * UNIT_ROUNDOFF[dtype] + n * UNIT_ROUNDOFF["f32"])


def router_tolerance(config: dict, dtype: str) -> float:
    """How far rounding can move a router logit, relative to the root mean
    square of the position's router logits: the bound of `tolerance` for
    one implementation, with the roundings before the last layer's router
    (12 per layer before it, its norm and the router's logits)."""
    layers = config["num_hidden_layers"]
    k = 12 * (layers - 1) + 2
    _, n = roundings(config)
    return ERROR_GAIN * (k * UNIT_ROUNDOFF[dtype] + n * UNIT_ROUNDOFF["f32"])


def logit_errors(ours: np.ndarray, golden: np.ndarray, config: dict, dtype: str) -> np.ndarray:
    """Per position (rows), the largest |ours - golden| over the vocabulary
    as a fraction of the tolerance (`tolerance`); <= 1 passes."""
    scale = np.sqrt(np.mean(np.square(golden.astype(np.float64)), axis=-1))
    error = np.max(np.abs(ours.astype(np.float64) - golden), axis=-1)
    return error / (tolerance(config, dtype) * scale)


def check_logits(golden: "Golden", logits: np.ndarray, who: str = "ETC") -> np.ndarray:
    """Asserts that `logits` (one row per `golden.prefixes()`, the logits of
    its last position) are within the tolerance of transformers' at every
    position; returns the errors as fractions of the tolerance."""
    want = golden.stacked_logits()
    if logits.shape != want.shape:
        raise AssertionError(f"{golden.name}: {who} gave logits of shape {logits.shape}, the "
                             f"golden has {want.shape}")
    errors = logit_errors(logits, want, golden.config, golden.dtype)
    worst = int(np.argmax(errors))
    if not errors[worst] <= 1:
        prefix = golden.prefixes()[worst]
        raise AssertionError(
            f"{golden.name}: {who}'s logits after {prefix} (position {len(prefix) - 1}) "
            f"differ from transformers' by {errors[worst]:.3g} times the tolerance "
            f"({tolerance(golden.config, golden.dtype):.3g} of their rms, {golden.dtype}); "
            f"{int(np.sum(errors > 1))} of {len(errors)} positions are outside it")
    return errors


def determined_tokens(golden: "Golden") -> list[int]:
    """Per prompt, how many of the golden's greedy tokens rounding cannot
    change: those before the first whose lead over the next token is at
    most twice the tolerance (all of them in f32 and f16: the prompts are
    chosen so)."""
    counts = []
    for prompt, tokens, logits in zip(golden.prompts, golden.tokens, golden.logits):
        rows = logits[len(prompt) - 1:].astype(np.float64)
        top = -np.sort(-rows, axis=-1)
        rms = np.sqrt(np.mean(np.square(rows), axis=-1))
        close = top[:, 0] - top[:, 1] <= 2 * tolerance(golden.config, golden.dtype) * rms
        counts.append(int(np.argmax(close)) if close.any() else len(tokens))
    return counts


def check_tokens(golden: "Golden", tokens: list, who: str = "ETC") -> None:
    """Asserts that the greedy `tokens` (per prompt) are transformers', up
    to the first token rounding could change (`determined_tokens`)."""
    for r, (count, want, got) in enumerate(zip(determined_tokens(golden), golden.tokens,
                                               tokens)):
        if list(got[:count]) != list(want[:count]):
            raise AssertionError(f"{golden.name}: prompt {r}: {who}'s greedy tokens "
                                 f"{list(got)} are not transformers' {list(want)} (the first "
                                 f"{count} are determined in {golden.dtype})")


def check_model(golden: "Golden", model) -> None:
    """Asserts that the compiled `model` (an `etc.models.Model` of the
    golden's checkpoint) computes in the golden's dtype, weights,
    activations and KV cache, and gives transformers' logits at every
    position (teacher forced: each prefix a request, one step) within the
    tolerance, and its greedy tokens (`check_tokens`)."""
    assert model.dtype == model.kv_dtype == golden.dtype
    storage = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[golden.dtype]
    assert {a.dtype for a in model.new_cache(2, 8).arrays.values()} == {np.dtype(storage)}
    out = model.generate(golden.prefixes(), 1, return_logits=True)
    check_logits(golden, np.stack([row[0] for row in out.logits]))
    check_tokens(golden, model.generate(golden.prompts, NEW).tokens)


# ----------------------------------------------------------------------
# Golden files
# ----------------------------------------------------------------------


def weights_digest(config: dict, seed: int, sharp: bool) -> str:
    """SHA-256 of the float32 tensors `write_checkpoint` draws for the case,
    in order, with their names."""
    digest = hashlib.sha256()
    for name, array in checkpoint_tensors(config, seed, sharp=sharp).items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array, np.float32).tobytes())
    return digest.hexdigest()


def cases() -> dict[str, dict]:
    """Every golden case by file name: its config.json, seed, `sharp`,
    dtype, and the architecture whose prompts it shares."""
    out = {}
    for arch, config in ARCHITECTURES.items():
        for style in STYLES:
            raw = as_transformers5(config) if style == "transformers5" else config
            for dtype in DTYPES:
                out[f"{arch}-{style}-{dtype}"] = dict(config=raw, seed=SEEDS[arch], sharp=True,
                                                      dtype=dtype, group=arch)
    for name, config in V5_CONFIGS.items():
        out[f"{name}-transformers5-f32"] = dict(config=config, seed=V5_SEEDS[name], sharp=False,
                                                dtype="f32", group=name)
    return out


class Golden:
    """One golden file: the case, the prompts, and transformers' greedy
    tokens and logits."""

    def __init__(self, name: str, case: dict, prompts: list, tokens: list, logits: list,
                 versions: dict, digest: str, router_gaps: list):
        self.name, self.case = name, case
        self.config, self.seed, self.sharp = case["config"], case["seed"], case["sharp"]
        self.dtype = case["dtype"]
        self.prompts, self.tokens = prompts, tokens
        #: Per prompt: (len(prompt) + NEW - 1, vocab) float32, the logits of
        #: every position of the prompt and its tokens but the last.
        self.logits = logits
        self.versions, self.digest = versions, digest
        #: Per prompt and position (MoE): the smallest lead of a chosen
        #: expert's router logit over the first one not chosen, over the
        #: sparse layers, relative to the router logits' rms (else empty).
        self.router_gaps = router_gaps

    def sequences(self) -> list[list[int]]:
        return [list(p) + list(t) for p, t in zip(self.prompts, self.tokens)]

    def prefixes(self) -> list[list[int]]:
        """Every prefix whose last position `logits` covers, in row order."""
        return [s[:j + 1] for s in self.sequences() for j in range(len(s) - 1)]

    def stacked_logits(self) -> np.ndarray:
        return np.concatenate(self.logits)

    def write_checkpoint(self, path) -> Path:
        """The case's checkpoint (config.json and safetensors) at `path`,
        after checking that its weights are those the golden was made from."""
        if weights_digest(self.config, self.seed, self.sharp) != self.digest:
            raise AssertionError(
                f"goldens/{self.name}.npz was made from other weights than "
                f"etc.models.testing draws now (seed {self.seed}): regenerate the goldens "
                f"(make goldens, where torch imports)")
        return write_checkpoint(path, self.config, dtype=DTYPES[self.dtype], seed=self.seed,
                                sharp=self.sharp)

    def save(self, directory: Path = DIRECTORY) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        lengths = [len(p) for p in self.prompts]
        path = directory / f"{self.name}.npz"
        np.savez_compressed(
            path, case=json.dumps(self.case, sort_keys=True), versions=json.dumps(self.versions),
            digest=self.digest, prompt_lengths=np.array(lengths, np.int32),
            prompts=np.array([t for p in self.prompts for t in p], np.int32),
            tokens=np.array(self.tokens, np.int32), logits=_stored(self.stacked_logits(),
                                                                 self.dtype),
            router_gaps=np.array([g for row in self.router_gaps for g in row], np.float32))
        return path

    @classmethod
    def load(cls, name: str, directory: Path = DIRECTORY) -> "Golden":
        """The golden `name`, checked to be the case `cases()` names now."""
        path = directory / f"{name}.npz"
        if not path.is_file():
            raise AssertionError(f"{path} is missing: make goldens (where torch imports)")
        with np.load(path) as data:
            case = json.loads(str(data["case"]))
            lengths = data["prompt_lengths"].tolist()
            flat = data["prompts"].tolist()
            starts = np.cumsum([0] + lengths)
            prompts = [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]
            tokens = data["tokens"].tolist()
            rows = np.cumsum([0] + [n + NEW - 1 for n in lengths])
            stacked = _unstored(data["logits"])
            logits = [stacked[a:b] for a, b in zip(rows[:-1], rows[1:])]
            gaps = data["router_gaps"].tolist()
            router_gaps = ([gaps[a:b] for a, b in zip(rows[:-1], rows[1:])] if gaps else [])
            golden = cls(name, case, prompts, tokens, logits, json.loads(str(data["versions"])),
                         str(data["digest"]), router_gaps)
        want = cases().get(name)
        if want is None or json.loads(json.dumps(want, sort_keys=True)) != case:
            raise AssertionError(f"{path} is of another case than hf_goldens.cases() says: "
                                 f"regenerate the goldens (make goldens, where torch imports)")
        return golden


def _stored(logits: np.ndarray, dtype: str) -> np.ndarray:
    """The logits as the file keeps them: transformers' half-precision
    logits are values of that dtype, kept in 16 bits (bf16 as its bit
    patterns, uint16), exactly."""
    logits = np.asarray(logits, np.float32)
    if dtype == "f16":
        stored = logits.astype(np.float16)
        back = stored.astype(np.float32)
    elif dtype == "bf16":
        stored = (logits.view(np.uint32) >> 16).astype(np.uint16)
        back = (stored.astype(np.uint32) << 16).view(np.float32)
    else:
        return logits
    if not np.array_equal(back, logits):
        raise ValueError(f"transformers' {dtype} logits are not {dtype} values")
    return stored


def _unstored(stored: np.ndarray) -> np.ndarray:
    if stored.dtype == np.uint16:
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


def load_all(prefix: str = "") -> dict[str, Golden]:
    return {name: Golden.load(name) for name in cases() if name.startswith(prefix)}


# ----------------------------------------------------------------------
# Making them (needs torch and transformers)
# ----------------------------------------------------------------------


def _torch_dtype(dtype: str):
    import torch

    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
            "f64": torch.float64}[dtype]


def hf_model(path, dtype: str):
    """transformers' model of checkpoint `path` computing in `dtype`
    ("f64" too); experts one by one (grouped matmuls take no float64)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=_torch_dtype(dtype), experts_implementation="eager")
    return model.eval()


def hf_greedy(model, prompt: list, new: int = NEW) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logits(model, sequence: list) -> np.ndarray:
    """(len(sequence), vocab) float64: the logits of every position."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([sequence])).logits[0].to(torch.float64).numpy()


def hf_router_gaps(model, sequence: list) -> list[float]:
    """Per position of `sequence`, the smallest lead of the k-th router
    logit over the (k+1)-th over the sparse layers, relative to the
    router logits' rms (`model` in float64)."""
    import torch

    k = getattr(model.config, "num_experts_per_tok", None)
    found: list[np.ndarray] = []

    def hook(module, args, result):
        x = args[0].reshape(-1, args[0].shape[-1])
        logits = (x @ module.weight.T).detach().numpy()
        top = -np.sort(-logits, axis=-1)
        rms = np.sqrt(np.mean(np.square(logits), axis=-1))
        found.append((top[:, k - 1] - top[:, k]) / rms)

    handles = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers
               if hasattr(layer.mlp, "experts")]
    try:
        with torch.no_grad():
            model(torch.tensor([sequence]))
    finally:
        for handle in handles:
            handle.remove()
    return np.min(np.stack(found), axis=0).tolist() if found else []


def _conditioned(config: dict, models: dict, prompt: list) -> bool:
    """Whether nothing compared for `prompt` sits within rounding of a tie
    in any dtype of `models` ({dtype: (model, float64 model)}): the greedy
    tokens lead the next by more than twice the tolerance in f32 and f16
    (bf16's bound is too wide for most tokens: its tokens are compared
    while determined), and (MoE) every position's routing is determined."""
    for dtype, (model, exact) in models.items():
        sequence = prompt + hf_greedy(model, prompt)
        if dtype != "bf16":
            logits = hf_logits(model, sequence[:-1])[len(prompt) - 1:]
            rms = np.sqrt(np.mean(np.square(logits), axis=-1))
            top = -np.sort(-logits, axis=-1)
            if np.any(top[:, 0] - top[:, 1] <= 2 * tolerance(config, dtype) * rms):
                return False
        gaps = hf_router_gaps(exact, sequence[:-1])
        if gaps and min(gaps) <= 2 * router_tolerance(config, dtype):
            return False
    return True


def _group_models(group: dict[str, dict], directory: Path) -> dict:
    """{dtype: (model, float64 model)} of the cases of `group` (one
    architecture's: they differ in style and dtype only)."""
    models = {}
    for name, case in group.items():
        if case["dtype"] not in models:
            path = write_checkpoint(directory / name, case["config"],
                                    dtype=DTYPES[case["dtype"]], seed=case["seed"],
                                    sharp=case["sharp"])
            models[case["dtype"]] = (hf_model(path, case["dtype"]), hf_model(path, "f64"))
    return models


def choose_prompts(config: dict, models: dict) -> list[list[int]]:
    """Prompts of PROMPT_LENGTHS from a seeded stream, the first of each
    length that `_conditioned` accepts for every model of `models`."""
    rng = np.random.default_rng(20261127)
    prompts = []
    for length in PROMPT_LENGTHS:
        for _ in range(1000):
            prompt = rng.integers(3, config["vocab_size"], length).tolist()
            if _conditioned(config, models, prompt):
                prompts.append(prompt)
                break
        else:
            raise RuntimeError(f"no well-conditioned prompt of {length} tokens in 1000 tries")
    return prompts


def compute(name: str, case: dict, prompts: list, directory: Path) -> Golden:
    """The golden of case `name` for `prompts`, computed by transformers."""
    import torch
    import transformers

    path = write_checkpoint(directory / name, case["config"], dtype=DTYPES[case["dtype"]],
                            seed=case["seed"], sharp=case["sharp"])
    model = hf_model(path, case["dtype"])
    exact = hf_model(path, "f64")
    tokens, logits, gaps = [], [], []
    for prompt in prompts:
        new = hf_greedy(model, prompt)
        sequence = prompt + new
        tokens.append(new)
        logits.append(hf_logits(model, sequence[:-1]).astype(np.float32))
        row = hf_router_gaps(exact, sequence[:-1])
        if row:
            gaps.append(row)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return Golden(name, case, prompts, tokens, logits, versions,
                  weights_digest(case["config"], case["seed"], case["sharp"]), gaps)


def compute_rope() -> dict[str, np.ndarray]:
    """transformers' inverse frequencies and attention factor of each
    ROPE_CASES case, written both ways: {"<i>-<written_by>": [factor,
    inv_freq...]} float64."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    out = {}
    for i, (kind, params) in enumerate(ROPE_CASES):
        for written_by in STYLES:
            raw = rope_config(kind, params, written_by)
            hf = transformers.AutoConfig.for_model(raw["model_type"], **{
                k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
            rope = getattr(hf, "rope_parameters", None) or {"rope_type": "default"}
            d = raw["head_dim"]
            if rope.get("rope_type", "default") == "default":
                inv_freq = 1.0 / (hf.rope_parameters["rope_theta"] **
                                  (np.arange(0, d, 2, dtype=np.float32) / d))
                factor = 1.0
            else:
                freq, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
                inv_freq = freq.numpy()
            out[f"{i}-{written_by}"] = np.concatenate([[factor], inv_freq]).astype(np.float64)
    return out


def load_rope(directory: Path = DIRECTORY) -> dict[str, np.ndarray]:
    path = directory / "rope.npz"
    if not path.is_file():
        raise AssertionError(f"{path} is missing: make goldens (where torch imports)")
    with np.load(path) as data:
        cases = json.loads(str(data["cases"]))
        if cases != json.loads(json.dumps(ROPE_CASES)):
            raise AssertionError(f"{path} is of other RoPE cases than hf_goldens.ROPE_CASES: "
                                 f"regenerate the goldens (make goldens, where torch imports)")
        return {k: data[k] for k in data.files if k != "cases"}


def make(directory: Path = DIRECTORY, check: bool = False,
         groups: Optional[list] = None) -> list[str]:
    """Computes every golden (or those of `groups`, and then not rope.npz);
    writes them to `directory`, or with `check` compares them with the
    files there. Returns what differs."""
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        prompts = {}
        for name, case in cases().items():
            group = case["group"]
            if groups is not None and group not in groups:
                continue
            if group not in prompts:
                members = {n: c for n, c in cases().items() if c["group"] == group}
                models = _group_models(members, scratch)
                if check:
                    # The stored prompts, still well-conditioned.
                    prompts[group] = Golden.load(name, directory).prompts
                    if not all(_conditioned(case["config"], models, p) for p in prompts[group]):
                        problems.append(f"{group}: the stored prompts are no longer "
                                        f"well-conditioned")
                else:
                    prompts[group] = choose_prompts(case["config"], models)
                    print(f"{group}: prompts {prompts[group]}")
            golden = compute(name, case, prompts[group], scratch)
            if check:
                problems += _differences(golden, Golden.load(name, directory))
            else:
                path = golden.save(directory)
                print(f"{path.relative_to(directory.parent)}: {path.stat().st_size} bytes")
    if groups is not None:
        return problems
    rope = compute_rope()
    if check:
        for key, values in load_rope(directory).items():
            if not np.allclose(rope[key], values, rtol=1e-6, atol=0):
                problems.append(f"rope.npz {key}: transformers gives {rope[key]}, the file "
                                f"{values}")
    else:
        np.savez_compressed(directory / "rope.npz", cases=json.dumps(ROPE_CASES), **rope)
    return problems


def _differences(fresh: Golden, stored: Golden) -> list[str]:
    """What transformers computes now and the stored golden disagree on:
    tokens, or logits beyond a tenth of the f32 tolerance (or, computed in
    half precision, a tenth of that dtype's)."""
    if fresh.prompts != stored.prompts:
        return [f"{stored.name}: the prompts chosen now differ"]
    problems = []
    if fresh.tokens != stored.tokens:
        problems.append(f"{stored.name}: tokens {fresh.tokens} != stored {stored.tokens}")
    errors = logit_errors(fresh.stacked_logits(), stored.stacked_logits(), stored.config,
                          stored.dtype)
    if errors.max() > 0.1:
        problems.append(f"{stored.name}: logits differ by {errors.max():.2f} of the tolerance")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored goldens instead of writing them")
    parser.add_argument("--directory", type=Path, default=DIRECTORY)
    parser.add_argument("--only", action="append", metavar="GROUP",
                        help="only the cases of this group (an ARCHITECTURES or V5_CONFIGS "
                             "name; repeatable), rope.npz left alone")
    args = parser.parse_args(argv)
    problems = make(args.directory, check=args.check, groups=args.only)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
