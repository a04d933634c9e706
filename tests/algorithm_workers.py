"""Rank-side code of tests/test_algorithms.py. One spawned group per machine
layout; inside it every subgroup of interest is created once per allreduce
algorithm (the algorithm is read from ROCE_PG_ALGO_* when a group is created),
and each runs a matrix of reduce ops x dtypes x size classes against float64 /
exact references from tests/reference.py."""
import os
import time

import torch
import torch.distributed as dist

import roce_pg

from .reference import DTYPES, TOLERANCE, Checker, applicable_ops, inputs_for, make_input, make_op, reduce_reference
from .support.proc_counts import thread_names

ALGOS = ["auto", "ring", "rd", "rabenseifner", "hier", "tree"]
# Variants: "ring3ch" is the ring with ROCE_PG_NCHANNELS=3, "hier2ch" hier
# with 2 (the others leave it on auto); "hiertree" is hier with the double
# binary tree among the machines (the cost model never picks it on 2 or 3
# machines), in sequence and overlapped with the in-machine phases.
VARIANTS = {"ring3ch": {"ROCE_PG_ALGO_ALLREDUCE": "ring", "ROCE_PG_NCHANNELS": "3"},
            "hier2ch": {"ROCE_PG_ALGO_ALLREDUCE": "hier", "ROCE_PG_NCHANNELS": "2"},
            "hiertree": {"ROCE_PG_ALGO_ALLREDUCE": "hier", "ROCE_PG_ALGO_ALLREDUCE_ACROSS": "tree"}}
CHANNELS = ("ring3ch", "hier2ch")
# The allgather algorithm tested alongside each allreduce algorithm.
ALLGATHER_FOR = {"auto": "auto", "ring": "ring", "rd": "bruck", "rabenseifner": "bruck", "hier": "hier",
                 "tree": "auto", "ring3ch": "ring", "hier2ch": "hier", "hiertree": "hier"}
# And the reduce-scatter algorithm.
REDUCE_SCATTER_FOR = {"auto": "auto", "ring": "ring", "rd": "auto", "rabenseifner": "auto", "hier": "hier",
                      "tree": "auto", "ring3ch": "ring", "hier2ch": "hier", "hiertree": "hier"}
# Channelled ring allreduce (8 KiB per channel at the test's ring threshold):
# 3 channels of a few KiB, 2 channels of float64, and 3 channels of many
# 4 KiB chunks each; uneven slices and segments throughout.
CHANNEL_CASES = [(torch.float32, "SUM", 6151), (torch.float64, "PRODUCT", 2100), (torch.bfloat16, "AVG", 12289),
                 (torch.int32, "MAX", 6151), (torch.int64, "PREMUL_SUM", 3073), (torch.float32, "SUM", 50001)]
# Small thresholds (set by the test) put every size class into a few KiB:
# rd <= 64 B < rabenseifner < 8 KiB <= ring, hier from 1 KiB.
FULL_SIZES = [7, 1000]                 # every dtype x op
SWEEP_SIZES = [0, 1, 3, 16, 17, 100, 1000, 2048, 3001]  # a few dtype/op pairs
SWEEP = [(torch.float32, "SUM"), (torch.int32, "MAX"), (torch.bfloat16, "AVG"), (torch.int64, "PREMUL_SUM"),
         (torch.float64, "PRODUCT")]


def _close(ck, what, got, expected, dtype, world):
    """Checker.close with the half-precision tolerance scaled to the group size
    (TOLERANCE is set for at most four ranks; one rounding per hop)."""
    if dtype in (torch.float16, torch.bfloat16) and world > 4:
        atol, rtol = TOLERANCE[dtype]
        g, e = got.to(torch.float64), expected.to(torch.float64)
        ck.checks += 1
        scale = world / 4
        if not bool(((g - e).abs() <= e.abs() * rtol * scale + atol * scale).all()):
            ck.failures.append(f"rank {ck.rank}: {what}: max error {(g - e).abs().max().item()}")
        return
    ck.close(what, got, expected, dtype)


def _check_allreduce(ck, group, members, me, label, dtype, opname, numel, salt):
    world = len(members)
    xs = inputs_for(world, numel, dtype, opname, salt)
    t = xs[me].clone()
    dist.all_reduce(t, op=make_op(opname, dtype), group=group)
    _close(ck, f"{label} all_reduce {dtype} {opname} n={numel}", t, reduce_reference(xs, opname, dtype), dtype, world)
    return t


def _matrix(ck, group, members, me, label):
    world = len(members)
    # Every dtype x op on groups of up to four ranks (which include the folded
    # three-rank cases); larger groups run the sweep only, to bound the time.
    for dtype in DTYPES if world <= 4 else []:
        for numel in FULL_SIZES:
            for opname in applicable_ops(dtype):
                _check_allreduce(ck, group, members, me, label, dtype, opname, numel, 1)
    make_input.cache_clear()
    for dtype, opname in SWEEP:
        for numel in SWEEP_SIZES:
            _check_allreduce(ck, group, members, me, label, dtype, opname, numel, 2)
    # Large enough for hier to overlap its phases in 2-4 pieces (shards of at
    # least two 4 KiB chunks and ROCE_PG_ALGO_RING_MIN_BYTES per piece).
    for dtype, opname in ((torch.float32, "SUM"), (torch.int64, "MAX"), (torch.bfloat16, "AVG")):
        _check_allreduce(ck, group, members, me, label, dtype, opname, 40000, 8)
    # Every rank ends with the same bits (each element is computed once, or by
    # both partners from the same two operands).
    for dtype in (torch.float32, torch.float16):
        for numel in (5, 1000, 3001):
            t = _check_allreduce(ck, group, members, me, label, dtype, "SUM", numel, 3)
            outs = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(outs, t, group=group)
            ck.checks += 1
            if not all(torch.equal(o.view(torch.int16 if dtype == torch.float16 else torch.int32),
                                   t.view(torch.int16 if dtype == torch.float16 else torch.int32)) for o in outs):
                ck.failures.append(f"rank {ck.rank}: {label} all_reduce {dtype} n={numel}: ranks differ bitwise")
    # reduce (an allreduce on a copy; reduce-scatter + gather from 8 KiB) and
    # allgather / reduce-scatter (Bruck, hier or ring) over the size classes
    for numel in (1, 17, 1000, 3001):
        root = members[numel % world]
        xs = inputs_for(world, numel, torch.int64, "SUM", 4)
        t = xs[me].clone()
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM, group=group)
        exp = reduce_reference(xs, "SUM", torch.int64) if members[me] == root else xs[me]
        ck.same(f"{label} reduce(root={root}) n={numel}", t, exp)
        for dtype in (torch.uint8, torch.float64):
            xs = [make_input(r, numel, dtype, "wide", 5) for r in range(world)]
            out = torch.empty(numel * world, dtype=dtype)
            dist.all_gather_into_tensor(out, xs[me], group=group)
            ck.same(f"{label} all_gather_into_tensor {dtype} n={numel}", out, torch.cat(xs))
    for dtype, opname in ((torch.int64, "SUM"), (torch.float32, "AVG"), (torch.float64, "PREMUL_SUM"),
                          (torch.int32, "MAX")):
        for block in (1, 300, 1500):
            xs = inputs_for(world, block * world, dtype, opname, 7)
            out = torch.empty(block, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[me].clone(), op=make_op(opname, dtype), group=group)
            exp = reduce_reference(xs, opname, dtype)[me * block:(me + 1) * block]
            _close(ck, f"{label} reduce_scatter_tensor {dtype} {opname} block={block}", out, exp, dtype, world)
    # broadcast: binomial tree below 8 KiB, pipelined chain (4 KiB chunks) above
    for numel, root_index in ((1, 0), (1000, 1), (3001, world - 1), (3001, 0)):
        root = members[root_index]
        x = make_input(root_index, numel, torch.float64, "wide", 6)
        t = x.clone() if members[me] == root else torch.zeros(numel, dtype=torch.float64)
        dist.broadcast(t, src=root, group=group)
        ck.same(f"{label} broadcast(root={root}) n={numel}", t, x)
    dist.barrier(group=group)


def _channels(ck, group, members, me, label, algo):
    for dtype, opname, numel in CHANNEL_CASES:
        _check_allreduce(ck, group, members, me, label, dtype, opname, numel, 7)
    # hier on 2x2 runs its phases in sequence for 8191 float32 (8 KiB pieces
    # at the test's thresholds), and its ring across machines splits the
    # shards of 4096 and 4095 elements into 2 and 1 channels: the ranks of a
    # machine differ, and the calls after it must still pair up.
    for numel in (8191, 8191, 7):
        _check_allreduce(ck, group, members, me, label, torch.float32, "SUM", numel, 8)
    if not algo.startswith("ring"):
        return
    # Channels beyond the first reduce on helper threads of their own.
    ck.checks += 1
    if "roce-reduce" not in thread_names():
        ck.failures.append(f"rank {ck.rank}: {label}: no roce-reduce helper thread after channelled allreduces")


def _traffic(group, numel, coll="all_reduce"):
    """This rank's counters for one float32 collective with numel elements per
    rank (all_reduce SUM; all_gather of numel; reduce_scatter SUM to numel)."""
    world = dist.get_world_size(group)
    t = torch.ones(numel if coll != "reduce_scatter" else numel * world)
    out = torch.empty(numel * world if coll == "all_gather" else numel)
    dist.barrier(group=group)
    roce_pg.reset_counters(group)
    if coll == "all_reduce":
        dist.all_reduce(t, group=group)
        out = t
    elif coll == "all_gather":
        dist.all_gather_into_tensor(out, t, group=group)
    else:
        dist.reduce_scatter_tensor(out, t, group=group)
    c = roce_pg.counters(group)
    expect = 1 if coll == "all_gather" else world
    assert torch.all(out == expect), f"traffic probe: wrong {coll} result"
    return c


def _set_algorithm(algo):
    os.environ.update({"ROCE_PG_ALGO_ALLREDUCE": algo, "ROCE_PG_NCHANNELS": "0",
                       "ROCE_PG_ALGO_ALLREDUCE_ACROSS": "auto", **VARIANTS.get(algo, {})})


def run(rank, world, port, groups, algos=ALGOS, traffic=None, timing=False, mismatch=None, only=None,
        regimes=None, plans=None):
    """groups: {label: list of global ranks}; traffic: {label: [numel, ...]}
    whose per-algorithm counters are returned for the parent to check;
    only: {algo: [label, ...]} runs those algorithms on those groups only;
    regimes: see _auto_regimes; plans: see _plans (rank 0 returns them)."""
    ck = Checker(rank)
    counters = {}
    for label, members in groups.items():
        for algo in algos:
            if only and algo in only and label not in only[algo]:
                continue
            _set_algorithm(algo)
            os.environ["ROCE_PG_ALGO_ALLGATHER"] = ALLGATHER_FOR[algo]
            os.environ["ROCE_PG_ALGO_REDUCE_SCATTER"] = REDUCE_SCATTER_FOR[algo]
            group = dist.new_group(members, backend="roce")
            t0 = time.monotonic()
            if rank in members:
                me = members.index(rank)
                name = f"[{label} {algo}]"
                _matrix(ck, group, members, me, name)
                if algo in CHANNELS:
                    _channels(ck, group, members, me, name, algo)
                for numel in (traffic or {}).get(label, []):
                    counters[f"{label}/{algo}/{numel}"] = _traffic(group, numel)
                    counters[f"{label}/{algo}/{numel}/all_gather"] = _traffic(group, numel, "all_gather")
                    counters[f"{label}/{algo}/{numel}/reduce_scatter"] = _traffic(group, numel, "reduce_scatter")
                # ops counts every operation begun on this group, exactly
                roce_pg.reset_counters(group)
                for _ in range(3):
                    dist.all_reduce(torch.ones(3), group=group)
                dist.barrier(group=group)
                c = roce_pg.counters(group)
                ck.checks += 1
                if c["ops"] != 4:
                    ck.failures.append(f"rank {rank}: {name}: ops counter {c['ops']} after 4 operations")
            # Everyone leaves the subgroup together: a rank that closes its
            # connections while a slower one still waits in the group's last
            # collective makes that wait fail (the peer's EOF is a failure).
            dist.barrier()
            if timing and rank == 0:
                print(f"{label} {algo}: {time.monotonic() - t0:.1f} s", flush=True)
            if rank in members:
                dist.destroy_process_group(group)
    if mismatch:
        _check_settings_mismatch(ck, rank, mismatch)
    out = ck.result()
    out["counters"] = counters
    if regimes:
        out["regimes"] = _auto_regimes(rank, groups, regimes)
    if plans and rank == 0:
        out["plans"] = _plans(plans)
    return out


def _mismatched_group_error(rank, members, name, value, others):
    """Creates a group in which the last member sets `name`=`value` and the
    others `others`; returns the error text a member saw (None if none)."""
    os.environ[name] = value if rank == members[-1] else others
    error = None
    try:
        group = dist.new_group(members, backend="roce")
        if rank in members:
            dist.all_reduce(torch.ones(4), group=group)
    except Exception as e:  # noqa: BLE001 - the error text is what is checked
        error = str(e)
    os.environ[name] = others
    dist.barrier()
    return error


def _check_settings_mismatch(ck, rank, members):
    """A group whose ranks set different ROCE_PG_ALGO* (or ROCE_PG_NCHANNELS)
    values must fail to form on every member, naming the setting, instead of
    pairing up different message patterns."""
    for name in ("ROCE_PG_ALGO_ALLREDUCE", "ROCE_PG_ALGO_ALLGATHER", "ROCE_PG_ALGO_REDUCE_SCATTER"):
        os.environ[name] = "auto"
    error = _mismatched_group_error(rank, members, "ROCE_PG_ALGO_ALLREDUCE", "ring", "auto")
    if rank in members:
        ck.checks += 1
        if not error or "different algorithm settings" not in error or "ROCE_PG_ALGO_ALLREDUCE=ring" not in error:
            ck.failures.append(f"rank {rank}: mismatched ROCE_PG_ALGO_ALLREDUCE: {error!r}")
    # The channel count decides the message pattern as well.
    error = _mismatched_group_error(rank, members, "ROCE_PG_NCHANNELS", "2", "0")
    if rank in members:
        ck.checks += 1
        if not error or "ROCE_PG_NCHANNELS=2" not in error or "ROCE_PG_NCHANNELS=0" not in error:
            ck.failures.append(f"rank {rank}: mismatched ROCE_PG_NCHANNELS: {error!r}")


# The allreduce settings that decide auto's choice; the regimes below start
# from none of them set (the test's thresholds and chunk would decide instead).
MODEL_SETTINGS = ("ROCE_PG_ALGO_RD_MAX_BYTES", "ROCE_PG_ALGO_RING_MIN_BYTES", "ROCE_PG_ALGO_HIER_MIN_BYTES",
                  "ROCE_PG_CHUNK_BYTES",
                  "ROCE_PG_ALGO_NET_ALPHA_US", "ROCE_PG_ALGO_NET_GBPS", "ROCE_PG_ALGO_NIC_GBPS",
                  "ROCE_PG_ALGO_SHM_ALPHA_US", "ROCE_PG_ALGO_SHM_GBPS", "ROCE_PG_ALGO_REDUCE_GBPS")


class _ModelSettingsCleared:
    """None of MODEL_SETTINGS set inside; restored afterwards."""

    def __enter__(self):
        self.saved = {k: os.environ.pop(k) for k in MODEL_SETTINGS if k in os.environ}

    def __exit__(self, *exc):
        for k in MODEL_SETTINGS:
            os.environ.pop(k, None)
        os.environ.update(self.saved)


def _plans(cases):
    """cases: [(ranks, machines, per machine or 0, bytes, {variable: value})]:
    what auto picks for each (no group needed: the model is a pure function)."""
    out = []
    with _ModelSettingsCleared():
        for ranks, machines, per_machine, nbytes, env in cases:
            os.environ.update(env)
            out.append(roce_pg._C._allreduce_plan(ranks, machines, per_machine, nbytes))
            for k in env:
                del os.environ[k]
    return out


def _auto_regimes(rank, groups, regimes):
    """regimes: [(label, group label, shape (ranks, machines, per machine or 0),
    numel, {variable: value})]. For each, the cost model's prediction for that
    shape (roce_pg._C._allreduce_plan), and this rank's counters of one
    float32 allreduce of numel in a group on auto and in one forced to the
    predicted algorithm: the parent checks that the two match rank by rank."""
    out = {}
    with _ModelSettingsCleared():
        for name, label, shape, numel, env in regimes:
            out[name] = _regime(rank, groups[label], shape, numel, env)
    _set_algorithm("auto")
    return out


def _regime(rank, members, shape, numel, env):
    os.environ.update(env)
    result = {"plan": roce_pg._C._allreduce_plan(*shape, numel * 4)}
    plan = result["plan"]
    for kind, algo in (("auto", "auto"), ("forced", plan["algo"])):
        _set_algorithm(algo)
        if kind == "forced" and plan["across"]:
            os.environ["ROCE_PG_ALGO_ALLREDUCE_ACROSS"] = plan["across"]
        group = dist.new_group(members, backend="roce")
        if rank in members:
            result[kind] = {k: v for k, v in _traffic(group, numel).items()
                            if k in ("sends", "bytes_sent_net", "bytes_sent_shm")}
        dist.barrier()
        if rank in members:
            dist.destroy_process_group(group)
    for k in env:
        del os.environ[k]
    return result
