"""roce's allreduce on CUDA tensors against the copies it cannot avoid, in one run.

    python3 benchmarks/cuda_staging.py [--sizes-mib 1 4 16 64 256] [--json out.json]
    python3 benchmarks/cuda_staging.py --device testdev --sizes-mib 1 4   # a smoke test without a GPU

Run from the repository root on a machine with torch + CUDA and the extension
built in place (`python setup.py build_ext --inplace`). Two ranks on this
machine (spawned here, TCP store on a free port): on GPUs 0 and 1 when there
are two, else both on GPU 0. For every size (float32):

  roce      busbw of dist.all_reduce on CUDA tensors with roce (staged through
            pinned host memory in ROCE_PG_DEVICE_PIECE_BYTES pieces, reduced
            on the host: ROCE_PG_DEVICE_REDUCE=host; docs/ACCELERATORS.md)
  roce-dev  the same with the reductions on the device
            (ROCE_PG_DEVICE_REDUCE=device, a second roce group in the same run)
  gloo      the same call through Gloo's CUDA path
  copy      the yardstick: per rank, both ranks copying at once, the bytes of
            one device-to-host copy into pinned memory plus one host-to-device
            copy back (2 S) over the time of the two, issued one after the
            other on one stream and waited for: what a staged allreduce must
            move at least, at the rate one direction after the other gives
  duplex    the same two copies on two streams at once (the link's two
            directions together; roce's two copy streams can approach it)
  roce/copy the ratio asked for (goal >= 0.7): with the copies out and back
            overlapped and the host part hidden behind them, busbw tends to
            the one-direction copy rate, i.e. to `copy`
  dev/copy  roce-dev / copy
  host      busbw of roce's allreduce of CPU tensors of the same size: the
            host part alone (reductions and the shared-memory transport), for
            context: roce cannot beat it on CUDA tensors

busbw = S / t x 2 (n - 1) / n (nccl-tests' definition; n = 2 here, so busbw =
S / t). Every allreduce result is checked (each rank contributes rank + 1;
the sum must be 3 everywhere) and a wrong one stops the run.

The script uses the device-generic torch API (torch.accelerator, torch.Stream),
so `--device testdev` runs it on the test device of tests/testdev (no Gloo
column there: Gloo stages CUDA tensors only); its numbers mean nothing, it
only checks the script before a GPU run.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the in-place build of roce_pg, and tests.support

from tests.support.ranks import run_group  # noqa: E402

WORLD = 2
MIB = 1 << 20


def iterations(nbytes):
    return max(5, min(50, (1 << 30) // nbytes))


def timed(fn, iters, barrier, sync):
    """Seconds per call, all ranks starting together, the device drained."""
    fn()
    sync()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def check(x, world, what):
    import torch

    expected = float(world * (world + 1) // 2)
    if not bool(torch.eq(x, expected).all()):
        bad = x[x != expected]
        raise AssertionError(f"{what}: wrong allreduce result ({bad.numel()} elements differ, e.g. {bad[:3].tolist()})")


def rank_main(rank, world, port, args):
    """One rank's rows; with --device testdev the device was loaded before roce_pg
    registered (run_group's prepare)."""
    import torch
    import torch.distributed as dist

    import roce_pg

    torch.accelerator.set_device_index(rank % torch.accelerator.device_count())
    dev = torch.device(args.device, torch.accelerator.current_device_index())
    # A group reads its ROCE_PG_* settings when it is created: the world
    # group reduces on the host, a second roce group on the device.
    os.environ["ROCE_PG_DEVICE_REDUCE"] = "host"
    dist.init_process_group("roce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    os.environ["ROCE_PG_DEVICE_REDUCE"] = "device"
    on_device = dist.new_group(backend="roce")
    os.environ["ROCE_PG_DEVICE_REDUCE"] = "host"
    gloo = dist.new_group(backend="gloo")
    sync = lambda: torch.accelerator.synchronize(dev)  # noqa: E731
    barrier = lambda: dist.barrier(group=gloo)  # noqa: E731  (a host barrier on the side group)
    backends = (("roce", None), ("roce-dev", on_device))
    if args.device == "cuda":
        backends += (("gloo", gloo),)
    rows = []
    for mib in args.sizes_mib:
        nbytes = mib * MIB
        n = nbytes // 4
        iters = iterations(nbytes)
        row = {"MiB": mib, "iters": iters}
        x = torch.empty(n, device=dev)
        row["gloo"] = float("nan")
        for name, group in backends:
            t = timed(lambda: dist.all_reduce(x, group=group), iters, barrier, sync)
            row[name] = nbytes / t * 2 * (WORLD - 1) / WORLD / 1e9
            x.fill_(float(rank + 1))
            dist.all_reduce(x, group=group)
            check(x, WORLD, f"{name} {mib} MiB")
        pinned = torch.empty(n, pin_memory=True)
        pinned2 = torch.empty(n, pin_memory=True)
        y = torch.empty(n, device=dev)

        def copy_pair():
            pinned.copy_(x, non_blocking=True)
            x.copy_(pinned, non_blocking=True)

        row["copy"] = 2 * nbytes / timed(copy_pair, iters, barrier, sync) / 1e9
        out_stream, in_stream = torch.Stream(device=dev), torch.Stream(device=dev)

        def duplex():
            main = torch.accelerator.current_stream(dev)
            out_stream.wait_stream(main)
            in_stream.wait_stream(main)
            with out_stream:
                pinned.copy_(x, non_blocking=True)
            with in_stream:
                y.copy_(pinned2, non_blocking=True)
            main.wait_stream(out_stream)
            main.wait_stream(in_stream)

        row["duplex"] = 2 * nbytes / timed(duplex, iters, barrier, sync) / 1e9
        row["roce/copy"] = row["roce"] / row["copy"]
        row["dev/copy"] = row["roce-dev"] / row["copy"]
        host = torch.empty(n)
        t = timed(lambda: dist.all_reduce(host), iters, barrier, lambda: None)
        row["host"] = nbytes / t * 2 * (WORLD - 1) / WORLD / 1e9
        host.fill_(float(rank + 1))
        dist.all_reduce(host)
        check(host, WORLD, f"roce CPU {mib} MiB")
        rows.append(row)
        del x, y, pinned, pinned2, host
    name = torch.cuda.get_device_name(dev) if args.device == "cuda" else args.device
    info = {"device": name, "torch": torch.__version__, "gpus": torch.accelerator.device_count(),
            "rank_device": str(dev), "staging": roce_pg.device_staging_stats(device=args.device)}
    dist.destroy_process_group()
    return {"rows": rows, "info": info}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--json", help="also write the rows and the setup here")
    ap.add_argument("--device", default="cuda", help="cuda (default), or testdev to check the script without a GPU")
    args = ap.parse_args()
    prepare = "tests.testdev.load" if args.device == "testdev" else None  # the device before roce_pg registers
    results = run_group("benchmarks.cuda_staging.rank_main", WORLD, init=False, deadline_s=1800, prepare=prepare,
                        kwargs={"args": args})
    info = results[0]["info"]
    print(f"# {info['device']} x{info['gpus']} (rank 0 on {info['rank_device']}, rank 1 on "
          f"{results[1]['info']['rank_device']}), torch {info['torch']}, {WORLD} ranks")
    print(f"# GB/s per rank; the slower rank's figure. roce staging buffers: {info['staging']}")
    cols = ["MiB", "roce", "roce-dev", "gloo", "copy", "duplex", "roce/copy", "dev/copy", "host"]
    print("  ".join(f"{c:>9}" for c in cols))
    merged = []
    for r0, r1 in zip(results[0]["rows"], results[1]["rows"]):
        row = {c: min(r0[c], r1[c]) for c in cols if c not in ("MiB", "roce/copy", "dev/copy")}
        row["MiB"] = r0["MiB"]
        row["roce/copy"] = row["roce"] / row["copy"]
        row["dev/copy"] = row["roce-dev"] / row["copy"]
        merged.append(row)
        print("  ".join(f"{row[c]:>9.3f}" if isinstance(row[c], float) else f"{row[c]:>9}" for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": merged, "per_rank": dict(enumerate(results))}, f, indent=1)


if __name__ == "__main__":
    main()
