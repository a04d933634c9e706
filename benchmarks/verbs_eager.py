"""Small-message latency over verbs with and without the eager protocol, side by side.

    # inside a Soft-RoCE VM (or on a machine with an RDMA port):
    ROCE_PG_FORCE_NETWORK=1 PYTHONPATH=. python benchmarks/verbs_eager.py [--ranks 2] [--iters 200]

Two groups live in the same ranks: "rendezvous" (created with
ROCE_PG_IB_EAGER_MAX_BYTES=0: every message waits for the receiver's RTR) and
"eager" (the default, messages up to 16 KiB go at once). For each size the
script alternates the two groups --rounds times and reports, per group, the
median over rounds of the mean time per call (slowest rank): allreduce, and a
ping-pong between ranks 0 and 1 (half the round trip). Ratios (eager /
rendezvous) are the point; the machine's absolute speed is not (Soft-RoCE
under emulation is ~1000x slower than a NIC).
"""
import argparse
import os
import statistics
import sys
import time

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.ranks import run_group  # noqa: E402


def timed(fn, iters, barrier):
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def bench_rank(rank, world, port, args):
    import torch
    import torch.distributed as dist

    import roce_pg

    torch.set_num_threads(1)
    dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    os.environ["ROCE_PG_IB_EAGER_MAX_BYTES"] = "0"  # read when the group is created
    rdv = dist.new_group(list(range(world)), backend="roce")
    os.environ.pop("ROCE_PG_IB_EAGER_MAX_BYTES")
    eager = dist.new_group(list(range(world)), backend="roce")
    groups = {"rendezvous": rdv, "eager": eager}
    results = {}
    for nbytes in args.sizes:
        t = torch.ones(max(1, nbytes // 4))
        buf = torch.empty_like(t)

        def pingpong(g):
            if rank == 0:
                dist.send(t, 1, group=g)
                dist.recv(buf, 1, group=g)
            elif rank == 1:
                dist.recv(buf, 0, group=g)
                dist.send(t, 0, group=g)

        for name, g in groups.items():  # warm-up
            for _ in range(5):
                dist.all_reduce(t, group=g)
                pingpong(g)
        per = {f"{kind} {name}": [] for kind in ("allreduce", "pingpong") for name in groups}
        for _ in range(args.rounds):
            for name, g in groups.items():
                per[f"allreduce {name}"].append(timed(lambda: dist.all_reduce(t, group=g), args.iters, dist.barrier))
                per[f"pingpong {name}"].append(timed(lambda: pingpong(g), args.iters, dist.barrier) / 2)
        results[nbytes] = {k: statistics.median(v) for k, v in per.items()}
    counters = roce_pg.counters(eager)
    out = [None] * world
    dist.all_gather_object(out, results)
    dist.destroy_process_group()
    worst = {n: {k: max(o[n][k] for o in out) for k in results[n]} for n in results}
    return worst, counters["eager_sends"]  # rank 0's is printed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=200, help="calls per timed block")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two groups per size")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 4096, 16384])
    p.add_argument("--timeout", type=float, default=1500)
    args = p.parse_args()
    print(f"# verbs_eager: {args.ranks} ranks, ROCE_PG_*: "
          f"{{{', '.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k.startswith('ROCE_PG_'))}}}")
    worst, eager_sends = run_group("benchmarks.verbs_eager.bench_rank", args.ranks, init=False,
                                   deadline_s=args.timeout, kwargs={"args": args})[0]
    print(f"# {'bytes':>8s} {'op':10s} {'rendezvous (us)':>16s} {'eager (us)':>11s} {'eager/rdv':>10s}")
    for n, r in worst.items():
        for kind in ("allreduce", "pingpong"):
            a, b = r[f"{kind} rendezvous"], r[f"{kind} eager"]
            print(f"  {n:8d} {kind:10s} {a * 1e6:16.1f} {b * 1e6:11.1f} {b / a:10.2f}")
    print(f"# eager_sends on rank 0's eager group: {eager_sends}")


if __name__ == "__main__":
    main()
