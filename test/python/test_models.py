"""etc.models on the CPU target: tiny random checkpoints written here,
whole models checked by teacher forcing against a NumPy forward pass,
ragged batches of mixed lengths, chunked prefill, bf16 checkpoints, the
errors, and Hugging Face transformers: against its goldens (hf_goldens.py)
for every architecture, config style and dtype, and live when torch and
transformers are importable."""

from __future__ import annotations

import json

import numpy as np
import pytest

import etc
import etc.models as models
import hf_goldens
from etc.models.step import reference
from etc.models.loading.checkpoint import Checkpoint
from etc.models.loading.safetensors import SafetensorsFile, save_file
from etc.models.testing import tiny_config, write_checkpoint

# The CPU tile kernels under LLVM's -O2, as users run them (conftest.py).
pytestmark = pytest.mark.cpu_opt_level(2)

# Prompts of different lengths: one token, a prompt across two attention
# chunks (chunk 4), and one across three.
PROMPTS = [[5], [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
NEW = 4
LOAD = dict(workers=3, max_seq_len=32, attention_chunk=4)

#: Llama 3 style (an untied LM head and llama3 RoPE scaling), Qwen3,
#: Qwen3-MoE with one dense layer, then a sparse one, and a one-layer
#: Mixtral: the goldens' configs.
CONFIGS = hf_goldens.ARCHITECTURES


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: write_checkpoint(root / name, config, seed=i)
            for i, (name, config) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """A compile cache of the module's own: the golden models take the step
    kernels compiled for `loaded` (the same configs, other weights)."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def loaded(checkpoints, kernel_cache):
    return {name: models.load(path, cache=kernel_cache, **LOAD)
            for name, path in checkpoints.items()}


def _teacher_forcing(path, prompts, out, tol=2e-4, kv_dtype="f32"):
    """Each step's logits are those of a NumPy forward pass over the prompt
    plus the tokens produced so far, and each token is their argmax."""
    checkpoint = Checkpoint(path)
    weights = checkpoint.weights()
    for r, prompt in enumerate(prompts):
        sequence = list(prompt) + out.tokens[r]
        want = reference.forward(checkpoint.config, weights, sequence[:-1], kv_dtype=kv_dtype)
        assert out.logits[r].shape == (len(out.tokens[r]), checkpoint.config.vocab_size)
        assert out.logits[r].dtype == np.float32
        for j, token in enumerate(out.tokens[r]):
            np.testing.assert_allclose(out.logits[r][j], want[len(prompt) - 1 + j],
                                       rtol=tol, atol=tol, err_msg=f"prompt {r}, new token {j}")
            assert token == int(np.argmax(out.logits[r][j]))


# ----------------------------------------------------------------------
# Whole models
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_cuda_tile_kernels_match_numpy_with_simulated_lanes(name, checkpoints):
    """The step graph built with the CUDA tile kernels (transposed GEMV,
    warp-per-row norms, vector elementwise) and run on the CPU with their
    lanes simulated: the same teacher-forced logits."""
    model = models.load(checkpoints[name], kernels="cuda", **LOAD)
    assert "matmul_gemv_t" in model.kernels[0].ir("graph")
    out = model.generate(PROMPTS, 2, return_logits=True)
    _teacher_forcing(checkpoints[name], PROMPTS, out)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generate_matches_numpy_by_teacher_forcing(name, loaded, checkpoints):
    model = loaded[name]
    out = model.generate(PROMPTS, NEW, return_logits=True)
    assert [len(t) for t in out.tokens] == [NEW] * len(PROMPTS)
    assert all(0 <= t < model.config.vocab_size for row in out.tokens for t in row)
    _teacher_forcing(checkpoints[name], PROMPTS, out)
    # Without logits: the same tokens.
    assert model.generate(PROMPTS, NEW).tokens == out.tokens


def test_one_kernel_for_every_batch_length_and_step(loaded):
    model = loaded["qwen3"]
    kernels = model.kernels
    assert len(kernels) == 1
    for prompts, new in (([[3]], 1), (PROMPTS, 6), ([[1] * 20, [2], [3, 4], [5, 6, 7]], 3)):
        model.generate(prompts, new)
    assert len(model.kernels) == 1 and model.kernels[0] is kernels[0]


def test_a_prompt_alone_or_in_a_batch_gives_the_same_tokens(loaded):
    model = loaded["qwen3_moe"]
    batched = model.generate(PROMPTS, NEW, return_logits=True)
    for r, prompt in enumerate(PROMPTS):
        alone = model.generate([prompt], NEW, return_logits=True)
        assert alone.tokens[0] == batched.tokens[r]
        np.testing.assert_allclose(alone.logits[0], batched.logits[r], rtol=1e-4, atol=1e-4)


def test_chunked_prefill_mixes_prefill_and_decode_in_one_step(checkpoints, loaded):
    # Three tokens a step: the long prompt is prefilled over several steps,
    # some of which also decode the short prompts' tokens.
    model = models.load(checkpoints["llama"], max_step_tokens=3, schedule="static", **LOAD)
    out = model.generate(PROMPTS, NEW, return_logits=True)
    assert out.steps > NEW + 3
    whole = loaded["llama"].generate(PROMPTS, NEW, return_logits=True)
    assert out.tokens == whole.tokens
    for a, b in zip(out.logits, whole.logits):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    _teacher_forcing(checkpoints["llama"], PROMPTS, out)


def test_step_serves_requests_that_join_and_leave(loaded):
    """Continuous batching through `step`: a request joins while another
    decodes, in the same kernel."""
    model = loaded["qwen3"]
    cache = model.new_cache(slots=2, length=16)
    logits_a, ids_a = model.step(cache, [models.Request(0, 0, [1, 2, 3])], return_logits=True)
    second, ids_b = model.step(cache, [models.Request(0, 3, [int(ids_a[0])]),
                                       models.Request(1, 0, [4, 5])], return_logits=True)
    want = reference.forward(model.config, Checkpoint(model.path).weights(),
                             [1, 2, 3, int(ids_a[0])])
    np.testing.assert_allclose(logits_a[0], want[2], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(second[0], want[3], rtol=2e-4, atol=2e-4)
    want_b = reference.forward(model.config, Checkpoint(model.path).weights(), [4, 5])
    np.testing.assert_allclose(second[1], want_b[1], rtol=2e-4, atol=2e-4)
    assert ids_b.dtype == np.int32 and list(ids_b) == list(np.argmax(second, axis=1))


def test_decode_steps_reuse_their_arrays_and_binding(loaded, monkeypatch):
    """`step` copies its small arrays into ones kept from the last step of
    the same shapes, so the runtime reuses that step's binding (no `_bind`
    at a repeated shape); the ids each step returns stay the caller's, and
    they are those of the same steps run on new arrays (`return_logits`)."""
    from etc.runtime.cpu import CPURuntime

    model = loaded["qwen3"]
    binds = []
    bind = CPURuntime._bind
    monkeypatch.setattr(CPURuntime, "_bind",
                        lambda self, *a, **k: binds.append(1) or bind(self, *a, **k))
    kept, fresh = model.new_cache(slots=2, length=16), model.new_cache(slots=2, length=16)
    prompts = {0: [1, 2, 3], 1: [4, 5]}
    for cache in (kept, fresh):
        model.step(cache, [models.Request(s, 0, p) for s, p in prompts.items()])
    tokens = {0: [7], 1: [9]}
    returned = []
    # One request, then both, then one again: the kept arrays of each shape.
    for step, slots in enumerate([(0,), (0,), (0, 1), (0, 1), (0, 1), (0,), (0,), (0,)]):
        requests = [models.Request(s, len(prompts[s]) + len(tokens[s]) - 1, [tokens[s][-1]])
                    for s in slots]
        binds.clear()
        _, ids = model.step(kept, requests)
        if step in (4, 7):  # the arrays of the two steps before: planned at the second
            assert binds == []
        returned.append((requests, ids, ids.tolist()))
        for s, token in zip(slots, ids.tolist()):
            tokens[s].append(token)
    for requests, ids, copy in returned:
        assert ids.tolist() == copy
        _, want = model.step(fresh, requests, return_logits=True)
        assert copy == want.tolist()


def test_bf16_checkpoint(tmp_path):
    path = write_checkpoint(tmp_path / "bf16", tiny_config("Qwen3ForCausalLM"), dtype="BF16",
                            seed=5, shards=2)
    assert all(SafetensorsFile(f).dtype(n) == "BF16" for f in path.glob("*.safetensors")
               for n in SafetensorsFile(f))
    model = models.load(path, schedule="static", dtype="f32", **LOAD)
    out = model.generate(PROMPTS, 3, return_logits=True)
    # The widened bf16 weights are exact float32 values: teacher forcing
    # holds as tightly as for float32 checkpoints.
    _teacher_forcing(path, PROMPTS, out)


def test_kv_cache_memory(loaded):
    model = loaded["qwen3"]
    c = model.config
    assert models.KVCache.bytes_for(c, 3, 20) == \
        2 * c.num_layers * 3 * 20 * c.num_kv_heads * c.head_dim * 4
    half = models.KVCache(c, 3, 20, dtype="bf16")
    assert half.nbytes == models.KVCache.bytes_for(c, 3, 20, "bf16") == \
        models.KVCache.bytes_for(c, 3, 20) // 2
    # Paged (the default, blocks of 16): 3 sequences of 20 positions hold
    # 2 blocks each.
    cache = model.new_cache(3, 20)
    assert model.kv_block_size == 16
    assert cache.nbytes == 6 * model.kv_cache_bytes_per_block == \
        2 * c.num_layers * 6 * 16 * c.num_kv_heads * c.head_dim * 4


def test_bf16_kv_cache_matches_numpy_by_teacher_forcing(checkpoints):
    """A float32 model with a bf16 cache: the cache's rounding of keys and
    values (relative 2^-9) is the only difference from float32, so the
    logits match a forward pass that rounds K and V the same way as
    tightly as float32 caches match, and miss the unrounded one."""
    model = models.load(checkpoints["llama"], kv_dtype="bf16", **LOAD)
    cache = model.new_cache(1, 4)
    assert cache.arrays["l0_k_cache"].dtype == np.uint16
    out = model.generate(PROMPTS, 3, return_logits=True)
    _teacher_forcing(checkpoints["llama"], PROMPTS, out, kv_dtype="bf16")
    with pytest.raises(AssertionError):
        _teacher_forcing(checkpoints["llama"], PROMPTS, out)
    with pytest.raises(ValueError, match=r"load: kv_dtype='f8' is not supported"):
        models.load(checkpoints["llama"], kv_dtype="f8", **LOAD)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_step_graph_code_does_not_grow_with_depth(name):
    """Per-layer weights are buffers, not kernel parameters: 2 and 6 layers
    have the same tile functions."""
    from etc.models.step.graph import build_step_graph

    def tile_functions(layers: int) -> int:
        config = models.ModelConfig.from_dict(dict(CONFIGS[name], num_hidden_layers=layers))
        graph = build_step_graph(config, max_seq_len=32, chunk=4)
        text = graph.to_mlir()
        assert text.count('event.task "attention_') == 2 * layers
        return text.count("func.func private")
    assert tile_functions(2) == tile_functions(6)


# ----------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------


def test_unsupported_architecture_and_fields(tmp_path):
    path = write_checkpoint(tmp_path / "gpt", tiny_config("GPT2LMHeadModel"))
    with pytest.raises(models.UnsupportedConfigError,
                       match=r"architecture 'GPT2LMHeadModel' is not supported; supported: "
                             r"LlamaForCausalLM, .*Qwen3ForCausalLM, Qwen3MoeForCausalLM"):
        models.load(path)
    for field, value, why in [("attention_bias", True, "no bias"),
                              ("hidden_act", "gelu", "SiLU"),
                              ("use_sliding_window", True, "windowed"),
                              ("rope_scaling", {"rope_type": "dynamic", "factor": 4.0}, "'dynamic'")]:
        config = tiny_config("Qwen3ForCausalLM", **{field: value})
        (tmp_path / "q").mkdir(exist_ok=True)
        (tmp_path / "q" / "config.json").write_text(json.dumps(config))
        with pytest.raises(models.UnsupportedConfigError, match=rf"field '{field}'.*{why}"):
            Checkpoint(tmp_path / "q")
    config = tiny_config("Qwen3ForCausalLM")
    del config["num_hidden_layers"]
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.UnsupportedConfigError, match=r"field 'num_hidden_layers' is missing"):
        Checkpoint(tmp_path / "q")


def test_missing_tensor_is_named(tmp_path):
    name = "model.layers.1.self_attn.k_norm.weight"
    path = write_checkpoint(tmp_path / "missing", tiny_config("Qwen3ForCausalLM"), drop=(name,))
    with pytest.raises(models.MissingTensorError,
                       match=rf"tensor '{name}' \(layer 1 k_norm\) is missing"):
        models.load(path)
    with pytest.raises(models.CheckpointError, match=r"no \*\.safetensors files"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text(json.dumps(tiny_config()))
        models.load(tmp_path / "empty")


def test_wrong_tensor_dtype_and_shape_are_named(tmp_path):
    path = write_checkpoint(tmp_path / "bad", tiny_config("Qwen3ForCausalLM"))
    file = next(path.glob("*.safetensors"))
    tensors = {n: SafetensorsFile(file).get(n) for n in SafetensorsFile(file)}
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:20]
    save_file(file, tensors)
    with pytest.raises(models.CheckpointError,
                       match=r"tensor 'model.norm.weight' \(final norm\) has shape \(20,\), "
                             r"expected \(32,\)"):
        models.load(path)
    import struct
    # model.norm.weight as 64-bit floats, in a file of its own.
    del tensors["model.norm.weight"]
    save_file(file, tensors)
    header = {"model.norm.weight": {"dtype": "F64", "shape": [32], "data_offsets": [0, 256]}}
    text = json.dumps(header).encode()
    other = path / "extra.safetensors"
    other.write_bytes(struct.pack("<Q", len(text)) + text + bytes(256))
    with pytest.raises(models.SafetensorsError,
                       match=r"tensor 'model.norm.weight' has a dtype ETC does not load 'F64'; "
                             r"supported: F32, F16, BF16"):
        models.load(path)
    with pytest.raises(ValueError, match=r"dtype='f64' is not supported"):
        other.unlink()
        models.load(path, dtype="f64")


def test_generate_errors(loaded):
    model = loaded["qwen3"]
    with pytest.raises(ValueError, match=r"prompt 1, position 2: token id 96 is outside the "
                                         r"vocabulary \[0, 96\)"):
        model.generate([[1], [1, 2, 96]], 2)
    with pytest.raises(ValueError, match=r"prompt 0 has 30 tokens; with max_new_tokens=3 the "
                                         r"sequence would be 33 tokens, longer than the cache "
                                         r"\(max_seq_len=32\)"):
        model.generate([[1] * 30], 3)
    with pytest.raises(ValueError, match=r"prompt 0 must be a non-empty list"):
        model.generate([[]], 2)
    with pytest.raises(ValueError, match=r"max_new_tokens=0 must be a positive int"):
        model.generate([[1]], 0)
    cache = model.new_cache(1, 4)  # paged: one block of 16 positions
    with pytest.raises(ValueError, match=r"request 0 covers positions \[30, 33\), a sequence "
                                         r"longer than the cache \(32 positions\)"):
        model.step(cache, [models.Request(0, 30, [1, 2, 3])])
    with pytest.raises(ValueError, match=r"request 0 reaches position 16, but its block table "
                                         r"holds 16 positions"):
        model.step(cache, [models.Request(0, 14, [1, 2, 3])])
    with pytest.raises(ValueError, match=r"request 0 uses sequence 1, which the paged cache has "
                                         r"not admitted"):
        model.step(cache, [models.Request(1, 0, [1])])


# ----------------------------------------------------------------------
# Formats and configs
# ----------------------------------------------------------------------


def test_safetensors_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal(7).astype(np.float32)}
    for dtype in ("F32", "F16", "BF16"):
        save_file(tmp_path / f"{dtype}.safetensors", tensors, dtype, metadata={"format": "pt"})
        file = SafetensorsFile(tmp_path / f"{dtype}.safetensors")
        assert file.keys() == ["a", "b"] and file.metadata == {"format": "pt"}
        for name, array in tensors.items():
            want = {"F32": array, "F16": array.astype(np.float16).astype(np.float32),
                    "BF16": etc.reference.round_bf16(array)}[dtype]
            np.testing.assert_array_equal(file.get(name), want)
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json!!......")
    with pytest.raises(models.SafetensorsError, match=r"the header is not JSON"):
        SafetensorsFile(tmp_path / "bad.safetensors")


def test_llama3_rope_scaling_matches_hugging_face_formula():
    config = models.ModelConfig.from_dict(CONFIGS["llama"])
    inv = config.rope_inv_freq()
    base = 1.0 / (500000.0 ** (np.arange(0, 16, 2) / 16))
    wavelen = 2 * np.pi / base
    factor, low, high, old = 8.0, 1.0, 4.0, 16
    expected = np.where(wavelen > old / low, base / factor, base)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    expected = np.where(medium, (1 - smooth) * expected / factor + smooth * expected, expected)
    np.testing.assert_allclose(inv, expected, rtol=1e-5)
    assert (inv != base.astype(np.float32)).any()


def test_moe_sparse_layers_follow_hugging_face():
    config = models.ModelConfig.from_dict(tiny_config(
        "Qwen3MoeForCausalLM", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert config.sparse_layers == (1, 5)


# ----------------------------------------------------------------------
# Hugging Face transformers
# ----------------------------------------------------------------------

#: The f32 goldens (the half-precision ones are test_goldens.py's).
GOLDENS = [name for name, case in hf_goldens.cases().items()
           if case["group"] in CONFIGS and case["dtype"] == "f32"]


@pytest.mark.parametrize("name", GOLDENS)
def test_matches_hugging_face_goldens(name, kernel_cache, tmp_path):
    """transformers' logits at every position of three prompts and their
    greedy continuations (teacher forced: each prefix a request) within
    the f32 tolerance (hf_goldens.tolerance: 1.7e-4 of the logits' rms),
    and its greedy tokens, for config.json as transformers 4 and 5 write
    it; the kernels are `loaded`'s (the same configs, other weights)."""
    golden = hf_goldens.Golden.load(name)
    model = models.load(golden.write_checkpoint(tmp_path / name), cache=kernel_cache, **LOAD)
    hf_goldens.check_model(golden, model)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_hugging_face_transformers(name, loaded, checkpoints):
    torch = pytest.importorskip("torch", reason="torch is not installed: the comparison with "
                                                "Hugging Face transformers needs torch and "
                                                "transformers")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                                              "the comparison needs it")
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[name],
                                                           torch_dtype=torch.float32)
    hf.eval()
    ours = loaded[name].generate(PROMPTS, NEW, return_logits=True)
    for r, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            result = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 pad_token_id=0)
        tokens = result.sequences[0, len(prompt):].tolist()
        logits = torch.stack(result.logits)[:, 0].numpy()
        np.testing.assert_allclose(ours.logits[r], logits, rtol=2e-4, atol=2e-4)
        assert ours.tokens[r] == tokens


# ----------------------------------------------------------------------
# CUDA: runs where a GPU is lent (the PTX of every architecture's step
# graph, at real widths: test_model_ptx.py)
# ----------------------------------------------------------------------


from etc.runtime.cuda import cuda_available  # noqa: E402


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU, its driver and cuda-python")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_generate_matches_cpu(name, loaded, checkpoints):
    cuda = models.load(checkpoints[name], target="cuda", max_seq_len=32, attention_chunk=4)
    ours = cuda.generate(PROMPTS, NEW, return_logits=True)
    _teacher_forcing(checkpoints[name], PROMPTS, ours, tol=1e-3)
    assert ours.tokens == loaded[name].generate(PROMPTS, NEW).tokens
