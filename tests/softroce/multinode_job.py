"""Runs inside each of two Soft-RoCE VMs (scripts/softroce/run_two_vms.sh):
two machines, two ranks per machine. torch is imported once per VM (minutes
under emulation); every rank is forked from this process. Ranks on one VM talk
through shared memory, across VMs through the verbs transport on rxe0. Several
phases in one boot, each reported in OUT_DIR/node<NODE_RANK>.json:

  torchrun   launched by torchrun's elastic agent (torch.distributed.launcher.api
             .elastic_launch, the API behind the torchrun command; workers
             forked) with c10d rendezvous over the link: collectives, 20 DDP
             steps compared with Gloo, a counted 8 MiB allreduce
  elastic    the same launcher with --max-restarts 1: the last rank (node 1)
             SIGKILLs itself at step 5 of 12 exact allreduces; the agents restart
             every worker on the same store and the second attempt must finish;
             when its workers started, formed the group and ran the first
             allreduce is recorded
  algorithms auto and the ring, hier and tree allreduces forced
             (tests/algorithm_workers.py) on the 2+2 layout over verbs (rd and
             rabenseifner, 28 s each under emulation, run across simulated
             machines in tests/test_algorithms.py): ops x dtypes x size classes against
             references, reduce / reduce-scatter / allgather / broadcast, and
             the network bytes per rank of hier against ring from the counters
  netem      a collective matrix (verbs_workers.link_matrix) while netem (RoCE packets only: UDP port
             4791, each VM shaping its egress) drops 1% of the packets and
             delays others (reordering); results checked against references
             (integers exact, floats against float64 within tolerance); netem
             and rxe counters recorded
  port_down  one rank takes its VM's netdev down during an allreduce loop;
             every rank must raise, none may hang

    NODE_RANK=0 PEER_ADDR=... python -m tests.softroce.multinode_job OUT_DIR MASTER_ADDR
"""
import json
import os
import re
import subprocess
import sys
import time
import traceback

# torch's default log formatter imports torch._dynamo (and triton) to format
# any record that carries an exception: the elastic agent logs its failed
# worker that way, which cost ~130 s of emulated CPU between the kill and the
# restart. A plain format (read when torch is imported) prints the same messages.
os.environ.setdefault("TORCH_LOGS_FORMAT", "%(levelname).1s %(asctime)s %(process)d %(filename)s:%(lineno)d] %(message)s")

import torch  # noqa: E402
# DDP's constructor imports torch._dynamo (sympy and more): measured at ~600 s
# of the torchrun phase on a loaded host, where each VM's two ranks imported
# it at once on a shared vCPU pair. Imported once here, before any rank is
# forked, it costs one import per VM (it starts no thread, so forking stays safe).
import torch._dynamo  # noqa: E402,F401

import roce_pg  # noqa: F401

from tests.softroce.rxe_counters import hw_counters, sent_packets
from tests.support.ranks import run_group

BIG = 8 << 20  # bytes of the allreduce whose packets are counted
RANKS_PER_NODE = 2
WORLD = 2 * RANKS_PER_NODE
# 1% of the RoCE packets lost, 1% held back 1 ms (the packets behind it overtake
# it). rxe is go-back-N: every loss and every overtaking costs a NAK or an ACK
# timeout and a resend from the gap.
NETEM = os.environ.get("SOFTROCE_NETEM", "loss 1% delay 1ms reorder 99%")
NETEM_ENV = {
    "ROCE_PG_IB_TIMEOUT": "14",   # 67 ms per ACK timeout (the default 18 waits 1 s per tail loss)
    "TEST_PG_TIMEOUT_S": "600",
}
# slow_teardown: the reaper waits 15 s before it destroys a broken group's
# queue pairs, as Soft-RoCE may (up to 50 s) when packets are stuck on the
# downed port; destroy_process_group must not wait for it.
PORT_DOWN_ENV = {"ROCE_PG_IB_TIMEOUT": "14", "ROCE_PG_HEARTBEAT_TIMEOUT_MS": "10000",
                 "ROCE_PG_TEST_FAULT": "slow_teardown"}
STORE_PORTS = {"netem": 29510, "port_down": 29520, "algorithms": 29530}
# The thresholds of tests/test_algorithms.py: a few KiB cover every size class.
ALGO_ENV = {"ROCE_PG_ALGO_RD_MAX_BYTES": "64", "ROCE_PG_ALGO_RING_MIN_BYTES": "8192",
            "ROCE_PG_ALGO_HIER_MIN_BYTES": "1024", "ROCE_PG_ALGO_BRUCK_MAX_BYTES": "256", "ROCE_PG_CHUNK_BYTES": "4096",
            "TEST_PG_TIMEOUT_S": "600"}
ALGO_TRAFFIC_NUMEL = 1 << 16  # float32 elements (256 KiB) of the hier-vs-ring counters


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


# The elastic phase: torchrun's agent restarts every worker after one dies.
ELASTIC_STEPS, ELASTIC_KILL_STEP, ELASTIC_VICTIM = 12, 5, WORLD - 1  # the victim is on node 1
ELASTIC_NUMEL = 50_000


def elastic_worker(scratch):
    """Exact int64 allreduces over verbs; in the first attempt the victim
    SIGKILLs itself mid-training, the survivors' collectives fail, and the
    agents start a second attempt on the same store, which must run to the end."""
    import signal

    import torch.distributed as dist

    started = time.time()
    dist.init_process_group("roce")
    formed = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    first = None
    for step in range(ELASTIC_STEPS):
        if attempt == 0 and rank == ELASTIC_VICTIM and step == ELASTIC_KILL_STEP:
            with open(os.path.join(scratch, "elastic_kill"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.arange(ELASTIC_NUMEL, dtype=torch.int64) * (rank + 1) * (step + 1)
        dist.all_reduce(t)
        expect = torch.arange(ELASTIC_NUMEL, dtype=torch.int64) * (step + 1) * (world * (world + 1) // 2)
        assert torch.equal(t, expect), f"rank {rank} step {step}: wrong allreduce result"
        first = first or time.time()
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "attempt": attempt, "steps": ELASTIC_STEPS, "started": started,
            "formed": formed, "first_allreduce": first}


def phase_elastic(node, master):
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    scratch = os.environ["SOFTROCE_SHARED_DIR"]  # both VMs see it: when the victim died
    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=RANKS_PER_NODE, run_id="softroce-elastic",
                          rdzv_backend="c10d", rdzv_endpoint=f"{master}:29401", max_restarts=1, start_method="fork",
                          monitor_interval=1, local_addr=os.environ["NODE_ADDR"],
                          rdzv_configs={"join_timeout": 900, "is_host": node == 0})
    before = sent_packets()
    results = elastic_launch(config, elastic_worker)(scratch)
    kill_file = os.path.join(scratch, "elastic_kill")
    killed_at = float(open(kill_file).read()) if os.path.exists(kill_file) else None
    return {"results": results, "killed_at": killed_at, "sent_packets": sent_packets() - before}


def phase_torchrun(node, master):
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=RANKS_PER_NODE, run_id="softroce",
                          rdzv_backend="c10d", rdzv_endpoint=f"{master}:29400", max_restarts=0, start_method="fork",
                          monitor_interval=1,
                          local_addr=os.environ["NODE_ADDR"],  # VM hostnames do not resolve across VMs
                          rdzv_configs={"join_timeout": 900, "is_host": node == 0})
    before = sent_packets()
    results = elastic_launch(config, worker)()
    return {"results": results, "sent_packets": sent_packets() - before}


def _tc(*args, check=True):
    p = subprocess.run(["tc", *args], capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f"tc {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def _netem_dropped(stats):
    """Packets dropped by the netem qdisc in `tc -s qdisc show` output."""
    m = re.search(r"qdisc netem .*?\n\s*Sent \d+ bytes (\d+) pkt \(dropped (\d+)", stats)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def phase_netem(node, master, netdev):
    # Only RoCE v2 (UDP 4791) goes through netem: the store and the lifelines (TCP) do not.
    _tc("qdisc", "del", "dev", netdev, "root", check=False)
    _tc("qdisc", "add", "dev", netdev, "root", "handle", "1:", "prio")
    _tc("qdisc", "add", "dev", netdev, "parent", "1:3", "handle", "30:", "netem", "limit", "10000", *NETEM.split())
    _tc("filter", "add", "dev", netdev, "parent", "1:0", "protocol", "ip", "u32", "match", "ip", "dport", "4791",
        "0xffff", "flowid", "1:3")
    hw0 = hw_counters()
    res = {"netem": NETEM}
    try:
        ranks = range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
        res["results"] = run_group("tests.softroce.verbs_workers.link_matrix", WORLD, env=NETEM_ENV,
                                   start_method="fork", host=master, port=STORE_PORTS["netem"], ranks=ranks,
                                   deadline_s=1200)
    finally:
        hw1 = hw_counters()
        res["hw_delta"] = {k: hw1[k] - hw0.get(k, 0) for k in hw1}
        stats = _tc("-s", "qdisc", "show", "dev", netdev)
        res["tc_stats"] = stats
        res["netem_sent"], res["netem_dropped"] = _netem_dropped(stats)
        _tc("qdisc", "del", "dev", netdev, "root", check=False)
    return res


VM_ALGOS = ["auto", "ring", "hier", "tree"]


def phase_algorithms(node, master):
    ranks = range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
    results = run_group("tests.algorithm_workers.run", WORLD, env=ALGO_ENV, start_method="fork", host=master,
                        port=STORE_PORTS["algorithms"], ranks=ranks, deadline_s=1000,
                        kwargs={"groups": {"2x2": list(range(WORLD))}, "traffic": {"2x2": [ALGO_TRAFFIC_NUMEL]},
                                "timing": True, "algos": VM_ALGOS})
    return {"results": dict(zip(ranks, results)), "traffic_numel": ALGO_TRAFFIC_NUMEL}


def phase_port_down(node, master, netdev):
    victim = WORLD - 1  # on node 1
    scratch = os.environ["SOFTROCE_SHARED_DIR"]  # both VMs see it: the moment the link went down
    ranks = range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)
    results = run_group("tests.softroce.verbs_workers.port_down", WORLD, env=PORT_DOWN_ENV, init=False,
                        start_method="fork", host=master, port=STORE_PORTS["port_down"], ranks=ranks,
                        kwargs={"host": master, "victim": victim, "netdev": netdev, "scratch": scratch,
                                "ranks_per_node": RANKS_PER_NODE},
                        deadline_s=400)
    return {"results": dict(zip(ranks, results)), "victim": victim}


def main():
    out_dir, master = sys.argv[1], sys.argv[2]
    node = int(os.environ["NODE_RANK"])
    netdev = os.environ["SOFTROCE_NETDEV"]
    phases = os.environ.get("SOFTROCE_PHASES", "torchrun elastic algorithms netem port_down").split()
    report = {"node": node, "phases": {}}
    path = os.path.join(out_dir, f"node{node}.json")
    ok = True
    for name in phases:
        fn = {"torchrun": phase_torchrun, "elastic": phase_elastic, "algorithms": phase_algorithms, "netem": phase_netem,
              "port_down": phase_port_down}[name]
        t0 = time.time()
        try:
            res = fn(node, master, netdev) if name in ("netem", "port_down") else fn(node, master)
        except Exception:  # noqa: BLE001
            res = {"error": traceback.format_exc()[-6000:]}
            ok = False
        res["seconds"] = round(time.time() - t0, 1)
        report["phases"][name] = res
        with open(path, "w") as f:  # rewritten after every phase: a run stopped by its limit still reports
            json.dump(report, f, indent=1, default=str)
        print(f"[node {node}] {name}: {res['seconds']} s {json.dumps(res, default=str)[:1500]}", flush=True)
    report["ports"] = roce_pg.rdma_ports()  # after every fork
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
