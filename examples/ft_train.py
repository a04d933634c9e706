"""Data-parallel training that survives a SIGKILLed rank without a restart.

    python examples/ft_train.py [--ranks 3] [--steps 30] [--kill-at 10 [STEP ...]] [--recovery spare|shrink]
                                [--spares 1] [--down-netdev DEV --down-at STEP]

This script is its own small launcher (torchrun would end every worker when
one dies): it starts `--ranks` workers on this machine and, with
`--recovery spare`, `--spares` spare processes more, hosts the job's store,
and acts as the job's failure detector. At step `--kill-at` the last worker
SIGKILLs itself (at a second step given, the worker before it, and so on).
The survivors' next allreduce fails; the launcher sees the process gone and
writes the next membership to the store; the survivors then

* `--recovery spare`: reconfigure (torch >= 2.15's fault-tolerance API,
  roce's `enable_reconfigure=True` groups) to themselves plus a spare still
  alive, which has waited with its handle (as long as it takes) and takes
  the dead rank's place; with no spare left, to themselves alone; or
* `--recovery shrink`: shrink_group the dead rank away and go on with one
  rank fewer.

A fault that kills nobody (a link or NIC port going down: `--down-netdev
dummy1 --down-at 8` takes that interface down at step 8 for `--down-for`
seconds, as root, where roce drives several ports) fails the group on every
member while all live: each reports it in the store, the launcher (told of the fault by --down-netdev)
names the same members again, and they reconfigure onto the ports still up (`--recovery spare`; `--spares 0`
starts no spare process).

Either way the new rank 0 broadcasts the model and the step it reached, and
training goes on from there: the loss continues where it was, and since
every step averages over one fixed global batch, split among whoever is a
member, the final model equals what one process would have trained. The
launcher prints each worker's last line as JSON: the loss per step and the
final parameters.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

GLOBAL_BATCH = 48
# With --down-netdev, a member's report of a failure with none dead this long
# after it: the link, which killed nobody. (Without it a report is not acted
# on: a killed process, whose exit may take long while the kernel frees its
# RDMA resources, is waited for.)
FAILURE_GRACE_S = 1.0


def batch(step, features):
    """The global batch of `step`: the same on every rank, from the step alone."""
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, features, generator=g, dtype=torch.float64)
    true_w = torch.linspace(-1, 1, features, dtype=torch.float64)
    y = x @ true_w + 0.01 * torch.randn(GLOBAL_BATCH, generator=g, dtype=torch.float64)
    return x, y


def train_step(w, step, rank, size, lr):
    """One SGD step of least squares on this rank's share of the global
    batch; the gradient is the global batch's mean, summed over ranks."""
    import torch
    import torch.distributed as dist

    x, y = batch(step, w.numel())
    share = slice(rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size)
    err = x[share] @ w - y[share]
    grad_and_loss = torch.cat([2 * x[share].T @ err, (err * err).sum().reshape(1)]) / GLOBAL_BATCH
    dist.all_reduce(grad_and_loss)
    return w - lr * grad_and_loss[:-1], float(grad_and_loss[-1])


def wait_for_membership(store, epoch, forever=False):
    """The stable ranks of membership `epoch`, once the launcher names them
    (within the store's timeout, or, for a spare, however long it takes: a
    spare may wait the whole job for a failure)."""
    key = f"membership/{epoch}"
    while forever and not store.check([key]):
        time.sleep(0.05)
    store.wait([key])
    return [int(r) for r in store.get(key).decode().split(",")]


def recover(store, epoch, how):
    """Makes the default group membership `epoch`: reconfigure to its
    members' handles, or shrink away the ranks it no longer names."""
    import torch.distributed as dist

    members = wait_for_membership(store, epoch)
    if how == "spare":
        handles = [store.get(f"handle/{r}").decode() for r in members]
        dist._reconfigure(uuid=epoch, handles=handles).wait()
        return
    previous = wait_for_membership(store, epoch - 1)
    dist.shrink_group([i for i, r in enumerate(previous) if r not in members])


def flap_link(netdev, seconds):
    """The fault of --down-netdev: the interface goes down, as a cable
    pulled, and comes back `seconds` later (a flapping link), in the background."""
    subprocess.run(["ip", "link", "set", "dev", netdev, "down"], check=True)
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; ip link set dev {netdev} up"])


def worker(args):
    import torch
    import torch.distributed as dist

    import roce_pg  # noqa: F401  (registers "roce")

    stable = int(os.environ["FT_STABLE_RANK"])
    total = int(os.environ["FT_PROCESSES"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=120))
    reconfigurable = args.recovery == "spare"
    # Every process, the spare included, starts in the world the launcher
    # named; with reconfigure the world has no members until the first epoch.
    dist.init_process_group("roce", store=store, rank=stable, world_size=total if reconfigurable else args.ranks,
                            timeout=timedelta(seconds=60), enable_reconfigure=reconfigurable)
    epoch = 1
    if reconfigurable:
        handle = dist._get_reconfigure_handle()
        store.set(f"handle/{stable}", handle)
        if stable not in wait_for_membership(store, 1):
            # The spare: waits until a membership names it.
            while stable not in wait_for_membership(store, epoch + 1, forever=True):
                epoch += 1
            epoch += 1
        recover(store, epoch, "spare")
    # The i-th --kill-at step kills stable rank ranks - 1 - i.
    victims = dict(zip(args.kill_at, range(args.ranks - 1, -1, -1)))
    w = torch.zeros(args.features, dtype=torch.float64)
    step, losses, recovered = 0, {}, []
    synced = epoch > 1  # a spare takes the state from rank 0 first
    while step < args.steps:
        if synced:
            state = torch.cat([w, torch.tensor([float(step)], dtype=torch.float64)])
            dist.broadcast(state, 0)
            w, step, synced = state[:-1].clone(), int(state[-1]), False
            continue
        if victims.get(step) == stable:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.down_at and stable == 0 and epoch == 1:
            flap_link(args.down_netdev, args.down_for)
        try:
            new_w, loss = train_step(w, step, dist.get_rank(), dist.get_world_size(), args.lr)
        except Exception as e:  # noqa: BLE001 - a member died or a link went: recover and redo the step
            store.add(f"failed/{epoch}", 1)  # for the launcher, should every member still live
            epoch += 1
            start = time.monotonic()
            recover(store, epoch, args.recovery)
            recovered.append({"at_step": step, "error": str(e)[:200], "seconds": time.monotonic() - start,
                              "size": dist.get_world_size()})
            synced = True  # ranks may disagree on whether the failed step completed: rank 0's state wins
            continue
        w, losses[step] = new_w, loss
        step += 1
    print(json.dumps({"stable_rank": stable, "rank": dist.get_rank(), "size": dist.get_world_size(),
                      "losses": losses, "recovered": recovered, "w": w.tolist()}), flush=True)
    dist.destroy_process_group()


def launcher(args):
    import torch.distributed as dist

    port = args.port
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=120))
    total = args.ranks + (args.spares if args.recovery == "spare" else 0)
    # Each worker's output goes to a file, read once it exited: a pipe read
    # only then would stall a worker whose report outgrows the pipe's buffer.
    outputs = [tempfile.TemporaryFile(mode="w+") for _ in range(total)]
    procs = []
    for r in range(total):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "FT_STABLE_RANK": str(r),
               "FT_PROCESSES": str(total)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=env,
                                      stdout=outputs[r], text=True))
    members, spares = list(range(args.ranks)), list(range(args.ranks, total))
    store.set("membership/1", ",".join(map(str, members)))
    epoch, deadline = 1, time.monotonic() + args.time_limit
    failure_seen = None  # when a member first reported the current membership failed
    while time.monotonic() < deadline:
        dead = [r for r in members if procs[r].poll() is not None and procs[r].returncode != 0]
        if args.down_netdev and not dead and failure_seen is None and store.check([f"failed/{epoch}"]):
            failure_seen = time.monotonic()
        if not dead and failure_seen is not None and time.monotonic() - failure_seen > FAILURE_GRACE_S:
            # Failed with every member alive (a link, a port): the same
            # members form again, on what still works.
            epoch, failure_seen = epoch + 1, None
            store.set(f"membership/{epoch}", ",".join(map(str, members)))
            print(f"launcher: membership {epoch - 1} failed with every member alive; membership {epoch}: "
                  f"{members}", file=sys.stderr, flush=True)
        if dead:
            # The failure detector's decision: the dead leave; spares still
            # alive, as many as there are, take their places.
            spares = [r for r in spares if procs[r].poll() is None]
            members = [r for r in members if r not in dead] + spares[:len(dead)]
            spares = spares[len(dead):]
            epoch, failure_seen = epoch + 1, None
            store.set(f"membership/{epoch}", ",".join(map(str, members)))
            print(f"launcher: ranks {dead} died ({[procs[r].returncode for r in dead]}); membership {epoch}: "
                  f"{members}", file=sys.stderr, flush=True)
        if all(procs[r].poll() is not None for r in members):
            break
        time.sleep(0.01)
    else:
        for p in procs:
            p.kill()
        sys.exit(f"launcher: the job did not finish within {args.time_limit} s")
    for p in procs:
        if p.poll() is None:  # a spare no membership named
            p.kill()
    failed = [r for r in members if procs[r].returncode != 0]
    for r in members:
        outputs[r].seek(0)
        out = outputs[r].read().strip().splitlines()
        print(out[-1] if out else json.dumps({"stable_rank": r, "error": "no output"}))
    if failed:
        sys.exit(f"launcher: members {failed} failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kill-at", type=int, nargs="+", default=[10],
                    help="step at which the last rank SIGKILLs itself (-1: none); a second step kills the rank "
                         "before it, and so on")
    ap.add_argument("--recovery", choices=["spare", "shrink"], default="spare")
    ap.add_argument("--spares", type=int, default=1, help="spare processes waiting with their handles (spare)")
    ap.add_argument("--down-netdev", help="network interface rank 0 takes down at --down-at (root)")
    ap.add_argument("--down-at", type=int, default=-1, help="step at which rank 0 takes --down-netdev down")
    ap.add_argument("--down-for", type=float, default=5.0, help="seconds until --down-netdev comes back up")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--features", type=int, default=16, help="the model's parameters (the gradient's size)")
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--time-limit", type=float, default=180)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.down_at >= 0 and (not args.down_netdev or args.recovery != "spare"):
        ap.error("--down-at needs --down-netdev and --recovery spare (shrinking cannot keep every member)")
    worker(args) if args.worker else launcher(args)


if __name__ == "__main__":
    main()
