"""FSDP2 (torch.distributed.fsdp.fully_shard) on CPU tensors over roce.

    torchrun --standalone --nproc_per_node 2 examples/fsdp2_train.py

Each rank keeps 1/world of every parameter; FSDP2 all-gathers a layer's
parameters before its forward and backward and reduce-scatters its gradients
after, which on CPU tensors are roce's all_gather_into_tensor and
reduce_scatter_tensor. The model learns a fixed random "teacher" network
from synthetic inputs, so the loss has somewhere to go; the run fails if it
does not fall or if the parameters are not actually sharded.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import roce_pg  # noqa: F401  (registers "roce"; torch >= 2.15 finds it by name anyway)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("roce")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    torch.manual_seed(0)  # same model and teacher on every rank
    model = nn.Sequential(*[Block(args.dim) for _ in range(args.layers)], nn.Linear(args.dim, args.dim))
    teacher = nn.Linear(args.dim, args.dim)
    full_params = sum(q.numel() for q in model.parameters())
    # FSDP2 shards dim 0 of every parameter: a rank holds at most ceil(rows / world) rows of each.
    share = sum(-(-q.shape[0] // world) * (q.numel() // q.shape[0]) for q in model.parameters())
    for block in model:  # one all-gather / reduce-scatter unit per block, then the root for the rest
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local_params = sum(q.to_local().numel() for q in model.parameters())

    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    losses = []
    for step in range(args.steps):
        x = torch.randn(64, args.dim, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    # Mean of the first and last few steps over every rank: one noisy batch decides nothing.
    k = max(1, args.steps // 8)
    ends = torch.tensor([sum(losses[:k]) / k, sum(losses[-k:]) / k], dtype=torch.float64)
    dist.all_reduce(ends)
    first, last = (ends / world).tolist()
    sharded = local_params <= share
    if rank == 0:
        print(f"parameters: {full_params} in the model, {local_params} held by rank 0 ({world} ranks)")
        print(f"loss {first:.4f} -> {last:.4f} ({'decreased' if last < first else 'DID NOT DECREASE'})")
    dist.destroy_process_group()
    raise SystemExit(0 if last < 0.5 * first and sharded else 1)


if __name__ == "__main__":
    main()
