"""Serving a tensor-parallel model: rank 0 leads, the other ranks follow.

The ranks of a tensor-parallel model (`etc.models.load(path,
tensor_parallel=N)`) must run the same steps together: their step kernels
meet inside every all-reduce. `generate` gets that by running on every
rank with the same prompts. A server cannot: requests arrive over HTTP at
one process, and the engine's choices (which sequences a step takes, which
KV blocks they get, the seeds of unseeded requests) happen there. So rank 0
runs the engine and the server on a `Leader`, which stands for the model
and sends every KV cache it makes and every step it runs to the other
ranks before running its own share; the other ranks `follow`: they make
the same caches and run each step on the inputs rank 0 computed (token
ids, positions, block tables, sampling parameters and seeds) with their own
weights and KV caches.

```python
# python -m etc.runtime.distributed -n 2 script.py  (or: etc serve --tensor-parallel 2)
model = etc.models.load(path, tensor_parallel=2)
if model.rank == 0:
    leader = Leader(model)
    try:
        etc.serve.run(leader, "127.0.0.1", 8000)
    finally:
        leader.stop()
else:
    follow(model)
```

The messages are MPI point-to-point sends from rank 0 (tag `TAG`); a
follower polls for the next one with a short sleep, so that an idle server
leaves the cores to others.

**Liveness.** A follower waits for rank 0 for as long as the server is
idle, so silence alone cannot tell it that rank 0 is gone. Every rank
therefore runs a `_Pulse`: a thread that sends a heartbeat to its peers
(the leader to every follower, a follower to the leader) every
`HEARTBEAT_SECONDS` and watches theirs. A peer on the same host whose
process is gone (or a zombie) is dead at once; any peer that sent no
heartbeat for `timeout` seconds (default `TIMEOUT_SECONDS`) is dead or
hung. Either way the watcher gets a `LostRankError` naming the rank:
`follow` raises it; the leader's next `step` raises it, and its
`on_lost` callback (the `etc` command's ends the process, since the MPI
job is broken) runs at once, so that an idle server or a chat waiting for
input does not outlive a follower.

Why heartbeats and not MPI's own failure detection: MPI reports a dead
peer only to an operation on it (and MPICH only with its fault-tolerance
extensions), never to a rank that is just waiting to be sent something,
and it cannot see a rank that hangs. A heartbeat thread sees both on any
host; the process check makes the common case, a rank killed on this
machine, an error within a fraction of a second.
"""

import os
import socket
import sys
import threading
import time
import traceback

#: The MPI tag of the leader's messages.
TAG = 7201

#: The MPI tag of the heartbeats.
HEARTBEAT_TAG = 7202

#: How long a follower sleeps between polls for the leader's next message.
POLL_SECONDS = 0.0005

#: How often a rank sends its heartbeat and checks its peers'.
HEARTBEAT_SECONDS = 0.2

#: Seconds without a heartbeat after which a peer counts as hung.
TIMEOUT_SECONDS = 10.0


class LostRankError(RuntimeError):
    """A rank of a tensor-parallel model died or stopped answering; the
    MPI job cannot go on (end the process: MPI cannot finalise with it)."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        #: The rank that died or hangs.
        self.rank = rank


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _process_state(pid: int):
    """The state letter of process `pid` on this host (/proc/PID/stat), or
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # "pid (comm) S ...": the name may hold spaces and parentheses.
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class _Pulse:
    """This rank's side of the liveness check (module docstring): a
    daemon thread that sends a heartbeat to each of `peers` every
    `HEARTBEAT_SECONDS`, takes theirs, and records a `LostRankError` in
    `error` (and calls `on_lost` with it, once) when one is dead or has been
    silent for `timeout` seconds. Collective: every rank makes its pulse
    at the same point (the leader's and followers' starts), which
    exchanges the ranks' hosts and process ids."""

    def __init__(self, comm, peers: list, timeout: float, on_lost=None, what=str):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
        self._comm = comm
        self._peers = list(peers)
        self._timeout = float(timeout)
        self._on_lost = on_lost
        self._what = what
        host = socket.gethostname()
        # (host, pid) of every rank: a peer on this host is watched directly.
        places = comm.allgather((host, os.getpid()))
        self._pids = {peer: places[peer][1] for peer in self._peers
                      if places[peer][0] == host}
        now = time.monotonic()
        self._heard = {peer: now for peer in self._peers}
        self._sends: list = []
        # The peers whose last heartbeat (True) came.
        self._closed: set = set()
        #: The first peer lost, as a LostRankError (None while all live).
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etc-pulse", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            error = self._beat()
            if error is not None:
                self.error = error
                if self._on_lost is not None:
                    self._on_lost(error)
                return

    def _beat(self):
        """Sends this rank's heartbeats and takes the peers'; returns the
        LostRankError of a peer that died or hangs, else None. A peer on
        this host is checked first: sending to a dead one can make MPI end
        this process before it says which rank was lost."""
        for peer in self._peers:
            pid = self._pids.get(peer)
            if pid is not None and _process_state(pid) in (None, "Z", "X"):
                return LostRankError(f"{self._what(peer)} died (process {pid} is gone)", peer)
        comm = self._comm
        try:
            self._sends = [request for request in self._sends if not request.Test()]
            for peer in self._peers:
                self._sends.append(comm.isend(False, dest=peer, tag=HEARTBEAT_TAG))
            now = time.monotonic()
            for peer in self._peers:
                while comm.iprobe(source=peer, tag=HEARTBEAT_TAG):
                    if comm.recv(source=peer, tag=HEARTBEAT_TAG):
                        self._closed.add(peer)  # its last: it is stopping
                    self._heard[peer] = now
        except Exception as error:  # noqa: BLE001 - MPI's report of a lost peer
            peer = self._peers[0] if len(self._peers) == 1 else None
            who = self._what(peer) if peer is not None else "a rank"
            return LostRankError(f"{who} is lost: MPI failed to reach it ({error})",
                                 -1 if peer is None else peer)
        for peer in self._peers:
            silent = now - self._heard[peer]
            if silent > self._timeout:
                pid = self._pids.get(peer)
                stopped = " (its process is stopped)" if pid is not None and \
                    _process_state(pid) == "T" else ""
                return LostRankError(f"{self._what(peer)} sent no heartbeat for {silent:.1f} s"
                                     f"{stopped}: it hangs or died", peer)
        return None

    def stop(self) -> None:
        """Ends the heartbeats, at once (a peer is lost: nothing more is
        exchanged)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def close(self) -> None:
        """Ends the heartbeats with the peers, which close theirs too: each
        side sends a last heartbeat and takes the peer's until its last
        one, so that no message is left unmatched (MPI_Finalize fails on a
        communicator with one, and a rank that fails to finalise makes
        the others' finalisation hang). Waits at most the timeout for a
        peer that does not close."""
        self.stop()
        comm = self._comm
        if self.error is None:
            for peer in self._peers:
                self._sends.append(comm.isend(True, dest=peer, tag=HEARTBEAT_TAG))
        deadline = time.monotonic() + self._timeout
        while self.error is None and len(self._closed) < len(self._peers) and \
                time.monotonic() < deadline:
            for peer in self._peers:
                while peer not in self._closed and comm.iprobe(source=peer, tag=HEARTBEAT_TAG):
                    if comm.recv(source=peer, tag=HEARTBEAT_TAG):
                        self._closed.add(peer)
            time.sleep(POLL_SECONDS)
        if len(self._closed) == len(self._peers):
            for request in self._sends:
                request.Wait()
        self._sends = []


def _rank_name(rank: int) -> str:
    return "rank 0 (the leader)" if rank == 0 else f"rank {rank} (a follower)"


class Leader:
    """Rank 0's stand-in for a tensor-parallel `Model`: what the engine
    calls (`new_cache`, `paged_cache`, `new_paged_cache`, `step`) also runs
    on the other ranks, which `follow`; everything else is the model's.

    Collective with the other ranks' `follow` (the liveness check starts).
    When a follower dies or hangs (no heartbeat for `timeout` seconds),
    `step` raises `LostRankError` and `on_lost(error)` is called at once
    from the heartbeat thread, if given."""

    def __init__(self, model, *, timeout: float = TIMEOUT_SECONDS, on_lost=None):
        if model.tensor_parallel < 2:
            raise ValueError(f"Leader: the model runs on {model.tensor_parallel} rank; a leader "
                             "needs a tensor-parallel model (tensor_parallel >= 2)")
        if model.rank != 0:
            raise ValueError(f"Leader: rank {model.rank} must follow; rank 0 leads")
        self._model = model
        self._comm = _world()
        # id(cache) -> (its number on every rank, the cache).
        self._caches: dict[int, tuple[int, object]] = {}
        self._stopped = False
        self._pulse = _Pulse(self._comm, range(1, self._comm.Get_size()), timeout, on_lost,
                             _rank_name)
        model.led = True

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _send(self, message) -> None:
        if self._stopped:
            raise RuntimeError("Leader: stopped; the other ranks no longer follow")
        if self._pulse.error is not None:
            raise self._pulse.error
        for rank in range(1, self._comm.Get_size()):
            self._comm.send(message, dest=rank, tag=TAG)

    def _known(self, cache, make: str, *arguments):
        """Registers `cache` (made by the model's `make`), and has the other
        ranks make theirs, the first time it is seen."""
        if id(cache) not in self._caches:
            number = len(self._caches)
            self._send(("cache", number, make, arguments))
            self._caches[id(cache)] = (number, cache)
        return cache

    def new_cache(self, slots: int, length: int):
        return self._known(self._model.new_cache(slots, length), "new_cache", slots, length)

    def paged_cache(self, tokens=None, window_tokens=None):
        cache = self._model.paged_cache(tokens, window_tokens)
        return self._known(cache, "new_paged_cache", cache.tokens, cache.window_tokens)

    def new_paged_cache(self, tokens: int, window_tokens=None):
        cache = self._model.new_paged_cache(tokens, window_tokens)
        return self._known(cache, "new_paged_cache", cache.tokens, cache.window_tokens)

    def step(self, cache, requests, return_logits: bool = False,
             return_logprobs: bool = False):
        """`Model.step`, run by every rank: the inputs rank 0 computes,
        but for the weights and KV caches each rank has its own of, go to
        the others first."""
        if id(cache) not in self._caches:
            raise ValueError("Leader.step: a KV cache the leader did not make (use its "
                             "new_cache, paged_cache or new_paged_cache)")
        number, _ = self._caches[id(cache)]
        data = self._model._step_data(cache, requests)  # all but the weights
        shared = {name: value for name, value in data.items() if name not in cache.arrays}
        count = len(data["sample_rows"])  # the step's choices
        self._send(("step", number, shared, count, return_logits))
        return self._model.run_step(data, count, return_logits,
                                    return_logprobs=return_logprobs)

    def stop(self) -> None:
        """Ends the other ranks' `follow` (once). With a follower lost,
        only stops the heartbeats (the others cannot be reached)."""
        if not self._stopped:
            if self._pulse.error is None:
                self._send(("stop",))
            self._pulse.close()
            self._stopped = True
            self._model.led = False


def follow(model, *, timeout: float = TIMEOUT_SECONDS) -> None:
    """Runs, on a rank other than 0, the caches and steps of rank 0's
    `Leader` until it stops. A step that fails here is reported on stderr
    and the next one runs (rank 0's engine fails the step's requests).
    Raises `LostRankError` when rank 0 dies (at once on this host) or
    sends no heartbeat for `timeout` seconds."""
    if model.tensor_parallel < 2 or model.rank == 0:
        raise ValueError(f"follow: rank {model.rank} of {model.tensor_parallel}: only the ranks "
                         "other than 0 of a tensor-parallel model follow")
    comm = _world()
    pulse = _Pulse(comm, [0], timeout, what=_rank_name)
    model.led = True
    caches = {}
    try:
        while True:
            while not comm.Iprobe(source=0, tag=TAG):
                if pulse.error is not None:
                    raise pulse.error
                time.sleep(POLL_SECONDS)
            message = comm.recv(source=0, tag=TAG)
            if message[0] == "stop":
                return
            if message[0] == "cache":
                _, number, make, arguments = message
                caches[number] = getattr(model, make)(*arguments)
                continue
            _, number, shared, count, return_logits = message
            cache = caches[number]
            try:
                model.run_step({**shared, **cache.arrays}, count, return_logits)
            except Exception:  # noqa: BLE001 - rank 0 fails the requests
                print(f"rank {model.rank}: step failed:\n{traceback.format_exc()}",
                      file=sys.stderr, flush=True)
    finally:
        pulse.close()
        model.led = False
