"""Allreduce algorithms: each one forced and "auto", on
simulated machine layouts over TCP, including non-power-of-two and uneven
groups, with the traffic counters checked against what each algorithm must
send, and auto's cost model checked at sizes and group sizes where it picks
differently from the old fixed thresholds.

Two spawned groups of six ranks; every layout below is a subgroup of one of
them (spawning costs seconds of `import torch` per rank):
  2x3 machines (ROCE_PG_SIM_NODE): 2x3, 2x2, uneven 1+3 and 3+2, one machine of 3
  3x2 machines (ROCE_PG_SIM_RANKS_PER_NODE=2): 3x2, 3x1 (all network), 5 ranks 2+2+1
"""
import warnings

import pytest

from .algorithm_workers import ALGOS
from .support.layouts import TCP
from .support.ranks import run_group

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
    return results


def test_two_machines_of_three():
    rank_env = {r: {"ROCE_PG_SIM_NODE": f"m{r // 3}"} for r in range(6)}
    groups = {"2x3": list(range(6)), "2x2": [0, 1, 3, 4], "1+3": [2, 3, 4, 5], "3+2": [0, 1, 2, 3, 4],
              "1x3": [0, 1, 2]}
    # Also hier with ROCE_PG_NCHANNELS=2 (channels in its ring across machines)
    # and with the tree across machines (on the layouts hier applies to).
    results = _run(ENV, rank_env, groups, {"2x2": [7, 1000, HIER_VS_RING]}, algos=ALGOS + ["hier2ch", "hiertree"],
                   only={"hiertree": ["2x3", "2x2"]})
    counters = [r["counters"] for r in results]
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
    # The double binary tree, one chunk per half (n/2 = 2000 B < 4 KiB chunks).
    # Positions 0-3: the first tree 0 -> 2 -> {1, 3}, the second 3 -> 1 -> {0, 2};
    # a rank sends its half up (if not a root) and down to each child.
    assert per_rank("tree", 1000, "sends") == [2, 4, 4, 2]
    assert per_rank("tree", 1000, "bytes_sent_net") == [n // 2, 3 * n // 2, 3 * n // 2, n // 2]
    # hier with the tree among the 2 machines: one half of the shard up, one down.
    assert per_rank("hiertree", 1000, "sends") == [4] * 4
    assert per_rank("hiertree", 1000, "bytes_sent_net") == [n // 2] * 4
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


# Auto with the thresholds unset (the cost model decides), where it now picks
# differently from the fixed thresholds (rd <= 64 KiB, hier from 64 KiB,
# Rabenseifner < 1 MiB, ring above): (name, group, shape for the model,
# float32 elements, variables, expected choice, old choice).
TREE_REGIME = {"ROCE_PG_ALGO_NET_ALPHA_US": "0", "ROCE_PG_ALGO_NET_GBPS": "100", "ROCE_PG_ALGO_NIC_GBPS": "1000",
               "ROCE_PG_ALGO_SHM_GBPS": "100", "ROCE_PG_ALGO_REDUCE_GBPS": "100"}
REGIMES = [
    # 3 ranks, one per machine: 4 ring steps beat Rabenseifner's fold (+2n).
    ("ring", "3x1", (3, 3, 1), 16384, {}, ("ring", None), ("rabenseifner", None)),
    # hier's shard (32 KiB) among 3 machines: the ring, not recursive doubling.
    ("hier/ring", "3x2", (6, 3, 2), 16384, {}, ("hier", "ring"), ("hier", "rd")),
    # Messages across machines made very slow: fewest rounds wins at 256 KiB.
    ("rd", "3x2", (6, 3, 2), 65536, {"ROCE_PG_ALGO_NET_ALPHA_US": "100000"}, ("rd", None), ("hier", "rabenseifner")),
    # Free network messages, 1 us ones in shared memory: the tree on 5 uneven ranks.
    ("tree", "2+2+1", (5, 3, 0), 40000, TREE_REGIME, ("tree", None), ("rabenseifner", None)),
    # A threshold that is set still decides (precedence over the model).
    ("threshold", "3x1", (3, 3, 1), 16384, {"ROCE_PG_ALGO_RD_MAX_BYTES": "1M"}, ("rd", None), ("rd", None)),
]

# auto's choice at scale (the model is a pure function: no group needed):
# (ranks, machines, ranks per machine, bytes, variables) -> (algorithm, across).
KiB, MiB = 1 << 10, 1 << 20
PLANS = {
    (1024, 128, 8, 8, ()): ("rd", None),
    (1024, 128, 8, 64 * KiB, ()): ("hier", "rd"),
    (1024, 128, 8, 1 * MiB, ()): ("hier", "rabenseifner"),
    (1024, 128, 8, 32 * MiB, ()): ("hier", "tree"),
    (1000, 1000, 1, 1 * MiB, ()): ("tree", None),
    (1000, 125, 8, 4 * MiB, ()): ("tree", None),
    # Thresholds that are set take their rows (and only those) from the model.
    (1024, 128, 8, 1 * MiB, (("ROCE_PG_ALGO_HIER_MIN_BYTES", "2M"),)): ("tree", None),
    (1024, 1024, 1, 1 * MiB, (("ROCE_PG_ALGO_RING_MIN_BYTES", "512K"),)): ("ring", None),
    # Forcing hier's ring among 128 machines (254 steps) makes hier the slower choice.
    (1024, 128, 8, 1 * MiB, (("ROCE_PG_ALGO_ALLREDUCE_ACROSS", "ring"),)): ("tree", None),
}
# Medium sizes at 1,024 ranks: never the ring's 2(p-1) steps, flat or among the machines.
MEDIUM_AT_SCALE = [(1024, machines, 1024 // machines, size, ()) for machines in (128, 1024)
                   for size in (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)]


def test_three_machines_of_two():
    env = {**ENV, "ROCE_PG_SIM_RANKS_PER_NODE": "2"}
    groups = {"3x2": list(range(6)), "3x1": [0, 2, 4], "2+2+1": [0, 1, 2, 3, 4]}
    # The last group: rank 4 sets another ROCE_PG_ALGO_ALLREDUCE than 0 and 2.
    # Also the ring in 3 channels (ROCE_PG_NCHANNELS=3) on every layout, hier
    # with the tree across its 3 machines, auto's regimes and plans at scale.
    plans = list(PLANS) + MEDIUM_AT_SCALE
    results = _run(env, None, groups, {"3x1": [1000]}, mismatch=[0, 2, 4], algos=ALGOS + ["ring3ch", "hiertree"],
                   only={"hiertree": ["3x2"]}, regimes=[r[:5] for r in REGIMES],
                   plans=[(*p[:4], dict(p[4])) for p in plans])
    counters = [r["counters"] for r in results]
    # 3 ranks, all over the network: rd folds rank 0 into rank 2 (send n),
    # exchanges once between the 2 survivors, and returns the result.
    n = 4000
    sends = [counters[r]["3x1/rd/1000"]["sends"] for r in (0, 2, 4)]
    net = [counters[r]["3x1/rd/1000"]["bytes_sent_net"] for r in (0, 2, 4)]
    assert sends == [1, 2, 1] and net == [n, 2 * n, n]
    assert all(counters[r]["3x1/hier/1000"]["bytes_sent_shm"] == 0 for r in (0, 2, 4))
    # The tree on 3 positions: 0 -> 2 -> 1 and 1 -> {0, 2}, halves of n/2.
    sends = [counters[r]["3x1/tree/1000"]["sends"] for r in (0, 2, 4)]
    net = [counters[r]["3x1/tree/1000"]["bytes_sent_net"] for r in (0, 2, 4)]
    assert sends == [2, 3, 3] and net == [n, 3 * n // 2, 3 * n // 2]

    for name, label, _, _, _, expected, old in REGIMES:
        got = results[0]["regimes"][name]["plan"]
        assert (got["algo"], got["across"]) == expected, (name, got)
        assert name == "threshold" or expected != old, name
        # What auto did equals what the predicted algorithm does when forced.
        for r in groups[label]:
            regime = results[r]["regimes"][name]
            assert regime["auto"] == regime["forced"], (name, r, regime)
    assert results[0]["regimes"]["threshold"]["plan"]["decided_by"] == "ROCE_PG_ALGO_RD_MAX_BYTES"

    got = dict(zip(plans, results[0]["plans"]))
    for case, expected in PLANS.items():
        assert (got[case]["algo"], got[case]["across"]) == expected, (case, got[case])
    for case in MEDIUM_AT_SCALE:
        assert "ring" not in (got[case]["algo"], got[case]["across"]), (case, got[case])
