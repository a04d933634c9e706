"""Rank functions for tests/test_windows.py: torch's one-sided windows
(dist._new_window) on roce. Every check runs inside one group, each against
values computed independently on the host (integers and float64: exact)."""
import datetime

import torch
import torch.distributed as dist


def _block(rank, peer, n, dtype=torch.float64):
    """What `rank` writes into `peer`'s window: distinct per pair and element."""
    return (torch.arange(n, dtype=torch.float64) + 1000 * rank + 100000 * peer).to(dtype)


def _same_machine(rank, peer, world):
    import os

    if os.environ.get("ROCE_PG_FORCE_NETWORK") == "1":
        return peer == rank
    per = int(os.environ.get("ROCE_PG_SIM_RANKS_PER_NODE", world))
    return rank // per == peer // per


def _expect_raises(fn, *words):
    try:
        fn()
    except Exception as e:  # torch raises RuntimeError (DistBackendError for timeouts)
        msg = str(e)
        assert all(w in msg for w in words), f"error {msg!r} does not name {words}"
        return msg
    raise AssertionError(f"expected an error naming {words}")


def _puts_then_signals(win, t, rank, world, n):
    """Every rank puts its block into every window (itself included) at
    offset rank * n, then signals everyone and waits for everyone's signal."""
    works = [win.put(_block(rank, p, n), p, rank * n, True) for p in range(world)]
    for w in works:
        w.wait()
    for p in range(world):
        win.signal(p, False)
    for p in range(world):
        win.wait_signal(p, False)
    want = torch.cat([_block(q, rank, n) for q in range(world)])
    assert torch.equal(t, want), f"rank {rank}: window holds {t.tolist()[:8]}..., expected {want.tolist()[:8]}..."


def _ordered_after_puts(win, t, rank, world, n, rounds=12):
    """A ring of producers: each round rank r overwrites its successor's
    slot with several puts, then signals; the successor must see every put
    of that round once its wait returns (the memory model a signal gives)."""
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for i in range(rounds):
        value = torch.full((n,), float(i * 10 + rank), dtype=torch.float64)
        half = n // 2
        win.put(value[:half], nxt, 0, True)
        win.put(value[half:], nxt, half, True)
        win.signal(nxt, True)
        win.wait_signal(prev, False)
        want = float(i * 10 + prev)
        assert torch.equal(t[:n], torch.full((n,), want, dtype=torch.float64)), \
            f"rank {rank} round {i}: slot holds {t[:n].unique().tolist()}, expected {want}"
        dist.barrier()  # nobody overwrites a slot before its owner checked it


def _alltoallv_by_puts(rank, world):
    """MoE-style dispatch: counts known only to senders, written with puts
    (the receiver learns its counts from a first put), against all_to_all_single."""
    counts = [(rank + 2 * p) % 5 + 1 for p in range(world)]  # what rank sends to p
    cap = 5 * world
    inbox = torch.zeros(world + cap, dtype=torch.int64)
    win = dist._new_window(inbox)
    # Offsets into a receiver's inbox are the senders before it, known by an
    # exchange of counts the receiver needs anyway.
    all_counts = torch.zeros(world * world, dtype=torch.int64)
    dist.all_gather_into_tensor(all_counts, torch.tensor(counts, dtype=torch.int64))
    all_counts = all_counts.view(world, world)  # [sender][receiver]
    for p in range(world):
        off = int(all_counts[:rank, p].sum())
        payload = torch.arange(counts[p], dtype=torch.int64) + 1000 * rank + 100 * p
        win.put(torch.tensor([counts[p]], dtype=torch.int64), p, rank, True)
        win.put(payload, p, world + off, True)
        win.signal(p, True)
    for p in range(world):
        win.wait_signal(p, False)
    got = inbox[world:world + int(all_counts[:, rank].sum())].clone()
    assert inbox[:world].tolist() == all_counts[:, rank].tolist()
    send = torch.cat([torch.arange(c, dtype=torch.int64) + 1000 * rank + 100 * p for p, c in enumerate(counts)])
    recv = torch.zeros(int(all_counts[:, rank].sum()), dtype=torch.int64)
    dist.all_to_all_single(recv, send, output_split_sizes=all_counts[:, rank].tolist(), input_split_sizes=counts)
    assert torch.equal(got, recv), f"rank {rank}: puts gave {got.tolist()}, all_to_all_single {recv.tolist()}"
    win.tensor_deregister()


def _one_sided_where_exposed(rank, world):
    """Over verbs a put to a rank on another machine is an RDMA WRITE into
    its window: the sender counts the bytes as written, and no service of the
    owner receives the put. Three pieces per peer: 8 bytes (inline in the work
    request), 16 KB (copied through a staging slot) and ~2.3 MB (from the
    source itself, several pieces). Over TCP the owner's service receives
    every one. Either way the bytes are exact once the signal is waited for;
    over verbs the signal itself is an RDMA WRITE of the sender's count into
    the owner's board, which its wait notices by polling. Then gets of the
    same pieces: RDMA READs over verbs."""
    import os

    import roce_pg

    verbs = os.environ.get("ROCE_PG_NET_TRANSPORT") == "verbs"
    served = [p for p in range(world) if not _same_machine(rank, p, world)]
    m = 300_001
    cuts = [0, 1, 2_001, m]
    big = torch.zeros(world * m, dtype=torch.float64)
    # Before the window exists: a peer may put as soon as its own
    # registration returned, and this rank's service count it at once.
    before = roce_pg.counters()
    win = dist._new_window(big)
    works = []
    for p in range(world):
        block = _block(rank, p, m)
        for a, b in zip(cuts, cuts[1:]):
            works.append(win.put(block[a:b].clone(), p, rank * m + a, True))
        works.append(win.signal(p, True))
    for p in range(world):
        win.wait_signal(p, False)
    for w in works:  # this rank's own puts may still be going out after its peers' signals came in
        w.wait()
    dist.barrier()  # and its peers' services have counted theirs
    after = roce_pg.counters()
    want = torch.cat([_block(q, rank, m) for q in range(world)])
    assert torch.equal(big, want), f"rank {rank}: one-sided puts left {(big != want).sum().item()} wrong elements"
    written = after["bytes_written"] - before["bytes_written"]
    served_puts = after["window_puts_served"] - before["window_puts_served"]
    served_signals = after["window_signals_served"] - before["window_signals_served"]
    if verbs and served:
        # The puts' bytes and one 4-byte count per signal.
        want_written = (8 * m + 4) * len(served)
        assert written == want_written, f"rank {rank}: {written} bytes written one-sided, expected {want_written}"
        assert served_puts == 0, f"rank {rank}: its service received {served_puts} puts that should have been RDMA writes"
        assert served_signals == 0, f"rank {rank}: its service counted {served_signals} signals that were to be written"
        assert after["bytes_zero_copy"] - before["bytes_zero_copy"] >= 8 * (m - 2_001) * len(served)
    else:
        assert written == 0, f"rank {rank}: {written} bytes written one-sided without an RDMA transport"
        assert served_puts == (len(cuts) - 1) * len(served), f"rank {rank}: its service received {served_puts} puts"
        assert served_signals == len(served), f"rank {rank}: its service counted {served_signals} signals"
    # Gets of what this rank put, the same three sizes: RDMA READs over verbs
    # (staged, staged, into the tensor itself), served messages otherwise.
    before = roce_pg.counters()
    for p in range(world):
        block = _block(rank, p, m)
        for a, b in zip(cuts, cuts[1:]):
            out = torch.full((b - a,), -1.0, dtype=torch.float64)
            roce_pg.window_get(win, out, p, rank * m + a)
            assert torch.equal(out, block[a:b]), f"rank {rank} got elements {a}:{b} of rank {p}'s window wrong"
    read = roce_pg.counters()["bytes_read"] - before["bytes_read"]
    assert read == (8 * m * len(served) if verbs else 0), f"rank {rank}: {read} bytes read one-sided"
    win.tensor_deregister()


def window_matrix(rank, world, port):
    assert dist.get_backend() == "roce"
    assert dist._supports_window() if hasattr(dist, "_supports_window") else True
    n = 37  # odd: puts that end mid-page
    t = torch.zeros(world * n, dtype=torch.float64)
    view = t[n:]  # a view made before registration keeps seeing the window
    win = dist._new_window(t)
    # A served window keeps a task on the progress thread; it still parks
    # beside it, so small synchronous collectives run on the caller's thread.
    import roce_pg

    assert roce_pg._wait_engine_parked(timeout=10), "the engine does not park beside a window's service"
    inline0 = roce_pg.counters()["inline_ops"]
    x = torch.ones(2, dtype=torch.float64)
    dist.all_reduce(x)
    assert x.tolist() == [world, world]
    assert roce_pg.counters()["inline_ops"] == inline0 + 1, "the allreduce beside the service did not run inline"
    _puts_then_signals(win, t, rank, world, n)
    assert torch.equal(view, torch.cat([_block(q, rank, n) for q in range(1, world)]))

    # The window is the tensor: what the owner writes, a mapped peer reads.
    t.fill_(rank + 0.5)
    dist.barrier()
    for p in range(world):
        if _same_machine(rank, p, world):
            remote = win.map_remote_tensor(p)
            assert remote.shape == t.shape and remote.dtype == t.dtype
            assert torch.equal(remote, torch.full_like(t, p + 0.5)), f"rank {rank} maps rank {p}: {remote[:4].tolist()}"
        else:
            _expect_raises(lambda: win.map_remote_tensor(p), "another machine")
        assert str(win.get_attr(p).access_type).endswith("UNIFIED")
    dist.barrier()

    # Gets: a peer's whole window, a slice, after a put of this rank's
    # (ordered behind it), empty; bounds and dtype checked on the caller.
    import roce_pg

    for p in range(world):
        whole = torch.empty_like(t)
        roce_pg.window_get(win, whole, p)
        assert torch.equal(whole, torch.full_like(t, p + 0.5)), f"rank {rank} got {whole[:4].tolist()} from rank {p}"
    dist.barrier()
    nxt = (rank + 1) % world
    win.put(torch.full((3,), -float(rank), dtype=torch.float64), nxt, rank * n + 5, True)
    part = torch.empty(5, dtype=torch.float64)
    roce_pg.window_get(win, part, nxt, rank * n + 4, async_op=True).wait()
    assert part.tolist() == [nxt + 0.5, -rank, -rank, -rank, nxt + 0.5], part.tolist()
    roce_pg.window_get(win, torch.empty(0, dtype=torch.float64), nxt, world * n)
    _expect_raises(lambda: roce_pg.window_get(win, torch.empty(2, dtype=torch.float64), nxt, world * n - 1), "reach past")
    _expect_raises(lambda: roce_pg.window_get(win, torch.empty(2, dtype=torch.int64), nxt), "Long")
    dist.barrier()

    # A source that is not contiguous, and an empty put.
    src = torch.arange(2 * n, dtype=torch.float64).view(n, 2)[:, 1]
    win.put(src, nxt, 0, False)
    win.put(torch.zeros(0, dtype=torch.float64), nxt, world * n, False)
    win.signal(nxt, False)
    win.wait_signal((rank - 1) % world, False)
    assert torch.equal(t[:n], torch.arange(2 * n, dtype=torch.float64)[1::2])
    dist.barrier()

    # Bad calls fail on the caller and leave the group usable.
    _expect_raises(lambda: win.put(torch.ones(n + 1, dtype=torch.float64), nxt, (world - 1) * n, False),
                   "reach past", f"rank {nxt}")
    _expect_raises(lambda: win.put(torch.ones(1, dtype=torch.float64), world, 0, False), "not a rank")
    _expect_raises(lambda: win.put(torch.ones(1, dtype=torch.float64), nxt, -1, False), "negative offset")
    _expect_raises(lambda: win.signal(-1, False), "not a rank")
    _expect_raises(lambda: win.tensor_register(t), "already registered")
    _expect_raises(lambda: win.put(torch.ones(1, dtype=torch.float32), nxt, 0, False), "Float", "Double")
    _expect_raises(lambda: win.put(torch.ones(1, dtype=torch.float64), nxt, 2**62, False), "reach past")
    _expect_raises(lambda: t.resize_(world * n + 4096), "not resizable")
    # torch grew t's sizes before the storage refused: back to what the storage holds.
    t.resize_(world * n)
    # A wait for a signal nobody sends yet times out, naming the peer; the
    # signal sent later still completes it.
    late = win.wait_signal(nxt, True)
    _expect_raises(lambda: late.wait(datetime.timedelta(milliseconds=200)), "timed out", f"from rank {nxt}")
    try:  # as every roce Work raises
        late.wait(datetime.timedelta(milliseconds=1))
        raise AssertionError("a wait for a signal nobody sent did not time out")
    except dist.DistBackendError:
        pass
    assert not late.is_completed()
    x = torch.full((3,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), world * (world + 1) / 2, dtype=torch.float64))

    _ordered_after_puts(win, t, rank, world, n)
    win.signal((rank - 1) % world, False)
    late.wait()
    assert late.is_completed()
    win.tensor_deregister()
    _expect_raises(lambda: win.put(x, nxt, 0, False), "before tensor_register")

    # The same tensor again (its memory is a deregistered window's), then
    # the same window with an integer tensor.
    win.tensor_register(t)
    win.put(torch.full((n,), float(rank), dtype=torch.float64), nxt, 0, True)
    win.signal(nxt, True)
    win.wait_signal((rank - 1) % world, False)
    assert torch.equal(t[:n], torch.full((n,), float((rank - 1) % world), dtype=torch.float64))
    # A wait nobody will signal ends with the deregistration, not at its timeout.
    pending = win.wait_signal(nxt, True)
    win.tensor_deregister()
    _expect_raises(lambda: pending.wait(datetime.timedelta(seconds=30)), "deregistered", f"rank {nxt}")
    # A conjugated view puts the values it shows; a get into one is refused.
    z = torch.zeros(world, dtype=torch.complex64)
    win.tensor_register(z)
    win.put(torch.tensor([complex(rank, 1)], dtype=torch.complex64).conj(), nxt, rank, True)
    win.signal(nxt, True)
    prev = (rank - 1) % world
    win.wait_signal(prev, False)
    assert z[prev].item() == complex(prev, -1), z.tolist()
    _expect_raises(lambda: roce_pg.window_get(win, torch.empty(1, dtype=torch.complex64).conj(), nxt), "conjugated")
    win.tensor_deregister()
    # The same window again, with an integer tensor.
    ints = torch.zeros(world * 5, dtype=torch.int32)
    win.tensor_register(ints)
    for p in range(world):
        win.put(torch.arange(5, dtype=torch.int32) + 10 * rank, p, 5 * rank, True)
        win.signal(p, True)
    for p in range(world):
        win.wait_signal(p, False)
    assert ints.tolist() == [10 * q + i for q in range(world) for i in range(5)]
    win.tensor_deregister()

    _one_sided_where_exposed(rank, world)
    _two_windows_at_once(rank, world)
    _refused_registrations(rank, world)
    _alltoallv_by_puts(rank, world)
    _puts_racing_a_deregistration(rank, world)
    return {"rank": rank}


def _puts_racing_a_deregistration(rank, world, n=64):
    """Another thread puts (async) while the main thread deregisters: each
    put is issued before the deregistration or refused after it, naming why;
    nothing crashes, and the group goes on."""
    import threading
    import time

    t = torch.zeros(world * n, dtype=torch.float64)
    win = dist._new_window(t)
    nxt = (rank + 1) % world
    issued, errors = [], []

    def putter():  # until a put is refused: every put after the deregistration must be
        while True:
            try:
                issued.append(win.put(torch.ones(n, dtype=torch.float64), nxt, rank * n, True))
            except Exception as e:  # noqa: BLE001 - the message is checked
                errors.append(str(e))
                return

    th = threading.Thread(target=putter)
    th.start()
    deadline = time.monotonic() + 60
    while len(issued) < 16 and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    win.tensor_deregister()
    th.join(60)
    assert not th.is_alive(), (len(issued), "puts issued; none refused 60 s after the deregistration (or one hung)")
    assert len(issued) >= 16 and errors, (len(issued), errors[:1], "the deregistration did not race the puts")
    for w in issued:  # issued before the close, so served before it
        w.wait()
    assert all("before tensor_register" in e for e in errors), errors[:3]
    x = torch.ones(2)
    dist.all_reduce(x)
    assert x.tolist() == [float(world)] * 2


def _two_windows_at_once(rank, world):
    """Two live windows of one group keep their traffic apart."""
    a, b = torch.zeros(world, dtype=torch.int64), torch.zeros(world, dtype=torch.int64)
    wa, wb = dist._new_window(a), dist._new_window(b)
    _expect_raises(lambda: dist._new_window(a), "registered in another window")
    for p in range(world):
        wa.put(torch.tensor([rank + 1], dtype=torch.int64), p, rank, True)
        wb.put(torch.tensor([-(rank + 1)], dtype=torch.int64), p, rank, True)
        wb.signal(p, True)
        wa.signal(p, True)
    for p in range(world):
        wa.wait_signal(p, False)
        wb.wait_signal(p, False)
    assert a.tolist() == [q + 1 for q in range(world)] and b.tolist() == [-(q + 1) for q in range(world)]
    wb.tensor_deregister()
    wa.tensor_deregister()


def _refused_registrations(rank, world):
    """A tensor that cannot become window memory on one rank fails the
    registration on every rank (none waits for the timeout), and the group
    goes on."""
    import numpy as np

    win = dist._new_window()
    bad = torch.from_numpy(np.zeros(4)) if rank == world - 1 else torch.zeros(4, dtype=torch.float64)
    msg = _expect_raises(lambda: win.tensor_register(bad), "window on rank")
    if rank == world - 1:
        assert "not torch's own CPU allocation" in msg, msg
    else:
        assert f"rank {world - 1} could not register" in msg, msg
    _expect_raises(lambda: win.tensor_register(torch.zeros(4)[::2]), "contiguous")
    # A window's old tensor keeps a storage that cannot grow; a resize_ that
    # failed left its sizes past its storage (torch grows them first), and
    # registering it then would publish bytes the segment does not have.
    old = torch.zeros(4, dtype=torch.float64)
    win.tensor_register(old)
    win.tensor_deregister()
    _expect_raises(lambda: old.resize_(4096), "not resizable")
    _expect_raises(lambda: win.tensor_register(old), "past its storage")
    x = torch.ones(2, dtype=torch.float64)
    dist.all_reduce(x)
    assert x.tolist() == [world, world]


def window_peer_death(rank, world, port):
    """The last rank dies with a window registered; the others' wait for its
    signal fails soon, naming why, instead of waiting out the timeout; so
    do their later calls on the window. A survivor that heard of the death
    before its own registration finished is refused at wait_signal already
    (the window never served); one that heard later fails in the wait."""
    import os
    import signal
    import time

    t = torch.zeros(4, dtype=torch.float64)
    win = dist._new_window(t)
    victim = world - 1
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    msg = _expect_raises(lambda: win.wait_signal(victim, True).wait(datetime.timedelta(seconds=120)), f"rank {victim}")
    assert "cannot complete" in msg or "stopped serving" in msg, msg
    elapsed = time.monotonic() - t0
    assert elapsed < 60, f"the wait took {elapsed:.1f} s to learn of the death"
    _expect_raises(lambda: win.put(t, 0, 0, False), "stopped serving")
    return {"rank": rank, "elapsed": elapsed}
