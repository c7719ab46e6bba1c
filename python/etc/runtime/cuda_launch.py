"""Launching a program's kernels: the parameter words of a launch
(MLIR's memref expansion, see `etc.runtime.cuda`), the device workspace of
one binding of the symbols (intermediates, counters, buffer table, result
words), and `Launch`, one bound run that can be enqueued any number of
times on a stream, also under CUDA-graph capture.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..binding import concrete_shape
from . import cuda_tensor_maps, layout
from .cpu import _STORAGE, from_storage
from .cuda_arrays import DeviceArray, fill_host_out
from .cuda_driver import _check, stream_handle

if TYPE_CHECKING:
    from .cuda import CUDARuntime

#: Threads of the one-CTA initialisation kernel.
INIT_THREADS = 256
#: Threads of the one-CTA end-of-run check, which scans every counter.
CHECK_THREADS = 256


def _memref_words(pointer: int, shape: tuple) -> list[int]:
    """The words of a C-contiguous memref: allocated and aligned pointer,
    offset 0, sizes, strides."""
    strides = []
    stride = 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= max(int(size), 1)
    return [pointer, pointer, 0, *[int(s) for s in shape], *reversed(strides)]


class _Parameters:
    """ctypes storage for one launch's parameters and the `void**` array the
    driver reads them through. A word is an int or a cuda-bindings handle
    (a CUdeviceptr from cuMemAlloc: `int()` is its value, it has no `&`)."""

    def __init__(self, words: list):
        self._values = [ctypes.c_uint64(int(w) & 0xFFFFFFFFFFFFFFFF) for w in words]
        self._array = (ctypes.c_void_p * len(self._values))(
            *[ctypes.addressof(v) for v in self._values])

    def pointer_array(self) -> int:
        return ctypes.addressof(self._array)


@dataclass
class _Kernel:
    """One kernel of the program's module: its name (for messages) and its
    CUfunction."""

    name: str
    function: object


class _Workspace:
    """The device buffers of one binding of the symbols, kept for reuse:
    outputs and intermediates, copies of NumPy inputs, the counter buffer,
    the result words and the buffer table."""

    #: The kinds of buffer allocated one by one; a subclass may place the
    #: others elsewhere (`_allocate_counters`).
    PRIVATE_KINDS = ("output", "intermediate")

    def __init__(self, runtime: "CUDARuntime", symbols: dict[str, int]):
        self.symbols = symbols
        self.buffer_shapes = {arg.name: concrete_shape(arg.shape, symbols)
                              for arg in runtime.arguments if arg.kind != "symbol"}
        self.buffers: dict[str, DeviceArray] = {}
        for arg in runtime.arguments:
            if arg.kind in self.PRIVATE_KINDS:
                self.buffers[arg.name] = runtime._alloc(self.buffer_shapes[arg.name],
                                                        _STORAGE[arg.dtype])
        self.staging: dict[str, DeviceArray] = {}
        # Word 0: g_counters' result (i64); word 1: g_check's status (i32).
        # The buffer table: one word per address and size, whatever the
        # buffers. `run` fills these for each call; a `Launch` from `bind`
        # has its own (see `Launch`).
        self.results, self.table = runtime._table_and_results(self.shapes())
        self.count = runtime._counter_count(self)
        layout.check_count(runtime.abi, self.count)
        self._allocate_counters(runtime)

    def _allocate_counters(self, runtime: "CUDARuntime") -> None:
        """Allocates the counter buffer (`count` words)."""
        self.counters = runtime._alloc((self.count,), np.int32)

    def free(self) -> None:
        """Called when the runtime lets go of the workspace. Nothing to do
        here: each buffer frees its memory when collected, which a `Launch`
        still holding it delays."""

    def shapes(self) -> dict:
        """Stand-ins for every buffer: its shape at these sizes, address 0."""
        return {name: DeviceArray(0, shape, np.uint8)
                for name, shape in self.buffer_shapes.items()}

    def staged(self, runtime, name: str, shape, dtype) -> DeviceArray:
        """The device copy buffer of NumPy input `name`."""
        buffer = self.staging.get(name)
        if buffer is None or buffer.shape != tuple(shape) or buffer.dtype != dtype:
            buffer = self.staging[name] = runtime._alloc(shape, dtype)
        return buffer


class Launch:
    """One bound run of a program on the device: inputs, outputs,
    intermediates and counters allocated (or borrowed), ready to be enqueued
    any number of times on a stream, also under CUDA-graph capture.

    Each launch from `bind` has its own buffer table, result words, copies
    of NumPy inputs and outputs, so that bindings of the same sizes to
    different arrays (or a CUDA graph captured from one) each compute on,
    and into, their own arrays. Bindings of the same sizes share the
    workspace's intermediates and counter buffer: run them one after
    another (on one stream), not at the same time."""

    def __init__(self, runtime: "CUDARuntime", workspace: _Workspace,
                 buffers: dict[str, DeviceArray], copies: list, table: DeviceArray,
                 results: DeviceArray):
        self.runtime = runtime
        self.workspace = workspace
        self.symbols = workspace.symbols
        self.buffers = buffers
        self.counters = workspace.counters
        self.count = workspace.count
        #: This binding's buffer table and result words (device memory).
        self.table, self.results = table, results
        self._copies = copies  # (device buffer, host array): NumPy inputs
        self._parameters: dict[str, _Parameters] = {}

    def _words(self, *extra: tuple[int, tuple]) -> list[int]:
        words = [self.symbols[arg.name] for arg in self.runtime.arguments
                 if arg.kind == "symbol"]
        words += _memref_words(self.table.pointer, self.table.shape)
        for pointer, shape in extra:
            words += _memref_words(pointer, shape)
        return words

    def upload(self, stream=0) -> None:
        """Enqueues the copies of the NumPy inputs and of the buffer table on
        `stream`, and prepares the launch parameters. `bind` does this; call
        it again after changing a bound NumPy input in place, and enqueue on
        `stream` (or on another after waiting for `stream`)."""
        rt = self.runtime
        driver = rt._driver
        stream = stream_handle(stream)
        for device, host in self._copies:
            if host.nbytes:
                _check(driver, "cuMemcpyHtoDAsync",
                       driver.cuMemcpyHtoDAsync(device.pointer, host.ctypes.data, host.nbytes,
                                                stream))
        self._table_host = rt._table(self.buffers)
        # Pageable host memory: the copy has read it when the call returns.
        _check(driver, "cuMemcpyHtoDAsync (buffer table)",
               driver.cuMemcpyHtoDAsync(self.table.pointer,
                                        self._table_host.ctypes.data, self._table_host.nbytes,
                                        stream))
        cuda_tensor_maps.upload(self, stream)
        results = self.results.pointer
        counters = (self.counters.pointer, self.counters.shape)
        # _init and the worker take the same parameters (the driver copies
        # them at each launch, so one array serves both).
        same = _Parameters(self._words(counters))
        self._parameters = {"init": same, "worker": same,
                            "check": _Parameters(self._words(counters, (results + 8, (1,))))}

    def enqueue(self, stream=0) -> None:
        """Enqueues counter initialisation, the persistent worker grid and the
        end-of-run check on `stream` (no copies: capturable as a CUDA graph)."""
        rt = self.runtime
        stream = stream_handle(stream)
        rt._launch(rt._init, (1, INIT_THREADS), self._parameters["init"], stream)
        cuda_tensor_maps.install(self, stream)
        rt._launch(rt._worker, (rt.workers, rt.lanes), self._parameters["worker"], stream,
                   cooperative=rt.abi.schedule == "static", shared=rt.abi.shared_bytes)
        rt._launch(rt._check_kernel, (1, CHECK_THREADS), self._parameters["check"], stream)

    def check(self, stream=0) -> None:
        """Waits for `stream` and raises on a device-side error of the run:
        `WatchdogError` (a spin timed out), task queue overflow, unbalanced
        events. Decodes the trace of a traced program."""
        rt = self.runtime
        driver = rt._driver
        stream = stream_handle(stream)
        _check(driver, "kernel execution (cuStreamSynchronize)", driver.cuStreamSynchronize(stream))
        header = np.zeros(layout.HEADER_WORDS, np.int32)
        first = (self.count - layout.HEADER_WORDS) * 4
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(
            header.ctypes.data, self.counters.pointer + first, header.nbytes))
        layout.check_header(rt.abi, header)
        if rt.abi.trace:
            from .trace import Trace

            rt._trace = Trace.decode(rt.abi, self.counters.numpy(), rt.workers)
        value = np.zeros(1, np.int32)
        _check(driver, "cuMemcpyDtoH", driver.cuMemcpyDtoH(
            value.ctypes.data, self.results.pointer + 8, 4))
        layout.check_status(rt.abi, int(value[0]))

    def collect(self, inputs: dict, out: dict | None) -> list:
        """After a checked run on `inputs`: copies the state buffers given
        as NumPy arrays back into them (a state is updated in place), and
        returns the outputs as NumPy arrays or, with `out` (by name), the
        `out` arrays, NumPy ones filled from the device (`fill_host_out`:
        a bf16 output's uint16 bits copied as they are)."""
        driver = self.runtime._driver
        for arg in self.runtime.arguments:
            value = inputs.get(arg.name)
            if arg.kind == "state" and isinstance(value, np.ndarray) and value.nbytes:
                _check(driver, "cuMemcpyDtoH",
                       driver.cuMemcpyDtoH(value.ctypes.data, self.buffers[arg.name].pointer,
                                           value.nbytes))
        if out is None:
            return self.outputs()
        return fill_host_out(out, self.buffers, self.runtime._dtype, driver)

    def outputs(self) -> list[np.ndarray]:
        """Host copies of the graph's outputs, in `g.output` order."""
        return [from_storage(self.buffers[name].numpy(), self.runtime._dtype(name))
                for name in self.runtime.abi.outputs]
