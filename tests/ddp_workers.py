"""DDP training with roce compared against the same training with Gloo, in the
same processes (a Gloo subgroup over the same ranks)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 20


def _model():
    torch.manual_seed(1234)  # identical initial parameters for every run
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))


def _batches(rank):
    g = torch.Generator().manual_seed(100 + rank)  # different data per rank
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(STEPS)]


def _train(rank, group, hook=None):
    model = DDP(_model(), process_group=group, bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(rank):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


def _future_hook(state, bucket):
    """A comm hook built on Work.get_future(): average by summing then dividing."""
    world = dist.get_world_size()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def run(rank, world, port):
    gloo = dist.new_group(backend="gloo")
    roce = _train(rank, None)                      # default group: roce
    ref = _train(rank, gloo)
    hooked = _train(rank, None, hook=_future_hook)
    diff = max((a - b).abs().max().item() for a, b in zip(roce, ref))
    diff_hook = max((a - b).abs().max().item() for a, b in zip(hooked, ref))
    moved = max((a - b).abs().max().item() for a, b in zip(roce, [p.detach() for p in _model().parameters()]))
    # Replicas agree across ranks (gather the flattened parameters).
    flat = torch.cat([p.flatten() for p in roce])
    outs = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(outs, flat, group=gloo)
    spread = max((o - outs[0]).abs().max().item() for o in outs)
    return {"diff": diff, "diff_hook": diff_hook, "moved": moved, "spread": spread}
