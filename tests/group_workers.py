"""Rank-side bodies of tests/test_groups.py: many groups in one
process share its runtime (one listener, one thread for every group's
lifelines, one verbs context per port), subgroups form from the world group's
roster with no join, and one group's failure or destroy leaves the others
working. Every collective is checked exactly against integers computed here."""
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import roce_pg

from .connection_workers import _store_barrier
from .support.proc_counts import devshm_kib, listening_ports, threads_named


def _cost():
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "listen": listening_ports(), "runtime_threads": threads_named("roce-runtime"), "devshm_kib": devshm_kib()}


def _check_allreduce(group, members, rank, n=1000):
    """Sum of (global rank + 1) * (index + 1) over the members, as int64."""
    t = torch.arange(1, n + 1, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, group=group)
    expected = torch.arange(1, n + 1, dtype=torch.int64) * sum(r + 1 for r in members)
    assert torch.equal(t, expected), (members, t[:4], expected[:4])


def _formation_ops(group):
    return group._get_backend(torch.device("cpu"))._formation_store_ops()


def subgroups(rank, world, port):
    """new_group over several member sets and a 2 x 2 DeviceMesh: every
    subgroup's formation makes no store operation of its own (no join) unless
    ROCE_PG_SUBGROUPS=join; exact sums in each."""
    out = {"world_ops": _formation_ops(dist.group.WORLD), "ops": {}}
    sets = [[0, 1], [1, 2, 3], [3, 0], list(range(world)), [2, 0, 1]]
    for members in sets:
        g = dist.new_group(members)
        if rank in members:
            _check_allreduce(g, members, rank)
            out["ops"][str(members)] = _formation_ops(g)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        g = mesh.get_group(dim)
        members = dist.get_process_group_ranks(g)
        _check_allreduce(g, members, rank)
        if isinstance(g._get_backend(torch.device("cpu")), roce_pg._C.RoceBackend):
            out["ops"][f"mesh {dim} {members}"] = _formation_ops(g)
    out["stats"] = roce_pg._C._runtime_stats()
    dist.barrier()
    return out


def costs(rank, world, port, groups=(1, 9)):
    """Descriptors, threads and listening ports after the world group plus N
    groups over every rank (one allreduce and one barrier each), for each N
    in `groups`."""
    made, points = [], {}
    _check_allreduce(None, range(world), rank)
    for target in groups:
        while len(made) < target:
            g = dist.new_group(list(range(world)))
            _check_allreduce(g, range(world), rank)
            dist.barrier(group=g)
            made.append(g)
        _store_barrier(f"costs{target}", world)
        points[target] = _cost()
        # Before any rank goes on: a faster rank's next operation would
        # otherwise dial a rank still counting.
        _store_barrier(f"costs{target}-counted", world)
    points["stats"] = roce_pg._C._runtime_stats()
    dist.barrier()
    return points


def cycles(rank, world, port, n=64):
    """n times: create a group over every rank, one allreduce, destroy it.
    Descriptors, threads, RSS and the runtime's mailboxes must come back."""
    def rss_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    samples = []
    for i in range(n):
        g = dist.new_group(list(range(world)))
        _check_allreduce(g, range(world), rank, n=4096)
        dist.destroy_process_group(g)
        if i in (3, n // 2, n - 1):
            _store_barrier(f"cycle{i}", world)
            s = _cost()
            s["rss_kib"] = rss_kib()
            stats = roce_pg._C._runtime_stats()
            s["mailboxes"], s["process_links"] = stats["mailboxes"], stats["process_links"]
            s["tcp_sockets"] = stats["tcp_sockets"]
            s["shm_doorbell_groups"] = stats["shm_doorbell_groups"]
            samples.append(s)
    _check_allreduce(None, range(world), rank)
    dist.barrier()
    return samples


def two_threads(rank, world, port, rounds=40):
    """A pipeline's send/recv on one group while a data-parallel allreduce runs
    on another, from two threads at once: both progress, exact values."""
    pipe = dist.new_group(list(range(world)))
    dp = dist.new_group(list(range(world)))
    errors = []

    def pipeline():
        try:
            peer = rank ^ 1
            for i in range(rounds):
                send = torch.full((4096,), rank * 1000 + i, dtype=torch.int64)
                got = torch.empty(4096, dtype=torch.int64)
                if rank % 2 == 0:
                    dist.send(send, peer, group=pipe)
                    dist.recv(got, peer, group=pipe)
                else:
                    dist.recv(got, peer, group=pipe)
                    dist.send(send, peer, group=pipe)
                assert torch.equal(got, torch.full((4096,), peer * 1000 + i, dtype=torch.int64)), (i, got[:2])
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    t = threading.Thread(target=pipeline)
    t.start()
    for i in range(rounds):
        _check_allreduce(dp, range(world), rank, n=8192 + i)
    t.join(timeout=120)
    assert not t.is_alive(), "the pipeline thread did not finish"
    if errors:
        raise errors[0]
    dist.barrier()
    return {}


def contained(rank, world, port):
    """Rank 1 destroys a subgroup {0, 1} while rank 0 still uses it: rank 0's
    next receive on it fails naming rank 1, and the world group and another
    subgroup keep working on every rank. Then rank 2 aborts a group: the same."""
    from .api_workers import expect_error

    pair = dist.new_group([0, 1])
    other = dist.new_group(list(range(world)))
    if rank in (0, 1):
        _check_allreduce(pair, [0, 1], rank)
    _store_barrier("pair-used", world)
    msg = ""
    if rank == 1:
        dist.destroy_process_group(pair)
    _store_barrier("pair-destroyed", world)
    if rank == 0:
        msg = expect_error(lambda: dist.recv(torch.ones(1 << 16), 1, group=pair), "rank 1")
    _check_allreduce(other, range(world), rank)
    # Rank 2 aborts a group the others then call a collective on: theirs
    # fails naming rank 2 (the FAIL notice travels that group's lifelines,
    # on the runtime thread every group shares); the rest keep working.
    aborted = dist.new_group(list(range(world)))
    _check_allreduce(aborted, range(world), rank)
    _store_barrier("abort-used", world)
    abort_msg = ""
    if rank == 2:
        dist.distributed_c10d._abort_process_group(aborted)
    else:
        abort_msg = expect_error(lambda: _check_allreduce(aborted, range(world), rank), "rank 2")
    _store_barrier("abort-seen", world)
    _check_allreduce(other, range(world), rank)
    _check_allreduce(None, range(world), rank)
    dist.barrier()
    return {"msg": msg, "abort_msg": abort_msg}


def failed_member(rank, world, port):
    """Rank 2's creation of a subgroup fails before its lifelines exist
    (ROCE_PG_TEST_FAULT=fail_forming) while the others' succeeds: their first
    collective on it fails naming rank 2 long before the group's 600 s
    timeout (rank 2's process answers their lifeline records with GONE).
    Twice: a group over every rank (its lifelines run over links the world
    group opened), and {0, 2}, whose processes had no link yet (the one
    with the smaller key dials; the other's pending link dials after 2 s).
    The world group keeps working."""
    from .api_workers import expect_error

    def attempt(members):
        err, elapsed = "", 0.0
        if rank == 2:
            os.environ["ROCE_PG_TEST_FAULT"] = "fail_forming"
            try:
                err = expect_error(lambda: dist.new_group(members, timeout=timedelta(seconds=600)), "fail_forming")
            finally:
                del os.environ["ROCE_PG_TEST_FAULT"]
        else:
            g = dist.new_group(members, timeout=timedelta(seconds=600))
            if rank in members:
                # Errors name group ranks: rank 2 is members.index(2) there.
                start = time.monotonic()
                err = expect_error(lambda: _check_allreduce(g, members, rank), f"rank {members.index(2)}")
                elapsed = time.monotonic() - start
        return {"err": err, "elapsed": elapsed}

    # The ring algorithm: every member talks to its ring neighbours only, so
    # the failure reaches rank 0 as the forwarded notice, not as a refused
    # data connection to rank 2.
    os.environ["ROCE_PG_ALGO_ALLREDUCE"] = "ring"
    try:
        everyone = attempt(list(range(world)))
        _store_barrier("failed-member-all", world)
        pair = attempt([0, 2])
        _store_barrier("failed-member-pair", world)
    finally:
        del os.environ["ROCE_PG_ALGO_ALLREDUCE"]
    _check_allreduce(None, range(world), rank)
    dist.barrier()
    return {"everyone": everyone, "pair": pair}


def protocol_mismatch(rank, world, port):
    """A group whose formation meets a rank of another roce_pg formation
    protocol (ROCE_PG_TEST_FAULT=next_protocol, read per group; subgroups
    join through their leader here): first a rank that is not the leader,
    then the leader. Every member fails at once, naming both versions, long
    before the group's 600 s timeout; the world group keeps working."""
    from .api_workers import expect_error

    out = {}
    for case, odd in (("joiner", world - 1), ("leader", 0)):
        if rank == odd:
            os.environ["ROCE_PG_TEST_FAULT"] = "next_protocol"
        start = time.monotonic()
        try:
            err = expect_error(lambda: dist.new_group(list(range(world)), timeout=timedelta(seconds=600)),
                               "formation protocol", "same roce_pg build")
        finally:
            os.environ.pop("ROCE_PG_TEST_FAULT", None)
        out[case] = {"err": err, "elapsed": time.monotonic() - start}
        _store_barrier(f"protocol-mismatch-{case}", world)
    _check_allreduce(None, range(world), rank)
    return out


def verbs_groups(rank, world, port):
    """Over verbs (the Soft-RoCE VM): subgroups formed from the world's roster
    and a second thread's group all use the process's one device context
    (VerbsDevice::shared); what each group registers is reported."""
    out = subgroups(rank, world, port)
    assert out["stats"]["verbs_devices"] == 1, out["stats"]
    landing_before = roce_pg._C._runtime_stats()["verbs_landing_bytes"]
    extra = dist.new_group(list(range(world)))
    _check_allreduce(extra, range(world), rank, n=1 << 16)
    c = roce_pg.counters(extra)
    stats = roce_pg._C._runtime_stats()
    # The landing and staging pools are the process's, registered by the
    # world group (which reaches as many peers): the group's own counter has
    # only its control rings, and the landing pool grows by at most its
    # reserved slots (less if a destroyed subgroup left reservations free).
    out["registered"] = {"world": roce_pg.counters()["registered_bytes"], "extra": c["registered_bytes"],
                         "formula": roce_pg._C.verbs_registered_bytes(c["connections"], routed=world - 1)
                         - roce_pg._C.verbs_landing_bytes(world - 1) - roce_pg._C.verbs_staging_bytes(world - 1),
                         "ceiling": roce_pg._C.verbs_registered_bytes(c["connections"], routed=1 << 20),
                         "landing_added": stats["verbs_landing_bytes"] - landing_before,
                         "reserved_formula": roce_pg._C.testing.verbs_reserved_bytes(world - 1),
                         "staging": stats["verbs_staging_bytes"],
                         "staging_formula": roce_pg._C.verbs_staging_bytes(world - 1)}
    assert roce_pg._C._runtime_stats()["verbs_devices"] == 1
    two_threads(rank, world, port, rounds=10)
    dist.barrier()
    return out


def staging_shared(rank, world, port, threads=3, rounds=6):
    """Many groups in one process, over verbs: every group of a process copies
    its chunks out of the process's one staging pool and is written into the
    process's one landing pool. Run with pools of a few slots and zero copy
    off, three groups' allreduces from three threads at once compete for them
    (a group that finds no staging slot waits for another group's completion; a
    peer that can be granted no open landing slot goes on through the slot
    reserved for it): exact sums,
    the process registers each pool once (the landing pool grows by each
    extra group's reservation only), and no group's counter includes them.
    The groups are then destroyed mid-life of the pools; the world group
    still gets every slot back (a leaked slot would stall its chunks)."""
    groups = [dist.new_group(list(range(world))) for _ in range(threads)]
    errors = []

    def work(g, k):
        try:
            for i in range(rounds):
                _check_allreduce(g, range(world), rank, n=(1 << 16) + 1000 * k + i)  # many chunks each
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    ts = [threading.Thread(target=work, args=(g, k)) for k, g in enumerate(groups)]
    for t in ts:
        t.start()
    for i in range(rounds):
        _check_allreduce(None, range(world), rank, n=(1 << 15) + i)
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a group's thread did not finish"
    if errors:
        raise errors[0]
    stats = roce_pg._C._runtime_stats()
    own = [roce_pg.counters(g)["registered_bytes"] for g in groups]
    out = {"waits": sum(roce_pg.counters(g)["staging_waits"] for g in groups),
           "landing_waits": sum(roce_pg.counters(g)["landing_waits"] for g in [None, *groups]),
           "landing": stats["verbs_landing_bytes"],
           "landing_formula": roce_pg._C.verbs_landing_bytes(world - 1)
           + threads * roce_pg._C.testing.verbs_reserved_bytes(world - 1),
           "staging": stats["verbs_staging_bytes"], "staging_formula": roce_pg._C.verbs_staging_bytes(world - 1),
           "own": own, "own_formula": [roce_pg._C.verbs_registered_bytes(roce_pg.counters(g)["connections"],
                                                                         routed=world - 1)
                                       - roce_pg._C.verbs_landing_bytes(world - 1)
                                       - roce_pg._C.verbs_staging_bytes(world - 1) for g in groups]}
    dist.barrier()
    for g in groups:
        dist.destroy_process_group(g)
    for i in range(rounds):
        _check_allreduce(None, range(world), rank, n=(1 << 16) + i)
    out["staging_after"] = roce_pg._C._runtime_stats()["verbs_staging_bytes"]
    out["landing_after"] = roce_pg._C._runtime_stats()["verbs_landing_bytes"]
    dist.barrier()
    return out


def watched_peers(rank, world, port):
    """Many groups in one process, over verbs: once a verbs connection is set
    up its socket is closed (the group's lifeline watches the peer over the
    link between the two processes instead), so a group whose rank talks to
    every other rank holds no descriptor per peer. Then rank 2, outside
    rank 0's ring neighbours (1 and 3), destroys the group: rank 0's receive
    from it fails at once naming rank 2, as the socket's EOF did; the world
    group keeps working."""
    from .api_workers import expect_error

    links_before = roce_pg._C._runtime_stats()["process_links"]
    fds_before = _cost()["fds"]
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=120))
    # Every rank talks to every other on g.
    got = {p: torch.empty(4096, dtype=torch.int64) for p in range(world) if p != rank}
    ops = [dist.P2POp(dist.isend, torch.full((4096,), rank * 100 + p, dtype=torch.int64), p, group=g)
           for p in got]
    ops += [dist.P2POp(dist.irecv, t, p, group=g) for p, t in got.items()]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for p, t in got.items():
        assert torch.equal(t, torch.full((4096,), p * 100 + rank, dtype=torch.int64)), (p, t[:2])
    out = {"connections": roce_pg.counters(g)["connections"], "fds_added": _cost()["fds"] - fds_before,
           "links_added": roce_pg._C._runtime_stats()["process_links"] - links_before}
    _store_barrier("watched-connected", world)
    if rank == 2:
        dist.destroy_process_group(g)
    _store_barrier("watched-destroyed", world)
    if rank == 0:
        start = time.monotonic()
        out["msg"] = expect_error(lambda: dist.recv(torch.ones(1 << 16), 2, group=g), "rank 2", "left")
        out["elapsed"] = time.monotonic() - start
    _check_allreduce(None, range(world), rank)
    dist.barrier()
    return out


def split(rank, world, port):
    """torch.distributed.split_group over a roce world group: the halves form
    from the world's roster (no store operation of their own), exact sums;
    a second split of a split group works the same way."""
    halves = [list(range(world // 2)), list(range(world // 2, world))]
    g = dist.split_group(split_ranks=halves)
    mine = halves[0] if rank in halves[0] else halves[1]
    assert dist.get_process_group_ranks(g) == mine, (dist.get_process_group_ranks(g), mine)
    _check_allreduce(g, mine, rank)
    out = {"ops": _formation_ops(g)}
    pairs = [[0], [1]]  # group ranks of the half: each rank alone
    solo = dist.split_group(parent_pg=g, split_ranks=pairs)
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, group=solo)
    assert t.item() == rank + 1, t
    dist.barrier()
    return out


def settings_mismatch(rank, world, port):
    """tests/algorithm_workers.py's mismatch check on a subgroup of every rank."""
    from tests.algorithm_workers import _check_settings_mismatch
    from tests.reference import Checker

    ck = Checker(rank)
    _check_settings_mismatch(ck, rank, list(range(world)))
    return {"checks": ck.checks, "failures": ck.failures}


def _exchange_with_every_peer(group, salt, rank, world, mib):
    """Sends `mib` MiB to every other rank of `group` and receives as much
    from each at once; exact int64 values naming sender, receiver and salt."""
    n = mib * (1 << 20) // 8
    got = {p: torch.empty(n, dtype=torch.int64) for p in range(world) if p != rank}
    ops = [dist.P2POp(dist.isend, torch.arange(n, dtype=torch.int64) * (rank + 1) + salt * 100 + p, p, group=group)
           for p in got]
    ops += [dist.P2POp(dist.irecv, t, p, group=group) for p, t in got.items()]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for p, t in got.items():
        expected = torch.arange(n, dtype=torch.int64) * (p + 1) + salt * 100 + rank
        assert torch.equal(t, expected), (salt, p, t[:3], expected[:3])


def _in_threads(fn, count):
    """fn(i) for i < count, each on its own thread at once; re-raises the
    first failure."""
    errors = []

    def run(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a thread did not finish"
    if errors:
        raise errors[0]


def first_contact_race(rank, world, port, threads=6):
    """Many groups in one process, over TCP: `threads` groups make their first
    contact with every peer process at the same moment, from their own threads
    (the world group has not talked yet). One group of a process dials each
    peer process and the others wait for its connection, so a pair of processes
    ends with one socket, or two when their dials cross from different
    groups."""
    groups = [dist.new_group(list(range(world))) for _ in range(threads)]
    _store_barrier("race-created", world)
    before = roce_pg._C._runtime_stats()["tcp_sockets"]
    _in_threads(lambda i: _exchange_with_every_peer(groups[i], i + 1, rank, world, 1), threads)
    _store_barrier("race-done", world)
    out = {"sockets_before": before, "sockets_after": roce_pg._C._runtime_stats()["tcp_sockets"],
           "dials": sum(roce_pg.counters(g)["connections"] for g in groups)}
    dist.barrier()
    return out


def shared_connection(rank, world, port, threads=3, mib=3):
    """Many groups in one process, over TCP: every group of a process reaches a
    peer process over one connection (tcp_mux.hpp). The world group connects
    every pair; then `threads` groups exchange `mib` MiB with every peer from
    their own threads at once (chunks of all of them interleave on each socket,
    more than its buffer holds); a group's stream that starts before the
    receiving process created the group is parked and handed over; a destroyed
    group's peer hears it. Exact values throughout; no group after the world
    one dials."""
    from .api_workers import expect_error

    def exchange(group, salt):
        _exchange_with_every_peer(group, salt, rank, world, mib)

    exchange(None, 0)
    _store_barrier("shared-mesh", world)
    sockets = roce_pg._C._runtime_stats()["tcp_sockets"]
    groups = [dist.new_group(list(range(world))) for _ in range(threads)]

    def run(i):
        for rnd in range(2):
            exchange(groups[i], 1 + i * 2 + rnd)

    _in_threads(run, threads)
    out = {"sockets_after_mesh": sockets, "sockets_after_groups": roce_pg._C._runtime_stats()["tcp_sockets"],
           "group_connections": [roce_pg.counters(g)["connections"] for g in groups]}

    # Parked: rank 0 streams 4 MiB on `late` to rank 2 before rank 2 created
    # it (rank 2 is no lifeline neighbour of rank 0, whose first operation
    # on `late` waits only for its neighbours' settings); rank 2's world
    # group reads past those chunks to reach its allreduce's.
    big = torch.arange(1 << 19, dtype=torch.int64) * 3
    if rank == 2:
        time.sleep(0.5)
        _check_allreduce(None, range(world), rank)
        out["parked"] = roce_pg._C._runtime_stats()["tcp_parked_streams"]
        late = dist.new_group(list(range(world)))
        got = torch.empty_like(big)
        dist.recv(got, 0, group=late)
        assert torch.equal(got, big), got[:3]
    else:
        late = dist.new_group(list(range(world)))
        sender = None
        if rank == 0:
            sender = threading.Thread(target=lambda: dist.send(big, 2, group=late))
            sender.start()
            time.sleep(0.2)
        _check_allreduce(None, range(world), rank)
        if sender:
            sender.join(timeout=120)
            assert not sender.is_alive()
    _store_barrier("shared-parked", world)

    # Gone: rank 1 destroys a group it never used. Rank 0's data to it is
    # answered GONE; so is rank 0's stream when it only receives (attaching
    # it tells the peer's process: OPEN). Either way rank 0's receive fails
    # naming rank 1 instead of waiting for the group's timeout.
    def gone(name, send_first):
        unused = dist.new_group([0, 1])
        if rank == 1:
            dist.destroy_process_group(unused)
        _store_barrier(name, world)
        if rank == 0:
            start = time.monotonic()
            if send_first:
                try:
                    dist.send(torch.ones(8), 1, group=unused)
                except Exception:  # noqa: BLE001  (either call may be the one to learn it)
                    pass
            out[name] = expect_error(lambda: dist.recv(torch.ones(8), 1, group=unused), "rank 1",
                                     "destroyed the process group")
            out[name + "_s"] = time.monotonic() - start
        _store_barrier(name + "-seen", world)

    gone("gone", send_first=True)
    gone("gone_recv_only", send_first=False)
    _check_allreduce(None, range(world), rank)
    out["sockets_at_end"] = roce_pg._C._runtime_stats()["tcp_sockets"]
    dist.barrier()
    return out


# --- shrink_group (torch >= 2.15) ---------------------------------------------


def shrink_after_a_death(rank, world, port):
    """The last rank is SIGKILLed; the survivors' next allreduce fails, and
    shrink_group drops it: the new default group (formed from the old one's
    roster, no join) has world - 1 ranks and exact results."""
    import signal

    t = torch.ones(8)
    dist.all_reduce(t)
    dead = world - 1
    if rank == dead:
        _store_barrier("shrink-before-kill", world)
        os.kill(os.getpid(), signal.SIGKILL)
    _store_barrier("shrink-before-kill", world)
    try:
        for _ in range(50):  # until the death is seen
            dist.all_reduce(torch.ones(8), async_op=True).wait()
            time.sleep(0.1)
        failed = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        failed = str(e)
    start = time.monotonic()
    new = dist.shrink_group([dead])
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    return {"failed": failed, "size": dist.get_world_size(), "new_size": new.size(), "rank": dist.get_rank(),
            "exact": torch.equal(t, torch.full((1000,), float(sum(range(1, world))))),
            "shrink_to_result_s": time.monotonic() - start}


def shrink_abort_with_a_hung_rank(rank, world, port):
    """The last rank stays alive but never joins the next allreduce; the
    others shrink it away with SHRINK_ABORT, which fails their allreduce in
    flight, and the new group works."""
    from torch.distributed.distributed_c10d import SHRINK_ABORT

    store = dist.distributed_c10d._get_default_store()  # the world's: shrinking changes the default group's
    hung = world - 1
    if rank == hung:
        _store_barrier("shrink-done", world, store)  # stays out of every later call
        return {}
    work = dist.all_reduce(torch.ones(8), async_op=True)
    time.sleep(0.5)
    in_flight = not work.is_completed()
    new = dist.shrink_group([hung], shrink_flags=SHRINK_ABORT)
    try:
        work.wait()
        aborted = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        aborted = str(e)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t, group=new)
    _store_barrier("shrink-done", world, store)
    return {"in_flight": in_flight, "aborted": aborted, "new_size": new.size(),
            "exact": torch.equal(t, torch.full((1000,), float(sum(range(1, world)))))}


def _leftover_segments(prefix="roce_pg."):
    """This user's /dev/shm segments of `prefix` whose creator's lock is free
    (csrc/transport/shm/shm_segment.hpp): left by a process that is gone."""
    import fcntl

    left = []
    for name in os.listdir("/dev/shm"):
        if not (name.startswith(prefix) and name.endswith(".lk")):
            continue
        try:
            fd = os.open(os.path.join("/dev/shm", name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # unlinked meanwhile
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            left.append(name)
        except BlockingIOError:
            pass  # its creator lives
        finally:
            os.close(fd)
    return left


def killed_while_forming_shm(rank, world, port):
    """The last rank SIGKILLs itself right after publishing its group's
    shared-memory segment (ROCE_PG_TEST_FAULT=die_forming_shm), before its
    peers mapped it. The survivors' formation fails, naming the wait; the
    dead rank's segment is gone from /dev/shm once it has."""
    try:
        dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=10 if rank == 0 else 6))
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"error": str(e), "leftovers": _leftover_segments()}


def settings_lost_on_the_way(rank, world, port):
    """A subgroup whose rank 1 never sends its first settings record
    (ROCE_PG_TEST_FAULT=lost_settings on that rank): its neighbours'
    heartbeats say they lack them, rank 1 sends them again, and the first
    allreduce is exact, long before the subgroup's 60 s timeout."""
    start = time.monotonic()
    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=60))
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x, group=group)
    out = {"exact": bool(torch.equal(x, torch.full((1000,), float(sum(range(1, world + 1)))))),
           "seconds": time.monotonic() - start}
    dist.destroy_process_group(group)
    return out
