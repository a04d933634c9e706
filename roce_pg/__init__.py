"""roce: a torch.distributed backend over RDMA verbs, shared memory and TCP.

Importing this package registers the backend name ``"roce"`` for CPU and CUDA
tensors::

    import roce_pg  # optional on torch >= 2.15 (entry point)
    torch.distributed.init_process_group("roce")

Configuration is read from ``ROCE_PG_*`` environment variables (see README).
"""
import torch
import torch.distributed as dist

# The extension's classes derive from torch's c10d bindings: import those first.
from . import _C  # noqa: E402

__all__ = ["register", "rdma_ports", "BACKEND_NAME"]

BACKEND_NAME = "roce"


def _create_backend(dist_backend_opts, backend_options):
    """Creator torch calls for every process group that uses roce."""
    opts = dist_backend_opts
    ranks = list(opts.global_ranks_in_group or [])
    global_rank = ranks[opts.group_rank] if ranks else opts.group_rank
    return _C.RoceBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, global_rank)


def register():
    """Registers "roce" with torch.distributed; calling it again is harmless."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])


def rdma_ports():
    """RDMA ports libibverbs sees on this machine (empty without rdma-core devices)."""
    return _C.rdma_ports()


register()
