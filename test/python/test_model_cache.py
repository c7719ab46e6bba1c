"""The compile cache of etc.models: a second load compiles nothing, the key
follows everything that changes the code, damaged entries are compiled
again, kernel files are checked against the model, a process that misses
while another compiles the same kernel waits and loads it, and a process
where `import mlir` fails loads and runs a model from the cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import etc
import etc.compiler
import etc.models as models
from etc.models.step import kernel_cache as model_cache
from etc.models.step.kernel_cache import KernelCache
from etc.models.testing import tiny_config, write_checkpoint

CONFIG = tiny_config("Qwen3ForCausalLM")
LOAD = dict(workers=2, max_seq_len=32, attention_chunk=8)
PROMPTS = [[5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """A checkpoint, a cache directory, and the model whose load compiled
    the one kernel that cache holds."""
    root = tmp_path_factory.mktemp("cache")
    checkpoint = write_checkpoint(root / "ckpt", CONFIG)
    directory = root / "cache"
    model = models.load(checkpoint, cache=directory, **LOAD)
    return checkpoint, directory, model


@pytest.fixture
def no_compiler(monkeypatch):
    """etc.compile raises: a load that compiles fails."""
    def refuse(*args, **kwargs):
        raise AssertionError("the step kernel was compiled again")

    monkeypatch.setattr(etc.compiler, "compile", refuse)


def test_a_second_load_compiles_nothing(cached, no_compiler):
    checkpoint, directory, first = cached
    assert first.kernel_source == "compiled" and "compile" in first.timings
    (entry,) = KernelCache(directory).entries()
    assert entry.description == first.describe()
    assert "Qwen3ForCausalLM layers=2" in entry.summary
    second = models.load(checkpoint, cache=directory, **LOAD)
    assert second.kernel_source == "cache" and "compile" not in second.timings
    want = first.generate(PROMPTS, 4, return_logits=True)
    got = second.generate(PROMPTS, 4, return_logits=True)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_array_equal(a, b)


def test_the_same_model_as_gguf_shares_the_kernel(cached, no_compiler, tmp_path):
    from etc.models.testing import write_gguf

    _, directory, _ = cached
    model = models.load(write_gguf(tmp_path / "m.gguf", CONFIG), cache=directory, **LOAD)
    assert model.kernel_source == "cache"


def test_the_key_follows_everything_that_changes_the_code(cached):
    config = models.ModelConfig.from_dict(CONFIG)

    def key(config=config, **changes):
        options = dict(LOAD, **changes)
        graph, compile = models.step_options(config, **options)
        return model_cache.key_of(model_cache.describe(config, graph, compile))

    base = key()
    assert base == key()  # deterministic
    assert base == model_cache.key_of(cached[2].describe())
    variants = [key(dtype="f16"), key(max_seq_len=64), key(attention_chunk=16),
                key(workers=3), key(schedule="static"), key(kernels="cuda"),
                key(target="cuda"), key(target="cuda", chip="sm_80"),
                key(config=models.ModelConfig.from_dict(dict(CONFIG, rms_norm_eps=1e-5))),
                key(config=models.ModelConfig.from_dict(dict(CONFIG, num_hidden_layers=3)))]
    assert len({base, *variants}) == len(variants) + 1
    # The chip is not used by the CPU target, and does not split its cache.
    assert key(chip="sm_80") == base
    description = cached[2].describe()
    assert description["compiler"] == model_cache.fingerprint()
    assert description["etc"] and description["artifact"] == etc.runtime.FORMAT_VERSION


def test_the_key_follows_the_cpu_opt_level(monkeypatch):
    """Kernels compiled at another LLVM level (ETC_CPU_OPT_LEVEL, which the
    test suite sets to 0) are other entries; a level LLVM has not is
    refused naming the variable."""
    config = models.ModelConfig.from_dict(CONFIG)
    graph, compile = models.step_options(config, **LOAD)

    def key(level):
        monkeypatch.setenv("ETC_CPU_OPT_LEVEL", level)
        return model_cache.key_of(model_cache.describe(config, graph, compile))

    assert len({key("0"), key("2"), key("3")}) == 3
    monkeypatch.delenv("ETC_CPU_OPT_LEVEL")
    assert model_cache.key_of(model_cache.describe(config, graph, compile)) == key("2")
    for bad in ("4", "-1", "O2", "fast"):
        monkeypatch.setenv("ETC_CPU_OPT_LEVEL", bad)
        with pytest.raises(ValueError, match=rf"ETC_CPU_OPT_LEVEL='{bad}' must be an LLVM "
                                             r"optimisation level: 0, 1, 2 or 3"):
            model_cache.describe(config, graph, compile)

def test_no_cache_writes_nothing(cached, monkeypatch, tmp_path):
    """cache=False, and ETC_CACHE=0 for loads that do not say, neither read
    nor write the cache (etc.compile is stubbed with the compiled kernel)."""
    checkpoint, directory, first = cached
    compiled = []
    monkeypatch.setattr(etc.compiler, "compile",
                        lambda *a, **k: compiled.append(1) or first.kernels[0])
    monkeypatch.setenv("ETC_CACHE_DIR", str(tmp_path / "env"))
    assert models.load(checkpoint, cache=False, **LOAD).kernel_source == "compiled"
    monkeypatch.setenv("ETC_CACHE", "0")
    assert models.load(checkpoint, **LOAD).kernel_source == "compiled"
    assert compiled == [1, 1] and not (tmp_path / "env").exists()
    monkeypatch.setenv("ETC_CACHE", "1")
    assert models.load(checkpoint, **LOAD).kernel_source == "compiled"
    assert [e.key for e in KernelCache().entries()] == [e.key for e in
                                                        KernelCache(directory).entries()]
    assert KernelCache().directory == tmp_path / "env"
    assert models.load(checkpoint, **LOAD).kernel_source == "cache"
    assert KernelCache().clear() == 1 and KernelCache().entries() == []


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("ETC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.default_directory() == tmp_path / "xdg" / "etc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_cache.default_directory() == tmp_path / "home" / ".cache" / "etc"


def test_a_damaged_entry_is_compiled_again(cached, monkeypatch, tmp_path):
    checkpoint, directory, first = cached
    (entry,) = KernelCache(directory).entries()
    copy = KernelCache(tmp_path / "copy")
    copy.directory.mkdir()
    damaged = copy.path(entry.key)
    damaged.write_bytes(entry.path.read_bytes()[:-100])
    monkeypatch.setattr(etc.compiler, "compile", lambda *a, **k: first.kernels[0])
    with pytest.warns(RuntimeWarning, match="cannot be loaded"):
        model = models.load(checkpoint, cache=copy.directory, **LOAD)
    assert model.kernel_source == "compiled"
    assert etc.runtime.load(damaged).abi.name == "step"  # rewritten whole


def test_kernel_files_are_checked_against_the_model(cached, no_compiler, tmp_path):
    checkpoint, directory, first = cached
    path = tmp_path / "step.etc"
    result = models.compile_checkpoint(checkpoint, cache=directory, output=path, **LOAD)
    assert result.source == "cache" and result.cache_path.parent == directory
    model = models.load(checkpoint, kernel=path, cache=False, **LOAD)
    assert model.kernel_source == "file"
    assert model.generate(PROMPTS, 2).tokens == first.generate(PROMPTS, 2).tokens
    with pytest.raises(ValueError, match=r"graph\.max_seq_len: 32 in the kernel, 64 wanted"):
        models.load(checkpoint, kernel=path, **dict(LOAD, max_seq_len=64))
    bare = tmp_path / "bare.etc"
    first.kernels[0].save(bare)
    with pytest.raises(ValueError, match="records no model description"):
        models.load(checkpoint, kernel=bare, **LOAD)


_WITHOUT_MLIR = textwrap.dedent("""
    import json, sys
    sys.modules["mlir"] = None  # `import mlir` raises ImportError from here on
    import etc.models as models
    checkpoint, directory, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    load = dict(workers=2, max_seq_len=32, attention_chunk=8)
    model = models.load(checkpoint, cache=directory, **load)
    out = model.generate(prompts, 4)
    assert model.kernel_source == "cache"
    assert not any(m == "etc.compiler" or m == "etc._etc" or m.startswith("mlir.")
                   for m in sys.modules), sorted(m for m in sys.modules if "mlir" in m)
    try:
        models.load(checkpoint, cache=directory, **dict(load, max_seq_len=64))
    except models.KernelNotCachedError as error:
        message = str(error)
    else:
        raise SystemExit("a kernel missing from the cache was compiled without MLIR")
    print(json.dumps({"tokens": out.tokens, "message": message}))
""")


def _waits_on_a_flock(pid: int) -> bool:
    """Whether process `pid` is blocked on a `flock` (a "->" line of
    /proc/locks)."""
    return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid)
               for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="needs Linux's /proc/locks")
def test_a_load_waits_for_another_process_compiling_the_same_kernel(cached, tmp_path):
    """The ranks of a tensor-parallel model miss the cache together: one
    compiles, the others wait and load it. Here the test plays the
    compiling process (it holds the key's lock); the process it starts
    misses, waits on the lock, and, once the kernel is saved and the lock
    released, loads it instead of compiling it too."""
    checkpoint, directory, first = cached
    (entry,) = KernelCache(directory).entries()
    other = KernelCache(tmp_path / "cache")
    script = textwrap.dedent("""
        import json, sys
        import etc.models
        model = etc.models.load(sys.argv[1], cache=sys.argv[2], **json.loads(sys.argv[3]))
        print(json.dumps({"source": model.kernel_source}))
    """)
    with other.compiling(entry.key):
        process = subprocess.Popen([sys.executable, "-c", script, str(checkpoint),
                                    str(other.directory), json.dumps(LOAD)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120  # a hang guard only
        while not _waits_on_a_flock(process.pid):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the loading process never waited on the lock"
            time.sleep(0.05)
        shutil.copy(entry.path, other.path(entry.key))
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err
    assert json.loads(out.splitlines()[-1]) == {"source": "cache"}


def test_models_load_from_the_cache_without_mlir(cached):
    """A process where `import mlir` fails: etc.models imports, loads the
    model from the cache and generates what the compiled model generates;
    a kernel not in the cache is an error that says how to compile it."""
    checkpoint, directory, first = cached
    result = subprocess.run([sys.executable, "-c", _WITHOUT_MLIR, str(checkpoint),
                             str(directory), json.dumps(PROMPTS)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["tokens"] == first.generate(PROMPTS, 4).tokens
    assert "the compiler cannot be imported here" in report["message"]
    assert "etc compile" in report["message"]


def test_a_model_from_the_cache_maps_no_mlir_where_mlir_is_installed(cached):
    """Serving from the cache needs no compiler, so it does not load one:
    `import etc` is lazy about MLIR (about 120 MB of it)."""
    checkpoint, directory, first = cached
    script = textwrap.dedent("""
        import json, sys
        import etc.models
        model = etc.models.load(sys.argv[1], cache=sys.argv[2], **json.loads(sys.argv[4]))
        tokens = model.generate(json.loads(sys.argv[3]), 4).tokens
        print(json.dumps({"source": model.kernel_source, "tokens": tokens,
                          "mlir": sorted(m for m in sys.modules if m.split(".")[0] == "mlir")}))
    """)
    result = subprocess.run([sys.executable, "-c", script, str(checkpoint), str(directory),
                             json.dumps(PROMPTS), json.dumps(LOAD)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["source"] == "cache" and report["mlir"] == []
    assert report["tokens"] == first.generate(PROMPTS, 4).tokens
