"""Shared fixtures for the Python tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The compile cache of etc.models is off in the tests unless a test turns it
# on (with a directory of its own): tests compile what they check, and never
# read or fill the user's cache. Subprocesses inherit both settings.
os.environ.setdefault("ETC_CACHE", "0")
# Runs use the workers they were compiled for unless a test says otherwise:
# on a loaded test machine a run would otherwise use fewer (see
# etc.runtime.workers.run_workers), and tests of a worker count would not
# test it.
os.environ.setdefault("ETC_ADAPT_WORKERS", "0")
os.environ.setdefault("ETC_CACHE_DIR", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"etc-test-cache-{os.getpid()}"))


def _find_etc_opt():
    candidates = [os.environ.get("ETC_OPT"), str(Path(sys.executable).parent / "etc-opt"),
                  str(ROOT / ".venv" / "bin" / "etc-opt"), shutil.which("etc-opt")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


@pytest.fixture(scope="session")
def etc_opt_path():
    """The path of the etc-opt to test."""
    path = _find_etc_opt()
    if path is None:
        pytest.skip("etc-opt is not installed (set ETC_OPT)")
    return path


@pytest.fixture(scope="session")
def etc_opt(etc_opt_path):
    """Runs `etc-opt <args>` on stdin text and returns stdout; fails on a non-zero exit."""
    path = etc_opt_path

    def run(text: str, *args: str) -> str:
        proc = subprocess.run([path, *args], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, f"etc-opt {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout

    return run


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A tiny Qwen3 with a trained BPE tokenizer and a ChatML template
    (`write_checkpoint(..., tokenizer=True)`), compiled once for the engine
    and server tests: vocabulary 320, EOS ids (2, 0), 64 positions."""
    import etc.models
    from etc.models.testing import tiny_config, write_checkpoint

    path = write_checkpoint(tmp_path_factory.mktemp("chat") / "tiny-chat",
                            tiny_config(vocab_size=320), tokenizer=True)
    return etc.models.load(path, workers=2, max_seq_len=64, attention_chunk=16)
