"""Every collective x dtype x reduce op x size on each process layout:
shared memory, forced network (TCP), and two simulated machines of two ranks.

The four-rank layouts check the largest size (1 Mi elements + 3) with one
dtype per element size and kind (tests/matrix.py, LARGE_REPRESENTATIVES):
that size in every dtype costs most of their time and adds nothing that the
one-, two- and three-rank layouts, which run it in every dtype, and the C++
unit tests of every kernel do not already check. Every smaller size runs in
every dtype everywhere."""
import warnings

import pytest

from .support.layouts import LAYOUTS
from .support.ranks import run_group

warnings.filterwarnings("ignore", category=FutureWarning)


THINNED = {"shm4", "net4", "mixed2x2"}


@pytest.mark.parametrize("layout", ["single", "shm2", "shm3", "shm4", "net2", "net3", "net4", "mixed2x2"])
def test_collective_matrix(layout):
    world, env = LAYOUTS[layout]
    thin = layout in THINNED
    results = run_group("tests.matrix.run", world, env=env, kwargs={"thin_large": thin})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    # Guard against a matrix that silently checked nothing.
    floor = 1500 if thin else 1700
    assert all(r["checks"] > floor for r in results), [r["checks"] for r in results]
