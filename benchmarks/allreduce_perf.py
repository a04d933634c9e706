"""nccl-tests-style all_reduce_perf for torch.distributed backends, side by side.

    torchrun --nproc_per_node 2 benchmarks/allreduce_perf.py -b 8 -e 32M -f 4 --backends roce,gloo

Prints, for each backend, the nccl-tests table (out-of-place block = copy into
the output then allreduce it, since torch's allreduce is in place; in-place
block = the plain call), then the ratios of every backend to the first one
for the in-place time and bus bandwidth, and a plain tensor copy measured in the
same run as a memory-bandwidth yardstick. Times are the max over ranks of the
mean over -n iterations, after -w warm-up iterations.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

DTYPES = {"float": torch.float32, "float32": torch.float32, "double": torch.float64, "half": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT,
       "avg": dist.ReduceOp.AVG}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def sizes(args):
    s = parse_size(args.minbytes)
    while s <= parse_size(args.maxbytes):
        yield s
        s *= args.stepfactor


def timed(fn, iters, warmup, coord):
    for _ in range(warmup):
        fn()
    dist.barrier(group=coord)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=coord)
    return elapsed.item()


def run_backend(name, group, args, coord):
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype, op = DTYPES[args.datatype], OPS[args.op]
    esize = torch.tensor([], dtype=dtype).element_size()
    factor = 2 * (world - 1) / world
    rows = []
    for size in sizes(args):
        count = max(1, size // esize)
        nbytes = count * esize
        inp = torch.full((count,), float(rank + 1), dtype=dtype)
        out = torch.empty_like(inp)

        def out_of_place():
            out.copy_(inp)
            dist.all_reduce(out, op=op, group=group)

        def in_place():
            dist.all_reduce(inp, op=op, group=group)

        t_oop = timed(out_of_place, args.iters, args.warmup, coord)
        t_ip = timed(in_place, args.iters, args.warmup, coord)
        wrong = -1
        if args.check and args.op == "sum":
            inp.fill_(rank + 1)
            dist.all_reduce(inp, op=op, group=group)
            wrong = int((inp != world * (world + 1) // 2).sum().item())
            total = torch.tensor([wrong])
            dist.all_reduce(total, group=coord)
            wrong = int(total.item())
        rows.append((nbytes, count, t_oop, t_ip, wrong))
    if rank == 0:
        print(f"#\n# backend: {name}   ranks: {world}   type: {args.datatype}   op: {args.op}")
        print("#       size         count      type   redop    root     time   algbw   busbw #wrong"
              "     time   algbw   busbw #wrong")
        print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
              "     (us)  (GB/s)  (GB/s)")
        bus = []
        for nbytes, count, t1, t2, wrong in rows:
            a1, a2 = nbytes / t1 / 1e9, nbytes / t2 / 1e9
            w = "N/A" if wrong < 0 else str(wrong)
            print(f"{nbytes:12d}  {count:12d}  {args.datatype:>8s}  {args.op:>6s}  {-1:6d}  {t1 * 1e6:8.2f}  "
                  f"{a1:6.2f}  {a1 * factor:6.2f}  {w:>5s}  {t2 * 1e6:8.2f}  {a2:6.2f}  {a2 * factor:6.2f}  {w:>5s}")
            bus.append(a2 * factor)
        print(f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4f}")
    return rows


def copy_bandwidth(nbytes, iters=20):
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    return nbytes / ((time.perf_counter() - t0) / iters) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="32M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-o", "--op", default="sum", choices=sorted(OPS))
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("--backends", default="roce,gloo", help="comma-separated; ratios are relative to the first")
    args = p.parse_args()

    import roce_pg  # noqa: F401  (registers "roce")

    # Coordination (timing barriers, max over ranks) runs on Gloo so it never
    # perturbs the backend under test.
    dist.init_process_group("gloo")
    coord = dist.group.WORLD
    results = {}
    for name in args.backends.split(","):
        group = dist.new_group(backend=name)
        results[name] = run_backend(name, group, args, coord)
        dist.destroy_process_group(group)
    if dist.get_rank() == 0:
        base = args.backends.split(",")[0]
        copy_gbs = copy_bandwidth(parse_size(args.maxbytes))
        factor = 2 * (dist.get_world_size() - 1) / dist.get_world_size()
        print(f"#\n# plain tensor copy of {args.maxbytes}B in this run: {copy_gbs:.2f} GB/s")
        for other in args.backends.split(",")[1:]:
            # Same bytes on both sides: the time ratio is also the bus-bandwidth ratio.
            print(f"#\n# {base} vs {other}, in place: speed-up = {other} time / {base} time")
            print("#           size   speed-up")
            for (nb, _, _, t_base, _), (_, _, _, t_other, _) in zip(results[base], results[other]):
                print(f"#   {nb:12d}   {t_other / t_base:8.2f}x")
        nb, _, _, t_last, _ = results[base][-1]
        print(f"# {base} busbw at {nb} B / plain copy bandwidth: {nb / t_last / 1e9 * factor / copy_gbs:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
