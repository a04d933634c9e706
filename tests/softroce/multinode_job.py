"""Runs inside each of two Soft-RoCE VMs (scripts/softroce/run_two_vms.sh): a
two-machine, two-ranks-per-machine job launched by torchrun's elastic agent
(torch.distributed.launcher.api.elastic_launch, the API behind the torchrun
command) with c10d rendezvous over the VMs' link. Workers are forked from this
process (start_method="fork") so torch is imported once per VM (minutes under
emulation). Ranks on one VM talk through shared memory, across VMs through
the verbs transport on rxe0. Writes OUT_DIR/node<NODE_RANK>.json.

    NODE_RANK=0 PEER_ADDR=... python -m tests.softroce.multinode_job OUT_DIR MASTER_ADDR
"""
import json
import os
import sys
import time

import torch

import roce_pg  # noqa: F401

from tests.softroce.rxe_counters import sent_packets

BIG = 8 << 20  # bytes of the allreduce whose packets are counted


def worker():
    import torch.distributed as dist

    from tests import ddp_workers

    dist.init_process_group("roce")
    rank, world = dist.get_rank(), dist.get_world_size()
    res = {"rank": rank, "backend": dist.get_backend()}
    # allreduce, allgather, reduce_scatter, broadcast, alltoall, barrier
    t = torch.arange(100_003, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    res["allreduce"] = bool(torch.equal(t, torch.arange(100_003, dtype=torch.float64) * sum(range(1, world + 1))))
    outs = [torch.empty(1000, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(outs, torch.full((1000,), rank, dtype=torch.int32))
    res["allgather"] = all(bool(torch.all(o == r)) for r, o in enumerate(outs))
    out = torch.empty(5000)
    dist.reduce_scatter_tensor(out, torch.arange(5000 * world, dtype=torch.float32) + rank)
    exp = torch.arange(5000 * world, dtype=torch.float32)[rank * 5000:(rank + 1) * 5000] * world + sum(range(world))
    res["reduce_scatter"] = bool(torch.equal(out, exp))
    b = torch.full((300_000,), float(rank), dtype=torch.float32)
    dist.broadcast(b, src=world - 1)
    res["broadcast"] = bool(torch.all(b == world - 1))
    a = torch.arange(world * 7, dtype=torch.int64) + 100 * rank
    o = torch.empty_like(a)
    dist.all_to_all_single(o, a)
    res["alltoall"] = bool(torch.equal(o, torch.cat([torch.arange(rank * 7, rank * 7 + 7) + 100 * k for k in range(world)])))
    dist.barrier()
    res["barrier"] = True
    # 20 DDP steps with roce against the same with Gloo
    r = ddp_workers.run(rank, world, 0)
    res["ddp_diff"], res["ddp_hook_diff"], res["ddp_moved"] = r["diff"], r["diff_hook"], r["moved"]
    # A known transfer for the packet counters.
    pkts = sent_packets()
    big = torch.ones(BIG // 4)
    dist.all_reduce(big)
    res["big_ok"] = bool(torch.all(big == world))
    res["big_packets_delta_seen_by_rank"] = sent_packets() - pkts
    dist.barrier()
    dist.destroy_process_group()
    return res


def main():
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    out_dir, master = sys.argv[1], sys.argv[2]
    node = int(os.environ["NODE_RANK"])
    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=2, run_id="softroce", rdzv_backend="c10d",
                          rdzv_endpoint=f"{master}:29400", max_restarts=0, start_method="fork", monitor_interval=1,
                          local_addr=os.environ["NODE_ADDR"],  # VM hostnames do not resolve across VMs
                          rdzv_configs={"join_timeout": 1800, "is_host": node == 0})
    before = sent_packets()
    t0 = time.time()
    results = elastic_launch(config, worker)()
    report = {"node": node, "results": results, "sent_packets": sent_packets() - before,
              "seconds": round(time.time() - t0, 1), "ports": roce_pg.rdma_ports()}  # after the forks
    with open(os.path.join(out_dir, f"node{node}.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"[node {node}] {json.dumps(report, default=str)[:1500]}", flush=True)


if __name__ == "__main__":
    main()
