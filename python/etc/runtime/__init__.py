"""Runtimes that execute compiled ETC programs, and saved artifacts.

Everything here needs only NumPy (and cuda-bindings for CUDA): a kernel
saved with `CompiledKernel.save` loads and runs with `etc.runtime.load`
in a process without MLIR.
"""

from .abi import Argument, KernelABI
from .artifact import FORMAT_VERSION, ArtifactError, LoadedKernel, load
from .layout import WatchdogError
from .trace import Trace, TraceEvent

__all__ = ["load", "LoadedKernel", "ArtifactError", "FORMAT_VERSION", "KernelABI", "Argument",
           "WatchdogError", "Trace", "TraceEvent"]
