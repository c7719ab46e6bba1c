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
from http_servers import free_port, wait_until_healthy

ETC = Path(sys.executable).parent / "etc"
try:
    import etc.models.engine  # noqa: F401
except ImportError:
    HAVE_ENGINE = False
else:
    HAVE_ENGINE = True
#: generate, chat and serve run requests on the serving engine, with the
#: checkpoint's tokenizer.
needs_engine = pytest.mark.skipif(not HAVE_ENGINE, reason="needs the serving engine "
                                  "(etc.models.engine), which this build does not have yet")
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
    # The paged cache's size: in tokens or bytes (with units), not both.
    for bad, message in ((["--kv-cache-memory", "2XB"], "'2XB' is not a size in bytes"),
                         (["--kv-cache-tokens", "4", "--kv-cache-memory", "1"],
                          "not allowed with argument"),
                         (["--kv-block-size", "0"], "not a positive integer")):
        usage = etc_command("generate", checkpoint, "hello", *bad)
        assert usage.returncode == 2 and message in usage.stderr, usage.stderr
    one_line_error(etc_command("generate", checkpoint, "hello", *SMALL, "--no-cache",
                               "--kv-cache-memory", "1KB"),
                   "kv_cache_memory=1000 bytes is less than one KV cache block")


# ----------------------------------------------------------------------
# Text: generate and chat (need the tokenizer and the engine)
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny Qwen3 with a trained BPE tokenizer and a ChatML template, its
    kernel compiled once into a cache the tests share."""
    root = tmp_path_factory.mktemp("cli-chat")
    path = write_checkpoint(root / "tiny-chat", tiny_config(vocab_size=320), tokenizer=True)
    cache = root / "cache"
    model = models.load(path, cache=cache, workers=2, max_seq_len=32, attention_chunk=8)
    return path, cache, model


@needs_engine
def test_generate_streams_the_models_text(chat_checkpoint):
    path, cache, model = chat_checkpoint
    result = etc_command("generate", path, "the quick brown", "--max-new-tokens", "6",
                         "--cache-dir", cache, *SMALL, "--verbose")
    assert result.returncode == 0, result.stderr
    want = model.generate("the quick brown", 6)
    assert result.stdout == want.text[0] + ("" if want.text[0].endswith("\n") else "\n")
    assert "cache step kernel" in result.stderr  # --verbose: loaded from the cache
    assert "first new token after" in result.stderr
    chat = etc_command("generate", path, "hello", "--chat", "--max-new-tokens", "5",
                       "--cache-dir", cache, *SMALL)
    assert chat.returncode == 0, chat.stderr
    reply = model.generate([{"role": "user", "content": "hello"}], 5).text[0]
    assert chat.stdout.rstrip("\n") == reply.rstrip("\n")


@needs_engine
def test_chat_reads_messages_from_stdin(chat_checkpoint):
    path, cache, model = chat_checkpoint
    result = etc_command("chat", path, "--max-new-tokens", "4", "--cache-dir", cache, *SMALL,
                         stdin="hi there\n\n/reset\nthe lazy dog\n")
    assert result.returncode == 0, result.stderr
    first = model.generate([{"role": "user", "content": "hi there"}], 4).text[0]
    second = model.generate([{"role": "user", "content": "the lazy dog"}], 4).text[0]
    assert result.stdout == f"{first}\n{second}\n"


@needs_engine
def test_a_gguf_file_through_the_command_line(chat_checkpoint, tmp_path):
    """The same model as a GGUF file with its tokenizer in the metadata: the
    same text, from the same cached kernel."""
    pytest.importorskip("gguf")
    from tokenizers import Tokenizer

    from etc.models.testing import CHAT_TEMPLATE, checkpoint_tensors, write_gguf

    path, cache, model = chat_checkpoint
    config = json.loads((path / "config.json").read_text())
    gguf_path = write_gguf(tmp_path / "tiny-chat.gguf", config,
                           tokenizer=Tokenizer.from_file(str(path / "tokenizer.json")),
                           pre="gpt2", chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>")
    result = etc_command("chat", gguf_path, "--max-new-tokens", "4", "--cache-dir", cache,
                         *SMALL, "--verbose", stdin="hi there\n")
    assert result.returncode == 0, result.stderr
    first = model.generate([{"role": "user", "content": "hi there"}], 4).text[0]
    assert result.stdout == f"{first}\n"
    assert "cache step kernel" in result.stderr


@needs_engine
def test_text_errors_are_one_line(checkpoint, tmp_path):
    one_line_error(etc_command("generate", tmp_path / "nothing", "hello"),
                   "no such file or directory")
    one_line_error(etc_command("generate", checkpoint, "hello", *SMALL, "--no-cache"),
                   "has no tokenizer")
    one_line_error(etc_command("generate", checkpoint, "hello", "--kernel",
                               tmp_path / "missing.etc", *SMALL), "missing.etc")


@needs_engine
def test_serve_answers_the_openai_client(chat_checkpoint):
    """`etc serve` as a process on a free local port: the openai client's
    chat completion gets the text the model generates."""
    openai = pytest.importorskip("openai")

    path, cache, model = chat_checkpoint
    port = free_port()
    server = subprocess.Popen([str(ETC), "serve", str(path), "--port", str(port),
                               "--max-num-seqs", "2", "--kv-cache-tokens", "64",
                               "--cache-dir", str(cache), *SMALL],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_healthy(server, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": "hi there"}])
        want = model.generate([{"role": "user", "content": "hi there"}], 4).text[0]
        assert reply.choices[0].message.content == want
        # A prompt of two blocks and more, twice: the second reuses them.
        words = "the quick brown fox jumps over the lazy dog and runs far away".split()
        for n in range(1, len(words) + 1):
            chat = [{"role": "user", "content": " ".join(words[:n])}]
            ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(chat),
                                         add_special_tokens=False)
            if len(ids) > 16:
                break
        assert 16 < len(ids) < 28
        cached = [client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=4, temperature=0,
            messages=chat).usage.prompt_tokens_details.cached_tokens for _ in range(2)]
        assert cached == [0, 16]
    finally:
        server.terminate()
        server.wait(timeout=60)
