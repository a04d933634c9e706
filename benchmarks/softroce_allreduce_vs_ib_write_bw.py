"""Inside each of two Soft-RoCE VMs (one rank per VM), in one boot:
1. `ib_write_bw -b` (bidirectional) between the VMs for each message size;
   per-direction bandwidth = the reported average / 2;
2. roce's allreduce over the verbs transport for the same sizes, launched by
   torchrun's elastic agent (fork start method: torch is imported once per VM);
then node 0 prints busbw / per-direction ib_write_bw per size.

    bash scripts/softroce/run_two_vms.sh \\
      "cd $PWD && .venv/bin/python benchmarks/softroce_allreduce_vs_ib_write_bw.py .softroce-out/bench 10.77.0.1"
"""
import json
import os
import re
import subprocess
import sys
import time

SIZES = [1 << 20, 2 << 20, 4 << 20, 8 << 20]
ITERS = {1 << 20: 40, 2 << 20: 20, 4 << 20: 10, 8 << 20: 6}


def ib_write_bw(node, master, size, iters, port):
    args = ["ib_write_bw", "-d", "rxe0", "-x", "1", "-b", "-F", "-s", str(size), "-n", str(iters), "-p", str(port)]
    if node == 0:
        p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    else:
        for _ in range(120):  # the server may not be listening yet
            p = subprocess.run(args + [master], capture_output=True, text=True, timeout=900)
            if p.returncode == 0:
                break
            time.sleep(1)
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0] == str(size):
            return float(f[3])  # BW average [MB/sec], both directions together with -b
    raise RuntimeError(f"ib_write_bw gave no result:\n{p.stdout}\n{p.stderr}")


def allreduce_worker(sizes, iters):
    import torch
    import torch.distributed as dist

    dist.init_process_group("roce")
    world = dist.get_world_size()
    out = {}
    for size in sizes:
        t = torch.ones(size // 4)
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters[size]):
            dist.all_reduce(t)
        elapsed = torch.tensor([(time.perf_counter() - t0) / iters[size]], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        out[size] = size / elapsed.item() * 2 * (world - 1) / world / 1e6  # busbw, MB/s
    dist.destroy_process_group()
    return out


def main():
    out_dir, master = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    node = int(os.environ["NODE_RANK"])
    ib = {}
    for i, size in enumerate(SIZES):
        ib[size] = ib_write_bw(node, master, size, ITERS[size], 18515 + i) / 2  # per direction
    import roce_pg  # noqa: F401
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1, run_id="bench", rdzv_backend="c10d",
                          rdzv_endpoint=f"{master}:29400", max_restarts=0, start_method="fork", monitor_interval=1,
                          local_addr=os.environ["NODE_ADDR"],  # VM hostnames do not resolve across VMs
                          rdzv_configs={"join_timeout": 1800, "is_host": node == 0})
    roce = next(iter(elastic_launch(config, allreduce_worker)(SIZES, ITERS).values()))  # keyed by global rank
    if node == 0:
        lines = ["# roce allreduce busbw vs ib_write_bw -b per direction, same link, same boot (MB/s)",
                 "#      size   ib_write_bw/dir   roce busbw   ratio"]
        for size in SIZES:
            lines.append(f"  {size:9d}   {ib[size]:15.2f}   {roce[size]:10.2f}   {roce[size] / ib[size]:5.2f}")
        text = "\n".join(lines)
        print(text, flush=True)
        with open(os.path.join(out_dir, "result.txt"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump({"ib_write_bw_per_direction": ib, "roce_busbw": roce}, f)


if __name__ == "__main__":
    main()
