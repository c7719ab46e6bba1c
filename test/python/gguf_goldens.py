"""GGUF files written and quantized by llama.cpp itself, for test_gguf.py:
one tiny checkpoint of each GGUF architecture ETC loads (llama, qwen3,
qwen3moe), converted by llama.cpp's `convert_hf_to_gguf.py` to F32 GGUF
and quantized to Q8_0 by llama.cpp's C quantizer
(`llama_cpp.llama_model_quantize`), with transformers' logits of the
source weights and llama.cpp's logits of the files to compare them with.

    make goldens LLAMA_CPP=/path/to/llama.cpp      # or:
    python test/python/gguf_goldens.py --llama-cpp /path/to/llama.cpp

writes test/python/goldens/<arch>-q8_0.gguf and gguf-<arch>.npz (and
`--runs`, alone: gguf-<arch>-llama-cpp.npz, llama.cpp's logits of the
files `write_gguf` writes for RUNS' families, below; `--mxfp4`, alone:
<arch>-mxfp4_moe.gguf and gguf-<arch>-mxfp4_moe.npz, llama.cpp's
MXFP4_MOE quantization of such a file of Qwen3-MoE and its logits of it,
MXFP4_MOE below). It needs
torch and transformers (the converter and the logits), llama-cpp-python
(the quantizer) and a llama.cpp source tree (the converter, with its own
gguf-py). The committed files were made with llama-cpp-python 0.3.36 (pip,
built from source) and the llama.cpp it vendors, commit
0c1e57098bba43ac29e6e3b677cdceebdd22334f (its convert_hf_to_gguf.py,
conversion/ and gguf-py/), torch 2.13.0 (CPU) and transformers 5.24.0.

How, exactly, for each architecture:
1. `write_checkpoint(dir, config, seed=seed, sharp=True, tokenizer=True)`:
   float32 safetensors, config.json, a byte-level BPE tokenizer.json of 320
   ids (CONFIGS below: hidden 32, 2 layers, MLP widths multiples of 32 so
   that every row splits into Q8_0's blocks of 32).
2. `convert_hf_to_gguf.py dir --outtype f32 --outfile <arch>-f32.gguf`,
   run with one change: its check of the BPE pre-tokenizer (a hash of how
   the tokenizer splits a test text, known only for published models) is
   replaced by the answer "gpt-2", which is what the tiny tokenizer does
   (GPT-2's split, then byte-level BPE).
3. `llama_model_quantize(<arch>-f32.gguf, <arch>-q8_0.gguf, params)` with
   `llama_model_quantize_default_params()` and ftype
   LLAMA_FTYPE_MOSTLY_Q8_0: llama.cpp keeps the norms (1-D) in F32 and
   writes every matrix as Q8_0.
4. transformers (float32) on the source checkpoint: the greedy tokens for
   PROMPTS and the logits they were chosen from, in gguf-<arch>.npz.
5. llama.cpp itself on the Q8_0 file (`llama_cpp.Llama(..., logits_all=True)`,
   2 threads): its logits at the same positions, also in gguf-<arch>.npz.
   The model is loaded with `use_extra_bufts = False` in its model
   parameters (no weight repacking into extra CPU buffer types, which is
   reported to crash on quantized files on some machines; on the one these
   were made on, it ran either way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from etc.models.testing import tiny_config, write_checkpoint

DIRECTORY = Path(__file__).resolve().parent / "goldens"
#: Each architecture's source checkpoint config; seeds below.
CONFIGS = {
    "llama": tiny_config("LlamaForCausalLM", vocab_size=320, intermediate_size=64,
                         rope_theta=500000.0),
    "qwen3": tiny_config("Qwen3ForCausalLM", vocab_size=320, intermediate_size=64),
    # Every layer sparse: llama.cpp's qwen3moe has no dense MLP layers.
    "qwen3moe": tiny_config("Qwen3MoeForCausalLM", vocab_size=320, intermediate_size=64,
                            moe_intermediate_size=32),
}
SEEDS = {"llama": 7, "qwen3": 8, "qwen3moe": 9}
PROMPTS = [[17], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]
NEW = 4

# Run in a fresh interpreter: llama.cpp's converter, its pre-tokenizer check
# answered "gpt-2" (see the module docstring).
_CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
convert_hf_to_gguf.main()
"""


def source_checkpoint(arch: str, directory: Path) -> Path:
    """Step 1: the float32 checkpoint the GGUF file of `arch` is made from."""
    return write_checkpoint(directory / arch, CONFIGS[arch], seed=SEEDS[arch], sharp=True,
                            tokenizer=True)


def convert(checkpoint: Path, out: Path, llama_cpp: Path) -> Path:
    """Step 2: llama.cpp's converter, F32."""
    subprocess.run([sys.executable, "-c", _CONVERT, str(llama_cpp), str(checkpoint),
                    "--outtype", "f32", "--outfile", str(out)], check=True,
                   env={**os.environ, "PYTHONPATH": ""})
    return out


def quantize(source: Path, out: Path) -> Path:
    """Step 3: llama.cpp's quantizer, Q8_0."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize({source}) returned {status}")
    return out


def reference_logits(checkpoint: Path) -> tuple[list, list]:
    """Step 4: transformers' greedy tokens for PROMPTS, and the logits
    (float32) each was chosen from: (NEW, vocab) per prompt."""
    import hf_goldens

    model = hf_goldens.hf_model(checkpoint, "f32")
    tokens, logits = [], []
    for prompt in PROMPTS:
        new = hf_goldens.hf_greedy(model, prompt, NEW)
        tokens.append(new)
        rows = hf_goldens.hf_logits(model, prompt + new[:-1])[len(prompt) - 1:]
        logits.append(rows.astype(np.float32))
    return tokens, logits


def _llama_cpp_model(path: Path):
    """llama-cpp-python's model of the file, 2 threads, every position's
    logits kept, without its extra buffer types (weight repacking, AMX),
    which segfault on quantized files in its 0.3.36 build on this machine."""
    import llama_cpp
    import llama_cpp.llama_cpp as bindings

    default = bindings.llama_model_default_params

    def without_repacking():
        params = default()
        params.use_extra_bufts = False
        return params

    bindings.llama_model_default_params = without_repacking
    try:
        return llama_cpp.Llama(str(path), n_ctx=32, n_batch=32, n_threads=2, logits_all=True,
                               verbose=False)
    finally:
        bindings.llama_model_default_params = default


def llama_cpp_logits(gguf_path: Path, tokens: list) -> list:
    """Step 5: llama.cpp's logits of the file at the positions of
    `reference_logits`, per prompt (NEW, vocab) float32."""
    model = _llama_cpp_model(gguf_path)
    out = []
    for prompt, new in zip(PROMPTS, tokens):
        sequence = prompt + new[:-1]
        model.reset()
        model.eval(sequence)
        out.append(np.array(model.scores[:len(sequence)], np.float32)[len(prompt) - 1:])
    return out


def load(arch: str, directory: Path = DIRECTORY) -> dict:
    """The golden of `arch`: {"gguf": path, "config", "seed", "tokens",
    "logits" (transformers', per prompt (NEW, vocab)), "llama_cpp_logits"
    (llama.cpp's of the file, the same), "versions"}."""
    path = directory / f"gguf-{arch}.npz"
    gguf_path = directory / f"{arch}-q8_0.gguf"
    for file in (path, gguf_path):
        if not file.is_file():
            raise AssertionError(f"{file} is missing: make goldens LLAMA_CPP=... (see "
                                 f"test/python/gguf_goldens.py)")
    with np.load(path) as data:
        case = json.loads(str(data["case"]))
        if case != json.loads(json.dumps({"config": CONFIGS[arch], "seed": SEEDS[arch],
                                          "prompts": PROMPTS})):
            raise AssertionError(f"{path} is of another case than gguf_goldens.py says: "
                                 f"regenerate it")
        logits = list(data["logits"].reshape(len(PROMPTS), NEW, -1))
        llama_cpp = list(data["llama_cpp_logits"].reshape(len(PROMPTS), NEW, -1))
        return {"gguf": gguf_path, "config": case["config"], "seed": case["seed"],
                "tokens": data["tokens"].tolist(), "logits": logits,
                "llama_cpp_logits": llama_cpp, "versions": json.loads(str(data["versions"]))}


def make(llama_cpp: Path, directory: Path = DIRECTORY) -> None:
    import llama_cpp as bindings
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for arch in CONFIGS:
            checkpoint = source_checkpoint(arch, scratch)
            f32 = convert(checkpoint, scratch / f"{arch}-f32.gguf", llama_cpp)
            out = quantize(f32, directory / f"{arch}-q8_0.gguf")
            tokens, logits = reference_logits(checkpoint)
            from_llama_cpp = llama_cpp_logits(out, tokens)
            versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                        "llama-cpp-python": bindings.__version__,
                        "llama.cpp": _commit(llama_cpp)}
            np.savez_compressed(
                directory / f"gguf-{arch}.npz",
                case=json.dumps({"config": CONFIGS[arch], "seed": SEEDS[arch],
                                 "prompts": PROMPTS}),
                versions=json.dumps(versions), tokens=np.array(tokens, np.int32),
                logits=np.concatenate(logits), llama_cpp_logits=np.concatenate(from_llama_cpp))
            print(f"{out.name}: {out.stat().st_size} bytes; gguf-{arch}.npz: "
                  f"{(directory / f'gguf-{arch}.npz').stat().st_size} bytes")


# ----------------------------------------------------------------------
# Files written by etc.models.testing, run by llama.cpp
# ----------------------------------------------------------------------

#: The token sequence of every case.
_RUN = [17, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]

#: Architectures whose GGUF file is `write_gguf`'s (the converter's layout
#: through the `gguf` package), float32, run by llama.cpp: Mixtral, which
#: llama.cpp's converter writes as llama with experts; Phi-4-mini's shape
#: (phi3 with rope.dimension_count 6 of head size 8, LongRoPE factor
#: tensors: llama.cpp's n_ctx of 32 is past the original context of 16, so
#: it computes with the long factors); SmolLM3 (smollm3, 4 layers: layer 3
#: without RoPE, llama.cpp's fixed rule). Granite and Granite MoE (`granite`,
#: `granitemoe`: their four scales as metadata keys, Q and K rows permuted
#: as Llama's, Granite MoE's fused experts split into gate and up stacks).
#: OLMo 2 and OLMo 3 (`olmo2`: no input norms, q/k norms over the whole
#: projections; OLMo 3's window of 5 on layers 0 to 2 of 4, llama.cpp's
#: fixed pattern; heads of hidden / heads = 8, the only size llama.cpp's
#: olmo2 takes), GLM-4 (`glm4`: q/k/v biases, the fused gate/up in
#: ffn_up, rope.dimension_count 8 of 16 in interleaved pairs). OLMoE
#: (`olmoe`: q/k norms over the whole projections, 4 experts of 32 a layer,
#: never renormalised; heads of hidden / heads and one KV head per head,
#: what llama.cpp's olmoe takes: its q and k norms are n_embd wide).
#: The case: config, seed of the sharp weights, the token sequence.
RUNS = {"mixtral": (tiny_config("MixtralForCausalLM", vocab_size=320), 21,
                    _RUN),
        "phi4_mini": (tiny_config("Phi3ForCausalLM", vocab_size=320, intermediate_size=64,
                                  head_dim=8, partial_rotary_factor=0.75, sliding_window=None,
                                  tie_word_embeddings=True, max_position_embeddings=128,
                                  original_max_position_embeddings=16,
                                  rope_scaling={"type": "longrope",
                                                "short_factor": [1.0, 1.25, 2.0],
                                                "long_factor": [1.5, 3.0, 8.0]}), 22,
                      _RUN),
        "smollm3": (tiny_config("SmolLM3ForCausalLM", vocab_size=320, intermediate_size=64,
                                num_hidden_layers=4), 23,
                    _RUN),
        "granite": (tiny_config("GraniteForCausalLM", vocab_size=320), 22,
                    _RUN),
        "granite_moe": (tiny_config("GraniteMoeForCausalLM", vocab_size=320), 23,
                        _RUN),
        # Shared experts: Qwen2-MoE (`qwen2moe`: ffn_*_shexp, the gate
        # vector ffn_gate_inp_shexp, q/k/v biases; llama.cpp's qwen2moe
        # takes the head size from hidden / heads) and GraniteMoeShared
        # (`granitemoe` with expert_shared_feed_forward_length).
        "qwen2_moe": (tiny_config("Qwen2MoeForCausalLM", vocab_size=320, head_dim=8), 24,
                      _RUN),
        "granite_moe_shared": (tiny_config("GraniteMoeSharedForCausalLM", vocab_size=320), 24,
                               _RUN),
        # gpt-oss (`gpt-oss`: sinks, q/k/v/o biases, window 3 on layer 0,
        # yarn, experts with biases), llama.cpp's clamp of 7.
        "gpt_oss": (tiny_config("GptOssForCausalLM", vocab_size=320, swiglu_limit=7.0), 23,
                    _RUN),
        "olmo2": (tiny_config("Olmo2ForCausalLM", vocab_size=320, intermediate_size=64,
                              head_dim=8), 24,
                  _RUN),
        "olmo3": (tiny_config("Olmo3ForCausalLM", vocab_size=320, intermediate_size=64,
                              head_dim=8, num_hidden_layers=4, rope_scaling=None,
                              layer_types=["sliding_attention"] * 3 +
                              ["full_attention"]), 25,
                  _RUN),
        "glm4": (tiny_config("Glm4ForCausalLM", vocab_size=320, intermediate_size=64), 26,
                 _RUN),
        # GLM-4.5 (`glm4moe`: exp_probs_b, expert_gating_func sigmoid,
        # expert_weights_scale, leading_dense_block_count, shared experts,
        # q/k/v biases and norms, half of each head rotated; no nextn layer,
        # whose full tensors llama.cpp would need).
        "glm4_moe": (tiny_config("Glm4MoeForCausalLM", vocab_size=320,
                                 num_nextn_predict_layers=0), 25,
                     _RUN),
        "olmoe": (tiny_config("OlmoeForCausalLM", vocab_size=320), 27,
                  _RUN),
        # ERNIE 4.5 (`ernie4_5`: RoPE on interleaved pairs, q/k as
        # transformers holds them) and its MoE (`ernie4_5-moe`: softmax
        # routing with exp_probs_b, a shared expert whose width the
        # converter writes as intermediate_size / KV heads (64 / 2 = 32,
        # one expert's), layer 0 dense; transformers' moe_norm_min).
        "ernie": (tiny_config("Ernie4_5ForCausalLM", vocab_size=320, intermediate_size=64), 28,
                  _RUN),
        "ernie_moe": (tiny_config("Ernie4_5_MoeForCausalLM", vocab_size=320,
                                  intermediate_size=64, moe_norm_min=None), 29,
                      _RUN),
        # EXAONE 4 (`exaone4`): the 32B's kind, a window of 5 on 3 of every
        # 4 layers with RoPE, the 4th full without, llama3 RoPE as
        # rope_freqs factors, at the 32B's 64 layers: llama.cpp (of
        # llama-cpp-python 0.3.36) slides no layer of a file of any other
        # depth, whatever its keys say. And the 1.2B's kind, no window
        # (every layer full with RoPE), tied. Heads of hidden / heads (8):
        # llama.cpp's exaone4 takes the output projection square.
        "exaone4": (tiny_config("Exaone4ForCausalLM", vocab_size=320, intermediate_size=64,
                                num_hidden_layers=64, head_dim=8,
                                layer_types=(["sliding_attention"] * 3 +
                                             ["full_attention"]) * 16),
                    28, _RUN),
        "exaone4_dense": (tiny_config("Exaone4ForCausalLM", vocab_size=320,
                                      intermediate_size=64, head_dim=8, sliding_window=None,
                                      sliding_window_pattern=None,
                                      layer_types=["full_attention"] * 2,
                                      tie_word_embeddings=True), 29, _RUN),
        # Seed-OSS (`seed_oss`: q/k/v biases, the MLP's norm
        # post_attention_norm; no o bias, which llama.cpp's seed_oss lacks).
        "seed_oss": (tiny_config("SeedOssForCausalLM", vocab_size=320, intermediate_size=64,
                                 attention_out_bias=False), 30, _RUN),
        # Hunyuan dense (`hunyuan-dense`: q/k norms after RoPE, NTK-alpha in
        # rope.freq_base).
        "hunyuan_dense": (tiny_config("HunYuanDenseV1ForCausalLM", vocab_size=320,
                                      intermediate_size=64), 31, _RUN),
        # DeepSeek-V2 and V3 (`deepseek2`: MLA as the converter writes it,
        # kv_b split into attn_k_b / attn_v_b; V2-Lite's softmax experts,
        # V3's q_lora, sigmoid routing in groups, exp_probs_b; yarn with
        # mscale = mscale_all_dim, what the file can say; no nextn layer).
        # V2 with q through a low rank (DeepSeek-V2's, not V2-Lite's):
        # llama.cpp's deepseek2 takes a q_proj only at V2-Lite's depth (26
        # or 27 layers), and 27 layers of sharp weights route differently
        # in llama.cpp's rounding (a near-tie of experts somewhere).
        "deepseek_v2": (tiny_config("DeepseekV2ForCausalLM", vocab_size=320,
                                    q_lora_rank=24), 28, _RUN),
        "deepseek_v3": (tiny_config("DeepseekV3ForCausalLM", vocab_size=320,
                                    num_nextn_predict_layers=0,
                                    rope_scaling={"type": "yarn", "factor": 4.0, "beta_fast": 32,
                                                  "beta_slow": 1, "mscale": 0.8,
                                                  "mscale_all_dim": 0.8,
                                                  "original_max_position_embeddings": 32}), 29,
                        _RUN),
        # Cohere (`command-r`: LayerNorms, the parallel block, interleaved
        # RoPE pairs, logit_scale; heads of hidden / heads, the only size
        # llama.cpp's command-r takes) and Cohere2 (`cohere2`, 4 layers: the
        # window of 5 and RoPE on layers 0 to 2, layer 3 full without RoPE,
        # llama.cpp's fixed pattern).
        "cohere": (tiny_config("CohereForCausalLM", vocab_size=320, intermediate_size=64,
                               head_dim=8), 28,
                   _RUN),
        "cohere2": (tiny_config("Cohere2ForCausalLM", vocab_size=320, intermediate_size=64,
                                num_hidden_layers=4, layer_types=None), 29,
                    _RUN)}


def run_digest(config, weights: dict) -> str:
    """SHA-256 of the ModelConfig and graph weights ETC reads from a file:
    what the logits depend on."""
    import dataclasses
    import hashlib

    # The fields that differ from their defaults: a field added to
    # ModelConfig (with a default) leaves the digests of older files.
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
              or getattr(config, f.name) != (f.default if f.default is not dataclasses.MISSING
                                             else f.default_factory())}
    digest = hashlib.sha256(repr(fields).encode())
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(weights[key]).tobytes())
    return digest.hexdigest()


def run_file(arch: str, directory: Path, tokenizer=None) -> Path:
    """The F32 GGUF file of RUNS' case `arch` (with `tokenizer`, a
    `tokenizers.Tokenizer`, in its metadata: llama.cpp needs one)."""
    from etc.models.testing import checkpoint_tensors, write_gguf

    config, seed, _ = RUNS[arch]
    return write_gguf(directory / f"{arch}-run.gguf", config,
                      tensors=checkpoint_tensors(config, seed, sharp=True), tokenizer=tokenizer,
                      pre="gpt-2", eos_token="<|im_end|>" if tokenizer else None)


def read_run(arch: str, directory: Path):
    """RUNS' case `arch` as ETC reads its file (written into `directory`)
    and llama.cpp's run of it: (the GGUFCheckpoint, its weights, the run:
    `load_run`), the weights checked to be those llama.cpp ran."""
    from etc.models.loading.gguf import GGUFCheckpoint

    run = load_run(arch)
    gg = GGUFCheckpoint(run_file(arch, directory))
    weights = gg.weights()
    assert run_digest(gg.config, weights) == run["digest"], \
        (f"etc.models.testing writes other weights now: python test/python/gguf_goldens.py "
         f"--runs {arch}")
    return gg, weights, run


def run_error(run: dict, logits) -> float:
    """How far `logits` (len(sequence), vocab) are from llama.cpp's in
    `run`: the largest difference at a position over that position's rms
    of llama.cpp's logits, the largest over the positions."""
    want = run["logits"].astype(np.float64)
    rms = np.sqrt(np.mean(np.square(want), axis=-1))
    return float((np.max(np.abs(logits - want), axis=-1) / rms).max())


def make_runs(directory: Path = DIRECTORY, names=None) -> None:
    """llama.cpp's logits of every position of RUNS' sequences (those of
    `names`, else all), in gguf-<arch>-llama-cpp.npz with the digest of what
    ETC reads from the same file (`run_digest`)."""
    import llama_cpp as bindings
    from tokenizers import Tokenizer

    from etc.models.loading.gguf import GGUFCheckpoint

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for arch, (config, seed, sequence) in RUNS.items():
            if names and arch not in names:
                continue
            source = write_checkpoint(scratch / arch, config, seed=seed, sharp=True,
                                      tokenizer=True)
            path = run_file(arch, scratch, Tokenizer.from_file(str(source / "tokenizer.json")))
            gg = GGUFCheckpoint(path)
            logits = _llama_cpp_run(path, sequence)
            out = directory / f"gguf-{arch}-llama-cpp.npz"
            np.savez_compressed(out, case=json.dumps({"config": config, "seed": seed,
                                                      "sequence": sequence}),
                                digest=run_digest(gg.config, gg.weights()), logits=logits,
                                versions=json.dumps({"llama-cpp-python": bindings.__version__}))
            print(f"{out.name}: {out.stat().st_size} bytes")


def _llama_cpp_run(path: Path, sequence: list) -> np.ndarray:
    """llama.cpp's logits (len(sequence), vocab) float32 of the file."""
    model = _llama_cpp_model(path)
    model.eval(sequence)
    return np.array(model.scores[:len(sequence)], np.float32)


def load_run(arch: str, directory: Path = DIRECTORY) -> dict:
    """The llama.cpp run of `arch`: {"config", "seed", "sequence",
    "digest", "logits", "versions"}."""
    path = directory / f"gguf-{arch}-llama-cpp.npz"
    if not path.is_file():
        raise AssertionError(f"{path} is missing: python test/python/gguf_goldens.py --runs "
                             f"(where llama-cpp-python imports)")
    return _load_case(path, RUNS[arch], "RUNS", strings=("digest",))


def _load_case(path: Path, case: tuple, table: str, strings: tuple = ()) -> dict:
    """The npz `path`'s {"config", "seed", "sequence", "logits", "versions"}
    and its `strings`, checked to be of `case` (config, seed, sequence) of
    the table named `table`."""
    config, seed, sequence = case
    with np.load(path) as data:
        stored = json.loads(str(data["case"]))
        if stored != json.loads(json.dumps({"config": config, "seed": seed,
                                            "sequence": sequence})):
            raise AssertionError(f"{path} is of another case than gguf_goldens.{table}: "
                                 f"regenerate it")
        return {**stored, **{key: str(data[key]) for key in strings}, "logits": data["logits"],
                "versions": json.loads(str(data["versions"]))}


# ----------------------------------------------------------------------
# llama.cpp's MXFP4_MOE quantization of a file written by etc.models.testing
# ----------------------------------------------------------------------

#: Architectures whose F32 file `write_gguf` writes (as `run_file`) and
#: llama.cpp's quantizer turns into an MXFP4_MOE file
#: (`llama_model_quantize`, ftype LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38: every
#: stack of experts MXFP4, the other matrices Q8_0, the norms and routers
#: F32), committed as <arch>-mxfp4_moe.gguf with llama.cpp's logits of it
#: at every position of the sequence (gguf-<arch>-mxfp4_moe.npz). The case:
#: config, seed of the sharp weights, the token sequence: its routers'
#: choices clear of ties (with 51, 52 after it, llama.cpp's activations,
#: rounded to Q8_0 blocks, flip a near tie of position 12's experts: its
#: logits 1.4 rms from those of the NumPy forward pass on the file's
#: weights, and from ETC's, which keep the tie's side there).
MXFP4_MOE = {"qwen3moe": (CONFIGS["qwen3moe"], SEEDS["qwen3moe"],
                          [17, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50])}
#: llama.cpp's ftype number of MXFP4_MOE (`llama_ftype`).
FTYPE_MXFP4_MOE = 38


def make_mxfp4(directory: Path = DIRECTORY) -> None:
    """MXFP4_MOE's files (llama-cpp-python only, no source tree)."""
    import llama_cpp as bindings
    from tokenizers import Tokenizer

    from etc.models.testing import checkpoint_tensors, write_gguf

    assert bindings.LLAMA_FTYPE_MOSTLY_MXFP4_MOE == FTYPE_MXFP4_MOE
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for arch, (config, seed, sequence) in MXFP4_MOE.items():
            source = write_checkpoint(scratch / arch, config, seed=seed, sharp=True,
                                      tokenizer=True)
            f32 = write_gguf(scratch / f"{arch}-f32.gguf", config,
                             tensors=checkpoint_tensors(config, seed, sharp=True),
                             tokenizer=Tokenizer.from_file(str(source / "tokenizer.json")),
                             pre="gpt-2", eos_token="<|im_end|>")
            params = bindings.llama_model_quantize_default_params()
            params.ftype = FTYPE_MXFP4_MOE
            out = directory / f"{arch}-mxfp4_moe.gguf"
            status = bindings.llama_model_quantize(str(f32).encode(), str(out).encode(), params)
            if status != 0:
                raise RuntimeError(f"llama_model_quantize({f32}, MXFP4_MOE) returned {status}")
            logits = _llama_cpp_run(out, sequence)
            npz = directory / f"gguf-{arch}-mxfp4_moe.npz"
            np.savez_compressed(npz, case=json.dumps({"config": config, "seed": seed,
                                                      "sequence": sequence}),
                                logits=logits,
                                versions=json.dumps({"llama-cpp-python": bindings.__version__}))
            print(f"{out.name}: {out.stat().st_size} bytes; {npz.name}: "
                  f"{npz.stat().st_size} bytes")


def load_mxfp4(arch: str, directory: Path = DIRECTORY) -> dict:
    """The MXFP4_MOE golden of `arch`: {"gguf": path, "config", "seed",
    "sequence", "logits" (llama.cpp's, (len(sequence), vocab)), "versions"}."""
    path = directory / f"gguf-{arch}-mxfp4_moe.npz"
    gguf_path = directory / f"{arch}-mxfp4_moe.gguf"
    for file in (path, gguf_path):
        if not file.is_file():
            raise AssertionError(f"{file} is missing: python test/python/gguf_goldens.py "
                                 f"--mxfp4 (where llama-cpp-python imports)")
    return {**_load_case(path, MXFP4_MOE[arch], "MXFP4_MOE"), "gguf": gguf_path}


def _commit(llama_cpp: Path) -> str:
    """The llama.cpp tree's git commit, or "unknown"."""
    try:
        return subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("LLAMA_CPP_COMMIT", "unknown")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path,
                        help="a llama.cpp source tree (its convert_hf_to_gguf.py is run)")
    parser.add_argument("--runs", nargs="*", metavar="ARCH",
                        help="only RUNS' files, of these architectures or all "
                             "(llama-cpp-python, no source tree needed)")
    parser.add_argument("--mxfp4", action="store_true",
                        help="only MXFP4_MOE's files (llama-cpp-python, no source tree needed)")
    parser.add_argument("--directory", type=Path, default=DIRECTORY)
    args = parser.parse_args(argv)
    if args.runs is not None:
        make_runs(args.directory, args.runs)
        return 0
    if args.mxfp4:
        make_mxfp4(args.directory)
        return 0
    if args.llama_cpp is None:
        parser.error("--llama-cpp is required (or --runs)")
    make(args.llama_cpp, args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
