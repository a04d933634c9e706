"""Runs a function on every rank of a freshly started process group.

How the tests and the benchmarks start a group's ranks on this machine:
run_group starts them, gives each a free port for the group's store, collects
what each returns, and fails with every failing rank's traceback.

By default ("forkserver") each rank is forked from multiprocessing's fork
server, a clean single-threaded process that has imported torch once for the
whole test session: a 4-rank group then starts in about 0.7 s instead of the
6 s four fresh interpreters take to import torch on a 2-core machine. The
rank starts from the caller's environment as it is at the call (copied over,
as a spawned process would inherit it; of what torch reads at its import,
only TORCH_DISTRIBUTED_DEBUG is read again) and imports roce_pg itself,
after `prepare`. "spawn" gives each rank a fresh interpreter. With
start_method="fork" the ranks are forked from the caller, which must have
imported torch already and must not have touched verbs (no ibv_fork_init) nor
initialized a process group: under CPU emulation (the Soft-RoCE VMs) that
saves minutes per group. Tests still run a whole matrix inside one group
rather than one group per case. A rank reports its return value or its traceback; the
parent enforces an overall deadline and kills stragglers, so a hang fails the
test instead of the CI run. Ranks named in expect_dead are meant to kill
themselves (fault tests): they must die by SIGKILL and report nothing.
"""
import importlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from datetime import timedelta

from .ports import free_port

# A test group normally finishes in seconds to a minute; this bounds a hang.
DEFAULT_DEADLINE_S = 600


def store_wait(store, key, count, arrive=True):
    """Adds one to `key` (unless arrive=False), then waits up to 120 s until
    it reaches `count`: a barrier on the store, also for groups that are
    broken on purpose."""
    if arrive:
        store.add(key, 1)
    deadline = time.monotonic() + 120
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _call(function_path, /, **kwargs):
    # Positional-only: workers such as verbs_workers.with_proof take their own `target` kwarg.
    module, name = function_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**kwargs)


# What the fork server imports once, before it forks any rank: torch and its
# distributed package (about 4 s of a fresh interpreter), nothing of roce_pg.
FORKSERVER_PRELOAD = ["torch", "torch.distributed"]


def _context(start_method):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # takes effect when the server starts
    return ctx


# After a rank reported an error: how long the others still get to report.
ERROR_GRACE_S = 30


def _rank_main(rank, world, port, env, target, kwargs, init, queue, host="127.0.0.1", alive=None, prepare=None,
               base_env=None):
    if base_env is not None:  # a fork server's child: the caller's environment, not the server's
        os.environ.clear()
        os.environ.update(base_env)
    os.environ.update({k: str(v) for k, v in env.items()})
    alive = world if alive is None else alive  # ranks expected to reach the end
    try:
        import torch.distributed as dist

        if base_env is not None:
            # What torch reads when it is imported came from the server's
            # environment: TORCH_DISTRIBUTED_DEBUG is the one these tests set.
            dist.set_debug_level_from_env()
        if prepare:
            _call(prepare)  # before roce_pg registers (e.g. loading a test device)
        import roce_pg  # noqa: F401  (registers "roce")

        if init:
            dist.init_process_group(
                "roce", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world,
                timeout=timedelta(seconds=float(env.get("TEST_PG_TIMEOUT_S", 120))),
            )
        result = _call(target, rank=rank, world=world, port=port, **kwargs)
        if init and dist.is_initialized():
            # Rank 0 hosts the store: nobody leaves before everyone is done,
            # even when the group under test is broken on purpose.
            store = dist.distributed_c10d._get_default_store()
            store_wait(store, "harness/done", alive)
            if rank == 0:
                store_wait(store, "harness/left", alive - 1, arrive=False)
            else:
                store.add("harness/left", 1)
            dist.destroy_process_group()
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_group(target, world, env=None, kwargs=None, init=True, deadline_s=DEFAULT_DEADLINE_S,
              rank_env=None, start_method="forkserver", expect_dead=(), host="127.0.0.1", port=None, ranks=None,
              prepare=None):
    """Runs `target` ("module.function") on `world` ranks; returns results by rank.

    Each rank calls target(rank=, world=, port=, **kwargs). With init (the
    default) it first joins a "roce" world group whose store rank 0 hosts on
    `port`, and leaves it after the target returns; with init=False the
    target forms its own groups (any backend), `port` free for their store.
    env applies to every rank, rank_env[r] (optional) to rank r on top of it.
    start_method: "forkserver", "spawn" (fresh interpreters) or "fork" (see
    the module doc).
    expect_dead: ranks that end themselves with SIGKILL; they must not report
    (their entry in the result is None), and the others do not wait for them
    at the end. Rank 0 hosts the store, so it cannot be one of them.
    host, port, ranks: for groups spanning machines, the store's address (rank
    0's machine) and the global ranks to start here (default: all); the result
    then lists those ranks only.
    prepare: "module.function" each rank calls first, before importing roce_pg
    (tests/test_accelerator.py loads its test device there).
    Raises AssertionError with every failing rank's traceback.
    """
    if start_method not in ("forkserver", "spawn", "fork"):
        raise ValueError(f"start_method must be 'forkserver', 'spawn' or 'fork', not {start_method!r}")
    expect_dead = set(expect_dead)
    assert 0 not in expect_dead, "rank 0 hosts the store and must stay alive"
    if start_method == "fork":
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            raise RuntimeError("run_group(start_method='fork') from a process with an initialized process group")
    ranks = list(range(world)) if ranks is None else list(ranks)
    ctx = _context(start_method)
    base_env = dict(os.environ) if start_method == "forkserver" else None
    queue = ctx.Queue()
    port = free_port() if port is None else port
    alive = world - len(expect_dead)
    procs = []
    for r in ranks:
        e = dict(env or {})
        e.update((rank_env or {}).get(r, {}))
        p = ctx.Process(target=_rank_main,
                        args=(r, world, port, e, target, kwargs or {}, init, queue, host, alive, prepare, base_env))
        p.start()
        procs.append(p)
    by_rank = dict(zip(ranks, procs))
    waiting_for = [r for r in ranks if r not in expect_dead]
    results, errors = {}, {}
    end = time.monotonic() + deadline_s
    while not all(r in results or r in errors for r in waiting_for) and time.monotonic() < end:
        try:
            rank, status, value = queue.get(timeout=1)
        except Exception:  # queue.Empty
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
            continue
        (results if status == "ok" else errors)[rank] = value
        if status != "ok":
            # The run has failed: the others' reports help diagnose it, but a
            # rank waiting on the failed one (its store, its next message)
            # would hold the suite for its whole timeout.
            end = min(end, time.monotonic() + ERROR_GRACE_S)
    killed = set()
    for r, p in by_rank.items():
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
            killed.add(r)
    missing = [r for r in waiting_for if r not in results and r not in errors]
    # An expected victim must really have died by SIGKILL, not reported or exited.
    survivors = {r: by_rank[r].exitcode for r in ranks if r in expect_dead
                 and (r in results or r in errors or r in killed or by_rank[r].exitcode != -signal.SIGKILL)}
    if errors or missing or survivors:
        msg = [f"rank {r} failed:\n{tb}" for r, tb in sorted(errors.items())]
        if missing:
            msg.append(f"ranks {missing} reported nothing (hung past {deadline_s}s, or {ERROR_GRACE_S}s after "
                       f"another rank's error, or died; "
                       f"exit codes {[p.exitcode for p in procs]})")
        if survivors:
            msg.append(f"ranks {sorted(survivors)} were to kill themselves but did not (exit codes {survivors}, "
                       f"{sorted(killed)} killed by the harness)")
        raise AssertionError("\n".join(msg))
    return [results.get(r) for r in ranks]

