"""Latency of dist.barrier() between ranks on one machine: 2,000 barriers
after 200 warm-up ones, best of 3, reported by rank 0. With roce a group on
one machine synchronises through one shared-memory barrier (no message);
run it with an older checkout on PYTHONPATH for the dissemination barrier
over messages, and with --backend gloo for Gloo.

    PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/barrier_latency.py --ranks 2 [--backend roce|gloo]
"""
import argparse
import os
import time


def rank_main(rank, world, port, backend, iters, queue):
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if backend == "roce":
        import roce_pg  # noqa: F401  (registers "roce")
    dist.init_process_group(backend, rank=rank, world_size=world)
    for _ in range(200):
        dist.barrier()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.barrier()
        best = min(best, (time.perf_counter() - t0) / iters)
    if rank == 0:
        queue.put(best)
    dist.destroy_process_group()


def main():
    import socket

    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--backend", default="roce", choices=("roce", "gloo"))
    p.add_argument("--iters", type=int, default=2000)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(args.ranks, port, args.backend, args.iters, queue), nprocs=args.ranks)
    print(f"{args.backend}: {args.ranks} local ranks, barrier {queue.get() * 1e6:.1f} us (best of 3 x {args.iters})")


if __name__ == "__main__":
    main()
