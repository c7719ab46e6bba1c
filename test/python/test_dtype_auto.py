"""`load(dtype=None)` and `etc --dtype auto` (the defaults): the compute dtype
is the checkpoint's own, resolved before the compile cache's key, so that
the model, the cache, the CLI and the server all name it (docs/models.md,
"The compute dtype")."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

import etc.cli
import etc.models as models
import etc.serve
from etc.models.loading.checkpoint import Checkpoint, config_dtype
from etc.models.loading.gguf import GGUFCheckpoint
from etc.models.loading.safetensors import save_file
from etc.models.step.kernel import resolve_dtype
from etc.models.testing import checkpoint_tensors, tiny_config, write_checkpoint, write_gguf

#: The load options of the one model compiled here, as the CLI spells them too.
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8)
CLI = ["--workers", "2", "--max-model-len", "32", "--attention-chunk", "8"]
PROMPTS = [[5, 6, 7], [9, 1]]


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    """A bf16 checkpoint (its config.json says float32, as tiny_config's
    does: the storage wins) loaded with the defaults, and its cache."""
    root = tmp_path_factory.mktemp("dtype_auto")
    path = write_checkpoint(root / "bf16", tiny_config(), dtype="BF16", seed=3)
    cache = root / "cache"
    return path, cache, models.load(path, cache=cache, **LOAD)


def test_a_bf16_checkpoint_computes_in_bf16(bf16):
    """Weights kept as the file's bf16 bits (never widened), bf16 KV
    caches, the kernel built for bf16 and cached under that key: an
    explicit dtype="bf16" (or "auto") load finds it, and computes the same
    logits."""
    path, cache, model = bf16
    assert model.dtype == "bf16" and model.kv_dtype == "bf16"
    assert model.graph_options["dtype"] == "bf16" and "dtype=bf16" in repr(model)
    assert model._weights["embed"].dtype == np.uint16
    assert model.kernel_source == "compiled"
    explicit = models.load(path, cache=cache, dtype="bf16", **LOAD)
    assert explicit.kernel_source == "cache"
    assert models.load(path, cache=cache, dtype="auto", **LOAD).kernel_source == "cache"
    got = model.generate(PROMPTS, 3, return_logits=True)
    want = explicit.generate(PROMPTS, 3, return_logits=True)
    assert got.tokens == want.tokens
    for here, there in zip(got.logits, want.logits):
        np.testing.assert_array_equal(np.asarray(here), np.asarray(there))


def test_the_command_line_names_the_resolved_dtype(bf16, capsys):
    """`etc compile` (default --dtype auto) finds the bf16 kernel the load
    compiled and says bf16; `etc cache list` shows dtype=bf16, never auto;
    so do the verbose load line and the server's /v1/models."""
    path, cache, model = bf16
    assert etc.cli.main(["compile", str(path), "--cache-dir", str(cache), *CLI]) == 0
    out = capsys.readouterr().out
    assert "bf16 step kernel for cpu found in the cache" in out, out
    assert etc.cli.main(["cache", "list", "--cache-dir", str(cache)]) == 0
    listed = capsys.readouterr().out
    assert "dtype=bf16" in listed and "dtype=auto" not in listed, listed
    assert etc.cli.main(["compile", str(path), "--cache-dir", str(cache), "--dtype", "bf16",
                         *CLI]) == 0
    assert "found in the cache" in capsys.readouterr().out
    from etc.cli.model import load_model

    args = etc.cli.parser().parse_args(["generate", str(path), "hi", "--verbose", "--quiet",
                                        "--cache-dir", str(cache), *CLI])
    assert load_model(args).dtype == "bf16"
    assert f"etc: loaded {path} (bf16, cache step kernel" in capsys.readouterr().err
    with TestClient(etc.serve.build_app(model, served_model_name="tiny")) as client:
        (served,) = client.get("/v1/models").json()["data"]
    assert served["dtype"] == "bf16"


def test_the_dtype_option_defaults_to_auto(capsys):
    for command in ("generate", "chat", "serve", "compile"):
        with pytest.raises(SystemExit) as exit:
            etc.cli.main([command, "--help"])
        assert exit.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "--dtype {auto,f32,f16,bf16}" in text, command
        assert "(default: auto, the checkpoint's own" in text, command
    args = etc.cli.parser().parse_args(["generate", "m", "hi"])
    assert args.dtype == "auto"
    with pytest.raises(SystemExit) as exit:
        etc.cli.main(["generate", "m", "hi", "--dtype", "f64"])
    assert exit.value.code == 2
    assert "argument --dtype: invalid choice: 'f64'" in capsys.readouterr().err


def test_storage_decides(tmp_path):
    """All matrices of one float dtype: that dtype, whatever config.json
    says; an explicit dtype wins over it; a bad one is an error naming it,
    before any weight is read."""
    for stored, want in (("F32", "f32"), ("F16", "f16"), ("BF16", "bf16")):
        path = write_checkpoint(tmp_path / stored, tiny_config(torch_dtype="bfloat16"),
                                dtype=stored)
        checkpoint = Checkpoint(path)
        assert checkpoint.default_dtype() == want
        assert resolve_dtype(checkpoint, None) == resolve_dtype(checkpoint, "auto") == want
        for explicit in ("f32", "f16", "bf16"):
            assert resolve_dtype(checkpoint, explicit) == explicit
    for bad in ("f64", "float32", "BF16", 32):
        with pytest.raises(ValueError, match=rf"load: dtype={bad!r} is not supported; expected "
                                             r"one of f32, f16, bf16, or None / 'auto'"):
            models.load(path, dtype=bad, cache=False)
    with pytest.raises(ValueError, match=r"dtype='f64' is not supported"):
        models.compile_checkpoint(path, dtype="f64", cache=False)


def _mixed(path, config: dict, dtypes: dict, default: str = "BF16"):
    """A checkpoint of `config` stored in `default`, tensors named in
    `dtypes` in theirs."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(path / "model.safetensors", checkpoint_tensors(config), default, dtypes=dtypes)
    return Checkpoint(path)


def test_mixed_storage(tmp_path):
    """Matrices of several dtypes: config.json's dtype (transformers 5) or
    torch_dtype when it is one of them, else f32, which holds them all.
    Norms and biases (vectors) do not count."""
    f32_head = {"lm_head.weight": "F32"}
    untied = dict(tie_word_embeddings=False)
    said = {"torch_dtype": "bfloat16"}
    assert _mixed(tmp_path / "a", tiny_config(**untied, **said), f32_head).default_dtype() \
        == "bf16"
    assert _mixed(tmp_path / "b", tiny_config(**untied, dtype="float32"),
                  f32_head).default_dtype() == "f32"
    assert _mixed(tmp_path / "c", tiny_config(**untied, torch_dtype="float16"),
                  f32_head).default_dtype() == "f32"
    f16_q = {"model.layers.0.self_attn.q_proj.weight": "F16"}
    assert _mixed(tmp_path / "d", tiny_config(**said), f16_q).default_dtype() == "bf16"
    assert _mixed(tmp_path / "e", tiny_config(torch_dtype="float32"), f16_q).default_dtype() \
        == "f32"
    norms = {"model.norm.weight": "F32", "model.layers.0.input_layernorm.weight": "F32"}
    assert _mixed(tmp_path / "f", tiny_config(torch_dtype="float32"), norms).default_dtype() \
        == "bf16"
    assert config_dtype({"torch_dtype": "torch.float16"}) == "f16"
    assert config_dtype({"dtype": "bfloat16", "torch_dtype": "float32"}) == "bf16"
    assert config_dtype({"torch_dtype": "float64"}) is None and config_dtype({}) is None


def test_fp8_checkpoints_take_their_other_matrices_dtype(tmp_path):
    """An FP8 checkpoint: the dtype of the matrices that are not e4m3 (the
    embeddings: bf16 in the official releases)."""
    config = tiny_config(hidden_size=64, intermediate_size=96, head_dim=32)
    block = (32, 32)
    assert Checkpoint(write_checkpoint(tmp_path / "bf16", config, dtype="BF16",
                                       fp8_block=block)).default_dtype() == "bf16"
    assert Checkpoint(write_checkpoint(tmp_path / "f32", config, dtype="F32",
                                       fp8_block=block)).default_dtype() == "f32"


@pytest.mark.parametrize("types, want", [
    (dict(tensor_type="F32"), "f32"),
    (dict(tensor_type="F16"), "f16"),
    (dict(tensor_type="BF16"), "bf16"),
    (dict(tensor_type="Q8_0"), "f32"),
    (dict(tensor_type="BF16", tensor_types={"blk.0.attn_q.weight": "Q8_0"}), "f32"),
    (dict(tensor_type="BF16", tensor_types={"blk.0.attn_q.weight": "F16"}), "f32"),
])
def test_gguf_files(types, want, tmp_path):
    """A GGUF file with any quantized matrix computes in f32 (its blocks
    stay packed); one of F16 or BF16 matrices only, in that dtype."""
    config = tiny_config(hidden_size=64, intermediate_size=96, head_dim=32)
    path = write_gguf(tmp_path / "m.gguf", config, **types)
    assert GGUFCheckpoint(path).default_dtype() == want
