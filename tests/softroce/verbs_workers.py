"""Rank-side bodies used only by the Soft-RoCE suites (the rest come from
tests/api_workers.py, tests/fault_workers.py and tests/matrix.py)."""
import importlib
import os
import subprocess
import time

import torch
import torch.distributed as dist

MTU = 1024  # rxe's active MTU: one packet carries at most this many payload bytes
PROOF_BYTES = 1 << 20


def proof_packets(world, nbytes=PROOF_BYTES):
    """Fewest packets an allreduce of nbytes on `world` ranks puts on the wire:
    whatever the algorithm, (world - 1) * nbytes bytes must cross between ranks."""
    return (world - 1) * nbytes // MTU


def with_proof(rank, world, port, target, kwargs=None, proof_bytes=PROOF_BYTES):
    """An allreduce of proof_bytes (whose packets the caller counts), then `target`."""
    t = torch.full((proof_bytes // 4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == world * (world + 1) / 2), "proof allreduce"
    module, name = target.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    return fn(rank=rank, world=world, port=port, **(kwargs or {}))


def matrix_and_big(rank, world, port, big_bytes=8 << 20, thin_large=False):
    """The collective matrix (thin_large: the largest size in one dtype per
    element size and kind, as tests/matrix.py explains), then an allreduce of
    big_bytes whose result is checked exactly."""
    from tests.matrix import run

    from tests.softroce.rxe_counters import sent_packets

    res = run(rank, world, port, thin_large=thin_large)
    t = torch.full((big_bytes // 4,), float(rank + 1))
    dist.barrier()
    before = sent_packets()  # one machine: every rank sees the same device counters
    dist.all_reduce(t)
    dist.barrier()
    res["big_packets"] = sent_packets() - before
    # the ring (reduce-scatter + allgather) sends 2 (n - 1) / n of the buffer per rank
    res["big_min_packets"] = 2 * (world - 1) * big_bytes // MTU
    res["big_ok"] = bool(torch.all(t == world * (world + 1) / 2))
    return res


def link_matrix(rank, world, port, sizes=(7, 16387), big_bytes=8 << 20):
    """A compact collective matrix for a lossy link: every dtype, allreduce (SUM
    and MAX), reduce_scatter, allgather, broadcast and all_to_all, a small and a
    large size (the large one spans up to 1,000 packets), checked as
    tests/matrix.py checks them (integers exactly, floats against float64
    references within tolerance); then an allreduce of big_bytes."""
    from tests.reference import (DTYPES, Checker, applicable_ops, block_input, inputs_for, make_input, make_op,
                                 reduce_reference)

    ck = Checker(rank)
    for dtype in DTYPES:
        for numel in sizes:
            tag = f"{dtype} n={numel}"
            for opname in [op for op in ("SUM", "MAX") if op in applicable_ops(dtype)]:
                xs = inputs_for(world, numel, dtype, opname)
                t = xs[rank].clone()
                dist.all_reduce(t, op=make_op(opname, dtype))
                ck.close(f"all_reduce {opname} {tag}", t, reduce_reference(xs, opname, dtype), dtype)
            mine = torch.cat([block_input(rank, b, numel, dtype, "SUM") for b in range(world)])
            out = torch.empty(numel, dtype=dtype)
            dist.reduce_scatter_tensor(out, mine)
            blocks = [block_input(k, rank, numel, dtype, "SUM") for k in range(world)]
            ck.close(f"reduce_scatter_tensor {tag}", out, reduce_reference(blocks, "SUM", dtype), dtype)
            xs = [make_input(r, numel, dtype, "wide", 3) for r in range(world)]
            out = torch.empty(numel * world, dtype=dtype)
            dist.all_gather_into_tensor(out, xs[rank])
            ck.same(f"all_gather_into_tensor {tag}", out, torch.cat(xs))
            root = numel % world
            t = xs[rank].clone() if rank == root else torch.zeros(numel, dtype=dtype)
            dist.broadcast(t, src=root)
            ck.same(f"broadcast(root={root}) {tag}", t, xs[root])
            ins = [make_input(k, numel * world, dtype, "wide", 4) for k in range(world)]
            out = torch.empty(numel * world, dtype=dtype)
            dist.all_to_all_single(out, ins[rank])
            ck.same(f"all_to_all_single {tag}", out, torch.cat([ins[k][rank * numel:(rank + 1) * numel]
                                                                 for k in range(world)]))
        make_input.cache_clear()
    res = ck.result()
    t = torch.full((big_bytes // 4,), float(rank + 1))
    dist.all_reduce(t)
    res["big_ok"] = bool(torch.all(t == world * (world + 1) / 2))
    return res


def _pattern(n, dtype, salt):
    """Deterministic values that every dtype holds exactly (integers below 2^11)."""
    return ((torch.arange(n, dtype=torch.int64) * 7919 + salt * 104729) % 2039).to(dtype)


def big_messages(rank, world, port, numel=(5 << 18) // 4 + 5):
    """Messages larger than a chunk (default 1 MiB; 1.25 to 2.5 MiB here): they cross in several chunks,
    through every landing slot and, with several QPs per connection, over all of
    them. Integer-valued data: every result is checked bit for bit."""
    right, left = (rank + 1) % world, (rank - 1) % world
    checks = 0
    for dtype in (torch.float32, torch.int64, torch.uint8):
        n = numel if dtype.itemsize >= 4 else numel * 4 + 3  # > 1 MiB for every dtype
        # allreduce (sum of patterns < 2^11 * world: exact in every dtype but uint8, which wraps)
        t = _pattern(n, dtype, rank)
        dist.all_reduce(t)
        exp = sum(_pattern(n, torch.int64, r) for r in range(world)).to(dtype)
        assert torch.equal(t, exp), f"allreduce {dtype} n={n}"
        # broadcast from the last rank
        t = _pattern(n, dtype, 50) if rank == world - 1 else torch.zeros(n, dtype=dtype)
        dist.broadcast(t, src=world - 1)
        assert torch.equal(t, _pattern(n, dtype, 50)), f"broadcast {dtype}"
        # allgather
        out = torch.empty(n * world, dtype=dtype)
        dist.all_gather_into_tensor(out, _pattern(n, dtype, 10 + rank))
        assert torch.equal(out, torch.cat([_pattern(n, dtype, 10 + r) for r in range(world)])), f"allgather {dtype}"
        # ring exchange, both directions at once, of different sizes
        got_l, got_r = torch.empty(n, dtype=dtype), torch.empty(n + 1001, dtype=dtype)
        ops = [dist.P2POp(dist.irecv, got_l, left), dist.P2POp(dist.irecv, got_r, right),
               dist.P2POp(dist.isend, _pattern(n, dtype, 20 + rank), right),
               dist.P2POp(dist.isend, _pattern(n + 1001, dtype, 30 + rank), left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(got_l, _pattern(n, dtype, 20 + left)), f"p2p from left {dtype}"
        assert torch.equal(got_r, _pattern(n + 1001, dtype, 30 + right)), f"p2p from right {dtype}"
        checks += 5
    # all_to_all with > 1 MiB per peer
    per = (5 << 18) // 8 + 17
    ins = torch.cat([_pattern(per, torch.int64, 100 * rank + r) for r in range(world)])
    out = torch.empty_like(ins)
    dist.all_to_all_single(out, ins)
    assert torch.equal(out, torch.cat([_pattern(per, torch.int64, 100 * k + rank) for k in range(world)])), "alltoall"
    checks += 1
    dist.barrier()
    return {"checks": checks}


def port_down(rank, world, port, host, victim, netdev, scratch, ranks_per_node=2, rounds=3, nbytes=1 << 20,
              cap_s=150.0, timeout_s=60):
    """Two machines; rank `victim` takes its machine's RDMA netdev down during an
    allreduce loop. Every rank must raise (not hang): each reports how long after
    the link went down it raised (measured with the wall clock on the other
    machine). scratch: a directory every machine sees. Group init and teardown
    are done here, not by the harness: once the link is down the far side cannot
    reach the store."""
    from datetime import timedelta

    store = dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("roce", store=dist.PrefixStore("portdown", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    t = torch.empty(nbytes // 4)
    for _ in range(rounds):
        t.fill_(1.0)
        dist.all_reduce(t)
        assert torch.all(t == world)
    res = {"same_machine_as_victim": rank // ranks_per_node == victim // ranks_per_node}
    res.update(_link_down_during_allreduce(t, rank == victim, netdev, scratch, cap_s,
                                           wall=not res["same_machine_as_victim"]))
    return res


def _link_down_during_allreduce(t, downs_it, netdev, scratch, cap_s, wall=False, destroy=True):
    """Allreduces of `t` in a loop until one raises; the rank that `downs_it`
    takes `netdev` down once the first is under way. Then (with destroy) the
    broken group is destroyed, which must not hang either. Returns
    await_failure's report plus the `ip link` result (that rank) and how
    destroy went."""
    from tests.fault_workers import await_failure, mark_time

    res, pending = {}, []
    if downs_it:
        t.fill_(1.0)
        pending.append(dist.all_reduce(t, async_op=True))
        time.sleep(0.05)  # the allreduce is under way
        down = subprocess.run(["ip", "link", "set", "dev", netdev, "down"], capture_output=True, text=True)
        mark_time(scratch)
        res["ip_link"] = f"rc={down.returncode} {down.stderr.strip()}"

    def again():
        if pending:
            return pending.pop()
        t.fill_(1.0)
        return dist.all_reduce(t, async_op=True)

    res.update(await_failure(again, scratch, cap_s, loop=True, wall=wall))
    if not destroy:
        return res
    t0 = time.monotonic()
    try:
        dist.destroy_process_group()
        res["destroy"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["destroy"] = f"{type(e).__name__}: {str(e)[:300]}"
    res["destroy_s"] = round(time.monotonic() - t0, 3)
    res.update(_await_reaper())
    return res


def _await_reaper(cap_s=90.0):
    """A broken group's verbs objects are released by the process's reaper
    after destroy returned (csrc/transport/verbs/reaper.hpp): how many it
    had to release, and how long after destroy it took (None: not within cap_s)."""
    import roce_pg

    pending = roce_pg._C._runtime_stats()["verbs_remains_pending"]
    t0 = time.monotonic()
    while roce_pg._C._runtime_stats()["verbs_remains_pending"] and time.monotonic() - t0 < cap_s:
        time.sleep(0.1)
    left = roce_pg._C._runtime_stats()["verbs_remains_pending"]
    return {"remains_after_destroy": pending, "remains_released_s": None if left else round(time.monotonic() - t0, 3)}


def _qp_lines_of_this_process():
    """Queue pairs this process owns, from `rdma res show qp` (netlink), one
    line each. Its "pid" is the id of the thread that created the QP (the
    progress thread, or a caller running a collective inline), so match every
    thread's id."""
    tids = set(os.listdir("/proc/self/task"))
    out = subprocess.run(["rdma", "res", "show", "qp"], capture_output=True, text=True, timeout=30).stdout
    mine = []
    for line in out.splitlines():
        words = line.split()
        pid = words[words.index("pid") + 1] if "pid" in words[:-1] else None
        if pid in tids:
            mine.append(line.strip())
    return mine


def _qps_of_this_process():
    return len(_qp_lines_of_this_process())


def _store_barrier(name, world):
    store = dist.distributed_c10d._get_default_store()
    store.add(name, 1)
    while store.add(name, 0) < world:
        time.sleep(0.01)


def verbs_at_scale(rank, world, port, big_numel=(1 << 20) // 8):
    """Eight ranks over verbs with a small pool: a rank connects to
    the peers its algorithm talks to and to no other (no queue pair, no
    registered byte for them), and registers the formula's bytes."""
    import roce_pg

    out = {"at_init": dict(roce_pg.counters()), "qps_at_init": _qps_of_this_process()}
    _store_barrier("init", world)
    # Recursive doubling (forced for this group) on 8 ranks: XOR partners 1, 2, 4.
    for numel in (8, big_numel):  # the large one proves the bytes went over rxe
        t = torch.arange(numel, dtype=torch.int64) * (rank + 1)
        dist.all_reduce(t)
        assert torch.equal(t, torch.arange(numel, dtype=torch.int64) * (world * (world + 1) // 2)), numel
    c = roce_pg.counters()
    # The group's own bytes plus the process's landing and staging pools (which it made).
    stats = roce_pg._C._runtime_stats()
    registered = c["registered_bytes"] + stats["verbs_landing_bytes"] + stats["verbs_staging_bytes"]
    out.update(rd_connections=c["connections"], rd_registered=registered, rd_qps=_qps_of_this_process(),
               formula_3_peers=roce_pg._C.verbs_registered_bytes(3, routed=world - 1))
    _store_barrier("rd", world)
    # A second group whose allreduce is the ring: ring neighbours only.
    os.environ["ROCE_PG_ALGO_ALLREDUCE"] = "ring"
    ring = dist.new_group(list(range(world)))
    t = torch.full((4096,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t, group=ring)
    assert torch.equal(t, torch.full((4096,), world * (world + 1) // 2, dtype=torch.int64))
    lines = _qp_lines_of_this_process()
    out.update(ring_connections=roce_pg.counters(ring)["connections"], all_qps=len(lines),
               qp_lines=lines if len(lines) != 5 else [])  # what an unexpected count was made of
    # Every rank reads before any starts the barrier: its partners are not all
    # ring neighbours, and a rank already in it dials ranks still reading here,
    # whose idle engines answer at once (counted 3-5 connections, 6 QPs).
    _store_barrier("ring", world)
    dist.barrier(group=ring)
    dist.destroy_process_group(ring)
    return out


def multi_nic(rank, world, port, scratch, nics=("rxe0", "rxe1"), netdev="dummy1", cap_s=120.0, timeout_s=60):
    """Every NIC: two Soft-RoCE devices (rxe0 on dummy0, rxe1 on
    dummy1, made by the guest suite) and no ROCE_PG_IB_HCA: every rank drives
    both. Exact results for eager, copied and zero-copy messages, packets on
    both devices; then rank 0 takes dummy1 down during an allreduce loop and
    every rank must raise an error naming the device (a rail that goes down
    fails the group, it does not hang or run on at half speed). A subgroup
    formed from the failed world then runs exact on rxe0 alone, and so does
    the membership the same processes reconfigure the world to
    (enable_reconfigure=True); once dummy1 is back up, the next one drives
    both again, although an older group still holds the device that failed.
    Group init and teardown are done here: the harness's destroy would follow
    the failure."""
    from datetime import timedelta

    from tests.reconfigure_workers import _handles
    from tests.softroce.rxe_counters import sent_packets

    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("roce", store=dist.PrefixStore("multinic", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s), enable_reconfigure=True)
    store.set(f"handle/{rank}", dist._get_reconfigure_handle())
    handles = _handles(store, range(world))
    dist._reconfigure(uuid=1, handles=handles).wait()
    res = {"nics": _nics()}
    dist.barrier()
    before = {d: sent_packets(d) for d in nics}
    checks = 0
    for numel in (255, (300 << 10) // 4 + 3, (8 << 20) // 4):  # eager, one chunk, zero copy over both rails
        for rnd in range(3):
            t = torch.full((numel,), float(rank + 1 + rnd))
            dist.all_reduce(t)
            want = sum(r + 1 + rnd for r in range(world))
            assert torch.all(t == want), (numel, rnd, t[:4])
            checks += 1
        # point to point both ways, a pattern that shows misplaced pieces
        mine = torch.arange(numel, dtype=torch.float32) + 1000 * rank
        got = torch.empty(numel)
        peer = (rank + 1) % world
        reqs = [dist.isend(mine, peer), dist.irecv(got, (rank - 1) % world)]
        for q in reqs:
            q.wait()
        assert torch.equal(got, torch.arange(numel, dtype=torch.float32) + 1000 * ((rank - 1) % world)), numel
        checks += 1
    dist.barrier()
    res["packets"] = {d: sent_packets(d) - before[d] for d in nics}
    res["checks"] = checks
    # Both ranks' counters are the same devices (one machine); each of the 2
    # ranks sent at least 3 x 8 MiB through the allreduces alone.
    res["min_packets_per_nic"] = world * 3 * (8 << 20) // MTU // 4
    # Holds both devices through what follows, as a job's other groups do: a
    # group formed after the port is back must not get the device that failed.
    keeper = dist.new_group(list(range(world)))
    dist.barrier(group=keeper)
    dist.barrier()
    res.update(_link_down_during_allreduce(torch.empty((1 << 20) // 4), rank == 0, netdev, scratch, cap_s,
                                           destroy=False))
    # A subgroup of the failed world, formed from its roster: on rxe0 alone.
    sub = dist.new_group(list(range(world)))
    t = torch.full(((8 << 20) // 4,), float(rank + 1))
    dist.all_reduce(t, group=sub)
    res["subgroup_after_down"] = {"nics": sub._get_backend(torch.device("cpu"))._nics(),
                                  "exact": bool(torch.all(t == sum(range(1, world + 1))))}
    res["after_down"] = _reconfigured_onto_the_ports_up(rank, world, handles, uuid=2, nics=nics)
    if rank == 0:  # the port comes back: the next membership drives it again
        up = subprocess.run(["bash", "-c", f"ip link set dev {netdev} up && for i in $(seq 120); do "
                             f"ibv_devinfo -d {nics[1]} | grep -q PORT_ACTIVE && grep -qs ffff:0a63:0101 "
                             f"/sys/class/infiniband/{nics[1]}/ports/1/gids/* && exit 0; sleep 0.5; done; exit 1"],
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, f"{netdev} / {nics[1]} did not come back: {up.stdout} {up.stderr}"
    _store_barrier("port-back", world)
    res["after_up"] = _reconfigured_onto_the_ports_up(rank, world, handles, uuid=3, nics=nics)
    del keeper, sub  # destroyed with the world
    t0 = time.monotonic()
    dist.destroy_process_group()
    res["destroy_s"] = round(time.monotonic() - t0, 3)
    res.update(_await_reaper())
    return res


def _nics():
    return dist.group.WORLD._get_backend(torch.device("cpu"))._nics()


def _reconfigured_onto_the_ports_up(rank, world, handles, uuid, nics):
    """The same processes reconfigure the failed world: the new membership
    drives the ports up now. Its NICs, how long from the call to the first
    exact allreduce, and the packets each NIC sent for 3 allreduces of 8 MiB
    (exact each)."""
    from tests.softroce.rxe_counters import sent_packets

    t0 = time.monotonic()
    dist._reconfigure(uuid=uuid, handles=handles).wait()
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    out = {"nics": _nics(), "exact": bool(torch.all(t == sum(range(1, world + 1)))),
           "recovered_s": round(time.monotonic() - t0, 3)}
    before = {d: sent_packets(d) for d in nics}
    for rnd in range(3):
        t = torch.full(((8 << 20) // 4,), float(rank + 1 + rnd))
        dist.all_reduce(t)
        out["exact"] = out["exact"] and bool(torch.all(t == sum(r + 1 + rnd for r in range(world))))
    dist.barrier()
    out["packets"] = {d: sent_packets(d) - before[d] for d in nics}
    return out


def ft_train_link_down(rank, world, port, netdev="dummy1", steps=16, down_at=6, features=1 << 15):
    """examples/ft_train.py as a user runs it, its two workers over verbs,
    each driving rxe0 and rxe1: rank 0 takes `netdev` down at step `down_at`.
    Nobody dies; the group fails on both, the launcher names the same
    members again, and they reconfigure onto rxe0. The gradient (`features`
    doubles, 256 KiB) is many chunks, spread over both NICs. What the
    launcher printed, and the packets each NIC sent."""
    import json
    import sys

    from tests.softroce.rxe_counters import sent_packets
    from tests.support.ports import free_port

    nics = ("rxe0", "rxe1")
    before = {d: sent_packets(d) for d in nics}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "examples/ft_train.py", "--ranks", "2", "--spares", "0", "--steps", str(steps),
                        "--kill-at", "-1", "--down-netdev", netdev, "--down-at", str(down_at),
                        "--features", str(features), "--lr", "0.001",  # below 2 / the top curvature: it converges
                        "--port", str(free_port()), "--time-limit", "420"],
                       cwd=root, capture_output=True, text=True, timeout=480)
    return {"rc": p.returncode, "stderr": p.stderr[-3000:],
            "same_members_again": "failed with every member alive" in p.stderr,
            "reports": [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")],
            "packets": {d: sent_packets(d) - before[d] for d in nics}}
