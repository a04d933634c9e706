"""Ring allreduce in 1, 2 and 4 channels (ROCE_PG_NCHANNELS), side by side.

    # TCP between local ranks:
    ROCE_PG_FORCE_NETWORK=1 ROCE_PG_NET_TRANSPORT=tcp PYTHONPATH=. python benchmarks/channels.py
    # verbs, inside a Soft-RoCE VM (scripts/softroce/run_vm.sh) or on a machine with an RDMA port:
    ROCE_PG_FORCE_NETWORK=1 PYTHONPATH=. python benchmarks/channels.py

One group per channel count lives in the same ranks (the count is read when a
group is created), every one forcing the ring. For each size the groups take
turns --rounds times, so all see the same machine load; each keeps its best
round. Per group and size: bus bandwidth (slowest rank), and rank 0's CPU
seconds per GB of bus traffic on the progress thread, on the channels' helper
threads (roce-reduce) and in the whole process (user time; see
softroce_zero_copy.measure). What channels are for shows in where the CPU
goes: the progress thread's share should fall as helpers take the
reductions; bandwidth can only rise where cores are free for them (not on a
2-core host with 2 ranks, where 2 channels already mean 4 busy threads).
"""
import argparse
import json
import os
import sys

from softroce_zero_copy import measure

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.ranks import run_group  # noqa: E402

MiB = 1 << 20


def bench_rank(rank, world, port, args):
    import torch
    import torch.distributed as dist

    import roce_pg

    torch.set_num_threads(1)
    dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    os.environ["ROCE_PG_ALGO_ALLREDUCE"] = "ring"
    groups = {}
    for ch in args.channels:
        os.environ["ROCE_PG_NCHANNELS"] = str(ch)  # read when the group is created
        groups[ch] = dist.new_group(list(range(world)), backend="roce")
    best, runs = {ch: {} for ch in args.channels}, []
    for size in args.sizes:
        for rnd in range(args.rounds):
            for ch, group in groups.items():
                r = measure(dist, torch, roce_pg, group, [size * MiB], total=args.total_mib * MiB)[size * MiB]
                runs.append({"channels": ch, "size_mib": size, "round": rnd, **r})
                if size not in best[ch] or r["busbw_MBps"] > best[ch][size]["busbw_MBps"]:
                    best[ch][size] = r
    dist.barrier()
    dist.destroy_process_group()
    return {"best": best, "runs": runs}  # rank 0's is printed (its CPU times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--channels", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 32], help="MiB per rank")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--total-mib", type=int, default=2048, help="MiB per rank allreduced per timed round "
                    "(CPU times come in 10 ms ticks)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", help="write every round here")
    args = ap.parse_args()
    res = run_group("benchmarks.channels.bench_rank", args.ranks, init=False, deadline_s=args.timeout,
                    kwargs={"args": args})[0]
    best = res["best"]
    base = args.channels[0]
    print(f"ring allreduce, {args.ranks} ranks, best of {args.rounds} alternating rounds; "
          f"CPU: rank 0, user seconds per GB of bus traffic")
    print(f"{'MiB':>5} {'ch':>3} {'busbw MB/s':>11} {'vs ' + str(base) + ' ch':>8} {'progress':>9} {'helpers':>8} "
          f"{'process':>8}")
    for size in args.sizes:
        for ch in args.channels:
            r = best[ch][size]
            print(f"{size:>5} {ch:>3} {r['busbw_MBps']:>11.0f} {r['busbw_MBps'] / best[base][size]['busbw_MBps']:>8.2f} "
                  f"{r['progress_user_s_per_GB']:>9.3f} {r['helpers_user_s_per_GB']:>8.3f} "
                  f"{r['process_user_s_per_GB']:>8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
