"""Goldens from Hugging Face transformers for the model families of
test_families.py (Qwen2, Mistral, Gemma 3, Gemma 2, Phi-3, Phi-4-mini,
SmolLM3, Granite, Granite MoE, GraniteMoeShared, Qwen2-MoE, OLMo 2, OLMo 3,
OLMoE, GLM-4, GLM-4.5, ERNIE 4.5 dense and MoE, EXAONE 4, Seed-OSS, Hunyuan dense, Cohere,
Cohere2, Command R+): what `AutoModelForCausalLM` computes for their tiny
checkpoints (and `Gemma3ForConditionalGeneration`,
`Mistral3ForConditionalGeneration` for Gemma 3's and Mistral's inside a
multimodal checkpoint, on text-only input: `MULTIMODAL`), kept in
test/python/goldens/ so that the tests compare ETC with an outside
implementation where torch is not installed.

    python test/python/hf_goldens_families.py [--check]

(where torch and transformers import, with `python/` on PYTHONPATH)
regenerates the files (`--check` compares instead of writing). Made with
torch 2.13.0 (CPU) and transformers 5.24.0; the files record the versions.

A case is a family's tiny checkpoint (`write_checkpoint`), config.json as
transformers 4 or 5 writes it, stored and computed in one dtype. Its file,
`goldens/<family>-<style>-<dtype>.npz`, holds the case, a SHA-256 of the
random weights (a changed generator is reported as such, not as a wrong
model), transformers' greedy tokens for each prompt (`generate`, with its
KV cache: sliding layers through transformers' sliding-window cache) and
the logits of every position of the prompt and its tokens (one forward
pass over the whole sequence): the layout of test/python/hf_goldens.py's
files. The prompts outgrow the windows (11 + 4 positions, windows of 5).

Tolerances are relative to the root mean square of a position's logits:
2 g (k u + n u32), u the dtype's unit roundoff, k = 12 roundings of stored
intermediates per layer (+2), n the terms of the float32 sums along the
longest path, g = 2 the gain of an error through a layer (the derivation
of hf_goldens.tolerance): f32 1.7e-4, f16 0.05, bf16 0.4 for these
configs. Greedy tokens are compared up to the first whose lead over the
next is within twice the tolerance (rounding could swap them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from etc.models.testing import as_transformers5, checkpoint_tensors, tiny_config, write_checkpoint

DIRECTORY = Path(__file__).resolve().parent / "goldens"
DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
NEW = 4
PROMPTS = [[5], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]

#: One tiny config per family, as transformers 4 writes config.json (test_families.py
#: compiles the same).
FAMILIES = {
    "qwen2": tiny_config("Qwen2ForCausalLM"),
    # Layer 0 full, layer 1 sliding (max_window_layers = 1): the prompts and
    # their new tokens (up to 15 positions) outgrow the window of 5.
    "qwen2_window": tiny_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=5,
                                max_window_layers=1),
    # Every layer sliding, a window of 5.
    "mistral": tiny_config("MistralForCausalLM"),
    # Layer 0 sliding (window 5, its own RoPE base), layer 1 full (RoPE
    # base 1e6, linear scaling by 2); q/k norms and the four norms of
    # 1 + w, GeGLU, embeddings scaled by sqrt(32), query_pre_attn_scalar 24.
    "gemma3": tiny_config("Gemma3ForCausalLM"),
    # Gemma 2: sliding and full layers alternating, attention scores capped
    # at 2 and final logits at 4.
    "gemma2": tiny_config("Gemma2ForCausalLM"),
    # Phi-3: q/k/v and gate/up fused (split at load), a window of 5 on
    # every layer.
    "phi3": tiny_config("Phi3ForCausalLM"),
    # Granite 3.x: Llama's layers, tied embeddings, the four multipliers far
    # from 1 (`etc.models.testing.GRANITE_MULTIPLIERS`); Granite MoE with 4
    # fused experts (2 per token) in every layer.
    "granite": tiny_config("GraniteForCausalLM"),
    "granite_moe": tiny_config("GraniteMoeForCausalLM"),
    # Phi-4-mini's shape: RoPE on the first 6 of each head's 8 dimensions
    # (partial_rotary_factor 0.75: the q/k rows permuted at load), LongRoPE
    # (the short factors: every sequence is within the original context of
    # 32, as is the tests' max_seq_len; attention factor 1.18 on the
    # rotated dimensions only), embeddings tied, no window.
    "phi4_mini": tiny_config("Phi3ForCausalLM", head_dim=8, partial_rotary_factor=0.75,
                             sliding_window=None, tie_word_embeddings=True,
                             max_position_embeddings=128, original_max_position_embeddings=32,
                             rope_scaling={"type": "longrope", "short_factor": [1.0, 1.25, 2.0],
                                           "long_factor": [1.5, 3.0, 8.0]}),
    # SmolLM3: layer 1 without RoPE (no_rope_layers [1, 0]), embeddings tied.
    "smollm3": tiny_config("SmolLM3ForCausalLM", no_rope_layers=[1, 0]),
    # Shared experts: Qwen2-MoE (4 experts of 32, 2 per token, not
    # renormalised, a shared expert of 64 gated by sigmoid(x . w), q/k/v
    # biases) and GraniteMoeShared (Granite MoE and an ungated shared MLP
    # of 64, fused gate/up).
    "qwen2_moe": tiny_config("Qwen2MoeForCausalLM"),
    "granite_moe_shared": tiny_config("GraniteMoeSharedForCausalLM"),
    # OLMo 2: no input norms, the attention's and MLP's outputs normed,
    # q/k norms over the whole projections, untied.
    "olmo2": tiny_config("Olmo2ForCausalLM"),
    # OLMo 3: OLMo 2's layers, layer 0 sliding (window 5, plain RoPE),
    # layer 1 full (yarn, attention factor 1.2).
    "olmo3": tiny_config("Olmo3ForCausalLM"),
    # OLMoE: Llama's pre-norm layers, q/k norms over the whole projections,
    # 4 experts of 32 in every layer, 2 per token, not renormalised.
    "olmoe": tiny_config("OlmoeForCausalLM"),
    # GLM-4: q/k/v biases, four norms of w, gate/up fused, RoPE on the
    # first 8 of each head's 16 dimensions in interleaved pairs.
    "glm4": tiny_config("Glm4ForCausalLM"),
    # GLM-4.5: sigmoid routing with a selection bias among 2 groups of 4
    # experts (the best 1 kept), weights times 2.5, a shared expert, layer 0
    # dense, q/k/v biases, q/k norms, half of each head rotated, and a
    # multi-token-prediction layer's weights (skipped).
    "glm4_moe": tiny_config("Glm4MoeForCausalLM"),
    # ERNIE 4.5: Llama's layers, RoPE on interleaved pairs of the whole
    # head, tied embeddings; the MoE model's softmax routing with a
    # selection bias (moe_statics), chosen scores divided by at least
    # moe_norm_min (0.5 here), a shared expert, layer 0 dense, and a
    # multi-token-prediction block's weights (skipped).
    "ernie": tiny_config("Ernie4_5ForCausalLM"),
    "ernie_moe": tiny_config("Ernie4_5_MoeForCausalLM"),
    # EXAONE 4 (the 32B's kind): no input norms, the blocks' outputs normed,
    # q/k norms per head; layer 0 sliding (window 5) with llama3-scaled
    # RoPE, layer 1 full without RoPE; untied.
    "exaone4": tiny_config("Exaone4ForCausalLM"),
    # Seed-OSS: Llama's layers with q/k/v biases and an o bias.
    "seed_oss": tiny_config("SeedOssForCausalLM"),
    # Hunyuan dense: q/k norms per head after RoPE, NTK-alpha RoPE (alpha
    # 1000: base 1e4 x 1000^(8/6)), tied.
    "hunyuan_dense": tiny_config("HunYuanDenseV1ForCausalLM"),
    # Cohere (Command R, Aya): LayerNorms without bias, the attention and
    # MLP in parallel on the one input norm, RoPE in interleaved pairs,
    # tied embeddings, logits times 0.25. Cohere2 (Command R7B): layer 0
    # sliding (window 5) with RoPE, layer 1 full without.
    "cohere": tiny_config("CohereForCausalLM"),
    "cohere2": tiny_config("Cohere2ForCausalLM"),
    # Command R+: Cohere with a LayerNorm of each head of q and k, a weight
    # for every head (use_qk_norm).
    "cohere_qk": tiny_config("CohereForCausalLM", use_qk_norm=True),
}
#: The seed of each family's random weights.
SEEDS = {"qwen2": 11, "qwen2_window": 12, "mistral": 13, "gemma3": 14, "gemma2": 16,
         "phi3": 17, "phi4_mini": 19, "smollm3": 20, "granite": 19, "granite_moe": 20,
         "qwen2_moe": 21, "granite_moe_shared": 22, "olmo2": 21, "olmo3": 22, "glm4": 23,
         "glm4_moe": 23, "olmoe": 24, "ernie": 25, "ernie_moe": 35, "exaone4": 28, "seed_oss": 29,
         "hunyuan_dense": 30, "cohere": 25, "cohere2": 26, "cohere_qk": 27}
#: Multimodal checkpoints whose text model ETC runs: the family's causal LM
#: inside `Gemma3ForConditionalGeneration` or
#: `Mistral3ForConditionalGeneration` (`write_checkpoint(...,
#: multimodal=...)`: a tiny SigLIP or Pixtral vision config, a few vision
#: tensors), computed by that class of transformers on text-only input.
#: Per case name: the family, the seed, and per config style the names of
#: the language model's tensors (transformers 4's before 4.52, and 4.52's).
MULTIMODAL = {"gemma3_mm": ("gemma3", 15, {"transformers4": "transformers4",
                                          "transformers5": "transformers4.52"}),
              "mistral3_mm": ("mistral", 18, {"transformers4": "transformers4"})}
#: gpt-oss (test_gptoss.py): biases on q/k/v/o, attention sinks, sliding
#: (window 3) and full layers alternating, yarn RoPE, 4 experts (2 a
#: token) with biases and the clamped SwiGLU; its experts as transformers
#: saves them (float stacks), and MXFP4 as OpenAI's checkpoints are
#: (`write_checkpoint(mxfp4=True)`; transformers needs `accelerate` to load
#: those, so its golden model takes the experts that transformers' own
#: `convert_moe_packed_tensors` dequantizes from the same blocks).
GPT_OSS = {"gpt_oss": tiny_config("GptOssForCausalLM")}
GPT_OSS_SEED = 19


#: The dtypes of transformers 4's config style where not all of DTYPES (the
#: suite's time): the families from Granite on in float32 and bfloat16 (f16
#: adds nothing their layers would not show in bf16); OLMo 3's in float32
#: (its layers are OLMo 2's, its windows Gemma's).
V4_DTYPES = {**dict.fromkeys(("granite", "granite_moe", "qwen2_moe", "granite_moe_shared",
                              "olmo2", "glm4", "glm4_moe", "olmoe", "ernie", "ernie_moe",
                              "exaone4", "seed_oss", "hunyuan_dense", "cohere", "cohere2",
                              "cohere_qk"), ("f32", "bf16")),
             "olmo3": ("f32",)}
#: The families whose transformers 4 goldens leave bfloat16 out: a bf16
#: step kernel compiles for 20 to 30 s on the test machine, and theirs are
#: Phi-3's and Llama's kinds (partial rotary and NoPE change the weights
#: and which layers rotate, not the tiles), and OLMo 3's OLMo 2's; their
#: bf16 weights are checked in test_rope_families.py (OLMo 3's: its
#: kernels are OLMo 2's with Gemma's windows).
NO_BF16 = ("phi4_mini", "smollm3", "olmo3")


def cases() -> dict[str, dict]:
    """Every golden case by file name: both config styles in float32, and
    transformers 4's in float16 and bfloat16 (`V4_DTYPES`; `NO_BF16`: float16 only)."""
    out = {}
    for name, config in FAMILIES.items():
        half = [d for d in V4_DTYPES.get(name, DTYPES) if d != "bf16" or name not in NO_BF16]
        for style, dtypes in (("transformers4", half), ("transformers5", ("f32",))):
            raw = as_transformers5(config) if style == "transformers5" else config
            for dtype in dtypes:
                out[f"{name}-{style}-{dtype}"] = dict(config=raw, seed=SEEDS[name],
                                                      dtype=dtype, family=name)
    for name, (family, seed, styles) in MULTIMODAL.items():
        for style, names in styles.items():
            config = FAMILIES[family]
            raw = as_transformers5(config) if style == "transformers5" else config
            out[f"{name}-{style}-f32"] = dict(config=raw, seed=seed, dtype="f32", family=family,
                                              multimodal=names)
    config = GPT_OSS["gpt_oss"]
    for dtype in ("f32", "bf16"):
        out[f"gpt_oss-transformers5-{dtype}"] = dict(config=as_transformers5(config),
                                                     seed=GPT_OSS_SEED, dtype=dtype,
                                                     family="gpt_oss")
        out[f"gpt_oss_mxfp4-transformers4-{dtype}"] = dict(config=config, seed=GPT_OSS_SEED,
                                                           dtype=dtype, family="gpt_oss",
                                                           mxfp4=True)
    return out


def tolerance(config: dict, dtype: str) -> float:
    """The largest difference allowed between two implementations' logits
    at one position, relative to the rms of that position's logits (see
    the module docstring)."""
    unit = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
    layers, h = config["num_hidden_layers"], config["hidden_size"]
    heads = config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    positions = max(map(len, PROMPTS)) + NEW
    k = 12 * layers + 2
    n = layers * (4 * h + 2 * d + 2 * positions + heads * d +
                  config["intermediate_size"]) + 2 * h
    return 2 * 2.0 * (k * unit[dtype] + n * unit["f32"])


def weights_digest(config: dict, seed: int) -> str:
    """SHA-256 of the float32 tensors `write_checkpoint` draws, with their names."""
    digest = hashlib.sha256()
    for name, array in checkpoint_tensors(config, seed).items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array, np.float32).tobytes())
    return digest.hexdigest()


class Golden:
    """One golden file: the case, the prompts, transformers' greedy tokens
    and the logits of every position."""

    def __init__(self, name: str, case: dict, prompts: list, tokens: list, logits: list,
                 versions: dict, digest: str):
        self.name, self.case = name, case
        self.config, self.seed, self.dtype = case["config"], case["seed"], case["dtype"]
        self.prompts, self.tokens, self.logits = prompts, tokens, logits
        self.versions, self.digest = versions, digest

    def sequences(self) -> list[list[int]]:
        return [list(p) + list(t) for p, t in zip(self.prompts, self.tokens)]

    def prefixes(self) -> list[list[int]]:
        """Every prefix whose last position the logits cover, in row order."""
        return [s[:j + 1] for s in self.sequences() for j in range(len(s) - 1)]

    def write_checkpoint(self, path) -> Path:
        """The case's checkpoint, after checking that its weights are those
        the golden was made from."""
        if weights_digest(self.config, self.seed) != self.digest:
            raise AssertionError(f"goldens/{self.name}.npz was made from other weights than "
                                 f"etc.models.testing draws now (seed {self.seed}): "
                                 f"regenerate it (test/python/hf_goldens_families.py)")
        return write_checkpoint(path, self.config, dtype=DTYPES[self.dtype], seed=self.seed,
                                multimodal=self.case.get("multimodal"),
                                mxfp4=self.case.get("mxfp4", False))

    def prefix_logits(self, model) -> np.ndarray:
        """`model`'s logits of every prefix (a row per `prefixes()`), each
        prefix a request of one step: prefill."""
        import etc.models as models

        prefixes = self.prefixes()
        cache = model.new_cache(len(prefixes), max(map(len, prefixes)))
        logits, _ = model.step(cache, [models.Request(i, 0, prefix)
                                       for i, prefix in enumerate(prefixes)], return_logits=True)
        return logits

    def errors(self, logits: np.ndarray) -> np.ndarray:
        """Per row of `logits` (a row per `prefixes()`), its largest
        difference from transformers' as a fraction of the tolerance."""
        want = np.concatenate(self.logits).astype(np.float64)
        assert logits.shape == want.shape, (logits.shape, want.shape)
        scale = np.sqrt(np.mean(np.square(want), axis=-1))
        return np.max(np.abs(logits - want), axis=-1) / (tolerance(self.config, self.dtype) *
                                                         scale)

    def check_logits(self, logits: np.ndarray) -> np.ndarray:
        """Asserts that `logits` (a row per `prefixes()`) are within the
        tolerance of transformers'; returns the errors as fractions of it."""
        errors = self.errors(logits)
        worst = int(np.argmax(errors))
        assert errors[worst] <= 1, (
            f"{self.name}: ETC's logits after {self.prefixes()[worst]} differ from "
            f"transformers' by {errors[worst]:.3g} times the tolerance "
            f"({tolerance(self.config, self.dtype):.3g} of their rms); "
            f"{int(np.sum(errors > 1))} of {len(errors)} positions are outside it")
        return errors

    def check_reference(self, config, weights: dict, misreadings: dict,
                        miss: float = 1) -> None:
        """Asserts that the NumPy forward pass (`etc.models.step.reference`)
        of `config` and `weights` is within the tolerance of transformers'
        logits, and that each of `misreadings` (what -> a function of
        (config, weights) giving the misread pair) is more than `miss`
        times it away."""
        from etc.models.step import reference

        def logits(config, weights):
            return np.concatenate([reference.forward(config, weights, s[:-1])
                                   for s in self.sequences()])

        self.check_logits(logits(config, weights))
        for what, misread in misreadings.items():
            assert self.errors(logits(*misread(config, weights))).max() > miss, (
                f"{self.name}: {what}: still within {miss} times the golden's tolerance")

    def check_tokens(self, tokens: list) -> None:
        """Asserts that the greedy `tokens` (per prompt) are transformers',
        up to the first one rounding could change."""
        tol = tolerance(self.config, self.dtype)
        for r, (prompt, want, got, logits) in enumerate(zip(self.prompts, self.tokens, tokens,
                                                            self.logits)):
            rows = logits[len(prompt) - 1:].astype(np.float64)
            top = -np.sort(-rows, axis=-1)
            close = top[:, 0] - top[:, 1] <= 2 * tol * np.sqrt(np.mean(rows ** 2, axis=-1))
            count = int(np.argmax(close)) if close.any() else len(want)
            assert list(got[:count]) == list(want[:count]), (
                f"{self.name}: prompt {r}: ETC's tokens {list(got)} are not transformers' "
                f"{list(want)} (the first {count} are determined in {self.dtype})")

    def check_model(self, model) -> None:
        """`check_logits` of `model`'s `prefix_logits`, and `check_tokens` of
        the NEW greedy tokens `model.generate` picks (prefill, then decode
        through the paged cache)."""
        self.check_logits(self.prefix_logits(model))
        self.check_tokens(model.generate(self.prompts, NEW).tokens)

    def save(self, directory: Path = DIRECTORY) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}.npz"
        np.savez_compressed(
            path, case=json.dumps(self.case, sort_keys=True), versions=json.dumps(self.versions),
            digest=self.digest, prompt_lengths=np.array([len(p) for p in self.prompts], np.int32),
            prompts=np.array([t for p in self.prompts for t in p], np.int32),
            tokens=np.array(self.tokens, np.int32), logits=np.concatenate(self.logits),
            router_gaps=np.zeros(0, np.float32))
        return path

    @classmethod
    def load(cls, name: str, directory: Path = DIRECTORY) -> "Golden":
        """The golden `name`, checked to be the case `cases()` names now."""
        return cls.read(name, directory, cases(), "hf_goldens_families.py")

    @classmethod
    def read(cls, name: str, directory: Path, expected: dict, script: str) -> "Golden":
        """The golden `name` in `directory`, checked to be the case that
        `expected` (a golden script's `cases()`) names now; `script` makes
        the files."""
        path = directory / f"{name}.npz"
        if not path.is_file():
            raise AssertionError(f"{path} is missing: run test/python/{script} where torch and "
                                 f"transformers import")
        with np.load(path) as data:
            case = json.loads(str(data["case"]))
            lengths = data["prompt_lengths"].tolist()
            starts = np.cumsum([0] + lengths)
            flat = data["prompts"].tolist()
            prompts = [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]
            rows = np.cumsum([0] + [n + NEW - 1 for n in lengths])
            logits = [data["logits"][a:b] for a, b in zip(rows[:-1], rows[1:])]
            golden = cls(name, case, prompts, data["tokens"].tolist(), logits,
                         json.loads(str(data["versions"])), str(data["digest"]))
        if json.loads(json.dumps(expected.get(name), sort_keys=True)) != case:
            raise AssertionError(f"{path} is of another case than {script}'s cases() says: "
                                 f"regenerate it")
        return golden


# ----------------------------------------------------------------------
# Making them (needs torch and transformers)
# ----------------------------------------------------------------------


def compute(name: str, case: dict, directory: Path) -> Golden:
    """The golden of case `name`, computed by transformers."""
    import torch
    import transformers

    path = write_checkpoint(directory / name, case["config"], dtype=DTYPES[case["dtype"]],
                            seed=case["seed"], multimodal=case.get("multimodal"),
                            mxfp4=case.get("mxfp4", False))
    if case.get("mxfp4"):
        path = _dequantized_by_transformers(path)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
    # A multimodal checkpoint: its own class (vision tower and all), given
    # text alone.
    kind = transformers.AutoModelForImageTextToText if case.get("multimodal") else \
        transformers.AutoModelForCausalLM
    model = kind.from_pretrained(path, dtype=dtype).eval()
    tokens, logits = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 pad_token_id=0)
            new = out[0, len(prompt):].tolist()
            tokens.append(new)
            sequence = torch.tensor([prompt + new[:-1]])
            logits.append(model(sequence).logits[0].to(torch.float32).numpy())
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return Golden(name, case, PROMPTS, tokens, logits, versions,
                  weights_digest(case["config"], case["seed"]))


def _dequantized_by_transformers(path: Path) -> Path:
    """A copy of MXFP4 checkpoint `path` whose experts transformers' own
    `convert_moe_packed_tensors` dequantized (in float32: MXFP4 values are
    exact in bf16 too), without the quantization_config: the model
    transformers computes for the MXFP4 checkpoint, where loading that
    needs `accelerate`."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(path / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            wide = convert_moe_packed_tensors(tensor, tensors[base + "_scales"],
                                              dtype=torch.float32)
            out[base] = wide.to(tensors[base.replace("_proj", "_proj_bias")].dtype).contiguous()
        elif not name.endswith("_scales"):
            out[name] = tensor
    target = path.with_name(path.name + "-dequantized")
    target.mkdir()
    save_file(out, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (target / "config.json").write_text(json.dumps(config))
    return target


def make(directory: Path = DIRECTORY, check: bool = False, families=None, *, every=None,
         load=None) -> list[str]:
    """Computes every golden (those of `families`, else all) of `every`
    (name -> case; default: `cases()`); writes them, or with `check`
    compares them with the files, read by `load` (default: `Golden.load`).
    Returns what differs."""
    problems = []
    every, load = every or cases(), load or Golden.load
    with tempfile.TemporaryDirectory() as scratch:
        for name, case in every.items():
            if families and case["family"] not in families:
                continue
            golden = compute(name, case, Path(scratch))
            if not check:
                print(golden.save(directory))
                continue
            stored = load(name, directory)
            if stored.tokens != golden.tokens:
                problems.append(f"{name}: tokens {stored.tokens} != {golden.tokens}")
            for a, b in zip(stored.logits, golden.logits):
                if not np.array_equal(a, b):
                    problems.append(f"{name}: logits differ by {np.abs(a - b).max():.3g}")
                    break
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files instead of writing them")
    parser.add_argument("families", nargs="*", help="only these families' goldens")
    args = parser.parse_args(argv)
    problems = make(check=args.check, families=args.families)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
