"""What a newcomer reads and sees: the README's quick start, the
prerequisites, build progress and the reasons of skipped tests."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quick_start() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Quick start"):readme.index("## Using it")]


def test_quick_start_keeps_exactly_two_commands():
    block = re.search(r"```sh\n(.*?)```", _quick_start(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


@pytest.mark.parametrize("doc", ["README.md", "docs/building.md"])
def test_prerequisites_are_listed(doc):
    text = (ROOT / doc).read_text()
    if doc == "README.md":
        text = _quick_start()
    for needle in ("Python 3.11", "C++17 compiler", "CMake", "3.20", "ninja"):
        assert needle in text, f"{doc} does not mention {needle!r}"


def _recipe(target: str) -> str:
    """The commands `make -n <target>` would run, without running them."""
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_build_shows_progress():
    recipe = _recipe("install")
    build = [line for line in recipe.splitlines() if "install --no-build-isolation" in line]
    assert build, recipe
    # pip's --quiet swallows the CMake and ninja output: minutes of silence.
    assert "--quiet" not in build[0] and " -v " in build[0]
    assert "echo \"== building" in recipe


def test_pytest_summarises_skip_reasons():
    pytest_lines = [line for line in _recipe("test").splitlines() if "-m pytest" in line]
    assert pytest_lines and all(" -rs " in line for line in pytest_lines)


def test_the_etc_commands_of_the_readme_run_as_written():
    """After the two quick-start commands `etc` is in .venv/bin only: the
    README puts it on PATH before its first `etc` command, and the
    activation script it names exists where `make` builds."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Serve a model"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands[0] == "source .venv/bin/activate", commands
    assert all(c.startswith("etc ") for c in commands[1:]), commands
    assert "VENV   ?= .venv" in (ROOT / "Makefile").read_text()
