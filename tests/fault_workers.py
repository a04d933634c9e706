"""Rank-side bodies of the fault and leak tests (tests/test_faults.py on the host,
tests/softroce/guest_suite.py over verbs in a Soft-RoCE VM).

A victim rank writes time.monotonic() to a file right before it SIGKILLs
itself; the survivors take the moment their operation raised and report the
difference (CLOCK_MONOTONIC is one clock for every process of a machine).
Survivors wait with Work.wait(timeout=cap_s), far below the group timeout, so
a missing detection ends the test in cap_s seconds instead of hanging it until
the group timeout: the report then says that nothing was detected.
"""
import ctypes
import gc
import importlib
import os
import shutil
import signal
import socket
import subprocess
import time
from datetime import timedelta

import torch
import torch.distributed as dist

KILL_FILE = "kill_t"
KILL_WALL_FILE = "kill_wall"


# ---------------------------------------------------------------- resources

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _rss_kib():
    """Private (anonymous) resident memory: what a leak grows. VmRSS also counts
    shared-memory pages, and the shm rings' pages become resident one by one as
    messages first travel through them (up to the rings' fixed size): growth
    that looks like a leak for the first few MiB of traffic but is bounded.
    Free memory the allocator keeps cached is handed back first (malloc_trim),
    so what remains is memory something still holds."""
    if "asan" not in os.environ.get("LD_PRELOAD", ""):  # ASan owns the heap there (and RSS is not checked)
        ctypes.CDLL(None).malloc_trim(0)
    return _status_kib("RssAnon")


def rdma_resources():
    """Summary of `rdma res show` (netlink; no verbs in this process): {"qp": n, "mr": n, ...} over all devices."""
    try:
        out = subprocess.run(["rdma", "res", "show"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    total = {}
    for line in out.splitlines():
        words = line.split()
        for name, value in zip(words[2::2], words[3::2]):  # "0: rxe0: pd 3 cq 6 qp 5 cm_id 0 mr 10 ctx 3 srq 0"
            if value.isdigit():
                total[name] = total.get(name, 0) + int(value)
    return total


def resources(rdma=False):
    """What this process holds: fds, threads, RSS, its /dev/shm names and shared-memory mappings."""
    gc.collect()
    pid = os.getpid()
    with open("/proc/self/maps") as f:
        shm_maps = sum(1 for line in f if "/dev/shm/" in line)
    res = {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "rss_kib": _rss_kib(),
        "shmem_kib": _status_kib("RssShmem"),  # the rings' touched pages (bounded by their size)
        "shm_names": sorted(n for n in os.listdir("/dev/shm") if n.startswith("roce_pg") and f".{pid}." in n),
        "shm_maps": shm_maps,
    }
    if rdma:
        res["rdma"] = rdma_resources()
    return res


# ---------------------------------------------------------------- dying and noticing

def mark_time(scratch):
    """Records the moment of a fault for the survivors: CLOCK_MONOTONIC (same
    machine) and the wall clock (other machines, as exact as their clocks agree)."""
    for name, value in ((KILL_FILE, time.monotonic()), (KILL_WALL_FILE, time.time())):
        path = os.path.join(scratch, name)
        with open(path + ".tmp", "w") as f:
            f.write(repr(value))
        os.rename(path + ".tmp", path)


def die(scratch):
    """Records the kill time for the survivors, then SIGKILLs this process (no cleanup of any kind)."""
    mark_time(scratch)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


def _kill_time(scratch, wait_s=5.0, name=KILL_FILE):
    path = os.path.join(scratch, name)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            with open(path) as f:
                return float(f.read())
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


def await_failure(start, scratch, cap_s, loop=False, wall=False):
    """Issues start() -> Work and waits for it (again and again if loop) until one raises.

    Returns {"detect_s": seconds from the fault to the error (None if nothing
    was detected within cap_s), "msg", "type", "ops"}; wall=True measures with
    the wall clock, for a fault on another machine."""
    t0 = time.monotonic()
    ops = 0
    while True:
        left = cap_s - (time.monotonic() - t0)
        try:
            if left <= 0:
                raise TimeoutError(f"no operation failed within {cap_s} s")
            start().wait(timeout=timedelta(seconds=left))
            ops += 1
            if not loop:
                return {"detect_s": None, "msg": "the operation completed although its peer was dead",
                        "type": None, "ops": ops}
        except Exception as e:  # noqa: BLE001
            t_err = time.monotonic()
            wall_err = time.time()
            msg = str(e)
            kill_t = _kill_time(scratch, name=KILL_WALL_FILE if wall else KILL_FILE)
            capped = isinstance(e, TimeoutError) or "did not complete within wait(timeout" in msg
            delay = (wall_err if wall else t_err) - kill_t if kill_t is not None else None
            return {"detect_s": None if capped or delay is None else round(delay, 3),
                    "waited_s": round(t_err - t0, 3), "msg": msg[:2000], "type": type(e).__name__,
                    "dist_backend_error": isinstance(e, dist.DistBackendError), "ops": ops,
                    "capped": capped, "kill_t_seen": kill_t is not None}


def kill_during_allreduce(rank, world, port, victim, scratch, nbytes=64 << 20, rounds=3, cap_s=20.0, pause_s=0.01):
    """Every rank runs large allreduces in a loop; `victim` dies in the middle of round rounds+1."""
    t = torch.empty(nbytes // 4)
    expected = float(world * (world + 1) // 2)
    t0 = time.monotonic()
    for _ in range(rounds):
        t.fill_(rank + 1)
        dist.all_reduce(t)
        assert t[0].item() == expected and t[-1].item() == expected, (t[0].item(), t[-1].item())
    per_round = (time.monotonic() - t0) / rounds
    if rank == victim:
        t.fill_(rank + 1)
        dist.all_reduce(t, async_op=True)
        time.sleep(pause_s)  # the transfer is under way
        die(scratch)

    def again():
        t.fill_(rank + 1)
        return dist.all_reduce(t, async_op=True)

    res = await_failure(again, scratch, cap_s, loop=True)
    res.update(round_s=round(per_round, 3), host=socket.gethostname())
    return res


def kill_while_idle(rank, world, port, victim, scratch, how="recv", cap_s=20.0, pause_s=1.0):
    """The survivors wait in a receive from `victim` (how="recv") or in a barrier
    (how="barrier") that only the victim has not joined; the victim dies meanwhile."""
    dist.barrier()
    if rank == victim:
        time.sleep(pause_s)  # the others are idle in their wait by now
        die(scratch)
    if how == "recv":
        buf = torch.empty(1000)
        res = await_failure(lambda: dist.irecv(buf, src=victim), scratch, cap_s)
    else:
        res = await_failure(lambda: dist.barrier(async_op=True), scratch, cap_s)
    res["host"] = socket.gethostname()
    return res


def _serve_store(port, ready):
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    ready.set()
    while True:  # until the test stops (SIGSTOP) and kills (SIGKILL) this process
        time.sleep(1)
        store.num_keys()


def kill_with_store_frozen(rank, world, port, victim, scratch, store_port, cap_s=20.0, timeout_s=300,
                           nbytes=8 << 20):
    """The group's store lives in a process of its own, which rank 0 freezes
    (SIGSTOP: its socket stays open and silent, like a host cut off by a
    partition); then `victim` dies during an allreduce loop. Store calls would
    now block for the whole store timeout (300 s), so the survivors must find
    the dead rank without the store and destroy the group without waiting on it."""
    store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("roce", store=dist.PrefixStore("frozen", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    t = torch.empty(nbytes // 4)
    for _ in range(2):
        t.fill_(1.0)
        dist.all_reduce(t)
        assert t[0].item() == world
    dist.barrier()
    if rank == 0:
        with open(os.path.join(scratch, "store_pid")) as f:
            os.kill(int(f.read()), signal.SIGSTOP)
        mark_time(os.path.join(scratch, "frozen"))
    _kill_time(os.path.join(scratch, "frozen"), wait_s=30.0)  # everyone starts after the freeze
    if rank == victim:
        t.fill_(1.0)
        dist.all_reduce(t, async_op=True)
        time.sleep(0.01)
        die(scratch)

    def again():
        t.fill_(1.0)
        return dist.all_reduce(t, async_op=True)

    res = await_failure(again, scratch, cap_s, loop=True)
    t0 = time.monotonic()
    dist.destroy_process_group()
    res["destroy_s"] = round(time.monotonic() - t0, 3)
    res["host"] = socket.gethostname()
    return res


def run_with_frozen_store(scenario_kwargs, world, env, deadline_s, rank_env=None):
    """Starts the store process for kill_with_store_frozen, runs the group, kills the store."""
    import multiprocessing as mp

    from .support.ports import free_port
    from .support.ranks import run_group

    scratch = scenario_kwargs["scratch"]
    os.makedirs(os.path.join(scratch, "frozen"), exist_ok=True)
    store_port = free_port()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    server = ctx.Process(target=_serve_store, args=(store_port, ready), daemon=True)
    server.start()
    try:
        assert ready.wait(60), "the store process did not start"
        with open(os.path.join(scratch, "store_pid"), "w") as f:
            f.write(str(server.pid))
        return run_group("tests.fault_workers.kill_with_store_frozen", world, env=env, init=False,
                         kwargs={**scenario_kwargs, "store_port": store_port}, start_method="fork", rank_env=rank_env,
                         expect_dead={scenario_kwargs["victim"]}, deadline_s=deadline_s)
    finally:
        server.kill()
        server.join()


def _private_store(rank, world, port, host="127.0.0.1"):
    return dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=timedelta(seconds=120))


def _leave_together(store, rank, world, key="test/done"):
    """Rank 0 hosts the store: nobody leaves before everyone is done with it."""
    from .support.ranks import store_wait

    store_wait(store, key, world)
    if rank == 0:
        store_wait(store, key + "/left", world - 1, arrive=False)
    else:
        store.add(key + "/left", 1)


def garbage_frames(rank, world, port, bad, cap_s=20.0, timeout_s=120):
    """Rank `bad` runs with ROCE_PG_TEST_FAULT=garbage_frames (set by the caller):
    the others must raise a clear error naming it, within cap_s, without crashing."""
    assert (os.environ.get("ROCE_PG_TEST_FAULT") == "garbage_frames") == (rank == bad)
    store = _private_store(rank, world, port)
    t0 = time.monotonic()
    res = {"stage": "init"}
    try:
        dist.init_process_group("roce", store=dist.PrefixStore("garbage", store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        res["stage"] = "collectives"
        for i in range(20):
            t = torch.full((100_000 if i % 2 else 10,), float(rank))
            left = cap_s - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError(f"no error within {cap_s} s")
            dist.all_reduce(t, async_op=True).wait(timeout=timedelta(seconds=left))
            assert torch.all(t == float(sum(range(world)))), "corrupted frames were accepted as data"
        res.update(raised=False, msg="20 allreduces completed")
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        res.update(raised=True, msg=msg[:2000], type=type(e).__name__,
                   capped=isinstance(e, TimeoutError) or "did not complete within wait(timeout" in msg)
    res["elapsed"] = round(time.monotonic() - t0, 3)
    _leave_together(store, rank, world)
    if dist.is_initialized():
        t1 = time.monotonic()
        dist.destroy_process_group()
        res["destroy_s"] = round(time.monotonic() - t1, 3)
    return res


SHM_FULL_CAUSE = ("/dev/shm (no space left)", "--shm-size")


def _small_allreduce_is_exact(rank, world):
    """512 int64 per rank: within the slots' first page, which every rank
    reserved with its group, so it allocates nothing."""
    t = torch.arange(512, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    return torch.equal(t, torch.arange(512, dtype=torch.int64) * sum(r + 1 for r in range(world)))


def shm_full(rank, world, port, bad):
    """Rank `bad` runs with ROCE_PG_TEST_FAULT=shm_full (set by the caller):
    allocating shared-memory pages beyond its group's reservation fails on
    it, as on a full /dev/shm. A ring is allocated by its first writer, so a
    small collective through the slots works everywhere, rank 0's message to
    `bad` arrives (rank 0 allocates that ring) and the other ranks' messages
    to each other arrive. Then `bad`'s first send to rank 0 fails at once
    naming the cause and the fix, and the group is broken on every rank: the
    others' next collective fails naming `bad` and the cause."""
    from .api_workers import expect_error
    from .connection_workers import _store_barrier

    assert (os.environ.get("ROCE_PG_TEST_FAULT") == "shm_full") == (rank == bad)
    n = 70_000  # more than one 64 KiB chunk of the ring's pages
    cause = ("could not allocate the shared-memory ring", *SHM_FULL_CAUSE, "ROCE_PG_SHM_RING_BYTES")
    out = {"allreduce_exact": _small_allreduce_is_exact(rank, world)}
    if rank == 0:
        dist.send(torch.arange(n, dtype=torch.int64) * 7, dst=bad)
    elif rank == bad:
        got = torch.empty(n, dtype=torch.int64)
        dist.recv(got, src=0)
        out["received_from_0"] = torch.equal(got, torch.arange(n, dtype=torch.int64) * 7)
    others = [r for r in range(world) if r != bad]
    if rank in others:
        peer = others[1] if rank == others[0] else others[0]
        mine, got = torch.arange(n, dtype=torch.int64) * (rank + 3), torch.empty(n, dtype=torch.int64)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer)]):
            w.wait()
        out["pair_exact"] = torch.equal(got, torch.arange(n, dtype=torch.int64) * (peer + 3))
    _store_barrier("shm-full-before", world)
    t0 = time.monotonic()
    if rank == bad:
        out["error"] = expect_error(lambda: dist.send(torch.ones(10), dst=0), "rank 0 (this machine)", *cause)
    else:
        out["error"] = expect_error(
            lambda: dist.all_reduce(torch.ones(10), async_op=True).wait(timeout=timedelta(seconds=60)),
            f"rank {bad}", *cause)
    out["error_s"] = time.monotonic() - t0
    _store_barrier("shm-full-done", world)
    return out


def shm_full_slots(rank, world, port, bad):
    """As shm_full, for the slots of the shared-memory collectives: a small
    allreduce works everywhere; the first one larger than the slots' reserved
    page fails on `bad` before its first barrier, naming the cause and the
    fix, and on the other ranks (waiting at that barrier) naming `bad`."""
    from .api_workers import expect_error
    from .connection_workers import _store_barrier

    assert (os.environ.get("ROCE_PG_TEST_FAULT") == "shm_full") == (rank == bad)
    cause = ("could not allocate this rank's shared-memory slots", *SHM_FULL_CAUSE, "ROCE_PG_SHM_SLOT_BYTES")
    out = {"allreduce_exact": _small_allreduce_is_exact(rank, world)}
    _store_barrier("shm-slots-before", world)
    big = torch.ones(70_000)
    t0 = time.monotonic()
    if rank == bad:
        out["error"] = expect_error(lambda: dist.all_reduce(big), *cause)
    else:
        out["error"] = expect_error(
            lambda: dist.all_reduce(big, async_op=True).wait(timeout=timedelta(seconds=60)), f"rank {bad}", *cause)
    out["error_s"] = time.monotonic() - t0
    _store_barrier("shm-slots-done", world)
    return out


# ---------------------------------------------------------------- leaks

def recreate_group(rank, world, port, cycles=50, rdma=False, timeout_s=60):
    """Creates, uses and destroys the default group `cycles` times; samples what the process holds."""
    from .support.ranks import store_wait

    store = _private_store(rank, world, port)
    samples, during = [], None
    t0 = time.monotonic()
    for i in range(cycles):
        try:
            dist.init_process_group("roce", store=dist.PrefixStore(f"cycle{i}", store), rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s))
            t = torch.full((4099,), float(rank + i))
            dist.all_reduce(t)
            assert torch.all(t == float(sum(range(world)) + world * i)), i
            outs = [torch.empty(3) for _ in range(world)]
            dist.all_gather(outs, torch.full((3,), float(rank)))
            dist.barrier()
            if i == 0:
                during = resources(rdma and rank == 0)
                store_wait(store, "cycle0/sampled", world)  # rdma counts are per machine
            dist.destroy_process_group()
            # Python may hold the group in a reference cycle until a collection;
            # rdma counts are per machine, so every rank collects before anyone samples.
            gc.collect()
            store_wait(store, f"cycle{i}/destroyed", world)  # nobody samples before every group is gone
            samples.append(resources(rdma and rank == 0 and i in (0, 1, cycles - 1)))
            # ... and nobody opens the next group's device while rank 0 counts the machine's RDMA objects
            store_wait(store, f"cycle{i}/sampled", world)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"cycle {i} of {cycles} on rank {rank}: {e}") from e
    elapsed = time.monotonic() - t0
    _leave_together(store, rank, world)
    return {"during": during, "first": samples[0], "second": samples[1], "last": samples[-1],
            "rss_kib": [s["rss_kib"] for s in samples], "seconds": round(elapsed, 1)}


def _mixed_op(i, rank, world):
    """One small collective (or point-to-point exchange) chosen by i; checks its result."""
    k = i % 10
    right, left = (rank + 1) % world, (rank - 1) % world
    if k == 0:
        t = torch.full((257,), float(rank))
        dist.all_reduce(t)
        ok = t[0].item() == sum(range(world))
    elif k == 1:
        t = torch.full((33,), i, dtype=torch.int64) if rank == i % world else torch.zeros(33, dtype=torch.int64)
        dist.broadcast(t, src=i % world)
        ok = t[-1].item() == i
    elif k == 2:
        out = torch.empty(world * 5, dtype=torch.int32)
        dist.all_gather_into_tensor(out, torch.full((5,), rank, dtype=torch.int32))
        ok = out.tolist() == [r for r in range(world) for _ in range(5)]
    elif k == 3:
        out = torch.empty(8)
        dist.reduce_scatter_tensor(out, torch.ones(8 * world))
        ok = out[0].item() == world
    elif k == 4:
        out = torch.empty(world * 2, dtype=torch.int64)
        dist.all_to_all_single(out, torch.arange(world * 2, dtype=torch.int64) + 100 * rank)
        ok = out[1].item() == 1 + 2 * rank and out[-1].item() == 100 * (world - 1) + 2 * rank + 1
    elif k == 5:
        got = torch.empty(16)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, left),
                                         dist.P2POp(dist.isend, torch.full((16,), float(rank)), right)]):
            w.wait()
        ok = got[0].item() == left
    elif k == 6:
        dist.barrier()
        ok = True
    elif k == 7:
        ts = [torch.full((64,), 1.0) for _ in range(4)]
        for w in [dist.all_reduce(x, async_op=True) for x in ts]:
            w.wait()
        ok = all(x[0].item() == world for x in ts)
    elif k == 8:
        t = torch.full((100,), float(rank + 1))
        dist.reduce(t, dst=i % world)
        ok = rank != i % world or t[0].item() == world * (world + 1) // 2
    else:
        t = torch.full((5000,), 2.0, dtype=torch.float64)  # a little larger, several KiB
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ok = t[-1].item() == 2.0
    if not ok:
        raise AssertionError(f"mixed op {k} (#{i}) returned a wrong result on rank {rank}")


def mixed_collectives(rank, world, port, total=10_000, warmup=1000, sample_every=1000, rdma=False, progress=False):
    """`total` small collectives of ten kinds; samples resources after the warm-up and every sample_every ops."""
    samples = {}
    t0 = time.monotonic()
    for i in range(total):
        _mixed_op(i, rank, world)
        n = i + 1
        if n == warmup or n % sample_every == 0:
            # rdma counts are per machine: sample them only with every rank at the same point
            dist.barrier()
            samples[n] = resources(rdma and rank == 0 and n in (warmup, total))
            dist.barrier()
            if rank == 0 and progress:
                print(f"[mixed] {n} ops, {n / (time.monotonic() - t0):.0f} ops/s, {samples[n]}", flush=True)
    elapsed = time.monotonic() - t0
    return {"samples": samples, "seconds": round(elapsed, 1), "ops_per_s": round(total / elapsed, 1)}


# ---------------------------------------------------------------- driver

def run_scenarios(rank, world, port, scenarios):
    """Runs each scenario in a group forked from this process (torch is imported
    once, here) and returns {name: per-rank results, or {"error": text}}.

    scenarios: {name: {"target", "world", "env", "kwargs", "init", "expect_dead",
    "rank_env", "deadline_s"}}; kwargs get a fresh "scratch" directory."""
    import tempfile

    from .support.ranks import run_group

    out = {}
    for name, sc in scenarios.items():
        scratch = tempfile.mkdtemp(prefix="roce-fault.")
        t0 = time.monotonic()
        try:
            kwargs = dict(sc.get("kwargs", {}))
            if sc.get("scratch"):
                kwargs["scratch"] = scratch
            if sc.get("runner"):  # a scenario that needs more than a group (e.g. a store process)
                module, fn = sc["runner"].rsplit(".", 1)
                runner = getattr(importlib.import_module(module), fn)
                res = runner(kwargs, sc["world"], sc.get("env"), sc.get("deadline_s", 300), sc.get("rank_env"))
            else:
                res = run_group(sc["target"], sc["world"], env=sc.get("env"), kwargs=kwargs,
                                init=sc.get("init", True), deadline_s=sc.get("deadline_s", 300),
                                rank_env=sc.get("rank_env"), start_method="fork",
                                expect_dead=sc.get("expect_dead", ()))
            out[name] = {"ranks": res}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {e}"[-6000:]}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"[faults] {name}: {out[name]['seconds']} s", flush=True)
    return out
