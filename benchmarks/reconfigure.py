"""From a rank's death to the survivors' first exact allreduce on their new
membership, through torch's reconfigure API: roce and Gloo side by side in
one run.

    .venv/bin/python benchmarks/reconfigure.py [--ranks 3] [--repeats 3] [--places shm net]
    scripts/softroce/run_vm.sh '.venv/bin/python benchmarks/reconfigure.py --places verbs'

Per backend and place, `ranks` processes start with enable_reconfigure=True,
reconfigure to all of them (uuid 1) and run an allreduce. The last rank
then writes its clock and pid to the store and SIGKILLs itself. The
survivors learn of the death as a launcher's failure detector would, out of
band: they poll the victim's /proc entry until it is gone or a zombie. They
pass their handles (a set) to reconfigure with a fresh uuid and run an
allreduce of 1,000 floats, checked exact. Printed per run: the time from the
victim's last clock reading to the first exact result (the slowest
survivor), and the reconfigure call alone. roce runs on one machine
(shared memory, "shm") and with every rank its own simulated machine over
TCP ("net"), and, in the Soft-RoCE VM, over verbs ("verbs", rxe); Gloo
always uses TCP over loopback.
"""
import argparse
import os
import statistics
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.layouts import LAYOUTS  # noqa: E402
from tests.support.ranks import run_group, store_wait  # noqa: E402

# The environments; --ranks sets the count. "verbs" needs an RDMA device.
PLACES = {"shm": LAYOUTS["shm3"][1], "net": LAYOUTS["net3"][1], "verbs": LAYOUTS["verbs3"][1]}


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # reaped between the open and the read: ESRCH
        return True


def rank_main(rank, world, port, backend):
    import signal
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if backend == "roce":
        import roce_pg  # noqa: F401
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60), enable_reconfigure=True)
    store = dist.distributed_c10d._get_default_store()
    store.set(f"handle/{rank}", dist._get_reconfigure_handle())
    store.wait([f"handle/{r}" for r in range(world)], timedelta(seconds=60))
    handles = [store.get(f"handle/{r}").decode() for r in range(world)]
    dist._reconfigure(uuid=1, handles=handles).wait()
    dist.all_reduce(torch.ones(1000))
    victim = world - 1
    # Gloo's handle names the membership it was read in: read it again.
    store.set(f"handle-now/{rank}", dist._get_reconfigure_handle())
    store_wait(store, "ready", world)
    if rank == victim:
        store.set("victim", f"{os.getpid()} {time.time()!r}")
        os.kill(os.getpid(), signal.SIGKILL)
    store.wait(["victim"], timedelta(seconds=60))
    pid, died_at = store.get("victim").decode().split()
    while not _gone(int(pid)):
        time.sleep(0.001)
    survivors = {store.get(f"handle-now/{r}").decode() for r in range(victim)}
    start = time.monotonic()
    dist._reconfigure(uuid=2, handles=survivors).wait()
    reconfigure_s = time.monotonic() - start
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    result_s = time.time() - float(died_at)
    exact = torch.equal(t, torch.full((1000,), float(sum(range(1, world)))))
    store_wait(store, "end", victim)
    if rank == 0:
        store_wait(store, "left", victim - 1, arrive=False)  # hosts the store: leaves last
    else:
        store.add("left", 1)
    return {"result_s": result_s, "reconfigure_s": reconfigure_s, "exact": exact}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--places", nargs="+", default=["shm", "net"], choices=list(PLACES))
    args = ap.parse_args()
    runs = [("gloo", "tcp", {})] + [("roce", p, PLACES[p]) for p in args.places]
    print(f"# {args.ranks} ranks, the last SIGKILLed; {args.repeats} runs each, interleaved; median of the runs")
    times = {(b, p): [] for b, p, _ in runs}
    for _ in range(args.repeats):
        for backend, place, env in runs:
            res = run_group("benchmarks.reconfigure.rank_main", args.ranks, init=False, env=env,
                            kwargs={"backend": backend}, expect_dead={args.ranks - 1},
                            deadline_s=1200 if "verbs" in args.places else 300)  # the VM imports torch slowly
            survivors = res[:-1]
            if not all(r["exact"] for r in survivors):
                sys.exit(f"{backend} {place}: inexact result after reconfigure: {survivors}")
            times[(backend, place)].append((max(r["result_s"] for r in survivors),
                                            max(r["reconfigure_s"] for r in survivors)))
    gloo = statistics.median(t for t, _ in times[("gloo", "tcp")])
    print(f"{'backend':8} {'place':6} {'death to result (ms)':>21} {'reconfigure (ms)':>17} {'vs gloo':>8}")
    for backend, place, _ in runs:
        result = statistics.median(t for t, _ in times[(backend, place)])
        call = statistics.median(c for _, c in times[(backend, place)])
        print(f"{backend:8} {place:6} {result * 1e3:21.1f} {call * 1e3:17.1f} {gloo / result:7.2f}x")


if __name__ == "__main__":
    main()
