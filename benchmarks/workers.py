"""Shared-memory collectives with 1, 2, ... worker threads per rank
(ROCE_PG_WORKERS), side by side with Gloo and, optionally, roce's old
point-to-point route: bus bandwidth and CPU seconds.

    PYTHONPATH=. python benchmarks/workers.py                     # 2 ranks, allreduce, workers 1 and 2
    PYTHONPATH=. python benchmarks/workers.py --ranks 4 --workers 1 2 4 --sizes 16 256
    PYTHONPATH=. python benchmarks/workers.py --ops allgather broadcast reduce_scatter --p2p

One group per worker count (the setting is read when a group is created),
with --p2p one more forcing the point-to-point algorithms over the
shared-memory rings (ROCE_PG_ALGO_ALLREDUCE=ring, ROCE_PG_ALGO_ALLGATHER=ring,
ROCE_PG_ALGO_BROADCAST=binomial, ROCE_PG_ALGO_REDUCE_SCATTER=ring; 1
worker), and one Gloo group live in the same ranks; for each collective and
size the groups take turns --rounds times, so all see the same machine
load, and each keeps its fastest round. The size is the float32 tensor per
rank: allreduce's and broadcast's tensor, allgather's output,
reduce_scatter's input. Per group and size: bus bandwidth (slowest rank;
nccl-tests' busbw: size x 2(n-1)/n per call for allreduce, (n-1)/n for
allgather and reduce_scatter, 1 for broadcast) and CPU seconds per GB per
rank: the process's CPU time (user + system, every thread: progress, pool
workers, helpers, Gloo's threads) during the timed calls, divided by the GB
of tensor, averaged over the ranks. More workers must not cost more CPU per
GB; they can only add bandwidth where the rank has idle cores.

The last line is the yardstick of this run: a plain 256 MiB tensor copy
(torch, one thread), all ranks copying at once, in GB/s per rank.
"""
import argparse
import json
import os
import sys
import time

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.ranks import run_group  # noqa: E402

MiB = 1 << 20


# busbw factor per collective for n ranks (nccl-tests' convention).
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
# The settings that force the point-to-point algorithms (--p2p).
P2P_SETTINGS = {"ROCE_PG_ALGO_ALLREDUCE": "ring", "ROCE_PG_ALGO_ALLGATHER": "ring",
                "ROCE_PG_ALGO_BROADCAST": "binomial", "ROCE_PG_ALGO_REDUCE_SCATTER": "ring"}


def call_for(dist, torch, op, size, world):
    """A function running one `op` on a size-byte float32 tensor in a group."""
    t = torch.ones(size // 4)
    if op == "allreduce":
        return lambda g: dist.all_reduce(t, group=g)
    if op == "broadcast":
        return lambda g: dist.broadcast(t, src=0, group=g)
    part = torch.ones(size // 4 // world)
    if op == "allgather":
        return lambda g: dist.all_gather_into_tensor(t[:part.numel() * world], part, group=g)
    return lambda g: dist.reduce_scatter_tensor(part, t[:part.numel() * world], group=g)


def timed(dist, torch, group, call, size, total):
    """Runs call(group) total/size times (at least 4); returns (slowest
    rank's seconds per call, this rank's CPU seconds per GB)."""
    for _ in range(2):
        call(group)
    n = max(4, total // size)
    dist.barrier(group=group)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        call(group)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    slowest = torch.tensor([wall / n], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.item(), cpu / (size * n / 1e9)


def copy_rate(torch, dist, size=256 * MiB, reps=5):
    src, dst = torch.ones(size // 4), torch.empty(size // 4)
    dst.copy_(src)
    dist.barrier()
    w0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return size * reps / (time.perf_counter() - w0) / 1e9


def bench_rank(rank, world, port, args):
    import torch
    import torch.distributed as dist

    import roce_pg  # noqa: F401  (registers "roce")

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = {}
    for w in args.workers:
        os.environ["ROCE_PG_WORKERS"] = str(w)  # read when the group is created
        groups[f"roce w={w}"] = dist.new_group(list(range(world)), backend="roce")
    if args.p2p:
        os.environ.update(P2P_SETTINGS, ROCE_PG_WORKERS="1")
        groups["roce p2p"] = dist.new_group(list(range(world)), backend="roce")
        for k in P2P_SETTINGS:
            del os.environ[k]
    if args.gloo:
        groups["gloo"] = dist.new_group(list(range(world)), backend="gloo")
    best, runs = {op: {name: {} for name in groups} for op in args.ops}, []
    for op in args.ops:
        for size in args.sizes:
            call = call_for(dist, torch, op, size * MiB, world)
            for rnd in range(args.rounds):
                for name, group in groups.items():
                    per_call, cpu_per_gb = timed(dist, torch, group, call, size * MiB, args.total_mib * MiB)
                    # Every rank's CPU, averaged (the ranks share the work evenly, not the load).
                    cpu = torch.tensor([cpu_per_gb], dtype=torch.float64)
                    dist.all_reduce(cpu)
                    r = {"busbw_GBps": size * MiB / per_call * BUS_FACTOR[op](world) / 1e9,
                         "cpu_s_per_GB": cpu.item() / world, "us_per_call": per_call * 1e6}
                    runs.append({"op": op, "group": name, "size_mib": size, "round": rnd, **r})
                    mine = best[op][name]
                    if size not in mine or r["us_per_call"] < mine[size]["us_per_call"]:
                        mine[size] = r
    rate = torch.tensor([copy_rate(torch, dist)], dtype=torch.float64)
    dist.all_reduce(rate)
    dist.destroy_process_group()
    return {"best": best, "runs": runs, "copy_GBps_per_rank": rate.item() / world,
            "cpus": len(os.sched_getaffinity(0))}  # rank 0's is printed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="ROCE_PG_WORKERS values")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256], help="MiB per rank")
    ap.add_argument("--ops", nargs="+", default=["allreduce"], choices=sorted(BUS_FACTOR))
    ap.add_argument("--p2p", action="store_true", help="add a group forcing the point-to-point algorithms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--total-mib", type=int, default=1024, help="MiB of tensor per rank per timed round")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", help="write every round here")
    args = ap.parse_args()
    res = run_group("benchmarks.workers.bench_rank", args.ranks, init=False, deadline_s=args.timeout,
                    kwargs={"args": args})[0]
    base = f"roce w={args.workers[0]}"
    print(f"float32, {args.ranks} ranks on one machine ({res['cpus']} usable CPUs), fastest of {args.rounds} "
          f"alternating rounds; CPU: user+sys seconds per GB of tensor, per rank (mean)")
    for op, best in res["best"].items():
        print(f"{op}:")
        print(f"{'MiB':>5} {'group':>10} {'busbw GB/s':>11} {'vs ' + base:>12} {'CPU s/GB':>9}")
        for size in args.sizes:
            for name in best:
                r = best[name][size]
                print(f"{size:>5} {name:>10} {r['busbw_GBps']:>11.2f} "
                      f"{r['busbw_GBps'] / best[base][size]['busbw_GBps']:>12.2f} {r['cpu_s_per_GB']:>9.3f}")
    print(f"plain 256 MiB copy, all ranks at once: {res['copy_GBps_per_rank']:.2f} GB/s per rank")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
