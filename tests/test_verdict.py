"""The cross-rank verdict when a job hangs: rank 2 of 4 stays
alive but stops calling collectives; every other rank times out in the next
allreduce, and every error names the same culprit and where the rest wait,
from the states the ranks exchanged over their lifelines. Over shared memory,
TCP between simulated machines, and both (the Soft-RoCE VM suite runs it over
verbs). The wording itself is checked without a group."""
import re

import pytest

from roce_pg._doctor_trace import rank_list

from .support.layouts import LAYOUTS
from .support.ranks import run_group

def check_verdicts(results, world, hung, timeout_s):
    """Every rank but `hung` failed, and its error carries the verdict naming
    `hung` as behind and all the others as waiting one collective later, the
    same on every rank."""
    others = rank_list([r for r in range(world) if r != hung])
    verdict = re.compile(rf"rank {hung} last completed allreduce #(\d+) and has called nothing for ([\d.]+) s; "
                         rf"ranks {re.escape(others)} wait in allreduce #(\d+)")
    seen = set()
    for r in results:
        if r["rank"] == hung:
            continue
        error = r["error"]
        assert error, f"rank {r['rank']}: the allreduce after rank {hung} stopped calling did not fail"
        m = verdict.search(error)
        assert m, f"rank {r['rank']}: no verdict naming rank {hung} in: {error}"
        assert int(m.group(3)) == int(m.group(1)) + 1, error
        # Rank `hung` last issued something before the others began waiting:
        # about the timeout ago (the figure is its own idle time when asked),
        # with slack for a busy machine.
        assert timeout_s * 0.5 <= float(m.group(2)) <= timeout_s * 4, error
        seen.add((m.group(1), m.group(3)))
        # Bounded: the timeout, the exchange (at most 2 s), a busy machine's slack.
        assert r["fail_s"] < timeout_s + 15, r
    assert len(seen) == 1, seen  # the same culprit and the same wait on every rank


@pytest.mark.parametrize("layout", ["shm4", "net4", "mixed2x2"])
def test_every_waiting_rank_names_the_hung_rank(layout):
    world, env = LAYOUTS[layout]
    timeout_s = 5
    results = run_group("tests.verdict_workers.hung_rank", world, env={**env, "TEST_PG_TIMEOUT_S": str(timeout_s)},
                        kwargs={"hung": 2})
    check_verdicts(results, world, 2, timeout_s)


def test_verdict_wording():
    import roce_pg._C as C

    def state(issued, started, ended, op="allreduce", idle=10000):
        return (f"issued={issued} issued_op={op} started={started} started_op={op} ended={ended} ended_op={op} "
                f"idle_ms={idle}")

    waiting, idle = state(4, 4, 3), state(3, 3, 3, idle=10043)
    assert C.testing.format_verdict({0: waiting, 1: waiting, 2: idle, 3: waiting}, 4) == (
        "rank 2 last completed allreduce #3 and has called nothing for 10.0 s; ranks 0, 1, 3 wait in allreduce #4")
    # A dead rank does not answer; 1,000 ranks stay one line.
    big = {r: waiting for r in range(1000) if r not in (5, 6, 7, 900)}
    big.update({5: idle, 6: idle})
    assert C.testing.format_verdict(big, 1000) == (
        "ranks 5, 6 last completed allreduce #3 and have called nothing for 10.0 s; ranks 0-4, 8-899, 901-999 wait "
        "in allreduce #4; no answer from ranks 7, 900 (dead, or cut off from the others' lifelines)")
    # Nobody behind: the hint points elsewhere.
    assert C.testing.format_verdict({0: waiting, 1: waiting}, 2).startswith("every rank waits in allreduce #4: none is behind")
    # A rank stuck inside an earlier collective; one that never called any.
    stuck = state(2, 2, 1, op="broadcast")
    never = "issued=0 issued_op=- started=0 started_op=- ended=0 ended_op=- idle_ms=12000"
    assert C.testing.format_verdict({0: waiting, 1: stuck, 2: never}, 3) == (
        "rank 2 has called no collective in this group for 12.0 s; rank 1 is still in broadcast #2; "
        "rank 0 waits in allreduce #4")
    assert C.testing.format_verdict({0: "garbage"}, 2) == ""


def test_straggler_report_names_the_slowed_rank():
    """The straggler report: while nothing fails, rank 2 of 4 (two simulated
    machines of two ranks: shared memory and TCP) sleeps 20 ms before each
    allreduce; every rank's straggler_report() names it, and once it stops,
    names nobody."""
    world, env = LAYOUTS["mixed2x2"]
    results = run_group("tests.verdict_workers.slowed_rank", world, env=env, kwargs={"slow": 2})
    for r in results:
        assert r["slowed"]["straggler"] == 2, r["slowed"]
        assert r["slowed"]["text"].startswith("rank 2 keeps the others waiting"), r["slowed"]["text"]
        shares = [x["inside_share"] for x in r["slowed"]["ranks"]]
        assert shares[2] < min(s for i, s in enumerate(shares) if i != 2), shares
        assert r["even"]["straggler"] is None, r["even"]
