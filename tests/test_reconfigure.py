"""torch's fault-tolerance API on roce (tests/reconfigure_workers.py): a job
that loses a rank goes on with the survivors, then with a spare process in
the dead rank's place, without a restart."""
import pytest
import torch.distributed as dist

from .support.layouts import TCP
from .support.ranks import run_group

# Where the four processes are: one machine (shared memory), each its own
# machine over TCP, or two simulated machines of two (the spare lands on the
# dead rank's machine: shared memory to nobody, TCP to the survivors).
PLACES = {
    "shm": {},
    "net": {"ROCE_PG_FORCE_NETWORK": "1", **TCP},
    "mixed": {"ROCE_PG_SIM_RANKS_PER_NODE": "2", **TCP},
}


@pytest.mark.parametrize("place", PLACES)
def test_a_death_then_a_spare_without_a_restart(place):
    if not hasattr(dist, "_reconfigure"):
        pytest.skip("this torch has no reconfigure API (torch >= 2.15)")
    res = run_group("tests.reconfigure_workers.survive_a_death_then_take_a_spare", 4, init=False,
                    env=PLACES[place], expect_dead={2}, deadline_s=300)
    assert res[2] is None
    members, spare = res[:2], res[3]
    for r in res[:2] + [spare]:
        assert r["supports"], r
        assert "no members until its first reconfigure" in r["before_any"], r
    assert len({r["handle"] for r in members + [spare]}) == 3
    for rank, r in enumerate(members):
        assert r["first"] == {"rank": rank, "size": 3, "exact": True}, r
        assert r["still_exact"], r
        assert r["reused_uuid"] and "uuid 1 was used before" in r["reused_uuid"], r
        assert r["not_a_member"] and "is not among the 2 handles" in r["not_a_member"], r
        assert r["not_a_handle"] and "'gloo:0:1:0:' is not a roce reconfigure handle" in r["not_a_handle"], r
        assert r["death_seen"], r
        assert r["with_the_dead"] and 2.5 < r["with_the_dead_s"] < 30, r
        assert r["after_failed"] and "reconfigure(uuid=2) failed" in r["after_failed"], r
        assert r["survivors"] == {"rank": rank, "size": 2, "exact": True}, r
        assert r["with_spare"] == {"rank": rank, "size": 3, "exact": True, "state": True}, r
        assert r["listen_port_first"] == r["listen_port_last"], r
    for r in members + [spare]:
        assert r["doorbell_groups"] <= 1, r  # this membership's group at most
    assert members[0]["old_in_flight"], members[0]
    assert members[0]["old_work"] and "reconfigure(uuid=4)" in members[0]["old_work"], members[0]
    assert spare["with_spare"] == {"rank": 2, "size": 3, "exact": True, "state": True}, spare
    print("death to the survivors' first exact allreduce:",
          [round(r["death_to_result_s"], 2) for r in members], "s (including a 3 s reconfigure that timed out)")
