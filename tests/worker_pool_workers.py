"""Worker for tests/test_workers.py, run inside every rank of one spawned
group: the shared-memory allreduce (one-shot and two-step) in four subgroups
that differ only in ROCE_PG_WORKERS (1, 2, 4, 8), against float64 / exact
references, bit for bit across the worker counts, with the pool's counter
showing that worker threads ran slices, and the pool's threads idle without
using CPU; allgather, broadcast and reduce_scatter through the shared-memory
slots in the same groups (bit for bit across worker counts, mismatched calls
failing everywhere, the old point-to-point route still forceable); then the
network algorithms' receive-side reductions over TCP at 1 and 8 workers."""
import os
import time

import torch
import torch.distributed as dist

from .api_workers import expect_error
from .reference import Checker, applicable_ops, block_input, inputs_for, make_op, reduce_reference
from .support.proc_counts import thread_cpu_seconds

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


# Allgather, broadcast and reduce_scatter through the shared-memory slots
# (csrc/algorithms/shm_copies.cpp, shm_reduce_scatter.cpp) in the same groups.
# Sizes in elements: empty, one, odd small ones, a chunk less a few elements
# (one chunk), and several chunks with a tail that is no multiple of 64 bytes.
COPY_DTYPES = [torch.float32, torch.int8, torch.bfloat16]
RS_DTYPES = DTYPES


def copy_sizes(dtype):
    esz = torch.empty(0, dtype=dtype).element_size()
    return [0, 1, 7, CHUNK // esz - 3, 2 * (CHUNK // esz) + 1237]


def rs_sizes(dtype, world):
    """Elements per block; a chunk of reduce_scatter holds one piece per rank."""
    per = CHUNK // torch.empty(0, dtype=dtype).element_size() // world
    return [0, 1, 7, per - 5, 2 * per + 1237]


def _same_everywhere(ck, what, outs, expected, dtype):
    """outs: workers -> result; the first against the reference, the others bit for bit against it."""
    first = None
    for w, t in outs.items():
        if first is None:
            ck.close(f"{what} workers={w}", t, expected, dtype)
            first = t
        else:
            ck.same(f"{what} workers={w}: bits equal to workers=1", bits(t), bits(first))


def _allgather_cases(ck, rank, world, groups):
    cases = 0
    for dtype in COPY_DTYPES:
        for numel in copy_sizes(dtype):
            xs = inputs_for(world, numel, dtype, "SUM", salt=31)
            expected = torch.cat(xs)
            flat, lists = {}, {}
            for w, g in groups.items():
                flat[w] = torch.empty(world * numel, dtype=dtype)
                dist.all_gather_into_tensor(flat[w], xs[rank].clone(), group=g)
                outs = [torch.empty(numel, dtype=dtype) for _ in range(world)]
                dist.all_gather(outs, xs[rank].clone(), group=g)
                lists[w] = torch.cat(outs)
            _same_everywhere(ck, f"all_gather_into_tensor {dtype} n={numel}", flat, expected, dtype)
            _same_everywhere(ck, f"all_gather (list) {dtype} n={numel}", lists, expected, dtype)
            cases += 1
    return cases


def _broadcast_cases(ck, rank, world, groups):
    cases = 0
    for dtype in COPY_DTYPES:
        for numel in copy_sizes(dtype):
            for root in range(world):
                xs = inputs_for(world, numel, dtype, "SUM", salt=32 + root)
                outs = {}
                for w, g in groups.items():
                    t = xs[rank].clone()
                    dist.broadcast(t, src=root, group=g)
                    outs[w] = t
                _same_everywhere(ck, f"broadcast root={root} {dtype} n={numel}", outs, xs[root], dtype)
                cases += 1
    return cases


def _reduce_scatter_cases(ck, rank, world, groups):
    cases = 0
    for dtype in RS_DTYPES:
        for numel in rs_sizes(dtype, world):
            for opname in applicable_ops(dtype) if dtype in FULL else SOME_OPS:
                blocks = [block_input(rank, b, numel, dtype, opname, salt=33) for b in range(world)]
                expected = reduce_reference([block_input(r, rank, numel, dtype, opname, salt=33)
                                             for r in range(world)], opname, dtype)
                flat, lists = {}, {}
                for w, g in groups.items():
                    flat[w] = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter_tensor(flat[w], torch.cat(blocks), op=make_op(opname, dtype), group=g)
                    lists[w] = torch.empty(numel, dtype=dtype)
                    dist.reduce_scatter(lists[w], [b.clone() for b in blocks], op=make_op(opname, dtype), group=g)
                what = f"{dtype} {opname} n={numel}"
                _same_everywhere(ck, f"reduce_scatter_tensor {what}", flat, expected, dtype)
                _same_everywhere(ck, f"reduce_scatter (list) {what}", lists, expected, dtype)
                cases += 1
    return cases


def _shm_mismatches(ck, rank, world, group):
    """Ranks that disagree fail on every rank with a clear error, and the group goes on working."""
    n = 2 * CHUNK + 64 * rank  # several chunks, a different size per rank
    errors = [
        expect_error(lambda: dist.all_gather_into_tensor(torch.empty(world * n), torch.ones(n), group=group),
                     "allgather mismatch", "same size"),
        expect_error(lambda: dist.broadcast(torch.ones(n), src=0, group=group), "broadcast mismatch", "same size"),
        expect_error(lambda: dist.broadcast(torch.ones(9), src=min(rank, 1), group=group), "broadcast mismatch",
                     "source"),
        expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(n), torch.ones(world * n), group=group),
                     "reduce_scatter mismatch", "same size"),
        expect_error(lambda: dist.reduce_scatter_tensor(
            torch.empty(5, dtype=torch.float64 if rank else torch.float32),
            torch.ones(world * 5, dtype=torch.float64 if rank else torch.float32), group=group), "mismatch", "dtype"),
    ]
    # Ranks calling different collectives at the same point.
    if rank == 0:
        errors.append(expect_error(lambda: dist.broadcast(torch.ones(8), src=0, group=group), "collective mismatch"))
    else:
        errors.append(expect_error(lambda: dist.all_gather_into_tensor(torch.empty(world * 8), torch.ones(8),
                                                                       group=group), "collective mismatch"))
    m = 2 * CHUNK + 64  # the same on every rank
    out = torch.empty(world * m)
    dist.all_gather_into_tensor(out, torch.full((m,), float(rank)), group=group)
    ck.same("allgather after mismatches", out, torch.cat([torch.full((m,), float(r)) for r in range(world)]))
    t = torch.full((m,), float(rank))
    dist.broadcast(t, src=world - 1, group=group)
    ck.same("broadcast after mismatches", t, torch.full((m,), float(world - 1)))
    return errors


def _p2p_forced(ck, rank, world):
    """The old point-to-point route, forced by the settings: same results, and messages were sent."""
    import roce_pg

    g = _new_group(world, ROCE_PG_ALGO_ALLGATHER="ring", ROCE_PG_ALGO_BROADCAST="chain",
                   ROCE_PG_ALGO_REDUCE_SCATTER="ring")
    roce_pg.reset_counters(g)
    n = 1000
    out = torch.empty(world * n)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank)), group=g)
    ck.same("p2p allgather", out, torch.cat([torch.full((n,), float(r)) for r in range(world)]))
    t = torch.full((n,), float(rank))
    dist.broadcast(t, src=1, group=g)
    ck.same("p2p broadcast", t, torch.full((n,), 1.0))
    rs = torch.empty(n)
    dist.reduce_scatter_tensor(rs, torch.arange(world * n, dtype=torch.float32), group=g)
    ck.same("p2p reduce_scatter", rs, world * torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32))
    sends = roce_pg.counters(g)["sends"]
    dist.destroy_process_group(g)
    return sends


def _shm_collectives(ck, rank, world, groups):
    """Every new shared-memory collective in every group; returns the cases
    run, the worker_slices and the point-to-point sends each group counted
    meanwhile, and the mismatch errors."""
    import roce_pg

    for g in groups.values():
        roce_pg.reset_counters(g)
    cases = {"allgather": _allgather_cases(ck, rank, world, groups),
             "broadcast": _broadcast_cases(ck, rank, world, groups),
             "reduce_scatter": _reduce_scatter_cases(ck, rank, world, groups)}
    counts = {w: roce_pg.counters(g) for w, g in groups.items()}
    errors = _shm_mismatches(ck, rank, world, groups[8])
    return {"shm_cases": cases, "shm_slices": {w: c["worker_slices"] for w, c in counts.items()},
            "shm_sends": {w: c["sends"] for w, c in counts.items()}, "shm_errors": errors,
            "p2p_sends": _p2p_forced(ck, rank, world)}


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
    shm = _shm_collectives(ck, rank, world, groups)
    threads_before = thread_cpu_seconds("roce-worker")
    time.sleep(1.0)
    idle_cpu = sum(thread_cpu_seconds("roce-worker")) - sum(threads_before)
    for g in groups.values():
        dist.destroy_process_group(g)
    net_slices = _network(ck, rank, world)
    out = ck.result()
    out.update(net_slices=net_slices, errors=errors, cases=cases, slices=slices, worker_threads=len(threads_before),
               idle_cpu=idle_cpu, **shm)
    return out
