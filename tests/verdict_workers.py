"""Rank functions for tests/test_verdict.py: one rank stops calling collectives
(alive, its process and lifelines up); the others time out in the next one,
and each of their errors carries the same cross-rank verdict (issue 28)."""
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
