"""Kernels of the fake CUDA driver (`fake_driver.py`): the `.entry`
parameter lists of the PTX a module was loaded from (the driver copies
each parameter's declared size from `kernelParams[i]`, and nothing tells
it how long the caller's array is), the launch shapes the programs' ABI
allows (`etc.runtime.cuda`), and what a launch does when it runs: the
same function of the CPU build of the program, on the buffers its
parameters and buffer table name, after checking that every one of them
lies inside device memory and matches the sizes its symbols give.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from fake_streams import Fault

#: Threads per worker CTA the tile kernels are written for when the
#: worker's PTX does not say (`.maxntid`, which the compiler writes from
#: `etc.compile(..., lanes=)`; PTX from before it has none and was compiled
#: for 128): `etc.ops.base.Target.lanes`. The GEMV's and MMA's warp counts
#: are compiled in, so a worker launched with another block size computes
#: something else.
WORKER_LANES = 128
#: The device's limit on threads per CTA.
MAX_THREADS = 1024

#: Bytes of each PTX parameter type.
_TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.[bsuf](8|16|32|64)\s+(?:\.ptr\s+)?"
                    r"(?:\.\w+\s+)*(?:\.align\s+\d+\s+)?[\w$]+\s*(?:\[(\d+)\])?")

#: Each role of a program's kernels: its memrefs after the symbols, as
#: (what, element bytes, writes), and its launch shape (grid, block; None:
#: any legal value; "workers": the worker grid).
ROLES = {
    "counters": ((("table", 8, False), ("result", 8, True)), (1, 1)),
    "init": ((("table", 8, False), ("counters", 4, True)), (1, None)),
    "worker": ((("table", 8, False), ("counters", 4, True)), ("workers", WORKER_LANES)),
    "check": ((("table", 8, False), ("counters", 4, False), ("result", 4, True)), (1, None)),
}
#: The probes' launch shapes (`etc.runtime.probes`' docstring).
PROBE_SHAPES = {"etc_spin": (1, 1), "etc_probe_sm": (None, None), "etc_probe_timer": (1, 1)}


_MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def max_threads(ptx: str) -> dict[str, int]:
    """Each `.entry` of `ptx` that declares `.maxntid` (between its
    parameter list and its body): the threads per CTA it allows."""
    found = {}
    for match in _ENTRY.finditer(ptx):
        body = ptx.find("{", match.end())
        bound = _MAXNTID.search(ptx, match.end(), body if body >= 0 else len(ptx))
        if bound is not None:
            found[match.group(1)] = 1
            for size in bound.groups():
                found[match.group(1)] *= int(size or 1)
    return found


def entries(ptx: str) -> dict[str, list[int]]:
    """The byte size of each parameter of each `.entry` of `ptx`."""
    found = {}
    for name, body in _ENTRY.findall(ptx):
        params = [p for p in body.split(",") if p.strip()]
        sizes = []
        for param in params:
            match = _PARAM.search(param)
            if match is None:
                raise ValueError(f"fake driver: cannot read the PTX parameter {param.strip()!r} "
                                 f"of .entry {name}")
            bits, count = match.groups()
            sizes.append(_TYPE_BYTES[bits] * int(count or 1))
        found[name] = sizes
    return found


@dataclass
class Function:
    """A CUfunction: its module's program (a CPU build, or "probes"), the
    role it plays there, its name and its parameters' sizes."""

    program: object
    role: str
    name: str
    sizes: list
    #: Its `.maxntid` (threads per CTA), when its PTX declares one.
    max_threads: int | None = None


def shape_error(function: Function, grid: tuple, block: tuple, cooperative: bool,
                resident: int) -> str | None:
    """Why the driver or the program's ABI refuses this launch shape, or
    None. `resident`: CTAs of this shape that fit on the device at once."""
    if min(grid) < 1 or min(block) < 1:
        return f"grid {grid} and block {block} must be at least 1 in every dimension"
    if block[0] * block[1] * block[2] > MAX_THREADS:
        return f"block {block} has more than {MAX_THREADS} threads"
    if function.max_threads is not None and block[0] * block[1] * block[2] > function.max_threads:
        return f"block {block} has more than the {function.max_threads} threads of its .maxntid"
    if grid[1:] != (1, 1) or block[1:] != (1, 1):
        return (f"{function.name} uses dimension x only: grid {grid} and block {block} must be "
                "1 in y and z")
    if function.program == "probes":
        want_grid, want_block = PROBE_SHAPES[function.name]
    else:
        want_grid, want_block = ROLES[function.role][1]
        if function.role == "worker" and function.max_threads is not None:
            # The worker's lanes, as its PTX declares them.
            want_block = function.max_threads
        if function.role == "worker" and function.program.abi.schedule == "static" \
                and not cooperative:
            return (f"{function.name}: the static schedule's worker CTAs wait for each other, so "
                    "it needs a cooperative launch (the driver then makes them co-resident)")
    if isinstance(want_grid, int) and grid[0] != want_grid:
        return f"{function.name} runs on a grid of {want_grid}, launched with {grid[0]}"
    if want_block is not None and block[0] != want_block:
        return (f"{function.name} is written for {want_block} threads per CTA, launched with "
                f"{block[0]}")
    if cooperative and grid[0] > resident:
        return "cooperative"
    return None


def read_parameters(reader, params: int, sizes: list) -> list[int] | str:
    """Each parameter's value (unsigned), read as the driver reads them:
    `sizes[i]` bytes from where `kernelParams[i]` points; or why not."""
    if not sizes:
        return []
    if not params:
        return f"kernelParams is NULL, and the kernel has {len(sizes)} parameters"
    values = []
    for i, size in enumerate(sizes):
        slot = reader.read(params + 8 * i, 8)
        pointer = int.from_bytes(slot, "little") if slot else 0
        data = reader.read(pointer, size) if pointer else None
        if data is None:
            return (f"kernelParams[{i}] ({pointer:#x}) is not readable host memory: the kernel "
                    f"has {len(sizes)} parameters of {sizes} bytes, so the array needs "
                    f"{len(sizes)} pointers")
        values.append(int.from_bytes(data, "little"))
    return values


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# ---------------------------------------------------------------------------
# What a launch touches, and running it
# ---------------------------------------------------------------------------

def accesses(memory, function: Function, values: list, grid: int, seq: int, illegal,
             misaligned) -> list:
    """The byte ranges the launch reads and writes, after checking that each
    lies in device memory; raises Fault(illegal or misaligned, why)."""
    if function.program == "probes":
        out, count = (values + [0, 0])[:2]
        extent = {"etc_probe_sm": 32 * grid, "etc_probe_timer": 8 * count}.get(function.name, 0)
        return _inside(memory, [(out, extent, True, "the output")], seq, illegal, function)
    program = function.program
    symbols = [a for a in program.arguments if a.kind == "symbol"]
    memrefs = ROLES[function.role][0]
    if len(values) != len(symbols) + 5 * len(memrefs):
        raise Fault(illegal, f"{function.name} has {len(values)} parameters; its program's ABI "
                             f"has {len(symbols)} symbols and {len(memrefs)} memrefs "
                             f"({len(symbols) + 5 * len(memrefs)} words)")
    bound = {arg.name: _signed(v) for arg, v in zip(symbols, values)}
    ranges, descriptors = [], {}
    for m, (what, element, writes) in enumerate(memrefs):
        allocated, aligned, offset, size, stride = values[len(symbols) + 5 * m:][:5]
        if allocated != aligned or offset != 0 or stride != 1:
            raise Fault(illegal, f"{function.name}: the {what} memref is ({allocated:#x}, "
                                 f"{aligned:#x}, offset {offset}, size {size}, stride {stride}); "
                                 "the runtime passes the same pointer twice, offset 0, stride 1")
        descriptors[what] = (aligned, size)
        ranges.append((aligned, size * element, writes, f"the {what} memref"))
    found = _inside(memory, ranges, seq, illegal, function)
    if function.role != "worker":
        return found
    from etc import packed
    from etc.binding import concrete_shape
    from etc.runtime.cpu import _STORAGE, table_slots

    slots, words = table_slots(program.arguments)
    table, size = descriptors["table"]
    if size < words:
        raise Fault(illegal, f"{function.name}: the buffer table has {size} words, the program's "
                             f"{words}")
    table_words = (ctypes.c_int64 * max(words, 1)).from_address(table)
    buffers = []
    for arg in program.arguments:
        if arg.kind == "symbol":
            continue
        slot = slots[arg.name]
        address = table_words[slot] & 0xFFFFFFFFFFFFFFFF
        sizes = tuple(table_words[slot + 1:slot + 1 + len(arg.shape)])
        expected = concrete_shape(arg.shape, bound)
        if packed.is_packed(arg.dtype):
            # A packed weight's buffer is its blocks' bytes: (..., bytes of
            # a row), which the table gives, as the CPU runtime's does.
            expected = tuple(packed.storage_shape(expected, arg.dtype))
        if sizes != expected:
            raise Fault(illegal, f"{function.name}: the buffer table gives {arg.kind} "
                                 f"{arg.name!r} sizes {sizes}, its symbols {bound} make it "
                                 f"{expected}")
        if address % 16:
            raise Fault(misaligned, f"{function.name}: {arg.kind} {arg.name!r} starts at "
                                    f"{address:#x}, not a multiple of 16 bytes (the kernels' "
                                    "vector accesses)")
        nbytes = _STORAGE[arg.dtype].itemsize
        for dim in expected:
            nbytes *= dim
        buffers.append((address, nbytes, arg.kind != "input", f"{arg.kind} {arg.name!r}"))
    return found + _inside(memory, buffers, seq, illegal, function)


def _inside(memory, ranges: list, seq: int, illegal, function: Function) -> list:
    found = []
    for address, nbytes, writes, what in ranges:
        if nbytes <= 0:
            continue
        if memory.find(address, nbytes, seq) is None:
            raise Fault(illegal, f"{function.name}: {what} [{address:#x}, +{nbytes}) does not lie "
                                 "inside one device allocation (an illegal address on a GPU)")
        found.append((address, address + nbytes, writes))
    return found


def descriptor(words):
    from etc.runtime.cpu import _descriptor_type

    d = _descriptor_type(1)()
    d.allocated, d.aligned, d.offset = words[0], words[1], words[2]
    d.shape[0], d.strides[0] = words[3], words[4]
    return d


def run_probe(name: str, grid: int, values: list, sms: int) -> None:
    """Plays a probe kernel of `etc.runtime.probes` on the host."""
    if name == "etc_probe_sm":
        start = time.perf_counter_ns()
        for cta in range(grid):
            record_at = values[0] + 32 * cta
            for i, value in enumerate((cta % sms, start, start + values[1], sms)):
                ctypes.c_uint64.from_address(record_at + 8 * i).value = value
    elif name == "etc_probe_timer":
        for i in range(values[1]):
            ctypes.c_uint64.from_address(values[0] + 8 * i).value = time.perf_counter_ns()


def run_program(function: Function, grid: int, values: list, initialised, illegal,
                failed) -> None:
    """Runs the CPU build's function of `function`'s role on the launch's
    parameters (the worker grid as one thread per CTA). `initialised()`
    says whether NVSHMEM saw the module (programs on several ranks); a
    worker whose puts and notifies broke NVSHMEM's rules faults with
    `failed`."""
    program, role = function.program, function.role
    symbols = sum(1 for a in program.arguments if a.kind == "symbol")
    memrefs = len(ROLES[role][0])
    args = [_signed(w) for w in values[:symbols]]
    descriptors = [descriptor(values[symbols + 5 * m: symbols + 5 * m + 5])
                   for m in range(memrefs)]
    ranks = program.abi.extra.get("ranks", 1)
    if ranks > 1:
        _on_ranks(program, role, descriptors, ranks, initialised, illegal)
    table = ctypes.addressof(descriptors[0])
    call = program.runtime._functions[role]
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
        with _gguf_layout(program, descriptors[0].aligned):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if ranks > 1:
            import fake_nvshmem

            violations = fake_nvshmem.transport().finished()
            if violations:
                raise Fault(failed, "; ".join(violations))


@contextlib.contextmanager
def _gguf_layout(program, table: int):
    """While a CPU build with native CPU kernels (which read packed weights
    in the GGUF layout) runs in place of a CUDA program, its repacked
    packed inputs (the CUDA runtime uploads the GPU layout of
    `etc.packed`) hold their GGUF bytes; the GPU layout is put back after.
    A build of the CUDA kernels (`kernels="cuda"`, ABI extra
    `packed_layout` "gpu") reads the device bytes as they are."""
    from etc import packed
    from etc.runtime.cpu import table_slots

    if program.abi.extra.get("packed_layout") == "gpu":
        yield
        return
    slots, words = table_slots(program.arguments)
    table_words = (ctypes.c_int64 * max(words, 1)).from_address(table)
    views = []
    for arg in program.arguments:
        if arg.kind != "input" or not packed.is_packed(arg.dtype) or \
                not packed.gpu_repacked(arg.dtype):
            continue
        slot = slots[arg.name]
        sizes = tuple(table_words[slot + 1:slot + 1 + len(arg.shape)])
        nbytes = int(np.prod(sizes, dtype=np.int64))
        if nbytes:
            address = table_words[slot] & 0xFFFFFFFFFFFFFFFF
            view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            views.append((view.reshape(sizes), arg.dtype))
    for view, dtype in views:
        view[...] = packed.from_gpu_layout(view, dtype)
    try:
        yield
    finally:
        for view, dtype in views:
            view[...] = packed.to_gpu_layout(view, dtype)


def _on_ranks(program, role: str, descriptors: list, ranks: int, initialised, illegal) -> None:
    """A program on several ranks: its CPU build reads the fake NVSHMEM's
    transport block after the buffer table, and its counters must lie in
    the symmetric heap (the other ranks notify them there)."""
    import fake_nvshmem
    import numpy as np

    if role == "worker" and not initialised():
        raise Fault(illegal, f"{program.abi.name}_worker: its module was not given its NVSHMEM "
                             "state (nvshmemx_cumodule_init)")
    counters = descriptors[1]
    if role != "counters" and not fake_nvshmem.symmetric(counters.aligned,
                                                         4 * counters.shape[0]):
        raise Fault(illegal, f"{program.abi.name}_{role}: the counter buffer "
                             f"{counters.aligned:#x} does not lie in NVSHMEM's symmetric heap, "
                             "where the other ranks' notifies reach it")
    words = np.ctypeslib.as_array((ctypes.c_int64 * descriptors[0].shape[0])
                                  .from_address(descriptors[0].aligned))
    extended = np.concatenate([words, fake_nvshmem.transport_block(ranks)])
    descriptors[0] = descriptor([extended.ctypes.data, extended.ctypes.data, 0,
                                 extended.size, 1])
    descriptors[0].keep = extended
    if role == "worker":
        # Remote notifies cannot wake a blocked CPU wait: poll.
        from etc.runtime import layout

        words = np.ctypeslib.as_array((ctypes.c_int32 * counters.shape[0])
                                      .from_address(counters.aligned))
        layout.header(words)[layout.SPIN_MICROSECONDS_WORD] = min(
            program.abi.watchdog_ms * 1000, 2**31 - 1)
