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
