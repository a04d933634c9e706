"""DDP trains to the same parameters with roce as with Gloo."""
import pytest

from .support.layouts import LAYOUTS
from .support.ranks import run_group


@pytest.mark.parametrize("layout", ["shm2", "mixed2x2"])
def test_ddp_matches_gloo(layout):
    world, env = LAYOUTS[layout]
    for r in run_group("tests.ddp_workers.run", world, env=env):
        assert r["moved"] > 1e-3, r        # training actually changed the parameters
        assert r["diff"] <= 1e-5, r        # roce == gloo after 20 steps
        assert r["diff_hook"] <= 1e-5, r   # comm hook on get_future() == gloo
        assert r["spread"] == 0.0, r       # every replica identical
