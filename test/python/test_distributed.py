"""Graphs on several ranks: the fused collectives run as real MPI processes
on this machine, and the front end's collective graphs.

Each MPI test starts N processes with `python -m etc.runtime.distributed`'s
launcher (the `mpich` wheel's mpiexec); the per-rank scripts are in
distributed/. They check the fused patterns against NumPy (all_gather +
matmul, matmul + reduce_scatter, matmul + all_reduce, on the static and
the dynamic schedule, 1 and 2 workers per rank), and that a rank that dies
or hangs is an error on every other rank, not a hang. CUDA programs on
several ranks (NVSHMEM) are in test_nvshmem.py; tensor-parallel models and
the `etc` command on several ranks in test_tensor_parallel.py."""

import re

import pytest

import mpi4py  # noqa: F401,E402  (a test dependency: a broken import fails)

import etc  # noqa: E402
from mpi_ranks import gather_graph, launch  # noqa: E402


@pytest.mark.parametrize("ranks", [2, 3])
def test_fused_collectives_match_numpy(ranks):
    result, output = launch(ranks, "fused_patterns.py")
    assert result.returncode == 0, output
    for rank in range(ranks):
        assert re.search(rf"rank {rank}: \d+ checks passed \(20 dynamic\)", output), output


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("mode", ["die", "hang"])
def test_failing_rank_is_an_error_on_every_rank(mode, schedule):
    """Rank 1 of 3 dies between runs, or hangs inside one (it never sends
    its rows); ranks 0 and 2 raise within the 1 s watchdog plus a
    meeting's timeout instead of hanging. Under the dynamic schedule the
    workers of ranks 0 and 2 poll for the rows, and the watchdog of their
    idle polls names the element still to arrive."""
    result, output = launch(3, "failing_rank.py", mode, schedule, timeout=120)
    expected = "DistributedError" if mode == "die" else "WatchdogError"
    for rank in (0, 2):
        line = re.search(rf"rank {rank}: (\w+) after ([0-9.]+) s: (.*)", output)
        assert line, output
        assert line.group(1) == expected, output
        assert float(line.group(2)) < 10, output
        if mode == "hang":
            # The stuck wait is named: the matmul's wait for gathered rows.
            assert "task matmul_0 tile (" in line.group(3), output
            assert "all_gather_0" in line.group(3), output
    if mode == "hang":
        # The silent rank finishes its own (different) program at once and
        # waits for the others at the end of the run: it either gives up
        # on them first (its meeting's timeout and their watchdog are both
        # 1 s, a race) or meets them and finds its counters changed by
        # their notifies. Under the dynamic schedule, those notifies can
        # also land on its queue or pending counts (its counter buffer is
        # laid out for another program) while it runs, so that its workers
        # idle until their watchdog. Either way it is an error, never a hang.
        errors = r"DistributedError|RuntimeError after [0-9.]+ s: gather_matmul: unbalanced events"
        if schedule == "dynamic":
            errors += r"|WatchdogError after [0-9.]+ s: gather_matmul: watchdog"
        assert re.search(rf"rank 1: ({errors})", output), output


# ----------------------------------------------------------------------
# The front end, in this process (no MPI)
# ----------------------------------------------------------------------


def test_collective_graph_ir():
    g, _ = gather_graph()
    text = g.to_mlir()
    assert "event.ranks = 2" in text
    assert "{event.intermediate, event.symmetric}" in text
    assert "!event.tensor<2, symmetric>" in text
    assert "(d0, d1)[s0] -> (d1, " in text
    assert "event.put" in text and "event.rank_id" in text
    # The matmul waits on its row block of the gathered rows.
    assert "waits(%" in text and "!event.tensor<2, symmetric> (d0, d1) -> (d0)" in text


def test_collective_errors():
    g = etc.Graph("one")
    x = g.input("x", (32, 16))
    with pytest.raises(ValueError, match="collectives need a graph on several ranks"):
        g.all_gather(x)
    g, gathered = gather_graph()
    with pytest.raises(ValueError, match="lives in the symmetric heap"):
        g.output(gathered)
    g = etc.Graph("rs", ranks=3)
    with pytest.raises(ValueError, match="static multiple of the 3 ranks"):
        g.reduce_scatter(g.input("y", (32, 16)))
    with pytest.raises(ValueError, match="ranks=0 must be a positive int"):
        etc.Graph("bad", ranks=0)
    g, _ = gather_graph(tile=(16, 8))
    with pytest.raises(ValueError, match="row blocks of the 32 rows each rank sends"):
        g.to_mlir()
