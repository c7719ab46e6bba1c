"""A stand-in for `cuda.bindings.driver` that runs ETC's CUDA runtime code
without a GPU and is as strict as the driver where the first GPU run would
otherwise find out: device memory is host memory, and a launch of a
graph's `counters`, `init`, `worker` or `check` kernel runs the same
function of a CPU build of the same scheduled program on the launch's
parameters (the buffer table holds host addresses, so the CPU code reads
and writes the "device" buffers in place; the worker grid becomes one
thread per CTA).

`build(programs)` makes one: `programs` maps the SHA-256 of each PTX module
to the CPU build of the same program (a saved artifact's path, or a
compiled CPU kernel). `sitecustomize.py` installs one in every Python
process started with ETC_FAKE_CUDA_MAP set (the GPU kit's children too);
tests may also hand one to `etc.runtime.cuda` directly.

What it holds the caller to, with the error the driver gives:
* handles are cuda-bindings' own types (CUdeviceptr, CUstream, CUevent,
  CUmodule, CUfunction, CUgraph, CUgraphExec, ...), which are not ints
  (no arithmetic, no `==` with an int: `int()` first); a stream, event,
  module, function or graph it did not make is CUDA_ERROR_INVALID_HANDLE;
* memory (`fake_memory.py`): copies and memsets must lie inside one
  allocation (CUDA_ERROR_INVALID_VALUE), a host pointer must not be device
  memory, a free must name a live allocation (INVALID_VALUE for an unknown
  pointer or a second free), cuMemAlloc(0) is INVALID_VALUE;
* launches (`fake_kernels.py`): parameters are read as the PTX's `.entry`
  declares them (count and sizes, from the module's PTX); the launch
  shape is the ABI's (`etc.runtime.cuda`: g_counters grid 1 block 1,
  g_init and g_check grid 1, the worker as many threads per CTA as its
  PTX's `.maxntid` (the compiled lanes; 128 in PTX without one) and, for
  the static schedule, cooperative), else INVALID_VALUE; a cooperative grid
  beyond SMs x occupancy is CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE; more
  than 48 KB of dynamic shared memory needs cuFuncSetAttribute first;
* when a launch runs, every memref and buffer-table entry must lie inside
  device memory with the sizes its symbols give, the worker's buffers
  16-byte aligned and its dynamic shared memory at least the ABI's
  `shared_bytes`; otherwise the context faults with a sticky
  CUDA_ERROR_ILLEGAL_ADDRESS or CUDA_ERROR_MISALIGNED_ADDRESS, and every
  later call fails too, as a real context does after a fault;
* asynchronous work (`fake_streams.py`: launches, async copies and
  memsets, the synchronous cuMemsetD8, which is asynchronous on the
  legacy stream, event records) runs only when the host waits for it, in
  the driver's stream order (legacy and blocking streams, non-blocking
  ones), and unordered work touching the same bytes is a RaceError;
* capture: launches on a capturing stream become a graph that
  cuGraphLaunch replays (parameters copied at capture); a synchronising or
  allocating call during a capture is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
  legacy-stream work beside a capturing blocking stream
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and either invalidates the capture.

It also plays the kernels of `etc.runtime.probes` on the host, links PTX
with the driver's JIT linker (`cuLink*`) into a "cubin" that names the
first PTX added, and, for a program on several ranks, runs the CPU build
with the transport block of the fake NVSHMEM's heap (`fake_nvshmem.py`),
refusing a worker whose module `nvshmemx_cumodule_init` did not see.
`driver.why()` says what the fake saw at the last refusal or fault.

A CPU build of native CPU kernels reads packed weights in the GGUF
layout: while its worker runs, the device copies of its repacked packed
inputs (the CUDA runtime uploads the GPU layout of `etc.packed`) hold
their GGUF bytes, put back after (`fake_kernels._gguf_layout`); a build
of the CUDA kernels (`kernels="cuda"`) reads them as they are.

What it cannot check: the PTX itself (ptxas tests and a real GPU do that).
ETC_FAKE_CUDA_LOG (if set) names a file that gets one line per launch
(plain or cooperative, kernel, schedule).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import threading
import time
import types
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fake_kernels  # noqa: E402
import fake_tensor_maps  # noqa: E402
from fake_memory import HostReader, Memory  # noqa: E402
from fake_streams import LEGACY, NON_BLOCKING, Fault, RaceError, Streams  # noqa: E402
from cuda.bindings import driver as REAL  # noqa: E402,N812  (handle and enum types)

#: How a fake "cubin" from cuLinkComplete starts (then the first PTX's SHA-256).
CUBIN_MARKER = "fake-cubin:"
#: Dynamic shared memory a kernel may use without cuFuncSetAttribute.
DEFAULT_SHARED = 48 << 10
#: What the device allows one CTA after opting in (an H100's 227 KB).
SHARED_OPTIN = 227 << 10
#: cuEventCreate's flag for an event without timing.
EVENT_DISABLE_TIMING = 2

CUresult = REAL.CUresult
SMS = 2
_ATTRIBUTES = {16: SMS, 38: 1 << 20, 39: 2048, 75: 9, 76: 0, 81: 228 << 10, 95: 1,
               97: SHARED_OPTIN}
_FUNCTION_ATTRIBUTES = {4: 40, 3: 0, 1: 16, 0: 1024}  # registers, local, static shared, threads
#: Calls that return a value besides the status (what a sticky fault
#: returns in its place), and cuLinkComplete's two.
_TWO_RESULTS = ("cuTensorMapEncodeTiled", "cuMemAlloc", "cuStreamCreate", "cuEventCreate", "cuModuleLoadData",
                "cuLinkCreate", "cuModuleLoadDataEx", "cuModuleGetFunction", "cuDeviceGet",
                "cuDeviceGetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                "cuFuncGetAttribute", "cuEventElapsedTime", "cuStreamEndCapture",
                "cuGraphInstantiate", "cuDeviceGetCount", "cuDevicePrimaryCtxRetain",
                "cuDeviceGetName", "cuDriverGetVersion")


@dataclass
class _Event:
    flags: int
    work: object = None
    time: float | None = None


def _handle(value) -> int:
    """The handle of a cuda-bindings object or int argument (None is 0)."""
    return 0 if value is None else int(value)


def build(programs: dict, log: str | None = None) -> types.ModuleType:
    """A fake `cuda.bindings.driver` module; see the module docstring."""
    memory, reader = Memory(), HostReader()
    state = {"fault": None, "why": ""}
    handles = iter(range(0x1000, 1 << 30, 0x10))
    modules: dict[int, tuple] = {}      # handle -> (program, entries)
    module_ptx: dict[int, str] = {}     # handle -> its PTX (its globals)
    module_globals: dict[tuple, tuple] = {}  # (handle, name) -> (pointer, bytes)
    functions: dict[int, fake_kernels.Function] = {}
    events: dict[int, _Event] = {}
    graphs: dict[int, list] = {}
    executables: dict[int, list] = {}
    links: dict[int, list] = {}
    cubins: dict[str, str] = {}        # a linked "cubin"'s digest -> its first PTX
    opted_in: dict[int, int] = {}
    lock = threading.RLock()

    def fault(error: Fault) -> CUresult:
        state["fault"], state["why"] = error.code, error.why
        print(f"fake CUDA driver: {CUresult(error.code).name}: {error.why}", file=sys.stderr,
              flush=True)
        return error.code

    streams = Streams()

    def refuse(code, why: str) -> tuple:
        state["why"] = why
        return (code,)

    def record(how: str, function) -> None:
        if log and function.program != "probes":
            with open(log, "a") as f:
                f.write(f"{how} {function.name} {function.program.abi.schedule}\n")

    def attempt(run) -> tuple:
        """Runs queued work; a fault becomes the context's sticky error, a
        race too (and is raised)."""
        try:
            run()
        except Fault as error:
            return (fault(error),)
        except RaceError as error:
            state["fault"], state["why"] = CUresult.CUDA_ERROR_LAUNCH_FAILED, str(error)
            raise
        return (CUresult.CUDA_SUCCESS,)

    def wait(clock: dict) -> tuple:
        return attempt(lambda: streams.wait(clock))

    # -- what may not happen while a stream is being captured ------------------

    def unsafe_during_capture(what: str):
        """A synchronising or allocating call while a capture is in progress
        (CU_STREAM_CAPTURE_MODE_GLOBAL): refused, and the capture is lost."""
        if not streams.capturing:
            return None
        for stream in streams.capturing:
            streams.invalidated.setdefault(stream, f"{what} was called during the capture")
        return refuse(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                      f"{what} is not allowed while a stream is being captured")

    def implicit_capture(stream: int, what: str):
        """Legacy-stream work while a blocking stream is captured would make
        one depend on the other: refused, and the capture is lost."""
        if stream != LEGACY:
            return None
        blocking = [s for s in streams.capturing if streams.blocking(s)]
        for captured in blocking:
            streams.invalidated.setdefault(captured, f"{what} on the legacy stream")
        if blocking:
            return refuse(CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                          f"{what} on the legacy stream while blocking stream "
                          f"{blocking[0]:#x} is being captured")
        return None

    def submit(stream: int, what: str, prepare, perform):
        """Queues work on `stream`: a Work, or the refusal."""
        refused = implicit_capture(stream, what)
        if refused:
            return refused
        if stream in streams.capturing:
            raise NotImplementedError(f"the fake CUDA driver captures kernel launches only, "
                                      f"not {what} (Launch.enqueue captures launches only)")
        return streams.queue(stream, what, prepare, perform)

    def stream_of(stream) -> int | None:
        value = _handle(stream)
        return value if streams.known(value) else None

    # -- device and context -----------------------------------------------------

    def cuInit(flags):
        return (CUresult.CUDA_SUCCESS,)

    def cuDeviceGetCount():
        return (CUresult.CUDA_SUCCESS, int(os.environ.get("ETC_FAKE_CUDA_DEVICES", "1")))

    def cuDeviceGet(ordinal):
        if not 0 <= int(ordinal) < cuDeviceGetCount()[1]:
            return (CUresult.CUDA_ERROR_INVALID_DEVICE, None)
        return (CUresult.CUDA_SUCCESS, REAL.CUdevice(int(ordinal)))

    def cuDeviceGetAttribute(attribute, device):
        return (CUresult.CUDA_SUCCESS, _ATTRIBUTES[int(attribute)])

    def cuDeviceGetName(length, device):
        return (CUresult.CUDA_SUCCESS, b"Fake CUDA device (CPU)\0")

    def cuDriverGetVersion():
        return (CUresult.CUDA_SUCCESS, 13000)

    def cuDevicePrimaryCtxRetain(device):
        return (CUresult.CUDA_SUCCESS, REAL.CUcontext(1))

    def cuCtxSetCurrent(context):
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxSynchronize():
        return unsafe_during_capture("cuCtxSynchronize") or wait(streams.everything())

    def cuGetErrorName(error):
        try:
            return (CUresult.CUDA_SUCCESS, CUresult(int(error)).name.encode())
        except ValueError:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)

    # -- memory -------------------------------------------------------------------

    def device_range(pointer, nbytes, what: str):
        """None when [pointer, +nbytes) lies in one allocation, else the refusal."""
        if memory.find(_handle(pointer), nbytes) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          f"{what}: [{_handle(pointer):#x}, +{nbytes}) does not lie inside one "
                          "device allocation")
        return None

    def host_pointer(pointer, what: str):
        if memory.touches(_handle(pointer)):
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          f"{what}: the host pointer {_handle(pointer):#x} is device memory")
        return None

    def cuMemAlloc(nbytes):
        refused = unsafe_during_capture("cuMemAlloc")
        if refused:
            return refused + (None,)
        if int(nbytes) <= 0:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return (CUresult.CUDA_SUCCESS, REAL.CUdeviceptr(memory.allocate(int(nbytes))))

    def cuMemFree(pointer):
        refused = unsafe_during_capture("cuMemFree")
        if refused:
            return refused
        pointer = _handle(pointer)
        if pointer == 0:  # as cudaFree(NULL)
            return (CUresult.CUDA_SUCCESS,)
        if not memory.free(pointer, streams.seq + 1):
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          f"cuMemFree({pointer:#x}): no live allocation starts there (never "
                          "allocated, inside an allocation, or freed already)")
        # The memory goes once all work queued before the free has run.
        work = streams.queue(LEGACY, "cuMemFree", lambda: [], lambda: None, everything=True)
        work.perform = lambda: memory.release(work.seq)
        return (CUresult.CUDA_SUCCESS,)

    def memset(pointer, value, nbytes, stream: int, what: str):
        pointer, nbytes = _handle(pointer), int(nbytes)
        if nbytes == 0:
            return (CUresult.CUDA_SUCCESS,)
        refused = device_range(pointer, nbytes, what)
        if refused:
            return refused
        work = submit(stream, what, lambda: [(pointer, pointer + nbytes, True)],
                      lambda: ctypes.memset(pointer, int(value), nbytes))
        return work if isinstance(work, tuple) else (CUresult.CUDA_SUCCESS,)

    def cuMemsetD8(pointer, value, nbytes):
        # Asynchronous with respect to the host, on the legacy stream.
        return memset(pointer, value, nbytes, LEGACY, "cuMemsetD8")

    def cuMemsetD8Async(pointer, value, nbytes, stream):
        if stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuMemsetD8Async: unknown stream")
        return memset(pointer, value, nbytes, stream_of(stream), "cuMemsetD8Async")

    def copy(destination, source, nbytes, stream: int, what: str, into_device: bool,
             from_device: bool, synchronous: bool):
        destination, source, nbytes = _handle(destination), _handle(source), int(nbytes)
        if nbytes == 0:
            return (CUresult.CUDA_SUCCESS,)
        if synchronous:
            refused = unsafe_during_capture(what)
            if refused:
                return refused
        checks = [device_range(destination, nbytes, what) if into_device
                  else host_pointer(destination, what),
                  device_range(source, nbytes, what) if from_device
                  else host_pointer(source, what)]
        refused = next((c for c in checks if c), None)
        if refused:
            return refused
        touched = ([(destination, destination + nbytes, True)] if into_device else []) + \
                  ([(source, source + nbytes, False)] if from_device else [])
        if from_device:
            perform = lambda: ctypes.memmove(destination, source, nbytes)  # noqa: E731
        else:  # pageable host memory is staged when the call is made
            staged = ctypes.create_string_buffer(ctypes.string_at(source, nbytes), nbytes)
            perform = lambda: ctypes.memmove(destination, staged, nbytes)  # noqa: E731
        work = submit(stream, what, lambda: touched, perform)
        if isinstance(work, tuple):
            return work
        # Into pageable host memory, or synchronous: done when the call returns.
        return wait(work.clock) if synchronous or not into_device else (CUresult.CUDA_SUCCESS,)

    def cuMemcpyHtoD(destination, source, nbytes):
        return copy(destination, source, nbytes, LEGACY, "cuMemcpyHtoD", True, False, True)

    def cuMemcpyDtoH(destination, source, nbytes):
        return copy(destination, source, nbytes, LEGACY, "cuMemcpyDtoH", False, True, True)

    def async_copy(what: str, into_device: bool, from_device: bool):
        def call(destination, source, nbytes, stream):
            if stream_of(stream) is None:
                return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, f"{what}: unknown stream")
            return copy(destination, source, nbytes, stream_of(stream), what, into_device,
                        from_device, False)
        return call

    cuMemcpyHtoDAsync = async_copy("cuMemcpyHtoDAsync", True, False)
    cuMemcpyDtoHAsync = async_copy("cuMemcpyDtoHAsync", False, True)
    cuMemcpyDtoDAsync = async_copy("cuMemcpyDtoDAsync", True, True)

    # -- streams and events --------------------------------------------------------

    def cuStreamCreate(flags):
        stream = next(handles)
        streams.create(stream, int(flags) & NON_BLOCKING)
        return (CUresult.CUDA_SUCCESS, REAL.CUstream(stream))

    def cuStreamDestroy(stream):
        if stream_of(stream) in (None, LEGACY):
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy: unknown stream")
        streams.destroy(_handle(stream))
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(stream):
        if stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE,
                          "cuStreamSynchronize: unknown stream")
        return unsafe_during_capture("cuStreamSynchronize") or wait(
            streams.stream_clock(stream_of(stream)))

    def query(clock: dict) -> tuple:
        """Progress, as a GPU makes it while the host polls: queued work
        runs at the first query, which says it was not ready."""
        if not streams.busy(clock):
            return wait(clock)
        result = attempt(lambda: streams.run_until(clock))
        return result if result[0] != CUresult.CUDA_SUCCESS else (CUresult.CUDA_ERROR_NOT_READY,)

    def cuStreamQuery(stream):
        if stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuStreamQuery: unknown stream")
        if stream_of(stream) in streams.capturing:
            return refuse(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "cuStreamQuery of a capturing stream")
        return query(streams.stream_clock(stream_of(stream)))

    def cuEventCreate(flags):
        event = next(handles)
        events[event] = _Event(int(flags))
        return (CUresult.CUDA_SUCCESS, REAL.CUevent(event))

    def cuEventDestroy(event):
        if events.pop(_handle(event), None) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy: unknown event")
        return (CUresult.CUDA_SUCCESS,)

    def cuEventRecord(event, stream):
        found = events.get(_handle(event))
        if found is None or stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: unknown event or "
                                                              "stream")

        def happened():
            found.time = time.perf_counter()

        work = submit(stream_of(stream), "cuEventRecord", lambda: [], happened)
        if isinstance(work, tuple):
            return work
        found.work, found.time = work, None
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(event):
        found = events.get(_handle(event))
        if found is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize: unknown event")
        if found.work is None:  # never recorded: complete
            return (CUresult.CUDA_SUCCESS,)
        return unsafe_during_capture("cuEventSynchronize") or wait(found.work.clock)

    def cuEventQuery(event):
        found = events.get(_handle(event))
        if found is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE, "cuEventQuery: unknown event")
        return (CUresult.CUDA_SUCCESS,) if found.work is None else query(found.work.clock)

    def cuEventElapsedTime(start, end):
        first, second = events.get(_handle(start)), events.get(_handle(end))
        if first is None or second is None or first.work is None or second.work is None or \
                (first.flags | second.flags) & EVENT_DISABLE_TIMING:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if first.time is None or second.time is None:
            return (CUresult.CUDA_ERROR_NOT_READY, None)
        return (CUresult.CUDA_SUCCESS, (second.time - first.time) * 1e3)

    # -- modules and functions ---------------------------------------------------------

    def program_of(ptx: str):
        from etc.runtime import probes

        if ptx.startswith(probes.MARKER):
            return "probes", ptx
        if ptx.startswith(CUBIN_MARKER):
            digest = ptx[len(CUBIN_MARKER):]
            ptx = cubins.get(digest, "")
        else:
            digest = hashlib.sha256(ptx.encode()).hexdigest()
        entry = programs.get(digest)
        if isinstance(entry, str):
            import etc.runtime  # the caller's etc (the kit's copy in the kit)

            entry = etc.runtime.load(entry)
        return entry, ptx

    def cuModuleLoadData(image):
        return cuModuleLoadDataEx(image, 0, [], [])

    def cuModuleLoadDataEx(image, count, options, values):
        program, ptx = program_of(ctypes.string_at(_handle(image)).decode())
        logs = {int(o): v for o, v in zip(options, values)}
        if program is None:
            error = b"ptxas fatal   : (fake driver) no CPU build of this PTX is known\0"
            buffer = logs.get(int(REAL.CUjit_option.CU_JIT_ERROR_LOG_BUFFER))
            if buffer is not None:
                buffer[:len(error)] = error
            return (CUresult.CUDA_ERROR_INVALID_PTX, None)
        info = logs.get(int(REAL.CUjit_option.CU_JIT_INFO_LOG_BUFFER))
        if info is not None:
            text = b"ptxas info    : (fake driver) 40 registers, 0 bytes spill\0"
            info[:len(text)] = text
        module = next(handles)
        modules[module] = (program, fake_kernels.entries(ptx), fake_kernels.max_threads(ptx))
        module_ptx[module] = ptx
        return (CUresult.CUDA_SUCCESS, REAL.CUmodule(module))

    def cuLinkCreate(count, options, values):
        state_ = next(handles)
        links[state_] = []
        return (CUresult.CUDA_SUCCESS, REAL.CUlinkState(state_))

    def cuLinkAddData(state_, kind, data, size, name, count, options, values):
        if _handle(state_) not in links or \
                int(kind) != int(REAL.CUjitInputType.CU_JIT_INPUT_PTX):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        links[_handle(state_)].append(ctypes.string_at(_handle(data)).decode())
        return (CUresult.CUDA_SUCCESS,)

    def cuLinkComplete(state_):
        sources = links.get(_handle(state_))
        if not sources:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None, None)
        digest = hashlib.sha256(sources[0].encode()).hexdigest()
        cubins[digest] = sources[0]
        image = ctypes.create_string_buffer((CUBIN_MARKER + digest).encode())
        links[_handle(state_)] = image  # alive until cuLinkDestroy, as the driver's
        return (CUresult.CUDA_SUCCESS, ctypes.addressof(image), len(image.value))

    def cuLinkDestroy(state_):
        links.pop(_handle(state_), None)
        return (CUresult.CUDA_SUCCESS,)

    def cuModuleGetFunction(module, name):
        found = modules.get(_handle(module))
        if found is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        program, entries, bounds = found
        name = name.decode()
        if name not in entries:
            return (CUresult.CUDA_ERROR_NOT_FOUND, None)
        role = name
        if program != "probes":
            prefix = program.abi.name + "_"
            role = name[len(prefix):] if name.startswith(prefix) else None
        function = next(handles)
        functions[function] = fake_kernels.Function(program, role, name, entries[name],
                                                    bounds.get(name))
        return (CUresult.CUDA_SUCCESS, REAL.CUfunction(function))

    def cuModuleGetGlobal(module, name):
        """A global the module's PTX declares, in device memory of its own
        (zeroed) for the module's life."""
        module = _handle(module)
        if module not in modules:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None, None)
        name = name.decode()
        if (module, name) not in module_globals:
            size = fake_tensor_maps.global_size(module_ptx.get(module, ""), name)
            if size is None:
                return (CUresult.CUDA_ERROR_NOT_FOUND, None, None)
            module_globals[module, name] = (memory.allocate(size), size)
        pointer, size = module_globals[module, name]
        return (CUresult.CUDA_SUCCESS, REAL.CUdeviceptr(pointer), size)

    def cuTensorMapEncodeTiled(dtype, rank, address, dims, strides, box, element_strides,
                               interleave, swizzle, l2, oob):
        fields = dict(dtype=int(dtype), rank=int(rank), address=_handle(address),
                      dims=[int(d) for d in dims], strides=[int(s) for s in strides],
                      box=[int(b) for b in box],
                      element_strides=[int(e) for e in element_strides],
                      interleave=int(interleave), swizzle=int(swizzle))
        why = fake_tensor_maps.rules(**fields)
        if why is not None:
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          f"cuTensorMapEncodeTiled: {why}") + (None,)
        tensor_map = REAL.CUtensorMap()
        padded = {f"dim{i}": d for i, d in enumerate(fields["dims"] + [0, 0])}
        padded.update({f"box{i}": b for i, b in enumerate(fields["box"] + [0, 0])})
        padded.update({f"element_stride{i}": e
                       for i, e in enumerate(fields["element_strides"] + [0, 0])})
        tensor_map.opaque = fake_tensor_maps.encode(dict(
            padded, dtype=fields["dtype"], rank=fields["rank"], address=fields["address"],
            stride0=(fields["strides"] + [0])[0], interleave=fields["interleave"],
            swizzle=fields["swizzle"], l2=int(l2), oob=int(oob)))
        return (CUresult.CUDA_SUCCESS, tensor_map)

    def cuFuncGetAttribute(attribute, function):
        if _handle(function) not in functions:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        if int(attribute) == 8:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            return (CUresult.CUDA_SUCCESS, opted_in.get(_handle(function), DEFAULT_SHARED))
        return (CUresult.CUDA_SUCCESS, _FUNCTION_ATTRIBUTES[int(attribute)])

    def cuFuncSetAttribute(function, attribute, value):
        if _handle(function) not in functions:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if int(attribute) == 8:
            if int(value) > SHARED_OPTIN:
                return (CUresult.CUDA_ERROR_INVALID_VALUE,)
            opted_in[_handle(function)] = int(value)
        return (CUresult.CUDA_SUCCESS,)

    def occupancy(shared: int) -> int:
        return 1 if shared <= SHARED_OPTIN else 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, shared):
        if _handle(function) not in functions:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        return (CUresult.CUDA_SUCCESS, occupancy(int(shared)))

    # -- launches -------------------------------------------------------------------------

    def launch_work(function, grid: int, shared: int, values: list, seq: int):
        """(prepare, perform) of one launch with these parameter values,
        queued as work `seq`."""
        program = function.program
        illegal = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS

        def prepare():
            if program != "probes" and function.role == "worker" and \
                    shared < program.abi.shared_bytes:
                raise Fault(illegal, f"{function.name} was launched with {shared} bytes of "
                                     f"dynamic shared memory; its scratch needs "
                                     f"{program.abi.shared_bytes}")
            return fake_kernels.accesses(memory, function, values, grid, seq, illegal,
                                         CUresult.CUDA_ERROR_MISALIGNED_ADDRESS)

        def initialised() -> bool:
            """Whether NVSHMEM saw a module of this program."""
            import fake_nvshmem

            return any(fake_nvshmem.initialised(handle)
                       for handle, (loaded, *_) in modules.items() if loaded is program)

        def perform():
            if program == "probes":
                fake_kernels.run_probe(function.name, grid, values, SMS)
            else:
                fake_kernels.run_program(function, grid, values, initialised, illegal,
                                         CUresult.CUDA_ERROR_LAUNCH_FAILED)

        return prepare, perform

    def launch(how, function, grid, block, shared, stream, params, extra=None):
        found = functions.get(_handle(function))
        if found is None or stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE,
                          f"{how} launch: unknown function or stream")
        if params and extra:
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          "kernelParams and extra are both given")
        if int(shared) > opted_in.get(_handle(function), DEFAULT_SHARED):
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE,
                          f"{found.name}: {int(shared)} bytes of dynamic shared memory, more than "
                          "its limit (cuFuncSetAttribute raises it above 48 KB)")
        if found.role is None or (found.program != "probes" and
                                  found.role not in fake_kernels.ROLES):
            return refuse(CUresult.CUDA_ERROR_NOT_SUPPORTED,
                          f"the fake driver cannot run {found.name}")
        resident = SMS * occupancy(int(shared))
        grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
        why = fake_kernels.shape_error(found, grid, block, how == "cooperative", resident)
        if why == "cooperative":
            return refuse(CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                          f"{found.name}: {grid[0]} CTAs cannot all be resident ({resident})")
        if why:
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE, why)
        values = fake_kernels.read_parameters(reader, _handle(params), found.sizes)
        if isinstance(values, str):
            return refuse(CUresult.CUDA_ERROR_INVALID_VALUE, f"{found.name}: {values}")
        return enqueue_launch(how, found, grid[0], int(shared), values, stream_of(stream))

    def enqueue_launch(how, function, grid, shared, values, stream):
        what = f"{function.name} ({how} launch)"
        refused = implicit_capture(stream, what)
        if refused:
            return refused
        if stream in streams.capturing:  # the driver copies the parameters now
            streams.capturing[stream].append((how, function, grid, shared, values))
            return (CUresult.CUDA_SUCCESS,)
        # The work this launch becomes is the next one queued.
        prepare, perform = launch_work(function, grid, shared, values, streams.seq + 1)
        streams.queue(stream, what, prepare, perform)
        record(how, function)
        return (CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return launch("plain", function, (gx, gy, gz), (bx, by, bz), shared, stream, params,
                      extra)

    def cuLaunchCooperativeKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params):
        return launch("cooperative", function, (gx, gy, gz), (bx, by, bz), shared, stream,
                      params)

    # -- graphs ------------------------------------------------------------------------------

    def cuStreamBeginCapture(stream, mode):
        if stream_of(stream) in (None, LEGACY):
            return refuse(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "capture of the legacy stream or an unknown one")
        if stream_of(stream) in streams.capturing:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        streams.capturing[stream_of(stream)] = []
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamEndCapture(stream):
        stream = _handle(stream)
        if stream not in streams.capturing:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE, None)
        recorded = streams.capturing.pop(stream)
        why = streams.invalidated.pop(stream, None)
        if why:
            state["why"] = f"the capture was invalidated: {why}"
            return (CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        graph = next(handles)
        graphs[graph] = recorded
        return (CUresult.CUDA_SUCCESS, REAL.CUgraph(graph))

    def cuGraphInstantiate(graph, flags):
        if _handle(graph) not in graphs:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        executable = next(handles)
        executables[executable] = list(graphs[_handle(graph)])
        return (CUresult.CUDA_SUCCESS, REAL.CUgraphExec(executable))

    def cuGraphLaunch(executable, stream):
        calls = executables.get(_handle(executable))
        if calls is None or stream_of(stream) is None:
            return refuse(CUresult.CUDA_ERROR_INVALID_HANDLE,
                          "cuGraphLaunch: unknown graph or stream")
        for how, function, grid, shared, values in calls:
            result = enqueue_launch(how, function, grid, shared, values, stream_of(stream))
            if result[0] != CUresult.CUDA_SUCCESS:
                return result
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphExecDestroy(executable):
        if executables.pop(_handle(executable), None) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphDestroy(graph):
        if graphs.pop(_handle(graph), None) is None:
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        return (CUresult.CUDA_SUCCESS,)

    # -- for the fake NVSHMEM and tests --------------------------------------------------------

    def defer(stream, what: str, touched: list, perform) -> None:
        """Queues host-played work (the fake NVSHMEM's collectives on a
        stream) in stream order; `touched` as (start, nbytes, writes)."""
        if stream_of(stream) is None:
            raise ValueError(f"{what}: unknown stream {stream!r}")
        for start, nbytes, _ in touched:
            if memory.find(start, nbytes) is None:
                raise ValueError(f"{what}: [{start:#x}, +{nbytes}) is not device memory")
        ranges = [(start, start + nbytes, writes) for start, nbytes, writes in touched]
        work = submit(stream_of(stream), what, lambda: ranges, perform)
        if isinstance(work, tuple):
            raise RuntimeError(f"{what}: {state['why']}")

    driver = types.ModuleType("cuda.bindings.driver")
    api = {name: value for name, value in locals().items()
           if name.startswith("cu") and callable(value)}
    for name, call in api.items():
        setattr(driver, name, _sticky(call, state, lock, 3 if name in ("cuLinkComplete",
                                                                       "cuModuleGetGlobal")
                                      else 2 if name in _TWO_RESULTS else 1))
    for name in dir(REAL):
        if name.startswith("CU") and isinstance(getattr(REAL, name), type):
            setattr(driver, name, getattr(REAL, name))
    # The error name is what tells a user what happened: never sticky.
    driver.cuGetErrorName = cuGetErrorName
    driver.fault = lambda: state["fault"]
    driver.why = lambda: state["why"]
    driver.memory = memory
    driver.defer = lambda *args: _locked(lock, defer, *args)
    driver.register_memory = memory.external
    driver.FAKE = True
    return driver


def _locked(lock, call, *args):
    with lock:
        return call(*args)


def _sticky(call, state: dict, lock, results: int):
    """A fault ends the context: every later call returns its error."""
    def wrapper(*args):
        with lock:
            if state["fault"] is not None:
                return (state["fault"],) + (None,) * (results - 1)
            return call(*args)
    wrapper.__name__ = call.__name__
    return wrapper


def install(driver: types.ModuleType) -> None:
    """Makes `import cuda.bindings.driver` give `driver` in this process."""
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
