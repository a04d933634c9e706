"""The doctor under torchrun: every machine's own checks, whether the machines
agree with each other (MTU, GID kind, ROCE_PG_* settings), and for every pair
of machines: can they talk, and how fast, over roce's verbs transport, roce's
TCP transport and Gloo. Rank 0 prints one table; every rank exits with its code.

Machines are told apart like roce does: hostname + kernel boot id, or blocks of
ROCE_PG_SIM_RANKS_PER_NODE ranks (tests on one host). One rank per machine (the
lowest) runs the machine's checks and the pair tests; the others only join the
groups (torch.distributed.new_group must be called by every rank).
"""
import os
import socket
import statistics
import time
import traceback
from datetime import timedelta
from itertools import combinations

from ._doctor_checks import chosen_port_facts, local_checks
from ._doctor_rows import FAIL, OK, WARN, Row, fmt_bytes, report
from ._doctor_settings import SAME_EVERYWHERE, SAME_ON_MACHINE, parse_size

# The transports a pair is measured over: (row name, backend, ROCE_PG_NET_TRANSPORT).
TRANSPORTS = (("roce verbs", "roce", "verbs"), ("roce tcp", "roce", "tcp"), ("gloo", "gloo", None))
PAIR_FIX = {
    "roce verbs": "the message says what failed; usual causes: no RDMA port on one side (see its rows), a wrong "
                  "GID (both ends need RoCE v2 GIDs of interfaces that reach each other: GID index rows, "
                  "ROCE_PG_IB_GID_INDEX), MTU or VLAN mismatch on the path, a firewall dropping UDP 4791; "
                  "ROCE_PG_NET_TRANSPORT=tcp runs without RDMA",
    "roce tcp": "the machines cannot reach each other over TCP from the address roce picks: set "
                "ROCE_PG_SOCKET_IFNAME to the interface they share; check firewalls",
    "gloo": "set GLOO_SOCKET_IFNAME to the interface the machines share; check firewalls",
}


def _machine_id(rank):
    sim = int(os.environ.get("ROCE_PG_SIM_RANKS_PER_NODE") or 0)
    if sim > 0:
        return f"sim-node{rank // sim}", f"node{rank // sim}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    host = socket.gethostname()
    return f"{host}/{boot}", host


def _roce_env():
    # The simulated placement differs per rank by design (ROCE_PG_SIM_NODE names each rank's machine).
    env = {k: v for k, v in os.environ.items()
           if k.startswith("ROCE_PG_") and k not in ("ROCE_PG_SIM_RANKS_PER_NODE", "ROCE_PG_SIM_NODE")}
    if "ROCE_PG_JOB_SECRET" in env:
        # Compared across ranks by a short, deliberately slow fingerprint (a
        # weak secret must not be guessable from the report), never shown.
        import hashlib

        digest = hashlib.pbkdf2_hmac("sha256", env["ROCE_PG_JOB_SECRET"].encode(), b"roce doctor", 200_000)
        env["ROCE_PG_JOB_SECRET"] = "set, fingerprint " + digest.hex()[:6]
    return env


# Ranks whose secrets differ cannot connect at all: a difference fails.
MUST_MATCH = SAME_EVERYWHERE + ("ROCE_PG_JOB_SECRET",)


class _Env:
    """Sets environment variables for the duration of a with-block."""

    def __init__(self, **values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bench(torch, dist, pg, me, a, b, size, iters, lat_iters):
    """Ping-pong latency and one-way bandwidth between global ranks a and b."""
    peer = b if me == a else a
    n = max(1, size // 4)
    # Data check first: a known pattern must arrive intact.
    pattern = torch.arange(n, dtype=torch.float32)
    if me == a:
        dist.send(pattern, b, group=pg)
    else:
        got = torch.empty(n)
        dist.recv(got, a, group=pg)
        if not torch.equal(got, pattern):
            raise RuntimeError("data arrived corrupted")
    small = torch.zeros(1)
    rtts = []
    for _ in range(lat_iters):
        t0 = time.perf_counter()
        if me == a:
            dist.send(small, peer, group=pg)
            dist.recv(small, peer, group=pg)
        else:
            dist.recv(small, peer, group=pg)
            dist.send(small, peer, group=pg)
        rtts.append(time.perf_counter() - t0)
    big = torch.ones(n)
    ack = torch.zeros(1)
    t0 = time.perf_counter()
    if me == a:
        works = [dist.isend(big, b, group=pg) for _ in range(iters)]
        for w in works:
            w.wait()
        dist.recv(ack, b, group=pg)
    else:
        for _ in range(iters):
            dist.recv(big, a, group=pg)
        dist.send(ack, a, group=pg)
    seconds = time.perf_counter() - t0
    return {"latency_us": statistics.median(rtts) / 2 * 1e6 if rtts else None,
            "bandwidth_MBps": iters * n * 4 / seconds / 1e6, "bytes": n * 4, "iters": iters}


def run(args):
    import torch
    import torch.distributed as dist

    import roce_pg

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    try:
        roce_pg._load_extension()
        roce_pg.register()
        ext_error = None
    except Exception as e:  # noqa: BLE001 - reported below
        ext_error = f"{type(e).__name__}: {e}"
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    except Exception as e:  # noqa: BLE001
        rows = [Row("join", FAIL, f"rank {rank}: cannot join the torchrun group over Gloo: {e}",
                    "check that every machine reaches the rendezvous address (--rdzv-endpoint / MASTER_ADDR) "
                    "and that GLOO_SOCKET_IFNAME names an interface the machines share")]
        return report(rows, args.json if rank == 0 else None, args.strict)

    machine, label = _machine_id(rank)
    ids = [None] * world
    dist.all_gather_object(ids, (machine, label))
    machines = {}
    for r, (mid, lab) in enumerate(ids):
        machines.setdefault(mid, {"label": lab, "ranks": []})["ranks"].append(r)
    labels = [m["label"] for m in machines.values()]
    for m in machines.values():      # same hostname on two machines (containers, VMs): number them
        if labels.count(m["label"]) > 1:
            m["label"] += f"#{m['ranks'][0]}"
    leaders = sorted(m["ranks"][0] for m in machines.values())
    mine = machines[machine]
    is_leader = rank == mine["ranks"][0]

    info = {"rank": rank, "machine": machine, "ext_error": ext_error, "env": _roce_env(), "nics": _my_nics(rank)}
    if is_leader:
        remote = world - len(mine["ranks"])
        try:
            info["rows"] = local_checks(verbs=True, remote_peers=remote or None)
            info["facts"] = chosen_port_facts()
        except Exception:  # noqa: BLE001
            info["rows"] = [Row("doctor", FAIL, traceback.format_exc(limit=3), "report this")]
            info["facts"] = {}
    infos = [None] * world
    dist.all_gather_object(infos, info)

    rows = []
    by_rank = {i["rank"]: i for i in infos}
    for r in leaders:
        lab = machines[by_rank[r]["machine"]]["label"]
        for row in by_rank[r]["rows"]:
            row.host = lab
            rows.append(row)
    rows += _agreement_rows(infos, machines, by_rank, leaders)
    rows += _nic_rows(infos, machines, by_rank)

    # roce on the whole job: one allreduce over every rank (shared memory inside a
    # machine, the network transport between machines).
    ext_ok = all(i["ext_error"] is None for i in infos)
    if not ext_ok:
        bad = [f"rank {i['rank']}: {i['ext_error']}" for i in infos if i["ext_error"]]
        rows.append(Row("roce_pg import", FAIL, "; ".join(bad)[:2000], "see the message (build row of that machine)"))
    else:
        rows.append(_world_allreduce(torch, dist, rank, world, args))

    pair_results = []
    if len(leaders) < 2:
        rows.append(Row("pairs", OK, f"one machine ({world} rank{'s' if world > 1 else ''}): the pair tests need "
                                     f"several (torchrun --nnodes N)"))
    size = parse_size(args.size)
    for a, b in combinations(leaders, 2):
        for name, backend, transport in TRANSPORTS:
            if backend == "roce" and not ext_ok:
                continue
            result = None
            with _Env(ROCE_PG_NET_TRANSPORT=transport):
                try:
                    pg = dist.new_group([a, b], backend=backend, timeout=timedelta(seconds=args.pair_timeout))
                    if rank in (a, b):
                        result = _bench(torch, dist, pg, rank, a, b, size, args.iters, args.lat_iters)
                except Exception as e:  # noqa: BLE001 - the row says what failed
                    pg = None
                    if rank in (a, b):
                        result = {"error": f"{type(e).__name__}: {str(e).strip()}"}
            if pg is not None and rank in (a, b):
                try:
                    dist.destroy_process_group(pg)
                except Exception:  # noqa: BLE001
                    pass
            if rank == a:
                pair_results.append({"a": a, "b": b, "name": name, **(result or {})})
            dist.barrier()
    gathered = [None] * world
    dist.all_gather_object(gathered, pair_results)
    results = [r for part in gathered for r in part]
    rows += _pair_rows(results, machines, by_rank)

    code = [0]
    if rank == 0:
        hosts = {m["label"]: m["ranks"] for m in machines.values()}
        code[0] = report(rows, args.json, args.strict, {"machines": hosts, "pairs": results})
    dist.broadcast_object_list(code, src=0)
    dist.destroy_process_group()
    return code[0]


def _my_nics(rank):
    """The RDMA ports this rank would drive (the extension's own choice:
    ROCE_PG_IB_HCA, else the ports nearest its GPU or its CPUs), or why none."""
    try:
        import roce_pg
        ports, why = roce_pg._C._chosen_ports(rank, roce_pg._rank_gpu_pci())
    except Exception as e:  # noqa: BLE001 - no extension: reported by the import row
        return {"ports": [], "why": f"{type(e).__name__}: {e}"}
    return {"ports": [f"{p['device']}:{p['port']}" + (f" (NUMA {p['numa_node']})" if p["numa_node"] >= 0 else "")
                      for p in ports], "why": why}


def _nic_rows(infos, machines, by_rank):
    """One row per machine: rank -> the NICs it drives."""
    rows = []
    for m in machines.values():
        parts, missing = [], []
        for r in m["ranks"]:
            nics = by_rank[r].get("nics") or {"ports": [], "why": "not reported"}
            parts.append(f"rank {r}: {', '.join(nics['ports']) or 'none'}")
            if not nics["ports"]:
                missing.append(f"rank {r}: {nics['why']}")
        # None at all is the port rows' business (they say why); some without is not.
        mixed = missing and len(missing) < len(m["ranks"])
        row = Row("rank -> NIC", WARN if mixed else OK, "; ".join(parts)[:1500] +
                  (f" ({'; '.join(missing)})"[:600] if missing else ""),
                  "see the port rows; ROCE_PG_IB_HCA chooses the ports" if mixed else "")
        row.host = m["label"]
        rows.append(row)
    return rows


def _agreement_rows(infos, machines, by_rank, leaders):
    rows = []
    envs = {}
    for i in infos:
        envs.setdefault(tuple(sorted(i["env"].items())), []).append(i["rank"])
    if len(envs) > 1:
        variants = "; ".join(f"ranks {v}: {dict(k) or 'none'}" for k, v in envs.items())
        differ = sorted(k for k in {k for e in envs for k, _ in e}
                        if k in MUST_MATCH and len({dict(e).get(k) for e in envs}) > 1)
        # The shared-memory layouts must match among the ranks of a machine only.
        on_machine = {}
        for i in infos:
            on_machine.setdefault(by_rank.get(i["rank"], {}).get("machine"), []).append(i["env"])
        differ += sorted({k for es in on_machine.values() for k in SAME_ON_MACHINE
                          if len({e.get(k) for e in es}) > 1})
        rows.append(Row("same ROCE_PG_* everywhere", FAIL if differ else WARN, f"ranks differ: {variants}"[:1500],
                        "set the same ROCE_PG_* variables on every rank" +
                        (f" ({', '.join(differ)} must match)" if differ else "")))
    else:
        rows.append(Row("same ROCE_PG_* everywhere", OK, "every rank has the same ROCE_PG_* variables"))
    if len(leaders) < 2:
        return rows
    facts = {machines[by_rank[r]["machine"]]["label"]: by_rank[r].get("facts") or {} for r in leaders}
    mtus = {lab: f.get("active_mtu") for lab, f in facts.items() if f.get("active_mtu")}
    if len(set(mtus.values())) > 1:
        rows.append(Row("same MTU everywhere", WARN, f"active_mtu differs: {mtus}; each pair uses the smaller",
                        "set the same (jumbo) MTU on every machine's RoCE netdev and the switches"))
    elif mtus:
        rows.append(Row("same MTU everywhere", OK, f"active_mtu {next(iter(mtus.values()))} on every machine"))
    kinds = {lab: f.get("gid_kind") for lab, f in facts.items() if f.get("ethernet")}
    if len(set(kinds.values())) > 1:
        rows.append(Row("same GID kind everywhere", FAIL, f"the chosen GIDs differ in kind: {kinds}",
                        "every machine must use RoCE v2 GIDs of the same kind (IPv4-mapped unless set otherwise):"
                        " unset ROCE_PG_IB_GID_INDEX or set it consistently; give every RoCE netdev an IPv4 "
                        "address"))
    elif kinds:
        rows.append(Row("same GID kind everywhere", OK, f"{next(iter(kinds.values()))} RoCE GIDs on every machine"))
    return rows


def _world_allreduce(torch, dist, rank, world, args):
    try:
        pg = dist.new_group(list(range(world)), backend="roce", timeout=timedelta(seconds=args.pair_timeout))
        t = torch.full((1024,), float(rank + 1))
        dist.all_reduce(t, group=pg)
        ok = bool(torch.all(t == world * (world + 1) / 2))
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(t, group=pg)
        us = (time.perf_counter() - t0) / 10 * 1e6
        dist.destroy_process_group(pg)
        status = OK if ok else FAIL
        res = {"status": status, "detail": f"4 KiB allreduce over all {world} ranks: "
                                           f"{'correct' if ok else 'WRONG RESULT'}, {us:.0f} us"}
    except Exception as e:  # noqa: BLE001
        res = {"status": FAIL, "detail": f"rank {rank}: {type(e).__name__}: {str(e).strip()}"}
    results = [None] * world
    dist.all_gather_object(results, res)
    bad = [r for r in results if r["status"] != OK]
    if bad:
        return Row("roce allreduce", FAIL, "; ".join(r["detail"] for r in bad)[:2000],
                   "see the message; the pair rows below narrow it down")
    return Row("roce allreduce", OK, results[0]["detail"])


def _pair_rows(results, machines, by_rank):
    label = {r: machines[by_rank[r]["machine"]]["label"] if r in by_rank and "machine" in by_rank[r] else str(r)
             for res in results for r in (res["a"], res["b"])}
    for m in machines.values():
        for r in m["ranks"]:
            label[r] = m["label"]
    rows = []
    pairs = {}
    for res in results:
        pairs.setdefault((res["a"], res["b"]), {})[res["name"]] = res
    for (a, b), by_name in pairs.items():
        name_ab = f"{label[a]} <-> {label[b]}"
        for name, _, _ in TRANSPORTS:
            res = by_name.get(name)
            if res is None:
                continue
            if "error" in res:
                rows.append(Row(f"{name_ab} {name}", FAIL, res["error"][:1500], PAIR_FIX[name]))
                continue
            rows.append(Row(f"{name_ab} {name}", OK,
                            f"latency {res['latency_us']:.1f} us (half round trip, median); "
                            f"{res['bandwidth_MBps']:.1f} MB/s ({res['iters']} x {fmt_bytes(res['bytes'])})"))
        v, t = by_name.get("roce verbs"), by_name.get("roce tcp")
        if v and t and "error" not in v and "error" not in t:
            ratio = v["bandwidth_MBps"] / t["bandwidth_MBps"] if t["bandwidth_MBps"] else 0
            soft = any((by_rank[r].get("facts") or {}).get("software") for r in (a, b) if r in by_rank)
            detail = f"verbs / TCP bandwidth = {ratio:.2f}, latency {v['latency_us']:.1f} vs {t['latency_us']:.1f} us"
            if ratio < 1 and not soft:
                rows.append(Row(f"{name_ab} verbs vs tcp", WARN, detail + ": RDMA is slower than TCP",
                                "check PFC/ECN for the RoCE traffic class (ROCE_PG_IB_TC), the MTU, and that the "
                                "GID's interface is the fast NIC"))
            else:
                rows.append(Row(f"{name_ab} verbs vs tcp", OK,
                                detail + (" (software RDMA: Soft-RoCE/siw run in the kernel's network stack)"
                                          if soft else "")))
    return rows
