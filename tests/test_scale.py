"""Scale, through the torch-free harness tests/scale (roce_scale):
64 ranks on simulated machines pass every collective's and algorithm's exact
checks, and what one rank costs - network connections, descriptors, threads,
memory - follows the peers it talks to, not the world size; and 256 ranks
with the default 64 KiB rings pass --checks few (waits on shared memory block).

roce_scale forks the ranks, serves their store and enforces a wall-clock
limit of its own (it kills and names ranks that hang), so a hang fails a test
instead of the run; the subprocess timeout is the backstop. The harness is
built here if needed (make, objects cached under build/scale/)."""
import fcntl
import json
import math
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "build", "scale", "roce_scale")
# A cold build of the harness takes about 10 s at -j2 on the 2-core machine
# where it links the extension's core objects (tests/scale/Makefile), about
# 70 s where it compiles the core itself; an up-to-date one, a second.
BUILD_BUDGET_S = 300
# One harness run: 64 ranks with every check take 15-25 s there.
RUN_LIMIT_S = 150

EIGHT_BY_EIGHT = "8x8"
UNEVEN = "1,7,8,3,13,8,16,8"  # 64 ranks; a machine of one, odd sizes, hier's layouts broken
TWO_BY_EIGHT = "2x8"


def _build():
    os.makedirs(os.path.dirname(BINARY), exist_ok=True)
    # Other test processes (pytest-xdist, a second checkout's run) may build at once.
    with open(BINARY + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["make", "-C", os.path.join(ROOT, "tests", "scale"), "-j2"],
                              capture_output=True, text=True, timeout=BUILD_BUDGET_S)
    if proc.returncode != 0:
        pytest.fail(f"building roce_scale failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """run(layout) -> the harness's JSON for that layout, each layout run once."""
    _build()
    runs = {}

    def run(layout):
        if layout not in runs:
            runs[layout] = _run_once(tmp_path_factory.mktemp("scale"), layout, "full", RUN_LIMIT_S)
        return runs[layout]

    return run


def _run_once(out_dir, layout, checks, limit_s, env=None):
    """The harness's JSON for one run (built already)."""
    out = out_dir / "result.json"
    proc = subprocess.run(
        [BINARY, "--layout", layout, "--checks", checks, "--sizes", "8", "--budget", "1",
         "--time-limit", str(limit_s), "--json", str(out)],
        capture_output=True, text=True, timeout=limit_s + 30, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"roce_scale --layout {layout} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def _worst(result, metric):
    values = result["metrics"][metric]
    assert None not in values, f"a rank did not report {metric}"
    return max(values)


@pytest.mark.parametrize("layout", [EIGHT_BY_EIGHT, UNEVEN])
def test_every_collective_and_algorithm_is_exact_on_64_ranks(harness, layout):
    r = harness(layout)
    assert r["ok"] and r["ranks"] == 64, r["problems"]
    # Each rank checked every collective (roots see a few more results than
    # the others) in the default group and in one group per algorithm.
    assert min(r["checks_passed"]) >= 130, r["checks_passed"]
    for algo in r["allreduce_algos"]:
        assert None not in r["metrics"][f"allreduce_{algo}_8"], algo
    # Collectives that talk to every rank connect to every network peer
    # (64 ranks minus the rank's own machine), and only they do.
    machine_of = [m for m, size in enumerate(r["machines"]) for _ in range(size)]
    network_peers = [64 - r["machines"][machine_of[rank]] for rank in range(64)]
    assert r["metrics"]["connections_all_peers"] == network_peers


def test_init_is_quick_at_64_ranks(harness):
    # Formation must not grow with a full mesh: with every rank cloning the
    # store and dialling every peer, 32 ranks took 10 s to form a group over
    # TCP, while 64 take a few hundredths of a second here with connections
    # made on demand. A generous bound: the machine is shared.
    assert _worst(harness(EIGHT_BY_EIGHT), "init_s") < 5


def test_per_rank_resources_do_not_grow_with_the_world_size(harness):
    small, large = harness(TWO_BY_EIGHT), harness(EIGHT_BY_EIGHT)
    assert small["ok"], small["problems"]
    # The few-peer collectives' network peers (docs/ALGORITHMS.md, "Peers per
    # algorithm"): ring, chain, tree and hier neighbours are a constant; the
    # barrier's dissemination, Bruck and the binomial broadcasts reach
    # rank +- 2^k (2 more peers per doubling of the world) and recursive
    # doubling its XOR partner (1 more). From 16 to 64 ranks: at most 6 more,
    # against 48 more network peers a full mesh would add.
    doublings = math.log2(large["ranks"] / small["ranks"])
    log_growth = 3 * doublings
    assert _worst(large, "connections") <= _worst(small, "connections") + log_growth
    # A connection is one descriptor; everything else a rank holds is fixed.
    assert _worst(large, "fds") <= _worst(small, "fds") + log_growth
    assert _worst(large, "threads") == _worst(small, "threads")
    # Memory, right after init (later the checks' buffers, some O(n) like an
    # allgather's output, pass through the heap): no buffer per rank of the
    # world. 48 more ranks may add the roster's and routes' bytes, not 64 KiB each.
    assert _worst(large, "pss_init_kib") <= _worst(small, "pss_init_kib") + 48 * 64
    # Store round trips per rank: a fixed number per group formed (join.cpp:
    # the leader's address, the roster; the machine's shared-memory names),
    # plus the harness's own fixed few; none per peer. A few more come with a
    # longer formation on a loaded machine (waits in slices, the leader's
    # progress record every 2 s, a joiner's retry): a handful per rank over the
    # run, where one round trip per peer would add 48 per group formed.
    per_rank = lambda r: r["store"]["requests"] / r["ranks"]  # noqa: E731
    assert per_rank(large) <= per_rank(small) + 12, (per_rank(small), per_rank(large))
    # Each algorithm's own connections, measured right after its checks.
    for algo in large["allreduce_algos"]:
        metric = f"connections_allreduce_{algo}"
        assert _worst(large, metric) <= _worst(small, metric) + log_growth, algo


def test_waits_without_doorbells_poll_and_pass(tmp_path):
    # Ranks that open no shared-memory doorbell (ROCE_PG_TEST_FAULT=no_doorbell)
    # wait on the rings by polling instead of blocking: every check still passes.
    _build()
    r = _run_once(tmp_path, TWO_BY_EIGHT, "full", RUN_LIMIT_S, env={"ROCE_PG_TEST_FAULT": "no_doorbell"})
    assert r["ok"] and r["ranks"] == 16, r["problems"]
    assert min(r["checks_passed"]) >= 130, r["checks_passed"]


def test_256_ranks_with_default_rings_pass_the_few_checks(tmp_path):
    # Why waits block: with waits on shared memory that polled, 256 ranks
    # (32 x 8) on the 2-core machine could not finish the 1.5 MiB chain
    # broadcasts of --checks few through the harness's 64 KiB rings within a
    # 166 s group timeout; blocked on the doorbell they pass, about 50 s for
    # the whole run there (docs/SCALE.md, "Limits found").
    _build()
    r = _run_once(tmp_path, "32x8", "few", 300)  # group timeout: the limit / 3 = 100 s
    assert r["ok"] and r["ranks"] == 256, r["problems"]
    assert min(r["checks_passed"]) >= 120, r["checks_passed"]
