"""The CPU target's JIT: MLIR's ExecutionEngine, given the soft-float
builtins it cannot find by itself, and failing with the reason.

Upstream, a module that cannot be translated to LLVM IR fails with "Failure
while creating the ExecutionEngine." and one that calls an undefined symbol
with "Unknown function <name>"; LLVM's own explanation goes to stderr, or
nowhere. `create` and `lookup` raise `JITError` with the cause instead.
"""

from __future__ import annotations

import ctypes
import os
import struct
import tempfile
from typing import Optional

from mlir import ir
from mlir._mlir_libs._mlirExecutionEngine import ExecutionEngine

#: f16 <-> f32 conversions that LLVM calls where the host has no instruction
#: for them (x86-64 without F16C). libgcc_s (GCC >= 12) defines them, but it
#: is loaded without RTLD_GLOBAL, so the JIT's process-wide search misses
#: them. bf16 conversions are expanded in MLIR instead (etc-lower-to-cpu).
SOFT_FLOAT_BUILTINS = ("__truncsfhf2", "__extendhfsf2")


#: Symbols that position-independent object code references and the linker
#: (here the JIT's) defines itself.
LINKER_SYMBOLS = ("_GLOBAL_OFFSET_TABLE_",)


class JITError(RuntimeError):
    """The CPU JIT could not compile or link the lowered program."""


def _libgcc():
    try:
        return ctypes.CDLL("libgcc_s.so.1")
    except OSError:
        return None


def create(module: ir.Module, what: str, opt_level: int = 2,
           isa: Optional[str] = None) -> ExecutionEngine:
    """JIT-compiles `module` (`what` names it in errors), with the builtins of
    `SOFT_FLOAT_BUILTINS` that this process has, for the x86-64 level `isa`
    (`etc.runtime.isa`; None: the host's CPU), its LLVM IR passes and its
    code generation at `opt_level`. Raises JITError with MLIR's
    diagnostics when the module cannot be translated to LLVM IR. Returns
    the bindings' ExecutionEngine (`raw_lookup`, `raw_register_runtime`,
    `dump_to_object_file`; not the `mlir.execution_engine` subclass's
    ctypes helpers)."""
    if isa is not None:
        set_target(module, isa)
    diagnostics: list[str] = []

    def collect(diagnostic) -> bool:
        diagnostics.append(f"{diagnostic.location}: {diagnostic.message}")
        return True

    handler = module.context.attach_diagnostic_handler(collect)
    try:
        # The object dump lets `lookup` list the symbols a failed link missed.
        # Position-independent, so that `CompiledKernel.save` can link the
        # same object code into a shared library.
        # Through ETC's extension: upstream's constructor generates code at
        # LLVM's -O2 whatever `opt_level` says (etc._etc.create_execution_engine).
        from .._etc import create_execution_engine

        engine = ExecutionEngine._CAPICreate(create_execution_engine(
            module, opt_level, enable_object_dump=True, enable_pic=True))
    except RuntimeError:
        cause = "\n  ".join(diagnostics) or "no diagnostic was reported"
        raise JITError(f"{what}: the CPU JIT could not translate the lowered module to "
                       f"LLVM IR:\n  {cause}") from None
    finally:
        handler.detach()
    libgcc = _libgcc()
    for name in SOFT_FLOAT_BUILTINS:
        if libgcc is not None and hasattr(libgcc, name):
            engine.raw_register_runtime(name, ctypes.cast(getattr(libgcc, name), ctypes.c_void_p))
    return engine


def set_target(module: ir.Module, level: str) -> None:
    """Makes all of the lowered (LLVM dialect) `module`'s code x86-64 level
    `level` code. The ExecutionEngine generates code with a target machine
    for the host, whose features (AVX-512 on some machines) a function uses
    unless it names its own: every function gets the level's CPU and
    features. The engine also adds a wrapper `_mlir_<f>` (no attributes, so
    host code) for every externally visible function `f`, and would inline
    `f` into it: only the C-interface entry points the runtimes call stay
    visible, and they are not inlined, so the wrappers only unpack
    arguments."""
    from .isa import llvm_attributes

    cpu, features = llvm_attributes(level)
    with module.context:
        cpu_attr = ir.StringAttr.get(cpu)
        features_attr = ir.Attribute.parse(
            "#llvm.target_features<[" + ", ".join(f'"{f}"' for f in features.split(",")) + "]>")
        internal = ir.Attribute.parse("#llvm.linkage<internal>")
        for op in module.body.operations:
            if op.operation.name != "llvm.func" or not op.regions[0].blocks:
                continue  # declarations: libc, libgcc
            op.attributes["target_cpu"] = cpu_attr
            op.attributes["target_features"] = features_attr
            if ir.StringAttr(op.attributes["sym_name"]).value.startswith("_mlir_ciface_"):
                op.attributes["no_inline"] = ir.UnitAttr.get()
            else:
                op.attributes["linkage"] = internal


def lookup(engine: ExecutionEngine, name: str, what: str) -> None:
    """Makes the JIT compile and link the C interface of function `name` now
    (what `ExecutionEngine.invoke(name, ...)` calls). Raises JITError naming
    the symbols it could not resolve."""
    if engine.raw_lookup(f"_mlir_ciface_{name}"):
        return
    missing = [symbol for symbol in _undefined_symbols(engine)
               if symbol not in LINKER_SYMBOLS and not _in_process(symbol)]
    if missing:
        cause = (f"the compiled code calls {', '.join(missing)}, which no library loaded in this "
                 "process exports")
        if any(symbol.startswith("__") for symbol in missing):
            cause += (" (compiler-rt builtins: ETC expands bf16 conversions in MLIR and takes "
                      f"{', '.join(SOFT_FLOAT_BUILTINS)} from libgcc_s, GCC 12 or newer)")
    else:
        cause = "LLVM reported no missing symbol; its 'JIT session error' is on stderr"
    raise JITError(f"{what}: the CPU JIT could not compile and link {name!r}: {cause}")


def _in_process(symbol: str) -> bool:
    """Whether the JIT's process-wide search (dlsym on the global scope) or
    the builtins given by `create` resolve `symbol`."""
    if symbol in SOFT_FLOAT_BUILTINS and _libgcc() is not None:
        return hasattr(_libgcc(), symbol)
    return hasattr(ctypes.CDLL(None), symbol)


def _undefined_symbols(engine: ExecutionEngine) -> list[str]:
    """The undefined symbols of the object code the JIT generated."""
    handle, path = tempfile.mkstemp(suffix=".o")
    os.close(handle)
    try:
        engine.dump_to_object_file(path)
        with open(path, "rb") as f:
            image = f.read()
    finally:
        os.unlink(path)
    return _elf_undefined_symbols(image)


def _elf_undefined_symbols(image: bytes) -> list[str]:
    """Names of the undefined symbols in a little-endian ELF64 object; [] for
    anything else."""
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return []
    (section_table,) = struct.unpack_from("<Q", image, 0x28)
    entry_size, count = struct.unpack_from("<HH", image, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize.
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, section_table + i * entry_size)
                for i in range(count)]
    symtab_type, undefined_section = 2, 0
    names = []
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != symtab_type:
            continue
        strings = sections[link][4]
        # Elf64_Sym: name, info, other, section index, value, size; entry 0 is null.
        for position in range(offset + symbol_size, offset + size, symbol_size):
            name, _, _, section = struct.unpack_from("<IBBH", image, position)
            if section == undefined_section and name:
                end = image.index(b"\0", strings + name)
                names.append(image[strings + name:end].decode())
    return names
