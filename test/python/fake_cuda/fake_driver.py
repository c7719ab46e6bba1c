"""A stand-in for `cuda.bindings.driver` that runs ETC's CUDA runtime code
without a GPU: device memory is host memory, and a launch of a graph's
`counters`, `init`, `worker` or `check` kernel runs the same function of a
CPU build of the same scheduled program on the launch's parameters (the
buffer table holds host addresses, so the CPU code reads and writes the
"device" buffers in place; the worker grid becomes one thread per CTA).

`build(programs)` makes one: `programs` maps the SHA-256 of each PTX module
to the CPU build of the same program (a saved artifact's path, or a
compiled CPU kernel). `sitecustomize.py` installs one in every Python
process started with ETC_FAKE_CUDA_MAP set (the GPU kit's children too);
tests may also hand one to `etc.runtime.cuda` directly.

Like a GPU, and unlike a plain mock, it
* hands out stream and event handles as objects like cuda-bindings 13.0.x
  does (`int()` is the handle, `getPtr()` the address of the Python
  object's storage, no `__cuda_stream__`), and refuses a launch or copy on
  a stream it did not create;
* faults on a worker launch whose buffer table holds an address that is
  not 16-byte aligned (the kernels' vector loads would), with a sticky
  CUDA_ERROR_MISALIGNED_ADDRESS: every later call fails too, as a real
  context does after a fault;
* refuses a launch with more than 48 KB of dynamic shared memory unless
  cuFuncSetAttribute raised the limit, and faults a worker launched with
  less than its ABI's `shared_bytes` (its scratch would lie outside);
* records launches on a capturing stream into a graph that
  cuGraphLaunch replays;
* plays the kernels of `etc.runtime.probes` on the host;
* links PTX with the driver's JIT linker (`cuLink*`) into a "cubin" that
  names the first PTX added, and, for a program on several ranks, runs the
  CPU build of the same program with the transport block of the fake
  NVSHMEM's heap (`fake_nvshmem.py`) after its buffer table, refusing a
  worker whose module `nvshmemx_cumodule_init` did not see.

What it cannot check: the PTX itself (ptxas tests and a real GPU do that).
ETC_FAKE_CUDA_LOG (if set) names a file that gets one line per launch
(plain or cooperative, kernel, schedule).
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import os
import threading
import time
import types

#: How a fake "cubin" from cuLinkComplete starts (then the first PTX's SHA-256).
CUBIN_MARKER = "fake-cubin:"
#: Dynamic shared memory a kernel may use without cuFuncSetAttribute.
DEFAULT_SHARED = 48 << 10
#: What the device allows one CTA after opting in (an H100's 227 KB).
SHARED_OPTIN = 227 << 10


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_PTX = 218
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_MISALIGNED_ADDRESS = 716
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class CUfunction_attribute(enum.IntEnum):
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUjit_option(enum.IntEnum):
    CU_JIT_INFO_LOG_BUFFER = 3
    CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
    CU_JIT_ERROR_LOG_BUFFER = 5
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
    CU_JIT_LOG_VERBOSE = 12


class CUjitInputType(enum.IntEnum):
    CU_JIT_INPUT_CUBIN = 0
    CU_JIT_INPUT_PTX = 1


class CUstreamCaptureMode(enum.IntEnum):
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0


class _Handle:
    """A driver handle as cuda-bindings 13.0.x makes them: `int()` is the
    handle; `getPtr()` is where the object keeps it, not the handle."""

    def __init__(self, value: int = 0):
        self._value = ctypes.c_uint64(int(value))

    def __int__(self) -> int:
        return self._value.value

    def getPtr(self) -> int:
        return ctypes.addressof(self._value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value.value:#x}>"


class CUstream(_Handle):
    pass


class CUevent(_Handle):
    pass


SMS = 2
_ATTRIBUTES = {16: SMS, 38: 1 << 20, 39: 2048, 75: 9, 76: 0, 81: 228 << 10, 95: 1,
               97: SHARED_OPTIN}


def build(programs: dict, log: str | None = None) -> types.ModuleType:
    """A fake `cuda.bindings.driver` module; see the module docstring."""
    memory: dict[int, ctypes.Array] = {}
    modules: dict[int, object] = {}
    events: dict[int, float] = {}
    streams = {0}
    handles = iter(range(0x1000, 1 << 30, 0x10))
    state = {"fault": None}
    #: Captures in progress (stream -> recorded calls) and instantiated graphs.
    capturing: dict[int, list] = {}
    graphs: dict[int, list] = {}
    opted_in: dict[int, int] = {}

    def record(how: str, function) -> None:
        if log:
            kernel, role = function
            with open(log, "a") as f:
                f.write(f"{how} {kernel.abi.name}_{role} {kernel.abi.schedule}\n")

    def sticky(call):
        """A fault ends the context: every later call returns its error."""
        def wrapper(*args):
            if state["fault"] is not None:
                return (state["fault"],) + (None,) * (wrapper.results - 1)
            return call(*args)
        wrapper.results = 1
        return wrapper

    def returning(count):
        def mark(call):
            call.results = count
            return call
        return mark

    def stream_of(stream) -> int | None:
        value = int(stream)
        return value if value in streams else None

    def cuInit(flags):
        return (CUresult.CUDA_SUCCESS,)

    def cuDeviceGetCount():
        return (CUresult.CUDA_SUCCESS, int(os.environ.get("ETC_FAKE_CUDA_DEVICES", "1")))

    def cuDeviceGet(ordinal):
        return (CUresult.CUDA_SUCCESS, 0)

    def cuDeviceGetAttribute(attribute, device):
        return (CUresult.CUDA_SUCCESS, _ATTRIBUTES[int(attribute)])

    def cuDeviceGetName(length, device):
        return (CUresult.CUDA_SUCCESS, b"Fake CUDA device (CPU)\0")

    def cuDriverGetVersion():
        return (CUresult.CUDA_SUCCESS, 13000)

    def cuDevicePrimaryCtxRetain(device):
        return (CUresult.CUDA_SUCCESS, 1)

    def cuCtxSetCurrent(context):
        return (CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(error):
        return (CUresult.CUDA_SUCCESS, CUresult(int(error)).name.encode())

    def cuMemAlloc(nbytes):
        buffer = ctypes.create_string_buffer(int(nbytes) + 256)
        address = (ctypes.addressof(buffer) + 255) // 256 * 256
        memory[address] = buffer
        return (CUresult.CUDA_SUCCESS, address)

    def cuMemFree(pointer):
        memory.pop(int(pointer), None)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemsetD8(pointer, value, nbytes):
        ctypes.memset(int(pointer), int(value), int(nbytes))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemsetD8Async(pointer, value, nbytes, stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return cuMemsetD8(pointer, value, nbytes)

    def cuMemcpyHtoD(destination, source, nbytes):
        ctypes.memmove(int(destination), int(source), int(nbytes))
        return (CUresult.CUDA_SUCCESS,)

    cuMemcpyDtoH = cuMemcpyHtoD

    def cuMemcpyHtoDAsync(destination, source, nbytes, stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return cuMemcpyHtoD(destination, source, nbytes)

    cuMemcpyDtoDAsync = cuMemcpyHtoDAsync

    def cuStreamCreate(flags):
        stream = CUstream(next(handles))
        streams.add(int(stream))
        return (CUresult.CUDA_SUCCESS, stream)

    def cuStreamDestroy(stream):
        streams.discard(int(stream))
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxSynchronize():
        return (CUresult.CUDA_SUCCESS,)

    def cuEventCreate(flags):
        return (CUresult.CUDA_SUCCESS, CUevent(next(handles)))

    def cuEventRecord(event, stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        events[int(event)] = time.perf_counter()
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(event):
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(start, end):
        return (CUresult.CUDA_SUCCESS, (events[int(end)] - events[int(start)]) * 1e3)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared):
        return (CUresult.CUDA_SUCCESS, 1)

    def cuFuncGetAttribute(attribute, function):
        values = {CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS: 40,
                  CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: 0,
                  CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: 16,
                  CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
                  CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
                      opted_in.get(id(function), DEFAULT_SHARED)}
        return (CUresult.CUDA_SUCCESS, values[CUfunction_attribute(int(attribute))])

    def cuFuncSetAttribute(function, attribute, value):
        if int(attribute) == CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            if int(value) > SHARED_OPTIN:
                return (CUresult.CUDA_ERROR_INVALID_VALUE,)
            opted_in[id(function)] = int(value)
        return (CUresult.CUDA_SUCCESS,)

    def load(ptx: str):
        from etc.runtime import probes

        if ptx.startswith(probes.MARKER):
            return "probes"
        digest = (ptx[len(CUBIN_MARKER):] if ptx.startswith(CUBIN_MARKER)
                  else hashlib.sha256(ptx.encode()).hexdigest())
        entry = programs.get(digest)
        if entry is None:
            return None
        if isinstance(entry, str):
            import etc.runtime  # the caller's etc (the kit's copy in the kit)

            return etc.runtime.load(entry)
        return entry

    def cuModuleLoadData(image):
        return cuModuleLoadDataEx(image, 0, [], [])

    def cuModuleLoadDataEx(image, count, options, values):
        ptx = ctypes.string_at(int(image)).decode()
        program = load(ptx)
        logs = {int(o): v for o, v in zip(options, values)}
        if program is None:
            error = b"ptxas fatal   : (fake driver) no CPU build of this PTX is known\0"
            buffer = logs.get(CUjit_option.CU_JIT_ERROR_LOG_BUFFER)
            if buffer is not None:
                buffer[:len(error)] = error
            return (CUresult.CUDA_ERROR_INVALID_PTX, None)
        info = logs.get(CUjit_option.CU_JIT_INFO_LOG_BUFFER)
        if info is not None:
            text = b"ptxas info    : (fake driver) 40 registers, 0 bytes spill\0"
            info[:len(text)] = text
        handle = next(handles)
        modules[handle] = program
        return (CUresult.CUDA_SUCCESS, handle)

    links: dict[int, list] = {}

    def cuLinkCreate(count, options, values):
        handle = next(handles)
        links[handle] = []
        return (CUresult.CUDA_SUCCESS, handle)

    def cuLinkAddData(state, kind, data, size, name, count, options, values):
        if int(state) not in links or int(kind) != CUjitInputType.CU_JIT_INPUT_PTX:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        links[int(state)].append(ctypes.string_at(int(data)).decode())
        return (CUresult.CUDA_SUCCESS,)

    def cuLinkComplete(state):
        sources = links.get(int(state))
        if not sources:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None, None)
        image = ctypes.create_string_buffer(
            (CUBIN_MARKER + hashlib.sha256(sources[0].encode()).hexdigest()).encode())
        links[int(state)] = image  # alive until cuLinkDestroy, as the driver's
        return (CUresult.CUDA_SUCCESS, ctypes.addressof(image), len(image.value))

    def cuLinkDestroy(state):
        links.pop(int(state), None)
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamQuery(stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (CUresult.CUDA_SUCCESS,)

    def cuModuleGetFunction(module, name):
        program = modules[int(module)]
        name = name.decode()
        if program == "probes":
            from etc.runtime import probes

            if name not in probes.KERNELS:
                return (CUresult.CUDA_ERROR_NOT_FOUND, None)
            return (CUresult.CUDA_SUCCESS, ("probes", name))
        prefix = program.abi.name + "_"
        if not name.startswith(prefix):
            return (CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (CUresult.CUDA_SUCCESS, (program, name[len(prefix):]))

    def descriptor(words):
        from etc.runtime.cpu import _descriptor_type

        d = _descriptor_type(1)()
        d.allocated, d.aligned, d.offset = words[0], words[1], words[2]
        d.shape[0], d.strides[0] = words[3], words[4]
        return d

    def probe(name: str, grid: int, params) -> None:
        from etc.runtime import probes

        pointers = ctypes.cast(int(params), ctypes.POINTER(ctypes.c_void_p))
        kinds = probes.KERNELS[name]
        words = [(ctypes.c_uint64 if kind == "u64" else ctypes.c_uint32).from_address(
            pointers[i]).value for i, kind in enumerate(kinds)]
        if name == "etc_probe_sm":
            start = time.perf_counter_ns()
            for cta in range(grid):
                record_at = words[0] + 32 * cta
                for i, value in enumerate((cta % SMS, start, start + words[1], SMS)):
                    ctypes.c_uint64.from_address(record_at + 8 * i).value = value
        elif name == "etc_probe_timer":
            for i in range(words[1]):
                ctypes.c_uint64.from_address(words[0] + 8 * i).value = time.perf_counter_ns()

    def misaligned(program, table: int) -> bool:
        from etc.runtime.cpu import table_slots

        slots, size = table_slots(program.arguments)
        words = (ctypes.c_uint64 * max(size, 1)).from_address(table)
        return any(words[slot] % 16 for slot in slots.values())

    def run(function, grid, shared, params):
        program, role = function
        if program == "probes":
            probe(role, grid, params)
            return (CUresult.CUDA_SUCCESS,)
        runtime = program.runtime
        symbols = sum(1 for a in program.arguments if a.kind == "symbol")
        memrefs = {"counters": 2, "init": 2, "worker": 2, "check": 3}[role]
        pointers = ctypes.cast(int(params), ctypes.POINTER(ctypes.c_void_p))
        words = [ctypes.c_uint64.from_address(pointers[i]).value
                 for i in range(symbols + 5 * memrefs)]
        args = [ctypes.c_int64(w).value for w in words[:symbols]]
        descriptors = [descriptor(words[symbols + 5 * m: symbols + 5 * m + 5])
                       for m in range(memrefs)]
        ranks = program.abi.extra.get("ranks", 1)
        if ranks > 1:
            # The CPU build reads the transport block after the table.
            import fake_nvshmem
            import numpy as np

            if role == "worker" and not any(fake_nvshmem.initialised(handle)
                                            for handle, loaded in modules.items()
                                            if loaded is program):
                state["fault"] = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
                return (state["fault"],)
            words = np.ctypeslib.as_array((ctypes.c_int64 * descriptors[0].shape[0])
                                          .from_address(descriptors[0].aligned))
            extended = np.concatenate([words, fake_nvshmem.transport_block(ranks)])
            descriptors[0] = descriptor([extended.ctypes.data, extended.ctypes.data, 0,
                                         extended.size, 1])
            descriptors[0].keep = extended
            if role == "worker":
                # Remote notifies cannot wake a blocked CPU wait: poll.
                from etc.runtime import layout

                counters = np.ctypeslib.as_array((ctypes.c_int32 * descriptors[1].shape[0])
                                                 .from_address(descriptors[1].aligned))
                layout.header(counters)[layout.SPIN_MICROSECONDS_WORD] = min(
                    program.abi.watchdog_ms * 1000, 2**31 - 1)
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
            if misaligned(program, descriptors[0].aligned):
                state["fault"] = CUresult.CUDA_ERROR_MISALIGNED_ADDRESS
                return (state["fault"],)
            if shared < program.abi.shared_bytes:
                state["fault"] = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
                return (state["fault"],)
            counters = ctypes.addressof(descriptors[1])
            threads = [threading.Thread(target=call, args=(*args, table, counters, w, grid))
                       for w in range(grid)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return (CUresult.CUDA_SUCCESS,)

    def parameter_count(function) -> int:
        program, role = function
        if program == "probes":
            from etc.runtime import probes

            return len(probes.KERNELS[role])
        symbols = sum(1 for a in program.arguments if a.kind == "symbol")
        return symbols + 5 * {"counters": 2, "init": 2, "worker": 2, "check": 3}[role]

    def launch(how, function, grid, shared, stream, params):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        limit = opted_in.get(id(function), DEFAULT_SHARED)
        if int(shared) > limit:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if int(stream) in capturing:
            # The driver copies the parameters at capture: so does this.
            pointers = ctypes.cast(int(params), ctypes.POINTER(ctypes.c_void_p))
            count = parameter_count(function)
            copied = [ctypes.c_uint64(ctypes.c_uint64.from_address(pointers[i]).value)
                      if pointers[i] else None for i in range(count)]
            capturing[int(stream)].append((how, function, grid, shared, copied))
            return (CUresult.CUDA_SUCCESS,)
        if function[0] != "probes":
            record(how, function)
        return run(function, grid, int(shared), params)

    def replay(calls) -> tuple:
        for how, function, grid, shared, copied in calls:
            array = (ctypes.c_void_p * len(copied))(
                *[ctypes.addressof(v) if v is not None else None for v in copied])
            if function[0] != "probes":
                record(how, function)
            result = run(function, grid, shared, ctypes.addressof(array))
            if result[0] != CUresult.CUDA_SUCCESS:
                return result
        return (CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return launch("plain", function, gx, shared, stream, params)

    def cuLaunchCooperativeKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params):
        if gx > SMS:
            return (CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,)
        return launch("cooperative", function, gx, shared, stream, params)

    def cuStreamBeginCapture(stream, mode):
        if stream_of(stream) in (None, 0):
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        capturing[int(stream)] = []
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamEndCapture(stream):
        handle = next(handles)
        graphs[handle] = capturing.pop(int(stream))
        return (CUresult.CUDA_SUCCESS, handle)

    def cuGraphInstantiate(graph, flags):
        return (CUresult.CUDA_SUCCESS, int(graph))

    def cuGraphLaunch(executable, stream):
        if stream_of(stream) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return replay(graphs[int(executable)])

    def cuGraphExecDestroy(executable):
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphDestroy(graph):
        return (CUresult.CUDA_SUCCESS,)

    driver = types.ModuleType("cuda.bindings.driver")
    for name, value in list(locals().items()):
        if name.startswith("cu"):
            value = sticky(value) if callable(value) else value
            setattr(driver, name, value)
    for name, value in globals().items():
        if name.startswith("CU"):
            setattr(driver, name, value)
    # Calls that return a value besides the status: what a sticky fault
    # returns in its place.
    driver.cuLinkComplete.results = 3
    for name in ("cuMemAlloc", "cuStreamCreate", "cuEventCreate", "cuModuleLoadData", "cuLinkCreate",
                 "cuModuleLoadDataEx", "cuModuleGetFunction", "cuDeviceGet",
                 "cuDeviceGetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                 "cuFuncGetAttribute", "cuEventElapsedTime", "cuStreamEndCapture",
                 "cuGraphInstantiate", "cuDeviceGetCount", "cuDevicePrimaryCtxRetain",
                 "cuGetErrorName", "cuDeviceGetName", "cuDriverGetVersion"):
        getattr(driver, name).results = 2
    # The error name is what tells a user what happened: never sticky.
    driver.cuGetErrorName = cuGetErrorName
    driver.fault = lambda: state["fault"]
    return driver


def install(driver: types.ModuleType) -> None:
    """Makes `import cuda.bindings.driver` give `driver` in this process."""
    import sys

    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    bindings.__version__ = "fake"
    cuda.bindings = bindings
    sys.modules.update({"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.driver": driver})


def from_environment() -> None:
    """Installs a fake driver when ETC_FAKE_CUDA_MAP names a JSON map."""
    import json

    path = os.environ.get("ETC_FAKE_CUDA_MAP")
    if path:
        with open(path) as f:
            programs = json.load(f)
        install(build(programs, os.environ.get("ETC_FAKE_CUDA_LOG")))
