"""Rank-side bodies of tests/test_api.py. Each returns a dict the test inspects,
or raises (the harness reports the traceback)."""
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import roce_pg


def expect_error(fn, *needles):
    """Runs fn, which must raise; returns the message after checking it names every needle."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        for n in needles:
            assert n.lower() in msg.lower(), f"error message lacks {n!r}: {msg}"
        return msg
    raise AssertionError(f"expected an error mentioning {needles}, got none")


def work_semantics(rank, world, port):
    out = {}
    t = torch.full((1000,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True
    assert w.is_completed() and w.is_success() and w.exception() is None
    value = w.get_future().wait()
    assert isinstance(value, list) and len(value) == 1
    assert value[0].data_ptr() == t.data_ptr(), "future value must be the output tensor"
    assert torch.equal(t, torch.full((1000,), float(sum(range(1, world + 1)))))
    # then() chains on the future, as DDP comm hooks do
    t2 = torch.ones(10)
    fut = dist.all_reduce(t2, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    assert torch.equal(fut.wait(), torch.full((10,), 10.0 * world))
    # barrier waits for earlier work
    works = [dist.all_reduce(torch.ones(100000), async_op=True) for _ in range(5)]
    dist.barrier()
    assert all(x.is_completed() for x in works)
    # wait(timeout) expires while the peer is late, and the work still completes later
    t3 = torch.ones(4)
    if rank == 0:
        w = dist.all_reduce(t3, async_op=True)
        msg = expect_error(lambda: w.wait(timeout=timedelta(milliseconds=300)), "did not complete within")
        out["wait_timeout_msg"] = msg
        w.wait()
    else:
        time.sleep(2)
        dist.all_reduce(t3)
    assert torch.equal(t3, torch.full((4,), float(world)))
    return out


def objects_and_p2p(rank, world, port):
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(world)]
    lst = [("hello", 42, rank)] if rank == 1 else [None]
    dist.broadcast_object_list(lst, src=1)
    assert lst == [("hello", 42, 1)]
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(rank * 3, gathered, dst=0)
    if rank == 0:
        assert gathered == [r * 3 for r in range(world)]
    recv = [None]
    dist.scatter_object_list(recv, [f"obj{r}" for r in range(world)] if rank == 0 else None, src=0)
    assert recv == [f"obj{rank}"]
    # batch_isend_irecv around a ring, both directions
    right, left = (rank + 1) % world, (rank - 1) % world
    send_r, send_l = torch.full((1000,), float(rank)), torch.full((7,), float(rank) + 0.5)
    got_l, got_r = torch.empty(1000), torch.empty(7)
    ops = [dist.P2POp(dist.irecv, got_l, left), dist.P2POp(dist.irecv, got_r, right),
           dist.P2POp(dist.isend, send_r, right), dist.P2POp(dist.isend, send_l, left)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 1, works  # one coalesced Work for the batch
    works[0].wait()
    assert torch.equal(got_l, torch.full((1000,), float(left)))
    assert torch.equal(got_r, torch.full((7,), float(right) + 0.5))
    # _coalescing_manager with a device: one Work for the batch of allreduces
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [torch.full((n,), float(rank + 1)) for n in (5, 1000, 70_000)]
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    assert len(cm.works) == 1, cm.works
    cm.wait()
    for t in ts:
        assert torch.equal(t, torch.full_like(t, float(world * (world + 1) // 2))), t
    # tags keep messages apart; a later tag may be received first. The sends are
    # non-blocking: a blocking send may wait for its matching receive (verbs
    # sends wait for the receiver's ready-to-receive, as NCCL's and MPI's may).
    if rank == 0:
        works = [dist.isend(torch.tensor([1.0]), 1, tag=5), dist.isend(torch.tensor([2.0]), 1, tag=6)]
        for w in works:
            w.wait()
    elif rank == 1:
        b, a = torch.empty(1), torch.empty(1)
        dist.recv(b, 0, tag=6)
        dist.recv(a, 0, tag=5)
        assert (a.item(), b.item()) == (1.0, 2.0)
    # receive from any source reports the sender
    if rank == 0:
        senders = set()
        for _ in range(world - 1):
            t = torch.empty(3)
            src = dist.recv(t)
            assert torch.equal(t, torch.full((3,), float(src)))
            senders.add(src)
        assert senders == set(range(1, world))
    else:
        dist.send(torch.full((3,), float(rank)), 0)
    # a large point-to-point message (larger than the shared-memory ring)
    if rank == 0:
        dist.send(torch.arange(3_000_000, dtype=torch.float64), 1)
    elif rank == 1:
        t = torch.empty(3_000_000, dtype=torch.float64)
        dist.recv(t, 0)
        assert torch.equal(t, torch.arange(3_000_000, dtype=torch.float64))
    dist.barrier()
    return {}


def bad_input(rank, world, port):
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    msgs = {}
    t = torch.ones(8)
    msgs["bxor_float"] = expect_error(lambda: dist.all_reduce(t, op=dist.ReduceOp.BXOR), "BXOR", "float32")
    msgs["avg_bool"] = expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG),
                                    "AVG", "bool")
    msgs["premul_bool"] = expect_error(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist._make_nccl_premul_sum(2.0)), "PREMUL_SUM", "bool")
    msgs["sparse_max"] = expect_error(lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX),
                                      "sparse", "SUM only", "MAX")
    opts = dist.BroadcastOptions()
    opts.rootRank = world + 3
    msgs["bad_root"] = expect_error(lambda: backend.broadcast([t], opts), "invalid root rank")
    msgs["send_self"] = expect_error(lambda: backend.send([t], rank, 0), "itself")
    msgs["bad_dst"] = expect_error(lambda: backend.send([t], world + 1, 0), "invalid destination rank")
    msgs["meta"] = expect_error(lambda: backend.allreduce([torch.ones(3, device="meta")]), "meta")
    msgs["mixed_devices"] = expect_error(
        lambda: backend.allgather([[torch.ones(3, device="meta")] + [torch.ones(3)] * (world - 1)], [torch.ones(3)]),
        "different devices")
    msgs["allgather_count"] = expect_error(lambda: backend.allgather([[torch.ones(3)]], [torch.ones(3)]),
                                           f"expected {world} output tensors")
    msgs["split_sum"] = expect_error(
        lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world), [1] * world, [2] * world),
        "split sizes add up")
    # Sizes that differ across ranks: every rank raises (no hang); on the
    # shared-memory path the group even stays usable.
    start = time.monotonic()
    msgs["size_mismatch"] = expect_error(lambda: dist.all_reduce(torch.ones(10 + rank)), "same size")
    msgs["size_mismatch_s"] = time.monotonic() - start
    # Coalescing regions as NCCL's: an empty one has no Work; one left open
    # (an exception inside the batch) gives way to the next with a warning;
    # closing none returns nothing. The next region still batches.
    cpu = torch.device("cpu")
    pg._start_coalescing(cpu)
    assert pg._end_coalescing(cpu) is None
    pg._start_coalescing(cpu)
    dist.all_reduce(torch.ones(3), async_op=True).wait()  # left in the region that is never ended
    pg._start_coalescing(cpu)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, async_op=True)
    batch = pg._end_coalescing(cpu)
    assert batch is not None
    batch.wait()
    assert torch.equal(t, torch.full((3,), float(sum(range(world))))), t
    assert pg._end_coalescing(cpu) is None
    # After every rejected call above the group still works.
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(world)))))
    return msgs


def monitored_barrier(rank, world, port):
    """Store-based monitored_barrier on 3 ranks: passes, names late ranks, and
    tells ranks that arrived (even late) what rank 0 saw; the group stays usable."""
    assert world == 3
    out = {}
    short = timedelta(milliseconds=500)
    for wait_all in (False, True):
        dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=wait_all)
    # Rank 2 arrives a second after rank 0 gave up: rank 0 names it, rank 1
    # (on time) and rank 2 (late) both get rank 0's verdict.
    if rank == 2:
        time.sleep(1.5)
    start = time.monotonic()
    out["late"] = expect_error(lambda: dist.monitored_barrier(timeout=short), "Rank 2 failed to pass monitoredBarrier")
    out["late_s"] = time.monotonic() - start
    # Ranks 1 and 2 late, every missing rank named.
    if rank != 0:
        time.sleep(1.5)
    out["all"] = expect_error(lambda: dist.monitored_barrier(timeout=short, wait_all_ranks=True),
                              "Ranks 1, 2 failed to pass monitoredBarrier")
    # A zero timeout gives rank 0 no time to wait: it says so.
    if rank == 0:
        out["zero"] = expect_error(lambda: dist.monitored_barrier(timeout=timedelta(0)), "Rank 0 timed out")
    else:
        out["zero"] = expect_error(lambda: dist.monitored_barrier(timeout=short), "rank 0 reports")
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), 3.0))
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    return out


def sparse_allreduce(rank, world, port):
    """all_reduce(SUM) of sparse COO tensors against the dense sum: nnz differing by
    rank (rank 1 has none), duplicate and unsorted indices, dense dims; then a
    size that differs on one rank fails every rank, and the group stays usable."""
    def local(r, dense_dims):
        nnz = 0 if r == 1 else 3 + 2 * r
        idx = torch.stack([torch.arange(nnz) % 4, torch.arange(nnz) % 2])  # i and i+4 repeat: uncoalesced
        vals = torch.arange(nnz * 4 ** dense_dims, dtype=torch.float64).reshape([nnz] + [4] * dense_dims) + r
        return torch.sparse_coo_tensor(idx, vals, [5, 3] + [4] * dense_dims)

    for dense_dims in (0, 1, 2):
        t = local(rank, dense_dims)
        dist.all_reduce(t)
        expected = sum(local(r, dense_dims).to_dense() for r in range(world))
        assert t.is_sparse and t.is_coalesced()
        assert torch.equal(t.to_dense(), expected), (dense_dims, t.to_dense(), expected)
    bad = torch.sparse_coo_tensor(torch.zeros(2, 1, dtype=torch.long), torch.ones(1), [5, 3 + (rank == 1)])
    msg = expect_error(lambda: dist.all_reduce(bad), "rank 1", "[5, 4]", "[5, 3]")
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(sum(range(world)))))
    return {"mismatch": msg}


def network_mismatch(rank, world, port):
    """Forced network path: a size mismatch fails every rank quickly, then the group refuses work."""
    start = time.monotonic()
    expect_error(lambda: dist.all_reduce(torch.ones(1000 + 100 * (rank == 0))), "roce")
    elapsed = time.monotonic() - start
    msg = expect_error(lambda: dist.all_reduce(torch.ones(4)), "cannot be used any more")
    return {"elapsed": elapsed, "msg": msg}


def debug_wrapper(rank, world, port):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend in torch's checking wrapper."""
    assert os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert type(backend).__name__ == "_ProcessGroupWrapper", type(backend)
    t = torch.full((100,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((100,), float(sum(range(world)))))
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    assert all(torch.equal(o, torch.full((3,), float(r))) for r, o in enumerate(outs))
    dist.barrier()
    return {}


def _resources():
    pid = os.getpid()
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "shm": sorted(f for f in os.listdir("/dev/shm") if f.startswith(f"roce_pg.{pid}.")),
        # Links to peer processes: kept for the process's life, whatever the groups.
        "process_links": roce_pg._C._runtime_stats()["process_links"],
    }


def groups(rank, world, port):
    """Subgroups, several groups alive and used at once, and release on destroy."""
    dist.barrier()
    time.sleep(0.5)  # as before `after`: connections of the world group's set-up may still be closing
    before = _resources()
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    pair = dist.new_group([1, 2])
    mine = evens if rank % 2 == 0 else odds
    t = torch.full((1000,), float(rank))
    dist.all_reduce(t, group=mine)
    assert torch.equal(t, torch.full((1000,), float(sum(r for r in range(world) if r % 2 == rank % 2))))
    if rank in (1, 2):
        t = torch.full((10,), float(rank))
        dist.broadcast(t, src=2, group=pair)
        assert torch.equal(t, torch.full((10,), 2.0))
    during = _resources()
    # Interleaved async work on two groups, issued from two threads at once.
    results = {}

    def hammer(name, group, value):
        ws = []
        ts = [torch.full((5000,), value) for _ in range(20)]
        for x in ts:
            ws.append(dist.all_reduce(x, group=group, async_op=True))
        for w in ws:
            w.wait()
        results[name] = ts

    th = [threading.Thread(target=hammer, args=("world", None, 1.0)),
          threading.Thread(target=hammer, args=("sub", mine, 2.0))]
    for x in th:
        x.start()
    for x in th:
        x.join()
    assert all(torch.equal(x, torch.full((5000,), float(world))) for x in results["world"])
    assert all(torch.equal(x, torch.full((5000,), 4.0)) for x in results["sub"])
    for g in (evens, odds, pair):
        dist.destroy_process_group(g)
    time.sleep(0.5)
    after = _resources()
    return {"before": before, "during": during, "after": after}


def skipped_collective(rank, world, port):
    """Rank 1 never calls the collective: rank 0 raises a timeout naming it."""
    if rank == 1:
        time.sleep(8)
        return {}
    start = time.monotonic()
    msg = expect_error(lambda: dist.all_reduce(torch.ones(16)), "timed out", "rank 1")
    return {"elapsed": time.monotonic() - start, "msg": msg}


def per_call_timeout(rank, world, port):
    """A per-call timeout shorter than the group's is honoured."""
    if rank == 1:
        time.sleep(6)
        return {}
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=1)
    start = time.monotonic()
    w = dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([torch.ones(4)], opts)
    msg = expect_error(lambda: w.wait(), "timed out")
    return {"elapsed": time.monotonic() - start, "msg": msg}


def ephemeral_timeout(rank, world, port):
    """torch's ephemeral timeout extension on a group whose timeout is 2 s:
    rank 0 extends it twice (accumulating to 2 + 8 s), then waits 5 s for
    rank 1 in an allreduce, which succeeds; the extensions expired with that
    allreduce, so the next 5 s wait times out after 2 s."""
    from torch.distributed.distributed_c10d import _add_ephemeral_timeout_for_all_pgs

    if rank == 0:
        _add_ephemeral_timeout_for_all_pgs(timedelta(seconds=4))
        _add_ephemeral_timeout_for_all_pgs(timedelta(seconds=4))
    else:
        time.sleep(5)
    t = torch.full((4,), float(rank + 1))
    start = time.monotonic()
    dist.all_reduce(t, async_op=True).wait()
    extended = {"elapsed": time.monotonic() - start, "sum": t.tolist()}
    if rank == 1:
        time.sleep(5)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        msg = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        msg = str(e)
    return {"extended": extended, "expired": {"elapsed": time.monotonic() - start, "msg": msg}}


def abort_hooks(rank, world, port):
    """torch's abort hooks on a group whose timeout is 2 s: rank 0's allreduce
    times out while rank 1 sleeps; each rank's hooks run, in id order, before
    its failed Work raises (a hook that raises does not stop the others; an
    unregistered one does not run)."""
    pg = dist.group.WORLD
    ran = []
    pg.register_abort_hook(1, lambda: ran.append("first"))
    pg.register_abort_hook(2, lambda: 1 / 0)
    pg.register_abort_hook(3, lambda: ran.append("unregistered"))
    pg.register_abort_hook(4, lambda: ran.append("last"))
    pg.unregister_abort_hook(3)
    healthy = list(ran)
    dist.all_reduce(torch.ones(4))  # a completed operation runs no hook
    healthy += ran
    if rank == 1:
        time.sleep(4)
    try:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        msg = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        msg = str(e)
    at_error = list(ran)
    return {"supported": pg.supports_abort_hooks, "healthy": healthy, "at_error": at_error, "msg": msg}


def abort_from_a_hook_while_the_program_aborts(rank, world, port):
    """Rank 0's allreduce times out (rank 1 sleeps, the group's timeout is
    2 s). Its abort hook, on roce's progress thread, waits until the
    program's thread is inside abort() (which stops the group and so joins
    that progress thread), then calls abort() itself: both return at once
    (the hook's abort found the group already ending)."""
    import threading

    pg = dist.group.WORLD
    if rank == 1:
        time.sleep(4)
        return {}
    hook_in, hook_done = threading.Event(), []

    def hook():
        hook_in.set()
        time.sleep(1.0)  # the program's thread enters abort() meanwhile
        pg.abort()
        hook_done.append(True)

    pg.register_abort_hook(1, hook)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    hook_in.wait(30)
    start = time.monotonic()
    pg.abort()
    out = {"abort_s": time.monotonic() - start, "hook_done": hook_done, "hook_ran": hook_in.is_set()}
    try:
        work.wait()
        out["work"] = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        out["work"] = str(e)
    return out


def time_estimation(rank, world, port):
    """torch's _time_estimator: calls inside it do not run (their tensors keep
    their values) and add the cost model's estimate; larger calls estimate
    longer; a call from another thread meanwhile runs; the group works after
    it. Returns the estimates and the measured time of the same allreduce,
    for the comparison."""
    from torch.distributed.distributed_c10d import _time_estimator

    n = 1 << 18  # 1 MiB of float32
    t = torch.full((n,), float(rank + 1))
    other = torch.full((4,), float(rank + 1))
    with _time_estimator() as one:
        dist.all_reduce(t)
        side = threading.Thread(target=dist.all_reduce, args=(other,))
        side.start()
        side.join()
    untouched = torch.equal(t, torch.full((n,), float(rank + 1)))
    other_ran = torch.equal(other, torch.full((4,), float(world * (world + 1) // 2)))
    with _time_estimator() as bigger:
        dist.all_reduce(torch.ones(16 * n))
    with _time_estimator() as several:
        dist.all_reduce(t)
        out = torch.empty(world * n)
        dist.all_gather_into_tensor(out, t)
        dist.barrier()
        peer = (rank + 1) % world
        works = [dist.isend(t, peer), dist.irecv(torch.empty(n), (rank - 1) % world)]
        for w in works:
            w.wait()
    untouched = untouched and torch.equal(t, torch.full((n,), float(rank + 1)))
    dist.all_reduce(t)  # runs again
    exact = torch.equal(t, torch.full((n,), float(world * (world + 1) // 2)))
    dist.barrier()
    times = []
    for _ in range(10):
        start = time.monotonic()
        dist.all_reduce(t)
        times.append(time.monotonic() - start)
    measured_us = min(times) * 1e6  # the least disturbed of ten: the machine is shared
    return {"one_us": one.estimated_time, "bigger_us": bigger.estimated_time, "several_us": several.estimated_time,
            "untouched": untouched, "exact": exact, "other_ran": other_ran, "measured_us": measured_us}


def never_joins(rank, world, port, timeout_s):
    """Rank world-1 never creates the group: the others fail within 2x the timeout."""
    if rank == world - 1:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)  # noqa: F841
        time.sleep(timeout_s * 2 + 3)
        return {}
    # The absent rank hosts the store, so the store outlives the ranks that fail.
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                          timeout=timedelta(seconds=60))
    start = time.monotonic()
    msg = expect_error(lambda: dist.init_process_group("roce", store=store, rank=rank, world_size=world,
                                                       timeout=timedelta(seconds=timeout_s)),
                       "timed out", f"rank {world - 1}")
    return {"elapsed": time.monotonic() - start, "msg": msg}


def no_rdma_device(rank, world, port):
    """Without RDMA devices a group spanning machines refuses to start unless TCP is chosen."""
    from .support.ranks import store_wait

    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=60))
    msg = expect_error(lambda: dist.init_process_group("roce", store=store, rank=rank, world_size=world,
                                                       timeout=timedelta(seconds=60)),
                       "no RDMA device", "ROCE_PG_NET_TRANSPORT=tcp", f"rank {1 - rank}")
    store_wait(store, "test/done", world)  # rank 0 hosts the store: leave together
    if rank == 0:
        time.sleep(1)
    return {"msg": msg}


def abort_from_a_callback(rank, world, port):
    """A Work's callback (on roce's progress thread) aborts the group it ran
    on; the program then destroys that group: the destruction waits for the
    progress thread's loop to end instead of freeing what it still uses, and
    the default group goes on."""
    sub = dist.new_group(list(range(world)))
    t = torch.ones(1000)
    if rank != 0:
        time.sleep(1)  # rank 0's Work is still pending when its callback is attached
    w = dist.all_reduce(t, group=sub, async_op=True)
    ran_on = []

    def abort_it(f):
        ran_on.append(threading.get_ident())
        sub.abort()

    fut = w.get_future().then(abort_it)
    fut.wait()
    if rank == 0:
        assert ran_on and ran_on[0] != threading.get_ident(), "the callback did not run on roce's progress thread"
    after = expect_error(lambda: sub.allreduce([torch.ones(4)]).wait(), "abort")
    dist.destroy_process_group(sub)
    x = torch.full((10,), float(rank))
    dist.all_reduce(x)
    return {"exact": torch.equal(x, torch.full((10,), float(sum(range(world))))), "after": after,
            "sum": t[0].item()}


def abort_pending(rank, world, port):
    """abort() on a subgroup fails its pending work at once and leaves the default group usable.

    Rank 0 starts an allreduce on the subgroup that rank 1 never joins, then aborts
    the subgroup; the pending work and any later work on it raise."""
    from .support.ranks import store_wait

    store = dist.distributed_c10d._get_default_store()
    sub = dist.new_group(list(range(world)))
    t = torch.ones(1000)
    dist.all_reduce(t, group=sub)  # the subgroup works (its connections are up)
    out = {}
    if rank == 0:
        w = dist.all_reduce(torch.ones(4), group=sub, async_op=True)
        time.sleep(0.5)
        assert not w.is_completed()
        start = time.monotonic()
        dist.distributed_c10d._abort_process_group(sub)
        out["pending"] = expect_error(lambda: w.wait(timeout=timedelta(seconds=30)), "abort")
        out["elapsed"] = time.monotonic() - start
        # Later work, and the group's counters, raise naming the abort (the
        # group's engine has no communicator any more). The group object
        # itself: torch's functions refuse a group it aborted before asking it.
        out["later"] = expect_error(lambda: sub.allreduce([torch.ones(4)]).wait(), "abort")
        out["counters"] = expect_error(lambda: roce_pg.counters(sub), "abort")
    store_wait(store, "abort/done", world)
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)  # the default group is untouched
    assert torch.equal(t, torch.full((10,), float(sum(range(world)))))
    return out
