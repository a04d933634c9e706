"""DDP communication hooks on roce: a hook of your own built on
Work.get_future(), and PyTorch's built-in fp16 compression hook, each checked
against plain DDP on the same seed and data.

    torchrun --standalone --nproc_per_node 2 examples/comm_hook.py

A comm hook receives each gradient bucket and returns a Future of the reduced
bucket; DDP copies the result into the gradients when the future completes.
roce's Work.get_future() completes when the collective has finished, so a
hook can chain work on it with `then` without blocking the backward pass.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import roce_pg  # noqa: F401  (registers "roce"; torch >= 2.15 finds it by name anyway)


def mean_hook(state, bucket):
    """Sum the bucket asynchronously, then divide in the future's callback."""
    state["calls"] += 1
    world = dist.get_world_size(state["group"])
    fut = dist.all_reduce(bucket.buffer(), group=state["group"], async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def train(steps, hook=None, state=None):
    torch.manual_seed(0)  # same initial parameters for every variant
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)),
                bucket_cap_mb=0.1)  # small buckets: the hook runs several times per step
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own data
    data = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)]
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.cat([p.detach().flatten() for p in model.module.parameters()]), losses


def max_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    dist.init_process_group("roce")
    plain, losses = train(args.steps)
    state = {"group": dist.group.WORLD, "calls": 0}
    results = {
        # Exact: the same sum and division as DDP's own averaging.
        "get_future hook": (train(args.steps, mean_hook, state)[0], 1e-5),
        # Gradients rounded to fp16 before the sum: close, not equal.
        "fp16_compress_hook": (train(args.steps, default_hooks.fp16_compress_hook, dist.group.WORLD)[0], 2e-3),
    }
    ok = state["calls"] > args.steps  # several buckets per step went through the hook
    if dist.get_rank() == 0:
        print(f"plain DDP: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps")
        print(f"get_future hook: called {state['calls']} times ({state['calls'] / args.steps:g} buckets per step)")
    for name, (params, limit) in results.items():
        diff = max_over_ranks((params - plain).abs().max().item())
        ok &= diff <= limit
        if dist.get_rank() == 0:
            print(f"{name}: max |param - plain DDP param| = {diff:.3e} (limit {limit:g}) "
                  f"{'OK' if diff <= limit else 'MISMATCH'}")
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
