"""ETC, the Event Tensor Compiler.

`import etc` is cheap: it loads the NumPy-only parts (`etc.runtime`, which
loads and runs saved kernels, and `etc.reference`, which evaluates their
graphs) and nothing of MLIR, so that serving a model whose step kernel is in
the compile cache never maps the MLIR libraries (about 120 MB and 0.4 s).

The compiler comes with the first use of one of its names (`etc.Graph`,
`etc.compile`, ...) or of a module that needs MLIR. Whenever the upstream
`mlir.ir` module is imported after `import etc` (by ETC or by the user),
ETC's dialects join its global dialect registry, so every
`mlir.ir.Context` created afterwards knows the `event` dialect, and ETC's
passes are registered for `PassManager.parse`; if `mlir.ir` was imported
before `import etc`, that happens at once.

Without the MLIR bindings (a machine that only runs saved kernels), the
compiler's names raise ImportError saying what is missing.
"""

import importlib.abc
import importlib.machinery
import sys

from . import reference, runtime  # noqa: E402  (both need only NumPy)

#: The names that need the compiler (MLIR and ETC's extension), and where
#: each comes from.
_COMPILER_NAMES = {"compile": ("compiler", "compile"),
                   "CompiledKernel": ("compiler", "CompiledKernel"),
                   "pipeline": ("pipeline", None), "Graph": ("graph", "Graph"),
                   "Argument": ("graph_values", "Argument"),
                   "Symbol": ("graph_values", "Symbol"), "Tensor": ("graph_values", "Tensor")}

#: None until the compiler was looked for; then () when it is here, or
#: (the ImportError,) when it cannot be imported.
_compiler_state = None


def _register() -> None:
    """Adds ETC's dialects and passes to the imported upstream bindings."""
    global _compiler_state
    if _compiler_state is not None:
        return
    try:
        from mlir import ir  # noqa: F401  (initialises the upstream bindings first)
        from mlir._mlir_libs import get_dialect_registry
        from mlir._mlir_libs._mlir import globals as mlir_globals

        from . import _etc
    except ImportError as error:  # a runtime-only installation
        _compiler_state = (error,)
        return
    _compiler_state = ()
    _etc.register_dialects(get_dialect_registry())
    _etc.register_passes()
    # Parsed `event` ops come back as the generated classes of etc.dialects.event.
    mlir_globals.append_dialect_search_prefix("etc.dialects")


def compiler_missing():
    """Why the compiler cannot be imported here (an ImportError), or None
    when it can; looks for it (and registers ETC's dialects) on first use."""
    if _compiler_state is None:
        _register()
    return _compiler_state[0] if _compiler_state else None


class _RegisterAfterMLIR(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `mlir.ir` with the other finders and, once it has run,
    registers ETC's dialects and passes (see the module docstring)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "mlir.ir" or _compiler_state is not None:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None:
                self._loader = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]
        _register()


if "mlir.ir" in sys.modules:
    _register()
else:
    sys.meta_path.insert(0, _RegisterAfterMLIR())


def register_dialects(context) -> None:
    """Makes ETC's dialects available in a context created before `import etc`."""
    missing = compiler_missing()
    if missing is not None:
        raise ImportError(f"etc.register_dialects needs the compiler ({missing})") from missing
    from mlir import ir

    from . import _etc

    registry = ir.DialectRegistry()
    _etc.register_dialects(registry)
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()


def __getattr__(name: str):
    if name == "_COMPILER_MISSING":  # the name the model cache's errors read
        return compiler_missing()
    if name not in _COMPILER_NAMES:
        raise AttributeError(f"module 'etc' has no attribute {name!r}")
    missing = compiler_missing()
    if missing is not None:
        raise ImportError(
            f"etc.{name} needs the compiler, which cannot be imported here ({missing}); this "
            "installation can load and run saved kernels with etc.runtime.load") from missing
    import importlib

    module_name, attribute = _COMPILER_NAMES[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


__all__ = ["register_dialects", "compiler_missing", "compile", "CompiledKernel", "pipeline",
           "Argument", "Graph", "Symbol", "Tensor", "reference", "runtime"]
