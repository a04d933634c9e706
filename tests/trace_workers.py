"""Rank functions for tests/test_trace.py: roce's flight recorder.

Each check compares what roce_pg.trace() recorded with what the rank itself
issued (op, sizes from the tensors it passed, dtypes, root/peer, order), and
torch's own flight recorder for roce (the hook torch attaches to groups whose
backend does not record into it natively) with roce's entries one to one.
"""
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import roce_pg

from .api_workers import expect_error


def _torch_entries(group):
    """torch's flight-recorder entries for `group` (its per-backend recorder for roce)."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    dump = json.loads(_dump_fr_trace_json(True, False, backend="roce"))
    return [e for e in dump.get("entries", []) if e["process_group"][0] == group.group_name]


def _torch_entries_settled(group, retired=None, timeout_s=5):
    """_torch_entries once `retired` of them (default: all) are retired: roce
    fires the completion hook just after the Work completes (so that torch's
    post-hook cannot miss it), so an op whose wait() has returned may still
    be retiring on the progress thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        entries = _torch_entries(group)
        want = len(entries) if retired is None else retired
        if sum(e["retired"] for e in entries) >= want or time.monotonic() > deadline:
            return entries
        time.sleep(0.01)


def _new_group(world, entries, dump=None, torch_fr=None, **kw):
    """A subgroup whose recorder keeps `entries` operations and dumps to the
    prefix `dump` on failure, with ROCE_PG_TORCH_FR=`torch_fr` if given (all
    read at creation)."""
    settings = {"ROCE_PG_TRACE_ENTRIES": str(entries), "ROCE_PG_TRACE_DUMP": dump, "ROCE_PG_TORCH_FR": torch_fr}
    old = {k: os.environ.get(k) for k in settings}
    for k, v in settings.items():
        if v is not None:
            os.environ[k] = v
    try:
        return dist.new_group(list(range(world)), **kw)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _issue_matrix(rank, world, n):
    """Every collective and point-to-point call once; returns what each should
    record: (op, in_elems, out_elems, in_dtype, out_dtype, peer, is_p2p)."""
    other = 1 - rank
    f32 = lambda k=n: torch.ones(k)  # noqa: E731
    expect = []

    def exp(op, i, o, dt_in="Float", dt_out="Float", peer=None, p2p=False):
        expect.append((op, i, o, dt_in, dt_out, peer, p2p))

    # A synchronous call runs inline only while the progress thread is parked;
    # right after the group formed it may still be on its way there.
    roce_pg._wait_engine_parked()
    dist.all_reduce(torch.ones(n, dtype=torch.int32))
    exp("allreduce", n, n, "Int", "Int")
    w = dist.all_reduce(torch.ones(n, dtype=torch.float64), async_op=True)
    w.wait()
    exp("allreduce", n, n, "Double", "Double")
    dist.broadcast(f32(), src=1)
    exp("broadcast", n, n, peer=1)
    dist.reduce(f32(), dst=0)
    exp("reduce", n, n, peer=0)
    dist.all_gather([f32() for _ in range(world)], f32())
    exp("allgather", n, world * n)
    dist.all_gather_into_tensor(f32(world * n), f32())
    exp("all_gather_into_tensor", n, world * n)
    dist.gather(f32(), [f32() for _ in range(world)] if rank == 0 else None, dst=0)
    # Non-roots pass no outputs: no output dtype.
    exp("gather", n, world * n if rank == 0 else 0, "Float", "Float" if rank == 0 else None, peer=0)
    dist.scatter(f32(), [f32() for _ in range(world)] if rank == 1 else None, src=1)
    exp("scatter", n, n, peer=1)
    dist.reduce_scatter(f32(), [f32() for _ in range(world)])
    exp("reduce_scatter", world * n, n)
    dist.reduce_scatter_tensor(f32(), f32(world * n))
    exp("reduce_scatter_tensor", world * n, n)
    dist.all_to_all_single(f32(world * n), f32(world * n))
    exp("all_to_all_single", world * n, world * n)
    dist.all_to_all([f32() for _ in range(world)], [f32() for _ in range(world)])
    exp("all_to_all", world * n, world * n)
    dist.barrier()
    exp("barrier", 0, 0, None, None)
    t = torch.full((n,), 3, dtype=torch.int64)
    if rank == 0:
        dist.send(t, 1, tag=7)
        exp("send", n, 0, "Long", None, peer=other, p2p=True)
        dist.recv(t, 1, tag=8)
        exp("recv", 0, n, None, "Long", peer=other, p2p=True)
    else:
        dist.recv(t, 0, tag=7)
        exp("recv", 0, n, None, "Long", peer=other, p2p=True)
        dist.send(t, 0, tag=8)
        exp("send", n, 0, "Long", None, peer=other, p2p=True)
    return expect


def run(rank, world, port, dump_dir):
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(f"rank {rank}: {what}")

    world_pg = dist.group.WORLD
    check(roce_pg._roce_backend(None)._trace_capacity() == 2000, "default capacity is not 2000")

    # 1. Every collective and point-to-point op, in order, with its sizes.
    before = len(roce_pg.trace())
    n = 5
    expect = _issue_matrix(rank, world, n)
    entries = roce_pg.trace()[before:]
    got = [(e["op"], e["in_elems"], e["out_elems"], e["in_dtype"], e["out_dtype"], e["peer"], e["is_p2p"])
           for e in entries]
    check(got == expect, f"recorded {got}\nexpected {expect}")
    seqs = [e["seq"] for e in entries]
    check(seqs == list(range(seqs[0], seqs[0] + len(expect))), f"seq not consecutive: {seqs}")
    coll = [e for e in entries if not e["is_p2p"]]
    check([e["collective_seq"] for e in coll] == list(range(coll[0]["collective_seq"], coll[0]["collective_seq"] + len(coll))),
          "collective_seq not consecutive")
    p2p = [e for e in entries if e["is_p2p"]]
    check([e["p2p_seq"] for e in p2p] == [1, 2], f"p2p_seq {[e['p2p_seq'] for e in p2p]}")
    check([e["tag"] for e in p2p] == [7, 8], f"p2p tags {[e['tag'] for e in p2p]}")
    for e in entries:
        check(e["state"] == "completed" and e["error"] is None, f"{e['op']} #{e['seq']}: {e['state']}")
        check(e["enqueue_ns"] <= e["start_ns"] <= e["end_ns"], f"{e['op']} #{e['seq']}: times out of order {e}")
        check(e["end_ns"] <= time.monotonic_ns(), f"{e['op']}: end_ns not on time.monotonic_ns()'s clock")
        elems, dtype = (e["out_elems"], e["out_dtype"]) if e["op"] == "recv" else (e["in_elems"], e["in_dtype"])
        check(e["bytes"] == elems * (8 if dtype in ("Double", "Long") else 4),
              f"{e['op']}: bytes {e['bytes']} vs {elems} elements of {dtype}")
    ar = entries[0]
    check(ar["algorithm"] == "shm", f"2 local ranks' allreduce used {ar['algorithm']}, expected shm")
    check(ar["inline"] and not entries[1]["inline"], "sync allreduce should run inline, async on the progress thread")

    # 2. torch's hook: one entry per roce op (not two), retired as completed,
    # with roce's duration.
    ours = {(e["collective_seq"], e["p2p_seq"]): e for e in roce_pg.trace() if e["state"] == "completed"}
    theirs = _torch_entries_settled(world_pg)
    keys = [(e["collective_seq_id"], e["p2p_seq_id"]) for e in theirs]
    check(len(keys) == len(set(keys)), "torch recorded some roce op twice")
    matched = [e for e in theirs if (e["collective_seq_id"], e["p2p_seq_id"]) in ours]
    check(len(theirs) == len(roce_pg.trace()) and len(matched) == len(theirs),
          f"torch has {len(theirs)} entries, roce {len(roce_pg.trace())}, {len(matched)} match")
    for e in matched:
        mine = ours[(e["collective_seq_id"], e["p2p_seq_id"])]
        check(e["state"] == "completed" and e["retired"], f"torch's {e['profiling_name']}: {e['state']}")
        want = (mine["end_ns"] - mine["start_ns"]) / 1e6
        check(abs(e.get("duration_ms", -1) - want) < 1e-3, f"torch duration {e.get('duration_ms')} vs roce {want}")

    # 3. torch's dump layout: roce_pg.dump_trace() holds the same entries
    # under torch's names (the test runs torch's analyzer on the pickles).
    dump = roce_pg.dump_trace(os.path.join(dump_dir, f"roce_trace_{rank}"))
    check(dump["version"] == "2.10" and list(dump["pg_config"]) == [world_pg.group_name], f"dump header {dump}")
    check(len(dump["entries"]) == len(roce_pg.trace()), "dump and trace differ in length")
    names = [e["profiling_name"] for e in dump["entries"][before:before + len(expect)]]
    check(names[:3] == ["roce:all_reduce", "roce:all_reduce", "roce:broadcast"]
          and names[-2:] == (["roce:send 0->1", "roce:recv 0<-1"] if rank == 0 else ["roce:recv 1<-0", "roce:send 1->0"]),
          f"profiling names {names}")

    # 4. The ring wraps: 5 entries keep the last 5 of 12 operations.
    small = _new_group(world, 5)
    for i in range(12):
        dist.all_reduce(torch.full((i + 1,), 1.0), group=small)
    wrapped = roce_pg.trace(small)
    check([e["record_id"] for e in wrapped] == list(range(8, 13)), f"record ids {[e['record_id'] for e in wrapped]}")
    check([e["in_elems"] for e in wrapped] == list(range(8, 13)), f"sizes {[e['in_elems'] for e in wrapped]}")
    check(roce_pg._roce_backend(small)._trace_capacity() == 5, "capacity")

    # 5. Off: nothing recorded, operations unaffected.
    off = _new_group(world, 0)
    t = torch.ones(3)
    dist.all_reduce(t, group=off)
    check(torch.equal(t, torch.full((3,), float(world))) and roce_pg.trace(off) == [], "ROCE_PG_TRACE_ENTRIES=0")

    # 6. A failed operation: rank 1 skips an allreduce on a group with a 2 s
    # timeout; rank 0's times out and its entry says failed, with the reason,
    # and the group's trace is written to ROCE_PG_TRACE_DUMP's prefix.
    prefix = os.path.join(dump_dir, "on_failure_")
    bad = _new_group(world, 100, dump=prefix, timeout=timedelta(seconds=2))
    dist.all_reduce(torch.ones(2), group=bad)  # both ranks: completed
    out = {}
    if rank == 0:
        start = time.monotonic()
        msg = expect_error(lambda: dist.all_reduce(torch.ones(4), group=bad), "timed out")
        out["fail_s"] = time.monotonic() - start
        last = roce_pg.trace(bad)[-1]
        check(last["state"] == "failed" and last["op"] == "allreduce" and last["in_elems"] == 4,
              f"failed op recorded as {last}")
        check(last["error"] and "timed out" in last["error"] and "rank 1" in last["error"],
              f"failure reason {last['error']!r} (raised: {msg!r})")
        check(last["end_ns"] - last["start_ns"] >= 1.9e9, "failed before its timeout")
        # torch keeps it un-retired: never seen to finish.
        mine = _torch_entries_settled(bad, retired=1)
        check(len(mine) == 2 and mine[0]["state"] == "completed" and mine[1]["state"] != "completed",
              f"torch's entries for the failed group: {[(e['profiling_name'], e['state']) for e in mine]}")
        out["reason"] = last["error"]
        path = f"{prefix}{rank}_{bad.group_name}.json"
        check(os.path.exists(path), f"no dump at {path}: {os.listdir(dump_dir)}")
        if os.path.exists(path):
            with open(path) as f:
                written = json.load(f)["entries"]
            check(len(written) == 2 and written[1]["retired"] and written[1]["state"] != "completed"
                  and "timed out" in written[1]["error"], f"dump on failure: {written}")
    dist.barrier()  # the world group is unaffected

    # 7. ROCE_PG_TORCH_FR=native (the default; this test's groups run with
    # "hook" so that part 2 can compare): torch attaches no hook to the group
    # and its recorder gets nothing from it, while roce's records every call;
    # with roce's recorder off, torch's hook records the group after all.
    hooks = dist.distributed_c10d._world.pg_flight_recorder_hooks
    check(world_pg in hooks, "ROCE_PG_TORCH_FR=hook: torch's hook should be attached to the world group")
    native = _new_group(world, 100, torch_fr="native")
    for _ in range(3):
        dist.all_reduce(torch.ones(2), group=native)
    check(native not in hooks and _torch_entries(native) == [],
          f"native: torch's hook attached ({native in hooks}) or recorded {len(_torch_entries(native))} entries")
    check(len(roce_pg.trace(native)) == 3, f"native: roce recorded {len(roce_pg.trace(native))} of 3 calls")
    unrecorded = _new_group(world, 0, torch_fr="native")
    dist.all_reduce(torch.ones(2), group=unrecorded)
    check(unrecorded in hooks and len(_torch_entries_settled(unrecorded)) == 1,
          "ROCE_PG_TRACE_ENTRIES=0: torch's hook should record the group")
    return {"failures": failures, **out}


def dump_on_signal(rank, world, port, dump_dir):
    """ROCE_PG_TRACE_SIGNAL=SIGUSR1: rank 0 hangs in an allreduce that rank 1
    joins late; rank 1 sends rank 0 the signal meanwhile, and rank 0's trace
    appears with that allreduce still started, while its caller is blocked."""
    import signal

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    out = {"failures": []}
    if rank == 1:
        # Signals until a dump shows rank 0 inside its 4th allreduce (each
        # signal rewrites the file; rank 0 may take a moment to get there).
        path = os.path.join(dump_dir, f"sig_0_{dist.group.WORLD.group_name}.json")
        # Another user's symlink where a predictable temporary name would be:
        # the dump must not write through it.
        victim = os.path.join(dump_dir, "victim")
        with open(victim, "w") as f:
            f.write("victim")
        for planted in (f"{path}.tmp{pids[0]}", f"{path}.tmp"):
            os.symlink(victim, planted)
        deadline, states = time.monotonic() + 30, None
        while time.monotonic() < deadline and states != ["completed"] * 3 + ["started"]:
            if os.path.exists(path):
                os.unlink(path)
            os.kill(pids[0], signal.SIGUSR1)
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                with open(path) as f:
                    entries = json.load(f)["entries"]
                states = [e["state"] for e in entries if e["profiling_name"] == "roce:all_reduce"]
            except (OSError, ValueError):
                states = None  # not written yet, or being replaced
            time.sleep(0.1)
        if states != ["completed"] * 3 + ["started"]:
            out["failures"].append(f"rank 0's dump on the signal: allreduce states {states} "
                                   f"(files: {os.listdir(dump_dir)})")
    if rank == 1:
        with open(victim) as f:
            if f.read() != "victim":
                out["failures"].append("the dump wrote through a symlink planted at a temporary name")
    dist.all_reduce(t)  # releases rank 0
    out["value_ok"] = bool((t == world ** 4).all())
    return out
