"""What an 8-byte dist.all_reduce costs before any communication: one-rank
groups, each backend with PyTorch's flight recorder on (torch's default),
off (TORCH_FR_BUFFER_SIZE=0), and with roce's own recorder off as well
(ROCE_PG_TRACE_ENTRIES=0; the other backends ignore it).

    PYTHONPATH=. python benchmarks/call_floor.py [--backends fake,roce,gloo] [--runs 3]

`fake` is torch's FakeProcessGroup, which completes every call at once: the
floor of torch's Python and dispatcher path. Since torch 2.15 the flight
recorder hooks every group whose backend does not record natively (roce, not
gloo or fake), so the first two columns differ by that hook's cost, the last
two by roce's native recording. Each figure is
the best of 7 blocks of --calls calls, measured in a fresh process per
backend and setting, the settings interleaved run by run.
"""
import argparse
import os
import subprocess
import sys
import time


def one_group(backend, calls):
    import torch
    import torch.distributed as dist

    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    else:
        if backend == "roce":
            import roce_pg  # noqa: F401  (registers "roce")
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    t = torch.ones(2)
    for _ in range(calls // 10):
        dist.all_reduce(t)
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t)
        best = min(best, (time.perf_counter() - t0) / calls)
    dist.destroy_process_group()
    print(f"{best * 1e6:.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="fake,roce,gloo")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=50000)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one_group(args.one, args.calls)
    settings = (("torch defaults", {}), ("TORCH_FR_BUFFER_SIZE=0", {"TORCH_FR_BUFFER_SIZE": "0"}),
                ("both recorders off", {"TORCH_FR_BUFFER_SIZE": "0", "ROCE_PG_TRACE_ENTRIES": "0"}))
    results = {(b, s): [] for b in args.backends.split(",") for s, _ in settings}
    for _ in range(args.runs):
        for b in args.backends.split(","):
            for s, extra in settings:
                env = dict(os.environ, **extra)
                for var in ("TORCH_FR_BUFFER_SIZE", "ROCE_PG_TRACE_ENTRIES"):
                    if var not in extra:
                        env.pop(var, None)
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", b, "--calls", str(args.calls)],
                                     env=env, capture_output=True, text=True, check=True).stdout
                results[(b, s)].append(out.strip().splitlines()[-1])
    print("# one-rank 8-byte dist.all_reduce, us per call (best of 7 blocks; one figure per run)")
    print(f"# {'backend':8s} " + " ".join(f"{s:>26s}" for s, _ in settings))
    for b in args.backends.split(","):
        print(f"  {b:8s} " + " ".join(f"{', '.join(results[(b, s)]):>26s}" for s, _ in settings))


if __name__ == "__main__":
    main()
