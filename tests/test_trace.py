"""roce's flight recorder in one spawned group of two local ranks:
every collective and point-to-point op recorded with its sizes, dtypes, peer,
algorithm and times; torch's flight-recorder hook sees each roce op once and
retires it as completed through roce's completion hook; dump_trace() in
torch's layout, which torch's analyzer reads; the ring wraps; 0 entries turns
it off; a timed-out op is recorded as failed with its reason and dumped;
with ROCE_PG_TORCH_FR=native (the default) torch attaches no hook to the
group (this test runs its groups with "hook" to check that path too).
The recording cost is benchmarks/trace_cost.cpp (docs/PERFORMANCE.md)."""
import pickle
import subprocess
import sys
import warnings

from .support.ranks import run_group

warnings.filterwarnings("ignore", category=FutureWarning)


def test_trace_records_every_op_and_feeds_torch_flight_recorder(tmp_path):
    results = run_group("tests.trace_workers.run", 2, env={"TEST_PG_TIMEOUT_S": "60", "ROCE_PG_TORCH_FR": "hook"},
                        kwargs={"dump_dir": str(tmp_path)})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert "timed out" in results[0]["reason"], results[0]
    # Dumping on failure does not hang the failing call (a 2 s timeout; the
    # margin is for a busy 2-core machine, where detection runs late).
    assert results[0]["fail_s"] < 10, results[0]
    # torch's own analyzer reads both ranks' dumps and matches every
    # collective across them.
    out = tmp_path / "analysis.pkl"
    subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path),
                    "--prefix", "roce_trace_", "-o", str(out)], check=True, capture_output=True, timeout=300)
    with open(out, "rb") as f:
        _, db = pickle.load(f)
    assert db.collectives and all(c.pass_check for c in db.collectives), db.collectives
    assert {c.collective_name for c in db.collectives} >= {"roce:all_reduce", "roce:_reduce_scatter_base",
                                                          "roce:all_to_all_single", "roce:barrier"}
    # roce's own reader of the dumps written at the failure names the failed
    # operation and its reason (exit 1: something went wrong in that group).
    p = subprocess.run([sys.executable, "-m", "roce_pg.doctor", "trace", str(tmp_path), "--prefix", "on_failure_"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "#2 failed" in p.stdout and "timed out" in p.stdout, p.stdout


def test_signal_dumps_the_trace_of_a_rank_blocked_in_a_collective(tmp_path):
    """ROCE_PG_TRACE_SIGNAL (opt-in): the dump is written by roce's own thread
    while the rank's caller is blocked inside an allreduce."""
    results = run_group("tests.trace_workers.dump_on_signal", 2,
                        env={"ROCE_PG_TRACE_SIGNAL": "SIGUSR1", "ROCE_PG_TRACE_DUMP": str(tmp_path / "sig_")},
                        kwargs={"dump_dir": str(tmp_path)})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert all(r["value_ok"] for r in results), results
