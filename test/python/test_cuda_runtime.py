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
    memory is host memory, and each launch checks that the runtime passed as
    many parameters as the PTX entry declares, then plays the kernel's part
    that the host can observe (the counter count, a clean g_check)."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"

    def __init__(self, ptx: str, counters: int):
        import re

        self.params = {name: len(re.findall(r"\.param ", body))
                       for name, body in re.findall(r"\.entry (\w+)\((.*?)\)", ptx, re.S)}
        self.counters = counters
        self.memory: dict[int, np.ndarray] = {}
        self.launches: list[tuple[str, int, int]] = []

    def cuDeviceGet(self, ordinal):
        return 0, 0

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, "context"

    def cuCtxSetCurrent(self, context):
        return (0,)

    def cuModuleLoadData(self, image):
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        return (0, name.decode()) if name.decode() in self.params else (500, None)

    def cuDeviceGetAttribute(self, attribute, device):
        return 0, {"sms": 4, "major": 9, "minor": 0}[attribute]

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, lanes, shared):
        return 0, 2

    def cuMemAlloc(self, nbytes):
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
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

    def cuMemcpyDtoH(self, host, device, nbytes):
        import ctypes

        ctypes.memmove(host, device, nbytes)
        return (0,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        import ctypes

        count = self.params[function]
        pointers = (ctypes.c_void_p * count).from_address(params)
        values = [ctypes.c_uint64.from_address(p).value for p in pointers]
        self.launches.append((function, gx, bx))
        # The last parameter group is a runtime-allocated memref (counters or
        # the result word): its aligned pointer lands where the PTX expects.
        assert values[-4] in self.memory, (function, values)
        assert values[-5] == values[-4] and values[-3] == 0  # allocated, aligned, offset
        if function.endswith("_counters"):  # the result memref's aligned pointer
            ctypes.c_int64.from_address(values[-4]).value = self.counters
        if function.endswith("_check"):
            ctypes.c_int32.from_address(values[-4]).value = 0
        return (0,)

    def cuCtxSynchronize(self):
        return (0,)

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_NOT_FOUND"


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_runtime_passes_the_parameters_the_ptx_declares(schedule, monkeypatch):
    from etc.runtime import cuda

    g = _mlp()
    kernel = etc.compile(g, target="cuda", schedule=schedule)
    fake = _FakeDriver(kernel.ptx, counters=7)
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    kernel.runtime.max_workers = 5
    rng = np.random.default_rng(0)
    inputs = {"x": _rand(rng, (9, 128)), "nw": _rand(rng, (128,)),
              "w1": _rand(rng, (128, 192)), "w2": _rand(rng, (192, 128))}
    outputs = kernel.run(**inputs)
    # Counters sized once per binding of the symbols, then init on one CTA,
    # the worker grid capped at max_workers (of 4 SMs x 2 resident), g_check.
    assert fake.launches == [("mlp_counters", 1, 1), ("mlp_init", 1, cuda.INIT_THREADS),
                             ("mlp_worker", 5, cuda.DEFAULT_LANES), ("mlp_check", 1, 1)]
    assert [o.shape for o in outputs] == [(9, 128), (9, 128)]
    kernel.runtime.max_workers = None
    assert kernel.runtime.workers == 8
