"""PTX from the CUDA pipeline, checked without a GPU: every operator graph
lowers to PTX that `ptxas` assembles, the synchronisation is what the design
says (GPU-scope release before the counter decrement, relaxed polling with
nanosleep and one acquire fence, one barrier and fence per tile however many
notifies, CTA barriers), and the kernels take MLIR's memref parameters."""

from __future__ import annotations

import re

import pytest
from mlir import ir
from mlir.passmanager import PassManager

import etc
from etc.compiler import _ptx
from ptxas_check import assemble, needs_ptxas
from test_cpu_runtime import OPERATORS, _graph, _mlp



def _entry(ptx: str, name: str) -> str:
    """The text of `.entry name(...) { ... }`."""
    start = ptx.index(f".entry {name}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start:] if end < 0 else ptx[start:end]


def _function(ptx: str, name: str) -> str:
    """The text of the definition of device function `name` (not its
    forward declaration)."""
    for match in re.finditer(rf"\.func\s+(?:\([^)]*\)\s*)?{name}\(", ptx):
        close = ptx.index(")", match.end())
        if ptx[close + 1:].lstrip().startswith("{"):
            return ptx[match.start():ptx.index("\n}\n", close)]
    raise AssertionError(f"the PTX defines no function {name}")


#: A GPU-scope release fence, then (no other fence between) a counter
#: decrement: the release pattern of a notify. A static worker's notifies
#: follow the fence without a barrier; a dynamic worker's `notify_ready`
#: has one more barrier, for its broadcast word.
_RELEASED_DECREMENT = re.compile(
    r"fence\.acq_rel\.gpu;(?:(?!fence\.)[\s\S])*?atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\], -1;")
_RELEASED_DECREMENT_NO_BARRIER = re.compile(
    r"fence\.acq_rel\.gpu;(?:(?!fence\.|bar\.sync)[\s\S])*?atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\], -1;")


def _check_worker_synchronisation(ptx: str, name: str, schedule: str) -> None:
    worker = _entry(ptx, f"{name}_worker")
    assert "bar.sync" in worker
    # Notify: a GPU-scope release fence before the decrement.
    pattern = _RELEASED_DECREMENT if schedule == "dynamic" else _RELEASED_DECREMENT_NO_BARRIER
    assert pattern.search(worker), worker
    # Wait: a relaxed load at GPU scope inline; when the element is not
    # ready, the out-of-line spin polls with relaxed loads, sleeping between
    # polls, bounded by the watchdog (%globaltimer); then one acquire fence
    # before the CTA barrier. No acquire load anywhere: each would
    # invalidate the SM's L1 at every poll.
    assert "ld.relaxed.gpu" in worker
    assert "ld.acquire" not in ptx
    # One GPU: no wait pays for system scope (symmetric events only).
    assert "relaxed.sys" not in ptx and "fence.acq_rel.sys" not in ptx
    assert "__etc_spin_counter_system" not in ptx
    spin = "__etc_spin_slot" if schedule == "dynamic" else "__etc_spin_counter"
    assert re.search(rf"call\.uni \(retval0\),\s*{spin},(?:(?!bar\.sync|fence\.)[\s\S])*fence\.acq_rel\.gpu;",
                     worker), worker
    body = _function(ptx, spin)
    assert "ld.relaxed.gpu" in body and "nanosleep.u32" in body and "%globaltimer" in body
    assert "fence." not in body
    # The tile bodies (device functions, or inlined) run on the CTA's
    # threads; static workers are the blocks (dynamic ones take tasks from
    # the queue instead).
    assert "%tid.x" in ptx
    if schedule == "static":
        assert "%ctaid.x" in worker and "%nctaid.x" in worker


@needs_ptxas
@pytest.mark.parametrize("kind", OPERATORS)
def test_every_operator_assembles_for_sm_90a(kind, tmp_path):
    g, _ = _graph(kind)
    kernel = etc.compile(g, target="cuda", chip="sm_90a")
    ptx = kernel.ptx
    assert ".target sm_90a" in ptx and ".version 8.0" in ptx
    for entry in ("counters", "init", "worker", "check"):
        assert f".entry {g.name}_{entry}(" in ptx
    # Every function is in the module: no unresolved calls (libdevice).
    assert ".extern" not in ptx
    assemble(ptx, "sm_90a", tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip, version", [("sm_80", "7.0"), ("sm_90a", "8.0")])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_mlp_assembles_with_the_expected_atomics(chip, version, schedule, tmp_path):
    g = _mlp()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule)
    ptx = kernel.ptx
    assert f".version {version}" in ptx and f".target {chip}" in ptx
    _check_worker_synchronisation(ptx, g.name, schedule)
    assemble(ptx, chip, tmp_path)


def test_dynamic_worker_broadcasts_popped_tasks_through_shared_memory():
    g = _mlp()
    ptx = etc.compile(g, target="cuda", schedule="dynamic").ptx
    worker = _entry(ptx, f"{g.name}_worker")
    assert re.search(r"\.shared \.align 4 \.u32 \S+;", ptx)
    assert "st.shared.b32" in worker and "ld.shared.b32" in worker
    # Published slots are release stores; popping claims the head atomically.
    assert "st.release.gpu" in worker
    assert "atom.global.add.u32" in worker


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_a_static_worker_under_policy_claim_assembles(chip, tmp_path):
    """policy=claim on CUDA (round-robin is its default): thread 0 claims
    the next tile with a GPU-scope atomic add and hands it to the CTA
    through shared memory."""
    g = _mlp()
    ptx = etc.compile(g, target="cuda", chip=chip, policy="claim").ptx
    worker = _entry(ptx, f"{g.name}_worker")
    assert re.search(r"\.shared \.align 4 \.u32 \S+;", ptx)
    assert "atom.global.add.u32" in worker or "atom.add.u32" in worker
    assert "st.shared.b32" in worker and "ld.shared.b32" in worker
    assemble(ptx, chip, tmp_path)


def test_kernel_parameters_follow_the_memref_descriptor_expansion():
    # One index symbol, then the buffer table (a rank-1 memref: 5 64-bit
    # parameters); the counter buffer is one more rank-1 memref, the
    # counters result another. Buffers do not add parameters.
    g = etc.Graph("params")
    B = g.symbol("B")
    x = g.input("x", (B, 96), "f32")
    g.output(g.scale(x, 2.0))
    ptx = etc.compile(g, target="cuda").ptx
    symbols = [a for a in g.arguments if a.kind == "symbol"]
    graph_params = len(symbols) + 5
    for entry, extra in [("counters", 5), ("init", 5), ("worker", 5), ("check", 10)]:
        params = re.findall(r"\.param \.u64[^,)]*params_" + entry + r"_param_\d+", _entry(ptx, f"params_{entry}"))
        assert len(params) == graph_params + extra, (entry, params)


def test_chip_selects_the_ptx_isa_version():
    pipeline = etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_80"))
    assert pipeline == "builtin.module(etc-lower-to-nvvm{chip=sm_80 features=+ptx70 watchdog-ms=5000})"
    pipeline = etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_90a"))
    assert pipeline == "builtin.module(etc-lower-to-nvvm{chip=sm_90a features=+ptx80 watchdog-ms=5000})"
    with pytest.raises(ValueError, match=r"chip='sm_60' is not supported on target='cuda'"):
        etc.pipeline.lowering_pipeline(etc.pipeline.Options(target="cuda", chip="sm_60"))


def test_ptx_is_only_for_cuda():
    g, _ = _graph("add")
    kernel = etc.compile(g, target="cpu", workers=1)
    with pytest.raises(AttributeError, match=r"kernel.ptx exists for target='cuda'"):
        kernel.ptx


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_watchdog_and_tracesassemble(chip, schedule, tmp_path):
    g = _mlp()
    kernel = etc.compile(g, target="cuda", chip=chip, schedule=schedule, trace=True)
    ptx = kernel.ptx
    worker = _entry(ptx, f"{g.name}_worker")
    # Trace records: %globaltimer in the worker itself.
    assert "%globaltimer" in worker
    # The first spin to time out claims the record (an atomic increment of
    # the claim word) and publishes it with a release (fence, relaxed store).
    report = _function(ptx, "__etc_watchdog_report")
    assert re.search(r"atom(\.global)?\.add\.u32\s+%r\d+, \[%rd\d+\+4\], 1;", report), report
    assert re.search(r"fence\.acq_rel\.gpu;\s*st\.relaxed\.gpu(\.global)?\.b32\s+\[%rd\d+\], 1;",
                     report), report
    assemble(ptx, chip, tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_hundreds_of_buffersassemble(chip, tmp_path):
    """No parameter ceiling: 321 buffers reach the kernels through the buffer
    table, so each kernel takes a handful of parameters."""
    g = etc.Graph("many")
    B = g.symbol("B")
    y = g.input("x", (B, 32), "f32")
    for i in range(160):
        y = g.add(y, g.input(f"w{i}", (B, 32), "f32"))
    g.output(y)
    assert sum(a.kind != "symbol" for a in g.arguments) == 321
    kernel = etc.compile(g, target="cuda", chip=chip)
    for entry in ("counters", "init", "worker", "check"):
        text = _entry(kernel.ptx, f"many_{entry}")
        assert text[:text.index(")")].count(".param ") <= 16
    assemble(kernel.ptx, chip, tmp_path)


#: A task that notifies three events, each waited on by its own consumer,
#: and a task that waits on two of them.
_FAN_OUT = """
event.graph @fan(%n: index, %x: memref<?xf32>, %y: memref<?xf32>, %z: memref<?xf32>, %u: memref<?xf32>,
                 %w: memref<?xf32>) {
  %e1 = event.alloc(%n) : !event.tensor<?>
  %e2 = event.alloc(%n) : !event.tensor<?>
  %e3 = event.alloc(%n) : !event.tensor<?>
  event.task "produce" grid(%n)
      writes(%x : memref<?xf32> (d0) -> (d0) [1])
      notifies(%e1 : !event.tensor<?> (d0) -> (d0), %e2 : !event.tensor<?> (d0) -> (d0),
               %e3 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %v = arith.constant 2.0 : f32
    memref.store %v, %x[%i] : memref<?xf32>
  }
""" + "".join(f"""
  event.task "use{k}" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%{out} : memref<?xf32> (d0) -> (d0) [1])
      waits(%e{k} : !event.tensor<?> (d0) -> (d0)) {{
  ^bb0(%i: index):
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %{out}[%i] : memref<?xf32>
  }}""" for k, out in ((1, "y"), (2, "z"), (3, "u"))) + """
  event.task "join" grid(%n)
      reads(%x : memref<?xf32> (d0) -> (d0) [1])
      writes(%w : memref<?xf32> (d0) -> (d0) [1])
      waits(%e1 : !event.tensor<?> (d0) -> (d0), %e2 : !event.tensor<?> (d0) -> (d0)) {
  ^bb0(%i: index):
    %a = memref.load %x[%i] : memref<?xf32>
    %v = arith.addf %a, %a : f32
    memref.store %v, %w[%i] : memref<?xf32>
  }
}
"""


def _fan_out_ptx(schedule: str, chip: str) -> str:
    features = {"sm_80": "+ptx70", "sm_90a": "+ptx80"}[chip]
    with ir.Context() as context:
        etc.register_dialects(context)
        module = ir.Module.parse(_FAN_OUT)
        PassManager.parse(f"builtin.module(event-{schedule}-schedule,"
                          f"etc-lower-to-nvvm{{chip={chip} features={features}}})").run(module.operation)
        return _ptx(module)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_a_tile_with_several_notifies_pays_one_barrier_and_one_fence(chip, tmp_path):
    ptx = _fan_out_ptx("static", chip)
    worker = _entry(ptx, "fan_worker")
    decrements = [m.start() for m in re.finditer(r"atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\], -1;", worker)]
    assert len(decrements) == 3, worker
    # The three decrements of "produce" follow one barrier and one release
    # fence, with no barrier or fence between them.
    before = worker[:decrements[0]]
    last_barrier = before.rindex("bar.sync")
    assert before[last_barrier:].count("fence.acq_rel.gpu") == 1, before[last_barrier:]
    between = worker[decrements[0]:decrements[-1]]
    assert "bar.sync" not in between and "fence." not in between, between
    assemble(ptx, chip, tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_dynamic_waiters_are_readied_by_each_lane_without_barriers(chip, tmp_path):
    ptx = _fan_out_ptx("dynamic", chip)
    worker = _entry(ptx, "fan_worker")
    # The readying of waiters is spread over the lanes: each lane's pending
    # decrement (release fence, atomic) and, when it is the last, its
    # acquire fence and push (tail claim, then release store of the slot),
    # with no CTA barrier in between (thread 0 used to do them one by one,
    # two barriers each).
    own_push = re.compile(r"fence\.acq_rel\.gpu;\s*atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\], -1;"
                          r"(?:(?!bar\.sync|fence\.)[\s\S])*fence\.acq_rel\.gpu;\s*"
                          r"atom\.global\.add\.u32\s+%r\d+, \[%rd\d+\+4\], 1;")
    assert own_push.search(worker), worker
    assert "st.release.gpu" in worker
    # Whether the tile's notify readied the element reaches every thread
    # with one reducing barrier, not a shared word between two barriers.
    assert re.search(r"bar\.red\.or\.pred", worker), worker
    assemble(ptx, chip, tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
def test_a_tile_with_several_waits_pays_one_fence_and_one_barrier(chip, tmp_path):
    ptx = _fan_out_ptx("static", chip)
    worker = _entry(ptx, "fan_worker")
    # Thread 0 polls both counters with relaxed loads (calling the spin when
    # one is not ready), then one acquire fence and one barrier (the
    # reducing one that also tells every thread whether the run stopped).
    pattern = re.compile(r"ld\.relaxed\.gpu\.global\.b32(?:(?!fence\.|bar\.)[\s\S])*?"
                         r"ld\.relaxed\.gpu\.global\.b32(?:(?!fence\.|bar\.)[\s\S])*?"
                         r"fence\.acq_rel\.gpu;(?:(?!fence\.|bar\.)[\s\S])*?bar\.red\.or\.pred")
    assert pattern.search(worker), worker
    assemble(ptx, chip, tmp_path)


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("schedule", ["static", "auto"])
def test_weights_are_prefetched_into_l2_before_a_tiles_waits(chip, schedule, tmp_path):
    """The MLP's second matmul waits for the first's rows; before the
    (relaxed) poll of that wait its tile prefetches its column block of w2,
    a buffer no task writes, into L2. The dynamic schedule has no waits to
    overlap and prefetches nothing."""
    g = _mlp()
    ptx = etc.compile(g, target="cuda", chip=chip, schedule=schedule).ptx
    worker = _entry(ptx, f"{g.name}_worker")
    assert "prefetch.global.L2" in worker
    # A prefetch, then (no fence or barrier between) the wait's first poll.
    assert re.search(r"prefetch\.global\.L2 \[%g\];(?:(?!fence\.|bar\.)[\s\S])*?"
                     r"ld\.relaxed\.gpu\.global\.b32", worker), worker
    assemble(ptx, chip, tmp_path)
    dynamic = etc.compile(g, target="cuda", chip=chip, schedule="dynamic").ptx
    assert "prefetch" not in dynamic
    off = etc.compile(g, target="cuda", chip=chip, schedule=schedule, prefetch=False).ptx
    assert "prefetch" not in off
    cpu = etc.compile(g, target="cpu", kernels="cuda", schedule=schedule)
    assert "event.prefetch" in cpu.ir("scheduled")
    assert "event.prefetch" not in etc.compile(g, target="cpu", schedule=schedule).ir(
        "scheduled")
