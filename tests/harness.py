"""Runs a function on every rank of a freshly spawned process group.

Each rank is a `spawn`ed process (it pays `import torch` once), so tests run a
whole matrix inside one group instead of spawning per case. A rank reports its
return value or its traceback; the parent enforces an overall deadline and
kills stragglers, so a hang fails the test instead of the CI run.
"""
import importlib
import multiprocessing as mp
import os
import socket
import time
import traceback
from datetime import timedelta

# A test group normally finishes in seconds to a minute; this bounds a hang.
DEFAULT_DEADLINE_S = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store_wait(store, key, count, arrive=True):
    if arrive:
        store.add(key, 1)
    deadline = time.monotonic() + 120
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _rank_main(rank, world, port, env, target, kwargs, init, queue):
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        import torch.distributed as dist

        import roce_pg  # noqa: F401  (registers "roce")

        if init:
            dist.init_process_group(
                "roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                timeout=timedelta(seconds=float(env.get("TEST_PG_TIMEOUT_S", 120))),
            )
        module, name = target.rsplit(".", 1)
        fn = getattr(importlib.import_module(module), name)
        result = fn(rank=rank, world=world, port=port, **kwargs)
        if init and dist.is_initialized():
            # Rank 0 hosts the store: nobody leaves before everyone is done,
            # even when the group under test is broken on purpose.
            store = dist.distributed_c10d._get_default_store()
            _store_wait(store, "harness/done", world)
            if rank == 0:
                _store_wait(store, "harness/left", world - 1, arrive=False)
            else:
                store.add("harness/left", 1)
            dist.destroy_process_group()
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_group(target, world, env=None, kwargs=None, init=True, deadline_s=DEFAULT_DEADLINE_S,
              rank_env=None, start_method="spawn"):
    """Runs `target` ("module.function") on `world` ranks; returns results by rank.

    env applies to every rank, rank_env[r] (optional) to rank r on top of it.
    Raises AssertionError with every failing rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(env or {})
        e.update((rank_env or {}).get(r, {}))
        p = ctx.Process(target=_rank_main, args=(r, world, port, e, target, kwargs or {}, init, queue))
        p.start()
        procs.append(p)
    results, errors = {}, {}
    end = time.monotonic() + deadline_s
    while len(results) + len(errors) < world and time.monotonic() < end:
        try:
            rank, status, value = queue.get(timeout=1)
        except Exception:  # queue.Empty
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
            continue
        (results if status == "ok" else errors)[rank] = value
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    missing = [r for r in range(world) if r not in results and r not in errors]
    if errors or missing:
        msg = [f"rank {r} failed:\n{tb}" for r, tb in sorted(errors.items())]
        if missing:
            msg.append(f"ranks {missing} reported nothing (hung past {deadline_s}s or died; "
                       f"exit codes {[p.exitcode for p in procs]})")
        raise AssertionError("\n".join(msg))
    return [results[r] for r in range(world)]


# Process layouts used across the suite: (world size, environment). The
# network layouts name TCP explicitly: this host has no RDMA device, and
# without the variable a group spanning "machines" refuses to start.
TCP = {"ROCE_PG_NET_TRANSPORT": "tcp"}
LAYOUTS = {
    "single": (1, {}),
    "shm2": (2, {}),
    "shm3": (3, {}),
    "shm4": (4, {}),
    "net2": (2, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    "net3": (3, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    "net4": (4, {"ROCE_PG_FORCE_NETWORK": "1", **TCP}),
    # Two simulated machines with two ranks each: shared memory inside a
    # "machine", the network between them.
    "mixed2x2": (4, {"ROCE_PG_SIM_RANKS_PER_NODE": "2", **TCP}),
    # Every peer over verbs (Soft-RoCE VM suite).
    "verbs2": (2, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
    "verbs3": (3, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
    "verbs4": (4, {"ROCE_PG_FORCE_NETWORK": "1", "ROCE_PG_NET_TRANSPORT": "verbs"}),
}
