"""The correctness matrix, executed inside every rank of one spawned group:
every collective x dtype x applicable reduce op x size, against references
from tests/reference.py. Returns a Checker result; the pytest side asserts that
checks ran and nothing failed. With `device` (tests/test_accelerator.py) the
tensors handed to the collectives live on that device; inputs and references
are still made on the host."""
import torch
import torch.distributed as dist

from .reference import (DTYPES, SIZES, Checker, applicable_ops, block_input, inputs_for, make_input,
                        make_op, reduce_reference)


# One dtype per element size and kind (bool, 2-byte float, 4-byte float,
# 8-byte int, 16-byte complex). Transports and algorithms see a dtype only as
# an element size and a reduction kernel; every kernel runs on every dtype at
# the largest size in the layouts that are not thinned (and in the C++ unit
# tests), so a thinned layout checks the largest size with these alone.
LARGE_REPRESENTATIVES = (torch.bool, torch.bfloat16, torch.float32, torch.int64, torch.complex128)


def _sizes_for(dtype, sizes, thin_large):
    return sizes if not thin_large or dtype in LARGE_REPRESENTATIVES else sizes[:-1]


def _reductions(ck, rank, world, dev, sizes, thin_large):
    for dtype in DTYPES:
        for si, numel in enumerate(_sizes_for(dtype, sizes, thin_large)):
            for opname in applicable_ops(dtype):
                tag = f"{dtype} {opname} n={numel}"
                xs = inputs_for(world, numel, dtype, opname)
                expected = reduce_reference(xs, opname, dtype)
                # all_reduce (in place)
                t = xs[rank].to(dev, copy=True)
                dist.all_reduce(t, op=make_op(opname, dtype, dev))
                ck.close(f"all_reduce {tag}", t, expected, dtype)
                # reduce to a root that moves with the size
                root = si % world
                t = xs[rank].to(dev, copy=True)
                dist.reduce(t, dst=root, op=make_op(opname, dtype, dev))
                ck.close(f"reduce(root={root}) {tag}", t, expected if rank == root else xs[rank], dtype)
                # reduce_scatter_tensor: numel elements per rank; only this rank's
                # block of every peer's input is needed for the reference
                mine = torch.cat([block_input(rank, b, numel, dtype, opname) for b in range(world)])
                out = torch.empty(numel, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, mine.to(dev), op=make_op(opname, dtype, dev))
                blocks = [block_input(k, rank, numel, dtype, opname) for k in range(world)]
                ck.close(f"reduce_scatter_tensor {tag}", out, reduce_reference(blocks, opname, dtype), dtype)
            make_input.cache_clear()  # keep memory bounded: inputs are per (dtype, size)
        # Non-contiguous tensors are handled: a strided view, its gaps untouched.
        base = make_input(rank, 2000, dtype, "sum", 7).to(dev, copy=True)
        view = base[::2]
        before_gaps = base[1::2].clone()
        dist.all_reduce(view)
        xs = [make_input(r, 2000, dtype, "sum", 7)[::2] for r in range(world)]
        ck.close(f"all_reduce non-contiguous {dtype}", view, reduce_reference(xs, "SUM", dtype), dtype)
        ck.same(f"all_reduce non-contiguous gaps {dtype}", base[1::2], before_gaps)
        # reduce_scatter with a list of inputs
        xs = inputs_for(world, 1000 * world, dtype, "SUM", salt=2)
        out = torch.empty(1000, dtype=dtype, device=dev)
        dist.reduce_scatter(out, list(xs[rank].to(dev, copy=True).chunk(world)))
        ck.close(f"reduce_scatter(list) {dtype}", out, reduce_reference(xs, "SUM", dtype)[rank * 1000:(rank + 1) * 1000], dtype)


def _data_movement(ck, rank, world, dev, sizes, thin_large):
    for dtype in DTYPES:
        for si, numel in enumerate(_sizes_for(dtype, sizes, thin_large)):
            tag = f"{dtype} n={numel}"
            xs = [make_input(r, numel, dtype, "wide", 3) for r in range(world)]
            root = (si + 1) % world
            t = xs[rank].to(dev, copy=True) if rank == root else torch.zeros(numel, dtype=dtype, device=dev)
            dist.broadcast(t, src=root)
            ck.same(f"broadcast(root={root}) {tag}", t, xs[root])

            out = torch.empty(numel * world, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, xs[rank].to(dev))
            ck.same(f"all_gather_into_tensor {tag}", out, torch.cat(xs))
            outs = [torch.empty(numel, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_gather(outs, xs[rank].to(dev))
            ck.same(f"all_gather {tag}", torch.cat(outs), torch.cat(xs))

            gl = [torch.empty(numel, dtype=dtype, device=dev) for _ in range(world)] if rank == root else None
            dist.gather(xs[rank].to(dev), gather_list=gl, dst=root)
            if rank == root:
                ck.same(f"gather(root={root}) {tag}", torch.cat(gl), torch.cat(xs))
            out = torch.empty(numel, dtype=dtype, device=dev)
            sl = [make_input(root, numel, dtype, "wide", 10 + r) for r in range(world)]
            dist.scatter(out, scatter_list=[x.to(dev) for x in sl] if rank == root else None, src=root)
            ck.same(f"scatter(root={root}) {tag}", out, sl[rank])

            # all_to_all_single, even split: block r of rank k's input goes to rank r
            ins = [make_input(k, numel * world, dtype, "wide", 4) for k in range(world)]
            out = torch.empty(numel * world, dtype=dtype, device=dev)
            dist.all_to_all_single(out, ins[rank].to(dev))
            exp = torch.cat([ins[k][rank * numel:(rank + 1) * numel] for k in range(world)])
            ck.same(f"all_to_all_single {tag}", out, exp)
        # uneven splits: rank k sends (k + r + 1) * 3 rows of 5 to rank r
        rows = lambda k, r: (k + r + 1) * 3  # noqa: E731
        ins = [make_input(k, 5 * sum(rows(k, r) for r in range(world)), dtype, "wide", 5).view(-1, 5)
               for k in range(world)]
        out = torch.empty(sum(rows(k, rank) for k in range(world)), 5, dtype=dtype, device=dev)
        dist.all_to_all_single(out, ins[rank].to(dev), output_split_sizes=[rows(k, rank) for k in range(world)],
                               input_split_sizes=[rows(rank, r) for r in range(world)])
        parts = []
        for k in range(world):
            start = sum(rows(k, r) for r in range(rank))
            parts.append(ins[k][start:start + rows(k, rank)])
        ck.same(f"all_to_all_single(uneven) {dtype}", out, torch.cat(parts))
        # all_to_all with lists
        ins = [[make_input(k, 10 + r, dtype, "wide", 6) for r in range(world)] for k in range(world)]
        outs = [torch.empty(10 + rank, dtype=dtype, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [x.to(dev) for x in ins[rank]])
        ck.same(f"all_to_all(list) {dtype}", torch.cat(outs), torch.cat([ins[k][rank] for k in range(world)]))


def _coalesced_and_barrier(ck, rank, world, dev):
    for dtype in (torch.float32, torch.int64):
        a = [make_input(k, 100, dtype, "sum", 8) for k in range(world)]
        b = [make_input(k, 33, dtype, "sum", 9) for k in range(world)]
        ta, tb = a[rank].to(dev, copy=True), b[rank].to(dev, copy=True)
        work = dist.all_reduce_coalesced([ta, tb], async_op=True)
        work.wait()
        ck.close(f"all_reduce_coalesced {dtype} a", ta, reduce_reference(a, "SUM", dtype), dtype)
        ck.close(f"all_reduce_coalesced {dtype} b", tb, reduce_reference(b, "SUM", dtype), dtype)
    # Coalesced tensor variants, called on the group and the backend (torch only
    # coalesces for backends that ask for it). The group's *_tensor_coalesced
    # names exist from torch 2.1 on; the backend's *_single_coalesced ones not in 2.11.
    group, backend = dist.group.WORLD, dist.group.WORLD._get_backend(dev)
    sizes = [5, 1000, 3]
    for dtype in (torch.float32, torch.int32):
        ins = {k: [make_input(k, n, dtype, "sum", 30 + i) for i, n in enumerate(sizes)] for k in range(world)}
        outs = [torch.empty(n * world, dtype=dtype, device=dev) for n in sizes]
        group.allgather_into_tensor_coalesced(outs, [x.to(dev, copy=True) for x in ins[rank]]).wait()
        for i in range(len(sizes)):
            ck.same(f"allgather_into_tensor_coalesced {dtype} #{i}", outs[i], torch.cat([ins[k][i] for k in range(world)]))
        # torch's layout: output_lists[r][i] receives rank r's input i
        lists = [[torch.empty(n, dtype=dtype, device=dev) for n in sizes] for _ in range(world)]
        backend.allgather_coalesced(lists, [x.to(dev, copy=True) for x in ins[rank]]).wait()
        for i in range(len(sizes)):
            ck.same(f"allgather_coalesced {dtype} #{i}", torch.cat([lists[k][i] for k in range(world)]),
                    torch.cat([ins[k][i] for k in range(world)]))
        big = {k: [make_input(k, n * world, dtype, "sum", 40 + i) for i, n in enumerate(sizes)] for k in range(world)}
        outs = [torch.empty(n, dtype=dtype, device=dev) for n in sizes]
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        group.reduce_scatter_tensor_coalesced(outs, [x.to(dev, copy=True) for x in big[rank]], opts).wait()
        for i, n in enumerate(sizes):
            expected = reduce_reference([big[k][i][rank * n:(rank + 1) * n] for k in range(world)], "SUM", dtype)
            ck.close(f"reduce_scatter_tensor_coalesced {dtype} #{i}", outs[i], expected, dtype)
    for _ in range(3):
        dist.barrier()
    ck.checks += 1


def run(rank, world, port, parts=("reductions", "data_movement", "coalesced"), device="cpu", sizes=SIZES,
        thin_large=False):
    ck = Checker(rank)
    dev = torch.device(device)
    if "reductions" in parts:
        _reductions(ck, rank, world, dev, sizes, thin_large)
    if "data_movement" in parts:
        _data_movement(ck, rank, world, dev, sizes, thin_large)
    if "coalesced" in parts:
        _coalesced_and_barrier(ck, rank, world, dev)
    return ck.result()
