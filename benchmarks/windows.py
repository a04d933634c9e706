"""One-sided windows against two-sided messages, side by side in one run.

    .venv/bin/python benchmarks/windows.py [--places shm net verbs] [--iters 200] [--a2a-ranks 3] [--sizes 8 65536]

Ping-pong between 2 ranks, per size: a put of the message into the peer's
window followed by a signal, answered the same way (the peer waits for the
signal, then puts back), against send/recv of the same tensor. Printed: the
one-way time (half the round trip, median of 5 batches) and the put's speedup.
Then an all-to-all-v of `--a2a-ranks` ranks with counts known only to the
senders: puts of the counts and the payloads plus one signal per peer,
against torch's all_gather of the counts plus all_to_all_single. "shm": every
rank on one machine (shared memory: puts are copies into the mapped peer);
"net": every rank its own simulated machine over TCP (puts are served by the
owner's progress thread); "verbs": the same over RDMA verbs, where a put is
an RDMA WRITE into the peer's window (needs an RDMA device: the Soft-RoCE VM,
scripts/softroce/run_vm.sh). Also printed: the bytes the transports copied
per payload byte each rank sent (memory traffic beside the NIC's; on
Soft-RoCE, slower than memcpy, this says more than the times). Values are
checked exact.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.layouts import LAYOUTS  # noqa: E402
from tests.support.ranks import run_group  # noqa: E402

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20]
PLACES = {"shm": LAYOUTS["shm2"][1], "net": LAYOUTS["net2"][1], "verbs": LAYOUTS["verbs2"][1]}


def _median_of_batches(fn, iters, batches=5):
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _copied_per_byte(fn, iters, payload):
    """Median one-way time of fn's rounds, and the bytes the transports
    copied per payload byte this rank sent (one message per round)."""
    import roce_pg

    before = roce_pg.counters()["bytes_copied"]
    t = _median_of_batches(fn, iters) / 2
    copied = roce_pg.counters()["bytes_copied"] - before
    return t, copied / max(1, payload * iters * 5)


def pingpong(rank, world, port, iters, sizes=None):
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    out = {}
    for size in sizes or SIZES:
        n = size // 4
        window = torch.zeros(n, dtype=torch.float32)
        msg = torch.full((n,), float(rank + 1), dtype=torch.float32)
        win = dist._new_window(window)
        reps = max(5, min(iters, (256 << 20) // max(size, 1) // 10))

        def put_round():
            if rank == 0:
                win.put(msg, peer, 0, True)
                win.signal(peer, True)
                win.wait_signal(peer, False)
            else:
                win.wait_signal(peer, False)
                win.put(msg, peer, 0, True)
                win.signal(peer, True)

        def send_round():
            if rank == 0:
                dist.send(msg, peer)
                dist.recv(window, peer)
            else:
                dist.recv(window, peer)
                dist.send(msg, peer)

        put_round()  # warm
        dist.barrier()
        t_put, c_put = _copied_per_byte(put_round, reps, size)
        assert torch.equal(window, torch.full((n,), float(peer + 1))), "put did not land"
        win.tensor_deregister()
        send_round()
        dist.barrier()
        t_send, c_send = _copied_per_byte(send_round, reps, size)
        out[size] = (t_put, t_send, c_put, c_send)
    return out


def alltoallv(rank, world, port, iters):
    import torch
    import torch.distributed as dist

    counts = [((rank + 3 * p) % 7 + 1) * 1024 for p in range(world)]  # elements rank sends to p
    cap = 8 * 1024 * world
    inbox = torch.zeros(world + cap, dtype=torch.int64)
    win = dist._new_window(inbox)
    sends = [torch.arange(c, dtype=torch.int64) + 1000 * rank + 100 * p for p, c in enumerate(counts)]
    all_counts = torch.zeros(world * world, dtype=torch.int64)
    dist.all_gather_into_tensor(all_counts, torch.tensor(counts, dtype=torch.int64))
    offsets = all_counts.view(world, world)  # [sender][receiver]

    def by_puts():
        # The receiver's slot for this sender comes from the counts every
        # rank already holds (a dispatch plan); the counts also travel.
        for p in range(world):
            win.put(torch.tensor([counts[p]], dtype=torch.int64), p, rank, True)
            win.put(sends[p], p, world + int(offsets[:rank, p].sum()), True)
            win.signal(p, True)
        for p in range(world):
            win.wait_signal(p, False)
        dist.barrier()  # nobody overwrites an inbox before its owner read it

    def by_collectives():
        got = torch.zeros(world, dtype=torch.int64)
        dist.all_to_all_single(got, torch.tensor(counts, dtype=torch.int64))
        recv = torch.zeros(int(got.sum()), dtype=torch.int64)
        dist.all_to_all_single(recv, torch.cat(sends), output_split_sizes=got.tolist(), input_split_sizes=counts)
        return recv

    by_puts()
    want = by_collectives()
    got = inbox[world:world + want.numel()]
    assert torch.equal(got, want), "puts and all_to_all_single disagree"
    t_put = _median_of_batches(by_puts, iters)
    t_coll = _median_of_batches(by_collectives, iters)
    win.tensor_deregister()
    return (t_put, t_coll)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--places", nargs="+", default=["shm", "net"], choices=list(PLACES))
    ap.add_argument("--sizes", nargs="+", type=int, default=SIZES, help="message bytes (multiples of 4)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--a2a-ranks", type=int, default=3)
    args = ap.parse_args()
    print("one-way time, put+signal vs send/recv (2 ranks; median of 5 batches)")
    print(f"{'place':6} {'bytes':>10} {'put us':>10} {'send us':>10} {'send/put':>9} {'copied/B put':>13} {'send':>6}")
    for place in args.places:
        res = run_group("benchmarks.windows.pingpong", 2, env=PLACES[place],
                        kwargs={"iters": args.iters, "sizes": args.sizes})
        for size, (tp, ts, cp, cs) in res[0].items():
            print(f"{place:6} {size:>10} {tp * 1e6:>10.1f} {ts * 1e6:>10.1f} {ts / tp:>8.2f}x {cp:>13.2f} {cs:>6.2f}")
    print(f"\nall-to-all-v of {args.a2a_ranks} ranks (1-7 Ki int64 per pair): puts+signals vs all_to_all_single x2")
    print(f"{'place':6} {'puts us':>10} {'a2a us':>10} {'a2a/puts':>9}")
    for place in args.places:
        env = dict(PLACES[place])
        res = run_group("benchmarks.windows.alltoallv", args.a2a_ranks, env=env, kwargs={"iters": max(args.iters // 4, 10)})
        tp = max(r[0] for r in res)
        tc = max(r[1] for r in res)
        print(f"{place:6} {tp * 1e6:>10.1f} {tc * 1e6:>10.1f} {tc / tp:>8.2f}x")


if __name__ == "__main__":
    main()
