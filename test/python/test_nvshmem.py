"""CUDA programs on several ranks, without a GPU: the PTX calls NVSHMEM's
device API and links with its device library (ptxas and nvlink), the
NVSHMEM host runtime and artifacts, and two MPI processes running such
programs on the fake CUDA driver and fake NVSHMEM (test/python/fake_cuda),
which hold them to NVSHMEM's rules."""

import importlib
import json
import re
import shutil

import pytest

import mpi4py  # noqa: F401,E402  (a test dependency: a broken import fails)

import etc  # noqa: E402
from etc.runtime import artifact, distributed, nvshmem  # noqa: E402
from mpi_ranks import gather_graph, launch  # noqa: E402


@pytest.mark.skipif(not (shutil.which("ptxas") and shutil.which("nvlink")),
                    reason="needs ptxas and nvlink (CUDA toolkit) on PATH")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_nvshmem_ptx_assembles_and_links(chip, schedule, tmp_path):
    """The CUDA program of a graph on two ranks calls NVSHMEM's device API
    (row puts, the remote atomic notify after a quiet, the PE), assembles
    as relocatable code and links with NVSHMEM's device library (its
    bitcode from the wheel, compiled for the chip) into a cubin, under
    both schedules. Both poll the symmetric elements with relaxed loads
    and acquire with a fence at system scope (other GPUs notify them): the
    static schedule's waits (spinning out of line in
    __etc_spin_counter_system), the dynamic schedule's polling worker,
    which backs off with nanosleep."""
    g, _ = gather_graph()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule)
    ptx = kernel.ptx
    for call in ("nvshmem_my_pe", "nvshmem_quiet", "nvshmem_int_atomic_add",
                 "nvshmemx_putmem_nbi_block"):
        assert re.search(rf"\.extern \.func .*{call}", ptx), call
    assert re.search(r"ld\.relaxed\.sys\.(global\.)?[bu]32", ptx)
    assert "fence.acq_rel.sys" in ptx
    if schedule == "static":
        assert re.search(r"\.func .*__etc_spin_counter_system\(", ptx)
    else:
        assert "nanosleep.u32" in ptx
    cubin = distributed.link_nvshmem(ptx, chip, str(tmp_path))
    assert cubin[:4] == b"\x7fELF"
    # What the runtime links with at load (and saves in the artifact).
    library = kernel.runtime.library_ptx
    assert re.search(r"\.visible \.const .* nvshmemi_device_state_d\[", library)
    for call in ("nvshmem_quiet", "nvshmem_int_atomic_add", "nvshmemx_putmem_nbi_block"):
        assert re.search(rf"\.visible \.func .*\b{call}\(", library), call


# ----------------------------------------------------------------------
# The NVSHMEM host runtime (CUDA on several ranks), without a GPU


def test_symmetric_layout():
    """The counters come first, each intermediate at the next multiple of
    256 bytes, whatever its size; the layout depends on the sizes only."""
    offsets, total = nvshmem.symmetric_layout(10, [("g", 4096), ("staging", 1), ("empty", 0)])
    assert offsets == {"g": 256, "staging": 256 + 4096, "empty": 256 + 4096 + 256}
    assert total == 256 + 4096 + 256 + 256
    assert all(offset % nvshmem.SYMMETRIC_ALIGNMENT == 0 for offset in offsets.values())
    assert nvshmem.symmetric_layout(65, []) == ({}, 512)
    with pytest.raises(ValueError, match="counter_count=0"):
        nvshmem.symmetric_layout(0, [])


def test_nvshmem_runtime_without_a_device():
    """A CUDA kernel on several ranks compiles with the NVSHMEM runtime,
    which touches nothing until it runs; binding it for enqueueing is
    refused (runs meet the other ranks on the host), and without
    nvshmem4py the host library's absence is named with what to install."""
    g, _ = gather_graph()
    kernel = etc.compile(g, target="cuda", chip="sm_80", schedule="dynamic")
    assert isinstance(kernel.runtime, nvshmem.NVSHMEMRuntime)
    assert kernel.runtime.ranks == 2 and kernel.runtime.comm is None
    with pytest.raises(NotImplementedError, match="cannot be bound .* call run"):
        kernel.runtime.bind({})
    try:
        importlib.import_module("nvshmem.bindings")
    except ImportError:
        with pytest.raises(RuntimeError, match=r"nvshmem4py-cu13==0\.4\.1"):
            nvshmem._bindings()


def test_nvshmem_artifact_carries_the_device_library(tmp_path):
    """A saved CUDA kernel on several ranks holds NVSHMEM's device library
    PTX beside its own (checked by its digest) and loads on the NVSHMEM
    runtime; one without it, or with a damaged one, is refused."""
    g, _ = gather_graph()
    kernel = etc.compile(g, target="cuda", chip="sm_80")
    library = b"// NVSHMEM's device library stands here\n"
    path = tmp_path / "ag.etc"
    artifact.write(path, kernel.abi, kernel.ptx.encode(), library=library)
    loaded = etc.runtime.load(path)
    assert isinstance(loaded.runtime, nvshmem.NVSHMEMRuntime)
    assert loaded.runtime.library_ptx == library.decode()
    loaded.save(tmp_path / "again.etc")
    assert etc.runtime.load(tmp_path / "again.etc").runtime.library_ptx == library.decode()
    with pytest.raises(ValueError, match="needs NVSHMEM's device library"):
        artifact.write(tmp_path / "none.etc", kernel.abi, kernel.ptx.encode())
    data = path.read_bytes().replace(b"stands here", b"stands HERE")
    (tmp_path / "damaged.etc").write_bytes(data)
    with pytest.raises(artifact.ArtifactError, match=r"is damaged: .*(nvshmem\.ptx|device library)"):
        etc.runtime.load(tmp_path / "damaged.etc")


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_nvshmem_runtime_on_the_fake_driver(schedule, tmp_path):
    """Two MPI processes run CUDA programs on several ranks through the
    NVSHMEM runtime on the fake CUDA driver and fake NVSHMEM: bootstrap,
    symmetric block, link, module initialisation, meetings and checks as
    on GPUs, the kernels played by the CPU build of the same program over
    an MPI window, every put held until its CTA's flush; all_gather +
    matmul and matmul + reduce_scatter match NumPy, also saved and loaded,
    and on a non-blocking stream with a new symmetric block (whose zeroing
    once raced with the stream's g_init). A program without the quiet
    before its notifies (flushes that deliver nothing) faults, saying that
    the notify overtook the puts."""
    result, output = launch(2, "nvshmem_fake.py", schedule, env_extra={"ETC_TEST_DIR": str(tmp_path)})
    assert result.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: nvshmem fake: 6 checks passed" in output, output
        assert f"rank {rank}: without quiet: RuntimeError: kernel execution (ag_mm_worker) " \
            "failed: CUDA_ERROR_LAUNCH_FAILED" in output, output
    assert "puts of the same CTA to that rank were not completed (no nvshmem_quiet between " \
        "them): the notify may overtake the data" in output, output


def test_fake_nvshmem_holds_the_program_to_nvshmem_rules(tmp_path):
    """The fake NVSHMEM refuses what NVSHMEM on GPUs would trip over: a
    collective whose source or destination is private memory or runs past
    its symmetric block, a second free, a put outside the heap, a notify
    that overtakes its CTA's puts and puts never completed; and a
    collective on a non-blocking stream has not run when its result is
    read without waiting for the stream (the old values come back, and the
    wait then reports the race)."""
    result, output = launch(2, "nvshmem_fake.py", "static", "rules",
                             env_extra={"ETC_TEST_DIR": str(tmp_path)})
    assert result.returncode == 0, output
    symmetric = "does not lie in one block of the symmetric heap"
    for rank in range(2):
        said = json.loads((tmp_path / f"rules-{rank}.json").read_text())
        for what in ("fcollect from private memory", "fcollect into private memory",
                     "reduce-scatter past its block"):
            assert said[what].startswith("NvshmemError: ") and symmetric in said[what], said
        assert "freed already" in said["a second free"], said
        assert said["a put outside the heap"] == "status 12", said
        violations = said["violations"]
        assert len(violations) == 3, violations
        assert "a put of 16 bytes" in violations[0] and \
            "outside every block of the symmetric heap" in violations[0]
        assert "a notify of rank" in violations[1] and \
            "not completed (no nvshmem_quiet between them)" in violations[1]
        assert "the worker ended with 1 puts never completed" in violations[2]
        ones, twos = [1] * 8, [2] * 8
        assert said["after the stream"] == ones + twos, said
        assert said["without waiting"] == ones + twos, said  # not 7s and 14s yet
        assert said["the wait after the early read"].startswith(
            "RaceError: fake CUDA driver: a race: cuMemcpyDtoH on the legacy stream and "
            "nvshmemx_bfloat16_fcollect_on_stream"), said

