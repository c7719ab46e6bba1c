"""examples/generate.py as a user runs it: `--tiny` never writes over an
existing directory's files, and the user's mistakes (a bad token id, a
directory that is no checkpoint, a prompt too long) are one-line errors
given before compiling, not tracebacks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from etc.models.testing import tiny_config, write_checkpoint

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate.py"


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fails(generate, capsys, argv, match):
    with pytest.raises(SystemExit) as exit:
        generate.main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert match in err, err
    assert "compiled in" not in capsys.readouterr().out


def test_tiny_refuses_a_directory_that_holds_files(generate, capsys, tmp_path):
    real = write_checkpoint(tmp_path / "real", tiny_config("LlamaForCausalLM"), seed=7)
    before = {p.name: p.read_bytes() for p in real.iterdir()}
    _fails(generate, capsys, [str(real), "--tiny", "qwen3", "--prompt-ids", "1"],
           "is not an empty directory")
    assert {p.name: p.read_bytes() for p in real.iterdir()} == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "README").write_text("mine")
    _fails(generate, capsys, [str(other), "--tiny", "qwen3", "--prompt-ids", "1"],
           "is not an empty directory")
    assert [p.name for p in other.iterdir()] == ["README"]


def test_user_errors_are_messages_before_compiling(generate, capsys, tmp_path):
    path = write_checkpoint(tmp_path / "q", tiny_config("Qwen3ForCausalLM"))
    _fails(generate, capsys, [str(path), "--prompt-ids", "1", "96"],
           "prompt 0: token id 96 is outside the vocabulary [0, 96)")
    _fails(generate, capsys, [str(path), "--prompt-ids", "1", "2", "--max-seq-len", "4",
                              "--max-new-tokens", "3"],
           "prompt 0 has 2 tokens: with --max-new-tokens 3 the sequence is longer than the 4")
    _fails(generate, capsys, [str(path), "--prompt-ids", "1", "--max-new-tokens", "0"],
           "--max-new-tokens 0 must be at least 1")
    _fails(generate, capsys, [str(tmp_path / "nowhere"), "--prompt-ids", "1"],
           "not a directory")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(tiny_config("GPT2LMHeadModel")))
    _fails(generate, capsys, [str(bad), "--prompt-ids", "1"],
           "architecture 'GPT2LMHeadModel' is not supported")


def test_tiny_into_a_new_directory_generates(generate, capsys, tmp_path):
    assert generate.main([str(tmp_path / "new"), "--tiny", "llama", "--prompt-ids", "1", "2",
                          "--max-new-tokens", "2", "--max-seq-len", "16", "--workers",
                          "2"]) == 0
    out = capsys.readouterr().out
    assert "wrote a random LlamaForCausalLM checkpoint" in out
    assert "prompt [1, 2] -> [" in out
