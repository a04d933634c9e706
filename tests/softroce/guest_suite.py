"""Runs inside one Soft-RoCE VM (scripts/softroce/run_vm.sh): the collective
matrix with every peer over the verbs transport on rxe0, with torch imported
once and the ranks forked from this process. Proves the bytes went through
the RDMA device with rxe's packet counters. Writes a JSON report to argv[1].

    python -m tests.softroce.guest_suite OUT.json verbs2 verbs4
"""
import json
import os
import sys
import time
import traceback

import torch  # noqa: F401  (imported once; forked ranks inherit it)

import roce_pg  # noqa: F401

from tests.harness import LAYOUTS, run_group
from tests.softroce.rxe_counters import sent_packets

MTU = 1024  # rxe on a dummy netdev; one packet carries at most MTU payload bytes


def main():
    out, layouts = sys.argv[1], sys.argv[2:]
    # No verbs call in this process before the ranks are forked (ibv_fork_init
    # must precede them): the ports are listed at the end.
    report = {"layouts": {}}
    ok = True
    for name in layouts:
        world, env = LAYOUTS[name]
        t0, before = time.time(), sent_packets()
        entry = {}
        try:
            results = run_group("tests.matrix.run", world, env=env, start_method="fork", deadline_s=3000)
            entry["checks"] = [r["checks"] for r in results]
            entry["failures"] = [f for r in results for f in r["failures"]][:40]
            # A known transfer on top: an 8 MiB allreduce moves at least
            # 2 (n-1)/n * 8 MiB per rank over the ring.
            pkts0 = sent_packets()
            big = run_group("tests.softroce.guest_suite.big_allreduce", world, env=env, start_method="fork")
            entry["big_allreduce_ok"] = all(big)
            entry["big_allreduce_packets"] = sent_packets() - pkts0
            entry["big_allreduce_min_packets"] = int(2 * (world - 1) / world * (8 << 20) * world / MTU)
        except Exception:  # noqa: BLE001
            entry["error"] = traceback.format_exc()[-4000:]
        entry["packets"] = sent_packets() - before
        entry["seconds"] = round(time.time() - t0, 1)
        passed = ("error" not in entry and not entry["failures"] and min(entry["checks"]) > 1000 and
                  entry["big_allreduce_ok"] and entry["big_allreduce_packets"] >= entry["big_allreduce_min_packets"])
        entry["passed"] = passed
        ok &= passed
        report["layouts"][name] = entry
        print(f"[guest] {name}: {'PASS' if passed else 'FAIL'} {json.dumps(entry)[:600]}", flush=True)
    report["ports"] = roce_pg.rdma_ports()
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    sys.exit(0 if ok else 1)


def big_allreduce(rank, world, port):
    import torch.distributed as dist

    t = torch.full(((8 << 20) // 4,), float(rank + 1))
    dist.all_reduce(t)
    return bool(torch.all(t == world * (world + 1) / 2))


if __name__ == "__main__":
    main()
