"""roce_pg.straggler_report() against a rank slowed on purpose, in one run.

    python3 benchmarks/straggler.py [--ranks 4] [--slow 2] [--delays-ms 0 1 5 20] [--mib 1] [--rounds 40]

Spawns --ranks local ranks (one group, shared memory; ROCE_PG_* settings
apply, e.g. ROCE_PG_FORCE_NETWORK=1 for TCP). For each delay, rank --slow
sleeps that long before every allreduce of --mib MiB (a slow data loader or
a straggling GPU, as the others see it); then every rank calls
straggler_report(). Prints, per delay, each rank's share of the window spent
inside collectives and its wait per collective, and the report's verdict
(the same on every rank; rank 0's is printed). The 0 ms row is the control:
it must name nobody.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the in-place build of roce_pg, and tests.support
from tests.support.ranks import run_group  # noqa: E402


def rank_main(rank, world, port, args):
    import torch
    import torch.distributed as dist

    import roce_pg

    dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.ones(args.mib * (1 << 20) // 4)
    rows = []
    for delay in args.delays_ms:
        dist.barrier()
        roce_pg.straggler_report()  # a fresh window
        for _ in range(args.rounds):
            if rank == args.slow:
                time.sleep(delay / 1000)
            dist.all_reduce(x)
        rows.append({"delay_ms": delay, "report": roce_pg.straggler_report()})
    dist.destroy_process_group()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--slow", type=int, default=2, help="the rank that sleeps before each allreduce")
    ap.add_argument("--delays-ms", type=float, nargs="+", default=[0, 1, 5, 20])
    ap.add_argument("--mib", type=int, default=1, help="allreduce size in MiB")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    if not 0 <= args.slow < args.ranks:
        sys.exit(f"--slow must be a rank below --ranks ({args.ranks})")
    results = run_group("benchmarks.straggler.rank_main", args.ranks, init=False, deadline_s=1800,
                        kwargs={"args": args})
    print(f"# {args.ranks} ranks, rank {args.slow} sleeps before each of {args.rounds} allreduces of {args.mib} MiB")
    print("# per rank: share of the window inside collectives / wait per collective (ms)")
    head = ["delay_ms"] + [f"rank {r}" for r in range(args.ranks)] + ["named", "verdict (rank 0)"]
    print(" | ".join(head))
    for i, delay in enumerate(args.delays_ms):
        rep = results[0][i]["report"]
        cells = [f"{x['inside_share']:.2f} / {x['wait_ms_per_collective']:.2f}" for x in rep["ranks"]]
        named = {results[r][i]["report"]["straggler"] for r in range(args.ranks)}
        print(" | ".join([f"{delay:g}"] + cells + [",".join(map(str, named)), rep["text"]]))


if __name__ == "__main__":
    main()
