"""Worker for tests/test_workers.py, run inside every rank of one spawned
group: the shared-memory allreduce (one-shot and two-step) in four subgroups
that differ only in ROCE_PG_WORKERS (1, 2, 4, 8), against float64 / exact
references, bit for bit across the worker counts, with the pool's counter
showing that worker threads ran slices, and the pool's threads idle without
using CPU; then the network algorithms' receive-side reductions over TCP at
1 and 8 workers."""
import os
import time

import torch
import torch.distributed as dist

from .api_workers import expect_error
from .reference import Checker, applicable_ops, inputs_for, make_op, reduce_reference

WORKER_COUNTS = [1, 2, 4, 8]
# Set by the test (ROCE_PG_SHM_ONESHOT_MAX_BYTES, ROCE_PG_SHM_CHUNK_BYTES):
# large enough that a call is cut into several 16 KiB+ slices per phase.
ONESHOT_MAX = 64 << 10
CHUNK = 128 << 10
DTYPES = [torch.float32, torch.int32, torch.float64, torch.float16, torch.bfloat16, torch.int8]
# Every op on one float and one integer type; the others with the ops whose
# kernels differ (SUM, MIN, and AVG's and PREMUL_SUM's extra passes).
FULL = (torch.float32, torch.int32)
SOME_OPS = ["SUM", "MIN", "AVG", "PREMUL_SUM"]
BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def sizes(dtype):
    """Element counts: empty, one, odd small ones, one-shot just under its
    limit, two-step in one chunk, and three chunks with a short last one; the
    large ones divisible neither by the ranks nor by a cache line."""
    esz = torch.empty(0, dtype=dtype).element_size()
    oneshot, chunk = ONESHOT_MAX // esz, CHUNK // esz
    return [0, 1, 7, oneshot - 3, oneshot + 5, 2 * chunk + 1237]


# The network algorithms' receive-side reductions (ring, including hier's
# and reduce-scatter's; tree; recursive doubling and Rabenseifner) over TCP
# between the same ranks, with 1 and 8 workers.
NET_ALGOS = ["ring", "rd", "rabenseifner", "tree"]
NET_WORKERS = [1, 8]
NET_CASES = [(torch.float32, "SUM"), (torch.float32, "AVG"), (torch.float32, "MAX"), (torch.bfloat16, "SUM"),
             (torch.int32, "BXOR"), (torch.int32, "PREMUL_SUM")]
NET_SIZES = [0, 1, 7, 100003]


def bits(t):
    return t.view(BITS[t.element_size()]) if t.numel() else t


def _worker_threads():
    """CPU seconds used so far by each of this process's roce-worker threads."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() != "roce-worker":
                    continue
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
        except OSError:
            pass
    return out


def _new_group(world, **env):
    """A subgroup of every rank created with these ROCE_PG_* settings (read at creation)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dist.new_group(list(range(world)), backend="roce")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _case(ck, rank, world, groups, dtype, opname, numel, salt, label=""):
    """One allreduce case in every group of `groups` (workers -> group, the
    first with 1 worker): that one against the reference, the others bit for
    bit against it (so as right, and independent of the worker count)."""
    xs = inputs_for(world, numel, dtype, opname, salt=salt)
    expected = reduce_reference(xs, opname, dtype)
    first = None
    for w, g in groups.items():
        t = xs[rank].clone()
        dist.all_reduce(t, op=make_op(opname, dtype), group=g)
        what = f"{label}workers={w} {dtype} {opname} n={numel}"
        if first is None:
            ck.close(what, t, expected, dtype)
            first = t
        else:
            ck.same(f"{what}: bits equal to workers=1", bits(t), bits(first))


def _network(ck, rank, world):
    """Each algorithm forced over TCP at 1 and 8 workers: exact, and the same
    bits; returns the worker_slices counter per (algorithm, workers)."""
    import roce_pg

    slices = {}
    for algo in NET_ALGOS:
        groups = {w: _new_group(world, ROCE_PG_FORCE_NETWORK="1", ROCE_PG_NET_TRANSPORT="tcp",
                                ROCE_PG_ALGO_ALLREDUCE=algo, ROCE_PG_WORKERS=str(w)) for w in NET_WORKERS}
        for dtype, opname in NET_CASES:
            for numel in NET_SIZES:
                _case(ck, rank, world, groups, dtype, opname, numel, salt=27, label=f"{algo} ")
        for w, g in groups.items():
            slices[f"{algo}/{w}"] = roce_pg.counters(g)["worker_slices"]
            dist.destroy_process_group(g)
    return slices


def run(rank, world, port):
    import roce_pg

    ck = Checker(rank)
    groups = {w: _new_group(world, ROCE_PG_WORKERS=str(w)) for w in WORKER_COUNTS}
    for g in groups.values():
        roce_pg.reset_counters(g)

    cases = 0
    for dtype in DTYPES:
        for numel in sizes(dtype):
            for opname in applicable_ops(dtype) if dtype in FULL else SOME_OPS:
                _case(ck, rank, world, groups, dtype, opname, numel, salt=26)
                cases += 1

    slices = {w: roce_pg.counters(g)["worker_slices"] for w, g in groups.items()}
    # A kernel that refuses its input on a worker thread: the caller raises
    # the error (not a crash), on every rank, and the group goes on working.
    big = 3 * ONESHOT_MAX + 1  # bool: two-step, cut into slices
    errors = [expect_error(lambda: dist.all_reduce(torch.ones(big, dtype=torch.bool), op=make_op(op, torch.float32),
                                                   group=groups[8]), op, "bool") for op in ("AVG", "PREMUL_SUM")]
    t = torch.full((big,), float(rank + 1))
    dist.all_reduce(t, group=groups[8])
    ck.same("allreduce after refused ones", t, torch.full((big,), float(sum(range(1, world + 1)))))
    threads_before = _worker_threads()
    time.sleep(1.0)
    idle_cpu = sum(_worker_threads()) - sum(threads_before)
    for g in groups.values():
        dist.destroy_process_group(g)
    net_slices = _network(ck, rank, world)
    out = ck.result()
    out.update(net_slices=net_slices, errors=errors, cases=cases, slices=slices, worker_threads=len(threads_before),
               idle_cpu=idle_cpu)
    return out
