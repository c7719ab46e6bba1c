"""FP8 checkpoints (config.json `quantization_config` quant_method "fp8", as
the official Qwen3 FP8 releases ship): float8_e4m3fn projections with a
float32 `weight_scale_inv` per 128 x 128 block load, stay packed
(`etc.packed` fp8_e4m3: 36 bytes per 32 values) and run dequantized in the
tile; the NumPy reference forward reads the same weights dequantized.

The test checkpoints are `write_checkpoint(fp8_block=...)`'s: a tiny
random model (bf16 norms and embeddings) whose projections are quantized
as transformers' FP8 quantizer does (scale max|w| / 448 per block). Their
widths are not multiples of 128 (intermediate 352 = 2 x 128 + 96, a MoE
expert width of 160): the scale grid's edge blocks are partial.

Tolerances. In f32 the packed model multiplies the same float32 weights as
the reference (each e4m3 value times its scale is exact in float32
before the product's rounding), so only the order of the sums differs:
logits within 1e-4 (measured 1e-6), the same greedy tokens. In bf16 the
activations are rounded to bf16 (relative 2^-9) at each of the buffers a
token passes through (about 20 on these 2-layer models), the logits
themselves too: against the f32 reference, teacher-forced on the bf16
model's tokens, the dense Qwen3's logits stay within T = 0.1 x their
standard deviation (measured 4.2%; the widened bf16 model, which also
rounds each weight to bf16, 5.0%), and a token that is not the
reference's best must be a near tie there (within 2T). (A MoE model is
not compared so in bf16: rounding may flip a near tie of the router's
top-k, which changes that token's output by far more: 21% of the logits'
deviation, measured, on one prefill row.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import etc.models as models
from etc import packed
from etc.models.loading import fp8
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.fields import UnsupportedConfigError
from etc.models.step.reference import forward
from etc.models.testing import tiny_config, write_checkpoint

import memory_growth

SHAPE = dict(hidden_size=256, intermediate_size=352, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, vocab_size=300)
CONFIGS = {
    "qwen3": tiny_config("Qwen3ForCausalLM", **SHAPE),
    "qwen3_moe": tiny_config("Qwen3MoeForCausalLM", mlp_only_layers=[0],
                             moe_intermediate_size=160, **SHAPE),
    "phi3": tiny_config("Phi3ForCausalLM", **SHAPE),
}
LOAD = dict(workers=2, max_seq_len=64, attention_chunk=16)
PROMPTS = [[5, 6, 7], list(range(1, 20))]
BLOCK = (128, 128)


def _fp8(tmp_path, name="qwen3", **options):
    return write_checkpoint(tmp_path / name, CONFIGS[name], dtype="BF16", fp8_block=BLOCK,
                            **options)


def test_the_weights_dequantize_as_transformers_does(tmp_path):
    """Every projection is F8_E4M3 with its scales; the checkpoint reads
    it as e4m3(q) x scale_inv[r // 128, c // 128] (transformers'
    `_dequantize_fp8_weight`, bit for bit: checked by hand against
    transformers 5.24), and the packed storage dequantizes to the same
    float32 values."""
    path = _fp8(tmp_path)
    checkpoint = Checkpoint(path)
    assert checkpoint.quantization == fp8.Fp8Quantization(block=BLOCK)
    assert "F8_E4M3" in checkpoint.dtypes()
    name, shape = "model.layers.1.mlp.gate_proj.weight", (352, 256)
    file = checkpoint._where[name]
    q, scales = file.read_bytes(name), file.get(name + "_scale_inv")
    assert q.dtype == np.uint8 and scales.shape == (3, 2)  # ceil(352 / 128) x 2
    want = np.empty(shape, np.float32)
    for r in range(shape[0]):
        for c in range(shape[1]):
            want[r, c] = packed.e4m3_values(q[r, c]) * scales[r // 128, c // 128]
    widened = checkpoint.tensor(name, shape, "test")
    np.testing.assert_array_equal(widened.view(np.uint32), want.view(np.uint32))
    raw = checkpoint.packed_tensor(name, shape, "test")
    assert raw.shape == packed.storage_shape(shape, "fp8_e4m3") == (352, 8 * 36)
    np.testing.assert_array_equal(packed.dequantize(raw, "fp8_e4m3").view(np.uint32),
                                  want.view(np.uint32))
    # The quantization is faithful: e4m3's 3 mantissa bits, relative 2^-4.
    original = write_checkpoint(tmp_path / "bf16", CONFIGS["qwen3"], dtype="BF16")
    exact = Checkpoint(original).tensor(name, shape, "test")
    assert np.all(np.abs(widened - exact) <= np.abs(exact) * 2**-4 + scales.max() * 2**-9)


def test_e4m3_rounding_and_values():
    """`to_e4m3` rounds to the nearest float8_e4m3fn value, ties to even,
    saturating at 448; `e4m3_values` reads all 254 non-NaN bytes exactly
    (the sign, 4 exponent bits of bias 7, 3 mantissa bits, subnormals)."""
    q = np.arange(256, dtype=np.uint8)
    values = packed.e4m3_values(q)
    sign = np.where(q & 0x80, -1.0, 1.0)
    exponent, mantissa = (q >> 3) & 15, (q & 7).astype(np.float64)
    want = sign * np.where(exponent == 0, mantissa * 2.0**-9,
                           2.0 ** (exponent.astype(np.float64) - 7) * (1 + mantissa / 8))
    real = (q & 0x7F) != 0x7F
    np.testing.assert_array_equal(values[real], want[real].astype(np.float32))
    np.testing.assert_array_equal(packed.to_e4m3(values[real]), q[real])
    assert packed.to_e4m3(np.float32(1e6)) == 0x7E and packed.to_e4m3(np.float32(-500)) == 0xFE
    # Halfway between 1 and 1.125 goes to 1 (even), between 1.125 and 1.25 to 1.25.
    assert list(packed.e4m3_values(packed.to_e4m3(np.float32([1.0625, 1.1875, 2**-10])))) == \
        [1.0, 1.25, 0.0]
    # Damaged storage: a non-finite scale, an e4m3 NaN.
    raw = packed.quantize(np.ones((2, 64), np.float32), "fp8_e4m3")
    assert packed.first_bad_block(raw, "fp8_e4m3") is None
    raw[1, 36:40] = np.array([np.inf], "<f4").view(np.uint8)  # row 1's second block
    assert packed.first_bad_block(raw, "fp8_e4m3") == 3
    raw[0, 4 + 7] = 0xFF
    assert packed.first_bad_block(raw, "fp8_e4m3") == 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp8_models_run_packed_and_equal_the_reference(name, tmp_path):
    """In f32: the packed model's greedy tokens are those of the NumPy
    reference forward on the dequantized weights (teacher-forced on the
    generated tokens), logits within 1e-4; the widened model
    (packed=False) agrees too. Every projection stays packed (a MoE
    layer's experts too; Phi-3's fused projections split by rows)."""
    path = _fp8(tmp_path, name)
    model = models.load(path, dtype="f32", **LOAD)  # by default bf16, the checkpoint's
    c = model.config
    expected = {f"l{i}_{w}" for i in range(c.num_layers) for w in ("wq", "wk", "wv", "wo")}
    for i in range(c.num_layers):
        parts = ("experts_gate", "experts_up", "experts_down") if c.is_sparse(i) else \
            ("w_gate", "w_up", "w_down")
        expected |= {f"l{i}_{p}" for p in parts}
    assert model.weight_formats == dict.fromkeys(expected, "fp8_e4m3")
    widened = models.load(path, packed=False, dtype="f32", **LOAD)
    assert widened.weight_formats == {} and model.num_parameters == widened.num_parameters
    got = model.generate(PROMPTS, 6, return_logits=True)
    want = widened.generate(PROMPTS, 6, return_logits=True)
    assert got.tokens == want.tokens
    weights = Checkpoint(path).weights("f32")
    for prompt, tokens, logits, other in zip(PROMPTS, got.tokens, got.logits, want.logits):
        reference = forward(c, weights, prompt + tokens[:-1])[len(prompt) - 1:]
        assert list(reference.argmax(-1)) == tokens
        np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.asarray(other), reference, atol=1e-4, rtol=0)


def test_bf16_and_the_simulated_gpu_kernels(tmp_path):
    """In bf16 the packed Qwen3 agrees with the f32 reference up to bf16
    rounding and near ties (module docstring). packed=True with the CUDA
    kernels (lanes simulated on the CPU: the packed GEMV and the MoE
    tiles, each e4m3 value dequantized in registers) runs the Qwen3-MoE
    with the f32 reference's tokens, logits within 1e-3."""
    path = _fp8(tmp_path, "qwen3")
    fast = models.load(path, dtype="bf16", **LOAD)
    assert fast.weight_formats
    weights = Checkpoint(path).weights("f32")
    got = fast.generate(PROMPTS + [[250, 3]], 10, return_logits=True)
    for prompt, tokens, logits in zip(PROMPTS + [[250, 3]], got.tokens, got.logits):
        reference = forward(fast.config, weights, prompt + tokens[:-1])[len(prompt) - 1:]
        for step, (token, here, there) in enumerate(zip(tokens, np.asarray(logits), reference)):
            tolerance = 0.1 * there.std()
            assert np.abs(here - there).max() <= tolerance, step
            assert there.max() - there[token] <= 2 * tolerance, step
    path = _fp8(tmp_path, "qwen3_moe")
    weights = Checkpoint(path).weights("f32")
    gpu = models.load(path, kernels="cuda", packed=True, dtype="f32",
                      **dict(LOAD, max_seq_len=32))
    assert "l1_experts_down" in gpu.weight_formats
    assert models.load(path, kernels="cuda", dtype="f32",
                       **dict(LOAD, max_seq_len=32)).weight_formats == {}
    got = gpu.generate(PROMPTS, 4, return_logits=True)
    for prompt, tokens, logits in zip(PROMPTS, got.tokens, got.logits):
        reference = forward(gpu.config, weights, prompt + tokens[:-1])[len(prompt) - 1:]
        assert list(reference.argmax(-1)) == tokens
        np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-3, rtol=0)


@pytest.mark.parametrize("field, value, message", [
    ("quant_method", "gptq", r"'quantization_config.quant_method' = 'gptq' is not supported"),
    ("fmt", "e5m2", r"'quantization_config.fmt' = 'e5m2' is not supported; ETC reads 'e4m3'"),
    ("activation_scheme", "static",
     r"'quantization_config.activation_scheme' = 'static' is not supported"),
    ("weight_block_size", None, r"'quantization_config.weight_block_size' = None is not "
                                r"supported; ETC reads block scales"),
    ("weight_block_size", [128, 48], r"'quantization_config.weight_block_size' = \[128, 48\] "
                                     r"is not supported: its columns must be a multiple of 32"),
    ("weight_block_size", [128], r"weight_block_size' = \[128\] is not supported"),
    ("modules_to_not_convert", "lm_head",
     r"'quantization_config.modules_to_not_convert' = 'lm_head' must be a list"),
    ("dequantize", True, r"'quantization_config.dequantize' is not supported"),
])
def test_quantization_config_fields_etc_does_not_honour_are_refused(field, value, message,
                                                                     tmp_path):
    quantization = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [128, 128], field: value}
    path = _fp8(tmp_path, quantization=quantization)
    with pytest.raises(UnsupportedConfigError, match=message):
        models.load(path, **LOAD)


def test_accepted_configs_and_damaged_checkpoints(tmp_path):
    """modules_to_not_convert is accepted (every tensor is read by its own
    dtype) and other block sizes load ([64, 96]: scale grids of 6 x 3);
    F8_E4M3 weights without a quantization_config, a missing or misshapen
    scale, a non-finite scale and an e4m3 NaN are errors naming the
    tensor."""
    path = _fp8(tmp_path, quantization={
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]})
    assert Checkpoint(path).quantization.block == BLOCK
    other = write_checkpoint(tmp_path / "b", CONFIGS["qwen3"], dtype="BF16", fp8_block=(64, 96))
    checkpoint = Checkpoint(other)
    name = "model.layers.0.mlp.down_proj.weight"
    assert checkpoint._where[name].shape(name + "_scale_inv") == (4, 4)  # (256/64, 352/96)
    raw = checkpoint.packed_tensor(name, (256, 352), "test")
    np.testing.assert_array_equal(packed.dequantize(raw, "fp8_e4m3"),
                                  checkpoint.tensor(name, (256, 352), "test"))

    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.CheckpointError, match=r"'model.layers.0.self_attn.q_proj.weight' "
                                                     r"\(layer 0 query projection\) is F8_E4M3, "
                                                     r"but config.json has no quantization"):
        models.load(path, **LOAD)

    from etc.models.loading.safetensors import SafetensorsFile, save_file

    def rewrite(change):
        path = _fp8(tmp_path, name="qwen3")
        file = path / "model.safetensors"
        tensors = SafetensorsFile(file)
        arrays = {n: tensors.read_bytes(n) if tensors.dtype(n) == "F8_E4M3" else
                  tensors.read(n, "bf16" if tensors.dtype(n) == "BF16" else "f32")
                  for n in tensors}
        dtypes = {n: tensors.dtype(n) for n in tensors}
        change(arrays)
        save_file(file, arrays, dtypes={n: dtypes[n] for n in arrays})
        return path

    scale = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    path = rewrite(lambda a: a.pop(scale))
    with pytest.raises(models.MissingTensorError,
                       match=rf"'{scale}' \(the block scales of layer 1 output projection\) is "
                             r"missing"):
        models.load(path, **LOAD)
    path = rewrite(lambda a: a.update({scale: a[scale][:, :1]}))
    with pytest.raises(models.CheckpointError, match=rf"'{scale}' .* has shape \(2, 1\), "
                                                     r"expected \(2, 2\)"):
        models.load(path, **LOAD)
    path = rewrite(lambda a: a[scale].__setitem__((1, 0), np.inf))
    with pytest.raises(models.CheckpointError, match=rf"'{scale}' has a non-finite scale at "
                                                     r"block \(1, 0\)"):
        models.load(path, **LOAD)
    weight = "model.layers.1.mlp.up_proj.weight"
    path = rewrite(lambda a: a[weight].__setitem__((3, 5), 0xFF))
    with pytest.raises(models.CheckpointError, match=rf"'{weight}' .* holds an e4m3 NaN at "
                                                     r"\(3, 5\)"):
        models.load(path, **LOAD)




def test_an_fp8_model_holds_about_its_file_in_memory(tmp_path):
    """A 48 MB FP8 Qwen3 (31 MB of e4m3 projections, 16 MB of bf16
    embeddings), loaded in bf16 (the step kernel from the compile cache)
    and run in a fresh process: the peak resident memory grows by at most
    1.3 x the file (the projections packed, 1.125 bytes per value: 1.08 x
    the file, read 256 rows at a time; measured 1.20 x in all), against
    2.2 x widened to bf16 (measured)."""
    config = tiny_config("Qwen3ForCausalLM", hidden_size=1024, intermediate_size=4096,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                         vocab_size=8192)
    path = write_checkpoint(tmp_path / "m", config, dtype="BF16", fp8_block=BLOCK)
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    cache = str(tmp_path / "cache")
    grown = {}
    for packed_weights in (True, False):
        grown[packed_weights] = memory_growth.grown(path, cache, packed=packed_weights, dtype="bf16")
    print({"file": size, **{("packed" if k else "widened"): v for k, v in grown.items()}})
    assert grown[True] <= 1.3 * size, (grown, size)
    assert grown[False] > 1.5 * size, (grown, size)  # the check can fail
