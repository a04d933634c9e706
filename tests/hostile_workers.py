"""Rank functions for tests/test_hostile_peers.py: someone who can reach a
rank's listener and knows roce's wire format (no nonce, no store access)
sends it well-formed records. Without the job secret nothing gets past the
front desk; the budgets behind it are tested as an insider who holds the
secret would attack (JOB_SECRET, which the tests set as ROCE_PG_JOB_SECRET).
Measured in the attacked rank's own process."""
import os
import socket
import struct
import time

import torch
import torch.distributed as dist

from .support.attacker import (BYE, FAIL, GONE, HELLO_VERSION, IDENTITY, MAC_BYTES, MAX_TEXT, RECORD, STATE,
                               data_hello, flood, process_link, record, refusal)
from .support.proc_counts import rss_kib
from .support.ranks import store_wait


def _exact_after_the_attack(rank, world):
    """The group's next allreduce, once every rank is past the attack: exact?"""
    dist.barrier()
    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x)
    return bool(torch.equal(x, world * torch.arange(1000, dtype=torch.float64) + sum(range(world))))


def _exact_in_a_new_group(rank, world):
    """A group formed now (its lifelines' settings may park at rank 0): its
    first allreduce exact? Within 60 s, not the default timeout, where its
    records were dropped."""
    from datetime import timedelta

    group = dist.new_group(list(range(world)), timeout=timedelta(seconds=60))
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x, group=group)
    exact = bool(torch.equal(x, torch.full((1000,), float(sum(range(1, world + 1))))))
    dist.destroy_process_group(group)
    return exact


def _settled(keys, timeout_s=60, until=None):
    """The runtime stats once `keys` stop changing (the runtime thread has
    read everything sent). `until(stats)`: what must hold first, for an
    attack whose first effect may come later than half a second on a loaded
    machine (before it, the keys are as stable as they were)."""
    import roce_pg

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        stats = roce_pg._C._runtime_stats()
        now = tuple(stats[k] for k in keys)
        if now == last and (until is None or until(stats)):
            return stats
        last = now
        time.sleep(0.5)
    return stats


def _grew_by(before, keys, n):
    """For _settled: the `keys` together grew by at least `n` since `before`
    (each of n connections is counted by one of them)."""
    return lambda s: sum(s[k] - before[k] for k in keys) >= n


def _all_dials_seen(before, dials):
    """Every one of `dials` links is held or was refused."""
    return _grew_by(before, ("process_links", "links_refused"), dials)


def parked_record_flood(rank, world, port, text_bytes=MAX_TEXT):
    """Rank 0 is flooded with 64 MB of well-formed records for 64 groups that
    do not exist, on a link no group of rank 0 asked for. Its parked records
    stay within the others' half of the process budget, its RSS grows by far
    less than what was sent, the group's next allreduce is exact, and so is
    the first of a group formed after the flood (whose records from rank 1
    park in the half kept for known peers). Empty texts: the most records,
    where bookkeeping is the cost."""
    import roce_pg

    C = roce_pg._C
    out = {}
    dist.all_reduce(torch.ones(1 << 16))  # the group's buffers exist before the baseline
    if rank == 0:
        rss0 = rss_kib()
        before = C._runtime_stats()
        out["sent"] = flood(before["listen_port"], groups=64, megabytes=64, text_bytes=text_bytes)
        # Every record read (parked or dropped) before going on: on a loaded
        # machine the runtime thread may still work through the flood when
        # the next group forms, and take rank 1's records after the mailbox
        # opened (nothing parks then).
        records = out["sent"] // (RECORD.size + MAC_BYTES + text_bytes)
        stats = _settled(("link_parked_bytes", "link_records_dropped"),
                         until=_grew_by(before, ("link_records_parked", "link_records_dropped"), records))
        out["stats"] = {k: v for k, v in stats.items() if k.startswith("link_")}
        out["rss_growth_kib"] = rss_kib() - rss0
    out["exact"] = _exact_after_the_attack(rank, world)
    parked = C._runtime_stats()["link_records_parked"]
    out["new_group_exact"] = _exact_in_a_new_group(rank, world)
    out["new_group_parked"] = C._runtime_stats()["link_records_parked"] - parked
    return out


def unnamed_links(rank, world, port):
    """Rank 0 is dialed 200 times on its process-link key by someone who
    never names a process, then once by someone who sends records before
    naming one, then once by someone who names two: at most 64 unnamed links
    are held at once (the oldest go), the one sending records and the one
    renaming itself are closed, and the group's allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    if rank == 0:
        listen = C._runtime_stats()["listen_port"]
        before = _settled(("process_links", "links_refused"))
        socks = [process_link(listen, name=None) for _ in range(200)]
        held = _settled(("process_links", "links_refused"), until=_all_dials_seen(before, 200))
        with process_link(listen, name=None) as s:
            s.sendall(record(BYE, b"bye", 0, 0x5EED, 1))
            after_records = _settled(("process_links", "links_refused", "link_parked_groups"),
                                     until=_all_dials_seen(held, 1))
        # Named twice: a second name would have made the link the one this
        # process sends on to two processes.
        with process_link(listen, name=b"first/127.0.0.1:1") as s:
            s.sendall(record(IDENTITY, b"second"))
            after_renaming = _settled(("process_links", "links_refused"), until=_all_dials_seen(after_records, 1))
        for s in socks:
            s.close()
        out = {"before": before["process_links"], "held": held["process_links"],
               "refused": held["links_refused"] - before["links_refused"],
               "refused_after_records": after_records["links_refused"] - held["links_refused"],
               "refused_after_renaming": after_renaming["links_refused"] - after_records["links_refused"],
               "parked_groups": after_records["link_parked_groups"]}
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def links_under_made_up_names(rank, world, port):
    """Rank 0 is dialed 200 times by an insider, each link naming another
    made-up process: no group of rank 0 links to any of them, so at most 64
    are held (the rest refused as they name themselves), and the group's
    allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    if rank == 0:
        listen = C._runtime_stats()["listen_port"]
        before = _settled(("process_links", "links_refused"))
        socks = [process_link(listen, name=f"made-up-{i}/127.0.0.1:{i}".encode()) for i in range(200)]
        after = _settled(("process_links", "links_refused"), until=_all_dials_seen(before, 200))
        for s in socks:
            s.close()
        out = {"held": after["process_links"] - before["process_links"],
               "refused": after["links_refused"] - before["links_refused"]}
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def names_that_do_not_fit_their_address(rank, world, port):
    """An insider dials rank 0 from 127.0.0.2 naming rank 1's process (the
    takeover a link named by anyone allowed: rank 0's records for rank 1
    would have gone to it), and from 127.0.0.1 naming a process of another
    machine: both are refused with a record that says why, and the group's
    allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    if rank == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        listen = C._runtime_stats()["listen_port"]
        before = _settled(("process_links", "links_refused"))
        counted_before = roce_pg.counters()["net_links_refused"]
        with process_link(listen, name=backend._process_keys()[1].encode(), source="127.0.0.2") as s:
            out["hijack"] = refusal(s).decode()
        with process_link(listen, name=b"elsewhere/10.9.9.9:1") as s:
            out["elsewhere"] = refusal(s).decode()
        after = _settled(("process_links", "links_refused"))
        out["refused"] = after["links_refused"] - before["links_refused"]
        out["counted"] = roce_pg.counters()["net_links_refused"] - counted_before
        out["held"] = after["process_links"] - before["process_links"]
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def a_record_not_signed_with_the_secret(rank, world, port):
    """An insider's link to rank 0 (signed hello, signed name) then carries a
    record whose MAC is another secret's, as bytes injected into an
    established connection would: the link is closed at that record, which
    is counted, and the group's allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    if rank == 0:
        before = _settled(("process_links", "link_records_forged"))
        with process_link(C._runtime_stats()["listen_port"]) as s:
            s.sendall(record(STATE, b"injected", 0, 0x5EED, 1, secret="not-the-job's"))
            s.settimeout(10)
            out["closed"] = s.recv(16) == b""
        after = _settled(("process_links", "link_records_forged"))
        out["forged"] = after["link_records_forged"] - before["link_records_forged"]
        out["held"] = after["process_links"] - before["process_links"]
        out["parked"] = after["link_parked_groups"]
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def a_hello_of_another_version(rank, world, port):
    """A data hello of the previous protocol version (unsigned, as that
    version sent it) gets the answer OtherVersion with this side's version,
    is counted, and the group's allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    if rank == 0:
        before = _settled(("connections_other_version",))["connections_other_version"]
        with socket.create_connection(("127.0.0.1", C._runtime_stats()["listen_port"])) as s:
            s.sendall(data_hello(HELLO_VERSION - 1, secret=None))
            s.settimeout(10)
            out["answer"] = struct.unpack("<IHH", s.recv(8))
        out["counted"] = _settled(("connections_other_version",))["connections_other_version"] - before
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def where_a_rank_listens(rank, world, port):
    """The addresses rank 0 listens on (its advertised one and 127.0.0.1,
    not every interface), and what a dial to 127.0.0.2, which no peer uses,
    gets: refused."""
    import errno

    import roce_pg

    from .support.proc_counts import listening_addresses

    out = {}
    if rank == 0:
        listen = roce_pg._C._runtime_stats()["listen_port"]
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        key = backend._process_keys()[0]
        out["advertised"] = key[key.rindex("/") + 1:key.rindex(":")]
        out["addresses"] = listening_addresses(listen)
        try:
            socket.create_connection(("127.0.0.2", listen), timeout=5).close()
            out["other_loopback"] = "connected"
        except OSError as e:
            out["other_loopback"] = "refused" if e.errno == errno.ECONNREFUSED else str(e)
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def records_speaking_for_another_process(rank, world, port):
    """An insider knows the group's nonces (rank 0's, rank 1's) and opens a
    process link to rank 0 under a name of its own, then sends what would
    end rank 0's group if rank 1 had sent it: a FAIL naming rank 1 and a
    GONE for rank 1's group. Rank 0's lifeline takes rank 1's records only
    from rank 1's process: both are refused and counted, and the group's
    next allreduce is exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    dist.all_reduce(torch.ones(16))
    if rank == 0:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        mine, peer = backend._nonces()[:2]
        keys = ("link_records_misrouted",)
        before = _settled(keys)
        text = b"rank 1 (host elsewhere) failed: made up by an insider"
        with process_link(C._runtime_stats()["listen_port"], name=b"insider/127.0.0.1:1") as s:
            s.sendall(record(FAIL, text, 1, mine, peer))
            s.sendall(record(GONE, b"", -1, mine, peer))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the lifeline reads them at its next tick
                after = C._runtime_stats()
                if after["link_records_misrouted"] - before["link_records_misrouted"] >= 2:
                    break
                time.sleep(0.2)
        out["misrouted"] = after["link_records_misrouted"] - before["link_records_misrouted"]
        out["counted"] = roce_pg.counters()["net_records_misrouted"]
    out["exact"] = _exact_after_the_attack(rank, world)
    return out


def stranger_without_the_secret(rank, world, port, dump_dir=None):
    """Rank 0 is dialed by someone who signs with another secret: a process
    link that would flood 16 MB of records, and a hello for a data
    connection (a made-up group's nonce, which would otherwise be parked). Both are closed at the front
    desk, unread: nothing is parked, no link is held, the refusals are
    counted (in roce_pg.counters() and, from the trace dumps, by the doctor),
    and the group's allreduce is exact."""
    import roce_pg

    out = {}
    dist.all_reduce(torch.ones(1 << 16))
    if rank == 0:
        keys = ("connections_unauthenticated", "process_links", "link_parked_bytes", "parked")
        before = _settled(keys)
        rss0 = rss_kib()
        out["sent"] = flood(before["listen_port"], groups=8, megabytes=16, text_bytes=MAX_TEXT, secret="not-the-job's")
        with socket.create_connection(("127.0.0.1", before["listen_port"])) as s:
            s.sendall(data_hello(secret="not-the-job's"))
            s.settimeout(10)
            out["data_hello_answer"] = s.recv(16)  # b"": closed without a word
        after = _settled(keys)
        out["refused"] = after["connections_unauthenticated"] - before["connections_unauthenticated"]
        out["links"] = after["process_links"] - before["process_links"]
        out["parked_bytes"] = after["link_parked_bytes"] - before["link_parked_bytes"]
        out["parked"] = after["parked"] - before["parked"]
        out["rss_growth_kib"] = rss_kib() - rss0
        out["counted"] = roce_pg.counters()["net_unauthenticated"]
    out["exact"] = _exact_after_the_attack(rank, world)
    if dump_dir:  # what the doctor's trace view reads
        roce_pg.dump_trace(os.path.join(dump_dir, f"roce_trace_{rank}_world.json"))
    return out


def form_and_report(rank, world, port):
    """Forms the group itself: {"error": None, ...} when it formed and an
    allreduce was exact, else the error text. Rank 0 hosts the store and
    waits longest (10 s, the others 5 s), so that the others' errors are
    their own. Also: whether the job's store holds a secret, and whether
    this rank's listener refuses a hello signed under an empty key (the
    unkeyed MAC of a process that adopted no secret)."""
    from datetime import timedelta

    import roce_pg

    try:
        dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=10 if rank == 0 else 5))
        x = torch.ones(10)
        dist.all_reduce(x)
        assert torch.equal(x, torch.full((10,), float(world)))
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"error": str(e)}
    store = job = dist.distributed_c10d._get_default_store()
    while isinstance(job, dist.PrefixStore):  # the job's store, under no group's prefix
        job = job.underlying_store
    before = roce_pg._C._runtime_stats()
    with socket.create_connection(("127.0.0.1", before["listen_port"])) as s:
        s.sendall(data_hello(secret=""))
        s.settimeout(10)
        s.recv(16)
    refused = _settled(("connections_unauthenticated",))["connections_unauthenticated"]
    out = {"error": None, "store_holds_a_secret": job.check(["roce/job_secret"]),
           "unkeyed_refused": refused - before["connections_unauthenticated"]}
    store_wait(store, "formed-done", world)
    # Rank 0 hosts the store: it stays until every rank stopped polling it.
    store.add("formed-left", 1)
    if rank == 0:
        store_wait(store, "formed-left", world, arrive=False)
    dist.destroy_process_group()
    return out


def slowloris(rank, world, port, connections=300):
    """Rank 0's listener is dialed `connections` times from 127.0.0.2 by
    someone who never sends a byte: the desk holds at most 256 of them
    (per source address) and closes the rest unread; meanwhile a new group
    forms and its allreduce, whose connections come from 127.0.0.1, is
    exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    store = dist.distributed_c10d._get_default_store()
    socks = []
    if rank == 0:
        listen = C._runtime_stats()["listen_port"]
        before = _settled(("connections_refused_busy", "pending_heads"))
        for _ in range(connections):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", listen))
            socks.append(s)
        keys = ("connections_refused_busy", "pending_heads")
        held = _settled(keys, until=_grew_by(before, keys, connections))
        out["pending"] = held["pending_heads"] - before["pending_heads"]
        out["refused"] = held["connections_refused_busy"] - before["connections_refused_busy"]
    store_wait(store, "slowloris-holding", world)
    out["new_group_exact"] = _exact_in_a_new_group(rank, world)
    out["exact"] = _exact_after_the_attack(rank, world)
    for s in socks:
        s.close()
    return out
