"""Shared fixtures for the Python tests."""

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The compile cache of etc.models is on in the tests, in a directory of the
# run's own (never the user's cache, whatever ETC_CACHE_DIR says): a model's
# step kernel is compiled once per run and loaded from its artifact by every
# other test that builds the same one (the key is everything its code
# depends on, the compiler's sources included), as issue #31 asks. The tests
# of compiling and of the cache say `cache=False` or give a directory of
# their own. Subprocesses and pytest-xdist's workers inherit the directory
# (ETC_TEST_RUN_CACHE); the process that chose it removes it at the end.
os.environ.setdefault("ETC_CACHE", "1")
_OWNS_RUN_CACHE = "ETC_TEST_RUN_CACHE" not in os.environ
_RUN_CACHE = os.environ.setdefault("ETC_TEST_RUN_CACHE", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"etc-test-cache-{os.getpid()}"))
os.environ["ETC_CACHE_DIR"] = _RUN_CACHE
# Runs use the workers they were compiled for unless a test says otherwise:
# on a loaded test machine a run would otherwise use fewer (see
# etc.runtime.workers.run_workers), and tests of a worker count would not
# test it.
os.environ.setdefault("ETC_ADAPT_WORKERS", "0")
# Native CPU kernels are compiled at LLVM's -O0 unless a file says otherwise
# (`pytestmark = pytest.mark.cpu_opt_level(2)`): at -O2 generating their
# code was about half of the suite's compile time, and the tests' tiny
# shapes run as fast either way. The same IR is compiled either way; the
# files marked for -O2 (the CPU tile kernels', the models', the packed
# kernels') keep what LLVM's optimisations do to it under test. Set
# ETC_CPU_OPT_LEVEL to run the whole suite at another level.
# (ETC_TEST_USER_OPT_LEVEL tells the suite's processes that it did.)
if "ETC_CPU_OPT_LEVEL" in os.environ:
    os.environ.setdefault("ETC_TEST_USER_OPT_LEVEL", os.environ["ETC_CPU_OPT_LEVEL"])
_OPT_LEVEL_FROM_USER = "ETC_TEST_USER_OPT_LEVEL" in os.environ
os.environ.setdefault("ETC_CPU_OPT_LEVEL", "0")


@pytest.fixture(scope="module", autouse=True)
def _cpu_opt_level(request):
    """The LLVM level of a file marked `cpu_opt_level(level)`, while its
    tests (and its module-scoped fixtures, which autouse fixtures precede)
    compile; a level the user set for the run wins."""
    marker = request.node.get_closest_marker("cpu_opt_level")
    if marker is None or _OPT_LEVEL_FROM_USER:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ETC_CPU_OPT_LEVEL", str(marker.args[0]))
        yield


def pytest_unconfigure(config):
    if _OWNS_RUN_CACHE:
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)


# Hypothesis: the same examples every run (CI cannot fail on a draw nobody
# can reproduce); HYPOTHESIS_PROFILE=explore draws new ones (docs/building.md).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
        pytest.fail("etc-opt is not installed ('make install' builds it; or set ETC_OPT)")
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


# ----------------------------------------------------------------------
# The order of the files: the longest first
# ----------------------------------------------------------------------

#: The files that take longest, longest first (seconds of each file in a
#: run of the whole suite with --durations=0, 2026-11-28: test_model_ptx.py
#: 162 s down to about 7 s, on a machine loaded by other work). The
#: Makefile's pytest hands whole files to its processes (pytest-xdist's
#: --dist loadfile) in the order of the collection, with
#: --no-loadscope-reorder (xdist would otherwise start the files with the
#: most tests first, and leave these to the end): the long ones start first
#: and the short ones fill in around them, so that both processes finish
#: together. Every other file follows in its usual order.
LONGEST_FIRST = ("test_model_ptx.py", "test_gpu_kit.py", "test_tensor_parallel.py",
                 "test_families.py", "test_cli.py", "test_fp8_checkpoints.py",
                 "test_gguf_packed_models.py", "test_cuda_ptx.py", "test_moe_packed.py",
                 "test_attention_query_blocks.py", "test_distributed.py",
                 "test_tile_functions.py", "test_speculative.py", "test_cpu_runtime.py",
                 "test_dynamic.py", "test_nvshmem.py", "test_models.py",
                 "test_paged_models.py", "test_gpu_kit_ranks.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        # `_cpu_opt_level` is module-scoped: only a file's pytestmark counts.
        own = getattr(item.module, "pytestmark", [])
        own = [getattr(m, "mark", m) for m in (own if isinstance(own, list) else [own])]
        if any(m not in own for m in item.iter_markers("cpu_opt_level")):
            raise pytest.UsageError(f"{item.nodeid}: cpu_opt_level marks a whole file "
                                    "(pytestmark = pytest.mark.cpu_opt_level(level)), not "
                                    "a test or class")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


# ----------------------------------------------------------------------
# Skips: only for what this machine lacks, never to hide a failure
# ----------------------------------------------------------------------

#: The reasons a test may skip for, by kind: hardware or platform this
#: machine does not have, and the optional peers (the CUDA toolkit's
#: assembler, torch and transformers, qemu). Any other skip reason fails the
#: run: a module of the package that does not import, a missing test
#: dependency or data that made a test give up are failures.
ALLOWED_SKIPS = {
    "GPU": re.compile(r"NVIDIA GPU|CUDA device is here|machine has a GPU"),
    "CUDA toolkit": re.compile(r"\bptxas\b|\bnvlink\b"),
    "torch": re.compile(r"\b(torch|transformers) is not installed"),
    "qemu": re.compile(r"\bqemu"),
    "platform": re.compile(r"x86-64|Linux|/proc|os\.fork|sched_setaffinity|usable cores"),
}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _skip_kind(reason: str):
    return next((kind for kind, pattern in ALLOWED_SKIPS.items() if pattern.search(reason)),
                None)


def _skips_by_kind(stats: dict):
    counts, unexpected = collections.Counter(), collections.Counter()
    for report in stats.get("skipped", []):
        reason = _skip_reason(report)
        kind = _skip_kind(reason)
        counts[kind or "NOT ALLOWED"] += 1
        if kind is None:
            unexpected[reason] += 1
    return counts, unexpected


def pytest_sessionfinish(session, exitstatus):
    # In the controlling process (xdist's workers send it their reports),
    # before the summary is printed: a skip for a reason outside
    # ALLOWED_SKIPS turns a green run red.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    if _skips_by_kind(reporter.stats)[1]:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts, unexpected = _skips_by_kind(terminalreporter.stats)
    if not counts:
        return
    terminalreporter.section("skips by kind")
    for kind, count in sorted(counts.items()):
        terminalreporter.line(f"{count:5d}  {kind}")
    for reason, count in sorted(unexpected.items()):
        terminalreporter.line(f"{count:5d}  NOT ALLOWED (fails the run): {reason}", red=True)
