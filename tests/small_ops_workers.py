"""Worker for tests/test_small_ops.py, run inside every rank of one spawned
group: the one-shot shared-memory allreduce around its threshold, the inline
execution of small collectives (ordering with queued work, completed Works
and futures, errors and timeouts), network and shared-memory waits that block
in poll(), all against exact / float64 references."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .api_workers import expect_error
from .reference import DTYPES, Checker, applicable_ops, inputs_for, make_op, reduce_reference

# Set by the test (ROCE_PG_SHM_ONESHOT_MAX_BYTES) so that sizes on both sides
# of the threshold stay small.
ONESHOT_MAX = 4096


def _around_threshold(dtype):
    esz = torch.empty(0, dtype=dtype).element_size()
    at = ONESHOT_MAX // esz
    return [0, 1, 3, at - 1, at, at + 1, 3 * at + 5]


def _oneshot_matrix(ck, rank, world):
    for dtype in DTYPES:
        for numel in _around_threshold(dtype):
            for opname in applicable_ops(dtype):
                xs = inputs_for(world, numel, dtype, opname, salt=11)
                expected = reduce_reference(xs, opname, dtype)
                t = xs[rank].clone()
                dist.all_reduce(t, op=make_op(opname, dtype))
                ck.close(f"all_reduce {dtype} {opname} n={numel}", t, expected, dtype)
                # Every rank must hold the same bits (each reduces all slots itself).
                got = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(got, t)
                ck.same(f"identical results {dtype} {opname} n={numel}", torch.stack(got), torch.stack([t] * world))


def _inline_ordering(ck, rank, world):
    # An idle engine runs a small op inline: the Work is complete on return,
    # its future holds the output tensors. (Idle means parked: the call before
    # this one may have been queued, and the thread may still be finishing it.)
    import roce_pg

    small = torch.full((4,), float(rank + 1))
    ck.same("engine parked before the inline call", torch.tensor(roce_pg._wait_engine_parked(timeout=10)),
            torch.tensor(True))
    w = dist.all_reduce(small, async_op=True)
    ck.same("inline work completed on return", torch.tensor(w.is_completed()), torch.tensor(True))
    fut = w.get_future()
    ck.same("inline future done", torch.tensor(fut.done()), torch.tensor(True))
    ck.same("inline future value", fut.value()[0], torch.full((4,), float(sum(range(1, world + 1)))))
    w.wait()
    # Mixed: large (queued) and small ops issued back to back without waiting;
    # small ones behind queued work must queue too, and all results be right.
    works, expect = [], []
    for i in range(12):
        big = torch.full((300_000,), float(rank + i))
        sm = torch.full((3,), float(rank * i + 1))
        works.append((dist.all_reduce(big, async_op=True), big))
        works.append((dist.all_reduce(sm, async_op=True), sm))
        expect.append(float(sum(r + i for r in range(world))))
        expect.append(float(sum(r * i + 1 for r in range(world))))
        if i % 3 == 0:  # and a broadcast / allgather / barrier in between
            b = torch.full((5,), float(rank))
            dist.broadcast(b, src=i % world)
            ck.same(f"broadcast among async ops {i}", b, torch.full((5,), float(i % world)))
            outs = [torch.empty(2) for _ in range(world)]
            dist.all_gather(outs, torch.full((2,), float(rank * 10 + i)))
            ck.same(f"all_gather among async ops {i}", torch.stack(outs),
                    torch.stack([torch.full((2,), float(r * 10 + i)) for r in range(world)]))
            dist.barrier()
    for (w, t), e in zip(works, expect):
        w.wait()
        ck.same(f"mixed async result {e}", t, torch.full_like(t, e))


def _errors(ck, rank, world):
    # A size mismatch on the one-shot path fails on every rank, quickly, and
    # leaves the group usable (argument-level error, nothing in flight).
    expect_error(lambda: dist.all_reduce(torch.ones(10 + rank)), "same size")
    # One rank one-shot, another the two-step protocol: still a clear error.
    n = 8 if rank == 0 else 3 * ONESHOT_MAX
    expect_error(lambda: dist.all_reduce(torch.ones(n)), "mismatch")
    expect_error(lambda: dist.all_reduce(torch.ones(5, dtype=torch.float64 if rank else torch.float32)), "mismatch")
    # The barrier of a group on one machine is a shared-memory collective
    # too: one rank in barrier while the others allreduce fails on all of
    # them, naming both calls, instead of the barrier pairing with it.
    if rank == 0:
        expect_error(dist.barrier, "mismatch", "runs barrier", "allreduce")
    else:
        expect_error(lambda: dist.all_reduce(torch.ones(4)), "mismatch", "runs allreduce", "barrier")
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    ck.same("usable after mismatches", t, torch.full((5,), float(sum(range(world)))))
    # ... also for collectives that exchange messages: the failed barrier
    # left every rank's collective tags in step.
    out = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), out, dst=0)
    if rank == 0:
        ck.same("gather after the mismatches", torch.stack(out),
                torch.stack([torch.full((2,), float(r)) for r in range(world)]))
    dist.barrier()
    _barrier_against_gather(ck, rank, world)
    _chunk_mismatch(ck, rank, world)
    # A timeout on the inline path: rank 0 alone calls a small allreduce in a
    # subgroup with a 2 s timeout; it must raise (naming the operation), not hang.
    sub = dist.new_group(list(range(world)), timeout=timedelta(seconds=2))
    dist.all_reduce(torch.ones(1), group=sub)  # the subgroup works
    dist.barrier()
    msg = ""
    if rank == 0:
        msg = expect_error(lambda: dist.all_reduce(torch.ones(2), group=sub), "timed out", "allreduce")
    dist.barrier()
    dist.destroy_process_group(sub)
    return msg


def _barrier_against_gather(ck, rank, world):
    """A barrier against a collective that exchanges messages (a gather) in a
    group on one machine: the barrier rank finds the other under the same
    collective tag and breaks the group, which releases the gather's root
    (waiting for rank 0's block) at once rather than at the group's timeout.
    A subgroup: it stays broken."""
    import time

    g = dist.new_group(list(range(world)))
    dist.barrier(group=g)  # formed everywhere; and the barrier works
    t0 = time.monotonic()
    if rank == 0:
        expect_error(lambda: dist.barrier(group=g), "mismatch", "rank 0 runs barrier", "gather")
    elif rank == 1:  # the root waits for rank 0's block
        out = [torch.empty(3) for _ in range(world)]
        expect_error(lambda: dist.gather(torch.ones(3), out, dst=1, group=g), "rank 0", "mismatch")
    else:  # its part (a send to the root) may complete before the group breaks
        try:
            dist.gather(torch.ones(3), None, dst=1, group=g)
        except RuntimeError as e:
            ck.true(f"a failed gather names the mismatch: {e}", "mismatch" in str(e))
    ck.true("barrier against gather fails within 10 s", time.monotonic() - t0 < 10)
    dist.destroy_process_group(g)


def _chunk_mismatch(ck, rank, world):
    """Ranks that disagree on ROCE_PG_SHM_CHUNK_BYTES would cut the two-step
    shared-memory allreduce at different places and read each other's slots
    wrongly: every rank must name the variable instead. The one-shot protocol
    has no chunks, so small calls still work in that group."""
    import os

    saved = os.environ.get("ROCE_PG_SHM_CHUNK_BYTES")
    os.environ["ROCE_PG_SHM_CHUNK_BYTES"] = "4096" if rank == 0 else "8192"
    g = dist.new_group(list(range(world)), backend="roce")
    if saved is None:
        os.environ.pop("ROCE_PG_SHM_CHUNK_BYTES")
    else:
        os.environ["ROCE_PG_SHM_CHUNK_BYTES"] = saved
    expect_error(lambda: dist.all_reduce(torch.ones(3 * ONESHOT_MAX), group=g), "ROCE_PG_SHM_CHUNK_BYTES")
    t = torch.full((7,), float(rank + 1))
    dist.all_reduce(t, group=g)
    ck.same("one-shot with different chunk settings", t, torch.full((7,), float(sum(range(1, world + 1)))))
    dist.destroy_process_group(g)


def _blocking_waits(ck, rank, world):
    """Waits on the network block in poll() instead of spinning: a group over TCP
    (every rank its own simulated machine) where the last rank joins an
    allreduce 1.5 s late. The others must block (counter), use little CPU
    meanwhile, and still get the right sum as soon as it arrives; async
    point-to-point work in flight while the progress thread blocks must not
    hold up a collective queued behind it."""
    import os
    import time

    import roce_pg

    # Inline execution of asynchronous calls (set for this test's world group)
    # off again: the defaults, under which only synchronous calls run inline.
    saved = {k: os.environ.get(k) for k in ("ROCE_PG_NET_TRANSPORT", "ROCE_PG_SIM_RANKS_PER_NODE",
                                            "ROCE_PG_INLINE_MAX_BYTES")}
    os.environ.update({"ROCE_PG_NET_TRANSPORT": "tcp", "ROCE_PG_SIM_RANKS_PER_NODE": "1",
                       "ROCE_PG_INLINE_MAX_BYTES": "0"})
    g = dist.new_group(list(range(world)), backend="roce")
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    # Default settings: a synchronous small call runs on the caller's thread
    # (PyTorch passes async_op down as asyncOp), an asynchronous one does not.
    # Each call is made once the progress thread is parked with nothing to do,
    # the only state in which a call may run inline: a call right after a
    # queued one can find the thread still finishing and queue, so without the
    # wait the count would depend on scheduling.
    y = torch.full((3,), float(rank))
    roce_pg.reset_counters(g)
    parked = 0
    for _ in range(5):
        parked += roce_pg._wait_engine_parked(g, timeout=10)
        dist.all_reduce(y, group=g)
    sync_inline = roce_pg.counters(g)["inline_ops"]
    for _ in range(5):
        parked += roce_pg._wait_engine_parked(g, timeout=10)
        dist.all_reduce(y, group=g, async_op=True).wait()
    async_inline = roce_pg.counters(g)["inline_ops"] - sync_inline
    ck.same("sync and async results", y, torch.full((3,), float(sum(range(world)) * world ** 9)))
    ck.same(f"progress thread parked before each of 10 calls ({parked})", torch.tensor(parked), torch.tensor(10))
    ck.same(f"synchronous 12-byte allreduces ran inline ({sync_inline} of 5), asynchronous ones did not "
            f"({async_inline} of 5)", torch.tensor([sync_inline, async_inline]), torch.tensor([5, 0]))
    late = world - 1
    for dtype in (torch.float32, torch.int64):
        t = torch.arange(1000, dtype=dtype) * (rank + 1)
        expect = torch.arange(1000, dtype=dtype) * sum(r + 1 for r in range(world))
        dist.barrier(group=g)
        roce_pg.reset_counters(g)
        if rank == late:
            time.sleep(1.5)
        wall0, cpu0 = time.monotonic(), time.process_time()
        dist.all_reduce(t, group=g)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        ck.same(f"allreduce {dtype} with a late rank over TCP", t, expect)
        if rank != late:
            blocked = roce_pg.counters(g)["blocked_waits"]
            ck.same(f"{dtype}: the wait for the late rank blocked in poll (blocked_waits {blocked})",
                    torch.tensor(blocked >= 1), torch.tensor(True))
            # All threads of this process: a spinning wait would use ~1 s of CPU
            # per 1.5 s; a blocked one wakes only for the slow checks (200 ms).
            ck.same(f"{dtype}: CPU {cpu:.3f} s while waiting {wall:.2f} s for the late rank",
                    torch.tensor(wall > 1.0 and cpu < 0.3 * wall), torch.tensor(True))
    # Async receive in flight (the progress thread blocks on its socket), then
    # an allreduce: it completes, and the receive completes once rank 0 sends.
    if rank != 0:
        buf = torch.zeros(8)
        recv = dist.irecv(buf, src=0, group=g)
    x = torch.full((5,), float(rank))
    dist.all_reduce(x, group=g)
    ck.same("allreduce behind a pending irecv", x, torch.full((5,), float(sum(range(world)))))
    if rank == 0:
        for r in range(1, world):
            dist.send(torch.full((8,), float(r)), dst=r, group=g)
    else:
        recv.wait()
        ck.same("irecv completed after the allreduce", buf, torch.full((8,), float(rank)))
    dist.destroy_process_group(g)


def _shm_blocking_waits(ck, rank, world):
    """Waits on the shared-memory rings block on the rank's doorbell instead of
    polling (the world group: one machine). The last rank is 1.5 s late twice:
    as the root of a broadcast (the others wait for data in an empty ring) and
    as the receiver of an 8 MiB message from rank 0, four times the ring (rank
    0 waits for space in a full ring). The waiting ranks must block (counter),
    use little CPU meanwhile, and the values be exact."""
    import time

    import roce_pg

    late = world - 1
    n = 32 * 1024  # 256 KiB of int64: the binomial broadcast
    big = torch.arange(1 << 20, dtype=torch.int64)  # 8 MiB; the rings are 2 MiB

    # The world group broadcasts through the shared-memory slots (a barrier,
    # not the rings); a subgroup forcing the binomial tree uses the rings.
    os.environ["ROCE_PG_ALGO_BROADCAST"] = "binomial"
    rings = dist.new_group(list(range(world)))
    del os.environ["ROCE_PG_ALGO_BROADCAST"]

    def bcast(group=rings):
        t = torch.arange(n, dtype=torch.int64) * (rank + 1) if rank == late else torch.zeros(n, dtype=torch.int64)
        dist.broadcast(t, src=late, group=group)
        ck.same("broadcast from a late root over shared memory", t, torch.arange(n, dtype=torch.int64) * (late + 1))

    def send_big():
        if rank == 0:
            dist.send(big * 3, dst=late)
        elif rank == late:
            got = torch.empty_like(big)
            dist.recv(got, src=0)
            ck.same("8 MiB received late over shared memory", got, big * 3)

    # (what, call, ranks that wait, group, whether they wait on a ring: the
    # slots' barrier sleeps on the late rank's futex, not on the doorbell).
    for what, fn, waiting, group, on_ring in (
            ("receivers wait for data", bcast, range(late), rings, True),
            ("a sender waits for ring space", send_big, (0,), None, True),
            ("slot readers wait for the root", lambda: bcast(None), range(late), None, False)):
        dist.barrier()
        roce_pg.reset_counters(group)
        if rank == late:
            time.sleep(1.5)
        wall0, cpu0 = time.monotonic(), time.process_time()
        fn()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if rank in waiting and on_ring:
            blocked = roce_pg.counters(group)["blocked_waits"]
            ck.same(f"shm, {what}: the wait blocked on the doorbell (blocked_waits {blocked})",
                    torch.tensor([blocked >= 1]), torch.tensor([True]))
        if rank in waiting:
            # Polling would not fail this (sleeps of 1 ms), spinning would; a
            # blocked wait wakes only for the slow checks (200 ms). One-element
            # tensors: the Checker reports a mismatch of those with its message.
            ck.same(f"shm, {what}: CPU {cpu:.3f} s while waiting {wall:.2f} s for the late rank",
                    torch.tensor([wall > 1.0 and cpu < 0.1 * wall]), torch.tensor([True]))
    dist.destroy_process_group(rings)


def run(rank, world, port):
    ck = Checker(rank)
    _oneshot_matrix(ck, rank, world)
    _inline_ordering(ck, rank, world)
    _blocking_waits(ck, rank, world)
    _shm_blocking_waits(ck, rank, world)
    timeout_msg = _errors(ck, rank, world)
    out = ck.result()
    out["timeout_msg"] = timeout_msg
    return out
