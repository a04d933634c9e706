"""Many groups in one process: the per-process runtime every group
shares (one TCP listener, one thread watching every group's lifelines),
subgroups formed from the world group's roster with no join, and failure
contained to the group it happened in.

Four ranks, each its own simulated machine over TCP unless a test says
otherwise, so every peer is a network peer as on a cluster."""
import re

from .support.layouts import TCP
from .support.ranks import run_group

FOUR_MACHINES = {**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "1", "ROCE_PG_SUBGROUPS": "parent"}
ONE_MACHINE = {"ROCE_PG_SUBGROUPS": "parent"}  # every peer over shared memory


def test_subgroups_form_without_a_join():
    results = run_group("tests.group_workers.subgroups", 4, env=FOUR_MACHINES)
    for rank, r in enumerate(results):
        # The world group joins through the store; every subgroup forms from
        # its roster: no store operation (over the network only, nothing to
        # exchange for shared memory).
        assert r["world_ops"] >= 2, r
        assert r["ops"] and all(v == 0 for v in r["ops"].values()), (rank, r["ops"])
        assert any(k.startswith("mesh") for k in r["ops"]), r["ops"]
        assert r["stats"]["parked"] == 0, r["stats"]


def test_subgroups_join_when_asked_to():
    results = run_group("tests.group_workers.subgroups", 4, env={**FOUR_MACHINES, "ROCE_PG_SUBGROUPS": "join"})
    for r in results:
        assert all(v >= 2 for v in r["ops"].values()), r["ops"]


def test_subgroups_from_the_parent_by_default():
    default = {k: v for k, v in FOUR_MACHINES.items() if k != "ROCE_PG_SUBGROUPS"}
    results = run_group("tests.group_workers.subgroups", 4, env=default)
    for r in results:
        assert r["ops"] and all(v == 0 for v in r["ops"].values()), r["ops"]


def test_mismatched_settings_fail_every_member_either_way():
    """A subgroup of four ranks (four machines: ring 0-1-2-3) whose last rank
    sets another ROCE_PG_ALGO_ALLREDUCE, then another ROCE_PG_NCHANNELS: every
    member's first operation fails naming both values, whether a leader
    compares (join) or the lifeline neighbours do (parent; rank 1 is no
    neighbour of rank 3 and learns it forwarded)."""
    for mode in ("parent", "join"):
        results = run_group("tests.group_workers.settings_mismatch", 4,
                            env={**FOUR_MACHINES, "ROCE_PG_SUBGROUPS": mode})
        for rank, r in enumerate(results):
            assert r["checks"] == 2 and not r["failures"], (mode, rank, r)


def test_a_subgroup_forms_when_a_settings_record_is_lost():
    results = run_group("tests.group_workers.settings_lost_on_the_way", 3, env=FOUR_MACHINES,
                        rank_env={1: {"ROCE_PG_TEST_FAULT": "lost_settings"}}, deadline_s=120)
    for r in results:
        assert r["exact"] and r["seconds"] < 20, r


def test_subgroups_on_one_machine_share_memory():
    # Two machines of two ranks: a subgroup within a machine exchanges its
    # shared-memory segment names through the store (its only store use);
    # across machines nothing.
    results = run_group("tests.group_workers.subgroups", 4,
                        env={**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "2", "ROCE_PG_SUBGROUPS": "parent"})
    for r in results:
        ops = r["ops"]
        if "[3, 0]" in ops:
            assert ops["[3, 0]"] == 0, ops                # machines 1 and 0: network only
        if "[0, 1]" in ops:
            assert 0 < ops["[0, 1]"] <= 8, ops            # one machine: segment names only


def test_extra_groups_share_the_process_runtime():
    results = run_group("tests.group_workers.costs", 4, env=FOUR_MACHINES)
    for rank, r in enumerate(results):
        one, nine = r[1], r[9]
        # One listening port and one runtime thread per process, whatever the
        # groups (rank 0 also listens for torch's store).
        assert one["listen"] == nine["listen"] == (2 if rank == 0 else 1), (rank, one, nine)
        assert one["runtime_threads"] == nine["runtime_threads"] == 1, (one, nine)
        # Per extra group: its progress thread only (the lifelines are the
        # runtime thread's); one descriptor, its wake-up (the caller's and
        # the engine's waits share it). Its data goes over the TCP
        # connections between the processes, and its lifelines over the
        # links between them, which every group shares; the mailbox's
        # descriptor is closed once the group formed.
        per_thread = (nine["threads"] - one["threads"]) / 8
        per_fd = (nine["fds"] - one["fds"]) / 8
        assert per_thread <= 1.0, (one, nine)
        assert per_fd <= 1.0, (one, nine, r["stats"])
        # One data connection per peer process the allreduces talked to
        # (two if both dialed at once), whatever the groups.
        assert 1 <= r["stats"]["tcp_sockets"] <= 6, r["stats"]
        # The process links' mailbox, the world group's and nine more.
        assert r["stats"]["mailboxes"] == 1 + 1 + 9, r["stats"]
        # One link per neighbour process (two if both dialed at once), for
        # all ten groups: every group has the same ring here.
        assert 2 <= r["stats"]["process_links"] <= 4, r["stats"]


def test_extra_local_groups_share_the_process_doorbell():
    """Four ranks on one machine: each group has its own shared-memory rings
    and slots, but not its own doorbell socket: the process's one doorbell
    wakes every group (a key per group)."""
    results = run_group("tests.group_workers.costs", 4, env=ONE_MACHINE)
    for rank, r in enumerate(results):
        one, nine = r[1], r[9]
        per_fd = (nine["fds"] - one["fds"]) / 8
        assert per_fd <= 1.0, (rank, one, nine)  # the group's wake-up eventfd only
        assert (nine["threads"] - one["threads"]) / 8 <= 1.0, (rank, one, nine)
        assert r["stats"]["shm_doorbell_groups"] == 1 + 9, r["stats"]
        assert r["stats"]["tcp_sockets"] == 0, r["stats"]
        # /dev/shm on the machine per extra group, each rank's part: 6
        # reserved pages (control, the slots' first pages, one per local
        # peer) and its slots up to the 8000 bytes its allreduce wrote (32
        # KiB). The 2 MiB rings stay unallocated until a peer writes into
        # them, which an allreduce or a barrier through shared memory never
        # does, and the slots' other pages until a larger collective (40 MiB
        # per group with everything reserved, 8 MiB with the slots reserved;
        # the barrier's messages allocated 2 rings per rank).
        per_group_kib = (nine["devshm_kib"] - one["devshm_kib"]) / 8
        assert per_group_kib <= 4 * 64, (rank, one, nine)


def test_create_and_destroy_64_local_groups_leaves_nothing_behind():
    results = run_group("tests.group_workers.cycles", 4, env=ONE_MACHINE)
    for samples in results:
        first, last = samples[0], samples[-1]
        assert last["fds"] <= first["fds"] + 3 and last["threads"] <= first["threads"] + 1, samples
        # Only the world group stays enrolled in the process's doorbell.
        assert all(s["shm_doorbell_groups"] == 1 for s in samples), samples
        assert last["rss_kib"] - first["rss_kib"] < 8 * 1024, samples


def test_create_and_destroy_64_groups_leaves_nothing_behind():
    results = run_group("tests.group_workers.cycles", 4, env=FOUR_MACHINES)
    for rank, samples in enumerate(results):
        first, mid, last = samples
        # 60 cycles between the samples: a leak of one descriptor or thread
        # per group would show 60. The slack is for what is in flight when a
        # sample is taken (a peer's probe or dial the front desk is reading,
        # a thread torch starts lazily).
        assert last["fds"] <= first["fds"] + 3 and last["threads"] <= first["threads"] + 1, samples
        assert last["mailboxes"] == first["mailboxes"] == 2, samples  # the world group's and the process links'
        assert last["process_links"] == first["process_links"] <= 4, samples
        # The first group's data connections serve every later one.
        assert last["tcp_sockets"] == first["tcp_sockets"] <= 6, samples
        assert last["listen"] == (2 if rank == 0 else 1) and last["runtime_threads"] == 1, samples
        # RSS: allocator noise only (a leaked group holds ~0.3 MiB: 60 would be 18 MiB).
        assert last["rss_kib"] - first["rss_kib"] < 8 * 1024, samples


def test_groups_share_one_tcp_connection_per_peer_process():
    results = run_group("tests.group_workers.shared_connection", 4, env=FOUR_MACHINES)
    for rank, r in enumerate(results):
        # The world group's all-pairs exchange made the connections (one per
        # pair, the dial race settled by the ConnectionManager); three more
        # groups moving 3 MiB per peer from three threads added none.
        assert r["sockets_after_mesh"] == 3, (rank, r)
        assert r["sockets_after_groups"] == r["sockets_at_end"] == 3, (rank, r)
        assert r["group_connections"] == [0, 0, 0], (rank, r)
    assert results[2]["parked"] >= 1, results[2]
    # Sending to, or only receiving from, a rank whose group is gone fails
    # at once (GONE), not at the group's timeout.
    assert "no such process group" in results[0]["gone"], results[0]
    assert "no such process group" in results[0]["gone_recv_only"], results[0]
    assert results[0]["gone_recv_only_s"] < 10, results[0]


def test_groups_making_first_contact_at_once_share_one_dial():
    results = run_group("tests.group_workers.first_contact_race", 4, env=FOUR_MACHINES)
    for rank, r in enumerate(results):
        # Six groups, six threads, three peer processes: one socket per pair,
        # two where the processes' dials crossed from different groups (six
        # groups dialing on their own made 7-13).
        assert r["sockets_before"] == 0, (rank, r)
        assert 3 <= r["sockets_after"] <= 6, (rank, r)


def test_two_groups_progress_from_two_threads():
    run_group("tests.group_workers.two_threads", 4, env=FOUR_MACHINES)
    run_group("tests.group_workers.two_threads", 4, env={**TCP, "ROCE_PG_SIM_RANKS_PER_NODE": "2"})  # joined subgroups


def test_a_destroyed_subgroup_leaves_the_others_working():
    results = run_group("tests.group_workers.contained", 4, env=FOUR_MACHINES)
    assert "rank 1" in results[0]["msg"], results[0]["msg"]
    for rank in (0, 1, 3):
        assert "rank 2" in results[rank]["abort_msg"], results[rank]["abort_msg"]


def test_a_member_whose_creation_failed_is_named_at_once():
    results = run_group("tests.group_workers.failed_member", 4, env=FOUR_MACHINES)
    for case, members in (("everyone", (0, 1, 3)), ("pair", (0,))):
        assert "fail_forming" in results[2][case]["err"], (case, results[2])
        for rank in members:
            # Its neighbours hear GONE from its process (and forward it).
            r = results[rank][case]
            assert "left this group" in r["err"], (case, rank, r)
            assert r["elapsed"] < 60, (case, rank, r)


def test_a_rank_of_another_roce_pg_version_fails_formation_on_every_member():
    results = run_group("tests.group_workers.protocol_mismatch", 4, env={**FOUR_MACHINES, "ROCE_PG_SUBGROUPS": "join"})
    for case, odd in (("joiner", 3), ("leader", 0)):
        for rank, r in enumerate(results):
            err = r[case]["err"]
            # Each message names both versions (join.hello), and who runs the other one.
            mine = re.search(r"this rank runs (\d+)\.(\d+)", err)
            theirs = re.findall(r"formation protocol (\d+)\.(\d+)", err)
            assert mine and theirs, (case, rank, err)
            (join, hello), (their_join, their_hello) = map(int, mine.groups()), map(int, theirs[0])
            assert hello == their_hello and join - their_join == (1 if rank == odd else -1), (case, rank, err)
            if case == "joiner" and rank != odd:
                assert f"rank {odd} runs roce_pg formation protocol" in err, (case, rank, err)
            if case == "leader" and rank != odd:
                assert "rank 0 (host" in err, (case, rank, err)
            if case == "leader" and rank == odd:  # every other rank, each with its versions
                assert len(theirs) == 3, (case, rank, err)
            assert r[case]["elapsed"] < 60, (case, rank, r[case])


def test_split_group_forms_from_the_parent():
    import torch

    if not hasattr(torch.distributed, "split_group"):
        import pytest

        pytest.skip("this torch has no split_group")
    results = run_group("tests.group_workers.split", 4, env=FOUR_MACHINES)
    assert [r["ops"] for r in results] == [0] * 4, results


def _needs_shrink_group():
    import pytest
    import torch

    if not hasattr(torch.distributed, "shrink_group"):
        pytest.skip("this torch has no shrink_group")


def test_shrink_group_after_a_rank_died():
    _needs_shrink_group()
    res = run_group("tests.group_workers.shrink_after_a_death", 3, expect_dead={2})
    for r in res[:2]:
        assert r["failed"], r  # the death was seen first
        assert r["size"] == 2 and r["new_size"] == 2 and r["exact"], r
    print("shrink_group to the first result:", [round(r["shrink_to_result_s"], 2) for r in res[:2]], "s")


def test_shrink_group_with_abort_fails_the_work_in_flight():
    _needs_shrink_group()
    res = run_group("tests.group_workers.shrink_abort_with_a_hung_rank", 3)
    for r in res[:2]:
        assert r["in_flight"] and r["aborted"] and "SHRINK_ABORT" in r["aborted"], r
        assert r["new_size"] == 2 and r["exact"], r


def test_a_rank_killed_while_forming_leaves_nothing_in_dev_shm():
    results = run_group("tests.group_workers.killed_while_forming_shm", 3, init=False, expect_dead={2},
                        rank_env={2: {"ROCE_PG_TEST_FAULT": "die_forming_shm"}})
    for r in results[:2]:
        # Its segment's name was published; the survivors mapped it and
        # waited for it to map theirs.
        assert r["error"] and "shared-memory setup" in r["error"], r
        assert r["leftovers"] == [], r
