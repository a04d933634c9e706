"""Verbs zero copy vs the copy path, inside each of two Soft-RoCE VMs (one rank per VM).

One run = one `import torch` per VM; call it once per build to compare builds in
the same boot (see docs/PERFORMANCE.md, "Verbs zero copy"):

    bash scripts/softroce/run_two_vms.sh "cd $PWD && \\
      PYTHONPATH=OTHER_BUILD .venv/bin/python benchmarks/softroce_zero_copy.py OUT 10.77.0.1 main --ib && \\
      PYTHONPATH=$PWD .venv/bin/python benchmarks/softroce_zero_copy.py OUT 10.77.0.1 branch"

--ib: first `ib_write_bw -b` between the VMs per size (per direction = average / 2).
Label `branch` measures two groups of this build: `copy` (ROCE_PG_IB_ZERO_COPY_MIN_BYTES=0,
every byte through the staging and landing slots) and `zc` (the default); any other
label measures the default group of whatever roce_pg is on PYTHONPATH.

Label `branch` alternates copy and zero copy per size (ZC_BENCH_REPS times
each, default 2) and keeps each mode's best run; all runs are in the JSON.
Sizes: ZC_BENCH_SIZES_MIB (default "1 4 16 64").

Per size: allreduce bus bandwidth (MB/s, the slowest rank) and the CPU seconds
per GB of bus traffic of this rank, from /proc/self/task/*/stat over the timed
loop: the progress thread (the non-main thread with the most CPU, helpers
aside; utime = user space, i.e. our memcpy and reduce; stime = kernel, i.e.
rxe's emulated NIC, which a real NIC would not spend), the channels' reduction
helpers (threads named roce-reduce) and the whole process.
"""
import json
import os
import sys
import time

from softroce_allreduce_vs_ib_write_bw import ib_write_bw  # same invocation and parsing

MiB = 1 << 20
SIZES = [int(x) * MiB for x in os.environ.get("ZC_BENCH_SIZES_MIB", "1 4 16 64").split()]
REPS = int(os.environ.get("ZC_BENCH_REPS", 2))  # copy and zero copy alternate this many times per size
TICK = os.sysconf("SC_CLK_TCK")


def iters_for(size, total=16 * MiB):
    return max(1, total // size)


def thread_cpu():
    """{tid: (utime_s, stime_s, name)} for every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
            fields = tail.split()
            out[int(tid)] = (int(fields[11]) / TICK, int(fields[12]) / TICK, head.split("(", 1)[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def measure(dist, torch, roce_pg, group, sizes, warm=True, total=16 * MiB):
    """Times iters_for(size, total) allreduces per size."""
    world = dist.get_world_size(group)
    res = {}
    for size in sizes:
        t = torch.ones(size // 4)
        for _ in range(2 if warm else 1):
            dist.all_reduce(t, group=group)
        dist.barrier(group=group)
        n = iters_for(size, total)
        roce_pg.reset_counters(group)
        c0, w0 = thread_cpu(), time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t, group=group)
        wall = time.perf_counter() - w0
        c1 = thread_cpu()
        counters = roce_pg.counters(group)
        elapsed = torch.tensor([wall / n], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        bus_bytes = size * 2 * (world - 1) / world * n
        delta = {tid: (c1[tid][0] - c0.get(tid, (0, 0))[0], c1[tid][1] - c0.get(tid, (0, 0))[1]) for tid in c1}
        # Channels' helper threads (ROCE_PG_NCHANNELS > 1) are named roce-reduce.
        helpers = [d for tid, d in delta.items() if c1[tid][2] == "roce-reduce"]
        others = {tid: d for tid, d in delta.items() if tid != os.getpid() and c1[tid][2] != "roce-reduce"}
        prog = max(others.values(), key=sum) if others else (0.0, 0.0)
        total = (sum(d[0] for d in delta.values()), sum(d[1] for d in delta.values()))
        gb = bus_bytes / 1e9
        res[size] = {
            "busbw_MBps": size / elapsed.item() * 2 * (world - 1) / world / 1e6,
            "iters": n,
            "wall_s": wall,
            "progress_user_s_per_GB": prog[0] / gb, "progress_sys_s_per_GB": prog[1] / gb,
            "helpers_user_s_per_GB": sum(d[0] for d in helpers) / gb,
            "process_user_s_per_GB": total[0] / gb, "process_sys_s_per_GB": total[1] / gb,
            "bytes_copied_per_byte": counters.get("bytes_copied", 0) / bus_bytes,
            "bytes_zero_copy_per_byte": counters.get("bytes_zero_copy", 0) / bus_bytes,
        }
        del t
    return res


def worker(label, sizes):
    import torch
    import torch.distributed as dist

    import roce_pg

    dist.init_process_group("roce")
    out = {}
    if label == "branch":
        os.environ["ROCE_PG_IB_ZERO_COPY_MIN_BYTES"] = "0"  # read when the group is created
        copy = dist.new_group(backend="roce")
        del os.environ["ROCE_PG_IB_ZERO_COPY_MIN_BYTES"]
        # Alternate per size, so that both modes see the same host load (the
        # shared host's load changes by the minute); keep each mode's best run.
        out = {"copy": {}, "zc": {}, "runs": []}
        for size in sizes:
            for rep in range(REPS):
                for mode, group in (("copy", copy), ("zc", None)):
                    r = measure(dist, torch, roce_pg, group, [size])[size]
                    out["runs"].append({"size": size, "rep": rep, "mode": mode, **r})
                    if size not in out[mode] or r["busbw_MBps"] > out[mode][size]["busbw_MBps"]:
                        out[mode][size] = r
    else:
        out[label] = measure(dist, torch, roce_pg, None, sizes)
    dist.destroy_process_group()
    return out


def main():
    out_dir, master, label = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    node = int(os.environ["NODE_RANK"])
    if "--ib" in sys.argv:
        ib = {size: ib_write_bw(node, master, size, max(5, iters_for(size)), 18615 + i) / 2
              for i, size in enumerate(SIZES)}
        if node == 0:
            with open(os.path.join(out_dir, "ib_write_bw.json"), "w") as f:
                json.dump(ib, f)
    import roce_pg  # noqa: F401
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1, run_id=f"zc-{label}", rdzv_backend="c10d",
                          rdzv_endpoint=f"{master}:29400", max_restarts=0, start_method="fork", monitor_interval=1,
                          local_addr=os.environ["NODE_ADDR"],  # VM hostnames do not resolve across VMs
                          rdzv_configs={"join_timeout": 1800, "is_host": node == 0})
    results = elastic_launch(config, worker)(label, SIZES)  # keyed by global rank
    with open(os.path.join(out_dir, f"{label}.node{node}.json"), "w") as f:
        json.dump({"roce_pg": roce_pg.__file__, "results": results}, f, indent=1)
    print(f"[zc-bench] node {node} {label}: {json.dumps(results)[:3000]}", flush=True)


if __name__ == "__main__":
    main()
