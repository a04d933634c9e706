"""Spawning a benchmark's ranks on this machine and collecting what each
reports: target(rank, port, args, queue) runs in `world` fresh interpreters
and puts (rank, "ok", value) or (rank, "error", traceback) on the queue."""
import multiprocessing as mp
import queue as queue_mod
import socket
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(target, world, args, timeout=1800):
    """{rank: value} once every rank reported; exits naming the first rank that
    failed, died without reporting, or did not finish within `timeout` s."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    try:
        while len(results) < world:
            try:
                rank, status, value = queue.get(timeout=1)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead or time.monotonic() > deadline:
                    sys.exit(f"rank(s) {dead} died (exit codes {[p.exitcode for p in procs]})" if dead
                             else f"the ranks did not finish within {timeout} s")
                continue
            if status != "ok":
                sys.exit(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        if len(results) < world:
            for p in procs:
                p.kill()
    for p in procs:
        p.join()
    return results
