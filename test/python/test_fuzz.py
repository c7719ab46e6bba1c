"""Bounded fuzzing of etc-opt: mutants of the lit corpus through the full
pipelines must fail cleanly or succeed cleanly.

A fixed seed draws the same mutants everywhere (see fuzz_mutants.py). Each
goes through the whole CPU pipeline (the schedule alternating between
static, dynamic and auto) and the whole NVVM pipeline. etc-opt must never
die by a signal (an assertion, a crash) and never exit 0 after printing an
error.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import fuzz_mutants
from etc import pipeline

SEED = 13
MUTANTS = 400
#: Seconds for one etc-opt run; typical runs take 0.05 s.
RUN_TIMEOUT = 60

PIPELINES = {
    "cpu-static": pipeline.build(pipeline.Options(schedule="static")),
    "cpu-dynamic": pipeline.build(pipeline.Options(schedule="dynamic")),
    "cpu-auto": pipeline.build(pipeline.Options(schedule="auto")),
    "nvvm": pipeline.build(pipeline.Options(target="cuda", chip="sm_80")),
}


def _problem(etc_opt: str, pipeline_name: str, text: str) -> str | None:
    """What is wrong with running `text` through a pipeline, or None."""
    try:
        proc = subprocess.run([etc_opt, f"--pass-pipeline={PIPELINES[pipeline_name]}",
                               "-o", os.devnull],
                              input=text, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{pipeline_name}: no answer within {RUN_TIMEOUT} s"
    if proc.returncode < 0:
        return f"{pipeline_name}: killed by signal {-proc.returncode}\n{proc.stderr[-2000:]}"
    if proc.returncode == 0 and "error:" in proc.stderr:
        return f"{pipeline_name}: exit status 0 after an error\n{proc.stderr[-2000:]}"
    if proc.returncode not in (0, 1):
        return f"{pipeline_name}: exit status {proc.returncode}\n{proc.stderr[-2000:]}"
    return None


def test_mutants_fail_cleanly(etc_opt_path):
    path = etc_opt_path
    mutants = fuzz_mutants.mutants(SEED, MUTANTS)
    schedules = ("cpu-static", "cpu-dynamic", "cpu-auto")

    def check(index: int) -> list[str]:
        text = mutants[index]
        found = []
        for name in (schedules[index % 3], "nvvm"):
            problem = _problem(path, name, text)
            if problem:
                found.append(f"mutant {index}, {problem}\n--- input ---\n{text}")
        return found

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        problems = [p for found in pool.map(check, range(len(mutants))) for p in found]
    assert not problems, f"{len(problems)} failures; the first:\n{problems[0]}"


def test_mutants_are_fixed_by_the_seed():
    """The same seed gives the same mutants; they differ from the corpus."""
    first = fuzz_mutants.mutants(SEED, 20)
    assert first == fuzz_mutants.mutants(SEED, 20)
    corpus = set(fuzz_mutants.corpus())
    assert len(set(first)) == 20 and not corpus & set(first)
