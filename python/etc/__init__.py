"""ETC, the Event Tensor Compiler.

Importing `etc` adds ETC's dialects to the upstream `mlir` package's global
dialect registry (so every `mlir.ir.Context` created afterwards knows the
`event` dialect) and registers ETC's passes for `PassManager.parse`.

Without the MLIR bindings (a machine that only runs saved kernels), `import
etc` still works: `etc.runtime` loads and runs artifacts, `etc.reference`
evaluates their graphs with NumPy, and the compiler's names (`etc.Graph`,
`etc.compile`, ...) raise ImportError saying what is missing.
"""

try:
    from mlir import ir as _ir  # initialises the upstream bindings first
    from mlir._mlir_libs import get_dialect_registry as _get_dialect_registry
    from mlir._mlir_libs._mlir import globals as _mlir_globals

    from . import _etc
except ImportError as _error:  # a runtime-only installation
    _COMPILER_MISSING: "ImportError | None" = _error
else:
    _COMPILER_MISSING = None
    _etc.register_dialects(_get_dialect_registry())
    _etc.register_passes()
    # Parsed `event` ops come back as the generated classes of etc.dialects.event.
    _mlir_globals.append_dialect_search_prefix("etc.dialects")

from . import reference, runtime  # noqa: E402  (both need only NumPy)

#: The names that need the compiler (MLIR and ETC's extension).
_COMPILER_NAMES = ("register_dialects", "compile", "CompiledKernel", "pipeline", "Argument",
                   "Graph", "Symbol", "Tensor")

if _COMPILER_MISSING is None:
    from . import pipeline  # noqa: E402
    from .compiler import CompiledKernel, compile  # noqa: E402
    from .graph import Graph  # noqa: E402
    from .graph_values import Argument, Symbol, Tensor  # noqa: E402

    def register_dialects(context: "_ir.Context") -> None:
        """Makes ETC's dialects available in a context created before `import etc`."""
        registry = _ir.DialectRegistry()
        _etc.register_dialects(registry)
        context.append_dialect_registry(registry)
        context.load_all_available_dialects()
else:
    def __getattr__(name: str):
        if name in _COMPILER_NAMES:
            raise ImportError(
                f"etc.{name} needs the compiler, which cannot be imported here "
                f"({_COMPILER_MISSING}); this installation can load and run saved kernels "
                "with etc.runtime.load") from _COMPILER_MISSING
        raise AttributeError(f"module 'etc' has no attribute {name!r}")


__all__ = ["register_dialects", "compile", "CompiledKernel", "pipeline", "Argument", "Graph",
           "Symbol", "Tensor", "reference", "runtime"]
