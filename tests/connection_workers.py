"""Rank-side bodies of tests/test_connections.py: which network peers a rank
connects to, and when (connections on demand). Every rank is its own
simulated machine over TCP, so every peer is a network peer."""
import os
import time

import torch
import torch.distributed as dist

import roce_pg

from .api_workers import expect_error
from .support.proc_counts import rss_kib


def _connections():
    return roce_pg.counters()["connections"]


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _settled_fds(quiet_s=0.5, limit_s=10.0):
    """The descriptor count once it stopped moving for `quiet_s`: sockets
    are opened and closed by the runtime and progress threads (a process
    link accepted, a dial that lost its race dropped) after the calls that
    caused them returned, later still on a loaded machine."""
    import time

    last, since, start = _fds(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - start < limit_s:
        time.sleep(0.01)
        now = _fds()
        if now != last:
            last, since = now, time.monotonic()
    return last


def _store_barrier(name, world, store=None):
    """A barrier through the store only (the default group's, or `store`):
    counts read before it are not disturbed by faster ranks that dial this
    one for the next phase."""
    import time
    store = store or dist.distributed_c10d._get_default_store()
    store.add(name, 1)
    while store.add(name, 0) < world:
        time.sleep(0.005)


def on_demand(rank, world, port):
    """Connections follow the peers the algorithms talk to; exact data throughout."""
    out = {"after_init": _connections()}
    _store_barrier("init", world)
    # A 2-element allreduce on 6 ranks: recursive doubling with the fold
    # (ranks 0..3 pair up, then XOR partners among the 4 survivors).
    t = torch.full((2,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(sum(range(1, world + 1))), dtype=torch.float64))
    out["after_small_allreduce"] = _connections()
    _store_barrier("allreduce", world)
    # Point to point between ranks that are no partners of each other: rank 0 -> 3.
    if rank in (0, 3):
        buf = torch.arange(1000, dtype=torch.int64) * (7 if rank == 0 else 0)
        if rank == 0:
            dist.send(buf, 3)
        else:
            dist.recv(buf, 0)
            assert torch.equal(buf, torch.arange(1000, dtype=torch.int64) * 7)
    out["after_p2p"] = _connections()
    _store_barrier("p2p", world)
    # The baseline of the descriptor count: the lifelines' process links
    # long made, nobody dialing (counted before the next phase's dials).
    out["fds_before_all_pairs"] = _settled_fds()
    _store_barrier("p2p-counted", world)
    # Both ends start at once: every pair exchanges with isend/irecv in both
    # directions, so each pair's two dials race; exactly one connection survives.
    reqs, got = [], {}
    for peer in range(world):
        if peer == rank:
            continue
        got[peer] = torch.empty(256, dtype=torch.int64)
        reqs.append(dist.isend(torch.full((256,), rank * 100 + peer, dtype=torch.int64), peer))
        reqs.append(dist.irecv(got[peer], peer))
    for r in reqs:
        r.wait()
    for peer, g in got.items():
        assert torch.equal(g, torch.full((256,), peer * 100 + rank, dtype=torch.int64)), (peer, g[:4])
    out["after_all_pairs"] = _connections()
    # Once nobody dials any more, and the sockets of the dials that lost
    # their race are closed (each rank's engine drops them after the waits
    # above may have returned).
    _store_barrier("all-pairs", world)
    out["fds_after_all_pairs"] = _settled_fds()
    out["tcp_sockets"] = roce_pg._C._runtime_stats()["tcp_sockets"]
    dist.barrier()
    return out


def eager(rank, world, port):
    return {"after_init": _connections()}


def peer_left(rank, world, port):
    """A rank sends to a peer that has destroyed its group: the connection is
    refused, and the error names both ranks and the transport."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        dist.destroy_process_group()
        store.set("left", "1")
        store.wait(["checked"])
        dist.init_process_group("roce", store=dist.PrefixStore("again", store), rank=rank, world_size=world)
        return {}
    store.wait(["left"])
    if rank == 0:
        msg = expect_error(lambda: dist.send(torch.ones(8), 1), "rank 1", "rank 0", "refused")
        store.set("checked", "1")
    else:
        store.wait(["checked"])
        msg = ""
    dist.destroy_process_group()
    dist.init_process_group("roce", store=dist.PrefixStore("again", store), rank=rank, world_size=world)
    return {"msg": msg}


def eager_send_to_a_reader_that_waits(rank, world, port, megabytes=64):
    """Rank 1 sends `megabytes` to rank 0, which posts its receive 3 s later:
    meanwhile rank 0 holds at most a stream's window of it (its inbox fills
    from the runtime's idle reads, then the sender waits for credit), the
    sender's Work is not done, and the receive then gets every byte exactly."""
    import torch

    n = megabytes << 18  # float32 elements
    dist.all_reduce(torch.ones(1 << 16))  # connected, buffers made
    if rank == 1:
        x = torch.arange(n, dtype=torch.float32)
        work = dist.isend(x, 0)
        time.sleep(1.5)
        done_early = work.is_completed()
        work.wait()
        _store_barrier("eager-done", world)
        return {"done_early": done_early}
    rss0 = rss_kib()
    time.sleep(3)
    held_kib = rss_kib() - rss0
    y = torch.empty(n, dtype=torch.float32)
    dist.recv(y, 1)
    exact = bool(torch.equal(y, torch.arange(n, dtype=torch.float32)))
    _store_barrier("eager-done", world)
    return {"held_kib": held_kib, "exact": exact}
