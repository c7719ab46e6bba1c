"""The `etc` command line, run as users run it: the installed console
script in a subprocess (compile, cache, generate, chat, the errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import etc.models as models
from etc.models.testing import tiny_config, write_checkpoint

ETC = Path(sys.executable).parent / "etc"
#: Options every command here shares: the small kernel the tests compile.
SMALL = ["--workers", "2", "--max-model-len", "32", "--attention-chunk", "8"]


def etc_command(*args, stdin: str | None = None, env: dict | None = None, timeout=600):
    assert ETC.is_file(), f"{ETC} is missing: 'make install' installs the console script"
    return subprocess.run([str(ETC), *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def one_line_error(result, *fragments: str) -> None:
    """Exit status 1 and one line on stderr, `etc: error: ...`, holding each
    fragment; never a traceback."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etc: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cli") / "tiny", tiny_config())


def test_compile_fills_the_cache_and_cache_lists_and_clears_it(checkpoint, tmp_path):
    cache = tmp_path / "cache"
    first = etc_command("compile", checkpoint, "--cache-dir", cache, *SMALL, "--progress")
    assert first.returncode == 0, first.stderr
    assert "step kernel for cpu compiled" in first.stdout
    assert f"cache: {cache}" in first.stdout
    assert "compiling the step kernel" in first.stderr  # the progress line
    again = etc_command("compile", checkpoint, "--cache-dir", cache, *SMALL, "-o",
                        tmp_path / "step.etc")
    assert again.returncode == 0, again.stderr
    assert "found in the cache" in again.stdout and (tmp_path / "step.etc").is_file()
    listed = etc_command("cache", "list", "--cache-dir", cache)
    assert listed.returncode == 0, listed.stderr
    assert "Qwen3ForCausalLM layers=2" in listed.stdout and "1 kernels" in listed.stdout
    assert "max_seq_len=32 target=cpu" in listed.stdout
    assert etc_command("cache", "dir", "--cache-dir", cache).stdout.strip() == str(cache)
    cleared = etc_command("cache", "clear", "--cache-dir", cache)
    assert cleared.returncode == 0 and "removed 1 kernels" in cleared.stdout
    assert "is empty" in etc_command("cache", "list", "--cache-dir", cache).stdout
    # The file -o wrote is the model's kernel, for --kernel / kernel=.
    model = models.load(checkpoint, kernel=tmp_path / "step.etc", workers=2, max_seq_len=32,
                        attention_chunk=8)
    assert model.kernel_source == "file"


_CUDA_WITHOUT_MLIR = textwrap.dedent("""
    import sys
    sys.modules["mlir"] = None
    import etc.models as models
    from etc.runtime.cuda import CUDAUnavailableError
    try:
        models.load(sys.argv[1], target="cuda", cache=sys.argv[2], max_seq_len=32,
                    attention_chunk=8)
    except CUDAUnavailableError as error:
        print("found the kernel; no GPU:", error)
    except models.KernelNotCachedError as error:
        raise SystemExit(f"not found: {error}")
""")


def test_compile_for_a_gpu_without_one(checkpoint, tmp_path):
    """`etc compile --target cuda --chip sm_90a` on this GPU-less machine:
    the cache gets the PTX (it assembles), and a process without MLIR
    finds the kernel there (and stops only for want of a GPU)."""
    from ptxas_check import PTXAS, assemble

    cache = tmp_path / "cache"
    result = etc_command("compile", checkpoint, "--target", "cuda", "--chip", "sm_90a",
                         "--cache-dir", cache, "--max-model-len", "32", "--attention-chunk", "8")
    assert result.returncode == 0, result.stderr
    assert "step kernel for cuda sm_90a compiled" in result.stdout
    (entry,) = models.KernelCache(cache).entries()
    assert entry.description["compile"]["chip"] == "sm_90a"
    if PTXAS is not None:  # on this kind of machine it is; elsewhere the load below still runs
        import etc.runtime

        assemble(etc.runtime.load(entry.path).ptx, "sm_90a", tmp_path, "step")
    found = subprocess.run([sys.executable, "-c", _CUDA_WITHOUT_MLIR, str(checkpoint),
                            str(cache)], capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "found the kernel; no GPU" in found.stdout


def test_user_errors_are_one_line(checkpoint, tmp_path):
    one_line_error(etc_command("compile", tmp_path / "nothing"), "no such file or directory")
    one_line_error(etc_command("compile", checkpoint, "--no-cache"), "-o FILE")
    bad = write_checkpoint(tmp_path / "bad", tiny_config("GPT2LMHeadModel"))
    one_line_error(etc_command("compile", bad, "--cache-dir", tmp_path / "c"),
                   "architecture 'GPT2LMHeadModel' is not supported")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 and then nothing")
    one_line_error(etc_command("compile", tmp_path / "junk.gguf"), "junk.gguf")
    # Usage errors are argparse's: status 2, its usage line.
    usage = etc_command("generate", checkpoint, "hello", "--workers", "0")
    assert usage.returncode == 2 and "not a positive integer" in usage.stderr
    assert etc_command().returncode == 2
    assert "Traceback" not in usage.stderr
