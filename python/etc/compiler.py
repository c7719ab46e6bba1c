"""`etc.compile`: a graph in, a kernel that runs on the chosen target out."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mlir import ir

from . import pipeline as _pipeline
from .binding import Signature
from .pipeline import Options

if TYPE_CHECKING:
    from .graph import Graph


class CompiledKernel:
    """A graph compiled for one target. One kernel serves every value of every
    symbolic dimension: `run` binds them from the input shapes.

    The kernel runs what was compiled: its `signature` (inputs, outputs and
    their order) is a snapshot taken by `etc.compile`, and later changes to
    `graph` do not affect it; compile again to pick them up."""

    def __init__(self, graph: "Graph", options: Options, stage_ir: dict[str, str],
                 timings: dict[str, float], runtime):
        self.graph = graph
        self.options = options
        self._stage_ir = stage_ir
        #: Seconds spent in each compilation stage.
        self.timings = timings
        self._runtime = runtime

    def ir(self, stage: str) -> str:
        """The IR after `stage`: one of "graph", "event", "scheduled", "lowered"."""
        if stage not in self._stage_ir:
            raise ValueError(f"unknown stage {stage!r}; expected one of {tuple(self._stage_ir)}")
        return self._stage_ir[stage]

    @property
    def ptx(self) -> str:
        """The PTX text of the program's kernels (target="cuda" only)."""
        if self.options.target != "cuda":
            raise AttributeError(f"kernel.ptx exists for target='cuda', not {self.options.target!r}")
        return self._runtime.ptx

    @property
    def runtime(self):
        """The target's runtime (e.g. `CUDARuntime`: `lanes`, `max_workers`,
        `bind(...)` for repeated device launches)."""
        return self._runtime

    @property
    def signature(self) -> Signature:
        """The graph's name, arguments and outputs as they were compiled."""
        return self._runtime.signature

    # `self` is positional-only so that an input may be called "self".
    def run(self, /, **inputs):
        """Runs the kernel on NumPy arrays named like the graph's inputs and
        returns the outputs, in the compiled `g.output` order, as a list of
        NumPy arrays.
        On CUDA, inputs may also be device arrays (`__cuda_array_interface__`,
        used without a copy); without a CUDA device or driver this raises
        `etc.runtime.cuda.CUDAUnavailableError` (a RuntimeError)."""
        return self._runtime.run(inputs)

    def __repr__(self) -> str:
        return (f"<CompiledKernel {self.graph.name} target={self.options.target} "
                f"schedule={self.options.schedule} workers={self.options.workers}>")


def compile(graph: "Graph", *, target: str = "cpu", schedule: str = "static",
            workers: int = 4, policy: str = "round-robin", chip: str = "sm_90a",
            kernels: str = "native") -> CompiledKernel:
    """Compiles `graph` into one persistent program for `target`.

    Stages: "graph" (L1 tasks) -> "event" (dependencies inferred) ->
    "scheduled" (persistent worker program) -> "lowered" (target code).
    A failing stage raises `etc.pipeline.PipelineError` with an `etc-opt`
    command that reproduces it.

    `kernels="cuda"` (target="cpu" only) builds the CUDA tile kernels and
    runs them on the CPU with their lanes simulated one after another: a
    check of the GPU kernels' indexing and reductions without a GPU.
    """
    options = Options(target=target, schedule=schedule, workers=workers, policy=policy, chip=chip,
                      kernels=kernels)
    stage_pipelines = _pipeline.stages(options)

    timings: dict[str, float] = {}
    start = time.perf_counter()
    # The runtime gets the signature of exactly the graph built here.
    signature = Signature.of(graph)
    module = graph.build(ir.Context(), target=options.kernel_target())
    timings["graph"] = time.perf_counter() - start
    stage_ir = {"graph": str(module)}
    for stage, stage_pipeline in stage_pipelines.items():
        start = time.perf_counter()
        _pipeline.run_stage(module, stage, stage_pipeline)
        timings[stage] = time.perf_counter() - start
        stage_ir[stage] = str(module)

    start = time.perf_counter()
    if options.target == "cuda":
        from .runtime.cuda import CUDARuntime

        # The driver JIT-compiles the PTX on the first run; nothing here
        # needs a GPU.
        runtime = CUDARuntime(signature, _ptx(module))
    else:
        from .runtime.cpu import CPURuntime

        # Simulated GPU kernels are for checking results, and LLVM 22's loop
        # vectorizer can take minutes on their lane loops: optimise less.
        runtime = CPURuntime(signature, module, options.workers,
                             opt_level=0 if options.kernels == "cuda" else 2)
    timings["jit"] = time.perf_counter() - start
    return CompiledKernel(graph, options, stage_ir, timings, runtime)


def _ptx(module: ir.Module) -> str:
    """The PTX text of the one `gpu.binary` that etc-lower-to-nvvm leaves."""
    from mlir.dialects import gpu

    texts = []
    for op in module.body.operations:
        if op.operation.name != "gpu.binary":
            continue
        for attr in op.attributes["objects"]:
            texts.append(gpu.ObjectAttr(attr).object.decode())
    if len(texts) != 1:
        raise RuntimeError(f"expected one gpu.binary object with PTX after lowering, found {len(texts)}")
    return texts[0]
