"""torch's fault-tolerance API on roce (tests/reconfigure_workers.py): a job
that loses a rank goes on with the survivors, then with a spare process in
the dead rank's place, without a restart."""
import pytest
import torch.distributed as dist

from .reconfigure_workers import check_story
from .support.layouts import LAYOUTS
from .support.ranks import run_group

pytestmark = pytest.mark.skipif(not hasattr(dist, "_reconfigure"),
                                reason="this torch has no reconfigure API (torch >= 2.15)")

# Where the four processes are: one machine (shared memory), each its own
# machine over TCP, or two simulated machines of two (the spare lands on the
# dead rank's machine: shared memory to nobody, TCP to the survivors).
PLACES = {"shm": LAYOUTS["shm4"][1], "net": LAYOUTS["net4"][1], "mixed": LAYOUTS["mixed2x2"][1]}


@pytest.mark.parametrize("place", PLACES)
def test_a_death_then_a_spare_without_a_restart(place):
    res = run_group("tests.reconfigure_workers.survive_a_death_then_take_a_spare", 4, init=False,
                    env=PLACES[place], expect_dead={2}, deadline_s=300)
    check_story(res)
    print("death to the survivors' first exact allreduce:",
          [round(r["death_to_result_s"], 2) for r in res[:2]], "s (including a 3 s reconfigure that timed out)")


def test_an_abort_while_a_reconfigure_forms_ends_its_wait():
    res = run_group("tests.reconfigure_workers.abort_while_reconfiguring", 2, init=False, env=LAYOUTS["shm2"][1],
                    deadline_s=120)
    assert "was called on this process group while its membership formed" in (res[0]["error"] or ""), res
    assert res[0]["seconds"] < 10, res  # the abort came after 1 s; the timeout is 30 s
    assert res[1]["error"], res


def test_members_passing_different_lists_are_refused_naming_both():
    res = run_group("tests.reconfigure_workers.mismatched_member_lists", 2, init=False, env=LAYOUTS["shm2"][1],
                    deadline_s=120)
    assert "pass the same handles on every member" in (res[1]["error"] or ""), res
    assert "timed out" in (res[0]["error"] or ""), res
