"""Which x86-64 instruction set the CPU target compiles for, and whether
this machine runs it.

Native code built for one CPU dies of SIGILL on an older one. So an
artifact records the instruction set it was compiled for, and loading
checks the host's features (CPUID, which is what the code will meet) and
refuses a CPU that lacks one, naming it. An instruction set is one of the
x86-64 micro-architecture levels every compiler and distribution knows
(`x86-64-v2`: SSE4.2 and POPCNT, 2009 on; `x86-64-v3`: AVX2, FMA, F16C,
BMI2, 2013 on; `x86-64-v4`: AVX-512), optionally with extensions the tile
kernels use where a CPU has them, written `<level>+<extension>...`:
AVX-512 BF16 (`vdpbf16ps`), VNNI, AVX-512 FP16 and the AMX tile unit
(`amx-tile`, `amx-bf16`, `amx-int8`), e.g.
`x86-64-v4+avx512bf16+avx512vnni+avxvnni`.

By default the CPU target compiles for this machine: the best level it
runs and every extension it has (`host()`). `ETC_CPU_ISA` picks another
instruction set (a level, a level with extensions, or `host`), for
artifacts meant for other machines; the compiling machine must run it too,
since the JIT runs the code here. AMX needs the process to ask Linux for
the tile state first (`request_amx`), which the CPU runtime does before a
kernel compiled with AMX runs. On other architectures the code is built
for the host, and artifacts are refused on another platform
(`etc.runtime.artifact`).

This module needs only the standard library.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import mmap
import os
import platform
import threading
from functools import lru_cache
from typing import Optional

__all__ = ["LEVELS", "EXTENSIONS", "HOST", "ISAError", "host_features", "host", "host_supports",
           "missing", "parse", "features", "has", "chosen", "opt_level", "llvm_attributes",
           "check", "request_amx", "prepare"]

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
#: Extensions an instruction set may add to its level (LLVM's names, in the
#: order an instruction set names them), each with the level it needs and
#: the extensions it needs besides.
EXTENSIONS: dict[str, tuple] = {
    "avx512bf16": ("x86-64-v4", ()),
    "avx512fp16": ("x86-64-v4", ()),
    "avx512vnni": ("x86-64-v4", ()),
    "avxvnni": ("x86-64-v3", ()),
    "amx-tile": ("x86-64-v4", ()),
    "amx-bf16": ("x86-64-v4", ("amx-tile",)),
    "amx-int8": ("x86-64-v4", ("amx-tile",)),
}
#: What `ETC_CPU_ISA` may say for this machine's own instruction set.
HOST = "host"
#: The environment variable that picks another instruction set.
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


#: The bits of XCR0 the OS sets when it saves each kind of register: SSE
#: and AVX (xmm, ymm), AVX-512 (opmask, upper zmm halves, zmm16-31), AMX
#: (tile configuration and data).
_XCR0_AVX = 0b110
_XCR0_AVX512 = 0b11100000
_XCR0_AMX = 0b11 << 17


def _features_from_cpuid(registers, xgetbv) -> set:
    highest = registers(0)[0]
    _, _, c1, d1 = registers(1)
    _, b7, c7, d7 = registers(7, 0) if highest >= 7 else (0, 0, 0, 0)
    a7s1 = registers(7, 1)[0] if highest >= 7 and registers(7, 0)[0] >= 1 else 0
    extended = registers(0x80000000)[0]
    c81 = registers(0x80000001)[2] if extended >= 0x80000001 else 0
    bits = {
        "cmov": d1 >> 15, "cx8": d1 >> 8, "fxsr": d1 >> 24, "mmx": d1 >> 23, "sse": d1 >> 25,
        "sse2": d1 >> 26, "sse3": c1, "ssse3": c1 >> 9, "fma": c1 >> 12, "cx16": c1 >> 13,
        "sse4.1": c1 >> 19, "sse4.2": c1 >> 20, "movbe": c1 >> 22, "popcnt": c1 >> 23,
        "xsave": c1 >> 26, "avx": c1 >> 28, "f16c": c1 >> 29, "bmi": b7 >> 3, "avx2": b7 >> 5,
        "bmi2": b7 >> 8, "avx512f": b7 >> 16, "avx512dq": b7 >> 17, "avx512cd": b7 >> 28,
        "avx512bw": b7 >> 30, "avx512vl": b7 >> 31, "sahf": c81, "lzcnt": c81 >> 5,
        "avx512vnni": c7 >> 11, "amx-bf16": d7 >> 22, "avx512fp16": d7 >> 23,
        "amx-tile": d7 >> 24, "amx-int8": d7 >> 25, "avxvnni": a7s1 >> 4,
        "avx512bf16": a7s1 >> 5,
    }
    features = {name for name, value in bits.items() if value & 1}
    # The registers are usable only where the OS saves them.
    xcr0 = xgetbv() if (c1 >> 27) & 1 else 0
    avx512 = set(_ADDED["x86-64-v4"]) | {"avx512bf16", "avx512fp16", "avx512vnni"}
    if xcr0 & _XCR0_AVX != _XCR0_AVX:
        features -= {"avx", "avx2", "fma", "f16c", "avxvnni"} | avx512
    if xcr0 & _XCR0_AVX512 != _XCR0_AVX512:
        features -= avx512
    if xcr0 & _XCR0_AMX != _XCR0_AMX:
        features -= {"amx-tile", "amx-bf16", "amx-int8"}
    return features


#: /proc/cpuinfo's names of the features whose LLVM names differ.
_CPUINFO_NAMES = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "lahf_lm": "sahf",
                  "abm": "lzcnt", "bmi1": "bmi", "avx512_bf16": "avx512bf16",
                  "avx512_fp16": "avx512fp16", "avx512_vnni": "avx512vnni",
                  "avx_vnni": "avxvnni", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16",
                  "amx_int8": "amx-int8"}


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
    and extensions use, by LLVM's names (empty off x86-64)."""
    if not is_x86_64():
        return frozenset()
    functions = _registers()
    features = _features_from_cpuid(*functions) if functions else _features_from_cpuinfo()
    known = set(LEVELS["x86-64-v4"]) | set(EXTENSIONS)
    return frozenset(features & known)


def parse(isa: str) -> tuple[str, tuple]:
    """The level and the extensions of instruction set `isa`
    (`<level>[+<extension>...]`). Raises ISAError for an unknown level or
    extension, or an extension without the level or extensions it needs."""
    level, *extensions = isa.split("+")
    if level not in LEVELS:
        raise ISAError(f"{isa!r} does not start with an x86-64 level; expected one of "
                       f"{', '.join(LEVELS)}, optionally followed by +extensions")
    names = list(LEVELS)
    for extension in extensions:
        if extension not in EXTENSIONS:
            raise ISAError(f"{isa!r}: {extension!r} is not an extension ETC knows; expected "
                           f"some of {', '.join(EXTENSIONS)}")
        needs, others = EXTENSIONS[extension]
        if names.index(level) < names.index(needs):
            raise ISAError(f"{isa!r}: {extension} needs {needs} or newer")
        absent = [other for other in others if other not in extensions]
        if absent:
            raise ISAError(f"{isa!r}: {extension} needs {', '.join(absent)} too")
    return level, tuple(e for e in EXTENSIONS if e in extensions)


def canonical(isa: str) -> str:
    """`isa` with its extensions in the order of EXTENSIONS (duplicates
    dropped), as artifacts and the compile cache record it."""
    level, extensions = parse(isa)
    return "+".join((level, *extensions))


def features(isa: str) -> tuple:
    """Every LLVM feature of instruction set `isa`: its level's and its
    extensions'."""
    level, extensions = parse(isa)
    return LEVELS[level] + extensions


def has(isa: Optional[str], feature: str) -> bool:
    """Whether code for `isa` may use `feature` (None: code for a host
    that is not x86-64, which has none of these)."""
    return isa is not None and feature in features(isa)


def missing(isa: str) -> list:
    """The features of `isa` (a level, or a level with extensions) this
    machine lacks (sorted)."""
    return sorted(set(features(isa)) - host_features())


def host_supports(isa: str) -> bool:
    return not missing(isa)


def host() -> Optional[str]:
    """This machine's instruction set: the best level it runs and every
    extension it has. None off x86-64 (code for the host)."""
    if not is_x86_64():
        return None
    level = next(name for name in reversed(LEVELS) if host_supports(name))
    order = list(LEVELS)
    extensions = [e for e, (needs, _) in EXTENSIONS.items()
                  if e in host_features() and order.index(needs) <= order.index(level)]
    return canonical("+".join((level, *extensions)))


def chosen() -> Optional[str]:
    """The instruction set the CPU target compiles for: `ETC_CPU_ISA` if
    set (a level, a level with extensions, or `host`), else this machine's
    (`host()`). None off x86-64 (code for the host). Raises ISAError for an
    unknown instruction set or one this machine cannot run (the JIT runs
    the code here too)."""
    if not is_x86_64():
        return None
    isa = os.environ.get(ENVIRONMENT)
    if not isa or isa == HOST:
        return host()
    try:
        isa = canonical(isa)
    except ISAError as error:
        raise ISAError(f"{ENVIRONMENT}={isa!r} is not an x86-64 instruction set: "
                       f"{error}") from None
    if not host_supports(isa):
        raise ISAError(f"{ENVIRONMENT}={isa!r}: this machine's CPU lacks "
                       f"{', '.join(missing(isa))}, and compiled kernels also run here")
    return isa


#: The environment variable that sets LLVM's optimisation level for native
#: CPU kernels (`opt_level`; not an instruction set, but like it a choice of
#: how the CPU code is generated that the compile cache's key carries).
OPT_LEVEL_ENVIRONMENT = "ETC_CPU_OPT_LEVEL"
#: The level kernels are compiled at when it is not set.
DEFAULT_OPT_LEVEL = 2


def opt_level() -> int:
    """LLVM's optimisation level (0-3) for native CPU kernels:
    `ETC_CPU_OPT_LEVEL` where set, else 2. Level 0 generates code about 25x
    faster (a tiny model's step kernel: 0.02 s against 0.5 s) that runs
    slower; the test suite uses it for the kernels whose speed no test
    measures (docs/building.md). Part of the compile cache's key. Raises
    ValueError naming the variable for anything but 0, 1, 2 or 3."""
    text = os.environ.get(OPT_LEVEL_ENVIRONMENT)
    if text is None or text == "":
        return DEFAULT_OPT_LEVEL
    if text not in ("0", "1", "2", "3"):
        raise ValueError(f"{OPT_LEVEL_ENVIRONMENT}={text!r} must be an LLVM optimisation "
                         "level: 0, 1, 2 or 3")
    return int(text)


def llvm_attributes(isa: str) -> tuple[str, str]:
    """The `target-cpu` and `target-features` every function of a kernel
    compiled for `isa` carries: they replace the host's CPU and features,
    which the JIT's target machine would use otherwise."""
    level, _ = parse(isa)
    return level, ",".join("+" + feature for feature in features(isa))


def check(isa: Optional[str], what: str) -> None:
    """Raises ISAError when this machine cannot run code compiled for
    `isa` (None: built for the host, nothing to check)."""
    if isa is None:
        return
    try:
        parse(isa)
    except ISAError as error:
        raise ISAError(f"{what} holds CPU code for {isa!r}, an instruction set this runtime "
                       f"does not know ({error})") from None
    absent = missing(isa)
    if absent:
        runs = host()
        hint = (f"compile it again with {ENVIRONMENT}={runs} (what this CPU runs)" if runs
                else "this CPU runs none of the x86-64 levels")
        raise ISAError(f"{what} holds CPU code for {isa}, and this machine's CPU lacks "
                       f"{', '.join(absent)}: running it would stop the process with an "
                       f"illegal instruction; {hint}")


# ----------------------------------------------------------------------
# AMX state
# ----------------------------------------------------------------------

#: Linux x86-64's arch_prctl system call, its request for permission to
#: use an extended state component, and AMX's tile data component.
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_amx_lock = threading.Lock()
_amx_granted = False


def request_amx() -> None:
    """Asks Linux for the AMX tile state in this process
    (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), once; every
    thread may then use the tile registers, which would otherwise fault
    (SIGILL) at the first tile instruction. Raises ISAError naming the
    reason where Linux refuses (a kernel older than 5.16, a CPU or a
    hypervisor without AMX, a signal stack too small for the state)."""
    global _amx_granted
    with _amx_lock:
        if _amx_granted:
            return
        if platform.system() != "Linux" or not is_x86_64():
            raise ISAError("AMX tiles need Linux on x86-64, where a process asks for the tile "
                           "state with arch_prctl; compile for an instruction set without "
                           f"amx-tile ({ENVIRONMENT}=x86-64-v4+avx512bf16, say)")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
            code = ctypes.get_errno()
            raise ISAError(f"Linux refused the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, "
                           f"XFEATURE_XTILEDATA): {_errno.errorcode.get(code, code)}, "
                           f"{os.strerror(code)}): kernels compiled with amx-tile cannot run in "
                           f"this process; compile for an instruction set without it "
                           f"({ENVIRONMENT}=x86-64-v4+avx512bf16, say)")
        _amx_granted = True


def prepare(isa: Optional[str]) -> None:
    """What a process does before it runs code compiled for `isa`: asks
    for the AMX tile state where `isa` has the tile unit."""
    if has(isa, "amx-tile"):
        request_amx()
