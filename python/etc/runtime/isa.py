"""Which x86-64 instruction set the CPU target compiles for, and whether
this machine runs it.

Native code built for the compiling machine's CPU dies of SIGILL on an
older one. So the CPU target compiles for a named baseline, one of the
x86-64 micro-architecture levels every compiler and distribution knows
(`x86-64-v2`: SSE4.2 and POPCNT, 2009 on; `x86-64-v3`: AVX2, FMA, F16C,
BMI2, 2013 on; `x86-64-v4`: AVX-512), and an artifact records it; loading
checks the host's features (CPUID, which is what the code will meet) and
refuses a CPU that lacks one, naming it.

The default is `x86-64-v3` (where the compiling machine has it, else the
best level it has); `ETC_CPU_ISA` picks another level. On other
architectures the code is built for the host, and artifacts are refused on
another platform (`etc.runtime.artifact`).

This module needs only the standard library.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
from functools import lru_cache
from typing import Optional

__all__ = ["LEVELS", "DEFAULT", "ISAError", "host_features", "host_supports", "missing",
           "chosen", "llvm_attributes", "check"]

#: The features each level adds to the one before, as LLVM names them (the
#: names `host_features` reports too).
_ADDED = {
    "x86-64": ("cmov", "cx8", "fxsr", "mmx", "sse", "sse2"),
    "x86-64-v2": ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"),
    "x86-64-v4": ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"),
}
#: Every level, oldest first, with all the features it requires.
LEVELS: dict[str, tuple] = {}
_so_far: tuple = ()
for _name, _added in _ADDED.items():
    _so_far = _so_far + _added
    LEVELS[_name] = _so_far
#: The level compiled for by default.
DEFAULT = "x86-64-v3"
#: The environment variable that picks another level.
ENVIRONMENT = "ETC_CPU_ISA"


class ISAError(RuntimeError):
    """Native code for an instruction set this machine does not run."""


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


# CPUID and XGETBV, as machine code run from an executable page: the
# features the CPU reports to the code itself (under an emulator, the
# emulated CPU's), which /proc/cpuinfo does not always show.
#   cpuid(leaf, subleaf, uint32_t out[4])    xgetbv() -> XCR0
_CPUID = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808"
                       "4189500c" "5b" "c3")
_XGETBV = bytes.fromhex("31c9" "0f01d0" "48c1e220" "4809d0" "c3")


def _registers():
    """(cpuid, xgetbv) callables, or None where no executable page can be
    had (then /proc/cpuinfo is read instead)."""
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None
    page.write(_CPUID + _XGETBV)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32,
                             ctypes.POINTER(ctypes.c_uint32 * 4))(address)
    xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64)(address + len(_CPUID))

    def registers(leaf: int, subleaf: int = 0) -> tuple:
        out = (ctypes.c_uint32 * 4)()
        cpuid(leaf, subleaf, ctypes.byref(out))
        return tuple(out)

    registers.page = page  # the page lives as long as the functions
    return registers, xgetbv


def _features_from_cpuid(registers, xgetbv) -> set:
    highest = registers(0)[0]
    _, _, c1, d1 = registers(1)
    b7 = registers(7, 0)[1] if highest >= 7 else 0
    extended = registers(0x80000000)[0]
    c81 = registers(0x80000001)[2] if extended >= 0x80000001 else 0
    bits = {
        "cmov": d1 >> 15, "cx8": d1 >> 8, "fxsr": d1 >> 24, "mmx": d1 >> 23, "sse": d1 >> 25,
        "sse2": d1 >> 26, "sse3": c1, "ssse3": c1 >> 9, "fma": c1 >> 12, "cx16": c1 >> 13,
        "sse4.1": c1 >> 19, "sse4.2": c1 >> 20, "movbe": c1 >> 22, "popcnt": c1 >> 23,
        "xsave": c1 >> 26, "avx": c1 >> 28, "f16c": c1 >> 29, "bmi": b7 >> 3, "avx2": b7 >> 5,
        "bmi2": b7 >> 8, "avx512f": b7 >> 16, "avx512dq": b7 >> 17, "avx512cd": b7 >> 28,
        "avx512bw": b7 >> 30, "avx512vl": b7 >> 31, "sahf": c81, "lzcnt": c81 >> 5,
    }
    features = {name for name, value in bits.items() if value & 1}
    # The vector registers are usable only where the OS saves them.
    xcr0 = xgetbv() if (c1 >> 27) & 1 else 0
    if xcr0 & 0b110 != 0b110:
        features -= {"avx", "avx2", "fma", "f16c"} | set(_ADDED["x86-64-v4"])
    if xcr0 & 0b11100000 != 0b11100000:
        features -= set(_ADDED["x86-64-v4"])
    return features


#: /proc/cpuinfo's names of the features whose LLVM names differ.
_CPUINFO_NAMES = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "lahf_lm": "sahf",
                  "abm": "lzcnt", "bmi1": "bmi"}


def _features_from_cpuinfo() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return {_CPUINFO_NAMES.get(flag, flag) for flag in flags}
    except OSError:
        pass
    return set()


@lru_cache(maxsize=None)
def host_features() -> frozenset:
    """The instruction-set features of this machine's CPU that the levels
    use, by LLVM's names (empty off x86-64)."""
    if not is_x86_64():
        return frozenset()
    functions = _registers()
    features = _features_from_cpuid(*functions) if functions else _features_from_cpuinfo()
    known = set(LEVELS["x86-64-v4"])
    return frozenset(features & known)


def missing(level: str) -> list:
    """The features of `level` this machine lacks (sorted)."""
    return sorted(set(LEVELS[level]) - host_features())


def host_supports(level: str) -> bool:
    return not missing(level)


def chosen() -> Optional[str]:
    """The level the CPU target compiles for: `ETC_CPU_ISA` if set, else
    `DEFAULT` if this machine runs it, else the best level it runs. None
    off x86-64 (code for the host). Raises ISAError for an unknown level
    or one this machine cannot run (the JIT runs the code here too)."""
    if not is_x86_64():
        return None
    level = os.environ.get(ENVIRONMENT)
    if level:
        if level not in LEVELS:
            raise ISAError(f"{ENVIRONMENT}={level!r} is not an x86-64 level; expected one of "
                           f"{', '.join(LEVELS)}")
        if not host_supports(level):
            raise ISAError(f"{ENVIRONMENT}={level!r}: this machine's CPU lacks "
                           f"{', '.join(missing(level))}, and compiled kernels also run here")
        return level
    if host_supports(DEFAULT):
        return DEFAULT
    return next(name for name in reversed(LEVELS) if host_supports(name))


def llvm_attributes(level: str) -> tuple[str, str]:
    """The `target-cpu` and `target-features` every function of a kernel
    compiled for `level` carries: they replace the host's CPU and features,
    which the JIT's target machine would use otherwise."""
    return level, ",".join("+" + feature for feature in LEVELS[level])


def check(level: Optional[str], what: str) -> None:
    """Raises ISAError when this machine cannot run code compiled for
    `level` (None: built for the host, nothing to check)."""
    if level is None:
        return
    if level not in LEVELS:
        raise ISAError(f"{what} holds CPU code for {level!r}, an instruction set this runtime "
                       f"does not know ({', '.join(LEVELS)})")
    absent = missing(level)
    if absent:
        older = [name for name in LEVELS if host_supports(name)]
        hint = (f"compile it again with {ENVIRONMENT}={older[-1]} (the best level this CPU "
                f"runs)" if older else "this CPU runs none of the x86-64 levels")
        raise ISAError(f"{what} holds CPU code for {level}, and this machine's CPU lacks "
                       f"{', '.join(absent)}: running it would stop the process with an "
                       f"illegal instruction; {hint}")
