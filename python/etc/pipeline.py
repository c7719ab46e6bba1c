"""The compilation pipeline, stage by stage.

Each stage is one textual pass pipeline, registered in C++ so that `etc-opt`,
this module and the lit tests run the same passes. `stages(options)` gives the
canonical pipeline string of every stage; `run_stage` runs one on a module and,
on failure, raises `PipelineError` carrying the IR it failed on and a one-line
`etc-opt` command that reproduces the failure.

The IR is verified at the end of each stage, not after each of its passes
(verifying after every pass was a fifth to a third of the passes' time);
the reproducer's `etc-opt` verifies after each pass, so it names the pass
that broke the IR. `ETC_VERIFY_EACH_PASS=1` verifies after each pass here
too.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass

from mlir import ir
from mlir.passmanager import PassManager

from .runtime.abi import check_worker_bounds

TARGETS = ("cpu", "cuda")
SCHEDULES = ("static", "dynamic", "auto")
POLICIES = ("round-robin", "claim")
KERNELS = ("native", "cuda", "amx")
#: The stages of the pipeline, in order, as `CompiledKernel.ir(stage)` names them.
STAGES = ("graph", "event", "scheduled", "lowered")


@dataclass(frozen=True)
class Options:
    """What `etc.compile` was asked for; validated on construction."""

    target: str = "cpu"
    schedule: str = "static"
    workers: int = 4
    #: How the static schedule shares the global tile order among the
    #: workers (`event-static-schedule`'s `policy`): "claim" (each worker
    #: claims the next tile from a shared counter, so a worker that the
    #: operating system deschedules holds back one tile) or "round-robin"
    #: (tile t on worker t mod W). None: "claim" on the CPU, where threads
    #: share cores with everything else; "round-robin" on CUDA, where a
    #: claim costs the CTA two barriers per tile.
    policy: str | None = None
    chip: str = "sm_90a"
    #: Record a trace of every run (`kernel.trace`).
    trace: bool = False
    #: Seconds a wait or queue pop may spin before the run is stopped and
    #: `run` raises `etc.runtime.WatchdogError`.
    watchdog: float = 5.0
    #: Which tile kernels: "native" (the target's own) or, on the CPU target,
    #: "cuda" (the CUDA kernels with their lanes simulated one after another,
    #: to test their indexing and reductions without a GPU) or "amx" (the
    #: AMX tile kernels, their tile instructions emulated by AVX-512 BF16
    #: vector code where the instruction set has no AMX, to test their
    #: packing and indexing without an AMX CPU).
    kernels: str = "native"
    #: Prefetch each tile's weight boxes into L2 before its waits (static
    #: schedule); None: on for CUDA kernels, off otherwise (the CPU
    #: lowering drops the hints anyway).
    prefetch: bool | None = None
    #: Threads per worker CTA the CUDA tile kernels are written for (and
    #: the runtime launches: the ABI records them); None: 128 (one
    #: warpgroup). A positive multiple of 32, at most 1024. CUDA only
    #: (target="cuda", or the CUDA kernels simulated on the CPU).
    lanes: int | None = None
    #: The worker's `.minnctapersm` (with `.maxntid` = lanes: ptxas then
    #: knows the registers a lane has at entry, 65,536 / (lanes x
    #: min_ctas), which `setmaxnreg` needs); None: no such bound.
    min_ctas: int | None = None

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target={self.target!r} is not supported; expected one of {TARGETS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule={self.schedule!r} is not supported; expected one of {SCHEDULES}")
        if self.policy is None:
            object.__setattr__(self, "policy", "claim" if self.target == "cpu" else "round-robin")
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is not supported; expected one of {POLICIES} "
                             "or None")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers={self.workers!r} must be a positive integer")
        if not isinstance(self.trace, bool):
            raise ValueError(f"trace={self.trace!r} must be True or False")
        if (isinstance(self.watchdog, bool) or not isinstance(self.watchdog, (int, float))
                or not 0.001 <= self.watchdog <= 2_000_000):
            raise ValueError(f"watchdog={self.watchdog!r} must be a number of seconds in "
                             "[0.001, 2000000]")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels={self.kernels!r} is not supported; expected one of {KERNELS}")
        if self.prefetch is not None and not isinstance(self.prefetch, bool):
            raise ValueError(f"prefetch={self.prefetch!r} must be True, False or None")
        if self.kernels in ("cuda", "amx") and self.target != "cpu":
            raise ValueError(f"kernels={self.kernels!r} simulates the {self.kernels.upper()} "
                             f"kernels on target='cpu'; target={self.target!r} builds its own "
                             "kernels")
        # The rules etc.models.load applies too (without MLIR).
        check_worker_bounds(self.lanes, self.min_ctas,
                            cuda_kernels="cuda" in (self.target, self.kernels))

    @property
    def worker_lanes(self) -> int:
        """Threads per worker CTA of the CUDA kernels (`lanes`, else 128)."""
        return 128 if self.lanes is None else self.lanes

    @property
    def prefetches(self) -> bool:
        """Whether the static schedule prefetches weight boxes."""
        if self.prefetch is not None:
            return self.prefetch
        return "cuda" in (self.target, self.kernels)

    @property
    def watchdog_ms(self) -> int:
        return max(1, round(self.watchdog * 1000))

    def kernel_target(self):
        """The `etc.ops.Target` the tile kernels are built for."""
        from .ops import Target
        if self.kernels == "cuda":
            return Target("cuda", self.chip, lanes=self.worker_lanes, min_ctas=self.min_ctas,
                          simulate_lanes=True)
        if self.target == "cpu":
            from .runtime import isa

            chosen = isa.chosen()
            if self.kernels == "amx" and not isa.has(chosen, "avx512bf16"):
                raise ValueError(f"kernels='amx' emulates the AMX tiles with AVX-512 BF16, which "
                                 f"the instruction set {chosen} lacks")
            return Target("cpu", self.chip, workers=self.workers, isa=chosen,
                          emulate_amx=self.kernels == "amx")
        return Target(self.target, self.chip, workers=self.workers, lanes=self.worker_lanes,
                      min_ctas=self.min_ctas)


def stages(options: Options) -> dict[str, str]:
    """The canonical pass pipeline of each stage after "graph" (the input)."""
    return {
        "event": "builtin.module(event.graph(event-infer-dependencies))",
        "scheduled": schedule_pipeline(options),
        "lowered": lowering_pipeline(options),
    }


def schedule_pipeline(options: Options) -> str:
    """L2 -> L3: check the event graph, then schedule it.

    "static" needs the textual task order to be a valid static order;
    "dynamic" only needs an acyclic, balanced graph (tasks run as they become
    ready); "auto" schedules each graph dynamically when its events depend on
    runtime data (indirect maps, events counted on the device) and statically
    otherwise, deciding in `event-dynamic-schedule{auto=true}`, which checks
    each graph as its schedule needs.
    """
    trace = " trace=true" if options.trace else ""
    # By default for CUDA kernels (also simulated on the CPU, where the CPU
    # lowering drops the hints): weights are prefetched into L2 while a
    # tile waits.
    prefetch = " prefetch=true" if options.prefetches else ""
    if options.schedule == "static":
        return ("builtin.module(event.graph(event-check-schedule),"
                f"event-static-schedule{{workers={options.workers} policy={options.policy}"
                f"{trace}{prefetch}}})")
    if options.schedule == "dynamic":
        return ("builtin.module(event.graph(event-check-schedule{static-order=false}),"
                f"event-dynamic-schedule{{workers={options.workers}{trace}}})")
    return ("builtin.module(event-dynamic-schedule{"
            f"workers={options.workers} auto=true policy={options.policy}{trace}{prefetch}}})")


def lowering_pipeline(options: Options) -> str:
    """L3 -> target code: LLVM dialect for the CPU runtime, or a gpu.binary
    holding PTX text for `options.chip` on CUDA.

    The PTX ISA version is the oldest that LLVM's NVPTX backend accepts for
    the chip (sm_90a needs PTX 8.0; the default 6.0 aborts for it); older
    PTX assembles on more drivers. Hopper tiles with TMA loads
    (`MatmulWGMMA.tma`) need 8.3 (`TMA_PTX`)."""
    if options.target == "cpu":
        return f"builtin.module(etc-lower-to-cpu{{watchdog-ms={options.watchdog_ms}}})"
    # chip -> oldest PTX ISA that LLVM emits for it and that has nanosleep (6.3).
    min_ptx = {"sm_70": 63, "sm_72": 63, "sm_75": 63, "sm_80": 70, "sm_86": 71,
               "sm_87": 74, "sm_89": 78, "sm_90": 78, "sm_90a": 80, "sm_100": 86,
               "sm_100a": 86, "sm_101": 86, "sm_101a": 86, "sm_120": 87, "sm_120a": 87}
    if options.chip not in min_ptx:
        raise ValueError(
            f"chip={options.chip!r} is not supported on target='cuda'; expected one of "
            f"{tuple(min_ptx)} (waits need nanosleep, sm_70 or newer)")
    ptx = min_ptx[options.chip]
    if options.chip == "sm_90a":
        from .ops.matmul_wgmma import TMA_PTX, MatmulWGMMA

        # TMA tiles fence the tensor-map proxy, which needs PTX 8.3.
        if MatmulWGMMA.tma:
            ptx = TMA_PTX
    features = f"+ptx{ptx}"
    # The worker's bounds: `.maxntid lanes` for lanes other than 128 or with
    # `min_ctas`, `.minnctapersm` with `min_ctas` (etc-lower-to-nvvm's options).
    bounds = f" lanes={options.worker_lanes}" if options.worker_lanes != 128 else ""
    if options.min_ctas is not None:
        bounds += f" min-ctas={options.min_ctas}"
    return (f"builtin.module(etc-lower-to-nvvm{{chip={options.chip} features={features} "
            f"watchdog-ms={options.watchdog_ms}{bounds}}})")


def build(options: Options) -> str:
    """The whole pipeline from L1 to the target, as one string for `etc-opt`."""
    inner = [p[len("builtin.module("):-1] for p in stages(options).values()]
    return "builtin.module(" + ",".join(inner) + ")"


class PipelineError(RuntimeError):
    """A stage of the pipeline failed.

    Attributes: `stage`, `pipeline` (the pass pipeline string), `ir` (the module
    it ran on), `repro` (a shell command reproducing the failure with etc-opt)
    and `diagnostics` (the compiler's messages).
    """

    def __init__(self, stage: str, pipeline: str, ir_text: str, repro: str, diagnostics: str):
        self.stage = stage
        self.pipeline = pipeline
        self.ir = ir_text
        self.repro = repro
        self.diagnostics = diagnostics
        super().__init__(
            f"stage {stage!r} failed:\n{diagnostics}\nreproduce with:\n  {repro}")


def _write_repro(ir_text: str) -> str:
    handle, path = tempfile.mkstemp(prefix="etc-repro-", suffix=".mlir")
    with os.fdopen(handle, "w") as f:
        f.write(ir_text)
    return path


def verify_each_pass() -> bool:
    """Whether `run_stage` verifies the IR after each pass
    (`ETC_VERIFY_EACH_PASS=1`) or once after the stage (unset or 0)."""
    value = os.environ.get("ETC_VERIFY_EACH_PASS", "0")
    if value not in ("0", "1"):
        raise ValueError(f"ETC_VERIFY_EACH_PASS={value!r}: expected 0 (verify the IR after "
                         f"each stage) or 1 (after each pass)")
    return value == "1"


def run_stage(module: ir.Module, stage: str, pipeline: str, before=None) -> None:
    """Runs `pipeline` on `module` in place, raising PipelineError on failure.

    `before` is a copy of `module` as it is now (`module.operation.clone()`;
    taken here when not given): printed only when the stage fails, for the
    reproducer. Copying is cheap where printing is not (a packed MoE step
    graph: 0.02 s against 0.35 s)."""
    each = verify_each_pass()
    if before is None:
        before = module.operation.clone()
    try:
        manager = PassManager.parse(pipeline, context=module.context)
        manager.enable_verifier(each)
        manager.run(module.operation)
        module.operation.verify()
    except ir.MLIRError as error:
        diagnostics = "\n".join(_format(d) for d in error.error_diagnostics) or str(error)
        before = before.get_asm(enable_debug_info=False)
        path = _write_repro(before)
        repro = f"etc-opt --pass-pipeline={shlex.quote(pipeline)} {shlex.quote(path)}"
        raise PipelineError(stage, pipeline, before, repro, diagnostics) from None


def _format(diagnostic) -> str:
    lines = [f"{diagnostic.location}: {diagnostic.message}"]
    lines += [f"  note: {_format(note)}" for note in diagnostic.notes]
    return "\n".join(lines)
