"""bench/attention_cpu.py's --evict: the buffer read before each run is the
size asked for, the option reaches the printed line, and a bad size is
refused by name."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "attention_cpu.py"
_SPEC = importlib.util.spec_from_file_location("bench_attention_cpu", _BENCH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


@pytest.mark.parametrize("megabytes", [1, 3])
def test_evict_buffer_size(megabytes):
    buffer = bench.evict_buffer(megabytes)
    assert buffer.nbytes == megabytes << 20
    assert buffer.sum() == buffer.size


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_evict_buffer_refuses(bad):
    with pytest.raises(ValueError, match="megabytes"):
        bench.evict_buffer(bad)


def test_evict_runs_and_is_reported():
    out = subprocess.run([sys.executable, str(_BENCH), "--positions", "40", "--layers", "1",
                          "--runs", "2", "--evict", "2"], capture_output=True, text=True,
                         check=True).stdout
    assert "2 MB read before each" in out


def test_evict_negative_is_refused():
    result = subprocess.run([sys.executable, str(_BENCH), "--evict", "-1"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "--evict must be >= 0" in result.stderr
