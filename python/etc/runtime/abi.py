"""What a compiled program takes and how to run it, without MLIR.

A `KernelABI` is everything a runtime needs besides the code: the graph's
arguments in order (names, kinds, dtypes, symbolic shapes), its outputs, the
target and schedule, and the tables that turn the device's error and trace
records into names (tasks and their tile grids, event tensors). `etc.compile`
builds it from the graph and the scheduled IR; an artifact stores it as JSON.

Sizes that depend on symbols are not formulas here: intermediates and
outputs take their declared shapes with the symbols bound from the inputs
(`etc.binding`), and the counter buffer (event counters, task queue, error
record, trace records) is as large as the program's own `<g>_counters`
function says for the bound symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..packed import FORMATS
from .ranges import RAGGED_LAYOUTS, IndexRange

#: Kinds of graph argument, in the order they appear.
ARGUMENT_KINDS = ("symbol", "input", "state", "output", "intermediate")
#: Element types of buffers ("index" for symbols, and the packed weight
#: formats of `etc.packed`).
DTYPES = ("f32", "f16", "bf16", "i32", "index", *FORMATS)


#: Threads per worker CTA of CUDA kernels compiled without `lanes` (one
#: warpgroup).
DEFAULT_LANES = 128


def check_worker_bounds(lanes, min_ctas, *, cuda_kernels: bool) -> None:
    """The rules `etc.compile` (`Options`) and `etc.models.load` apply to
    `lanes` (threads per worker CTA) and `min_ctas` (the worker's
    `.minnctapersm`), without MLIR: both None, or positive ints for CUDA
    kernels (`cuda_kernels`: target "cuda", or the CUDA kernels simulated
    on the CPU); lanes a multiple of 32 up to 1,024; at most 2,048 threads
    of worker CTAs per SM. A ValueError names the argument otherwise."""
    for name, value in (("lanes", lanes), ("min_ctas", min_ctas)):
        if value is None:
            continue
        if not cuda_kernels:
            raise ValueError(f"{name}={value!r} applies to CUDA kernels: target='cuda', or "
                             "target='cpu' with kernels='cuda' (simulated)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if lanes is not None and (lanes % 32 or lanes > 1024):
        raise ValueError(f"lanes={lanes!r} must be a multiple of 32 (whole warps) "
                         "and at most 1024 (threads per CTA)")
    width = DEFAULT_LANES if lanes is None else lanes
    if min_ctas is not None and width * min_ctas > 2048:
        raise ValueError(f"min_ctas={min_ctas!r} CTAs of {width} lanes "
                         "exceed the 2,048 threads an SM holds")


@dataclass(frozen=True)
class Argument:
    """One argument of the program, in argument order: `kind` is one of
    ARGUMENT_KINDS; `shape` holds ints and symbol names (`()` for a symbol)."""

    kind: str
    name: str
    shape: tuple
    dtype: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "shape": list(self.shape),
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> "Argument":
        kind, dtype = data["kind"], data["dtype"]
        if kind not in ARGUMENT_KINDS:
            raise ValueError(f"argument {data.get('name')!r}: unknown kind {kind!r}")
        if dtype not in DTYPES:
            raise ValueError(f"argument {data.get('name')!r}: unknown dtype {dtype!r}")
        shape = tuple(d if isinstance(d, str) else int(d) for d in data["shape"])
        return cls(kind, str(data["name"]), shape, dtype)


@dataclass(frozen=True)
class Task:
    """One task (operator) of the program: its name (`matmul_1`) and the rank
    of its tile grid."""

    name: str
    grid_rank: int


@dataclass(frozen=True)
class Event:
    """One event tensor: its name (`e<number>`) and the tasks that notify it
    and wait on it."""

    name: str
    notified_by: tuple = ()
    waited_by: tuple = ()


@dataclass(frozen=True)
class KernelABI:
    """The interface of one compiled program (see the module docstring).

    `schedule` is the schedule the program got ("static" or "dynamic"; "auto"
    is resolved at compile time). `workers` is the CPU thread count.
    `watchdog_ms` bounds every spin of the program; `trace` says whether the
    workers record trace events. `reference` is the graph's operators for
    the NumPy reference (`etc.reference.evaluate`), when known. `isa` is
    the x86-64 level CPU code is compiled for (`etc.runtime.isa`; None for
    CUDA, and for CPU code built for the host on other architectures).
    `shared_bytes` (CUDA) is the worker's scratch arena: the dynamic shared
    memory each worker CTA is launched with (`convert-event-to-gpu`).
    `lanes` (CUDA kernels) is the threads per worker CTA the tiles are
    written for (`etc.compile(..., lanes=)`), which the runtime launches;
    an ABI written before it was recorded reads as 128, what every kernel
    was then compiled for.
    """

    name: str
    target: str
    chip: str
    schedule: str
    workers: int
    arguments: tuple
    outputs: tuple
    tasks: tuple = ()
    events: tuple = ()
    watchdog_ms: int = 0
    trace: bool = False
    reference: dict | None = None
    extra: dict = field(default_factory=dict)
    isa: str | None = None
    #: The valid values of index inputs (`etc.runtime.ranges.IndexRange`), by name:
    #: runtimes check them before every run.
    index_ranges: dict = field(default_factory=dict)
    #: The ragged batches (`Graph.ragged_batch`: role -> input name), whose
    #: consistency runtimes check before every run.
    ragged_batches: tuple = ()
    shared_bytes: int = 0
    lanes: int = DEFAULT_LANES

    # -- names of the program's functions ----------------------------------

    def function(self, role: str) -> str:
        """The symbol of the program's `role` function: counters, init, worker
        or check."""
        return f"{self.name}_{role}"

    @property
    def inputs(self) -> list[str]:
        return [a.name for a in self.arguments if a.kind == "input"]

    def argument(self, name: str) -> Argument:
        for arg in self.arguments:
            if arg.name == name:
                return arg
        raise KeyError(name)

    # -- JSON ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "target": self.target, "chip": self.chip,
            "schedule": self.schedule, "workers": self.workers,
            "arguments": [a.to_json() for a in self.arguments],
            "outputs": list(self.outputs),
            "tasks": [{"name": t.name, "grid_rank": t.grid_rank} for t in self.tasks],
            "events": [{"name": e.name, "notified_by": list(e.notified_by),
                        "waited_by": list(e.waited_by)} for e in self.events],
            "watchdog_ms": self.watchdog_ms, "trace": self.trace,
            "reference": self.reference,
            "extra": self.extra,
            "isa": self.isa,
            "index_ranges": {name: r.to_json() for name, r in self.index_ranges.items()},
            "ragged_batches": [dict(batch) for batch in self.ragged_batches],
            "shared_bytes": self.shared_bytes,
            "lanes": self.lanes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KernelABI":
        try:
            abi = cls(
                name=str(data["name"]), target=str(data["target"]), chip=str(data["chip"]),
                schedule=str(data["schedule"]), workers=int(data["workers"]),
                arguments=tuple(Argument.from_json(a) for a in data["arguments"]),
                outputs=tuple(str(o) for o in data["outputs"]),
                tasks=tuple(Task(str(t["name"]), int(t["grid_rank"])) for t in data["tasks"]),
                events=tuple(Event(str(e["name"]), tuple(e["notified_by"]),
                                   tuple(e["waited_by"])) for e in data["events"]),
                watchdog_ms=int(data["watchdog_ms"]), trace=bool(data["trace"]),
                reference=data.get("reference"),
                extra=dict(data.get("extra") or {}),
                isa=None if data.get("isa") is None else str(data["isa"]),
                index_ranges={str(name): IndexRange.from_json(r)
                              for name, r in (data.get("index_ranges") or {}).items()},
                ragged_batches=tuple({str(role): str(name) for role, name in batch.items()}
                                     for batch in data.get("ragged_batches") or ()),
                shared_bytes=int(data.get("shared_bytes", 0)),
                lanes=int(data.get("lanes", 128)))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed kernel ABI: {type(error).__name__}: {error}") from None
        names = {a.name for a in abi.arguments}
        missing = [o for o in abi.outputs if o not in names]
        if missing:
            raise ValueError(f"malformed kernel ABI: outputs {missing} are not arguments")
        inputs = {a.name for a in abi.arguments if a.kind == "input" and a.dtype == "i32"}
        symbols = {a.name for a in abi.arguments if a.kind == "symbol"}
        wrong = [n for n, r in abi.index_ranges.items() if n not in inputs or any(
            isinstance(dim, str) and dim.partition("*")[0] not in symbols
            for dim, _ in r.highs)]
        if wrong:
            raise ValueError(f"malformed kernel ABI: the index ranges of {wrong} name inputs "
                             f"or symbols the kernel does not have")
        for batch in abi.ragged_batches:
            if set(batch) not in RAGGED_LAYOUTS or not set(batch.values()) <= inputs:
                raise ValueError(f"malformed kernel ABI: ragged batch {batch!r}")
        if not 32 <= abi.lanes <= 1024 or abi.lanes % 32:
            raise ValueError(f"malformed kernel ABI: lanes={abi.lanes} is not a positive "
                             "multiple of 32 up to 1024 (threads per worker CTA)")
        return abi
