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
LINK_MAGIC, BYE, FAIL, STATE = 0x4C494E4B, 2, 3, 4
MAX_TEXT = 4096


def _rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _flood(port, groups, megabytes):
    """A process link to this rank's listener, then records with full texts
    for `groups` nonces nobody created, from ever new senders: the records a
    group keeps until it is created (BYE and FAIL were kept without limit)."""
    text = b"x" * MAX_TEXT
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(HELLO.pack(HELLO_MAGIC, HELLO_VERSION, KIND_PROCESS, -1, 0, 0, PROCESS_LINKS_KEY))
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


def parked_record_flood(rank, world, port):
    """Rank 0 is flooded with 64 MB of well-formed records for 64 groups that
    do not exist. Its parked records stay within the process budget, its RSS
    grows by far less than what was sent, and the group's next allreduce is
    exact."""
    import roce_pg

    C = roce_pg._C
    out = {}
    dist.all_reduce(torch.ones(1 << 16))  # the group's buffers exist before the baseline
    if rank == 0:
        rss0 = _rss_kib()
        out["sent"] = _flood(C._runtime_stats()["listen_port"], groups=64, megabytes=64)
        # The runtime thread reads the link: wait until it has taken everything.
        deadline, last = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            stats = C._runtime_stats()
            now = (stats["link_parked_bytes"], stats["link_records_dropped"])
            if now == last:
                break
            last = now
            time.sleep(0.5)
        out["stats"] = {k: v for k, v in C._runtime_stats().items() if k.startswith("link_")}
        out["rss_growth_kib"] = _rss_kib() - rss0
    dist.barrier()
    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x)
    out["exact"] = bool(torch.equal(x, world * torch.arange(1000, dtype=torch.float64) + sum(range(world))))
    return out
