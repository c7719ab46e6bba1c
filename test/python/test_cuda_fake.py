"""The CUDA runtime run in process on the fake driver (test/python/fake_cuda),
whose launches run the CPU build of the same program: streams of every
cuda-bindings version, device arrays as PyTorch hands them over, one buffer
table per binding, misaligned arrays, dynamic shared memory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.runtime import cuda

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "python" / "fake_cuda"))
import fake_driver  # noqa: E402
from test_cuda_runtime import _CAIArray, _DLPackArray  # noqa: E402

# Where `make install` puts them: beside the environment running the tests
# (.venv, or the VENV given to make).
VERSIONS = Path(sys.prefix) / "cuda-bindings"


def _graph(name: str = "axpy", width: int = 64):
    g = etc.Graph(name)
    B = g.symbol("B")
    x = g.input("x", (B, width), "f32")
    g.output(g.add(g.scale(x, 2.0), g.input("z", (B, width), "f32")))
    return g


def use_fake_driver(monkeypatch, kernel, build):
    """`kernel` (a CUDA kernel) on a new fake driver whose launches run
    `build`, the CPU build of the same program; the driver."""
    driver = fake_driver.build({hashlib.sha256(kernel.ptx.encode()).hexdigest(): build})
    monkeypatch.setattr(cuda, "_driver", lambda: driver)
    kernel.runtime._driver = None  # load again on this driver
    kernel.runtime._workspaces.clear()
    return driver


def _fake(monkeypatch, graph, **options):
    """The CUDA kernel of `graph` and a fake driver running its CPU build."""
    kernel = etc.compile(graph, target="cuda", **options)
    cpu = etc.compile(graph, target="cpu", workers=fake_driver.SMS,
                      schedule=options.get("schedule", "static"))
    return kernel, use_fake_driver(monkeypatch, kernel, cpu)


@pytest.fixture(scope="module")
def axpy():
    """One compile of the axpy graph for CUDA and for the CPU (the fake
    driver runs the latter)."""
    graph = _graph()
    return (graph, etc.compile(graph, target="cuda"),
            etc.compile(graph, target="cpu", workers=fake_driver.SMS))


@pytest.fixture
def fake(monkeypatch, axpy):
    graph, kernel, cpu = axpy
    return kernel, use_fake_driver(monkeypatch, kernel, cpu)


# ---------------------------------------------------------------------------
# 1. Streams
# ---------------------------------------------------------------------------

def _version_dirs():
    return sorted(VERSIONS.glob("*")) if VERSIONS.is_dir() else []


@pytest.mark.parametrize("version", ["installed", "12.9.4", "13.0.3"])
def test_stream_handles_of_each_cuda_bindings_version(version):
    """A CUstream made by cuda-bindings (no driver needed to construct one)
    gives its handle: 13.0.x has no __cuda_stream__, and its getPtr() is
    the address of the Python object's storage."""
    env = dict(os.environ)
    if version != "installed":
        path = VERSIONS / version
        if not path.is_dir():
            pytest.skip(f"cuda-bindings {version} is not in {VERSIONS} (make install puts it there)")
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    script = ("import cuda.bindings, sys\n"
              "from cuda.bindings import driver\n"
              "from etc.runtime.cuda import stream_handle\n"
              "assert cuda.bindings.__version__ == sys.argv[1] or sys.argv[1] == 'installed', "
              "cuda.bindings.__version__\n"
              "stream = driver.CUstream(0x5150)\n"
              "print(cuda.bindings.__version__, hasattr(stream, '__cuda_stream__'), "
              "stream_handle(stream))\n")
    result = subprocess.run([sys.executable, "-c", script, version], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    found, protocol, handle = result.stdout.split()
    assert int(handle) == 0x5150, result.stdout
    if version != "installed":
        assert found == version and protocol == "False"


def test_a_created_stream_is_the_one_launched_on(fake):
    kernel, driver = fake
    stream = cuda._check(driver, "cuStreamCreate", driver.cuStreamCreate(0))
    assert stream.getPtr() != int(stream)  # like cuda-bindings 13.0.3
    x, z = np.ones((3, 64), np.float32), np.full((3, 64), 0.5, np.float32)
    (y,) = kernel.run(x=x, z=z, stream=stream)
    np.testing.assert_allclose(y, 2.5)


def test_the_jit_optimization_level_comes_from_the_environment(monkeypatch, fake):
    """ETC_CUDA_JIT_OPT_LEVEL (the kit's --jit-opt-level) is one more option
    of the driver JIT, and a kernel loads and runs with it; anything but 0
    to 4 is an error naming the variable."""
    from cuda.bindings import driver as real
    from etc.runtime.cuda_driver import JITLogs

    option = real.CUjit_option.CU_JIT_OPTIMIZATION_LEVEL
    monkeypatch.delenv("ETC_CUDA_JIT_OPT_LEVEL", raising=False)
    assert option not in JITLogs(real).keys
    monkeypatch.setenv("ETC_CUDA_JIT_OPT_LEVEL", "0")
    logs = JITLogs(real)
    assert logs.values[logs.keys.index(option)] == 0
    kernel, _ = fake
    (y,) = kernel.run(x=np.ones((2, 64), np.float32), z=np.zeros((2, 64), np.float32))
    np.testing.assert_allclose(y, 2.0)
    for bad in ("5", "-1", "fast"):
        monkeypatch.setenv("ETC_CUDA_JIT_OPT_LEVEL", bad)
        with pytest.raises(ValueError, match="ETC_CUDA_JIT_OPT_LEVEL='"):
            JITLogs(real)


@pytest.mark.parametrize("version", ["12.9.4", "13.0.3"])
def test_the_fake_hands_out_the_handle_types_of_the_cuda_bindings_found(version, axpy,
                                                                        tmp_path):
    """The fake's handles are the cuda-bindings types on the path (13.5.0,
    installed, has CUstream.__cuda_stream__); with an older release first
    on the path, its types: 13.0.x's CUstream has no __cuda_stream__, so
    the runtime takes the handle with int(), and the run is the same."""
    path = VERSIONS / version
    if not path.is_dir():
        pytest.skip(f"cuda-bindings {version} is not in {VERSIONS} (make install puts it there)")
    _, kernel, cpu = axpy
    kernel.save(tmp_path / "axpy-cuda.etc")
    cpu.save(tmp_path / "axpy-cpu.etc")
    script = ("import hashlib, sys\n"
              "sys.path.insert(0, sys.argv[3])\n"
              "import numpy as np, cuda.bindings, etc.runtime, fake_driver\n"
              "version = cuda.bindings.__version__\n"
              "kernel = etc.runtime.load(sys.argv[1])\n"
              "driver = fake_driver.build({hashlib.sha256(kernel.ptx.encode()).hexdigest(): "
              "sys.argv[2]})\n"
              "fake_driver.install(driver)\n"
              "stream = driver.cuStreamCreate(0)[1]\n"
              "y, = kernel.run(x=np.ones((3, 64), np.float32), "
              "z=np.full((3, 64), 0.5, np.float32), stream=stream)\n"
              "print(version, hasattr(stream, '__cuda_stream__'), float(y.min()), "
              "float(y.max()))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), os.environ["PYTHONPATH"]])
               if os.environ.get("PYTHONPATH") else str(path))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "axpy-cuda.etc"),
                             str(tmp_path / "axpy-cpu.etc"), str(ROOT / "test" / "python" /
                                                                 "fake_cuda")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [version, "False", "2.5", "2.5"], result.stdout


# ---------------------------------------------------------------------------
# 3. PyTorch-style device arrays
# ---------------------------------------------------------------------------

class _TorchBF16(_DLPackArray):
    """PyTorch's bf16 CUDA tensor: its __cuda_array_interface__ reports the
    dtype as `<V2` (a 2-byte void); __dlpack__ names bf16."""

    def __init__(self, fake, shape):
        super().__init__(fake, shape, code=4, bits=16)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<V2",
                                         "data": (self.pointer, False), "version": 3}


class _RequiresGrad:
    """PyTorch's tensor that requires grad: both interfaces raise."""

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. "
                           "If gradients aren't required, use var.detach() to get Variable "
                           "that doesn't require grad.")

    def __dlpack__(self, stream=None):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")


def test_bf16_tensor_reported_as_void_goes_through_dlpack(monkeypatch):
    g = etc.Graph("bf")
    B = g.symbol("B")
    g.output(g.silu(g.input("x", (B, 64), "bf16")))
    kernel, driver = _fake(monkeypatch, g)
    x = _TorchBF16(driver, (3, 64))
    values = np.linspace(-2, 2, 3 * 64, dtype=np.float32).reshape(3, 64)
    driver.cuMemcpyHtoD(x.pointer, etc.bfloat16.to_bits(values).ctypes.data, values.size * 2)
    (y,) = kernel.run(x=x)
    np.testing.assert_allclose(y, values / (1 + np.exp(-etc.bfloat16.from_bits(
        etc.bfloat16.to_bits(values)))), rtol=2e-2, atol=1e-2)


def test_a_tensor_that_requires_grad_gets_a_clear_error(fake):
    kernel, _ = fake
    with pytest.raises(TypeError, match=r"device input 'x' \(_RequiresGrad\) cannot be used in "
                                        r"place: its __cuda_array_interface__ raised "
                                        r"RuntimeError.*__dlpack__ raised.*tensor.detach\(\)"):
        kernel.run(x=_RequiresGrad(), z=np.ones((3, 64), np.float32))


# ---------------------------------------------------------------------------
# 4. A buffer table per binding
# ---------------------------------------------------------------------------

def test_each_binding_computes_on_its_own_arrays(fake):
    """Two bindings of the same sizes: enqueueing the first after binding
    the second computes on the first's arrays (and so does a CUDA graph
    captured from it)."""
    kernel, driver = fake
    runtime = kernel.runtime
    z = np.zeros((2, 64), np.float32)
    first = runtime.bind({"x": np.full((2, 64), 0.5, np.float32), "z": z})
    second = runtime.bind({"x": np.full((2, 64), 1.0, np.float32), "z": z})
    stream = cuda._check(driver, "cuStreamCreate", driver.cuStreamCreate(0))
    cuda._check(driver, "cuStreamBeginCapture", driver.cuStreamBeginCapture(stream, 0))
    first.enqueue(stream)
    graph = cuda._check(driver, "cuStreamEndCapture", driver.cuStreamEndCapture(stream))
    executable = cuda._check(driver, "cuGraphInstantiate", driver.cuGraphInstantiate(graph, 0))
    first.enqueue()
    first.check()
    np.testing.assert_array_equal(first.outputs()[0], 1.0)
    second.enqueue()
    second.check()
    np.testing.assert_array_equal(second.outputs()[0], 2.0)
    cuda._check(driver, "cuGraphLaunch", driver.cuGraphLaunch(executable, stream))
    first.check(stream)
    np.testing.assert_array_equal(first.outputs()[0], 1.0)
    assert first.table.pointer != second.table.pointer


# ---------------------------------------------------------------------------
# 5. Misaligned arrays used in place
# ---------------------------------------------------------------------------

def test_a_misaligned_device_array_is_refused_before_any_launch(fake):
    kernel, driver = fake
    aligned = _CAIArray(driver, (3, 64), "<f4")
    offset = _CAIArray(driver, (3, 64), "<f4")
    offset.__cuda_array_interface__ = dict(offset.__cuda_array_interface__,
                                           data=(offset.pointer + 4 * 3, False))
    with pytest.raises(ValueError, match=r"device input 'z' starts at address 0x[0-9a-f]+, which "
                                         r"is not a multiple of 16 bytes.*tensor.clone\(\)"):
        kernel.run(x=aligned, z=offset)
    with pytest.raises(ValueError, match=r"device out\['add_0'\] starts at address"):
        kernel.run(x=aligned, z=aligned, out=[offset])
    assert driver.fault() is None
    (y,) = kernel.run(x=aligned, z=aligned)  # the context is still usable
    assert y.shape == (3, 64)


def test_the_fake_driver_faults_on_a_misaligned_buffer_like_a_gpu(fake):
    """What the check above prevents: a worker given a misaligned address
    faults when it runs, which the next synchronisation reports (the
    launch itself succeeds, as on a GPU), and the context is unusable
    afterwards (sticky error)."""
    kernel, driver = fake
    launch = kernel.runtime.bind({"x": np.ones((3, 64), np.float32),
                                  "z": np.ones((3, 64), np.float32)})
    launch.buffers["x"] = cuda.DeviceArray(launch.buffers["x"].pointer + 4, (3, 64), np.float32)
    launch.upload()
    launch.enqueue()
    with pytest.raises(RuntimeError, match="cuStreamSynchronize.*CUDA_ERROR_MISALIGNED_ADDRESS"):
        launch.check()
    assert "input 'x' starts at 0x" in driver.why()
    with pytest.raises(RuntimeError, match="CUDA_ERROR_MISALIGNED_ADDRESS"):
        kernel.run(x=np.ones((3, 64), np.float32), z=np.ones((3, 64), np.float32))


# ---------------------------------------------------------------------------
# 2. Dynamic shared memory
# ---------------------------------------------------------------------------

def test_a_worker_with_more_than_48_kb_of_scratch_opts_in(monkeypatch):
    """A tensor-core tile of 256 x 128 stages 57 KB of A and B in shared
    memory: the worker is launched with its scratch arena as dynamic shared
    memory, after raising its limit (the fake driver, like a GPU, refuses
    more than 48 KB without, and faults a worker launched with less than
    its arena)."""
    g = etc.Graph("wide_mma")
    g.output(g.matmul(g.input("a", (256, 64), "bf16"), g.input("b", (64, 256), "bf16"),
                      tile=(256, 128)))
    kernel, driver = _fake(monkeypatch, g)
    assert kernel.abi.shared_bytes > 48 << 10
    rng = np.random.default_rng(1)
    a = etc.reference.round_bf16(rng.standard_normal((256, 64), np.float32))
    b = etc.reference.round_bf16(rng.standard_normal((64, 256), np.float32))
    (y,) = kernel.run(a=a, b=b)
    np.testing.assert_allclose(y, etc.reference.evaluate(g, a=a, b=b)[0], rtol=2e-2, atol=2e-2)
    resources = kernel.runtime.resources()
    assert resources["dynamic_shared_bytes"] == kernel.abi.shared_bytes


# ---------------------------------------------------------------------------
# 6. Packed weights uploaded once
# ---------------------------------------------------------------------------

def test_a_packed_weight_uploaded_once_is_used_in_place(monkeypatch):
    """A packed weight's blocks (uint8 storage) copied to the device with
    `device_array`, as a model's weights are (`models.step.model`), bind as
    that input in place; the product equals the run on the host arrays."""
    from etc import packed

    g = etc.Graph("packed_dev")
    T = g.symbol("T")
    g.output(g.matmul(g.input("x", (T, 256), "bf16"), g.input("w", (16, 256), "q4_k"),
                      transpose_b=True))
    kernel, _ = _fake(monkeypatch, g, schedule="static")
    rng = np.random.default_rng(0)
    blocks = packed.quantize(rng.standard_normal((16, 256)).astype(np.float32), "q4_k")
    x = etc.reference.round_bf16(rng.standard_normal((3, 256)))
    want = kernel.run(x=x, w=blocks)[0]
    device = kernel.runtime.device_array(blocks)
    np.testing.assert_array_equal(kernel.run(x=x, w=device)[0], want)
    with pytest.raises(TypeError, match="input 'w' has dtype float32, expected uint8"):
        kernel.run(x=x, w=kernel.runtime.device_array(np.zeros(blocks.shape, np.float32)))
