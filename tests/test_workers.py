"""The worker pool (ROCE_PG_WORKERS, csrc/common/worker_pool.hpp) under the
shared-memory allreduce: in one spawned group of three ranks (not a power of
two), four subgroups with 1, 2, 4 and 8 workers run every dtype/op/size case
of tests/worker_pool_workers.py, one-shot and two-step over several chunks.
Results must match float64 / exact references and be the same bits for every
worker count; the pool's threads must actually have run slices (else the test
proves nothing about them), and idle threads must sleep, not spin. The same
over TCP for the receive-side reductions of ring, rd, rabenseifner and tree
at 1 and 8 workers. And, in the same four subgroups, allgather (tensor and
list), broadcast (every root) and reduce_scatter (tensor and list, every op
and several dtypes) through the shared-memory slots, plus their mismatched
calls failing on every rank and the old point-to-point route forced. The
pool's job hand-off alone (200,000 tiny jobs, forks while they run) is a C++
unit test: tests/unit/cpp/test_worker_pool.cpp."""
import warnings

from .support.ranks import run_group
from .worker_pool_workers import CHUNK, NET_ALGOS, NET_CASES, NET_SIZES, NET_WORKERS, ONESHOT_MAX, WORKER_COUNTS

warnings.filterwarnings("ignore", category=FutureWarning)


def test_worker_counts_exact_and_identical():
    env = {"ROCE_PG_SHM_ONESHOT_MAX_BYTES": str(ONESHOT_MAX), "ROCE_PG_SHM_CHUNK_BYTES": str(CHUNK),
           "TEST_PG_TIMEOUT_S": "120"}
    results = run_group("tests.worker_pool_workers.run", 3, env=env)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    for r in results:
        net_checks = len(NET_ALGOS) * len(NET_CASES) * len(NET_SIZES) * len(NET_WORKERS)
        shm = r["shm_cases"]
        # Per case: allgather and reduce_scatter check two forms per worker
        # count, broadcast one; then 2 checks after the mismatches, 3 forced p2p.
        shm_checks = len(WORKER_COUNTS) * (2 * shm["allgather"] + shm["broadcast"] + 2 * shm["reduce_scatter"]) + 5
        assert r["cases"] > 150 and r["checks"] == len(WORKER_COUNTS) * r["cases"] + 1 + net_checks + shm_checks, \
            (r["cases"], r["checks"], shm)
        assert shm["allgather"] >= 15 and shm["broadcast"] >= 45 and shm["reduce_scatter"] >= 150, shm
        # The shared-memory route sent no point-to-point message; the forced
        # old route did; the pool's threads ran slices of the new collectives.
        assert all(s == 0 for s in r["shm_sends"].values()), r["shm_sends"]
        assert r["p2p_sends"] > 0, r["p2p_sends"]
        assert r["shm_slices"][1] == 0 and all(r["shm_slices"][w] > 0 for w in WORKER_COUNTS[1:]), r["shm_slices"]
        assert len(r["shm_errors"]) == 6, r["shm_errors"]
        # workers=1 never touches the pool; the others hand it slices.
        assert r["slices"][1] == 0, r["slices"]
        assert all(r["slices"][w] > 0 for w in WORKER_COUNTS[1:]), r["slices"]
        # One pool per process, sized by the largest group: 8 - 1 threads.
        assert r["worker_threads"] == max(WORKER_COUNTS) - 1, r["worker_threads"]
        # Seven idle threads over 1 s: spinning would cost seconds.
        assert r["idle_cpu"] < 0.05, r["idle_cpu"]
        assert all(r["net_slices"][f"{algo}/1"] == 0 for algo in NET_ALGOS), r["net_slices"]
    # Every network algorithm handed its reductions to the pool at 8 workers
    # (summed: with 3 ranks, rd and rabenseifner fold rank 0 out, and it reduces nothing).
    for algo in NET_ALGOS:
        assert sum(r["net_slices"][f"{algo}/8"] for r in results) > 0, [r["net_slices"] for r in results]
