"""Rank functions for tests/test_hostile_peers.py: someone who can reach a
rank's listener and knows only roce's wire format (no nonce, no store access)
sends it well-formed records. Measured in the attacked rank's own process."""
import socket
import struct
import time

import torch
import torch.distributed as dist

# The wire format as csrc/runtime/hello.hpp and process_links.cpp define it.
HELLO = struct.Struct("<IHHiiQQ")      # magic, version, kind, src, dst, srcNonce, dstNonce
RECORD = struct.Struct("<IHHiIQQ")     # magic, type, len, srcRank, reserved, dstNonce, srcNonce
HELLO_MAGIC, HELLO_VERSION, KIND_PROCESS = 0x526F4345, 5, 5
PROCESS_LINKS_KEY = 0x70726F636C696E6B  # "proclink"
LINK_MAGIC, BYE, FAIL, STATE, IDENTITY = 0x4C494E4B, 2, 3, 4, 0x100
MAX_TEXT = 4096


def _rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _process_link(port, name=b"stranger"):
    """A process link to this rank's listener; `name`: the process key it
    claims (None: it names none)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(HELLO.pack(HELLO_MAGIC, HELLO_VERSION, KIND_PROCESS, -1, 0, 0, PROCESS_LINKS_KEY))
    if name is not None:
        s.sendall(RECORD.pack(LINK_MAGIC, IDENTITY, len(name), -1, 0, 0, 0) + name)
    return s


def _settled(keys, timeout_s=60):
    """The runtime stats once `keys` stop changing (the runtime thread has
    read everything sent)."""
    import roce_pg

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        stats = roce_pg._C._runtime_stats()
        now = tuple(stats[k] for k in keys)
        if now == last:
            return stats
        last = now
        time.sleep(0.5)
    return stats


def _flood(port, groups, megabytes, text_bytes):
    """A process link naming a made-up process, then records with texts of
    `text_bytes` for `groups` nonces nobody created, from ever new senders:
    the records a group keeps until it is created (BYE and FAIL were kept
    without limit)."""
    text = b"x" * text_bytes
    sent = 0
    with _process_link(port) as s:
        batch, sender = [], 0
        while sent < megabytes << 20:
            for kind in (BYE, FAIL, STATE):
                nonce = 0x5EED0000 + sender % groups
                batch.append(RECORD.pack(LINK_MAGIC, kind, len(text), sender, 0, nonce, sender) + text)
            sender += 1
            if len(batch) >= 64:
                chunk = b"".join(batch)
                s.sendall(chunk)
                sent += len(chunk)
                batch = []
    return sent


def parked_record_flood(rank, world, port, text_bytes=MAX_TEXT):
    """Rank 0 is flooded with 64 MB of well-formed records for 64 groups that
    do not exist. Its parked records stay within the process budget, its RSS
    grows by far less than what was sent, and the group's next allreduce is
    exact. Empty texts: the most records, where bookkeeping is the cost."""
    import roce_pg

    C = roce_pg._C
    out = {}
    dist.all_reduce(torch.ones(1 << 16))  # the group's buffers exist before the baseline
    if rank == 0:
        rss0 = _rss_kib()
        out["sent"] = _flood(C._runtime_stats()["listen_port"], groups=64, megabytes=64,
                            text_bytes=text_bytes)
        stats = _settled(("link_parked_bytes", "link_records_dropped"))
        out["stats"] = {k: v for k, v in stats.items() if k.startswith("link_")}
        out["rss_growth_kib"] = _rss_kib() - rss0
    dist.barrier()
    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x)
    out["exact"] = bool(torch.equal(x, world * torch.arange(1000, dtype=torch.float64) + sum(range(world))))
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
        socks = [_process_link(listen, name=None) for _ in range(200)]
        held = _settled(("process_links", "links_refused"))
        with _process_link(listen, name=None) as s:
            s.sendall(RECORD.pack(LINK_MAGIC, BYE, 3, 0, 0, 0x5EED, 1) + b"bye")
            after_records = _settled(("process_links", "links_refused", "link_parked_groups"))
        # Named twice: a second name would have made the link the one this
        # process sends on to two processes.
        with _process_link(listen, name=b"first") as s:
            s.sendall(RECORD.pack(LINK_MAGIC, IDENTITY, 6, -1, 0, 0, 0) + b"second")
            after_renaming = _settled(("process_links", "links_refused"))
        for s in socks:
            s.close()
        out = {"before": before["process_links"], "held": held["process_links"],
               "refused": held["links_refused"] - before["links_refused"],
               "refused_after_records": after_records["links_refused"] - held["links_refused"],
               "refused_after_renaming": after_renaming["links_refused"] - after_records["links_refused"],
               "parked_groups": after_records["link_parked_groups"]}
    dist.barrier()
    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x)
    out["exact"] = bool(torch.equal(x, world * torch.arange(1000, dtype=torch.float64) + sum(range(world))))
    return out
