"""roce's flight recorder (issue 28) in one spawned group of two local ranks:
every collective and point-to-point op recorded with its sizes, dtypes, peer,
algorithm and times; torch's flight-recorder hook sees each roce op once and
retires it as completed through roce's completion hook; the ring wraps; 0
entries turns it off; a timed-out op is recorded as failed with its reason.
The recording cost is benchmarks/trace_cost.cpp (docs/PERFORMANCE.md)."""
import warnings

from .harness import run_group

warnings.filterwarnings("ignore", category=FutureWarning)


def test_trace_records_every_op_and_feeds_torch_flight_recorder():
    results = run_group("tests.trace_workers.run", 2, env={"TEST_PG_TIMEOUT_S": "60"})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert "timed out" in results[0]["reason"], results[0]
