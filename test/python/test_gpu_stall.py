"""A hang inside a Hopper tile's software pipeline (`etc.ops.wgmma.Barriers`:
a lane waiting on an mbarrier whose phase never completes) is a watchdog
error naming the task, tile and barrier, not an anonymous trap: each failed
poll stalls with `event.stall`, which the schedule gives the counter buffer
and site and convert-event-to-gpu lowers with the watchdog's record write
(test/Conversion/EventToGPU/stall-to-gpu.mlir checks the lowered IR).

The fake CUDA driver runs the CPU build of a program, which simulates
barriers and cannot hang on one; the end-to-end test writes, from the fake
worker, the record the lowered stall writes, and checks that the CUDA
runtime raises it as the named `WatchdogError`. A real hang is a GPU check.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.ops import wgmma
from etc.runtime import layout
from ptxas_check import assemble, assert_no_spills, needs_ptxas

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "python" / "fake_cuda"))
import fake_driver  # noqa: E402
from test_cuda_fake import use_fake_driver  # noqa: E402


def _gemm(name: str = "gemm") -> etc.Graph:
    g = etc.Graph(name)
    x = g.input("x", (128, 128), "f16")
    wt = g.input("wt", (128, 128), "f16")
    g.output(g.matmul(x, wt, transpose_b=True))
    return g


@pytest.fixture(scope="module", params=["static", "dynamic"])
def gemm(request):
    kernel = etc.compile(_gemm(), target="cuda", chip="sm_90a", schedule=request.param)
    assert "_tile_matmul_wgmma_" in kernel.ir("graph")
    return kernel


def test_every_barrier_wait_stalls_with_its_site(gemm):
    """The tile function's full and empty waits stall; the schedule gives
    the tile function the counter buffer, the task index and the tile as
    arguments, which every stall in it names, and the worker passes them."""
    tile = re.search(r"func\.func private @gemm_tile_matmul_wgmma_\d+\(", gemm.ir("graph"))
    graph_body = gemm.ir("graph")[tile.start():]
    assert 'event.stall "full"' in graph_body and " on %" not in graph_body.split("return")[0]
    scheduled = gemm.ir("scheduled")
    name = tile.group(0).split("@")[1][:-1]
    body = scheduled[scheduled.index(f"func.func private @{name}("):]
    body = body[:body.find("func.func", 1)]
    stalls = re.findall(r'event\.stall "(\w+)" .*', body)
    assert set(stalls) == {"full", "empty"}, stalls
    assert all(" on %" in s and " site(%" in s
               for s in re.findall(r"event\.stall .*", body))
    worker = scheduled[scheduled.index("func.func @gemm_worker("):]
    assert re.search(rf"func\.call @{name}\(.*memref<\?xi32>, i32, i32, i32\) -> \(\)",
                     worker)
    assert "event.stall" not in gemm.ir("lowered")


@needs_ptxas
def test_the_stalls_do_not_trap_and_assemble_without_spills(gemm, tmp_path):
    """The waits poll `mbarrier.try_wait.parity` and report through the
    watchdog; nothing traps any more, and ptxas still assembles the worker
    (the tile inlined) with no spills or stack."""
    ptx = gemm.ptx
    assert "mbarrier.try_wait.parity.shared.b64" in ptx
    assert "trap;" not in ptx
    report = assemble(ptx, "sm_90a", tmp_path, "gemm")
    assert_no_spills(report, stack=True)
    registers = re.search(r"Compiling entry function 'gemm_worker'.*?Used (\d+) registers",
                          report, re.S).group(1)
    print(f"gemm_worker: {registers} registers")


def test_barriers_need_a_role():
    with pytest.raises(ValueError, match=r"role='half': a tile's barriers are one of"):
        wgmma.Barriers(None, 2, 1, role="half")


def _record(counters: np.ndarray, worker: int, task: int, tile: tuple, element: tuple,
            value: int, waited_ms: int) -> None:
    """The error record the lowered `event.stall` writes when its wait
    outlives the watchdog (`__etc_watchdog_report`, site kind barrier)."""
    header = layout.header(counters)
    header[layout.CLAIM_WORD] = 1
    header[layout.WORKER_WORD] = worker
    header[layout.SITE_WORD] = layout.SITE_BARRIER
    header[layout.TASK_WORD] = task
    header[layout.TILE_RANK_WORD] = len(tile)
    header[layout.TILE_WORDS:layout.TILE_WORDS + len(tile)] = tile
    header[layout.EVENT_WORD] = -1
    header[layout.ELEMENT_RANK_WORD] = len(element)
    header[layout.ELEMENT_WORDS:layout.ELEMENT_WORDS + len(element)] = element
    header[layout.VALUE_WORD] = value - (1 << 32) if value >= 1 << 31 else value  # the i32 word
    header[layout.WAITED_MS_WORD] = waited_ms
    header[layout.STATUS_WORD] = layout.WATCHDOG


def test_a_hung_barrier_is_a_named_watchdog_error(monkeypatch):
    """A run whose full barrier of stage 1 never completed for parity 0 in
    tile (0, 1) of the GEMM: the CUDA runtime reads the record from the
    counter buffer and raises WatchdogError naming all of it."""
    graph = _gemm("hung")
    kernel = etc.compile(graph, target="cuda", chip="sm_90a")
    cpu = etc.compile(graph, target="cpu", workers=fake_driver.SMS)
    use_fake_driver(monkeypatch, kernel, cpu)
    (task,) = [i for i, t in enumerate(kernel.abi.tasks) if t.grid_rank == 2]
    name = kernel.abi.tasks[task].name
    runtime = cpu.runtime
    worker = runtime._functions["worker"]

    def hung(*args):
        worker(*args)
        *_, counters, w, _grid = args
        if w == 1:
            words = ctypes.cast(counters, ctypes.POINTER(ctypes.c_int64))
            aligned, size = words[1], words[3]
            buffer = np.ctypeslib.as_array((ctypes.c_int32 * size).from_address(aligned))
            _record(buffer, worker=1, task=task, tile=(0, 1), element=(1, layout.BARRIER_FULL, 0),
                    value=0x80000001, waited_ms=5000)
    monkeypatch.setitem(runtime._functions, "worker", hung)
    x = np.ones((128, 128), np.float16)
    with pytest.raises(layout.WatchdogError) as caught:
        kernel.run(x=x, wt=x)
    error = caught.value
    assert (error.site, error.task, error.tile, error.element, error.worker) == \
        ("barrier", name, (0, 1), (1, "full", 0), 1)
    assert error.event is None and error.waited == 5.0
    message = str(error)
    assert f"task {name} tile (0, 1) waited 5.0 s on the full barrier of stage 1 for parity 0" \
        in message, message
    assert "barrier state 0x80000001" in message, message


def test_the_empty_role_and_an_unknown_task_read_back():
    """The host side alone: the empty role, and a record without a task."""
    abi = etc.compile(_gemm("roles"), target="cuda", chip="sm_90a").abi
    counters = np.zeros(layout.HEADER_WORDS + 4, np.int32)
    _record(counters, worker=3, task=-1, tile=(), element=(0, layout.BARRIER_EMPTY, 1),
            value=7, waited_ms=250)
    with pytest.raises(layout.WatchdogError,
                       match=r"worker 3 waited 0\.2 s on the empty barrier of stage 0 "
                             r"for parity 1") as caught:
        layout.check_header(abi, layout.header(counters))
    assert caught.value.element == (0, "empty", 1) and caught.value.task is None
