"""Rank functions for tests/test_verdict.py: one rank stops calling collectives
(alive, its process and lifelines up); the others time out in the next one,
and each of their errors carries the same cross-rank verdict."""
import time

import torch
import torch.distributed as dist


def hung_rank(rank, world, port, hung, rounds=3):
    t = torch.ones(8)
    for _ in range(rounds):
        dist.all_reduce(t)
    if rank == hung:
        # Alive but no longer calling: the harness keeps this process (and its
        # lifelines) up until every rank returned.
        return {"rank": rank, "error": None}
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        error = None
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        error = str(e)
    return {"rank": rank, "error": error, "fail_s": time.monotonic() - start}


def slowed_rank(rank, world, port, slow, delay_s=0.02, rounds=25):
    """Rank `slow` sleeps before each allreduce (a slow data loader, say); the
    others wait for it inside. straggler_report() must name it, and, with the
    delay gone, name nobody."""
    import roce_pg

    t = torch.ones(1024)
    roce_pg.straggler_report()  # a fresh window on every rank
    for _ in range(rounds):
        if rank == slow:
            time.sleep(delay_s)
        dist.all_reduce(t)
    slowed = roce_pg.straggler_report()
    dist.barrier()
    for _ in range(rounds):
        dist.all_reduce(t)
    even = roce_pg.straggler_report()
    return {"rank": rank, "slowed": slowed, "even": even}
