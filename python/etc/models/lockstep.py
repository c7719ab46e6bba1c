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
"""

import sys
import time
import traceback

#: The MPI tag of the leader's messages.
TAG = 7201

#: How long a follower sleeps between polls for the leader's next message.
POLL_SECONDS = 0.0005


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


class Leader:
    """Rank 0's stand-in for a tensor-parallel `Model`: what the engine
    calls (`new_cache`, `paged_cache`, `new_paged_cache`, `step`) also runs
    on the other ranks, which `follow`; everything else is the model's."""

    def __init__(self, model):
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
        model.led = True

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _send(self, message) -> None:
        if self._stopped:
            raise RuntimeError("Leader: stopped; the other ranks no longer follow")
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

    def paged_cache(self, tokens=None):
        cache = self._model.paged_cache(tokens)
        return self._known(cache, "new_paged_cache", cache.tokens)

    def new_paged_cache(self, tokens: int):
        cache = self._model.new_paged_cache(tokens)
        return self._known(cache, "new_paged_cache", cache.tokens)

    def step(self, cache, requests, return_logits: bool = False):
        """`Model.step`, run by every rank: the inputs rank 0 computes,
        but for the weights and KV caches each rank has its own of, go to
        the others first."""
        if id(cache) not in self._caches:
            raise ValueError("Leader.step: a KV cache the leader did not make (use its "
                             "new_cache, paged_cache or new_paged_cache)")
        number, _ = self._caches[id(cache)]
        data = self._model._step_data(cache, requests)  # all but the weights
        shared = {name: value for name, value in data.items() if name not in cache.arrays}
        self._send(("step", number, shared, len(requests), return_logits))
        return self._model.run_step(data, len(requests), return_logits)

    def stop(self) -> None:
        """Ends the other ranks' `follow` (once)."""
        if not self._stopped:
            self._send(("stop",))
            self._stopped = True
            self._model.led = False


def follow(model) -> None:
    """Runs, on a rank other than 0, the caches and steps of rank 0's
    `Leader` until it stops. A step that fails here is reported on stderr
    and the next one runs (rank 0's engine fails the step's requests)."""
    if model.tensor_parallel < 2 or model.rank == 0:
        raise ValueError(f"follow: rank {model.rank} of {model.tensor_parallel}: only the ranks "
                         "other than 0 of a tensor-parallel model follow")
    comm = _world()
    model.led = True
    caches = {}
    try:
        while True:
            while not comm.Iprobe(source=0, tag=TAG):
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
        model.led = False
