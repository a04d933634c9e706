"""The c10d surface beyond the numbers: registration, Work and futures, object
collectives, point-to-point, argument errors, groups, release on destroy and
timeouts."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from .support.layouts import LAYOUTS
from .support.ranks import run_group


def test_registration_is_idempotent():
    import roce_pg

    roce_pg.register()
    roce_pg.register()
    assert "roce" in dist.Backend.backend_list
    assert dist.Backend("roce") == "roce"
    # (plus a renamed PrivateUse1 device, if a test loaded one in this process)
    assert {"cpu", "cuda"} <= set(dist.Backend.backend_capability["roce"])
    assert isinstance(roce_pg.rdma_ports(), list)  # libibverbs linked; no device needed


def test_init_by_name_without_import_uses_entry_point(tmp_path):
    """torch >= 2.15 finds the backend through the torch.distributed.backends entry point."""
    code = textwrap.dedent(f"""
        import sys, torch, torch.distributed as dist
        assert "roce_pg" not in sys.modules
        dist.init_process_group("roce", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        assert dist.get_backend() == "roce", dist.get_backend()
        t = torch.arange(5.0)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.equal(t, torch.arange(5.0))
        dist.destroy_process_group()
        print("ENTRY_POINT_OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ENTRY_POINT_OK" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("layout", ["shm2", "net2"])
def test_work_semantics(layout):
    world, env = LAYOUTS[layout]
    res = run_group("tests.api_workers.work_semantics", world, env=env)
    assert "did not complete within" in res[0]["wait_timeout_msg"]


@pytest.mark.parametrize("layout", ["shm4", "mixed2x2"])
def test_object_collectives_and_point_to_point(layout):
    world, env = LAYOUTS[layout]
    run_group("tests.api_workers.objects_and_p2p", world, env=env)


def test_bad_input_raises_clear_errors_and_group_stays_usable():
    world, env = LAYOUTS["shm2"]
    res = run_group("tests.api_workers.bad_input", world, env=env)
    for r in res:
        assert r["size_mismatch_s"] < 10, r
        assert "rank 0" in r["size_mismatch"] and "rank 1" in r["size_mismatch"], r["size_mismatch"]


def test_monitored_barrier_names_late_ranks_and_releases_all_or_none():
    res = run_group("tests.api_workers.monitored_barrier", 3)
    # Rank 0 gives up after the barrier's 0.5 s (polled every 10 ms at most).
    assert res[0]["late_s"] < 1.5, res[0]
    for r in (1, 2):
        assert "rank 0 reports" in res[r]["late"] and "Rank 2 failed" in res[r]["late"], res[r]["late"]


@pytest.mark.parametrize("layout", ["shm3", "net3"])
def test_sparse_allreduce_sums_and_rejects_mismatched_sizes(layout):
    world, env = LAYOUTS[layout]
    res = run_group("tests.api_workers.sparse_allreduce", world, env=env)
    assert all("rank 1" in r["mismatch"] for r in res), res


def test_size_mismatch_on_network_path_fails_every_rank_fast():
    world, env = LAYOUTS["net4"]
    res = run_group("tests.api_workers.network_mismatch", world, env=env)
    # Group timeout is 120 s: every rank must learn of the failure long before.
    assert all(r["elapsed"] < 20 for r in res), [r["elapsed"] for r in res]


def test_torch_distributed_debug_detail_wrapper():
    world, env = LAYOUTS["shm2"]
    run_group("tests.api_workers.debug_wrapper", world, env={**env, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


def test_subgroups_concurrent_groups_and_release():
    world, env = LAYOUTS["mixed2x2"]
    res = run_group("tests.api_workers.groups", world, env=env)
    for r in res:
        assert r["during"]["threads"] > r["before"]["threads"], r  # progress threads existed
        assert r["after"]["threads"] == r["before"]["threads"], r  # ...and were joined
        # Sockets closed. (Fewer than before is fine: a loaded host was seen
        # to close two of the world group's set-up connections only later.)
        # The links to peer processes a subgroup opened stay for later groups
        # (one per peer process at most, two if both dialed at once).
        new_links = r["after"]["process_links"] - r["before"]["process_links"]
        assert 0 <= new_links <= 2 * (world - 1), r
        assert r["after"]["fds"] <= r["before"]["fds"] + new_links, r
        assert r["after"]["shm"] == [] and r["during"]["shm"] == [], r  # unlinked right after setup


def test_rank_skipping_a_collective_times_out_within_twice_the_timeout():
    res = run_group("tests.api_workers.skipped_collective", 2, env={"TEST_PG_TIMEOUT_S": "3"})
    assert res[0]["elapsed"] < 6, res[0]


def test_per_call_timeout_is_honoured():
    res = run_group("tests.api_workers.per_call_timeout", 2, env={"TEST_PG_TIMEOUT_S": "60"})
    assert res[0]["elapsed"] < 2, res[0]


def test_ephemeral_timeout_extends_until_the_first_later_operation_completes():
    res = run_group("tests.api_workers.ephemeral_timeout", 2, env={"TEST_PG_TIMEOUT_S": "2"})
    for r in res:
        assert r["extended"]["sum"] == [3.0] * 4, r
    assert res[0]["extended"]["elapsed"] > 4, res[0]  # it did wait past the group's 2 s
    expired = res[0]["expired"]
    assert expired["msg"] and "timed out" in expired["msg"] and expired["elapsed"] < 4.5, expired
    assert res[1]["expired"]["msg"], res[1]  # the peer's failure reached rank 1


def test_abort_hooks_run_before_the_failed_work_raises():
    res = run_group("tests.api_workers.abort_hooks", 2, env={"TEST_PG_TIMEOUT_S": "2"})
    for r in res:
        assert r["supported"] and r["healthy"] == [] and r["msg"], r
        assert r["at_error"] == ["first", "last"], r
    assert "timed out" in res[0]["msg"], res[0]


def test_an_abort_hook_may_abort_while_the_program_aborts():
    res = run_group("tests.api_workers.abort_from_a_hook_while_the_program_aborts", 2,
                    env={"TEST_PG_TIMEOUT_S": "2"}, deadline_s=90)
    r = res[0]
    assert r["hook_ran"] and r["hook_done"] == [True] and r["abort_s"] < 10, r
    assert r["work"] and "timed out" in r["work"], r


def test_time_estimation_runs_nothing_and_estimates_from_the_cost_model():
    res = run_group("tests.api_workers.time_estimation", 2, env=LAYOUTS["shm2"][1])
    for r in res:
        assert r["untouched"] and r["exact"] and r["other_ran"], r
        assert 0 < r["one_us"] < r["several_us"] and r["one_us"] < r["bigger_us"], r
        # The model's constants are defaults, not this machine's, and the
        # machine is shared: an estimate within 100x of the fastest of ten
        # runs, either way, is a sane one (here: about 4x under).
        assert r["measured_us"] / 100 < r["one_us"] < r["measured_us"] * 100, r
    print("1 MiB allreduce, shm2: estimated", round(res[0]["one_us"]), "us, measured", round(res[0]["measured_us"]), "us")


def test_rank_that_never_joins_fails_the_others_within_twice_the_timeout():
    res = run_group("tests.api_workers.never_joins", 3, init=False, kwargs={"timeout_s": 4})
    for r in res[:2]:
        assert r["elapsed"] < 8, r


def test_group_spanning_machines_without_rdma_device_needs_explicit_tcp():
    import roce_pg

    if roce_pg.rdma_ports():
        pytest.skip("this machine has RDMA ports; the error path needs a machine without")
    res = run_group("tests.api_workers.no_rdma_device", 2, init=False, env={"ROCE_PG_SIM_RANKS_PER_NODE": "1"})
    assert all("libibverbs found no RDMA device" in r["msg"] for r in res), res
