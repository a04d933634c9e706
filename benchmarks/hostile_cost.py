"""What each attack on a rank's listener costs the attacked rank, beside the
same measurements with no attack, in one run: the CPU time of its roce
threads, its resident memory, and the time from the attack's end to the
group's next exact allreduce and to a new group's first exact allreduce.

    .venv/bin/python benchmarks/hostile_cost.py [--repeats 3] [--attacks NAME ...]

Two ranks, each its own simulated machine over TCP, with a job secret, as
tests/test_hostile_peers.py runs them. The attacker runs in rank 0's
process (tests/support/attacker.py: well-formed hellos and process-link
records, signed with the job secret as an insider would, or with another as
a stranger would); only roce's own threads are counted (`roce-*`: runtime,
progress, workers), so the attacker's Python is not. Per attack and repeat:

  * cpu: what roce's threads of rank 0 spent from the attack's start until
    they stopped spending (read every 0.5 s), less the same for no attack;
  * rss: rank 0's resident memory after that, against before the attack;
  * next allreduce: from the attack's last byte (connections it holds stay
    open) to the existing group's next exact allreduce of 1,000 doubles,
    which rank 1 entered before the attack began;
  * new group: then, connections still held, a new group of both ranks
    forms (dist.new_group: its lifelines' first records pass rank 0's
    process links, where the floods park) and its first allreduce is
    exact: the time for both.

Printed: the median over the repeats (rss: the largest growth). Records
parked by a flood stay (30 minutes, or until the budget's half is full),
so a repeat of a flood meets the half already full: its CPU is then what
dropping, not keeping, costs, and its RSS does not grow again.
"""
import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support import attacker  # noqa: E402
from tests.support.layouts import TCP  # noqa: E402
from tests.support.ranks import run_group  # noqa: E402

TWO_MACHINES = {**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "1", "ROCE_PG_JOB_SECRET": attacker.JOB_SECRET}
OTHER_SECRET = "not-the-job's"


def _hold(socks):
    return lambda: [s.close() for s in socks]


def _stranger(listen, backend):
    attacker.flood(listen, groups=8, megabytes=16, text_bytes=attacker.MAX_TEXT, secret=OTHER_SECRET)
    import socket

    with socket.create_connection(("127.0.0.1", listen)) as s:
        s.sendall(attacker.data_hello(secret=OTHER_SECRET))
        s.settimeout(10)
        s.recv(16)


def _slowloris(listen, backend):
    import socket

    socks = []
    for _ in range(300):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", listen))
        socks.append(s)
    return _hold(socks)


def _flood(text_bytes):
    def attack(listen, backend):
        attacker.flood(listen, groups=64, megabytes=64, text_bytes=text_bytes)
    return attack


def _speaking_for_rank_1(listen, backend):
    mine, peer = backend._nonces()[:2]
    with attacker.process_link(listen, name=b"insider/127.0.0.1:1") as s:
        s.sendall(attacker.record(attacker.FAIL, b"rank 1 failed: made up", 1, mine, peer))
        s.sendall(attacker.record(attacker.GONE, b"", -1, mine, peer))


def _forged(listen, backend):
    with attacker.process_link(listen) as s:
        s.sendall(attacker.record(attacker.STATE, b"injected", 0, 0x5EED, 1, secret=OTHER_SECRET))
        s.settimeout(10)
        s.recv(16)


# name -> (what the table calls it, attack(listen_port, backend) -> None or a release callable)
ATTACKS = {
    "none": ("no attack", lambda listen, backend: None),
    "stranger": ("stranger, another secret: 16 MB of records, and a data hello", _stranger),
    "flood": ("insider: 64 MB of records (4 KiB texts) for 64 made-up groups", _flood(attacker.MAX_TEXT)),
    "flood-empty": ("insider: 64 MB of records without text for 64 made-up groups", _flood(0)),
    "unnamed-links": ("insider: 200 process links that never name a process",
                      lambda listen, backend: _hold([attacker.process_link(listen, name=None) for _ in range(200)])),
    "made-up-links": ("insider: 200 process links naming made-up processes",
                      lambda listen, backend: _hold([attacker.process_link(listen, f"made-up-{i}/127.0.0.1:{i}".encode())
                                                     for i in range(200)])),
    "slowloris": ("insider: 300 silent connections from 127.0.0.2", _slowloris),
    "speaking-for": ("insider: a FAIL and a GONE naming rank 1, with the group's nonces", _speaking_for_rank_1),
    "forged": ("insider's link, then a record signed with another secret", _forged),
}


def _roce_cpu_until_idle(timeout_s=60):
    """roce's threads' CPU seconds once they stop spending (two readings
    0.5 s apart that agree: the clock ticks are 10 ms)."""
    from tests.support.proc_counts import thread_cpu_seconds

    last, deadline = None, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = sum(thread_cpu_seconds())
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def _exact_allreduce(group, rank, world):
    import torch
    import torch.distributed as dist

    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x, group=group)
    return bool(torch.equal(x, world * torch.arange(1000, dtype=torch.float64) + sum(range(world))))


def rank_main(rank, world, port, attacks, repeats):
    import torch
    import torch.distributed as dist

    import roce_pg
    from tests.support.proc_counts import rss_kib

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    listen = roce_pg._C._runtime_stats()["listen_port"]
    dist.all_reduce(torch.ones(1 << 16))  # the group's connections and buffers exist before any baseline
    rows = []
    for _ in range(repeats):
        for name in attacks:
            dist.barrier()
            row = {"attack": name}
            release = None
            if rank == 0:
                cpu0, rss0 = _roce_cpu_until_idle(), rss_kib()
                release = ATTACKS[name][1](listen, backend)
                start = time.monotonic()
            exact = _exact_allreduce(None, rank, world)
            if rank == 0:
                row["next_s"] = time.monotonic() - start
                row["cpu_s"] = _roce_cpu_until_idle() - cpu0
                row["rss_kib"] = rss_kib() - rss0
                start = time.monotonic()
            group = dist.new_group([0, 1], timeout=timedelta(seconds=60))  # not a hang where records are dropped
            exact = _exact_allreduce(group, rank, world) and exact
            if rank == 0:
                row["new_group_s"] = time.monotonic() - start
            row["exact"] = exact
            if release:
                release()
            dist.destroy_process_group(group)
            rows.append(row)
    return {"rows": rows, "counters": {k: v for k, v in roce_pg.counters().items() if k.startswith("net_")}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    args = ap.parse_args()
    attacks = ["none"] + [a for a in args.attacks if a != "none"]
    res = run_group("benchmarks.hostile_cost.rank_main", 2, env=TWO_MACHINES, deadline_s=1800,
                    kwargs={"attacks": attacks, "repeats": args.repeats})
    rows = res[0]["rows"]
    if not all(r["exact"] for r in res[0]["rows"] + res[1]["rows"]):
        sys.exit(f"an allreduce after an attack was not exact: {res}")
    by = {a: [r for r in rows if r["attack"] == a] for a in attacks}
    idle_cpu = statistics.median(r["cpu_s"] for r in by["none"])
    print(f"# 2 ranks over TCP, each its own simulated machine; rank 0 attacked; {args.repeats} repeats, "
          f"interleaved; medians (rss: largest); cpu less no attack's {idle_cpu * 1e3:.0f} ms")
    print("| attack | rank 0's roce threads, CPU ms | RSS growth KiB | to the next exact allreduce, ms "
          "| to a new group's first exact allreduce, ms |")
    print("|---|---|---|---|---|")
    for a in attacks:
        cpu = statistics.median(r["cpu_s"] for r in by[a]) - (0 if a == "none" else idle_cpu)
        print(f"| {ATTACKS[a][0]} | {cpu * 1e3:.0f} | {max(r['rss_kib'] for r in by[a])} "
              f"| {statistics.median(r['next_s'] for r in by[a]) * 1e3:.1f} "
              f"| {statistics.median(r['new_group_s'] for r in by[a]) * 1e3:.1f} |")
    print(f"rank 0's refusal counters at the end: {res[0]['counters']}")


if __name__ == "__main__":
    main()
