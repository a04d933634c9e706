"""What roce's flight recorder adds to a whole dist.all_reduce call: one
process, a one-rank world group with the recorder on (ROCE_PG_TRACE_ENTRIES
default) and a one-rank subgroup with it off (=0), called in alternating
blocks and timed in the calling thread's CPU time (small collectives run on
the calling thread), so other processes on a busy machine do not count.

    PYTHONPATH=. python benchmarks/trace_overhead.py [--calls 20000] [--blocks 20]

torch's flight-recorder hook is off here (TORCH_FR_BUFFER_SIZE=0), so that
only roce's recording differs between the two groups.
"""
import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000, help="calls per block")
    p.add_argument("--blocks", type=int, default=20, help="blocks per group, alternating")
    args = p.parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    os.environ.pop("ROCE_PG_TRACE_ENTRIES", None)
    import torch
    import torch.distributed as dist

    import roce_pg

    dist.init_process_group("roce", store=dist.HashStore(), rank=0, world_size=1)
    os.environ["ROCE_PG_TRACE_ENTRIES"] = "0"  # read when a group is created
    off = dist.new_group([0])
    groups = {"on": dist.group.WORLD, "off": off}
    assert roce_pg.trace(off) == [] and roce_pg._roce_backend(None)._trace_capacity() > 0
    t = torch.ones(2)
    per_call = {k: [] for k in groups}
    for _ in range(args.blocks):
        for name, g in groups.items():
            t0 = time.thread_time_ns()
            for _ in range(args.calls):
                dist.all_reduce(t, group=g)
            per_call[name].append((time.thread_time_ns() - t0) / args.calls)
    on, off_ = statistics.median(per_call["on"]), statistics.median(per_call["off"])
    print(f"# one-rank 8-byte dist.all_reduce, thread CPU ns per call, median of {args.blocks} blocks "
          f"of {args.calls} calls")
    print(f"  recorder on  {on:8.0f}  (min {min(per_call['on']):.0f})")
    print(f"  recorder off {off_:8.0f}  (min {min(per_call['off']):.0f})")
    print(f"  recording    {on - off_:8.0f}  (difference of the medians; of the minima "
          f"{min(per_call['on']) - min(per_call['off']):.0f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
