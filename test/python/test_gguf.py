"""GGUF files (llama.cpp's format) written here with `gguf.GGUFWriter`:
metadata and tensors checked against the same weights as a safetensors
checkpoint, every tensor name and metadata key against the gguf package's
own (gguf.tensor_mapping, gguf.constants), every quantized type against a
NumPy dequantization of known blocks written from ggml's definitions, the
tokenizer against the one it was written from, whole models against the
safetensors models, and the errors; and files written and quantized (Q8_0)
by llama.cpp itself (gguf_goldens.py) against transformers' logits of their
source weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gguf  # noqa: E402
import tokenizers  # noqa: E402,F401

import etc.models as models  # noqa: E402
import gguf_goldens  # noqa: E402
import hf_goldens  # noqa: E402
from etc.models.step import reference  # noqa: E402
from etc.models.loading.gguf import GGUFCheckpoint, GGUFError, PRE_TOKENIZERS  # noqa: E402
from etc.models.testing import (checkpoint_tensors, tiny_config, write_checkpoint,  # noqa: E402
                                write_gguf)

CONFIGS = {
    "llama": tiny_config("LlamaForCausalLM", rope_theta=500000.0),
    "qwen3": tiny_config("Qwen3ForCausalLM"),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0]),
}
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8)
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


# ----------------------------------------------------------------------
# Metadata and tensors against safetensors
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gguf_config_and_weights_equal_the_safetensors_checkpoint(name, tmp_path):
    """Same random weights written both ways: the same ModelConfig, and the
    same graph weights bit for bit (Llama's Q/K row permutation undone; MoE
    experts in the file's (E, out, in) stacks as g.moe takes them, F32 ones
    views of the file's map, not copies)."""
    config = CONFIGS[name]
    st = models.Checkpoint(write_checkpoint(tmp_path / "st", config, seed=3))
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, seed=3))
    assert gg.config == st.config
    want, got = st.weights(), gg.weights()
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == np.float32 and got[key].flags.c_contiguous
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        if "_experts_" in key:
            name = f"blk.{key[1:key.index('_')]}.ffn_{key.rsplit('_', 1)[1]}_exps.weight"
            assert np.shares_memory(got[key], gg._file.raw(name)), key


def test_llama_qk_rows_are_permuted_in_the_file(tmp_path):
    """The file holds the converter's permuted rows (so the test above would
    fail without the un-permutation)."""
    config = CONFIGS["llama"]
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, seed=3))
    q = checkpoint_tensors(config, 3)["model.layers.0.self_attn.q_proj.weight"]
    stored = gg.tensor("blk.0.attn_q.weight", q.shape, "query")
    assert not np.array_equal(stored, q)
    assert np.array_equal(np.sort(stored, axis=None), np.sort(q, axis=None))


@pytest.mark.parametrize("kind, tolerance", [("F16", 2.0 ** -11), ("BF16", 2.0 ** -8)])
def test_half_precision_tensors(kind, tolerance, tmp_path):
    config = CONFIGS["qwen3"]
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, seed=1, tensor_type=kind))
    assert kind in gg.dtypes()
    want = models.Checkpoint(write_checkpoint(tmp_path / "st", config, seed=1)).weights()
    got = gg.weights()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=tolerance, atol=1e-7,
                                   err_msg=key)
    assert not np.array_equal(got["l0_wq"], want["l0_wq"])  # rounded, so really stored as kind


def test_llama3_rope_frequency_factors(tmp_path):
    """llama.cpp stores Llama 3's RoPE scaling as per-frequency divisors
    (`rope_freqs.weight`): they give the frequencies Hugging Face's
    rope_scaling gives."""
    scaled = tiny_config("LlamaForCausalLM", rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})
    want = models.ModelConfig.from_dict(scaled)
    plain = models.ModelConfig.from_dict(CONFIGS["llama"])
    factors = plain.rope_inv_freq() / want.rope_inv_freq()
    assert np.any(factors > 1.5)
    gg = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", CONFIGS["llama"], rope_freqs=factors))
    np.testing.assert_allclose(gg.weights()["inv_freq"], want.rope_inv_freq(), rtol=1e-6)


# ----------------------------------------------------------------------
# Names and keys: the gguf package's own
# ----------------------------------------------------------------------

#: Configs llama.cpp's architectures hold: qwen3moe with every layer sparse
#: (llama.cpp's qwen3moe has no dense MLP), llama tied and untied.
NAME_CONFIGS = {
    "llama": CONFIGS["llama"],
    "llama_tied": tiny_config("LlamaForCausalLM", tie_word_embeddings=True),
    "qwen3": CONFIGS["qwen3"],
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM"),
}


def _gguf_names(config: dict) -> dict:
    """Hugging Face tensor name -> the GGUF name the gguf package maps it to
    (experts under the name llama.cpp's converter stacks them as), checked
    to be one of the architecture's tensors in gguf.constants."""
    import re

    from etc.models.testing import tensor_shapes

    architecture = {"LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA,
                    "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
                    "Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE}[config["architectures"][0]]
    layers = config["num_hidden_layers"]
    name_map = gguf.get_tensor_name_map(architecture, layers)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) + ".weight"
               for t in gguf.MODEL_TENSORS[architecture] for i in range(layers)}
    out = {}
    for name in tensor_shapes(config):
        stacked = re.sub(r"\.experts\.\d+\.", ".experts.", name)
        found = name_map.get_name(stacked, try_suffixes=(".weight",))
        assert found in allowed, f"{name}: gguf maps it to {found!r}, not a tensor of " \
                                 f"{gguf.MODEL_ARCH_NAMES[architecture]}"
        out[name] = found
    return out


def record_gguf_reads(monkeypatch) -> tuple:
    """(tensor names, "<arch>.<key>" metadata keys): the lists every
    GGUFCheckpoint appends to as it reads them, from now on."""
    read, asked = [], []
    tensor, key = GGUFCheckpoint.tensor, GGUFCheckpoint._key

    def recording_tensor(self, tensor_name, *args):
        read.append(tensor_name)
        return tensor(self, tensor_name, *args)

    def recording_key(self, key_name, *args):
        asked.append(f"{self.architecture}.{key_name}")
        return key(self, key_name, *args)

    monkeypatch.setattr(GGUFCheckpoint, "tensor", recording_tensor)
    monkeypatch.setattr(GGUFCheckpoint, "_key", recording_key)
    return read, asked


def metadata_keys(architecture: str) -> set:
    """Every metadata key gguf.Keys names, for `architecture`."""
    keys = set()
    for group in vars(gguf.Keys).values():
        for value in vars(group).values() if isinstance(group, type) else ():
            if isinstance(value, str):
                keys.add(value.replace("{arch}", architecture))
    return keys


@pytest.mark.parametrize("name", list(NAME_CONFIGS))
def test_tensor_names_and_keys_are_the_gguf_packages(name, tmp_path, monkeypatch):
    """The GGUF loader reads exactly the tensors the gguf package's name map
    gives the architecture's Hugging Face tensors, each into the graph
    weight the safetensors loader reads the Hugging Face tensor into, and
    only metadata keys gguf.Keys names."""
    config = NAME_CONFIGS[name]
    names = _gguf_names(config)
    read, keys = record_gguf_reads(monkeypatch)
    path = write_gguf(tmp_path / "m.gguf", config, seed=2)
    assert set(GGUFCheckpoint(path).names()) == set(names.values())
    got = GGUFCheckpoint(path).weights()
    assert sorted(read) == sorted(set(names.values()))
    assert set(keys) <= metadata_keys(GGUFCheckpoint(path).architecture)
    want = models.Checkpoint(write_checkpoint(tmp_path / "st", config, seed=2)).weights()
    assert set(got) == set(want)
    for graph_name in want:
        np.testing.assert_array_equal(got[graph_name], want[graph_name], err_msg=graph_name)


# ----------------------------------------------------------------------
# Quantized types: known blocks against ggml's definitions
# ----------------------------------------------------------------------


def _f16(values) -> np.ndarray:
    return np.asarray(values, np.float16)


def _ref_q8_0(block: bytes) -> np.ndarray:
    d = np.frombuffer(block[:2], np.float16)[0].astype(np.float32)
    return d * np.frombuffer(block[2:34], np.int8).astype(np.float32)


def _ref_q4_0(block: bytes) -> np.ndarray:
    d = np.frombuffer(block[:2], np.float16)[0].astype(np.float32)
    y = np.empty(32, np.float32)
    for j in range(16):
        y[j] = ((block[2 + j] & 0xF) - 8) * d
        y[j + 16] = ((block[2 + j] >> 4) - 8) * d
    return y


def _ref_q4_1(block: bytes) -> np.ndarray:
    d, m = np.frombuffer(block[:4], np.float16).astype(np.float32)
    y = np.empty(32, np.float32)
    for j in range(16):
        y[j] = (block[4 + j] & 0xF) * d + m
        y[j + 16] = (block[4 + j] >> 4) * d + m
    return y


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _ref_q4_k(block: bytes) -> np.ndarray:
    d, dmin = np.frombuffer(block[:4], np.float16).astype(np.float32)
    scales, q = block[4:16], block[16:144]
    y = []
    for group in range(4):
        sc1, m1 = _scale_min_k4(2 * group, scales)
        sc2, m2 = _scale_min_k4(2 * group + 1, scales)
        chunk = q[32 * group:32 * group + 32]
        y += [d * sc1 * (b & 0xF) - dmin * m1 for b in chunk]
        y += [d * sc2 * (b >> 4) - dmin * m2 for b in chunk]
    return np.asarray(y, np.float32)


def _ref_q5_k(block: bytes) -> np.ndarray:
    d, dmin = np.frombuffer(block[:4], np.float16).astype(np.float32)
    scales, qh, ql = block[4:16], block[16:48], block[48:176]
    y = []
    for group in range(4):
        sc1, m1 = _scale_min_k4(2 * group, scales)
        sc2, m2 = _scale_min_k4(2 * group + 1, scales)
        u1, u2 = 1 << (2 * group), 2 << (2 * group)
        chunk = ql[32 * group:32 * group + 32]
        y += [d * sc1 * ((b & 0xF) + (16 if qh[l] & u1 else 0)) - dmin * m1
              for l, b in enumerate(chunk)]
        y += [d * sc2 * ((b >> 4) + (16 if qh[l] & u2 else 0)) - dmin * m2
              for l, b in enumerate(chunk)]
    return np.asarray(y, np.float32)


def _ref_q6_k(block: bytes) -> np.ndarray:
    ql, qh = block[:128], block[128:192]
    scales = np.frombuffer(block[192:208], np.int8).astype(np.float32)
    d = np.frombuffer(block[208:210], np.float16)[0].astype(np.float32)
    y = np.empty(256, np.float32)
    for half in range(2):
        l8, h8, s8, out = ql[64 * half:], qh[32 * half:], scales[8 * half:], 128 * half
        for l in range(32):
            s = l // 16
            q1 = ((l8[l] & 0xF) | (((h8[l] >> 0) & 3) << 4)) - 32
            q2 = ((l8[l + 32] & 0xF) | (((h8[l] >> 2) & 3) << 4)) - 32
            q3 = ((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4)) - 32
            q4 = ((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4)) - 32
            y[out + l] = d * s8[s] * q1
            y[out + l + 32] = d * s8[s + 2] * q2
            y[out + l + 64] = d * s8[s + 4] * q3
            y[out + l + 96] = d * s8[s + 6] * q4
    return y


#: type: (values per block, bytes per block, byte offsets of the f16 fields,
#: reference dequantization of one block)
QUANTS = {
    "Q8_0": (32, 34, (0,), _ref_q8_0),
    "Q4_0": (32, 18, (0,), _ref_q4_0),
    "Q4_1": (32, 20, (0, 2), _ref_q4_1),
    "Q4_K": (256, 144, (0, 2), _ref_q4_k),
    "Q5_K": (256, 176, (0, 2), _ref_q5_k),
    "Q6_K": (256, 210, (208,), _ref_q6_k),
}


@pytest.mark.parametrize("kind", list(QUANTS))
def test_quantized_blocks_dequantize_as_ggml_defines_them(kind, tmp_path):
    """Random blocks (random bits, finite f16 scales) in a tensor of a GGUF
    model file: the checkpoint dequantizes them as ggml's C definitions
    (written out here block by block) do."""
    per_block, size, halves, dequantize = QUANTS[kind]
    rows, blocks_per_row = 3, 2
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (rows * blocks_per_row, size), dtype=np.uint8)
    for offset in halves:
        scales = _f16(rng.uniform(-0.05, 0.05, rows * blocks_per_row))
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    path = write_gguf(tmp_path / "m.gguf", CONFIGS["qwen3"],
                      raw_tensors={"extra.weight": (raw.reshape(rows, -1), kind)})
    checkpoint = GGUFCheckpoint(path)
    assert kind in checkpoint.dtypes()
    got = checkpoint.tensor("extra.weight", (rows, blocks_per_row * per_block), "test")
    want = np.concatenate([dequantize(bytes(block)) for block in raw])
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-6, atol=1e-6)
    assert np.ptp(want) > 0


@pytest.mark.parametrize("kind, step", [("Q8_0", 1 / 127), ("Q4_0", 1 / 7), ("Q4_1", 1 / 15)])
def test_quantized_model_weights_are_within_a_quantization_step(kind, step, tmp_path):
    """A whole model quantized by the gguf package's quantizers: every
    quantized matrix within half a step of the float weights (the step
    relative to its block's largest value), and really quantized."""
    config = CONFIGS["qwen3_moe"]
    want = models.Checkpoint(write_checkpoint(tmp_path / "st", config)).weights()
    got = GGUFCheckpoint(write_gguf(tmp_path / "m.gguf", config, tensor_type=kind)).weights()
    for key in ("embed", "l0_wq", "l1_experts_gate", "l1_router"):
        w = want[key]
        bound = np.abs(w).max() * step
        assert np.abs(got[key] - w).max() <= bound, key
        assert not np.array_equal(got[key], w), key


# ----------------------------------------------------------------------
# Whole models
# ----------------------------------------------------------------------


def test_gguf_llama_generates_what_the_safetensors_model_generates(tmp_path):
    """Llama (permuted Q/K rows, an untied head, Llama 3 frequency factors)
    loaded from GGUF and from safetensors: the same tokens and logits."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    config = tiny_config("LlamaForCausalLM", rope_theta=500000.0, rope_scaling=scaling)
    plain = {k: v for k, v in config.items() if k != "rope_scaling"}
    factors = (models.ModelConfig.from_dict(plain).rope_inv_freq() /
               models.ModelConfig.from_dict(config).rope_inv_freq())
    st = models.load(write_checkpoint(tmp_path / "st", config, seed=5), cache=False, **LOAD)
    gg = models.load(write_gguf(tmp_path / "m.gguf", plain, seed=5, rope_freqs=factors),
                     cache=False, **LOAD)
    want = st.generate(PROMPTS, 4, return_logits=True)
    got = gg.generate(PROMPTS, 4, return_logits=True)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_quantized_gguf_moe_model_matches_numpy_on_its_weights(tmp_path):
    """A Q8_0 Qwen3-MoE file through the compiled model with its weights
    widened (packed=False; test_gguf_packed_models.py checks the packed
    kernels): each step's logits are those of the NumPy forward pass over
    the dequantized weights."""
    path = write_gguf(tmp_path / "m.gguf", CONFIGS["qwen3_moe"], tensor_type="Q8_0")
    model = models.load(path, cache=False, packed=False, **LOAD)
    checkpoint = GGUFCheckpoint(path)
    weights = checkpoint.weights()
    out = model.generate(PROMPTS, 3, return_logits=True)
    for r, prompt in enumerate(PROMPTS):
        sequence = list(prompt) + out.tokens[r]
        want = reference.forward(checkpoint.config, weights, sequence[:-1])
        np.testing.assert_allclose(out.logits[r], want[len(prompt) - 1:], rtol=2e-4, atol=2e-4)


# ----------------------------------------------------------------------
# Files llama.cpp wrote and quantized
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_cpp_files(tmp_path_factory):
    """Per architecture: the golden, the file read by ETC, and the source
    checkpoint the file was made from (gguf_goldens.py)."""
    root = tmp_path_factory.mktemp("llama_cpp")
    out = {}
    for arch in gguf_goldens.CONFIGS:
        golden = gguf_goldens.load(arch)
        source = models.Checkpoint(gguf_goldens.source_checkpoint(arch, root))
        out[arch] = (golden, GGUFCheckpoint(golden["gguf"]), source)
    return out


def _quantization_tolerance(config: dict, quantized: dict, source: dict) -> float:
    """The largest difference allowed between the logits of quantized
    weights and of their source, relative to the rms of the position's
    logits.

    Derivation. A quantized matrix W + E multiplies x into W x + E x; with
    the rounding errors of E independent, E x has rms e ||W x|| / sqrt(n)
    over the outputs, e = ||E|| / ||W|| (Frobenius; measured here from the
    file and the source, about 0.006 for Q8_0's step of max|block| / 127):
    a relative error e of the matrix's output. The errors of the matrices
    along the path add (at most the sum of their e), carried on with gain
    at most ERROR_GAIN = 2 as in hf_goldens.tolerance, and the largest of a
    position's 320 logit errors is within 4 times their rms (a normal
    deviation beyond 4 sigma has probability 6e-5 each). So

        tol = 4 g sum(e) + tolerance(f32)      (about 0.8 for these files)

    Measured: 0.3 to 0.4 of it."""
    errors = [np.linalg.norm(quantized[k] - source[k]) / np.linalg.norm(source[k])
              for k in source if source[k].ndim >= 2]
    return 4 * hf_goldens.ERROR_GAIN * sum(errors) + hf_goldens.tolerance(config, "f32")


def _quantized_errors(golden: dict, config, weights: dict, tol: float) -> np.ndarray:
    """Per position, the NumPy forward pass on `weights` against the
    golden's logits, as fractions of `tol` (relative to the rms)."""
    errors = []
    for prompt, tokens, want in zip(gguf_goldens.PROMPTS, golden["tokens"], golden["logits"]):
        got = reference.forward(config, weights, prompt + tokens[:-1])[len(prompt) - 1:]
        rms = np.sqrt(np.mean(np.square(want.astype(np.float64)), axis=-1))
        errors.append(np.max(np.abs(got - want), axis=-1) / (tol * rms))
    return np.concatenate(errors)


@pytest.mark.parametrize("arch", list(gguf_goldens.CONFIGS))
def test_llama_cpp_q8_0_files_hold_their_source_weights(arch, llama_cpp_files):
    """llama.cpp quantized every matrix but the routers to Q8_0 and kept the
    norms and routers in F32; ETC reads each weight within Q8_0's step of
    its source (half a step, d = max|block| / 127, plus the float16
    rounding of d), and the config the converter's metadata says is the
    source's."""
    golden, file, source = llama_cpp_files[arch]
    assert file.dtypes() == {"F32", "Q8_0"}
    assert file.config == source.config
    kept = {name for name, entry in file._tensors.items() if entry.type == "F32"}
    assert kept == {name for name in file.names() if "norm" in name or "gate_inp" in name}
    quantized, want = file.weights(), source.weights()
    assert set(quantized) == set(want)
    for key, w in want.items():
        if w.ndim == 1 or key.endswith("_router"):
            np.testing.assert_array_equal(quantized[key], w, err_msg=key)
            continue
        # Blocks of 32 along each row's input dimension, as llama.cpp stores
        # rows (the experts too: (E, out, in) stacks, as the graph takes them).
        rows, got = w, quantized[key]
        step = np.repeat(np.abs(rows.reshape(-1, 32)).max(axis=1) / 127, 32).reshape(rows.shape)
        assert np.all(np.abs(got - rows) <= step * (0.5 + 127 * 2.0 ** -11) + 1e-12), key
        assert np.any(got != rows), key  # really quantized


@pytest.mark.parametrize("arch", list(gguf_goldens.CONFIGS))
def test_llama_cpp_q8_0_files_match_transformers_on_their_source(arch, llama_cpp_files):
    """The NumPy forward pass on the weights and config ETC reads from the
    file llama.cpp wrote is within the quantization tolerance of
    transformers' logits of the source weights, and picks transformers'
    greedy tokens where they lead by more than twice it; the loader bugs
    a GGUF reader can have (Llama's Q/K rows left permuted, k/v swapped,
    RoPE's base misread, a norm weight missed) miss it by half as much
    again at least (these are the quantized model itself, its rounding
    included)."""
    golden, file, source = llama_cpp_files[arch]
    config, weights = file.config, file.weights()
    tol = _quantization_tolerance(golden["config"], weights, source.weights())
    assert 0.5 < tol < 1.0
    errors = _quantized_errors(golden, config, weights, tol)
    assert errors.max() <= 1, f"{arch}: {errors.max():.2f} times the quantization tolerance"
    for prompt, tokens, want in zip(gguf_goldens.PROMPTS, golden["tokens"], golden["logits"]):
        # The tokens Q8_0's rounding cannot change (few: its tolerance is
        # wider than most greedy margins of these tiny models).
        got = reference.forward(config, weights, prompt + tokens[:-1])[len(prompt) - 1:]
        rms = np.sqrt(np.mean(np.square(want.astype(np.float64)), axis=-1))
        top = -np.sort(-want, axis=-1)
        determined = top[:, 0] - top[:, 1] > 2 * tol * rms
        assert np.array_equal(np.argmax(got, axis=-1)[determined], np.array(tokens)[determined])

    def permuted(w, heads):  # what llama.cpp stores: ETC reading it as it is
        return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)

    layers = range(config.num_layers)
    other_base = 10000.0 if config.rope_theta != 10000.0 else 1000000.0
    wrong = {
        "k and v swapped": (config, {**weights, **{f"l{i}_wk": weights[f"l{i}_wv"]
                                                   for i in layers},
                                     **{f"l{i}_wv": weights[f"l{i}_wk"] for i in layers}}),
        "RoPE base misread": (dataclasses.replace(config, rope_theta=other_base), weights),
        "final norm missed": (config, {**weights, "final_norm": np.ones_like(
            weights["final_norm"])}),
    }
    if arch == "llama":
        wrong["Q/K rows left permuted"] = (config, {
            **weights, **{f"l{i}_wq": permuted(weights[f"l{i}_wq"], config.num_heads)
                          for i in layers},
            **{f"l{i}_wk": permuted(weights[f"l{i}_wk"], config.num_kv_heads) for i in layers}})
    if config.qk_norm:
        wrong["k norms missed"] = (config, {**weights, **{
            f"l{i}_k_norm": np.ones_like(weights[f"l{i}_k_norm"]) for i in layers}})
    if config.is_moe:
        wrong["experts' gate and up swapped"] = (config, {**weights, **{
            f"l{i}_experts_gate": weights[f"l{i}_experts_up"] for i in layers}, **{
            f"l{i}_experts_up": weights[f"l{i}_experts_gate"] for i in layers}})
    missed = {name: float(_quantized_errors(golden, c, w, tol).max())
              for name, (c, w) in wrong.items()}
    assert all(value > 1.5 for value in missed.values()), missed


@pytest.mark.parametrize("arch", list(gguf_goldens.CONFIGS))
def test_llama_cpp_files_run_packed_as_llama_cpp_and_transformers_compute(arch,
                                                                          llama_cpp_files):
    """`etc.models.load` of the file llama.cpp wrote, its Q8_0 weights kept
    packed (the default for GGUF files), teacher forced over transformers'
    greedy sequences (each prefix a request): the logits are within the
    packed tolerance of llama.cpp's own logits of the file and of
    transformers' of the source weights. Packed, each matmul's activations
    are rounded to Q8_0 blocks too (as llama.cpp's CPU kernels do):
    errors the size of the weights' (the same format), so the tolerance
    counts the weights' measured errors twice."""
    golden, file, source = llama_cpp_files[arch]
    model = models.load(golden["gguf"], cache=False, **LOAD)
    assert set(model.weight_formats.values()) == {"q8_0"}
    assert set(model.weight_formats) == set(file.weight_formats())
    tol = 2 * _quantization_tolerance(golden["config"], file.weights(), source.weights())
    prefixes = [p + t[:j] for p, t in zip(gguf_goldens.PROMPTS, golden["tokens"])
                for j in range(gguf_goldens.NEW)]
    out = model.generate(prefixes, 1, return_logits=True)
    ours = np.stack([row[0] for row in out.logits])
    for who, want in (("llama.cpp", golden["llama_cpp_logits"]), ("transformers",
                                                                  golden["logits"])):
        want = np.concatenate(want).astype(np.float64)
        rms = np.sqrt(np.mean(np.square(want), axis=-1))
        errors = np.max(np.abs(ours - want), axis=-1) / (tol * rms)
        assert errors.max() <= 1, f"{arch}: {errors.max():.2f} times the tolerance of {who}'s"


#: The largest difference of ETC's logits of llama.cpp's MXFP4_MOE file
#: from llama.cpp's, in rms of the position's logits (see below).
MXFP4_TOLERANCE = 0.3


def test_llama_cpp_mxfp4_moe_file_runs_packed_as_llama_cpp_computes(tmp_path):
    """llama.cpp's C quantizer with ftype MXFP4_MOE on an F32 Qwen3-MoE file
    of `write_gguf` (gguf_goldens.MXFP4_MOE): the stacks of experts MXFP4
    (byte for byte what `etc.packed.quantize` writes: ggml's reference
    quantizer), the other matrices Q8_0. ETC keeps both packed, experts
    in MXFP4 tiles, and its logits of every position (each prefix a
    request) are within MXFP4_TOLERANCE of llama.cpp's own of the file
    and of the NumPy forward pass on the weights ETC reads from it.

    The tolerance. `_quantization_tolerance`'s bound (the weights' errors
    against the source, twice) is 12 rms here: MXFP4's relative error is
    0.11 per matrix (Q8_0's 0.005), too wide to see a wrong kernel. Both
    ETC and llama.cpp compute the file's weights exactly and differ from
    the NumPy forward pass on them only by rounding each matmul's
    activations to int8 blocks of 32: measured at most 0.10 rms (ETC) and
    0.17 (llama.cpp), so they are within 0.27 of each other; 0.3 allows
    that. Measured: 0.13. MXFP4's scale doubled (a wrong e8m0 decode)
    misses by 2 to 4 rms, a flipped routing choice by 1.4."""
    from etc import packed

    golden = gguf_goldens.load_mxfp4("qwen3moe")
    file = GGUFCheckpoint(golden["gguf"])
    assert file.dtypes() == {"F32", "Q8_0", "MXFP4"}
    source = models.Checkpoint(write_checkpoint(tmp_path / "source", golden["config"],
                                                seed=golden["seed"], sharp=True))
    assert file.config == source.config
    formats = file.weight_formats()
    assert {k: f for k, f in formats.items() if f == "mxfp4"} == {
        f"l{i}_experts_{p}": "mxfp4" for i in range(2) for p in ("gate", "up", "down")}
    raw = file.weights(formats=formats)
    want = source.weights()
    for key, fmt in formats.items():
        if fmt == "mxfp4":
            np.testing.assert_array_equal(raw[key], packed.quantize(want[key], "mxfp4"),
                                          err_msg=key)
    model = models.load(golden["gguf"], cache=False, **LOAD)
    assert model.weight_formats == formats
    assert set(formats.values()) == {"q8_0", "mxfp4"}
    sequence = golden["sequence"]
    out = model.generate([sequence[:j + 1] for j in range(len(sequence))], 1,
                         return_logits=True)
    ours = np.stack([row[0] for row in out.logits])
    weights = file.weights()
    for who, logits in (("llama.cpp", golden["logits"]),
                        ("NumPy", reference.forward(file.config, weights, sequence))):
        logits = logits.astype(np.float64)
        rms = np.sqrt(np.mean(np.square(logits), axis=-1))
        errors = np.max(np.abs(ours - logits), axis=-1) / rms
        assert errors.max() <= MXFP4_TOLERANCE, f"{who}: {errors.max():.2f} rms"


def test_llama_cpp_file_tokenizer_encodes_like_its_source(llama_cpp_files, tmp_path):
    """The tokenizer llama.cpp's converter wrote into the file (byte-level
    BPE, pre-tokenizer "gpt-2") encodes and decodes as the source
    tokenizer.json does."""
    from etc.models.testing import TEXT as SOURCE_TEXT

    golden, file, source = llama_cpp_files["qwen3"]
    want, got = source.tokenizer(), file.tokenizer()
    assert file.metadata["tokenizer.ggml.pre"] == "gpt-2"
    for text in (SOURCE_TEXT, TEXT, "<|im_start|>user\nhi<|im_end|>\n"):
        assert got.encode(text) == want.encode(text)
        assert got.decode(want.encode(text)) == want.decode(want.encode(text))
    assert file.eos_token_ids() == [2]


# ----------------------------------------------------------------------
# Tokenizer and chat template
# ----------------------------------------------------------------------

TEXT = ("The quick brown fox jumps over the lazy dog. It's 2026, and we're testing 12345 "
        "tokens: café, naïve, 日本語, emoji 🙂! Don't stop; I'll see you at 10:30.\n\n"
        "Lists:\n- one\n- two\n\tindented    spaces")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _trained(pre: str):
    """A byte-level BPE tokenizer trained here on TEXT, split the way
    llama.cpp's pre-tokenizer `pre` splits."""
    from tokenizers import Regex, Tokenizer, decoders, models as tm, pre_tokenizers, trainers

    split = PRE_TOKENIZERS[pre]
    tokenizer = Tokenizer(tm.BPE())
    if split == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif split == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([TEXT] * 4, trainer)
    return tokenizer


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt2", "smollm", "gpt-4o", "glm4"])
def test_tokenizer_from_metadata_encodes_like_the_original(pre, tmp_path):
    original = _trained(pre)
    config = tiny_config("Qwen3ForCausalLM", vocab_size=original.get_vocab_size())
    path = write_gguf(tmp_path / "m.gguf", config, tokenizer=original, pre=pre,
                      chat_template=TEMPLATE, eos_token="<|im_end|>", bos_token="<|endoftext|>")
    checkpoint = GGUFCheckpoint(path)
    backend = checkpoint.tokenizer_backend()
    samples = [TEXT, "Hello world!", "  leading spaces and trailing  ", "数字 123 and 4567",
               "<|im_start|>user\nhi<|im_end|>\n"]
    for text in samples:
        want = original.encode(text).ids
        assert backend.encode(text).ids == want, text
        assert backend.decode(want, skip_special_tokens=False) == \
            original.decode(want, skip_special_tokens=False)
    ids = backend.encode("<|im_start|>user").ids
    assert ids[0] == original.token_to_id("<|im_start|>")
    assert checkpoint.eos_token_ids() == [original.token_to_id("<|im_end|>")]
    assert checkpoint.chat_template == TEMPLATE
    assert checkpoint.metadata["tokenizer.ggml.bos_token_id"] == original.token_to_id(
        "<|endoftext|>")


def test_unsupported_tokenizers_are_refused_by_name(tmp_path):
    original = _trained("qwen2")
    config = tiny_config("Qwen3ForCausalLM", vocab_size=original.get_vocab_size())
    path = write_gguf(tmp_path / "bert.gguf", config, tokenizer=original,
                      metadata={"tokenizer.ggml.model": "bert"})
    with pytest.raises(GGUFError, match="tokenizer.ggml.model = 'bert' is not supported"):
        GGUFCheckpoint(path).tokenizer_backend()
    path = write_gguf(tmp_path / "pre.gguf", config, tokenizer=original, pre="chatglm-bpe")
    with pytest.raises(GGUFError, match="tokenizer.ggml.pre = 'chatglm-bpe' is not supported"):
        GGUFCheckpoint(path).tokenizer_backend()
    path = write_gguf(tmp_path / "none.gguf", config)
    with pytest.raises(GGUFError, match="no tokenizer"):
        GGUFCheckpoint(path).tokenizer_backend()


# ----------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------


def test_errors_name_the_key_tensor_or_type(tmp_path):
    qwen3 = CONFIGS["qwen3"]
    with pytest.raises(GGUFError, match="not a GGUF file"):
        (tmp_path / "x.gguf").write_bytes(b"not gguf")
        GGUFCheckpoint(tmp_path / "x.gguf")
    with pytest.raises(models.CheckpointError, match="neither a GGUF file"):
        models.load(tmp_path / "x.gguf")
    with pytest.raises(models.CheckpointError, match="no such file"):
        models.load(tmp_path / "missing.gguf")
    path = write_gguf(tmp_path / "arch.gguf", qwen3, metadata={"general.architecture": "gemma"})
    with pytest.raises(models.UnsupportedConfigError, match="architecture 'gemma'"):
        GGUFCheckpoint(path)
    path = write_gguf(tmp_path / "drop.gguf", qwen3, drop=("blk.1.attn_k.weight",))
    with pytest.raises(models.MissingTensorError, match="'blk.1.attn_k.weight' .layer 1 key"):
        GGUFCheckpoint(path).weights()
    path = write_gguf(tmp_path / "yarn.gguf", qwen3, metadata={
        "qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0})
    with pytest.raises(models.UnsupportedConfigError, match="rope_scaling.*'yarn'"):
        GGUFCheckpoint(path)
    path = write_gguf(tmp_path / "heads.gguf", qwen3,
                      metadata={"qwen3.attention.head_count": [4, 2]})
    with pytest.raises(models.UnsupportedConfigError, match="head_count differs between layers"):
        GGUFCheckpoint(path)
    path = write_gguf(tmp_path / "ctx.gguf", qwen3, metadata={"qwen3.context_length": None})
    with pytest.raises(models.UnsupportedConfigError, match="'qwen3.context_length' is missing"):
        GGUFCheckpoint(path)
    path = write_gguf(tmp_path / "rope.gguf", qwen3,
                      metadata={"qwen3.rope.dimension_count": 8})
    with pytest.raises(models.UnsupportedConfigError, match="partial rotary"):
        GGUFCheckpoint(path)
    # A type ETC does not load (I8), named with the tensor.
    embedding = np.zeros((qwen3["vocab_size"], qwen3["hidden_size"]), np.uint8)
    path = write_gguf(tmp_path / "i8.gguf", qwen3, drop=("token_embd.weight",),
                      raw_tensors={"token_embd.weight": (embedding, "I8")})
    with pytest.raises(GGUFError, match="'token_embd.weight' .token embeddings. has type I8"):
        GGUFCheckpoint(path).weights()
    # A tensor of the wrong shape, named with the shape the metadata implies.
    tensors = checkpoint_tensors(qwen3)
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((40, 32), np.float32)
    path = write_gguf(tmp_path / "shape.gguf", qwen3, tensors=tensors)
    with pytest.raises(GGUFError, match=r"'blk.0.ffn_up.weight' .* shape \(40, 32\), expected "
                                        r"\(48, 32\)"):
        GGUFCheckpoint(path).weights()


def test_gguf_tokenizer_and_template_match_the_checkpoint_directory(tmp_path):
    """A directory with tokenizer.json and a chat template, and the GGUF file
    of the same model and tokenizer: the same `Tokenizer` behaviour (ids,
    text, chat template) and end-of-sequence ids."""
    from tokenizers import Tokenizer as Backend

    from etc.models.testing import CHAT_TEMPLATE

    directory = write_checkpoint(tmp_path / "dir", tiny_config(vocab_size=320), tokenizer=True)
    backend = Backend.from_file(str(directory / "tokenizer.json"))
    path = write_gguf(tmp_path / "m.gguf", tiny_config(vocab_size=320), tokenizer=backend,
                      pre="gpt2", chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>",
                      metadata={"tokenizer.ggml.eot_token_id":
                                backend.token_to_id("<|endoftext|>")})
    want, got = models.Checkpoint(directory), GGUFCheckpoint(path)
    a, b = want.tokenizer(), got.tokenizer()
    for text in (TEXT, "Hello world!", "<|im_start|>user\nhi<|im_end|>\n"):
        assert b.encode(text) == a.encode(text)
        assert b.decode(a.encode(text)) == a.decode(a.encode(text))
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and then?"}]
    assert b.apply_chat_template(chat) == a.apply_chat_template(chat)
    assert sorted(got.eos_token_ids()) == sorted(want.eos_token_ids())
    assert b.eos_token == "<|im_end|>"
