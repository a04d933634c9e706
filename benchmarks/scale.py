"""Scale: what forming a group and running it costs per rank as the
world grows, on one machine.

(a) torch, torchrun-style (a store served by this process, as torchrun's
    agent serves one; each rank connects once, meets the others in a barrier
    on it, and hands it to init_process_group), roce against Gloo:
    init_process_group's time after that barrier (imports and the store
    connection excluded) and the descriptors per rank, with every rank
    its own simulated machine over TCP (ROCE_PG_NET_TRANSPORT=tcp
    ROCE_PG_SIM_RANKS_PER_NODE=1), so every peer is a network peer. For
    comparison: with every rank dialling every peer at formation, roce took
    0.03 / 5.06 / 10.2 s at 8 / 16 / 32 ranks, Gloo 0.04 / 0.09 / 0.22 s,
    which is why connections are made on demand.
(b) the torch-free harness tests/scale (roce_scale) at 64, 256 and 1,024
    ranks (8 per simulated machine): init time, RSS/PSS, descriptors,
    threads, connections, verbs memory projected for those connections, and
    allreduce times per algorithm. 1,024 runs only if the per-rank memory
    measured at 256 says the machine can hold it.
(c) a log-log plot of both against the world size, to the PNG path given.

    .venv/bin/python benchmarks/scale.py scale.png
    .venv/bin/python benchmarks/scale.py scale.png --torch-ranks 8,16 --harness-ranks 64

roce comes from this checkout (its roce_pg/ with _C built in place:
`python setup.py build_ext --inplace`), else from the installed package; the
first line of (a) says which.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from tests.support.ports import free_port  # noqa: E402

HARNESS = os.path.join(ROOT, "build", "scale", "roce_scale")
RANKS_PER_MACHINE = 8
# Of what the harness runs, the part (b) shows: init and per-rank costs, and
# the allreduce algorithms at 8 B / 1 MiB / 32 MiB (sizes whose buffers do not
# fit at some N are left out there, and the harness says so).
HARNESS_SIZES = "8,1M,32M"
HARNESS_ALGOS = "rd,rabenseifner,ring,tree,hier,auto"
# What 1,024 ranks may take of the memory available, measured per rank at 256.
MEMORY_SHARE = 0.6
KIB, MIB = 1 << 10, 1 << 20


def count_fds():
    return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor


def count_threads():
    return len(os.listdir("/proc/self/task"))


# --------------------------------------------------------------------------- (a)

def _torch_rank(backend, rank, world, port, queue):
    """One rank: the store barrier, then init_process_group alone is timed.

    The store connection is made before the barrier: here 16 or more clients
    connecting to one TCPStore at once wait about 5 s (both backends alike),
    which would hide what the backends themselves cost."""
    import torch
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, world, False, timedelta(seconds=120))
        store.add("arrived", 1)
        store.wait(["go"])
        # A forked rank inherits descriptors of this process (one pipe per
        # rank started before it): count what init adds.
        fds, threads = count_fds(), count_threads()
        start = time.perf_counter()
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))
        took = time.perf_counter() - start
        fds, threads = count_fds() - fds, count_threads() - threads
        t = torch.ones(1)
        dist.all_reduce(t)  # the group works (not timed)
        assert t.item() == world, t
        queue.put((rank, {"init_s": took, "fds": fds, "threads": threads}))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        queue.put((rank, {"error": repr(e)}))


def torch_init(backend, world, deadline_s=300):
    """Per-rank results of one group formation, forked from this process
    (which imported torch once) so that no rank pays the import."""
    import torch.distributed as dist

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_torch_rank, args=(backend, r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    # The store lives here, created after the fork (no child inherits its
    # threads); the ranks' clients retry until it listens.
    store = dist.TCPStore("127.0.0.1", port, world, True, timedelta(seconds=120), wait_for_workers=False)
    end = time.monotonic() + deadline_s
    while store.add("arrived", 0) < world and time.monotonic() < end:
        time.sleep(0.01)
    store.set("go", "1")
    results = {}
    while len(results) < world and time.monotonic() < end:
        try:
            rank, value = queue.get(timeout=1)
            results[rank] = value
        except Exception:  # queue.Empty
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    errors = {r: v["error"] for r, v in results.items() if "error" in v}
    if errors or len(results) < world:
        raise SystemExit(f"{backend} at {world} ranks failed: {errors or f'{world - len(results)} ranks did not report'}")
    return [results[r] for r in range(world)]


def part_a(torch_ranks, repeats):
    import roce_pg  # noqa: F401  (registers "roce")

    print(f"(a) init_process_group after a store barrier, torchrun-style, every rank its own simulated machine "
          f"over TCP; roce from {os.path.dirname(roce_pg.__file__)}; max over ranks, median of {repeats} runs")
    os.environ.update(ROCE_PG_NET_TRANSPORT="tcp", ROCE_PG_SIM_RANKS_PER_NODE="1")
    rows = []
    print("descriptors and threads: what init_process_group added, on the rank with the most")
    print(f"{'ranks':>6} {'backend':>8} {'init s':>8} {'fds':>5} {'threads':>8}")
    for world in torch_ranks:
        for backend in ("roce", "gloo"):
            runs = [torch_init(backend, world) for _ in range(repeats)]
            row = {"ranks": world, "backend": backend,
                   "init_s": statistics.median(max(r["init_s"] for r in run) for run in runs),
                   "fds": max(r["fds"] for r in runs[-1]),
                   "threads": max(r["threads"] for r in runs[-1])}
            rows.append(row)
            print(f"{world:>6} {backend:>8} {row['init_s']:>8.3f} {row['fds']:>5} {row['threads']:>8}", flush=True)
    return rows


# --------------------------------------------------------------------------- (b)

def build_harness():
    subprocess.run(["make", "-C", os.path.join(ROOT, "tests", "scale"), "-j2", "--no-print-directory"],
                   check=True, stdout=subprocess.DEVNULL)


def run_harness(ranks, time_limit_s):
    """roce_scale's JSON for `ranks` ranks, 8 per simulated machine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        layout = f"{ranks // RANKS_PER_MACHINE}x{RANKS_PER_MACHINE}"
        # No correctness checks: at 1,024 ranks on 2 cores they would not end
        # (see the report); tests/test_scale.py checks. Every N runs the same.
        cmd = [HARNESS, "--layout", layout, "--checks", "none", "--algos", HARNESS_ALGOS, "--sizes", HARNESS_SIZES,
               "--budget", "3", "--time-limit", str(time_limit_s), "--json", out]
        print(f"$ {' '.join(cmd[:-2])}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit_s + 60)
        for line in proc.stdout.splitlines():
            if line.startswith(("note:", "FAILED")):
                print(f"  {line}")
        if proc.returncode != 0:
            raise SystemExit(f"roce_scale at {ranks} ranks failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def spread(result, metric):
    values = [v for v in result["metrics"].get(metric, []) if v is not None]
    return (min(values), statistics.median(values), max(values)) if values else None


def memory_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KIB
    return 0


def per_rank_bytes(result):
    """What one rank holds at its peak, on average over the ranks (they peak
    together, in the same timed allreduce): its peak RSS less the pages it
    shares with every other rank (the launcher's image: RSS minus PSS right
    after init), plus its shared-memory segment."""
    m = result["metrics"]
    held = [(peak - (rss - pss) + seg) * KIB
            for peak, rss, pss, seg in zip(m["peak_rss_kib"], m["rss_init_kib"], m["pss_init_kib"], m["shm_segment_kib"])]
    return statistics.mean(held)


def part_b(harness_ranks, time_limit_s):
    build_harness()
    print(f"\n(b) roce_scale (torch-free ranks, {RANKS_PER_MACHINE} per simulated machine, TCP between, shared "
          f"memory inside); per rank min / median / max")
    results = {}
    for ranks in harness_ranks:
        if ranks > 256 and 256 in results:
            need = per_rank_bytes(results[256]) * ranks
            have = memory_available()
            print(f"  {ranks} ranks need about {need / MIB:.0f} MiB ({per_rank_bytes(results[256]) / MIB:.1f} MiB per "
                  f"rank at its peak at 256 ranks: private RSS + own shared-memory segment); {have / MIB:.0f} MiB "
                  f"available")
            if need > MEMORY_SHARE * have:
                print(f"  not running {ranks} ranks: more than {MEMORY_SHARE:.0%} of the available memory")
                continue
        start = time.monotonic()
        results[ranks] = run_harness(ranks, time_limit_s)
        print(f"  {ranks} ranks: {time.monotonic() - start:.0f} s", flush=True)
    print_table(results)
    return results


TABLE_ROWS = [
    ("init_s", "init: store barrier -> Communicator (s)", 1),
    ("rss_init_kib", "RSS right after init (MiB)", 1 / KIB),
    ("pss_init_kib", "PSS right after init (MiB)", 1 / KIB),
    ("peak_rss_kib", "peak RSS, timings included (MiB)", 1 / KIB),
    ("shm_segment_kib", "own shared-memory segment (MiB)", 1 / KIB),
    ("fds_peak", "descriptors, most", 1),
    ("threads_peak", "threads, most", 1),
    ("connections_peak", "network connections, most in a group", 1),
    ("verbs_bytes_peak", "verbs registered, projected (MiB)", 1 / MIB),
]


def print_table(results):
    if not results:
        return
    ns = sorted(results)
    print(f"\n{'per rank (min / median / max)':<42}" + "".join(f"{n:>26}" for n in ns))
    for metric, label, scale in TABLE_ROWS:
        cells = []
        for n in ns:
            s = spread(results[n], metric)
            cells.append("-" if s is None else " / ".join(f"{v * scale:.3g}" for v in s))
        print(f"{label:<42}" + "".join(f"{c:>26}" for c in cells))
    # The store serves every group formation of the run (and the harness's
    # few keys per rank): its load per rank, over the ranks.
    for key, label, scale in (("requests", "store requests, per rank", 1),
                              ("bytes_out", "store bytes sent, per rank (KiB)", 1 / KIB)):
        print(f"{label:<42}" + "".join(f"{results[n]['store'][key] * scale / n:>26.3g}" for n in ns))
    print("\nallreduce, ms per call (median / max over ranks)")
    for algo in HARNESS_ALGOS.split(","):
        for size in HARNESS_SIZES.split(","):
            nbytes = int(size[:-1]) * MIB if size.endswith("M") else int(size)
            cells = []
            for n in ns:
                s = spread(results[n], f"allreduce_{algo}_{nbytes}")
                cells.append("not timed" if s is None else f"{s[1] * 1e3:.3g} / {s[2] * 1e3:.3g}")
            print(f"{algo + ' ' + size:<42}" + "".join(f"{c:>26}" for c in cells))


# --------------------------------------------------------------------------- (c)

def plot(torch_rows, harness, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for backend, style in (("roce", "o-"), ("gloo", "s--")):
        rows = [r for r in torch_rows if r["backend"] == backend]
        if rows:
            left.plot([r["ranks"] for r in rows], [r["init_s"] for r in rows], style,
                      label=f"{backend}: init_process_group (torch, 1 rank per machine)")
    ns = sorted(harness)
    if ns:
        left.plot(ns, [spread(harness[n], "init_s")[2] for n in ns], "^-",
                  label=f"roce core: Communicator (roce_scale, {RANKS_PER_MACHINE} per machine), slowest rank")
    left.set(xscale="log", yscale="log", xlabel="ranks", ylabel="seconds", title="group formation time")
    left.legend(fontsize=8)
    for metric, label, scale in [("connections_peak", "network connections", 1), ("fds_peak", "descriptors", 1),
                                 ("threads_peak", "threads", 1), ("pss_init_kib", "PSS after init (MiB)", 1 / KIB),
                                 ("verbs_bytes_peak", "verbs registered, projected (MiB)", 1 / MIB)]:
        if ns:
            right.plot(ns, [spread(harness[n], metric)[2] * scale for n in ns], "o-", label=label)
    for backend, style in (("roce", "x:"), ("gloo", "+:")):
        rows = [r for r in torch_rows if r["backend"] == backend]
        if rows:
            right.plot([r["ranks"] for r in rows], [r["fds"] for r in rows], style,
                       label=f"{backend}: descriptors init_process_group added (torch)")
    right.set(xscale="log", yscale="log", xlabel="ranks", title="per rank, worst rank")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\n(c) plot written to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plot", help="PNG path for the log-log plot")
    ap.add_argument("--torch-ranks", default="8,16,32", help="world sizes for (a); 'none' skips it")
    ap.add_argument("--harness-ranks", default="64,256,1024", help="world sizes for (b), multiples of 8; 'none' skips it")
    ap.add_argument("--repeats", type=int, default=3, help="formations per backend and size in (a)")
    ap.add_argument("--time-limit", type=int, default=1500, help="seconds per harness run")
    args = ap.parse_args()
    sizes = lambda s: [] if s == "none" else [int(x) for x in s.split(",")]  # noqa: E731
    torch_rows = part_a(sizes(args.torch_ranks), args.repeats) if sizes(args.torch_ranks) else []
    harness = part_b(sizes(args.harness_ranks), args.time_limit) if sizes(args.harness_ranks) else {}
    plot(torch_rows, harness, args.plot)


if __name__ == "__main__":
    main()
