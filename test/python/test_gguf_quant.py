"""Quantized GGUF files: every block format of `etc.packed` against the
`gguf` package's dequantization bit for bit (on data its quantizers and
`GGUFWriter` wrote, and on random valid blocks), ETC's own reader of the
container against `gguf.GGUFReader`, and the errors of truncated or
damaged files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import tokenizers

from etc import packed
from etc.models.loading import gguf_file
from etc.models.loading.gguf import TENSOR_TYPES, GGUFCheckpoint, GGUFError
from etc.models.testing import tiny_config, write_gguf

QWEN3 = tiny_config("Qwen3ForCausalLM")
#: The formats the gguf package's quantizer writes (the others: K-quants, IQ4_NL).
GGUF_QUANTIZES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4")


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.float32).view(np.uint32)


def _random_blocks(fmt: packed.Format, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random bytes with finite float16 scales (MXFP4: e near 127, and 0
    and 1, the subnormal scales, and 200): any valid blocks."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * blocks, fmt.nbytes), dtype=np.uint8)
    if fmt.name == "mxfp4":
        raw[:, 0] = rng.integers(118, 134, rows * blocks)
        raw[:3, 0] = [0, 1, 200]
    for at in fmt.halves:
        raw[:, at:at + 2] = rng.uniform(-0.1, 0.1, (rows * blocks, 1)).astype(
            np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * fmt.nbytes)


def test_type_tables_are_the_gguf_packages():
    """The reader's value types and tensor types (written out so that
    reading does not import the package) are the package's numbers."""
    assert gguf_file.VALUE_TYPES == tuple(t.name for t in sorted(gguf.GGUFValueType))
    for number, (name, block, nbytes) in gguf_file.TENSOR_TYPES.items():
        qtype = gguf.GGMLQuantizationType(number)
        assert qtype.name == name
        assert gguf.GGML_QUANT_SIZES[qtype] == (block, nbytes)
    # Every type of llama.cpp's Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0 and
    # MXFP4_MOE files loads.
    assert set(TENSOR_TYPES) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                 "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "MXFP4"}


@pytest.mark.parametrize("name", packed.GGML_FORMATS)
def test_dequantize_equals_the_gguf_package_bit_for_bit(name, tmp_path):
    """A tensor of each format in a file written by `GGUFWriter`: random
    valid blocks, and (where the package quantizes the format) the
    package's own quantization of Gaussian weights, through the checkpoint
    and through `etc.packed.dequantize`, equal the package's dequantization
    bit for bit."""
    fmt = packed.FORMATS[name]
    qtype = gguf.GGMLQuantizationType[fmt.ggml]
    rows, blocks = 5, 3
    weights = np.random.default_rng(1).standard_normal((rows, blocks * fmt.block)).astype(
        np.float32)
    tensors = {"random.weight": _random_blocks(fmt, rows, blocks, 2)}
    if name in GGUF_QUANTIZES:
        tensors["quantized.weight"] = gguf.quants.quantize(weights, qtype)
        # ggml's reference quantizers, which etc.packed.quantize follows.
        np.testing.assert_array_equal(packed.quantize(weights, name),
                                      tensors["quantized.weight"])
    else:
        tensors["quantized.weight"] = packed.quantize(weights, name)
    path = write_gguf(tmp_path / "m.gguf", QWEN3,
                      raw_tensors={key: (raw, fmt.ggml) for key, raw in tensors.items()})
    checkpoint = GGUFCheckpoint(path)
    assert fmt.ggml in checkpoint.dtypes()
    for key, raw in tensors.items():
        want = gguf.quants.dequantize(raw, qtype)
        got = checkpoint.tensor(key, (rows, blocks * fmt.block), "test")
        np.testing.assert_array_equal(_bits(got), _bits(want))
        np.testing.assert_array_equal(_bits(packed.dequantize(raw, name)), _bits(want))
        assert np.ptp(want) > 0
    # Quantized, not copied: within a few steps of the weights.
    error = np.abs(checkpoint.tensor("quantized.weight", weights.shape, "test") - weights)
    assert 0 < error.max() < 0.3 * np.abs(weights).max()


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_half_tensors_equal_the_gguf_package(kind, tmp_path):
    weights = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(weights, qtype)
    path = write_gguf(tmp_path / "m.gguf", QWEN3, raw_tensors={
        "half.weight": (raw.view(np.uint8).reshape(4, -1), kind)})
    got = GGUFCheckpoint(path).tensor("half.weight", (4, 64), "test")
    np.testing.assert_array_equal(_bits(got), _bits(gguf.quants.dequantize(raw, qtype)))


def test_metadata_equals_the_gguf_packages_reader(tmp_path):
    """Every value type, arrays of numbers and strings, and the tensor
    table read as `gguf.GGUFReader` reads them."""
    from etc.models.testing import write_tokenizer

    tokenizer = tokenizers.Tokenizer.from_file(
        str(write_tokenizer(tmp_path / "tok", 400) / "tokenizer.json"))
    metadata = {"test.u32": 7, "test.f32": 0.1, "test.bool": True, "test.text": "héllo",
                "test.ints": [1, 2, 3], "test.floats": [0.5, 1.5], "test.words": ["a", "", "ü"]}
    path = write_gguf(tmp_path / "m.gguf", QWEN3, tensor_type="Q8_0", tokenizer=tokenizer,
                      metadata=metadata)
    writer = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "qwen3")
    for number, kind in enumerate(("uint8", "int8", "uint16", "int16", "uint32", "int32")):
        getattr(writer, f"add_{kind}")(f"test.{kind}", number + 1)
    writer.add_uint64("test.uint64", 2**40)
    writer.add_int64("test.int64", -2**40)
    writer.add_float64("test.float64", 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for file in (path, tmp_path / "types.gguf"):
        ours = gguf_file.GGUFFile(file)
        theirs = gguf.GGUFReader(file)
        want = {name: field.contents() for name, field in theirs.fields.items()
                if not name.startswith("GGUF.")}
        assert ours.metadata == want
        assert list(ours.tensors) == [t.name for t in theirs.tensors]
        for tensor in theirs.tensors:
            raw = ours.raw(tensor.name)
            np.testing.assert_array_equal(raw.view(np.uint8).reshape(-1),
                                          tensor.data.view(np.uint8).reshape(-1))
            assert ours.tensors[tensor.name].type == tensor.tensor_type.name
    assert ours.metadata["test.uint64"] == 2**40 and ours.metadata["test.float64"] == 0.1


def test_truncated_and_damaged_files_name_the_tensor_or_field(tmp_path):
    extra = packed.quantize(np.ones((4, 64), np.float32), "q8_0")
    path = write_gguf(tmp_path / "m.gguf", QWEN3, tensor_type="Q8_0",
                      raw_tensors={"extra.weight": (extra, "Q8_0")})
    data = path.read_bytes()
    table = gguf_file.GGUFFile(path).tensors
    last = max(table.values(), key=lambda t: t.offset)
    assert last.type == "Q8_0"
    # Cut inside the last tensor.
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:last.offset + last.nbytes - 5])
    with pytest.raises(GGUFError, match=f"tensor '{last.name}' .Q8_0.* needs {last.nbytes} "
                                        f"bytes.*truncated"):
        GGUFCheckpoint(cut)
    # Cut inside the metadata.
    cut.write_bytes(data[:200])
    with pytest.raises(GGUFError, match="ends inside .*truncated or damaged"):
        GGUFCheckpoint(cut)
    # A block whose scale is NaN: the tensor is named, with the block.
    damaged = bytearray(data)
    q = table["blk.1.ffn_up.weight"]
    assert q.type == "Q8_0" and q.shape == (48, 32)
    at = q.offset + 34 * 2  # row 2 (one block per row): its float16 scale
    damaged[at:at + 2] = np.array([np.nan], np.float16).tobytes()
    broken = tmp_path / "nan.gguf"
    broken.write_bytes(bytes(damaged))
    checkpoint = GGUFCheckpoint(broken)
    with pytest.raises(GGUFError, match=r"'blk.1.ffn_up.weight' .layer 1 MLP up, Q8_0. has a "
                                        r"non-finite scale in block 0 of row 2"):
        checkpoint.weights()
    # Packed and split over 2 ranks (rows 0-23 and 24-47), each rank checks
    # its share of the blocks: rank 0 finds it, rank 1 has none of it.
    from etc.models.step.parallel import shard_weight

    formats = checkpoint.weight_formats()
    assert formats["l1_w_up"] == "q8_0"

    def share(rank):
        return lambda key, array: shard_weight(checkpoint.config, key, array, 2, rank,
                                               formats.get(key))

    with pytest.raises(GGUFError, match=r"'blk.1.ffn_up.weight' .*non-finite scale in block 0 "
                                        r"of row 2 of this rank's share"):
        checkpoint.weights(formats=formats, shard=share(0))
    assert checkpoint.weights(formats=formats, shard=share(1))["l1_w_up"].shape == (24, 34)
    # An unknown tensor type number.
    damaged = bytearray(data)
    name = b"blk.0.attn_q.weight"
    entry = data.index(name) + len(name)
    dims = int.from_bytes(data[entry:entry + 4], "little")
    at = entry + 4 + 8 * dims
    damaged[at:at + 4] = (250).to_bytes(4, "little")
    broken.write_bytes(bytes(damaged))
    with pytest.raises(GGUFError, match="'blk.0.attn_q.weight' has unknown GGML type 250"):
        GGUFCheckpoint(broken)


def test_mxfp4_scales_past_the_quantizers_are_refused(tmp_path):
    """An MXFP4 block whose e is above any ggml's quantizer writes (252):
    values of it overflow to infinities (as ggml's dequantization), so
    the loader names the tensor and block as damaged; 252 itself loads."""
    weights = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    raw = packed.quantize(weights, "mxfp4")
    assert raw[:, ::17].max() <= 130
    raw[2, 17] = packed.MXFP4_LARGEST_E  # row 2, block 1
    assert packed.first_bad_block(raw, "mxfp4") is None
    assert np.isfinite(packed.dequantize(raw, "mxfp4")).all()
    raw[2, 17] = packed.MXFP4_LARGEST_E + 1
    assert packed.first_bad_block(raw, "mxfp4") == 5
    path = write_gguf(tmp_path / "m.gguf", QWEN3, raw_tensors={"odd.weight": (raw, "MXFP4")})
    with pytest.raises(GGUFError, match=r"'odd.weight' .*MXFP4. has a non-finite scale in "
                                        r"block 1 of row 2"):
        GGUFCheckpoint(path).tensor("odd.weight", (4, 64), "test")


@pytest.mark.parametrize("tensor_type, fallback", [("Q4_K", "Q5_0"), ("Q6_K", "Q8_0"),
                                                   ("IQ4_NL", "F32"), ("Q5_1", "F32")])
def test_k_quant_files_load_with_their_fallbacks(tensor_type, fallback, tmp_path):
    """Files laid out as llama.cpp's quantizer writes them: matrices whose
    rows are whole blocks of 256 in a K-quant, the others in its fallback
    (what made real Q4_K_M files fail to load): every weight loads, within
    its format's error of the float weights."""
    config = tiny_config("LlamaForCausalLM", hidden_size=256, intermediate_size=96,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    from etc.models.testing import checkpoint_tensors

    tensors = checkpoint_tensors(config)
    path = write_gguf(tmp_path / "m.gguf", config, tensors=tensors, tensor_type=tensor_type,
                      fallback_type=fallback)
    checkpoint = GGUFCheckpoint(path)
    kinds = checkpoint.dtypes()
    assert tensor_type in kinds and (fallback == "F32" or fallback in kinds)
    weights = checkpoint.weights()
    down = weights["l0_w_down"]  # rows of 96: not whole blocks of 256
    original = tensors["model.layers.0.mlp.down_proj.weight"]
    assert np.abs(down - original).max() < 0.3 * np.abs(original).max()
