"""The CUDA runtime: numerics against NumPy on a GPU (skipped without one), and
a clear error everywhere else."""

from __future__ import annotations

import numpy as np
import pytest

import etc
from etc.runtime.cuda import CUDAUnavailableError, cuda_available
from test_cpu_runtime import BATCHES, OPERATORS, _check, _graph, _inputs, _mlp, _rand

HAVE_GPU = cuda_available()
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU, its driver and cuda-python")


def _device_chip() -> str:
    from cuda.bindings import driver

    _, device = driver.cuDeviceGet(0)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    chip = f"sm_{major}{minor}"
    return "sm_90a" if chip == "sm_90" else chip


@pytest.mark.skipif(HAVE_GPU, reason="this machine has a GPU; the error path is for machines without")
def test_run_without_a_gpu_raises_a_clear_error():
    g, extra = _graph("add")
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    assert ".entry op_add_worker(" in kernel.ptx  # compiling needs no GPU
    inputs = _inputs(np.random.default_rng(0), extra, 4)
    with pytest.raises(CUDAUnavailableError, match=r"(no CUDA (driver|device) is available|needs cuda-python)"):
        kernel.run(**inputs)
    assert issubclass(CUDAUnavailableError, RuntimeError)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("kind", OPERATORS)
def test_operator_matches_numpy_on_the_gpu(kind, schedule):
    rng = np.random.default_rng(len(kind))
    g, extra = _graph(kind)
    kernel = etc.compile(g, target="cuda", chip=_device_chip(), schedule=schedule)
    for batch in BATCHES:
        _check(kernel, g, _inputs(rng, extra, batch))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("max_workers", [None, 1, 3])
def test_mlp_one_compile_serves_every_batch_on_the_gpu(schedule, max_workers):
    rng = np.random.default_rng(3)
    g = _mlp()
    kernel = etc.compile(g, target="cuda", chip=_device_chip(), schedule=schedule)
    kernel.runtime.max_workers = max_workers
    for batch in BATCHES:
        inputs = {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
                  "w1": _rand(rng, (128, 192), 0.1), "w2": _rand(rng, (192, 128), 0.1)}
        _check(kernel, g, inputs)


@pytest.mark.gpu
@needs_gpu
def test_device_arrays_are_used_in_place():
    from etc.runtime.cuda import DeviceArray

    g, extra = _graph("add")
    kernel = etc.compile(g, target="cuda", chip=_device_chip())
    rng = np.random.default_rng(5)
    inputs = _inputs(rng, extra, 40)
    first = kernel.runtime.bind(inputs)  # copies x and z to the device
    device_x = first.buffers["x"]
    assert isinstance(device_x, DeviceArray)
    outputs = kernel.run(x=device_x, z=inputs["z"])
    np.testing.assert_allclose(outputs[0], inputs["x"] + inputs["z"], rtol=1e-6)


class _FakeDriver:
    """Just enough of `cuda.bindings.driver` to drive the runtime without a GPU:
    device memory is host memory. Each launch reads the kernel's argument
    words (direct parameters, or through the argument table), checks that
    their number is what the PTX entry and the ABI say, and plays the kernel's
    part that the host can observe (the counter count, g_check's status)."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = "cooperative"

    def __init__(self, ptx: str, abi, counters: int, resident: int = 8):
        import re

        self.params = {name: len(re.findall(r"\.param ", body))
                       for name, body in re.findall(r"\.entry (\w+)\((.*?)\)", ptx, re.S)}
        self.abi = abi
        self.counters = counters
        self.resident = resident
        self.memory: dict[int, np.ndarray] = {}
        self.allocations = 0
        self.launches: list[tuple[str, int, int, int, bool]] = []
        self.words: dict[str, list[int]] = {}

    def _words_expected(self, function: str) -> int:
        # The symbols, the buffer table, then the counters and/or result word.
        words = sum(1 for a in self.abi.arguments if a.kind == "symbol") + 5
        return words + (10 if function.endswith("_check") else 5)

    def table(self, function: str) -> list[int]:
        """The buffer table the last launch of `function` read."""
        import ctypes

        symbols = sum(1 for a in self.abi.arguments if a.kind == "symbol")
        pointer, size = self.words[function][symbols + 1], self.words[function][symbols + 3]
        return list((ctypes.c_int64 * size).from_address(pointer))

    def cuDeviceGet(self, ordinal):
        return 0, 0

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, "context"

    def cuCtxSetCurrent(self, context):
        return (0,)

    class CUjit_option:
        CU_JIT_INFO_LOG_BUFFER = 3
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
        CU_JIT_ERROR_LOG_BUFFER = 5
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
        CU_JIT_LOG_VERBOSE = 12

    def cuModuleLoadDataEx(self, image, count, options, values):
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        return (0, name.decode()) if name.decode() in self.params else (500, None)

    def cuDeviceGetAttribute(self, attribute, device):
        return 0, {"sms": 4, "major": 9, "minor": 0, "cooperative": 1}[attribute]

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, lanes, shared):
        return 0, 2

    def cuMemAlloc(self, nbytes):
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
        self.allocations += 1
        return 0, block.ctypes.data

    def cuMemsetD8(self, pointer, value, nbytes):
        self.memory[pointer][:nbytes] = value
        return (0,)

    def cuMemFree(self, pointer):
        self.memory.pop(pointer, None)
        return (0,)

    def cuMemcpyHtoD(self, device, host, nbytes):
        import ctypes

        ctypes.memmove(device, host, nbytes)
        return (0,)

    def cuMemcpyHtoDAsync(self, device, host, nbytes, stream):
        return self.cuMemcpyHtoD(device, host, nbytes)

    def cuMemcpyDtoH(self, host, device, nbytes):
        import ctypes

        ctypes.memmove(host, device, nbytes)
        return (0,)

    def _kernel(self, function, grid, block, stream, params, cooperative):
        import ctypes

        count = self.params[function]
        pointers = (ctypes.c_void_p * count).from_address(params)
        values = [ctypes.c_uint64.from_address(p).value for p in pointers]
        expected = self._words_expected(function)
        assert count == expected, (function, count, expected)
        self.words[function] = values
        self.launches.append((function, grid, block, stream, cooperative))
        # The last memref is runtime-allocated (counters or the result word):
        # allocated == aligned, offset 0.
        assert values[-5] == values[-4] and values[-3] == 0
        if function.endswith("_counters"):  # the result memref's aligned pointer
            ctypes.c_int64.from_address(values[-4]).value = self.counters
        if function.endswith("_check"):
            ctypes.c_int32.from_address(values[-4]).value = 0
        return (0,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self._kernel(function, gx, bx, stream, params, False)

    def cuLaunchCooperativeKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params):
        if gx > self.resident:
            return (self.CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,)
        return self._kernel(function, gx, bx, stream, params, True)

    def cuStreamSynchronize(self, stream):
        return (0,)

    def cuGetErrorName(self, err):
        if err == self.CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
            return 0, b"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"
        return 0, b"CUDA_ERROR_NOT_FOUND"


def _fake(monkeypatch, kernel, counters=27, resident=8):
    from etc.runtime import cuda

    fake = _FakeDriver(kernel.ptx, kernel.abi, counters=counters, resident=resident)
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    return fake


def _mlp_inputs(batch, rng=None):
    rng = rng or np.random.default_rng(0)
    return {"x": _rand(rng, (batch, 128)), "nw": _rand(rng, (128,)),
            "w1": _rand(rng, (128, 192)), "w2": _rand(rng, (192, 128))}


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_runtime_passes_the_parameters_the_ptx_declares(schedule, monkeypatch):
    from etc.runtime import cuda

    kernel = etc.compile(_mlp(), target="cuda", schedule=schedule)
    fake = _fake(monkeypatch, kernel)
    kernel.runtime.max_workers = 5
    outputs = kernel.run(**_mlp_inputs(9))
    # Counters sized once per binding of the symbols, then init on one CTA,
    # the worker grid capped at max_workers (of 4 SMs x 2 resident), launched
    # cooperatively for the static schedule only, then g_check.
    static = schedule == "static"
    assert fake.launches == [("mlp_counters", 1, 1, 0, False),
                             ("mlp_init", 1, cuda.INIT_THREADS, 0, False),
                             ("mlp_worker", 5, cuda.DEFAULT_LANES, 0, static),
                             ("mlp_check", 1, cuda.CHECK_THREADS, 0, False)]
    assert [o.shape for o in outputs] == [(9, 128), (9, 128)]
    kernel.runtime.max_workers = None
    assert kernel.runtime.workers == 8


def test_oversubscribed_static_launch_is_refused_not_a_hang(monkeypatch):
    from etc.runtime.cuda import CoResidencyError

    kernel = etc.compile(_mlp(), target="cuda", schedule="static")
    _fake(monkeypatch, kernel, resident=3)  # e.g. another kernel holds SMs
    with pytest.raises(CoResidencyError, match=r"all 8 worker CTAs .* resident at once.*"
                                               r"COOPERATIVE_LAUNCH_TOO_LARGE"):
        kernel.run(**_mlp_inputs(4))


def test_repeated_runs_of_one_size_allocate_nothing(monkeypatch):
    kernel = etc.compile(_mlp(), target="cuda", schedule="dynamic")
    fake = _fake(monkeypatch, kernel)
    kernel.run(**_mlp_inputs(9))
    first = fake.allocations
    assert first > 0
    for _ in range(3):
        kernel.run(**_mlp_inputs(9))
    assert fake.allocations == first
    kernel.run(**_mlp_inputs(40))  # a new size warms up once
    second = fake.allocations
    assert second > first
    kernel.run(**_mlp_inputs(9))
    kernel.run(**_mlp_inputs(40))
    assert fake.allocations == second
    # Freed workspaces give their memory back; the next run builds anew.
    held = len(fake.memory)
    kernel.runtime.free_workspaces()
    import gc
    gc.collect()
    assert len(fake.memory) < held
    kernel.run(**_mlp_inputs(9))
    assert fake.allocations > second


class _CAIArray:
    """A device array known only through __cuda_array_interface__."""

    def __init__(self, fake, shape, typestr):
        self.shape = shape
        size = int(np.prod(shape)) * np.dtype(typestr).itemsize
        self.pointer = int(fake.cuMemAlloc(size)[1])  # a CUdeviceptr from cuda-bindings
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (self.pointer, False), "version": 3}


class _DLPackArray:
    """A device array known only through __dlpack__ (a legacy "dltensor"
    capsule over a DLManagedTensor on device type kDLCUDA)."""

    def __init__(self, fake, shape, code, bits, device_type=2, strides=None):
        import ctypes

        from etc.runtime.cuda_arrays import _DLTensor

        itemsize = bits // 8
        self.pointer = int(fake.cuMemAlloc(int(np.prod(shape)) * itemsize)[1])
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None

        class Managed(ctypes.Structure):
            _fields_ = [("tensor", _DLTensor), ("context", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p)]

        self._managed = Managed()
        t = self._managed.tensor
        t.data, t.ndim, t.byte_offset = self.pointer, len(shape), 0
        t.device.device_type, t.device.device_id = device_type, 0
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape = self._shape
        t.strides = self._strides
        self.streams = []

    def __dlpack__(self, stream=None):
        import ctypes

        self.streams.append(stream)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), b"dltensor", None)


class _TorchLikeStream:
    cuda_stream = 0x5150


def test_device_arrays_and_out_buffers_are_used_in_place(monkeypatch):
    kernel = etc.compile(_mlp(), target="cuda", schedule="dynamic")
    fake = _fake(monkeypatch, kernel)
    inputs = _mlp_inputs(9)
    x = _CAIArray(fake, (9, 128), "<f4")
    w1 = _DLPackArray(fake, (128, 192), code=2, bits=32)
    y = _DLPackArray(fake, (9, 128), code=2, bits=32)
    soft = np.zeros((9, 128), np.float32)
    result = kernel.run(x=x, nw=inputs["nw"], w1=w1, w2=inputs["w2"], out=[y, soft],
                        stream=_TorchLikeStream())
    assert result[0] is y and result[1] is soft
    assert w1.streams == [0x5150]  # the producer is told which stream consumes
    assert fake.words["mlp_worker"][0] == 9  # symbol B
    # The buffer table: x (address, 2 sizes), nw (address, size), w1, ...
    table = fake.table("mlp_worker")
    assert table[0] == x.pointer and table[1:3] == [9, 128]
    assert table[5] == w1.pointer and y.pointer in table
    assert fake.launches[-1][3] == 0x5150


def test_device_arrays_are_checked(monkeypatch):
    kernel = etc.compile(_mlp(), target="cuda", schedule="dynamic")
    fake = _fake(monkeypatch, kernel)
    inputs = _mlp_inputs(9)
    with pytest.raises(TypeError, match=r"device input 'x' has dtype float16, expected float32"):
        kernel.run(**{**inputs, "x": _CAIArray(fake, (9, 128), "<f2")})
    with pytest.raises(TypeError, match=r"not in CUDA memory"):
        kernel.run(**{**inputs, "x": _DLPackArray(fake, (9, 128), 2, 32, device_type=1)})
    with pytest.raises(ValueError, match=r"must be C-contiguous"):
        kernel.run(**{**inputs, "x": _DLPackArray(fake, (9, 128), 2, 32, strides=(1, 9))})
    with pytest.raises(ValueError, match=r"out\['mlp_add_0'\]|out\[.*\] has shape"):
        kernel.run(**inputs, out=[np.zeros((8, 128), np.float32), np.zeros((9, 128), np.float32)])
    with pytest.raises(TypeError, match=r"out= has 1 arrays for the 2 outputs"):
        kernel.run(**inputs, out=[np.zeros((9, 128), np.float32)])


def test_bf16_device_inputs_come_through_dlpack(monkeypatch):
    g = etc.Graph("bf")
    B = g.symbol("B")
    g.output(g.silu(g.input("x", (B, 64), "bf16")))
    kernel = etc.compile(g, target="cuda")
    fake = _fake(monkeypatch, kernel)
    x = _DLPackArray(fake, (3, 64), code=4, bits=16)  # kDLBfloat
    kernel.run(x=x)
    assert fake.table("bf_worker")[0] == x.pointer
