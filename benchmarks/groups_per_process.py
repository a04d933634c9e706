"""What each extra process group costs a rank: file
descriptors, threads, listening TCP ports, RSS and verbs-registered bytes
per rank after 1, 4, 16 and 64 groups, each formed over every rank with one
allreduce in it (as a 3-D-parallel job's DeviceMesh and new_group calls do).

    PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/groups_per_process.py \\
        [--ranks 4] [--groups 1 4 16 64] [--transport tcp|verbs] [--backend roce|gloo]

By default each rank is its own simulated machine (ROCE_PG_FORCE_NETWORK=1)
so every peer is reached over the network transport, as on a cluster; with
--transport verbs it needs an RDMA device (the Soft-RoCE VM). Counts are
read from /proc/self (fd, task, net/tcp{,6} LISTEN sockets whose inodes the
process holds), from statvfs("/dev/shm") (devshm_kib: the whole
machine's, every rank's shared-memory segments) and from roce's counters (registered_bytes, summed over the
groups, plus the landing and staging pools the process's groups share; devices: verbs
device contexts the process holds). Printed: the
maximum over ranks, and per extra group the growth from the first to the
last point.
"""
import argparse
import os
import sys

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.proc_counts import devshm_kib, listening_ports  # noqa: E402
from tests.support.ranks import run_group  # noqa: E402


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _snapshot(groups, backend):
    registered = devices = 0
    if backend == "roce":
        import roce_pg

        stats = roce_pg._C._runtime_stats()
        registered = (sum(roce_pg.counters(g)["registered_bytes"] for g in groups)
                      + stats["verbs_landing_bytes"] + stats["verbs_staging_bytes"])
        devices = stats["verbs_devices"]  # RDMA device contexts this process holds
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "listen": listening_ports(), "rss_kib": _rss_kib(), "registered": registered, "devices": devices,
            "devshm_kib": devshm_kib()}


def rank_main(rank, world, port, args):
    """{groups: _snapshot} at each point of --groups, for this rank."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch
    import torch.distributed as dist

    dist.init_process_group(args.backend, rank=rank, world_size=world)
    groups, points = [dist.group.WORLD], {}
    t = torch.ones(1024)
    dist.all_reduce(t)
    for target in sorted(args.groups):
        while len(groups) - 1 < target:
            g = dist.new_group(list(range(world)))
            dist.all_reduce(t, group=g)
            groups.append(g)
        dist.barrier()
        points[target] = _snapshot(groups, args.backend)
    dist.destroy_process_group()
    return points


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--groups", type=int, nargs="+", default=[1, 4, 16, 64], help="extra groups per point")
    p.add_argument("--transport", choices=["tcp", "verbs"], default="tcp")
    p.add_argument("--backend", choices=["roce", "gloo"], default="roce")
    p.add_argument("--local", action="store_true", help="ranks share memory as one machine (roce only)")
    args = p.parse_args()
    env = {}
    if args.backend == "roce" and not args.local:  # every peer over the network transport
        env = {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": args.transport}
    results = run_group("benchmarks.groups_per_process.rank_main", args.ranks, env=env, init=False,
                        deadline_s=1800, kwargs={"args": args})
    keys = ["fds", "threads", "listen", "rss_kib", "registered", "devices", "devshm_kib"]
    where = "one machine" if args.local else f"each its own machine, {args.transport}"
    print(f"# {args.backend}: {args.ranks} ranks ({where}); per rank, maximum over ranks, "
          "after the world group plus N groups")
    print("  N groups  " + "  ".join(f"{k:>12s}" for k in keys))
    points = sorted(args.groups)
    for n in points:
        row = [max(r[n][k] for r in results) for k in keys]
        print(f"  {n:8d}  " + "  ".join(f"{v:12d}" for v in row))
    if len(points) > 1:
        lo, hi = points[0], points[-1]
        per = [(max(r[hi][k] for r in results) - max(r[lo][k] for r in results)) / (hi - lo)
               for k in keys]
        print("  per group " + "  ".join(f"{v:12.1f}" for v in per))


if __name__ == "__main__":
    main()
