"""Threads per worker CTA from compile to launch: `etc.compile(...,
lanes=N, min_ctas=M)` builds the CUDA tiles for N lanes
(`Target.lanes`), the worker carries `.maxntid N` (and `.minnctapersm M`),
the ABI records N (artifact format 6; a format-5 artifact, which has no
field, reads as 128) and the CUDA runtime launches N threads per worker
CTA. The fake CUDA driver refuses a worker launched with another block
size than its PTX's `.maxntid`, so each launch below is checked by it."""

from __future__ import annotations

import json
import re
import zipfile

import numpy as np
import pytest

import etc
import etc.pipeline
from etc.runtime import artifact, cuda
from etc.runtime.abi import KernelABI
from test_cuda_fake import _graph, use_fake_driver

X, Z = np.ones((3, 64), np.float32), np.full((3, 64), 0.5, np.float32)


@pytest.fixture(scope="module")
def cpu_build():
    """The CPU build of the axpy program the fake driver runs launches on."""
    return etc.compile(_graph(), target="cpu", workers=2)


def _worker_blocks(monkeypatch) -> list:
    """The block size of each worker launch from here on."""
    blocks = []
    launch = cuda.CUDARuntime._launch

    def spy(self, kernel, shape, *args, **kwargs):
        if kernel.name.endswith("_worker"):
            blocks.append(shape[1])
        return launch(self, kernel, shape, *args, **kwargs)
    monkeypatch.setattr(cuda.CUDARuntime, "_launch", spy)
    return blocks


def _run(kernel) -> None:
    y, = kernel.run(x=X, z=Z)
    np.testing.assert_array_equal(np.asarray(y), np.full((3, 64), 2.5, np.float32))


def _maxntid(ptx: str) -> str:
    return re.search(r"\.entry axpy_worker\([^)]*\)\s*(\.maxntid [\d, ]+)", ptx).group(1)


def test_lanes_reach_the_abi_the_ptx_and_the_launch(monkeypatch, cpu_build, tmp_path):
    """Compiled with lanes=256: the ABI says 256, the worker's PTX has
    `.maxntid 256, 1, 1`, and the runtime launches 256 threads per CTA,
    also after a save and load."""
    kernel = etc.compile(_graph(), target="cuda", lanes=256)
    assert kernel.abi.lanes == 256 and kernel.runtime.lanes == 256
    assert _maxntid(kernel.ptx) == ".maxntid 256, 1, 1"
    assert ".minnctapersm" not in kernel.ptx
    blocks = _worker_blocks(monkeypatch)
    use_fake_driver(monkeypatch, kernel, cpu_build)
    _run(kernel)
    kernel.save(tmp_path / "axpy.etc")
    loaded = etc.runtime.load(tmp_path / "axpy.etc")
    assert loaded.abi.lanes == 256
    use_fake_driver(monkeypatch, loaded, cpu_build)
    _run(loaded)
    assert blocks == [256, 256]


def test_default_lanes_are_128(monkeypatch, cpu_build):
    kernel = etc.compile(_graph(), target="cuda")
    # No bounds at 128: `.maxntid 128` alone made ptxas cap the worker at
    # 128 registers (the fake driver holds such a worker to 128 threads).
    assert kernel.abi.lanes == 128 and ".maxntid" not in kernel.ptx
    blocks = _worker_blocks(monkeypatch)
    use_fake_driver(monkeypatch, kernel, cpu_build)
    _run(kernel)
    assert blocks == [128]


def test_min_ctas_bounds_the_worker():
    kernel = etc.compile(_graph(), target="cuda", lanes=256, min_ctas=2)
    assert re.search(r"\.entry axpy_worker\([^)]*\)\s*\.maxntid 256, 1, 1\s*\.minnctapersm 2\s*\{",
                     kernel.ptx)
    # Only the worker: the other kernels have launch shapes of their own.
    assert kernel.ptx.count(".maxntid") == 1 and kernel.ptx.count(".minnctapersm") == 1


def _rewrite(path, edit) -> None:
    """The artifact at `path` with its manifest edited and signed again."""
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    manifest = json.loads(members[artifact.MANIFEST])
    edit(manifest)
    manifest["sha256"] = artifact._manifest_digest(manifest)
    members[artifact.MANIFEST] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _format_5(manifest) -> None:
    """What format 5 wrote: no lanes."""
    manifest["version"] = 5
    del manifest["abi"]["lanes"]


def test_an_artifact_without_lanes_launches_128(monkeypatch, cpu_build, tmp_path):
    """A format-5 artifact (no `lanes`: every kernel was compiled for 128)
    loads and launches 128 threads per CTA."""
    path = tmp_path / "old.etc"
    etc.compile(_graph(), target="cuda").save(path)
    _rewrite(path, _format_5)
    loaded = etc.runtime.load(path)
    assert loaded.abi.lanes == 128 and loaded.runtime.lanes == 128
    blocks = _worker_blocks(monkeypatch)
    use_fake_driver(monkeypatch, loaded, cpu_build)
    _run(loaded)
    assert blocks == [128]


def test_a_worker_launched_with_other_lanes_than_its_ptx_is_refused(monkeypatch, cpu_build,
                                                                    tmp_path):
    """The fake driver holds the launch to the worker's `.maxntid`: a
    256-lane program whose ABI lost its lanes (read as 128) is refused, as
    is the runtime told 128 for it."""
    path = tmp_path / "wide.etc"
    etc.compile(_graph(), target="cuda", lanes=256).save(path)
    _rewrite(path, _format_5)
    loaded = etc.runtime.load(path)
    driver = use_fake_driver(monkeypatch, loaded, cpu_build)
    with pytest.raises(RuntimeError, match=r"axpy_worker, grid=\d+, block=128.*INVALID_VALUE"):
        loaded.run(x=X, z=Z)
    assert "written for 256 threads per CTA, launched with 128" in driver.why()


def test_the_runtime_refuses_other_lanes_than_the_abis():
    kernel = etc.compile(_graph(), target="cuda", lanes=256)
    with pytest.raises(ValueError, match="written for 256 threads per CTA"):
        cuda.CUDARuntime(kernel.abi, kernel.ptx, lanes=128)
    assert cuda.CUDARuntime(kernel.abi, kernel.ptx, lanes=256).lanes == 256


@pytest.mark.parametrize("options, message", [
    ({"target": "cuda", "lanes": 100}, "lanes=100 must be a multiple of 32"),
    ({"target": "cuda", "lanes": 2048}, "at most 1024"),
    ({"target": "cuda", "lanes": 0}, "lanes=0 must be a positive integer"),
    ({"target": "cuda", "lanes": True}, "lanes=True must be a positive integer"),
    ({"target": "cuda", "min_ctas": 0}, "min_ctas=0 must be a positive integer"),
    ({"target": "cuda", "lanes": 1024, "min_ctas": 3}, "exceed the 2,048 threads"),
    ({"target": "cpu", "lanes": 256}, "lanes=256 applies to CUDA kernels"),
    ({"target": "cpu", "min_ctas": 2}, "min_ctas=2 applies to CUDA kernels"),
])
def test_bad_lanes_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        etc.compile(_graph(), workers=2, **options)


def test_the_lowering_pipeline_carries_the_bounds():
    options = etc.pipeline.Options(target="cuda", lanes=256, min_ctas=2)
    assert etc.pipeline.lowering_pipeline(options).endswith(
        "watchdog-ms=5000 lanes=256 min-ctas=2})")
    target = options.kernel_target()
    assert (target.lanes, target.min_ctas, target.entry_registers) == (256, 2, 128)
    simulated = etc.pipeline.Options(target="cpu", kernels="cuda", lanes=256).kernel_target()
    assert simulated.simulate_lanes and simulated.lanes == 256


def test_abi_lanes_round_trip_and_are_checked():
    abi = etc.compile(_graph(), target="cuda", lanes=512).abi
    data = abi.to_json()
    assert data["lanes"] == 512 and KernelABI.from_json(data).lanes == 512
    del data["lanes"]
    assert KernelABI.from_json(data).lanes == 128
    with pytest.raises(ValueError, match="lanes=48 is not a positive multiple of 32"):
        KernelABI.from_json({**data, "lanes": 48})


def test_the_compile_cache_key_follows_the_lanes():
    """A model's step kernel compiled at other lanes, or warp-specialised,
    is another cache entry; 128 lanes said or not are the same one."""
    import etc.models as models
    from etc.models.step import kernel_cache
    from etc.models.testing import tiny_config
    from etc.ops.matmul_wgmma import tma_loads, warp_specialised

    config = models.ModelConfig.from_dict(tiny_config("Qwen3ForCausalLM"))
    graph, compile = models.step_options(config, target="cuda", max_seq_len=32)

    def key(**changes):
        return kernel_cache.key_of(kernel_cache.describe(config, graph, {**compile, **changes}))

    base = key()
    assert key(lanes=128) == base
    with tma_loads():
        tma = key(lanes=256, min_ctas=2)
        with warp_specialised():
            ws = key(lanes=256, min_ctas=2)
    assert len({base, key(lanes=256), key(lanes=256, min_ctas=2), tma, ws}) == 5
