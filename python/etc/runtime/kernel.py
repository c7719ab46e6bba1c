"""Kernels as users hold them: `Kernel`, what a freshly compiled kernel
(`etc.CompiledKernel`) and one loaded from an artifact
(`etc.runtime.LoadedKernel`) share: the ABI, the target's runtime, `run`
and `partial`; and `PartialKernel`, a kernel with some of its arrays bound
once (`kernel.partial(**arrays)`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .abi import KernelABI

if TYPE_CHECKING:
    from ..binding import Signature


class Kernel:
    """A program for one target and the runtime that runs it: `run` arrays
    named like the graph's inputs, `partial` to bind some of them once,
    its `abi`, `arguments`, `signature`, `trace`, and `ptx` for CUDA."""

    def __init__(self, abi: KernelABI, runtime):
        #: What the program takes and how it runs (see `etc.runtime.abi`).
        self.abi = abi
        self._runtime = runtime

    @property
    def ptx(self) -> str:
        """The PTX text of the program's kernels (target="cuda" only)."""
        if self.abi.target != "cuda":
            raise AttributeError(f"kernel.ptx exists for target='cuda', not {self.abi.target!r}")
        return self._runtime.ptx

    @property
    def arguments(self) -> tuple:
        """The program's arguments in order (`etc.runtime.Argument`s)."""
        return self.abi.arguments

    @property
    def signature(self) -> "Signature":
        """The graph's name, arguments and outputs as they were compiled."""
        return self._runtime.signature

    @property
    def trace(self):
        """The trace of the last run (`etc.runtime.trace.Trace`; kernels
        compiled with trace=True)."""
        return self._runtime.trace

    @property
    def runtime(self):
        """The target's runtime (e.g. `CUDARuntime`: `lanes`, `max_workers`,
        `bind(...)` for repeated device launches)."""
        return self._runtime

    # `self` is positional-only so that an input may be called "self".
    def run(self, /, *, out=None, stream=None, **inputs):
        """Runs the kernel on arrays named like the graph's inputs and returns
        the outputs, in `g.output` order, as a list of NumPy arrays (bf16
        ones widened to float32).

        `out=` (a list in output order, or a dict by name) receives the
        outputs instead, and `run` returns those arrays. On the CPU an
        `out=` array has the output's shape and its storage dtype, which
        the program then writes in place without a copy: float32, float16,
        int32, and for bf16 uint16 bit patterns (`etc.bfloat16.from_bits`
        reads them); a float32 array for a bf16 output gets the widened
        values by a copy, as does a strided view or an array that does not
        start at a multiple of 16 bytes or shares memory with an input
        (`etc.runtime.aligned.empty` makes 64-byte aligned ones, which the
        tiles store fastest into). Its old contents do not matter. Two
        `out=` arrays that share memory are refused (a ValueError naming
        both), on every target: only one output could be left there.

        On CUDA, inputs may also be device arrays (`__cuda_array_interface__`
        or `__dlpack__`: PyTorch, CuPy, JAX), used without a copy; `out=`
        takes device arrays (written in place) or the NumPy arrays the CPU
        takes (copied into: a bf16 output's uint16 bits as the device holds
        them, float32 widened, strided views too), and `stream=` picks the
        CUDA stream. The run
        is complete, and device-side errors raised, when `run` returns.
        Without a CUDA device or driver this raises
        `etc.runtime.cuda.CUDAUnavailableError` (a RuntimeError). Inputs
        named `out` or `stream` go through `kernel.runtime.run(dict)`."""
        return self._runtime.run(inputs, out=out, stream=stream)

    def partial(self, /, **arrays) -> "PartialKernel":
        """The kernel with `arrays` (inputs or state buffers by name) bound
        once, to run with the others (`PartialKernel`): on the CPU a run
        then checks and addresses only those, e.g. a decode step's dozen
        small arrays instead of also its hundreds of weights."""
        return PartialKernel(self, self._runtime, arrays)


class PartialKernel:
    """A kernel with some of its inputs bound once (`kernel.partial(**arrays)`)
    and run with the others: `partial.run(out=None, stream=None, **rest)`
    computes what `kernel.run(**arrays, **rest)` computes. The CPU runtimes
    check, convert and address the bound arrays once (`CPURuntime.constants`;
    a decode step binds its hundreds of weights so), others pass them again
    at every run. The bound arrays are read at every run, not copied (except
    a conversion, e.g. float32 for a bf16 input, made once). `out=` is as
    for `Kernel.run` (an `out=` array that is a bound array gets a copy)."""

    def __init__(self, kernel, runtime, arrays: dict):
        self.kernel = kernel
        self._runtime = runtime
        self._arrays = dict(arrays)
        bind = getattr(runtime, "constants", None)
        self._constants = bind(self._arrays) if callable(bind) else None

    def run(self, /, *, out=None, stream=None, **inputs):
        """Runs the kernel on `inputs` and the bound arrays (see
        `Kernel.run`)."""
        if self._constants is not None:
            return self._runtime.run(inputs, out=out, stream=stream, constants=self._constants)
        bound = sorted(set(inputs) & self._arrays.keys())
        if bound:
            raise TypeError(f"{self.kernel.signature.name}: inputs {bound} are bound by "
                            f"partial() and given to run() too")
        return self._runtime.run({**self._arrays, **inputs}, out=out, stream=stream)

    def __repr__(self) -> str:
        return f"<PartialKernel of {self.kernel.signature.name}: {len(self._arrays)} bound>"
