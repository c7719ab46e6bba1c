"""Checkpoints read without widening (a bf16 or f16 checkpoint computed in
its own dtype takes about its file size in memory, measured in a fresh
process on a few-hundred-MB file), and safetensors files that are damaged
or malicious refused with SafetensorsError rather than misread."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import etc
import etc.models as models
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.safetensors import SafetensorsError, SafetensorsFile, save_file
from etc.models.testing import tensor_shapes, tiny_config, write_checkpoint

# ----------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------

#: About 300 MB of bf16 weights (150 M parameters): 8 layers of hidden 1024
#: and MLP 4096, a vocabulary of 32,000.
BIG = tiny_config("Qwen3ForCausalLM", hidden_size=1024, intermediate_size=4096,
                  num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=128, vocab_size=32000, tie_word_embeddings=False)

# VmHWM, the peak resident memory of this program (unlike ru_maxrss, it does
# not carry over the parent's from before the exec), and VmRSS, the current.
_MEASURE = textwrap.dedent("""
    import sys
    from etc.models.loading.checkpoint import Checkpoint

    def status(field):  # bytes
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    checkpoint = Checkpoint(sys.argv[1])
    before = status("VmRSS")
    weights = checkpoint.weights(sys.argv[2])
    peak = status("VmHWM")
    kept = status("VmRSS")
    size = sum(w.nbytes for w in weights.values())
    dtypes = sorted({str(w.dtype) for w in weights.values()})
    print(peak - before, kept - before, size, *dtypes)
""")


@pytest.mark.parametrize("stored, dtype, storage", [("BF16", "bf16", "uint16"),
                                                    ("F16", "f16", "float16")])
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc/self/status")
def test_half_precision_checkpoints_load_without_widening(tmp_path, stored, dtype, storage):
    """Peak memory of loading stays within 1.5x of the file (it was 7x for
    bf16: every tensor widened to float32 and rounded back)."""
    path = tmp_path / "big"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BIG))
    rng = np.random.default_rng(0)
    # Small values in the storage dtype, written as they are (no float32
    # copy of the whole model in this process either).
    tensors = {}
    for name, shape in tensor_shapes(BIG).items():
        bits = rng.integers(0x3000, 0x3400, size=shape, dtype=np.uint16)
        tensors[name] = bits if stored == "BF16" else bits.view(np.float16)
    save_file(path / "model.safetensors", tensors, stored)
    del tensors
    file_size = (path / "model.safetensors").stat().st_size
    assert file_size > 250e6
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(path), dtype],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    peak, kept, size, *dtypes = result.stdout.split()
    assert dtypes == [storage]
    assert abs(int(size) - file_size) < 1e5
    assert int(peak) <= 1.5 * file_size, (int(peak) / file_size, result.stdout)
    assert int(kept) <= 1.2 * file_size, (int(kept) / file_size, result.stdout)


def test_weights_keep_the_bits_of_the_file(tmp_path):
    """bf16 weights computed in bf16 are the file's bit patterns; f16 ones
    its halves; other combinations round once, as before."""
    path = write_checkpoint(tmp_path / "bf16", tiny_config("Qwen3ForCausalLM"), dtype="BF16")
    file = SafetensorsFile(next(path.glob("*.safetensors")))
    raw = Checkpoint(path).weights("bf16")
    assert raw["embed"].dtype == np.uint16
    np.testing.assert_array_equal(raw["embed"], etc.bfloat16.to_bits(
        file.get("model.embed_tokens.weight")))
    half = Checkpoint(path).weights("f16")
    np.testing.assert_array_equal(half["embed"],
                                  file.get("model.embed_tokens.weight").astype(np.float16))
    moe = write_checkpoint(tmp_path / "moe", tiny_config("Qwen3MoeForCausalLM"), dtype="BF16")
    stacked = Checkpoint(moe).weights("bf16")["l0_experts_down"]
    wide = Checkpoint(moe).weights("f32")["l0_experts_down"]
    assert stacked.dtype == np.uint16
    np.testing.assert_array_equal(etc.bfloat16.from_bits(stacked), wide)
    with pytest.raises(ValueError, match=r"weights: dtype 'f64' is not one of f32, f16, bf16"):
        Checkpoint(path).weights("f64")


@pytest.mark.parametrize("stored, dtype", [("BF16", "bf16"), ("F32", "f32"), ("F16", "f16"),
                                           ("BF16", "f32")])
def test_float_experts_stay_in_the_checkpoints_layout(tmp_path, monkeypatch, stored, dtype):
    """A MoE layer's float experts are stacked (E, out, in), each expert the
    file's (out, in) matrix, and the step graph reads them so (`g.moe` with
    transpose_w); stored in the compute dtype, each expert's bytes are read
    straight into the stack (no temporary or transposed copy: `read` is
    never called for them), converted otherwise."""
    from etc.models.step.graph import build_step_graph

    config = tiny_config("Qwen3MoeForCausalLM")
    path = write_checkpoint(tmp_path / "moe", config, dtype=stored)
    file = SafetensorsFile(next(path.glob("*.safetensors")))
    checkpoint = Checkpoint(path)
    c = checkpoint.config
    read = SafetensorsFile.read

    def no_expert_read(self, name, *args, **kwargs):
        assert ".experts." not in name or _storage(stored) != dtype, name
        return read(self, name, *args, **kwargs)
    monkeypatch.setattr(SafetensorsFile, "read", no_expert_read)
    weights = checkpoint.weights(dtype)
    monkeypatch.setattr(SafetensorsFile, "read", read)
    e, f, h = c.num_experts, c.moe_intermediate_size, c.hidden_size
    for key, proj, shape in (("gate", "gate_proj", (e, f, h)), ("up", "up_proj", (e, f, h)),
                             ("down", "down_proj", (e, h, f))):
        stack = weights[f"l0_experts_{key}"]
        assert stack.shape == shape and stack.flags.c_contiguous, (key, stack.shape)
        for j in range(e):
            np.testing.assert_array_equal(
                stack[j], file.read(f"model.layers.0.mlp.experts.{j}.{proj}.weight", dtype))
    graph = build_step_graph(c, max_seq_len=32, chunk=4, dtype=dtype)
    moes = [op for op in graph.operations if op.kind == "moe"]
    assert len(moes) == c.num_layers
    assert all(op.params["transpose_w"] for op in moes)
    gate, down = moes[0].operands[2:4]
    assert (tuple(gate.shape), tuple(down.shape)) == ((e, f, h), (e, h, f))


def _storage(stored: str) -> str:
    """The compute dtype whose storage safetensors dtype `stored` is."""
    return {"BF16": "bf16", "F32": "f32", "F16": "f16"}[stored]


# ----------------------------------------------------------------------
# Damaged and malicious files
# ----------------------------------------------------------------------


def _file(tmp_path, header, data: bytes = b"", raw: bytes | None = None):
    text = raw if raw is not None else json.dumps(header).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_deeply_nested_header_is_a_safetensors_error(tmp_path):
    path = _file(tmp_path, None, raw=b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(SafetensorsError, match=r"nests JSON too deeply"):
        SafetensorsFile(path)


def test_overlapping_tensors_are_refused(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    with pytest.raises(SafetensorsError, match=r"tensors 'a' and 'b' overlap"):
        SafetensorsFile(_file(tmp_path, header, bytes(24)))
    header["b"]["data_offsets"] = [16, 32]
    assert SafetensorsFile(_file(tmp_path, header, bytes(32))).keys() == ["a", "b"]


@pytest.mark.parametrize("entry", [
    {"dtype": "F32", "shape": [2.5, 2], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [True, 4], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16]},
    {"dtype": 1, "shape": [4], "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]},
    {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]},
    [1, 2],
])
def test_malformed_entries_are_refused_not_truncated(tmp_path, entry):
    with pytest.raises(SafetensorsError, match=r"tensor 'a' has a malformed header entry"):
        SafetensorsFile(_file(tmp_path, {"a": entry}, bytes(16)))


def test_huge_header_length_and_bad_metadata(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 200_000_000))
    os.truncate(path, 200_000_100)  # sparse: no 200 MB written
    with pytest.raises(SafetensorsError, match=r"exceeds the format's limit"):
        SafetensorsFile(path)
    with pytest.raises(SafetensorsError, match=r"'__metadata__' is not a JSON object"):
        SafetensorsFile(_file(tmp_path, {"__metadata__": [1]}))


def test_a_file_cut_short_after_opening_is_an_error(tmp_path):
    path = _file(tmp_path, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                 bytes(16))
    file = SafetensorsFile(path)
    os.truncate(path, path.stat().st_size - 4)
    with pytest.raises(SafetensorsError, match=r"tensor 'a' is cut short"):
        file.get("a")


def test_save_file_takes_bf16_bit_patterns(tmp_path):
    bits = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)  # 1, -2, inf
    save_file(tmp_path / "b.safetensors", {"w": bits}, "BF16")
    file = SafetensorsFile(tmp_path / "b.safetensors")
    np.testing.assert_array_equal(file.read("w", "bf16"), bits)
    np.testing.assert_array_equal(file.get("w"), [1.0, -2.0, np.inf])


def test_save_file_refuses_dtypes_of_tensors_it_does_not_have(tmp_path):
    with pytest.raises(ValueError, match=r"dtypes names 'wq', which is not one of the tensors"):
        save_file(tmp_path / "c.safetensors", {"w": np.zeros(4, np.float32)},
                  dtypes={"wq": "F8_E4M3"})
    with pytest.raises(ValueError, match=r"F8_E4M3 tensor 'w' must be uint8 bytes"):
        save_file(tmp_path / "c.safetensors", {"w": np.zeros(4, np.float32)},
                  dtypes={"w": "F8_E4M3"})
