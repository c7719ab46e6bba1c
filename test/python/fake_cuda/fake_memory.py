"""Device memory of the fake CUDA driver (`fake_driver.py`): allocations
in host memory, which every copy, memset and kernel access must lie inside
(a range that starts in one allocation and ends in another, or past its
end, is refused), frees that must name a live allocation, memory made
elsewhere that counts as device memory (the fake NVSHMEM's symmetric
heap), and reads of host addresses that cannot crash the process (the
driver reads kernel parameters through pointers the caller gives it).
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import threading
from dataclasses import dataclass, field

#: Device allocations start at a multiple of this (the driver's 256 bytes).
ALIGNMENT = 256


@dataclass
class Allocation:
    """One allocation: [start, start + size). `freed_by` is the sequence
    number of the free that ends it (work issued before the free may still
    use it); `keep` holds the host memory behind it."""

    start: int
    size: int
    label: str
    keep: object = field(default=None, repr=False)
    freed_by: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.size


class Memory:
    """The fake device's allocations (see the module docstring)."""

    def __init__(self):
        self._starts: list[int] = []
        self._blocks: dict[int, Allocation] = {}
        #: Freed allocations whose free has not run on the device yet.
        self._dying: list[Allocation] = []

    def allocate(self, nbytes: int) -> int:
        buffer = ctypes.create_string_buffer(nbytes + ALIGNMENT)
        start = -(-ctypes.addressof(buffer) // ALIGNMENT) * ALIGNMENT
        self._add(Allocation(start, nbytes, "cuMemAlloc", buffer))
        return start

    def external(self, start: int, size: int, label: str) -> None:
        """Counts [start, start + size) as device memory (never freed)."""
        if self.find(start, 1) is None:
            self._add(Allocation(start, size, label))

    def _add(self, allocation: Allocation) -> None:
        bisect.insort(self._starts, allocation.start)
        self._blocks[allocation.start] = allocation

    def find(self, address: int, nbytes: int, seq: int | None = None) -> Allocation | None:
        """The allocation that holds all of [address, address + nbytes), or
        None. With `seq` (the sequence number of the work asking), an
        allocation freed by later work still counts."""
        address, nbytes = int(address), max(int(nbytes), 1)
        at = bisect.bisect_right(self._starts, address) - 1
        candidates = [self._blocks[self._starts[at]]] if at >= 0 else []
        if seq is not None:
            candidates += [a for a in self._dying if seq < a.freed_by]
        for allocation in candidates:
            if allocation.start <= address and address + nbytes <= allocation.end:
                return allocation
        return None

    def touches(self, address: int) -> bool:
        """Whether `address` lies in any live allocation (a host pointer
        that does is device memory passed where host memory belongs)."""
        at = bisect.bisect_right(self._starts, int(address)) - 1
        return at >= 0 and int(address) < self._blocks[self._starts[at]].end

    def free(self, pointer: int, seq: int) -> bool:
        """Ends the allocation that starts at `pointer` for work issued
        from `seq` on; False when no live allocation starts there (an
        unknown pointer, an address inside an allocation, or a second free)."""
        allocation = self._blocks.get(int(pointer))
        if allocation is None or allocation.label != "cuMemAlloc":
            return False
        self._starts.remove(allocation.start)
        del self._blocks[allocation.start]
        allocation.freed_by = seq
        self._dying.append(allocation)
        return True

    def release(self, seq: int) -> None:
        """The device reached free `seq`: its host memory goes."""
        self._dying = [a for a in self._dying if a.freed_by != seq]

    def live(self) -> int:
        """Allocations not freed (for tests)."""
        return sum(1 for a in self._blocks.values() if a.label == "cuMemAlloc")


class HostReader:
    """Reads host memory at addresses a caller handed over, failing with
    None instead of a segmentation fault where nothing is mapped (write(2)
    into a pipe returns EFAULT for an unreadable buffer)."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self._libc.write.restype = ctypes.c_ssize_t
        self._read, self._write = os.pipe()
        self._lock = threading.Lock()

    def read(self, address: int, nbytes: int) -> bytes | None:
        if not address or address < 4096:
            return None
        with self._lock:
            written = self._libc.write(self._write, address, nbytes)
            if written < 0:
                if ctypes.get_errno() == errno.EFAULT:
                    return None
                raise OSError(ctypes.get_errno(), "fake driver: reading host memory")
            return os.read(self._read, written)
