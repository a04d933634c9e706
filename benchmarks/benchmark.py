"""End-to-end DDP training benchmark, printed in the layout of PyTorch's
benchmarks/distributed/ddp/benchmark.py (the "e2e" test of the cloud RDMA
guides):

      2 CPUs --    1M/2G:  p50:  0.412s      77/s  p75:  0.418s      76/s  p90: ...  p95: ...

N GPUs/CPUs = processes in the group (CPUs when the tensors live on the CPU);
1M/2G = machines x processes per machine (PyTorch's notation, also on CPU);
pXX = percentile of the per-iteration wall time (forward, backward with DDP's
gradient reduction, optimizer step, device sync), pooled over every rank;
/s = samples per second per process (batch size / that time).

Launch with torchrun, on one machine or many (see examples/train.sh):

    torchrun --standalone --nproc_per_node 2 benchmarks/benchmark.py --backend roce,gloo

Several backends run one after the other in the same processes, on the same
seed and data; the run ends with the largest parameter difference between
them and the throughput ratio to the first backend. --sweep adds PyTorch's
ladder of smaller worlds (a no-DDP baseline, 1M/1G, 1M/2G, ... machines x
full nodes) before the full world.
"""
import argparse
import inspect
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_models
import runenv

PERCENTILES = (50, 75, 90, 95)
# No buffer sync each forward (as in PyTorch's benchmark): the time measured is
# the gradient reduction, not a per-step copy of BatchNorm statistics. torch
# 2.15 renamed the flag and warns on the old name.
NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                  else {"broadcast_buffers": False})
DISTINCT_BATCHES = 4  # cycled, so the loss falls while no data loading is timed


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="roce,gloo", help="comma-separated: roce, gloo, nccl, mpi")
    p.add_argument("--model", default="resnet50", help=", ".join(ddp_models.MODELS))
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--iters", type=int, default=20, help="measured iterations per run")
    p.add_argument("--warmup", type=int, default=5, help="iterations run before measuring")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--image-size", type=int, default=None,
                   help="CNN input side; default 224 on cuda, 32 on cpu (same parameters and bytes reduced)")
    p.add_argument("--seq-len", type=int, default=64, help="transformer sequence length")
    p.add_argument("--sweep", action="store_true", help="also run PyTorch's ladder of smaller worlds first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the configuration and every measurement")
    args = p.parse_args()
    args.backends = args.backend.split(",")
    if args.image_size is None:
        args.image_size = 224 if args.device == "cuda" else 32
    return args


def workload(args):
    torch.manual_seed(args.seed)  # identical initial parameters for every backend and run
    return ddp_models.build(args.model, args.batch_size, image_size=args.image_size, seq_len=args.seq_len)


def runs(world, nodes, per_node, sweep):
    """(label, ranks, use DDP) in order of growing world, as PyTorch's sweep."""
    plan = []
    if sweep:
        plan.append(("no ddp", 1, False))
        k = 1
        while k < per_node:
            plan.append((runenv.layout_label(k, per_node), k, True))
            k *= 2
        plan += [(runenv.layout_label(m * per_node, per_node), m * per_node, True) for m in range(1, nodes)]
    plan.append((runenv.layout_label(world, per_node), world, True))
    return plan


def train(args, group, use_ddp, device, progress, tag):
    """Returns (per-iteration seconds, flat parameters, first loss, last loss)."""
    rank = dist.get_rank()
    work = workload(args)
    model = work.model.to(device)
    if use_ddp:
        model = DDP(model, process_group=group, bucket_cap_mb=args.bucket_cap_mb, **NO_BUFFER_SYNC,
                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)  # different data per rank, same per backend
    batches = [[t.to(device) for t in work.make_batch(g)] for _ in range(DISTINCT_BATCHES)]
    times, losses = [], []
    total = args.warmup + args.iters
    for i in range(total):
        x, y = batches[i % DISTINCT_BATCHES]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(dt)
        phase = "warm-up" if i < args.warmup else "measure"
        progress.update(f"{tag}: {phase} iteration {i + 1}/{total}  {dt:.3f}s  loss {losses[-1]:.4f}")
    module = model.module if use_ddp else model
    params = torch.cat([p.detach().flatten().cpu() for p in module.parameters()])
    return times, params, losses[0], losses[-1]


def percentile_line(n, unit, label, times, batch):
    line = f"{n:4d} {unit} -- {label:>8s}:"
    for q in PERCENTILES:
        t = float(np.percentile(times, q))
        line += f"  p{q:02d}:  {t:1.3f}s  {int(batch / t):6d}/s"
    return line


def column_header():
    return " " * 22 + f"{'sec/iter':>14s}{'ex/sec':>10s}" * len(PERCENTILES)


def main():
    args = parse_args()
    runenv.check_backends(args.backends, args.device)
    coord = runenv.init_coordination()
    rank = dist.get_rank()
    world, nodes, per_node = runenv.world_layout()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    unit = "GPUs" if args.device == "cuda" else "CPUs"
    work = workload(args)
    n_params = sum(p.numel() for p in work.model.parameters())
    say = print if rank == 0 else (lambda *a, **k: None)
    say("-" * 60)
    say("roce DDP benchmark (layout of PyTorch's benchmarks/distributed/ddp)")
    say("-" * 60)
    for line in runenv.config_lines(args.backends, args.device):
        say(line)
    say(f"* Model: {args.model}: {work.describe}; {n_params / 1e6:.2f}M parameters "
        f"({n_params * 4 / 2**20:.0f} MiB of fp32 gradients reduced per step)")
    say(f"* Batch size: {args.batch_size} per process; {args.warmup} warm-up + {args.iters} measured iterations; "
        f"SGD; synthetic data")
    say(f"* Maximum bucket size: {args.bucket_cap_mb:g}MB", flush=True)

    progress = runenv.Progress()
    results, final = [], {}
    for backend in args.backends:
        say(f"\nBenchmark: {args.model} with batch size {args.batch_size}, backend {backend}")
        say(column_header(), flush=True)
        for label, size, use_ddp in runs(world, nodes, per_node, args.sweep):
            ranks = list(range(size))
            group = dist.new_group(ranks=ranks, backend=backend) if use_ddp else None
            times, first_loss, last_loss = [], None, None
            if rank in ranks:
                times, params, first_loss, last_loss = train(
                    args, group, use_ddp, device, progress, f"[{backend} {label}]")
                if size == world:
                    final[backend] = params
            progress.clear()
            if group is not None:
                dist.destroy_process_group(group)
            pooled = [t for ts in gather(times) for t in ts]
            say(percentile_line(size, unit, label, pooled, args.batch_size), flush=True)
            results.append({"backend": backend, "label": label, "ranks": ranks, "ddp": use_ddp,
                            "measurements": pooled, "loss_first": first_loss, "loss_last": last_loss,
                            "p50": float(np.percentile(pooled, 50))})

    comparison = compare(args.backends, final, results, world, coord)
    for line in comparison["lines"]:
        say(line)
    if rank == 0 and args.json:
        config = vars(args) | {"world": world, "nodes": nodes, "per_node": per_node, "parameters": n_params,
                               "torch": torch.__version__, "roce_settings": runenv.roce_settings()}
        with open(args.json, "w") as f:
            json.dump({"config": config, "results": results,
                       "comparison": {k: v for k, v in comparison.items() if k != "lines"}}, f, indent=1)
    dist.destroy_process_group()


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def compare(backends, final, results, world, coord):
    """Every backend against the first: parameters after training (max over
    ranks of the largest element difference) and p50 throughput ratio."""
    base = backends[0]
    full = {r["backend"]: r for r in results if len(r["ranks"]) == world}
    out = {"lines": [], "max_param_diff": {}, "throughput_ratio_p50": {}}
    if len(backends) > 1:
        out["lines"].append("")
    for other in backends[1:]:
        diff = torch.tensor([(final[base] - final[other]).abs().max().item()], dtype=torch.float64)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX, group=coord)
        ratio = full[other]["p50"] / full[base]["p50"]  # same batch: time ratio = throughput ratio
        out["max_param_diff"][f"{base}-{other}"] = diff.item()
        out["throughput_ratio_p50"][f"{base}/{other}"] = ratio
        out["lines"] += [f"* max |param({base}) - param({other})| after training: {diff.item():.3e}",
                         f"* throughput {base}/{other} (p50): {ratio:.2f}x"]
    return out


if __name__ == "__main__":
    main()
