"""Allreduce algorithms (issue 7): each one forced and "auto", on simulated
machine layouts over TCP, including non-power-of-two and uneven groups, with
the traffic counters checked against what each algorithm must send.

Two spawned groups of six ranks; every layout below is a subgroup of one of
them (spawning costs seconds of `import torch` per rank):
  2x3 machines (ROCE_PG_SIM_NODE): 2x3, 2x2, uneven 1+3 and 3+2, one machine of 3
  3x2 machines (ROCE_PG_SIM_RANKS_PER_NODE=2): 3x2, 3x1 (all network), 5 ranks 2+2+1
"""
import warnings

import pytest

from .algorithm_workers import ALGOS
from .harness import TCP, run_group

warnings.filterwarnings("ignore", category=FutureWarning)

# Thresholds small enough that a few KiB cover every size class (see
# tests/algorithm_workers.py); chunks of 4 KiB make the ring pipeline.
ENV = {**TCP, "ROCE_PG_ALGO_RD_MAX_BYTES": "64", "ROCE_PG_ALGO_RING_MIN_BYTES": "8192",
       "ROCE_PG_ALGO_HIER_MIN_BYTES": "1024", "ROCE_PG_ALGO_BRUCK_MAX_BYTES": "256", "ROCE_PG_CHUNK_BYTES": "4096"}
HIER_VS_RING = 1 << 16  # float32 elements (256 KiB) for the network-bytes comparison


def _run(env, rank_env, groups, traffic, **extra):
    results = run_group("tests.algorithm_workers.run", 6, env=env, rank_env=rank_env,
                        kwargs={"groups": groups, "traffic": traffic, **extra})
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(r["checks"] > 300 for r in results), [r["checks"] for r in results]
    return [r["counters"] for r in results]


def test_two_machines_of_three():
    rank_env = {r: {"ROCE_PG_SIM_NODE": f"m{r // 3}"} for r in range(6)}
    groups = {"2x3": list(range(6)), "2x2": [0, 1, 3, 4], "1+3": [2, 3, 4, 5], "3+2": [0, 1, 2, 3, 4],
              "1x3": [0, 1, 2]}
    # Also hier with ROCE_PG_NCHANNELS=2 (channels in its ring across machines).
    counters = _run(ENV, rank_env, groups, {"2x2": [7, 1000, HIER_VS_RING]}, algos=ALGOS + ["hier2ch"])
    members = groups["2x2"]  # ring order 0,1 | 3,4: the network edges are 1->3 and 4->0

    def per_rank(algo, numel, key):
        return [counters[r][f"2x2/{algo}/{numel}"][key] for r in members]

    n = 1000 * 4  # bytes of the 1000-element probe
    # Messages per rank on 4 ranks: rd lg4 = 2, rabenseifner 2 lg4 = 4, ring 2(p-1) = 6
    # (segments of 1000 B < one 4 KiB chunk), hier 1 + 2 (rabenseifner across 2) + 1.
    assert per_rank("rd", 1000, "sends") == [2] * 4
    assert per_rank("rabenseifner", 1000, "sends") == [4] * 4
    assert per_rank("ring", 1000, "sends") == [6] * 4
    assert per_rank("hier", 1000, "sends") == [4] * 4
    # Network bytes: rd and rabenseifner cross machines on the XOR-2 step (n, and
    # n/2 + n/2); the ring only on its two boundary ranks (6 segments of n/4);
    # hier exchanges each rank's half across (n/4 + n/4).
    assert per_rank("rd", 1000, "bytes_sent_net") == [n] * 4
    assert per_rank("rabenseifner", 1000, "bytes_sent_net") == [n] * 4
    assert per_rank("ring", 1000, "bytes_sent_net") == [0, 6 * n // 4, 0, 6 * n // 4]
    assert per_rank("hier", 1000, "bytes_sent_net") == [n // 2] * 4
    # auto: 28 B -> recursive doubling; 4000 B on 2x2 -> hier (threshold 1 KiB)
    assert per_rank("auto", 7, "sends") == [2] * 4
    assert per_rank("auto", 1000, "bytes_sent_net") == [n // 2] * 4
    # The point of hier: per rank at most half of the ring's network bytes.
    big = HIER_VS_RING * 4
    ring_net, hier_net = per_rank("ring", HIER_VS_RING, "bytes_sent_net"), per_rank("hier", HIER_VS_RING, "bytes_sent_net")
    assert ring_net == [0, 3 * big // 2, 0, 3 * big // 2]
    assert hier_net == [big // 2] * 4 and max(hier_net) <= max(ring_net) / 2
    # Allgather and reduce-scatter of n bytes per block: the flat ring crosses
    # machines on its two boundary ranks with 3 blocks each; hier sends each
    # rank's one block across (its team spans 2 machines).
    for coll in ("all_gather", "reduce_scatter"):
        def net(algo):
            return [counters[r][f"2x2/{algo}/{HIER_VS_RING}/{coll}"]["bytes_sent_net"] for r in members]
        assert net("ring") == [0, 3 * big, 0, 3 * big], (coll, net("ring"))
        assert net("hier") == [big] * 4, (coll, net("hier"))
        assert net("auto") == [big] * 4, (coll, net("auto"))
    # Shared memory carries the rest; the shm rings copy it in and out.
    assert all(x > 0 for x in per_rank("hier", HIER_VS_RING, "bytes_sent_shm"))
    assert all(x >= 2 * s for x, s in zip(per_rank("hier", HIER_VS_RING, "bytes_copied"),
                                          per_rank("hier", HIER_VS_RING, "bytes_sent_shm")))


def test_three_machines_of_two():
    env = {**ENV, "ROCE_PG_SIM_RANKS_PER_NODE": "2"}
    groups = {"3x2": list(range(6)), "3x1": [0, 2, 4], "2+2+1": [0, 1, 2, 3, 4]}
    # The last group: rank 4 sets another ROCE_PG_ALGO_ALLREDUCE than 0 and 2.
    # Also the ring in 3 channels (ROCE_PG_NCHANNELS=3) on every layout.
    counters = _run(env, None, groups, {"3x1": [1000]}, mismatch=[0, 2, 4], algos=ALGOS + ["ring3ch"])
    # 3 ranks, all over the network: rd folds rank 0 into rank 2 (send n),
    # exchanges once between the 2 survivors, and returns the result.
    n = 4000
    sends = [counters[r]["3x1/rd/1000"]["sends"] for r in (0, 2, 4)]
    net = [counters[r]["3x1/rd/1000"]["bytes_sent_net"] for r in (0, 2, 4)]
    assert sends == [1, 2, 1] and net == [n, 2 * n, n]
    assert all(counters[r]["3x1/hier/1000"]["bytes_sent_shm"] == 0 for r in (0, 2, 4))
