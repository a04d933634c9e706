"""Rank-side bodies for the verbs zero-copy checks (guest suite phase `zerocopy`).

Run with ROCE_PG_CHUNK_BYTES=1 MiB (the suite's default 16 KiB chunk would keep
every message under the zero-copy threshold). Sizes straddle
ROCE_PG_IB_ZERO_COPY_MIN_BYTES (64 KiB): below it messages are copied through
the registered staging/landing slots, from it on the NIC moves them tensor to
tensor. Every result is compared exactly: integer-valued float32 (sums of small
integers are exact), float64 references and int64.
"""
import torch
import torch.distributed as dist

import roce_pg

from tests.support.proc_counts import thread_names

# Per-rank message sizes in bytes: below, at and above the 64 KiB threshold,
# and above the 1 MiB chunk (several messages per collective step).
SIZES = (4 << 10, (64 << 10) - 4, 64 << 10, (1 << 20) + 12, 3 << 20)


def _pattern(numel, rank, salt, dtype):
    # Small integers: every sum over a few ranks is exact in float32.
    i = torch.arange(numel, dtype=torch.int64)
    v = (i * 7 + rank * 13 + salt * 5) % 251 - 125
    return v.to(dtype)


def _check(failures, what, got, want):
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        failures.append(f"{what}: {bad.numel()} elements differ, first at {bad[0].tolist() if bad.numel() else '?'}")


def exactness(rank, world, port):
    """Every collective kind at sizes below and above the threshold, exact."""
    failures, checks = [], 0
    for salt, nbytes in enumerate(SIZES):
        for dtype in (torch.float32, torch.float64, torch.int64):
            esz = torch.empty(0, dtype=dtype).element_size()
            n = max(1, nbytes // esz)
            ref = sum(_pattern(n, r, salt, torch.float64) for r in range(world))
            t = _pattern(n, rank, salt, dtype)
            dist.all_reduce(t)
            _check(failures, f"all_reduce {dtype} {nbytes} B", t, ref.to(dtype))
            out = torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(out, _pattern(n, rank, salt, dtype))
            _check(failures, f"all_gather_into_tensor {dtype} {nbytes} B", out,
                   torch.cat([_pattern(n, r, salt, dtype) for r in range(world)]))
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, _pattern(n, rank, salt, dtype))
            for r in range(world):
                _check(failures, f"all_gather[{r}] {dtype} {nbytes} B", outs[r], _pattern(n, r, salt, dtype))
            b = _pattern(n, rank, salt, dtype)
            dist.broadcast(b, src=world - 1)
            _check(failures, f"broadcast {dtype} {nbytes} B", b, _pattern(n, world - 1, salt, dtype))
            rs = torch.empty(n, dtype=dtype)
            full = [_pattern(n * world, r, salt, torch.float64) for r in range(world)]
            dist.reduce_scatter_tensor(rs, _pattern(n * world, rank, salt, dtype))
            _check(failures, f"reduce_scatter_tensor {dtype} {nbytes} B", rs,
                   sum(full)[rank * n:(rank + 1) * n].to(dtype))
            # send/recv around the ring
            right, left = (rank + 1) % world, (rank - 1) % world
            got = torch.empty(n, dtype=dtype)
            reqs = [dist.isend(_pattern(n, rank, salt + 1, dtype), right), dist.irecv(got, left)]
            for q in reqs:
                q.wait()
            _check(failures, f"send/recv {dtype} {nbytes} B", got, _pattern(n, left, salt + 1, dtype))
            checks += 6
    checks += _mixed_protocols_one_tag(failures, rank, world)
    return {"failures": failures, "checks": checks, "counters": roce_pg.counters()}


def _mixed_protocols_one_tag(failures, rank, world):
    """Eager (<= 16 KiB), copied and zero-copy messages interleaved on one tag
    must pair with the receives in posting order, whether the receives are
    posted before the sends (RTRs waiting at the sender) or after them (eager
    data buffered, RTSs waiting at the receiver)."""
    right, left = (rank + 1) % world, (rank - 1) % world
    sizes = [8, 3 << 20, 4 << 10, 96 << 10, 0, 12, 1 << 20, 16 << 10]
    checks = 0
    for recv_first in (True, False):
        got = [torch.full((n // 4,), -1.0) for n in sizes]
        recvs, sends = [], []
        def post_recvs():
            recvs.extend(dist.irecv(g, left, tag=7) for g in got)
        def post_sends():
            sends.extend(dist.isend(_pattern(n // 4, rank, i, torch.float32), right, tag=7) for i, n in enumerate(sizes))
        if recv_first:
            post_recvs()
            dist.barrier()
            post_sends()
        else:
            post_sends()
            dist.barrier()
            post_recvs()
        for q in sends + recvs:
            q.wait()
        for i, n in enumerate(sizes):
            _check(failures, f"one tag, {'receives' if recv_first else 'sends'} first, message {i} ({n} B)", got[i],
                   _pattern(n // 4, left, i, torch.float32))
            checks += 1
    return checks


def steady_state(rank, world, port, nbytes=2 << 20, iters=10, sizes=(1 << 20, 4 << 20), transient=20):
    """After warm-up, allreduce of a persistent >= 1 MiB tensor copies nothing
    and registers nothing; the MR count stays flat."""
    t = torch.zeros(nbytes // 4)
    for _ in range(3):  # warm-up: registers the tensor and the algorithms' scratch
        dist.all_reduce(t)
    dist.barrier()
    roce_pg.reset_counters()
    c0 = roce_pg.counters()
    ok = True
    for i in range(iters):
        t.copy_(_pattern(t.numel(), rank, i, torch.float32))
        dist.all_reduce(t)
        ok &= torch.equal(t, sum(_pattern(t.numel(), r, i, torch.float64) for r in range(world)).float())
    c1 = roce_pg.counters()
    res = {"exact": bool(ok), "steady": c1, "cached_mrs_before": c0["cached_mrs"]}
    # other sizes >= 1 MiB after warm-up too
    for size in sizes:
        x = torch.ones(size // 4)
        dist.all_reduce(x)
        dist.barrier()
        roce_pg.reset_counters()
        for _ in range(3):
            x.fill_(rank + 1)
            dist.all_reduce(x)
        res[f"copied_{size}"] = roce_pg.counters()["bytes_copied"]
        res[f"zero_copy_{size}"] = roce_pg.counters()["bytes_zero_copy"]
        res[f"exact_{size}"] = bool(torch.all(x == world * (world + 1) / 2))
    # Freed and reallocated tensors (often at the same address): never a stale
    # registration, and the cache does not keep growing.
    mrs = []
    for i in range(transient):
        y = _pattern(1 << 18, rank, i, torch.float32)  # 1 MiB, a new storage each time
        dist.all_reduce(y)
        ok &= torch.equal(y, sum(_pattern(1 << 18, r, i, torch.float64) for r in range(world)).float())
        del y
        mrs.append(roce_pg.counters()["cached_mrs"])
    res["transient_exact"] = bool(ok)
    res["transient_mrs"] = mrs
    res["threads"] = sorted(thread_names())
    return res



def eviction(rank, world, port):
    """A tiny ROCE_PG_IB_REG_CACHE_BYTES: tensors take turns in the cache (and
    one does not fit at all and is copied); results stay exact."""
    bufs = [torch.zeros((1 << 20) // 4 + 64 * k) for k in range(5)]
    failures = []
    roce_pg.reset_counters()
    for it in range(6):
        for k, b in enumerate(bufs):
            b.copy_(_pattern(b.numel(), rank, it * 10 + k, torch.float32))
            dist.all_reduce(b)
            _check(failures, f"all_reduce it {it} buf {k}", b,
                   sum(_pattern(b.numel(), r, it * 10 + k, torch.float64) for r in range(world)).float())
    big = _pattern((8 << 20) // 4, rank, 99, torch.float32)  # larger than the whole cache: copied
    dist.all_reduce(big)
    _check(failures, "all_reduce over the cache limit", big,
           sum(_pattern(big.numel(), r, 99, torch.float64) for r in range(world)).float())
    return {"failures": failures, "counters": roce_pg.counters()}


def mismatch(rank, world, port):
    """Zero-copy sizes that do not match: send/recv (the receiver offered its
    buffer, the sender NACKs instead of writing), then an allreduce; every rank
    fails quickly, the receive buffer is untouched, then the group refuses work."""
    import time

    from tests.api_workers import expect_error

    out = {}
    start = time.monotonic()
    if rank in (0, 1):
        if rank == 0:
            expect_error(lambda: dist.send(torch.ones(1 << 18), 1), "bytes")
        else:
            buf = torch.full((1 << 19,), 7.0)
            expect_error(lambda: dist.recv(buf, 0), "bytes")
            out["recv_buffer_untouched"] = bool(torch.all(buf == 7.0))
    out["p2p_elapsed"] = time.monotonic() - start
    start = time.monotonic()
    # the group may already refuse work after the p2p failure: either error is fine
    expect_error(lambda: dist.all_reduce(torch.ones((1 << 18) + (1 << 16) * (rank == 0))))
    out["elapsed"] = time.monotonic() - start
    out["msg"] = expect_error(lambda: dist.all_reduce(torch.ones(4)), "cannot be used any more")
    return out
