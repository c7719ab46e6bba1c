"""ptxas for the PTX tests: one way to assemble a kernel's PTX and read
what `ptxas -v` says about spills and stack frames."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

PTXAS = shutil.which("ptxas")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) is not on PATH")

_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def assemble(ptx: str, chip: str, tmp_path, name: str = "kernel") -> str:
    """Assembles `ptx` for `chip` with `ptxas -v`; fails the test on an
    error; returns ptxas's report."""
    path = tmp_path / f"{name}_{chip}.ptx"
    path.write_text(ptx)
    result = subprocess.run([PTXAS, f"-arch={chip}", "-v", str(path), "-o", "/dev/null"],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"ptxas -arch={chip} rejected the PTX:\n{result.stderr}"
    return result.stderr


def assert_no_spills(report: str, stack: bool = False) -> None:
    """No function of the report spills (and, with `stack`, none has a
    stack frame)."""
    frames = _FRAME.findall(report)
    assert frames, report
    for frame_bytes, stores, loads in frames:
        assert (stores, loads) == ("0", "0"), report
        assert not stack or frame_bytes == "0", report
