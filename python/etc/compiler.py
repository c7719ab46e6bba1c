"""`etc.compile`: a graph in, a kernel that runs on the chosen target out."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING

from mlir import ir

from . import ops
from . import pipeline as _pipeline
from . import reference as _reference
from .binding import Signature
from .pipeline import Options
from .runtime import artifact as _artifact
from .runtime.abi import Argument, Event, KernelABI, Task
from .runtime.kernel import Kernel

if TYPE_CHECKING:
    from .graph import Graph


class CompiledKernel(Kernel):
    """A graph compiled for one target. One kernel serves every value of every
    symbolic dimension: `run` binds them from the input shapes.

    The kernel runs what was compiled: its `signature` (inputs, outputs and
    their order) and `abi` are a snapshot taken by `etc.compile`, and later
    changes to `graph` do not affect it; compile again to pick them up."""

    def __init__(self, graph: "Graph | None", options: Options, abi: KernelABI,
                 stage_ir: dict, timings: dict[str, float], runtime, engine=None):
        super().__init__(abi, runtime)
        self.graph = graph
        self.options = options
        # Stage name -> the IR's text, or a copy of the module after that
        # stage, printed when first asked for (printing a step graph's
        # lowered module takes seconds; copying it, a fraction of one).
        self._stage_ir = stage_ir
        #: Seconds spent in each compilation stage.
        self.timings = timings
        self._engine = engine

    def ir(self, stage: str) -> str:
        """The IR after `stage`: one of "graph", "event", "scheduled", "lowered"."""
        if stage not in self._stage_ir:
            raise ValueError(f"unknown stage {stage!r}; expected one of {tuple(self._stage_ir)}")
        text = self._stage_ir[stage]
        if not isinstance(text, str):
            text = self._stage_ir[stage] = str(text)
        return text

    def save(self, path, metadata: dict | None = None) -> None:
        """Writes the kernel to `path` as one self-describing artifact that
        `etc.runtime.load` runs without MLIR (see `etc.runtime.artifact`),
        with `metadata` (JSON-able: what the kernel was compiled from).

        CUDA artifacts hold the PTX (and, for a graph on several ranks,
        NVSHMEM's device library as PTX, linked with it at load). CPU artifacts hold a shared library linked
        from the JIT's object code by the system C compiler (`cc`, or `$CC`),
        for this machine's platform."""
        library = None
        if self.options.target == "cuda":
            code = self._runtime.ptx.encode()
            if self.abi.extra.get("ranks", 1) > 1:
                library = self._runtime.library_ptx.encode()
        else:
            code = _shared_library(self._engine)
        _artifact.write(path, self.abi, code, metadata, library=library)

    def __repr__(self) -> str:
        return (f"<CompiledKernel {self.abi.name} target={self.options.target} "
                f"schedule={self.abi.schedule} workers={self.options.workers}>")


def default_workers(target: str) -> int:
    """The worker count `workers=None` means: one thread per core this
    process may run on for the CPU (more only contend for the cores: the
    workers spin-wait for each other); 1 for CUDA, where the runtime sizes
    the grid from the device and the option only records the intent."""
    if target != "cpu":
        return 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def compile(graph: "Graph", *, target: str = "cpu", schedule: str = "static",
            workers: int | None = None, policy: str | None = None, chip: str = "sm_90a",
            trace: bool = False, watchdog: float = 5.0,
            kernels: str = "native", prefetch: bool | None = None, lanes: int | None = None,
            min_ctas: int | None = None) -> CompiledKernel:
    """Compiles `graph` into one persistent program for `target`.

    Stages: "graph" (L1 tasks) -> "event" (dependencies inferred) ->
    "scheduled" (persistent worker program) -> "lowered" (target code).
    A failing stage raises `etc.pipeline.PipelineError` with an `etc-opt`
    command that reproduces it.

    `trace=True` makes every run record each tile task's worker, task, tile,
    start and end (`kernel.trace`); untraced kernels have no such code.
    Every wait of the program gives up after `watchdog` seconds: the run
    stops and raises `etc.runtime.WatchdogError` naming the stuck task, tile,
    event and element.

    `kernels="cuda"` (target="cpu" only) builds the CUDA tile kernels and
    runs them on the CPU with their lanes simulated one after another: a
    check of the GPU kernels' indexing and reductions without a GPU.
    `kernels="amx"` (target="cpu" only, an instruction set with AVX-512
    BF16) builds the AMX matmul tiles for bf16 and, where the instruction
    set has no AMX, runs their tile instructions as AVX-512 BF16 vector
    code: a check of their packing and indexing without an AMX CPU.

    `prefetch` (static schedule): before its waits, each tile asks for the
    boxes it reads from weights (buffers no task writes) to be brought into
    L2; None turns it on for CUDA kernels.

    `workers=None` is one CPU thread per usable core (`default_workers`).

    `lanes` (CUDA kernels, also simulated): threads per worker CTA the tiles
    are written for and the runtime launches (the ABI records them); None:
    128. A positive multiple of 32, at most 1024. `min_ctas`: the worker's
    `.minnctapersm` (worker CTAs per SM), which with `.maxntid lanes` fixes
    the registers a lane has at entry (65,536 / (lanes x min_ctas)); the
    warp-specialised Hopper tile needs it (`matmul_wgmma.warp_specialised`).

    `policy` (static schedule, and the graphs "auto" schedules statically):
    how the workers share the global tile order: "claim" (the next tile
    from a shared counter: a descheduled worker holds back one tile) or
    "round-robin" (tile t on worker t mod W); None: "claim" on the CPU,
    "round-robin" on CUDA.
    """
    if workers is None:
        workers = default_workers(target)
    options = Options(target=target, schedule=schedule, workers=workers, policy=policy, chip=chip,
                      trace=trace, watchdog=watchdog, kernels=kernels, prefetch=prefetch,
                      lanes=lanes, min_ctas=min_ctas)
    start = time.perf_counter()
    # The kernel gets the signature of exactly the graph built here.
    signature = Signature.of(graph)
    reference = _reference.describe(graph)
    module = graph.build(ir.Context(), target=options.kernel_target())
    elapsed = time.perf_counter() - start
    kernel = compile_module(module, signature, options, stage="graph", reference=reference)
    kernel.timings = {"graph": elapsed, **kernel.timings}
    kernel.graph = graph
    return kernel


def compile_module(module: ir.Module, signature, options: Options, *,
                   stage: str = "graph", reference: dict | None = None) -> CompiledKernel:
    """Compiles `module`, whose IR is at `stage` (it runs the stages after
    it, in place), into a kernel with the arguments of `signature`: an
    `etc.Graph`, or anything with its `name`, `arguments` (`etc.Argument`s in
    argument order) and `outputs`. For tests and tools that start from IR
    (hand-written or edited); `etc.compile` is this from "graph"."""
    names = _pipeline.STAGES
    if stage not in names:
        raise ValueError(f"unknown stage {stage!r}; expected one of {names}")
    stage_pipelines = _pipeline.stages(options)
    timings: dict[str, float] = {}
    stage_ir = {stage: module.operation.clone()}
    tables = _program_tables(module, signature.name) if stage == "scheduled" else None
    for previous, name in zip(names[names.index(stage):], names[names.index(stage) + 1:]):
        start = time.perf_counter()
        _pipeline.run_stage(module, name, stage_pipelines[name], before=stage_ir[previous])
        timings[name] = time.perf_counter() - start
        stage_ir[name] = module.operation.clone()
        if name == "scheduled":
            tables = _program_tables(module, signature.name)
    if tables is None:
        raise ValueError(f"compile_module needs the IR at stage 'scheduled' or before, "
                         f"not {stage!r}: the kernel's task and event tables come from it")

    abi = _abi(signature, options, tables, reference)
    if options.target == "cuda":
        abi = dataclasses.replace(abi, shared_bytes=_shared_bytes(module, signature.name))
    start = time.perf_counter()
    engine = None
    if options.target == "cuda":
        from .runtime.cuda import CUDARuntime

        # The driver JIT-compiles the PTX on the first run; nothing here
        # needs a GPU.
        if abi.extra.get("ranks", 1) > 1:
            from .runtime.distributed import nvshmem_library_ptx
            from .runtime.nvshmem import NVSHMEMRuntime

            # NVSHMEM's device library is compiled for the chip when the
            # kernel is first run or saved (a cached cut of its bitcode).
            runtime = NVSHMEMRuntime(abi, _ptx(module),
                                     functools.partial(nvshmem_library_ptx, abi.chip))
        else:
            runtime = CUDARuntime(abi, _ptx(module))
    else:
        from .runtime.cpu import CPURuntime
        from .runtime.isa import opt_level

        # Simulated GPU kernels are for checking results, and LLVM 22's loop
        # vectorizer can take minutes on their lane loops: no optimisation.
        # Native kernels: ETC_CPU_OPT_LEVEL, else 2.
        engine, entry_points = _jit(module, abi,
                                    opt_level=0 if options.kernels == "cuda" else opt_level())
        if abi.extra.get("ranks", 1) > 1:
            from .runtime.distributed import DistributedCPURuntime

            runtime = DistributedCPURuntime(abi, entry_points, options.workers)
        else:
            runtime = CPURuntime(abi, entry_points, options.workers)
    timings["jit"] = time.perf_counter() - start
    return CompiledKernel(signature if hasattr(signature, "operations") else None, options, abi,
                          stage_ir, timings, runtime, engine)


def _program_tables(module: ir.Module, name: str) -> dict:
    """What the scheduler recorded on `@<name>_worker`: the schedule it
    chose, the task and event tables, and whether the program traces."""
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value != f"{name}_worker":
            continue
        attributes = op.attributes

        def names(entry, key):
            return tuple(ir.StringAttr(n).value for n in ir.ArrayAttr(ir.DictAttr(entry)[key]))

        tasks = tuple(Task(ir.StringAttr(ir.DictAttr(t)["name"]).value,
                           ir.IntegerAttr(ir.DictAttr(t)["grid_rank"]).value)
                      for t in ir.ArrayAttr(attributes["event.tasks"]))
        events = tuple(Event(ir.StringAttr(ir.DictAttr(e)["name"]).value,
                             names(e, "notified_by"), names(e, "waited_by"))
                       for e in ir.ArrayAttr(attributes["event.events"]))
        ranks = (ir.IntegerAttr(attributes["event.ranks"]).value
                 if "event.ranks" in attributes else 1)
        return {"schedule": ir.StringAttr(attributes["event.schedule"]).value,
                "tasks": tasks, "events": events, "trace": "event.trace" in attributes,
                "ranks": ranks}
    raise ValueError(f"the scheduled module has no worker function @{name}_worker")


def _shared_bytes(module: ir.Module, name: str) -> int:
    """The scratch arena of graph `name`'s worker: the dynamic shared memory
    `convert-event-to-gpu` recorded for its kernels (0 when it needs none)."""
    attributes = module.operation.attributes
    if "event.dynamic_shared_bytes" not in attributes:
        return 0
    sizes = ir.DictAttr(attributes["event.dynamic_shared_bytes"])
    key = f"{name}_kernels"
    return ir.IntegerAttr(sizes[key]).value if key in sizes else 0


def _abi(signature, options: Options, tables: dict, reference: dict | None) -> KernelABI:
    """The kernel ABI of `signature` compiled with `options`; `tables` from
    `_program_tables`."""
    arguments = tuple(Argument(a.kind, a.name, tuple(a.shape), a.dtype)
                      for a in signature.arguments)
    if reference is None and hasattr(signature, "operations"):
        reference = _reference.describe(signature)
    chip = options.chip if options.target == "cuda" else _artifact.host_platform()
    isa = None
    if options.target == "cpu":
        from .runtime import isa as _isa

        isa = _isa.chosen()
    # The schedule is the one the program got ("auto" resolved, or whatever a
    # hand-picked pipeline chose), as the scheduler recorded it.
    lanes = options.worker_lanes if "cuda" in (options.target, options.kernels) else 128
    return KernelABI(name=signature.name, target=options.target, chip=chip, lanes=lanes,
                     schedule=tables["schedule"], workers=options.workers, arguments=arguments,
                     outputs=tuple(signature.outputs), tasks=tables["tasks"],
                     events=tables["events"], watchdog_ms=options.watchdog_ms,
                     trace=tables["trace"], reference=reference, isa=isa,
                     index_ranges=dict(getattr(signature, "index_ranges", {}) or {}),
                     ragged_batches=tuple(getattr(signature, "ragged_batches", ()) or ()),
                     extra=_extra(options, tables))


def _extra(options: Options, tables: dict) -> dict:
    """The ABI's `extra`: the rank count of a multi-GPU program; for CUDA
    kernels simulated on the CPU, `packed_layout` "gpu" (the CPU runtime
    repacks packed inputs as the CUDA runtime does: `etc.packed`)."""
    extra = {"ranks": tables["ranks"]} if tables["ranks"] > 1 else {}
    if options.target == "cpu" and options.kernels == "cuda":
        extra["packed_layout"] = "gpu"
    return extra


def _jit(module: ir.Module, abi: KernelABI, opt_level: int = 2):
    """JIT-compiles the lowered module (position-independent, so that `save`
    can link the same object code into a shared library) and returns the
    engine and the program's entry points."""
    from .runtime import jit
    from .runtime.cpu import ROLES, EntryPoints

    engine = jit.create(module, abi.name, opt_level, isa=abi.isa)
    addresses = {}
    for role in ROLES:
        # Looking the entry points up now makes the JIT generate their code
        # here, at compile time, instead of inside the first `run`, and turns
        # a program that cannot link into a JITError naming what is missing.
        jit.lookup(engine, abi.function(role), abi.name)
        # raw_lookup(name) finds the symbol `_mlir_<name>`, so "ciface_<f>"
        # is the C-interface function `_mlir_ciface_<f>` itself.
        addresses[role] = engine.raw_lookup(f"ciface_{abi.function(role)}")
    return engine, EntryPoints(addresses, engine)


def _shared_library(engine) -> bytes:
    """The JIT's object code linked into a shared library by the system C
    compiler."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("saving a CPU kernel links a shared library and needs a C compiler: "
                           "install cc (gcc or clang) or set $CC")
    with tempfile.TemporaryDirectory(prefix="etc-save-") as directory:
        obj = os.path.join(directory, "kernel.o")
        lib = os.path.join(directory, "kernel.so")
        engine.dump_to_object_file(obj)
        result = subprocess.run([compiler, "-shared", "-o", lib, obj, "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"linking the CPU kernel failed ({compiler}):\n{result.stderr}")
        with open(lib, "rb") as f:
            return f.read()


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
