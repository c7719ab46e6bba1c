"""The fake CUDA driver (test/python/fake_cuda) is as strict as the driver:
for each rule, the wrong use it refuses, with the error the driver gives,
and where the runtime could make the mistake, a mutation of the runtime's
call sequence that it catches; and the runtime bugs the strict fake found,
each with the test that failed before its fix."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.runtime import cuda, cuda_arrays, layout
from etc.runtime.cuda_launch import Launch, _Parameters
from etc.runtime.ranges import IndexRangeError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "python" / "fake_cuda"))
import fake_driver  # noqa: E402
import fake_kernels  # noqa: E402
from cuda.bindings import driver as real  # noqa: E402  (imported before any fake is installed)
from test_cuda_fake import _graph  # noqa: E402
from test_cuda_runtime import _CAIArray  # noqa: E402

SUCCESS = real.CUresult.CUDA_SUCCESS
X, Z = np.ones((3, 64), np.float32), np.full((3, 64), 0.5, np.float32)


@pytest.fixture(scope="module")
def compiled():
    graph = _graph()
    return etc.compile(graph, target="cuda"), etc.compile(graph, target="cpu",
                                                          workers=fake_driver.SMS)


def _use(monkeypatch, driver) -> None:
    """Makes the runtime (device arrays too) find `driver`."""
    monkeypatch.setattr(cuda, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_arrays, "_driver", lambda: driver)


@pytest.fixture
def fake(monkeypatch, compiled):
    """A fresh driver (a fault is sticky) running the axpy graph."""
    kernel, cpu = compiled
    driver = fake_driver.build({hashlib.sha256(kernel.ptx.encode()).hexdigest(): cpu})
    _use(monkeypatch, driver)
    kernel.runtime._driver = None
    kernel.runtime._workspaces.clear()
    return kernel, driver


def ok(driver, result):
    return cuda._check(driver, "the call", result)


def refused(driver, result, code: str, why: str = "") -> None:
    assert real.CUresult(result[0]).name == code, (result, driver.why())
    assert why in driver.why(), driver.why()


def non_blocking(driver):
    return ok(driver, driver.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING, as PyTorch's


# ---------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------

def test_handles_are_cuda_bindings_types(fake):
    """What the driver returns are cuda-bindings' handle types, which are
    not ints: `+`, `&` and `==` with an int do not work on them."""
    kernel, driver = fake
    kernel.run(x=X, z=Z)
    pointer = ok(driver, driver.cuMemAlloc(64))
    assert isinstance(pointer, real.CUdeviceptr)
    with pytest.raises(TypeError):
        pointer + 8
    assert isinstance(ok(driver, driver.cuStreamCreate(0)), real.CUstream)
    assert isinstance(ok(driver, driver.cuEventCreate(0)), real.CUevent)
    assert isinstance(kernel.runtime._module, real.CUmodule)
    assert isinstance(kernel.runtime._worker.function, real.CUfunction)
    stream = ok(driver, driver.cuStreamCreate(0))
    launch = kernel.runtime.bind({"x": X, "z": Z})  # allocates: not during a capture
    ok(driver, driver.cuStreamBeginCapture(stream, 0))
    launch.enqueue(stream)
    graph = ok(driver, driver.cuStreamEndCapture(stream))
    assert isinstance(graph, real.CUgraph)
    executable = ok(driver, driver.cuGraphInstantiate(graph, 0))
    assert isinstance(executable, real.CUgraphExec)
    refused(driver, driver.cuGraphLaunch(graph, stream), "CUDA_ERROR_INVALID_HANDLE")


def test_handles_the_driver_did_not_make_are_refused(fake):
    kernel, driver = fake
    kernel.run(x=X, z=Z)
    stranger = real.CUstream(0x5150)
    refused(driver, driver.cuStreamSynchronize(stranger), "CUDA_ERROR_INVALID_HANDLE")
    refused(driver, driver.cuEventRecord(real.CUevent(0x5150), 0), "CUDA_ERROR_INVALID_HANDLE")
    refused(driver, driver.cuLaunchKernel(real.CUfunction(0x5150), 1, 1, 1, 1, 1, 1, 0, 0, 0, 0),
            "CUDA_ERROR_INVALID_HANDLE")
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_HANDLE"):
        kernel.run(x=X, z=Z, stream=stranger)


def test_launch_parameters_may_be_handles():
    """The GPU kit's probe passes cuMemAlloc's CUdeviceptr as a kernel
    parameter; `_Parameters` did `word & mask` on it, a TypeError on every
    real GPU (the fake's plain ints hid it)."""
    parameters = _Parameters([real.CUdeviceptr(0x7F0000001000), 5])
    words = ctypes.cast(parameters.pointer_array(), ctypes.POINTER(ctypes.c_void_p))
    assert [ctypes.c_uint64.from_address(words[i]).value for i in range(2)] == [
        0x7F0000001000, 5]


# ---------------------------------------------------------------------------
# Parameters as the PTX declares them
# ---------------------------------------------------------------------------

def test_parameter_lists_come_from_the_ptx(compiled):
    from etc.runtime import probes

    kernel, _ = compiled
    sizes = fake_kernels.entries(kernel.ptx)
    # One symbol, then 5 words per memref: the table and the counters (or
    # the result), and g_check's result too.
    assert {name: len(s) for name, s in sizes.items()} == {
        "axpy_counters": 11, "axpy_init": 11, "axpy_worker": 11, "axpy_check": 16}
    assert all(size == 8 for s in sizes.values() for size in s)
    assert fake_kernels.entries(probes.PTX) == {"etc_spin": [8], "etc_probe_sm": [8, 8],
                                                "etc_probe_timer": [8, 4]}


def test_each_parameter_is_read_with_its_declared_size(fake):
    """The driver copies as many bytes as the PTX declares from where each
    kernelParams[i] points: 4 for etc_probe_timer's `.u32 n`, 8 for
    etc_spin's `.u64 ns`. A value on the last 4 bytes before an unmapped
    page passes as the first and is refused as the second."""
    from etc.runtime import probes

    _, driver = fake
    module, _ = cuda.load_module(driver, probes.PTX)
    timer = ok(driver, driver.cuModuleGetFunction(module, b"etc_probe_timer"))
    spin = ok(driver, driver.cuModuleGetFunction(module, b"etc_spin"))
    pages = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(pages))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0  # PROT_NONE
    try:
        last = base + mmap.PAGESIZE - 4
        ctypes.c_uint32.from_address(last).value = 3
        out = ok(driver, driver.cuMemAlloc(8 * 3))
        address = ctypes.c_uint64(int(out))
        params = (ctypes.c_void_p * 2)(ctypes.addressof(address), last)
        ok(driver, driver.cuLaunchKernel(timer, 1, 1, 1, 1, 1, 1, 0, 0,
                                         ctypes.addressof(params), 0))
        ok(driver, driver.cuCtxSynchronize())
        one = (ctypes.c_void_p * 1)(last)
        refused(driver, driver.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0,
                                              ctypes.addressof(one), 0),
                "CUDA_ERROR_INVALID_VALUE", "kernelParams[0]")
    finally:
        libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, 3)  # PROT_READ | PROT_WRITE
        pages.close()


def test_a_launch_missing_a_parameter_is_refused(fake, monkeypatch):
    """Mutation: g_check given its symbol, table and counters but not its
    result memref (11 of its 16 words). The driver reads 16 pointers whatever the
    caller's array holds; here the array ends in a NULL, so the read past
    its end is refused rather than garbage."""
    kernel, driver = fake

    class Terminated(_Parameters):
        def __init__(self, words):
            super().__init__(list(words))
            self._array = (ctypes.c_void_p * (len(self._values) + 1))(
                *[ctypes.addressof(v) for v in self._values], None)

    words = Launch._words
    monkeypatch.setattr("etc.runtime.cuda_launch._Parameters", Terminated)
    monkeypatch.setattr(Launch, "_words", lambda self, *extra: words(self, *extra[:1]))
    with pytest.raises(RuntimeError, match=r"cuLaunchKernel\(axpy_check.*CUDA_ERROR_INVALID_VALUE"):
        kernel.run(x=X, z=Z)
    assert "kernelParams[11] (0x0) is not readable host memory: the kernel has 16" in driver.why()


# ---------------------------------------------------------------------------
# Launch shapes: the ABI's
# ---------------------------------------------------------------------------

def test_the_fakes_worker_lanes_are_the_compilers():
    from etc.ops.base import Target

    assert fake_kernels.WORKER_LANES == Target().lanes == cuda.DEFAULT_LANES


def test_a_worker_with_other_lanes_than_compiled_is_refused(fake):
    """Mutation: `runtime.lanes = 256`. The tile kernels are compiled for
    128 threads per CTA (their warp counts are constants), so another block
    size would compute something else; the fake driver holds a worker
    without `.maxntid` to those 128 and refuses more (fewer: test_cuda_lanes.py)."""
    kernel, driver = fake
    kernel.runtime.lanes = 256
    try:
        with pytest.raises(RuntimeError, match=r"axpy_worker, grid=2, block=256.*INVALID_VALUE"):
            kernel.run(x=X, z=Z)
        assert "written for 128 threads per CTA, launched with 256" in driver.why()
    finally:
        kernel.runtime.lanes = cuda.DEFAULT_LANES


def test_a_static_worker_must_be_launched_cooperatively(fake, monkeypatch):
    """Mutation: the static schedule's worker launched plainly, where the
    driver would not make its CTAs co-resident (a hang on a busy GPU)."""
    kernel, driver = fake
    launch = cuda.CUDARuntime._launch
    monkeypatch.setattr(cuda.CUDARuntime, "_launch",
                        lambda self, *args, cooperative=False, shared=0:
                        launch(self, *args, cooperative=False, shared=shared))
    with pytest.raises(RuntimeError, match=r"cuLaunchKernel\(axpy_worker.*INVALID_VALUE"):
        kernel.run(x=X, z=Z)
    assert "needs a cooperative launch" in driver.why()


def test_a_cooperative_grid_beyond_co_residency_is_refused(fake, monkeypatch):
    kernel, _ = fake
    monkeypatch.setattr(cuda.CUDARuntime, "workers", property(lambda self: fake_driver.SMS + 1))
    with pytest.raises(cuda.CoResidencyError, match="COOPERATIVE_LAUNCH_TOO_LARGE"):
        kernel.run(x=X, z=Z)


@pytest.mark.parametrize("role,grid,block,why", [
    ("_init", (2, 1, 1), (256, 1, 1), "runs on a grid of 1, launched with 2"),
    ("_check_kernel", (1, 2, 1), (256, 1, 1), "must be 1 in y and z"),
    ("_counters", (1, 1, 1), (32, 1, 1), "written for 1 threads per CTA, launched with 32"),
    ("_init", (1, 1, 1), (2048, 1, 1), "more than 1024 threads"),
    ("_init", (1, 1, 1), (0, 1, 1), "must be at least 1"),
])
def test_launch_shapes_outside_the_abi_are_refused(fake, role, grid, block, why):
    kernel, driver = fake
    kernel.run(x=X, z=Z)
    function = getattr(kernel.runtime, role).function
    refused(driver, driver.cuLaunchKernel(function, *grid, *block, 0, 0, 0, 0),
            "CUDA_ERROR_INVALID_VALUE", why)


# ---------------------------------------------------------------------------
# Memory: copies, memsets, frees and buffer-table entries
# ---------------------------------------------------------------------------

def test_copies_and_memsets_must_lie_inside_one_allocation(fake):
    _, driver = fake
    first, second = (ok(driver, driver.cuMemAlloc(256)) for _ in range(2))
    host = np.zeros(512, np.uint8)
    ok(driver, driver.cuMemcpyHtoD(first, host.ctypes.data, 256))
    ok(driver, driver.cuMemcpyHtoD(int(first) + 128, host.ctypes.data, 128))
    invalid = "CUDA_ERROR_INVALID_VALUE"
    refused(driver, driver.cuMemcpyHtoD(first, host.ctypes.data, 257), invalid,
            "does not lie inside one device allocation")
    refused(driver, driver.cuMemcpyHtoD(int(first) + 128, host.ctypes.data, 129), invalid)
    refused(driver, driver.cuMemcpyDtoH(host.ctypes.data, host.ctypes.data, 8), invalid)
    refused(driver, driver.cuMemsetD8(int(first) + 255, 0, 2), invalid)
    refused(driver, driver.cuMemcpyDtoDAsync(second, first, 512, 0), invalid)
    # Device memory where host memory belongs: HtoD and DtoH mixed up.
    refused(driver, driver.cuMemcpyHtoD(first, int(second), 8), invalid,
            "the host pointer 0x")
    refused(driver, driver.cuMemcpyDtoH(int(second), first, 8), invalid)
    ok(driver, driver.cuMemcpyHtoD(first, host.ctypes.data, 0))  # nothing to copy


def test_frees_must_name_a_live_allocation(fake):
    _, driver = fake
    invalid = "CUDA_ERROR_INVALID_VALUE"
    refused(driver, driver.cuMemAlloc(0), invalid)
    pointer = ok(driver, driver.cuMemAlloc(256))
    refused(driver, driver.cuMemFree(int(pointer) + 16), invalid, "no live allocation starts")
    refused(driver, driver.cuMemFree(np.zeros(4).ctypes.data), invalid)
    ok(driver, driver.cuMemFree(pointer))
    refused(driver, driver.cuMemFree(pointer), invalid, "freed already")
    host = np.zeros(8, np.uint8)
    refused(driver, driver.cuMemcpyHtoD(pointer, host.ctypes.data, 8), invalid)


@pytest.mark.parametrize("mutation,why", [
    # Starts inside x's 768 bytes and ends past them: never inside one
    # allocation (1024 bytes on could land in another, by the heap's layout).
    (lambda a: cuda.DeviceArray(a.pointer + 512, a.shape, a.dtype),
     r"input 'x' \[0x[0-9a-f]+, \+768\) does not lie inside one device allocation"),
    (lambda a: cuda.DeviceArray(a.pointer, (2, 64), a.dtype),
     r"the buffer table gives input 'x' sizes \(2, 64\), its symbols \{'B': 3\} make it \(3, 64\)"),
])
def test_buffer_table_entries_must_lie_in_device_memory(fake, mutation, why):
    """Mutation: a launch's buffer table names memory past the end of the
    input's allocation, or sizes other than its symbols give. The worker
    faults when it runs (a sticky illegal address, reported by the next
    synchronisation), as a GPU does."""
    import re

    kernel, driver = fake
    launch = kernel.runtime.bind({"x": X, "z": Z})
    launch.buffers["x"] = mutation(launch.buffers["x"])
    launch.upload()
    launch.enqueue()
    with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        launch.check()
    assert re.search(why, driver.why()), driver.why()


def test_a_buffer_freed_before_its_launch_runs_is_an_illegal_address(fake):
    """The launch is queued with its table; the input's memory is freed
    (and its free ordered after the launch: fine), then the same table is
    enqueued again, after the free: the worker faults."""
    kernel, driver = fake
    launch = kernel.runtime.bind({"x": X, "z": Z})
    launch.enqueue()
    launch.buffers["z"].free()
    launch.check()  # the first run came before the free
    launch.enqueue()
    with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        launch.check()
    assert "input 'z'" in driver.why()


# ---------------------------------------------------------------------------
# Asynchronous work runs when the host waits for it
# ---------------------------------------------------------------------------

def test_async_copies_wait_for_a_host_wait(fake):
    """A copy queued on a non-blocking stream has not happened when the
    legacy stream reads the memory (the old bytes come back), and the wait
    that then runs it reports the race; on a blocking stream the legacy
    stream's read waits for it, as the driver's does."""
    _, driver = fake
    pointer = ok(driver, driver.cuMemAlloc(16))
    ok(driver, driver.cuMemsetD8(pointer, 1, 16))
    new, seen = np.full(16, 9, np.uint8), np.zeros(16, np.uint8)
    blocking = ok(driver, driver.cuStreamCreate(0))
    ok(driver, driver.cuMemcpyHtoDAsync(pointer, new.ctypes.data, 16, blocking))
    new[:] = 5  # pageable memory: the copy took the bytes when it was queued
    ok(driver, driver.cuMemcpyDtoH(seen.ctypes.data, pointer, 16))
    assert (seen == 9).all()
    stream = non_blocking(driver)
    ok(driver, driver.cuMemcpyHtoDAsync(pointer, new.ctypes.data, 16, stream))
    ok(driver, driver.cuMemcpyDtoH(seen.ctypes.data, pointer, 16))
    assert (seen == 9).all()  # not 5: nothing ordered the copy before the read
    with pytest.raises(fake_driver.RaceError, match=r"cuMemcpyDtoH on the legacy stream and "
                                                    r"cuMemcpyHtoDAsync on stream 0x"):
        driver.cuStreamSynchronize(stream)
    refused(driver, driver.cuMemAlloc(16), "CUDA_ERROR_LAUNCH_FAILED")  # the context is gone


def test_stream_queries_and_events_see_queued_work(fake):
    kernel, driver = fake
    stream = non_blocking(driver)
    start, end, never = (ok(driver, driver.cuEventCreate(0)) for _ in range(3))
    launch = kernel.runtime.bind({"x": X, "z": Z})
    ok(driver, driver.cuEventRecord(start, stream))
    launch.enqueue(stream)
    ok(driver, driver.cuEventRecord(end, stream))
    refused(driver, driver.cuEventElapsedTime(start, end), "CUDA_ERROR_NOT_READY")
    refused(driver, driver.cuEventElapsedTime(start, never), "CUDA_ERROR_INVALID_HANDLE")
    ok(driver, driver.cuEventSynchronize(never))  # never recorded: complete
    refused(driver, driver.cuStreamQuery(stream), "CUDA_ERROR_NOT_READY")  # runs it
    ok(driver, driver.cuStreamQuery(stream))
    assert ok(driver, driver.cuEventElapsedTime(start, end)) >= 0
    launch.check(stream)
    np.testing.assert_array_equal(launch.outputs()[0], 2.5)


def test_results_read_without_the_streams_sync_are_stale(fake, monkeypatch):
    """Mutation: `Launch.check` without its cuStreamSynchronize. On a
    non-blocking stream the results read back are the zeroed buffer's, and
    the next wait reports the race; on the legacy stream the copies wait
    for the run anyway, as the driver's do."""
    kernel, driver = fake

    def check_without_sync(self, stream=0):
        header = np.zeros(layout.HEADER_WORDS, np.int32)
        first = (self.count - layout.HEADER_WORDS) * 4
        ok(driver, driver.cuMemcpyDtoH(header.ctypes.data, self.counters.pointer + first,
                                       header.nbytes))
        layout.check_header(self.runtime.abi, header)

    monkeypatch.setattr(Launch, "check", check_without_sync)
    (y,) = kernel.run(x=X, z=Z)
    np.testing.assert_array_equal(y, 2.5)
    (y,) = kernel.run(x=2 * X, z=Z, stream=non_blocking(driver))
    np.testing.assert_array_equal(y, 2.5)  # the last run's, not 4.5
    with pytest.raises(fake_driver.RaceError):
        driver.cuCtxSynchronize()


# ---------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------

def test_what_a_capture_refuses(fake):
    """During a capture a synchronising or allocating call is refused and
    invalidates it; legacy-stream work beside a capturing blocking stream
    too (it would make one depend on the other)."""
    kernel, driver = fake
    launch = kernel.runtime.bind({"x": X, "z": Z})
    stream = ok(driver, driver.cuStreamCreate(0))
    ok(driver, driver.cuStreamBeginCapture(stream, 0))
    refused(driver, driver.cuStreamSynchronize(stream), "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    refused(driver, driver.cuStreamEndCapture(stream), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            "cuStreamSynchronize was called")
    ok(driver, driver.cuStreamBeginCapture(stream, 0))
    refused(driver, driver.cuMemAlloc(16), "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    refused(driver, driver.cuStreamEndCapture(stream), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
    ok(driver, driver.cuStreamBeginCapture(stream, 0))
    with pytest.raises(RuntimeError, match="CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"):
        launch.enqueue(0)
    refused(driver, driver.cuStreamEndCapture(stream), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
    # Beside a non-blocking stream's capture, the legacy stream is free.
    other = non_blocking(driver)
    ok(driver, driver.cuStreamBeginCapture(other, 0))
    launch.enqueue(other)
    launch.enqueue(0)
    ok(driver, driver.cuStreamEndCapture(other))
    launch.check(0)


# ---------------------------------------------------------------------------
# Runtime bugs the strict fake found
# ---------------------------------------------------------------------------

def test_a_first_run_on_a_non_blocking_stream_finds_its_buffers_zeroed(fake):
    """New device buffers were zeroed with cuMemsetD8, which is
    asynchronous on the legacy stream: a non-blocking stream's g_init could
    run before the zeroing of the counters it sets (a RaceError here)."""
    kernel, driver = fake
    (y,) = kernel.run(x=X, z=Z, stream=non_blocking(driver))
    np.testing.assert_array_equal(y, 2.5)
    ok(driver, driver.cuCtxSynchronize())


def test_a_bound_launch_runs_on_any_stream(fake):
    """`bind` queued its copies (and the buffer table) on the legacy stream
    and returned: a launch enqueued on a non-blocking stream could run
    first, on a zeroed table (an illegal address here)."""
    kernel, driver = fake
    launch = kernel.runtime.bind({"x": X, "z": Z})
    stream = non_blocking(driver)
    launch.enqueue(stream)
    launch.check(stream)
    np.testing.assert_array_equal(launch.outputs()[0], 2.5)


def test_device_index_inputs_are_checked_once_their_stream_has_them(monkeypatch):
    """A device array of ids written on the caller's stream: the range
    check copied it back on the legacy stream without waiting for that
    stream, read the old (zero) ids and let an id past the table through
    (a RaceError here)."""
    g = etc.Graph("emb")
    n = g.symbol("N")
    ids = g.input("ids", (n,), "i32")
    g.index_range(ids, below=16)
    g.output(g.embedding(g.input("table", (16, 64), "f32"), ids))
    kernel, cpu = etc.compile(g, target="cuda"), etc.compile(g, target="cpu", workers=2)
    driver = fake_driver.build({hashlib.sha256(kernel.ptx.encode()).hexdigest(): cpu})
    _use(monkeypatch, driver)
    table = np.arange(16 * 64, dtype=np.float32).reshape(16, 64)
    stream = non_blocking(driver)
    device_ids = _CAIArray(driver, (3,), "<i4")
    for values in ([3, 20, 1], [3, 15, 1]):
        host = np.array(values, np.int32)
        ok(driver, driver.cuMemcpyHtoDAsync(device_ids.pointer, host.ctypes.data, 12, stream))
        if 20 in values:
            with pytest.raises(IndexRangeError, match=r"'ids'\[1\] = 20"):
                kernel.run(table=table, ids=device_ids, stream=stream)
        else:
            (y,) = kernel.run(table=table, ids=device_ids, stream=stream)
            np.testing.assert_array_equal(y, table[values])
