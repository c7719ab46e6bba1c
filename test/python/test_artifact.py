"""Saved kernels: the artifact format, its errors, and CPU artifacts run in a
process where `import mlir` fails, against the NumPy reference."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.runtime import ArtifactError, artifact

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "kit"))
import families  # noqa: E402

#: Families that cover every operator (dense + one-operator topk/scale/exp/...
#: folded into `everything`), dtypes and the data-dependent MoE layer.
CPU_FAMILIES = ("everything", "mlp_f16", "mlp_bf16", "moe")


def _everything():
    """One graph with every operator family of the front end."""
    g = etc.Graph("everything")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    nw = g.input("nw", (96,), "f32")
    w = g.input("w", (96, 64), "f32")
    wt = g.input("wt", (96, 64), "f32")
    r = g.input("r", (64,), "f32")
    h = g.rmsnorm(x, nw, 1e-5)
    a = g.silu(g.matmul(h, w))
    b = g.gelu(g.mul(a, g.add(a, r)))
    c = g.matmul(g.exp(g.scale(b, -0.5)), wt, transpose_b=True)
    values, indices = g.topk(c, 3)
    g.output(g.softmax(c), g.sum(b), values, indices)
    return g


def _family(name):
    if name == "everything":
        return _everything(), families.Recipe(scales={"w": 0.3, "wt": 0.3, "r": 0.3})
    build, recipe = families.families()[name]
    return build(), recipe


_SUBPROCESS = textwrap.dedent("""
    import json, sys
    sys.modules["mlir"] = None  # `import mlir` raises ImportError from here on
    try:
        import mlir  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("mlir is still importable")
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    import etc.runtime, etc.reference
    import families
    assert not any(m == "etc._etc" or m.startswith("mlir.") for m in sys.modules)
    checks = 0
    for path, recipe in json.loads(open(sys.argv[1]).read()):
        kernel = etc.runtime.load(path)
        recipe = families.recipe_from_json(recipe)
        symbol = next(a.name for a in kernel.arguments if a.kind == "symbol")
        rng = np.random.default_rng(0)
        for size in recipe.sizes:
            inputs = families.make_inputs(kernel.arguments, {symbol: size}, recipe, rng)
            outputs = kernel.run(**inputs)
            expected = etc.reference.evaluate(kernel, **inputs)
            for got, want in zip(outputs, expected, strict=True):
                error = families.relative_error(got, want)
                assert error <= recipe.tolerance, (path, size, error)
                checks += 1
    try:
        etc.Graph
    except ImportError as error:
        assert "etc.runtime.load" in str(error)
    else:
        raise SystemExit("etc.Graph exists without MLIR")
    print("checked", checks)
""")


def test_cpu_artifacts_run_without_mlir(tmp_path):
    """Every operator family, static and dynamic, saved here and run in a
    process where `import mlir` fails, against the NumPy reference computed
    there from the description the artifact carries."""
    jobs = []
    for name in CPU_FAMILIES:
        graph, recipe = _family(name)
        for schedule in ("static", "dynamic"):
            path = tmp_path / f"{name}_{schedule}.etc"
            etc.compile(graph, target="cpu", schedule=schedule, workers=3).save(path)
            jobs.append((str(path), recipe.to_json()))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    script = tmp_path / "run.py"
    script.write_text(_SUBPROCESS)
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "jobs.json"),
                             str(ROOT / "kit")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split()[-1] == str(
        sum(len(_family(n)[1].sizes) * len(_family(n)[0].outputs) * 2 for n in CPU_FAMILIES))


def _saved(tmp_path, target="cpu", schedule="static"):
    g = families.operator_graph("add")
    kernel = etc.compile(g, target=target, schedule=schedule, workers=2)
    path = tmp_path / f"add_{target}.etc"
    kernel.save(path)
    return kernel, path


def test_loaded_kernel_has_the_abi_and_runs_like_the_compiled_one(tmp_path):
    kernel, path = _saved(tmp_path)
    loaded = etc.runtime.load(path)
    assert [(a.kind, a.name, a.shape, a.dtype) for a in loaded.arguments] == [
        ("symbol", "B", (), "index"), ("input", "x", ("B", 96), "f32"),
        ("input", "z", ("B", 96), "f32"), ("output", "add_0", ("B", 96), "f32")]
    assert loaded.abi.schedule == "static" and loaded.abi.target == "cpu"
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((37, 96), np.float32),
              "z": rng.standard_normal((37, 96), np.float32)}
    np.testing.assert_array_equal(loaded.run(**inputs)[0], kernel.run(**inputs)[0])
    with pytest.raises(TypeError, match="missing inputs"):
        loaded.run(x=inputs["x"])


def test_cuda_artifact_holds_the_ptx(tmp_path):
    kernel, path = _saved(tmp_path, "cuda", "dynamic")
    loaded = etc.runtime.load(path)
    assert loaded.ptx == kernel.ptx
    assert loaded.abi.chip == "sm_90a" and loaded.abi.schedule == "dynamic"
    with pytest.raises(AttributeError, match="target='cuda'"):
        etc.runtime.load(_saved(tmp_path)[1]).ptx


def test_auto_schedule_is_resolved_in_the_abi(tmp_path):
    g = families.moe_graph()
    path = tmp_path / "moe.etc"
    etc.compile(g, schedule="auto", workers=2).save(path)
    assert etc.runtime.load(path).abi.schedule == "dynamic"


def _rewrite(path, manifest=None, code=None, sign=True):
    """Rewrites the artifact at `path` with a changed manifest (its digest
    recomputed unless `sign` is false: an artifact saved that way) or code."""
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    if manifest is not None:
        data = json.loads(members[artifact.MANIFEST])
        manifest(data)
        if sign:
            data["sha256"] = artifact._manifest_digest(data)
        members[artifact.MANIFEST] = json.dumps(data).encode()
    if code is not None:
        name = next(n for n in members if n != artifact.MANIFEST)
        members[name] = code(members[name])
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_another_format_version_is_a_clear_error(tmp_path):
    _, path = _saved(tmp_path)
    _rewrite(path, manifest=lambda m: m.update(version=artifact.FORMAT_VERSION + 1))
    version = artifact.FORMAT_VERSION
    with pytest.raises(ArtifactError, match=rf"format version {version + 1}, but this runtime "
                                            rf"reads version {version}"):
        etc.runtime.load(path)


def test_damaged_files_are_clear_errors(tmp_path):
    _, path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    # Flip a byte in the middle of the stored code: the zip CRC catches it.
    data[len(data) // 2] ^= 0xFF
    broken = tmp_path / "flipped.etc"
    broken.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="damaged"):
        etc.runtime.load(broken)

    truncated = tmp_path / "truncated.etc"
    truncated.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ArtifactError, match="not an ETC artifact"):
        etc.runtime.load(truncated)

    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(ArtifactError, match="no etc-artifact.json"):
        etc.runtime.load(other)

    _rewrite(path, code=lambda code: code + b"\0")
    with pytest.raises(ArtifactError, match="checksum"):
        etc.runtime.load(path)


def _flip_every_byte(path, tmp_path, start: int, end: int) -> dict:
    """Loads `path` with each byte of [start, end) flipped in turn; the
    outcomes by exception type (a flip may also leave it loadable)."""
    data = path.read_bytes()
    outcomes: dict = {}
    broken = tmp_path / "broken.etc"
    for position in range(start, min(end, len(data))):
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        broken.write_bytes(bytes(flipped))
        try:
            etc.runtime.load(broken)
            kind = "loaded"
        except ArtifactError:
            kind = "ArtifactError"
        outcomes.setdefault(kind, []).append(position)
    return outcomes


def test_every_flipped_header_byte_is_an_artifact_error(tmp_path):
    """Every byte of the zip structures (local headers, central directory),
    flipped: ArtifactError or a kernel that loads, never another exception
    (a flipped compression method made zipfile raise NotImplementedError)."""
    _, path = _saved(tmp_path)
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        headers = [(info.header_offset, info.header_offset + 30 + len(info.filename))
                   for info in archive.infolist()]
    central = size - 22 - 46 * 2 - sum(len(n) for n in ("etc-artifact.json", "kernel.so"))
    outcomes = {}
    for start, end in headers + [(central, size)]:
        for kind, where in _flip_every_byte(path, tmp_path, start, end).items():
            outcomes.setdefault(kind, []).extend(where)
    assert set(outcomes) <= {"ArtifactError", "loaded"}, outcomes
    assert outcomes["ArtifactError"]


def test_an_edited_manifest_is_refused(tmp_path):
    """The manifest's digest covers the ABI: a shape edited by hand would
    make the code read past its arrays."""
    _, path = _saved(tmp_path)

    def widen(manifest):
        manifest["abi"]["arguments"][1]["shape"][-1] = 4096
    _rewrite(path, manifest=widen, sign=False)
    with pytest.raises(ArtifactError, match=r"the manifest does not match its checksum"):
        etc.runtime.load(path)


def test_cpu_code_for_another_platform_is_refused(tmp_path):
    _, path = _saved(tmp_path)
    _rewrite(path, manifest=lambda m: m.update(platform="linux-riscv64"))
    with pytest.raises(ArtifactError, match="CPU code for linux-riscv64"):
        etc.runtime.load(path)


_STEP_SUBPROCESS = textwrap.dedent("""
    import sys
    sys.modules["mlir"] = None
    import numpy as np
    import etc.runtime
    data = np.load(sys.argv[2])
    inputs = {name: data[name] for name in data.files}
    logits, next_ids, *_ = etc.runtime.load(sys.argv[1]).run(**inputs)
    np.save(sys.argv[3], logits)
    np.save(sys.argv[4], inputs["l0_k_cache"])
""")


def test_a_model_step_kernel_with_state_runs_from_its_artifact(tmp_path):
    """An LLM step kernel (KV caches are state arguments) saved, loaded
    without MLIR and run: the logits and the updated cache match the
    compiled kernel's."""
    from etc import models
    from etc.models.testing import write_checkpoint

    model = models.load(write_checkpoint(tmp_path / "ckpt"), workers=2, max_seq_len=16)
    kernel = model.kernels[0]
    path = tmp_path / "step.etc"
    kernel.save(path)
    assert [a.kind for a in etc.runtime.load(path).arguments].count("state") == 4
    cache = model.new_cache(2, 16)
    requests = [models.Request(0, 0, [3, 5, 7]), models.Request(1, 0, [11])]
    inputs = model.step_inputs(cache, requests)
    np.savez(tmp_path / "inputs.npz", **inputs)
    expected_logits, *_ = kernel.run(**inputs)
    script = tmp_path / "step.py"
    script.write_text(_STEP_SUBPROCESS)
    result = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "inputs.npz"),
                             str(tmp_path / "logits.npy"), str(tmp_path / "cache.npy")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected_logits, rtol=1e-5,
                               atol=1e-5)
    # The subprocess's cache started at zero too and got the same rows.
    np.testing.assert_allclose(np.load(tmp_path / "cache.npy"), inputs["l0_k_cache"], rtol=1e-5,
                               atol=1e-6)
    assert np.any(inputs["l0_k_cache"][0, :3])
