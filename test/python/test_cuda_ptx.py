"""PTX from the CUDA pipeline, checked without a GPU: every operator graph
lowers to PTX that `ptxas` assembles, the synchronisation is what the design
says (GPU-scope release before the counter decrement, acquire polling with
nanosleep, CTA barriers), and the kernels take MLIR's memref parameters."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import etc
from test_cpu_runtime import OPERATORS, _graph, _mlp

PTXAS = shutil.which("ptxas")
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="ptxas (CUDA toolkit) is not on PATH")


def _assemble(ptx: str, arch: str, tmp_path) -> None:
    source = tmp_path / f"kernel_{arch}.ptx"
    source.write_text(ptx)
    result = subprocess.run([PTXAS, f"-arch={arch}", str(source), "-o", str(tmp_path / f"k_{arch}.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"ptxas -arch={arch} rejected the PTX:\n{result.stderr}"


def _entry(ptx: str, name: str) -> str:
    """The text of `.entry name(...) { ... }`."""
    start = ptx.index(f".entry {name}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start:] if end < 0 else ptx[start:end]


def _function(ptx: str, name: str) -> str:
    """The text of the definition of device function `name` (not its
    forward declaration)."""
    for match in re.finditer(rf"\.func\s+(?:\([^)]*\)\s*)?{name}\(", ptx):
        close = ptx.index(")", match.end())
        if ptx[close + 1:].lstrip().startswith("{"):
            return ptx[match.start():ptx.index("\n}\n", close)]
    raise AssertionError(f"the PTX defines no function {name}")


def _check_worker_synchronisation(ptx: str, name: str, schedule: str) -> None:
    worker = _entry(ptx, f"{name}_worker")
    assert "bar.sync" in worker
    # Notify: a GPU-scope release fence right before the decrement.
    assert re.search(r"fence\.acq_rel\.gpu;\s*atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\], -1;", worker), worker
    # Wait: an acquire load at GPU scope inline; when the element is not
    # ready, the out-of-line spin polls, sleeping between polls, bounded by
    # the watchdog (%globaltimer).
    assert "ld.acquire.gpu" in worker
    spin = "__etc_spin_slot" if schedule == "dynamic" else "__etc_spin_counter"
    assert re.search(rf"call\.uni \(retval0\),\s*{spin},", worker), worker
    body = _function(ptx, spin)
    assert "ld.acquire.gpu" in body and "nanosleep.u32" in body and "%globaltimer" in body
    # The tile bodies (device functions, or inlined) run on the CTA's
    # threads; static workers are the blocks (dynamic ones take tasks from
    # the queue instead).
    assert "%tid.x" in ptx
    if schedule == "static":
        assert "%ctaid.x" in worker and "%nctaid.x" in worker


@needs_ptxas
@pytest.mark.parametrize("kind", OPERATORS)
def test_every_operator_assembles_for_sm_90a(kind, tmp_path):
    g, _ = _graph(kind)
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    ptx = kernel.ptx
    assert ".target sm_90a" in ptx and ".version 8.0" in ptx
    for entry in ("counters", "init", "worker", "check"):
        assert f".entry {g.name}_{entry}(" in ptx
    # Every function is in the module: no unresolved calls (libdevice).
    assert ".extern" not in ptx
    _assemble(ptx, "sm_90a", tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip, version", [("sm_80", "7.0"), ("sm_90a", "8.0")])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_mlp_assembles_with_the_expected_atomics(chip, version, schedule, tmp_path):
    g = _mlp()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule)
    ptx = kernel.ptx
    assert f".version {version}" in ptx and f".target {chip}" in ptx
    _check_worker_synchronisation(ptx, g.name, schedule)
    _assemble(ptx, chip, tmp_path)


def test_dynamic_worker_broadcasts_popped_tasks_through_shared_memory():
    g = _mlp()
    ptx = etc.compile(g, target="cuda", schedule="dynamic").ptx
    worker = _entry(ptx, f"{g.name}_worker")
    assert re.search(r"\.shared \.align 4 \.u32 \S+;", ptx)
    assert "st.shared.b32" in worker and "ld.shared.b32" in worker
    # Published slots are release stores; popping claims the head atomically.
    assert "st.release.gpu" in worker
    assert "atom.global.add.u32" in worker


def test_kernel_parameters_follow_the_memref_descriptor_expansion():
    # One index symbol, then the buffer table (a rank-1 memref: 5 64-bit
    # parameters); the counter buffer is one more rank-1 memref, the
    # counters result another. Buffers do not add parameters.
    g = etc.Graph("params")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    g.output(g.scale(x, 2.0))
    ptx = etc.compile(g, target="cuda").ptx
    symbols = [a for a in g.arguments if a.kind == "symbol"]
    graph_params = len(symbols) + 5
    for entry, extra in [("counters", 5), ("init", 5), ("worker", 5), ("check", 10)]:
        params = re.findall(r"\.param \.u64[^,)]*params_" + entry + r"_param_\d+", _entry(ptx, f"params_{entry}"))
        assert len(params) == graph_params + extra, (entry, params)


def test_chip_selects_the_ptx_isa_version():
    pipeline = etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_80"))
    assert pipeline == "builtin.module(etc-lower-to-nvvm{chip=sm_80 features=+ptx70 watchdog-ms=5000})"
    pipeline = etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_90a"))
    assert pipeline == "builtin.module(etc-lower-to-nvvm{chip=sm_90a features=+ptx80 watchdog-ms=5000})"
    with pytest.raises(ValueError, match=r"chip='sm_60' is not supported on target='cuda'"):
        etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_60"))


def test_ptx_is_only_for_cuda():
    g, _ = _graph("add")
    kernel = etc.compile(g, target="cpu", workers=1)
    with pytest.raises(AttributeError, match=r"kernel.ptx exists for target='cuda'"):
        kernel.ptx


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_watchdog_and_traces_assemble(chip, schedule, tmp_path):
    g = _mlp()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule, trace=True)
    ptx = kernel.ptx
    worker = _entry(ptx, f"{g.name}_worker")
    # Trace records: %globaltimer in the worker itself.
    assert "%globaltimer" in worker
    # The first spin to time out claims the record (an atomic increment of
    # the claim word) and publishes it with a release (fence, relaxed store).
    report = _function(ptx, "__etc_watchdog_report")
    assert re.search(r"atom(\.global)?\.add\.u32\s+%r\d+, \[%rd\d+\+4\], 1;", report), report
    assert re.search(r"fence\.acq_rel\.gpu;\s*st\.relaxed\.gpu(\.global)?\.b32\s+\[%rd\d+\], 1;",
                     report), report
    _assemble(ptx, chip, tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_hundreds_of_buffers_assemble(chip, tmp_path):
    """No parameter ceiling: 321 buffers reach the kernels through the buffer
    table, so each kernel takes a handful of parameters."""
    g = etc.Graph("many")
    B = g.symbol("B")
    y = g.input("x", (B, 32), "f32")
    for i in range(160):
        y = g.add(y, g.input(f"w{i}", (B, 32), "f32"))
    g.output(y)
    assert sum(a.kind != "symbol" for a in g.arguments) == 321
    kernel = etc.compile(g, target="cuda", chip=chip)
    for entry in ("counters", "init", "worker", "check"):
        text = _entry(kernel.ptx, f"many_{entry}")
        assert text[:text.index(")")].count(".param ") <= 16
    _assemble(kernel.ptx, chip, tmp_path)
