"""The collectives collectives_perf.py measures, each described once: how a
size maps to buffers and counts (as nccl-tests count them), how to run it out
of place and in place with torch.distributed, what every rank must hold
afterwards, and nccl-tests' bus-bandwidth factor (its doc/PERFORMANCE.md).

Sizes follow nccl-tests: `size` is the larger of the send and receive buffers
(the whole gathered/scattered array), `count` is the element count passed to
the call per rank (per peer for alltoall). torch has no out-of-place form of
all_reduce, reduce and broadcast: their out-of-place column copies the input
into the output buffer and runs the in-place call on it (the copy is timed).
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

REDOPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
          "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def pattern(rank, count, redop="sum", start=0):
    """Rank-specific small integers, exact in every dtype (bfloat16 included)
    and, for prod, powers of two that stay exact when multiplied."""
    i = torch.arange(start, start + count, dtype=torch.float64)
    if redop == "prod":
        return torch.remainder(i + rank, 2) + 1
    return torch.remainder(i + 3 * rank, 7) + 1 + rank % 5


def reduce_ref(tensors, redop):
    stacked = torch.stack(tensors)
    if redop == "sum":
        return stacked.sum(0)
    if redop == "prod":
        return stacked.prod(0)
    if redop == "avg":
        return stacked.mean(0)
    return stacked.amin(0) if redop == "min" else stacked.amax(0)


@dataclass
class Case:
    """One collective at one size on this rank: buffers, calls and the answer."""
    inp: torch.Tensor
    out: torch.Tensor
    run_oop: Callable[[], object]   # each returns the call's Work
    run_ip: Callable[[], object]
    expect_oop: torch.Tensor        # what `out` holds after run_oop (float64); None = nothing to check here
    expect_ip: torch.Tensor
    ip_result: Callable[[], torch.Tensor]  # the in-place call's result on this rank
    reset: Callable[[], None] = None  # restores what an in-place call overwrote; default: the input

    def __post_init__(self):
        if self.reset is None:
            keep = self.inp.clone()
            self.reset = lambda: self.inp.copy_(keep)


@dataclass
class Collective:
    name: str
    factor: Callable[[int], float]      # bus bandwidth = algbw x factor(n ranks)
    reduces: bool = False               # has a reduction op (redop column, -o)
    rooted: bool = False                # has a root (root column, -r)
    split: bool = False                 # the size is divided among ranks
    copies_oop: bool = False            # out-of-place = copy + in-place call
    check_ip: bool = True               # in-place has a defined result
    native: str = "out-of-place"        # the column that is the plain torch call


def _expect(values, dtype):
    """The reference as the dtype can hold it (integers wrap like the tensors)."""
    if dtype.is_floating_point:
        return values.to(dtype).to(torch.float64)
    return values.to(torch.int64).to(dtype).to(torch.float64)


def make_case(coll, count, dtype, rank, n, group, redop="sum", root=0):
    op = REDOPS[redop]
    mine = pattern(rank, count * (n if coll.name in ("reduce_scatter", "alltoall") else 1), redop)

    def filled(values):
        return values.to(dtype).clone()

    if coll.name in ("all_reduce", "reduce", "broadcast"):
        inp, out = filled(mine), torch.empty(count, dtype=dtype)
        every = [pattern(r, count, redop) for r in range(n)]
        if coll.name == "broadcast":
            want = every[root]
            call = lambda t: dist.broadcast(t, src=root, group=group, async_op=True)  # noqa: E731
        else:
            want = reduce_ref(every, redop)
            if coll.name == "all_reduce":
                call = lambda t: dist.all_reduce(t, op=op, group=group, async_op=True)  # noqa: E731
            else:
                call = lambda t: dist.reduce(t, dst=root, op=op, group=group, async_op=True)  # noqa: E731
                want = want if rank == root else None  # only the root's buffer is defined
        want = None if want is None else _expect(want, dtype)

        def oop():
            out.copy_(inp)
            return call(out)

        return Case(inp, out, oop, lambda: call(inp), want, want, lambda: inp)

    if coll.name == "all_gather":
        inp, out = filled(mine), torch.empty(count * n, dtype=dtype)
        mine_in_out = out.narrow(0, rank * count, count)
        want = _expect(torch.cat([pattern(r, count, redop) for r in range(n)]), dtype)
        return Case(inp, out,
                    lambda: dist.all_gather_into_tensor(out, inp, group=group, async_op=True),
                    lambda: dist.all_gather_into_tensor(out, mine_in_out, group=group, async_op=True),
                    want, want, lambda: out, lambda: mine_in_out.copy_(inp))

    if coll.name == "reduce_scatter":
        inp, out = filled(mine), torch.empty(count, dtype=dtype)
        mine_in_inp = inp.narrow(0, rank * count, count)
        full = reduce_ref([pattern(r, count * n, redop) for r in range(n)], redop)
        want = _expect(full[rank * count:(rank + 1) * count], dtype)
        return Case(inp, out,
                    lambda: dist.reduce_scatter_tensor(out, inp, op=op, group=group, async_op=True),
                    lambda: dist.reduce_scatter_tensor(mine_in_inp, inp, op=op, group=group, async_op=True),
                    want, want, lambda: mine_in_inp)

    if coll.name == "alltoall":
        inp, out = filled(mine), torch.empty(count * n, dtype=dtype)
        want = _expect(torch.cat([pattern(r, count * n, redop)[rank * count:(rank + 1) * count]
                                  for r in range(n)]), dtype)
        return Case(inp, out,
                    lambda: dist.all_to_all_single(out, inp, group=group, async_op=True),
                    lambda: dist.all_to_all_single(inp, inp, group=group, async_op=True),
                    want, want, lambda: inp)

    if coll.name == "sendrecv":
        inp, out = filled(mine), torch.empty(count, dtype=dtype)
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        want = _expect(pattern(prv, count, redop), dtype)

        def ring(src, dst):
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, src, nxt, group),
                                            dist.P2POp(dist.irecv, dst, prv, group)])
            return _All(works)

        return Case(inp, out, lambda: ring(inp, out), lambda: ring(inp, inp), want, None, lambda: inp)
    raise ValueError(coll.name)


class _All:
    """Waits for several Works as one (a send and a receive)."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()


def _ring(n):
    return (n - 1) / n


COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", lambda n: 2 * (n - 1) / n, reduces=True, copies_oop=True, native="in-place"),
    Collective("all_gather", _ring, split=True),
    Collective("reduce_scatter", _ring, reduces=True, split=True),
    Collective("broadcast", lambda n: 1.0, rooted=True, copies_oop=True, native="in-place"),
    Collective("reduce", lambda n: 1.0, reduces=True, rooted=True, copies_oop=True, native="in-place"),
    # In place, the same buffer is sent and received at once, which neither
    # NCCL nor torch defines (Gloo returns wrong data): like nccl-tests, these
    # in-place columns are timed but not checked.
    Collective("alltoall", _ring, split=True, check_ip=False),
    Collective("sendrecv", lambda n: 1.0, check_ip=False),
)}
