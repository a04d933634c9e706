"""The small-op paths in one spawned group of three ranks (not a power of two):
the one-shot shared-memory allreduce at every dtype and op around its
threshold and the two-step one over several chunks, chunk-size mismatches, small collectives run inline on the caller's thread (ordering with
queued work, completed futures), mismatches and a timeout on that path, and
waits that block in poll() (a rank 1.5 s late over TCP, and over shared memory
on its doorbell)."""
import warnings

from .support.ranks import run_group

warnings.filterwarnings("ignore", category=FutureWarning)


def test_small_ops_shm3():
    # 4 KiB chunks: the largest sizes of the matrix run the two-step protocol
    # over several chunks, with slices that do not divide evenly.
    env = {"ROCE_PG_SHM_ONESHOT_MAX_BYTES": "4096", "ROCE_PG_SHM_CHUNK_BYTES": "4096",
           "ROCE_PG_INLINE_MAX_BYTES": "65536", "TEST_PG_TIMEOUT_S": "60"}
    results = run_group("tests.small_ops_workers.run", 3, env=env)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(r["checks"] > 500 for r in results), [r["checks"] for r in results]
    assert "timed out" in results[0]["timeout_msg"], results[0]["timeout_msg"]
