"""Where the microseconds of a small dist.all_reduce go, layer by layer, in
one process: one-rank groups that differ by one layer each, called in
alternating blocks and timed in the calling thread's CPU time (small
collectives run on the calling thread; nothing waits on a peer), so other
processes on a busy machine barely count:

  fake             torch's FakeProcessGroup: torch's Python and dispatcher
                   path alone (torch's floor)
  roce bare        roce with both flight recorders off: + roce's adapter
                   (checks, Work and future, task, inline run, completion)
  roce trace       + roce's own recorder: roce's and torch's defaults
                   (ROCE_PG_TORCH_FR=native: torch's hook skips the group)
  roce trace+fr    + torch's flight-recorder hook (ROCE_PG_TORCH_FR=hook)

    PYTHONPATH=. python benchmarks/call_breakdown.py [--calls 20000] [--blocks 15]

What two ranks add (the shared-memory allreduce's synchronisation) needs a
peer and wall time: benchmarks/small_ops.py.
"""
import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000, help="calls per block")
    p.add_argument("--blocks", type=int, default=15, help="blocks per group, alternating")
    args = p.parse_args()
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "ROCE_PG_TRACE_ENTRIES", "ROCE_PG_TORCH_FR"):
        os.environ.pop(var, None)
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    import roce_pg

    # The settings are read when a group is created; torch's recorder for
    # roce is created (enabled) with the first group, which keeps its hook.
    os.environ["ROCE_PG_TORCH_FR"] = "hook"
    dist.init_process_group("roce", store=dist.HashStore(), rank=0, world_size=1)
    os.environ.pop("ROCE_PG_TORCH_FR")  # the default: torch's hook skips roce's groups
    traced = dist.new_group([0])
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"  # no hook whatever roce says
    os.environ["ROCE_PG_TRACE_ENTRIES"] = "0"
    bare = dist.new_group([0])
    fake = dist.new_group([0], backend="fake")
    hooks = dist.distributed_c10d._world.pg_flight_recorder_hooks
    assert dist.group.WORLD in hooks and traced not in hooks and bare not in hooks
    groups = {"fake": fake, "roce bare": bare, "roce trace": traced, "roce trace+fr": dist.group.WORLD}
    assert roce_pg.trace(bare) == [] and roce_pg._roce_backend(traced)._trace_capacity() > 0
    t = torch.ones(2)
    per_call = {k: [] for k in groups}
    for _ in range(args.blocks):
        for name, g in groups.items():
            t0 = time.thread_time_ns()
            for _ in range(args.calls):
                dist.all_reduce(t, group=g)
            per_call[name].append((time.thread_time_ns() - t0) / args.calls)
    med = {k: statistics.median(v) for k, v in per_call.items()}
    print(f"# one-rank 8-byte dist.all_reduce, thread CPU ns per call, median of {args.blocks} blocks "
          f"of {args.calls} calls (min in brackets)")
    prev = None
    for name in groups:
        step = "" if prev is None else f"   {med[name] - med[prev]:+6.0f} over {prev}"
        print(f"  {name:14s} {med[name]:7.0f}  ({min(per_call[name]):.0f}){step}")
        prev = name
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
