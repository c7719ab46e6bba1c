"""A stand-in for `cuda.bindings.driver` that runs ETC's CUDA runtime code
without a GPU: device memory is host memory, and a launch of a graph's
`counters`, `init`, `worker` or `check` kernel runs the same function of a
CPU build of the same scheduled program on the launch's parameters (the
buffer table holds host addresses, so the CPU code reads and writes the
"device" buffers in place; the worker grid becomes one thread per CTA).

Installed through this `sitecustomize.py` (put its folder on PYTHONPATH), so
that every Python process of a test, the GPU kit's child processes too, gets
it. ETC_FAKE_CUDA_MAP names a JSON file mapping the SHA-256 of each PTX
module to the CPU artifact of the same program; ETC_FAKE_CUDA_LOG, if set,
a file that gets one line per launch (plain or cooperative, kernel,
schedule).

What it checks by running: the runtime's parameter packing (memref words,
symbols), buffer table, staging copies, workspaces, cooperative launches,
run-header and g_check decoding, and the kit's CUDA paths. What it cannot:
the PTX itself (ptxas tests and a real GPU do that).
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import json
import os
import sys
import threading
import time
import types

if os.environ.get("ETC_FAKE_CUDA_MAP"):
    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_VALUE = 1
        CUDA_ERROR_NOT_FOUND = 500

    class CUdevice_attribute(enum.IntEnum):
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95

    OK = CUresult.CUDA_SUCCESS
    SMS = 2
    _ATTRIBUTES = {16: SMS, 75: 9, 76: 0, 95: 1}
    _memory: dict[int, ctypes.Array] = {}
    _modules: dict[int, object] = {}
    _events: dict[int, float] = {}
    _handles = iter(range(1, 1 << 30))
    _map = json.loads(open(os.environ["ETC_FAKE_CUDA_MAP"]).read())
    _log = os.environ.get("ETC_FAKE_CUDA_LOG")

    def _record(how: str, function) -> None:
        """Appends "<how> <kernel> <schedule>" to ETC_FAKE_CUDA_LOG (if set),
        so that a test can see how each kernel was launched."""
        if _log:
            kernel, role = function
            with open(_log, "a") as f:
                f.write(f"{how} {kernel.abi.name}_{role} {kernel.abi.schedule}\n")

    def cuInit(flags):
        return (OK,)

    def cuDeviceGetCount():
        return (OK, 1)

    def cuDeviceGet(ordinal):
        return (OK, 0)

    def cuDeviceGetAttribute(attribute, device):
        return (OK, _ATTRIBUTES[int(attribute)])

    def cuDeviceGetName(length, device):
        return (OK, b"Fake CUDA device (CPU)\0")

    def cuDriverGetVersion():
        return (OK, 13000)

    def cuDevicePrimaryCtxRetain(device):
        return (OK, 1)

    def cuCtxSetCurrent(context):
        return (OK,)

    def cuGetErrorName(error):
        return (OK, CUresult(int(error)).name.encode())

    def cuMemAlloc(nbytes):
        buffer = ctypes.create_string_buffer(int(nbytes) + 256)
        address = (ctypes.addressof(buffer) + 255) // 256 * 256
        _memory[address] = buffer
        return (OK, address)

    def cuMemFree(pointer):
        _memory.pop(int(pointer), None)
        return (OK,)

    def cuMemsetD8(pointer, value, nbytes):
        ctypes.memset(int(pointer), int(value), int(nbytes))
        return (OK,)

    def cuMemsetD8Async(pointer, value, nbytes, stream):
        return cuMemsetD8(pointer, value, nbytes)

    def _copy(destination, source, nbytes, *stream):
        ctypes.memmove(int(destination), int(source), int(nbytes))
        return (OK,)

    cuMemcpyHtoD = cuMemcpyHtoDAsync = cuMemcpyDtoH = cuMemcpyDtoDAsync = _copy

    def cuStreamCreate(flags):
        return (OK, next(_handles))

    def cuStreamSynchronize(stream):
        return (OK,)

    def cuEventCreate(flags):
        return (OK, next(_handles))

    def cuEventRecord(event, stream):
        _events[int(event)] = time.perf_counter()
        return (OK,)

    def cuEventSynchronize(event):
        return (OK,)

    def cuEventElapsedTime(start, end):
        return (OK, (_events[int(end)] - _events[int(start)]) * 1e3)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared):
        return (OK, 1)

    def cuModuleLoadData(image):
        ptx = ctypes.string_at(int(image)).decode()
        digest = hashlib.sha256(ptx.encode()).hexdigest()
        if digest not in _map:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        import etc.runtime  # the caller's etc (the kit's copy in the kit)

        handle = next(_handles)
        _modules[handle] = etc.runtime.load(_map[digest])
        return (OK, handle)

    def cuModuleGetFunction(module, name):
        kernel = _modules[int(module)]
        prefix = kernel.abi.name + "_"
        name = name.decode()
        if not name.startswith(prefix):
            return (CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (OK, (kernel, name[len(prefix):]))

    def _descriptor(words):
        from etc.runtime.cpu import _descriptor_type

        descriptor = _descriptor_type(1)()
        descriptor.allocated, descriptor.aligned, descriptor.offset = words[0], words[1], words[2]
        descriptor.shape[0], descriptor.strides[0] = words[3], words[4]
        return descriptor

    def _launch(function, grid, params):
        kernel, role = function
        runtime = kernel.runtime
        symbols = sum(1 for a in kernel.arguments if a.kind == "symbol")
        memrefs = {"counters": 2, "init": 2, "worker": 2, "check": 3}[role]
        pointers = ctypes.cast(int(params), ctypes.POINTER(ctypes.c_void_p))
        words = [ctypes.c_uint64.from_address(pointers[i]).value
                 for i in range(symbols + 5 * memrefs)]
        args = [ctypes.c_int64(w).value for w in words[:symbols]]
        descriptors = [_descriptor(words[symbols + 5 * m: symbols + 5 * m + 5])
                       for m in range(memrefs)]
        table = ctypes.addressof(descriptors[0])
        call = runtime._functions[role]
        if role == "counters":
            ctypes.c_int64.from_address(descriptors[1].aligned).value = call(*args, table)
        elif role == "check":
            ctypes.c_int32.from_address(descriptors[2].aligned).value = call(
                *args, table, ctypes.addressof(descriptors[1]))
        elif role == "init":
            call(*args, table, ctypes.addressof(descriptors[1]))
        else:
            counters = ctypes.addressof(descriptors[1])
            threads = [threading.Thread(target=call, args=(*args, table, counters, w, grid))
                       for w in range(grid)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return (OK,)

    def cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        _record("plain", function)
        return _launch(function, gx, params)

    def cuLaunchCooperativeKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params):
        _record("cooperative", function)
        if gx > SMS:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        return _launch(function, gx, params)

    driver = types.ModuleType("cuda.bindings.driver")
    for _name, _value in list(globals().items()):
        if _name.startswith("cu") or _name.startswith("CU"):
            setattr(driver, _name, _value)
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    bindings.__version__ = "fake"
    cuda.bindings = bindings
    sys.modules.update({"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.driver": driver})
