"""Every collective x dtype x reduce op x size on each process layout:
shared memory, forced network (TCP), and two simulated machines of two ranks."""
import warnings

import pytest

from .support.layouts import LAYOUTS
from .support.ranks import run_group

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.mark.parametrize("layout", ["single", "shm2", "shm3", "shm4", "net2", "net3", "net4", "mixed2x2"])
def test_collective_matrix(layout):
    world, env = LAYOUTS[layout]
    results = run_group("tests.matrix.run", world, env=env)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    # Guard against a matrix that silently checked nothing.
    assert all(r["checks"] > 1500 for r in results), [r["checks"] for r in results]
