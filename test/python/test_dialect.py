"""The event dialect from Python: upstream `mlir.ir` and `etc` in one process."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlir import ir
from mlir.dialects import arith, func
from mlir.passmanager import PassManager

import etc
from etc.dialects import event

ROOT = Path(__file__).resolve().parents[2]


def _build_graph() -> ir.Module:
    """Builds a one-task graph with the generated op classes."""
    module = ir.Module.create()
    f32 = ir.F32Type.get()
    index = ir.IndexType.get()
    buffer = ir.MemRefType.get([ir.ShapedType.get_dynamic_size(), 64], f32)
    with ir.InsertionPoint(module.body):
        graph = event.GraphOp("scale", ir.TypeAttr.get(ir.FunctionType.get([index, buffer, buffer], [])))
        block = graph.body.blocks.append(index, buffer, buffer)
        with ir.InsertionPoint(block):
            rows, x, y = block.arguments
            two = arith.ConstantOp(index, 2)
            box = ir.Attribute.parse("#event.box<(d0, d1) -> (d0 * 32, d1 * 32) [32, 32]>")
            task = event.TaskOp(
                "scale", [rows, two], [x], [y], [], [], [],
                ir.ArrayAttr.get([box]), ir.ArrayAttr.get([box]),
                ir.ArrayAttr.get([]), ir.ArrayAttr.get([]))
            body = task.body.blocks.append(index, index)
            with ir.InsertionPoint(body):
                event.LaneIdOp()
                event.YieldOp()
            event.YieldOp()
    return module


def test_upstream_and_etc_share_one_context():
    with ir.Context() as ctx, ir.Location.unknown():
        assert ctx.is_registered_operation("event.task")
        assert ctx.is_registered_operation("arith.addi")
        module = _build_graph()
        assert module.operation.verify()
        text = str(module)
        assert 'event.task "scale" grid(%arg0, %c2)' in text
        assert "writes(%arg2 : memref<?x64xf32> (d0, d1) -> (d0 * 32, d1 * 32) [32, 32])" in text


def test_parsed_ops_are_generated_classes():
    with ir.Context():
        module = ir.Module.parse((ROOT / "examples" / "mlp_l2.mlir").read_text())
        graph = module.body.operations[0]
        assert isinstance(graph, event.GraphOp)
        ops = list(graph.regions[0].blocks[0].operations)
        assert any(isinstance(op, event.AllocOp) for op in ops)
        tasks = [op for op in ops if isinstance(op, event.TaskOp)]
        assert [t.attributes["name"].value for t in tasks] == ["scale", "add"]


def test_pass_manager_runs_upstream_passes_on_event_ir():
    with ir.Context(), ir.Location.unknown():
        module = _build_graph()
        PassManager.parse("builtin.module(event.graph(canonicalize))").run(module.operation)
        # The pure lane_id with no uses is gone; the task remains.
        text = str(module)
        assert "event.lane_id" not in text
        assert 'event.task "scale"' in text


def test_etc_passes_are_registered_for_pass_manager():
    with ir.Context():
        for name in ["event-infer-dependencies", "event-check-schedule"]:
            PassManager.parse(f"builtin.module(event.graph({name}))")
        PassManager.parse("builtin.module(event-static-schedule{workers=4 policy=round-robin})")
        PassManager.parse("builtin.module(etc-lower-to-cpu)")


def test_verifier_errors_reach_python():
    with ir.Context():
        bad = """
        event.graph @g(%x: memref<8xf32>) {
          %c1 = arith.constant 1 : index
          event.task "t" grid(%c1) writes(%x : memref<8xf32> (d0) -> (d0, 0) [4, 4]) {
          ^bb0(%i: index):
          }
        }"""
        with pytest.raises(ir.MLIRError, match="has 2 offsets but the buffer has rank 1"):
            ir.Module.parse(bad)


def test_context_created_before_import_can_register():
    # A context from before `import etc` gets the dialect on request.
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = False
    etc.register_dialects(ctx)
    with ctx:
        ir.Module.parse("event.graph @g(%n: index) {\n}")


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.mlir")), ids=lambda p: p.name)
def test_examples_round_trip_with_etc_opt(example, tmp_path):
    etc_opt = shutil.which("etc-opt")
    assert etc_opt, "etc-opt is not on PATH (is the environment activated?)"
    first = subprocess.run([etc_opt, str(example)], check=True, capture_output=True, text=True).stdout
    (tmp_path / "once.mlir").write_text(first)
    second = subprocess.run([etc_opt, str(tmp_path / "once.mlir")], check=True,
                            capture_output=True, text=True).stdout
    assert first == second


_IMPORT_ORDER = """
import sys
order = sys.argv[1]
if order == "mlir-first":
    import mlir.ir
import etc, etc.models
assert ("mlir" in sys.modules) == (order == "mlir-first"), sorted(m for m in sys.modules if m.startswith("mlir"))
if order == "etc-first":
    import mlir.ir
context = mlir.ir.Context()
assert context.is_registered_operation("event.graph")
assert etc.compiler_missing() is None and etc.Graph.__name__ == "Graph"
"""


@pytest.mark.parametrize("order", ["etc-first", "mlir-first"])
def test_import_etc_loads_no_mlir_and_registers_the_dialect_whenever_mlir_comes(order):
    """`import etc` (and `etc.models`, what serving from the cache needs)
    maps no MLIR library; a Context made after MLIR is imported, before or
    after etc, knows the event dialect."""
    result = subprocess.run([sys.executable, "-c", _IMPORT_ORDER, order], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
