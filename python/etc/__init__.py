"""ETC, the Event Tensor Compiler.

Importing `etc` adds ETC's dialects to the upstream `mlir` package's global
dialect registry (so every `mlir.ir.Context` created afterwards knows the
`event` dialect) and registers ETC's passes for `PassManager.parse`.
"""

from mlir import ir as _ir  # noqa: F401  (initialises the upstream bindings first)
from mlir._mlir_libs import get_dialect_registry as _get_dialect_registry
from mlir._mlir_libs._mlir import globals as _mlir_globals

from . import _etc

_etc.register_dialects(_get_dialect_registry())
_etc.register_passes()
# Parsed `event` ops come back as the generated classes of etc.dialects.event.
_mlir_globals.append_dialect_search_prefix("etc.dialects")

from . import pipeline, reference  # noqa: E402
from .compiler import CompiledKernel, compile  # noqa: E402
from .graph import Argument, Graph, Symbol, Tensor  # noqa: E402


def register_dialects(context: "_ir.Context") -> None:
    """Makes ETC's dialects available in a context created before `import etc`."""
    registry = _ir.DialectRegistry()
    _etc.register_dialects(registry)
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()


__all__ = ["register_dialects", "compile", "CompiledKernel", "pipeline", "Argument", "Graph", "Symbol", "Tensor", "reference"]
