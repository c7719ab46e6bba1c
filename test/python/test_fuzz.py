"""Bounded fuzzing of etc-opt: mutants of the lit corpus through the full
pipelines must fail cleanly or succeed cleanly.

A fixed seed draws the same mutants everywhere (see fuzz_mutants.py). Each
goes through the whole CPU pipeline (the schedule alternating between
static, dynamic and auto) and the whole NVVM pipeline. etc-opt must never
die by a signal (an assertion, a crash) and never succeed after printing an
error.

Starting etc-opt costs about 40 ms (its shared MLIR and LLVM libraries),
ten times what most mutants take, so the mutants of one pipeline go
through one process in batches, with `--split-input-file`: etc-opt gives
each chunk an MLIR context of its own and prints each one's output (none
for a chunk that failed) between split markers, and reports errors at the
lines of the whole input, so each mutant's outcome and errors are its own.
A batch that crashes, hangs, exits with another status or prints an error
it cannot place is run again one mutant per process, as a user would run
them, to name the mutant at fault.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import fuzz_mutants
from etc import pipeline

SEED = 13
MUTANTS = 400
#: Seconds for one etc-opt run; typical runs take 0.05 s.
RUN_TIMEOUT = 60
#: Mutants per etc-opt process, and the seconds a batch may take.
BATCH = 40
BATCH_TIMEOUT = 120
SPLIT = "// -----"

PIPELINES = {
    "cpu-static": pipeline.build(pipeline.Options(schedule="static")),
    "cpu-dynamic": pipeline.build(pipeline.Options(schedule="dynamic")),
    "cpu-auto": pipeline.build(pipeline.Options(schedule="auto")),
    "nvvm": pipeline.build(pipeline.Options(target="cuda", chip="sm_80")),
}

_ERROR_AT = re.compile(r"^<stdin>:(\d+):\d+: error:", re.M)


def _problem(etc_opt: str, pipeline_name: str, text: str) -> str | None:
    """What is wrong with running `text` alone through a pipeline, or None."""
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


def _batch_outcomes(etc_opt: str, pipeline_name: str, texts: list[str]):
    """Runs `texts` through a pipeline in one process; returns each text's
    (succeeded, error lines) or None when the batch must be run again one
    text at a time (a crash, a hang, another exit status, an error at no
    line of the input, or outputs that do not match the chunks)."""
    texts = [text.rstrip("\n") + "\n" for text in texts]
    starts, lines = [], 1
    for text in texts:
        starts.append(lines)
        lines += text.count("\n") + 1  # the text, then the split marker
    source = f"{SPLIT}\n".join(texts)
    try:
        proc = subprocess.run([etc_opt, f"--pass-pipeline={PIPELINES[pipeline_name]}",
                               "--split-input-file", "-o", "-"],
                              input=source, capture_output=True, text=True,
                              timeout=BATCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    outputs = re.split(rf"^{re.escape(SPLIT)}$", proc.stdout, flags=re.M)
    errors = [int(line) for line in _ERROR_AT.findall(proc.stderr)]
    if proc.returncode not in (0, 1) or len(outputs) != len(texts) or \
            len(errors) != proc.stderr.count("error:"):
        return None
    ends = starts[1:] + [lines]
    return [(bool(output.strip()), [e for e in errors if start <= e < end])
            for output, start, end in zip(outputs, starts, ends)]


def _problems(etc_opt: str, pipeline_name: str, texts: list[str], names: list[str]):
    """The problems of running each of `texts` through a pipeline: in
    batches, each batch again one text per process where it needs to."""
    found = []
    outcomes = _batch_outcomes(etc_opt, pipeline_name, texts)
    if outcomes is None:
        alone = [(name, _problem(etc_opt, pipeline_name, text), text)
                 for name, text in zip(names, texts)]
        return [f"{name}, {problem}\n--- input ---\n{text}"
                for name, problem, text in alone if problem]
    for name, text, (succeeded, errors) in zip(names, texts, outcomes):
        # An output after an error: a pass that reported an error and did
        # not fail (upstream lower-affine's non-positive divisor). etc-opt
        # then exits 1 on its own, which is clean; the batch cannot tell,
        # so the text runs again alone to decide.
        if succeeded and errors:
            problem = _problem(etc_opt, pipeline_name, text)
            if problem:
                found.append(f"{name}, {problem} (line {errors[0]} of its batch)"
                             f"\n--- input ---\n{text}")
    return found


def check_mutants(etc_opt: str, mutants: list[str]) -> list[str]:
    """Every mutant through a CPU pipeline (by its index: static, dynamic,
    auto) and the NVVM one, BATCH a process, two processes at a time."""
    schedules = ("cpu-static", "cpu-dynamic", "cpu-auto")
    jobs = {name: [i for i in range(len(mutants)) if i % 3 == s]
            for s, name in enumerate(schedules)}
    jobs["nvvm"] = list(range(len(mutants)))
    batches = [(name, indices[b:b + BATCH]) for name, indices in jobs.items()
               for b in range(0, len(indices), BATCH)]

    def run(batch):
        name, indices = batch
        return _problems(etc_opt, name, [mutants[i] for i in indices],
                         [f"mutant {i}" for i in indices])

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return [p for found in pool.map(run, batches) for p in found]


def test_mutants_fail_cleanly(etc_opt_path):
    mutants = fuzz_mutants.mutants(SEED, MUTANTS)
    problems = check_mutants(etc_opt_path, mutants)
    assert not problems, f"{len(problems)} failures; the first:\n{problems[0]}"


def test_mutants_are_fixed_by_the_seed():
    """The same seed gives the same mutants; they differ from the corpus."""
    first = fuzz_mutants.mutants(SEED, 20)
    assert first == fuzz_mutants.mutants(SEED, 20)
    corpus = set(fuzz_mutants.corpus())
    assert len(set(first)) == 20 and not corpus & set(first)


# ----------------------------------------------------------------------
# The batches see what a process per mutant sees
# ----------------------------------------------------------------------

VALID = "func.func @f() {\n  return\n}\n"
INVALID = "func.func @g() {\n  %0 = arith.constant 1 : i32\n  return %0 : i32\n}\n"


def test_a_batch_gives_each_mutant_its_own_outcome_and_errors(etc_opt_path):
    """Valid, invalid, valid: the second alone failed, at its own lines."""
    outcomes = _batch_outcomes(etc_opt_path, "cpu-static", [VALID, INVALID, VALID])
    assert [succeeded for succeeded, _ in outcomes] == [True, False, True]
    assert outcomes[0][1] == outcomes[2][1] == [] and outcomes[1][1] == [7]
    assert check_mutants(etc_opt_path, [VALID, INVALID, VALID]) == []


def test_a_faulty_etc_opt_is_caught_in_a_batch(tmp_path):
    """A stand-in for etc-opt that succeeds after an error on one input,
    and one that crashes on another (batched or alone): each is named."""
    fake = tmp_path / "fake-etc-opt"
    fake.write_text(f"""#!{sys.executable}
import os, re, signal, sys
text = sys.stdin.read()
chunks = re.split(r"^{SPLIT}\\n", text, flags=re.M) if "--split-input-file" in sys.argv else [text]
line, outputs = 1, []
for chunk in chunks:
    if "@crash" in chunk:
        os.kill(os.getpid(), signal.SIGSEGV)
    if "@lenient" in chunk:
        print(f"<stdin>:{{line}}:1: error: let through", file=sys.stderr)
    outputs.append("module {{}}\\n")
    line += chunk.count("\\n") + 1
print("{SPLIT}\\n".join(outputs), end="")
""")
    fake.chmod(0o755)
    lenient, crash = VALID.replace("@f", "@lenient"), VALID.replace("@f", "@crash")
    problems = check_mutants(str(fake), [VALID, lenient, VALID, crash])
    assert len(problems) == 4, problems
    # Batched ("succeeded after an error") and alone ("exit status 0").
    assert sum("mutant 1, " in p and "after an error" in p for p in problems) == 2
    assert sum("mutant 3, " in p and "killed by signal 11" in p for p in problems) == 2
