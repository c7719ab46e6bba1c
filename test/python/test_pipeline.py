"""The staged pipeline: canonical strings, and failures that carry a repro."""

import shlex
import subprocess

import pytest
from mlir import ir
from mlir.passmanager import PassManager

import etc
from etc import pipeline

# A wait on an event that only a *later* task notifies: legal IR, but the
# static order cannot run it (the schedule check must reject it, not hang).
LATE_PRODUCER = """
event.graph @late(%x: memref<8xf32>) {
  %c1 = arith.constant 1 : index
  %e = event.alloc() count(%c1) : !event.tensor<>
  event.task "consumer" grid(%c1) waits(%e : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
  event.task "producer" grid(%c1) notifies(%e : !event.tensor<> (d0) -> ()) {
  ^bb0(%i: index):
  }
}
"""


def test_build_is_the_concatenation_of_the_stages():
    options = pipeline.Options(workers=3)
    full = pipeline.build(options)
    assert full.startswith("builtin.module(") and "event-static-schedule{workers=3" in full
    for stage_pipeline in pipeline.stages(options).values():
        assert stage_pipeline[len("builtin.module("):-1] in full
    with ir.Context():
        PassManager.parse(full)


def test_failing_stage_raises_with_a_working_repro(tmp_path):
    with ir.Context():
        module = ir.Module.parse(LATE_PRODUCER)
        stage_pipeline = pipeline.schedule_pipeline(pipeline.Options())
        with pytest.raises(pipeline.PipelineError) as info:
            pipeline.run_stage(module, "scheduled", stage_pipeline)
    error = info.value
    assert error.stage == "scheduled" and error.pipeline == stage_pipeline
    assert "consumer" in error.diagnostics and "producer" in error.diagnostics
    assert error.repro.startswith("etc-opt --pass-pipeline=")
    assert "reproduce with:" in str(error)
    # The command really reproduces the failure, with the same message.
    result = subprocess.run(shlex.split(error.repro), capture_output=True, text=True)
    assert result.returncode != 0
    first_line = error.diagnostics.splitlines()[0].split(": ", 1)[1]
    assert first_line in result.stderr


def _invalid_module() -> ir.Module:
    """A module whose IR the verifier rejects: an integer add of floats."""
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        f32 = ir.F32Type.get()
        one = ir.Operation.create("arith.constant", results=[f32],
                                  attributes={"value": ir.FloatAttr.get(f32, 1.0)})
        ir.Operation.create("arith.addi", results=[ir.IntegerType.get_signless(32)],
                            operands=[one.result, one.result])
    return module


@pytest.mark.parametrize("each", ["0", "1"])
def test_a_stage_ends_with_verified_ir(each, monkeypatch):
    """The passes run without verifying after each one (unless
    ETC_VERIFY_EACH_PASS=1); the stage's output is verified either way, and
    invalid IR is a PipelineError naming the op and operand."""
    monkeypatch.setenv("ETC_VERIFY_EACH_PASS", each)
    with ir.Context(), ir.Location.unknown():
        with pytest.raises(pipeline.PipelineError) as info:
            pipeline.run_stage(_invalid_module(), "event", "builtin.module()")
    assert "'arith.addi' op operand #0 must be signless-integer-like" in info.value.diagnostics


def test_verify_each_pass_is_validated(monkeypatch):
    monkeypatch.setenv("ETC_VERIFY_EACH_PASS", "yes")
    with ir.Context(), ir.Location.unknown():
        with pytest.raises(ValueError, match="ETC_VERIFY_EACH_PASS='yes': expected 0"):
            pipeline.run_stage(ir.Module.create(), "event", "builtin.module()")


def test_options_are_validated():
    with pytest.raises(ValueError, match="schedule='fast' is not supported"):
        pipeline.Options(schedule="fast")
    with pytest.raises(ValueError, match="policy='random' is not supported"):
        pipeline.Options(policy="random")
    with pytest.raises(ValueError, match="workers=True must be a positive integer"):
        pipeline.Options(workers=True)
