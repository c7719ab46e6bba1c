"""bench/serve.py's fairness between the two servers it races: each side's
run waits for the other side's processes to go quiet first."""

import importlib.util
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(_BENCH))  # serve.py imports llm_decode_cpu beside it
_SPEC = importlib.util.spec_from_file_location("bench_serve", _BENCH / "serve.py")
bench_serve = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_serve)

#: A child that spins on a core (as vLLM's CPU backend does for about a
#: second after its last request) for 0.6 CPU seconds, says so, then idles.
_SPINNER = """
import sys, time
child = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(60)"])
while time.process_time() < 0.6:
    pass
print("done", flush=True)
time.sleep(60)
"""


def _kill_tree(process: subprocess.Popen) -> None:
    """Kills `process` and its children (from /proc: no pgrep needed)."""
    children = []
    for task in os.listdir(f"/proc/{process.pid}/task"):
        with open(f"/proc/{process.pid}/task/{task}/children") as f:
            children += [int(pid) for pid in f.read().split()]
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    process.kill()
    process.wait()


def test_wait_quiet_waits_until_the_process_stops_spinning():
    process = subprocess.Popen([sys.executable, "-c", _SPINNER], stdout=subprocess.PIPE,
                               text=True)
    try:
        waited = bench_serve.wait_quiet(process.pid, window=0.25, cores=0.1, timeout=60)
        assert waited < 60  # quiet, not timed out
        # It returned only once the spinning was over: the line is there.
        assert select.select([process.stdout], [], [], 0)[0]
        assert process.stdout.readline() == "done\n"
        assert bench_serve.process_seconds(process.pid) >= 0.5
    finally:
        _kill_tree(process)


def test_process_seconds_counts_the_descendants():
    # A process tree's CPU seconds: vLLM's engine core and workers are
    # children of its API server. Here the parent sleeps, its child spins.
    child = ("import time\nwhile time.process_time() < 0.4: pass\n"
             "print(1, flush=True)\ntime.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "1\n"  # the child has spun (it shares the pipe)
        assert bench_serve.process_seconds(parent.pid) >= 0.35
    finally:
        _kill_tree(parent)
