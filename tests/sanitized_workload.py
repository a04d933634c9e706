"""A short collective matrix for the sanitizer run: tests/test_sanitizers.py
passes this file to pytest explicitly (its name keeps it out of the normal
suite, which runs the full matrix). Every collective, dtype and reduce op at
small sizes plus one chunked size, on shared memory and TCP (there with the
large allreduce in 2 channels)."""
import os

import pytest

from .support.layouts import LAYOUTS
from .support.ranks import run_group

SHORT = {"ROCE_TEST_LARGE_SIZE": "70001", "ROCE_PG_CHUNK_BYTES": "16384"}


def test_the_instrumented_build_is_the_one_imported():
    assert os.environ.get("ROCE_PG_EXPECT_SANITIZED"), "run this file through scripts/sanitize.sh"
    import roce_pg

    assert "address" in roce_pg.build_info().get("sanitize", ""), (roce_pg.__file__, roce_pg.build_info())


# Over TCP the large size runs as a ring in 2 channels, one reducing on a helper thread.
CHANNELS = {"ROCE_PG_NCHANNELS": "2", "ROCE_PG_ALGO_RING_MIN_BYTES": "65536"}


@pytest.mark.parametrize("layout", ["shm3", "net3"])
def test_short_matrix(layout):
    world, env = LAYOUTS[layout]
    results = run_group("tests.matrix.run", world, env={**env, **SHORT, **(CHANNELS if layout == "net3" else {})})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(r["checks"] > 1000 for r in results), [r["checks"] for r in results]
