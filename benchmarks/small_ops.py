"""Small-op latency and single-machine allreduce bandwidth, side by side in one run.

    PYTHONPATH=. python benchmarks/small_ops.py [--ranks 2] [--iters 2000] [--big-iters 20]

Rows (all on this machine, `--ranks` local processes):
  * 8-byte allreduce (two float32) latency, median of --reps blocks of --iters
    calls each: roce, gloo, and Open MPI's MPI_Allreduce through mpi4py (the
    MPI column is skipped, with the reason, when mpi4py or mpirun is missing;
    CI does not install them);
  * 32 MiB float32 allreduce bus bandwidth (nccl-tests' busbw = S/t x 2(n-1)/n)
    for roce and gloo, and the bandwidth of a plain `dst.copy_(src)` of 32 MiB
    (S/t) in one process as the yardstick of this machine's memory, and the
    same copy run in --ranks processes at once (the slowest one's S/t): an
    allreduce rank must read and write its own tensor at least once, so when
    one core's copy already saturates the memory bus, busbw / plain copy
    cannot exceed about 1/--ranks (and the concurrent copies show it).
Then the ratios the issue asks for. Machines are shared and noisy: compare
ratios taken in one run, not absolute numbers across runs.

A backend named NAME-nofr (the default list has roce-nofr and gloo-nofr) is
NAME with PyTorch's flight recorder off (TORCH_FR_BUFFER_SIZE=0 in its ranks);
NAME-notrace (also NAME-nofr-notrace) turns roce's own recorder off
(ROCE_PG_TRACE_ENTRIES=0); NAME-frhook runs roce with ROCE_PG_TORCH_FR=hook;
`fake` is torch's FakeProcessGroup, the floor of torch's own per-call path.
Since torch 2.15, init_process_group attaches a recording hook to every group
whose backend does not record natively. roce records natively and by default
asks torch to skip its groups, as torch skips gloo's; with -frhook torch's hook
records roce's groups too, which costs each collective ~1.5-2.5 us of torch's
time (capturing the caller's stack and thread name), about a third of an
8-byte dist.all_reduce. The -nofr rows show each backend with torch's
recorder off (gloo's native one included).

Torch ranks are started by tests/support/ranks.py (a TCP store on a free
port); the MPI column runs `mpirun -np N python small_ops.py --mpi-worker` (as
root it passes --allow-run-as-root; --oversubscribe because ranks may
outnumber cores).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# The repository root, for tests.support; appended, so that roce_pg still
# comes from where it did (PYTHONPATH or the installed package).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.ranks import run_group  # noqa: E402

SMALL_BYTES = 8
BIG_BYTES = 32 << 20


def time_blocks(fn, iters, reps, barrier):
    """Median seconds per call over `reps` blocks of `iters` calls."""
    per_call = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per_call.append((time.perf_counter() - t0) / iters)
    return statistics.median(per_call)


NO_FLIGHT_RECORDER = "-nofr"
NO_ROCE_TRACE = "-notrace"  # roce's own flight recorder off (ROCE_PG_TRACE_ENTRIES=0)
TORCH_FR_HOOK = "-frhook"  # torch's flight-recorder hook on roce's groups too (ROCE_PG_TORCH_FR=hook)


def backend_settings(row):
    """(torch backend, environment) of a row name such as roce-nofr-notrace."""
    backend, env = row, {}
    if backend.endswith(TORCH_FR_HOOK):
        backend = backend[:-len(TORCH_FR_HOOK)]
        env["ROCE_PG_TORCH_FR"] = "hook"
    if backend.endswith(NO_ROCE_TRACE):
        backend = backend[:-len(NO_ROCE_TRACE)]
        env["ROCE_PG_TRACE_ENTRIES"] = "0"
    if backend.endswith(NO_FLIGHT_RECORDER):
        backend = backend[:-len(NO_FLIGHT_RECORDER)]
        env["TORCH_FR_BUFFER_SIZE"] = "0"  # read when torch creates the group and its recorder
    return backend, env


def torch_rank(rank, world, port, backend, args):
    """(8-byte seconds per call, 32 MiB seconds per call, CPU share), the
    slowest rank's times, on every rank."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "fake":
        return fake_rank(rank, world, args)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    small = torch.ones(SMALL_BYTES // 4)
    big = torch.ones(BIG_BYTES // 4)
    for _ in range(args.warmup):
        dist.all_reduce(small)
    dist.all_reduce(big)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    t_small = time_blocks(lambda: dist.all_reduce(small), args.iters, args.reps, dist.barrier)
    cpu_share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)  # all threads of the rank
    t_big = time_blocks(lambda: dist.all_reduce(big), args.big_iters, args.reps, dist.barrier)
    # Every rank's median; report the slowest rank (an allreduce ends for all at once).
    out = [None] * world
    dist.all_gather_object(out, (t_small, t_big, cpu_share))
    dist.destroy_process_group()
    return max(x[0] for x in out), max(x[1] for x in out), sum(x[2] for x in out) / world


def fake_rank(rank, world, args):
    """torch's floor: FakeProcessGroup completes every call at once, so this is
    torch's Python and dispatcher path alone (no 32 MiB row: nothing moves)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    small = torch.ones(SMALL_BYTES // 4)
    for _ in range(args.warmup):
        dist.all_reduce(small)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    t_small = time_blocks(lambda: dist.all_reduce(small), args.iters, args.reps, lambda: None)
    cpu_share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    dist.destroy_process_group()
    return t_small, float("nan"), cpu_share  # the ranks share nothing: each its own figure


def run_torch(row, args):
    """torch_rank's figures for one row (a backend name, with -nofr etc.):
    rank 0's; a rank that fails or a run past --timeout ends the run."""
    backend, env = backend_settings(row)
    return run_group("benchmarks.small_ops.torch_rank", args.ranks, env=env, init=False, deadline_s=args.timeout,
                     kwargs={"backend": backend, "args": args})[0]


def mpi_worker(args):
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    src = np.ones(SMALL_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    for _ in range(args.warmup):
        comm.Allreduce(src, dst, op=MPI.SUM)
    t = time_blocks(lambda: comm.Allreduce(src, dst, op=MPI.SUM), args.iters, args.reps, comm.Barrier)
    t = comm.allreduce(t, op=MPI.MAX)
    if comm.Get_rank() == 0:
        print("MPI_RESULT " + json.dumps({"small_s": t}), flush=True)


def run_mpi(args):
    """(seconds per 8-byte MPI_Allreduce, None) or (None, why it was skipped)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None, "mpi4py is not installed (pip install mpi4py; needs an MPI such as openmpi-bin + libopenmpi-dev)"
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None, "mpirun not found on PATH"
    cmd = [mpirun, "-np", str(args.ranks), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, os.path.abspath(__file__), "--mpi-worker", "--iters", str(args.iters),
            "--reps", str(args.reps), "--warmup", str(args.warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    for line in p.stdout.splitlines():
        if line.startswith("MPI_RESULT "):
            return json.loads(line.split(" ", 1)[1])["small_s"], None
    return None, f"mpirun failed (rc {p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}"


def copy_bandwidth(nbytes, iters, reps, barrier=lambda: None):
    import torch

    torch.set_num_threads(1)  # one core, as each rank of an allreduce has
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time_blocks(lambda: dst.copy_(src), iters, reps, barrier)
    return nbytes / t / 1e9


def copy_rank(rank, world, port, args):
    """One of `world` processes copying 32 MiB at the same time (blocks start
    together, through a store barrier); the slowest one's GB/s."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gbs = copy_bandwidth(BIG_BYTES, args.big_iters, args.reps, dist.barrier)
    out = [None] * world
    dist.all_gather_object(out, gbs)
    dist.destroy_process_group()
    return min(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=2000, help="8-byte calls per timed block")
    p.add_argument("--big-iters", type=int, default=20, help="32 MiB calls per timed block")
    p.add_argument("--reps", type=int, default=5, help="timed blocks (the median is reported)")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--backends", default="fake,roce,gloo,roce-frhook,gloo-nofr",
                   help="comma-separated; NAME-nofr runs NAME with torch's flight recorder off, roce-frhook with "
                        "ROCE_PG_TORCH_FR=hook; fake is "
                        "torch's FakeProcessGroup (the floor of torch's own per-call path)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the backend list this many times, interleaved, and keep each backend's best round "
                        "(a busy machine's noise comes in bursts)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--no-mpi", action="store_true", help="skip the MPI column")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mpi_worker:
        return mpi_worker(args)

    n = args.ranks
    factor = 2 * (n - 1) / n
    print(f"# small_ops: {n} local ranks, {os.cpu_count()} CPUs, "
          f"ROCE_PG_*: {{{', '.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k.startswith('ROCE_PG_'))}}}")
    results = {}
    for _ in range(args.rounds):
        for b in args.backends.split(","):
            r = run_torch(b, args)
            results[b] = r if b not in results else min(results[b], r)
    mpi_s, mpi_why = run_mpi(args) if not args.no_mpi else (None, "--no-mpi")
    copy_gbs = copy_bandwidth(BIG_BYTES, args.big_iters, args.reps)
    copies_gbs = run_group("benchmarks.small_ops.copy_rank", n, init=False, deadline_s=args.timeout,
                           kwargs={"args": args})[0]

    print(f"# {'':12s} {'8 B allreduce (us)':>20s} {'32 MiB busbw (GB/s)':>21s} {'CPU/rank in 8 B loop':>21s}")
    for b, (ts, tb, cpu) in results.items():
        print(f"  {b:12s} {ts * 1e6:20.2f} {BIG_BYTES / tb / 1e9 * factor:21.2f} {cpu:20.0%}")
    if mpi_s is not None:
        print(f"  {'mpi':12s} {mpi_s * 1e6:20.2f} {'-':>21s}")
    else:
        print(f"# MPI column skipped: {mpi_why}")
    print(f"  {'tensor copy':12s} {'-':>20s} {copy_gbs:21.2f}   (dst.copy_(src), 32 MiB, one process)")
    print(f"  {f'{n} copies':12s} {'-':>20s} {copies_gbs:21.2f}   (the same in {n} processes at once; the slowest)")
    if "fake" in results:
        print(f"# 8 B allreduce above torch's floor (fake backend) [target: <= 2 us with recording on]")
        for b, (ts, _, _) in results.items():
            if b != "fake":
                print(f"#   {b:18s} {(ts - results['fake'][0]) * 1e6:6.2f} us")
    for suffix, what in (("", "torch defaults"), (NO_FLIGHT_RECORDER, "flight recorder off")):
        roce, gloo = results.get("roce" + suffix), results.get("gloo" + suffix)
        if roce is None:
            continue
        ts, tb, _ = roce
        bus = BIG_BYTES / tb / 1e9 * factor
        print(f"# ratios, {what} (targets in brackets)")
        if mpi_s is not None:
            print(f"#   8 B:    roce / MPI  = {ts / mpi_s:6.2f}x slower  [<= 5x]")
        if gloo is not None:
            print(f"#   8 B:    gloo / roce = {gloo[0] / ts:6.1f}x faster [>= 50x]")
            print(f"#   32 MiB: roce / gloo = {gloo[1] / tb:6.2f}x busbw  [>= 5x]")
        print(f"#   32 MiB: roce busbw / plain copy = {bus / copy_gbs:5.2f}   [>= 0.5]")
        print(f"#   32 MiB: roce busbw / {n} copies at once = {bus / copies_gbs:5.2f}   (each rank reads and "
              "writes its own tensor as each copy does)")


if __name__ == "__main__":
    main()
