"""Allreduce algorithms side by side on simulated machines over TCP.
A benchmark, not a test: it prints tables (markdown) for docs/PERFORMANCE.md.

    .venv/bin/python benchmarks/algorithms.py            # both layouts
    .venv/bin/python benchmarks/algorithms.py --quick    # fewer sizes and iterations

Layout A: 2 simulated machines x 2 ranks (ROCE_PG_SIM_RANKS_PER_NODE=2): shared
memory inside a "machine", TCP between them. For every algorithm (forced with
ROCE_PG_ALGO_ALLREDUCE, and auto): time per allreduce (float32 SUM, maximum
over ranks of the median of N calls) from 8 B to 64 MiB, and the network bytes
per rank from the counters (maximum over ranks) for 1-64 MiB.
Layout B: 4 simulated machines x 1 rank: the 8-byte allreduce, auto vs ring.
Every process runs on this one host, so "network" is TCP over loopback: the
times show the algorithms' message counts and copies, not a real NIC.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tests.support.sizes import parse_size  # noqa: E402

ALGOS = ["ring", "rd", "rabenseifner", "hier", "auto"]


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def _time_calls(dist, t, g, budget_s):
    """Median seconds per allreduce over about budget_s of calls (the same count on every rank)."""
    import torch

    for _ in range(2):
        dist.all_reduce(t, group=g)
    # as many calls as fit in about budget_s, decided on the slowest rank's first call
    dist.barrier(group=g)
    t0 = time.perf_counter()
    dist.all_reduce(t, group=g)
    est = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX, group=g)
    iters = int(max(3, min(5000, budget_s / max(est.item(), 1e-6))))
    dist.barrier(group=g)
    # The median call, not the mean: on a loaded host a few calls that lose
    # the CPU for tens of ms would dominate a mean.
    calls = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(t, group=g)
        calls.append(time.perf_counter() - t0)
    return _median(calls), iters


def worker(rank, world, port, algos, sizes, net_sizes, budget_s, rounds=1):
    import torch
    import torch.distributed as dist

    import roce_pg

    # One group per algorithm, all alive at once, so that the algorithms can be
    # measured in alternation: round r times every algorithm at every size, in
    # an order rotated by r, and the result is the median over rounds. Drift
    # on a shared host (another job, thermal) then hits every column alike.
    groups = {}
    for algo in algos:
        os.environ["ROCE_PG_ALGO_ALLREDUCE"] = algo  # read when the group is created
        groups[algo] = dist.new_group(list(range(world)), backend="roce")
    medians = {(a, s): [] for a in algos for s in sizes}
    iters = {}
    for r in range(rounds):
        order = algos[r % len(algos):] + algos[:r % len(algos)]
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // 4))
            for algo in order:
                sec, iters[(algo, nbytes)] = _time_calls(dist, t, groups[algo], budget_s)
                dt = torch.tensor([sec], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=groups[algo])
                medians[(algo, nbytes)].append(dt.item() * 1e6)
    out = {}
    for (algo, nbytes), per_round in medians.items():
        g = groups[algo]
        row = {"us": _median(per_round), "rounds_us": per_round, "iters": iters[(algo, nbytes)]}
        if nbytes in net_sizes:
            t = torch.ones(max(1, nbytes // 4))
            dist.barrier(group=g)
            roce_pg.reset_counters(g)
            dist.all_reduce(t, group=g)
            net = torch.tensor([roce_pg.counters(g)["bytes_sent_net"]], dtype=torch.float64)
            dist.all_reduce(net, op=dist.ReduceOp.MAX, group=g)
            row["net_max"] = int(net.item())
        out[(algo, nbytes)] = row
    for g in groups.values():
        dist.destroy_process_group(g)
    return out


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def flat(args):
    from tests.support.ranks import run_group

    algos = args.algos.split(",") if args.algos else ["ring", "rd", "rabenseifner", "auto"]
    sizes = [8, 512, 8 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20]
    if args.sizes:
        sizes = [parse_size(x) for x in args.sizes.split(",")]
    env = {"ROCE_PG_NET_TRANSPORT": "tcp", "ROCE_PG_SIM_RANKS_PER_NODE": "1"}
    res = run_group("benchmarks.algorithms.worker", args.flat, env=env, deadline_s=3000,
                    kwargs={"algos": algos, "sizes": sizes, "net_sizes": [], "budget_s": args.budget,
                            "rounds": args.rounds})[0]
    print(f"## {args.flat} simulated machines x 1 rank, TCP (median time per allreduce, us; float32 SUM; "
          f"median of {args.rounds} alternating rounds)\n")
    print("| bytes | " + " | ".join(algos) + " | fastest |")
    print("|---" * (len(algos) + 2) + "|")
    for s in sizes:
        best = min(algos[:-1] or algos, key=lambda a: res[(a, s)]["us"])
        print(f"| {human(s)} | " + " | ".join(f"{res[(a, s)]['us']:.0f}" for a in algos) + f" | {best} |")
    if "ring" in algos and "auto" in algos:
        print("\nauto / ring per round (same round, same size):")
        for s in sizes:
            ratios = [a / r for a, r in zip(res[("auto", s)]["rounds_us"], res[("ring", s)]["rounds_us"])]
            print(f"  {human(s)}: " + ", ".join(f"{x:.2f}" for x in ratios) +
                  f" (median {sorted(ratios)[len(ratios) // 2]:.2f})")


def main():
    from tests.support.ranks import run_group

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--budget", type=float, default=0.3, help="seconds of timed calls per size and algorithm")
    p.add_argument("--flat", type=int, default=0, metavar="N",
                   help="instead: N simulated machines x 1 rank, ring / rd / rabenseifner / auto times only")
    p.add_argument("--algos", default="", help="with --flat: comma-separated algorithms (default ring,rd,rabenseifner,auto)")
    p.add_argument("--sizes", default="", help="with --flat: comma-separated sizes, e.g. 1M,16M,64M")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every algorithm this many times, alternating, and report the median round")
    args = p.parse_args()
    if args.flat:
        return flat(args)
    sizes = [8 << (2 * k) for k in range(12)] + [64 << 20]  # 8 B ... 32 MiB by x4, and 64 MiB
    if args.quick:
        sizes = [8, 512, 32 << 10, 1 << 20, 16 << 20]
    net_sizes = [s for s in sizes if s >= 1 << 20]
    env = {"ROCE_PG_NET_TRANSPORT": "tcp", "ROCE_PG_SIM_RANKS_PER_NODE": "2"}
    wall = time.time()
    res = run_group("benchmarks.algorithms.worker", 4, env=env, deadline_s=3000,
                    kwargs={"algos": ALGOS, "sizes": sizes, "net_sizes": net_sizes, "budget_s": args.budget,
                            "rounds": args.rounds})[0]
    print(f"## 2 simulated machines x 2 ranks, TCP between them (time per allreduce, us; float32 SUM)\n")
    print("| bytes | " + " | ".join(ALGOS) + " | fastest |")
    print("|---" * (len(ALGOS) + 2) + "|")
    for s in sizes:
        cells = [res[(a, s)]["us"] for a in ALGOS]
        best = min(ALGOS[:-1], key=lambda a: res[(a, s)]["us"])
        print(f"| {human(s)} | " + " | ".join(f"{c:.0f}" for c in cells) + f" | {best} |")
    print("\n## Network bytes per rank (maximum over ranks), 2 x 2\n")
    print("| bytes | ring | hier | hier / ring | rd | rabenseifner |")
    print("|---|---|---|---|---|---|")
    for s in net_sizes:
        r, h = res[("ring", s)]["net_max"], res[("hier", s)]["net_max"]
        print(f"| {human(s)} | {r} | {h} | {h / r:.2f} | {res[('rd', s)]['net_max']} | "
              f"{res[('rabenseifner', s)]['net_max']} |")
    print("\n## Crossovers (smallest size from which the first is faster than the second at every larger size)\n")
    for a, b in (("rabenseifner", "rd"), ("ring", "rabenseifner"), ("hier", "rabenseifner"), ("hier", "ring")):
        cross = None
        for s in reversed(sizes):
            if res[(a, s)]["us"] < res[(b, s)]["us"]:
                cross = s
            else:
                break
        print(f"- {a} beats {b} from {human(cross) if cross else 'never (in this range)'}")
    env4 = {"ROCE_PG_NET_TRANSPORT": "tcp", "ROCE_PG_SIM_RANKS_PER_NODE": "1"}
    res4 = run_group("benchmarks.algorithms.worker", 4, env=env4, deadline_s=600,
                     kwargs={"algos": ["ring", "auto"], "sizes": [8], "net_sizes": [], "budget_s": 1.0})[0]
    ring, auto = res4[("ring", 8)]["us"], res4[("auto", 8)]["us"]
    print("\n## 4 simulated machines x 1 rank, TCP: 8-byte allreduce\n")
    print("| ring (us) | auto = rd (us) | auto / ring |\n|---|---|---|")
    print(f"| {ring:.0f} | {auto:.0f} | {auto / ring:.2f} |")
    print(f"\n(wall time {time.time() - wall:.0f} s)")


if __name__ == "__main__":
    main()
