"""Tensor-parallel commands (`--tensor-parallel N`): starting the N MPI ranks
(the `mpich` wheel's mpiexec running this command again), knowing this
process's rank, and rank 0 leading the others through its steps
(`etc.models.engine.lockstep`), with the whole job ended when a rank is
lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Optional

from .output import one_line


#: Set by the command that starts the ranks itself when its stdin is a
#: terminal: rank 0's stdin is then mpiexec's pipe, and `etc chat` prompts
#: as it would at the terminal.
INTERACTIVE_VARIABLE = "ETC_INTERACTIVE"


#: The variables by which MPI launchers tell a process its rank (MPICH's
#: Hydra, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank in the MPI job an MPI launcher started it in,
    else 0."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            try:
                return int(os.environ[name])
            except ValueError:
                pass
    return 0


def check_ranks(args) -> None:
    """Under an MPI launcher, the job must have --tensor-parallel ranks."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    if size != args.tensor_parallel:
        raise ValueError(f"--tensor-parallel {args.tensor_parallel}, but this process is one of "
                         f"{size} MPI ranks: start {args.tensor_parallel} (or run the command "
                         f"without mpiexec, and it starts them itself)")


def start_ranks(args, argv: list) -> int:
    """Runs this command again as --tensor-parallel MPI processes (the
    `mpich` wheel's mpiexec) and returns their exit status: stdin goes to
    rank 0, the ranks' output comes here. Ctrl-C reaches the ranks through
    mpiexec (which ends them); SIGTERM to this process goes to rank 0,
    which stops the others (mpiexec would kill them) and serves no more."""
    from ..runtime import distributed

    argv = list(argv)
    if not args.quiet and not args.progress and sys.stderr.isatty():
        argv.insert(1, "--progress")  # the ranks' stderr is mpiexec's pipe
    env = distributed.environment()
    if sys.stdin.isatty():
        env[INTERACTIVE_VARIABLE] = "1"
    process = subprocess.Popen(
        distributed.command(args.tensor_parallel, ["-m", "etc.cli", *argv], supervised=True),
        env=env)

    def terminate(*_) -> None:
        os.kill(rank_zero(process.pid) or process.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        while True:
            try:
                return process.wait()
            except KeyboardInterrupt:
                continue  # mpiexec got the Ctrl-C too and passes it on
    finally:
        signal.signal(signal.SIGTERM, previous)


def rank_zero(root: int) -> Optional[int]:
    """The pid of rank 0's `etc` process among the descendants of `root`
    (mpiexec; Linux's /proc), or None."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                kids = [int(kid) for kid in children.read().split()]
        except OSError:
            continue
        for kid in kids:
            todo.append(kid)
            try:
                with open(f"/proc/{kid}/environ", "rb") as environ:
                    variables = environ.read().split(b"\0")
                with open(f"/proc/{kid}/cmdline", "rb") as cmdline:
                    argv = cmdline.read().split(b"\0")
            except OSError:
                continue
            if b"PMI_RANK=0" in variables and b"etc.cli" in argv and \
                    os.path.basename(argv[0]) != b"sh":
                return kid
    return None


def broken_job(error: BaseException) -> bool:
    """Whether `error` leaves this rank's MPI job unable to finalise (a
    rank died or hangs)."""
    return type(error).__name__ in ("LostRankError", "DistributedError", "WatchdogError")


def led(model, args, body) -> int:
    """`body(model)` for a model on one rank. For a tensor-parallel one,
    `body` runs on rank 0 with a `Leader` for the model, and the other
    ranks follow it; a rank lost while the leader waits (for input, for
    requests) ends rank 0's process at once with an error naming it."""
    if model.tensor_parallel == 1:
        return body(model)
    from ..models.engine.lockstep import Leader, follow

    # MPICH's launcher tells the survivors of a rank that died with SIGUSR1,
    # which would end them before they say which rank it was: the
    # heartbeats find it. (Set after MPI_Init, which sets a handler too.)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if model.rank != 0:
        # The launcher passes Ctrl-C and SIGTERM to every rank: rank 0 stops
        # the others when it gets them, or they find it lost.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        follow(model, timeout=args.rank_timeout)
        return 0
    # SIGTERM ends rank 0 as Ctrl-C does (the server sets its own), so
    # that it stops the others on its way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    leader = Leader(model, timeout=args.rank_timeout, on_lost=lost)
    try:
        return body(leader)
    finally:
        leader.stop()


def lost(error: BaseException) -> None:
    """Rank 0's end when another rank is lost (called from the heartbeat
    thread, whatever rank 0 is doing): ends the whole MPI job."""
    print(f"etc: error: {one_line(error)}", file=sys.stderr, flush=True)
    abort()


def abort() -> None:
    """Ends every rank of the MPI job: MPI_Abort has the launcher kill them
    all, a hung one included (MPI cannot finalise with a rank lost)."""
    sys.stdout.flush()
    sys.stderr.flush()
    # The report just written goes to the launcher through its proxy's
    # pipe; MPI_Abort has the launcher kill everything, proxies included,
    # and a line still in flight is lost (a follower's "rank 0 sent no
    # heartbeat" went missing that way on a loaded machine). A moment for
    # it to pass first: the job ends either way.
    time.sleep(0.5)
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)
