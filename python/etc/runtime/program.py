"""`ProgramRuntime`: what every target's runtime of one compiled program
shares (the CPU's `CPURuntime`, CUDA's `CUDARuntime` and their
several-rank forms): the program's ABI, its signature and arguments as
compiled, and the trace of its last run.
"""

from __future__ import annotations

from ..binding import Signature
from .abi import KernelABI
from .trace import Trace


class ProgramRuntime:
    """The base of the runtimes: `abi`, `signature`, `arguments` and
    `trace`. A runtime that runs a traced program sets `_trace` after each
    run (`Trace.decode` of the run's counter buffer)."""

    def __init__(self, abi: KernelABI):
        self.abi = abi
        #: The compiled graph's name, arguments and outputs.
        self.signature = Signature(abi.name, abi.arguments, abi.outputs)
        self.arguments = list(abi.arguments)
        self._trace: Trace | None = None

    @property
    def trace(self) -> Trace:
        """The trace of the last run (kernels compiled with trace=True)."""
        if not self.abi.trace:
            raise RuntimeError(f"{self.abi.name} was compiled without traces: compile with "
                               "etc.compile(..., trace=True)")
        if self._trace is None:
            raise RuntimeError(f"{self.abi.name} has not run yet, so there is no trace")
        return self._trace
