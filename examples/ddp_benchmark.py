"""Short DDP training benchmark: the same synthetic model and data trained with
each backend in one torchrun job, printed in the format of PyTorch's
benchmarks/distributed/ddp/benchmark.py (pXX = percentile over iterations of
the per-iteration wall time, gathered from all ranks; /s = samples per second
per process).

    torchrun --nproc_per_node 2 examples/ddp_benchmark.py --backends roce,gloo
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model(width, depth):
    torch.manual_seed(0)
    layers = [nn.Linear(256, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def train(group, args):
    rank = dist.get_rank()
    model = DDP(make_model(args.width, args.depth), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 256, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times = []
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    return torch.tensor(times, dtype=torch.float64), params


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="roce,gloo")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4)
    args = p.parse_args()
    import roce_pg  # noqa: F401

    dist.init_process_group("gloo")  # coordination only
    world = dist.get_world_size()
    nodes = 1  # torchrun --nproc_per_node on one machine
    n_params = sum(q.numel() for q in make_model(args.width, args.depth).parameters())
    if dist.get_rank() == 0:
        print(f"# DDP benchmark: MLP {args.depth}x{args.width} ({n_params / 1e6:.1f}M parameters, "
              f"{n_params * 4 / 2**20:.0f} MiB of gradients/step), batch {args.batch}, {args.iters} iterations")
    final = {}
    for name in args.backends.split(","):
        group = dist.new_group(backend=name)
        times, params = train(group, args)
        gathered = [torch.empty_like(times) for _ in range(world)]
        dist.all_gather(gathered, times)
        final[name] = params
        if dist.get_rank() == 0:
            all_t = torch.cat(gathered).sort().values
            line = f"{name:>5s} {world:2d} procs -- {nodes}M/{world // nodes}G:"
            for q in (50, 75, 90, 95):
                t = all_t[min(len(all_t) - 1, int(len(all_t) * q / 100))].item()
                line += f"  p{q}: {t:6.3f}s {args.batch / t:7.0f}/s"
            print(line, flush=True)
        dist.destroy_process_group(group)
    names = list(final)
    if len(names) > 1 and dist.get_rank() == 0:
        diff = (final[names[0]] - final[names[1]]).abs().max().item()
        print(f"# max |param({names[0]}) - param({names[1]})| after training: {diff:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
