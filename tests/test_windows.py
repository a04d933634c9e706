"""torch's one-sided windows on roce (tests/window_workers.py): puts,
signals, mapped peers and served peers, bounds, timeouts, re-registration
and an all-to-all-v written with puts, on shared memory, TCP and both."""
import pytest
import torch.distributed as dist

from .support.layouts import LAYOUTS
from .support.ranks import run_group


@pytest.mark.parametrize("layout", ["shm3", "net3", "mixed2x2"])
def test_window_matrix(layout):
    if not hasattr(dist, "_new_window"):
        pytest.skip("this torch has no one-sided window API (torch >= 2.15)")
    world, env = LAYOUTS[layout]
    run_group("tests.window_workers.window_matrix", world, env=env, deadline_s=240)


@pytest.mark.parametrize("layout", ["net3", "shm3"])
def test_window_wait_fails_when_a_peer_dies(layout):
    if not hasattr(dist, "_new_window"):
        pytest.skip("this torch has no one-sided window API (torch >= 2.15)")
    world, env = LAYOUTS[layout]
    res = run_group("tests.window_workers.window_peer_death", world, env=env, expect_dead={world - 1}, deadline_s=240)
    print("a survivor's wait learned of the death after", [round(r["elapsed"], 2) for r in res if r], "s")
