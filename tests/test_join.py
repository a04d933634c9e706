"""Joining a group whose leader dies mid-formation: rank 0 took rank 1's join,
then was SIGKILLed while it still waited for rank 2 (which never comes).
Rank 1 must fail naming rank 0, about one store wait slice (10 s) after the
kill, not at the group timeout (60 s here). The store lives in the test
process, so it survives rank 0."""
import datetime
import multiprocessing as mp
import os
import signal
import time

import torch.distributed as dist

TIMEOUT_S = 60


def _rank_main(rank, port, queue):
    import roce_pg  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    queue.put((rank, "started"))
    try:
        dist.init_process_group("roce", store=store, rank=rank, world_size=3,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        queue.put((rank, "formed a group without rank 2"))
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        queue.put((rank, f"{type(e).__name__}: {e}"))


def test_a_leader_killed_after_taking_a_join_is_named_long_before_the_timeout():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, store.port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        assert {queue.get(timeout=120) for _ in procs} == {(0, "started"), (1, "started")}
        # Joining takes milliseconds once both run (torch wraps the store in
        # group prefixes, so the leader's waiting list is not read here).
        time.sleep(8)
        assert all(p.is_alive() for p in procs), "a rank ended before the kill"
        os.kill(procs[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        rank, outcome = queue.get(timeout=TIMEOUT_S + 30)
        after_kill = time.monotonic() - killed
        assert rank == 1 and "DistBackendError" in outcome, outcome
        assert "rank 0" in outcome and "stopped listening" in outcome, outcome
        assert after_kill < TIMEOUT_S / 2, f"rank 1 failed {after_kill:.1f} s after the kill: {outcome}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
