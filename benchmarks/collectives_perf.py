"""nccl-tests for torch.distributed backends: the tables of all_reduce_perf,
all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf,
alltoall_perf and sendrecv_perf, for several backends side by side.

    torchrun --standalone --nproc_per_node 2 benchmarks/collectives_perf.py \\
        -b 8 -e 32M -f 4 --coll all_reduce,all_gather --backend roce,gloo --plot busbw.png

Flags mean what they mean in nccl-tests (-b -e -i -f -n -w -m -c -o -d -r -a
-z); columns: size, count, type, redop, root, then time (us), algbw, busbw
(GB/s, nccl-tests' factors) and #wrong, out of place then in place. Each
backend gets its own table per collective, then the ratio of every backend
to the first per size. Sizes are measured backend after backend, so a busy
machine slows all of them alike.

Where this differs from nccl-tests, and why: -z defaults to 1 (the host
waits for each call, as training code does on CPU tensors); -c N runs N
checked calls after the timed ones (fresh inputs, every element compared
against an independent float64 reference). The plain tensor copy measured at
the end is a yardstick for shared-memory bandwidth on this machine.
"""
import argparse
import csv
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import coll_ops
import runenv

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.sizes import parse_size  # noqa: E402

DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
          "half": torch.float16, "float": torch.float32, "double": torch.float64, "bfloat16": torch.bfloat16}
ALIASES = {"char": "int8", "int": "int32", "float16": "half", "float32": "float", "float64": "double"}
AVERAGE = {0: "rank 0", 1: "average over ranks", 2: "minimum over ranks", 3: "maximum over ranks"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="32M")
    p.add_argument("-i", "--stepbytes", default="1M", help="fixed increment, used when -f is 1")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiplication factor between sizes")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-m", "--agg_iters", type=int, default=1, help="calls issued together per iteration")
    p.add_argument("-c", "--check", type=int, default=1, help="checked calls per size and column (0 = none)")
    p.add_argument("-o", "--op", default="sum", help="reduction: sum, prod, min, max, avg, or all")
    p.add_argument("-d", "--datatype", default="float", help=f"{', '.join(DTYPES)}, or all")
    p.add_argument("-r", "--root", default="0", help="root of broadcast/reduce, or all")
    p.add_argument("-a", "--average", type=int, default=1, choices=sorted(AVERAGE),
                   help="time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks")
    p.add_argument("-z", "--blocking", type=int, default=1, choices=(0, 1),
                   help="1: wait for each call; 0: issue all -n x -m calls, then wait")
    p.add_argument("--coll", "--collective", dest="coll", default="all_reduce",
                   help=f"comma-separated: {', '.join(coll_ops.COLLECTIVES)}, or all")
    p.add_argument("--backend", "--backends", dest="backend", default="roce,gloo",
                   help="comma-separated; ratios are relative to the first")
    p.add_argument("-F", "--csv", metavar="FILE", help="one row per backend, collective and size")
    p.add_argument("--json", metavar="FILE", help="configuration and every row")
    p.add_argument("--plot", metavar="FILE.png", help="bus bandwidth vs size, one line per backend and collective")
    args = p.parse_args()
    args.backends = args.backend.split(",")
    args.colls = list(coll_ops.COLLECTIVES) if args.coll == "all" else args.coll.split(",")
    unknown = [c for c in args.colls if c not in coll_ops.COLLECTIVES]
    types = list(DTYPES) if args.datatype == "all" else [ALIASES.get(args.datatype, args.datatype)]
    args.redops = list(coll_ops.REDOPS) if args.op == "all" else [args.op]
    if unknown or types[0] not in DTYPES or args.redops[0] not in coll_ops.REDOPS:
        p.error(f"unknown collective/datatype/op: {unknown or types or args.redops}")
    args.types = types
    if args.plot:
        try:  # fail now, not after the whole run
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib: .venv/bin/pip install matplotlib")
    return args


def counts(coll, args, esize, world):
    """Elements per call for each size of -b/-e/-f (-i); sizes too small to
    give every rank a different element count collapse into one row."""
    s, top = max(1, parse_size(args.minbytes)), parse_size(args.maxbytes)
    share = esize * (world if coll.split else 1)
    seen = set()
    while s <= top:
        count = max(1, s // share)
        if count not in seen:
            seen.add(count)
            yield count
        s = s * args.stepfactor if args.stepfactor > 1 else s + parse_size(args.stepbytes)


def variants(coll, args, world):
    """(type, redop, root) combinations that apply to this collective."""
    redops = args.redops if coll.reduces else ["none"]
    roots = (range(world) if args.root == "all" else [int(args.root)]) if coll.rooted else [-1]
    return [(t, o, r) for t in args.types for o in redops for r in roots]


def timed(launch, args, serial, coord):
    """Seconds per call on this rank, after -w warm-up calls."""
    blocking = args.blocking or serial  # a call that first copies must not overlap the previous one
    for _ in range(args.warmup_iters):
        launch().wait()
    dist.barrier(group=coord)
    pending = []
    t0 = time.perf_counter()
    for _ in range(args.iters * args.agg_iters):
        work = launch()
        if blocking:
            work.wait()
        else:
            pending.append(work)
    for work in pending:
        work.wait()
    return (time.perf_counter() - t0) / (args.iters * args.agg_iters)


def count_wrong(case, run, result, expect, checks):
    wrong = 0
    for _ in range(checks):
        case.reset()
        run().wait()
        if expect is not None:
            wrong += int((result().to(torch.float64) != expect).sum().item())
    return wrong


def measure(coll, backend, group, count, variant, args, coord):
    """One table row: times aggregated over ranks (-a) and wrong elements summed."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype_name, redop, root = variant
    dtype = DTYPES[dtype_name]
    esize = dtype.itemsize
    case = coll_ops.make_case(coll, count, dtype, rank, world, group,
                              redop if coll.reduces else "sum", max(root, 0))
    t_oop = timed(case.run_oop, args, coll.copies_oop, coord)
    t_ip = timed(case.run_ip, args, False, coord)
    wrong = [-1, -1]
    if args.check:
        wrong = [count_wrong(case, case.run_oop, lambda: case.out, case.expect_oop, args.check),
                 count_wrong(case, case.run_ip, case.ip_result, case.expect_ip, args.check) if coll.check_ip else -1]
    stats = torch.tensor([t_oop, t_ip] + wrong, dtype=torch.float64)
    every = [torch.empty_like(stats) for _ in range(world)]
    dist.all_gather(every, stats, group=coord)
    every = torch.stack(every)
    times = {0: every[0, :2], 1: every[:, :2].mean(0), 2: every[:, :2].amin(0), 3: every[:, :2].amax(0)}
    t_oop, t_ip = times[args.average].tolist()
    wrong = [-1 if w < 0 else int(every[:, 2 + i].sum().item()) for i, w in enumerate(wrong)]
    nbytes = count * esize * (world if coll.split else 1)
    factor = coll.factor(world)
    row = {"backend": backend, "collective": coll.name, "size": nbytes, "count": count, "type": dtype_name,
           "redop": redop, "root": root}
    for tag, t, w in (("oop", t_oop, wrong[0]), ("ip", t_ip, wrong[1])):
        algbw = nbytes / t / 1e9
        row |= {f"{tag}_time_us": t * 1e6, f"{tag}_algbw": algbw, f"{tag}_busbw": algbw * factor,
                f"{tag}_wrong": None if w < 0 else w}
    return row


def fmt_time(us):
    """Fits nccl-tests' 7-character time column at any magnitude."""
    return f"{us:7.0f}" if us >= 1e4 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def print_table(rows, backend, coll, world):
    first = rows[0]
    redop = f"   op: {first['redop']}" if first["redop"] != "none" else ""
    print(f"#\n# {coll}_perf   backend: {backend}   ranks: {world}   type: {first['type']}{redop}")
    print(f"# {'':10s}  {'':12s}  {'':8s}  {'':6s}  {'':6s}  {'out-of-place':^31s}  {'in-place':^31s}")
    print(f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}"
          + f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}" * 2)
    print(f"# {'(B)':>10s}  {'(elements)':>12s}  {'':8s}  {'':6s}  {'':6s}"
          + f"  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s} {'':6s}" * 2)
    for r in rows:
        line = f"{r['size']:12d}  {r['count']:12d}  {r['type']:>8s}  {r['redop']:>6s}  {r['root']:6d}"
        for tag in ("oop", "ip"):
            w = "N/A" if r[f"{tag}_wrong"] is None else str(r[f"{tag}_wrong"])
            line += (f"  {fmt_time(r[f'{tag}_time_us'])}  {r[f'{tag}_algbw']:6.2f}  {r[f'{tag}_busbw']:6.2f}"
                     f"  {w:>5s}")
        print(line)
    bus = [r[f"{t}_busbw"] for r in rows for t in ("oop", "ip")]
    print(f"# Wrong elements       : {total_wrong(rows)} {'OK' if total_wrong(rows) == 0 else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {sum(bus) / len(bus):.4f}")


def total_wrong(rows):
    return sum(r[f"{t}_wrong"] or 0 for r in rows for t in ("oop", "ip"))


def print_ratios(rows_by_backend, coll):
    """Same bytes on both sides, so the time ratio is also the busbw ratio."""
    if not rows_by_backend:
        return
    base, *others = rows_by_backend
    for other in others:
        print(f"#\n# {coll}: {base} vs {other}, speed-up = {other} time / {base} time")
        print(f"# {'size':>10s}  {'out-of-place':>12s}  {'in-place':>9s}")
        for a, b in zip(rows_by_backend[base], rows_by_backend[other]):
            print(f"# {a['size']:10d}  {b['oop_time_us'] / a['oop_time_us']:11.2f}x"
                  f"  {b['ip_time_us'] / a['ip_time_us']:8.2f}x")


def copy_bandwidth(nbytes, iters=10):
    src = torch.ones(max(1, nbytes // 4))
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    return src.numel() * 4 / ((time.perf_counter() - t0) / iters) / 1e9


def write_outputs(args, rows, config):
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(rows[0]))
            out.writeheader()
            out.writerows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": config, "rows": rows}, f, indent=1)
    if args.plot:
        import plot_busbw
        plot_busbw.plot(rows, args.plot, config)


def run_variant(coll, variant, groups, args, coord, progress):
    """Every size on every backend, interleaved so that a machine growing
    busier slows all backends alike. A combination a backend rejects (e.g.
    AVG on integers in Gloo: the same error on every rank, at the first call)
    drops that backend from this table instead of ending the run."""
    table, skipped = {b: [] for b in groups}, {}
    for count in counts(coll, args, DTYPES[variant[0]].itemsize, dist.get_world_size()):
        for b in [b for b in groups if b not in skipped]:
            progress.update(f"{coll.name} {variant[0]}: {count} elements on {b}")
            try:
                table[b].append(measure(coll, b, groups[b], count, variant, args, coord))
            except (RuntimeError, ValueError) as e:
                skipped[b] = str(e).splitlines()[0]
    progress.clear()
    return {b: rows for b, rows in table.items() if b not in skipped}, skipped


def main():
    args = parse_args()
    runenv.check_backends(args.backends, "cpu")
    coord = runenv.init_coordination()
    world, rank = dist.get_world_size(), dist.get_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    groups = {b: dist.new_group(backend=b) for b in args.backends}
    say(f"# collectives_perf: minBytes {parse_size(args.minbytes)} maxBytes {parse_size(args.maxbytes)} "
        f"step: {args.stepfactor if args.stepfactor > 1 else args.stepbytes}({'factor' if args.stepfactor > 1 else 'bytes'}) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: {args.agg_iters} "
        f"validation: {args.check} blocking: {args.blocking} time: {AVERAGE[args.average]}")
    for line in runenv.config_lines(args.backends, "cpu"):
        say("# " + line)
    progress = runenv.Progress()
    all_rows = []
    for name in args.colls:
        coll = coll_ops.COLLECTIVES[name]
        if name == "sendrecv" and world < 2:
            say("#\n# sendrecv needs 2 ranks or more: skipped")
            continue
        for variant in variants(coll, args, world):
            table, skipped = run_variant(coll, variant, groups, args, coord, progress)
            if rank == 0:
                for b, rows in table.items():
                    print_table(rows, b, name, world)
                for b, why in skipped.items():
                    print(f"#\n# {name}_perf   backend: {b}   {variant[0]} {variant[1]}: not supported: {why}")
                print_ratios(table, name)
            all_rows += [r for rows in table.values() for r in rows]
    if rank == 0:
        top = parse_size(args.maxbytes)
        say(f"#\n# plain tensor copy of {top} B on rank 0 in this run: {copy_bandwidth(top):.2f} GB/s")
        config = vars(args) | {"world": world, "layout": runenv.world_layout(), "torch": torch.__version__,
                               "roce_settings": runenv.roce_settings()}
        write_outputs(args, all_rows, config)
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()
    if total_wrong(all_rows):
        raise SystemExit(1)  # like nccl-tests: a wrong result fails the run


if __name__ == "__main__":
    main()
