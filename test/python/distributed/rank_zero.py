"""What rank 0 computes, on every rank, waited for asleep: the tensor-parallel
checks compile and run the whole model on rank 0 only, and MPICH's blocking
calls (`bcast`) poll a core the whole time, which the test machine's other
test process needs."""

import time


def from_rank_zero(comm, compute):
    """`compute()` run on rank 0 of `comm`; its value, on every rank."""
    if comm.Get_rank() == 0:
        value = compute()
        for rank in range(1, comm.Get_size()):
            comm.send(value, dest=rank)
        return value
    request = comm.irecv(source=0)
    while True:
        done, value = request.test()
        if done:
            return value
        time.sleep(0.01)
